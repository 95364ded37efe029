#!/usr/bin/env bash
# psrsearch against baseband-tasks (with numpy's FFTs and with pyFFTW's) on one core: dedispersion throughput at one
# DM and search throughput at 32 DMs, on the same input, with ratios and real-time factors.
#
#   bench/psr_compare.sh [NSAMPLES]        (default 524288 samples per channel)
#
# Input: the demo band of `psrsearch bench` — 820 MHz, 8 MHz in 4 complex channels of 2 MHz,
# 2 polarisations — NSAMPLES samples of 8-bit-like Gaussian noise per series, in memory.
# What is timed (wall clock, everything pinned to CPU 0 with taskset):
#   psrsearch, one DM      `psrsearch bench`: per overlap-save block forward FFT, chirp,
#                          inverse FFT, square-law detection, polarisation sum, downsampling
#                          by 32 (DM 48.2, FFT chosen by psrsearch).
#   psrsearch, 32 DMs      the same with DMs 0, 2, …, 62 sharing each block's forward FFT.
#   baseband-tasks, 1 DM   Dedisperse(DM 48.2, reference 820 MHz, its own default FFT length,
#                          >= 75% efficiency) read over the whole input, then |z|^2 summed
#                          over polarisations and channels and downsampled by 32.
#   baseband-tasks, 32 DMs for each of DMs 0, 2, …, 62: the one-DM pipeline above plus a
#                          power spectrum (numpy rfft) of the detected series — the least a
#                          search needs; baseband-tasks has no way to share the forward FFT.
# Rates count valid output samples of every channel and polarisation (per DM for the search),
# as `psrsearch bench` does. The real-time factor is the rate over a 16 MHz, 2-polarisation
# band's 3.2e7 complex samples/s (times 32 for the search).
#
# Then the wide channel (psrsearch only): one 16 MHz complex channel at 820 MHz, 2
# polarisations, PSR_WIDE_NSAMPLES (default 4194304) samples, DMs 0-62 by 2, downsampled by
# 32, as one channel (a 2^20-point FFT per DM: the smear within the channel is 2.4e5
# samples) and split by the coherent filterbank (`--subchannels auto`: 32 sub-channels of
# 0.5 MHz, 1024-point FFTs; the filterbank's time included): the 32-DM real-time factor on
# one core and the cores real time needs. PSR_WIDE_ONLY=1 stops after it.
#
# Needs python3 with pip and PyPI (or an environment already at $PSR_PYENV); skips with a
# message otherwise. The environment is made under /tmp, never in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
NSAMP=${1:-524288}
[ $((NSAMP % 4096)) -eq 0 ] || { echo "NSAMPLES must be a multiple of 4096"; exit 2; }
PYENV=${PSR_PYENV:-/tmp/psrsearch-bbt-venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/target-psr2}
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}

if [ ! -x "$PYENV/bin/python" ] || ! "$PYENV/bin/python" -c 'import baseband_tasks' 2>/dev/null; then
  if ! python3 -m venv "$PYENV" >/dev/null 2>&1 ||
     ! "$PYENV/bin/pip" install -q baseband baseband-tasks numpy scipy astropy >/dev/null 2>&1; then
    echo "SKIP: cannot install baseband-tasks with pip (no python3 venv or PyPI unreachable)"
    exit 0
  fi
fi
# pyFFTW (FFTW through Python) for the second peer column; the comparison runs without it.
"$PYENV/bin/python" -c 'import pyfftw' 2>/dev/null || "$PYENV/bin/pip" install -q pyfftw >/dev/null 2>&1 || true
cargo build --release -q -p psrsearch
PSR="$CARGO_TARGET_DIR/release/psrsearch"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

echo "== psrsearch bench --nsamples $NSAMP (CPU 0)"
PSR_OUT=$(taskset -c 0 "$PSR" bench --nsamples "$NSAMP" --ndm 32)
echo "$PSR_OUT"
PSR_ONE=$(echo "$PSR_OUT" | awk '/^one DM:/ {print $3}')
PSR_MANY=$(echo "$PSR_OUT" | awk '/^[0-9]+ DMs:/ {print $3}')

WIDE_N=${PSR_WIDE_NSAMPLES:-4194304}
WIDE_SUMMARY=""
for split in 1 auto; do
    echo "== psrsearch bench --band wide16 --nsamples $WIDE_N --ndm 32 --subchannels $split (CPU 0)"
    WIDE_OUT=$(taskset -c 0 "$PSR" bench --band wide16 --nsamples "$WIDE_N" --ndm 32 --subchannels "$split")
    echo "$WIDE_OUT"
    RT=$(echo "$WIDE_OUT" | awk '/^real time at/ {print $6}')
    CORES=$(echo "$WIDE_OUT" | awk '/^real time at/ {print $NF}')
    FFT=$(echo "$WIDE_OUT" | awk '/^FFT length/ {print $3}')
    NSUB=$(echo "$WIDE_OUT" | awk '/^filterbank/ {print $2}')
    WIDE_SUMMARY+=$(printf '%-34s%12s%10s%8s' "16 MHz 1 chan, ${NSUB:-no} sub-channels" "FFT $FFT" "$RT" "$CORES")$'\n'
done
echo
printf '%-34s%12s%10s%8s\n' "one core, 32 DMs, 2 pol" "" "real time" "cores"
printf '%s' "$WIDE_SUMMARY"
[ "${PSR_WIDE_ONLY:-0}" = 1 ] && exit 0

# baseband-tasks with its FFT from `$1` (numpy or pyfftw), on CPU 0: "one DM" and "32 DMs" lines.
bbt() {
taskset -c 0 "$PYENV/bin/python" - "$NSAMP" "$1" <<'PY'
import sys, time
import numpy as np
import astropy.units as u
from astropy.time import Time
from baseband_tasks.dispersion import Dedisperse
from baseband_tasks.generators import StreamGenerator

nsamp, backend = int(sys.argv[1]), sys.argv[2]
if backend == 'pyfftw':
    import pyfftw.interfaces.numpy_fft as npfft
    from baseband_tasks.fourier import fft_maker
    fft_maker.set('pyfftw', threads=1, flags=('FFTW_ESTIMATE',))
    pyfftw_cache = __import__('pyfftw').interfaces.cache
    pyfftw_cache.enable()
else:
    npfft = np.fft
nchan, npol, ds = 4, 2, 32
rate = 2 * u.MHz
freq = (820 - 4 + 2 * np.arange(nchan) + 1) * u.MHz   # channel centres, upper sideband
rng = np.random.default_rng(3)
data = (rng.normal(0, 10, (nsamp, npol, nchan)) +
        1j * rng.normal(0, 10, (nsamp, npol, nchan))).round().astype(np.complex64)
# Served in frames of 4096 samples, so that Dedisperse picks its own FFT length from the
# dispersive padding (its default: >= 75% efficiency) rather than the source's frame size.
frame = 4096
source = StreamGenerator(lambda sh: data[sh.tell():sh.tell() + frame], data.shape,
                         Time('2020-01-01'), rate, samples_per_frame=frame,
                         frequency=freq, sideband=1)

def detect(dm):
    dd = Dedisperse(source, dm, reference_frequency=820 * u.MHz)
    dd.seek(0)
    v = dd.read()
    p = (v.real ** 2 + v.imag ** 2).sum(axis=(1, 2))
    n = len(p) // ds * ds
    return p[:n].reshape(-1, ds).sum(axis=1), v.shape[0], dd._ih_samples_per_frame

detect(48.2)  # warm-up (plans, caches)
t = time.perf_counter()
_, nout, fft = detect(48.2)
one = nout * nchan * npol / (time.perf_counter() - t)
print(f"one DM: {one:.3e} complex samples/s (FFT {fft}, {nout} valid samples)")
dms = np.arange(32) * 2.0
t = time.perf_counter()
total = 0
for dm in dms:
    series, nout, _ = detect(dm)
    spec = np.abs(npfft.rfft(series - series.mean())) ** 2
    total += nout * nchan * npol
many = total / (time.perf_counter() - t)
print(f"32 DMs: {many:.3e} sample-DM trials/s")
PY
}
BBT_VERSION=$("$PYENV/bin/python" -c 'import baseband_tasks; print(baseband_tasks.__version__)')
echo "== baseband-tasks $BBT_VERSION with numpy (CPU 0)"
BBT_OUT=$(bbt numpy)
echo "$BBT_OUT"
BBT_ONE=$(echo "$BBT_OUT" | awk '/^one DM:/ {print $3}')
BBT_MANY=$(echo "$BBT_OUT" | awk '/^32 DMs:/ {print $3}')
if "$PYENV/bin/python" -c 'import pyfftw' 2>/dev/null; then
    echo "== baseband-tasks $BBT_VERSION with pyFFTW $("$PYENV/bin/python" -c 'import pyfftw; print(pyfftw.__version__)') (CPU 0, FFTW_ESTIMATE plans: baseband-tasks plans anew for every DM)"
    FFTW_OUT=$(bbt pyfftw)
    echo "$FFTW_OUT"
    FFTW_ONE=$(echo "$FFTW_OUT" | awk '/^one DM:/ {print $3}')
    FFTW_MANY=$(echo "$FFTW_OUT" | awk '/^32 DMs:/ {print $3}')
else
    echo "== pyFFTW could not be installed: its column is left out"
    FFTW_ONE=0 FFTW_MANY=0
fi

python3 - "$PSR_ONE" "$PSR_MANY" "$BBT_ONE" "$BBT_MANY" "$FFTW_ONE" "$FFTW_MANY" <<'PY'
import sys
p1, pn, b1, bn, f1, fn = map(float, sys.argv[1:])
band = 3.2e7  # 16 MHz, 2 polarisations, complex samples/s
fftw = f1 > 0 and fn > 0
# The peer is the faster of baseband-tasks' two FFT engines.
q1, qn = max(b1, f1), max(bn, fn)
print()
head = f"{'one core':<34}{'psrsearch':>12}{'bbt numpy':>12}" + (f"{'bbt pyFFTW':>12}" if fftw else "")
print(head + f"{'ratio':>8}")
def row(name, p, b, f, q):
    print(f"{name:<34}{p:>12.3e}{b:>12.3e}" + (f"{f:>12.3e}" if fftw else "") + f"{p / q:>7.1f}x")
row("dedispersion, 1 DM (samples/s)", p1, b1, f1, q1)
row("search, 32 DMs (sample-DM/s)", pn, bn, fn, qn)
print(f"{'real time, 16 MHz 2 pol, 1 DM':<34}{p1 / band:>11.2f}x{q1 / band:>11.2f}x")
print(f"{'real time, 16 MHz 2 pol, 32 DMs':<34}{pn / band / 32:>11.2f}x{qn / band / 32:>11.2f}x")
print(f"cores for real time, 32 DMs: psrsearch {band * 32 / pn:.1f}, baseband-tasks {band * 32 / qn:.1f}")
ok = p1 / q1 >= 4 and pn / qn >= 4
print("target (>= 4x the faster peer in both):", "met" if ok else "NOT met")
PY
