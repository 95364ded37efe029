//! Simulated observations: Gaussian noise plus pulsars dispersed with the exact interstellar
//! transfer function, written as DADA or GUPPI.
//!
//! A pulsar's emission is amplitude-modulated noise: in each channel and polarisation an
//! independent complex Gaussian series times `√(A·p(φ))`, with `p` a wrapped Gaussian pulse
//! of unit peak whose FWHM is the duty cycle, so it adds `A` times the system noise power
//! at the pulse peak. Each pulsar's signal is generated on a padded interval, multiplied in
//! the Fourier domain by `exp(+2πi·s·φ_DM(ν))` (the inverse of [`crate::chirp`]'s filter,
//! with the full inter-channel delay) and cut back, so no wrap-around reaches the data.
//! Pulse phase is zero at time zero at the reference frequency (the band centre by default).

use std::io::Write;
use std::path::Path;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use rustfft::num_complex::Complex32;
use rustfft::FftPlanner;
use serde::{Deserialize, Serialize};

use crate::band::Band;
use crate::dm::{Dispersion, DEFAULT_DISPERSION_CONSTANT};
use crate::format::dada::{write_dada, DadaHeader};
use crate::format::guppi::{write_guppi_as, GuppiHeader};
use crate::format::metadata::dada_utc;
use crate::format::vdif::{write_vdif_at, VdifSidecar};
use crate::format::SampleFormat;
use crate::format::{Metadata, SkyPosition};
use crate::voltages::Voltages;

/// An injected pulsar.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pulsar {
    /// Spin period, s.
    pub period_s: f64,
    /// Dispersion measure.
    pub dm: f64,
    /// Pulse FWHM as a fraction of the period.
    pub duty_cycle: f64,
    /// Peak pulsed power relative to the system noise power.
    pub amplitude: f64,
    /// A circular binary orbit (`None`: an isolated pulsar).
    #[serde(default)]
    pub orbit: Option<Orbit>,
}

/// A circular orbit, seen as the light-travel delay it puts on the pulses.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Orbit {
    /// Orbital period, s.
    pub period_s: f64,
    /// Projected semi-major axis, light-seconds (`a·sin i / c`).
    pub asini_lts: f64,
    /// Orbital phase at time zero, cycles from the ascending node.
    pub phase: f64,
}

impl Orbit {
    /// Delay of pulses emitted at `t` (s): `asini·sin(2π(t/Pb + phase))`.
    pub fn delay_s(&self, t: f64) -> f64 {
        self.asini_lts * (std::f64::consts::TAU * (t / self.period_s + self.phase)).sin()
    }

    /// Line-of-sight acceleration at `t`, m/s² (positive away from the observer).
    pub fn accel_ms2(&self, t: f64) -> f64 {
        let w = std::f64::consts::TAU / self.period_s;
        -self.asini_lts * 299_792_458.0 * w * w * (w * t + std::f64::consts::TAU * self.phase).sin()
    }
}

impl FromStr for Pulsar {
    type Err = String;
    /// `period_ms:dm:duty:amplitude[:orbit_s:asini_lts[:orbit_phase]]`, e.g.
    /// `33.1:26.8:0.05:0.04`, or `33.1:26.8:0.05:0.04:600:2.5:0.25` in a 10-minute orbit.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || {
            format!(
                "pulsar {s:?}: expected period_ms:dm:duty:amplitude[:orbit_s:asini_lts[:orbit_phase]], \
                 e.g. 33.1:26.8:0.05:0.04 or 33.1:26.8:0.05:0.04:600:2.5:0.25"
            )
        };
        if ![4, 6, 7].contains(&parts.len()) {
            return Err(bad());
        }
        let v: Vec<f64> = parts
            .iter()
            .map(|p| p.trim().parse::<f64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let p = Pulsar {
            period_s: v[0] / 1e3,
            dm: v[1],
            duty_cycle: v[2],
            amplitude: v[3],
            orbit: (v.len() > 4).then(|| Orbit {
                period_s: v[4],
                asini_lts: v[5],
                phase: v.get(6).copied().unwrap_or(0.0),
            }),
        };
        p.validate()?;
        Ok(p)
    }
}

impl Pulsar {
    fn validate(&self) -> Result<(), String> {
        let ok = self.period_s > 0.0
            && self.dm >= 0.0
            && self.duty_cycle > 0.0
            && self.duty_cycle < 1.0
            && self.amplitude >= 0.0
            && self.orbit.is_none_or(|o| {
                o.period_s > 0.0
                    && o.asini_lts >= 0.0
                    && o.phase.is_finite()
                    && o.asini_lts.is_finite()
            });
        if !ok {
            return Err(format!(
                "pulsar {self:?}: need period > 0, DM ≥ 0, 0 < duty < 1, amplitude ≥ 0, \
                 orbital period > 0 and asini ≥ 0"
            ));
        }
        Ok(())
    }

    /// Pulse shape at rotational phase `phase` (cycles): a wrapped Gaussian of unit peak.
    pub fn profile(&self, phase: f64) -> f64 {
        let d = phase - phase.round();
        (-4.0 * std::f64::consts::LN_2 * (d / self.duty_cycle).powi(2)).exp()
    }
}

/// Output encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SimFormat {
    /// PSRDADA with `NBIT` 8.
    Dada8,
    /// PSRDADA with `NBIT` 16.
    Dada16,
    /// PSRDADA with `NBIT` 32 (floats, no quantisation).
    Dada32,
    /// GUPPI RAW, 8-bit, this many samples per block.
    Guppi {
        /// Samples per block.
        block_samples: usize,
    },
    /// GUPPI RAW, 16-bit, this many samples per block.
    Guppi16 {
        /// Samples per block.
        block_samples: usize,
    },
    /// VDIF, 8-bit, one thread per channel and polarisation, with the `FILE.hdr` side-car
    /// that gives the sky frequencies.
    Vdif8,
}

/// What to simulate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Band centre, MHz.
    pub centre_mhz: f64,
    /// Total bandwidth, MHz; negative for lower sideband.
    pub bandwidth_mhz: f64,
    /// Channels.
    pub nchan: usize,
    /// Polarisations.
    pub npol: usize,
    /// Complex samples (real ones otherwise; DADA only).
    pub complex: bool,
    /// Samples per channel.
    pub nsamples: usize,
    /// Random seed.
    pub seed: u64,
    /// Injected pulsars.
    pub pulsars: Vec<Pulsar>,
    /// Dispersion constant, s MHz² cm³ pc⁻¹.
    pub dispersion_constant: f64,
    /// Reference frequency for pulse phase, MHz (band centre if `None`).
    pub reference_mhz: Option<f64>,
    /// Noise RMS of each component in output units (matters for 8-bit quantisation).
    pub rms: f32,
    /// Source, telescope, position and start time written into the headers (the start
    /// time of a VDIF file is the whole second at or before it).
    #[serde(default)]
    pub metadata: Metadata,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            centre_mhz: 820.0,
            bandwidth_mhz: 8.0,
            nchan: 4,
            npol: 2,
            complex: true,
            nsamples: 1 << 20,
            seed: 1,
            pulsars: Vec::new(),
            dispersion_constant: DEFAULT_DISPERSION_CONSTANT,
            reference_mhz: None,
            rms: 10.0,
            metadata: SimConfig::default_metadata(),
        }
    }
}

/// Why a simulation cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// Contradictory or out-of-range settings.
    #[error("invalid simulation settings: {0}")]
    Config(String),
    /// Writing the file.
    #[error("cannot write the simulated file")]
    Io(#[from] std::io::Error),
}

impl SimConfig {
    /// What a simulation's headers say unless told otherwise: source `SIMULATED` at
    /// 12:00:00, +30:00:00 (an arbitrary position, so that products show one), telescope
    /// `Fake` (SIGPROC's and PRESTO's name for simulated data), starting at MJD 51544
    /// (2000-01-01 00:00 UTC).
    pub fn default_metadata() -> Metadata {
        Metadata {
            source: "SIMULATED".into(),
            telescope: "Fake".into(),
            start_mjd: Some(51_544.0),
            position: SkyPosition::new(12.0, 30.0),
        }
    }

    /// The band this configuration describes.
    pub fn band(&self) -> Band {
        let rate = self.bandwidth_mhz.abs() * 1e6 / self.nchan as f64
            * if self.complex { 1.0 } else { 2.0 };
        Band::from_total(
            self.centre_mhz,
            self.bandwidth_mhz,
            self.nchan,
            rate,
            self.complex,
            self.npol,
        )
    }

    fn validate(&self) -> Result<(), SimError> {
        let bad = |s: &str| Err(SimError::Config(s.to_string()));
        if self.nchan == 0 || self.npol == 0 || self.npol > 2 {
            return bad("need at least one channel and one or two polarisations");
        }
        if self.bandwidth_mhz == 0.0 || !self.bandwidth_mhz.is_finite() {
            return bad("bandwidth must be non-zero");
        }
        if self.centre_mhz - self.bandwidth_mhz.abs() / 2.0 <= 0.0 {
            return bad("the band must lie above 0 MHz");
        }
        if self.nsamples == 0 {
            return bad("need at least one sample");
        }
        for p in &self.pulsars {
            p.validate().map_err(SimError::Config)?;
        }
        Ok(())
    }
}

/// Generate the voltages (in units of the noise RMS per component times `rms`).
///
/// # Errors
/// Invalid settings.
pub fn simulate(config: &SimConfig) -> Result<(Band, Voltages), SimError> {
    config.validate()?;
    let band = config.band();
    let n = config.nsamples;
    let reference = config
        .reference_mhz
        .unwrap_or_else(|| band.band_centre_mhz());
    let rate = band.sample_rate_hz;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut out = Voltages::zeros(band.nchan(), band.npol, n);
    // Complex noise has half its power in each component.
    let component = if band.complex {
        std::f32::consts::FRAC_1_SQRT_2
    } else {
        1.0
    };
    let mut planner = FftPlanner::<f32>::new();
    for c in 0..band.nchan() {
        // Pad by the largest delay any pulsar has anywhere in this channel.
        let pad = config
            .pulsars
            .iter()
            .map(|p| {
                let d = Dispersion {
                    dm: p.dm,
                    constant: config.dispersion_constant,
                };
                let half = band.channel_bandwidth_mhz() / 2.0;
                let lo = d.delay_s(band.centre_mhz[c] - half, reference).abs();
                let hi = d.delay_s(band.centre_mhz[c] + half, reference).abs();
                (lo.max(hi) * rate).ceil() as usize
            })
            .max()
            .unwrap_or(0)
            + 64;
        let len = fast_len(n + 2 * pad);
        let fwd = planner.plan_fft_forward(len);
        let inv = planner.plan_fft_inverse(len);
        let mut scratch = vec![
            Complex32::new(0.0, 0.0);
            fwd.get_inplace_scratch_len()
                .max(inv.get_inplace_scratch_len())
        ];
        let filters: Vec<Vec<Complex32>> = config
            .pulsars
            .iter()
            .map(|p| dispersing_filter(&band, c, p.dm, config.dispersion_constant, reference, len))
            .collect();
        for p in 0..band.npol {
            let dst = out.series_mut(c, p);
            for v in dst.iter_mut() {
                let re: f32 = rng.sample(StandardNormal);
                let im: f32 = if band.complex {
                    rng.sample(StandardNormal)
                } else {
                    0.0
                };
                *v = Complex32::new(re, im) * component;
            }
            if config.pulsars.is_empty() {
                continue;
            }
            let mut total = vec![Complex32::new(0.0, 0.0); len];
            let mut buf = vec![Complex32::new(0.0, 0.0); len];
            for (psr, h) in config.pulsars.iter().zip(&filters) {
                for (i, b) in buf.iter_mut().enumerate() {
                    // Intrinsic time of padded sample i at the reference frequency.
                    let t = (i as f64 - pad as f64) / rate;
                    let emitted = t - psr.orbit.map_or(0.0, |o| o.delay_s(t));
                    let env = (psr.amplitude * psr.profile(emitted / psr.period_s)).sqrt();
                    *b = if env > 1e-6 {
                        let re: f32 = rng.sample(StandardNormal);
                        let im: f32 = if band.complex {
                            rng.sample(StandardNormal)
                        } else {
                            0.0
                        };
                        Complex32::new(re, im) * (component * env as f32)
                    } else {
                        Complex32::new(0.0, 0.0)
                    };
                }
                fwd.process_with_scratch(&mut buf, &mut scratch);
                for ((t, b), h) in total.iter_mut().zip(&buf).zip(h) {
                    *t += b * h;
                }
            }
            inv.process_with_scratch(&mut total, &mut scratch);
            let scale = 1.0 / len as f32;
            for (d, s) in dst.iter_mut().zip(&total[pad..pad + n]) {
                *d += if band.complex {
                    s * scale
                } else {
                    Complex32::new(s.re * scale, 0.0)
                };
            }
        }
    }
    let gain = config.rms / component;
    for v in out.as_mut_slice() {
        *v *= gain;
    }
    Ok((band, out))
}

/// `exp(+2πi·s·φ(ν))` on an `len`-point grid: the dispersing filter, inverse of the chirp.
fn dispersing_filter(
    band: &Band,
    chan: usize,
    dm: f64,
    constant: f64,
    reference: f64,
    len: usize,
) -> Vec<Complex32> {
    let disp = Dispersion { dm, constant };
    let mut h = crate::chirp::build(band, chan, disp, reference, 0, len, 1.0);
    for v in &mut h {
        *v = v.conj();
    }
    h
}

/// Smallest `2^a·3^b·5^c ≥ n`: sizes RustFFT handles without Bluestein's detour.
pub fn fast_len(n: usize) -> usize {
    let mut best = n.next_power_of_two();
    let mut p3 = 1usize;
    while p3 < best {
        let mut p35 = p3;
        while p35 < best {
            let mut v = p35;
            while v < n {
                v *= 2;
            }
            best = best.min(v);
            p35 *= 5;
        }
        p3 *= 3;
    }
    best
}

/// Simulate and write to `path` in `format`; returns the band written.
///
/// # Errors
/// Invalid settings (GUPPI needs complex data in more than one channel, real data only fit
/// DADA) and I/O errors.
pub fn write_simulation(
    config: &SimConfig,
    format: SimFormat,
    path: &Path,
) -> Result<Band, SimError> {
    if let SimFormat::Guppi { block_samples } | SimFormat::Guppi16 { block_samples } = format {
        // GUPPI marks complex data by OBSNCHAN > 1.
        if !config.complex || config.nchan < 2 {
            return Err(SimError::Config(
                "GUPPI files hold complex data only with two or more channels (OBSNCHAN = 1 means real)".into(),
            ));
        }
        if block_samples == 0 {
            return Err(SimError::Config("GUPPI block size must be positive".into()));
        }
    }
    let (band, data) = simulate(config)?;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    match format {
        SimFormat::Dada8 | SimFormat::Dada16 | SimFormat::Dada32 => {
            let m = &config.metadata;
            let mut h = DadaHeader::with_defaults();
            h.set("SOURCE", &m.source);
            h.set("TELESCOPE", &m.telescope);
            h.set("INSTRUMENT", "psrsearch");
            if let Some(mjd) = m.start_mjd {
                h.set("UTC_START", dada_utc(mjd));
                h.set("MJD_START", mjd);
            }
            if let Some(p) = m.position {
                h.set("RA", p.ra_text());
                h.set("DEC", p.dec_text());
            }
            h.set("FREQ", config.centre_mhz);
            h.set("BW", config.bandwidth_mhz);
            h.set("TSAMP", 1e6 / band.sample_rate_hz);
            let nbit = match format {
                SimFormat::Dada8 => 8,
                SimFormat::Dada16 => 16,
                _ => 32,
            };
            h.set("NBIT", nbit);
            h.set("NDIM", if config.complex { 2 } else { 1 });
            h.set("NPOL", config.npol);
            h.set("NCHAN", config.nchan);
            write_dada(&mut w, &h, &data)?;
        }
        SimFormat::Vdif8 => {
            let rate = band.sample_rate_hz;
            let parts = if config.complex { 2 } else { 1 };
            // The longest frame up to 8192 samples that divides both the observation and a
            // second, with a payload of whole 8-byte words.
            let spf = (1..=8192usize)
                .rev()
                .find(|&n| {
                    config.nsamples % n == 0
                        && (rate / n as f64).fract() == 0.0
                        && (n * 8 * parts) % 64 == 0
                })
                .ok_or_else(|| {
                    SimError::Config(format!(
                        "no VDIF frame length divides both {} samples and a second at {rate} Hz: \
                         choose another duration",
                        config.nsamples
                    ))
                })?;
            // 8-bit VDIF decodes code c as (c - 127.5) / 35.5: scale so that the codes
            // carry the same integer steps as 8-bit DADA.
            let mut scaled = data.clone();
            scaled.as_mut_slice().iter_mut().for_each(|z| *z /= 35.5);
            let m = &config.metadata;
            let start = m.start_mjd.unwrap_or(51_544.0);
            write_vdif_at(&mut w, &scaled, config.complex, 8, spf, rate, start)?;
            let mut car = format!(
                "# side-car of {}: what VDIF headers do not say\nFREQ {}\nBW {}\nNPOL {}\n\
                 SAMPLE_RATE {}\n",
                path.display(),
                config.centre_mhz,
                config.bandwidth_mhz,
                config.npol,
                rate / 1e6,
            );
            for (key, value) in [("SOURCE", &m.source), ("TELESCOPE", &m.telescope)] {
                if !value.is_empty() {
                    car.push_str(&format!("{key} {value}\n"));
                }
            }
            if let Some(p) = m.position {
                car.push_str(&format!("RA {}\nDEC {}\n", p.ra_text(), p.dec_text()));
            }
            std::fs::write(VdifSidecar::path_of(path), car)?;
        }
        SimFormat::Guppi { block_samples } | SimFormat::Guppi16 { block_samples } => {
            let mut h = GuppiHeader::default();
            h.set_str("BACKEND", "GUPPI");
            let m = &config.metadata;
            h.set_str("TELESCOP", &m.telescope);
            h.set_str("SRC_NAME", &m.source);
            if let Some(p) = m.position {
                h.set_str("RA_STR", &p.ra_text());
                h.set_str("DEC_STR", &p.dec_text());
                h.set_num("RA", p.ra_hours() * 15.0);
                h.set_num("DEC", p.dec_deg());
            }
            h.set_num("OBSFREQ", config.centre_mhz);
            h.set_num("OBSBW", config.bandwidth_mhz);
            h.set_num("CHAN_BW", config.bandwidth_mhz / config.nchan as f64);
            h.set_num("TBIN", 1.0 / band.sample_rate_hz);
            if let Some(mjd) = m.start_mjd {
                // Whole day, whole second and the fraction, as GUPPI splits them.
                let day = mjd.floor();
                let secs = (mjd - day) * 86_400.0;
                h.set_num("STT_IMJD", day);
                h.set_num("STT_SMJD", secs.floor());
                h.set_num("STT_OFFS", secs - secs.floor());
            }
            h.set_num("DIRECTIO", 0.0);
            let sample = match format {
                SimFormat::Guppi16 { .. } => SampleFormat::Int16,
                _ => SampleFormat::Int8,
            };
            write_guppi_as(&mut w, &h, &data, block_samples, sample)?;
        }
    }
    w.flush()?;
    Ok(band)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulsar_parsing() {
        let p: Pulsar = "33.1:26.8:0.05:0.04".parse().unwrap();
        assert!((p.period_s - 0.0331).abs() < 1e-15);
        assert_eq!((p.dm, p.duty_cycle, p.amplitude), (26.8, 0.05, 0.04));
        assert!("1:2:3".parse::<Pulsar>().is_err());
        assert!("1:2:1.5:0.1".parse::<Pulsar>().is_err());
        assert!((p.profile(0.0) - 1.0).abs() < 1e-12);
        assert!((p.profile(1.025) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn fast_lengths() {
        assert_eq!(fast_len(1000), 1000);
        assert_eq!(fast_len(1025), 1080);
        assert_eq!(fast_len(7), 8);
        for n in [1usize, 17, 4097, 100_003] {
            let f = fast_len(n);
            assert!(f >= n && f <= n.next_power_of_two());
        }
    }

    #[test]
    fn noise_statistics_and_determinism() {
        let cfg = SimConfig {
            nchan: 2,
            npol: 1,
            nsamples: 20_000,
            bandwidth_mhz: 2.0,
            rms: 1.0,
            ..Default::default()
        };
        let (_, a) = simulate(&cfg).unwrap();
        let (_, b) = simulate(&cfg).unwrap();
        assert_eq!(a, b);
        let var = a
            .as_slice()
            .iter()
            .map(|z| z.norm_sqr() as f64)
            .sum::<f64>()
            / a.as_slice().len() as f64;
        // Each component has unit RMS, so |z|² averages 2.
        assert!((var - 2.0).abs() < 0.05, "{var}");
    }

    #[test]
    fn guppi_needs_complex_multichannel() {
        let cfg = SimConfig {
            nchan: 1,
            ..Default::default()
        };
        let e = write_simulation(
            &cfg,
            SimFormat::Guppi { block_samples: 16 },
            Path::new("/nonexistent/x"),
        );
        assert!(matches!(e, Err(SimError::Config(_))));
    }
}
