//! GUPPI RAW files: blocks, each a header of 80-character FITS cards ending with `END`
//! (padded with NULs to a multiple of 512 bytes when `DIRECTIO` is set) followed by
//! `BLOCSIZE` bytes of 8- or 16-bit (little-endian) two's-complement samples (`NBITS`).
//!
//! As in `baseband`: data are complex unless `OBSNCHAN` is 1; `NPOL` counts real components
//! (4 for two complex polarisations); payloads are channel-major, `(channel, time,
//! polarisation, re/im)`, for `PKTFMT` `1SFA` and time-major `(time, channel, polarisation)`
//! for `SIMPLE`; the last `OVERLAP` samples of a block repeat at the start of the next and are
//! read once. `OBSFREQ` is the band centre and `OBSBW` the signed total bandwidth in MHz,
//! `TBIN` the sample interval in seconds.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::layout::{Axis, Layout, SampleFormat};
use super::{
    parse_f64, parse_i64, read_up_to, Frame, HeaderError, Index, Metadata, ReadError, SkyPosition,
};
use crate::band::Band;
use crate::voltages::Voltages;

const FORMAT: &str = "GUPPI";
const CARD: usize = 80;
/// Headers longer than this many cards are taken as garbage rather than read forever.
const MAX_CARDS: usize = 4096;

/// A card value: quoted string or bare (numeric, logical) text.
#[derive(Clone, Debug, PartialEq)]
pub enum CardValue {
    /// `'text'`, trailing blanks removed.
    Str(String),
    /// Unquoted text, as written.
    Raw(String),
}

impl CardValue {
    fn text(&self) -> &str {
        match self {
            CardValue::Str(s) | CardValue::Raw(s) => s.trim(),
        }
    }
}

/// A GUPPI header: its cards in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GuppiHeader {
    cards: Vec<(String, CardValue)>,
}

/// The values of a GUPPI header that the reader needs, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct GuppiParams {
    /// Payload bytes of this block.
    pub blocsize: u64,
    /// Channels.
    pub nchan: usize,
    /// Polarisations (`NPOL` / 2 for complex data).
    pub npol: usize,
    /// Complex samples (`OBSNCHAN` ≠ 1).
    pub complex: bool,
    /// Encoding of each component (`NBITS`).
    pub sample: SampleFormat,
    /// Band centre, MHz.
    pub obsfreq_mhz: f64,
    /// Signed total bandwidth, MHz.
    pub obsbw_mhz: f64,
    /// Sample interval, s.
    pub tbin_s: f64,
    /// Samples repeated at the start of the next block.
    pub overlap: usize,
    /// `(channel, time, pol)` payload (`1SFA`) rather than `(time, channel, pol)` (`SIMPLE`).
    pub channels_first: bool,
    /// Header padded to 512 bytes.
    pub directio: bool,
}

/// What a block whose header fails [`GuppiParams::same_layout`] is told.
pub(crate) const LAYOUT_CHANGED: &str =
    "a block header changes OBSNCHAN/NPOL/NBITS/TBIN/OBSFREQ/OBSBW/PKTFMT from the first block";

impl GuppiParams {
    /// Whether a later block's header keeps this block's layout and band (all a reader
    /// assumes stays fixed through a file or stream).
    pub fn same_layout(&self, other: &GuppiParams) -> bool {
        self.nchan == other.nchan
            && self.npol == other.npol
            && self.complex == other.complex
            && self.sample == other.sample
            && self.tbin_s == other.tbin_s
            && self.obsfreq_mhz == other.obsfreq_mhz
            && self.obsbw_mhz == other.obsbw_mhz
            && self.channels_first == other.channels_first
    }

    /// Bytes of one complete sample.
    pub fn bytes_per_time(&self) -> usize {
        self.nchan * self.npol * self.sample.bytes() * if self.complex { 2 } else { 1 }
    }

    /// Complete samples in one block, overlap included.
    pub fn samples_per_block(&self) -> usize {
        (self.blocsize / self.bytes_per_time() as u64) as usize
    }

    /// Frequency layout.
    pub fn band(&self) -> Band {
        Band::from_total(
            self.obsfreq_mhz,
            self.obsbw_mhz,
            self.nchan,
            1.0 / self.tbin_s,
            self.complex,
            self.npol,
        )
    }

    pub(crate) fn layout(&self) -> Layout {
        let order = if self.channels_first {
            [Axis::Chan, Axis::Time, Axis::Pol]
        } else {
            [Axis::Time, Axis::Chan, Axis::Pol]
        };
        Layout::dense(
            order,
            self.samples_per_block(),
            self.nchan,
            self.npol,
            self.complex,
            self.sample,
        )
    }
}

impl GuppiHeader {
    /// Parse cards from `bytes` (a whole number of 80-byte cards, the `END` card optional).
    ///
    /// # Errors
    /// A card that is not ASCII or has no `=` in column 9.
    pub fn parse(bytes: &[u8]) -> Result<Self, HeaderError> {
        let mut cards = Vec::new();
        for (i, card) in bytes.chunks(CARD).enumerate() {
            let Ok(text) = std::str::from_utf8(card) else {
                return Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("card {i} is not ASCII"),
                });
            };
            if text.starts_with("END") && text[3..].trim().is_empty() {
                break;
            }
            // Blank and commentary cards (COMMENT, HISTORY: no '=' in column 9) carry no value.
            if text.trim().is_empty() || text.as_bytes().get(8) == Some(&b' ') {
                continue;
            }
            if text.len() < 10 || text.as_bytes()[8] != b'=' {
                return Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("card {i} {text:?} has no '=' in column 9"),
                });
            }
            let key = text[..8].trim().to_string();
            cards.push((key, parse_value(&text[9..])));
        }
        Ok(GuppiHeader { cards })
    }

    /// Read cards from `r` up to and including `END`; returns the header and the number of
    /// cards consumed (the `END` card included), or `None` at a clean end of file.
    ///
    /// # Errors
    /// I/O errors; `Ok(Some(Err(..)))` for malformed or unterminated headers.
    #[allow(clippy::type_complexity)]
    pub fn read_from(
        r: &mut impl Read,
    ) -> std::io::Result<Option<Result<(Self, usize), HeaderError>>> {
        let mut bytes = Vec::new();
        let mut card = [0u8; CARD];
        for ncards in 0..MAX_CARDS {
            let n = read_up_to(r, &mut card)?;
            if n == 0 && ncards == 0 {
                return Ok(None);
            }
            if n < CARD {
                return Ok(Some(Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!("file ends inside the header after {ncards} cards"),
                })));
            }
            if card.starts_with(b"END") && card[3..].iter().all(|b| *b == b' ') {
                return Ok(Some(GuppiHeader::parse(&bytes).map(|h| (h, ncards + 1))));
            }
            if card[8] != b'=' && card[8] != b' ' {
                return Ok(Some(Err(HeaderError::Malformed {
                    format: FORMAT,
                    detail: format!(
                        "card {ncards} {:?} is not a FITS card (no END card before it)",
                        String::from_utf8_lossy(&card)
                    ),
                })));
            }
            bytes.extend_from_slice(&card);
        }
        Ok(Some(Err(HeaderError::Malformed {
            format: FORMAT,
            detail: format!("no END card within {MAX_CARDS} cards"),
        })))
    }

    /// The value of `key` as text (quotes removed, blanks trimmed).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.cards
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.text())
    }

    /// Set a string-valued card, replacing or appending (trailing blanks are not
    /// significant in FITS strings and are dropped).
    pub fn set_str(&mut self, key: &str, value: &str) {
        self.set(key, CardValue::Str(value.trim_end().to_string()));
    }

    /// Set a numeric card, replacing or appending.
    pub fn set_num(&mut self, key: &str, value: f64) {
        self.set(key, CardValue::Raw(format_number(value)));
    }

    fn set(&mut self, key: &str, value: CardValue) {
        match self.cards.iter_mut().find(|(k, _)| k == key) {
            Some(c) => c.1 = value,
            None => self.cards.push((key.to_string(), value)),
        }
    }

    /// Number of cards (without `END`).
    pub fn len(&self) -> usize {
        self.cards.len()
    }

    /// Whether there are no cards.
    pub fn is_empty(&self) -> bool {
        self.cards.is_empty()
    }

    /// Bytes the header occupies in a file: cards, `END`, and 512-byte padding under
    /// `DIRECTIO`.
    pub fn nbytes(&self) -> usize {
        let n = (self.cards.len() + 1) * CARD;
        let directio = self.get("DIRECTIO").and_then(parse_i64).unwrap_or(0) != 0;
        if directio && n % 512 != 0 {
            n + 512 - n % 512
        } else {
            n
        }
    }

    /// Validate and extract what the reader needs.
    ///
    /// # Errors
    /// Missing or invalid keys, naming the key and what would have been accepted, and
    /// contradictions between bandwidth, channel count and `TBIN`.
    pub fn params(&self) -> Result<GuppiParams, HeaderError> {
        let get = |key: &str| {
            self.get(key)
                .ok_or_else(|| HeaderError::missing(FORMAT, key))
        };
        let int = |key: &str, ok: fn(i64) -> bool, expected: &str| -> Result<i64, HeaderError> {
            let v = get(key)?;
            parse_i64(v)
                .filter(|n| ok(*n))
                .ok_or_else(|| HeaderError::invalid(FORMAT, key, v, expected))
        };
        let float = |key: &str, ok: fn(f64) -> bool, expected: &str| -> Result<f64, HeaderError> {
            let v = get(key)?;
            parse_f64(v)
                .filter(|x| ok(*x))
                .ok_or_else(|| HeaderError::invalid(FORMAT, key, v, expected))
        };
        let blocsize = int("BLOCSIZE", |n| n > 0, "a positive byte count")? as u64;
        let sample = match int("NBITS", |n| n == 8 || n == 16, "8 or 16 (signed integers)")? {
            8 => SampleFormat::Int8,
            _ => SampleFormat::Int16,
        };
        let nchan = int("OBSNCHAN", |n| n >= 1, "an integer ≥ 1")? as usize;
        let nchan = super::check_nchan(FORMAT, "OBSNCHAN", nchan)?;
        let complex = nchan != 1;
        let npol_raw = if complex {
            int(
                "NPOL",
                |n| n == 2 || n == 4,
                "2 or 4 (real components: 2 per complex polarisation)",
            )?
        } else {
            int("NPOL", |n| n == 1 || n == 2, "1 or 2 for real data")?
        };
        let npol = if complex { npol_raw / 2 } else { npol_raw } as usize;
        let obsfreq_mhz = float("OBSFREQ", |x| x > 0.0, "a positive centre frequency in MHz")?;
        let obsbw_mhz = float(
            "OBSBW",
            |x| x != 0.0,
            "a non-zero bandwidth in MHz (negative for lower sideband)",
        )?;
        let tbin_s = float("TBIN", |x| x > 0.0, "a positive sample interval in seconds")?;
        let expected = nchan as f64 / tbin_s / 1e6 / if complex { 1.0 } else { 2.0 };
        if ((obsbw_mhz.abs() - expected) / expected).abs() > 1e-5 {
            return Err(HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "|OBSBW| = {} MHz but OBSNCHAN {nchan} channels at TBIN {tbin_s} s span {expected} MHz",
                    obsbw_mhz.abs()
                ),
            });
        }
        let channels_first = match self.get("PKTFMT").unwrap_or("1SFA") {
            "1SFA" => true,
            "SIMPLE" => false,
            other => {
                return Err(HeaderError::invalid(
                    FORMAT,
                    "PKTFMT",
                    other,
                    "1SFA (channel-major) or SIMPLE (time-major)",
                ))
            }
        };
        let directio = match self.get("DIRECTIO") {
            None => false,
            Some(v) => match parse_i64(v) {
                Some(0) => false,
                Some(1) => true,
                _ => return Err(HeaderError::invalid(FORMAT, "DIRECTIO", v, "0 or 1")),
            },
        };
        let p = GuppiParams {
            blocsize,
            nchan,
            npol,
            complex,
            sample,
            obsfreq_mhz,
            obsbw_mhz,
            tbin_s,
            overlap: 0,
            channels_first,
            directio,
        };
        if blocsize % p.bytes_per_time() as u64 != 0 {
            return Err(HeaderError::Inconsistent {
                format: FORMAT,
                detail: format!(
                    "BLOCSIZE {blocsize} is not a whole number of {}-byte samples",
                    p.bytes_per_time()
                ),
            });
        }
        let overlap = match self.get("OVERLAP") {
            None => 0,
            Some(v) => match parse_i64(v) {
                Some(n) if n >= 0 && (n as usize) < p.samples_per_block() => n as usize,
                _ => {
                    return Err(HeaderError::invalid(
                        FORMAT,
                        "OVERLAP",
                        v,
                        format!("a sample count below {} per block", p.samples_per_block()),
                    ))
                }
            },
        };
        Ok(GuppiParams { overlap, ..p })
    }

    /// The header as file bytes (cards, `END`, `DIRECTIO` padding).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.nbytes());
        for (key, value) in &self.cards {
            let body = match value {
                CardValue::Str(s) => format!("'{:<8}'", s.replace('\'', "''")),
                CardValue::Raw(s) => format!("{s:>20}"),
            };
            let card = format!("{key:<8}= {body}");
            out.extend_from_slice(format!("{card:<80}").as_bytes()[..CARD].as_ref());
        }
        out.extend_from_slice(format!("{:<80}", "END").as_bytes());
        out.resize(self.nbytes(), 0);
        out
    }
}

fn parse_value(rest: &str) -> CardValue {
    let rest = rest.trim_start();
    if let Some(inner) = rest.strip_prefix('\'') {
        // A doubled quote inside a FITS string is a literal quote.
        let mut s = String::new();
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\'' {
                if chars.peek() == Some(&'\'') {
                    chars.next();
                    s.push('\'');
                } else {
                    break;
                }
            } else {
                s.push(c);
            }
        }
        CardValue::Str(s.trim_end().to_string())
    } else {
        CardValue::Raw(rest.split('/').next().unwrap_or("").trim().to_string())
    }
}

/// A number in at most 20 characters, as fixed-format FITS wants it.
fn format_number(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() <= 20 {
        plain
    } else {
        format!("{v:E}")
    }
}

pub(crate) fn index(path: &Path, file: &mut File) -> Result<Index, ReadError> {
    let io = |e| ReadError::io(path, e);
    let file_len = file.metadata().map_err(io)?.len();
    let mut frames: Vec<Frame> = Vec::new();
    let mut warnings = Vec::new();
    let mut first: Option<(GuppiHeader, GuppiParams)> = None;
    let mut pos = 0u64;
    let mut overlaps = Vec::new();
    while pos < file_len {
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        let parsed = match GuppiHeader::read_from(file).map_err(io)? {
            None => break,
            Some(r) => r.and_then(|(h, _)| h.params().map(|p| (h, p))),
        };
        let (header, params) = match parsed {
            Ok(hp) => hp,
            Err(source) if first.is_none() => {
                return Err(ReadError::Header {
                    path: path.to_path_buf(),
                    offset: pos,
                    source,
                })
            }
            Err(e) => {
                warnings.push(format!("stopped at byte {pos}: {e}"));
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
                        detail: LAYOUT_CHANGED.into(),
                    },
                });
            }
        }
        let payload_offset = pos + header.nbytes() as u64;
        let end = payload_offset + params.blocsize;
        if end > file_len {
            warnings.push(format!(
                "block at byte {pos} announces BLOCSIZE {} but the file ends {} bytes short; \
                 block dropped",
                params.blocsize,
                end - file_len
            ));
            if first.is_none() {
                first = Some((header, params));
            }
            break;
        }
        frames.push(Frame {
            payload_offset,
            first_sample: 0,
            nsamples: params.samples_per_block() as u64,
            layout: params.layout(),
        });
        overlaps.push(params.overlap as u64);
        if first.is_none() {
            first = Some((header, params));
        }
        pos = end;
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
            detail: format!(
                "the first block needs {} payload bytes after its {}-byte header",
                params.blocsize,
                header.nbytes()
            ),
        });
    }
    // Every block but the last gives up its overlap to the next one.
    let last = frames.len() - 1;
    let mut next = 0;
    for (i, f) in frames.iter_mut().enumerate() {
        if i != last {
            f.nsamples -= overlaps[i];
        }
        f.first_sample = next;
        next += f.nsamples;
    }
    let (metadata, warning) = metadata_of(&header, &params);
    warnings.extend(warning);
    let header_text = header
        .cards
        .iter()
        .map(|(k, v)| format!("{k:<8}= {}", v.text()))
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

/// Source, telescope, position and start of the first sample a header describes: the start
/// from `STT_IMJD`, `STT_SMJD`, `STT_OFFS` and `PKTIDX`; the position from `RA_STR` and
/// `DEC_STR`, else `RA` and `DEC` in degrees, with a warning when they are unreadable.
pub(crate) fn metadata_of(
    header: &GuppiHeader,
    params: &GuppiParams,
) -> (Metadata, Option<String>) {
    let start_mjd = match (header.get("STT_IMJD"), header.get("STT_SMJD")) {
        (Some(i), Some(s)) => {
            let imjd = parse_f64(i).unwrap_or(0.0);
            let smjd = parse_f64(s).unwrap_or(0.0);
            let offs = header.get("STT_OFFS").and_then(parse_f64).unwrap_or(0.0);
            // PKTIDX counts packets of PKTSIZE bytes since the start of the scan.
            let pkt_seconds = match (
                header.get("PKTIDX").and_then(parse_f64),
                header.get("PKTSIZE").and_then(parse_f64),
            ) {
                (Some(idx), Some(size)) => {
                    (idx * size / params.bytes_per_time() as f64).floor() * params.tbin_s
                }
                _ => 0.0,
            };
            Some(imjd + (smjd + offs + pkt_seconds) / 86400.0)
        }
        _ => None,
    };
    let text = |key: &str| header.get(key).map(str::trim).filter(|v| !v.is_empty());
    let (position, warning) = match (text("RA_STR"), text("DEC_STR")) {
        (Some(ra), Some(dec)) => match SkyPosition::parse(ra, dec) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("RA_STR/DEC_STR not used: {e}"))),
        },
        _ => match (
            header.get("RA").and_then(parse_f64),
            header.get("DEC").and_then(parse_f64),
        ) {
            (Some(ra), Some(dec)) => match SkyPosition::from_degrees(ra, dec) {
                Some(p) => (Some(p), None),
                None => (
                    None,
                    Some(format!(
                        "RA/DEC not used: {ra} {dec} is not a position in degrees"
                    )),
                ),
            },
            _ => (None, None),
        },
    };
    let metadata = Metadata {
        source: text("SRC_NAME").unwrap_or("unknown").to_string(),
        telescope: text("TELESCOP").unwrap_or("unknown").to_string(),
        start_mjd,
        position,
    };
    (metadata, warning)
}

/// Write `data` as GUPPI blocks of `block_samples` samples (the last block may be shorter),
/// channel-major (`1SFA`), 8-bit, no overlap. `template` supplies the descriptive cards;
/// `BLOCSIZE`, `OBSNCHAN`, `NPOL`, `NBITS`, `PKTFMT`, `OVERLAP` and `PKTIDX` are set here.
///
/// # Errors
/// I/O errors, or a template that (once completed) does not describe `data`.
pub fn write_guppi(
    w: &mut impl Write,
    template: &GuppiHeader,
    data: &Voltages,
    block_samples: usize,
) -> std::io::Result<()> {
    write_guppi_as(w, template, data, block_samples, SampleFormat::Int8)
}

/// [`write_guppi`] with components encoded as `sample` (8- or 16-bit integers).
///
/// # Errors
/// As [`write_guppi`], and for floats, which GUPPI does not carry.
pub fn write_guppi_as(
    w: &mut impl Write,
    template: &GuppiHeader,
    data: &Voltages,
    block_samples: usize,
    sample: SampleFormat,
) -> std::io::Result<()> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    if block_samples == 0 {
        return Err(invalid("block_samples must be positive".into()));
    }
    if sample == SampleFormat::Float32 {
        return Err(invalid(
            "GUPPI RAW holds 8- or 16-bit integers, not floats".into(),
        ));
    }
    let complex = data.nchan() != 1;
    let mut header = template.clone();
    header.set_num("OBSNCHAN", data.nchan() as f64);
    header.set_num("NPOL", (data.npol() * if complex { 2 } else { 1 }) as f64);
    header.set_num("NBITS", f64::from(sample.bits()));
    header.set_str("PKTFMT", "1SFA");
    header.set_num("OVERLAP", 0.0);
    let pktsize = header.get("PKTSIZE").and_then(parse_i64).unwrap_or(8192);
    header.set_num("PKTSIZE", pktsize as f64);
    let bpt = data.nchan() * data.npol() * sample.bytes() * if complex { 2 } else { 1 };
    let mut start = 0usize;
    let mut bytes_written = 0u64;
    let mut buf = Vec::new();
    while start < data.nsamp() {
        let n = block_samples.min(data.nsamp() - start);
        header.set_num("BLOCSIZE", (n * bpt) as f64);
        header.set_num("PKTIDX", (bytes_written / pktsize as u64) as f64);
        let params = header.params().map_err(|e| invalid(e.to_string()))?;
        let layout = Layout::dense(
            [Axis::Chan, Axis::Time, Axis::Pol],
            n,
            data.nchan(),
            data.npol(),
            complex,
            sample,
        );
        debug_assert_eq!(params.samples_per_block(), n);
        w.write_all(&header.to_bytes())?;
        buf.clear();
        for c in 0..data.nchan() {
            for t in start..start + n {
                for p in 0..data.npol() {
                    layout.encode(data.get(c, p, t), &mut buf);
                }
            }
        }
        w.write_all(&buf)?;
        bytes_written += buf.len() as u64;
        start += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(s: &str) -> String {
        format!("{s:<80}")
    }

    fn puppi_like() -> Vec<u8> {
        let cards = [
            "SRC_NAME= 'J1810+1744'",
            "OBSFREQ =             356.6875",
            "OBSBW   =                0.001",
            "PKTFMT  = '1SFA    '",
            "OBSNCHAN=                    4",
            "NPOL    =                    4",
            "NBITS   =                    8",
            "TBIN    =                0.004",
            "OVERLAP =                   64",
            "BLOCSIZE=                16384",
            "PKTIDX  =                    0",
            "PKTSIZE =                 1024",
            "END",
        ];
        cards
            .iter()
            .map(|c| card(c))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn parses_puppi_style_cards() {
        let bytes = puppi_like();
        let (h, n) = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(n, 13);
        assert_eq!(h.nbytes(), 13 * 80);
        assert_eq!(h.get("SRC_NAME"), Some("J1810+1744"));
        assert_eq!(h.get("PKTFMT"), Some("1SFA"));
        let p = h.params().unwrap();
        assert_eq!((p.nchan, p.npol, p.complex), (4, 2, true));
        assert_eq!(p.samples_per_block(), 1024);
        assert_eq!(p.overlap, 64);
        assert_eq!(p.band().sample_rate_hz, 250.0);
    }

    #[test]
    fn quoted_numbers_and_directio_padding() {
        // VEGAS writes numbers as strings; Breakthrough Listen pads headers to 512 bytes.
        let mut h = GuppiHeader::default();
        h.set_str("NPOL", "4       ");
        h.set_str("OBSNCHAN", "32");
        h.set_str("NBITS", "8");
        h.set_str("OBSBW", "-100");
        h.set_str("OBSFREQ", "1551.5625");
        h.set_str("TBIN", "3.2e-07");
        h.set_num("BLOCSIZE", 132186112.0);
        h.set_str("DIRECTIO", "1");
        let p = h.params().unwrap();
        assert_eq!(p.npol, 2);
        assert_eq!(p.band().sideband, crate::band::Sideband::Lower);
        assert!(p.directio);
        assert_eq!(h.nbytes(), 1024);
        let bytes = h.to_bytes();
        assert_eq!(bytes.len(), 1024);
        let (back, _) = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(back, h);
    }

    fn with(key: &str, value: &str) -> HeaderError {
        let bytes = puppi_like();
        let (mut h, _) = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap();
        h.set(key, CardValue::Raw(value.to_string()));
        h.params().unwrap_err()
    }

    #[test]
    fn errors_name_the_key() {
        let e = with("NBITS", "4");
        assert!(
            e.to_string().contains("NBITS") && e.to_string().contains("8"),
            "{e}"
        );
        assert!(matches!(with("NPOL", "3"), HeaderError::Invalid { key, .. } if key == "NPOL"));
        assert!(matches!(with("TBIN", "0"), HeaderError::Invalid { key, .. } if key == "TBIN"));
        assert!(
            matches!(with("PKTFMT", "'VDIF'"), HeaderError::Invalid { key, .. } if key == "PKTFMT")
        );
        assert!(
            matches!(with("OVERLAP", "1024"), HeaderError::Invalid { key, .. } if key == "OVERLAP")
        );
        assert!(matches!(
            with("OBSBW", "0.002"),
            HeaderError::Inconsistent { .. }
        ));
        assert!(matches!(
            with("BLOCSIZE", "16383"),
            HeaderError::Inconsistent { .. }
        ));
        let bytes = puppi_like();
        let (mut h, _) = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap();
        h.cards.retain(|(k, _)| k != "OBSFREQ");
        assert_eq!(
            h.params().unwrap_err(),
            HeaderError::missing(FORMAT, "OBSFREQ")
        );
    }

    #[test]
    fn malformed_headers() {
        let mut bytes = card("OBSFREQ =  1.0").into_bytes();
        bytes.extend_from_slice(card("not a card at all").as_bytes());
        let e = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("not a FITS card"), "{e}");
        let bytes = card("OBSFREQ =  1.0").into_bytes();
        let e = GuppiHeader::read_from(&mut bytes.as_slice())
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("ends inside the header"), "{e}");
        assert!(GuppiHeader::read_from(&mut [].as_slice())
            .unwrap()
            .is_none());
    }

    #[test]
    fn value_parsing() {
        assert_eq!(
            parse_value(" 'O''Brien ' / who"),
            CardValue::Str("O'Brien".into())
        );
        assert_eq!(
            parse_value("   3.5 / comment"),
            CardValue::Raw("3.5".into())
        );
        assert_eq!(format_number(3.41333333333333e-7), "3.41333333333333E-7");
        assert_eq!(format_number(356.6875), "356.6875");
    }
}
