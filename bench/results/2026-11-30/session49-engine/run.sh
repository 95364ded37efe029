#!/usr/bin/env bash
# Session 49's engine changes (poller election's pass_on, collectives as PassWork) against the
# session's start (a89a0aa): alternating rounds of `metampi bench` on 2 ranks, and the
# thread-pair ping-pong that exercises the election. OLD: the old build's metampi binary.
# Usage: OLD=/tmp/old/target/release/metampi bash run.sh [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
new=$(cd "$here/../../../.." && pwd)/target/release/metampi
old=${OLD:?the old build\'s metampi binary}
rounds=${1:-3}
for r in $(seq 1 "$rounds"); do
    for side in old new; do
        bin=$old; [ "$side" = new ] && bin=$new
        "$bin" bench -n 2 --ops pingpong,bw,barrier,allreduce --sizes 8,4K,64K,1M \
            --label "$side" --json "$here/$side.$r.json" > /dev/null
        "$bin" bench -n 2 --ops pingpong_mt --threads 4 --sizes 8,4K \
            --label "$side" --json "$here/$side.mt.$r.json" > /dev/null
    done
done
python3 - "$here" "$rounds" <<'PY'
import json, statistics, sys
here, rounds = sys.argv[1], int(sys.argv[2])
def load(side, tag):
    out = {}
    for r in range(1, rounds + 1):
        d = json.load(open(f"{here}/{side}.{tag}{r}.json"))
        for row in d["results"]:
            key = (row["op"], row["bytes"])
            out.setdefault(key, []).append(row.get("median_us", row.get("us")))
    return out
for tag in ["", "mt."]:
    o, n = load("old", tag), load("new", tag)
    for k in sorted(o):
        mo, mn = statistics.median(o[k]), statistics.median(n[k])
        spread = (max(o[k]) - min(o[k])) / mo if mo else 0
        print(f"{k[0]:12s} {k[1]:>8d}  old {mo:10.2f}  new {mn:10.2f}  new/old {mn/mo:5.2f}  (old spread {spread:.0%})")
PY
