//! Cold-plasma dispersion: delays and the interstellar transfer function.
//!
//! The dispersion constant is kept as a parameter because two conventions are in use:
//! `1/2.41e-4 s MHz² cm³/pc ≈ 4149.378` (dspsr, PRESTO, baseband-tasks, TEMPO; the default
//! here so that outputs match theirs) and the physical `e²/(2π mₑ c) ≈ 4148.808`.

/// `1/2.41e-4` s MHz² cm³ pc⁻¹, the convention of dspsr, PRESTO and baseband-tasks.
pub const DEFAULT_DISPERSION_CONSTANT: f64 = 1.0 / 2.41e-4;

/// A dispersion measure together with the constant that turns it into delays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dispersion {
    /// Dispersion measure in pc cm⁻³.
    pub dm: f64,
    /// Dispersion constant in s MHz² cm³ pc⁻¹.
    pub constant: f64,
}

impl Dispersion {
    /// `dm` with the default constant.
    pub fn new(dm: f64) -> Self {
        Dispersion {
            dm,
            constant: DEFAULT_DISPERSION_CONSTANT,
        }
    }

    /// Arrival delay in seconds of frequency `nu_mhz` relative to `ref_mhz` (positive when
    /// `nu` is below the reference: low frequencies arrive late).
    pub fn delay_s(&self, nu_mhz: f64, ref_mhz: f64) -> f64 {
        self.constant * self.dm * (1.0 / (nu_mhz * nu_mhz) - 1.0 / (ref_mhz * ref_mhz))
    }

    /// Phase of the interstellar transfer function in cycles at `ref + offset`, relative to
    /// the reference frequency: `k·DM·Δ²/(ref²·(ref+Δ))` with `Δ = offset` (Lorimer & Kramer
    /// eq. 5.21 written with absolute frequency, as baseband-tasks does). Taking the offset
    /// rather than the absolute frequency avoids cancellation: the phase reaches 10⁶ cycles
    /// and must be right to far better than one.
    pub fn phase_cycles(&self, offset_mhz: f64, ref_mhz: f64) -> f64 {
        let nu = ref_mhz + offset_mhz;
        // The constant is in s MHz²; with frequencies in MHz the result is in s·MHz = 10⁶ cycles.
        self.constant * self.dm * 1e6 * offset_mhz * offset_mhz / (ref_mhz * ref_mhz * nu)
    }

    /// Delay in seconds across `[lo, hi]` MHz: the smear of an undedispersed pulse.
    pub fn smear_s(&self, lo_mhz: f64, hi_mhz: f64) -> f64 {
        self.delay_s(lo_mhz, hi_mhz).abs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_sign_and_size() {
        let d = Dispersion::new(10.0);
        // 10 pc/cc between 400 MHz and infinity: 4149.378·10/400² s.
        let t = d.delay_s(400.0, f64::INFINITY);
        assert!((t - DEFAULT_DISPERSION_CONSTANT * 10.0 / 160_000.0).abs() < 1e-12);
        assert!(d.delay_s(300.0, 400.0) > 0.0);
        assert!(d.delay_s(500.0, 400.0) < 0.0);
    }

    #[test]
    fn phase_derivative_is_the_delay() {
        // dφ/dν (cycles per Hz) = -(delay relative to the reference), the group delay.
        let d = Dispersion::new(30.0);
        let (r, off, h) = (430.0, -1.3, 1e-6);
        let dphi = (d.phase_cycles(off + h, r) - d.phase_cycles(off - h, r)) / (2.0 * h * 1e6);
        let expected = -d.delay_s(r + off, r);
        assert!(
            ((dphi - expected) / expected).abs() < 1e-6,
            "{dphi} vs {expected}"
        );
    }

    #[test]
    fn phase_matches_absolute_formula() {
        // baseband-tasks: k·DM·ν·(1/ref − 1/ν)² cycles.
        let d = Dispersion::new(56.7);
        let (r, nu) = (1400.0, 1392.25);
        let absolute = d.constant * d.dm * 1e6 * nu * (1.0 / r - 1.0 / nu).powi(2);
        let ours = d.phase_cycles(nu - r, r);
        assert!((absolute - ours).abs() < 1e-6 * absolute.abs());
    }
}
