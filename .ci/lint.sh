#!/usr/bin/env bash
# CI gates before the tests: formatting, clippy with warnings as errors on every target,
# and the API docs with warnings as errors (broken intra-doc links and the like).
# The fuzz targets are built and smoke-run by .ci/fuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -q -- -D warnings
# The library as programs build it: without the test kit's private `test-counters` feature,
# which the workspace build above turns on.
cargo clippy -p metampi --lib --locked -q -- -D warnings
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q
# README's claim: the library compiles no C, and the launcher builds without its two C
# libraries (ring for TLS, zstd) when asked.
echo "== C in the build"
if cargo tree -p metampi -e normal --prefix none --locked | grep -E '^(ring|zstd-sys|cc|openssl-sys) '; then
    echo "the metampi library pulls in C code (above)" >&2
    exit 1
fi
cargo clippy -p metampi-cli --no-default-features --locked -q -- -D warnings
if cargo tree -p metampi-cli --no-default-features -e normal --prefix none --locked \
    | grep -E '^(ring|zstd-sys) '; then
    echo "metampi-cli --no-default-features still pulls in C code (above)" >&2
    exit 1
fi
