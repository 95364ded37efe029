//! Per-frame payload compression and the `Auto` policy.
//!
//! Compressed payloads start with the raw length (`u32`, little-endian) so the
//! receiver can bound its allocation before it decompresses anything.

use bytes::Bytes;

use crate::frame::{Codec, DecodeError};

/// Which compression a link applies to the payloads it sends. Receivers decode whatever
/// the frame's flags say, so the two ends need not agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Compression {
    /// Never compress.
    Off,
    /// LZ4 block compression (`lz4_flex`, pure Rust): cheap enough for every frame.
    #[default]
    Lz4,
    /// zstd at [`crate::ConfigBuilder::zstd_level`]: better ratio, more CPU. Needs the
    /// `zstd` feature.
    Zstd,
    /// LZ4 while it pays; after a few frames that do not shrink it sends raw frames and
    /// probes again after a growing number of frames.
    Auto,
}

/// Payloads shorter than this are never worth a compressor call.
const MIN_COMPRESS: usize = 128;
/// Consecutive frames that did not shrink before `Auto` pauses.
const AUTO_MISSES: u32 = 3;
const AUTO_MIN_PAUSE: u32 = 16;
const AUTO_MAX_PAUSE: u32 = 1024;

/// Compressor state of one link.
#[derive(Debug)]
pub(crate) struct Compressor {
    mode: Compression,
    zstd_level: i32,
    misses: u32,
    pause: u32,
    skip_left: u32,
    /// Frames `Auto` sent raw without trying, while paused.
    pub(crate) skipped: u64,
}

impl Compressor {
    pub(crate) fn new(mode: Compression, zstd_level: i32) -> Compressor {
        Compressor {
            mode,
            zstd_level,
            misses: 0,
            pause: AUTO_MIN_PAUSE,
            skip_left: 0,
            skipped: 0,
        }
    }

    /// Whether `Auto` is currently sending raw frames without trying.
    #[cfg(test)]
    fn paused(&self) -> bool {
        self.skip_left > 0
    }

    /// Encodes a raw payload; returns the codec used and the wire bytes.
    pub(crate) fn compress(&mut self, raw: Vec<u8>) -> (Codec, Vec<u8>) {
        if raw.len() < MIN_COMPRESS {
            return (Codec::Raw, raw);
        }
        let codec = match self.mode {
            Compression::Off => return (Codec::Raw, raw),
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd => Codec::Zstd,
            Compression::Auto if self.skip_left > 0 => {
                self.skip_left -= 1;
                self.skipped += 1;
                return (Codec::Raw, raw);
            }
            Compression::Auto => Codec::Lz4,
        };
        let packed = compress_with(codec, &raw, self.zstd_level);
        let shrank = packed
            .as_ref()
            .is_some_and(|p| p.len() * 8 <= raw.len() * 7);
        if self.mode == Compression::Auto {
            self.account(shrank);
        }
        // A saving of a few bytes (say, zeros in record headers among random data) is
        // not worth the receiver's decompression.
        match packed {
            Some(p) if p.len() + raw.len() / 32 < raw.len() => (codec, p),
            _ => (Codec::Raw, raw),
        }
    }

    fn account(&mut self, shrank: bool) {
        if shrank {
            self.misses = 0;
            self.pause = AUTO_MIN_PAUSE;
            return;
        }
        self.misses += 1;
        if self.misses >= AUTO_MISSES {
            self.skip_left = self.pause;
            self.pause = (self.pause * 2).min(AUTO_MAX_PAUSE);
            // The probe after a pause decides alone: one more miss pauses again.
            self.misses = AUTO_MISSES - 1;
        }
    }
}

fn compress_with(codec: Codec, raw: &[u8], zstd_level: i32) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len() / 2 + 16);
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    match codec {
        Codec::Raw => return None,
        Codec::Lz4 => out.extend_from_slice(&lz4_flex::block::compress(raw)),
        #[cfg(feature = "zstd")]
        Codec::Zstd => out.extend_from_slice(&zstd::bulk::compress(raw, zstd_level).ok()?),
        #[cfg(not(feature = "zstd"))]
        Codec::Zstd => {
            let _ = zstd_level;
            return None;
        }
    }
    Some(out)
}

/// Decodes a payload as it came off the wire, refusing to expand past `max` bytes.
///
/// # Errors
/// [`DecodeError::Truncated`], [`DecodeError::PayloadTooLong`],
/// [`DecodeError::Decompress`] or [`DecodeError::UnsupportedCodec`].
pub fn decompress(codec: Codec, wire: &[u8], max: usize) -> Result<Bytes, DecodeError> {
    let (len, raw) = match codec {
        Codec::Raw => return Ok(Bytes::copy_from_slice(wire)),
        Codec::Lz4 => {
            let (len, body) = split_len(wire, max)?;
            let raw = lz4_flex::block::decompress(body, len)
                .map_err(|e| DecodeError::Decompress(e.to_string()))?;
            (len, raw)
        }
        #[cfg(feature = "zstd")]
        Codec::Zstd => {
            let (len, body) = split_len(wire, max)?;
            let raw = zstd::bulk::decompress(body, len)
                .map_err(|e| DecodeError::Decompress(e.to_string()))?;
            (len, raw)
        }
        #[cfg(not(feature = "zstd"))]
        Codec::Zstd => return Err(DecodeError::UnsupportedCodec(codec)),
    };
    if raw.len() != len {
        return Err(DecodeError::Decompress(format!(
            "expanded to {} bytes, header said {len}",
            raw.len()
        )));
    }
    Ok(Bytes::from(raw))
}

/// The raw-length prefix of a compressed payload, checked against `max`, and the rest.
fn split_len(wire: &[u8], max: usize) -> Result<(usize, &[u8]), DecodeError> {
    let (len, body) = wire
        .split_first_chunk::<4>()
        .ok_or(DecodeError::Truncated)?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > max {
        return Err(DecodeError::PayloadTooLong {
            len: len as u64,
            max: max as u64,
        });
    }
    Ok((len, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn lz4_and_zstd_round_trip_and_fall_back_to_raw() {
        let modes: &[Compression] = if cfg!(feature = "zstd") {
            &[Compression::Lz4, Compression::Zstd]
        } else {
            &[Compression::Lz4]
        };
        for &mode in modes {
            let mut c = Compressor::new(mode, 3);
            let text = b"the quick brown fox ".repeat(100);
            let (codec, wire) = c.compress(text.clone());
            assert_ne!(codec, Codec::Raw);
            assert!(wire.len() < text.len() / 4);
            assert_eq!(decompress(codec, &wire, 1 << 20).unwrap(), text);
            let random = noise(4000, 9);
            assert_eq!(c.compress(random.clone()), (Codec::Raw, random));
        }
    }

    #[test]
    fn auto_pauses_on_incompressible_data_and_probes_again() {
        let mut c = Compressor::new(Compression::Auto, 3);
        let mut tried = 0;
        for i in 0..AUTO_MISSES {
            let (codec, _) = c.compress(noise(1000, u64::from(i) + 1));
            assert_eq!(codec, Codec::Raw);
            tried += 1;
        }
        assert_eq!(tried, AUTO_MISSES);
        assert!(c.paused());
        // While paused even compressible data goes raw...
        let text = b"abcd".repeat(500);
        for _ in 0..AUTO_MIN_PAUSE {
            assert_eq!(c.compress(text.clone()).0, Codec::Raw);
        }
        // ...and the probe after the pause finds it compressible and resumes.
        assert!(!c.paused());
        assert_eq!(c.compress(text.clone()).0, Codec::Lz4);
        assert_eq!(c.pause, AUTO_MIN_PAUSE);
    }

    #[test]
    fn auto_backs_off_exponentially_while_data_stays_incompressible() {
        let mut c = Compressor::new(Compression::Auto, 3);
        let mut pauses = Vec::new();
        let mut was_paused = false;
        for i in 0..5000u64 {
            c.compress(noise(1000, i + 1));
            if c.paused() && !was_paused {
                pauses.push(c.skip_left);
            }
            was_paused = c.paused();
        }
        assert_eq!(&pauses[..4], &[16, 32, 64, 128]);
        assert!(pauses.iter().all(|&p| p <= AUTO_MAX_PAUSE));
    }

    #[test]
    fn hostile_compressed_payloads_are_errors() {
        assert_eq!(
            decompress(Codec::Lz4, &[1, 2], 100),
            Err(DecodeError::Truncated)
        );
        let mut big = (1000u32).to_le_bytes().to_vec();
        big.extend_from_slice(&[0; 8]);
        assert!(matches!(
            decompress(Codec::Lz4, &big, 100),
            Err(DecodeError::PayloadTooLong { .. })
        ));
        let mut c = Compressor::new(Compression::Lz4, 3);
        let (codec, mut wire) = c.compress(b"xyzw".repeat(100));
        wire[0] = wire[0].wrapping_add(1);
        assert!(matches!(
            decompress(codec, &wire, 1 << 20),
            Err(DecodeError::Decompress(_))
        ));
        for junk in 0..64u64 {
            let j = noise(40, junk + 100);
            let _ = decompress(Codec::Lz4, &j, 1 << 16);
            let _ = decompress(Codec::Zstd, &j, 1 << 16);
        }
    }
}
