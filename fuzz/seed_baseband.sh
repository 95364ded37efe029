#!/usr/bin/env bash
# Seeds for the `baseband` fuzz target: a small file of every format `psrsearch simulate`
# writes (DADA 8/16/32-bit, real DADA, GUPPI 8/16-bit, VDIF with its side-car), each as a
# stream with the format detected and named, and as a file. Input layout (see
# fuzz_targets/baseband.rs): selector byte, side-car length, side-car text, then the bytes.
#
#   bash fuzz/seed_baseband.sh && cd fuzz && cargo +nightly fuzz run baseband
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p psrsearch
psr=${CARGO_TARGET_DIR:-target}/release/psrsearch
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=fuzz/corpus/baseband
mkdir -p "$out"
small=(--duration 0.0005 --bw 2 --nchan 2 --npol 2)
for f in dada dada16 dada32 guppi guppi16 vdif; do
    "$psr" simulate --format "$f" --out "$tmp/s.$f" "${small[@]}" >/dev/null
done
"$psr" simulate --format dada --real --out "$tmp/s.real" --duration 0.0005 --bw 2 --nchan 1 \
    --npol 1 >/dev/null
python3 - "$tmp" "$out" <<'PY'
import os, sys
tmp, out = sys.argv[1], sys.argv[2]
car = open(f"{tmp}/s.vdif.hdr", "rb").read()
for name in ["dada", "dada16", "dada32", "guppi", "guppi16", "real", "vdif"]:
    data = open(f"{tmp}/s.{name}", "rb").read()
    c = car if name == "vdif" else b""
    named = {"vdif": 3, "guppi": 2, "guppi16": 2}.get(name, 1)
    # 0: stream, format detected; 1-3: stream, format named; 0x80: file.
    for sel in (0, named, 0x80):
        with open(f"{out}/{name}-{sel}", "wb") as f:
            f.write(bytes([sel, len(c)]) + c + data)
print(f"{len(os.listdir(out))} inputs in {out}")
PY
