#!/usr/bin/env bash
# One unchanged MPI binary on MPICH and on metampi with MPI's freedoms pinned
# (bench/c/pinned.c: wildcard receives take the lowest source, sums of doubles associate
# one way), so that any difference left in the output is a difference in meaning, not in
# rounding or arrival order. Prints the lines of output that differ (times masked) and
# where the two libraries' call logs first part, rank by rank.
#   bench/pinned_compare.sh RANKS DIR PROGRAM [ARGS...]     (runs in DIR, for input files)
#   PIN_SUM=right bench/pinned_compare.sh 4 /tmp/sep ./xdsep
# Environment: PIN_SUM (left|right, default left), PIN_ANY_SOURCE (asc|desc, default asc),
# PIN_WAIT_US (default 20000), MASK (awk field numbers to blank before comparing, e.g.
# "7 8" for ScaLAPACK's time columns), IGNORE (a grep pattern of log lines that may differ,
# default wildcard receives: 's=-2 '; add timer reductions). Output: bench/results/DATE/pinned/NAME.PIN_SUM.{mpich,metampi}.txt
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,11p' "$0"; exit 2; }
ranks=$1 dir=$2
shift 2
cd "$(dirname "$0")/.."
root=$(pwd)
command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null ||
    { echo "SKIP: needs MPICH (mpicc.mpich, mpiexec.mpich)"; exit 0; }
cargo build --release -q -p metampi-abi -p metampi-cli || exit 1
out="$root/bench/results/$(date +%F)/pinned"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc.mpich -O2 -shared -fPIC -o "$tmp/libpinned.so" bench/c/pinned.c || exit 1
name=$(basename "$1")
export PIN_SUM=${PIN_SUM:-left} PIN_ANY_SOURCE=${PIN_ANY_SOURCE:-asc}
for lib in mpich metampi; do
    mkdir -p "$tmp/log.$lib"
    if [ $lib = mpich ]; then launch=(mpiexec.mpich -n "$ranks"); else launch=("$root/target/release/metampi" run -n "$ranks"); fi
    start=$(date +%s)
    (cd "$dir" && PIN_LOG="$tmp/log.$lib" LD_PRELOAD="$tmp/libpinned.so" "${launch[@]}" "$@") \
        >"$out/$name.$PIN_SUM.$lib.txt" 2>&1
    echo "$lib: exit $?, $(($(date +%s) - start)) s, output in $out/$name.$PIN_SUM.$lib.txt"
done
mask() { awk -v m="${MASK:-}" 'BEGIN{n=split(m,f," ")} {for(i=1;i<=n;i++) $f[i]="-"; print}' "$1"; }
if diff <(mask "$out/$name.$PIN_SUM.mpich.txt") <(mask "$out/$name.$PIN_SUM.metampi.txt") >"$tmp/d"; then
    echo "output: the same on both ($(wc -l <"$out/$name.$PIN_SUM.metampi.txt") lines)"
else
    echo "output: $(grep -c '^<' "$tmp/d") lines differ; first ones:"
    head -8 "$tmp/d"
fi
# Wildcard receives (and timers) may part legitimately; the first other call whose data
# differs is the place to look.
calls() { cut -d' ' -f2- "$1" | grep -Ev "${IGNORE:-s=-2 }"; }
for f in "$tmp"/log.mpich/r*.txt; do
    r=$(basename "$f")
    first=$(diff <(calls "$f") <(calls "$tmp/log.metampi/$r") | head -3 | tr '\n' ' ')
    echo "${r%.txt}: $(wc -l <"$f") calls; ${first:-every call carried the same data}"
done
