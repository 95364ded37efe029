//! A PSRDADA stream read in order, from a pipe or a socket: a header, then `FILE_SIZE` bytes of
//! payload (or payload to the end when the header gives none), then possibly another header
//! and payload, and so on. Nothing can be sought, so the payload must be time-major (every
//! axis the `ORDER` puts before time has length one): whole time samples arrive one after
//! another and can be decoded as they come.

use std::io::Read;
use std::path::PathBuf;

use super::dada::{DadaHeader, DadaParams, DEFAULT_HDR_SIZE};
use super::guppi_stream::GuppiStream;
use super::layout::{Axis, Layout};
use super::vdif_stream::VdifStream;
use super::{read_up_to, BasebandFormat, HeaderError, Metadata, ReadError};
use crate::band::Band;
use crate::voltages::Voltages;
use serde::{Deserialize, Serialize};

/// An ordered DADA stream; see the module documentation.
#[derive(Debug)]
pub struct DadaStream<R> {
    input: R,
    name: PathBuf,
    params: DadaParams,
    band: Band,
    layout: Layout,
    header_text: String,
    metadata: Metadata,
    /// Payload bytes left in the current frame, when the header sets `FILE_SIZE`.
    left_in_frame: Option<u64>,
    /// Bytes consumed so far (headers included), for error offsets.
    offset: u64,
    samples: u64,
    scratch: Vec<u8>,
}

impl<R: Read> DadaStream<R> {
    /// Read and validate the first header. `name` (`<stdin>`, an address) labels errors.
    ///
    /// # Errors
    /// I/O errors, an invalid header, or a payload order that is not time-major.
    pub fn new(mut input: R, name: impl Into<PathBuf>) -> Result<Self, ReadError> {
        let name = name.into();
        let (header, text, size) =
            read_header(&mut input, &name, 0)?.ok_or_else(|| ReadError::Truncated {
                path: name.clone(),
                detail: "the stream ended before a DADA header".into(),
            })?;
        let params = header.params().map_err(|source| ReadError::Header {
            path: name.clone(),
            offset: 0,
            source,
        })?;
        let len = |a: Axis| match a {
            Axis::Chan => params.nchan,
            Axis::Pol => params.npol,
            Axis::Time => 1,
        };
        let time_major = params
            .order
            .iter()
            .take_while(|a| **a != Axis::Time)
            .all(|a| len(*a) == 1);
        if !time_major {
            return Err(ReadError::Header {
                path: name,
                offset: 0,
                source: HeaderError::invalid(
                    "DADA",
                    "ORDER",
                    params
                        .order
                        .iter()
                        .map(|a| match a {
                            Axis::Time => 'T',
                            Axis::Chan => 'F',
                            Axis::Pol => 'P',
                        })
                        .collect::<String>(),
                    "a time-major order (TPF, TFP) for a stream, which cannot be sought",
                ),
            });
        }
        // With one time sample the strides of the inner axes are those of every sample.
        let layout = Layout::dense(
            params.order,
            1,
            params.nchan,
            params.npol,
            params.complex,
            params.sample,
        );
        let metadata = super::dada::metadata_of(&header, &params).0;
        Ok(DadaStream {
            input,
            name,
            metadata,
            band: params.band(),
            left_in_frame: params.file_size,
            params,
            layout,
            header_text: text,
            offset: size as u64,
            samples: 0,
            scratch: Vec::new(),
        })
    }

    /// The band the first header describes.
    pub fn band(&self) -> &Band {
        &self.band
    }

    /// Source, telescope, position and start time the first header gives.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The validated values of the first header.
    pub fn params(&self) -> &DadaParams {
        &self.params
    }

    /// Text of the first header.
    pub fn header_text(&self) -> &str {
        &self.header_text
    }

    /// Time samples delivered so far.
    pub fn samples_read(&self) -> u64 {
        self.samples
    }

    /// Read `n` time samples of every channel and polarisation into `out` from sample
    /// `at` on. Returns how many were read: fewer than `n` only when the stream ended (a
    /// partial sample at the end is dropped).
    ///
    /// # Errors
    /// I/O errors, and a later header that is invalid or describes a different layout.
    ///
    /// # Panics
    /// If `out` does not have the stream's channels and polarisations or `at + n` samples.
    pub fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, ReadError> {
        super::check_block(out, self.params.nchan, self.params.npol, at, n);
        let bpt = self.layout.bytes_per_time();
        let mut done = 0;
        while done < n {
            if self.left_in_frame == Some(0) && !self.next_frame()? {
                break;
            }
            let mut want = (n - done) as u64;
            if let Some(left) = self.left_in_frame {
                want = want.min(left / bpt as u64);
                if want == 0 {
                    // A frame whose payload ends inside a sample: skip the rest, as the file
                    // reader uses only whole samples.
                    self.skip(left)?;
                    self.left_in_frame = Some(0);
                    continue;
                }
            }
            let bytes = want as usize * bpt;
            self.scratch.resize(bytes, 0);
            let got = read_up_to(&mut self.input, &mut self.scratch)
                .map_err(|e| ReadError::io(&self.name, e))?;
            self.offset += got as u64;
            if let Some(left) = self.left_in_frame.as_mut() {
                *left -= got as u64;
            }
            let whole = got / bpt;
            self.decode(out, at + done, whole);
            done += whole;
            if got < bytes {
                self.samples += done as u64;
                return Ok(done);
            }
        }
        self.samples += done as u64;
        Ok(done)
    }

    fn decode(&self, out: &mut Voltages, at: usize, n: usize) {
        let l = &self.layout;
        let (bpt, elem) = (l.bytes_per_time(), l.elem_bytes());
        for c in 0..l.nchan {
            for p in 0..l.npol {
                let base = c * l.stride_c + p * l.stride_p;
                let dst = &mut out.series_mut(c, p)[at..at + n];
                for (t, d) in dst.iter_mut().enumerate() {
                    let i = t * bpt + base;
                    *d = l.decode(&self.scratch[i..i + elem]);
                }
            }
        }
    }

    /// Past the end of a frame's payload: read the next header, if any. `false` at the end
    /// of the stream.
    fn next_frame(&mut self) -> Result<bool, ReadError> {
        let at = self.offset;
        let Some((header, _, size)) = read_header(&mut self.input, &self.name, at)? else {
            return Ok(false);
        };
        self.offset += size as u64;
        let p = header.params().map_err(|source| ReadError::Header {
            path: self.name.clone(),
            offset: at,
            source,
        })?;
        if !p.same_layout(&self.params) {
            return Err(ReadError::Header {
                path: self.name.clone(),
                offset: at,
                source: HeaderError::Inconsistent {
                    format: "DADA",
                    detail: "a later frame's header describes a different layout than the first"
                        .into(),
                },
            });
        }
        self.left_in_frame = p.file_size;
        Ok(true)
    }

    fn skip(&mut self, n: u64) -> Result<(), ReadError> {
        let got = std::io::copy(&mut (&mut self.input).take(n), &mut std::io::sink())
            .map_err(|e| ReadError::io(&self.name, e))?;
        self.offset += got;
        Ok(())
    }
}

/// Which format `psrsearch stream` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamFormat {
    /// Told by the first bytes: a DADA header is `KEY value` text, a GUPPI header FITS
    /// cards, a VDIF frame binary.
    #[default]
    Auto,
    /// PSRDADA.
    Dada,
    /// GUPPI RAW.
    Guppi,
    /// VDIF, with a side-car text for what its headers do not say.
    Vdif,
}

/// The input a stream was opened on, with the bytes looked at to tell its format put back
/// in front.
pub type Peeked<R> = std::io::Chain<std::io::Cursor<Vec<u8>>, R>;

/// An ordered baseband stream of either format.
#[derive(Debug)]
pub enum BasebandStream<R> {
    /// See [`DadaStream`].
    Dada(DadaStream<Peeked<R>>),
    /// See [`GuppiStream`].
    Guppi(GuppiStream<Peeked<R>>),
    /// See [`VdifStream`].
    Vdif(VdifStream<Peeked<R>>),
}

impl<R: Read> BasebandStream<R> {
    /// Open `input` as `format` (told by the first bytes for `Auto`); `vdif_sidecar` is
    /// the side-car text a VDIF stream needs. `name` labels errors.
    ///
    /// # Errors
    /// As [`DadaStream::new`], [`GuppiStream::new`] and [`VdifStream::new`]; a VDIF stream
    /// without a side-car, or bytes of no known format.
    pub fn open(
        mut input: R,
        name: impl Into<PathBuf>,
        format: StreamFormat,
        vdif_sidecar: Option<&str>,
    ) -> Result<Self, ReadError> {
        let name = name.into();
        let mut start = vec![0u8; 64];
        let got = read_up_to(&mut input, &mut start).map_err(|e| ReadError::io(&name, e))?;
        start.truncate(got);
        let format = match format {
            StreamFormat::Auto => match super::detect(&start) {
                Some(BasebandFormat::Dada) => StreamFormat::Dada,
                Some(BasebandFormat::Vdif) => StreamFormat::Vdif,
                Some(BasebandFormat::Guppi) => StreamFormat::Guppi,
                None if got == 0 => {
                    return Err(ReadError::Truncated {
                        path: name,
                        detail: "the stream ended before its first header".into(),
                    })
                }
                None => {
                    return Err(ReadError::UnknownFormat {
                        path: name,
                        detail: format!(
                            "the first bytes are neither a DADA or GUPPI header nor a VDIF \
                             frame: {:?}",
                            String::from_utf8_lossy(&start[..got.min(32)])
                        ),
                    })
                }
            },
            f => f,
        };
        let input = std::io::Cursor::new(start).chain(input);
        match format {
            StreamFormat::Vdif => {
                let car = vdif_sidecar.ok_or_else(|| ReadError::Header {
                    path: name.clone(),
                    offset: 0,
                    source: HeaderError::Missing {
                        format: "VDIF",
                        key: "FREQ (VDIF headers give no sky frequency: pass a side-car of \
                              `FREQ <MHz>` and `SAMPLE_RATE <MHz>` lines, optionally BW, NPOL, \
                              THREADS, with --vdif-header)"
                            .into(),
                    },
                })?;
                Ok(BasebandStream::Vdif(VdifStream::new(input, name, car)?))
            }
            StreamFormat::Guppi => Ok(BasebandStream::Guppi(GuppiStream::new(input, name)?)),
            _ => Ok(BasebandStream::Dada(DadaStream::new(input, name)?)),
        }
    }

    /// The band the stream describes.
    pub fn band(&self) -> &Band {
        match self {
            BasebandStream::Dada(s) => s.band(),
            BasebandStream::Guppi(s) => s.band(),
            BasebandStream::Vdif(s) => s.band(),
        }
    }

    /// Source, telescope, position and start time the first header (or the VDIF side-car
    /// and first frame) gives.
    pub fn metadata(&self) -> &Metadata {
        match self {
            BasebandStream::Dada(s) => s.metadata(),
            BasebandStream::Guppi(s) => s.metadata(),
            BasebandStream::Vdif(s) => s.metadata(),
        }
    }

    /// Read `n` time samples into `out` from sample `at` on; fewer only at the end.
    ///
    /// # Errors
    /// As the format's reader.
    pub fn read_samples(
        &mut self,
        out: &mut Voltages,
        at: usize,
        n: usize,
    ) -> Result<usize, ReadError> {
        match self {
            BasebandStream::Dada(s) => s.read_samples(out, at, n),
            BasebandStream::Guppi(s) => s.read_samples(out, at, n),
            BasebandStream::Vdif(s) => s.read_samples(out, at, n),
        }
    }

    /// Time samples delivered so far.
    pub fn samples_read(&self) -> u64 {
        match self {
            BasebandStream::Dada(s) => s.samples_read(),
            BasebandStream::Guppi(s) => s.samples_read(),
            BasebandStream::Vdif(s) => s.samples_read(),
        }
    }

    /// What had to be repaired, in words (VDIF: frames read as zeros, late, damaged;
    /// GUPPI: a last block cut short); empty when nothing was.
    pub fn repairs(&self) -> Vec<String> {
        let s = match self {
            BasebandStream::Vdif(s) => s,
            BasebandStream::Guppi(s) => {
                return s.dropped_block().map(String::from).into_iter().collect()
            }
            BasebandStream::Dada(_) => return Vec::new(),
        };
        let c = s.counts();
        let mut out = Vec::new();
        for (n, what) in [
            (
                c.zero_frames,
                "frame(s) missing or marked invalid: read as zeros",
            ),
            (
                c.late,
                "frame(s) arrived after their frame set was used: dropped",
            ),
            (
                c.damaged,
                "frame(s) with unusable headers or dates: skipped",
            ),
            (c.other_threads, "frame(s) of threads not read: ignored"),
        ] {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        }
        out
    }
}

/// A header at the stream's position: `None` at a clean end of stream.
fn read_header(
    input: &mut impl Read,
    name: &std::path::Path,
    offset: u64,
) -> Result<Option<(DadaHeader, String, usize)>, ReadError> {
    let mut buf = vec![0u8; DEFAULT_HDR_SIZE];
    let got = read_up_to(input, &mut buf).map_err(|e| ReadError::io(name, e))?;
    if got == 0 {
        return Ok(None);
    }
    let bad = |source| ReadError::Header {
        path: name.to_path_buf(),
        offset,
        source,
    };
    let text = String::from_utf8_lossy(&buf[..got]).into_owned();
    let header = DadaHeader::parse(&text).map_err(bad)?;
    let size = header.hdr_size().map_err(bad)?;
    if size < got {
        // A header shorter than the default: what was read past it is payload. Streams are
        // read in order, so that cannot be put back; refuse rather than lose samples.
        return Err(bad(HeaderError::Malformed {
            format: "DADA",
            detail: format!(
                "HDR_SIZE {size} is below {DEFAULT_HDR_SIZE}, which a stream cannot handle"
            ),
        }));
    }
    let mut full = buf[..got].to_vec();
    if size > got {
        let mut rest = vec![0u8; size - got];
        let more = read_up_to(input, &mut rest).map_err(|e| ReadError::io(name, e))?;
        full.extend_from_slice(&rest[..more]);
    }
    if full.len() < size {
        return Err(ReadError::Truncated {
            path: name.to_path_buf(),
            detail: format!("the stream ended inside a header of {size} bytes at byte {offset}"),
        });
    }
    let text = String::from_utf8_lossy(&full).into_owned();
    let header = DadaHeader::parse(&text).map_err(bad)?;
    let shown = text.split('\0').next().unwrap_or("").to_string();
    Ok(Some((header, shown, size)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BasebandReader;
    use crate::simulate::{write_simulation, SimConfig, SimFormat};

    /// A simulated 8-bit DADA file of 2 channels, 2 polarisations and `nsamples` samples in
    /// a directory of its own (`tag` names it).
    fn simulated(tag: &str, nsamples: usize) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("psr-stream-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s.dada");
        let cfg = SimConfig {
            nchan: 2,
            npol: 2,
            bandwidth_mhz: 2.0,
            nsamples,
            ..SimConfig::default()
        };
        write_simulation(&cfg, SimFormat::Dada8, &file).unwrap();
        (dir, file)
    }

    #[test]
    fn stream_reads_what_the_file_reader_reads() {
        let (dir, file) = simulated("read", 5000);
        let mut reader = BasebandReader::open(&file).unwrap();
        let whole = reader.read(0, 5000).unwrap();
        // Two frames back to back, as a recorder writing successive files would send them.
        let bytes = std::fs::read(&file).unwrap();
        let twice: Vec<u8> = bytes.iter().chain(&bytes).copied().collect();
        let mut s = DadaStream::new(&twice[..], "<test>").unwrap();
        assert_eq!(s.band(), reader.band());
        let mut out = Voltages::zeros(2, 2, 12000);
        let mut at = 0;
        for chunk in [1, 999, 3000, 4000, 4000] {
            at += s.read_samples(&mut out, at, chunk).unwrap();
        }
        assert_eq!(at, 10000);
        for c in 0..2 {
            for p in 0..2 {
                assert_eq!(&out.series(c, p)[..5000], whole.series(c, p));
                assert_eq!(&out.series(c, p)[5000..10000], whole.series(c, p));
            }
        }
        assert_eq!(s.read_samples(&mut out, 0, 10).unwrap(), 0);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn stream_refuses_frequency_major_order() {
        let mut h = DadaHeader::with_defaults();
        for (k, v) in [
            ("NBIT", "8"),
            ("NDIM", "2"),
            ("NPOL", "1"),
            ("NCHAN", "2"),
            ("TSAMP", "1"),
            ("FREQ", "400"),
            ("BW", "2"),
            ("ORDER", "FT"),
        ] {
            h.set(k, v);
        }
        let bytes = h.to_bytes().unwrap();
        let e = DadaStream::new(&bytes[..], "<test>").unwrap_err();
        assert!(e.to_string().contains("bad header"), "{e}");
    }

    /// Damaged bytes in a DADA stream (headers of the first and later frames, payload, the
    /// end) and random bytes give errors or samples, never a panic.
    #[test]
    fn damaged_dada_streams_never_panic() {
        use rand::{Rng, SeedableRng};
        let (dir, file) = simulated("fuzz", 3000);
        let one = std::fs::read(&file).unwrap();
        let bytes: Vec<u8> = one.iter().chain(&one).copied().collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut opened = 0;
        for _ in 0..400 {
            // Header text of either frame most of the time, digits where numbers are.
            let b = crate::format::fuzz::damage(&bytes, &mut rng, 20, |rng| {
                if rng.gen_bool(0.8) {
                    rng.gen_range(0..4096) + if rng.gen_bool(0.5) { 0 } else { one.len() }
                } else {
                    rng.gen_range(0..bytes.len())
                }
            });
            let Ok(mut s) = DadaStream::new(&b[..], "<fuzz>") else {
                continue;
            };
            opened += 1;
            let shape = (s.params().nchan, s.params().npol);
            crate::format::fuzz::drain(shape, 1000, b.len(), |out| s.read_samples(out, 0, 1000));
        }
        // Enough damaged streams still open for their payload paths to be exercised.
        assert!(opened >= 40, "only {opened} of 400 damaged streams opened");
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for _ in 0..300 {
            let junk: Vec<u8> = (0..rng.gen_range(0..6000)).map(|_| rng.gen()).collect();
            let _ = DadaStream::new(&junk[..], "<junk>");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
