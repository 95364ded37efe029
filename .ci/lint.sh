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
