#!/usr/bin/env bash
# mpi4py's own test suite on metampi's MPICH-ABI library and on MPICH, side by side.
# Installs mpi4py's PyPI wheel and its source distribution (for test/) under /tmp; prints
# SKIP and exits 0 where PyPI cannot be reached. Not part of `cargo test` (minutes, network).
#   bench/mpi4py_suite.sh [RANKS...]      (default: 1 2)
# Excluded on both: ULFM (test_ulfm: MPIX fault tolerance).
set -uo pipefail
cd "$(dirname "$0")/.."
ver=4.1.2
venv=/tmp/metampi-mpi4py
src=/tmp/metampi-mpi4py-src
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" && "$venv/bin/pip" -q install "mpi4py==$ver" \
        || { echo "SKIP: cannot install mpi4py from PyPI"; exit 0; }
fi
if [ ! -d "$src/mpi4py-$ver/test" ]; then
    mkdir -p "$src" && "$venv/bin/pip" -q download --no-binary :all: --no-deps "mpi4py==$ver" -d "$src" \
        && tar xzf "$src/mpi4py-$ver.tar.gz" -C "$src" \
        || { echo "SKIP: cannot download mpi4py's source distribution"; exit 0; }
fi
cargo build --release -q -p metampi-abi -p metampi-cli
# Debian's MPICH has libmpich.so.12 but not the libmpi.so and libmpi.so.12 the wheel loads
# (without the first, Open MPI's development link would be found on the system path).
mpich_lib=$(mktemp -d)
ln -s "$(mpicc.mpich -print-file-name=libmpich.so.12)" "$mpich_lib/libmpi.so.12"
ln -s "$(mpicc.mpich -print-file-name=libmpich.so.12)" "$mpich_lib/libmpi.so"
exclude=(-e test_ulfm)
root=$(pwd)
cd "$src/mpi4py-$ver"
for n in "${@:-1 2}"; do
    for n1 in $n; do
        m=$(timeout 600 "$root/target/release/metampi" run --timeout 590 -n "$n1" "$venv/bin/python" test/main.py "${exclude[@]}" 2>&1 | grep -E '^Ran|^FAILED|^OK|timed out' | sort -u | tr '\n' ' ')
        p=$(LD_LIBRARY_PATH=$mpich_lib timeout 600 mpiexec.mpich -n "$n1" "$venv/bin/python" test/main.py "${exclude[@]}" 2>&1 | grep -E '^Ran|^FAILED|^OK' | sort -u | tr '\n' ' ')
        echo "$n1 ranks: metampi: ${m:-no summary}"
        echo "$n1 ranks: MPICH:   ${p:-no summary (timed out or crashed)}"
    done
done
rm -rf "$mpich_lib"
