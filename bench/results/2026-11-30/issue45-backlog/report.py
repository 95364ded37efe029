import json,glob,sys,statistics as st
rows={}
for f in sorted(glob.glob(sys.argv[1]+'/[ab]-[0-9]*.json')):
    v=f.split('/')[-1].split('-')[0]
    for r in json.load(open(f))['results']:
        k=(r['op'],r['bytes'])
        val=r.get('mbps') if r['op'] in ('bw','bibw') else r['median_us']
        rows.setdefault(k,{}).setdefault(v,[]).append(val)
print("op bytes | a (per pair) | b (per pair) | b/a of medians as time (< 1: b faster)")
for k,d in sorted(rows.items()):
    a,b=d.get('a',[]),d.get('b',[])
    if not a or not b: continue
    ma,mb=st.median(a),st.median(b)
    ratio=(ma/mb) if k[0] in ('bw','bibw') else (mb/ma)
    print(f"{k[0]:9s} {k[1]:8d} | {' '.join(f'{x:.1f}' for x in a)} | {' '.join(f'{x:.1f}' for x in b)} | {ratio:.2f}")
