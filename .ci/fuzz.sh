#!/usr/bin/env bash
# The fuzz targets (fuzz/, a workspace of its own) built on the stable toolchain and each fed
# 20,000 generated inputs from a fixed seed. Stable builds carry no sanitizer coverage, so
# this is a gate that every target still compiles against the crates and survives random
# bytes, not a fuzzing campaign: that is `cargo +nightly fuzz run TARGET` (fuzz/Cargo.toml).
# About 2.5 minutes cold on 2 cores, 10 s of running.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
echo "== fuzz targets: build (stable) and 20000 runs each"
cargo build --release --locked -q --target-dir ../target/fuzz
for t in $(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v '^metampi-fuzz$'); do
    # -max_len keeps the inputs near the sizes the seeds have; -seed makes a failure repeatable.
    if ! out=$(../target/fuzz/release/"$t" -runs=20000 -max_len=4096 -seed=1 -artifact_prefix=../target/fuzz/ 2>&1); then
        echo "$out" | tail -n 30
        echo "fuzz target $t failed on a generated input (seed 1); the input is under target/fuzz/" >&2
        exit 1
    fi
    echo "  $t: $(echo "$out" | grep -o 'Done [0-9]* runs.*' || echo done)"
done
