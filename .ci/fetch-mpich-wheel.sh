#!/usr/bin/env bash
# Fetches MPICH's PyPI wheel once per machine into the temporary folder, where the
# standard-ABI test (crates/metampi-cli/tests/c_abi.rs) looks for it: its `mpicc_abi` builds C
# programs against the MPI-5 standard ABI, and its `libmpi_abi.so.1` runs them on MPICH for
# comparison. A test-time tool, never a dependency; the test suite itself downloads nothing
# (it skips that test, or fails under CI, when the wheel is not here). .ci/run calls this.
set -euo pipefail
V=5.0.2 # keep equal to MPICH_WHEEL in crates/metampi-cli/tests/c_abi.rs
tmp=${TMPDIR:-/tmp}
root="$tmp/metampi-mpich-wheel-$V"
if [ -x "$root/mpich-$V.data/data/bin/mpicc_abi" ]; then
    echo "MPICH $V wheel: $root"
    exit 0
fi
part=$(mktemp -d "$tmp/metampi-mpich-wheel-part.XXXXXX")
trap 'rm -rf "$part"' EXIT
python3 -m pip download -q --no-deps --only-binary :all: -d "$part" "mpich==$V"
# A wheel is a zip; Python's zipfile unpacks it without the files' modes (set after).
python3 -c 'import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]).extractall(sys.argv[1])' "$part"
chmod 755 "$part/mpich-$V.data/data/bin/"*
# Renamed into place whole, so a test never sees half of it; another run may have won.
mv -T "$part" "$root" 2>/dev/null || true
echo "MPICH $V wheel: $root"
