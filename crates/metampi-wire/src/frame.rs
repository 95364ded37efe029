//! Frame header codec: the 48-byte header, its checks and the stream decoder.
//!
//! Layout (all integers little-endian, like the rank-side envelope):
//!
//! | offset | size | field | meaning |
//! |---:|---:|---|---|
//! | 0 | 4 | magic | `"MPWF"` |
//! | 4 | 1 | version | [`VERSION`] |
//! | 5 | 1 | kind | [`FrameKind`] |
//! | 6 | 1 | flags | bits 0–1: [`Codec`] of the payload; bit 2: failover; bit 3: payload unchecked; others zero |
//! | 7 | 1 | link | index of the link inside its bundle |
//! | 8 | 4 | connection | connection id both ends configured |
//! | 12 | 8 | seq | sequence number of a `Data` frame (0 otherwise) |
//! | 20 | 8 | ack | next sequence number the sender of this frame expects |
//! | 28 | 8 | credit | absolute flow-control limit granted to the peer |
//! | 36 | 4 | len | payload bytes that follow the header |
//! | 40 | 4 | header crc | CRC32C of bytes 0..40 |
//! | 44 | 4 | frame crc | CRC32C of bytes 0..44 followed by the payload (of bytes 0..44 alone when the payload is unchecked) |
//!
//! The header has its own CRC so that a corrupted `len` is caught at once: without it
//! the decoder would wait for up to `len` bytes that never come before it could
//! tell the frame was bad.
//!
//! A sender whose link is configured without payload checksums (TCP's own checksum
//! trusted, or TLS, whose record authentication already covers every byte) sets the
//! *unchecked* flag: its frame checksum then covers the header alone. The flag sits
//! under the header checksum, so a flipped bit cannot turn checking off.

use bytes::{Buf, Bytes, BytesMut};
use crc_fast::{CrcAlgorithm, Digest};
use thiserror::Error;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"MPWF";
/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 48;
/// Largest payload any decoder accepts, whatever its configuration; bounds the memory a
/// hostile peer can make us allocate for one frame.
pub const MAX_PAYLOAD: usize = 16 << 20;

const FLAG_CODEC_MASK: u8 = 0b11;
const FLAG_FAILOVER: u8 = 0b100;
const FLAG_UNCHECKED: u8 = 0b1000;

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Carries records (message fragments); sequenced and acknowledged.
    Data = 1,
    /// Acknowledgement and credit update only.
    Ack = 2,
    /// Like `Ack`, and asks the peer to resend everything from `ack` on.
    Nack = 3,
    /// First frame after the transport reconnected; like `Nack`.
    Resume = 4,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Data,
            2 => FrameKind::Ack,
            3 => FrameKind::Nack,
            4 => FrameKind::Resume,
            _ => return None,
        })
    }
}

/// How a frame's payload is encoded on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Codec {
    /// Payload is the record bytes themselves.
    #[default]
    Raw = 0,
    /// `u32` raw length, then an LZ4 block.
    Lz4 = 1,
    /// `u32` raw length, then a zstd frame.
    Zstd = 2,
}

impl Codec {
    fn from_bits(v: u8) -> Option<Codec> {
        Some(match v {
            0 => Codec::Raw,
            1 => Codec::Lz4,
            2 => Codec::Zstd,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the frame is for.
    pub kind: FrameKind,
    /// Encoding of the payload.
    pub codec: Codec,
    /// The records were first sent on a bundle link that has since died; they are
    /// outside the flow-control credit (so they can always reach the receiver, which
    /// may be waiting for exactly them before it can free any credit).
    pub failover: bool,
    /// The frame checksum covers the header only, not the payload (the sender's link
    /// runs without payload checksums).
    pub unchecked: bool,
    /// Link index inside the bundle.
    pub link: u8,
    /// Connection id both ends agreed on.
    pub connection: u32,
    /// Sequence number (`Data` frames only).
    pub seq: u64,
    /// Next sequence number the sender expects from us (cumulative acknowledgement).
    pub ack: u64,
    /// Absolute credit limit granted to the receiver of this frame.
    pub credit: u64,
    /// Payload length in bytes.
    pub len: u32,
}

/// Why bytes could not be decoded. Bytes from the network end up here, never in a panic.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer does not start with [`MAGIC`].
    #[error("frame does not start with the magic bytes")]
    BadMagic,
    /// The header's own checksum does not match.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The checksum over header and payload does not match.
    #[error("frame checksum mismatch")]
    FrameChecksum,
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Flag bits this version does not define.
    #[error("unknown frame flags {0:#04x}")]
    UnknownFlags(u8),
    /// A payload longer than the decoder accepts.
    #[error("payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLong {
        /// Announced length.
        len: u64,
        /// Limit in force.
        max: u64,
    },
    /// The payload ends inside a record or a length prefix.
    #[error("payload truncated")]
    Truncated,
    /// An unknown record kind inside a payload.
    #[error("unknown record kind {0}")]
    UnknownRecord(u8),
    /// Reserved bits that must be zero were set.
    #[error("reserved field is not zero")]
    Reserved,
    /// A fragment that does not lie inside its message.
    #[error("fragment at {offset}+{len} lies outside a message of {total} bytes")]
    FragmentOutOfBounds {
        /// Fragment offset.
        offset: u64,
        /// Fragment length.
        len: u64,
        /// Message length.
        total: u64,
    },
    /// The payload uses a compression this build cannot decode.
    #[error("payload compression {0:?} is not supported by this build")]
    UnsupportedCodec(Codec),
    /// The compressed payload is malformed or does not expand to its announced size.
    #[error("payload does not decompress: {0}")]
    Decompress(String),
}

/// Result of looking at the front of a byte buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// More bytes are needed; at least this many in total.
    Incomplete(usize),
    /// A whole, checked frame and how many bytes it used.
    Frame {
        /// The header.
        header: Header,
        /// The payload as it was on the wire (possibly compressed).
        payload: &'a [u8],
        /// Bytes of `buf` this frame used.
        used: usize,
    },
}

/// Decodes one frame from the front of `buf`, accepting payloads of at most `max_payload`
/// bytes (capped at [`MAX_PAYLOAD`]).
///
/// # Errors
/// Any [`DecodeError`] about the header or the checksums. The payload itself is not
/// interpreted here (see [`crate::record::decode_payload`]).
pub fn decode(buf: &[u8], max_payload: usize) -> Result<Decoded<'_>, DecodeError> {
    let max_payload = max_payload.min(MAX_PAYLOAD);
    // Check the magic as soon as it is there, so a resyncing reader gives up early.
    let have = buf.len().min(MAGIC.len());
    if buf[..have] != MAGIC[..have] {
        return Err(DecodeError::BadMagic);
    }
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(Decoded::Incomplete(HEADER_LEN));
    };
    if crc32(&h[..40]) != le_u32(h, 40) {
        return Err(DecodeError::HeaderChecksum);
    }
    let header = parse_header(h, max_payload)?;
    let end = HEADER_LEN + header.len as usize;
    let Some(payload) = buf.get(HEADER_LEN..end) else {
        return Ok(Decoded::Incomplete(end));
    };
    let crc = if header.unchecked {
        crc32(&h[..44])
    } else {
        crc32_parts(&h[..44], &[payload])
    };
    if crc != le_u32(h, 44) {
        return Err(DecodeError::FrameChecksum);
    }
    Ok(Decoded::Frame {
        header,
        payload,
        used: end,
    })
}

/// Whether `buf` starts with a whole frame header whose magic and header checksum hold
/// (its fields are not checked). Looks at 48 bytes at most.
pub(crate) fn starts_with_header(buf: &[u8]) -> bool {
    buf.get(..HEADER_LEN)
        .is_some_and(|h| h[..4] == MAGIC && crc32(&h[..40]) == le_u32(h, 40))
}

/// The whole length (header and payload) of the frame whose checked header starts
/// `buf`; `None` where `buf` does not start with one (too short, or not a header: the
/// decoder then resynchronises) or its payload would exceed [`MAX_PAYLOAD`]. For a
/// reader that cuts the stream at frame boundaries before the decoder sees it.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    if !starts_with_header(buf) {
        return None;
    }
    let len = le_u32(buf, 36) as usize;
    (len <= MAX_PAYLOAD).then_some(HEADER_LEN + len)
}

/// CRC-32C (Castagnoli, "iSCSI"), the frames' checksum.
fn crc32(b: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(b)
}

/// CRC-32C of `head`, then `parts`, one after the other.
fn crc32_parts<P: AsRef<[u8]>>(head: &[u8], parts: &[P]) -> u32 {
    let mut d = Digest::new(CrcAlgorithm::Crc32Iscsi);
    d.update(head);
    for p in parts {
        d.update(p.as_ref());
    }
    d.finalize() as u32
}

fn parse_header(h: &[u8], max_payload: usize) -> Result<Header, DecodeError> {
    if h[4] != VERSION {
        return Err(DecodeError::UnsupportedVersion(h[4]));
    }
    let kind = FrameKind::from_u8(h[5]).ok_or(DecodeError::UnknownKind(h[5]))?;
    let flags = h[6];
    if flags & !(FLAG_CODEC_MASK | FLAG_FAILOVER | FLAG_UNCHECKED) != 0 {
        return Err(DecodeError::UnknownFlags(flags));
    }
    let codec =
        Codec::from_bits(flags & FLAG_CODEC_MASK).ok_or(DecodeError::UnknownFlags(flags))?;
    let len = le_u32(h, 36);
    if len as usize > max_payload {
        return Err(DecodeError::PayloadTooLong {
            len: len.into(),
            max: max_payload as u64,
        });
    }
    let failover = flags & FLAG_FAILOVER != 0;
    let unchecked = flags & FLAG_UNCHECKED != 0;
    if kind != FrameKind::Data && (len != 0 || codec != Codec::Raw || failover || unchecked) {
        // Control frames carry nothing; a payload there is a bug or an attack.
        return Err(DecodeError::Reserved);
    }
    Ok(Header {
        kind,
        codec,
        failover,
        unchecked,
        link: h[7],
        connection: le_u32(h, 8),
        seq: le_u64(h, 12),
        ack: le_u64(h, 20),
        credit: le_u64(h, 28),
        len,
    })
}

/// Appends one frame (header and payload) to `out`. `header.len` is ignored: the
/// payload's own length is written.
///
/// # Panics
/// If `payload` is longer than [`MAX_PAYLOAD`]; callers build payloads from their
/// configuration, which is validated to stay below it.
pub fn encode(header: &Header, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&encode_header(header, payload));
    out.extend_from_slice(payload);
}

/// The header of a frame carrying `payload`, checksums included: the frame is
/// this followed by the payload, which can then be written from where it is.
///
/// # Panics
/// When `payload` is longer than [`MAX_PAYLOAD`].
pub fn encode_header(header: &Header, payload: &[u8]) -> [u8; HEADER_LEN] {
    encode_header_parts(header, &[payload])
}

/// [`encode_header`] for a payload that is the concatenation of `parts`: the frame
/// is the header followed by the parts, written with one vectored write (the
/// payload is never gathered into one buffer).
///
/// # Panics
/// When the parts add up to more than [`MAX_PAYLOAD`].
pub fn encode_header_parts<P: AsRef<[u8]>>(header: &Header, parts: &[P]) -> [u8; HEADER_LEN] {
    let len: usize = parts.iter().map(|p| p.as_ref().len()).sum();
    assert!(len <= MAX_PAYLOAD, "payload over MAX_PAYLOAD");
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = header.kind as u8;
    h[6] = header.codec as u8
        | if header.failover { FLAG_FAILOVER } else { 0 }
        | if header.unchecked { FLAG_UNCHECKED } else { 0 };
    h[7] = header.link;
    h[8..12].copy_from_slice(&header.connection.to_le_bytes());
    h[12..20].copy_from_slice(&header.seq.to_le_bytes());
    h[20..28].copy_from_slice(&header.ack.to_le_bytes());
    h[28..36].copy_from_slice(&header.credit.to_le_bytes());
    h[36..40].copy_from_slice(&(len as u32).to_le_bytes());
    let hcrc = crc32(&h[..40]);
    h[40..44].copy_from_slice(&hcrc.to_le_bytes());
    let fcrc = if header.unchecked {
        crc32(&h[..44])
    } else {
        crc32_parts(&h[..44], parts)
    };
    h[44..48].copy_from_slice(&fcrc.to_le_bytes());
    h
}

/// Smallest read [`reserve_for_frames`] asks for into a buffer with nothing pending.
const MIN_READ: usize = 16 << 10;

/// Readies `buf` for a read from a byte stream whose frames are split off its front
/// (`split_to` + `freeze`) and handed out without a copy; returns how many bytes to
/// read at most. `rest` is what the frame at the front still lacks (0 when `buf` is
/// empty); `frame_max` the largest frame expected (a hint: larger ones still work).
///
/// Split-off frames keep their allocation alive, so the buffer cannot grow in place:
/// a frame that a read leaves unfinished at the end of an allocation would have to be
/// copied into the next one. So reads are sized to leave room for one whole frame
/// after them, a new allocation (of about four frames) is started when the buffer is
/// empty or cannot finish its frame, and near the end of an allocation only the rest
/// of the current frame is read. In steady streaming nothing is copied but the odd
/// partial header.
pub fn reserve_for_frames(buf: &mut BytesMut, rest: usize, frame_max: usize) -> usize {
    reserve_for_frames_within(buf, rest, frame_max, usize::MAX).expect("no bound on memory")
}

/// [`reserve_for_frames`] where memory is rationed: a new allocation (or a reclaimed one)
/// is at most `most` bytes, smaller than the usual four frames where that is all there
/// is; `None`, with nothing allocated, when even the least that works (the frame in
/// progress and one more) is larger.
pub fn reserve_for_frames_within(
    buf: &mut BytesMut,
    rest: usize,
    frame_max: usize,
    most: usize,
) -> Option<usize> {
    let spare = buf.capacity() - buf.len();
    let need = if buf.is_empty() {
        frame_max + MIN_READ
    } else {
        rest.max(1)
    };
    if spare < need {
        let least = buf.len() + rest + frame_max + MIN_READ;
        if least > most {
            return None;
        }
        let alloc = (4 * frame_max).clamp(64 << 10, 4 << 20).min(most);
        let want = alloc.max(least);
        // An allocation no split-off frame uses any more is reused. Otherwise a new
        // one gets a copy of the unfinished frame only (nothing when empty):
        // `reserve` would carry the consumed bytes in front of it along.
        if !buf.try_reclaim(want - buf.len()) {
            let mut fresh = BytesMut::with_capacity(want);
            fresh.extend_from_slice(buf);
            *buf = fresh;
        }
    }
    let spare = buf.capacity() - buf.len();
    Some(if spare >= rest + frame_max + MIN_READ.min(frame_max) {
        spare - frame_max
    } else {
        rest.max(1).min(spare)
    })
}

/// Reassembles frames from a byte stream that may be split anywhere and may contain
/// garbage (corruption, lost bytes, the tail of a stream cut by a reconnect).
///
/// On any header or checksum failure it drops bytes up to the next occurrence of the
/// magic and tries again, so one bad frame costs that frame only. A frame that waits for
/// bytes lost inside the stream is not detected here (only silence tells); the owner
/// gives it up with [`StreamDecoder::skip_front`].
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Bytes not decoded yet; a decoded frame is split off the front, so its
    /// payload is handed out without a copy.
    buf: BytesMut,
    max_payload: usize,
}

/// One step of [`StreamDecoder::next_frame`].
#[derive(Debug, PartialEq, Eq)]
pub enum StreamItem {
    /// A checked frame (its payload shares the decoder's buffer, no copy).
    Frame(Header, Bytes),
    /// Bytes that were skipped, and why the first skip happened.
    Skipped(usize, DecodeError),
}

impl StreamDecoder {
    /// A decoder accepting payloads of at most `max_payload` bytes.
    pub fn new(max_payload: usize) -> StreamDecoder {
        StreamDecoder {
            buf: BytesMut::new(),
            max_payload: max_payload.min(MAX_PAYLOAD),
        }
    }

    /// Adds bytes from the stream (a copy; [`StreamDecoder::read_with`] reads
    /// straight into the decoder's buffer instead).
    pub fn push(&mut self, bytes: &[u8]) {
        self.read_with(|buf, _| buf.extend_from_slice(bytes));
    }

    /// Adds `chunk` of the stream, taking the buffer over where nothing is buffered (no
    /// copy: frames are split off it as off the decoder's own), else appending it.
    pub fn adopt(&mut self, chunk: BytesMut) {
        if self.buf.is_empty() {
            self.buf = chunk;
        } else {
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// Lets `read` append bytes from the stream to the decoder's own buffer, so that
    /// they are not copied again: frames and their payloads are later split off it.
    /// `read` gets the buffer and how many bytes to read at most (the buffer has that
    /// much spare capacity; see [`reserve_for_frames`]). It should only append:
    /// whatever it does, the decoder stays consistent and never panics.
    pub fn read_with<T>(&mut self, read: impl FnOnce(&mut BytesMut, usize) -> T) -> T {
        let rest = self.rest();
        let limit = reserve_for_frames(&mut self.buf, rest, HEADER_LEN + self.max_payload);
        read(&mut self.buf, limit)
    }

    /// Bytes the frame at the front still lacks, as far as its header tells; 0 when
    /// nothing is buffered.
    pub fn rest(&self) -> usize {
        let have = self.buf.len();
        if have == 0 {
            return 0;
        }
        if !starts_with_header(&self.buf) {
            return HEADER_LEN.saturating_sub(have).max(1);
        }
        let len = le_u32(&self.buf, 36) as usize;
        // A length over the limit is refused when decoded; do not reserve for it.
        let total = HEADER_LEN + len.min(self.max_payload);
        total.saturating_sub(have).max(1)
    }

    /// The buffered bytes from `from` on (the bytes a read just appended).
    pub(crate) fn buffered_from(&self, from: usize) -> &[u8] {
        self.buf.get(from..).unwrap_or_default()
    }

    /// Forgets buffered bytes (the stream they came from is gone).
    pub fn reset(&mut self) {
        self.buf.clear();
    }

    /// Bytes buffered and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Gives up the frame at the front, which waits for bytes that are not coming (lost
    /// inside the stream): drops its first byte, so that the next
    /// [`StreamDecoder::next_frame`] resyncs on the next magic after it, which may lie
    /// inside the bytes given up. Returns the bytes dropped (0 when none are buffered).
    pub fn skip_front(&mut self) -> usize {
        let n = self.buf.len().min(1);
        self.buf.advance(n);
        n
    }

    /// The next frame or skipped run, or `None` when more bytes are needed.
    pub fn next_frame(&mut self) -> Option<StreamItem> {
        let rest = &self.buf[..];
        if rest.is_empty() {
            return None;
        }
        match decode(rest, self.max_payload) {
            Ok(Decoded::Incomplete(_)) => None,
            Ok(Decoded::Frame {
                header,
                payload,
                used,
            }) => {
                let at = payload.as_ptr() as usize - rest.as_ptr() as usize;
                let len = payload.len();
                let frame = self.buf.split_to(used).freeze();
                Some(StreamItem::Frame(header, frame.slice(at..at + len)))
            }
            Err(e) => {
                // A frame whose header checked out but whose payload did not had a
                // trustworthy length: skip all of it rather than scanning its payload.
                let skip = match e {
                    DecodeError::FrameChecksum => {
                        HEADER_LEN + le_u32(&rest[..HEADER_LEN], 36) as usize
                    }
                    _ => 1 + find_magic(&rest[1..]).unwrap_or(rest.len() - 1),
                };
                let skip = skip.min(self.buf.len());
                self.buf.advance(skip);
                Some(StreamItem::Skipped(skip, e))
            }
        }
    }
}

/// Position of the first possible start of [`MAGIC`] in `buf`, including a partial
/// magic at its very end.
fn find_magic(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find(|&i| {
        let n = (buf.len() - i).min(MAGIC.len());
        buf[i..i + n] == MAGIC[..n]
    })
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum is CRC-32C (its standard check value), whole or in parts.
    #[test]
    fn checksum_is_crc32c() {
        assert_eq!(crc32(b"123456789"), 0xE306_9283);
        assert_eq!(crc32_parts(b"1234", &[&b"56"[..], b"789"]), 0xE306_9283);
    }

    fn header(kind: FrameKind, len: u32) -> Header {
        Header {
            kind,
            codec: Codec::Raw,
            failover: false,
            unchecked: false,
            link: 3,
            connection: 0xdead_beef,
            seq: 7,
            ack: 5,
            credit: 1 << 40,
            len,
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let mut out = Vec::new();
        encode(&header(FrameKind::Data, 3), b"abc", &mut out);
        assert_eq!(out.len(), HEADER_LEN + 3);
        assert_eq!(&out[..4], b"MPWF");
        assert_eq!(out[5], FrameKind::Data as u8);
        assert_eq!(le_u64(&out, 12), 7);
        match decode(&out, 1024).unwrap() {
            Decoded::Frame {
                header: h,
                payload,
                used,
            } => {
                assert_eq!(h, header(FrameKind::Data, 3));
                assert_eq!(payload, b"abc");
                assert_eq!(used, out.len());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn frame_len_reads_whole_headers_only() {
        let mut out = Vec::new();
        encode(&header(FrameKind::Data, 5), b"hello", &mut out);
        encode(&header(FrameKind::Ack, 0), b"", &mut out);
        assert_eq!(frame_len(&out), Some(HEADER_LEN + 5));
        assert_eq!(frame_len(&out[HEADER_LEN + 5..]), Some(HEADER_LEN));
        // A header cut short, or one with a bit flipped, says nothing.
        assert_eq!(frame_len(&out[..HEADER_LEN - 1]), None);
        let mut bad = out.clone();
        bad[37] ^= 1;
        assert_eq!(frame_len(&bad), None);
        assert_eq!(frame_len(&out[1..]), None);
    }

    #[test]
    fn every_prefix_is_incomplete_and_every_bit_flip_is_caught() {
        let mut out = Vec::new();
        encode(&header(FrameKind::Data, 5), b"hello", &mut out);
        for n in 0..out.len() {
            assert!(matches!(
                decode(&out[..n], 1024),
                Ok(Decoded::Incomplete(_))
            ));
        }
        for bit in 0..out.len() * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(decode(&bad, 1024), Ok(Decoded::Frame { .. })),
                "flip of bit {bit} accepted"
            );
        }
    }

    /// An unchecked frame's checksum leaves its payload out: a changed payload byte
    /// passes, while every header bit, the flag among them, is still caught.
    #[test]
    fn unchecked_frames_check_the_header_only() {
        let h = Header {
            unchecked: true,
            ..header(FrameKind::Data, 5)
        };
        let mut out = Vec::new();
        encode(&h, b"hello", &mut out);
        assert_eq!(out[6] & FLAG_UNCHECKED, FLAG_UNCHECKED);
        assert_eq!(le_u32(&out, 44), crc32(&out[..44]));
        match decode(&out, 1024).unwrap() {
            Decoded::Frame { header, .. } => assert_eq!(header, h),
            other => panic!("unexpected {other:?}"),
        }
        for bit in 0..HEADER_LEN * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(decode(&bad, 1024), Ok(Decoded::Frame { .. })),
                "flip of header bit {bit} accepted"
            );
        }
        let mut changed = out.clone();
        changed[HEADER_LEN] ^= 1;
        match decode(&changed, 1024).unwrap() {
            Decoded::Frame { payload, .. } => assert_eq!(payload, b"iello"),
            other => panic!("unexpected {other:?}"),
        }
        // The same frame checked differs only in the flag and the checksums.
        let mut checked = Vec::new();
        encode(&header(FrameKind::Data, 5), b"hello", &mut checked);
        assert_eq!(checked[..6], out[..6]);
        assert_eq!(checked[7..40], out[7..40]);
        assert_eq!(checked[HEADER_LEN..], out[HEADER_LEN..]);
        // Control frames never carry the flag.
        let mut ack = Vec::new();
        encode(
            &Header {
                unchecked: true,
                ..header(FrameKind::Ack, 0)
            },
            &[],
            &mut ack,
        );
        assert_eq!(decode(&ack, 99), Err(DecodeError::Reserved));
    }

    #[test]
    fn rejects_oversized_payload_and_payload_on_control_frames() {
        let mut out = Vec::new();
        encode(&header(FrameKind::Data, 100), &[0; 100], &mut out);
        assert_eq!(
            decode(&out, 99),
            Err(DecodeError::PayloadTooLong { len: 100, max: 99 })
        );
        let mut out = Vec::new();
        encode(&header(FrameKind::Ack, 1), &[0], &mut out);
        assert_eq!(decode(&out, 99), Err(DecodeError::Reserved));
    }

    #[test]
    fn stream_decoder_resyncs_after_garbage_and_corruption() {
        let mut a = Vec::new();
        encode(&header(FrameKind::Data, 2), b"one", &mut a);
        let mut b = Vec::new();
        encode(&header(FrameKind::Data, 3), b"two", &mut b);
        let mut c = Vec::new();
        encode(&header(FrameKind::Data, 5), b"three", &mut c);
        let mut stream = b"junkMPW".to_vec();
        stream.extend_from_slice(&a);
        let corrupt_at = stream.len() + HEADER_LEN + 1;
        stream.extend_from_slice(&b);
        stream[corrupt_at] ^= 0x10;
        stream.extend_from_slice(&c[..10]);
        stream.extend_from_slice(&c);

        let mut d = StreamDecoder::new(1024);
        let mut frames = Vec::new();
        let mut skipped = Vec::new();
        // Feed one byte at a time: frames may be split anywhere.
        for byte in &stream {
            d.push(std::slice::from_ref(byte));
            while let Some(item) = d.next_frame() {
                match item {
                    StreamItem::Frame(_, p) => frames.push(p),
                    StreamItem::Skipped(_, e) => skipped.push(e),
                }
            }
        }
        assert_eq!(frames, vec![b"one".to_vec(), b"three".to_vec()]);
        assert!(skipped.contains(&DecodeError::FrameChecksum));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn skip_front_resyncs_on_a_frame_inside_the_given_up_one() {
        // The first frame lost 500 bytes of its payload, so its header announces more than
        // is there and the whole second frame sits inside its announced length.
        let mut a = Vec::new();
        encode(&header(FrameKind::Data, 0), &[7u8; 2000], &mut a);
        a.drain(HEADER_LEN + 100..HEADER_LEN + 600);
        let mut b = Vec::new();
        encode(&header(FrameKind::Data, 0), b"inside", &mut b);
        let mut d = StreamDecoder::new(4096);
        d.push(&a);
        d.push(&b);
        assert_eq!(d.next_frame(), None, "waits for the announced length");
        assert_eq!(d.skip_front(), 1);
        let mut items = Vec::new();
        while let Some(item) = d.next_frame() {
            items.push(item);
        }
        assert_eq!(
            items,
            vec![
                StreamItem::Skipped(a.len() - 1, DecodeError::BadMagic),
                StreamItem::Frame(header(FrameKind::Data, 6), Bytes::from_static(b"inside")),
            ]
        );
        assert_eq!((d.buffered(), d.skip_front()), (0, 0));
    }

    /// A stream of frames of mixed sizes read into the decoder's own buffer in reads
    /// of whatever size the transport has (here pseudo-random, never more than the
    /// decoder asks for): every frame comes out intact, and the only bytes copied
    /// from one allocation to the next are partial headers.
    #[test]
    fn reading_into_the_decoder_copies_no_payload() {
        let max = 256 << 10;
        let mut stream = Vec::new();
        let mut sizes = Vec::new();
        let mut x = 12345u64;
        for i in 0..300u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = match x >> 60 {
                0..=9 => max,
                10..=12 => (x >> 20) as usize % max,
                _ => (x >> 20) as usize % 300,
            };
            let payload: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            encode(&header(FrameKind::Data, 0), &payload, &mut stream);
            sizes.push(len);
        }
        let mut d = StreamDecoder::new(max);
        let (mut at, mut copied, mut frames, mut moves) = (0, 0, Vec::new(), 0);
        // Where the buffered bytes ended after the last read: splitting frames off the
        // front does not move the end, a new allocation does.
        let mut end = 0usize;
        while at < stream.len() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let have = stream.len() - at;
            let kept = d.buffered();
            let (moved, n) = d.read_with(|buf, limit| {
                let moved = buf.as_ptr() as usize + buf.len() != end;
                // A read returns what the socket has, up to what was asked.
                let n = limit.min(have).min(1 + (x >> 40) as usize % (300 << 10));
                assert!(buf.capacity() - buf.len() >= n);
                buf.extend_from_slice(&stream[at..at + n]);
                end = buf.as_ptr() as usize + buf.len();
                (moved, n)
            });
            moves += usize::from(moved);
            if moved {
                copied += kept;
                assert!(kept < HEADER_LEN, "{kept} bytes of a frame copied");
            }
            at += n;
            while let Some(item) = d.next_frame() {
                match item {
                    StreamItem::Frame(_, p) => frames.push(p),
                    StreamItem::Skipped(n, e) => panic!("skipped {n}: {e}"),
                }
            }
        }
        assert_eq!(frames.len(), sizes.len());
        for (i, (f, &len)) in frames.iter().zip(&sizes).enumerate() {
            assert_eq!(f.len(), len);
            assert!(f
                .iter()
                .enumerate()
                .all(|(k, &b)| b == (k as u32 ^ i as u32) as u8));
        }
        assert!(copied < 300 * HEADER_LEN);
        // About four frames per allocation.
        assert!(moves < 300 / 2, "{moves} allocations");
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn reserve_for_frames_sizes_reads_to_finish_frames_inside_one_allocation() {
        let f = 1000;
        let mut buf = BytesMut::new();
        // Empty: a fresh allocation, and room for one more frame kept after the read.
        let n = reserve_for_frames(&mut buf, 0, f);
        assert_eq!(buf.capacity() - n, f);
        assert!(n >= MIN_READ);
        // Near the end of the allocation only the rest of the current frame.
        buf.extend_from_slice(&vec![0u8; n + f - 300]);
        let _ = buf.split_to(n + f - 300 - 100);
        assert_eq!(reserve_for_frames(&mut buf, 250, f), 250);
        // A frame that cannot finish here moves (with its 100 bytes) to a new one.
        let n = reserve_for_frames(&mut buf, 900, f);
        assert!(buf.capacity() >= 100 + 900 + f && n >= 900);
    }

    #[test]
    fn rationed_reservations_shrink_to_what_is_left_or_allocate_nothing() {
        let f = 256 << 10;
        let least = f + MIN_READ;
        // Too little left for one frame and the read after it: nothing is allocated.
        let mut buf = BytesMut::new();
        assert_eq!(reserve_for_frames_within(&mut buf, 0, f, least - 1), None);
        assert_eq!(buf.capacity(), 0);
        // Less than the usual four frames: an allocation of what is left.
        let n = reserve_for_frames_within(&mut buf, 0, f, 2 * f).expect("room for one");
        assert_eq!(buf.capacity(), 2 * f);
        assert_eq!(n, f);
        // Room already there costs nothing more, whatever is left.
        buf.extend_from_slice(&[0u8; 100]);
        assert!(reserve_for_frames_within(&mut buf, 50, f, 0).is_some());
    }

    #[test]
    fn a_header_at_the_start_is_recognised_only_whole_and_checked() {
        let mut out = Vec::new();
        encode(&header(FrameKind::Ack, 0), &[], &mut out);
        assert!(starts_with_header(&out));
        assert!(!starts_with_header(&out[..HEADER_LEN - 1]));
        assert!(!starts_with_header(&out[1..]));
        out[20] ^= 1;
        assert!(!starts_with_header(&out));
    }
}
