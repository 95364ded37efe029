//! PRESTO time series: `NAME.dat` (32-bit little-endian floats) and `NAME.inf` (text, one
//! `label = value` per line with the `=` in column 41, as PRESTO's `writeinf` lays it out).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::sigproc::canonical_telescope;
use super::{parse_f64, HeaderError, Metadata, SkyPosition};
use crate::band::Band;

const FORMAT: &str = "PRESTO .inf";

/// The fields of a radio `.inf` file.
#[derive(Clone, Debug, PartialEq)]
pub struct InfFile {
    /// Data file name without suffix.
    pub name: String,
    /// Telescope.
    pub telescope: String,
    /// Instrument.
    pub instrument: String,
    /// Object observed.
    pub object: String,
    /// `hh:mm:ss.ssss`.
    pub ra: String,
    /// `dd:mm:ss.ssss`.
    pub dec: String,
    /// Observer.
    pub observer: String,
    /// MJD of the first sample.
    pub epoch_mjd: f64,
    /// Barycentred.
    pub barycentred: bool,
    /// Number of samples.
    pub n: u64,
    /// Sample interval, s.
    pub dt: f64,
    /// Beam diameter, arcsec.
    pub beam_diameter_arcsec: f64,
    /// DM of the series.
    pub dm: f64,
    /// Centre frequency of the lowest channel, MHz.
    pub low_channel_mhz: f64,
    /// Total bandwidth, MHz.
    pub total_bw_mhz: f64,
    /// Channels.
    pub nchan: u32,
    /// Channel bandwidth, MHz.
    pub chan_bw_mhz: f64,
    /// Who analysed it.
    pub analyzer: String,
    /// Free text.
    pub notes: String,
}

const LABELS: [&str; 19] = [
    "Data file name without suffix",
    "Telescope used",
    "Instrument used",
    "Object being observed",
    "J2000 Right Ascension (hh:mm:ss.ssss)",
    "J2000 Declination     (dd:mm:ss.ssss)",
    "Data observed by",
    "Epoch of observation (MJD)",
    "Barycentered?           (1 yes, 0 no)",
    "Number of bins in the time series",
    "Width of each time series bin (sec)",
    "Any breaks in the data? (1 yes, 0 no)",
    "Type of observation (EM band)",
    "Beam diameter (arcsec)",
    "Dispersion measure (cm-3 pc)",
    "Central freq of low channel (MHz)",
    "Total bandwidth (MHz)",
    "Number of channels",
    "Channel bandwidth (MHz)",
];

/// What PRESTO writes for a position it does not know.
const NO_POSITION: (&str, &str) = ("00:00:00.0000", "00:00:00.0000");

impl InfFile {
    /// The `.inf` of a dedispersed series of `n` samples of `dt` s at `dm`, starting at MJD
    /// `epoch_mjd`, from an observation that `metadata` describes over `band` (`None`:
    /// unknown, written as one channel of no width). The telescope is named as PRESTO
    /// names it where it knows it (`Effelsberg`, `Jodrell`), an unknown position is
    /// PRESTO's zeros.
    pub fn for_series(
        metadata: &Metadata,
        band: Option<&Band>,
        n: u64,
        dt: f64,
        dm: f64,
        epoch_mjd: f64,
        notes: String,
    ) -> Self {
        let (ra, dec) = metadata.position.map_or_else(
            || (NO_POSITION.0.to_string(), NO_POSITION.1.to_string()),
            |p| (p.ra_text(), p.dec_text()),
        );
        let telescope = match canonical_telescope(&metadata.telescope) {
            t if t.is_empty() => "Unknown".to_string(),
            t => t,
        };
        InfFile {
            name: String::new(),
            telescope,
            instrument: "psrsearch".into(),
            object: metadata.source.clone(),
            ra,
            dec,
            observer: "unknown".into(),
            epoch_mjd,
            barycentred: false,
            n,
            dt,
            beam_diameter_arcsec: 0.0,
            dm,
            low_channel_mhz: band.map_or(0.0, |b| b.lowest_mhz() + b.channel_bandwidth_mhz() / 2.0),
            total_bw_mhz: band.map_or(0.0, |b| b.highest_mhz() - b.lowest_mhz()),
            nchan: band.map_or(1, |b| b.nchan() as u32),
            chan_bw_mhz: band.map_or(0.0, |b| b.channel_bandwidth_mhz()),
            analyzer: "psrsearch".into(),
            notes,
        }
    }

    /// The observation this `.inf` describes: object, telescope, epoch and, unless it is
    /// PRESTO's zeros, the position.
    ///
    /// # Errors
    /// A position that does not parse, in words.
    pub fn metadata(&self) -> Result<Metadata, String> {
        let position = if (self.ra.as_str(), self.dec.as_str()) == NO_POSITION {
            None
        } else {
            Some(SkyPosition::parse(&self.ra, &self.dec)?)
        };
        Ok(Metadata {
            source: self.object.clone(),
            telescope: self.telescope.clone(),
            start_mjd: Some(self.epoch_mjd),
            position,
        })
    }

    /// The `.inf` text.
    pub fn to_text(&self) -> String {
        let values = [
            self.name.clone(),
            self.telescope.clone(),
            self.instrument.clone(),
            self.object.clone(),
            self.ra.clone(),
            self.dec.clone(),
            self.observer.clone(),
            format!("{:.15}", self.epoch_mjd),
            u8::from(self.barycentred).to_string(),
            self.n.to_string(),
            format!("{}", self.dt),
            "0".to_string(),
            "Radio".to_string(),
            format!("{:.0}", self.beam_diameter_arcsec),
            format!("{}", self.dm),
            format!("{}", self.low_channel_mhz),
            format!("{}", self.total_bw_mhz),
            self.nchan.to_string(),
            format!("{}", self.chan_bw_mhz),
        ];
        let mut s = String::new();
        for (label, value) in LABELS.iter().zip(values) {
            s.push_str(&format!(" {label:<39}=  {value}\n"));
        }
        s.push_str(&format!(
            " {:<39}=  {}\n",
            "Data analyzed by", self.analyzer
        ));
        s.push_str(&format!(" Any additional notes:\n    {}\n\n", self.notes));
        s
    }

    /// Parse `.inf` text written by PRESTO or by [`to_text`](Self::to_text).
    ///
    /// # Errors
    /// Missing lines or values that are not numbers where numbers belong.
    pub fn parse(text: &str) -> Result<Self, HeaderError> {
        let mut lines = text.lines();
        let mut values = Vec::new();
        for label in LABELS.iter().chain(["Data analyzed by"].iter()) {
            let line = lines
                .next()
                .ok_or_else(|| HeaderError::missing(FORMAT, label))?;
            // PRESTO puts '=' in column 41; other writers only promise some '='.
            let value = if line.len() > 41 && line.as_bytes()[40] == b'=' {
                &line[41..]
            } else {
                line.rsplit_once('=').map(|(_, v)| v).ok_or_else(|| {
                    HeaderError::invalid(FORMAT, label, line, "a 'label = value' line")
                })?
            };
            values.push(value.trim().to_string());
        }
        let _ = lines.next();
        let notes = lines
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        let num = |i: usize| -> Result<f64, HeaderError> {
            parse_f64(&values[i])
                .ok_or_else(|| HeaderError::invalid(FORMAT, LABELS[i], &values[i], "a number"))
        };
        let breaks = num(11)?;
        if breaks != 0.0 {
            return Err(HeaderError::invalid(
                FORMAT,
                LABELS[11],
                &values[11],
                "0 (on/off bin pairs are not supported)",
            ));
        }
        Ok(InfFile {
            name: values[0].clone(),
            telescope: values[1].clone(),
            instrument: values[2].clone(),
            object: values[3].clone(),
            ra: values[4].clone(),
            dec: values[5].clone(),
            observer: values[6].clone(),
            epoch_mjd: num(7)?,
            barycentred: num(8)? != 0.0,
            n: num(9)? as u64,
            dt: num(10)?,
            beam_diameter_arcsec: num(13)?,
            dm: num(14)?,
            low_channel_mhz: num(15)?,
            total_bw_mhz: num(16)?,
            nchan: num(17)? as u32,
            chan_bw_mhz: num(18)?,
            analyzer: values[19].clone(),
            notes,
        })
    }
}

/// Write `base.dat` and `base.inf` (any extension on `base` is replaced). Returns the two
/// paths written.
///
/// # Errors
/// I/O errors.
pub fn write_dat_inf(
    base: &Path,
    inf: &InfFile,
    data: &[f32],
) -> std::io::Result<(PathBuf, PathBuf)> {
    let dat = base.with_extension("dat");
    let inf_path = base.with_extension("inf");
    let mut inf = inf.clone();
    inf.n = data.len() as u64;
    inf.name = base
        .with_extension("")
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::File::create(&dat)?.write_all(&buf)?;
    std::fs::write(&inf_path, inf.to_text())?;
    Ok((dat, inf_path))
}

/// Read `base.dat` and `base.inf`.
///
/// # Errors
/// I/O errors as [`HeaderError::Malformed`], `.inf` errors, or a `.dat` whose length
/// disagrees with the `.inf`.
pub fn read_dat_inf(base: &Path) -> Result<(InfFile, Vec<f32>), HeaderError> {
    let io = |e: std::io::Error| HeaderError::Malformed {
        format: FORMAT,
        detail: e.to_string(),
    };
    let inf = InfFile::parse(&std::fs::read_to_string(base.with_extension("inf")).map_err(io)?)?;
    let bytes = std::fs::read(base.with_extension("dat")).map_err(io)?;
    if bytes.len() as u64 != inf.n * 4 {
        return Err(HeaderError::Inconsistent {
            format: FORMAT,
            detail: format!(
                "{} samples in .inf but {} bytes in .dat",
                inf.n,
                bytes.len()
            ),
        });
    }
    let data = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((inf, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_sign_in_column_41() {
        let inf = InfFile {
            name: "x".into(),
            telescope: "Lovell".into(),
            instrument: "psrsearch".into(),
            object: "fake".into(),
            ra: "00:00:00.0000".into(),
            dec: "00:00:00.0000".into(),
            observer: "nobody".into(),
            epoch_mjd: 51500.25,
            barycentred: false,
            n: 10,
            dt: 6.4e-5,
            beam_diameter_arcsec: 720.0,
            dm: 26.5,
            low_channel_mhz: 1400.0,
            total_bw_mhz: 16.0,
            nchan: 1,
            chan_bw_mhz: 16.0,
            analyzer: "psrsearch".into(),
            notes: "coherently dedispersed".into(),
        };
        let text = inf.to_text();
        for line in text.lines().take(20) {
            assert_eq!(line.as_bytes()[40], b'=', "{line:?}");
        }
        assert!(text.contains("Width of each time series bin (sec)    =  0.000064"));
        assert_eq!(InfFile::parse(&text).unwrap(), inf);
        let broken = text.replace("=  26.5", "=  lots");
        let e = InfFile::parse(&broken).unwrap_err();
        assert!(e.to_string().contains("Dispersion measure"), "{e}");
    }
}
