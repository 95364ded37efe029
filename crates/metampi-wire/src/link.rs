//! A connection over a single link: the common case of one TCP connection per site pair.

use std::time::Instant;

use bytes::BytesMut;

use crate::bundle::{Bundle, Event};
use crate::config::Config;
use crate::error::{CloseReason, SendError};
use crate::link_state::Transmit;
use crate::record::{Message, MessageParts};
use crate::stats::Stats;

/// A reliable, ordered, flow-controlled message connection over one byte stream.
///
/// It is a [`Bundle`] of one link, so it behaves exactly like one; see there for how to
/// drive it.
#[derive(Debug)]
pub struct Link {
    inner: Bundle,
}

impl Link {
    /// A link whose transport is connected now.
    pub fn new(now: Instant, config: Config) -> Link {
        Link {
            inner: Bundle::with_links(now, config, 1),
        }
    }

    /// Queues a message.
    ///
    /// # Errors
    /// As [`Bundle::send_message`]; the message comes back in the error.
    pub fn send_message(&mut self, now: Instant, msg: Message) -> Result<(), SendError> {
        self.inner.send_message(now, msg)
    }

    /// Bytes read from the transport, split anywhere.
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) {
        self.inner.handle_bytes(now, 0, bytes);
    }

    /// Reads from the transport straight into the buffer frames are decoded from, then
    /// handles the bytes (as [`Bundle::handle_read`]).
    pub fn handle_read<T>(
        &mut self,
        now: Instant,
        read: impl FnOnce(&mut BytesMut, usize) -> T,
    ) -> T {
        self.inner.handle_read(now, 0, read)
    }

    /// Bytes another thread read from the transport (as [`Bundle::handle_owned`]).
    pub fn handle_owned(&mut self, now: Instant, chunk: BytesMut) {
        self.inner.handle_owned(now, 0, chunk);
    }

    /// The next bytes to write to the transport.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.inner.poll_transmit(now, 0)
    }

    /// The next frame to write, as header and payload parts (as
    /// [`Bundle::poll_transmit_parts`]).
    #[must_use]
    pub fn poll_transmit_parts(&mut self, now: Instant) -> Option<Transmit> {
        self.inner.poll_transmit_parts(now, 0)
    }

    /// The next delivered message as the pieces it arrived in (as
    /// [`Bundle::poll_message_parts`]).
    #[must_use]
    pub fn poll_message_parts(&mut self) -> Option<MessageParts> {
        self.inner.poll_message_parts()
    }

    /// When `handle_timeout` should be called next; `None` once closed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.inner.poll_timeout()
    }

    /// Timers: retransmission, delayed acknowledgement, keepalive, idle timeout,
    /// partial-frame timeout (as [`Bundle::handle_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.inner.handle_timeout(now);
    }

    /// The transport broke; nothing is sent until [`Link::handle_reconnect`].
    pub fn handle_disconnect(&mut self, now: Instant) {
        self.inner.handle_disconnect(now, 0);
    }

    /// The transport is connected again: everything unacknowledged is resent.
    pub fn handle_reconnect(&mut self, now: Instant) {
        self.inner.handle_reconnect(now, 0);
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.inner.poll_event()
    }

    /// Closes the link locally.
    pub fn close(&mut self) {
        self.inner.close();
    }

    /// Why the link closed, once it has.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.inner.close_reason()
    }

    /// Statistics, readable at any time.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Credit of messages accepted and not yet acknowledged.
    pub fn send_buffered(&self) -> u64 {
        self.inner.send_buffered()
    }

    /// Credit held by received messages not yet taken with `poll_event`.
    pub fn receive_buffered(&self) -> u64 {
        self.inner.receive_buffered()
    }
}
