#!/usr/bin/env python3
"""Side-by-side report of `metampi bench` against bench/c/osu_like.c runs.

    compare_report.py DIR ROUNDS PEER

Reads DIR/metampi.R.json and DIR/peer.R.json for R = 1..ROUNDS (the two sides'
sweeps, run alternately), keeps each point's best round on both sides alike
(lowest median time, highest bandwidth), writes DIR/metampi.json and
DIR/peer.json, and prints the median per point with the ratio metampi/peer
(for bandwidth peer/metampi), so < 1 means metampi is faster everywhere.
"""
import json
import sys


def best_of(out, side, rounds):
    runs = [json.load(open(f"{out}/{side}.{r}.json")) for r in range(1, rounds + 1)]
    best = runs[0]
    for run in runs[1:]:
        for i, row in enumerate(run["results"]):
            b = best["results"][i]
            if (row["op"], row["bytes"]) != (b["op"], b["bytes"]):
                continue
            better_bw = (row["mbps"] or 0) > (b["mbps"] or 0)
            better_time = row["mbps"] is None and row["median_us"] < b["median_us"]
            if better_bw or better_time:
                best["results"][i] = row
    json.dump(best, open(f"{out}/{side}.json", "w"))
    return best["results"]


def main():
    out, rounds, peer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    m = best_of(out, "metampi", rounds)
    p = best_of(out, "peer", rounds)
    print(f"(best of {rounds} alternating rounds per side)")
    key = {(r["op"], r["bytes"]): r for r in p}
    print(f"{'op':>10} {'bytes':>9} {'metampi':>12} {peer:>12} {'ratio':>7}   (median us; MB/s for bw)")
    for r in m:
        q = key.get((r["op"], r["bytes"]))
        if not q:
            continue
        if r["mbps"] is not None:
            a, b = r["mbps"], q["mbps"]
            ratio = b / a if a else float("inf")
        else:
            a, b = r["median_us"], q["median_us"]
            ratio = a / b if b else float("inf")
        print(f"{r['op']:>10} {r['bytes']:>9} {a:>12.2f} {b:>12.2f} {ratio:>7.2f}")
    print("ratio < 1: metampi is faster")


if __name__ == "__main__":
    main()
