#!/usr/bin/env bash
# What TLS on router links costs (issue 7): rank-to-rank ping-pong latency
# and bandwidth through two routers, links plain (TLS = off) against
# encrypted (TLS = auto: TLS 1.3, AES-128-GCM), compression off in both so
# the same bytes cross. Rounds alternate the two configurations and the
# table shows the median over rounds of each run's median (latency) or
# throughput; then one run each over an emulated 100 Mbit/s, 20 ms line.
#   ROUNDS=7 bench/wan_tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
cargo build --release -q -p metampi-cli
M=${CARGO_TARGET_DIR:-target}/release/metampi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
site() { # PORTBASE TLS [PAIR OPTIONS]
    cat <<CFG
PORTBASE $1
TLS = $2
COMPRESSION = off
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 1 ${3:-}
a0 <-> b0
CFG
}
site 27600 off > "$d/off.cfg"
site 27700 auto > "$d/auto.cfg"
site 27800 off "- { BANDWIDTH = 100Mbit; LATENCY = 20ms; }" > "$d/off-wan.cfg"
site 27900 auto "- { BANDWIDTH = 100Mbit; LATENCY = 20ms; }" > "$d/auto-wan.cfg"

# val OP BYTES COLUMN: from the bench table (column 4 median us, 8 MB/s)
val() { awk -v op="$1" -v b="$2" -v col="$3" '/^# [a-z]+ \(/ {found = ($2==op); next} $1==b && found {print $col; exit}'; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

for ((i = 1; i <= rounds; i++)); do
    for mode in off auto; do
        out=$($M run --meta "$d/$mode.cfg" $M bench --ops pingpong,bw --sizes 8,64K,4M --iters-scale 0.2)
        val pingpong 8 4 <<<"$out" >>"$d/$mode.lat8"
        val pingpong 65536 4 <<<"$out" >>"$d/$mode.lat64k"
        val bw 65536 8 <<<"$out" >>"$d/$mode.bw64k"
        val bw 4194304 8 <<<"$out" >>"$d/$mode.bw4m"
    done
    echo "round $i of $rounds done" >&2
done
for mode in off auto; do
    out=$($M run --meta "$d/$mode-wan.cfg" $M bench --ops bw --sizes 1M --iters-scale 0.004)
    val bw 1048576 8 <<<"$out" >"$d/$mode.wan"
done

r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
row() { # LABEL FILE
    local p t
    p=$(median <"$d/off.$2")
    t=$(median <"$d/auto.$2")
    printf '%-46s %10s %10s %7s\n' "$1" "$p" "$t" "$(r "$t" "$p")"
}
printf '%-46s %10s %10s %7s\n' "through 2 routers ($rounds rounds)" "plain" "TLS" "TLS/plain"
row "8-byte ping-pong, one way (us)" lat8
row "64 KiB ping-pong, one way (us)" lat64k
row "64 KiB streaming bandwidth (MB/s)" bw64k
row "4 MiB streaming bandwidth (MB/s)" bw4m
row "100 Mbit/s 20 ms line, 1 MiB bandwidth (MB/s)" wan
