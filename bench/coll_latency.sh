#!/usr/bin/env bash
# Small-message collective latency of metampi against MPICH on this machine,
# in one go: barrier and all-reduce (8 bytes, sum of f64) on RANKS ranks
# (default 2). Every rank is pinned to its own core (taskset), for both
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

# prints "barrier allreduce" medians (us) of one run of metampi binary $1
one_metampi() {
    "$1" run -n "$RANKS" sh -c "exec taskset -c \$((METAMPI_RANK % $cores)) $1 bench --ops barrier,allreduce --sizes $SIZE --iters-scale $SCALE" |
        awk '/^# barrier/ {op = "b"} /^# allreduce/ {op = "a"} $1 ~ /^[0-9]+$/ {v[op] = $4} END {print v["b"], v["a"]}'
}
one_mpich() {
    timeout 120 mpiexec.mpich -n "$RANKS" sh -c "exec taskset -c \$((PMI_RANK % $cores)) $out/osu_like_peer barrier,allreduce $SIZE $SCALE mpich $out/peer.json" >/dev/null
    python3 -c "import json,sys; r={x['op']: x['median_us'] for x in json.load(open(sys.argv[1]))['results']}; print(r['barrier'], r['allreduce'])" "$out/peer.json"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$out/lat_m" && : >"$out/lat_p" && : >"$out/lat_b"
for _ in $(seq "$RUNS"); do
    one_metampi "$M" >>"$out/lat_m"
    one_mpich >>"$out/lat_p"
    if [ -n "${BEFORE:-}" ]; then one_metampi "$(realpath "$BEFORE")" >>"$out/lat_b"; fi
done
col() { awk -v c="$2" '{print $c}' "$1" | median; }
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-10s %12s %12s %8s' op "metampi(us)" "MPICH(us)" ratio
[ -n "${BEFORE:-}" ] && printf ' %12s %8s' "before(us)" "ratio"
echo
for c in 1 2; do
    name=$([ $c = 1 ] && echo barrier || echo allreduce)
    m=$(col "$out/lat_m" $c)
    p=$(col "$out/lat_p" $c)
    printf '%-10s %12s %12s %8s' "$name" "$m" "$p" "$(r "$m" "$p")"
    if [ -n "${BEFORE:-}" ]; then
        b=$(col "$out/lat_b" $c)
        printf ' %12s %8s' "$b" "$(r "$b" "$p")"
    fi
    echo
done
echo "($RANKS ranks, $SIZE bytes, ranks pinned one per core; medians of $RUNS runs; ratio = metampi / MPICH)"
