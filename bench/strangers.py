#!/usr/bin/env python3
# Holds 500 silent connections against the key-value (PMI) port of a running `metampi run`
# job and reports the launcher's peak threads and descriptors, how many connections the
# server closed, and whether the job completed.   python3 bench/strangers.py target/release/metampi
import socket, subprocess, time, os, sys, re
# metampi run a short job; hold 500 silent connections against its key-value port
job = subprocess.Popen([sys.argv[1], "run", "-n", "2", "sh", "-c", "sleep 8; echo done"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(1.0)
pid = job.pid
ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
port = None
for line in ss.splitlines():
    if f"pid={pid}," in line:
        port = int(re.search(r":(\d+)\s", line.split()[3] + " ").group(1)); break
def stats():
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))
print("port", port, "threads,fds before", stats())
socks = []
for i in range(500):
    s = socket.socket(); s.connect(("127.0.0.1", port)); socks.append(s)
peak = (0, 0)
for _ in range(60):
    t, f = stats(); peak = (max(peak[0], t), max(peak[1], f)); time.sleep(0.1)
closed = 0
for s in socks:
    s.settimeout(0.01)
    try:
        closed += s.recv(1) == b""
    except Exception:
        pass
print("peak threads,fds while 500 held", peak, "closed by the server after 6 s:", closed)
out, err = job.communicate()
print("job exit", job.returncode, "stdout", out.split(), "stderr lines", err.strip().splitlines()[:3])
