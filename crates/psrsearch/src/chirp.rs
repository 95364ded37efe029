//! The inverse interstellar transfer function ("chirp") of one channel on an FFT grid.
//!
//! Sign conventions, matching baseband-tasks (and through it dspsr):
//! - FFTs are `X_k = Σ x_n e^{-2πi kn/N}` (RustFFT forward); bin `k` is baseband frequency
//!   `f = k·R/N` for `k < N/2` and `(k − N)·R/N` above (complex data).
//! - The sky frequency of baseband frequency `f` is `ν = ν_c + s·f` with `s = ±1` the
//!   sideband ([`Band::sky_mhz`]). Dispersion multiplies the sky signal by
//!   `exp(+2πi·φ(ν))`, `φ(ν) = D·DM·(ν − ν_ref)²/(ν_ref²·ν)` cycles; a lower-sideband
//!   mixer conjugates the signal, so at baseband the dispersing filter is
//!   `exp(+2πi·s·φ)` and the dedispersing one `H(f) = exp(−2πi·s·φ(ν_c + s·f))`.
//!   For upper sideband and `ν_c = ν_ref` this is the textbook
//!   `exp(−2πi·D·DM·f²/(f₀²(f₀+f)))`.
//! - `φ` contains the delay of each channel relative to `ν_ref`. Its integer part (in units
//!   of a chosen quantum of samples) is taken out of the filter and applied by indexing,
//!   so the FFT overlap only has to cover the smear *within* the channel; the remainder
//!   stays in the filter as a linear phase, so the result equals the full filter exactly.
//! - The inverse FFT is unnormalised in RustFFT; `1/N` is folded into the chirp.
//! - Real data use the same `H` on the positive half and its conjugate mirror on the negative
//!   half (a Hermitian filter keeps the output real).

use rustfft::num_complex::Complex32;

use crate::band::Band;
use crate::dm::Dispersion;

/// Integer delay (in samples, a multiple of `quantum`) of channel `chan` relative to the
/// reference frequency, taken out of the filter and applied by indexing: the fully
/// dedispersed sample at reference time `j` is the chirp-filtered sample `j + shift`.
pub fn channel_shift(
    band: &Band,
    chan: usize,
    disp: Dispersion,
    ref_mhz: f64,
    quantum: usize,
) -> i64 {
    let samples = disp.delay_s(band.centre_mhz[chan], ref_mhz) * band.sample_rate_hz;
    let q = quantum.max(1) as f64;
    ((samples / q).floor() * q) as i64
}

/// Range `(min, max)` of the group delay, in samples, of the chirp of `chan` after `shift`
/// is taken out: the lags over which its impulse response is spread.
pub fn lag_range(
    band: &Band,
    chan: usize,
    disp: Dispersion,
    ref_mhz: f64,
    shift: i64,
) -> (f64, f64) {
    let (f_lo, f_hi) = if band.complex {
        (-band.sample_rate_hz / 2.0, band.sample_rate_hz / 2.0)
    } else {
        (0.0, band.sample_rate_hz / 2.0)
    };
    // The group delay is monotonic in frequency, so the band edges bound it.
    let g = |f: f64| {
        let nu = band.sky_mhz(chan, f);
        band.sample_rate_hz
            * disp.constant
            * disp.dm
            * (1.0 / (ref_mhz * ref_mhz) - 1.0 / (nu * nu))
            + shift as f64
    };
    let (a, b) = (g(f_lo), g(f_hi));
    (a.min(b), a.max(b))
}

/// Phase in cycles of the dedispersing filter (with `shift` taken out) at baseband frequency
/// `f_hz` of `chan`, in f64: the reference that [`build`] must reproduce.
pub fn phase_cycles(
    band: &Band,
    chan: usize,
    disp: Dispersion,
    ref_mhz: f64,
    shift: i64,
    f_hz: f64,
) -> f64 {
    let s = band.sideband.sign();
    let offset = band.sky_offset_mhz(chan, f_hz, ref_mhz);
    -s * disp.phase_cycles(offset, ref_mhz) - f_hz * shift as f64 / band.sample_rate_hz
}

/// Build the dedispersing filter of `chan` on an `fft_len` grid, scaled by `scale`
/// (pass `1/fft_len` to normalise RustFFT's inverse).
pub fn build(
    band: &Band,
    chan: usize,
    disp: Dispersion,
    ref_mhz: f64,
    shift: i64,
    fft_len: usize,
    scale: f32,
) -> Vec<Complex32> {
    let n = fft_len;
    let rate = band.sample_rate_hz;
    let at = |f: f64| {
        let cycles = phase_cycles(band, chan, disp, ref_mhz, shift, f);
        // Reduce in f64 first: the phase reaches millions of cycles.
        let (sin, cos) = (std::f64::consts::TAU * (cycles - cycles.round())).sin_cos();
        Complex32::new(cos as f32 * scale, sin as f32 * scale)
    };
    let mut h = vec![Complex32::new(0.0, 0.0); n];
    if band.complex {
        for (k, v) in h.iter_mut().enumerate() {
            let kk = if k < n.div_ceil(2) {
                k as f64
            } else {
                k as f64 - n as f64
            };
            *v = at(kk * rate / n as f64);
        }
    } else {
        for (k, v) in h.iter_mut().enumerate().take(n / 2 + 1) {
            *v = at(k as f64 * rate / n as f64);
        }
        for k in n / 2 + 1..n {
            h[k] = h[n - k].conj();
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::band::Sideband;

    fn band(complex: bool, sideband: Sideband) -> Band {
        Band::from_total(430.0, 4.0, 4, if complex { 1e6 } else { 2e6 }, complex, 1)
            .with_sideband(sideband)
    }

    #[test]
    fn coefficients_match_the_f64_formula() {
        for sb in [Sideband::Upper, Sideband::Lower] {
            let b = band(true, sb);
            let d = Dispersion::new(37.5);
            let shift = channel_shift(&b, 0, d, 430.0, 16);
            let n = 4096;
            let h = build(&b, 0, d, 430.0, shift, n, 1.0);
            for k in [0usize, 1, 17, 2047, 2048, 2049, 4095] {
                let f = if k < n / 2 {
                    k as f64
                } else {
                    k as f64 - n as f64
                } * 1e6
                    / n as f64;
                let cyc = phase_cycles(&b, 0, d, 430.0, shift, f);
                let want = Complex32::new(
                    (std::f64::consts::TAU * cyc).cos() as f32,
                    (std::f64::consts::TAU * cyc).sin() as f32,
                );
                assert!((h[k] - want).norm() < 2e-4, "k={k}: {} vs {want}", h[k]);
            }
        }
    }

    #[test]
    fn shift_centres_the_lags() {
        let b = band(true, Sideband::Upper);
        let d = Dispersion::new(50.0);
        for chan in 0..4 {
            let shift = channel_shift(&b, chan, d, b.band_centre_mhz(), 8);
            assert_eq!(shift % 8, 0);
            let (lo, hi) = lag_range(&b, chan, d, b.band_centre_mhz(), shift);
            // Within a channel the smear is ±half the intra-channel delay, offset by < quantum.
            let smear = d.smear_s(b.centre_mhz[chan] - 0.5, b.centre_mhz[chan] + 0.5) * 1e6;
            assert!(hi - lo <= smear * 1.0001 && hi - lo >= smear * 0.9999);
            assert!(lo < 0.0 && hi > 0.0 && hi < smear, "{lo} {hi} {smear}");
        }
        // Channel 0 is the lowest: delayed, so a positive shift.
        assert!(channel_shift(&b, 0, d, 430.0, 1) > 0);
        assert!(channel_shift(&b, 3, d, 430.0, 1) < 0);
    }

    #[test]
    fn real_chirp_is_hermitian() {
        let b = band(false, Sideband::Upper);
        let h = build(&b, 1, Dispersion::new(10.0), 430.0, 0, 256, 1.0);
        for k in 1..128 {
            assert_eq!(h[256 - k], h[k].conj());
        }
    }

    #[test]
    fn phase_is_quadratic_near_reference() {
        // USB, reference at the channel centre: H(f) ≈ exp(−2πi·D·DM·f²/f₀³) for small f.
        let b = Band::from_total(1000.0, 1.0, 1, 1e6, true, 1);
        let d = Dispersion::new(100.0);
        let f = 1e3;
        let exact = phase_cycles(&b, 0, d, 1000.0, 0, f);
        let approx = -d.constant * d.dm * 1e6 * (f / 1e6).powi(2) / 1000f64.powi(3);
        assert!(((exact - approx) / approx).abs() < 1e-5);
    }
}
