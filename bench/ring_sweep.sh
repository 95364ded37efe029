#!/usr/bin/env bash
# Shared-memory ring sizes side by side on the mid sizes (decision 0052): `metampi bench`
# 2 ranks, ping-pong, streaming and bidirectional streaming, once per ring size and round,
# the sizes alternating within each round so a slow spell of the machine lands on all of
# them. Prints the best round per point (lowest µs, highest MB/s). On a 2-core VM the spread
# between rounds reaches 2x; settle it on a machine with a core per rank (PIN=1 binds ranks).
#   bash bench/ring_sweep.sh [RINGS] [SIZES] [ROUNDS]
#   bash bench/ring_sweep.sh 131072,262144,524288 4096,16384,32768,49152,65536,131072 5
set -euo pipefail
cd "$(dirname "$0")/.."
RINGS=${1:-131072,262144,524288}
SIZES=${2:-4096,16384,32768,49152,65536,131072}
ROUNDS=${3:-3}
cargo build --release -q -p metampi-cli
out=${OUT:-target/bench/ring-sweep}
mkdir -p "$out"
# PIN=1: each rank bound to a core of its own (the launcher's METAMPI_BIND_TO).
[ "${PIN:-0}" = 0 ] || export METAMPI_BIND_TO=core
for r in $(seq "$ROUNDS"); do
    for ring in ${RINGS//,/ }; do
        METAMPI_SHM_RING=$ring target/release/metampi bench -n 2 --ops pingpong,bw,bibw \
            --sizes "$SIZES" --iters-scale 0.5 --json "$out/ring$ring.$r.json" >/dev/null
    done
done
python3 - "$out" "$RINGS" "$ROUNDS" <<'PY'
import json, sys
out, rings, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
best = {}
for ring in rings:
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/ring{ring}.{r}.json"))["results"]:
            key = (row["op"], row["bytes"], ring)
            v = row["mbps"] if row["mbps"] else row["median_us"]
            better = max if row["mbps"] else min
            best[key] = better(best.get(key, v), v)
print(f"best of {rounds} rounds; µs for pingpong, MB/s for bw and bibw")
print(f"{'op':>9} {'bytes':>8} " + " ".join(f"{'ring ' + str(int(g) >> 10) + 'K':>11}" for g in rings))
for op in ("pingpong", "bw", "bibw"):
    for size in sorted({k[1] for k in best if k[0] == op}):
        print(f"{op:>9} {size:>8} " + " ".join(f"{best[(op, size, g)]:>11.2f}" for g in rings))
PY
