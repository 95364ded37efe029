#!/usr/bin/env bash
# Programs nobody here wrote, unchanged, on metampi's MPICH-ABI library and on MPICH:
#   1. NetPIPE (Debian's netpipe-mpich2, `NPmpich2`): integrity check and latency/bandwidth on
#      2 ranks of one machine and across 2 emulated sites (routers between them);
#   2. ScaLAPACK's test programs (Debian's scalapack-mpi-test, MPICH build) on 4 ranks: every
#      program on metampi (one machine, then the TESTS across 3 emulated sites), and the
#      MPICH_TESTS on MPICH too (MPICH spins where ranks outnumber cores: minutes a program).
# Installs the two Debian packages where it can (root and apt-get), else prints SKIP.
#   bench/real_programs.sh                   everything (about 5 minutes on 2 cores)
#   TESTS="xdlu xzqr" MPICH_TESTS=all bench/real_programs.sh
# Output: bench/results/DATE/real-programs/ (one file per run) and a summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
scal=/usr/lib/x86_64-linux-gnu/scalapack/mpich-tests
if ! command -v NPmpich2 >/dev/null || [ ! -d "$scal" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            netpipe-mpich2 scalapack-mpi-test >/dev/null 2>&1
    fi
fi
if ! command -v NPmpich2 >/dev/null || [ ! -d "$scal" ]; then
    echo "SKIP: needs Debian's netpipe-mpich2 and scalapack-mpi-test (apt-get install them)"
    exit 0
fi
cargo build --release -q -p metampi-abi -p metampi-cli || exit 1
root=$(pwd)
metampi="$root/target/release/metampi"
out="$root/bench/results/$(date +%F)/real-programs"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sites() { # sites FILE PORTBASE NPROCS...: a description with one meta host per rank count
    local f=$1 port=$2 i=0 names=(a b c d)
    shift 2
    echo "PORTBASE $port" >"$f"
    for n in "$@"; do
        echo "METAHOST ${names[$i]} { LAUNCH = local; NPROCS = $n; NODES = ${names[$i]}0; }" >>"$f"
        i=$((i + 1))
    done
    for ((a = 0; a < i; a++)); do for ((b = a + 1; b < i; b++)); do
        printf 'PAIR %s %s 1\n%s0 <-> %s0\n' "${names[$a]}" "${names[$b]}" "${names[$a]}" "${names[$b]}" >>"$f"
    done; done
}
sites "$tmp/two.cfg" 25200 1 1
sites "$tmp/three.cfg" 25100 2 1 1

echo "== NetPIPE (NPmpich2), 2 ranks"
np_summary() { # the one-way time at 8 bytes and the bandwidth at 64 KiB and 4 MiB
    awk '$1==8{l=$3*1e6} $1==65536{b1=$2} $1==4194304{b2=$2}
         END{printf "8 B %.2f us, 64 KiB %.0f Mbit/s, 4 MiB %.0f Mbit/s\n", l, b1, b2}' "$1"
}
cd "$tmp" || exit 1
for where in one-machine two-sites; do
    case $where in
        one-machine) run=("$metampi" run -n 2) ;;
        two-sites) run=("$metampi" run --meta "$tmp/two.cfg") ;;
    esac
    ok=$(timeout 300 "${run[@]}" NPmpich2 -i -u 1048576 2>&1 | tee "$out/np-integrity-$where.txt" |
        grep -c 'Integrity check passed')
    timeout 300 "${run[@]}" NPmpich2 -u 4194304 -o "$out/np-metampi-$where.txt" >/dev/null 2>&1
    echo "metampi, $where: integrity $ok sizes passed; $(np_summary "$out/np-metampi-$where.txt")"
done
timeout 300 mpiexec.mpich -n 2 NPmpich2 -u 4194304 -o "$out/np-mpich-one-machine.txt" >/dev/null 2>&1
echo "MPICH, one machine: $(np_summary "$out/np-mpich-one-machine.txt")"

echo "== ScaLAPACK tests, 4 ranks (programs passed/failed lines; rc 124: timed out)"
cd "$scal" || exit 1
tests=${TESTS:-$(ls x[a-z]* | tr '\n' ' ')}
mpich_tests=${MPICH_TESTS:-xddblu xsdtlu xdinv xdsep}
[ "$mpich_tests" = all ] && mpich_tests=$tests
count() { echo "$(grep -c PASSED "$1") passed, $(grep -c FAILED "$1") failed"; }
for t in $tests; do
    timeout 300 "$metampi" run --timeout 240 -n 4 "./$t" >"$out/$t.metampi.txt" 2>&1
    line="$t: metampi rc $? $(count "$out/$t.metampi.txt")"
    if [[ " $mpich_tests " == *" $t "* ]]; then
        timeout 600 mpiexec.mpich -n 4 "./$t" >"$out/$t.mpich.txt" 2>&1
        line="$line | MPICH rc $? $(count "$out/$t.mpich.txt")"
    fi
    echo "$line"
done
echo "== ScaLAPACK across 3 emulated sites (2+1+1 ranks)"
for t in ${SITE_TESTS:-xdlu xzqr xdllt xsinv}; do
    timeout 300 "$metampi" run --timeout 240 --meta "$tmp/three.cfg" "./$t" >"$out/$t.3sites.txt" 2>&1
    echo "$t: metampi 3 sites rc $? $(count "$out/$t.3sites.txt")"
done
