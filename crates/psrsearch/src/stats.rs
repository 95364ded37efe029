//! Tail probabilities and their Gaussian-equivalent significance, in log space so that the
//! overwhelming detections of bright pulsars (p ≈ e^-1000) still get a finite number.

/// `ln erfc(x)`, from the Chebyshev fit of Numerical Recipes' `erfcc` (relative error below
/// 1.2e-7 everywhere), which is already of the form `t·exp(…)` and so never underflows.
pub fn ln_erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let ln_pos = t.ln() + poly;
    if x >= 0.0 {
        ln_pos
    } else {
        (2.0 - ln_pos.exp()).ln()
    }
}

/// `ln P(N(0,1) > sigma)`.
pub fn ln_normal_sf(sigma: f64) -> f64 {
    ln_erfc(sigma / std::f64::consts::SQRT_2) - std::f64::consts::LN_2
}

/// The `sigma` whose one-sided Gaussian tail has probability `exp(ln_p)`; 0 for `p ≥ ½`.
pub fn sigma_from_ln_p(ln_p: f64) -> f64 {
    if ln_p >= -std::f64::consts::LN_2 {
        return 0.0;
    }
    // ln_normal_sf is monotonic; bisect between 0 and a bound past the asymptote.
    let (mut lo, mut hi) = (0.0, (-2.0 * ln_p).sqrt() + 4.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if ln_normal_sf(mid) > ln_p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-10 {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// `ln Q(n, s)`: log probability that the sum of `n` independent unit exponentials (the
/// normalised powers of `n` harmonics of noise) exceeds `s`; `Q(n,s) = e^-s Σ_{k<n} s^k/k!`.
pub fn ln_gamma_q_int(n: usize, s: f64) -> f64 {
    if s <= 0.0 {
        return 0.0;
    }
    let ln_s = s.ln();
    let mut ln_fact = 0.0;
    let mut terms = Vec::with_capacity(n);
    for k in 0..n {
        if k > 0 {
            ln_fact += (k as f64).ln();
        }
        terms.push(k as f64 * ln_s - ln_fact);
    }
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = terms.iter().map(|t| (t - max).exp()).sum();
    (-s + max + sum.ln()).min(0.0)
}

/// `ln` of the chance that the largest of `trials` independent tries exceeds a threshold each
/// exceeds with probability `exp(ln_p)`: `1 − (1 − p)^trials`.
pub fn ln_p_any(ln_p: f64, trials: f64) -> f64 {
    let p = ln_p.exp();
    if p < 1e-12 {
        // Here 1 − (1−p)^N = N·p to far better than our precision.
        return ln_p + trials.max(1.0).ln();
    }
    (-(trials.max(1.0) * (-p).ln_1p()).exp_m1()).ln()
}

/// Gaussian-equivalent significance of a harmonic sum `power` of `nharm` normalised powers,
/// corrected for `trials` independent tries.
pub fn harmonic_sigma(power: f64, nharm: usize, trials: f64) -> f64 {
    sigma_from_ln_p(ln_p_any(ln_gamma_q_int(nharm, power), trials))
}

/// The smallest harmonic-sum power that reaches `sigma` (inverse of [`harmonic_sigma`]).
pub fn power_for_sigma(sigma: f64, nharm: usize, trials: f64) -> f64 {
    let (mut lo, mut hi) = (
        0.0,
        10.0 + nharm as f64 * 4.0 + sigma * sigma + trials.max(1.0).ln() * 2.0,
    );
    while harmonic_sigma(hi, nharm, trials) < sigma {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if harmonic_sigma(mid, nharm, trials) < sigma {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        ((a - b) / b).abs() < rel
    }

    #[test]
    fn erfc_against_tabulated_values() {
        for (x, v) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_13),
            (3.0, 2.209_049_699_858_544e-5),
            (10.0, 2.088_487_583_762_545e-45),
            (-1.0, 1.842_700_792_949_715),
        ] {
            assert!(close(ln_erfc(x).exp(), v, 2e-7), "erfc({x})");
        }
        // Deep tail: erfc(30) ≈ 2.5646e-393 underflows f64 but its log does not.
        assert!(
            close(ln_erfc(30.0), -903.974_117_110_6, 2e-9),
            "{}",
            ln_erfc(30.0)
        );
    }

    #[test]
    fn sigma_roundtrip() {
        // Φ(−5) = 2.866515718791939e-7.
        assert!(close(
            sigma_from_ln_p(2.866_515_718_791_939e-7f64.ln()),
            5.0,
            1e-6
        ));
        assert_eq!(sigma_from_ln_p(0.7f64.ln()), 0.0);
        for s in [1.0, 3.0, 8.0, 40.0, 120.0] {
            assert!(close(sigma_from_ln_p(ln_normal_sf(s)), s, 1e-7), "{s}");
        }
    }

    /// Obviously correct: integrate the Gamma(n) density numerically.
    fn gamma_q_numeric(n: usize, s: f64) -> f64 {
        let steps = 200_000;
        let upper = s + 60.0 + 4.0 * n as f64;
        let h = (upper - s) / steps as f64;
        let fact: f64 = (1..n).map(|k| k as f64).product();
        let pdf = |x: f64| x.powi(n as i32 - 1) * (-x).exp() / fact;
        let mut acc = 0.5 * (pdf(s) + pdf(upper));
        for i in 1..steps {
            acc += pdf(s + i as f64 * h);
        }
        acc * h
    }

    #[test]
    fn gamma_tail_against_numeric_integration() {
        for n in [1usize, 2, 4, 8, 16] {
            for s in [0.5, 3.0, 12.0, 40.0] {
                let want = gamma_q_numeric(n, s);
                let got = ln_gamma_q_int(n, s).exp();
                assert!(close(got, want, 1e-6), "n={n} s={s}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn trials_and_inverse() {
        let ln_p = 1e-9f64.ln();
        assert!(close(ln_p_any(ln_p, 1000.0).exp(), 1e-6, 1e-5));
        assert!(close(ln_p_any(0.1f64.ln(), 2.0).exp(), 0.19, 1e-9));
        for nh in [1usize, 4, 16] {
            let p = power_for_sigma(6.0, nh, 1e5);
            assert!((harmonic_sigma(p, nh, 1e5) - 6.0).abs() < 1e-6);
        }
    }
}
