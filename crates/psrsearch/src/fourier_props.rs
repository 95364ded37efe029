//! A signal's properties at one Fourier frequency, from the series itself: raw power, phase,
//! and where in the observation the power comes from (centroid) and how evenly it is spread
//! (purity), the columns PRESTO's `accelsearch` lists for each harmonic of a candidate.
//!
//! With `t = n/N` the time of sample `n` in parts of the observation and
//! `A(r) = Σ x[n] exp(-2πi r t)` the Fourier amplitude at `r` bins, a signal of envelope `w(t)`
//! at `r` has, to second order in the offset `δ` from `r`,
//! `A(r + δ) ≈ S0 exp(-2πi δ t̄) (1 - 2π² δ² σ²)` where `t̄` and `σ²` are the mean and variance
//! of `t` weighted by `w`. Hence
//! - centroid `t̄ = -(1/2π) dφ/dr`, with `dφ/dr = Im(A' A*) / |A|²` (0.5 for a signal present
//!   all through the observation, 0.25 for one in its first half only);
//! - purity `√(12 σ²)`, with `σ² = -P'' / (8π² P)` and `P'' = 2 (|A'|² + Re(A'' A*))` the
//!   second derivative of the power `P = |A|²` (1 for an even spread, as PRESTO's, 0.5 for a
//!   signal in one half only).
//!
//! `A'` and `A''` are the sums with the factors `-2πi t` and `(-2πi t)²`; all three are
//! accumulated in one pass over the series. Both measures assume `r` is at the peak of the
//! power, as a folded candidate's frequency is to within a fraction of a bin.

use serde::{Deserialize, Serialize};

/// One harmonic's properties (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HarmonicProps {
    /// The frequency measured at, Fourier bins: the power's peak nearest the one asked for.
    pub r: f64,
    /// `|A|²`, not normalised.
    pub raw_power: f64,
    /// Phase of `A` at the first sample, radians in (-π, π].
    pub phase_rad: f64,
    /// Mean time of the power, in parts of the observation (0 to 1).
    pub centroid: f64,
    /// Spread of the power in time, 1 for an even spread over the observation.
    pub purity: f64,
}

/// Samples between exact recomputations of the rotating phasor, which otherwise drifts by
/// rounding.
const RESYNC: usize = 1024;

/// Newton steps towards the peak of the power taken from the `r` asked for.
const PEAK_STEPS: usize = 3;

/// The properties of `x` (its mean taken out) at the peak of its power nearest `r` Fourier
/// bins: up to three Newton steps on the power's derivatives, each at most half a
/// bin, keep the measures from depending on how close to the peak `r` was given (off the
/// peak, the power's curvature makes a steady signal look less pure than it is).
pub fn harmonic_props(x: &[f32], r: f64) -> HarmonicProps {
    let flat = HarmonicProps {
        r,
        raw_power: 0.0,
        phase_rad: 0.0,
        centroid: 0.5,
        purity: 1.0,
    };
    if x.is_empty() {
        return flat;
    }
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64;
    let mut at = r;
    let mut s = sums(x, mean, at);
    for _ in 0..PEAK_STEPS {
        let (p1, p2) = (s.power_slope(), s.power_curvature());
        if p2 >= 0.0 || s.power() == 0.0 {
            break;
        }
        let step = (-p1 / p2).clamp(-0.5, 0.5);
        if step.abs() < 1e-4 {
            break;
        }
        at += step;
        s = sums(x, mean, at);
    }
    let p = s.power();
    if p == 0.0 {
        return flat;
    }
    let variance = (-s.power_curvature() / (8.0 * std::f64::consts::PI.powi(2) * p)).max(0.0);
    HarmonicProps {
        r: at,
        raw_power: p,
        phase_rad: s.a[1].atan2(s.a[0]),
        // dφ/dr = Im(A' A*) / |A|².
        centroid: -(s.d1[1] * s.a[0] - s.d1[0] * s.a[1]) / p / std::f64::consts::TAU,
        purity: (12.0 * variance).sqrt(),
    }
}

/// `A`, `A'` and `A''` at one frequency, as (re, im).
struct Sums {
    a: [f64; 2],
    d1: [f64; 2],
    d2: [f64; 2],
}

impl Sums {
    fn power(&self) -> f64 {
        self.a[0] * self.a[0] + self.a[1] * self.a[1]
    }

    /// `P' = 2 Re(A' A*)`.
    fn power_slope(&self) -> f64 {
        2.0 * (self.d1[0] * self.a[0] + self.d1[1] * self.a[1])
    }

    /// `P'' = 2 (|A'|² + Re(A'' A*))`.
    fn power_curvature(&self) -> f64 {
        2.0 * (self.d1[0] * self.d1[0]
            + self.d1[1] * self.d1[1]
            + self.d2[0] * self.a[0]
            + self.d2[1] * self.a[1])
    }
}

/// One pass over `x - mean`: the sums of `y·e`, `y·t·e` and `y·t²·e` with
/// `e = exp(-2πi r t)`, turned into `A`, `A' = -2πi Σ y t e` and `A'' = -4π² Σ y t² e`.
fn sums(x: &[f32], mean: f64, r: f64) -> Sums {
    let nf = x.len() as f64;
    let two_pi = std::f64::consts::TAU;
    let step = -two_pi * r / nf;
    let (ws, wc) = step.sin_cos();
    let (mut a0, mut a1, mut a2) = ([0.0f64; 2], [0.0f64; 2], [0.0f64; 2]);
    let (mut er, mut ei) = (1.0f64, 0.0f64);
    for (k, &v) in x.iter().enumerate() {
        if k % RESYNC == 0 {
            (ei, er) = (step * k as f64).sin_cos();
        }
        let y = f64::from(v) - mean;
        let t = k as f64 / nf;
        let (yr, yi) = (y * er, y * ei);
        a0[0] += yr;
        a0[1] += yi;
        a1[0] += yr * t;
        a1[1] += yi * t;
        a2[0] += yr * t * t;
        a2[1] += yi * t * t;
        (er, ei) = (er * wc - ei * ws, er * ws + ei * wc);
    }
    Sums {
        a: a0,
        d1: [two_pi * a1[1], -two_pi * a1[0]],
        d2: [-two_pi * two_pi * a2[0], -two_pi * two_pi * a2[1]],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sinusoid(n: usize, r: f64, phase: f64, on: impl Fn(f64) -> bool) -> Vec<f32> {
        (0..n)
            .map(|k| {
                let t = k as f64 / n as f64;
                if on(t) {
                    (std::f64::consts::TAU * r * t + phase).cos() as f32
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn a_steady_sinusoid_is_centred_and_pure() {
        let n = 1 << 16;
        let p = harmonic_props(&sinusoid(n, 1000.0, 0.7, |_| true), 1000.0);
        // |A| = N/2 for a unit cosine at an exact bin; its phase is the cosine's.
        assert!(
            (p.raw_power.sqrt() / (n as f64 / 2.0) - 1.0).abs() < 1e-3,
            "{p:?}"
        );
        assert!((p.phase_rad - 0.7).abs() < 1e-3, "{p:?}");
        assert!((p.centroid - 0.5).abs() < 1e-3, "{p:?}");
        assert!((p.purity - 1.0).abs() < 1e-2, "{p:?}");
    }

    #[test]
    fn a_signal_in_one_half_shows_where_and_how_spread() {
        let n = 1 << 16;
        let first = harmonic_props(&sinusoid(n, 2000.0, 0.0, |t| t < 0.5), 2000.0);
        assert!((first.centroid - 0.25).abs() < 1e-2, "{first:?}");
        assert!((first.purity - 0.5).abs() < 2e-2, "{first:?}");
        let last = harmonic_props(&sinusoid(n, 2000.0, 0.0, |t| t >= 0.5), 2000.0);
        assert!((last.centroid - 0.75).abs() < 1e-2, "{last:?}");
        assert!((last.purity - 0.5).abs() < 2e-2, "{last:?}");
    }

    #[test]
    fn a_frequency_off_the_peak_is_measured_at_the_peak() {
        let n = 1 << 16;
        let x = sinusoid(n, 1000.3, 0.0, |_| true);
        let p = harmonic_props(&x, 1000.0);
        assert!((p.r - 1000.3).abs() < 1e-2, "{p:?}");
        assert!((p.purity - 1.0).abs() < 2e-2, "{p:?}");
        assert!((p.centroid - 0.5).abs() < 1e-2, "{p:?}");
    }

    #[test]
    fn a_constant_series_has_no_power() {
        let p = harmonic_props(&[3.0; 100], 7.0);
        assert!(p.raw_power < 1e-12, "{p:?}");
    }
}
