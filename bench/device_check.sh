#!/usr/bin/env bash
# The measurements issues 3 and 6 still need from a machine with a core per process (the
# 16-core device machine), made easy to run there in few calls (wan took 2.4 minutes on the
# 2-core development machine, router 0.5, reader 2, plan 0.75). That machine has no cargo
# and no network, so the binaries are built here and travel with the working tree:
#
#   bash bench/device_check.sh pack            # here: stripped release builds into .dev-carry/
#   # on the device (carry .dev-carry), one stage per call, each well inside 10 minutes:
#   bash bench/device_check.sh wan             # ROUNDS=5 bench/wan.sh: routed vs direct TCP
#   bash bench/device_check.sh router          # bench/router_cpu.sh, checksums on/off, reader threads off/on
#   bash bench/device_check.sh reader          # wan.sh again with reader threads on the incoming links
#   bash bench/device_check.sh plan            # psr_plan.sh 6, ranks bound to hardware threads
#   bash bench/device_check.sh all             # all of them (about 6 minutes here)
#
# Each stage prints its figures with the issue's target beside them and keeps its whole output
# in $OUT (the device tool's folder that comes back) or target/device. M= and PSR= name other
# builds of metampi and psrsearch; DIR= another folder of packed binaries. Where cargo is here
# and nothing was packed, the stages build as the scripts they call do.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
DIR=${DIR:-.dev-carry}
out=${OUT:-target/device}

case "$stage" in
pack)
    command -v cargo >/dev/null || { echo "pack needs cargo (run it where the project builds)"; exit 2; }
    cargo build --release -q -p metampi-cli -p psrsearch
    mkdir -p "$DIR"
    T=${CARGO_TARGET_DIR:-target}
    for b in metampi psrsearch; do
        strip -o "$DIR/$b" "$T/release/$b"
    done
    ls -l "$DIR"
    echo "carry $DIR (ignored by git through .git/info/exclude: add '/$DIR/' there if it is not)"
    exit 0
    ;;
wan | router | reader | plan | all) ;;
*)
    echo "usage: bash bench/device_check.sh pack|wan|router|reader|plan|all" >&2
    exit 2
    ;;
esac

# The binaries: given, packed, or built by the called scripts.
if [ -z "${M:-}" ] && [ -x "$DIR/metampi" ]; then M=$(realpath "$DIR/metampi"); fi
if [ -z "${PSR:-}" ] && [ -x "$DIR/psrsearch" ]; then PSR=$(realpath "$DIR/psrsearch"); fi
if [ -z "${M:-}" ] || [ -z "${PSR:-}" ]; then
    command -v cargo >/dev/null ||
        { echo "no binaries: run 'bash bench/device_check.sh pack' where cargo is and carry $DIR"; exit 2; }
fi
[ -n "${M:-}" ] && export M
[ -n "${PSR:-}" ] && export PSR
mkdir -p "$out"
echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(uname -r)"

# Issue 3: rank-to-rank through two routers against direct TCP, and the emulated links.
wan() {
    echo "== issue 3: bench/wan.sh, medians of 5 rounds (targets in the last column)"
    ROUNDS=5 bash bench/wan.sh 2>&1 | tee "$out/wan.log"
}

# Where routed bandwidth goes: CPU per GB of every process, with and without payload checksums,
# and with and without reader threads on the incoming links (METAMPI_ROUTER_READER, off by
# default until this says whether they pay), taking turns.
router() {
    for c in on off; do
        for rd in 0 1 0 1; do
            echo "== issue 3: bench/router_cpu.sh, payload checksums $c, METAMPI_ROUTER_READER=$rd"
            METAMPI_ROUTER_READER=$rd CHECKSUM=$c bash bench/router_cpu.sh 2>&1 |
                tee -a "$out/router_cpu_$c.log"
        done
    done
}

# Issue 3's rows with reader threads on the incoming links (latency too: a thread hand-over).
reader() {
    echo "== issue 3: bench/wan.sh with METAMPI_ROUTER_READER=1, medians of 3 rounds"
    METAMPI_ROUTER_READER=1 ROUNDS=3 bash bench/wan.sh 2>&1 | tee "$out/wan_reader.log"
}

# Issue 6: the static plan's predicted finish time per host against the measured one (15%).
plan() {
    echo "== issue 6: bench/psr_plan.sh 6, plan against measured, ranks bound to hardware threads"
    METAMPI_BIND_TO=hwthread PLAN_ONLY=1 QUIET_WAIT=20 bash bench/psr_plan.sh 6 2>&1 |
        tee "$out/plan.log"
}

case "$stage" in
wan) wan ;;
router) router ;;
reader) reader ;;
plan) plan ;;
all) wan; router; reader; plan ;;
esac
