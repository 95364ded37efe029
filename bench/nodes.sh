#!/usr/bin/env bash
# Flat against hierarchical (machine-aware) collectives on emulated machines
# of one meta host (default 2 machines x 4 ranks: shared memory inside a
# machine, TCP on loopback between them), in one go: barrier, broadcast,
# reduce and all-reduce of 8 bytes and 1 MiB. "flat" forces the algorithm
# the flat selection uses for that size; "hier" forces `hierarchical` (the
# automatic choice on such a layout). Each figure is the median over RUNS
# runs of `metampi bench`'s median time per operation.
#
#   bash bench/nodes.sh                     # RUNS=3, MACHINES=m0:4,m1:4
#   RUNS=5 MACHINES=m0:3,m1:5 bash bench/nodes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
MACHINES=${MACHINES:-m0:4,m1:4}
SCALE=${SCALE:-0.3}
T=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p metampi-cli
M=$T/release/metampi
n=$(awk -F, '{s = 0; for (i = 1; i <= NF; i++) {split($i, a, ":"); s += a[2]}; print s}' <<<"$MACHINES")

flat_alg() { # OP BYTES
    case "$1:$2" in
        barrier:*) echo dissemination ;;
        bcast:8) echo binomial ;;
        bcast:*) echo scatter_allgather ;;
        reduce:*) echo binomial ;;
        allreduce:8) echo recursive_doubling ;;
        allreduce:*) echo rabenseifner ;;
    esac
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one() { # OP BYTES ALG : median us of one run
    METAMPI_COLL_ALG="$1=$3" $M bench -n "$n" --machines "$MACHINES" --ops "$1" --sizes "$2" \
        --iters-scale "$SCALE" | awk '$1 ~ /^[0-9]+$/ {print $4; exit}'
}
point() { # OP BYTES ALG : median over RUNS
    for _ in $(seq "$RUNS"); do one "$@"; done | median
}
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-10s %8s %-20s %12s %12s %8s\n' op bytes "flat algorithm" "flat (us)" "hier (us)" speedup
for op in barrier bcast reduce allreduce; do
    for bytes in 8 1048576; do
        [ "$op" = barrier ] && [ "$bytes" != 8 ] && continue
        fa=$(flat_alg "$op" "$bytes")
        f=$(point "$op" "$bytes" "$fa")
        h=$(point "$op" "$bytes" hierarchical)
        printf '%-10s %8s %-20s %12s %12s %8s\n' "$op" "$bytes" "$fa" "$f" "$h" "$(r "$f" "$h")"
    done
done
echo "($n ranks on machines $MACHINES; medians of $RUNS runs; speedup = flat / hier)"
