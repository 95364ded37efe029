//! SIGPROC `.tim` (dedispersed time series) and `.fil` (filterbank) files.
//!
//! The header is a sequence of keywords between `HEADER_START` and `HEADER_END`, each a
//! little-endian `i32` length and the keyword's bytes, followed by its value: `i32` for
//! counts and flags, `f64` for times and frequencies, length-prefixed bytes for strings.
//! Data follow as 32-bit floats, time-major with channels fastest (channel `0` at `fch1`,
//! `foff` apart).
//!
//! `telescope_id` is SIGPROC's number for the telescope ([`telescope_id`]), and the source's
//! position is `src_raj`/`src_dej`, packed `hhmmss.s` doubles ([`SkyPosition::sigproc`]).

use std::io::{Read, Write};

use super::{HeaderError, SkyPosition};

const FORMAT: &str = "SIGPROC";

/// SIGPROC's telescope ids (`aliases.c`, `telescope_name`) where SIGPROC and PRESTO
/// (`sigproc_fb.c`, `get_telescope_name`) agree, or SIGPROC alone names one: 9 and 10 are
/// left out, SIGPROC calling them 140ft and SRT, PRESTO ATA and UTR-2. The name is the one
/// both write; the aliases (lower case) are other spellings headers use.
const TELESCOPES: [(i32, &str, &[&str]); 13] = [
    (
        0,
        "Fake",
        &["fake", "psrsearch-simulator", "simulator", "simulated"],
    ),
    (1, "Arecibo", &["arecibo", "ao"]),
    (2, "Ooty", &["ooty", "ort"]),
    (3, "Nancay", &["nancay", "nrt"]),
    (4, "Parkes", &["parkes", "pks", "murriyang"]),
    (
        5,
        "Jodrell",
        &["jodrell", "jodrell bank", "jb", "jbo", "lovell"],
    ),
    (6, "GBT", &["gbt", "green bank", "greenbank", "gb"]),
    (7, "GMRT", &["gmrt"]),
    (8, "Effelsberg", &["effelsberg", "eff", "ef"]),
    (11, "LOFAR", &["lofar"]),
    (64, "MeerKAT", &["meerkat", "mk", "mkt"]),
    (65, "KAT-7", &["kat-7", "kat7"]),
    (82, "eMerlin", &["emerlin", "e-merlin"]),
];

/// SIGPROC's `telescope_id` for a telescope name (any case, some other spellings: `Lovell`
/// is Jodrell Bank's); 0, SIGPROC's "Fake", for a name it does not know.
pub fn telescope_id(name: &str) -> i32 {
    known_telescope(name).map_or(0, |t| t.0)
}

/// The name SIGPROC and PRESTO give `telescope_id`; `None` for an id they do not share.
pub fn telescope_name(id: i32) -> Option<&'static str> {
    TELESCOPES.iter().find(|t| t.0 == id).map(|t| t.1)
}

/// The name PRESTO and SIGPROC use for a telescope they know under another spelling
/// (`EFFELSBERG`, `Lovell`), else `name` as given: PRESTO finds observatory codes by name.
pub fn canonical_telescope(name: &str) -> String {
    known_telescope(name).map_or_else(|| name.trim().to_string(), |t| t.1.to_string())
}

fn known_telescope(name: &str) -> Option<&'static (i32, &'static str, &'static [&'static str])> {
    let name = name.trim().to_ascii_lowercase();
    TELESCOPES.iter().find(|(_, canonical, aliases)| {
        canonical.eq_ignore_ascii_case(&name) || aliases.contains(&name.as_str())
    })
}

/// The SIGPROC keywords this crate writes and reads.
#[derive(Clone, Debug, PartialEq)]
pub struct SigprocHeader {
    /// `source_name`.
    pub source_name: String,
    /// `telescope_id`: SIGPROC's number for the telescope (0 = fake, [`telescope_id`]).
    pub telescope_id: i32,
    /// `machine_id` (0 = fake).
    pub machine_id: i32,
    /// 1 = filterbank, 2 = time series.
    pub data_type: i32,
    /// MJD of the first sample.
    pub tstart_mjd: f64,
    /// Sample interval, s.
    pub tsamp_s: f64,
    /// Bits per sample (32: float; 8: unsigned byte on reading).
    pub nbits: i32,
    /// Channels.
    pub nchans: i32,
    /// Polarisation products (1 = summed).
    pub nifs: i32,
    /// Centre frequency of the first channel, MHz (the reference frequency for a `.tim`).
    pub fch1_mhz: f64,
    /// Channel spacing, MHz (negative when channels descend).
    pub foff_mhz: f64,
    /// DM the data were dedispersed at, if any.
    pub refdm: Option<f64>,
    /// 1 when barycentred.
    pub barycentric: i32,
    /// `src_raj` and `src_dej`, when the position is known (written only then).
    pub position: Option<SkyPosition>,
}

impl SigprocHeader {
    /// A time-series header.
    pub fn time_series(source: &str, tstart_mjd: f64, tsamp_s: f64, ref_mhz: f64, dm: f64) -> Self {
        SigprocHeader {
            source_name: source.to_string(),
            telescope_id: 0,
            machine_id: 0,
            data_type: 2,
            tstart_mjd,
            tsamp_s,
            nbits: 32,
            nchans: 1,
            nifs: 1,
            fch1_mhz: ref_mhz,
            foff_mhz: 0.0,
            refdm: Some(dm),
            barycentric: 0,
            position: None,
        }
    }

    /// Encode the header.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_str(&mut out, "HEADER_START");
        put_str(&mut out, "source_name");
        put_str(&mut out, &self.source_name);
        for (k, v) in [
            ("telescope_id", self.telescope_id),
            ("machine_id", self.machine_id),
            ("data_type", self.data_type),
            ("barycentric", self.barycentric),
            ("nbits", self.nbits),
            ("nchans", self.nchans),
            ("nifs", self.nifs),
        ] {
            put_str(&mut out, k);
            out.extend_from_slice(&v.to_le_bytes());
        }
        let mut doubles = vec![
            ("tstart", self.tstart_mjd),
            ("tsamp", self.tsamp_s),
            ("fch1", self.fch1_mhz),
            ("foff", self.foff_mhz),
        ];
        if let Some(p) = self.position {
            let (raj, dej) = p.sigproc();
            doubles.push(("src_raj", raj));
            doubles.push(("src_dej", dej));
        }
        if let Some(dm) = self.refdm {
            doubles.push(("refdm", dm));
        }
        for (k, v) in doubles {
            put_str(&mut out, k);
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut out, "HEADER_END");
        out
    }

    /// Decode a header from the start of `r`, leaving `r` at the first data byte.
    ///
    /// # Errors
    /// I/O errors (as [`HeaderError::Malformed`]), unknown keywords, or no `HEADER_START`.
    pub fn read_from(r: &mut impl Read) -> Result<Self, HeaderError> {
        let malformed = |detail: String| HeaderError::Malformed {
            format: FORMAT,
            detail,
        };
        if get_str(r)? != "HEADER_START" {
            return Err(malformed("file does not start with HEADER_START".into()));
        }
        let mut h = SigprocHeader::time_series("", 0.0, 0.0, 0.0, 0.0);
        h.refdm = None;
        let (mut raj, mut dej) = (None, None);
        loop {
            let key = get_str(r)?;
            match key.as_str() {
                "HEADER_END" => break,
                "source_name" | "rawdatafile" => {
                    let v = get_str(r)?;
                    if key == "source_name" {
                        h.source_name = v;
                    }
                }
                "telescope_id" | "machine_id" | "data_type" | "barycentric" | "pulsarcentric"
                | "nbits" | "nchans" | "nifs" | "nbeams" | "ibeam" | "nsamples" => {
                    let mut b = [0u8; 4];
                    r.read_exact(&mut b).map_err(|e| malformed(e.to_string()))?;
                    let v = i32::from_le_bytes(b);
                    match key.as_str() {
                        "telescope_id" => h.telescope_id = v,
                        "machine_id" => h.machine_id = v,
                        "data_type" => h.data_type = v,
                        "barycentric" => h.barycentric = v,
                        "nbits" => h.nbits = v,
                        "nchans" => h.nchans = v,
                        "nifs" => h.nifs = v,
                        _ => {}
                    }
                }
                "tstart" | "tsamp" | "fch1" | "foff" | "refdm" | "az_start" | "za_start"
                | "src_raj" | "src_dej" | "period" => {
                    let mut b = [0u8; 8];
                    r.read_exact(&mut b).map_err(|e| malformed(e.to_string()))?;
                    let v = f64::from_le_bytes(b);
                    match key.as_str() {
                        "tstart" => h.tstart_mjd = v,
                        "tsamp" => h.tsamp_s = v,
                        "fch1" => h.fch1_mhz = v,
                        "foff" => h.foff_mhz = v,
                        "refdm" => h.refdm = Some(v),
                        "src_raj" => raj = Some(v),
                        "src_dej" => dej = Some(v),
                        _ => {}
                    }
                }
                other => {
                    return Err(HeaderError::invalid(
                        FORMAT,
                        other,
                        "",
                        "a known SIGPROC keyword (its value size is unknown otherwise)",
                    ))
                }
            }
        }
        if let (Some(raj), Some(dej)) = (raj, dej) {
            h.position = Some(SkyPosition::from_sigproc(raj, dej).ok_or_else(|| {
                HeaderError::invalid(
                    FORMAT,
                    "src_raj/src_dej",
                    format!("{raj} {dej}"),
                    "hhmmss.s and ddmmss.s with minutes and seconds below 60",
                )
            })?);
        }
        if h.nbits != 32 && h.nbits != 8 {
            return Err(HeaderError::invalid(
                FORMAT,
                "nbits",
                h.nbits.to_string(),
                "8 or 32",
            ));
        }
        if h.nchans < 1 || h.nifs < 1 {
            return Err(HeaderError::invalid(
                FORMAT,
                "nchans",
                h.nchans.to_string(),
                "a positive channel count (and nifs ≥ 1)",
            ));
        }
        Ok(h)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn get_str(r: &mut impl Read) -> Result<String, HeaderError> {
    let malformed = |detail: String| HeaderError::Malformed {
        format: FORMAT,
        detail,
    };
    let mut b = [0u8; 4];
    r.read_exact(&mut b).map_err(|e| malformed(e.to_string()))?;
    let n = i32::from_le_bytes(b);
    if !(1..=4096).contains(&n) {
        return Err(malformed(format!("keyword length {n} out of range")));
    }
    let mut s = vec![0u8; n as usize];
    r.read_exact(&mut s).map_err(|e| malformed(e.to_string()))?;
    String::from_utf8(s).map_err(|_| malformed("keyword is not UTF-8".into()))
}

/// Write a `.tim`: header then `data` as 32-bit floats.
///
/// # Errors
/// I/O errors.
pub fn write_tim(w: &mut impl Write, header: &SigprocHeader, data: &[f32]) -> std::io::Result<()> {
    let mut h = header.clone();
    h.data_type = 2;
    h.nchans = 1;
    h.nifs = 1;
    h.nbits = 32;
    write_with(w, &h, data)
}

/// Write a `.fil`: header then `data` (`nsamp × nchans`, channels fastest) as floats.
///
/// # Errors
/// I/O errors, or a data length that is not a multiple of `nchans`.
pub fn write_fil(w: &mut impl Write, header: &SigprocHeader, data: &[f32]) -> std::io::Result<()> {
    let mut h = header.clone();
    h.data_type = 1;
    h.nbits = 32;
    h.nifs = 1;
    if h.nchans < 1 || data.len() % h.nchans as usize != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} values are not whole spectra of {} channels",
                data.len(),
                h.nchans
            ),
        ));
    }
    write_with(w, &h, data)
}

fn write_with(w: &mut impl Write, h: &SigprocHeader, data: &[f32]) -> std::io::Result<()> {
    w.write_all(&h.to_bytes())?;
    let mut buf = Vec::with_capacity(data.len() * 4);
    for v in data {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&buf)
}

/// Read a `.tim` or `.fil` whole: header and data as floats (`nsamp × nchans`).
///
/// # Errors
/// Header errors, or data not a whole number of spectra.
pub fn read_sigproc(r: &mut impl Read) -> Result<(SigprocHeader, Vec<f32>), HeaderError> {
    let h = SigprocHeader::read_from(r)?;
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes)
        .map_err(|e| HeaderError::Malformed {
            format: FORMAT,
            detail: e.to_string(),
        })?;
    let data: Vec<f32> = if h.nbits == 32 {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        bytes.iter().map(|b| *b as f32).collect()
    };
    let per = (h.nchans * h.nifs) as usize;
    if data.len() % per != 0 || (h.nbits == 32 && bytes.len() % 4 != 0) {
        return Err(HeaderError::Malformed {
            format: FORMAT,
            detail: format!(
                "{} data bytes are not whole spectra of {per} values",
                bytes.len()
            ),
        });
    }
    Ok((h, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_starts_as_sigproc_expects() {
        let h = SigprocHeader::time_series("J0000+0000", 60000.5, 6.4e-5, 1400.0, 12.5);
        let b = h.to_bytes();
        assert_eq!(&b[..4], &12i32.to_le_bytes());
        assert_eq!(&b[4..16], b"HEADER_START");
        assert!(b.ends_with(b"HEADER_END"));
    }

    #[test]
    fn telescope_ids_are_sigprocs() {
        for (name, id) in [
            ("Effelsberg", 8),
            ("EFFELSBERG", 8),
            ("Arecibo", 1),
            ("Parkes", 4),
            ("GBT", 6),
            ("GMRT", 7),
            ("LOFAR", 11),
            ("Lovell", 5),
            ("Fake", 0),
            ("somewhere", 0),
        ] {
            assert_eq!(telescope_id(name), id, "{name}");
        }
        assert_eq!(telescope_name(8), Some("Effelsberg"));
        assert_eq!(telescope_name(9), None);
        assert_eq!(canonical_telescope("effelsberg"), "Effelsberg");
        assert_eq!(canonical_telescope(" Kitt Peak "), "Kitt Peak");
        assert_eq!(canonical_telescope("psrsearch-simulator"), "Fake");
    }

    #[test]
    fn unknown_keyword_is_an_error() {
        let mut b = Vec::new();
        put_str(&mut b, "HEADER_START");
        put_str(&mut b, "mystery");
        let e = SigprocHeader::read_from(&mut b.as_slice()).unwrap_err();
        assert!(e.to_string().contains("mystery"), "{e}");
        let e = SigprocHeader::read_from(&mut b"\x05\0\0\0HELLO".as_slice()).unwrap_err();
        assert!(e.to_string().contains("HEADER_START"), "{e}");
    }
}
