#!/usr/bin/env python3
# A 2-site job (1+1 ranks) runs `metampi bench --ops bw` twice without and twice with 2000 silent TCP
# connections held against its routers' link ports: the routers' cost of strangers, as throughput.
#   python3 bench/router_strangers.py   (after cargo build --release -p metampi-cli; raise ulimit -n to 8192)
import socket, subprocess, sys, time, os, re
exe = "target/release/metampi"
cfg = "/tmp/silent.meta"
open(cfg, "w").write("PORTBASE 28600\nMETAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\nMETAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }\nPAIR a b 1\na0 <-> b0\n")
def run(n):
    socks = []
    job = subprocess.Popen([exe, "run", "--meta", cfg, exe, "bench", "--ops", "bw", "--sizes", "64K,1M", "--iters-scale", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while n and time.time() - t0 < 10:
        try:
            s = socket.socket(); s.connect(("127.0.0.1", 28600)); socks.append(s); break
        except OSError:
            time.sleep(0.01)
    for i in range(n - len(socks)):
        try:
            s = socket.socket(); s.connect(("127.0.0.1", 28600 + (i % 2))); socks.append(s)
        except OSError as e:
            print("connect failed after", i, e); break
    if n: print("held", len(socks), "within", round(time.time() - t0, 2), "s")
    out, err = job.communicate()
    for s in socks: s.close()
    rows = [l for l in out.splitlines() if re.match(r"\s+(65536|1048576)\s", l)]
    print(f"{n} silent connections held: ", " | ".join(" ".join(r.split()[i] for i in (0, 7)) + " MB/s" for r in rows), "; refused lines:", sum('refused' in l for l in err.splitlines()))
for n in (0, 2000, 0, 2000):
    run(n)
