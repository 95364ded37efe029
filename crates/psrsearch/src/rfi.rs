//! Interference: known periodic frequencies removed from the spectra (birdies), impulsive
//! samples clipped from the detected series, and candidates that look as bright at DM 0 as
//! at their own DM flagged rather than ranked as pulsars.
//!
//! - A [`Birdie`] zeroes the whitened spectrum within `±width·k` of each harmonic `k·f`
//!   (the width grows with `k` because a drifting fundamental drifts `k` times as far at its
//!   `k`-th harmonic), and never less than one Fourier bin `1/T`. [`Birdie::mains`] gives 50
//!   and 60 Hz with every harmonic.
//! - [`clip`] replaces samples further than `sigma` robust standard deviations (1.4826 ×
//!   the median absolute deviation) from a series' median by that median.
//! - [`zero_dm_flag`] flags a candidate whose folded S/N at the trial DM nearest 0 is at least
//!   [`RfiConfig::zero_dm_fraction`] of its best: terrestrial signals are not dispersed, and
//!   a pulsar whose dispersion smear is small against its pulse width cannot be told from them
//!   by DM, which the flag's text says.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::assemble::DmSeries;

/// A periodic interference frequency and its harmonics, removed from every spectrum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Birdie {
    /// Fundamental frequency, Hz.
    pub freq_hz: f64,
    /// Half-width of the zapped range at the fundamental, Hz (`k` times this at harmonic `k`).
    pub width_hz: f64,
    /// Harmonics zapped, the fundamental included (0: all up to the top of the spectrum).
    pub harmonics: usize,
}

/// Default half-width of a birdie given without one, Hz: mains frequency wanders by
/// hundredths of a hertz over an observation.
pub const DEFAULT_BIRDIE_WIDTH_HZ: f64 = 0.05;

impl Birdie {
    /// 50 Hz and 60 Hz mains with all their harmonics.
    pub fn mains() -> Vec<Birdie> {
        [50.0, 60.0]
            .into_iter()
            .map(|f| Birdie {
                freq_hz: f,
                width_hz: DEFAULT_BIRDIE_WIDTH_HZ,
                harmonics: 0,
            })
            .collect()
    }

    /// Parse `FREQ[:WIDTH[:HARMONICS]]` (Hz, Hz, count; 0 harmonics: all), or `mains`.
    ///
    /// # Errors
    /// A field that is not a number, a frequency or width that is not positive, or too many
    /// fields; the message names the field.
    pub fn parse_list(spec: &str) -> Result<Vec<Birdie>, String> {
        if spec.trim() == "mains" {
            return Ok(Birdie::mains());
        }
        let fields: Vec<&str> = spec.split(':').map(str::trim).collect();
        if fields.len() > 3 {
            return Err(format!(
                "birdie {spec:?}: expected FREQ[:WIDTH[:HARMONICS]] or mains"
            ));
        }
        let number = |i: usize, name: &str| -> Result<f64, String> {
            let v: f64 = fields[i]
                .parse()
                .map_err(|_| format!("birdie {spec:?}: {name} {:?} is not a number", fields[i]))?;
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("birdie {spec:?}: {name} must be above 0, not {v}"));
            }
            Ok(v)
        };
        let freq_hz = number(0, "frequency")?;
        let width_hz = if fields.len() > 1 {
            number(1, "width")?
        } else {
            DEFAULT_BIRDIE_WIDTH_HZ
        };
        let harmonics = match fields.get(2) {
            Some(h) => h.parse().map_err(|_| {
                format!("birdie {spec:?}: harmonics {h:?} is not a whole number (0: all)")
            })?,
            None => 1,
        };
        Ok(vec![Birdie {
            freq_hz,
            width_hz,
            harmonics,
        }])
    }

    /// Read a birdie file: one birdie per line as `FREQ [WIDTH [HARMONICS]]` (spaces or
    /// colons between fields) or `mains`; `#` starts a comment.
    ///
    /// # Errors
    /// An unreadable file, or `PATH:LINE:COLUMN: message` for the first bad line.
    pub fn read_file(path: &Path) -> Result<Vec<Birdie>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading birdie list {}: {e}", path.display()))?;
        let mut out = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("");
            let spec = line.split_whitespace().collect::<Vec<_>>().join(":");
            if spec.is_empty() {
                continue;
            }
            let column = raw.len() - raw.trim_start().len() + 1;
            out.extend(
                Birdie::parse_list(&spec)
                    .map_err(|e| format!("{}:{}:{column}: {e}", path.display(), i + 1))?,
            );
        }
        Ok(out)
    }

    /// Whether `freq_hz` lies in this birdie's zapped range.
    pub fn covers(&self, freq_hz: f64) -> bool {
        let k = (freq_hz / self.freq_hz).round();
        k >= 1.0
            && (self.harmonics == 0 || k <= self.harmonics as f64)
            && (freq_hz - k * self.freq_hz).abs() <= k * self.width_hz
    }
}

/// Zero the bins of a spectrum (bin `r` at `r·df_hz`) that `birdies` cover, and at least one
/// independent Fourier bin (`resolution_hz`, `1/T`) either side of each harmonic, where a
/// signal's power leaks; returns how many.
pub fn zap(power: &mut [f32], df_hz: f64, resolution_hz: f64, birdies: &[Birdie]) -> usize {
    let mut zapped = 0;
    let top = power.len() as f64 * df_hz;
    for b in birdies {
        let last = if b.harmonics == 0 {
            (top / b.freq_hz).ceil() as usize
        } else {
            b.harmonics
        };
        for k in 1..=last {
            let (f, w) = (
                k as f64 * b.freq_hz,
                (k as f64 * b.width_hz).max(resolution_hz),
            );
            // A bin exactly on the edge of the range is in it, whatever the rounding.
            let lo = ((f - w) / df_hz - 1e-9).ceil().max(0.0) as usize;
            let hi = (((f + w) / df_hz + 1e-9).floor() as usize).min(power.len().saturating_sub(1));
            for p in power.iter_mut().take(hi + 1).skip(lo) {
                if *p != 0.0 {
                    *p = 0.0;
                    zapped += 1;
                }
            }
        }
    }
    zapped
}

/// Interference settings of a search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RfiConfig {
    /// Flag a candidate whose S/N at the trial DM nearest 0 is at least this fraction of its
    /// best S/N (0: never).
    pub zero_dm_fraction: f64,
    /// The trial nearest DM 0 counts only within this distance of 0 (no such trial: no flag).
    pub zero_dm_max: f64,
    /// Clip detected samples beyond this many robust standard deviations (0: no clipping).
    pub clip_sigma: f64,
}

impl Default for RfiConfig {
    fn default() -> Self {
        RfiConfig {
            zero_dm_fraction: 0.85,
            zero_dm_max: 1.0,
            clip_sigma: 0.0,
        }
    }
}

/// What clipping removed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MaskSummary {
    /// The clipping threshold, robust sigma (0: no clipping was done).
    pub sigma: f64,
    /// Samples replaced, over all DM series.
    pub clipped: u64,
    /// Samples looked at.
    pub total: u64,
    /// Series with at least one sample clipped.
    pub series_touched: usize,
}

impl MaskSummary {
    /// One line for logs: what was clipped, as a count and a percentage.
    pub fn describe(&self) -> String {
        let pct = if self.total > 0 {
            100.0 * self.clipped as f64 / self.total as f64
        } else {
            0.0
        };
        format!(
            "clipped {} of {} detected samples ({pct:.3}%) beyond {} robust sigma, in {} DM series",
            self.clipped, self.total, self.sigma, self.series_touched
        )
    }
}

/// Median of `x` (which is reordered).
fn median(x: &mut [f32]) -> f32 {
    let mid = x.len() / 2;
    let (_, m, _) = x.select_nth_unstable_by(mid, f32::total_cmp);
    *m
}

/// Median and robust standard deviation (1.4826 × the median absolute deviation) of `x`,
/// which must not be empty.
pub fn robust_stats(x: &[f32]) -> (f32, f64) {
    let mut work = x.to_vec();
    let m = median(&mut work);
    for (w, v) in work.iter_mut().zip(x) {
        *w = (v - m).abs();
    }
    (m, 1.4826 * f64::from(median(&mut work)))
}

/// Replace samples further than `sigma` robust standard deviations from each series' median
/// by the median; `sigma ≤ 0` does nothing.
pub fn clip(series: &mut [DmSeries], sigma: f64) -> MaskSummary {
    let mut summary = MaskSummary::default();
    if sigma <= 0.0 {
        return summary;
    }
    summary.sigma = sigma;
    for s in series {
        summary.total += s.data.len() as u64;
        if s.data.len() < 3 {
            continue;
        }
        let (m, robust) = robust_stats(&s.data);
        if robust <= 0.0 {
            continue;
        }
        let limit = (sigma * robust) as f32;
        let mut n = 0;
        for v in &mut s.data {
            if (*v - m).abs() > limit {
                *v = m;
                n += 1;
            }
        }
        summary.clipped += n;
        summary.series_touched += usize::from(n > 0);
    }
    summary
}

/// The flag for a candidate with S/N `snr_vs_dm` over trial `dms`, or an empty string.
pub fn zero_dm_flag(dms: &[f64], snr_vs_dm: &[f64], config: &RfiConfig) -> String {
    if config.zero_dm_fraction <= 0.0 {
        return String::new();
    }
    let Some((k, dm0)) = dms
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    else {
        return String::new();
    };
    let best = snr_vs_dm.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let at0 = snr_vs_dm.get(k).copied().unwrap_or(f64::NEG_INFINITY);
    if dm0.abs() <= config.zero_dm_max && best > 0.0 && at0 >= config.zero_dm_fraction * best {
        format!("zero-DM({:.0}%)", 100.0 * at0 / best)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn birdie_specs_parse_and_bad_ones_are_named() {
        assert_eq!(Birdie::parse_list("mains").unwrap().len(), 2);
        assert_eq!(
            Birdie::parse_list("50:0.1:8").unwrap(),
            vec![Birdie {
                freq_hz: 50.0,
                width_hz: 0.1,
                harmonics: 8
            }]
        );
        let b = &Birdie::parse_list("33.3").unwrap()[0];
        assert_eq!((b.width_hz, b.harmonics), (DEFAULT_BIRDIE_WIDTH_HZ, 1));
        assert!(Birdie::parse_list("fifty")
            .unwrap_err()
            .contains("frequency \"fifty\""));
        assert!(Birdie::parse_list("50:-1").unwrap_err().contains("width"));
        assert!(Birdie::parse_list("50:1:x")
            .unwrap_err()
            .contains("harmonics"));
        assert!(Birdie::parse_list("1:2:3:4").is_err());
    }

    #[test]
    fn birdie_files_report_line_and_column() {
        let dir = std::env::temp_dir().join(format!("psr-birdies-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("zap.txt");
        std::fs::write(&path, "# mains\nmains\n  100 0.2 3 # a fan\n\n  12.5 x\n").unwrap();
        let e = Birdie::read_file(&path).unwrap_err();
        assert!(
            e.ends_with("zap.txt:5:3: birdie \"12.5:x\": width \"x\" is not a number"),
            "{e}"
        );
        std::fs::write(&path, "# mains\nmains\n  100 0.2 3 # a fan\n").unwrap();
        let list = Birdie::read_file(&path).unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[2].harmonics, 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zapping_covers_harmonics_with_growing_width() {
        let b = Birdie {
            freq_hz: 50.0,
            width_hz: 0.1,
            harmonics: 0,
        };
        assert!(b.covers(50.05) && b.covers(149.75) && !b.covers(149.6) && !b.covers(75.0));
        let mut p = vec![1.0f32; 2000];
        // Bins of 0.1 Hz up to 200 Hz: 50 ± 0.1 is 3 bins, 100 ± 0.2 is 5, 150 ± 0.3 is 7,
        // and 200 − 0.4 up to the last bin (199.9) is 4.
        let n = zap(&mut p, 0.1, 0.0, &[b]);
        assert_eq!(n, 3 + 5 + 7 + 4);
        assert_eq!(p[500], 0.0);
        assert_eq!(p[1497], 0.0);
        assert_eq!(p[1496], 1.0);
        // Only the first harmonic when asked.
        let mut p = vec![1.0f32; 2000];
        let one = Birdie::parse_list("50:0.1:1").unwrap();
        assert_eq!(zap(&mut p, 0.1, 0.0, &one), 3);
        // Never narrower than the spectral resolution: ±0.3 Hz is 7 bins.
        let mut p = vec![1.0f32; 2000];
        assert_eq!(zap(&mut p, 0.1, 0.3, &one), 7);
    }

    #[test]
    fn clipping_replaces_outliers_by_the_median() {
        let mut s = vec![DmSeries {
            dm: 0.0,
            tsamp_s: 1.0,
            start_sample: 0,
            data: (0..1000).map(|i| (i % 7) as f32).collect(),
        }];
        s[0].data[10] = 1000.0;
        s[0].data[20] = -1000.0;
        let untouched = s.clone();
        assert_eq!(clip(&mut s, 0.0).clipped, 0);
        assert_eq!(s, untouched);
        let m = clip(&mut s, 6.0);
        assert_eq!((m.clipped, m.total, m.series_touched), (2, 1000, 1));
        assert_eq!((s[0].data[10], s[0].data[20]), (3.0, 3.0));
        assert!(
            m.describe().starts_with("clipped 2 of 1000"),
            "{}",
            m.describe()
        );
    }

    #[test]
    fn zero_dm_flags_need_a_trial_near_zero() {
        let c = RfiConfig::default();
        let dms = [0.0, 2.0, 4.0];
        assert_eq!(zero_dm_flag(&dms, &[20.0, 20.5, 19.8], &c), "zero-DM(98%)");
        assert_eq!(zero_dm_flag(&dms, &[5.0, 20.0, 12.0], &c), "");
        assert_eq!(zero_dm_flag(&[3.0, 5.0], &[20.0, 20.0], &c), "");
        let off = RfiConfig {
            zero_dm_fraction: 0.0,
            ..c
        };
        assert_eq!(zero_dm_flag(&dms, &[20.0, 20.5, 19.8], &off), "");
    }
}
