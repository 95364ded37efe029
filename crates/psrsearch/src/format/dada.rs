//! PSRDADA files: an ASCII header of `HDR_SIZE` bytes (4096 unless the header says
//! otherwise), `KEY value # comment` per line, padded with NUL bytes, then `FILE_SIZE` bytes
//! of payload; a file may hold several such frames back to back, the last one short.
//!
//! Payload order follows `baseband`: time slowest, then polarisation, then channel, then the
//! real/imaginary pair (`TPF`), unless an `ORDER` key names another permutation of `T`, `F`
//! and `P` (slowest first). `NBIT` 8 and 16 are two's-complement integers (16 little
//! endian), 32 is little-endian floats. `TSAMP` is in microseconds, `FREQ` (band centre) and `BW` in MHz, a negative `BW`
//! meaning lower sideband.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::layout::{Axis, Layout, SampleFormat};
use super::{
    parse_f64, parse_i64, read_up_to, Frame, HeaderError, Index, Metadata, ReadError, SkyPosition,
};
use crate::band::Band;
use crate::voltages::Voltages;

const FORMAT: &str = "DADA";
/// Header size when `HDR_SIZE` is absent.
pub const DEFAULT_HDR_SIZE: usize = 4096;

/// Largest `HDR_SIZE` accepted: headers are a few kilobytes (4096 is the default, 64 KiB
/// is rare), and a reader allocates what the header claims.
pub const MAX_HDR_SIZE: usize = 1 << 20;

/// A DADA header: its keys in file order with the first word of each value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DadaHeader {
    entries: Vec<(String, String)>,
}

/// The values of a DADA header that the reader needs, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct DadaParams {
    /// Bytes of each header block.
    pub hdr_size: usize,
    /// Payload bytes per frame, if given.
    pub file_size: Option<u64>,
    /// Component encoding (`NBIT`).
    pub sample: SampleFormat,
    /// Complex (`NDIM` 2) or real (`NDIM` 1).
    pub complex: bool,
    /// Polarisations.
    pub npol: usize,
    /// Channels.
    pub nchan: usize,
    /// Sample interval in µs.
    pub tsamp_us: f64,
    /// Band centre in MHz.
    pub freq_mhz: f64,
    /// Total bandwidth in MHz, negative for lower sideband.
    pub bw_mhz: f64,
    /// Payload axis order, slowest first.
    pub order: [Axis; 3],
    /// Bytes between the observation start and this file's first sample.
    pub obs_offset: u64,
    /// `MJD_START`, if present.
    pub mjd_start: Option<f64>,
}

impl DadaParams {
    /// Whether a later frame's header keeps this frame's layout and band (all a reader
    /// assumes stays fixed through a file or stream).
    pub fn same_layout(&self, other: &DadaParams) -> bool {
        self.sample == other.sample
            && self.complex == other.complex
            && self.npol == other.npol
            && self.nchan == other.nchan
            && self.tsamp_us == other.tsamp_us
            && self.freq_mhz == other.freq_mhz
            && self.bw_mhz == other.bw_mhz
            && self.order == other.order
    }

    /// Frequency layout.
    pub fn band(&self) -> Band {
        Band::from_total(
            self.freq_mhz,
            self.bw_mhz,
            self.nchan,
            1e6 / self.tsamp_us,
            self.complex,
            self.npol,
        )
    }

    /// Bytes of one complete sample.
    pub fn bytes_per_time(&self) -> usize {
        self.sample.bytes() * if self.complex { 2 } else { 1 } * self.npol * self.nchan
    }

    fn layout(&self, nsamp: usize) -> Layout {
        Layout::dense(
            self.order,
            nsamp,
            self.nchan,
            self.npol,
            self.complex,
            self.sample,
        )
    }

    /// Whether a cut-short payload still holds whole samples: every axis stored outside
    /// time has length one (e.g. `FTP` with a single channel is time-major in effect).
    fn time_major(&self) -> bool {
        self.order
            .iter()
            .take_while(|a| **a != Axis::Time)
            .all(|a| match a {
                Axis::Chan => self.nchan == 1,
                Axis::Pol => self.npol == 1,
                Axis::Time => true,
            })
    }
}

impl DadaHeader {
    /// Parse header text: lines of `KEY value`, `#` starting a comment, stopping at a line
    /// `# end of header` or at the first NUL byte.
    ///
    /// # Errors
    /// A line that is not valid ASCII.
    pub fn parse(text: &str) -> Result<Self, HeaderError> {
        let mut entries = Vec::new();
        for line in text.split('\0').next().unwrap_or("").lines() {
            let trimmed = line.trim();
            if trimmed.starts_with('#') && trimmed.contains("end of header") {
                break;
            }
            if !line.is_ascii() {
                return Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("line {line:?} is not ASCII"),
                });
            }
            let content = line.split('#').next().unwrap_or("");
            let mut words = content.split_whitespace();
            if let Some(key) = words.next() {
                let value = words.next().unwrap_or("");
                entries.push((key.to_string(), value.to_string()));
            }
        }
        Ok(DadaHeader { entries })
    }

    /// The header `baseband` writes by default, to be completed with [`set`](Self::set).
    pub fn with_defaults() -> Self {
        let mut h = DadaHeader::default();
        for (k, v) in [
            ("HEADER", "DADA"),
            ("HDR_VERSION", "1.0"),
            ("HDR_SIZE", "4096"),
            ("DADA_VERSION", "1.0"),
            ("OBS_ID", "unset"),
            ("FILE_NUMBER", "0"),
            ("OBS_OFFSET", "0"),
            ("OBS_OVERLAP", "0"),
            ("SOURCE", "unset"),
            ("TELESCOPE", "unset"),
            ("INSTRUMENT", "unset"),
            ("RESOLUTION", "1"),
            ("DSB", "1"),
        ] {
            h.set(k, v);
        }
        h
    }

    /// The value of `key`, if present (the last one wins, as in a dictionary).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Set `key`, replacing an existing value in place or appending.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        let value = value.to_string();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = value,
            None => self.entries.push((key.to_string(), value)),
        }
    }

    /// Keys and values in order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// `HDR_SIZE` (the default where absent): a positive byte count of at most
    /// [`MAX_HDR_SIZE`], since readers allocate what a header says it spans.
    ///
    /// # Errors
    /// Anything else.
    pub fn hdr_size(&self) -> Result<usize, HeaderError> {
        let Some(v) = self.get("HDR_SIZE") else {
            return Ok(DEFAULT_HDR_SIZE);
        };
        match parse_i64(v) {
            Some(n) if n > 0 && n as u64 <= MAX_HDR_SIZE as u64 => Ok(n as usize),
            _ => Err(HeaderError::invalid(
                FORMAT,
                "HDR_SIZE",
                v,
                format!("a positive byte count of at most {MAX_HDR_SIZE}"),
            )),
        }
    }

    /// Validate and extract what the reader needs.
    ///
    /// # Errors
    /// Missing or invalid keys, naming the key and what would have been accepted, and a
    /// bandwidth that does not match the sampling rate.
    pub fn params(&self) -> Result<DadaParams, HeaderError> {
        if let Some(h) = self.get("HEADER") {
            if h != "DADA" {
                return Err(HeaderError::invalid(FORMAT, "HEADER", h, "DADA"));
            }
        }
        let hdr_size = self.hdr_size()?;
        let int = |key: &str, allowed: &[i64], expected: &str| -> Result<i64, HeaderError> {
            let v = self
                .get(key)
                .ok_or_else(|| HeaderError::missing(FORMAT, key))?;
            match parse_i64(v) {
                Some(n) if allowed.is_empty() || allowed.contains(&n) => Ok(n),
                _ => Err(HeaderError::invalid(FORMAT, key, v, expected)),
            }
        };
        let sample = match int(
            "NBIT",
            &[8, 16, 32],
            "8 or 16 (signed integers) or 32 (floats)",
        )? {
            8 => SampleFormat::Int8,
            16 => SampleFormat::Int16,
            _ => SampleFormat::Float32,
        };
        let complex = int("NDIM", &[1, 2], "1 (real) or 2 (complex)")? == 2;
        let npol = int("NPOL", &[1, 2], "1 or 2")? as usize;
        let nchan = match self.get("NCHAN") {
            None => 1,
            Some(v) => match parse_i64(v) {
                Some(n) if n >= 1 => super::check_nchan(FORMAT, "NCHAN", n as usize)?,
                _ => return Err(HeaderError::invalid(FORMAT, "NCHAN", v, "an integer ≥ 1")),
            },
        };
        let float = |key: &str, ok: fn(f64) -> bool, expected: &str| -> Result<f64, HeaderError> {
            let v = self
                .get(key)
                .ok_or_else(|| HeaderError::missing(FORMAT, key))?;
            parse_f64(v)
                .filter(|x| ok(*x))
                .ok_or_else(|| HeaderError::invalid(FORMAT, key, v, expected))
        };
        let tsamp_us = float("TSAMP", |x| x > 0.0, "a positive sample interval in µs")?;
        let freq_mhz = float("FREQ", |x| x > 0.0, "a positive centre frequency in MHz")?;
        let bw_mhz = float(
            "BW",
            |x| x != 0.0,
            "a non-zero bandwidth in MHz (negative for lower sideband)",
        )?;
        let expected_bw = nchan as f64 / tsamp_us / if complex { 1.0 } else { 2.0 };
        if ((bw_mhz.abs() - expected_bw) / expected_bw).abs() > 1e-6 {
            return Err(HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "|BW| = {} MHz but NCHAN {nchan} of {} samples at TSAMP {tsamp_us} µs span {expected_bw} MHz",
                    bw_mhz.abs(),
                    if complex { "complex" } else { "real" },
                ),
            });
        }
        if freq_mhz - bw_mhz.abs() / 2.0 <= 0.0 {
            return Err(HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "band FREQ {freq_mhz} ± BW/2 {} MHz reaches zero",
                    bw_mhz / 2.0
                ),
            });
        }
        let file_size = match self.get("FILE_SIZE") {
            None => None,
            Some(v) => match parse_i64(v) {
                Some(0) => None,
                Some(n) if n > 0 => Some(n as u64),
                _ => {
                    return Err(HeaderError::invalid(
                        FORMAT,
                        "FILE_SIZE",
                        v,
                        "a non-negative byte count",
                    ))
                }
            },
        };
        let order = match self.get("ORDER") {
            None => [Axis::Time, Axis::Pol, Axis::Chan],
            Some(v) => parse_order(v, nchan, npol)?,
        };
        let obs_offset = match self.get("OBS_OFFSET") {
            None => 0,
            Some(v) => match parse_i64(v) {
                Some(n) if n >= 0 => n as u64,
                _ => {
                    return Err(HeaderError::invalid(
                        FORMAT,
                        "OBS_OFFSET",
                        v,
                        "a non-negative byte count",
                    ))
                }
            },
        };
        Ok(DadaParams {
            hdr_size,
            file_size,
            sample,
            complex,
            npol,
            nchan,
            tsamp_us,
            freq_mhz,
            bw_mhz,
            order,
            obs_offset,
            mjd_start: self.get("MJD_START").and_then(parse_f64),
        })
    }

    /// The header as `HDR_SIZE` bytes: lines, `# end of header`, NUL padding.
    ///
    /// # Errors
    /// If the text does not fit in `HDR_SIZE`.
    pub fn to_bytes(&self) -> Result<Vec<u8>, HeaderError> {
        let size = self.hdr_size()?;
        let mut text = String::new();
        for (k, v) in &self.entries {
            text.push_str(&format!("{k:<12} {v}\n"));
        }
        text.push_str("# end of header\n");
        if text.len() > size {
            return Err(HeaderError::Malformed {
                format: FORMAT,
                detail: format!(
                    "header text of {} bytes does not fit HDR_SIZE {size}",
                    text.len()
                ),
            });
        }
        let mut bytes = text.into_bytes();
        bytes.resize(size, 0);
        Ok(bytes)
    }

    /// Read the header at the current position of `r` (which is left just after it).
    ///
    /// # Errors
    /// I/O errors, or a header whose `HDR_SIZE` runs past the end of the file.
    pub fn read_from(r: &mut (impl Read + Seek)) -> std::io::Result<Result<Self, HeaderError>> {
        let start = r.stream_position()?;
        let mut buf = vec![0u8; DEFAULT_HDR_SIZE];
        let n = read_up_to(r, &mut buf)?;
        buf.truncate(n);
        let mut header = match DadaHeader::parse(&String::from_utf8_lossy(&buf)) {
            Ok(h) => h,
            Err(e) => return Ok(Err(e)),
        };
        let size = match header.hdr_size() {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        if size > buf.len() {
            // Larger header than the default: the first 4096 bytes may have cut a line.
            r.seek(SeekFrom::Start(start))?;
            let mut big = vec![0u8; size];
            let n = read_up_to(r, &mut big)?;
            if n < size {
                return Ok(Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("HDR_SIZE is {size} bytes but only {n} remain in the file"),
                }));
            }
            header = match DadaHeader::parse(&String::from_utf8_lossy(&big)) {
                Ok(h) => h,
                Err(e) => return Ok(Err(e)),
            };
        } else if n < size {
            return Ok(Err(HeaderError::Malformed {
                format: FORMAT,
                detail: format!("HDR_SIZE is {size} bytes but only {n} remain in the file"),
            }));
        }
        r.seek(SeekFrom::Start(start + size as u64))?;
        Ok(Ok(header))
    }
}

fn parse_order(v: &str, nchan: usize, npol: usize) -> Result<[Axis; 3], HeaderError> {
    let bad = || {
        HeaderError::invalid(
            FORMAT,
            "ORDER",
            v,
            "a permutation of T, F and P, slowest first, such as TPF or TFP (F or P may be left \
             out when there is one channel or one polarisation)",
        )
    };
    let mut axes = Vec::new();
    for ch in v.chars() {
        let axis = match ch.to_ascii_uppercase() {
            'T' => Axis::Time,
            'F' => Axis::Chan,
            'P' => Axis::Pol,
            _ => return Err(bad()),
        };
        if axes.contains(&axis) {
            return Err(bad());
        }
        axes.push(axis);
    }
    if !axes.contains(&Axis::Time) {
        return Err(bad());
    }
    // An axis of length one may be omitted; put it innermost where it costs nothing.
    for (axis, len) in [(Axis::Pol, npol), (Axis::Chan, nchan)] {
        if !axes.contains(&axis) {
            if len != 1 {
                return Err(bad());
            }
            axes.push(axis);
        }
    }
    Ok([axes[0], axes[1], axes[2]])
}

pub(crate) fn index(path: &Path, file: &mut File) -> Result<Index, ReadError> {
    let io = |e| ReadError::io(path, e);
    let file_len = file.metadata().map_err(io)?.len();
    let mut frames = Vec::new();
    let mut warnings = Vec::new();
    let mut pos = 0u64;
    let mut first: Option<(DadaHeader, DadaParams)> = None;
    let mut next_sample = 0u64;
    while pos < file_len {
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        let header = DadaHeader::read_from(file)
            .map_err(io)?
            .and_then(|h| h.params().map(|p| (h, p)));
        let (header, params) = match header {
            Ok(hp) => hp,
            Err(source) if first.is_none() => {
                return Err(ReadError::Header {
                    path: path.to_path_buf(),
                    offset: pos,
                    source,
                })
            }
            Err(e) => {
                warnings.push(format!(
                    "stopped at byte {pos}: what follows is not a usable header ({e})"
                ));
                break;
            }
        };
        if let Some((_, p0)) = &first {
            if !p0.same_layout(&params) {
                return Err(ReadError::Header {
                    path: path.to_path_buf(),
                    offset: pos,
                    source: HeaderError::Inconsistent {
                        format: FORMAT,
                        detail: "frame header changes NBIT/NDIM/NPOL/NCHAN/TSAMP/FREQ/BW/ORDER \
                                 from the first frame"
                            .into(),
                    },
                });
            }
        }
        let payload_offset = pos + params.hdr_size as u64;
        let remaining = file_len.saturating_sub(payload_offset);
        let announced = params.file_size.unwrap_or(remaining);
        let bpt = params.bytes_per_time() as u64;
        let full_nsamp = announced / bpt;
        let (nsamp, short) = if remaining >= announced {
            (full_nsamp, false)
        } else if params.time_major() {
            (remaining / bpt, true)
        } else {
            // Channel- or polarisation-major payloads lose whole channels when cut short.
            (0, true)
        };
        if short {
            warnings.push(format!(
                "frame at byte {pos} announces {announced} payload bytes but {remaining} remain; \
                 using {nsamp} complete samples"
            ));
        }
        if nsamp > 0 {
            frames.push(Frame {
                payload_offset,
                first_sample: next_sample,
                nsamples: nsamp,
                layout: params.layout(full_nsamp as usize),
            });
            next_sample += nsamp;
        }
        if first.is_none() {
            first = Some((header, params.clone()));
        }
        pos = payload_offset + announced;
        if short {
            break;
        }
    }
    let Some((header, params)) = first else {
        return Err(ReadError::Truncated {
            path: path.to_path_buf(),
            detail: "empty file".into(),
        });
    };
    if frames.is_empty() {
        return Err(ReadError::Truncated {
            path: path.to_path_buf(),
            detail: "no complete sample after the header".into(),
        });
    }
    let (metadata, warning) = metadata_of(&header, &params);
    warnings.extend(warning);
    let header_text = header
        .entries()
        .iter()
        .map(|(k, v)| format!("{k:<12} {v}"))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Index {
        band: params.band(),
        metadata,
        frames,
        header_text,
        warnings,
    })
}

/// Source, telescope, position and start of the first sample a header describes (`MJD_START`
/// moved on by `OBS_OFFSET`), with a warning when `RA`/`DEC` are there but unreadable
/// (the position is then unknown rather than the file refused).
pub(crate) fn metadata_of(header: &DadaHeader, params: &DadaParams) -> (Metadata, Option<String>) {
    let start_mjd = params.mjd_start.map(|m| {
        let seconds =
            (params.obs_offset / params.bytes_per_time() as u64) as f64 * params.tsamp_us * 1e-6;
        m + seconds / 86400.0
    });
    let set = |key: &str| header.get(key).filter(|v| !v.is_empty() && *v != "unset");
    let (position, warning) = match (set("RA"), set("DEC")) {
        (Some(ra), Some(dec)) => match SkyPosition::parse(ra, dec) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("RA/DEC not used: {e}"))),
        },
        _ => (None, None),
    };
    let metadata = Metadata {
        source: header.get("SOURCE").unwrap_or("unknown").to_string(),
        telescope: header.get("TELESCOPE").unwrap_or("unknown").to_string(),
        start_mjd,
        position,
    };
    (metadata, warning)
}

/// Write one DADA frame: `header` (which must describe `data`) then the samples in `TPF`
/// order, encoded as its `NBIT` says; `FILE_SIZE` is set from the data.
///
/// # Errors
/// I/O errors, an invalid header, or a header whose shape does not match `data`.
pub fn write_dada(w: &mut impl Write, header: &DadaHeader, data: &Voltages) -> std::io::Result<()> {
    let invalid = |e: HeaderError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let mut header = header.clone();
    let params = header.params().map_err(invalid)?;
    if params.nchan != data.nchan() || params.npol != data.npol() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "header says {} channels × {} polarisations, data has {} × {}",
                params.nchan,
                params.npol,
                data.nchan(),
                data.npol()
            ),
        ));
    }
    header.set("ORDER", "TPF");
    header.set(
        "FILE_SIZE",
        params.bytes_per_time() as u64 * data.nsamp() as u64,
    );
    w.write_all(&header.to_bytes().map_err(invalid)?)?;
    let layout = params.layout(data.nsamp());
    let mut buf = Vec::with_capacity(1 << 16);
    for t in 0..data.nsamp() {
        for p in 0..data.npol() {
            for c in 0..data.nchan() {
                layout.encode(data.get(c, p, t), &mut buf);
            }
        }
        if buf.len() >= 1 << 16 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE_HEADER: &str = "HEADER       DADA                # Distributed aquisition\n\
HDR_VERSION  1.0\nHDR_SIZE     4096                # Size of the header in bytes\n\
FILE_SIZE    64000\nSOURCE     2016+28\nFREQ       320.0000         # observation frequency\n\
BW           16              # bandwidth of in MHz (-ve lower sb)\nTSAMP        0.0625\n\
NBIT         8\nNDIM         2\nNPOL         2\nNCHAN        1  \t\t# number of channels here\n\
# end of header\nIGNORED 1\n";

    #[test]
    fn parses_the_effelsberg_style_header() {
        let h = DadaHeader::parse(SAMPLE_HEADER).unwrap();
        assert_eq!(h.get("SOURCE"), Some("2016+28"));
        assert_eq!(h.get("IGNORED"), None);
        let p = h.params().unwrap();
        assert_eq!(p.hdr_size, 4096);
        assert_eq!(p.file_size, Some(64000));
        assert!(p.complex);
        assert_eq!((p.npol, p.nchan), (2, 1));
        assert_eq!(p.bytes_per_time(), 4);
        assert_eq!(p.band().sample_rate_hz, 16e6);
    }

    fn with(key: &str, value: &str) -> HeaderError {
        let mut h = DadaHeader::parse(SAMPLE_HEADER).unwrap();
        h.set(key, value);
        h.params().unwrap_err()
    }

    #[test]
    fn errors_name_the_key_and_expectation() {
        let e = with("NBIT", "4");
        assert!(matches!(&e, HeaderError::Invalid { key, .. } if key == "NBIT"));
        assert!(
            e.to_string().contains("8 or 16 (signed integers) or 32"),
            "{e}"
        );
        assert!(matches!(with("NDIM", "3"), HeaderError::Invalid { key, .. } if key == "NDIM"));
        assert!(matches!(with("NPOL", "4"), HeaderError::Invalid { key, .. } if key == "NPOL"));
        assert!(matches!(with("NCHAN", "0"), HeaderError::Invalid { key, .. } if key == "NCHAN"));
        assert!(matches!(with("TSAMP", "-1"), HeaderError::Invalid { key, .. } if key == "TSAMP"));
        assert!(matches!(with("BW", "0"), HeaderError::Invalid { key, .. } if key == "BW"));
        assert!(
            matches!(with("HEADER", "PSRFITS"), HeaderError::Invalid { key, .. } if key == "HEADER")
        );
        assert!(matches!(with("ORDER", "TXF"), HeaderError::Invalid { key, .. } if key == "ORDER"));
        let e = with("BW", "8");
        assert!(matches!(e, HeaderError::Inconsistent { .. }), "{e}");
        let mut h = DadaHeader::parse(SAMPLE_HEADER).unwrap();
        h.entries.retain(|(k, _)| k != "TSAMP");
        let e = h.params().unwrap_err();
        assert_eq!(e, HeaderError::missing(FORMAT, "TSAMP"));
        assert!(e.to_string().contains("TSAMP"));
    }

    #[test]
    fn order_key() {
        assert_eq!(
            parse_order("FTP", 1, 2).unwrap(),
            [Axis::Chan, Axis::Time, Axis::Pol]
        );
        assert_eq!(
            parse_order("TF", 4, 1).unwrap(),
            [Axis::Time, Axis::Chan, Axis::Pol]
        );
        assert!(parse_order("TF", 4, 2).is_err());
        assert!(parse_order("FP", 4, 2).is_err());
    }

    #[test]
    fn header_bytes_roundtrip() {
        let mut h = DadaHeader::with_defaults();
        for (k, v) in [
            ("NBIT", "32"),
            ("NDIM", "2"),
            ("NPOL", "1"),
            ("NCHAN", "2"),
            ("TSAMP", "1"),
            ("FREQ", "1400"),
            ("BW", "-2"),
        ] {
            h.set(k, v);
        }
        let bytes = h.to_bytes().unwrap();
        assert_eq!(bytes.len(), 4096);
        let mut cur = std::io::Cursor::new(bytes);
        let back = DadaHeader::read_from(&mut cur).unwrap().unwrap();
        assert_eq!(back, h);
        assert_eq!(cur.position(), 4096);
        let p = back.params().unwrap();
        assert_eq!(p.band().centre_mhz, vec![1400.5, 1399.5]);
        h.set("HDR_SIZE", "64");
        assert!(h.to_bytes().is_err());
    }
}
