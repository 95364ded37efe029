#!/usr/bin/env bash
# The four papers' experiments on this machine, with sites emulated by metampi's routers, and
# docs/papers.md written with the papers' figures, ours and the ratios that matter:
#   1. PACX-MPI's URANUS table: apps/uranus.c, 1 site of N ranks against 2 sites of N/2 over
#      the SC97 line, three variants, then the same with compression, with both of SC97's
#      2 Mbit/s lines striped, and with METAMPI_ASYNC_PROGRESS;
#   2. PACX-MPI's P3T-DSMC table: apps/dsmc.c at the paper's particles per CPU;
#   3. MetaMPICH's ping-pong per router interconnect (Fast Ethernet, ATM, Gigabit), PNG plots;
#   4. ScaMPI's barrier and all-to-all tables over the rank counts this machine can run (more
#      ranks than cores are marked oversubscribed), with MPICH or Open MPI beside them;
#   5. an SC99 Table 1-style psrsearch run over 3 sites at SC99's measured link rates.
#
#   bash bench/papers.sh            # about 15 minutes here
#   SCALE=10 NRANKS=2 bash bench/papers.sh
#
# Scaling (docs/papers.md says it again): every time of the paper's setting is divided by
# SCALE (default 10): the line's rate is multiplied by it and its delay divided by it, and the
# programs' work per cell or particle is calibrated here so that one site's compute time per
# iteration is the paper's divided by SCALE. The bytes that cross the line per iteration are
# the paper's own (for URANUS, the two-site overhead it measured times the line rate), so the
# ratio of computation to communication, and of both to the delay, is the paper's.
# Raw output goes to bench/results/DATE/papers/.
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${SCALE:-10}
n=${NRANKS:-2}
if [ $((n % 2)) -ne 0 ] || [ "$n" -lt 2 ]; then
    echo "NRANKS must be even (two sites of NRANKS/2): $n" >&2
    exit 2
fi
for tool in mpicc.mpich python3; do
    command -v "$tool" >/dev/null || { echo "papers.sh needs $tool" >&2; exit 1; }
done
cargo build --release -q -p metampi-cli -p metampi-abi -p psrsearch
m=target/release/metampi
raw=bench/results/$(date +%F)/papers
mkdir -p "$raw" docs/papers
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc.mpich -O2 -o "$work/uranus" apps/uranus.c -lm
mpicc.mpich -O2 -o "$work/dsmc" apps/dsmc.c -lm
mpicc.mpich -O2 -o "$work/osu_like" bench/c/osu_like.c
cores=$(nproc)
echo "scale=$scale ranks=$n cores=$cores host=$(uname -n) date=$(date -Is)" > "$raw/setting.txt"

# A two-site description: sites a and b of $1 ranks each, port base $2, then PAIR options
# ($3) and the link lines ($4, default one link each way).
two_sites() {
    local file=$work/$5.cfg
    printf 'PORTBASE %s\nMETAHOST a { LAUNCH = local; NPROCS = %s; NODES = a0; }\nMETAHOST b { LAUNCH = local; NPROCS = %s; NODES = b0; }\nPAIR a b 1 - { %s }\n%s\n' \
        "$2" "$1" "$1" "$3" "${4:-a0 <-> b0}" > "$file"
    echo "$file"
}
# The SC97 line, scaled: 2 Mbit/s and 70 ms one way.
rate_kbit=$((2000 * scale))
delay_us=$((70000 / scale))
line="BANDWIDTH = ${rate_kbit}kbit; LATENCY = ${delay_us}us;"
half=$((n / 2))
one_site() { "$m" run --timeout 1800 -n "$n" "$@"; }
on() { local cfg=$1; shift; "$m" run --timeout 1800 --meta "$cfg" "$@"; }
value() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

# ---- 1. URANUS ----
# The paper's unchanged code lost 54.3 s in 10 iterations to the 2 Mbit/s line. A blocking
# halo exchange sends one way, then the other: about 0.68 MB each way per iteration if all of
# the loss was transfer. Five variables, two layers: 80 bytes per face cell, so a face of
# 92 x 92 cells. (Compute and face both grow with the face's area, so the smaller grid of the
# convergence runs keeps the ratio at the same work per cell.)
grid=16x92x92
off=$(two_sites "$half" 23800 "$line COMPRESSION = off;" "" sc97)
zstd=$(two_sites "$half" 23820 "$line COMPRESSION = zstd;" "" sc97-zstd)
striped=$(two_sites "$half" 23840 "$line COMPRESSION = off;" 'a0 <-> b0 \
  a0 <-> b0' sc97-striped)
target=$(python3 -c "print(10.24 / $scale)")
echo "# URANUS: calibrating the work per cell for ${target} s of sweeping per iteration" >&2
s0=$(one_site "$work/uranus" --grid $grid --iters 2 --work 0 | value sweep)
s1=$(one_site "$work/uranus" --grid $grid --iters 2 --work 100 | value sweep)
uw=$(python3 -c "print(max(1, round(100 * ($target * 2 - $s0) / ($s1 - $s0))))")
echo "calibration uranus sweep(work=0)=$s0 sweep(work=100)=$s1 (2 iterations) work=$uw" >> "$raw/setting.txt"
{
    for variant in blocking overlap pipelined; do
        for where in one two; do
            if [ $where = one ]; then
                r=$(one_site "$work/uranus" --variant $variant --grid $grid --iters 10 --work "$uw")
            else
                r=$(on "$off" "$work/uranus" --variant $variant --grid $grid --iters 10 --work "$uw")
            fi
            echo "uranus-table where=$where $r"
        done
    done
    for variant in blocking overlap; do
        echo "uranus-zstd where=two $(on "$zstd" "$work/uranus" --variant $variant --grid $grid --iters 10 --work "$uw")"
        echo "uranus-striped where=two $(on "$striped" "$work/uranus" --variant $variant --grid $grid --iters 10 --work "$uw")"
    done
    # A progress thread moves the nonblocking transfers while the ranks compute.
    for variant in overlap pipelined; do
        echo "uranus-async where=two $(METAMPI_ASYNC_PROGRESS=1 on "$off" "$work/uranus" --variant $variant --grid $grid --iters 10 --work "$uw")"
    done
    # Iterations to converge: the pipelined variant's extra sweeps (the paper: about 10%),
    # on a smaller grid with the same ratio of sweep time to line time.
    for variant in blocking pipelined; do
        echo "uranus-converge where=two $(on "$off" "$work/uranus" --variant $variant --grid 16x24x24 --tol 1 --work "$uw" --max-iters 2000)"
    done
} | tee "$raw/uranus.txt"

# ---- 2. P3T-DSMC ----
target=$(python3 -c "print(0.05 / $scale)")
echo "# DSMC: calibrating the work per particle for ${target} s per step at 1935 particles" >&2
d0=$(one_site "$work/dsmc" --particles 1935 --steps 40 --work 0 | value per_step)
d1=$(one_site "$work/dsmc" --particles 1935 --steps 40 --work 400 | value per_step)
dw=$(python3 -c "print(max(1, round(400 * ($target - $d0) / ($d1 - $d0))))")
echo "calibration dsmc per_step(work=0)=$d0 per_step(work=400)=$d1 work=$dw" >> "$raw/setting.txt"
dsmc_cfg=$(two_sites "$half" 23860 "$line COMPRESSION = off;" "" dsmc)
{
    for p in 1935 3906 7812 15625 31250; do
        steps=$((40 * 1935 / p + 10))
        echo "dsmc-table where=one $(one_site "$work/dsmc" --particles $p --steps $steps --work "$dw")"
        echo "dsmc-table where=two $(on "$dsmc_cfg" "$work/dsmc" --particles $p --steps $steps --work "$dw")"
        echo "dsmc-blocking where=two $(on "$dsmc_cfg" "$work/dsmc" --particles $p --steps $steps --work "$dw" --exchange blocking)"
        echo "dsmc-async where=two $(METAMPI_ASYNC_PROGRESS=1 on "$dsmc_cfg" "$work/dsmc" --particles $p --steps $steps --work "$dw")"
    done
} | tee "$raw/dsmc.txt"

# ---- 3. MetaMPICH ping-pong per router interconnect ----
# One rank per site, the routers' link shaped to each interconnect's rate; no added delay
# (the routers sat on one LAN). The paper's saturation: 9, 11 and 23 MB/s.
port=23880
for net in "fast-ethernet:100Mbit:Fast Ethernet (100 Mbit/s)" "atm:155Mbit:ATM OC-3 (155 Mbit/s)" \
    "gigabit:1000Mbit:Gigabit Ethernet (1000 Mbit/s)"; do
    IFS=: read -r name rate label <<<"$net"
    cfg=$(two_sites 1 $port "BANDWIDTH = $rate; COMPRESSION = off;" "" "pp-$name")
    port=$((port + 20))
    on "$cfg" "$m" bench --ops pingpong --sizes 1:4M --iters-scale 0.05 \
        --label "$label" --json "$raw/pingpong-$name.json" > "$raw/pingpong-$name.txt"
done
"$m" bench plot --output docs/papers/metampich-pingpong.png \
    "$raw/pingpong-fast-ethernet.json" "$raw/pingpong-atm.json" "$raw/pingpong-gigabit.json" >/dev/null

# ---- 4. ScaMPI barrier and all-to-all ----
# 256 KiB blocks: "long messages". The peer is MPICH where each rank has a core, Open MPI
# where ranks outnumber cores (MPICH's polling ranks starve each other there).
for p in 2 4 8; do
    "$m" bench -n $p --ops barrier,alltoall --sizes 0,256K --iters-scale 0.2 \
        --json "$raw/scampi-metampi-$p.json" > "$raw/scampi-metampi-$p.txt"
    if [ $p -le "$cores" ]; then
        mpiexec.mpich -n $p "$work/osu_like" barrier,alltoall 0,262144 0.2 "MPICH" \
            "$raw/scampi-peer-$p.json" > "$raw/scampi-peer-$p.txt"
    elif command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
        mpicc.openmpi -O2 -o "$work/osu_like_ompi" bench/c/osu_like.c
        mpirun.openmpi --allow-run-as-root --oversubscribe -n $p "$work/osu_like_ompi" \
            barrier,alltoall 0,262144 0.2 "Open MPI" "$raw/scampi-peer-$p.json" > "$raw/scampi-peer-$p.txt"
    fi
done

# ---- 5. SC99 Table 1 ----
# Manchester holds the data; Stuttgart at 0.8 MB/s and Pittsburgh at 0.5 MB/s, as measured
# at SC99 (not scaled: the search's own data sets the time).
cat > "$work/sc99.cfg" <<CFG
PORTBASE 23960
METAHOST manchester { LAUNCH = local; NPROCS = 3; NODES = man0; }
METAHOST stuttgart { LAUNCH = local; NPROCS = 2; NODES = stu0; }
METAHOST pittsburgh { LAUNCH = local; NPROCS = 2; NODES = pit0; }
PAIR manchester stuttgart 1 - { BANDWIDTH = 6400kbit; LATENCY = 15ms; COMPRESSION = off; }
man0 <-> stu0
PAIR manchester pittsburgh 1 - { BANDWIDTH = 4000kbit; LATENCY = 45ms; COMPRESSION = off; }
man0 <-> pit0
PAIR stuttgart pittsburgh 1 - { BANDWIDTH = 4000kbit; LATENCY = 50ms; COMPRESSION = off; }
stu0 <-> pit0
CFG
target/release/psrsearch demo --meta "$work/sc99.cfg" --out-dir "$work/psr" > "$raw/sc99.txt" 2>&1 || {
    echo "psrsearch over the SC99 sites failed: $raw/sc99.txt" >&2
    exit 1
}

python3 bench/papers_report.py "$raw" docs/papers.md
echo "wrote docs/papers.md (raw output in $raw)"
