//! Puts fragments from all links of a bundle back into whole messages, in message-id
//! order, and remembers which link's credit each one holds.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::error::ProtocolError;
use crate::record::{Envelope, MessageParts, Record};

/// Credit charged to a link: (link index, bytes).
pub(crate) type Charge = (u8, u64);

#[derive(Debug)]
struct Partial {
    envelope: Envelope,
    total: u64,
    received: u64,
    fragments: BTreeMap<u64, Bytes>,
    charges: Vec<Charge>,
}

impl Partial {
    /// The parts of `data` (at `offset`) not received yet. After a failover the same
    /// bytes may come again, cut differently, so overlaps are expected; every frame is
    /// checksummed, so the copy already held is as good as the new one.
    fn missing(&self, offset: u64, data: &Bytes) -> Vec<(u64, Bytes)> {
        if data.is_empty() {
            // Only an empty message has an empty fragment (the decoder checks).
            return match self.fragments.contains_key(&offset) {
                true => Vec::new(),
                false => vec![(offset, Bytes::new())],
            };
        }
        let end = offset + data.len() as u64;
        // Held fragments do not overlap each other, so walking back from `end` their
        // ends decrease too, and the first one ending at or before `offset` is the last
        // that matters.
        let mut covered: Vec<(u64, u64)> = self
            .fragments
            .range(..end)
            .rev()
            .map(|(&s, b)| (s, s + b.len() as u64))
            .take_while(|&(_, e)| e > offset)
            .collect();
        covered.reverse();
        let mut pieces = Vec::new();
        let mut at = offset;
        let slice =
            |from: u64, to: u64| data.slice((from - offset) as usize..(to - offset) as usize);
        for (s, e) in covered {
            if s > at {
                pieces.push((at, slice(at, s)));
            }
            at = at.max(e);
        }
        if at < end {
            pieces.push((at, slice(at, end)));
        }
        pieces
    }
}

#[derive(Debug, Default)]
pub(crate) struct Reassembler {
    next_id: u64,
    pending: BTreeMap<u64, Partial>,
    ready: VecDeque<(MessageParts, Vec<Charge>)>,
    max_message_len: u64,
    /// Credit held by records not yet delivered (pending and ready).
    held: u64,
}

/// What happened to one record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Accepted {
    /// Kept; its credit is released when its message is delivered.
    Kept,
    /// Already had it (resent after a link failed over); release its credit now.
    Duplicate,
}

impl Reassembler {
    pub(crate) fn new(max_message_len: u64) -> Reassembler {
        Reassembler {
            max_message_len,
            ..Reassembler::default()
        }
    }

    /// Takes one record that arrived on `link`.
    pub(crate) fn insert(&mut self, link: u8, r: Record) -> Result<Accepted, ProtocolError> {
        if r.id < self.next_id {
            return Ok(Accepted::Duplicate);
        }
        if r.total > self.max_message_len {
            return Err(ProtocolError::MessageTooLarge {
                len: r.total,
                max: self.max_message_len,
            });
        }
        let cost = r.cost();
        let p = self.pending.entry(r.id).or_insert_with(|| Partial {
            envelope: r.envelope,
            total: r.total,
            received: 0,
            fragments: BTreeMap::new(),
            charges: Vec::new(),
        });
        if p.envelope != r.envelope || p.total != r.total {
            return Err(ProtocolError::InconsistentFragment { id: r.id });
        }
        let pieces = p.missing(r.offset, &r.data);
        if pieces.is_empty() {
            return Ok(Accepted::Duplicate);
        }
        for (offset, bytes) in pieces {
            p.received += bytes.len() as u64;
            p.fragments.insert(offset, bytes);
        }
        match p.charges.iter_mut().find(|c| c.0 == link) {
            Some(c) => c.1 += cost,
            None => p.charges.push((link, cost)),
        }
        self.held += cost;
        // An empty message has one empty fragment; it is complete once that is here.
        let complete = p.received == p.total;
        if complete && r.id == self.next_id {
            self.drain_complete();
        }
        Ok(Accepted::Kept)
    }

    fn drain_complete(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            let p = entry.get();
            if *entry.key() != self.next_id || p.received != p.total {
                break;
            }
            let p = entry.remove();
            // Fragments do not overlap and cover the message: in offset order they are
            // the message, handed on as they are.
            let message = MessageParts {
                envelope: p.envelope,
                parts: p
                    .fragments
                    .into_values()
                    .filter(|b| !b.is_empty())
                    .collect(),
            };
            self.ready.push_back((message, p.charges));
            self.next_id += 1;
        }
    }

    /// The next complete message in order, with the credit it releases.
    pub(crate) fn pop(&mut self) -> Option<(MessageParts, Vec<Charge>)> {
        let (m, charges) = self.ready.pop_front()?;
        self.held -= charges.iter().map(|c| c.1).sum::<u64>();
        Some((m, charges))
    }

    /// Credit held by undelivered records.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Envelope, MESSAGE_OVERHEAD};

    fn frag(id: u64, offset: u64, data: &[u8], total: u64) -> Record {
        Record {
            envelope: Envelope {
                src: 0,
                dst: 1,
                context: 2,
                tag: id as i32,
            },
            id,
            total,
            offset,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn refragmented_resends_fill_only_the_gaps() {
        let mut r = Reassembler::new(100);
        r.insert(0, frag(0, 2, b"cd", 10)).unwrap();
        r.insert(0, frag(0, 6, b"gh", 10)).unwrap();
        // A resend cut another way: "abcdefghij" in two pieces that straddle both.
        assert_eq!(
            r.insert(1, frag(0, 0, b"abcde", 10)).unwrap(),
            Accepted::Kept
        );
        assert!(r.pop().is_none());
        assert_eq!(
            r.insert(1, frag(0, 5, b"fghij", 10)).unwrap(),
            Accepted::Kept
        );
        let (m, _) = r.pop().unwrap();
        // The pieces as they were kept: no copy.
        let parts: Vec<&[u8]> = m.parts.iter().map(|p| &p[..]).collect();
        assert_eq!(parts, [&b"ab"[..], b"cd", b"e", b"f", b"gh", b"ij"]);
        assert_eq!(&m.into_message().data[..], b"abcdefghij");
    }

    #[test]
    fn delivers_in_id_order_whatever_the_arrival_order() {
        let mut r = Reassembler::new(100);
        assert_eq!(r.insert(1, frag(1, 3, b"def", 6)).unwrap(), Accepted::Kept);
        assert_eq!(r.insert(0, frag(2, 0, b"", 0)).unwrap(), Accepted::Kept);
        assert_eq!(r.insert(0, frag(1, 0, b"abc", 6)).unwrap(), Accepted::Kept);
        assert!(r.pop().is_none(), "message 0 is still missing");
        r.insert(1, frag(0, 0, b"x", 1)).unwrap();
        let (m0, c0) = r.pop().unwrap();
        assert_eq!(&m0.into_message().data[..], b"x");
        assert_eq!(c0, vec![(1, 1 + MESSAGE_OVERHEAD)]);
        let (m1, c1) = r.pop().unwrap();
        assert_eq!(&m1.into_message().data[..], b"abcdef");
        assert_eq!(c1, vec![(1, 3), (0, 3 + MESSAGE_OVERHEAD)]);
        let (m2, _) = r.pop().unwrap();
        assert!(m2.is_empty() && m2.into_message().data.is_empty());
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn duplicates_are_reported_and_conflicts_are_errors() {
        let mut r = Reassembler::new(100);
        r.insert(0, frag(0, 0, b"ab", 4)).unwrap();
        assert_eq!(
            r.insert(1, frag(0, 0, b"ab", 4)).unwrap(),
            Accepted::Duplicate
        );
        assert_eq!(
            r.insert(1, frag(0, 1, b"b", 4)).unwrap(),
            Accepted::Duplicate
        );
        assert!(r.insert(0, frag(0, 2, b"cd", 5)).is_err(), "other total");
        assert!(r.pop().is_none());
        r.insert(0, frag(0, 2, b"cd", 4)).unwrap();
        r.pop().unwrap();
        assert_eq!(
            r.insert(1, frag(0, 2, b"cd", 4)).unwrap(),
            Accepted::Duplicate
        );
        assert!(matches!(
            r.insert(0, frag(1, 0, b"", 101)),
            Err(ProtocolError::MessageTooLarge { .. })
        ));
    }
}
