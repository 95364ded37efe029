#!/usr/bin/env bash
# The loom models of the lock-free parts and the poller election (decision 0049): the
# library's own code run in every interleaving loom allows. A build of its own (`--cfg loom`,
# target/loom), without debug info to keep it small; about 3.5 minutes cold on 2 cores, then
# about 40 s (the three-waiter election model takes 35).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== loom models"
RUSTFLAGS="--cfg loom" CARGO_PROFILE_DEV_DEBUG=0 \
    cargo test --locked -q -p metampi-sys -p metampi --lib --target-dir target/loom -- loom_model
