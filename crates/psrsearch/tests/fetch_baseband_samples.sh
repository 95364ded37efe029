#!/usr/bin/env bash
# Fetch the sample files that ship with the PyPI package `baseband` (GPLv3; they are
# not committed here) into the directory given as $1, via pip. Exits non-zero, with a
# message, when pip or PyPI is unavailable; the tests then skip.
set -euo pipefail
dest=${1:?usage: fetch_baseband_samples.sh DIR}
mkdir -p "$dest"
pip=$(command -v pip3 || command -v pip || true)
if [ -z "$pip" ]; then
    echo "pip not found" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 120 "$pip" download --no-deps --no-binary :all: baseband -d "$tmp" >&2 \
    || timeout 120 "$pip" download --no-deps baseband -d "$tmp" >&2
archive=$(ls "$tmp"/baseband-* | head -n 1)
case "$archive" in
    *.tar.gz) tar -xzf "$archive" -C "$tmp" ;;
    *.whl | *.zip) python3 -m zipfile -e "$archive" "$tmp/unpacked" ;;
    *) echo "unexpected archive $archive" >&2; exit 3 ;;
esac
data=$(find "$tmp" -type d -path '*baseband/data' | head -n 1)
if [ -z "$data" ]; then
    echo "no baseband/data in $archive" >&2
    exit 4
fi
for f in sample.dada sample_meerkat.dada sample_puppi.raw sample_vegas.raw sample_blc.raw \
    sample.vdif sample_bps1.vdif; do
    cp "$data/$f" "$dest/$f"
done
echo "baseband samples in $dest" >&2
