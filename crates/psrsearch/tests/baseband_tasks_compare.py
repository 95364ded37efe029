"""Coherent dedispersion of baseband's real DADA sample by baseband-tasks and by psrsearch.

Run by tests/baseband_tasks_compare.sh (which makes the virtual environment and builds
psrsearch). For each sideband it dedisperses the sample at one DM with both, at the same FFT
length, reference frequency (the band centre) and dispersion constant (both default to
1/2.41e-4 s MHz^2 cm^3/pc), lines the outputs up by their time origin and prints the largest
complex difference over the RMS of baseband-tasks' output. Exit status 1 when that exceeds
the tolerance.

Usage: python baseband_tasks_compare.py PSRSEARCH WORKDIR [--dm 0.02] [--fft-len 4096]
       [--tolerance 1e-3]
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import astropy.units as u
import numpy as np
from baseband import data as bdata
from baseband import open as bopen
from baseband_tasks.dispersion import Dedisperse


def reference_dedispersion(path, dm, fft_len, centre, sideband):
    """baseband-tasks: complex voltages (time, pol) and the input sample of output 0."""
    with bopen(path, "rs") as fh:
        # The DADA reader gives no frequencies; the header's FREQ is the channel centre.
        probe = Dedisperse(fh, dm, frequency=centre, sideband=sideband, reference_frequency=centre)
        pad = probe._pad_start + probe._pad_end
        task = Dedisperse(
            fh,
            dm,
            frequency=centre,
            sideband=sideband,
            reference_frequency=centre,
            samples_per_frame=fft_len - pad,
        )
        if task._ih_samples_per_frame != fft_len:
            raise SystemExit(
                f"baseband-tasks chose an FFT of {task._ih_samples_per_frame}, not {fft_len}"
            )
        out = task.read()
        return out, task._pad_start, (task._pad_start, task._pad_end)


def psrsearch_dedispersion(exe, path, dm, fft_len, centre, sideband, workdir):
    """psrsearch: complex voltages (nchan, npol, time) and the input sample of output 0."""
    npy = workdir / f"psrsearch_{sideband}.npy"
    run = subprocess.run(
        [
            str(exe),
            "dedisperse",
            str(path),
            "--dm",
            repr(float(dm)),
            "--fft-len",
            str(fft_len),
            "--ref-freq",
            repr(float(centre.to_value(u.MHz))),
            "--sideband",
            sideband,
            "--voltages",
            str(npy),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"psrsearch dedisperse failed:\n{run.stderr}")
    found = re.search(r"voltages start at input sample (-?\d+)", run.stderr)
    if not found:
        raise SystemExit(f"psrsearch did not say where its voltages start:\n{run.stderr}")
    geometry = re.search(r"overlap (\d+), lead (\d+)", run.stderr)
    return np.load(npy), int(found.group(1)), geometry.groups() if geometry else None


def compare(exe, workdir, dm, fft_len, tolerance, sideband):
    path = bdata.SAMPLE_DADA
    centre = 320.0 * u.MHz
    sign = 1 if sideband == "upper" else -1
    ref, ref_start, pads = reference_dedispersion(path, dm, fft_len, centre, sign)
    ours, our_start, geometry = psrsearch_dedispersion(
        exe, path, dm, fft_len, centre, sideband, workdir
    )
    ours = ours[0].T  # (time, pol), as baseband-tasks gives it
    start = max(ref_start, our_start)
    stop = min(ref_start + len(ref), our_start + len(ours))
    if stop - start < fft_len:
        raise SystemExit(f"too little common output: samples {start}..{stop}")
    a = ref[start - ref_start : stop - ref_start]
    b = ours[start - our_start : stop - our_start]
    rms = float(np.sqrt(np.mean(np.abs(a) ** 2)))
    diff = np.abs(a - b)
    worst = float(diff.max())
    at = np.unravel_index(int(diff.argmax()), diff.shape)
    ratio = worst / rms
    print(
        f"{sideband:5} sideband: DM {dm}, FFT {fft_len}, reference {centre}; "
        f"baseband-tasks pads {pads[0]}+{pads[1]}, psrsearch overlap/lead {geometry}; "
        f"compared input samples {start}..{stop} ({stop - start} x {a.shape[1]} pol): "
        f"RMS {rms:.4f}, max |diff| {worst:.3e} at sample {start + at[0]} pol {at[1]}, "
        f"max |diff| / RMS = {ratio:.3e} (tolerance {tolerance:g})"
    )
    return ratio <= tolerance


def main():
    p = argparse.ArgumentParser()
    p.add_argument("psrsearch", type=Path)
    p.add_argument("workdir", type=Path)
    p.add_argument("--dm", type=float, default=0.02)
    p.add_argument("--fft-len", type=int, default=4096)
    p.add_argument("--tolerance", type=float, default=1e-3)
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    ok = True
    for sideband in ("upper", "lower"):
        ok &= compare(a.psrsearch, a.workdir, a.dm, a.fft_len, a.tolerance, sideband)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
