//! One logical connection over one or more links (striping), as MetaMPICH's routers use
//! several TCP connections per site pair.
//!
//! Messages get consecutive ids per connection. Links pull fragments from one shared
//! queue when they can send, so a faster link carries more; the receiving side puts
//! fragments from all links back together and delivers whole messages in id order.
//! Ordering between any two ranks therefore holds however the fragments were spread
//! (MPI-1.2 §3.5, non-overtaking).
//!
//! When a link dies (idle timeout) its unacknowledged fragments go back to the front of
//! the queue for the surviving links; the receiver drops whatever it already had.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::config::{Config, ConfigError};
use crate::error::{CloseReason, ProtocolError, SendError};
use crate::link_state::{LinkState, Received, Transmit, DISCARD_READ};
use crate::queue::SendQueue;
use crate::reassembly::{Accepted, Reassembler};
use crate::record::{Message, MessageParts};
use crate::stats::Stats;

/// Something the application should know about, from `poll_event`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A whole message, in order, exactly once.
    Delivered(Message),
    /// The send buffer has room again after `send_message` returned `WouldBlock`.
    Writable,
    /// One link stopped for good; in a bundle the others carry its traffic on.
    LinkDead {
        /// Index of the link.
        link: usize,
        /// Why it stopped.
        reason: CloseReason,
    },
    /// Link `link` has been connected and silent for `silent` (not a byte from the
    /// peer), the [`crate::ConfigBuilder::silent_reconnect`] limit: its transport may be
    /// stuck without breaking. The driver drops it ([`Bundle::handle_disconnect`]) and
    /// connects again; the link is given up only a whole idle timeout after this event
    /// if nothing arrives meanwhile.
    LinkSilent {
        /// Index of the link.
        link: usize,
        /// How long it has been silent.
        silent: Duration,
    },
    /// The connection is gone: no link is left, the peer broke the protocol, or
    /// [`Bundle::close`] was called. Messages still queued are lost; messages delivered
    /// before this event are complete and in order.
    Closed(CloseReason),
}

/// A connection striped over `n` links. See the module documentation.
///
/// Driving it: after every `handle_*` call, call `poll_transmit` for each connected link
/// until it returns `None` and write the bytes to that link's transport; drain
/// `poll_event`; sleep until `poll_timeout` or the next input, then `handle_timeout`.
/// `now` must never go backwards.
#[derive(Debug)]
pub struct Bundle {
    cfg: Config,
    links: Vec<LinkState>,
    queue: SendQueue,
    reassembler: Reassembler,
    events: VecDeque<Event>,
    blocked: bool,
    closed: Option<CloseReason>,
    /// Credit of failover records held undelivered; bounded by one window per link.
    failover_held: u64,
}

/// Charge index of records that came in failover frames (no link's credit).
const FAILOVER: u8 = u8::MAX;

impl Bundle {
    /// A connection over `links` links, all connected now.
    ///
    /// # Errors
    /// [`ConfigError::Links`] unless `1 <= links <= 255`.
    pub fn new(now: Instant, config: Config, links: usize) -> Result<Bundle, ConfigError> {
        match u8::try_from(links) {
            Ok(n) if n > 0 => Ok(Bundle::with_links(now, config, n)),
            _ => Err(ConfigError::Links(links)),
        }
    }

    pub(crate) fn with_links(now: Instant, config: Config, links: u8) -> Bundle {
        Bundle {
            reassembler: Reassembler::new(config.max_message_len),
            links: (0..links)
                .map(|i| LinkState::new(now, &config, i))
                .collect(),
            cfg: config,
            queue: SendQueue::default(),
            events: VecDeque::new(),
            blocked: false,
            closed: None,
            failover_held: 0,
        }
    }

    /// Number of links, dead ones included.
    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// Queues a message (MPI-1.2 §3.4, a standard-mode send once buffered).
    ///
    /// # Errors
    /// [`SendError::WouldBlock`] when the send buffer cannot take it now,
    /// [`SendError::TooLarge`] above `max_message_len`, [`SendError::Closed`] after
    /// [`Event::Closed`]. Each gives the message back.
    pub fn send_message(&mut self, now: Instant, msg: Message) -> Result<(), SendError> {
        if self.closed.is_some() {
            return Err(SendError::Closed(msg));
        }
        if msg.data.len() as u64 > self.cfg.max_message_len {
            return Err(SendError::TooLarge(msg));
        }
        if self.queue.buffered + msg.cost() > self.cfg.send_buffer {
            self.blocked = true;
            return Err(SendError::WouldBlock(msg));
        }
        self.queue.push(now, msg);
        Ok(())
    }

    /// Bytes read from link `link`'s transport, split anywhere. Unknown links are ignored.
    /// The bytes are copied; [`Bundle::handle_read`] avoids that.
    pub fn handle_bytes(&mut self, now: Instant, link: usize, bytes: &[u8]) {
        self.handle_read(now, link, |buf, _| buf.extend_from_slice(bytes));
    }

    /// Reads from link `link`'s transport straight into the buffer its frames are
    /// decoded from, then handles the bytes as [`Bundle::handle_bytes`] does, without
    /// copying them: frames, and the message fragments in them, are slices of that
    /// buffer. `read` gets the buffer and how many bytes to read at most (that much
    /// spare capacity is reserved, sized so that frames do not straddle allocations);
    /// it should append at most that many bytes and nothing else, and returns what
    /// this call returns (the transport's result, say). Bytes for an unknown or dead
    /// link are read into a scratch buffer and dropped.
    ///
    /// ```
    /// # use std::time::Instant;
    /// # use metampi_wire::{Bundle, Config};
    /// # let mut bundle = Bundle::new(Instant::now(), Config::default(), 1).unwrap();
    /// # let mut socket: &[u8] = &[];
    /// use std::io::Read;
    /// let n = bundle.handle_read(Instant::now(), 0, |buf, max| {
    ///     // A socket read into the spare capacity would avoid zeroing it first.
    ///     let at = buf.len();
    ///     buf.resize(at + max, 0);
    ///     let r = socket.read(&mut buf[at..]);
    ///     buf.truncate(at + *r.as_ref().unwrap_or(&0));
    ///     r
    /// });
    /// assert_eq!(n.unwrap(), 0);
    /// ```
    pub fn handle_read<T>(
        &mut self,
        now: Instant,
        link: usize,
        read: impl FnOnce(&mut BytesMut, usize) -> T,
    ) -> T {
        let Some(l) = self.links.get_mut(link) else {
            return read(&mut BytesMut::new(), DISCARD_READ);
        };
        let (t, r) = l.handle_read(now, read);
        match r {
            Ok(r) => self.absorb(link, r),
            Err(e) => self.fail(link, e.into()),
        }
        t
    }

    /// Bytes of link `link`'s transport that another thread read, in order with every
    /// other read of that link: handled as [`Bundle::handle_bytes`] handles bytes, but a
    /// chunk that starts where a frame starts (nothing of an earlier frame still waiting
    /// for bytes) becomes the buffer frames are decoded from, without a copy. Unknown links
    /// are ignored.
    pub fn handle_owned(&mut self, now: Instant, link: usize, chunk: BytesMut) {
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        match l.handle_owned(now, chunk) {
            Ok(r) => self.absorb(link, r),
            Err(e) => self.fail(link, e.into()),
        }
    }

    /// Takes what link `link` decoded: acknowledged credit, records in order, failover
    /// records (bounded separately).
    fn absorb(&mut self, link: usize, received: Received) {
        self.acked(received.acked_cost);
        for r in received.records {
            let cost = r.cost();
            match self.reassembler.insert(link as u8, r) {
                Ok(Accepted::Kept) => {}
                Ok(Accepted::Duplicate) => self.links[link].release(cost),
                Err(e) => return self.fail(link, e.into()),
            }
        }
        let limit = self.cfg.window * self.links.len() as u64;
        for r in received.failover {
            let cost = r.cost();
            match self.reassembler.insert(FAILOVER, r) {
                Ok(Accepted::Kept) => self.failover_held += cost,
                Ok(Accepted::Duplicate) => {}
                Err(e) => return self.fail(link, e.into()),
            }
            if self.failover_held > limit {
                let e = ProtocolError::FlowControl {
                    used: self.failover_held,
                    granted: limit,
                };
                return self.fail(link, e.into());
            }
        }
    }

    /// The next bytes to write to link `link`'s transport.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, link: usize) -> Option<Vec<u8>> {
        self.poll_transmit_parts(now, link).map(|t| t.to_vec())
    }

    /// Like [`Bundle::poll_transmit`], but the frame as header and payload, the
    /// payload shared with the copy kept for resending (write both with one
    /// `writev`; no copy of the payload).
    #[must_use]
    pub fn poll_transmit_parts(&mut self, now: Instant, link: usize) -> Option<Transmit> {
        self.links
            .get_mut(link)?
            .poll_transmit(now, &mut self.queue)
    }

    /// When `handle_timeout` should be called next; `None` once closed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.links
            .iter()
            .filter_map(|l| l.poll_timeout(&self.queue))
            .min()
    }

    /// Timers: retransmission, delayed acknowledgement, keepalive, idle timeout, and
    /// the partial-frame timeout (a frame whose missing bytes are not coming is given
    /// up and a resend asked for; see [`crate::ConfigBuilder::partial_frame_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.queue.handle_timeout(now, self.cfg.flush_delay);
        for i in 0..self.links.len() {
            // First, so that acknowledgements found in the given-up bytes count before
            // the retransmission timer is looked at.
            match self.links[i].handle_stall(now) {
                Ok(r) => self.absorb(i, r),
                Err(e) => self.fail(i, e.into()),
            }
            if let Some(reason) = self.links[i].handle_timeout(now) {
                self.link_died(now, i, reason);
            } else if let Some(silent) = self.links[i].handle_silence(now) {
                self.events.push_back(Event::LinkSilent { link: i, silent });
            }
        }
    }

    /// Whether link `link`'s retransmission timer has expired: the moment for a
    /// driver to ask its transport whether it is still delivering (see
    /// [`Bundle::transport_busy`]) rather than on every timer.
    #[must_use]
    pub fn retransmission_due(&self, now: Instant, link: usize) -> bool {
        self.links
            .get(link)
            .is_some_and(|l| l.retransmission_due(now))
    }

    /// The transport of link `link` still holds bytes it has not delivered (a TCP
    /// socket whose peer has not acknowledged everything written): nothing sent
    /// on the link can be lost yet, so its retransmission timer restarts now. A
    /// driver calls it before [`Bundle::handle_timeout`]; over a slow line, frames
    /// wait in the transport's queue longer than any round trip measured on it.
    pub fn transport_busy(&mut self, now: Instant, link: usize) {
        if let Some(l) = self.links.get_mut(link) {
            l.transport_busy(now);
        }
    }

    /// The transport of link `link` broke; nothing is sent on it until
    /// [`Bundle::handle_reconnect`]. Its idle timeout keeps running.
    pub fn handle_disconnect(&mut self, _now: Instant, link: usize) {
        if let Some(l) = self.links.get_mut(link) {
            l.handle_disconnect();
        }
    }

    /// The transport of link `link` is connected again (a new byte stream): everything
    /// unacknowledged is resent; the peer drops what it already had.
    pub fn handle_reconnect(&mut self, now: Instant, link: usize) {
        if let Some(l) = self.links.get_mut(link) {
            l.handle_reconnect(now);
        }
    }

    /// The next event: delivered messages first, then link and connection events.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(m) = self.poll_message_parts() {
            return Some(Event::Delivered(m.into_message()));
        }
        self.events.pop_front()
    }

    /// The next delivered message, in order, as the pieces it arrived in: what
    /// [`Bundle::poll_event`] would deliver next, without joining a message that came
    /// in several fragments into one buffer. Events other than deliveries stay for
    /// `poll_event`.
    #[must_use]
    pub fn poll_message_parts(&mut self) -> Option<MessageParts> {
        let (m, charges) = self.reassembler.pop()?;
        for (link, cost) in charges {
            if link == FAILOVER {
                self.failover_held -= cost;
            } else if let Some(l) = self.links.get_mut(link as usize) {
                l.release(cost);
            }
        }
        Some(m)
    }

    /// Closes the connection locally: nothing more is sent or accepted.
    pub fn close(&mut self) {
        if self.closed.is_none() {
            for l in &mut self.links {
                l.kill();
            }
            self.closed = Some(CloseReason::Local);
            self.events.push_back(Event::Closed(CloseReason::Local));
        }
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// Whether link `link` is still in use.
    pub fn is_link_alive(&self, link: usize) -> bool {
        self.links.get(link).is_some_and(|l| !l.is_dead())
    }

    /// Statistics summed over all links, with the shared queue's depth.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for l in &self.links {
            s += &l.stats();
        }
        s.queued_messages = self.queue.len() as u64;
        s.queued_bytes = self.queue.bytes();
        s
    }

    /// Statistics of one link (the queue gauges are zero: the queue is shared).
    pub fn link_stats(&self, link: usize) -> Option<Stats> {
        self.links.get(link).map(LinkState::stats)
    }

    /// Credit of messages accepted and not yet acknowledged (the send buffer in use).
    pub fn send_buffered(&self) -> u64 {
        self.queue.buffered
    }

    /// Credit held by received messages not yet taken with `poll_event`.
    pub fn receive_buffered(&self) -> u64 {
        self.reassembler.held()
    }

    fn acked(&mut self, cost: u64) {
        if cost == 0 {
            return;
        }
        self.queue.buffered -= cost;
        if self.blocked {
            self.blocked = false;
            self.events.push_back(Event::Writable);
        }
    }

    fn link_died(&mut self, now: Instant, link: usize, reason: CloseReason) {
        self.events.push_back(Event::LinkDead {
            link,
            reason: reason.clone(),
        });
        if self.links.iter().all(LinkState::is_dead) {
            self.closed = Some(reason.clone());
            self.events.push_back(Event::Closed(reason));
            return;
        }
        match self.links[link].take_unacked() {
            // Due at once: they have waited at least a retransmission timeout already.
            Ok(records) => self.queue.requeue(
                now.checked_sub(self.cfg.flush_delay).unwrap_or(now),
                records,
            ),
            Err(e) => self.fail(link, ProtocolError::Internal(e).into()),
        }
    }

    fn fail(&mut self, link: usize, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        for l in &mut self.links {
            l.kill();
        }
        self.events.push_back(Event::LinkDead {
            link,
            reason: reason.clone(),
        });
        self.closed = Some(reason.clone());
        self.events.push_back(Event::Closed(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{self, Codec, FrameKind, Header};
    use crate::record::{Envelope, Record};
    use bytes::Bytes;

    fn failover_frame(seq: u64, id: u64, len: usize) -> Vec<u8> {
        let r = Record {
            envelope: Envelope::default(),
            id,
            total: len as u64,
            offset: 0,
            data: Bytes::from(vec![3u8; len]),
        };
        let mut payload = Vec::new();
        r.encode(&mut payload);
        let h = Header {
            kind: FrameKind::Data,
            codec: Codec::Raw,
            failover: true,
            unchecked: false,
            link: 0,
            connection: 0,
            seq,
            ack: 0,
            credit: 0,
            len: 0,
        };
        let mut out = Vec::new();
        frame::encode(&h, &payload, &mut out);
        out
    }

    #[test]
    fn failover_frames_are_outside_credit_but_still_bounded() {
        let now = Instant::now();
        let cfg = Config::builder()
            .window(crate::INITIAL_CREDIT)
            .max_message_len(60_000)
            .build()
            .unwrap();
        let mut b = Bundle::new(now, cfg, 1).unwrap();
        // Message 0 never comes, so nothing is delivered and everything stays held.
        b.handle_bytes(now, 0, &failover_frame(0, 1, 60_000));
        assert!(
            b.close_reason().is_none(),
            "one window of failover records is fine"
        );
        assert_eq!(
            b.receive_buffered(),
            60_000 + crate::record::MESSAGE_OVERHEAD
        );
        b.handle_bytes(now, 0, &failover_frame(1, 2, 60_000));
        assert!(matches!(
            b.close_reason(),
            Some(CloseReason::Protocol(ProtocolError::FlowControl { .. }))
        ));
    }

    #[test]
    fn link_count_is_checked() {
        let now = Instant::now();
        assert_eq!(
            Bundle::new(now, Config::default(), 0).unwrap_err(),
            ConfigError::Links(0)
        );
        assert_eq!(
            Bundle::new(now, Config::default(), 256).unwrap_err(),
            ConfigError::Links(256)
        );
        assert_eq!(
            Bundle::new(now, Config::default(), 255).unwrap().links(),
            255
        );
    }
}
