#!/bin/bash
# Alternating rounds: session start (915f42a) against HEAD, metampi bench on shared memory.
OUT=/tmp/ab; rm -rf $OUT; mkdir -p $OUT
for r in 1 2 3 4; do
  for v in base new; do
    if [ $v = base ]; then B=/tmp/base50-target/release/metampi; else B=/work/main/target/release/metampi; fi
    $B bench -n 2 --ops pingpong,bw,bibw,allreduce --sizes 8,4K,64K,1M --json $OUT/$v-$r.json > $OUT/$v-$r.txt 2>&1
  done
done
python3 - <<'PY'
import json,glob,statistics as st
rows={}
for f in sorted(glob.glob('/tmp/ab/*.json')):
    v=f.split('/')[-1].split('-')[0]
    for r in json.load(open(f))['results']:
        k=(r['op'],r['bytes'])
        val=r.get('mbps') if r['op'] in ('bw','bibw') else r['median_us']
        rows.setdefault(k,{}).setdefault(v,[]).append(val)
print("op bytes | base (per round) | new (per round) | ratio new/base of medians (time; for bw base/new)")
for k,d in sorted(rows.items()):
    b,n=d.get('base',[]),d.get('new',[])
    if not b or not n: continue
    mb,mn=st.median(b),st.median(n)
    ratio = (mb/mn) if k[0] in ('bw','bibw') else (mn/mb)
    print(f"{k[0]:9s} {k[1]:8d} | {' '.join(f'{x:.2f}' for x in b)} | {' '.join(f'{x:.2f}' for x in n)} | {ratio:.2f}")
PY
