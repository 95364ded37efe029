//! Messages and the records (message fragments) a `Data` frame's payload is made of.
//!
//! A payload is a sequence of records, each a 48-byte record header followed by the
//! fragment bytes (little-endian):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | record kind (1 = message fragment) |
//! | 1 | 3 | reserved, zero |
//! | 4 | 4 | source world rank |
//! | 8 | 4 | destination world rank |
//! | 12 | 4 | context id |
//! | 16 | 4 | tag (`i32`) |
//! | 20 | 4 | fragment length |
//! | 24 | 8 | message id (per connection, from 0, no gaps) |
//! | 32 | 8 | total message length |
//! | 40 | 8 | fragment offset |
//!
//! Many small messages share one frame (bundling); a large one is cut into fragments
//! carried by several frames, possibly on several links (striping).

use bytes::{Bytes, BytesMut};

use crate::frame::{le_u32, le_u64, DecodeError};

/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 48;
const RECORD_MESSAGE: u8 = 1;

/// Flow-control cost charged once per message on top of its bytes, so that a flood of
/// empty messages is bounded too (it stands for the receiver's per-message bookkeeping).
pub const MESSAGE_OVERHEAD: u64 = 64;

/// The matching information of a message (MPI-1.2 §3.2.3, the message envelope), with
/// world ranks because routers deliver across communicators' site boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Envelope {
    /// World rank of the sender.
    pub src: u32,
    /// World rank of the receiver.
    pub dst: u32,
    /// Context id of the communicator.
    pub context: u32,
    /// Message tag.
    pub tag: i32,
}

/// A message as the application hands it to a link and gets it back.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Message {
    /// Who sends it, to whom, on which context and tag.
    pub envelope: Envelope,
    /// The bytes; cloning and fragmenting a `Bytes` does not copy them.
    pub data: Bytes,
}

impl Message {
    /// A message with the given envelope and bytes.
    pub fn new(envelope: Envelope, data: impl Into<Bytes>) -> Message {
        Message {
            envelope,
            data: data.into(),
        }
    }

    /// Bytes of send window and receive credit this message uses.
    pub fn cost(&self) -> u64 {
        self.data.len() as u64 + MESSAGE_OVERHEAD
    }
}

/// A delivered message as the slices it arrived in (fragments from the receive
/// buffers, not joined): a transport can write them with one vectored write.
/// [`MessageParts::into_message`] joins them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MessageParts {
    /// Who sent it, to whom, on which context and tag.
    pub envelope: Envelope,
    /// The message bytes in order; none is empty.
    pub parts: Vec<Bytes>,
}

impl MessageParts {
    /// Bytes of the message.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The message in one buffer (a copy when it came in more than one piece).
    pub fn into_message(self) -> Message {
        Message {
            envelope: self.envelope,
            data: join(&self.parts),
        }
    }
}

/// One fragment of a message as carried in a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The message's envelope (repeated in every fragment).
    pub envelope: Envelope,
    /// Message id: messages of one connection are numbered from 0 without gaps.
    pub id: u64,
    /// Length of the whole message.
    pub total: u64,
    /// Where this fragment starts in the message.
    pub offset: u64,
    /// The fragment bytes.
    pub data: Bytes,
}

impl Record {
    /// Flow-control cost: the bytes, plus [`MESSAGE_OVERHEAD`] on the first fragment.
    pub fn cost(&self) -> u64 {
        self.data.len() as u64
            + if self.offset == 0 {
                MESSAGE_OVERHEAD
            } else {
                0
            }
    }

    /// Bytes this record takes in a payload.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_LEN + self.data.len()
    }

    /// Appends the record to a payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header());
        out.extend_from_slice(&self.data);
    }

    /// The record header; the fragment bytes follow it in a payload.
    pub fn header(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0] = RECORD_MESSAGE;
        h[4..8].copy_from_slice(&self.envelope.src.to_le_bytes());
        h[8..12].copy_from_slice(&self.envelope.dst.to_le_bytes());
        h[12..16].copy_from_slice(&self.envelope.context.to_le_bytes());
        h[16..20].copy_from_slice(&self.envelope.tag.to_le_bytes());
        h[20..24].copy_from_slice(&(self.data.len() as u32).to_le_bytes());
        h[24..32].copy_from_slice(&self.id.to_le_bytes());
        h[32..40].copy_from_slice(&self.total.to_le_bytes());
        h[40..48].copy_from_slice(&self.offset.to_le_bytes());
        h
    }
}

/// Fragments at least this long go into a frame as their own slice (written from
/// where they are with the frame's vectored write); shorter ones are copied next to
/// their record header, which costs less than an I/O vector entry each.
pub const INLINE_BELOW: usize = 4096;

/// A payload made of records without copying their fragments: record headers and
/// short fragments are gathered in shared buffers, long fragments stay the slices
/// they are. Concatenated, the parts are exactly what [`Record::encode`] would write.
#[derive(Debug, Default)]
pub struct PayloadBuilder {
    parts: Vec<Bytes>,
    head: BytesMut,
    len: usize,
}

impl PayloadBuilder {
    /// An empty payload.
    pub fn new() -> PayloadBuilder {
        PayloadBuilder::default()
    }

    /// Appends one record.
    pub fn push(&mut self, r: &Record) {
        if self.head.capacity() - self.head.len() < RECORD_HEADER_LEN + INLINE_BELOW {
            // Headers of one frame share an allocation.
            self.head.reserve(RECORD_HEADER_LEN + INLINE_BELOW);
        }
        self.head.extend_from_slice(&r.header());
        if r.data.len() < INLINE_BELOW {
            self.head.extend_from_slice(&r.data);
        } else {
            self.parts.push(self.head.split().freeze());
            self.parts.push(r.data.clone());
        }
        self.len += r.encoded_len();
    }

    /// Bytes of the payload so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no record was pushed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The payload's parts, in order.
    pub fn finish(mut self) -> Vec<Bytes> {
        if !self.head.is_empty() {
            self.parts.push(self.head.split().freeze());
        }
        self.parts
    }
}

/// The parts of a payload joined into one buffer (a copy, unless there is one part).
pub fn join(parts: &[Bytes]) -> Bytes {
    match parts {
        [] => Bytes::new(),
        [one] => one.clone(),
        _ => {
            let mut b = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for p in parts {
                b.extend_from_slice(p);
            }
            b.freeze()
        }
    }
}

/// Fragments below this size are copied out of the frame so that a small message does
/// not keep a whole frame buffer alive (the credit accounting would not see it).
const COPY_BELOW: usize = 4096;

/// Splits a decoded (decompressed) payload into records.
///
/// # Errors
/// [`DecodeError::Truncated`], [`DecodeError::UnknownRecord`], [`DecodeError::Reserved`]
/// or [`DecodeError::FragmentOutOfBounds`] for malformed payloads; an empty payload is
/// malformed too, since a `Data` frame always carries at least one record.
pub fn decode_payload(payload: &Bytes) -> Result<Vec<Record>, DecodeError> {
    let mut records = Vec::new();
    let mut at = 0;
    if payload.is_empty() {
        return Err(DecodeError::Truncated);
    }
    while at < payload.len() {
        let h = payload
            .get(at..at + RECORD_HEADER_LEN)
            .ok_or(DecodeError::Truncated)?;
        if h[0] != RECORD_MESSAGE {
            return Err(DecodeError::UnknownRecord(h[0]));
        }
        if h[1..4] != [0, 0, 0] {
            return Err(DecodeError::Reserved);
        }
        let envelope = Envelope {
            src: le_u32(h, 4),
            dst: le_u32(h, 8),
            context: le_u32(h, 12),
            tag: le_u32(h, 16) as i32,
        };
        let len = le_u32(h, 20) as usize;
        let id = le_u64(h, 24);
        let total = le_u64(h, 32);
        let offset = le_u64(h, 40);
        let start = at + RECORD_HEADER_LEN;
        let end = start.checked_add(len).ok_or(DecodeError::Truncated)?;
        if end > payload.len() {
            return Err(DecodeError::Truncated);
        }
        let out_of_bounds = offset
            .checked_add(len as u64)
            .is_none_or(|e| e > total)
            // Empty fragments would cost no credit; only an empty message may have one.
            || (len == 0 && (total != 0 || offset != 0));
        if out_of_bounds {
            return Err(DecodeError::FragmentOutOfBounds {
                offset,
                len: len as u64,
                total,
            });
        }
        let data = if len < COPY_BELOW {
            Bytes::copy_from_slice(&payload[start..end])
        } else {
            payload.slice(start..end)
        };
        records.push(Record {
            envelope,
            id,
            total,
            offset,
            data,
        });
        at = end;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, offset: u64, data: &'static [u8], total: u64) -> Record {
        Record {
            envelope: Envelope {
                src: 1,
                dst: 2,
                context: 4,
                tag: -5,
            },
            id,
            total,
            offset,
            data: Bytes::from_static(data),
        }
    }

    #[test]
    fn bundle_of_records_round_trips() {
        let records = vec![
            record(0, 0, b"", 0),
            record(1, 0, b"abc", 3),
            record(2, 10, b"xyz", 13),
        ];
        let mut out = Vec::new();
        for r in &records {
            r.encode(&mut out);
        }
        assert_eq!(out.len(), 3 * RECORD_HEADER_LEN + 6);
        assert_eq!(decode_payload(&Bytes::from(out)).unwrap(), records);
    }

    #[test]
    fn a_built_payload_is_the_encoded_records_and_shares_long_fragments() {
        let long = Bytes::from(vec![9u8; INLINE_BELOW + 10]);
        let records = vec![
            record(1, 0, b"abc", 3),
            Record {
                data: long.clone(),
                total: long.len() as u64,
                ..record(2, 0, b"", 0)
            },
            record(3, 0, b"", 0),
            record(4, 5, b"xy", 7),
        ];
        let mut encoded = Vec::new();
        let mut b = PayloadBuilder::new();
        for r in &records {
            r.encode(&mut encoded);
            b.push(r);
        }
        assert_eq!(b.len(), encoded.len());
        let parts = b.finish();
        assert_eq!(
            parts.len(),
            3,
            "headers and short ones, the long one, the rest"
        );
        assert_eq!(parts[1].as_ptr(), long.as_ptr(), "not copied");
        assert_eq!(&join(&parts)[..], &encoded[..]);
        assert_eq!(decode_payload(&join(&parts)).unwrap(), records);
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let mut out = Vec::new();
        record(2, 10, b"xyz", 12).encode(&mut out);
        assert!(matches!(
            decode_payload(&Bytes::from(out)),
            Err(DecodeError::FragmentOutOfBounds { .. })
        ));
        let mut out = Vec::new();
        record(2, 1, b"", 12).encode(&mut out);
        assert!(matches!(
            decode_payload(&Bytes::from(out)),
            Err(DecodeError::FragmentOutOfBounds { .. })
        ));
        let mut out = Vec::new();
        record(1, 0, b"abc", 3).encode(&mut out);
        out.pop();
        assert_eq!(
            decode_payload(&Bytes::from(out.clone())),
            Err(DecodeError::Truncated)
        );
        out[0] = 9;
        assert_eq!(
            decode_payload(&Bytes::from(out)),
            Err(DecodeError::UnknownRecord(9))
        );
        assert_eq!(decode_payload(&Bytes::new()), Err(DecodeError::Truncated));
    }

    #[test]
    fn cost_charges_overhead_once_per_message() {
        assert_eq!(record(0, 0, b"abc", 6).cost(), 3 + MESSAGE_OVERHEAD);
        assert_eq!(record(0, 3, b"abc", 6).cost(), 3);
    }
}
