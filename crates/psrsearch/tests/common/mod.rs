//! Helpers shared by psrsearch's test files.

use rustfft::num_complex::Complex32;

/// Relative RMS difference of `a` from `b`.
pub fn rel_rms(a: &[Complex32], b: &[Complex32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).norm_sqr() as f64)
        .sum();
    let den: f64 = b.iter().map(|y| y.norm_sqr() as f64).sum();
    (num / den).sqrt()
}
