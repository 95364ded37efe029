#!/usr/bin/env bash
# Side-by-side ping-pong of metampi and MPICH (Debian's mpich, ch4:ucx) on this
# machine, in one go: 8-byte one-way latency and 4 MiB windowed streaming
# bandwidth, over shared memory and over TCP. Each figure is the median of
# RUNS runs. Ratios are metampi / MPICH (latency: lower is better;
# bandwidth: higher is better).
#
#   bash bench/compare_mpich.sh            # RUNS=5 by default
#   PIN=1 bash bench/compare_mpich.sh      # each rank pinned to its own core (taskset)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
LAT=${LAT:-8}
BW=${BW:-4194304}

# mpicc.mpich, not mpicc: with Open MPI installed too, `mpicc` may be Open MPI's,
# and its binaries under mpiexec.mpich would each be a world of one.
if ! command -v mpicc.mpich >/dev/null || ! command -v mpiexec.mpich >/dev/null; then
    echo "installing mpich (apt)..." >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev) >/dev/null
fi
out=${OUT:-target/bench}
mkdir -p "$out"
mpicc.mpich -O2 -w -o "$out/pingpong_mpich" bench/c/pingpong.c
cargo build --release -q -p metampi-cli -p metampi --example pingpong
MR=target/release/metampi
PP=target/release/examples/pingpong

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# run_case NAME CMD... : prints "lat bw" medians over RUNS runs
run_case() {
    local lats=() bws=()
    for _ in $(seq "$RUNS"); do
        local o
        # A stuck run (seen with MPICH's UCX shared memory) is killed and retried once.
        o=$(timeout 60 "$@" "$LAT" "$BW") || o=$(timeout 60 "$@" "$LAT" "$BW") || { echo "run failed: $*" >&2; continue; }
        lats+=("$(awk '/^latency_us/ {print $3}' <<<"$o")")
        bws+=("$(awk '/^bandwidth_MBps/ {print $3}' <<<"$o")")
    done
    echo "$(printf '%s\n' "${lats[@]}" | median) $(printf '%s\n' "${bws[@]}" | median)"
}

# With PIN=1 every rank runs under `taskset -c <its rank>`; otherwise the
# kernel places them. Extra arguments (the message sizes) follow the program.
MP=("$PP") PM=("$out/pingpong_mpich")
if [ "${PIN:-0}" = 1 ]; then
    MP=(sh -c 'exec taskset -c "$METAMPI_RANK" "$0" "$@"' "$PP")
    PM=(sh -c 'exec taskset -c "$PMI_RANK" "$0" "$@"' "$out/pingpong_mpich")
fi
read -r m_shm_lat m_shm_bw < <(run_case "$MR" run -n 2 "${MP[@]}")
read -r p_shm_lat p_shm_bw < <(run_case mpiexec.mpich -n 2 "${PM[@]}")
read -r m_tcp_lat m_tcp_bw < <(run_case env METAMPI_FORCE_TCP=1 "$MR" run -n 2 -x METAMPI_FORCE_TCP "${MP[@]}")
read -r p_tcp_lat p_tcp_bw < <(run_case env UCX_TLS=tcp,self MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_SHM_ENABLE=0 mpiexec.mpich -n 2 "${PM[@]}")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-22s %12s %12s %8s %s\n' "measure" "metampi" "MPICH" "ratio" "target"
printf '%-22s %12s %12s %8s %s\n' "shm latency (us)" "$m_shm_lat" "$p_shm_lat" "$(ratio "$m_shm_lat" "$p_shm_lat")" "<= 1.0"
printf '%-22s %12s %12s %8s %s\n' "shm bandwidth (MB/s)" "$m_shm_bw" "$p_shm_bw" "$(ratio "$m_shm_bw" "$p_shm_bw")" ">= 1.0"
printf '%-22s %12s %12s %8s %s\n' "tcp latency (us)" "$m_tcp_lat" "$p_tcp_lat" "$(ratio "$m_tcp_lat" "$p_tcp_lat")" "<= 1.0"
printf '%-22s %12s %12s %8s %s\n' "tcp bandwidth (MB/s)" "$m_tcp_bw" "$p_tcp_bw" "$(ratio "$m_tcp_bw" "$p_tcp_bw")" ">= 1.0"
echo "(message sizes: latency $LAT bytes, bandwidth $BW bytes; $RUNS runs each, medians; pinned: ${PIN:-0})"
