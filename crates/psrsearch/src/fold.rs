//! Folding a time series into a pulse profile, the profile's signal-to-noise ratio, and a
//! fold-based refinement of a candidate's spin frequency.
//!
//! Sample `i` (interval `dt`) is at time `(i + ½)·dt`; its phase is `frac(f·t)`.
//! The S/N is the best boxcar: for widths of 1 … `nbins/2` bins at every starting phase,
//! `Σ_on (m_b − μ_off) / (σ·√(Σ_on 1/n_b))`, with `m_b` the bin means, `n_b` their sample
//! counts, `μ_off` the mean of the other bins and `σ` the standard deviation of the series.

use serde::{Deserialize, Serialize};

/// A folded profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Spin frequency folded at, Hz.
    pub freq_hz: f64,
    /// Mean of the samples in each phase bin.
    pub means: Vec<f64>,
    /// Samples in each bin.
    pub counts: Vec<u64>,
    /// Best boxcar S/N.
    pub snr: f64,
    /// Width of the best boxcar, bins.
    pub width_bins: usize,
    /// First bin of the best boxcar.
    pub peak_bin: usize,
}

/// Sum and count the samples of `series` into `nbins` phase bins at `freq_hz`.
pub fn fold(series: &[f32], tsamp_s: f64, freq_hz: f64, nbins: usize) -> (Vec<f64>, Vec<u64>) {
    let mut sums = vec![0.0f64; nbins];
    let mut counts = vec![0u64; nbins];
    // Phase advances by a constant per sample; accumulate it in f64 and wrap, which costs far
    // less than a multiply and floor per sample yet stays exact to ~1e-12 cycles over 1e8 samples.
    let dphi = freq_hz * tsamp_s;
    let mut phase = (0.5 * dphi).fract();
    let nb = nbins as f64;
    for v in series {
        let b = ((phase * nb) as usize).min(nbins - 1);
        sums[b] += *v as f64;
        counts[b] += 1;
        phase += dphi;
        if phase >= 1.0 {
            phase -= phase.floor();
        }
    }
    (sums, counts)
}

/// [`fold`] of `nsub` consecutive, nearly equal parts of `series` (sub-integrations), each
/// part's samples in the bins the whole fold puts them in: summed over the parts, sums and
/// counts are [`fold`]'s. Returns `(sums, counts, first sample)` per part; `nsub` is
/// reduced to the number of samples where that is fewer.
pub fn fold_subints(
    series: &[f32],
    tsamp_s: f64,
    freq_hz: f64,
    nbins: usize,
    nsub: usize,
) -> Vec<(Vec<f64>, Vec<u64>, usize)> {
    let nsub = nsub.clamp(1, series.len().max(1));
    let mut parts: Vec<(Vec<f64>, Vec<u64>, usize)> = (0..nsub)
        .map(|k| (vec![0.0; nbins], vec![0; nbins], k * series.len() / nsub))
        .collect();
    // The same phase recurrence as `fold`, so that no sample changes bin between the two.
    let dphi = freq_hz * tsamp_s;
    let mut phase = (0.5 * dphi).fract();
    let nb = nbins as f64;
    let mut k = 0;
    for (i, v) in series.iter().enumerate() {
        while k + 1 < nsub && i >= parts[k + 1].2 {
            k += 1;
        }
        let b = ((phase * nb) as usize).min(nbins - 1);
        parts[k].0[b] += *v as f64;
        parts[k].1[b] += 1;
        phase += dphi;
        if phase >= 1.0 {
            phase -= phase.floor();
        }
    }
    parts
}

/// Standard deviation of a series.
pub fn std_dev(series: &[f32]) -> f64 {
    let n = series.len().max(1) as f64;
    let mean = series.iter().map(|v| *v as f64).sum::<f64>() / n;
    let var = series
        .iter()
        .map(|v| (*v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    var.sqrt()
}

/// Best boxcar S/N of a profile: `(snr, width, first bin)`.
pub fn boxcar_snr(means: &[f64], counts: &[u64], sigma: f64) -> (f64, usize, usize) {
    let nbins = means.len();
    let total: f64 = means.iter().sum();
    let inv: Vec<f64> = counts.iter().map(|c| 1.0 / (*c).max(1) as f64).collect();
    let mut best = (f64::NEG_INFINITY, 1, 0);
    if sigma <= 0.0 || nbins < 2 {
        return (0.0, 1, 0);
    }
    let mut width = 1;
    while width <= nbins / 2 {
        for start in 0..nbins {
            let (mut on, mut var) = (0.0, 0.0);
            for k in 0..width {
                let b = (start + k) % nbins;
                on += means[b];
                var += inv[b];
            }
            let mu_off = (total - on) / (nbins - width) as f64;
            let snr = (on - width as f64 * mu_off) / (sigma * var.sqrt());
            if snr > best.0 {
                best = (snr, width, start);
            }
        }
        width = if width < 4 { width + 1 } else { width * 3 / 2 };
    }
    best
}

/// S/N of harmonic `k` of a folded profile: the amplitude of its `k`-th Fourier component
/// over that amplitude's noise, from `sigma`, the standard deviation of the series folded.
/// 0 where the profile has too few bins to hold that harmonic.
pub fn harmonic_snr(p: &Profile, sigma: f64, k: usize) -> f64 {
    let n = p.means.len();
    if k == 0 || 2 * k >= n || sigma <= 0.0 {
        return 0.0;
    }
    let (mut re, mut im, mut var) = (0.0, 0.0, 0.0);
    for (b, (m, c)) in p.means.iter().zip(&p.counts).enumerate() {
        let a = std::f64::consts::TAU * (k * b) as f64 / n as f64;
        re += m * a.cos();
        im -= m * a.sin();
        // Each component carries half the variance of the bin means.
        var += 0.5 * sigma * sigma / (*c).max(1) as f64;
    }
    (re * re + im * im).sqrt() / var.sqrt()
}

impl Profile {
    /// Equivalent width of the pulse in bins, not rounded to whole bins: the area of the
    /// best boxcar's bins above the off-pulse mean over the height of the highest of them
    /// (1.06 × the FWHM for a Gaussian pulse).
    pub fn equivalent_width_bins(&self) -> f64 {
        let n = self.means.len();
        if n < 2 || self.width_bins >= n {
            return self.width_bins as f64;
        }
        let on: Vec<f64> = (0..self.width_bins)
            .map(|k| self.means[(self.peak_bin + k) % n])
            .collect();
        let off = (self.means.iter().sum::<f64>() - on.iter().sum::<f64>())
            / (n - self.width_bins) as f64;
        let area: f64 = on.iter().map(|m| m - off).sum();
        let peak = on.iter().copied().fold(f64::NEG_INFINITY, f64::max) - off;
        if peak > 0.0 && area > 0.0 {
            (area / peak).clamp(1.0, self.width_bins as f64)
        } else {
            self.width_bins as f64
        }
    }
}

/// Fold and measure.
pub fn profile(series: &[f32], tsamp_s: f64, freq_hz: f64, nbins: usize, sigma: f64) -> Profile {
    let (sums, counts) = fold(series, tsamp_s, freq_hz, nbins);
    let means: Vec<f64> = sums
        .iter()
        .zip(&counts)
        .map(|(s, c)| if *c > 0 { s / *c as f64 } else { 0.0 })
        .collect();
    let (snr, width_bins, peak_bin) = boxcar_snr(&means, &counts, sigma);
    Profile {
        freq_hz,
        means,
        counts,
        snr,
        width_bins,
        peak_bin,
    }
}

/// `series` resampled so that a pulse whose frequency is `f0_hz` at its start and drifts by
/// `fdot_hz_s` keeps the constant frequency `f0_hz`: sample `i` of the result is the series
/// (linearly interpolated) at the time `t` whose phase `f0·t + ḟ·t²/2` is `f0·(i + ½)·dt`.
/// Folding the result at `f0` folds the drifting pulse coherently.
pub fn dedrift(series: &[f32], tsamp_s: f64, f0_hz: f64, fdot_hz_s: f64) -> Vec<f32> {
    let k = fdot_hz_s / f0_hz;
    let last = series.len().saturating_sub(1);
    (0..series.len())
        .map(|i| {
            let tau = (i as f64 + 0.5) * tsamp_s;
            // The root of k/2·t² + t − τ = 0 near τ, in a form that stays exact as k → 0.
            let disc = (1.0 + 2.0 * k * tau).max(0.0);
            let t = 2.0 * tau / (1.0 + disc.sqrt());
            let x = (t / tsamp_s - 0.5).clamp(0.0, last as f64);
            let j = (x.floor() as usize).min(last);
            let w = (x - j as f64) as f32;
            let next = series[(j + 1).min(last)];
            series[j] * (1.0 - w) + next * w
        })
        .collect()
}

/// Bins for folding at `freq_hz`: `max_bins`, or fewer when a period spans fewer samples.
pub fn bins_for(freq_hz: f64, tsamp_s: f64, max_bins: usize) -> usize {
    let samples_per_period = 1.0 / (freq_hz * tsamp_s);
    (samples_per_period.floor() as usize).clamp(8, max_bins.max(8))
}

/// Search frequencies within `±half_range_hz` of `f0` for the highest folded S/N: a coarse
/// pass in steps that drift one bin over the observation, a pass eight times finer around
/// the best, then a correction from the pulse's phase drift between the two halves of the
/// series, which pins the frequency far below the bin width when the pulse is bright.
pub fn refine(
    series: &[f32],
    tsamp_s: f64,
    f0: f64,
    half_range_hz: f64,
    max_bins: usize,
) -> Profile {
    let sigma = std_dev(series);
    let tobs = series.len() as f64 * tsamp_s;
    let nbins = bins_for(f0, tsamp_s, max_bins);
    let coarse = 1.0 / (nbins as f64 * tobs);
    let search = |center: f64, half: f64, step: f64| {
        let n = (half / step).ceil() as i64;
        (-n..=n)
            .map(|k| profile(series, tsamp_s, center + k as f64 * step, nbins, sigma))
            .max_by(|a, b| a.snr.total_cmp(&b.snr))
            .unwrap_or_else(|| profile(series, tsamp_s, center, nbins, sigma))
    };
    let first = search(f0, half_range_hz.max(coarse), coarse);
    let mut best = search(first.freq_hz, coarse, coarse / 8.0);
    for _ in 0..2 {
        let Some(f) = drift_corrected(series, tsamp_s, best.freq_hz, nbins) else {
            break;
        };
        // Trust the drift only within the range searched, and not if the profile collapses
        // (a weak pulse gives a noisy drift). A broad pulse folds to nearly the same S/N
        // over several grid steps, so the grid maximum can sit a few steps from the truth
        // and is biased high by noise: a better frequency may fold to a slightly lower S/N.
        if (f - f0).abs() > half_range_hz.max(coarse) + coarse {
            break;
        }
        let p = profile(series, tsamp_s, f, nbins, sigma);
        if p.snr < 0.8 * best.snr {
            break;
        }
        best = p;
    }
    best
}

/// Frequency corrected by the phase drift of the pulse between the first and second half of
/// the series, folded at `freq_hz`. A pulse at true frequency `f + δ` drifts by `−δ·t` in
/// phase, so the halves (centred `T/2` apart) differ by `−δ·T/2`.
pub fn drift_corrected(series: &[f32], tsamp_s: f64, freq_hz: f64, nbins: usize) -> Option<f64> {
    let half = series.len() / 2;
    if half < 2 * nbins {
        return None;
    }
    let first = profile_means(&series[..half], tsamp_s, freq_hz, nbins, 0.0);
    // The second half starts `half` samples later: fold with that phase offset.
    let second = profile_means(
        &series[half..2 * half],
        tsamp_s,
        freq_hz,
        nbins,
        half as f64 * tsamp_s,
    );
    let shift = phase_shift(&first, &second)?;
    Some(freq_hz - 2.0 * shift / (2.0 * half as f64 * tsamp_s))
}

fn profile_means(series: &[f32], tsamp_s: f64, freq_hz: f64, nbins: usize, t0: f64) -> Vec<f64> {
    let mut sums = vec![0.0f64; nbins];
    let mut counts = vec![0u64; nbins];
    let dphi = freq_hz * tsamp_s;
    let mut phase = (freq_hz * t0 + 0.5 * dphi).fract();
    for v in series {
        let b = ((phase * nbins as f64) as usize).min(nbins - 1);
        sums[b] += *v as f64;
        counts[b] += 1;
        phase += dphi;
        if phase >= 1.0 {
            phase -= phase.floor();
        }
    }
    let means: Vec<f64> = sums
        .iter()
        .zip(&counts)
        .map(|(s, c)| s / (*c).max(1) as f64)
        .collect();
    let mean = means.iter().sum::<f64>() / nbins as f64;
    means.iter().map(|m| m - mean).collect()
}

/// Phase (cycles, in `(-½, ½]`) by which `b` lags `a`: the peak of their circular
/// cross-correlation, interpolated with a parabola through its three highest points.
pub fn phase_shift(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len();
    if n < 3 || b.len() != n {
        return None;
    }
    let xc: Vec<f64> = (0..n)
        .map(|lag| (0..n).map(|i| a[i] * b[(i + lag) % n]).sum())
        .collect();
    let (k, peak) = xc.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1))?;
    if *peak <= 0.0 {
        return None;
    }
    let (l, r) = (xc[(k + n - 1) % n], xc[(k + 1) % n]);
    let denom = l - 2.0 * peak + r;
    let frac = if denom < 0.0 {
        0.5 * (l - r) / denom
    } else {
        0.0
    };
    let mut lag = (k as f64 + frac) / n as f64;
    if lag > 0.5 {
        lag -= 1.0;
    }
    Some(lag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn fold_matches_per_sample_floor() {
        let mut rng = StdRng::seed_from_u64(1);
        let x: Vec<f32> = (0..10_000).map(|_| rng.gen_range(0.0..1.0)).collect();
        let (tsamp, f, nb) = (1e-4, 13.37, 32);
        let (sums, counts) = fold(&x, tsamp, f, nb);
        let (mut s2, mut c2) = (vec![0.0f64; nb], vec![0u64; nb]);
        for (i, v) in x.iter().enumerate() {
            let phase = (f * (i as f64 + 0.5) * tsamp).fract();
            let b = (phase * nb as f64) as usize;
            s2[b] += *v as f64;
            c2[b] += 1;
        }
        // Accumulated and direct phases may put a sample on the other side of a bin edge.
        let moved: u64 = counts.iter().zip(&c2).map(|(a, b)| a.abs_diff(*b)).sum();
        assert!(moved <= 2, "{moved}");
        for b in 0..nb {
            assert!((sums[b] - s2[b]).abs() <= 2.0);
        }
    }

    #[test]
    fn sub_integrations_sum_to_the_whole_fold() {
        let mut rng = StdRng::seed_from_u64(3);
        let x: Vec<f32> = (0..10_007).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (tsamp, f, nb) = (1e-4, 13.37, 32);
        let (sums, counts) = fold(&x, tsamp, f, nb);
        for nsub in [1, 7, 32] {
            let parts = fold_subints(&x, tsamp, f, nb, nsub);
            assert_eq!(parts.len(), nsub);
            assert_eq!(parts[0].2, 0);
            let mut s2 = vec![0.0f64; nb];
            let mut c2 = vec![0u64; nb];
            for (s, c, _) in &parts {
                for b in 0..nb {
                    s2[b] += s[b];
                    c2[b] += c[b];
                }
            }
            assert_eq!(c2, counts, "{nsub} parts");
            for b in 0..nb {
                assert!((s2[b] - sums[b]).abs() < 1e-9, "{nsub} parts, bin {b}");
            }
            // Parts differ in length by at most one sample.
            let lens: Vec<u64> = parts.iter().map(|p| p.1.iter().sum()).collect();
            let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
            assert!(hi - lo <= 1, "{lens:?}");
        }
        assert_eq!(fold_subints(&x[..3], tsamp, f, nb, 32).len(), 3);
    }

    #[test]
    fn boxcar_snr_against_direct_formula() {
        let means = vec![0.0, 0.1, -0.1, 3.0, 3.0, 0.0, 0.05, -0.05];
        let counts = vec![100; 8];
        let (snr, w, start) = boxcar_snr(&means, &counts, 1.0);
        assert_eq!((w, start), (2, 3));
        let mu_off = (0.0 + 0.1 - 0.1 + 0.0 + 0.05 - 0.05) / 6.0;
        let want = (6.0 - 2.0 * mu_off) / (2.0f64 / 100.0).sqrt();
        assert!((snr - want).abs() < 1e-9);
    }

    #[test]
    fn noise_profile_is_insignificant_and_pulse_is_found() {
        let mut rng = StdRng::seed_from_u64(2);
        let normal = rand_distr::Normal::new(0.0f32, 1.0).unwrap();
        let tsamp = 1e-3;
        let noise: Vec<f32> = (0..50_000).map(|_| rng.sample(normal)).collect();
        let p = profile(&noise, tsamp, 9.1, 32, std_dev(&noise));
        assert!(p.snr < 6.0, "{}", p.snr);
        let f0 = 9.1;
        let pulsed: Vec<f32> = noise
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v + if ((i as f64 + 0.5) * tsamp * f0).fract() < 0.1 {
                    0.5
                } else {
                    0.0
                }
            })
            .collect();
        let r = refine(&pulsed, tsamp, f0 + 0.01, 0.05, 32);
        assert!(r.snr > 20.0, "{}", r.snr);
        assert!((r.freq_hz - f0).abs() < 1e-3, "{}", r.freq_hz);
    }

    #[test]
    fn phase_shift_of_rotated_profiles() {
        let a: Vec<f64> = (0..32)
            .map(|i| (-((i as f64 - 10.0) / 1.5).powi(2)).exp())
            .collect();
        let b: Vec<f64> = (0..32)
            .map(|i| (-((i as f64 - 13.25) / 1.5).powi(2)).exp())
            .collect();
        let s = phase_shift(&a, &b).unwrap();
        assert!((s - 3.25 / 32.0).abs() < 0.01, "{s}");
        assert!((phase_shift(&b, &a).unwrap() + 3.25 / 32.0).abs() < 0.01);
    }

    #[test]
    fn drift_correction_finds_the_true_frequency() {
        // A noiseless narrow pulse at 10 Hz folded at 10.02 Hz over 10 s drifts 0.2 cycles.
        let tsamp = 1e-3;
        let f0 = 10.0;
        let x: Vec<f32> = (0..10_000)
            .map(|i| {
                let ph = ((i as f64 + 0.5) * tsamp * f0).fract();
                (-((ph - 0.3) / 0.02).powi(2)).exp() as f32
            })
            .collect();
        let f = drift_corrected(&x, tsamp, 10.02, 64).unwrap();
        assert!((f - f0).abs() < 2e-3, "{f}");
    }
}
