//! The 64-byte envelope that every transport carries in front of a payload.
//!
//! Layout (little-endian):
//! ```text
//!  0 kind u8 | 1 flags u8 | 2..4 reserved | 4..8 dst world rank | 8..12 src world rank
//! 12..16 context | 16..20 tag | 20..24 ring record length (owned by the shm ring)
//! 24..32 message length in bytes
//! 32..64 either the inline payload (Eager with len <= 32, shared memory only)
//!        or sreq u64 | rreq u64 | addr-or-offset u64 | fragment length u32
//! ```

use std::io;

use crate::ring::LINE;

pub const ENV_LEN: usize = LINE;
/// Payload bytes that fit inside the envelope itself.
pub const INLINE_MAX: usize = 32;

/// Envelope kinds. Values are wire values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Payload follows (or is inline); completes the send at once.
    Eager = 1,
    /// Like `Eager`, but the receiver answers `SyncAck` when it matches.
    EagerSync = 2,
    /// Request to send a large message; `addr` is the sender's buffer for CMA.
    Rts = 3,
    /// Receiver matched an `Rts` and asks for the data (`rreq` names its request).
    Cts = 4,
    /// A fragment of rendezvous data at `offset` for request `rreq`.
    Data = 5,
    /// Receiver pulled the data itself (CMA); the send is complete.
    Fin = 6,
    /// A synchronous eager send was matched.
    SyncAck = 7,
    /// Receiver matched an `Rts` on shared memory and asks the sender to copy
    /// chunks into its buffer at `addr` (`rreq`: slot and generation, see
    /// `engine::coop`); the send completes on `Fin` as before.
    Help = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Eager,
            2 => Kind::EagerSync,
            3 => Kind::Rts,
            4 => Kind::Cts,
            5 => Kind::Data,
            6 => Kind::Fin,
            7 => Kind::SyncAck,
            8 => Kind::Help,
            _ => return None,
        })
    }
}

/// Flag: the payload sits inside the envelope.
pub const F_INLINE: u8 = 1;
/// Flag: the typed payload is big-endian (receiver makes right).
pub const F_BIG_ENDIAN: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub kind: Kind,
    pub flags: u8,
    pub src: u32,
    /// Destination world rank: routers forward by it.
    pub dst: u32,
    pub context: u32,
    pub tag: i32,
    pub len: u64,
    pub sreq: u64,
    pub rreq: u64,
    pub addr: u64,
    pub frag: u32,
}

impl Envelope {
    pub fn new(kind: Kind, src: u32, context: u32, tag: i32, len: u64) -> Envelope {
        Envelope {
            kind,
            flags: 0,
            src,
            dst: 0,
            context,
            tag,
            len,
            sreq: 0,
            rreq: 0,
            addr: 0,
            frag: 0,
        }
    }

    /// Encodes the envelope. With `inline` the payload is stored in bytes 32..64
    /// instead of the request fields (only for `Eager`).
    #[inline(always)]
    pub fn encode(&self, inline: Option<&[u8]>) -> [u8; ENV_LEN] {
        let mut b = [0u8; ENV_LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.dst.to_le_bytes());
        b[8..12].copy_from_slice(&self.src.to_le_bytes());
        b[12..16].copy_from_slice(&self.context.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        match inline {
            Some(p) => {
                debug_assert!(p.len() <= INLINE_MAX && self.kind == Kind::Eager);
                b[1] |= F_INLINE;
                b[32..32 + p.len()].copy_from_slice(p);
            }
            None => {
                b[32..40].copy_from_slice(&self.sreq.to_le_bytes());
                b[40..48].copy_from_slice(&self.rreq.to_le_bytes());
                b[48..56].copy_from_slice(&self.addr.to_le_bytes());
                b[56..60].copy_from_slice(&self.frag.to_le_bytes());
            }
        }
        b
    }

    /// Decodes an envelope; `None` for an unknown kind or inconsistent fields.
    #[inline]
    pub fn decode(b: &[u8]) -> Option<Envelope> {
        if b.len() < ENV_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let kind = Kind::from_u8(b[0])?;
        let flags = b[1];
        let len = u64_at(24);
        let inline = flags & F_INLINE != 0;
        if inline && (kind != Kind::Eager || len > INLINE_MAX as u64) {
            return None;
        }
        Some(Envelope {
            kind,
            flags,
            src: u32_at(8),
            dst: u32_at(4),
            context: u32_at(12),
            tag: u32_at(16) as i32,
            len,
            sreq: if inline { 0 } else { u64_at(32) },
            rreq: if inline { 0 } else { u64_at(40) },
            addr: if inline { 0 } else { u64_at(48) },
            frag: if inline { 0 } else { u32_at(56) },
        })
    }

    pub fn is_inline(&self) -> bool {
        self.flags & F_INLINE != 0
    }

    /// Bytes of payload that travel after this envelope on a stream or ring.
    pub fn trailing_len(&self) -> usize {
        match self.kind {
            Kind::Eager | Kind::EagerSync if !self.is_inline() => self.len as usize,
            Kind::Data => self.frag as usize,
            _ => 0,
        }
    }
}

/// The envelope at the front of a stream's bytes, once all of it is there. Streams carry no
/// inline envelopes (those are for shared-memory rings).
///
/// # Errors
/// `InvalidData` for bytes that are no envelope.
pub fn decode_head(bytes: &[u8]) -> io::Result<Option<Envelope>> {
    let Some(head) = bytes.get(..ENV_LEN) else {
        return Ok(None);
    };
    Envelope::decode(head)
        .filter(|e| !e.is_inline())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed envelope"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let mut e = Envelope::new(Kind::Rts, 7, 3, -5, 1 << 40);
        e.sreq = 11;
        e.rreq = 12;
        e.addr = 0xdead_beef;
        e.frag = 99;
        assert_eq!(Envelope::decode(&e.encode(None)), Some(e));
        let i = Envelope::new(Kind::Eager, 1, 2, 3, 5);
        let b = i.encode(Some(b"hello"));
        let d = Envelope::decode(&b).unwrap();
        assert!(d.is_inline());
        assert_eq!(&b[32..37], b"hello");
        assert_eq!(d.trailing_len(), 0);
        let mut bad = b;
        bad[0] = 200;
        assert_eq!(Envelope::decode(&bad), None);
        assert_eq!(Envelope::decode(&b[..10]), None);
        let mut lie = b;
        lie[24] = 200; // inline but claims 200 bytes
        assert_eq!(Envelope::decode(&lie), None);
    }
}
