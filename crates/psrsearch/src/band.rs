//! Where each channel of a baseband recording sits on the sky-frequency axis.
//!
//! Conventions (the ones `baseband` and `baseband-tasks` use):
//! - complex (quadrature) data: a channel sampled at rate `R` covers `R` Hz centred on its
//!   centre frequency; baseband frequency `f` in `[-R/2, R/2)` is sky frequency
//!   `centre + s·f`, with `s = +1` for upper and `-1` for lower sideband;
//! - real data: a channel covers `R/2` Hz; baseband frequency `f` in `[0, R/2]` is sky
//!   frequency `edge + s·f`, where `edge` is the lower band edge for upper sideband and the
//!   upper edge for lower sideband;
//! - a negative total bandwidth in a header (`BW` in DADA, `OBSBW` in GUPPI) means lower
//!   sideband: every channel is spectrally inverted *and* channels are numbered from the top
//!   of the band down, which is what dspsr does.

use serde::{Deserialize, Serialize};

/// Whether increasing baseband frequency means increasing sky frequency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sideband {
    /// Sky frequency increases with baseband frequency.
    Upper,
    /// Sky frequency decreases with baseband frequency (spectrum inverted).
    Lower,
}

impl Sideband {
    /// `+1.0` for upper, `-1.0` for lower sideband.
    pub fn sign(self) -> f64 {
        match self {
            Sideband::Upper => 1.0,
            Sideband::Lower => -1.0,
        }
    }

    /// The header convention: a negative bandwidth means lower sideband.
    pub fn from_bandwidth(bandwidth: f64) -> Self {
        if bandwidth < 0.0 {
            Sideband::Lower
        } else {
            Sideband::Upper
        }
    }
}

impl std::str::FromStr for Sideband {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "upper" | "usb" | "u" | "+1" | "1" => Ok(Sideband::Upper),
            "lower" | "lsb" | "l" | "-1" => Ok(Sideband::Lower),
            _ => Err(format!("unknown sideband {s:?}: expected upper or lower")),
        }
    }
}

/// The frequency layout of a recording: sampling rate, channels, polarisations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// Complete samples per second in each channel.
    pub sample_rate_hz: f64,
    /// Quadrature (complex) samples rather than real ones.
    pub complex: bool,
    /// Number of polarisations (1 or 2).
    pub npol: usize,
    /// Sky frequency in MHz of the middle of each channel, in file order.
    pub centre_mhz: Vec<f64>,
    /// Sideband of every channel.
    pub sideband: Sideband,
}

impl Band {
    /// The layout that DADA and GUPPI headers describe: `nchan` equal channels filling a band
    /// of `total_bw_mhz` (negative for lower sideband) centred on `centre_mhz`.
    pub fn from_total(
        centre_mhz: f64,
        total_bw_mhz: f64,
        nchan: usize,
        sample_rate_hz: f64,
        complex: bool,
        npol: usize,
    ) -> Band {
        let chan_bw = total_bw_mhz / nchan as f64;
        let centres = (0..nchan)
            .map(|c| centre_mhz - total_bw_mhz / 2.0 + (c as f64 + 0.5) * chan_bw)
            .collect();
        Band {
            sample_rate_hz,
            complex,
            npol,
            centre_mhz: centres,
            sideband: Sideband::from_bandwidth(total_bw_mhz),
        }
    }

    /// Number of channels.
    pub fn nchan(&self) -> usize {
        self.centre_mhz.len()
    }

    /// Width in MHz of one channel (always positive).
    pub fn channel_bandwidth_mhz(&self) -> f64 {
        if self.complex {
            self.sample_rate_hz / 1e6
        } else {
            self.sample_rate_hz / 2e6
        }
    }

    /// Sample interval in seconds.
    pub fn tsamp_s(&self) -> f64 {
        1.0 / self.sample_rate_hz
    }

    /// Lowest sky frequency covered, MHz.
    pub fn lowest_mhz(&self) -> f64 {
        let lo = self
            .centre_mhz
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        lo - self.channel_bandwidth_mhz() / 2.0
    }

    /// Highest sky frequency covered, MHz.
    pub fn highest_mhz(&self) -> f64 {
        let hi = self
            .centre_mhz
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        hi + self.channel_bandwidth_mhz() / 2.0
    }

    /// Middle of the whole band, the default dedispersion reference (as in baseband-tasks).
    pub fn band_centre_mhz(&self) -> f64 {
        (self.lowest_mhz() + self.highest_mhz()) / 2.0
    }

    /// Sky frequency in MHz seen at baseband frequency `f_hz` of channel `chan`.
    ///
    /// For complex data `f_hz` lies in `[-R/2, R/2)`; for real data in `[0, R/2]`.
    pub fn sky_mhz(&self, chan: usize, f_hz: f64) -> f64 {
        let s = self.sideband.sign();
        if self.complex {
            self.centre_mhz[chan] + s * f_hz / 1e6
        } else {
            self.centre_mhz[chan] + s * (f_hz - self.sample_rate_hz / 4.0) / 1e6
        }
    }

    /// Offset in MHz of sky frequency `f_hz` from `reference_mhz`, computed without forming
    /// the (large) absolute frequency first, so that the chirp phase keeps its precision.
    pub fn sky_offset_mhz(&self, chan: usize, f_hz: f64, reference_mhz: f64) -> f64 {
        let s = self.sideband.sign();
        let base = self.centre_mhz[chan] - reference_mhz;
        if self.complex {
            base + s * f_hz / 1e6
        } else {
            base + s * (f_hz - self.sample_rate_hz / 4.0) / 1e6
        }
    }

    /// The same layout with the sideband of every channel replaced (channel centres kept).
    pub fn with_sideband(mut self, sideband: Sideband) -> Band {
        self.sideband = sideband;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dada_sample_layout() {
        // sample.dada: FREQ 320, BW 16, complex, 1 channel at 16 MHz.
        let b = Band::from_total(320.0, 16.0, 1, 16e6, true, 2);
        assert_eq!(b.centre_mhz, vec![320.0]);
        assert_eq!(b.lowest_mhz(), 312.0);
        assert_eq!(b.highest_mhz(), 328.0);
        assert_eq!(b.sky_mhz(0, -8e6), 312.0);
    }

    #[test]
    fn lower_sideband_channels_descend_and_invert() {
        let b = Band::from_total(1000.0, -4.0, 4, 1e6, true, 1);
        assert_eq!(b.centre_mhz, vec![1001.5, 1000.5, 999.5, 998.5]);
        assert_eq!(b.sideband, Sideband::Lower);
        assert!((b.sky_mhz(0, 0.25e6) - 1001.25).abs() < 1e-12);
        assert_eq!(b.band_centre_mhz(), 1000.0);
    }

    #[test]
    fn real_data_edges() {
        // MeerKAT sample: FREQ 1400, BW 400, real, sampled at 800 MHz.
        let b = Band::from_total(1400.0, 400.0, 1, 800e6, false, 2);
        assert_eq!(b.sky_mhz(0, 0.0), 1200.0);
        assert_eq!(b.sky_mhz(0, 400e6), 1600.0);
        let lsb = b.clone().with_sideband(Sideband::Lower);
        assert_eq!(lsb.sky_mhz(0, 0.0), 1600.0);
        assert!((b.sky_offset_mhz(0, 100e6, 1400.0) + 100.0).abs() < 1e-9);
    }

    #[test]
    fn sideband_parse() {
        assert_eq!("LSB".parse::<Sideband>(), Ok(Sideband::Lower));
        assert_eq!("upper".parse::<Sideband>(), Ok(Sideband::Upper));
        assert!("sideways".parse::<Sideband>().is_err());
    }
}
