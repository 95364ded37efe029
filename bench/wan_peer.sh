#!/usr/bin/env bash
# metampi across two sites against Open MPI on the same wide-area link, in one
# go: two network namespaces joined by a veth pair that `tc tbf` limits in both
# directions (bench/netns-testbed.sh), NA ranks in one, NB in the other.
# metampi's ranks reach the other site through its two routers (one link,
# compression off unless COMPRESSION= says otherwise); Open MPI's ranks connect
# to each other directly over the veth, as a flat MPI world spread over two
# sites does. Same operations, sizes and iteration counts on both sides
# (bench/c/osu_like.c); point-to-point runs between rank 0 and rank NA (the
# first rank of the second site). Open MPI is the peer because NA + NB ranks
# outnumber this machine's cores (MPICH busy-polls and collapses there).
# Each side's sweep runs ROUNDS times, alternating; each point keeps its best.
#
#   bash bench/wan_peer.sh                    # RATE=100mbit NA=4 NB=4
#   RATE=1gbit NA=2 NB=2 OPS=bw,allreduce SIZES=65536,1048576 bash bench/wan_peer.sh
#   RATE= bash bench/wan_peer.sh              # the veth unshaped
#
# Needs root, iproute2 and network namespaces: skips with a message without them.
# The bench's send buffers hold constant bytes: with COMPRESSION=lz4 or auto the
# routers shrink them to almost nothing, so keep it off for a like-for-like run.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE-100mbit}
NA=${NA:-4}
NB=${NB:-4}
OPS=${OPS:-pingpong,bw,barrier,bcast,allreduce,alltoall}
SIZES=${SIZES:-8,1024,65536,1048576}
SCALE=${SCALE:-0.05}
ROUNDS=${ROUNDS:-2}
export COMPRESSION=${COMPRESSION:-off}
out=${OUT:-target/bench/wan_peer}
mkdir -p "$out"
out=$(realpath "$out")

if [ "$(id -u)" != 0 ] || ! ip netns add mp-probe 2>/dev/null; then
    echo "SKIP: network namespaces cannot be made here (needs root and iproute2)"
    exit 0
fi
ip netns del mp-probe
if ! command -v mpicc.openmpi >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) >/dev/null
fi
mpicc.openmpi -O2 -w -o "$out/osu_like_peer" bench/c/osu_like.c
cargo build --release -q -p metampi-cli
M=$(realpath "${CARGO_TARGET_DIR:-target}/release/metampi")

bash bench/netns-testbed.sh down
bash bench/netns-testbed.sh up "$RATE"
trap 'bash bench/netns-testbed.sh down' EXIT
NA=$NA NB=$NB bash bench/netns-testbed.sh config >"$out/sites.cfg"

# Open MPI starts its daemon on the second site through an "rsh agent": this
# one runs the command in that site's namespace. Each site also gets a host
# name of its own (a UTS namespace), since both share this machine's.
cat >"$out/agent.sh" <<'AGENT'
#!/bin/sh
host=$1; shift
case "$host" in
    10.77.0.1) ns=mpa ;;
    10.77.0.2) ns=mpb ;;
    *) echo "agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec $ns unshare --uts sh -c "hostname $ns; $*"
AGENT
chmod +x "$out/agent.sh"
peer="mpirun.openmpi --allow-run-as-root --oversubscribe --host 10.77.0.1:$NA,10.77.0.2:$NB -n $((NA + NB))"
peer="$peer --mca plm_rsh_agent $out/agent.sh --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24"

echo "link: ${RATE:-unshaped} each way (tc tbf on a veth pair); $NA + $NB ranks; metampi compression $COMPRESSION"
for r in $(seq "$ROUNDS"); do
    timeout 900 "$M" run --meta "$out/sites.cfg" "$M" bench --ops "$OPS" --sizes "$SIZES" \
        --iters-scale "$SCALE" --pair "0,$NA" --label metampi --json "$out/metampi.$r.json" >/dev/null
    timeout 900 ip netns exec mpa unshare --uts sh -c "hostname mpa; exec $peer \
        $out/osu_like_peer $OPS $SIZES $SCALE openmpi $out/peer.$r.json 0,$NA"
done
python3 bench/compare_report.py "$out" "$ROUNDS" openmpi
"$M" bench plot "$out/metampi.json" "$out/peer.json" -o "$out/compare.svg" >/dev/null
echo "plot: $out/compare.svg"
