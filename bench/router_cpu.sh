#!/usr/bin/env bash
# Where routed bandwidth goes: CPU seconds per GB moved by every process of
# a 4 MiB streaming run, rank to rank through two routers against direct TCP
# between the ranks. On a machine with fewer cores than the
# routed path has processes (2 ranks + 2 routers), throughput is bound by the
# total CPU per byte; with a core per process, by the busiest process; and
# where routers run writer or reader threads beside their loop
# (METAMPI_ROUTER_WRITER=1, METAMPI_ROUTER_READER=1), with a core per thread,
# by the busiest thread. All three bounds are printed, so the routed/direct
# ratio can be judged apart from the core count of the machine it was
# measured on. Ranks that share cores spin, yield and sleep more than ranks
# with a core each, so their CPU per GB here is an upper bound.
#
#   bash bench/router_cpu.sh          # ITERS=0.2 (bench --iters-scale)
#   M=/tmp/metampi-old bash bench/router_cpu.sh
#   COMPRESSION=auto bash bench/router_cpu.sh   # the link's setting (default off);
#                                               # prints what auto chose and why
#   CHECKSUM=off bash bench/router_cpu.sh       # frames without payload checksums (default on)
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${ITERS:-0.2}
COMPRESSION=${COMPRESSION:-off}
CHECKSUM=${CHECKSUM:-on}
T=${CARGO_TARGET_DIR:-target}
if [ -z "${M:-}" ]; then # M=path/to/metampi measures that build instead
    cargo build --release -q -p metampi-cli
    M=$(realpath "$T/release/metampi")
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat >"$d/plain.cfg" <<CFG
PORTBASE 27700
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 1 - { COMPRESSION = $COMPRESSION; CHECKSUM = $CHECKSUM; }
a0 <-> b0
CFG
ticks=$(getconf CLK_TCK)
# Ranks report their own user+system CPU seconds through /usr/bin/time.
rank_cmd="/usr/bin/time -f 'cpu %U %S' -a -o $d/ranks.cpu $M bench --ops bw --sizes 4M --iters-scale $ITERS"

# Routed: routers are sampled from /proc while the job runs (they are killed at its end).
mkdir -p "$d/stats"
METAMPI_ROUTER_STATS="$d/stats" $M run --meta "$d/plain.cfg" sh -c "$rank_cmd" >"$d/routed.out" &
job=$!
: >"$d/routers.cpu"
: >"$d/threads.cpu"
while kill -0 "$job" 2>/dev/null; do
    for p in $(pgrep -f "metampi.*router" || true); do
        [ -r "/proc/$p/stat" ] || continue
        # utime and stime are fields 14 and 15 (the command name has no spaces here).
        awk -v p="$p" '{print p, $14 + $15}' "/proc/$p/stat" 2>/dev/null >>"$d/routers.cpu" || true
        # Per thread too (the loop, and writer or reader threads where a link has them).
        for t in /proc/"$p"/task/*/stat; do
            awk -v t="$t" '{print t, $14 + $15}' "$t" 2>/dev/null >>"$d/threads.cpu" || true
        done
    done
    sleep 0.1
done
wait "$job"
routed_bw=$(awk '$1 == 4194304 {print $8}' "$d/routed.out")
bytes=$(cat "$d"/stats/router-*-link-*-out.json | sed 's/.*"payload_raw_out":\([0-9]*\).*/\1/' | sort -n | tail -1)
routed_ranks=$(awk '/^cpu/ {print $2 + $3}' "$d/ranks.cpu" | sort -g | tr '\n' ' ')
routers=$(awk -v t="$ticks" '{if ($2 > m[$1]) m[$1] = $2} END {for (p in m) print m[p] / t}' "$d/routers.cpu" | sort -g | tr '\n' ' ')
# Router threads that ran (10 ms or more of CPU), the busiest last.
router_threads=$(awk -v t="$ticks" '{if ($2 > m[$1]) m[$1] = $2} END {for (p in m) if (m[p] > 0) print m[p] / t}' "$d/threads.cpu" | sort -g | tr '\n' ' ')

# Direct TCP between the two ranks, same bench.
: >"$d/ranks.cpu"
METAMPI_FORCE_TCP=1 $M run -n 2 sh -c "$rank_cmd" >"$d/direct.out"
direct_bw=$(awk '$1 == 4194304 {print $8}' "$d/direct.out")
direct_ranks=$(awk '/^cpu/ {print $2 + $3}' "$d/ranks.cpu" | sort -g | tr '\n' ' ')

gb=$(awk -v b="$bytes" 'BEGIN {print b / 1e9}')
per() { for s in $1; do awk -v s="$s" -v g="$gb" 'BEGIN {printf "%.2f ", s / g}'; done; }
sum() { awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; print s}' <<<"$1"; }
maxv() { awk '{m = 0; for (i = 1; i <= NF; i++) if ($i > m) m = $i; print m}' <<<"$1"; }
echo "payload moved: $bytes bytes (from the routers' link statistics)"
if [ "$COMPRESSION" != off ]; then
    # The sending router's link: compression setting, the mode auto chose, and
    # the goodput it measured in each mode (uncompressed bytes per busy second).
    for f in "$d"/stats/router-*-link-*-out.json; do
        grep -q '"payload_raw_out":[1-9]' "$f" || continue
        grep -o '"compression[a-z_]*":[^,]*\|"goodput_[a-z]*_bps":[0-9]*\|"auto_[a-z_]*":[0-9]*' "$f" | tr '\n' ' '
        echo
    done
fi
echo "routed: $routed_bw MB/s; CPU s/GB ranks: $(per "$routed_ranks")routers: $(per "$routers")"
echo "direct: $direct_bw MB/s; CPU s/GB ranks: $(per "$direct_ranks")"
echo "router threads: CPU s/GB $(per "$router_threads")"
rt=$(sum "$routed_ranks $routers"); dt=$(sum "$direct_ranks")
rm_=$(maxv "$routed_ranks $routers"); dm=$(maxv "$direct_ranks")
rtm=$(maxv "$routed_ranks $router_threads")
awk -v rt="$rt" -v dt="$dt" -v rm="$rm_" -v rtm="$rtm" -v dm="$dm" -v g="$gb" 'BEGIN {
    printf "total CPU per GB: routed %.2f s, direct %.2f s (%.2fx)\n", rt / g, dt / g, rt / dt
    printf "bound with one core per process (busiest process): routed %.0f MB/s, direct %.0f MB/s, ratio %.2f\n", g * 1e3 / rm, g * 1e3 / dm, dm / rm
    printf "bound with one core per thread (busiest rank or router thread): routed %.0f MB/s, ratio %.2f\n", g * 1e3 / rtm, dm / rtm
}'
