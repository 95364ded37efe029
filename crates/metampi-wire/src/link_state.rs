//! Reliability of one link: sequence numbers, cumulative and negative acknowledgements,
//! go-back-N retransmission, credits, resumption after a reconnect.
//!
//! The receiver accepts `Data` frames strictly in sequence and drops everything else, so
//! it never buffers out-of-order frames: over a TCP stream frames only go missing through
//! corruption or a cut connection, where resending the tail is what is needed anyway.
//!
//! Bytes lost *inside* the stream (a fault-injecting proxy, a broken middlebox) leave the
//! decoder holding a valid header that announces more payload than will come. Later
//! bytes would fill the gap and fail the frame checksum, but after the last frame of a
//! burst nothing comes but the sender's resend, one retransmission timeout later, and it
//! is swallowed as the missing payload. So a partly received frame that gets no new byte
//! for the partial-frame timeout is given up: its bytes are rescanned from the second one
//! (later frames may lie inside), and a `Nack` asks for everything from `expected`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::compress::{decompress, Compressor};
use crate::config::{Config, INITIAL_CREDIT};
use crate::error::{CloseReason, ProtocolError};
use crate::frame::{self, Codec, DecodeError, FrameKind, Header, StreamDecoder, StreamItem};
use crate::queue::SendQueue;
use crate::record::{decode_payload, join, PayloadBuilder, Record};
use crate::stats::Stats;

/// What one `handle_bytes` produced for the bundle.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Records accepted in order.
    pub(crate) records: Vec<Record>,
    /// Records accepted in order from failover frames (outside credit).
    pub(crate) failover: Vec<Record>,
    /// Credit of frames the peer acknowledged, to leave the send buffer.
    pub(crate) acked_cost: u64,
}

/// One frame to write: its header, then its payload as parts (shared, not copied:
/// the message bytes where the application put them, and the copy a link keeps
/// until the frame is acknowledged). Write it with one vectored write.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// The 48-byte header with both checksums.
    pub header: [u8; frame::HEADER_LEN],
    /// The payload as it goes on the wire, in order: record headers with short
    /// fragments, long fragments as they are, or one compressed buffer.
    pub parts: Vec<Bytes>,
}

impl Transmit {
    /// Bytes of the whole frame.
    pub fn len(&self) -> usize {
        self.header.len() + self.parts.iter().map(Bytes::len).sum::<usize>()
    }

    /// Never true: a frame has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The frame's bytes from `offset` on, as non-empty slices in order: what a
    /// vectored write that resumes after `offset` written bytes needs.
    pub fn slices_from(&self, offset: usize) -> impl Iterator<Item = &[u8]> {
        let mut skip = offset;
        std::iter::once(&self.header[..])
            .chain(self.parts.iter().map(|p| &p[..]))
            .filter_map(move |s| {
                if skip >= s.len() {
                    skip -= s.len();
                    None
                } else {
                    let rest = &s[skip..];
                    skip = 0;
                    Some(rest)
                }
            })
    }

    /// The frame in one buffer (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.header);
        for p in &self.parts {
            v.extend_from_slice(p);
        }
        v
    }
}

#[derive(Debug)]
struct SentFrame {
    seq: u64,
    codec: Codec,
    failover: bool,
    /// The payload as sent (shared with the transmits).
    parts: Vec<Bytes>,
    wire_len: usize,
    raw_len: usize,
    /// `Auto`'s measurement window.
    window: u64,
    cost: u64,
    first_sent: Instant,
    last_sent: Instant,
    /// Reconnect epoch of the last transmission.
    epoch: u64,
    retransmitted: bool,
}

/// Why a go-back-N resend is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GoBack {
    /// A second retransmission timeout without a fresh round trip, or our own
    /// reconnect: always, everything.
    Force,
    /// A first retransmission timeout: the oldest frame only. Over an in-order
    /// transport a frame is lost only with everything behind it or by a fault the
    /// peer reports (`Nack`); a timeout is far more often a frame still queued
    /// before a slow line (a 256 KiB frame takes a second at 2 Mbit/s), and resending
    /// a whole window of queued frames would only queue it twice. A tail truly lost
    /// is resent whole at the next timeout, the backoff being kept until then.
    Probe,
    /// The peer saw a gap: unless the frame was already resent less than a round trip
    /// ago (the report then predates the resend). A first transmission is always
    /// resent: a report for it arrives about one round trip after it left, so no
    /// timing rule tells a stale report from a fresh one, and the peer sends at most
    /// one report per gap per retransmission timeout.
    Nack,
    /// The peer reconnected: unless the frame was already resent on the new stream.
    Resume,
}

#[derive(Debug)]
struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl Rtt {
    /// RFC 6298 smoothing.
    fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }
}

/// Doublings of the partial-frame timeout (it is also capped by `max_rto`).
const MAX_STALL_BACKOFF: u32 = 8;
/// Data frames received that make an acknowledgement due at once.
const ACK_FRAMES: u32 = 32;
/// Wire bytes received (in two frames or more) that make one due at once.
const ACK_BYTES: u64 = 64 << 10;

/// Bytes a dead link's transport is read for at most per call (then dropped).
pub(crate) const DISCARD_READ: usize = 64 << 10;

#[derive(Debug)]
pub(crate) struct LinkState {
    index: u8,
    cfg: Config,
    connected: bool,
    dead: bool,

    next_seq: u64,
    unacked: VecDeque<SentFrame>,
    peer_ack: u64,
    peer_credit: u64,
    sent_cost: u64,
    resend_next: Option<u64>,
    /// Resending stops before this sequence number (`u64::MAX`: at the newest frame).
    resend_end: u64,
    epoch: u64,
    rtt: Rtt,
    backoff: u32,
    /// When an acknowledgement last took frames off `unacked`, or the driver last
    /// saw the transport still delivering: the retransmission timer restarts there
    /// (RFC 6298, 5.3). A frame written into a deep transport queue (a socket
    /// buffer draining into a slow line) waits its turn for longer than a round
    /// trip, but while the frames before it keep being acknowledged nothing is
    /// lost; timing it from its write alone resent whole windows that were only
    /// queued (measured: half a 100 Mbit/s line's bytes were resends).
    progress_at: Instant,
    last_send: Instant,
    resume_owed: bool,
    compressor: Compressor,
    /// Since when nothing sent on this link has been waiting for its acknowledgement.
    idle_since: Option<Instant>,
    /// Time the link spent so before `idle_since`: `Auto` rates a mode by what the
    /// link delivers per second of being busy.
    idle: Duration,

    decoder: StreamDecoder,
    expected: u64,
    recv_cost: u64,
    consumed: u64,
    advertised: u64,
    /// Data frames and their wire bytes received since our last frame (which
    /// acknowledged them).
    acks_owed: u32,
    ack_bytes_owed: u64,
    ack_deadline: Option<Instant>,
    ack_now: bool,
    nack_owed: bool,
    last_nack: Option<(u64, Instant)>,
    /// A partly received frame was given up: `Nack` even if one went out less than a
    /// retransmission timeout ago (that one's resend is what was lost). At most one per
    /// give-up, and a give-up needs a partial-frame timeout of silence.
    nack_forced: bool,
    last_recv: Instant,
    /// Last time any byte arrived, or the transport was connected again.
    last_bytes: Instant,
    /// [`Event::LinkSilent`](crate::Event::LinkSilent) was raised and no byte has come
    /// since; the link may be given up no earlier than `grace_until`.
    silence_raised: bool,
    grace_until: Option<Instant>,
    /// Last time bytes arrived that may belong to the frame being received.
    last_progress: Instant,
    /// Longest silence inside a frame since the last accepted one.
    silence_max: Duration,
    /// Doublings of the partial-frame timeout: one per give-up that proved premature,
    /// so a transport that pauses longer than the timeout inside healthy frames is not
    /// starved.
    stall_backoff: u32,
    /// A frame was given up and no byte has come since: the next bytes tell whether
    /// that was premature.
    stall_probe: bool,

    stats: Stats,
}

impl LinkState {
    pub(crate) fn new(now: Instant, cfg: &Config, index: u8) -> LinkState {
        LinkState {
            index,
            cfg: cfg.clone(),
            connected: true,
            dead: false,
            next_seq: 0,
            unacked: VecDeque::new(),
            peer_ack: 0,
            peer_credit: INITIAL_CREDIT,
            sent_cost: 0,
            resend_next: None,
            resend_end: u64::MAX,
            epoch: 0,
            rtt: Rtt {
                srtt: None,
                rttvar: Duration::ZERO,
            },
            backoff: 0,
            progress_at: now,
            last_send: now,
            resume_owed: false,
            compressor: Compressor::new(now, cfg.compression, cfg.zstd_level),
            idle_since: Some(now),
            idle: Duration::ZERO,
            decoder: StreamDecoder::new(cfg.max_frame_payload),
            expected: 0,
            recv_cost: 0,
            consumed: 0,
            advertised: INITIAL_CREDIT,
            acks_owed: 0,
            ack_bytes_owed: 0,
            ack_deadline: None,
            ack_now: false,
            nack_owed: false,
            last_nack: None,
            nack_forced: false,
            last_recv: now,
            last_bytes: now,
            silence_raised: false,
            grace_until: None,
            last_progress: now,
            silence_max: Duration::ZERO,
            stall_backoff: 0,
            stall_probe: false,
            stats: Stats::default(),
        }
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead
    }

    pub(crate) fn kill(&mut self) {
        self.dead = true;
    }

    /// Bytes from the transport (copied into the decoder's buffer).
    #[cfg(test)]
    pub(crate) fn handle_bytes(
        &mut self,
        now: Instant,
        bytes: &[u8],
    ) -> Result<Received, ProtocolError> {
        self.handle_read(now, |buf, _| buf.extend_from_slice(bytes))
            .1
    }

    /// Lets `read` append bytes from the transport straight to the decoder's buffer
    /// (at most the given count; see [`StreamDecoder::read_with`]), then handles them.
    pub(crate) fn handle_read<T>(
        &mut self,
        now: Instant,
        read: impl FnOnce(&mut BytesMut, usize) -> T,
    ) -> (T, Result<Received, ProtocolError>) {
        if self.dead {
            // Read and dropped, so the transport does not stay readable for nothing.
            let mut scratch = BytesMut::new();
            return (read(&mut scratch, DISCARD_READ), Ok(Received::default()));
        }
        let before = self.decoder.buffered();
        let t = self.decoder.read_with(read);
        (t, self.absorb_read(now, before))
    }

    /// As [`LinkState::handle_read`], for bytes another thread read (`chunk`): the
    /// decoder takes the buffer over where it holds nothing, so a chunk that starts
    /// with a frame is not copied.
    pub(crate) fn handle_owned(
        &mut self,
        now: Instant,
        chunk: BytesMut,
    ) -> Result<Received, ProtocolError> {
        if self.dead {
            return Ok(Received::default());
        }
        self.stats.chunks_handed_in += 1;
        let before = self.decoder.buffered();
        self.decoder.adopt(chunk);
        self.absorb_read(now, before)
    }

    /// What a read that left bytes `before..` in the decoder brought.
    fn absorb_read(&mut self, now: Instant, before: usize) -> Result<Received, ProtocolError> {
        let mut out = Received::default();
        let bytes = self.decoder.buffered_from(before);
        // Nothing arriving is no progress either.
        if !bytes.is_empty() {
            self.last_bytes = now;
            self.silence_raised = false;
        }
        if bytes.is_empty() {
            return Ok(out);
        }
        self.stats.bytes_in += bytes.len() as u64;
        let n = bytes.len().min(frame::MAGIC.len());
        let starts_like_a_frame = bytes[..n] == frame::MAGIC[..n];
        // While a frame waits for payload, bytes that start with a whole checksummed
        // header are most likely a later frame (a keepalive, an acknowledgement, the
        // sender's resend) landing in the gap lost bytes left, not the rest of the frame:
        // unless they complete it, they do not put off giving it up.
        let waiting = before > 0;
        let foreign = waiting && frame::starts_with_header(bytes);
        if std::mem::take(&mut self.stall_probe) && !starts_like_a_frame {
            // After a give-up nothing is buffered, so the next bytes should start a
            // frame: a resend, or whatever the sender had queued. Bytes that cannot be a
            // frame's start are the rest of the frame given up: it was only paused.
            self.stall_backoff = (self.stall_backoff + 1).min(MAX_STALL_BACKOFF);
        }
        if waiting && !foreign {
            // Before decoding: the frame these bytes complete is judged with its pauses.
            let silence = now.saturating_duration_since(self.last_progress);
            self.silence_max = self.silence_max.max(silence);
        }
        let decoded = self.drain_decoder(now, &mut out)?;
        if !foreign || decoded {
            self.last_progress = now;
        }
        Ok(out)
    }

    /// Decodes what the decoder holds; whether anything came out of it.
    fn drain_decoder(&mut self, now: Instant, out: &mut Received) -> Result<bool, ProtocolError> {
        let mut any = false;
        while let Some(item) = self.decoder.next_frame() {
            any = true;
            match item {
                StreamItem::Frame(h, payload) => self.on_frame(now, h, payload, out)?,
                StreamItem::Skipped(n, e) => {
                    self.stats.skipped_bytes_in += n as u64;
                    if e != DecodeError::BadMagic {
                        self.stats.corrupt_in += 1;
                    }
                    // Whatever was lost, the peer has to resend from our `expected`.
                    self.nack_owed = true;
                }
            }
        }
        Ok(any)
    }

    /// Gives up a partly received frame that got no byte for the partial-frame timeout
    /// (see the module documentation); frames found inside its bytes are handled as if
    /// they had just arrived.
    pub(crate) fn handle_stall(&mut self, now: Instant) -> Result<Received, ProtocolError> {
        let mut out = Received::default();
        if self.dead || self.stall_deadline().is_none_or(|d| now < d) {
            return Ok(out);
        }
        self.stats.stalled_frames_in += 1;
        self.stall_probe = true;
        self.nack_forced = true;
        // Whatever is still incomplete after the rescan has been silent just as long, so
        // it goes too: nothing stays buffered, and the deadline cannot fire again until
        // new bytes come.
        while self.decoder.buffered() > 0 {
            self.stats.skipped_bytes_in += self.decoder.skip_front() as u64;
            self.drain_decoder(now, &mut out)?;
        }
        Ok(out)
    }

    /// How long a partly received frame may go without a byte, after `backoff` doublings.
    fn stall_timeout(&self, backoff: u32) -> Duration {
        let floor = self.cfg.partial_frame_timeout;
        // A transport may pause about one round trip inside a frame (TCP after an idle
        // period or a lost segment); twice that, where this end has measured it.
        let base = self.rtt.srtt.map_or(floor, |s| floor.max(s * 2));
        base.saturating_mul(1 << backoff.min(MAX_STALL_BACKOFF))
            .min(self.cfg.max_rto.max(floor))
    }

    fn stall_deadline(&self) -> Option<Instant> {
        if !self.connected || self.decoder.buffered() == 0 {
            return None;
        }
        Some(self.last_progress + self.stall_timeout(self.stall_backoff))
    }

    fn on_frame(
        &mut self,
        now: Instant,
        h: Header,
        payload: Bytes,
        out: &mut Received,
    ) -> Result<(), ProtocolError> {
        if h.connection != self.cfg.connection_id || h.link != self.index {
            return Err(ProtocolError::WrongLink {
                connection: h.connection,
                link: h.link,
                expected_connection: self.cfg.connection_id,
                expected_link: self.index,
            });
        }
        self.stats.frames_in += 1;
        self.last_recv = now;
        self.on_ack(now, h.ack, out)?;
        self.peer_credit = self.peer_credit.max(h.credit);
        match h.kind {
            FrameKind::Data if h.seq < self.expected => {
                self.stats.duplicates_in += 1;
                // The peer resends because our acknowledgement got lost: repeat it soon.
                self.ack_now = true;
            }
            FrameKind::Data if h.seq > self.expected => {
                self.stats.out_of_order_in += 1;
                self.nack_owed = true;
            }
            FrameKind::Data => self.accept(now, h, payload, out)?,
            // Control frames carry the sender's next sequence number: a higher one than
            // we expect reveals lost data frames at the tail without waiting for a timeout.
            FrameKind::Ack => self.nack_owed |= h.seq > self.expected,
            FrameKind::Nack => {
                self.stats.nacks_in += 1;
                self.go_back(now, h.ack, GoBack::Nack);
                self.nack_owed |= h.seq > self.expected;
            }
            FrameKind::Resume => {
                self.go_back(now, h.ack, GoBack::Resume);
                self.ack_now = true;
            }
        }
        Ok(())
    }

    fn accept(
        &mut self,
        now: Instant,
        h: Header,
        payload: Bytes,
        out: &mut Received,
    ) -> Result<(), ProtocolError> {
        // Uncompressed payloads are used as they are (records slice them, no copy).
        let raw = if h.codec == Codec::Raw {
            payload.clone()
        } else {
            decompress(h.codec, &payload, self.cfg.max_frame_payload)?
        };
        let records = decode_payload(&raw)?;
        self.stats.records_in += records.len() as u64;
        self.stats.unchecked_frames_in += u64::from(h.unchecked);
        if h.failover {
            // Outside this link's credit; the bundle bounds these separately.
            out.failover.extend(records);
        } else {
            let cost: u64 = records.iter().map(Record::cost).sum();
            let used = self.recv_cost + cost;
            if used > self.advertised {
                return Err(ProtocolError::FlowControl {
                    used,
                    granted: self.advertised,
                });
            }
            self.recv_cost = used;
            out.records.extend(records);
        }
        self.expected += 1;
        // A frame got through: undo one doubling of the partial-frame timeout, but only
        // if the pauses it had would have passed the shorter timeout with room to spare,
        // so a transport that pauses long inside every frame keeps the longer one.
        if self.stall_backoff > 0
            && self.silence_max * 2 <= self.stall_timeout(self.stall_backoff - 1)
        {
            self.stall_backoff -= 1;
        }
        self.silence_max = Duration::ZERO;
        self.stats.payload_raw_in += raw.len() as u64;
        self.stats.payload_wire_in += payload.len() as u64;
        self.acks_owed += 1;
        self.ack_bytes_owed += payload.len() as u64;
        // Acknowledge every second frame of a stream (the sender keeps frames
        // until they are acknowledged and sends within its credit), but small
        // frames only once they add up to [`ACK_BYTES`] or [`ACK_FRAMES`]: a
        // lone small message waits for the deadline (or for a frame of ours
        // going the other way), so that a ping-pong over two one-way
        // connections does not pay a frame of acknowledgement, written and
        // read, per message.
        if self.acks_owed >= ACK_FRAMES || (self.acks_owed >= 2 && self.ack_bytes_owed >= ACK_BYTES)
        {
            self.ack_now = true;
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.cfg.ack_delay);
        }
        Ok(())
    }

    fn on_ack(&mut self, now: Instant, ack: u64, out: &mut Received) -> Result<(), ProtocolError> {
        if ack > self.next_seq {
            return Err(ProtocolError::AckBeyondSent {
                ack,
                sent: self.next_seq,
            });
        }
        if ack <= self.peer_ack {
            return Ok(());
        }
        let mut sample = None;
        while self.unacked.front().is_some_and(|f| f.seq < ack) {
            let Some(f) = self.unacked.pop_front() else {
                break;
            };
            out.acked_cost += f.cost;
            // Busy until now: `idle` is the total at this acknowledgement.
            self.compressor.acked(now, self.idle, f.window, f.raw_len);
            // Karn: a resent frame's acknowledgement says nothing about the round trip.
            if !f.retransmitted {
                sample = Some(f.first_sent);
            }
        }
        if let Some(sent) = sample {
            self.rtt.sample(now.saturating_duration_since(sent));
            // RFC 6298: a backed-off timeout stays until a new measurement.
            self.backoff = 0;
        }
        if self.unacked.is_empty() {
            self.idle_since.get_or_insert(now);
        }
        self.peer_ack = ack;
        self.progress_at = now;
        if self.resend_next.is_some_and(|r| r < ack) {
            self.resend_next = (ack < self.next_seq.min(self.resend_end)).then_some(ack);
        }
        Ok(())
    }

    fn go_back(&mut self, now: Instant, from: u64, why: GoBack) {
        let Some(first) = self.unacked.front().map(|f| f.seq) else {
            return;
        };
        let from = from.max(first);
        if from >= self.next_seq {
            return;
        }
        if self.resend_next.is_some_and(|r| r <= from) {
            // Already resending from there: a probe becomes a full resend.
            if why != GoBack::Probe {
                self.resend_end = u64::MAX;
            }
            return;
        }
        let Some(f) = self.unacked.get((from - first) as usize) else {
            return;
        };
        let skip = match why {
            GoBack::Force | GoBack::Probe => false,
            GoBack::Nack => {
                f.retransmitted && now < f.last_sent + self.rtt.srtt.unwrap_or(self.cfg.min_rto)
            }
            GoBack::Resume => f.epoch == self.epoch,
        };
        if !skip {
            self.resend_next = Some(from);
            self.resend_end = match why {
                GoBack::Probe => from + 1,
                _ => u64::MAX,
            };
        }
    }

    fn rto(&self) -> Duration {
        let base = match self.rtt.srtt {
            None => self.cfg.initial_rto,
            Some(s) => (s + self.rtt.rttvar * 4).clamp(self.cfg.min_rto, self.cfg.max_rto),
        };
        base.saturating_mul(1 << self.backoff.min(16))
            .min(self.cfg.max_rto)
    }

    fn rto_deadline(&self) -> Option<Instant> {
        if !self.connected || self.resend_next.is_some() {
            return None;
        }
        self.unacked
            .front()
            .map(|f| f.last_sent.max(self.progress_at) + self.rto())
    }

    /// See [`crate::Bundle::retransmission_due`].
    pub(crate) fn retransmission_due(&self, now: Instant) -> bool {
        !self.dead && self.rto_deadline().is_some_and(|d| now >= d)
    }

    /// See [`crate::Bundle::transport_busy`].
    pub(crate) fn transport_busy(&mut self, now: Instant) {
        self.progress_at = self.progress_at.max(now);
    }

    fn credit_left(&self) -> u64 {
        self.peer_credit.saturating_sub(self.sent_cost)
    }

    fn can_send_data(&self, queue: &SendQueue) -> bool {
        queue.can_pull(self.cfg.max_frame_payload, self.credit_left())
    }

    fn credit_owed(&self) -> bool {
        self.consumed + self.cfg.window >= self.advertised + self.cfg.window / 4
    }

    /// Credit taken by the application: the peer may send that much more.
    pub(crate) fn release(&mut self, cost: u64) {
        self.consumed += cost;
    }

    /// Returns a reason if the link died.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Option<CloseReason> {
        if self.dead {
            return None;
        }
        if now >= self.give_up_at() {
            self.dead = true;
            return Some(CloseReason::IdleTimeout(self.cfg.idle_timeout));
        }
        if self.retransmission_due(now) {
            self.stats.timeouts += 1;
            let why = match self.backoff {
                0 => GoBack::Probe,
                _ => GoBack::Force,
            };
            self.backoff = self.backoff.saturating_add(1);
            self.go_back(now, self.peer_ack, why);
        }
        let keepalive_due = self.connected && now >= self.last_send + self.cfg.keepalive;
        if keepalive_due || self.ack_deadline.is_some_and(|d| now >= d) {
            self.ack_now = true;
            self.ack_deadline = None;
        }
        None
    }

    /// When the link is given up if no frame arrives before.
    fn give_up_at(&self) -> Instant {
        let idle = self.last_recv + self.cfg.idle_timeout;
        self.grace_until.map_or(idle, |g| idle.max(g))
    }

    /// When a connected link counts as silent (see [`LinkState::handle_silence`]).
    fn silence_deadline(&self) -> Option<Instant> {
        let after = self.cfg.silent_reconnect?;
        (self.connected && !self.silence_raised).then(|| self.last_bytes + after)
    }

    /// How long the link has been connected and silent, once it reaches the
    /// `silent_reconnect` limit (then not again until bytes arrive): the driver is to
    /// connect it again, and the link gets a whole idle timeout from now to show life.
    pub(crate) fn handle_silence(&mut self, now: Instant) -> Option<Duration> {
        if self.dead || self.silence_deadline().is_none_or(|d| now < d) {
            return None;
        }
        self.silence_raised = true;
        self.grace_until = Some(now + self.cfg.idle_timeout);
        self.stats.silent_reconnects += 1;
        Some(now.saturating_duration_since(self.last_bytes))
    }

    pub(crate) fn poll_timeout(&self, queue: &SendQueue) -> Option<Instant> {
        if self.dead {
            return None;
        }
        let mut t = self.give_up_at();
        if let Some(s) = self.silence_deadline() {
            t = t.min(s);
        }
        // Deadlines whose work is already owed are left out: a driver that cannot write
        // yet must not be woken for them again and again.
        if self.connected {
            if !self.ack_now {
                t = t.min(self.last_send + self.cfg.keepalive);
            }
            let candidates = [
                self.rto_deadline(),
                self.stall_deadline(),
                self.ack_deadline,
                self.can_send_data(queue)
                    .then(|| queue.deadline(self.cfg.flush_delay))
                    .flatten(),
            ];
            for c in candidates.into_iter().flatten() {
                t = t.min(c);
            }
        }
        Some(t)
    }

    pub(crate) fn handle_disconnect(&mut self) {
        self.connected = false;
    }

    pub(crate) fn handle_reconnect(&mut self, now: Instant) {
        if self.dead {
            return;
        }
        self.connected = true;
        // Silence is counted on the new stream from its start.
        self.last_bytes = self.last_bytes.max(now);
        // The old stream's partial frame is gone with it; a cut is not a stall.
        self.decoder.reset();
        self.silence_max = Duration::ZERO;
        self.stall_probe = false;
        self.epoch += 1;
        self.resume_owed = true;
        self.backoff = 0;
        self.stats.reconnects += 1;
        self.go_back(now, self.peer_ack, GoBack::Force);
    }

    /// The next frame to write to the transport, if any, as its header and
    /// its payload (which is shared with the copy kept for resending).
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        queue: &mut SendQueue,
    ) -> Option<Transmit> {
        if self.dead || !self.connected {
            return None;
        }
        if self.resume_owed {
            self.resume_owed = false;
            return Some(self.control(now, FrameKind::Resume));
        }
        if self.nack_owed || self.nack_forced {
            self.nack_owed = false;
            let repeat = !std::mem::take(&mut self.nack_forced)
                && self
                    .last_nack
                    .is_some_and(|(e, at)| e == self.expected && now < at + self.rto());
            if !repeat {
                self.last_nack = Some((self.expected, now));
                self.stats.nacks_out += 1;
                return Some(self.control(now, FrameKind::Nack));
            }
        }
        if let Some(seq) = self.resend_next {
            return self.resend(now, seq);
        }
        if queue.ready(now, self.cfg.flush_delay, self.cfg.max_frame_payload)
            && self.can_send_data(queue)
        {
            return self.send_data(now, queue);
        }
        let ack_due = self.ack_now || self.ack_deadline.is_some_and(|d| now >= d);
        if ack_due || self.credit_owed() || now >= self.last_send + self.cfg.keepalive {
            return Some(self.control(now, FrameKind::Ack));
        }
        None
    }

    fn header(&mut self, kind: FrameKind, codec: Codec, seq: u64) -> Header {
        self.advertised = self.advertised.max(self.consumed + self.cfg.window);
        Header {
            kind,
            codec,
            failover: false,
            // Control frames have no payload to check.
            unchecked: kind == FrameKind::Data && !self.cfg.payload_checksum,
            link: self.index,
            connection: self.cfg.connection_id,
            seq,
            ack: self.expected,
            credit: self.advertised,
            len: 0,
        }
    }

    fn control(&mut self, now: Instant, kind: FrameKind) -> Transmit {
        let h = self.header(kind, Codec::Raw, self.next_seq);
        let t = Transmit {
            header: frame::encode_header(&h, &[]),
            parts: Vec::new(),
        };
        self.sent(now, t.len());
        t
    }

    /// Bookkeeping after any frame: it carried our acknowledgement and credit.
    fn sent(&mut self, now: Instant, bytes: usize) {
        self.last_send = now;
        self.acks_owed = 0;
        self.ack_bytes_owed = 0;
        self.ack_deadline = None;
        self.ack_now = false;
        self.stats.frames_out += 1;
        self.stats.bytes_out += bytes as u64;
    }

    fn resend(&mut self, now: Instant, seq: u64) -> Option<Transmit> {
        let first = self.unacked.front()?.seq;
        let idx = usize::try_from(seq.checked_sub(first)?).ok()?;
        let (codec, fseq, failover) = {
            let f = self.unacked.get(idx)?;
            (f.codec, f.seq, f.failover)
        };
        let h = Header {
            failover,
            ..self.header(FrameKind::Data, codec, fseq)
        };
        let epoch = self.epoch;
        let f = self.unacked.get_mut(idx)?;
        let out = Transmit {
            header: frame::encode_header_parts(&h, &f.parts),
            parts: f.parts.clone(),
        };
        f.last_sent = now;
        f.epoch = epoch;
        f.retransmitted = true;
        self.resend_next = (seq + 1 < self.next_seq.min(self.resend_end)).then_some(seq + 1);
        self.stats.retransmits += 1;
        self.sent(now, out.len());
        Some(out)
    }

    fn send_data(&mut self, now: Instant, queue: &mut SendQueue) -> Option<Transmit> {
        let cap = self.cfg.max_frame_payload;
        let failover = queue.head_is_failover();
        let credit = if failover {
            u64::MAX
        } else {
            self.credit_left()
        };
        let mut payload = PayloadBuilder::new();
        let mut cost = 0;
        let mut records = 0;
        while let Some(r) = queue.pull(cap - payload.len(), credit - cost, failover) {
            cost += r.cost();
            payload.push(&r);
            records += 1;
        }
        if records == 0 {
            return None;
        }
        let raw_len = payload.len();
        if let Some(since) = self.idle_since.take() {
            self.idle += now.saturating_duration_since(since);
        }
        let enc = self
            .compressor
            .encode(now, self.idle, payload.finish(), raw_len);
        let seq = self.next_seq;
        self.next_seq += 1;
        if !failover {
            self.sent_cost += cost;
        }
        let h = Header {
            failover,
            ..self.header(FrameKind::Data, enc.codec, seq)
        };
        let out = Transmit {
            header: frame::encode_header_parts(&h, &enc.parts),
            parts: enc.parts,
        };
        let wire_len = out.len() - frame::HEADER_LEN;
        self.stats.records_out += records;
        self.stats.payload_raw_out += raw_len as u64;
        self.stats.payload_wire_out += wire_len as u64;
        if enc.codec != Codec::Raw {
            self.stats.compressed_frames_out += 1;
        }
        self.unacked.push_back(SentFrame {
            seq,
            codec: enc.codec,
            failover,
            parts: out.parts.clone(),
            wire_len,
            raw_len,
            window: enc.window,
            cost,
            first_sent: now,
            last_sent: now,
            epoch: self.epoch,
            retransmitted: false,
        });
        self.sent(now, out.len());
        Some(out)
    }

    /// Records of frames never acknowledged, for another link to carry.
    pub(crate) fn take_unacked(&mut self) -> Result<Vec<Record>, DecodeError> {
        let mut records = Vec::new();
        for f in self.unacked.drain(..) {
            let wire = join(&f.parts);
            let raw = match f.codec {
                Codec::Raw => wire,
                codec => decompress(codec, &wire, frame::MAX_PAYLOAD)?,
            };
            records.extend(decode_payload(&raw)?);
        }
        self.resend_next = None;
        self.stats.failed_over += records.len() as u64;
        Ok(records)
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.unacked_frames = self.unacked.len() as u64;
        s.unacked_bytes = self.unacked.iter().map(|f| f.wire_len as u64).sum();
        s.send_credit = self.credit_left();
        s.srtt = self.rtt.srtt;
        s.compression_skipped = self.compressor.skipped;
        (
            s.auto_mode,
            s.auto_goodput_compressed,
            s.auto_goodput_raw,
            s.auto_probes,
            s.auto_switches,
            s.auto_busy_percent,
        ) = self.compressor.auto_state();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, Decoded};
    use crate::record::{Envelope, Message};

    fn kind_of(bytes: &[u8]) -> (FrameKind, u64) {
        match decode(bytes, frame::MAX_PAYLOAD) {
            Ok(Decoded::Frame { header, .. }) => (header.kind, header.seq),
            other => panic!("not a frame: {other:?}"),
        }
    }

    struct Pair {
        now: Instant,
        cfg: Config,
        a: LinkState,
        b: LinkState,
        qa: SendQueue,
        qb: SendQueue,
    }

    impl Pair {
        fn new() -> Pair {
            let now = Instant::now();
            let cfg = Config::builder()
                .compression(crate::Compression::Off)
                .build()
                .unwrap();
            let mut p = Pair {
                now,
                a: LinkState::new(now, &cfg, 0),
                b: LinkState::new(now, &cfg, 0),
                cfg,
                qa: SendQueue::default(),
                qb: SendQueue::default(),
            };
            // Exchange the opening credit announcements.
            p.flush_b();
            p.drain_a();
            p
        }

        /// Frames `a` sends now.
        fn drain_a(&mut self) -> Vec<Vec<u8>> {
            std::iter::from_fn(|| self.a.poll_transmit(self.now, &mut self.qa))
                .map(|t| t.to_vec())
                .collect()
        }

        /// Everything `b` sends now, delivered to `a`.
        fn flush_b(&mut self) -> Vec<(FrameKind, u64)> {
            let frames: Vec<_> =
                std::iter::from_fn(|| self.b.poll_transmit(self.now, &mut self.qb))
                    .map(|t| t.to_vec())
                    .collect();
            for f in &frames {
                self.a.handle_bytes(self.now, f).unwrap();
            }
            frames.iter().map(|f| kind_of(f)).collect()
        }

        /// Queues one message per frame and returns the frames `a` sends.
        fn send_frames(&mut self, n: usize) -> Vec<Vec<u8>> {
            (0..n)
                .flat_map(|i| {
                    let m = Message::new(
                        Envelope {
                            tag: i as i32,
                            ..Envelope::default()
                        },
                        vec![1u8; 100],
                    );
                    self.qa.push(self.now, m);
                    self.now += self.cfg.flush_delay;
                    self.drain_a()
                })
                .collect()
        }

        fn deliver_to_b(&mut self, frame: &[u8]) -> Received {
            self.b.handle_bytes(self.now, frame).unwrap()
        }
    }

    #[test]
    fn a_silent_link_is_reported_once_and_given_a_grace_period() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let builder = || {
            Config::builder()
                .keepalive(ms(100))
                .idle_timeout(ms(1000))
                .compression(crate::Compression::Off)
        };
        let cfg = builder().silent_reconnect(ms(400)).build().unwrap();
        let mut a = LinkState::new(t0, &cfg, 0);
        let mut b = LinkState::new(t0, &cfg, 0);
        let mut qb = SendQueue::default();
        assert!(a.poll_timeout(&SendQueue::default()).unwrap() <= t0 + ms(400));
        assert_eq!(a.handle_silence(t0 + ms(399)), None);
        assert_eq!(a.handle_silence(t0 + ms(400)), Some(ms(400)));
        assert_eq!(a.handle_silence(t0 + ms(900)), None, "once per silence");
        // The driver drops the stream and connects again; the link is not given up at
        // its idle timeout but a whole one after the report.
        a.handle_disconnect();
        a.handle_reconnect(t0 + ms(600));
        assert_eq!(a.handle_timeout(t0 + ms(1000)), None);
        assert_eq!(a.stats.silent_reconnects, 1);
        // Bytes on the new stream end the silence; the next one is reported again.
        let t1 = t0 + ms(700);
        assert_eq!(b.handle_timeout(t1), None);
        let keepalive = b.poll_transmit(t1, &mut qb).expect("a keepalive is due");
        a.handle_bytes(t1, &keepalive.to_vec()).unwrap();
        assert_eq!(a.handle_silence(t1 + ms(399)), None);
        assert_eq!(a.handle_silence(t1 + ms(400)), Some(ms(400)));
        assert_eq!(a.handle_timeout(t1 + ms(1399)), None);
        assert!(matches!(
            a.handle_timeout(t1 + ms(1400)),
            Some(CloseReason::IdleTimeout(_))
        ));

        // Without the setting nothing is reported and the idle timeout stands.
        let cfg = builder().build().unwrap();
        let mut c = LinkState::new(t0, &cfg, 0);
        assert_eq!(c.handle_silence(t0 + ms(999)), None);
        assert!(c.handle_timeout(t0 + ms(1000)).is_some());
    }

    #[test]
    fn a_gap_is_nacked_once_and_the_tail_resent_once() {
        let mut p = Pair::new();
        let frames = p.send_frames(3);
        assert_eq!(frames.len(), 3);
        p.now += Duration::from_millis(5);
        assert_eq!(p.deliver_to_b(&frames[0]).records.len(), 1);
        assert!(
            p.deliver_to_b(&frames[2]).records.is_empty(),
            "frame 1 is missing"
        );
        assert_eq!(p.flush_b(), vec![(FrameKind::Nack, 0)]);
        let resent: Vec<_> = p.drain_a().iter().map(|f| kind_of(f)).collect();
        assert_eq!(resent, vec![(FrameKind::Data, 1), (FrameKind::Data, 2)]);
        // The same gap reported again before a round trip has passed changes nothing:
        // the resends are on their way.
        p.b.nack_owed = true;
        p.b.last_nack = None;
        assert_eq!(p.flush_b(), vec![(FrameKind::Nack, 0)]);
        assert!(p.drain_a().is_empty());
        assert_eq!(p.a.stats.retransmits, 2);
    }

    #[test]
    fn small_frames_are_acknowledged_after_many_or_after_the_delay() {
        let mut p = Pair::new();
        let frames = p.send_frames(ACK_FRAMES as usize);
        // A few small frames: no acknowledgement of their own yet.
        for f in &frames[..ACK_FRAMES as usize - 1] {
            p.deliver_to_b(f);
        }
        assert!(p.flush_b().is_empty(), "acknowledged before its delay");
        // The delay passes: one acknowledgement of them all.
        p.now += p.cfg.ack_delay;
        p.b.handle_timeout(p.now);
        assert_eq!(p.flush_b(), vec![(FrameKind::Ack, 0)]);
        assert_eq!(p.a.peer_ack, ACK_FRAMES as u64 - 1);
        // The count of frames makes it due at once.
        let more = p.send_frames(ACK_FRAMES as usize);
        p.deliver_to_b(&frames[ACK_FRAMES as usize - 1]);
        for f in &more[..ACK_FRAMES as usize - 1] {
            p.deliver_to_b(f);
        }
        assert_eq!(p.flush_b(), vec![(FrameKind::Ack, 0)]);
        assert_eq!(p.a.peer_ack, 2 * ACK_FRAMES as u64 - 1);
        // So do the bytes, in two frames or more: two of half the threshold.
        let big = ACK_BYTES as usize / 2;
        let m = |tag| {
            Message::new(
                Envelope {
                    tag,
                    ..Envelope::default()
                },
                vec![7u8; big],
            )
        };
        p.deliver_to_b(&more[ACK_FRAMES as usize - 1]);
        p.qa.push(p.now, m(1));
        let first = p.drain_a();
        p.qa.push(p.now, m(2));
        let second = p.drain_a();
        p.flush_b();
        for f in first.iter().chain(&second) {
            p.deliver_to_b(f);
        }
        assert_eq!(p.flush_b(), vec![(FrameKind::Ack, 0)]);
        assert_eq!(p.a.peer_ack, p.a.next_seq);
    }

    #[test]
    fn retransmission_timeout_backs_off_until_a_fresh_round_trip() {
        let mut p = Pair::new();
        let frames = p.send_frames(1);
        let mut fired = Vec::new();
        for _ in 0..3 {
            let t = p.a.rto_deadline().unwrap();
            fired.push(t);
            p.now = t;
            assert!(p.a.handle_timeout(p.now).is_none());
            assert_eq!(
                p.drain_a().iter().map(|f| kind_of(f)).collect::<Vec<_>>(),
                vec![(FrameKind::Data, 0)]
            );
        }
        let gaps: Vec<_> = fired.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[1], gaps[0] * 2, "{gaps:?}");
        assert_eq!(p.a.backoff, 3);
        p.deliver_to_b(&frames[0]);
        p.b.ack_now = true;
        p.flush_b();
        // Karn: a resent frame's acknowledgement gives no sample, so the backed-off
        // timeout stays (RFC 6298) ...
        assert_eq!((p.a.backoff, p.a.unacked.len()), (3, 0));
        assert!(p.a.rtt.srtt.is_none());
        // ... until a frame sent once comes back.
        let f = p.send_frames(1);
        p.now += Duration::from_millis(3);
        p.deliver_to_b(&f[0]);
        p.b.ack_now = true;
        p.flush_b();
        assert_eq!(p.a.backoff, 0);
        assert!(p.a.rtt.srtt.is_some());
    }

    #[test]
    fn a_first_timeout_resends_the_oldest_frame_and_a_second_the_rest() {
        let mut p = Pair::new();
        let frames = p.send_frames(4);
        // Frames still queued before a slow line: the first timeout probes with
        // the oldest alone.
        p.now = p.a.rto_deadline().unwrap();
        p.a.handle_timeout(p.now);
        assert_eq!(p.drain_a(), frames[..1]);
        // Its original arrives (it was only late): the acknowledgement ends the
        // probe, and the frames behind it are not resent.
        p.deliver_to_b(&frames[0]);
        p.b.ack_now = true;
        p.flush_b();
        assert!(p.drain_a().is_empty());
        // Nothing more arrives (the tail was lost): the next timeout, the backoff
        // kept, resends all of it.
        p.now = p.a.rto_deadline().unwrap();
        p.a.handle_timeout(p.now);
        assert_eq!(p.drain_a(), frames[1..]);
        for f in &frames[1..] {
            p.deliver_to_b(f);
        }
        p.b.ack_now = true;
        p.flush_b();
        assert!(p.a.unacked.is_empty());
        assert_eq!(p.a.stats.retransmits, 4);
    }

    #[test]
    fn a_nack_during_a_probe_resends_everything_from_the_gap() {
        let mut p = Pair::new();
        let frames = p.send_frames(3);
        p.now = p.a.rto_deadline().unwrap();
        p.a.handle_timeout(p.now);
        // The peer reports frame 0 missing before the probe went out.
        p.deliver_to_b(&frames[1]);
        p.flush_b();
        assert_eq!(p.drain_a(), frames);
    }

    #[test]
    fn a_deep_queue_drained_with_steady_acknowledgements_is_not_resent() {
        let mut p = Pair::new();
        // Quick round trips first: the timeout comes down to its floor.
        for _ in 0..5 {
            let f = p.send_frames(1);
            p.now += Duration::from_millis(1);
            p.deliver_to_b(&f[0]);
            p.b.ack_now = true;
            p.flush_b();
        }
        assert_eq!(p.a.rto(), p.cfg.min_rto);
        // Then 40 frames written at once into a transport that delivers one every
        // 10 ms (a socket buffer before a slow line): the last waits 400 ms, far
        // beyond the timeout, yet an acknowledgement comes every 10 ms.
        let frames = p.send_frames(40);
        for f in &frames {
            p.now += Duration::from_millis(10);
            assert!(p.a.handle_timeout(p.now).is_none());
            assert!(
                p.drain_a().is_empty(),
                "queued frame {} was resent",
                p.a.peer_ack
            );
            p.deliver_to_b(f);
            p.b.ack_now = true;
            p.flush_b();
        }
        assert_eq!((p.a.stats.retransmits, p.a.unacked.len()), (0, 0));
        // Silence does still resend, one timeout after the last acknowledgement.
        let f = p.send_frames(1);
        p.now += p.a.rto();
        p.a.handle_timeout(p.now);
        assert_eq!(p.drain_a(), f);
    }

    #[test]
    fn reconnect_resends_once_even_when_both_ends_resume() {
        let mut p = Pair::new();
        let frames = p.send_frames(3);
        p.deliver_to_b(&frames[0]);
        // The stream breaks with frames 1 and 2 lost; both ends reconnect.
        p.now += Duration::from_millis(1);
        p.a.handle_disconnect();
        p.b.handle_disconnect();
        p.a.handle_reconnect(p.now);
        p.b.handle_reconnect(p.now);
        let sent: Vec<_> = p.drain_a().iter().map(|f| kind_of(f)).collect();
        assert_eq!(
            sent,
            vec![
                (FrameKind::Resume, 3),
                (FrameKind::Data, 0),
                (FrameKind::Data, 1),
                (FrameKind::Data, 2)
            ]
        );
        // b's Resume (ack 1) crossed a's resends: frames 1 and 2 already went out on
        // the new stream, so nothing is sent again.
        assert_eq!(p.flush_b()[0], (FrameKind::Resume, 0));
        assert!(p.drain_a().iter().all(|f| kind_of(f).0 != FrameKind::Data));
        assert_eq!(p.a.stats.retransmits, 3);
    }

    /// `frame` without `n` bytes of its payload: its header announces more than comes.
    fn with_a_gap(frame: &[u8], n: usize) -> Vec<u8> {
        let mut f = frame.to_vec();
        f.drain(frame::HEADER_LEN + 10..frame::HEADER_LEN + 10 + n);
        f
    }

    #[test]
    fn a_silent_partial_frame_is_given_up_once_and_nacked_at_once() {
        let mut p = Pair::new();
        let frames = p.send_frames(2);
        let sent = p.now;
        // A NACK for the same gap went out just now, which would hold back another.
        p.b.last_nack = Some((0, p.now));
        p.deliver_to_b(&with_a_gap(&frames[0], 10));
        let deadline = sent + p.cfg.partial_frame_timeout;
        assert_eq!(p.b.poll_timeout(&p.qb), Some(deadline));
        p.now = deadline - Duration::from_micros(1);
        assert!(p.b.handle_stall(p.now).unwrap().records.is_empty());
        assert_eq!(p.b.stats.stalled_frames_in, 0);

        p.now = deadline;
        p.b.handle_stall(p.now).unwrap();
        assert_eq!(p.b.stats.stalled_frames_in, 1);
        assert_eq!(p.b.decoder.buffered(), 0, "nothing left to give up");
        // No busy loop: the deadline is gone and firing again does nothing.
        assert!(p.b.poll_timeout(&p.qb).unwrap() > p.now);
        p.b.handle_stall(p.now).unwrap();
        assert_eq!(p.b.stats.stalled_frames_in, 1);
        assert_eq!(p.flush_b(), vec![(FrameKind::Nack, 0)]);
        let resent: Vec<_> = p.drain_a().iter().map(|f| kind_of(f)).collect();
        assert_eq!(resent, vec![(FrameKind::Data, 0), (FrameKind::Data, 1)]);
    }

    #[test]
    fn a_frame_arriving_in_the_gap_does_not_put_off_the_give_up_but_payload_does() {
        let mut p = Pair::new();
        let frames = p.send_frames(1);
        // Room in the gap for more than a keepalive.
        p.deliver_to_b(&with_a_gap(&frames[0], 100));
        let deadline = p.b.stall_deadline().unwrap();
        // A keepalive lands in the gap: taken for payload, but no progress.
        p.now += Duration::from_millis(150);
        let keepalive = p.a.control(p.now, FrameKind::Ack).to_vec();
        p.deliver_to_b(&keepalive);
        assert_eq!(p.b.stall_deadline(), Some(deadline));
        // Bytes that could be the rest of the payload are progress.
        p.deliver_to_b(&[0; 5]);
        let deadline = p.now + p.cfg.partial_frame_timeout;
        assert_eq!(p.b.stall_deadline(), Some(deadline));
        // Given up, the keepalive is found again in the bytes: a whole frame in there.
        let frames_in = p.b.stats.frames_in;
        p.now = deadline;
        p.b.handle_stall(p.now).unwrap();
        assert_eq!(p.b.stats.frames_in, frames_in + 1);
    }

    #[test]
    fn the_expected_frame_found_inside_a_given_up_duplicate_is_accepted() {
        let mut p = Pair::new();
        p.qa.push(p.now, Message::new(Envelope::default(), vec![2u8; 2000]));
        p.now += p.cfg.flush_delay;
        let big = p.drain_a();
        let small = p.send_frames(1);
        assert_eq!(
            (kind_of(&big[0]), kind_of(&small[0])),
            ((FrameKind::Data, 0), (FrameKind::Data, 1))
        );
        assert_eq!(p.deliver_to_b(&big[0]).records.len(), 1);
        // A needless resend of frame 0 loses bytes; frame 1 ends up inside its length.
        p.deliver_to_b(&with_a_gap(&big[0], 1000));
        assert!(p.deliver_to_b(&small[0]).records.is_empty());
        p.now += p.cfg.partial_frame_timeout;
        assert_eq!(p.b.handle_stall(p.now).unwrap().records.len(), 1);
        assert_eq!(p.b.expected, 2);
    }

    #[test]
    fn a_premature_give_up_doubles_the_timeout_until_frames_pass_quickly_again() {
        let mut p = Pair::new();
        let frames = p.send_frames(2);
        let (head, tail) = frames[0].split_at(frame::HEADER_LEN + 50);
        p.deliver_to_b(head);
        p.now += p.cfg.partial_frame_timeout;
        p.b.handle_stall(p.now).unwrap();
        // The rest of the frame comes after all: it was paused, not lost.
        p.now += Duration::from_millis(50);
        p.deliver_to_b(tail);
        assert_eq!(p.b.stall_backoff, 1);
        assert_eq!(p.b.stall_timeout(1), p.cfg.partial_frame_timeout * 2);
        // A resend that pauses longer than the floor inside passes and keeps the longer
        // timeout; one without pauses brings it back.
        p.deliver_to_b(head);
        p.now += p.cfg.partial_frame_timeout + Duration::from_millis(50);
        assert!(p.b.handle_stall(p.now).unwrap().records.is_empty());
        assert_eq!(p.deliver_to_b(tail).records.len(), 1);
        assert_eq!(p.b.stall_backoff, 1);
        assert_eq!(p.deliver_to_b(&frames[1]).records.len(), 1);
        assert_eq!(p.b.stall_backoff, 0);
        assert_eq!(p.b.stats.stalled_frames_in, 1);
    }

    #[test]
    fn an_acknowledgement_of_unsent_frames_is_a_protocol_error() {
        let mut p = Pair::new();
        p.b.expected = 5;
        p.b.ack_now = true;
        let f = p.b.poll_transmit(p.now, &mut p.qb).unwrap().to_vec();
        assert_eq!(
            p.a.handle_bytes(p.now, &f).unwrap_err(),
            ProtocolError::AckBeyondSent { ack: 5, sent: 0 }
        );
    }
}
