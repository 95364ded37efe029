#!/usr/bin/env bash
# A two-site testbed on this machine: network namespaces mpa and mpb joined by a
# veth pair (10.77.0.1 <-> 10.77.0.2), each direction optionally limited with
# `tc tbf` (a real kernel-shaped wide-area link, unlike the routers' own emulation).
#
#   bash bench/netns-testbed.sh up [RATE]     # e.g. RATE=100mbit; default unlimited
#   bash bench/netns-testbed.sh down
#   bash bench/netns-testbed.sh config        # prints a description file for the testbed
#   bash bench/netns-testbed.sh run PROG...   # up, run PROG over the two sites, down
#
# Needs root and iproute2. Traffic stays inside the two namespaces.
set -euo pipefail
A=mpa B=mpb
cmd=${1:-}
up() {
    ip netns add $A
    ip netns add $B
    ip link add mpa-v type veth peer name mpb-v
    ip link set mpa-v netns $A
    ip link set mpb-v netns $B
    ip -n $A addr add 10.77.0.1/24 dev mpa-v
    ip -n $B addr add 10.77.0.2/24 dev mpb-v
    for ns in $A $B; do ip -n $ns link set lo up; done
    ip -n $A link set mpa-v up
    ip -n $B link set mpb-v up
    if [ -n "${1:-}" ]; then
        ip netns exec $A tc qdisc add dev mpa-v root tbf rate "$1" burst 64kb latency 50ms
        ip netns exec $B tc qdisc add dev mpb-v root tbf rate "$1" burst 64kb latency 50ms
    fi
}
down() {
    ip netns del $A 2>/dev/null || true
    ip netns del $B 2>/dev/null || true
}
config() {
    cat <<CFG
PORTBASE 29000
METAHOST a { LAUNCH = netns $A; NPROCS = ${NA:-1}; NODES = a0 (10.77.0.1); }
METAHOST b { LAUNCH = netns $B; NPROCS = ${NB:-1}; NODES = b0 (10.77.0.2); }
PAIR a b 1 - { COMPRESSION = ${COMPRESSION:-off}; }
a0 <-> b0
CFG
}
case "$cmd" in
    up) up "${2:-}" ;;
    down) down ;;
    config) config ;;
    run)
        shift
        cd "$(dirname "$0")/.."
        cargo build --release -q -p metampi-cli
        down
        up "${RATE:-}"
        trap down EXIT
        cfg=$(mktemp)
        config > "$cfg"
        target/release/metampi run --meta "$cfg" "$@"
        ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
esac
