#!/usr/bin/env bash
# Wide-area measurements on this machine, in one go (issue 3's benchmark):
#  1. ping-pong latency and 4 MiB bandwidth rank to rank through two routers
#     against direct TCP between two emulated machines;
#  2. throughput over an emulated 100 Mbit/s, 20 ms link (incompressible-ish
#     payload: compression off) against the link rate;
#  3. the same link with lz4 and compressible data: effective throughput
#     against the link rate;
#  4. two links of 50 Mbit/s striped as one connection against one such link.
# Also the two meta hosts paired directly (PAIR a b 0, no routers).
#
#   bash bench/wan.sh
#   ROUNDS=5 bash bench/wan.sh    # medians of 5 alternating rounds of the rank-to-rank rows
#   M=/path/to/metampi bash bench/wan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# M=path/to/metampi measures that build (a machine without cargo, say).
if [ -z "${M:-}" ]; then
    cargo build --release -q -p metampi-cli
    M=target/release/metampi
fi
d=$(mktemp -d)
trap 'rm -rf "$d"; pkill -f "metampi router" || true' EXIT
site() { # PORTBASE OPTIONS [LINKS]
    cat <<CFG
PORTBASE $1
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 1 $2
${3:-a0 <-> b0}
CFG
}
site 27100 "" > "$d/plain.cfg"
# The same without compression: direct TCP compresses nothing, and COMPRESSION = auto (the
# default) starts compressed until its first probe of the raw mode.
site 27600 "- { COMPRESSION = off; }" > "$d/raw.cfg"
# And without payload checksums (direct TCP checks nothing beyond TCP's own sum either).
site 27650 "- { COMPRESSION = off; CHECKSUM = off; }" > "$d/bare.cfg"
# The same two meta hosts paired directly (PAIR a b 0: no routers).
cat > "$d/direct.cfg" <<CFG
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 0
CFG
site 27200 "- { BANDWIDTH = 100Mbit; LATENCY = 20ms; COMPRESSION = off; }" > "$d/slow.cfg"
site 27300 "- { BANDWIDTH = 100Mbit; LATENCY = 20ms; COMPRESSION = lz4; }" > "$d/slowz.cfg"
site 27400 "- { BANDWIDTH = 50Mbit; LATENCY = 5ms; COMPRESSION = off; }" > "$d/one.cfg"
site 27500 "- { BANDWIDTH = 50Mbit; LATENCY = 5ms; COMPRESSION = off; }" "a0 <-> b0, a0 <-> b0" > "$d/two.cfg"

# med OP BYTES COLUMN: a value from the bench table (column 4 median us, 8 MB/s)
med() { awk -v op="$1" -v b="$2" -v col="$3" '/^# [a-z]+ \(/ {found = ($2==op); next} $1==b && found {print $col; exit}'; }
# ROUNDS=N repeats the rank-to-rank measurements N times, the configurations taking turns,
# and prints each figure's median (a shared machine has slow spells lasting seconds).
ROUNDS=${ROUNDS:-1}
declare -A got
add() { got[$1]="${got[$1]:-} $2"; }
median() { tr ' ' '\n' <<<"${got[$1]}" | grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
bench_in() { $M run --meta "$1" $M bench --ops pingpong,bw --sizes 8,4M --iters-scale 0.2; }
for ((round = 0; round < ROUNDS; round++)); do
    direct=$($M bench -n 2 --machines m0:1,m1:1 --ops pingpong,bw --sizes 8,4M --iters-scale 0.2)
    routed=$(bench_in "$d/plain.cfg")
    routed_raw=$(bench_in "$d/raw.cfg")
    routed_bare=$(bench_in "$d/bare.cfg")
    # The same with TCP between ranks and routers instead of shared-memory pipes.
    routed_tcp=$(METAMPI_NO_ROUTER_SHM=1 bench_in "$d/plain.cfg")
    paired=$(bench_in "$d/direct.cfg")
    add pl "$(med pingpong 8 4 <<<"$paired")"; add pb "$(med bw 4194304 8 <<<"$paired")"
    add dl "$(med pingpong 8 4 <<<"$direct")"; add rl "$(med pingpong 8 4 <<<"$routed")"
    add db "$(med bw 4194304 8 <<<"$direct")"; add rb "$(med bw 4194304 8 <<<"$routed")"
    add tl "$(med pingpong 8 4 <<<"$routed_tcp")"; add vb "$(med bw 4194304 8 <<<"$routed_tcp")"
    add ol "$(med pingpong 8 4 <<<"$routed_raw")"; add ob4 "$(med bw 4194304 8 <<<"$routed_raw")"
    add nb4 "$(med bw 4194304 8 <<<"$routed_bare")"
done
pl=$(median pl); pb=$(median pb); dl=$(median dl); rl=$(median rl); db=$(median db); rb=$(median rb)
tl=$(median tl); vb=$(median vb); ol=$(median ol); ob4=$(median ob4); nb4=$(median nb4)
[ "$ROUNDS" -gt 1 ] && echo "rank-to-rank figures: medians of $ROUNDS rounds (4 MiB direct TCP:${got[db]} MB/s; routed, checksums off:${got[nb4]})"
slow=$($M run --meta "$d/slow.cfg" $M bench --ops bw --sizes 1M --iters-scale 0.004)
slowz=$($M run --meta "$d/slowz.cfg" $M bench --ops bw --sizes 1M --iters-scale 0.004)
sb=$(med bw 1048576 8 <<<"$slow"); zb=$(med bw 1048576 8 <<<"$slowz")
one=$($M run --meta "$d/one.cfg" $M bench --ops bw --sizes 1M --iters-scale 0.004)
two=$($M run --meta "$d/two.cfg" $M bench --ops bw --sizes 1M --iters-scale 0.004)
ob=$(med bw 1048576 8 <<<"$one"); tb=$(med bw 1048576 8 <<<"$two")
link=12.5
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-44s %10s %10s %7s %s\n' measure routed direct ratio target
printf '%-44s %10s %10s %7s %s\n' "8-byte latency (us), through 2 routers" "$rl" "$dl" "$(r "$rl" "$dl")" "<= 2.0"
printf '%-44s %10s %10s %7s %s\n' "  latency the routers add (us)" "$(awk -v a="$rl" -v b="$dl" 'BEGIN {printf "%.2f", a - b}')" "$dl" "$(awk -v a="$rl" -v b="$dl" 'BEGIN {printf "%.2f", (a - b) / b}')" "<= 2.0"
printf '%-44s %10s %10s %7s %s\n' "4 MiB bandwidth (MB/s), through 2 routers" "$rb" "$db" "$(r "$rb" "$db")" ">= 0.9"
printf '%-44s %10s %10s %7s %s\n' "  same, compression off: latency (us)" "$ol" "$dl" "$(r "$ol" "$dl")" "-"
printf '%-44s %10s %10s %7s %s\n' "  same, compression off: bandwidth (MB/s)" "$ob4" "$db" "$(r "$ob4" "$db")" ">= 0.9"
printf '%-44s %10s %10s %7s %s\n' "  same, and payload checksums off (MB/s)" "$nb4" "$db" "$(r "$nb4" "$db")" ">= 0.9"
printf '%-44s %10s %10s %7s %s\n' "  same, TCP to the routers: latency (us)" "$tl" "$dl" "$(r "$tl" "$dl")" "-"
printf '%-44s %10s %10s %7s %s\n' "  same, TCP to the routers: bandwidth (MB/s)" "$vb" "$db" "$(r "$vb" "$db")" "-"
printf '%-44s %10s %10s %7s %s\n' "  direct pair (PAIR a b 0): latency (us)" "$pl" "$dl" "$(r "$pl" "$dl")" "-"
printf '%-44s %10s %10s %7s %s\n' "  direct pair (PAIR a b 0): bandwidth (MB/s)" "$pb" "$db" "$(r "$pb" "$db")" "-"
printf '%-44s %10s %10s %7s %s\n' "100 Mbit/s link, no compression (MB/s)" "$sb" "$link" "$(r "$sb" "$link")" ">= 0.95"
printf '%-44s %10s %10s %7s %s\n' "100 Mbit/s link, lz4, compressible (MB/s)" "$zb" "$link" "$(r "$zb" "$link")" "> 1.0"
printf '%-44s %10s %10s %7s %s\n' "2 striped 50 Mbit/s links vs 1 (MB/s)" "$tb" "$ob" "$(r "$tb" "$ob")" ">= 1.8"
