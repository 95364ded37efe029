#!/usr/bin/env bash
# One C binary, two MPI libraries: MPICH's (mpiexec.mpich) and metampi's MPICH-ABI library
# (metampi run), side by side in one run.
#   1. tests/c/abi_suite.c: the checks each library passes, on RANKS ranks;
#   2. bench/c/osu_like.c: latency, bandwidth, barrier, allreduce; ratios metampi/MPICH
#      (< 1: metampi faster) and the C path against metampi's Rust API (`metampi bench`).
# Usage: bench/c_abi_compare.sh [RANKS] [OPS] [SIZES]      (needs mpicc.mpich, mpiexec.mpich)
# Raw output goes to bench/results/DATE/c-abi/ (or OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-2}
OPS=${2:-pingpong,bw,barrier,allreduce}
SIZES=${3:-8,65536}
out=${OUT:-bench/results/$(date +%F)/c-abi}
mkdir -p "$out"
cargo build --release -q -p metampi-abi -p metampi-cli
tmp=$(mktemp -d)
mpicc.mpich -O2 -o "$tmp/suite" crates/metampi-cli/tests/c/abi_suite.c 2>/dev/null
mpicc.mpich -O2 -o "$tmp/osu_like" bench/c/osu_like.c
echo "== C suite, $RANKS ranks"
printf 'MPICH:   '; mpiexec.mpich -n "$RANKS" "$tmp/suite" 2>/dev/null | grep '^suite:' | tee "$out/suite.mpich.txt"
printf 'metampi: '; target/release/metampi run -n "$RANKS" "$tmp/suite" | grep '^suite:' | tee "$out/suite.metampi.txt"
echo "== osu_like.c, one binary, $RANKS ranks"
mpiexec.mpich -n "$RANKS" "$tmp/osu_like" "$OPS" "$SIZES" 1 mpich "$out/mpich.json" >/dev/null 2>&1
target/release/metampi run -n "$RANKS" "$tmp/osu_like" "$OPS" "$SIZES" 1 metampi-c "$out/metampi-c.json" >/dev/null
target/release/metampi bench -n "$RANKS" --ops "$OPS" --sizes "$SIZES" --iters-scale 1 --label metampi-rust --json "$out/metampi-rust.json" >/dev/null
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda n: {(r["op"], r["bytes"]): r["median_us"] for r in json.load(open(f"{d}/{n}.json"))["results"]}
m, c, r = load("mpich"), load("metampi-c"), load("metampi-rust")
print(f"{'op':<10}{'bytes':>8}{'MPICH us':>10}{'C us':>10}{'Rust us':>10}{'C/MPICH':>9}{'C/Rust':>8}")
for k in sorted(c):
    if k in m and k in r:
        print(f"{k[0]:<10}{k[1]:>8}{m[k]:>10.3f}{c[k]:>10.3f}{r[k]:>10.3f}{c[k]/m[k]:>9.2f}{c[k]/r[k]:>8.2f}")
PY
rm -rf "$tmp"
