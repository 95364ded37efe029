//! VDIF (VLBI Data Interchange Format, release 1.1.1) baseband files.
//!
//! A VDIF file is a sequence of frames, each a 32-byte header (16 in legacy mode) and a
//! payload of little-endian 32-bit words holding offset-binary samples of 1, 2, 4 or 8 bits,
//! the first sample in the lowest bits. A frame belongs to one *thread*; the frames of all
//! threads with the same second and frame number form a frame set, and successive frame sets
//! make the stream. Samples decode to the levels `baseband` (and mark5access) use, so values
//! match theirs exactly.
//!
//! The headers say nothing of sky frequency, and only some extended-data versions (1 and 3)
//! give the sample rate. A text file beside the data, `FILE.hdr`, supplies the rest:
//!
//! ```text
//! FREQ         1400.0     # centre of the whole band, MHz (required)
//! BW           -64        # total bandwidth, MHz; negative = lower sideband (optional)
//! NPOL         2          # thread k is polarisation k % NPOL of channel k / NPOL (default 1)
//! SAMPLE_RATE  32         # MHz per channel, where the headers do not give it (optional)
//! THREADS      0,1,2,3    # which threads, in channel order (default: all, ascending)
//! SOURCE       B0329+54   # optional
//! TELESCOPE    Effelsberg # optional
//! RA           03:32:59.4 # J2000, hh:mm:ss.s (optional, with DEC)
//! DEC          +54:34:43  # J2000, dd:mm:ss.s (optional, with RA)
//! ```

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use rustfft::num_complex::Complex32;

use super::{
    parse_f64, parse_i64, read_up_to, HeaderError, Index, Metadata, ReadError, SkyPosition,
};
use crate::band::Band;
use crate::voltages::Voltages;

const FORMAT: &str = "VDIF";

/// The high level of 2-bit data when the low one is 1 (`baseband`'s `OPTIMAL_2BIT_HIGH`).
const TWO_BIT_HIGH: f32 = 3.316505;
/// 4-bit data are divided by this to look like 2-bit data (`baseband`'s `FOUR_BIT_1_SIGMA`).
const FOUR_BIT_SIGMA: f32 = 2.95;
/// 8-bit data likewise (`baseband`'s `EIGHT_BIT_1_SIGMA`, after mark5access).
const EIGHT_BIT_SIGMA: f32 = 35.5;

/// One frame header.
#[derive(Clone, Debug, PartialEq)]
pub struct VdifHeader {
    /// The data of this frame are marked invalid.
    pub invalid: bool,
    /// Legacy mode: a 16-byte header without extended user data.
    pub legacy: bool,
    /// Seconds since the reference epoch.
    pub seconds: u32,
    /// Reference epoch in half years since 2000-01-01.
    pub ref_epoch: u8,
    /// Frame number within the second.
    pub frame_nr: u32,
    /// VDIF version.
    pub version: u8,
    /// Channels per frame (a power of two).
    pub nchan: usize,
    /// Frame length in bytes, header included.
    pub frame_bytes: usize,
    /// Quadrature samples.
    pub complex: bool,
    /// Bits per component.
    pub bits: u32,
    /// Thread id.
    pub thread: u16,
    /// Station id.
    pub station: u16,
    /// Extended data version (`None` in legacy mode).
    pub edv: Option<u8>,
    /// Complete samples per second per channel, where the extended data give it.
    pub sample_rate_hz: Option<f64>,
}

impl VdifHeader {
    /// Decode and check a header from the first 16 (legacy) or 32 bytes of a frame.
    ///
    /// # Errors
    /// Too few bytes, a frame length shorter than its header or not a multiple of 8 bytes,
    /// or a sample size other than 1, 2, 4 or 8 bits.
    pub fn parse(b: &[u8]) -> Result<Self, HeaderError> {
        let malformed = |detail: String| HeaderError::Malformed {
            format: FORMAT,
            detail,
        };
        if b.len() < 16 {
            return Err(malformed(format!(
                "{} bytes, a header needs 16 or 32",
                b.len()
            )));
        }
        let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        let legacy = w(0) >> 30 & 1 == 1;
        if !legacy && b.len() < 32 {
            return Err(malformed(format!("{} bytes, a header needs 32", b.len())));
        }
        let edv = (!legacy).then(|| (w(4) >> 24) as u8);
        let mut h = VdifHeader {
            invalid: w(0) >> 31 == 1,
            legacy,
            seconds: w(0) & 0x3fff_ffff,
            ref_epoch: (w(1) >> 24 & 0x3f) as u8,
            frame_nr: w(1) & 0x00ff_ffff,
            version: (w(2) >> 29) as u8,
            nchan: 1 << (w(2) >> 24 & 0x1f),
            frame_bytes: (w(2) & 0x00ff_ffff) as usize * 8,
            complex: w(3) >> 31 == 1,
            bits: (w(3) >> 26 & 0x1f) + 1,
            thread: (w(3) >> 16 & 0x3ff) as u16,
            station: (w(3) & 0xffff) as u16,
            edv,
            sample_rate_hz: None,
        };
        // Extended data versions 1 and 3: word 4 holds the rate of complex samples per
        // channel (half that of real ones) in kHz or, with bit 23 set, in MHz.
        if matches!(edv, Some(1) | Some(3)) && w(4) & 0x007f_ffff != 0 {
            let unit = if w(4) >> 23 & 1 == 1 { 1e6 } else { 1e3 };
            let rate = f64::from(w(4) & 0x007f_ffff) * unit;
            h.sample_rate_hz = Some(if h.complex { rate } else { 2.0 * rate });
        }
        if h.frame_bytes <= h.header_bytes() {
            return Err(HeaderError::invalid(
                FORMAT,
                "frame length",
                h.frame_bytes.to_string(),
                format!("more than the {}-byte header", h.header_bytes()),
            ));
        }
        if ![1, 2, 4, 8].contains(&h.bits) {
            return Err(HeaderError::invalid(
                FORMAT,
                "bits per sample",
                h.bits.to_string(),
                "1, 2, 4 or 8",
            ));
        }
        if (h.payload_bytes() * 8) % h.bits_per_time() != 0 {
            return Err(HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "a payload of {} bytes is not a whole number of {}-bit samples",
                    h.payload_bytes(),
                    h.bits_per_time()
                ),
            });
        }
        Ok(h)
    }

    /// Encode as the 16 or 32 header bytes (extended data zero but for the EDV).
    pub fn to_bytes(&self) -> Vec<u8> {
        let words = [
            u32::from(self.invalid) << 31 | u32::from(self.legacy) << 30 | self.seconds,
            u32::from(self.ref_epoch) << 24 | self.frame_nr,
            u32::from(self.version) << 29
                | self.nchan.trailing_zeros() << 24
                | (self.frame_bytes / 8) as u32,
            u32::from(self.complex) << 31
                | (self.bits - 1) << 26
                | u32::from(self.thread) << 16
                | u32::from(self.station),
            u32::from(self.edv.unwrap_or(0)) << 24,
            0,
            0,
            0,
        ];
        let n = self.header_bytes() / 4;
        words[..n].iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Header length in bytes.
    pub fn header_bytes(&self) -> usize {
        if self.legacy {
            16
        } else {
            32
        }
    }

    /// Payload length in bytes.
    pub fn payload_bytes(&self) -> usize {
        self.frame_bytes - self.header_bytes()
    }

    /// Bits of one complete sample (every channel, both components if complex).
    pub fn bits_per_time(&self) -> usize {
        self.bits as usize * self.nchan * if self.complex { 2 } else { 1 }
    }

    /// Complete samples per frame.
    pub fn samples_per_frame(&self) -> usize {
        self.payload_bytes() * 8 / self.bits_per_time()
    }

    /// Whether `other` can be a frame of the same stream.
    pub(crate) fn same_stream(&self, other: &VdifHeader) -> bool {
        (
            self.frame_bytes,
            self.nchan,
            self.complex,
            self.bits,
            self.legacy,
            self.station,
        ) == (
            other.frame_bytes,
            other.nchan,
            other.complex,
            other.bits,
            other.legacy,
            other.station,
        )
    }

    /// The reference epoch as a modified Julian date.
    pub(crate) fn epoch_mjd(&self) -> f64 {
        let year = 2000 + i64::from(self.ref_epoch / 2);
        let month = if self.ref_epoch % 2 == 0 { 1 } else { 7 };
        days_from_civil(year, month, 1) as f64 + 40_587.0
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What the text file beside the data says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VdifSidecar {
    /// Centre of the whole band, MHz.
    pub freq_mhz: Option<f64>,
    /// Total bandwidth, MHz (negative: lower sideband).
    pub bw_mhz: Option<f64>,
    /// Polarisations the threads interleave.
    pub npol: usize,
    /// Complete samples per second per channel.
    pub sample_rate_hz: Option<f64>,
    /// Threads to read, in channel order.
    pub threads: Option<Vec<u16>>,
    /// Source name.
    pub source: String,
    /// Telescope name.
    pub telescope: String,
    /// Where the telescope pointed (`RA` and `DEC`).
    pub position: Option<SkyPosition>,
}

impl VdifSidecar {
    /// Parse `KEY value` lines (`#` starts a comment).
    ///
    /// # Errors
    /// Unknown keys, and values that are not what the key needs; the message names the line.
    pub fn parse(text: &str) -> Result<Self, HeaderError> {
        let mut s = VdifSidecar {
            npol: 1,
            ..Default::default()
        };
        let (mut ra, mut dec) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((key, value)) = line.split_once(char::is_whitespace) else {
                if line.is_empty() {
                    continue;
                }
                return Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("line {}: {line:?} has no value", n + 1),
                });
            };
            let value = value.trim();
            let bad = |expected: &str| {
                HeaderError::invalid(FORMAT, &format!("{key} (line {})", n + 1), value, expected)
            };
            let positive = |v: &str| parse_f64(v).filter(|x| *x > 0.0);
            match key.to_ascii_uppercase().as_str() {
                "FREQ" => s.freq_mhz = Some(positive(value).ok_or_else(|| bad("MHz above 0"))?),
                "BW" => {
                    s.bw_mhz = Some(
                        parse_f64(value)
                            .filter(|x| *x != 0.0)
                            .ok_or_else(|| bad("MHz, not 0"))?,
                    )
                }
                "NPOL" => {
                    s.npol = match parse_i64(value) {
                        Some(1) => 1,
                        Some(2) => 2,
                        _ => return Err(bad("1 or 2")),
                    }
                }
                "SAMPLE_RATE" => {
                    s.sample_rate_hz =
                        Some(positive(value).ok_or_else(|| bad("MHz above 0"))? * 1e6)
                }
                "THREADS" => {
                    let ids: Option<Vec<u16>> = value
                        .split(',')
                        .map(|t| t.trim().parse::<u16>().ok().filter(|&t| t < 1024))
                        .collect();
                    let ids = ids.ok_or_else(|| bad("thread ids 0-1023, comma-separated"))?;
                    if ids.iter().collect::<BTreeSet<_>>().len() != ids.len() {
                        return Err(bad("each thread once"));
                    }
                    s.threads = Some(ids);
                }
                "SOURCE" => s.source = value.to_string(),
                "TELESCOPE" => s.telescope = value.to_string(),
                "RA" => ra = Some((n, value.to_string())),
                "DEC" => dec = Some((n, value.to_string())),
                _ => {
                    return Err(HeaderError::invalid(
                        FORMAT,
                        &format!("line {}", n + 1),
                        key,
                        "FREQ, BW, NPOL, SAMPLE_RATE, THREADS, SOURCE, TELESCOPE, RA or DEC",
                    ))
                }
            }
        }
        s.position = match (ra, dec) {
            (Some((n, ra)), Some((_, dec))) => {
                Some(SkyPosition::parse(&ra, &dec).map_err(|e| {
                    HeaderError::invalid(FORMAT, &format!("RA (line {})", n + 1), ra, e)
                })?)
            }
            (None, None) => None,
            (Some((n, _)), None) | (None, Some((n, _))) => {
                return Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("line {}: RA and DEC go together", n + 1),
                })
            }
        };
        Ok(s)
    }

    /// The side-car file of `data`: `data` with `.hdr` appended.
    pub fn path_of(data: &Path) -> PathBuf {
        let mut p = data.as_os_str().to_owned();
        p.push(".hdr");
        PathBuf::from(p)
    }
}

/// Whether `start` (the first bytes of a file) looks like a VDIF frame header.
pub(crate) fn looks_like(start: &[u8]) -> bool {
    VdifHeader::parse(start).is_ok_and(|h| h.version <= 1)
}

/// Where the frames of a VDIF file are.
#[derive(Clone, Debug)]
pub(crate) struct VdifIndex {
    /// The first header (every frame shares its shape).
    header: VdifHeader,
    /// Threads read, in output order.
    threads: Vec<u16>,
    /// Polarisations the threads interleave.
    npol: usize,
    /// For frame set `s` and thread slot `k`, `slots[s * threads.len() + k]` is the payload
    /// offset of a valid frame, or `None` (missing or invalid: read as zeros).
    slots: Vec<Option<u64>>,
}

impl VdifIndex {
    /// Bits of one real component.
    pub(crate) fn bits(&self) -> u32 {
        self.header.bits
    }

    /// Number of frame sets.
    pub(crate) fn nsets(&self) -> usize {
        self.slots.len() / self.threads.len()
    }

    fn samples_per_frame(&self) -> u64 {
        self.header.samples_per_frame() as u64
    }

    /// Stream samples held.
    pub(crate) fn nsamples(&self) -> u64 {
        self.nsets() as u64 * self.samples_per_frame()
    }

    /// Decode stream samples `start..start + out.nsamp()` into `out`.
    pub(crate) fn read_into(
        &self,
        file: &mut File,
        start: u64,
        out: &mut Voltages,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let spf = self.samples_per_frame();
        let end = start + out.nsamp() as u64;
        let mut t = start;
        while t < end {
            let set = (t / spf) as usize;
            let t0 = (t % spf) as usize;
            let t1 = ((end - set as u64 * spf).min(spf)) as usize;
            let at = (t - start) as usize;
            for (k, slot) in self.slots[set * self.threads.len()..][..self.threads.len()]
                .iter()
                .enumerate()
            {
                self.decode_frame(file, *slot, k, t0..t1, out, at, scratch)?;
            }
            t = set as u64 * spf + t1 as u64;
        }
        Ok(())
    }

    /// Decode times `t` of the frame of thread slot `k` (zeros where there is none).
    #[allow(clippy::too_many_arguments)]
    fn decode_frame(
        &self,
        file: &mut File,
        payload: Option<u64>,
        k: usize,
        t: Range<usize>,
        out: &mut Voltages,
        at: usize,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let h = &self.header;
        let n = t.len();
        let pol = k % self.npol;
        let chan0 = k / self.npol * h.nchan;
        let Some(offset) = payload else {
            for j in 0..h.nchan {
                out.series_mut(chan0 + j, pol)[at..at + n].fill(Complex32::new(0.0, 0.0));
            }
            return Ok(());
        };
        let bpt = h.bits_per_time();
        let first_bit = t.start * bpt;
        let (b0, b1) = (first_bit / 8, (t.end * bpt).div_ceil(8));
        scratch.resize(b1 - b0, 0);
        file.seek(SeekFrom::Start(offset + b0 as u64))?;
        let got = read_up_to(file, scratch)?;
        if got < scratch.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("frame payload ends {} bytes early", scratch.len() - got),
            ));
        }
        decode_bits(
            h,
            &levels(h.bits),
            scratch,
            first_bit - b0 * 8,
            n,
            out,
            chan0,
            pol,
            at,
        );
        Ok(())
    }
}

/// Decode `n` times of a frame of header `h` into channels `chan0..chan0 + h.nchan`,
/// polarisation `pol`, samples `at..at + n` of `out`, from `bytes`, whose bit `shift0` is the
/// first bit of the first time; `level` maps codes to values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_bits(
    h: &VdifHeader,
    level: &[f32],
    bytes: &[u8],
    shift0: usize,
    n: usize,
    out: &mut Voltages,
    chan0: usize,
    pol: usize,
    at: usize,
) {
    let bits = h.bits as usize;
    let mask = (1u32 << bits) - 1;
    let parts = if h.complex { 2 } else { 1 };
    // Component e of the range starts at bit shift0 + e * bits of `bytes`; samples never
    // straddle a byte since bits divides 8.
    let comp = |e: usize| {
        let bit = shift0 + e * bits;
        level[(u32::from(bytes[bit / 8]) >> (bit % 8) & mask) as usize]
    };
    for j in 0..h.nchan {
        let dst = &mut out.series_mut(chan0 + j, pol)[at..at + n];
        for (i, d) in dst.iter_mut().enumerate() {
            let e = (i * h.nchan + j) * parts;
            *d = if h.complex {
                Complex32::new(comp(e), comp(e + 1))
            } else {
                Complex32::new(comp(e), 0.0)
            };
        }
    }
}

/// Decoded value of every code of a `bits`-bit component.
pub(crate) fn levels(bits: u32) -> Vec<f32> {
    match bits {
        1 => vec![-1.0, 1.0],
        2 => vec![-TWO_BIT_HIGH, -1.0, 1.0, TWO_BIT_HIGH],
        4 => (0..16).map(|v| (v as f32 - 8.0) / FOUR_BIT_SIGMA).collect(),
        _ => (0..256)
            .map(|v| (v as f32 - 127.5) / EIGHT_BIT_SIGMA)
            .collect(),
    }
}

/// Frame sets a second at `rate` samples a second with `spf` samples a frame.
pub(crate) fn frames_per_second(rate: f64, spf: f64) -> Result<u64, HeaderError> {
    let fps = rate / spf;
    if fps.fract() != 0.0 {
        return Err(HeaderError::Inconsistent {
            format: FORMAT,
            detail: format!(
                "a sample rate of {rate} Hz is not a whole number of {spf}-sample frames per \
                 second"
            ),
        });
    }
    if fps < 1.0 {
        return Err(HeaderError::Inconsistent {
            format: FORMAT,
            detail: format!(
                "a sample rate of {rate} Hz is less than one {spf}-sample frame a second"
            ),
        });
    }
    Ok(fps as u64)
}

/// The band of `nt` threads of frames like `h0` at `sample_rate_hz`, with the side-car's
/// frequency and bandwidth; `car_name` names the side-car in errors.
pub(crate) fn band_of(
    h0: &VdifHeader,
    car: &VdifSidecar,
    nt: usize,
    sample_rate_hz: f64,
    car_name: &str,
) -> Result<Band, HeaderError> {
    let nchan = super::check_nchan(
        FORMAT,
        "channels (threads × channels per frame)",
        (nt / car.npol).saturating_mul(h0.nchan),
    )?;
    let chan_bw = if h0.complex {
        sample_rate_hz
    } else {
        sample_rate_hz / 2.0
    } / 1e6;
    let total = nchan as f64 * chan_bw;
    let bw = car.bw_mhz.unwrap_or(total);
    if (bw.abs() - total).abs() > 1e-6 * total {
        return Err(HeaderError::Inconsistent {
            format: FORMAT,
            detail: format!(
                "BW {bw} MHz in {car_name} but {nchan} channels at {sample_rate_hz} Hz span \
                 {total} MHz"
            ),
        });
    }
    let freq = car.freq_mhz.ok_or_else(|| HeaderError::Missing {
        format: FORMAT,
        key: format!("FREQ in {car_name}"),
    })?;
    Ok(Band::from_total(
        freq,
        bw,
        nchan,
        sample_rate_hz,
        h0.complex,
        car.npol,
    ))
}

/// Index a VDIF file whose side-car (see the module documentation) gives what the headers
/// do not.
pub(crate) fn index(path: &Path, file: &mut File) -> Result<(Index, VdifIndex), ReadError> {
    let io = |e| ReadError::io(path, e);
    let header_err = |offset: u64, source: HeaderError| ReadError::Header {
        path: path.to_path_buf(),
        offset,
        source,
    };
    let car_path = VdifSidecar::path_of(path);
    let car = match std::fs::read_to_string(&car_path) {
        Ok(text) => VdifSidecar::parse(&text).map_err(|e| header_err(0, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(header_err(
                0,
                HeaderError::Missing {
                    format: FORMAT,
                    key: format!(
                        "FREQ (VDIF headers give no sky frequency: write `FREQ <MHz>` and \
                         optionally BW, NPOL, SAMPLE_RATE, THREADS into {})",
                        car_path.display()
                    ),
                },
            ))
        }
        Err(e) => return Err(ReadError::io(&car_path, e)),
    };
    let file_len = file.metadata().map_err(io)?.len();
    let mut warnings = Vec::new();
    let mut first: Option<VdifHeader> = None;
    // (second, frame number, thread, payload offset, valid) of every frame.
    let mut frames = Vec::new();
    let mut pos = 0u64;
    let mut buf = [0u8; 32];
    while pos < file_len {
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        let n = read_up_to(file, &mut buf).map_err(io)?;
        let h = match VdifHeader::parse(&buf[..n]) {
            Ok(h) => h,
            Err(e) if first.is_none() => return Err(header_err(pos, e)),
            Err(e) => {
                warnings.push(format!(
                    "stopped at byte {pos}: not a usable frame header ({e})"
                ));
                break;
            }
        };
        let f0 = first.get_or_insert_with(|| h.clone());
        if !f0.same_stream(&h) {
            warnings.push(format!(
                "stopped at byte {pos}: the frame there changes length, channels, sample size \
                 or station"
            ));
            break;
        }
        if pos + h.frame_bytes as u64 > file_len {
            warnings.push(format!(
                "ignored a frame at byte {pos} that the file cuts short by {} bytes",
                pos + h.frame_bytes as u64 - file_len
            ));
            break;
        }
        let payload = pos + h.header_bytes() as u64;
        frames.push((h.seconds, h.frame_nr, h.thread, payload, !h.invalid));
        pos += h.frame_bytes as u64;
    }
    let h0 = first.expect("the loop reads at least one header or returns");
    if frames.is_empty() {
        return Err(ReadError::Truncated {
            path: path.to_path_buf(),
            detail: format!(
                "the first frame needs {} bytes and the file has {file_len}",
                h0.frame_bytes
            ),
        });
    }
    let spf = h0.samples_per_frame() as f64;
    // Frame sets per second: from the sample rate, else from a frame number that wraps.
    let rate = car.sample_rate_hz.or(h0.sample_rate_hz);
    let fps = match rate {
        Some(r) => frames_per_second(r, spf).map_err(|e| header_err(0, e))?,
        None => {
            let s0 = frames[0].0;
            if !frames.iter().any(|f| f.0 != s0) {
                return Err(header_err(
                    0,
                    HeaderError::Missing {
                        format: FORMAT,
                        key: format!(
                            "SAMPLE_RATE (the headers do not give it and the file spans no \
                             second boundary to count frames by: add `SAMPLE_RATE <MHz>` to {})",
                            car_path.display()
                        ),
                    },
                ));
            }
            frames.iter().map(|f| u64::from(f.1)).max().unwrap_or(0) + 1
        }
    };
    let sample_rate_hz = fps as f64 * spf;
    let seen: BTreeSet<u16> = frames.iter().map(|f| f.2).collect();
    let threads = match &car.threads {
        Some(t) => {
            if let Some(missing) = t.iter().find(|t| !seen.contains(t)) {
                return Err(header_err(
                    0,
                    HeaderError::invalid(
                        FORMAT,
                        "THREADS",
                        format!("{missing}"),
                        format!("threads the file holds ({seen:?})"),
                    ),
                ));
            }
            t.clone()
        }
        None => seen.into_iter().collect(),
    };
    if threads.len() % car.npol != 0 {
        return Err(header_err(
            0,
            HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "{} threads do not split into {} polarisations",
                    threads.len(),
                    car.npol
                ),
            },
        ));
    }
    // Frame sets by time since the first frame; gaps and missing threads read as zeros.
    let when = |f: &(u32, u32, u16, u64, bool)| {
        u64::from(f.0)
            .saturating_mul(fps)
            .saturating_add(u64::from(f.1))
    };
    // The stream starts at the earliest of the first frames (threads may be written a
    // little out of order); frames before it, or so far after it that the gap would
    // outnumber the frames present (a damaged header), are left out.
    let t0 = frames.iter().take(64).map(when).min().unwrap_or(0);
    let reach = 2 * frames.len() as u64 + 1024;
    let before = frames.len();
    frames.retain(|f| when(f) >= t0 && when(f) - t0 < reach);
    if frames.len() < before {
        warnings.push(format!(
            "{} frame(s) dated before the first frame or far beyond the others: ignored",
            before - frames.len()
        ));
    }
    let nsets = frames.iter().map(|f| when(f) - t0 + 1).max().unwrap_or(0) as usize;
    let nt = threads.len();
    let mut slots = vec![None; nsets * nt];
    let mut filled = 0usize;
    for f in &frames {
        if let Some(k) = threads.iter().position(|&t| t == f.2) {
            if f.1 as u64 >= fps {
                warnings.push(format!(
                    "frame number {} is beyond the {fps} frames a second the sample rate gives",
                    f.1
                ));
                continue;
            }
            let slot = &mut slots[(when(f) - t0) as usize * nt + k];
            if f.4 && slot.is_none() {
                *slot = Some(f.3);
                filled += 1;
            }
        }
    }
    if filled < slots.len() {
        warnings.push(format!(
            "{} of {} frames missing or marked invalid: read as zeros",
            slots.len() - filled,
            slots.len()
        ));
    }
    let band = band_of(
        &h0,
        &car,
        nt,
        sample_rate_hz,
        &car_path.display().to_string(),
    )
    .map_err(|e| header_err(0, e))?;
    let start = frames
        .iter()
        .find(|f| when(f) == t0)
        .map_or((0, 0), |f| (f.0, f.1));
    let start_mjd =
        h0.epoch_mjd() + (f64::from(start.0) + f64::from(start.1) / fps as f64) / 86_400.0;
    let header_text = format!(
        "VDIF version {} EDV {} station {:#06x}: {} threads {:?}, {} channel(s) per frame, \
         {}-bit {}, {} samples in {}-byte frames, {} frame sets\n{}",
        h0.version,
        h0.edv
            .map_or("none (legacy)".to_string(), |e| e.to_string()),
        h0.station,
        nt,
        threads,
        h0.nchan,
        h0.bits,
        if h0.complex { "complex" } else { "real" },
        h0.samples_per_frame(),
        h0.frame_bytes,
        nsets,
        std::fs::read_to_string(&car_path).unwrap_or_default()
    );
    let index = Index {
        band,
        metadata: Metadata {
            source: car.source,
            telescope: car.telescope,
            start_mjd: Some(start_mjd),
            position: car.position,
        },
        frames: Vec::new(),
        header_text,
        warnings,
    };
    Ok((
        index,
        VdifIndex {
            header: h0,
            threads,
            npol: car.npol,
            slots,
        },
    ))
}

/// Write `data` as VDIF frames of `samples_per_frame` samples, one thread per (channel,
/// polarisation) pair (thread `c * npol + p`), quantised to `bits` bits the way `baseband`
/// encodes, with EDV 0 headers starting at 2000-01-01 00:00 UTC (epoch 0, second 0).
/// `samples_per_frame` must divide the block's length and give whole 8-byte payloads.
///
/// # Errors
/// I/O failures, and shapes the format cannot hold (as `InvalidInput`).
pub fn write_vdif(
    w: &mut impl std::io::Write,
    data: &Voltages,
    complex: bool,
    bits: u32,
    samples_per_frame: usize,
    sample_rate_hz: f64,
) -> std::io::Result<()> {
    write_vdif_at(
        w,
        data,
        complex,
        bits,
        samples_per_frame,
        sample_rate_hz,
        51_544.0,
    )
}

/// [`write_vdif`] with the first frame dated `start_mjd` (UTC) in the latest reference
/// epoch at or before it. A frame set starts on a whole second, so the fraction of a
/// second in `start_mjd` is dropped.
///
/// # Errors
/// As [`write_vdif`], and a start before 2000 or beyond the 63 epochs VDIF counts.
pub fn write_vdif_at(
    w: &mut impl std::io::Write,
    data: &Voltages,
    complex: bool,
    bits: u32,
    samples_per_frame: usize,
    sample_rate_hz: f64,
    start_mjd: f64,
) -> std::io::Result<()> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    let dated = |ref_epoch: u8| VdifHeader {
        invalid: false,
        legacy: false,
        seconds: 0,
        ref_epoch,
        frame_nr: 0,
        version: 1,
        nchan: 1,
        frame_bytes: 0,
        complex,
        bits,
        thread: 0,
        station: 0x4d50,
        edv: Some(0),
        sample_rate_hz: None,
    };
    let ref_epoch = (0..64u8)
        .rev()
        .find(|&e| dated(e).epoch_mjd() <= start_mjd)
        .filter(|_| start_mjd.is_finite())
        .ok_or_else(|| invalid(format!("VDIF cannot date MJD {start_mjd}, before 2000")))?;
    // A hair above the whole second, so that an MJD meant to be on one is not a second early.
    let start_s = ((start_mjd - dated(ref_epoch).epoch_mjd()) * 86_400.0 + 1e-6).floor() as u64;
    // The header's seconds field has 30 bits.
    if start_s + data.nsamp() as u64 / samples_per_frame.max(1) as u64 >= 1 << 30 {
        return Err(invalid(format!(
            "VDIF cannot date MJD {start_mjd}: beyond its last reference epoch"
        )));
    }
    let parts = if complex { 2 } else { 1 };
    let payload_bits = samples_per_frame * bits as usize * parts;
    if ![1, 2, 4, 8].contains(&bits) || payload_bits % 64 != 0 || samples_per_frame == 0 {
        return Err(invalid(format!(
            "{samples_per_frame} samples of {bits} bits do not make whole 8-byte payloads"
        )));
    }
    if data.nsamp() % samples_per_frame != 0 {
        return Err(invalid(format!(
            "{} samples are not whole frames of {samples_per_frame}",
            data.nsamp()
        )));
    }
    let fps = sample_rate_hz / samples_per_frame as f64;
    if fps.fract() != 0.0 || fps < 1.0 {
        return Err(invalid(format!(
            "{sample_rate_hz} Hz is not a whole number of frames per second"
        )));
    }
    let fps = fps as u64;
    let encode = |x: f32| -> u32 {
        match bits {
            1 => u32::from(x >= 0.0),
            2 => {
                // baseband's thresholds: 0, ±2.174564 (between the 1 and high levels).
                let v = (x / 2.174_564).floor() + 2.0;
                v.clamp(0.0, 3.0) as u32
            }
            4 => (x * FOUR_BIT_SIGMA + 8.5).clamp(0.0, 15.0) as u32,
            _ => (x * EIGHT_BIT_SIGMA + 127.5).round().clamp(0.0, 255.0) as u32,
        }
    };
    for set in 0..data.nsamp() / samples_per_frame {
        for c in 0..data.nchan() {
            for p in 0..data.npol() {
                let h = VdifHeader {
                    seconds: (start_s + set as u64 / fps) as u32,
                    frame_nr: (set as u64 % fps) as u32,
                    frame_bytes: 32 + payload_bits / 8,
                    thread: (c * data.npol() + p) as u16,
                    ..dated(ref_epoch)
                };
                w.write_all(&h.to_bytes())?;
                let mut payload = vec![0u8; payload_bits / 8];
                let series = &data.series(c, p)[set * samples_per_frame..][..samples_per_frame];
                for (i, v) in series.iter().enumerate() {
                    let comps = [v.re, v.im];
                    for (q, &x) in comps[..parts].iter().enumerate() {
                        let bit = (i * parts + q) * bits as usize;
                        payload[bit / 8] |= (encode(x) << (bit % 8)) as u8;
                    }
                }
                w.write_all(&payload)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_fields() {
        let h = VdifHeader {
            invalid: false,
            legacy: false,
            seconds: 12_345,
            ref_epoch: 29,
            frame_nr: 77,
            version: 1,
            nchan: 4,
            frame_bytes: 32 + 1024,
            complex: true,
            bits: 4,
            thread: 513,
            station: 0x4142,
            edv: Some(0),
            sample_rate_hz: None,
        };
        let b = h.to_bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(VdifHeader::parse(&b).unwrap(), h);
        assert_eq!(h.samples_per_frame(), 1024 * 8 / (4 * 4 * 2));
        let legacy = VdifHeader {
            legacy: true,
            edv: None,
            frame_bytes: 16 + 1024,
            ..h.clone()
        };
        assert_eq!(VdifHeader::parse(&legacy.to_bytes()).unwrap(), legacy);
    }

    #[test]
    fn edv3_sample_rate() {
        let mut b = VdifHeader {
            invalid: false,
            legacy: false,
            seconds: 0,
            ref_epoch: 0,
            frame_nr: 0,
            version: 1,
            nchan: 1,
            frame_bytes: 5032,
            complex: false,
            bits: 2,
            thread: 0,
            station: 0,
            edv: Some(3),
            sample_rate_hz: None,
        }
        .to_bytes();
        // 16 MHz of complex samples (bit 23: MHz): 32 MHz of real ones.
        b[16..20].copy_from_slice(&(3u32 << 24 | 1 << 23 | 16).to_le_bytes());
        assert_eq!(VdifHeader::parse(&b).unwrap().sample_rate_hz, Some(32e6));
    }

    #[test]
    fn bad_headers_are_named() {
        let mut b = VdifHeader::parse(&[0u8; 32]).unwrap_err().to_string();
        assert!(b.contains("frame length"), "{b}");
        let mut h = vec![0u8; 32];
        h[8] = 100; // 800-byte frames
        h[15] = 5 << 2; // 6 bits per sample
        b = VdifHeader::parse(&h).unwrap_err().to_string();
        assert!(
            b.contains("bits per sample") && b.contains("1, 2, 4 or 8"),
            "{b}"
        );
        assert!(VdifHeader::parse(&h[..10]).is_err());
    }

    #[test]
    fn sidecar_parses_and_names_bad_lines() {
        let s = VdifSidecar::parse(
            "# obs\nFREQ 1400.5\nBW -64\nNPOL 2\nSAMPLE_RATE 32\nTHREADS 3, 1,2,0\nSOURCE B0329+54\n",
        )
        .unwrap();
        assert_eq!(s.freq_mhz, Some(1400.5));
        assert_eq!(s.bw_mhz, Some(-64.0));
        assert_eq!((s.npol, s.sample_rate_hz), (2, Some(32e6)));
        assert_eq!(s.threads, Some(vec![3, 1, 2, 0]));
        assert_eq!(s.source, "B0329+54");
        let e = VdifSidecar::parse("FREQ 1400\nNPOL 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("NPOL (line 2)") && e.contains("1 or 2"), "{e}");
        let e = VdifSidecar::parse("FREQ 1400\nCOLOUR red\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("COLOUR"), "{e}");
        let e = VdifSidecar::parse("THREADS 1,1\n").unwrap_err().to_string();
        assert!(e.contains("each thread once"), "{e}");
    }

    #[test]
    fn epoch_dates() {
        let h = |ep| VdifHeader {
            ref_epoch: ep,
            ..VdifHeader::parse(&{
                let mut b = vec![0u8; 32];
                b[8] = 100;
                b
            })
            .unwrap()
        };
        assert_eq!(h(0).epoch_mjd(), 51_544.0); // 2000-01-01
        assert_eq!(h(28).epoch_mjd(), 56_658.0); // 2014-01-01
        assert_eq!(h(29).epoch_mjd(), 56_839.0); // 2014-07-01
    }
}
