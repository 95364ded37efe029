//! Periodicity search of one dedispersed time series: power spectrum, red-noise whitening,
//! incoherent harmonic summing, candidates with significance.
//!
//! - The series (mean removed) is zero-padded to at least twice its length before the FFT,
//!   which evaluates the spectrum on half-bins as well: a signal between two Fourier bins
//!   loses at most 19% of its power instead of 59% (the same effect as "interbinning").
//! - Whitening divides each power by the running median of its neighbours over
//!   [`PeriodicityConfig::median_window`] independent bins, times `1/ln 2`, so that noise
//!   powers follow a unit exponential (whose median is `ln 2`) whatever the red noise.
//! - Harmonic summing adds, for each trial fundamental, the whitened powers at its first
//!   `n` harmonics (`n` = 1, 2, 4, 8, 16). For the `n`-harmonic sum the index `t` runs over
//!   the top harmonic, with the lower ones at `round(t·h/n)`, so the fundamental is
//!   resolved to `1/n` of a bin.
//! - A sum `S` of `n` noise powers has the tail `Q(n, S)`; the significance is the Gaussian
//!   `sigma` of that probability after multiplying by the trials: independent Fourier bins
//!   searched times harmonic stages ([`crate::stats`]).

use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};
use serde::{Deserialize, Serialize};

use crate::rfi::{self, Birdie};
use crate::stats;

/// Settings of the periodicity search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodicityConfig {
    /// Lowest spin frequency searched, Hz.
    pub min_freq_hz: f64,
    /// Highest spin frequency searched, Hz (capped at Nyquist).
    pub max_freq_hz: f64,
    /// Running-median window for whitening, in independent Fourier bins.
    pub median_window: usize,
    /// Largest number of harmonics summed (stages are 1, 2, 4, … up to this).
    pub max_harmonics: usize,
    /// Per-DM candidates below this significance are not kept.
    pub keep_sigma: f64,
    /// At most this many candidates are kept per DM (the most significant).
    pub max_per_dm: usize,
    /// Interference frequencies zeroed in every whitened spectrum.
    #[serde(default)]
    pub birdies: Vec<Birdie>,
    /// Largest frequency drift searched, Fourier bins over the observation, of the highest
    /// harmonic summed (PRESTO's `zmax`); 0: no acceleration search ([`crate::accel`]).
    #[serde(default)]
    pub zmax: f64,
}

impl Default for PeriodicityConfig {
    fn default() -> Self {
        PeriodicityConfig {
            min_freq_hz: 1.0,
            max_freq_hz: 2000.0,
            median_window: 128,
            max_harmonics: 16,
            keep_sigma: 2.0,
            max_per_dm: 200,
            birdies: Vec::new(),
            zmax: 0.0,
        }
    }
}

/// A peak in one harmonic-sum spectrum of one DM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpectralCandidate {
    /// Index of the DM trial.
    pub dm_index: usize,
    /// Spin frequency estimate, Hz.
    pub freq_hz: f64,
    /// Harmonics summed.
    pub nharm: usize,
    /// Summed whitened power.
    pub power: f64,
    /// Gaussian-equivalent significance, trials included.
    pub sigma: f64,
    /// Drift of the fundamental's frequency over the observation, Fourier bins
    /// (`ḟ·T²`; 0 without an acceleration search).
    #[serde(default)]
    pub z: f64,
}

/// A whitened power spectrum.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerSpectrum {
    /// Frequency spacing of `power`, Hz.
    pub df_hz: f64,
    /// Whitened power; bin `r` is frequency `r·df_hz`; bins outside the search range are 0.
    pub power: Vec<f32>,
}

/// FFT plan and derived constants for series of one length and sample interval.
#[derive(Clone)]
pub struct PeriodicityPlan {
    config: PeriodicityConfig,
    len: usize,
    tsamp_s: f64,
    fft: Arc<dyn Fft<f32>>,
    padded: usize,
    /// With `zmax` > 0: the acceleration search that [`PeriodicityPlan::search`] runs.
    accel: Option<crate::accel::AccelPlan>,
}

impl std::fmt::Debug for PeriodicityPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeriodicityPlan")
            .field("len", &self.len)
            .field("padded", &self.padded)
            .field("tsamp_s", &self.tsamp_s)
            .finish_non_exhaustive()
    }
}

impl PeriodicityPlan {
    /// Plan for series of `len` samples at `tsamp_s`.
    pub fn new(len: usize, tsamp_s: f64, config: PeriodicityConfig) -> Self {
        let padded = padded_len(len);
        let fft = FftPlanner::new().plan_fft_forward(padded);
        let accel =
            (config.zmax > 0.0).then(|| crate::accel::AccelPlan::new(len, tsamp_s, config.clone()));
        PeriodicityPlan {
            config,
            len,
            tsamp_s,
            fft,
            padded,
            accel,
        }
    }

    /// Duration of the series, s.
    pub fn tobs_s(&self) -> f64 {
        self.len as f64 * self.tsamp_s
    }

    /// Frequency spacing of the padded spectrum, Hz.
    pub fn df_hz(&self) -> f64 {
        1.0 / (self.padded as f64 * self.tsamp_s)
    }

    /// Bins of the spectrum that are computed and whitened: from the lowest fundamental to
    /// the highest harmonic of the highest fundamental (or Nyquist).
    fn bin_range(&self) -> (usize, usize) {
        let df = self.df_hz();
        let nyquist = 0.5 / self.tsamp_s;
        let top = (self.config.max_freq_hz * self.config.max_harmonics.max(1) as f64).min(nyquist);
        let lo = (self.config.min_freq_hz / df).ceil().max(1.0) as usize;
        let hi = ((top / df).floor() as usize).min(self.padded / 2);
        (lo, hi.max(lo + 1))
    }

    /// Independent trials per DM: Fourier bins of the fundamentals searched, times harmonic
    /// stages.
    pub fn trials(&self) -> f64 {
        let nyquist = 0.5 / self.tsamp_s;
        let span = self.config.max_freq_hz.min(nyquist) - self.config.min_freq_hz;
        (span * self.tobs_s()).max(1.0) * self.stages().len() as f64
    }

    /// Harmonic stages: 1, 2, 4, … up to the configured maximum.
    pub fn stages(&self) -> Vec<usize> {
        std::iter::successors(Some(1usize), |n| Some(n * 2))
            .take_while(|n| *n <= self.config.max_harmonics.max(1))
            .collect()
    }

    /// The whitened power spectrum of `series`.
    ///
    /// # Panics
    /// If `series` is not the planned length.
    pub fn spectrum(&self, series: &[f32]) -> PowerSpectrum {
        assert_eq!(series.len(), self.len, "series length");
        let mean = series.iter().map(|v| *v as f64).sum::<f64>() / self.len as f64;
        let mut buf = vec![Complex32::new(0.0, 0.0); self.padded];
        for (b, v) in buf.iter_mut().zip(series) {
            b.re = (*v as f64 - mean) as f32;
        }
        let mut scratch = vec![Complex32::new(0.0, 0.0); self.fft.get_inplace_scratch_len()];
        self.fft.process_with_scratch(&mut buf, &mut scratch);
        let (lo, hi) = self.bin_range();
        let mut power = vec![0.0f32; hi];
        for r in lo..hi {
            power[r] = buf[r].norm_sqr();
        }
        let half_window = ((self.config.median_window as f64 / (self.df_hz() * self.tobs_s()))
            / 2.0)
            .round()
            .max(2.0) as usize;
        whiten(&mut power[lo..hi], half_window);
        rfi::zap(
            &mut power,
            self.df_hz(),
            1.0 / self.tobs_s(),
            &self.config.birdies,
        );
        PowerSpectrum {
            df_hz: self.df_hz(),
            power,
        }
    }

    /// Search one series; `dm_index` is copied into the candidates.
    pub fn search(&self, series: &[f32], dm_index: usize) -> Vec<SpectralCandidate> {
        if let Some(accel) = &self.accel {
            return accel.search(series, dm_index);
        }
        let spectrum = self.spectrum(series);
        self.search_spectrum(&spectrum, dm_index)
    }

    /// Harmonic-sum and pick candidates from an already whitened spectrum.
    pub fn search_spectrum(
        &self,
        spectrum: &PowerSpectrum,
        dm_index: usize,
    ) -> Vec<SpectralCandidate> {
        let (lo, _) = self.bin_range();
        let trials = self.trials();
        let df = spectrum.df_hz;
        let mut out = Vec::new();
        for nh in self.stages() {
            let sums = harmonic_sum(&spectrum.power, nh);
            let threshold = stats::power_for_sigma(self.config.keep_sigma, nh, trials) as f32;
            let t_lo = (lo * nh).max(1);
            for t in t_lo..sums.len().saturating_sub(1) {
                let s = sums[t];
                if s >= threshold && s > sums[t - 1] && s >= sums[t + 1] {
                    let freq = t as f64 * df / nh as f64;
                    if freq < self.config.min_freq_hz || freq > self.config.max_freq_hz {
                        continue;
                    }
                    out.push(SpectralCandidate {
                        dm_index,
                        freq_hz: freq,
                        nharm: nh,
                        power: s as f64,
                        sigma: stats::harmonic_sigma(s as f64, nh, trials),
                        z: 0.0,
                    });
                }
            }
        }
        keep_most_significant(&mut out, self.config.max_per_dm);
        out
    }
}

/// Orders one DM's candidates by significance (then frequency) and keeps the first `max`.
pub(crate) fn keep_most_significant(cands: &mut Vec<SpectralCandidate>, max: usize) {
    cands.sort_by(|a, b| {
        b.sigma
            .total_cmp(&a.sigma)
            .then(a.freq_hz.total_cmp(&b.freq_hz))
    });
    cands.truncate(max);
}

/// FFT length for a series of `len` samples: at least twice as long, a power of two.
pub fn padded_len(len: usize) -> usize {
    (2 * len.max(2)).next_power_of_two()
}

/// Divide `power` by its running median over `[i − half, i + half]` (truncated at the ends),
/// scaled so that white noise has unit mean.
pub fn whiten(power: &mut [f32], half: usize) {
    let medians = running_median(power, half);
    for (p, m) in power.iter_mut().zip(medians) {
        *p = if m > 0.0 {
            *p * std::f32::consts::LN_2 / m
        } else {
            0.0
        };
    }
}

/// Median of `x[i − half ..= i + half]` (clipped to the slice) for every `i`, keeping the
/// window sorted so each step costs one binary search and one shift.
pub fn running_median(x: &[f32], half: usize) -> Vec<f32> {
    let n = x.len();
    let mut out = Vec::with_capacity(n);
    let mut window: Vec<f32> = Vec::with_capacity(2 * half + 1);
    let (mut lo, mut hi) = (0usize, 0usize);
    for i in 0..n {
        let want_lo = i.saturating_sub(half);
        let want_hi = (i + half + 1).min(n);
        while hi < want_hi {
            let v = x[hi];
            let at = window.partition_point(|w| w.total_cmp(&v).is_lt());
            window.insert(at, v);
            hi += 1;
        }
        while lo < want_lo {
            let v = x[lo];
            let at = window.partition_point(|w| w.total_cmp(&v).is_lt());
            window.remove(at);
            lo += 1;
        }
        let m = window.len();
        out.push(if m % 2 == 1 {
            window[m / 2]
        } else {
            0.5 * (window[m / 2 - 1] + window[m / 2])
        });
    }
    out
}

/// `out[t] = Σ_{h=1..n} p[round(t·h/n)]`: the `n`-harmonic sum whose top harmonic is at bin
/// `t` (fundamental at `t/n`).
pub fn harmonic_sum(p: &[f32], n: usize) -> Vec<f32> {
    let n = n.max(1);
    let mut out = p.to_vec();
    for h in 1..n {
        for (t, o) in out.iter_mut().enumerate() {
            *o += p[(t * h + n / 2) / n];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn naive_median(x: &[f32], i: usize, half: usize) -> f32 {
        let lo = i.saturating_sub(half);
        let hi = (i + half + 1).min(x.len());
        let mut w = x[lo..hi].to_vec();
        w.sort_by(f32::total_cmp);
        let m = w.len();
        if m % 2 == 1 {
            w[m / 2]
        } else {
            0.5 * (w[m / 2 - 1] + w[m / 2])
        }
    }

    #[test]
    fn running_median_matches_sorting_each_window() {
        let mut rng = StdRng::seed_from_u64(7);
        let x: Vec<f32> = (0..500).map(|_| rng.gen_range(-5.0..5.0)).collect();
        for half in [0, 1, 4, 37, 600] {
            let fast = running_median(&x, half);
            for (i, v) in fast.iter().enumerate() {
                assert_eq!(*v, naive_median(&x, i, half), "half={half} i={i}");
            }
        }
    }

    #[test]
    fn harmonic_sum_matches_direct_loops() {
        let mut rng = StdRng::seed_from_u64(3);
        let p: Vec<f32> = (0..257).map(|_| rng.gen_range(0.0..3.0)).collect();
        for n in [1usize, 2, 4, 8, 16] {
            let fast = harmonic_sum(&p, n);
            for t in 0..p.len() {
                let want: f32 = (1..=n)
                    .map(|h| p[((t * h) as f64 / n as f64).round() as usize])
                    .sum();
                assert!((fast[t] - want).abs() < 1e-4, "n={n} t={t}");
            }
        }
    }

    #[test]
    fn spectrum_matches_naive_dft() {
        let mut rng = StdRng::seed_from_u64(11);
        let x: Vec<f32> = (0..48).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let plan = PeriodicityPlan::new(
            x.len(),
            0.01,
            PeriodicityConfig {
                min_freq_hz: 0.0,
                median_window: 1_000_000,
                ..Default::default()
            },
        );
        let mean = x.iter().sum::<f32>() as f64 / x.len() as f64;
        let n = 128; // padded length
        let raw: Vec<f64> = (0..n / 2)
            .map(|k| {
                let (mut re, mut im) = (0.0f64, 0.0f64);
                for (i, v) in x.iter().enumerate() {
                    let a = -std::f64::consts::TAU * (k * i) as f64 / n as f64;
                    re += (*v as f64 - mean) * a.cos();
                    im += (*v as f64 - mean) * a.sin();
                }
                re * re + im * im
            })
            .collect();
        let s = plan.spectrum(&x);
        assert!((s.df_hz - 1.0 / 1.28).abs() < 1e-12);
        // With one window covering everything, whitening divides by one global median.
        let mut sorted = raw[1..].to_vec();
        sorted.sort_by(f64::total_cmp);
        let m = sorted.len();
        let med = if m % 2 == 1 {
            sorted[m / 2]
        } else {
            0.5 * (sorted[m / 2 - 1] + sorted[m / 2])
        };
        for (k, r) in raw.iter().enumerate().skip(1) {
            let want = r * std::f64::consts::LN_2 / med;
            assert!(
                (s.power[k] as f64 - want).abs() < 1e-4 * want.max(1.0),
                "k={k}"
            );
        }
    }

    #[test]
    fn white_noise_gives_unit_exponential_powers() {
        let mut rng = StdRng::seed_from_u64(5);
        let normal = rand_distr::Normal::new(0.0f32, 1.0).unwrap();
        let x: Vec<f32> = (0..1 << 14).map(|_| rng.sample(normal)).collect();
        let plan = PeriodicityPlan::new(x.len(), 1e-3, PeriodicityConfig::default());
        let s = plan.spectrum(&x);
        let (lo, hi) = plan.bin_range();
        let p = &s.power[lo..hi];
        let mean = p.iter().map(|v| *v as f64).sum::<f64>() / p.len() as f64;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        let tail = p.iter().filter(|v| **v > 3.0).count() as f64 / p.len() as f64;
        assert!((tail - (-3.0f64).exp()).abs() < 0.01, "tail {tail}");
        assert!(plan.search(&x, 0).iter().all(|c| c.sigma < 6.0));
    }

    #[test]
    fn finds_a_periodic_signal_with_harmonics() {
        let mut rng = StdRng::seed_from_u64(9);
        let normal = rand_distr::Normal::new(0.0f32, 1.0).unwrap();
        let tsamp = 1e-3;
        let f0 = 7.3;
        let x: Vec<f32> = (0..1 << 14)
            .map(|i| {
                let phase = (i as f64 * tsamp * f0).fract();
                let pulse = if phase < 0.05 { 1.0 } else { 0.0 };
                rng.sample(normal) + pulse
            })
            .collect();
        let plan = PeriodicityPlan::new(x.len(), tsamp, PeriodicityConfig::default());
        let c = plan.search(&x, 0);
        let best = &c[0];
        assert!(best.sigma > 10.0, "{best:?}");
        assert!(best.nharm >= 4, "{best:?}");
        assert!((best.freq_hz - f0).abs() < 1.0 / plan.tobs_s(), "{best:?}");
    }
}
