//! What an observation is of, where and when: source, sky position, telescope and start
//! time. Readers take them from the input's headers (DADA `SOURCE`, `RA`, `DEC`,
//! `TELESCOPE`, `MJD_START`; GUPPI `SRC_NAME`, `RA_STR`/`DEC_STR` or `RA`/`DEC` in degrees,
//! `TELESCOP`, `STT_IMJD`…; VDIF the side-car's `SOURCE`, `RA`, `DEC`, `TELESCOPE` and the
//! frames' dates), and every product carries them: SIGPROC and PRESTO headers, candidate
//! tables, ACCEL files and plots.
//!
//! Positions are J2000 and written as PRESTO writes them, `hh:mm:ss.ssss` and
//! `[-]dd:mm:ss.ssss`, or packed as SIGPROC's `hhmmss.s` doubles.

use serde::{Deserialize, Serialize};

/// Descriptive header values carried into products.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Source name.
    pub source: String,
    /// Telescope name.
    pub telescope: String,
    /// Start of the first sample as an MJD (UTC), when the header gives one.
    pub start_mjd: Option<f64>,
    /// Where the telescope pointed, when the header says.
    #[serde(default)]
    pub position: Option<SkyPosition>,
}

impl Metadata {
    /// `(key, value)` pairs for a text header: `source`, `telescope`, `ra`, `dec`,
    /// `start_mjd`, each present only when known, values as [`Metadata::parse_pairs`]
    /// reads them back.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !self.source.is_empty() {
            out.push(("source", self.source.clone()));
        }
        if !self.telescope.is_empty() {
            out.push(("telescope", self.telescope.clone()));
        }
        if let Some(p) = self.position {
            out.push(("ra", p.ra_text()));
            out.push(("dec", p.dec_text()));
        }
        if let Some(m) = self.start_mjd {
            // Rust's shortest form reads back to the same double.
            out.push(("start_mjd", m.to_string()));
        }
        out
    }

    /// Metadata from `(key, value)` pairs as [`Metadata::pairs`] writes them; unknown keys
    /// are ignored, so later additions do not break older readers.
    ///
    /// # Errors
    /// A position or MJD that does not parse, naming the key.
    pub fn parse_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, String> {
        let mut m = Metadata::default();
        let (mut ra, mut dec) = (None, None);
        for (key, value) in pairs {
            match key {
                "source" => m.source = value.to_string(),
                "telescope" => m.telescope = value.to_string(),
                "ra" => ra = Some(value),
                "dec" => dec = Some(value),
                "start_mjd" => {
                    m.start_mjd = Some(
                        value
                            .parse()
                            .map_err(|_| format!("start_mjd {value:?} is not a number"))?,
                    )
                }
                _ => {}
            }
        }
        m.position = match (ra, dec) {
            (Some(ra), Some(dec)) => Some(SkyPosition::parse(ra, dec)?),
            (None, None) => None,
            _ => return Err("ra and dec must come together".into()),
        };
        Ok(m)
    }
}

/// A J2000 sky position.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "PositionText", try_from = "PositionText")]
pub struct SkyPosition {
    ra_hours: f64,
    dec_deg: f64,
}

/// How positions appear in JSON: the text a person reads, 0.1 mas of precision.
#[derive(Serialize, Deserialize)]
struct PositionText {
    ra: String,
    dec: String,
}

impl From<SkyPosition> for PositionText {
    fn from(p: SkyPosition) -> Self {
        PositionText {
            ra: p.ra_text(),
            dec: p.dec_text(),
        }
    }
}

impl TryFrom<PositionText> for SkyPosition {
    type Error = String;
    fn try_from(t: PositionText) -> Result<Self, String> {
        SkyPosition::parse(&t.ra, &t.dec)
    }
}

/// Units of the last digit written: 1e-4 s of RA, 1e-4 arcsec of declination.
const TEXT_UNITS: f64 = 1e4;
/// SIGPROC's packed doubles keep more: 1e-7 s and arcsec.
const PACKED_UNITS: f64 = 1e7;

impl SkyPosition {
    /// A position from right ascension in hours `[0, 24)` and declination in degrees
    /// `[-90, 90]`; `None` outside those.
    pub fn new(ra_hours: f64, dec_deg: f64) -> Option<Self> {
        ((0.0..24.0).contains(&ra_hours) && (-90.0..=90.0).contains(&dec_deg)).then_some(
            SkyPosition {
                ra_hours,
                dec_deg: dec_deg + 0.0,
            },
        )
    }

    /// A position from both coordinates in degrees (GUPPI's `RA`, `DEC` cards); right
    /// ascension is taken modulo 360.
    pub fn from_degrees(ra_deg: f64, dec_deg: f64) -> Option<Self> {
        if !ra_deg.is_finite() {
            return None;
        }
        Self::new(ra_deg.rem_euclid(360.0) / 15.0 % 24.0, dec_deg)
    }

    /// Parse sexagesimal text: right ascension `hh:mm:ss.s` (hours), declination
    /// `[+-]dd:mm:ss.s` (degrees); fields may also be separated by spaces, and trailing
    /// fields left out (`20:16` is 20h16m).
    ///
    /// # Errors
    /// Text that is not such a value, or one out of range, in words.
    pub fn parse(ra: &str, dec: &str) -> Result<Self, String> {
        let ra_h = sexagesimal(ra).ok_or_else(|| {
            format!("right ascension {ra:?} is not hh:mm:ss.s (hours, minutes, seconds)")
        })?;
        let dec_d = sexagesimal(dec).ok_or_else(|| {
            format!("declination {dec:?} is not dd:mm:ss.s (degrees, arcminutes, arcseconds)")
        })?;
        SkyPosition::new(ra_h, dec_d)
            .ok_or_else(|| format!("position {ra} {dec} is off the sky (RA 0-24 h, Dec ±90°)"))
    }

    /// Right ascension, hours.
    pub fn ra_hours(&self) -> f64 {
        self.ra_hours
    }

    /// Declination, degrees.
    pub fn dec_deg(&self) -> f64 {
        self.dec_deg
    }

    /// Right ascension as PRESTO writes it: `hh:mm:ss.ssss`.
    pub fn ra_text(&self) -> String {
        let (h, m, s, frac) = split(self.ra_hours, TEXT_UNITS, 24);
        format!("{h:02}:{m:02}:{s:02}.{frac:04}")
    }

    /// Declination as PRESTO writes it: `dd:mm:ss.ssss`, with `-` in front when south.
    pub fn dec_text(&self) -> String {
        let (d, m, s, frac) = split(self.dec_deg.abs(), TEXT_UNITS, 0);
        let sign = if self.dec_deg < 0.0 && (d, m, s, frac) != (0, 0, 0, 0) {
            "-"
        } else {
            ""
        };
        format!("{sign}{d:02}:{m:02}:{s:02}.{frac:04}")
    }

    /// SIGPROC's `src_raj` and `src_dej`: `hhmmss.s` and `[-]ddmmss.s` packed into doubles.
    pub fn sigproc(&self) -> (f64, f64) {
        let pack = |v: f64, wrap: i64| {
            let (a, m, s, frac) = split(v, PACKED_UNITS, wrap);
            (a * 10_000 + m * 100 + s) as f64 + frac as f64 / PACKED_UNITS
        };
        let dec = pack(self.dec_deg.abs(), 0);
        (
            pack(self.ra_hours, 24),
            if self.dec_deg < 0.0 { -dec } else { dec },
        )
    }

    /// The position SIGPROC's `src_raj` and `src_dej` encode; `None` when they do not
    /// (minutes or seconds of 60 and above, or off the sky).
    pub fn from_sigproc(raj: f64, dej: f64) -> Option<Self> {
        let unpack = |v: f64| -> Option<f64> {
            let a = v.abs();
            let whole = (a / 10_000.0).floor();
            let m = ((a - whole * 10_000.0) / 100.0).floor();
            let s = a - whole * 10_000.0 - m * 100.0;
            (v.is_finite() && m < 60.0 && s < 60.0)
                .then(|| v.signum() * (whole + m / 60.0 + s / 3600.0))
        };
        SkyPosition::new(unpack(raj)?, unpack(dej)?)
    }
}

/// `value` (hours or degrees, ≥ 0) as whole units, minutes, seconds and the fraction of a
/// second in `units` per second, rounded once so that 59.99999 s carries into the minute;
/// a whole part of `wrap` (24 h) becomes 0.
fn split(value: f64, units: f64, wrap: i64) -> (i64, i64, i64, i64) {
    let per_unit = 3600.0 * units;
    let mut total = (value * per_unit).round() as i64;
    let per_unit = per_unit as i64;
    if wrap > 0 && total >= wrap * per_unit {
        total -= wrap * per_unit;
    }
    let per_second = units as i64;
    let frac = total % per_second;
    let seconds = total / per_second;
    (seconds / 3600, seconds / 60 % 60, seconds % 60, frac)
}

/// `[+-]a[:b[:c]]` (or spaces between) as `a + b/60 + c/3600` with the sign of the text.
fn sexagesimal(text: &str) -> Option<f64> {
    let t = text.trim();
    let (negative, rest) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let fields: Vec<&str> = rest
        .split(|c: char| c == ':' || c.is_whitespace())
        .filter(|f| !f.is_empty())
        .collect();
    if fields.is_empty() || fields.len() > 3 || fields.iter().any(|f| f.starts_with(['-', '+'])) {
        return None;
    }
    let mut value = 0.0;
    for (i, f) in fields.iter().enumerate() {
        let v: f64 = f
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
        if i > 0 && v >= 60.0 {
            return None;
        }
        value += v / 60f64.powi(i as i32);
    }
    Some(if negative { -value } else { value })
}

/// The UTC date and time of an MJD, `YYYY-MM-DD hh:mm:ss` (to the second).
pub fn utc_text(mjd: f64) -> String {
    let (y, mo, d, secs) = utc_parts(mjd);
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The UTC date and time of an MJD as DADA's `UTC_START` writes it, `YYYY-MM-DD-hh:mm:ss`.
pub fn dada_utc(mjd: f64) -> String {
    utc_text(mjd).replacen(' ', "-", 1)
}

/// Year, month, day and second of the day of an MJD, the second rounded (a carry into the
/// next day moves the date).
fn utc_parts(mjd: f64) -> (i64, i64, i64, i64) {
    let total = (mjd * 86_400.0).round() as i64;
    let (days, secs) = (total.div_euclid(86_400), total.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days - 40_587 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presto_text_round_trips_and_carries() {
        let p = SkyPosition::parse("20:16:00.20", "28:30:30.0").unwrap();
        assert_eq!(
            (p.ra_text(), p.dec_text()),
            ("20:16:00.2000".into(), "28:30:30.0000".into())
        );
        let south = SkyPosition::parse("05 34 31.97", "-00:30:00").unwrap();
        assert_eq!(south.dec_text(), "-00:30:00.0000");
        assert!((south.dec_deg() + 0.5).abs() < 1e-15);
        let back = SkyPosition::parse(&south.ra_text(), &south.dec_text()).unwrap();
        assert_eq!(back.ra_text(), "05:34:31.9700");
        // 59.99999 s rounds into the next minute, 23:59:59.99999 into 0 h.
        let p = SkyPosition::new(23.0 + 59.0 / 60.0 + 59.999_99 / 3600.0, -(1.0 - 1e-10)).unwrap();
        assert_eq!(
            (p.ra_text(), p.dec_text()),
            ("00:00:00.0000".into(), "-01:00:00.0000".into())
        );
        for (ra, dec) in [
            ("24:00:00", "0"),
            ("12:60:00", "0"),
            ("1", "91"),
            ("x", "0"),
            ("1", "+-3"),
        ] {
            assert!(SkyPosition::parse(ra, dec).is_err(), "{ra} {dec}");
        }
    }

    #[test]
    fn sigproc_packing_matches_presto_unpacking() {
        let p = SkyPosition::parse("18:10:37.28", "-17:44:37.3801").unwrap();
        let (raj, dej) = p.sigproc();
        assert!((raj - 181_037.28).abs() < 1e-7, "{raj}");
        assert!((dej + 174_437.380_1).abs() < 1e-7, "{dej}");
        let back = SkyPosition::from_sigproc(raj, dej).unwrap();
        assert_eq!(
            (back.ra_text(), back.dec_text()),
            (p.ra_text(), p.dec_text())
        );
        assert!(SkyPosition::from_sigproc(186_037.0, 0.0).is_none());
    }

    #[test]
    fn degrees_and_dates() {
        // GUPPI sample_puppi.raw: RA 272.655, DEC 17.7437.
        let p = SkyPosition::from_degrees(272.655, 17.7437).unwrap();
        assert_eq!(
            (p.ra_text(), p.dec_text()),
            ("18:10:37.2000".into(), "17:44:37.3200".into())
        );
        assert_eq!(utc_text(51_544.0), "2000-01-01 00:00:00");
        assert_eq!(dada_utc(56_475.067_824_074_074), "2013-07-02-01:37:40");
        assert_eq!(utc_text(40_587.5), "1970-01-01 12:00:00");
        assert_eq!(utc_text(59_999.999_999_99), "2023-02-25 00:00:00");
    }

    #[test]
    fn pairs_round_trip() {
        let m = Metadata {
            source: "2016+28".into(),
            telescope: "Effelsberg".into(),
            start_mjd: Some(56_475.069_039_351_85),
            position: Some(SkyPosition::parse("20:16:00.2", "28:30:30").unwrap()),
        };
        let pairs = m.pairs();
        let back = Metadata::parse_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
        assert_eq!(back, m);
        assert_eq!(Metadata::parse_pairs([]).unwrap(), Metadata::default());
        assert!(Metadata::parse_pairs([("ra", "1:00")]).is_err());
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains("\"ra\":\"20:16:00.2000\""), "{json}");
        assert_eq!(serde_json::from_str::<Metadata>(&json).unwrap(), m);
    }
}
