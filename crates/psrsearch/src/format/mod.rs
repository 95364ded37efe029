//! File formats: baseband input (PSRDADA, GUPPI RAW, VDIF) and products (SIGPROC, PRESTO,
//! `.npy`, candidate tables and ACCEL files), all carrying the observation's [`Metadata`].
//!
//! [`BasebandReader`] opens any of the baseband formats, validates its headers and hands out
//! blocks of [`Voltages`] by sample range, so a driver can give different
//! workers different ranges of one file.

pub mod accel;
pub mod candidates;
pub mod dada;
pub mod guppi;
pub mod guppi_stream;
mod layout;
pub mod metadata;
pub mod npy;
pub mod presto;
pub mod sigproc;
pub mod stream;
pub mod vdif;
pub mod vdif_stream;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::band::Band;
use crate::voltages::Voltages;

pub use layout::{Layout, SampleFormat};
pub use metadata::{Metadata, SkyPosition};

/// A header that cannot be used, with the key at fault and what was expected.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum HeaderError {
    /// A required key is absent.
    #[error("{format} header: required key {key} is missing")]
    Missing {
        /// Format name.
        format: &'static str,
        /// The key.
        key: String,
    },
    /// A key has a value that cannot be used.
    #[error("{format} header: {key} = {value:?} is not valid: expected {expected}")]
    Invalid {
        /// Format name.
        format: &'static str,
        /// The key.
        key: String,
        /// The value found.
        value: String,
        /// What would have been accepted.
        expected: String,
    },
    /// Keys that are valid one by one but contradict each other.
    #[error("{format} header: {detail}")]
    Inconsistent {
        /// Format name.
        format: &'static str,
        /// What contradicts what.
        detail: String,
    },
    /// The header block itself is malformed.
    #[error("{format} header: {detail}")]
    Malformed {
        /// Format name.
        format: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// Most channels a header may declare. Real baseband recorders write up to some thousands;
/// a header claiming billions (a damaged or hostile one, from a file or the network) would
/// make the band's own tables larger than any machine.
pub const MAX_NCHAN: usize = 1 << 20;

/// `n` channels as read from `key`, or the error that says it is too many.
pub(crate) fn check_nchan(format: &'static str, key: &str, n: usize) -> Result<usize, HeaderError> {
    if n > MAX_NCHAN {
        return Err(HeaderError::invalid(
            format,
            key,
            n.to_string(),
            format!("at most {MAX_NCHAN} channels"),
        ));
    }
    Ok(n)
}

impl HeaderError {
    pub(crate) fn invalid(
        format: &'static str,
        key: &str,
        value: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        HeaderError::Invalid {
            format,
            key: key.to_string(),
            value: value.into(),
            expected: expected.into(),
        }
    }

    pub(crate) fn missing(format: &'static str, key: &str) -> Self {
        HeaderError::Missing {
            format,
            key: key.to_string(),
        }
    }
}

/// Failure to read a file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The operating system refused.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A header is unusable.
    #[error("bad header in {path} at byte {offset}")]
    Header {
        /// The file.
        path: PathBuf,
        /// Where the header starts.
        offset: u64,
        /// What is wrong.
        #[source]
        source: HeaderError,
    },
    /// The file ends before the data it announces.
    #[error("{path} is truncated: {detail}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// Neither DADA, GUPPI nor VDIF.
    #[error("{path} is not a DADA, GUPPI RAW or VDIF file: {detail}")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// What the start of the file looked like.
        detail: String,
    },
    /// A sample range beyond the end of the data.
    #[error("samples {start}..{end} requested but the file holds {available}")]
    OutOfRange {
        /// First sample asked for.
        start: u64,
        /// One past the last.
        end: u64,
        /// Samples in the file.
        available: u64,
    },
}

impl ReadError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ReadError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Which baseband format a file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BasebandFormat {
    /// PSRDADA: one ASCII header of `HDR_SIZE` bytes per frame.
    Dada,
    /// GUPPI RAW: FITS-card headers before every block.
    Guppi,
    /// VDIF: binary frame headers, one thread per frame; sky frequencies from `FILE.hdr`.
    Vdif,
}

/// One frame of a baseband file: where its payload is and which stream samples it holds.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    /// Byte offset of the payload in the file.
    pub payload_offset: u64,
    /// First stream sample held.
    pub first_sample: u64,
    /// Stream samples taken from this frame (overlap with the next frame excluded).
    pub nsamples: u64,
    /// How samples are arranged in the payload.
    pub layout: Layout,
}

/// A DADA, GUPPI or VDIF file opened for reading blocks of samples.
///
/// ```no_run
/// let mut r = psrsearch::BasebandReader::open("obs.dada")?;
/// let block = r.read(0, 4096)?;
/// println!("{} channels, first sample {:?}", block.nchan(), block.get(0, 0, 0));
/// # Ok::<(), psrsearch::ReadError>(())
/// ```
#[derive(Debug)]
pub struct BasebandReader {
    path: PathBuf,
    file: File,
    format: BasebandFormat,
    band: Band,
    metadata: Metadata,
    frames: Vec<Frame>,
    nsamples: u64,
    header_text: String,
    warnings: Vec<String>,
    scratch: Vec<u8>,
    /// Where a VDIF file's frames are (the other formats use `frames`).
    vdif: Option<vdif::VdifIndex>,
}

impl BasebandReader {
    /// Open a file, detecting the format from its first bytes, and index all its frames.
    ///
    /// # Errors
    /// I/O failures, unrecognised formats, invalid or mutually inconsistent headers, and files
    /// too short to hold one usable frame.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        let path = path.as_ref();
        let mut file = File::open(path).map_err(|e| ReadError::io(path, e))?;
        let mut start = [0u8; 80];
        let n = read_up_to(&mut file, &mut start).map_err(|e| ReadError::io(path, e))?;
        file.seek(SeekFrom::Start(0))
            .map_err(|e| ReadError::io(path, e))?;
        let format = detect(&start[..n]).ok_or_else(|| ReadError::UnknownFormat {
            path: path.to_path_buf(),
            detail: format!(
                "starts with {:?}",
                String::from_utf8_lossy(&start[..n.min(40)])
            ),
        })?;
        let (index, vdif) = match format {
            BasebandFormat::Dada => (dada::index(path, &mut file)?, None),
            BasebandFormat::Guppi => (guppi::index(path, &mut file)?, None),
            BasebandFormat::Vdif => {
                let (index, v) = vdif::index(path, &mut file)?;
                (index, Some(v))
            }
        };
        let nsamples = match &vdif {
            Some(v) => v.nsamples(),
            None => index.frames.iter().map(|f| f.nsamples).sum(),
        };
        Ok(BasebandReader {
            path: path.to_path_buf(),
            file,
            format,
            band: index.band,
            metadata: index.metadata,
            frames: index.frames,
            nsamples,
            header_text: index.header_text,
            warnings: index.warnings,
            scratch: Vec::new(),
            vdif,
        })
    }

    /// Bits of one real component as stored (8 or 16 for integers, 32 for floats; VDIF 1
    /// to 8).
    pub fn bits_per_component(&self) -> u32 {
        match &self.vdif {
            Some(v) => v.bits(),
            None => self.frames.first().map_or(0, |f| f.layout.sample.bits()),
        }
    }

    /// The format detected.
    pub fn format(&self) -> BasebandFormat {
        self.format
    }

    /// Frequency layout.
    pub fn band(&self) -> &Band {
        &self.band
    }

    /// Source, telescope, start time.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Complete samples per channel in the stream (GUPPI block overlaps counted once).
    pub fn nsamples(&self) -> u64 {
        self.nsamples
    }

    /// Number of frames (DADA frames, GUPPI blocks or VDIF frame sets).
    pub fn nframes(&self) -> usize {
        self.vdif.as_ref().map_or(self.frames.len(), |v| v.nsets())
    }

    /// Text of the first header, for display.
    pub fn header_text(&self) -> &str {
        &self.header_text
    }

    /// Things tolerated while indexing (a truncated last frame, for instance).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read `len` samples of every channel and polarisation starting at stream sample `start`.
    ///
    /// # Errors
    /// [`ReadError::OutOfRange`] past the end of the data, or I/O failures.
    pub fn read(&mut self, start: u64, len: usize) -> Result<Voltages, ReadError> {
        let mut out = Voltages::zeros(self.band.nchan(), self.band.npol, len);
        self.read_into(start, &mut out)?;
        Ok(out)
    }

    /// As [`read_into`](Self::read_into), but a block reaching past the end of the data
    /// is filled up with zeros: the last block of a dedispersion (see
    /// [`DedispersionPlan::num_blocks`](crate::DedispersionPlan::num_blocks)).
    ///
    /// # Errors
    /// As [`read_into`](Self::read_into) for a block starting past the end of the data.
    pub fn read_padded_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        let end = start + out.nsamp() as u64;
        if end <= self.nsamples || start >= self.nsamples {
            return self.read_into(start, out);
        }
        let have = (self.nsamples - start) as usize;
        let part = self.read(start, have)?;
        out.fill_window(&part, 0);
        Ok(())
    }

    /// As [`read`](Self::read), into an existing block whose shape gives the length.
    ///
    /// # Errors
    /// As [`read`](Self::read); also if the block's channel or polarisation count differs.
    pub fn read_into(&mut self, start: u64, out: &mut Voltages) -> Result<(), ReadError> {
        let len = out.nsamp() as u64;
        let end = start + len;
        if end > self.nsamples || out.nchan() != self.band.nchan() || out.npol() != self.band.npol {
            return Err(ReadError::OutOfRange {
                start,
                end,
                available: self.nsamples,
            });
        }
        if let Some(v) = &self.vdif {
            return v
                .read_into(&mut self.file, start, out, &mut self.scratch)
                .map_err(|e| ReadError::io(&self.path, e));
        }
        // Frames are sorted by first_sample; find the first one that overlaps.
        let first = self
            .frames
            .partition_point(|f| f.first_sample + f.nsamples <= start);
        for frame in &self.frames[first..] {
            if frame.first_sample >= end {
                break;
            }
            let t0 = start.max(frame.first_sample) - frame.first_sample;
            let t1 = end.min(frame.first_sample + frame.nsamples) - frame.first_sample;
            let out_offset = (frame.first_sample + t0 - start) as usize;
            layout::read_frame_range(
                &mut self.file,
                frame,
                t0 as usize..t1 as usize,
                out,
                out_offset,
                &mut self.scratch,
            )
            .map_err(|e| ReadError::io(&self.path, e))?;
        }
        Ok(())
    }
}

/// What a format indexer found.
pub(crate) struct Index {
    pub band: Band,
    pub metadata: Metadata,
    pub frames: Vec<Frame>,
    pub header_text: String,
    pub warnings: Vec<String>,
}

pub(crate) fn detect(start: &[u8]) -> Option<BasebandFormat> {
    // GUPPI headers are FITS cards: an 8-character key padded with blanks, then "= ".
    if start.len() >= 10
        && start[8] == b'='
        && start[..8]
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"_- ".contains(b))
    {
        return Some(BasebandFormat::Guppi);
    }
    let text = String::from_utf8_lossy(start);
    let first_key = text.split_whitespace().next().unwrap_or("");
    if first_key == "HEADER" || text.contains("DADA") || text.starts_with("HDR_") {
        return Some(BasebandFormat::Dada);
    }
    vdif::looks_like(start).then_some(BasebandFormat::Vdif)
}

/// Fill as much of `buf` as the file allows; returns the count.
pub(crate) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The streams' check of a caller's block: it has the stream's `nchan` channels and `npol`
/// polarisations, and room for samples `at..at + n`.
///
/// # Panics
/// When it does not.
pub(crate) fn check_block(out: &Voltages, nchan: usize, npol: usize, at: usize, n: usize) {
    assert_eq!(out.nchan(), nchan, "channel count");
    assert_eq!(out.npol(), npol, "polarisation count");
    assert!(at + n <= out.nsamp(), "block too short");
}

/// Parse a number the way headers write them (FITS allows a `D` exponent).
pub(crate) fn parse_f64(s: &str) -> Option<f64> {
    let t = s.trim().replace(['D', 'd'], "E");
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parse an integer, also accepting an integral float such as `8.0`.
pub(crate) fn parse_i64(s: &str) -> Option<i64> {
    let t = s.trim();
    t.parse::<i64>().ok().or_else(|| {
        parse_f64(t)
            .filter(|v| v.fract() == 0.0 && v.abs() < 9e15)
            .map(|v| v as i64)
    })
}

/// Helpers of the streams' damaged-input tests.
#[cfg(test)]
pub(crate) mod fuzz {
    use super::ReadError;
    use crate::voltages::Voltages;
    use rand::rngs::StdRng;
    use rand::Rng;

    /// `bytes` with 1 to `edits` bytes changed, at positions `pick` chooses, to a digit
    /// (header numbers) or a random byte, then cut at a random length.
    pub(crate) fn damage(
        bytes: &[u8],
        rng: &mut StdRng,
        edits: usize,
        mut pick: impl FnMut(&mut StdRng) -> usize,
    ) -> Vec<u8> {
        let digits = b"0123456789-.eE ";
        let mut b = bytes.to_vec();
        for _ in 0..rng.gen_range(1..edits) {
            let i = pick(rng).min(b.len() - 1);
            b[i] = if rng.gen_bool(0.5) {
                digits[rng.gen_range(0..digits.len())]
            } else {
                rng.gen()
            };
        }
        b.truncate(rng.gen_range(0..=b.len()));
        b
    }

    /// Reads a stream of `nchan` x `npol` in chunks of `chunk` samples through `read` until
    /// its end or first error; a stream that yields more samples than its `len` bytes
    /// fails the test. Streams of more than 64 series are skipped (damaged counts).
    pub(crate) fn drain(
        (nchan, npol): (usize, usize),
        chunk: usize,
        len: usize,
        mut read: impl FnMut(&mut Voltages) -> Result<usize, ReadError>,
    ) {
        if nchan * npol > 64 {
            return;
        }
        let mut out = Voltages::zeros(nchan, npol, chunk);
        let mut total = 0;
        while let Ok(n) = read(&mut out) {
            if n == 0 {
                break;
            }
            total += n;
            assert!(total <= len, "more samples than bytes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection() {
        assert_eq!(
            detect(b"HEADER       DADA                # Distributed"),
            Some(BasebandFormat::Dada)
        );
        assert_eq!(
            detect(b"SRC_NAME= 'J1810+1744'          "),
            Some(BasebandFormat::Guppi)
        );
        assert_eq!(
            detect(b"BACKEND = 'GUPPI   '          "),
            Some(BasebandFormat::Guppi)
        );
        assert_eq!(detect(b"\x93NUMPY"), None);
        let mut v = [0u8; 32];
        v[8] = 100; // 800-byte frames, version 0
        assert_eq!(detect(&v), Some(BasebandFormat::Vdif));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_f64("3.2D-07"), Some(3.2e-7));
        assert_eq!(parse_f64(" 356.6875 "), Some(356.6875));
        assert_eq!(parse_f64("nan"), None);
        assert_eq!(parse_i64("8"), Some(8));
        assert_eq!(parse_i64("8.0"), Some(8));
        assert_eq!(parse_i64("8.5"), None);
    }
}
