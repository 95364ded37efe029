#!/usr/bin/env bash
# Start-up time of an N-rank job (MPI_Init + MPI_Finalize of a C program built with
# mpicc.mpich), on metampi's library and on MPICH's, under each launcher present:
# `metampi run`, Hydra (`mpiexec.mpich`) and Slurm (`srun --mpi=pmi2`, and each launcher inside
# `salloc`, where `sinfo` answers; set SLURM_CONF for a private cluster). Best and median of ROUNDS runs, launchers alternated.
# Usage: bash bench/startup.sh [N]   (ROUNDS=5 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-16}
ROUNDS=${ROUNDS:-5}
ABI=$PWD/target/release/mpi-abi
METAMPI=$PWD/target/release/metampi
[ -f "$ABI/libmpi.so.12" ] && [ -x "$METAMPI" ] || {
    echo "build first: cargo build --release -p metampi-cli -p metampi-abi" >&2
    exit 1
}
command -v mpicc.mpich >/dev/null || { echo "needs mpicc.mpich (apt-get install libmpich-dev)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/init.c" <<'C'
#include <mpi.h>
int main(int argc, char **argv) {
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return size > 0 ? 0 : 1;
}
C
mpicc.mpich -o "$dir/init" "$dir/init.c"

declare -A cmds
cmds["metampi run, metampi"]="$METAMPI run -n $N $dir/init"
cmds["mpiexec.mpich, metampi"]="mpiexec.mpich -n $N -genv LD_LIBRARY_PATH $ABI $dir/init"
cmds["mpiexec.mpich, MPICH"]="mpiexec.mpich -n $N $dir/init"
if sinfo -h >/dev/null 2>&1; then
    cmds["srun --mpi=pmi2, metampi"]="env LD_LIBRARY_PATH=$ABI srun -n $N --overcommit --mpi=pmi2 $dir/init"
    cmds["srun --mpi=pmi2, MPICH"]="srun -n $N --overcommit --mpi=pmi2 $dir/init"
    # Inside an allocation: metampi run's srun step per rank, Hydra's srun-started proxies.
    cmds["salloc + metampi run, metampi"]="salloc -Q -n $N --overcommit $METAMPI run -n $N $dir/init"
    cmds["salloc + mpiexec.mpich, MPICH"]="salloc -Q -n $N --overcommit mpiexec.mpich -n $N $dir/init"
else
    echo "(no Slurm answers here: srun rows left out)"
fi
declare -A times
for r in $(seq "$ROUNDS"); do
    for k in "${!cmds[@]}"; do
        s=$(date +%s.%N)
        ${cmds[$k]} >/dev/null 2>&1 || { echo "failed: $k" >&2; exit 1; }
        e=$(date +%s.%N)
        times[$k]+="$(echo "$e - $s" | bc) "
    done
done
echo "start-up of $N ranks (MPI_Init, a barrier, MPI_Finalize), $ROUNDS rounds, seconds"
printf '%-28s %8s %8s\n' "launcher, library" best median
for k in "${!cmds[@]}"; do
    echo "${times[$k]}" | tr ' ' '\n' | grep . | sort -g | awk -v k="$k" \
        '{a[NR]=$1} END {printf "%-28s %8.3f %8.3f\n", k, a[1], a[int((NR+1)/2)]}'
done | sort
