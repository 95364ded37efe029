#!/usr/bin/env bash
# The distributed search with and without the coherent filterbank (decision 0065), on this
# 2-core machine: one 16 MHz complex channel at 820 MHz, 2 polarisations, 2^22 samples
# (0.26 s), a pulsar at DM 26.8; 32 DMs (0-62 by 2), downsampled by 32.
#   PSR=path/to/psrsearch [RUNS="1 2"] bash commands.sh > raw.txt 2>&1
# For --subchannels 1, 8 and auto (32): the single-process search, then `search --meta` on
# one emulated site of 4 ranks (a server, 3 clients) and on the demo's three sites (jodrell:
# the data, a server and 2 clients; stuttgart: 3 clients behind 100 Mbit/s; pittsburgh: 2
# behind 40 Mbit/s), scheduled service. Printed: the psrsearch output (plan, per host units,
# planned and measured finish, unit and result bytes) and the wall time of each command.
set -uo pipefail
PSR=${PSR:?set PSR to the psrsearch binary}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
echo "# $(date -u) $(uname -n) load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
"$PSR" simulate --out "$d/w16.dada" --freq 820 --bw 16 --nchan 1 --npol 2 \
  --duration 0.262144 --seed 3 --pulsar 33.13:26.8:0.05:0.3 | tail -1
printf 'METAHOST a { LAUNCH = local; NPROCS = 4; NODES = a0; }\n' > "$d/one.cfg"
cat > "$d/three.cfg" <<'CFG'
PORTBASE 14300
METAHOST jodrell { LAUNCH = local; NPROCS = 3; NODES = jb0; }
METAHOST stuttgart { LAUNCH = local; NPROCS = 3; NODES = hlrs0; }
METAHOST pittsburgh { LAUNCH = local; NPROCS = 2; NODES = psc0; }
PAIR jodrell stuttgart 1 - { BANDWIDTH = 100Mbit; LATENCY = 5ms; COMPRESSION = off; }
jb0 <-> hlrs0
PAIR jodrell pittsburgh 1 - { BANDWIDTH = 40Mbit; LATENCY = 40ms; COMPRESSION = off; }
jb0 <-> psc0
PAIR stuttgart pittsburgh 1 - { BANDWIDTH = 50Mbit; LATENCY = 30ms; COMPRESSION = off; }
hlrs0 <-> psc0
CFG
search() {
  local name=$1; shift
  echo "== $name: psrsearch search w16.dada --dm-end 62 --dm-step 2 --downsample 32 $*"
  local t0=$(date +%s.%N)
  timeout 300 "$PSR" search "$d/w16.dada" --dm-end 62 --dm-step 2 --downsample 32 --no-plots \
    --out-dir "$d/$name" "$@" 2>&1 | grep -v '^  *$'
  echo "-- $name: wall $(echo "$(date +%s.%N) - $t0" | bc) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
  sed -n '7,8p' "$d/$name/candidates.csv" 2>/dev/null
}
for run in ${RUNS:-1 2}; do
  for n in 1 8 auto; do
    search "single-$n-$run" --subchannels "$n"
    search "one-$n-$run" --subchannels "$n" --meta "$d/one.cfg" --mode scheduled
    search "three-$n-$run" --subchannels "$n" --meta "$d/three.cfg" --mode scheduled
  done
done
