#!/usr/bin/env python3
"""Writes docs/papers.md from the raw output of bench/papers.sh.

    python3 bench/papers_report.py RAW_DIR OUT.md
"""
import json
import os
import re
import sys

raw, out = sys.argv[1], sys.argv[2]


def read(name):
    with open(os.path.join(raw, name)) as f:
        return f.read()


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


setting = read("setting.txt")
first = fields(setting.splitlines()[0])
scale = float(first["scale"])
ranks = int(first["ranks"])
cores = int(first["cores"])
calibration = [l for l in setting.splitlines()[1:] if l.startswith("calibration")]


def rows(name, kind):
    found = []
    for line in read(name).splitlines():
        if line.startswith(kind + " "):
            found.append(fields(line))
    return found


def pct(a, b):
    return f"{100.0 * (a - b) / b:+.0f}%"


md = []
w = md.append
w("# The papers' experiments, reproduced on emulated sites")
w("")
w(f"Written by `bash bench/papers.sh` on {first['date'][:10]} ({first['host']}, {cores} cores); "
  f"raw output in `{raw}`. Sites are emulated on this one machine by metampi's routers, "
  "which shape each link to the rate and delay named in the description file.")
w("")
w(f"**Scaling.** Every time of a paper's setting is divided by {scale:g}: a line's rate is "
  f"multiplied by {scale:g} and its delay divided by it, and the programs' work per cell or "
  f"particle is calibrated so that one site's compute time is the paper's divided by {scale:g}. "
  "The bytes that cross the line are the paper's own, so the ratios of computation to "
  "transfer and to delay are the paper's. Times below are shown as measured and multiplied "
  f"back by {scale:g} (\"as paper\"), next to the paper's. The ratio that matters is the "
  "two-site overhead, which scaling leaves alone.")
w("")
w(f"**Ranks.** The papers used 60-128 nodes per configuration; here one site of {ranks} ranks "
  f"runs against two sites of {ranks // 2}, on {cores} cores (routers share them).")
w("")
for c in calibration:
    w(f"- {c}")
w("")

# ---- URANUS ----
paper = {"blocking": ("unchanged", 102.4, 156.7), "overlap": ("modified", 91.2, 150.5),
         "pipelined": ("pipelined", None, 116.7)}
table = rows("uranus.txt", "uranus-table")
by = {(r["variant"], r["where"]): float(r["time"]) for r in table}
base = by.get(("blocking", "one"))
w("## PACX-MPI: URANUS, 10 iterations (seconds)")
w("")
w("`apps/uranus.c`: a 3-D grid of 5 variables, a two-cell overlap, one relaxation sweep and a "
  "residual all-reduce per iteration; 16 x 92 x 92 cells, so that each iteration sends about "
  "0.68 MB each way across the cut between the sites: the paper's two-site loss of the unchanged "
  "code (54.3 s over 10 iterations) times the 2 Mbit/s line's rate, halved because a blocking "
  "exchange sends one way and then the other. The line: "
  f"{2 * scale:g} Mbit/s and {70 / scale:g} ms (SC97's 2 Mbit/s and 70 ms, scaled).")
w("")
w("| variant | paper, 1 machine | paper, 2 machines | paper overhead | ours, 1 site (as paper) "
  "| ours, 2 sites (as paper) | our overhead |")
w("|---|---|---|---|---|---|---|")
for v, (name, p1, p2) in paper.items():
    one, two = by.get((v, "one")), by.get((v, "two"))
    if one is None or two is None:
        continue
    p_over = pct(p2, p1 if p1 else 102.4) + ("" if p1 else " (vs unchanged)")
    w(f"| {name} (`--variant {v}`) | {p1 if p1 else '-'} | {p2} | {p_over} | "
      f"{one:.2f} ({one * scale:.1f}) | {two:.2f} ({two * scale:.1f}) | {pct(two, one)} |")
w("")
extra = (rows("uranus.txt", "uranus-zstd") + rows("uranus.txt", "uranus-striped")
         + rows("uranus.txt", "uranus-async"))
if extra:
    w("What metampi adds, on the same two sites (overhead against the same variant on one "
      "site):")
    w("")
    w("| setting | variant | ours, 2 sites (as paper) | overhead |")
    w("|---|---|---|---|")
    for kind, label in (("uranus-zstd", "`COMPRESSION = zstd` on the line"),
                        ("uranus-striped", "both of SC97's 2 Mbit/s lines, striped (two links)"),
                        ("uranus-async", "`METAMPI_ASYNC_PROGRESS=1` (transfers move while ranks "
                         "compute)")):
        for r in rows("uranus.txt", kind):
            t = float(r["time"])
            one = by.get((r["variant"], "one"))
            w(f"| {label} | {r['variant']} | {t:.2f} ({t * scale:.1f}) | "
              f"{pct(t, one) if one else '-'} |")
    w("")
conv = {r["variant"]: r for r in rows("uranus.txt", "uranus-converge")}
if "blocking" in conv and "pipelined" in conv:
    b, p = int(conv["blocking"]["iters"]), int(conv["pipelined"]["iters"])
    w(f"Iterations to converge (16 x 24 x 24 cells, the same work per cell, residual below "
      f"{conv['blocking']['residual'][:8]}..., 2 sites): blocking {b}, pipelined {p} "
      f"({pct(p, b)}; the paper: about +10%). Pipelined time "
      f"{float(conv['pipelined']['time']):.1f} s against {float(conv['blocking']['time']):.1f} s.")
    w("")

# ---- DSMC ----
paper_dsmc = {1935: (0.05, 0.28), 3906: (0.1, 0.31), 7812: (0.2, 0.31), 15625: (0.4, 0.4),
              31250: (0.81, 0.81)}
d = {}
for kind in ("dsmc-table", "dsmc-blocking", "dsmc-async"):
    for r in rows("dsmc.txt", kind):
        d[(kind, r["where"], int(r["per_rank"]))] = float(r["per_step"])
w("## PACX-MPI: P3T-DSMC, seconds per time step")
w("")
w("`apps/dsmc.c`: particles move, migrate to the neighbouring slab and collide in pairs within "
  "cells; a step talks only to its two neighbours. `overlap` sends migrants nonblocking and "
  "collides meanwhile; `blocking` exchanges them first (counts, then particles).")
w("")
w("| particles/CPU | paper, 60 nodes | paper, 2 x 30 | paper ratio | ours, 1 site (as paper) | "
  "ours, 2 sites overlap (as paper) | ratio | ours, 2 sites blocking (as paper) | ratio | "
  "ours, 2 sites overlap, `METAMPI_ASYNC_PROGRESS=1` | ratio |")
w("|---|---|---|---|---|---|---|---|---|---|---|")
for p, (p1, p2) in paper_dsmc.items():
    one = d.get(("dsmc-table", "one", p))
    two = d.get(("dsmc-table", "two", p))
    blk = d.get(("dsmc-blocking", "two", p))
    asy = d.get(("dsmc-async", "two", p))
    if one is None or two is None or blk is None:
        continue
    cell = lambda t: "-" if t is None else f"{t:.4f} ({t * scale:.3f})"  # noqa: E731
    w(f"| {p} | {p1} | {p2} | {p2 / p1:.2f} | {cell(one)} | {cell(two)} | {two / one:.2f} | "
      f"{cell(blk)} | {blk / one:.2f} | {cell(asy)} | "
      f"{'-' if asy is None else f'{asy / one:.2f}'} |")
w("")

# ---- MetaMPICH ping-pong ----
nets = [("fast-ethernet", 100, 9), ("atm", 155, 11), ("gigabit", 1000, 23)]
w("## MetaMPICH: ping-pong between two sites per router interconnect")
w("")
w("One rank per site; the routers' link shaped to the interconnect's rate, no added delay. "
  "Bandwidth is message bytes over half the round trip. Plot: "
  "[metampich-pingpong.png](papers/metampich-pingpong.png).")
w("")
w("| interconnect | line (MB/s) | paper saturation (MB/s) | paper, share of line | "
  "ours, best (MB/s) | ours, share of line | ours, 1 B one way (µs) |")
w("|---|---|---|---|---|---|---|")
for name, mbit, theirs in nets:
    path = os.path.join(raw, f"pingpong-{name}.json")
    if not os.path.exists(path):
        continue
    res = [r for r in json.load(open(path))["results"] if r["op"] == "pingpong"]
    best = max((r["bytes"] / r["median_us"] for r in res if r["bytes"] > 0), default=0.0)
    small = min((r["median_us"] for r in res if r["bytes"] <= 1), default=float("nan"))
    line = mbit / 8.0
    w(f"| {json.load(open(path))['label']} | {line:.1f} | {theirs} | {theirs / line:.0%} | "
      f"{best:.1f} | {best / line:.0%} | {small:.0f} |")
w("")
w("![ping-pong over emulated router interconnects](papers/metampich-pingpong.png)")
w("")

# ---- ScaMPI ----
scampi_barrier = {2: 8.1, 4: 8.2, 8: 9.3}
scampi_a2a = {2: 30.9, 4: 35.2, 8: 36.5}


def med(path, op, size):
    if not os.path.exists(path):
        return None, None
    j = json.load(open(path))
    for r in j["results"]:
        if r["op"] == op and r["bytes"] == size:
            return r["median_us"], j.get("label", "")
    return None, None


w("## ScaMPI: barrier (µs) and all-to-all throughput per rank (MB/s), one machine")
w("")
w("ScaMPI's figures are over SCI between nodes; ours are shared memory on this machine, so "
  "the comparison that means something is with the peer MPI measured in the same run "
  "(MPICH where every rank has a core, Open MPI where ranks outnumber cores). All-to-all "
  "throughput counts what a rank sends to the others: (ranks - 1) x 256 KiB per operation.")
w("")
w("| ranks | ScaMPI barrier | ours | peer | ours/peer | ScaMPI all-to-all | ours | peer | "
  "ours/peer | note |")
w("|---|---|---|---|---|---|---|---|---|---|")
for p in (2, 4, 8):
    ob, _ = med(os.path.join(raw, f"scampi-metampi-{p}.json"), "barrier", 0)
    pb, label = med(os.path.join(raw, f"scampi-peer-{p}.json"), "barrier", 0)
    oa, _ = med(os.path.join(raw, f"scampi-metampi-{p}.json"), "alltoall", 262144)
    pa, _ = med(os.path.join(raw, f"scampi-peer-{p}.json"), "alltoall", 262144)
    if ob is None:
        continue
    tput = lambda t: (p - 1) * 262144 / t if t else None  # noqa: E731 (bytes/µs = MB/s)
    ot, pt = tput(oa), tput(pa)
    note = f"oversubscribed ({p} ranks, {cores} cores)" if p > cores else ""
    if label:
        note = (note + "; " if note else "") + f"peer: {label}"
    w(f"| {p} | {scampi_barrier[p]} | {ob:.2f} | {pb if pb is None else f'{pb:.2f}'} | "
      f"{'-' if pb is None else f'{ob / pb:.2f}'} | {scampi_a2a[p]} | {ot:.0f} | "
      f"{'-' if pt is None else f'{pt:.0f}'} | {'-' if pt is None else f'{ot / pt:.2f}'} | "
      f"{note} |")
w("")

# ---- SC99 ----
sc99 = read("sc99.txt")
w("## SC99: the pulsar search over three sites at SC99's link rates")
w("")
w("`psrsearch demo --meta` over Manchester (data and server, 3 ranks), Stuttgart (2 ranks, "
  "0.8 MB/s) and Pittsburgh (2 ranks, 0.5 MB/s): the rates the paper measured (its Table 1 "
  "gives processors and 1 MB records per site). The search's static plan decides which remote "
  "processors the links can feed, as at SC99; the lines below are the run's own.")
w("")
w("```")
keep = re.compile(r"^(link |\d+ units of|host |manchester|stuttgart|pittsburgh|warning|"
                  r"balanced|finish times|whole|distributed search|both injected|demo wall)")
for line in sc99.splitlines():
    if keep.search(line):
        w(line.rstrip())
w("```")
w("")
with open(out, "w") as f:
    f.write("\n".join(md))
