#!/usr/bin/env bash
# The SC99 buffer case (seed 000): many clients on one site send through a
# slow wide-area link into one receiver; at SC99 a router ran out of buffer
# space and the job died. Here the senders must block instead, and the
# routers' memory must stay bounded. Prints the job's result and each
# router's peak resident memory (VmHWM) from its statistics file.
#
#   bash bench/sc99.sh [SENDERS=256] [MESSAGES=2] [BYTES=16384] [RATE=2Mbit]
set -euo pipefail
cd "$(dirname "$0")/.."
senders=${1:-256} messages=${2:-2} bytes=${3:-16384} rate=${4:-2Mbit}
cargo build --release -q -p metampi-cli
cargo build --release -q -p metampi --example fanin
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/sc99.cfg" <<CFG
PORTBASE 26800
METAHOST clients { LAUNCH = local; NPROCS = $senders; NODES = c0; }
METAHOST server { LAUNCH = local; NPROCS = 1; NODES = s0; }
PAIR clients server 1 - { BANDWIDTH = $rate; LATENCY = 35ms; COMPRESSION = off; }
c0 <-> s0
CFG
mkdir -p "$d/stats"
start=$(date +%s.%N)
METAMPI_ROUTER_STATS="$d/stats" target/release/metampi run --timeout 900 --meta "$d/sc99.cfg" \
    target/release/examples/fanin "$messages" "$bytes"
end=$(date +%s.%N)
echo "job wall time: $(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f s", b - a}')"
for f in "$d"/stats/router-?.json; do
    echo "$(basename "$f" .json): $(cat "$f")"
done
