#!/usr/bin/env bash
# `metampi bench` and the same measurements in C against MPICH (or Open MPI
# for oversubscribed runs), in one go: same operations, sizes and iteration
# counts. Prints the median time per point for both and the ratio
# metampi/peer (for bandwidth: peer/metampi, so < 1 is better everywhere),
# and writes an overlay plot.
#
# A shared machine has slow spells that last seconds: one sweep after the
# other would charge a spell to whichever ran in it. Each side's sweep runs
# ROUNDS times (default 2), the two alternating, and each point keeps its
# best round (lowest median time, highest bandwidth) on both sides alike.
#
#   bash bench/compare_bench.sh [RANKS] [OPS] [SIZES]
#   PEER=openmpi bash bench/compare_bench.sh 8 barrier,allreduce 8
#   ROUNDS=1 bash bench/compare_bench.sh 2      # quicker, noisier
#   MISALIGN=16 bash bench/compare_bench.sh 2 pingping,alltoall
#
# Both sides start send buffers on a page boundary and receive buffers
# MISALIGN bytes past one (default 0), as the OSU benchmarks align theirs:
# 1-31 bytes is the placement that slows `rep movsb` copies on AMD Zen.
#
#   HOG=1 bash bench/compare_bench.sh 2 pingpong,bcast,allreduce 8,4096
#   TCP=1 bash bench/compare_bench.sh 2 pingpong,bw,bibw
#   THREADS=4 bash bench/compare_bench.sh 2 pingpong_mt 8,4096,1048576
#
# HOG=1 keeps one busy-looping process of another job running throughout
# (both sides alike), as a desktop or a shared node has: ranks that yield
# their core to it, or sleep, pay for it in latency.
#
# TCP=1 sends every message over TCP on both sides, as between machines:
# `metampi bench --tcp`; MPICH (ch4:ucx) with MPIR_CVAR_NOLOCAL=1,
# MPIR_CVAR_CH4_SHM_ENABLE=0 and
# UCX_TLS=tcp,self; Open MPI with `--mca pml ob1 --mca btl tcp,self`.
#
# THREADS (default 4) is the thread pairs of `pingpong_mt` on both sides
# (`metampi bench --threads`; the C side asks for MPI_THREAD_MULTIPLE only
# when OPS has pingpong_mt).
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-2}
OPS=${2:-pingpong,bw,bibw,barrier,bcast,allreduce,alltoall}
SIZES=${3:-0,8,64,512,4096,32768,262144,1048576,4194304}
SCALE=${SCALE:-0.5}
PEER=${PEER:-mpich}
MISALIGN=${MISALIGN:-0}
THREADS=${THREADS:-4}
export MISALIGN THREADS
if [ "${HOG:-0}" = 1 ]; then
    sh -c 'while :; do :; done' &
    hog=$!
    trap 'kill "$hog" 2>/dev/null || true' EXIT
fi
out=${OUT:-target/bench}
mkdir -p "$out"

if [ "$PEER" = mpich ]; then
    if ! command -v mpicc.mpich >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev) >/dev/null
    fi
    mpicc.mpich -O2 -w -o "$out/osu_like_peer" bench/c/osu_like.c
    peer_run=(mpiexec.mpich -n "$RANKS")
    [ "${TCP:-0}" = 0 ] || peer_run=(env MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_SHM_ENABLE=0 UCX_TLS=tcp,self "${peer_run[@]}")
else
    # openmpi-bin brings the wrapper without the header (libopenmpi-dev): try one.
    if ! echo '#include <mpi.h>' | mpicc.openmpi -E -x c - >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) >/dev/null
    fi
    mpicc.openmpi -O2 -w -o "$out/osu_like_peer" bench/c/osu_like.c
    peer_run=(mpirun.openmpi --allow-run-as-root --oversubscribe -x MISALIGN -x THREADS -n "$RANKS")
    [ "${TCP:-0}" = 0 ] || peer_run+=(--mca pml ob1 --mca btl tcp,self)
fi
cargo build --release -q -p metampi-cli
ours=()
[ "${TCP:-0}" = 0 ] || ours=(--tcp)

ROUNDS=${ROUNDS:-2}
for r in $(seq "$ROUNDS"); do
    target/release/metampi bench -n "$RANKS" "${ours[@]}" --ops "$OPS" --sizes "$SIZES" --iters-scale "$SCALE" --misalign "$MISALIGN" --threads "$THREADS" --label metampi --json "$out/metampi.$r.json" >/dev/null
    timeout 600 "${peer_run[@]}" "$out/osu_like_peer" "$OPS" "$SIZES" "$SCALE" "$PEER" "$out/peer.$r.json"
done

[ "$MISALIGN" = 0 ] || echo "receive buffers start $MISALIGN bytes past a page boundary on both sides"
[ "${HOG:-0}" = 0 ] || echo "both sides ran beside a busy-looping process"
[ "${TCP:-0}" = 0 ] || echo "every message over TCP on both sides"

python3 bench/compare_report.py "$out" "$ROUNDS" "$PEER"
target/release/metampi bench plot "$out/metampi.json" "$out/peer.json" -o "$out/compare.svg" >/dev/null
echo "plot: $out/compare.svg"
