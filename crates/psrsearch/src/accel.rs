//! Acceleration search: the Fourier-domain search over frequency drift of a pulsar in a
//! binary orbit (PRESTO's `accelsearch`, `--zmax`), with harmonic summing.
//!
//! - A signal whose frequency drifts linearly by `z` Fourier bins over the observation
//!   (`z = ḟ·T²`) spreads its power over about `|z|` bins. Its complex Fourier amplitudes
//!   around the mean frequency `r` (in bins) are `A_k ≈ N·g(k − r; z)` with
//!   `g(d; z) = ∫₀¹ exp(2πi(−d·u + z·(u² − u)/2)) du`. Correlating the amplitudes with
//!   `g` for a grid of `z` gathers that power back (a matched filter): the `z` plane's
//!   power at `r` is `|Σ_k A_k·conj(g(k − r; z))|² / Σ|g|²`, which for noise of unit mean
//!   power is again of unit mean, and for `z = 0` is the plain power at `r`.
//! - The series is transformed at its own length (independent bins; no zero padding), the
//!   amplitudes are whitened by the running median of their powers as in
//!   [`crate::periodicity`], and `r` runs on half bins.
//! - `z` runs from `−zmax` to `zmax` in steps of 2 and describes the highest harmonic summed
//!   (PRESTO's convention): for the `n`-harmonic sum whose top harmonic is at `(r, z)`,
//!   harmonic `h` is taken at `(r·h/n, z·h/n)` from the nearest plane, so the fundamental's
//!   drift is `z/n`.
//! - The kernel `g` is the FFT of the sampled chirp (exact to its aliasing, which the
//!   oversampled length keeps far below the noise); the correlation is done by FFT in
//!   overlapping blocks (overlap-save).
//!
//! Memory: every plane is kept over the bins searched, `(2·zmax/2 + 1) × 2 × bins` powers
//! of 4 bytes.

use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use crate::periodicity::{
    keep_most_significant, running_median, PeriodicityConfig, SpectralCandidate,
};
use crate::{rfi, stats};

/// Step between `z` planes, bins (PRESTO's): a drift mismatch of at most one bin.
pub const DZ: f64 = 2.0;
/// Taps of the matched filter beyond the drift's own span, each side: the response's
/// sinc-like tails.
const PAD_TAPS: usize = 8;
/// Independent `z` trials are about this far apart (PRESTO's figure for the trials
/// correction).
const Z_INDEPENDENT: f64 = 6.95;

/// An acceleration search of series of one length.
#[derive(Clone)]
pub struct AccelPlan {
    config: PeriodicityConfig,
    len: usize,
    tsamp_s: f64,
    zmax: f64,
    fft: Arc<dyn Fft<f32>>,
}

impl std::fmt::Debug for AccelPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccelPlan")
            .field("len", &self.len)
            .field("zmax", &self.zmax)
            .finish_non_exhaustive()
    }
}

impl AccelPlan {
    /// Plan for series of `len` samples at `tsamp_s`, drifts up to `config.zmax`.
    pub fn new(len: usize, tsamp_s: f64, config: PeriodicityConfig) -> Self {
        let zmax = config.zmax.max(0.0);
        let fft = FftPlanner::new().plan_fft_forward(len.max(2));
        AccelPlan {
            config,
            len: len.max(2),
            tsamp_s,
            zmax,
            fft,
        }
    }

    fn tobs_s(&self) -> f64 {
        self.len as f64 * self.tsamp_s
    }

    /// The `z` of each plane, `−zmax` to `zmax`.
    pub fn planes(&self) -> Vec<f64> {
        let n = (self.zmax / DZ).floor() as i64;
        (-n..=n).map(|i| i as f64 * DZ).collect()
    }

    /// Fourier bins searched: from the lowest fundamental to the highest harmonic of the
    /// highest fundamental (or Nyquist).
    fn bin_range(&self) -> (usize, usize) {
        let t = self.tobs_s();
        let top = self.config.max_freq_hz * self.config.max_harmonics.max(1) as f64;
        let lo = (self.config.min_freq_hz * t).ceil().max(1.0) as usize;
        let hi = ((top * t).floor() as usize).min(self.len / 2);
        (lo, hi.max(lo + 1))
    }

    /// Bytes the planes of one series take.
    pub fn memory_bytes(&self) -> u64 {
        let (lo, hi) = self.bin_range();
        self.planes().len() as u64 * 2 * (hi - lo) as u64 * 4
    }

    /// Harmonic stages: 1, 2, 4, … up to the configured maximum.
    fn stages(&self) -> Vec<usize> {
        std::iter::successors(Some(1usize), |n| Some(n * 2))
            .take_while(|n| *n <= self.config.max_harmonics.max(1))
            .collect()
    }

    /// Independent trials per DM: fundamental bins, harmonic stages and independent drifts.
    pub fn trials(&self) -> f64 {
        let nyquist = 0.5 / self.tsamp_s;
        let span = self.config.max_freq_hz.min(nyquist) - self.config.min_freq_hz;
        let drifts = (2.0 * self.zmax / Z_INDEPENDENT).max(1.0);
        (span * self.tobs_s()).max(1.0) * self.stages().len() as f64 * drifts
    }

    /// The whitened amplitudes of `series` (birdies zeroed), indexed by Fourier bin.
    fn amplitudes(&self, series: &[f32]) -> Vec<Complex32> {
        let mean = series.iter().map(|v| *v as f64).sum::<f64>() / series.len().max(1) as f64;
        let mut a: Vec<Complex32> = (0..self.len)
            .map(|i| {
                let v = series.get(i).map_or(0.0, |v| (*v as f64 - mean) as f32);
                Complex32::new(v, 0.0)
            })
            .collect();
        let mut scratch = vec![Complex32::new(0.0, 0.0); self.fft.get_inplace_scratch_len()];
        self.fft.process_with_scratch(&mut a, &mut scratch);
        let (lo, hi) = self.bin_range();
        a.truncate(hi);
        a[..lo].fill(Complex32::new(0.0, 0.0));
        let mut power: Vec<f32> = a.iter().map(|c| c.norm_sqr()).collect();
        let half = (self.config.median_window / 2).max(2);
        let medians = running_median(&power[lo..hi], half);
        for (c, m) in a[lo..hi].iter_mut().zip(medians) {
            let scale = if m > 0.0 {
                (std::f32::consts::LN_2 / m).sqrt()
            } else {
                0.0
            };
            *c *= scale;
        }
        let t = self.tobs_s();
        rfi::zap(&mut power, 1.0 / t, 1.0 / t, &self.config.birdies);
        for (c, p) in a.iter_mut().zip(&power) {
            if *p == 0.0 {
                *c = Complex32::new(0.0, 0.0);
            }
        }
        a
    }

    /// The power of every plane on the half-bin grid: `planes[iz][t − 2·lo]` at `r = t/2`.
    fn plane_powers(&self, amps: &[Complex32]) -> Vec<Vec<f32>> {
        let (lo, hi) = self.bin_range();
        let zs = self.planes();
        let widest = taps(self.zmax);
        let block = (8 * (2 * widest + 1)).next_power_of_two().max(1024);
        let mut planner = FftPlanner::new();
        let fwd = planner.plan_fft_forward(block);
        let inv = planner.plan_fft_inverse(block);
        // The amplitudes from `lo − widest`, transformed once in blocks that overlap by the
        // widest filter.
        let step = block - 2 * widest;
        let outputs = hi - lo;
        let at = |k: i64| {
            (k >= 0)
                .then(|| amps.get(k as usize).copied())
                .flatten()
                .unwrap_or_default()
        };
        let mut scratch = vec![Complex32::default(); fwd.get_inplace_scratch_len()];
        let blocks: Vec<Vec<Complex32>> = (0..outputs.div_ceil(step))
            .map(|b| {
                let start = lo as i64 - widest as i64 + (b * step) as i64;
                let mut x: Vec<Complex32> = (0..block as i64).map(|i| at(start + i)).collect();
                fwd.process_with_scratch(&mut x, &mut scratch);
                x
            })
            .collect();
        let mut iscratch = vec![Complex32::default(); inv.get_inplace_scratch_len()];
        let mut planes = Vec::with_capacity(zs.len());
        for &z in &zs {
            let mut plane = vec![0.0f32; 2 * outputs];
            for half in 0..2 {
                let (kernel, norm) = response(z, 0.5 * half as f64, widest);
                // Correlation as a circular convolution with the reversed conjugate filter:
                // out[j] = Σ_m x[j + m]·c[m], c[m] = conj(g(m − widest − δ)).
                let mut d = vec![Complex32::default(); block];
                for (m, g) in kernel.iter().enumerate() {
                    d[(block - m) % block] = g.conj();
                }
                fwd.process_with_scratch(&mut d, &mut scratch);
                let scale = 1.0 / (block as f32 * norm.sqrt());
                for (b, x) in blocks.iter().enumerate() {
                    let mut y: Vec<Complex32> = x.iter().zip(&d).map(|(x, d)| x * d).collect();
                    inv.process_with_scratch(&mut y, &mut iscratch);
                    for (j, v) in y[..step].iter().enumerate() {
                        let k = b * step + j;
                        if k >= outputs {
                            break;
                        }
                        plane[2 * k + half] = (v * scale).norm_sqr();
                    }
                }
            }
            planes.push(plane);
        }
        planes
    }

    /// Search one series; `dm_index` is copied into the candidates, whose `z` is the
    /// fundamental's drift.
    pub fn search(&self, series: &[f32], dm_index: usize) -> Vec<SpectralCandidate> {
        let amps = self.amplitudes(series);
        let planes = self.plane_powers(&amps);
        let (lo, _) = self.bin_range();
        let zs = self.planes();
        let trials = self.trials();
        let t_obs = self.tobs_s();
        let mut out = Vec::new();
        for nh in self.stages() {
            let threshold = stats::power_for_sigma(self.config.keep_sigma, nh, trials) as f32;
            let sums: Vec<Vec<f32>> = (0..zs.len())
                .map(|iz| harmonic_sum(&planes, &zs, iz, nh, 2 * lo))
                .collect();
            for (iz, s) in sums.iter().enumerate() {
                for i in 1..s.len().saturating_sub(1) {
                    let v = s[i];
                    if v < threshold || v <= s[i - 1] || v < s[i + 1] {
                        continue;
                    }
                    // A peak in drift too: the same signal is in the planes beside.
                    if (iz > 0 && sums[iz - 1][i] > v)
                        || sums.get(iz + 1).is_some_and(|n| n[i] >= v)
                    {
                        continue;
                    }
                    let t = (i + 2 * lo) as f64;
                    let freq = t / 2.0 / nh as f64 / t_obs;
                    if freq < self.config.min_freq_hz || freq > self.config.max_freq_hz {
                        continue;
                    }
                    out.push(SpectralCandidate {
                        dm_index,
                        freq_hz: freq,
                        nharm: nh,
                        power: v as f64,
                        sigma: stats::harmonic_sigma(v as f64, nh, trials),
                        z: zs[iz] / nh as f64,
                    });
                }
            }
        }
        keep_most_significant(&mut out, self.config.max_per_dm);
        out
    }
}

/// Taps of the matched filter each side of its centre for drift `z`.
fn taps(z: f64) -> usize {
    (z.abs() / 2.0).ceil() as usize + PAD_TAPS
}

/// The filter for drift `z` and offset `delta` (bins): `g(q − δ; z)` for
/// `q = −w ..= w`, and `Σ|g|²` over those taps.
fn response(z: f64, delta: f64, w: usize) -> (Vec<Complex32>, f32) {
    let m = (8 * (z.abs() as usize + w + 1)).next_power_of_two().max(64);
    let mut y: Vec<rustfft::num_complex::Complex64> = (0..m)
        .map(|n| {
            let u = (n as f64 + 0.5) / m as f64;
            let phase = 2.0 * std::f64::consts::PI * (delta * u + 0.5 * z * (u * u - u));
            rustfft::num_complex::Complex64::from_polar(1.0 / m as f64, phase)
        })
        .collect();
    FftPlanner::new().plan_fft_forward(m).process(&mut y);
    let g: Vec<Complex32> = (-(w as i64)..=w as i64)
        .map(|q| {
            // Bin q of a transform whose samples sit at (n + ½)/m: undo the half-sample shift.
            let shift = rustfft::num_complex::Complex64::from_polar(
                1.0,
                -std::f64::consts::PI * q as f64 / m as f64,
            );
            let c = y[q.rem_euclid(m as i64) as usize] * shift;
            Complex32::new(c.re as f32, c.im as f32)
        })
        .collect();
    let norm = g
        .iter()
        .map(|c| c.norm_sqr())
        .sum::<f32>()
        .max(f32::MIN_POSITIVE);
    (g, norm)
}

/// The `n`-harmonic sum with its top harmonic in plane `iz`: harmonic `h` at half-bin
/// `round(t·h/n)` of the plane nearest `z·h/n`; `t0` is the half-bin of index 0.
fn harmonic_sum(planes: &[Vec<f32>], zs: &[f64], iz: usize, n: usize, t0: usize) -> Vec<f32> {
    let mid = zs.len() / 2;
    let mut out = planes[iz].clone();
    for h in 1..n {
        let z = zs[iz] * h as f64 / n as f64;
        let jz = (mid as i64 + (z / DZ).round() as i64).clamp(0, zs.len() as i64 - 1) as usize;
        let p = &planes[jz];
        for (i, o) in out.iter_mut().enumerate() {
            let t = (((i + t0) * h + n / 2) / n).checked_sub(t0);
            *o += t.and_then(|t| p.get(t)).copied().unwrap_or(0.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    fn config(zmax: f64, harmonics: usize) -> PeriodicityConfig {
        PeriodicityConfig {
            min_freq_hz: 1.0,
            max_freq_hz: 200.0,
            max_harmonics: harmonics,
            keep_sigma: 3.0,
            zmax,
            ..PeriodicityConfig::default()
        }
    }

    /// A sinusoid of mean frequency `f_mid` drifting by `z` bins over `n` samples at `dt`.
    fn chirp(n: usize, dt: f64, f_mid: f64, z: f64, amp: f32, seed: u64) -> Vec<f32> {
        let t_obs = n as f64 * dt;
        let fdot = z / (t_obs * t_obs);
        let f0 = f_mid - fdot * t_obs / 2.0;
        let mut rng = StdRng::seed_from_u64(seed);
        let noise = Normal::new(0.0f32, 1.0).unwrap();
        (0..n)
            .map(|i| {
                let t = i as f64 * dt;
                let phase = 2.0 * std::f64::consts::PI * (f0 * t + 0.5 * fdot * t * t);
                amp * phase.cos() as f32 + noise.sample(&mut rng)
            })
            .collect()
    }

    #[test]
    fn the_filter_holds_the_whole_response_and_is_the_plain_bin_without_drift() {
        let (g, norm) = response(0.0, 0.0, taps(0.0));
        // No drift, on a bin: all the power in the centre tap.
        assert!(
            (g[taps(0.0)].norm() - 1.0).abs() < 1e-4,
            "{:?}",
            g[taps(0.0)]
        );
        assert!((norm - 1.0).abs() < 1e-4);
        for z in [-40.0, 7.0, 100.0] {
            for delta in [0.0, 0.5] {
                let (_, norm) = response(z, delta, taps(z));
                // Parseval: the taps hold nearly all of the unit energy.
                assert!(norm > 0.95 && norm <= 1.0001, "z {z} δ {delta}: {norm}");
            }
        }
    }

    #[test]
    fn noise_planes_have_unit_mean_power() {
        let plan = AccelPlan::new(1 << 14, 1e-3, config(20.0, 1));
        let series = chirp(1 << 14, 1e-3, 50.0, 0.0, 0.0, 3);
        let planes = plan.plane_powers(&plan.amplitudes(&series));
        for (z, p) in plan.planes().iter().zip(&planes) {
            let mean = p.iter().map(|v| *v as f64).sum::<f64>() / p.len() as f64;
            assert!((mean - 1.0).abs() < 0.1, "z {z}: mean power {mean}");
        }
    }

    /// A drifting signal smears out of the plain spectrum and is found, with its drift,
    /// by the acceleration search.
    #[test]
    fn a_drifting_signal_is_found_at_its_drift() {
        let (n, dt) = (1 << 15, 1e-3);
        let series = chirp(n, dt, 37.3, 24.0, 0.12, 9);
        let plain = AccelPlan::new(n, dt, config(0.0, 1)).search(&series, 0);
        let accel = AccelPlan::new(n, dt, config(40.0, 1)).search(&series, 0);
        let best = &accel[0];
        assert!(
            (best.freq_hz - 37.3).abs() < 1.0 / (n as f64 * dt),
            "{best:?}"
        );
        assert!((best.z - 24.0).abs() <= DZ, "{best:?}");
        let plain_sigma = plain
            .iter()
            .find(|c| (c.freq_hz - 37.3).abs() < 0.5)
            .map_or(0.0, |c| c.sigma);
        assert!(
            best.sigma > plain_sigma + 4.0,
            "{} vs {plain_sigma}",
            best.sigma
        );
    }

    /// The harmonics of a drifting pulse drift in proportion: the harmonic sum takes them
    /// from the planes of `z·h/n`.
    #[test]
    fn harmonics_of_a_drifting_pulse_add_up() {
        let (n, dt) = (1 << 15, 1e-3);
        let t_obs = n as f64 * dt;
        let (f_mid, z) = (21.1, 6.0);
        let fdot = z / (t_obs * t_obs);
        let f0 = f_mid - fdot * t_obs / 2.0;
        let mut rng = StdRng::seed_from_u64(4);
        let noise = Normal::new(0.0f32, 1.0).unwrap();
        let series: Vec<f32> = (0..n)
            .map(|i| {
                let t = i as f64 * dt;
                let phase = (f0 * t + 0.5 * fdot * t * t).fract();
                let d = phase - phase.round();
                0.5 * (-(d * d) / (2.0 * 0.02f64.powi(2))).exp() as f32 + noise.sample(&mut rng)
            })
            .collect();
        let found = AccelPlan::new(n, dt, config(64.0, 8)).search(&series, 0);
        let best = &found[0];
        assert!(best.nharm >= 4, "{best:?}");
        assert!((best.freq_hz - f_mid).abs() < 1.0 / t_obs, "{best:?}");
        assert!((best.z - z).abs() <= DZ, "{best:?}");
    }
}
