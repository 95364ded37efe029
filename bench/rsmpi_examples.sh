#!/usr/bin/env bash
# Builds the 58 example programs that ship with rsmpi (`mpi` 0.8.2 on
# crates.io) against metampi renamed to `mpi`, and runs each that compiles on
# 4 ranks with `metampi run`. Nothing of rsmpi is copied into this repository:
# the crate is downloaded into a temporary directory. Examples that fail by
# design are listed with the reason (EXPECTED below); any other failure is a
# regression and the script exits 1.
#
#   bash bench/rsmpi_examples.sh [RANKS]
#   SITES=1 bash bench/rsmpi_examples.sh    # 4 ranks over 3 local meta hosts (routers)
#   SITES=big bash bench/rsmpi_examples.sh  # the same, one meta host big-endian
#   RUN="--launch local --hosts m0:2,m1:2 -n 4" bash bench/rsmpi_examples.sh   # two machines (TCP)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RANKS=${1:-4}
W=${WORK:-$(mktemp -d)}
cargo build --release -q -p metampi-cli || exit 1
mkdir -p "$W/probe" "$W/compat/examples" "$W/compat/src"
if [ "${SITES:-0}" != 0 ]; then
    # 1 + 1 + 2 ranks on three meta hosts of this machine, joined by routers;
    # SITES=big declares meta host b big-endian (data converted across it).
    order=""; [ "$SITES" = big ] && order="BYTEORDER = big;"
    cat > "$W/sites.meta" <<M
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; $order }
METAHOST c { LAUNCH = local; NPROCS = 2; NODES = c0; }
PAIR a b 1
a0 <-> b0
PAIR a c 1
a0 <-> c0
PAIR b c 1
b0 <-> c0
M
    RUN=${RUN:---meta $W/sites.meta}
fi
read -r -a run_args <<<"${RUN:--n $RANKS}"
(cd "$W/probe" && cat > Cargo.toml <<'T'
[package]
name = "probe"
version = "0.0.0"
edition = "2021"
[dependencies]
mpi = "=0.8.2"
[workspace]
T
mkdir -p src && echo "" > src/lib.rs && cargo vendor -q "$W/vendor" >/dev/null 2>&1) || {
    # Without crates.io there is nothing to run; CI (REQUIRE_REGISTRY=1) counts that as failing.
    echo "cannot download mpi 0.8.2 (no registry?)"; exit "${REQUIRE_REGISTRY:-0}"; }
cp "$W/vendor/mpi/examples/"*.rs "$W/compat/examples/"
cat > "$W/compat/Cargo.toml" <<T
[package]
name = "compat"
version = "0.0.0"
edition = "2021"
[features]
default = ["user-operations"]
user-operations = []
[dependencies]
mpi = { package = "metampi", path = "$ROOT/crates/metampi", features = ["complex", "derive", "user-operations"] }
num-complex = "0.4"
[workspace]
T
echo 'fn main() { println!("cargo::rustc-check-cfg=cfg(msmpi)"); }' > "$W/compat/build.rs"
echo "" > "$W/compat/src/lib.rs"
(cd "$W/compat" && CARGO_TARGET_DIR="$W/target" cargo build -q --examples --keep-going >"$W/build.log" 2>&1)
# Examples that fail by design, and why. Any other failure is a regression:
# the script then exits 1.
declare -A EXPECTED=(
    [derive_nonthreaded_panic]="expects a panic making a datatype off the main thread; metampi's datatypes work on any thread"
    [derive_postfinalize_panic]="expects a panic making a datatype after finalize; metampi's datatypes need no live library"
    [derive_preinit_panic]="expects a panic making a datatype before initialize; likewise"
    [dyn_communicator]="scans a usize into an i32; metampi refuses with MPI_ERR_COUNT where C MPI writes past the i32"
)
built=0; ran=0; total=0; notbuilt=(); failed=()
for f in "$W/compat/examples/"*.rs; do
    e=$(basename "$f" .rs); total=$((total + 1))
    exe="$W/target/debug/examples/$e"
    if [ ! -x "$exe" ]; then notbuilt+=("$e"); continue; fi
    built=$((built + 1))
    if timeout 60 target/release/metampi run "${run_args[@]}" "$exe" >"$W/$e.log" 2>&1; then ran=$((ran + 1)); else failed+=("$e"); fi
done
echo "rsmpi 0.8.2 examples: $total; compile against metampi: $built; run OK (metampi run ${run_args[*]}): $ran"
bad=0
for e in "${notbuilt[@]}" "${failed[@]}"; do
    if [ -n "${EXPECTED[$e]:-}" ]; then
        echo "  expected: $e: ${EXPECTED[$e]}"
    else
        echo "  REGRESSION: $e (log: $W/$e.log, build: $W/build.log)"; bad=1
    fi
done
# The examples' build folder is about 3 GB: gone unless WORK named the folder, logs kept.
[ -z "${WORK:-}" ] && rm -rf "$W/target"
echo "(logs in $W)"
exit $bad
