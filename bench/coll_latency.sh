#!/usr/bin/env bash
# Small-message collective latency of metampi against MPICH on this machine,
# in one go: barrier, all-reduce, broadcast, reduce, gather and all-gather
# (OPS; SIZE bytes, default 8; reductions sum f32) on RANKS ranks (default 2). Every rank is pinned to its own core (taskset), for both
# libraries alike: unpinned, two spinning ranks that the scheduler puts on
# one core of a busy machine measure the scheduler. Runs alternate between
# the libraries; each figure is the median over RUNS runs of the median
# time per operation. With BEFORE=path/to/an/older/metampi binary the same
# run also measures that build, for before/after figures.
#
#   bash bench/coll_latency.sh                  # RUNS=7, RANKS=2
#   BEFORE=/tmp/metampi-old RUNS=11 bash bench/coll_latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
RANKS=${RANKS:-2}
SIZE=${SIZE:-8}
SCALE=${SCALE:-1}
OPS=${OPS:-barrier,allreduce,bcast,reduce,gather,allgather}
T=${CARGO_TARGET_DIR:-target}
out=${OUT:-$T/bench}
mkdir -p "$out"
if ! command -v mpicc.mpich >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev) >/dev/null
fi
mpicc.mpich -O2 -w -o "$out/osu_like_peer" bench/c/osu_like.c
cargo build --release -q -p metampi-cli
M=$(realpath "$T/release/metampi")
cores=$(nproc)

# One run of metampi binary $1: "op median_us" lines, one per operation.
one_metampi() {
    "$1" run -n "$RANKS" sh -c "exec taskset -c \$((METAMPI_RANK % $cores)) $1 bench --ops $OPS --sizes $SIZE --iters-scale $SCALE --json $out/m.json" >/dev/null
    python3 -c "import json,sys; [print(x['op'], x['median_us']) for x in json.load(open(sys.argv[1]))['results']]" "$out/m.json"
}
one_mpich() {
    timeout 120 mpiexec.mpich -n "$RANKS" sh -c "exec taskset -c \$((PMI_RANK % $cores)) $out/osu_like_peer $OPS $SIZE $SCALE mpich $out/peer.json" >/dev/null
    python3 -c "import json,sys; [print(x['op'], x['median_us']) for x in json.load(open(sys.argv[1]))['results']]" "$out/peer.json"
}
: >"$out/lat_m" && : >"$out/lat_p" && : >"$out/lat_b"
for _ in $(seq "$RUNS"); do
    one_metampi "$M" >>"$out/lat_m"
    one_mpich >>"$out/lat_p"
    if [ -n "${BEFORE:-}" ]; then one_metampi "$(realpath "$BEFORE")" >>"$out/lat_b"; fi
done
python3 - "$out" "$OPS" "${BEFORE:+yes}" <<'PY'
import statistics, sys
out, ops, before = sys.argv[1], sys.argv[2].split(","), sys.argv[3] == "yes"
def meds(f):
    v = {}
    for line in open(f"{out}/{f}"):
        op, t = line.split()
        v.setdefault(op, []).append(float(t))
    return {op: statistics.median(t) for op, t in v.items()}
m, p = meds("lat_m"), meds("lat_p")
b = meds("lat_b") if before else {}
head = f"{'op':<10} {'metampi(us)':>12} {'MPICH(us)':>12} {'ratio':>8}"
print(head + (f" {'before(us)':>12} {'ratio':>8}" if before else ""))
for op in ops:
    if op not in m or op not in p:
        continue
    line = f"{op:<10} {m[op]:>12.3f} {p[op]:>12.3f} {m[op] / p[op]:>8.2f}"
    if before and op in b:
        line += f" {b[op]:>12.3f} {b[op] / p[op]:>8.2f}"
    print(line)
PY
echo "($RANKS ranks, $SIZE bytes, ranks pinned one per core; medians of $RUNS runs; ratio = metampi / MPICH)"
