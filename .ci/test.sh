#!/usr/bin/env bash
# The test suite with one closing summary line: `cargo test --workspace --release` (every test
# binary and the doc tests, each run even after another failed), then what all of them did
# together, and which failed. Arguments replace `--workspace` (`bash .ci/test.sh -p psrsearch`).
#
# Multi-rank tests start their own test binary as each rank, and those ranks print test-result
# lines of their own into the same output: a binary's result is the last such line before the
# next binary starts, so only that one is counted.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp -t metampi-tests.XXXXXX)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
if [ $# -eq 0 ]; then set -- --workspace; fi
cargo test --release --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
secs=$(($(date +%s) - start))
awk -v status="$status" -v secs="$secs" '
    # A test binary or the doc tests of a crate start.
    /^ *Running / {
        close_binary(); open = 1; last = ""
        # (target/release/deps/NAME-HASH) -> NAME, with the source it was built from
        name = $NF; gsub(/[()]/, "", name); sub(/.*\//, "", name); sub(/-[0-9a-f]+$/, "", name)
        name = name "(" $(NF-1) ")"
        next
    }
    /^ *Doc-tests / { close_binary(); open = 1; last = ""; name = "doc:" $2; next }
    /^test result: / { last = $0 }
    function close_binary(   n) {
        if (!open) return
        binaries++
        if (last == "") { silent = silent " " name; return }
        n = split(last, w, /[ ;.]+/)
        for (i = 1; i <= n; i++) {
            if (w[i+1] == "passed") passed += w[i]
            if (w[i+1] == "failed") { failed += w[i]; if (w[i] > 0) bad = bad " " name }
            if (w[i+1] == "ignored") ignored += w[i]
        }
    }
    END {
        close_binary()
        verdict = (status == 0 && failed == 0) ? "ok" : "FAILED"
        printf "\nsuite %s: %d passed, %d failed, %d ignored in %d test binaries and doc-test sets, %d s\n", \
            verdict, passed, failed, ignored, binaries, secs
        if (bad != "") printf "failed in:%s\n", bad
        if (silent != "") printf "no result from (did not build or crashed):%s\n", silent
    }' "$log"
exit "$status"
