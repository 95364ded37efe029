#!/usr/bin/env bash
# Prints docs/c-abi.md's table of MPICH-ABI functions: implemented by metampi (a `PMPI_<name>`
# in src/) or answering MPI_ERR_UNSUPPORTED_OPERATION. Run from anywhere:
#   crates/metampi-abi/tools/abi_table.sh > /tmp/table.md
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
impl=$(grep -rhoE '\bPMPIX?_[A-Za-z0-9_]+' "$here/src" | sort -u)
total=0; done_n=0; rows=""
while read -r name; do
    case "$name" in ''|'#'*) continue ;; esac
    total=$((total + 1))
    if grep -qx "P$name" <<<"$impl"; then
        done_n=$((done_n + 1)); rows+="| \`$name\` | yes |"$'\n'
    else
        rows+="| \`$name\` | no |"$'\n'
    fi
done < "$here/abi/mpich-functions.txt"
std_total=0; std_done=0
while read -r name; do
    case "$name" in ''|'#'*) continue ;; esac
    std_total=$((std_total + 1))
    grep -qx "P$name" <<<"$impl" && std_done=$((std_done + 1))
done < "$here/abi/standard-functions.txt"
echo "$done_n of $total functions implemented ($std_done of the standard ABI's $std_total)."
echo
echo "| function | implemented |"
echo "|---|---|"
printf '%s' "$rows"
