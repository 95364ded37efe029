#!/usr/bin/env bash
# Flat against hierarchical (topology-aware) collectives on 3 emulated meta
# hosts of 4 ranks joined by 100 Mbit/s, 20 ms links, in one go: 1 MiB
# broadcast and all-reduce, median time per operation.
set -euo pipefail
cd "$(dirname "$0")/.."
# M=path/to/metampi measures that build instead.
if [ -z "${M:-}" ]; then
    cargo build --release -q -p metampi-cli
    M=${CARGO_TARGET_DIR:-target}/release/metampi
fi
d=$(mktemp -d)
trap 'rm -rf "$d"; pkill -f "metampi router" || true' EXIT
cat > "$d/sites.cfg" <<'CFG'
PORTBASE 27600
METAHOST a { LAUNCH = local; NPROCS = 4; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 4; NODES = b0; }
METAHOST c { LAUNCH = local; NPROCS = 4; NODES = c0; }
PAIR a b 1 - { BANDWIDTH = 100Mbit; LATENCY = 20ms; COMPRESSION = off; }
a0 <-> b0
PAIR a c 1 - { BANDWIDTH = 100Mbit; LATENCY = 20ms; COMPRESSION = off; }
a0 <-> c0
PAIR b c 1 - { BANDWIDTH = 100Mbit; LATENCY = 20ms; COMPRESSION = off; }
b0 <-> c0
CFG
med() { awk -v op="$1" '/^# [a-z]+ \(/ {found = ($2==op); next} found && $1 ~ /^[0-9]+$/ {print $4; exit}'; }
run() { # ALGSPEC OPS
    METAMPI_COLL_ALG="$1" $M run --meta "$d/sites.cfg" -x METAMPI_COLL_ALG $M bench --ops "$2" --sizes 1M --iters-scale 0.0001
}
# Incompressible payloads are not needed: compression is off on these links.
fb=$(run "bcast=scatter_allgather" bcast | med bcast)
fb2=$(run "bcast=binomial" bcast | med bcast)
hb=$(run "bcast=hierarchical" bcast | med bcast)
fa=$(run "allreduce=rabenseifner" allreduce | med allreduce)
fa2=$(run "allreduce=recursive_doubling" allreduce | med allreduce)
ha=$(run "allreduce=hierarchical" allreduce | med allreduce)
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-30s %12s %14s %8s %s\n' "1 MiB, 3 sites x 4 ranks" "flat (us)" "hierarchical" "speedup" target
printf '%-30s %12s %14s %8s %s\n' "broadcast (scatter+allgather)" "$fb" "$hb" "$(r "$fb" "$hb")" ">= 3"
printf '%-30s %12s %14s %8s %s\n' "broadcast (binomial)" "$fb2" "$hb" "$(r "$fb2" "$hb")" ""
printf '%-30s %12s %14s %8s %s\n' "all-reduce (Rabenseifner)" "$fa" "$ha" "$(r "$fa" "$ha")" ">= 2"
printf '%-30s %12s %14s %8s %s\n' "all-reduce (recursive dbl)" "$fa2" "$ha" "$(r "$fa2" "$ha")" ""
echo "(flat = the algorithm the flat selection uses for 1 MiB on 12 ranks; binomial and recursive doubling shown too)"
