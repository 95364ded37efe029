//! Messages accepted by `send_message` and not yet cut into frames, shared by all links
//! of a bundle: a link that can send pulls the next fragment, so faster links take more.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::record::{Envelope, Message, Record, MESSAGE_OVERHEAD, RECORD_HEADER_LEN};

/// A fragment shorter than this is not cut off a longer message just because the frame
/// or the credit has little room left; the rest waits for the next frame.
const MIN_FRAGMENT: usize = 1024;

#[derive(Debug)]
struct Pending {
    envelope: Envelope,
    id: u64,
    total: u64,
    /// Offset of `data` in the message.
    offset: u64,
    data: Bytes,
    since: Instant,
    /// Taken back from a dead link: sent outside credit, never bundled with new data.
    failover: bool,
}

#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    items: VecDeque<Pending>,
    next_id: u64,
    bytes: u64,
    /// Credit of messages accepted and not yet acknowledged: the send buffer in use.
    pub(crate) buffered: u64,
    /// The head's flush deadline passed in `handle_timeout`; it stays due (and is no
    /// longer reported as a timer) until the queue empties, so a driver whose transport
    /// is not writable does not spin on a deadline in the past.
    due: bool,
}

impl SendQueue {
    /// Queues a message and returns its id.
    pub(crate) fn push(&mut self, now: Instant, m: Message) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += m.data.len() as u64;
        self.buffered += m.cost();
        self.items.push_back(Pending {
            envelope: m.envelope,
            id,
            total: m.data.len() as u64,
            offset: 0,
            data: m.data,
            since: now,
            failover: false,
        });
        id
    }

    /// Puts records of a failed link back at the front, in message order, ready to go.
    /// Their credit is still counted in `buffered`.
    pub(crate) fn requeue(&mut self, since: Instant, mut records: Vec<Record>) {
        records.sort_by_key(|r| (r.id, r.offset));
        for r in records.into_iter().rev() {
            self.bytes += r.data.len() as u64;
            self.items.push_front(Pending {
                envelope: r.envelope,
                id: r.id,
                total: r.total,
                offset: r.offset,
                data: r.data,
                since,
                failover: true,
            });
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a frame should go out now: enough is queued to fill one, or the oldest
    /// message has waited out the flush delay.
    pub(crate) fn ready(&self, now: Instant, flush_delay: Duration, frame_cap: usize) -> bool {
        let Some(head) = self.items.front() else {
            return false;
        };
        let encoded = self.bytes as usize + self.items.len() * RECORD_HEADER_LEN;
        self.due || encoded >= frame_cap || now >= head.since + flush_delay
    }

    /// When the oldest message's flush delay runs out, unless it already has.
    pub(crate) fn deadline(&self, flush_delay: Duration) -> Option<Instant> {
        if self.due {
            return None;
        }
        self.items.front().map(|h| h.since + flush_delay)
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant, flush_delay: Duration) {
        if self
            .items
            .front()
            .is_some_and(|h| now >= h.since + flush_delay)
        {
            self.due = true;
        }
    }

    /// Whether the head was taken back from a dead link.
    pub(crate) fn head_is_failover(&self) -> bool {
        self.items.front().is_some_and(|h| h.failover)
    }

    /// Fragment length the head would yield into `space` payload bytes with `credit`,
    /// if its failover flag is `failover`.
    fn pull_len(&self, space: usize, credit: u64, failover: bool) -> Option<usize> {
        let head = self.items.front().filter(|h| h.failover == failover)?;
        let overhead = if head.offset == 0 {
            MESSAGE_OVERHEAD
        } else {
            0
        };
        let credit = credit.checked_sub(overhead)?;
        let space = space.checked_sub(RECORD_HEADER_LEN)?;
        let room = usize::try_from(credit).unwrap_or(usize::MAX).min(space);
        let n = head.data.len();
        let take = n.min(room);
        (take == n || take >= MIN_FRAGMENT).then_some(take)
    }

    /// Whether the head can be sent with this much credit into an empty frame.
    pub(crate) fn can_pull(&self, frame_cap: usize, credit: u64) -> bool {
        let failover = self.head_is_failover();
        let credit = if failover { u64::MAX } else { credit };
        self.pull_len(frame_cap, credit, failover).is_some()
    }

    /// Cuts the next record off the head, fitting `space` payload bytes and `credit`,
    /// if the head's failover flag is `failover`.
    pub(crate) fn pull(&mut self, space: usize, credit: u64, failover: bool) -> Option<Record> {
        let take = self.pull_len(space, credit, failover)?;
        let head = self.items.front_mut()?;
        let r = Record {
            envelope: head.envelope,
            id: head.id,
            total: head.total,
            offset: head.offset,
            data: head.data.split_to(take),
        };
        head.offset += take as u64;
        if head.data.is_empty() {
            self.items.pop_front();
            self.due &= !self.items.is_empty();
        }
        self.bytes -= take as u64;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(n: usize) -> Message {
        Message::new(Envelope::default(), vec![7u8; n])
    }

    #[test]
    fn fragments_fit_space_and_credit_and_keep_costs() {
        let t = Instant::now();
        let mut q = SendQueue::default();
        q.push(t, msg(5000));
        q.push(t, msg(0));
        assert_eq!(q.buffered, 5000 + 2 * MESSAGE_OVERHEAD);
        // Not even the overhead fits.
        assert!(q.pull(4096, 10, false).is_none());
        let a = q.pull(2048 + RECORD_HEADER_LEN, 1 << 20, false).unwrap();
        assert_eq!((a.offset, a.data.len()), (0, 2048));
        // Credit limits the fragment; below MIN_FRAGMENT nothing is cut.
        assert!(q.pull(4096, 1000, false).is_none());
        let b = q.pull(1 << 16, 1500, false).unwrap();
        assert_eq!((b.offset, b.data.len()), (2048, 1500));
        let c = q.pull(1 << 16, 1 << 20, false).unwrap();
        assert_eq!((c.offset, c.data.len(), c.total), (3548, 1452, 5000));
        let d = q.pull(1 << 16, MESSAGE_OVERHEAD, false).unwrap();
        assert_eq!((d.id, d.data.len()), (1, 0));
        assert_eq!(
            a.cost() + b.cost() + c.cost() + d.cost(),
            5000 + 2 * MESSAGE_OVERHEAD
        );
        assert_eq!((q.len(), q.bytes()), (0, 0));
    }

    #[test]
    fn ready_on_full_frame_or_deadline() {
        let t = Instant::now();
        let delay = Duration::from_micros(200);
        let mut q = SendQueue::default();
        assert!(!q.ready(t, delay, 4096));
        q.push(t, msg(10));
        assert!(!q.ready(t, delay, 4096));
        assert!(q.ready(t + delay, delay, 4096));
        assert_eq!(q.deadline(delay), Some(t + delay));
        q.push(t, msg(5000));
        assert!(q.ready(t, delay, 4096));
    }

    #[test]
    fn requeued_records_go_first_in_order() {
        let t = Instant::now();
        let mut q = SendQueue::default();
        q.push(t, msg(10));
        let first = q.pull(4096, 1 << 20, false).unwrap();
        q.push(t, msg(20));
        q.requeue(t, vec![first.clone()]);
        assert!(q.head_is_failover());
        // Failover records never share a frame with new data, and need no credit.
        assert!(q.pull(4096, 1 << 20, false).is_none());
        assert!(q.can_pull(4096, 0));
        assert_eq!(q.pull(4096, u64::MAX, true).unwrap(), first);
        assert!(q.pull(4096, u64::MAX, true).is_none());
        assert_eq!(q.pull(4096, 1 << 20, false).unwrap().id, 1);
    }
}
