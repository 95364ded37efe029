#!/usr/bin/env bash
# Installs mpi4py's PyPI wheel once per machine into the temporary folder, where the Python
# test (crates/metampi-cli/tests/python.rs) looks for it: Python programs through mpi4py, and
# mpi4py.futures spawning its workers, on metampi's C library. A test-time tool, never a
# dependency; the test suite itself downloads nothing (it skips that test, or fails under CI,
# when the package is not here). .ci/run calls this.
set -euo pipefail
V=4.1.2 # keep equal to MPI4PY in crates/metampi-cli/tests/python.rs
tmp=${TMPDIR:-/tmp}
root="$tmp/metampi-mpi4py-$V"
if [ -f "$root/mpi4py/__init__.py" ]; then
    echo "mpi4py $V: $root"
    exit 0
fi
part=$(mktemp -d "$tmp/metampi-mpi4py-part.XXXXXX")
trap 'rm -rf "$part"' EXIT
# --target installs beside, not into, the system's Python (which Debian marks as managed).
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --only-binary :all: \
    --target "$part/site" "mpi4py==$V"
rm -rf "$root"
mv "$part/site" "$root"
echo "mpi4py $V: $root"
