#!/usr/bin/env bash
# Dedisperse the real DADA sample of the PyPI package `baseband` (Effelsberg, 16 MHz complex,
# 2 polarisations) with baseband-tasks and with `psrsearch dedisperse`, at the same DM, FFT
# length, reference frequency and dispersion constant, for upper and lower sideband; fail
# unless max |difference| <= 1e-3 of the output RMS. Not part of `cargo test` (it needs pip
# and PyPI); run it as
#
#   crates/psrsearch/tests/baseband_tasks_compare.sh [--dm 0.02] [--fft-len 4096]
#
# The Python environment goes to $PSR_PYENV (default /tmp/psrsearch-bbt-venv), never into the
# repository. Without python3/venv or PyPI it prints SKIP and exits 0.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
PYENV=${PSR_PYENV:-/tmp/psrsearch-bbt-venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/target-psr2}
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}

if [ ! -x "$PYENV/bin/python" ] || ! "$PYENV/bin/python" -c 'import baseband_tasks, baseband' 2>/dev/null; then
  if ! python3 -m venv "$PYENV" >/dev/null 2>&1 ||
     ! "$PYENV/bin/pip" install -q baseband baseband-tasks numpy scipy astropy >/dev/null 2>&1; then
    echo "SKIP: cannot install baseband and baseband-tasks with pip (no python3 venv or PyPI unreachable)"
    exit 0
  fi
fi
(cd "$ROOT" && cargo build --release -q -p psrsearch)
WORK=$(mktemp -d /tmp/psr-bbt-compare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$PYENV/bin/python" "$HERE/baseband_tasks_compare.py" "$CARGO_TARGET_DIR/release/psrsearch" "$WORK" "$@"
