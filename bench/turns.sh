#!/usr/bin/env bash
# The cost of waiting: ranks take turns computing for 50 us to 3 ms before an
# 8-byte all-reduce (crates/metampi/examples/turns.rs, bench/c/turns.c). A
# rank that sleeps while it waits pays for its wake-up, which costs hundreds
# of microseconds in some virtual machines; MPICH and Open MPI spin. Runs
# metampi with its learnt spin budget, with the budget fixed where it starts
# (METAMPI_SPIN_US: 200 us, 1000 where ranks outnumber cores; the budgets
# before they learnt), and the peer, ROUNDS times alternating (default 3),
# and prints each run's overhead per iteration.
#
#   bash bench/turns.sh [RANKS]          # PEER=openmpi for Open MPI
#   SITES=1 bash bench/turns.sh          # 2 meta hosts of 1 rank: the all-reduce
#                                        # goes through 2 routers; against direct
#                                        # TCP between 2 emulated machines
#   M=/tmp/metampi-old SITES=1 bash bench/turns.sh   # that build's launcher and routers
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-2}
ROUNDS=${ROUNDS:-3}
PEER=${PEER:-mpich}
T=${CARGO_TARGET_DIR:-target}
out=$T/bench
mkdir -p "$out"
cargo build --release -q -p metampi-cli -p metampi --example turns
M=${M:-$T/release/metampi}
EX=$T/release/examples/turns
overheads() { awk '{printf " %7s", $(NF-1)} END {print ""}'; }
printf '%-24s %7s %7s %7s %7s %7s   (overhead per iteration, us)\n' "work (us):" 50 150 300 1000 3000
if [ "${SITES:-0}" = 1 ]; then
    d=$(mktemp -d)
    trap 'rm -rf "$d"' EXIT
    cat >"$d/sites.cfg" <<CFG
PORTBASE 27800
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 1 - { COMPRESSION = off; }
a0 <-> b0
CFG
    for r in $(seq "$ROUNDS"); do
        printf '%-24s' "routed (2 routers)"
        "$M" run --meta "$d/sites.cfg" "$EX" | overheads
        printf '%-24s' "direct TCP"
        "$M" run --launch local --hosts m0:1,m1:1 -n 2 "$EX" | overheads
    done
    exit 0
fi
if [ "$PEER" = mpich ]; then
    command -v mpicc.mpich >/dev/null ||
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich libmpich-dev) >/dev/null
    mpicc.mpich -O2 -o "$out/turns_peer" bench/c/turns.c
    peer=(mpiexec.mpich -n "$RANKS" "$out/turns_peer")
else
    command -v mpicc.openmpi >/dev/null ||
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) >/dev/null
    mpicc.openmpi -O2 -o "$out/turns_peer" bench/c/turns.c
    peer=(mpirun.openmpi --allow-run-as-root --oversubscribe -n "$RANKS" "$out/turns_peer")
fi
fixed=200
[ "$RANKS" -gt "$(nproc)" ] && fixed=1000
for r in $(seq "$ROUNDS"); do
    printf '%-24s' "metampi (learnt)"
    "$M" run -n "$RANKS" "$EX" | overheads
    printf '%-24s' "metampi (fixed $fixed us)"
    METAMPI_SPIN_US=$fixed "$M" run -n "$RANKS" "$EX" | overheads
    printf '%-24s' "$PEER"
    "${peer[@]}" | overheads
done
