//! The router process that carries traffic between meta hosts (sites),
//! after MetaMPICH's router and PACX-MPI's two daemons.
//!
//! Vertical: every rank of the router's site connects to it (one TCP
//! connection, the rank's hello first) and sends it frames for ranks on the
//! router's peer site. Horizontal: the router sends those frames over its
//! outgoing links to the peer site's router, which writes them to the
//! destination rank's vertical connection unchanged, so the rank sees the
//! original sender ("pretending to be the real sender"). Frames are the
//! library's own 64-byte envelopes plus payload; the destination world rank
//! is in the envelope.
//!
//! Ordering: all frames of one (source, destination) pair take the same
//! vertical connection and the same peer connection, whose wire [`Bundle`]
//! delivers messages in send order however its links (several TCP
//! connections, striped) carried the fragments; delivery to a rank is FIFO.
//! So MPI's non-overtaking rule holds.
//!
//! One thread drives everything with non-blocking sockets and `ppoll`: a frame
//! read from a rank goes onto the link in the same pass (no hand-over between
//! threads, which cost a wake-up per hop). Link emulation (bandwidth as a
//! virtual-finish-time token bucket, latency as a delay line) sits between
//! the wire protocol and each link's socket. A link whose connection breaks
//! is reconnected (the sending side dials again with backoff) and the wire
//! protocol resends what was not acknowledged. Memory is bounded: a full
//! peer connection stops the router reading from ranks, and a full queue
//! towards ranks stops it taking messages from links, whose credit then
//! holds the sending router back.
//!
//! A router is this crate's [`run`], in a process of its own: `metampi run`
//! (and any program that calls [`run_from_env`] first, as the test kit and
//! `psrsearch` do) becomes one when the launcher
//! (`metampi_launch::meta`) sets `METAMPI_ROUTER_SPEC`.

#![deny(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use metampi_wire::frame::reserve_for_frames_within;
use metampi_wire::{AutoMode, Bundle, Compression, Config, Event, Transmit};

use metampi::auth;
use metampi::auth::VERTICAL_CTX;
pub use metampi_launch::router_spec::{
    read_ready, Identity, LinkTls, OutLink, PeerCheck, RouterSpec, COMPRESSIONS,
};
use metampi_sys as sys;
use metampi_sys::envelope::ENV_LEN;
use sys::vchan::{Offer, VChan, OFFER_LEN};

mod reader;
mod switch;
pub mod tls;
mod writer;

use switch::{
    frame_size, Budget, Inlet, LinkHello, Outlet, PeerKey, Peers, Switch, LINK_HELLO,
    MAX_WIRE_MESSAGE,
};

fn parse_compression(s: &str) -> Option<Compression> {
    Some(match s {
        "off" => Compression::Off,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        "auto" => Compression::Auto,
        _ => return None,
    })
}

/// The wire configuration both ends of link `id` use. The transport is TCP,
/// which already delivers every byte: resends are only for reconnects and
/// corruption, so the retransmission timer is generous, and frames are kept
/// small so that an emulated slow line stays pipelined. The receive window and the send
/// buffer are the router's [`Budget`]'s.
fn wire_config(
    id: u32,
    compression: Compression,
    slow: bool,
    checksum: bool,
    budget: &Budget,
) -> Config {
    let builder = Config::builder()
        .connection_id(id)
        .max_message_len(MAX_WIRE_MESSAGE)
        // A byte lost inside a frame is only found once the frame's announced
        // length has arrived: frames of 256 KiB keep that wait short.
        .max_frame_payload(if slow { 64 << 10 } else { 256 << 10 })
        // Bundle what piles up while a frame is out, never hold a lone message.
        .flush_delay(Duration::ZERO)
        .ack_delay(Duration::from_micros(ACK_DELAY_US))
        .window(budget.window)
        .send_buffer(budget.send_buffer)
        .initial_rto(Duration::from_secs(1))
        .min_rto(Duration::from_millis(500))
        // TCP itself pauses inside a frame while it recovers a lost segment (its
        // timeout is 200 ms at least, then doubles): a give-up before that is
        // premature and costs a resend of everything after the frame. A pure
        // receiver (it sends only acknowledgements) measures no round trip to
        // stretch the wait by.
        .partial_frame_timeout(Duration::from_secs(1))
        .idle_timeout(link_timeout())
        .keepalive((link_timeout() / 3).min(Duration::from_secs(1)))
        // A TCP stream backing off after repeated losses on a congested line can stay
        // silent past the link timeout without breaking; a new connection does not
        // inherit its backoff (issue 43's abort over a shaped line).
        .silent_reconnect(link_timeout() / 2)
        .payload_checksum(checksum);
    match builder.clone().compression(compression).build() {
        Ok(config) => config,
        // zstd may be compiled out: fall back to lz4 rather than refuse to run.
        Err(_) => builder
            .compression(Compression::Lz4)
            .build()
            .expect("the router's wire configuration is valid"),
    }
}

/// How long a link may stay silent or disconnected before it is given up
/// (`METAMPI_LINK_TIMEOUT`, seconds; default 10). A connection whose links
/// are all given up ends the router, and with it the job.
fn link_timeout() -> Duration {
    metampi::knobs::seconds("METAMPI_LINK_TIMEOUT")
        .map_or(Duration::from_secs(10), Duration::from_secs_f64)
}

/// Acknowledgement delay on router links (µs). Delayed acknowledgements cost
/// a ping-pong through two routers about 0.5 ms each way (measured with the
/// wire crate's 1 ms default), so acknowledge at once.
const ACK_DELAY_US: u64 = 2000;

/// Emulated link: each chunk of bytes is serialised at the link rate after
/// the previous one (virtual finish time) and then propagates for the
/// latency; it is written to the socket when it would arrive. The wire
/// protocol is only asked for more bytes when the emulated line is idle, so
/// its retransmission timer sees the link's real round trip, not a queue.
/// How far ahead of the emulated line the shaper takes frames.
const LINE_SLACK: Duration = Duration::from_millis(2);

struct Shaper {
    bytes_per_sec: Option<u64>,
    latency: Option<Duration>,
    next_free: Instant,
    /// Frames waiting for their arrival time, with the bytes already written.
    queue: VecDeque<(Instant, Transmit, usize)>,
    /// The front frame waits for room in the link's writer thread, which
    /// wakes the loop (the socket's readiness says nothing about it).
    held_for_writer: bool,
}

impl Shaper {
    fn new(bytes_per_sec: Option<u64>, latency: Option<Duration>) -> Shaper {
        Shaper {
            bytes_per_sec,
            latency,
            next_free: Instant::now(),
            queue: VecDeque::new(),
            held_for_writer: false,
        }
    }

    /// Whether the emulated line can take more bytes now: a little before it
    /// is idle, so that the loop waking late never leaves the line unused.
    fn can_take(&self, now: Instant) -> bool {
        self.next_free <= now + LINE_SLACK && self.queue.len() < 4096
    }

    fn push(&mut self, now: Instant, bytes: Transmit) {
        let mut done = now;
        if let Some(bps) = self.bytes_per_sec {
            done =
                self.next_free.max(now) + Duration::from_secs_f64(bytes.len() as f64 / bps as f64);
            self.next_free = done;
        }
        self.queue
            .push_back((done + self.latency.unwrap_or_default(), bytes, 0));
    }

    /// Writes what is due (its arrival time has come), handing large frames,
    /// and any frame while earlier ones wait there, to `writer`.
    fn write(
        &mut self,
        s: &mut TcpStream,
        now: Instant,
        writer: Option<&writer::Writer>,
    ) -> io::Result<()> {
        self.held_for_writer = false;
        while let Some((due, t, done)) = self.queue.front() {
            if *due > now {
                break;
            }
            let hand =
                writer.filter(|w| *done == 0 && (w.busy() || t.len() >= writer::HAND_OVER_BYTES));
            if let Some(w) = hand {
                let (due, t, _) = self.queue.pop_front().expect("a front frame");
                if let Err(t) = w.offer(t)? {
                    self.queue.push_front((due, t, 0));
                    self.held_for_writer = true;
                    break;
                }
                continue;
            }
            let Some((_, t, done)) = self.queue.front_mut() else {
                break;
            };
            // Header and payload parts in one writev: the payload is not copied.
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let n = io_slices(t, *done, &mut iov);
            let r = s.write_vectored(&iov[..n]);
            let total = t.len();
            match r {
                Ok(n) => {
                    *done += n;
                    if *done == total {
                        self.queue.pop_front();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// [`Shaper::write`] through a TLS session: what is due is encrypted as
    /// far as the session's bounded send buffer takes it, and the records go
    /// out as the socket takes them; `done` counts bytes the session took.
    fn write_tls(
        &mut self,
        s: &mut TcpStream,
        t: &mut tls::TlsStream,
        now: Instant,
    ) -> io::Result<()> {
        loop {
            t.flush(s)?;
            if t.wants_write() {
                return Ok(());
            }
            let Some((due, f, done)) = self.queue.front_mut() else {
                return Ok(());
            };
            if *due > now {
                return Ok(());
            }
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let k = io_slices(f, *done, &mut iov);
            let n = t.write_plain(&iov[..k])?;
            *done += n;
            if *done == f.len() {
                self.queue.pop_front();
            }
            if n == 0 {
                return Ok(());
            }
        }
    }

    /// When a timer of the emulated line next needs the loop (an arrival
    /// falls due, or the line frees up); `None` when nothing waits on time.
    fn due(&self, now: Instant) -> Option<Instant> {
        let free = (self.next_free > now + LINE_SLACK).then_some(self.next_free - LINE_SLACK);
        match self.queue.front() {
            Some(f) if f.0 <= now => None,
            Some(f) => Some(free.map_or(f.0, |t| t.min(f.0))),
            None => free,
        }
    }

    fn blocked_on_socket(&self, now: Instant) -> bool {
        !self.held_for_writer && self.queue.front().is_some_and(|f| f.0 <= now)
    }
}

/// I/O vector entries per write of a frame; a frame has at most about 130 parts
/// (see `metampi_wire::record::INLINE_BELOW`), and what does not fit goes in the
/// next write.
const MAX_IOV: usize = 64;

/// Fills `iov` with frame `t`'s bytes after the first `done`; how many entries.
fn io_slices<'a>(t: &'a Transmit, done: usize, iov: &mut [IoSlice<'a>; MAX_IOV]) -> usize {
    io_slices_upto(t, done, usize::MAX, iov)
}

/// [`io_slices`], at most `cap` bytes.
fn io_slices_upto<'a>(
    t: &'a Transmit,
    done: usize,
    cap: usize,
    iov: &mut [IoSlice<'a>; MAX_IOV],
) -> usize {
    let (mut n, mut room) = (0, cap);
    for (slot, part) in iov.iter_mut().zip(t.slices_from(done)) {
        let part = &part[..part.len().min(room)];
        *slot = IoSlice::new(part);
        n += 1;
        room -= part.len();
        if room == 0 {
            break;
        }
    }
    n
}

/// ", down since <UTC time>" for a message, when known.
fn lost_since(t: Option<std::time::SystemTime>) -> String {
    let Some(t) = t else {
        return String::new();
    };
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let ago = t.elapsed().map_or(0.0, |d| d.as_secs_f64());
    format!(", down since {h:02}:{m:02}:{s:02} UTC ({ago:.1} s)")
}

/// Where a link's statistics are written while the job runs.
fn stats_path(router: usize, link: u32, side: &str) -> Option<std::path::PathBuf> {
    let dir = metampi::knobs::os("METAMPI_ROUTER_STATS")?;
    Some(std::path::PathBuf::from(dir).join(format!("router-{router}-link-{link}-{side}.json")))
}

/// Writes a link's statistics as one JSON object; `compression` is the link's
/// setting, and with `auto` the mode it chose and the goodput it measured in each
/// (uncompressed bytes per second of the link being busy; 0 before a
/// measurement), which is why it chose it.
fn write_stats(
    path: &std::path::Path,
    st: &metampi_wire::Stats,
    compression: &str,
    checksum: bool,
) {
    let mode = match st.auto_mode {
        AutoMode::NotAuto => compression,
        m => m.as_str(),
    };
    let text = serde_json::json!({
        "bytes_out": st.bytes_out,
        "bytes_in": st.bytes_in,
        "frames_out": st.frames_out,
        "frames_in": st.frames_in,
        "payload_raw_out": st.payload_raw_out,
        "payload_wire_out": st.payload_wire_out,
        "compression_ratio_out": st.compression_ratio_out(),
        "retransmits": st.retransmits,
        "timeouts": st.timeouts,
        "nacks_in": st.nacks_in,
        "nacks_out": st.nacks_out,
        "duplicates_in": st.duplicates_in,
        "out_of_order_in": st.out_of_order_in,
        "reconnects": st.reconnects,
        "silent_reconnects": st.silent_reconnects,
        "srtt_us": st.srtt.map_or(0, |d| d.as_micros() as u64),
        "queued_messages": st.queued_messages,
        "queued_bytes": st.queued_bytes,
        "unacked_bytes": st.unacked_bytes,
        "corrupt_in": st.corrupt_in,
        "stalled_frames_in": st.stalled_frames_in,
        "compression": compression,
        "compression_mode": mode,
        "compressed_frames_out": st.compressed_frames_out,
        "compression_skipped": st.compression_skipped,
        "goodput_compressed_bps": st.auto_goodput_compressed,
        "goodput_raw_bps": st.auto_goodput_raw,
        "auto_probes": st.auto_probes,
        "auto_switches": st.auto_switches,
        "auto_busy_percent": st.auto_busy_percent,
        "payload_checksum_out": checksum,
        "unchecked_frames_in": st.unchecked_frames_in,
        "reader_chunks_in": st.chunks_handed_in,
    })
    .to_string()
        + "\n";
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Where a router process stands with one TCP connection to a peer router.
struct WireConn {
    stream: TcpStream,
    shaper: Shaper,
    /// The TLS session on `stream`, on a link with TLS.
    tls: Option<Box<tls::TlsStream>>,
    /// The thread that writes large frames (plain, unshaped outgoing links
    /// where cores are spare; see [`writer`]).
    writer: Option<writer::Writer>,
    /// The thread that reads the socket (plain incoming links, where asked
    /// for; see [`reader`]).
    reader: Option<reader::Reader>,
}

impl WireConn {
    /// Whether frames written to this connection may still be on their way:
    /// waiting in the shaper's delay line or the writer thread, or in the
    /// socket unacknowledged by the peer's kernel.
    fn delivering(&self) -> bool {
        !self.shaper.queue.is_empty()
            || self.writer.as_ref().is_some_and(writer::Writer::busy)
            || sys::poll::unacked_bytes(self.stream.as_raw_fd()).is_ok_and(|n| n > 0)
    }

    /// Reads what arrived (decrypted on a TLS link) straight into the buffer
    /// link `link` of `bundle` decodes frames from, which then takes it (the
    /// bytes are not copied again: the messages it delivers are slices of that
    /// buffer). Returns the bytes read and `false` at the end of the stream.
    fn read_into(
        &mut self,
        bundle: &mut Bundle,
        now: Instant,
        link: usize,
    ) -> io::Result<(usize, bool)> {
        if let Some(r) = &self.reader {
            return read_from_reader(r, bundle, now, link);
        }
        let Some(w) = &self.writer else {
            return read_link(&mut self.stream, self.tls.as_deref_mut(), bundle, now, link);
        };
        // What the writer thread read comes first; while it writes, the
        // socket is its to read. The inbox stays locked through a read here.
        let mut inbox = w.inbox();
        let n = inbox.bytes.len();
        if n > 0 {
            bundle.handle_bytes(now, link, &inbox.bytes);
            inbox.bytes.clear();
        }
        if inbox.closed {
            return Ok((n, false));
        }
        if w.busy() {
            return Ok((n, true));
        }
        let (m, open) = read_link(&mut self.stream, None, bundle, now, link)?;
        Ok((n + m, open))
    }

    /// The descriptor the loop polls: none while the writer thread reads it, or
    /// where a reader thread does.
    fn poll_fd(&self) -> i32 {
        match &self.writer {
            _ if self.reader.is_some() => -1,
            Some(w) if w.busy() => -1,
            _ => self.stream.as_raw_fd(),
        }
    }

    /// Writes the shaper's due frames.
    fn write(&mut self, now: Instant) -> io::Result<()> {
        if let Some(w) = &self.writer {
            w.check()?;
        }
        match self.tls.as_mut() {
            None => self
                .shaper
                .write(&mut self.stream, now, self.writer.as_ref()),
            Some(t) => self.shaper.write_tls(&mut self.stream, t, now),
        }
    }

    /// Bytes wait inside the TLS session, or in the writer thread's inbox:
    /// read again without waiting for the socket.
    fn pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.pending())
            || self.reader.as_ref().is_some_and(reader::Reader::pending)
            || self.writer.as_ref().is_some_and(|w| {
                let inbox = w.inbox();
                inbox.closed || !inbox.bytes.is_empty()
            })
    }

    /// The loop must wait for the socket to take bytes.
    fn wants_write(&self, now: Instant) -> bool {
        self.shaper.blocked_on_socket(now) || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }
}

/// What the reader thread of link `link` read, handed to `bundle` in order;
/// the end of the stream or the thread's read error after the last of it.
fn read_from_reader(
    r: &reader::Reader,
    bundle: &mut Bundle,
    now: Instant,
    link: usize,
) -> io::Result<(usize, bool)> {
    let mut inbox = r.inbox();
    let chunks = inbox.take();
    let closed = inbox.closed;
    let failed = inbox.failed.take();
    drop(inbox);
    r.made_room();
    let mut n = 0;
    for c in chunks {
        n += c.len();
        bundle.handle_owned(now, link, c);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok((n, !closed)),
    }
}

/// Reads what arrived on a link (decrypted on a TLS link) straight into the
/// buffer link `link` of `bundle` decodes frames from (see [`WireConn::read_into`]).
fn read_link(
    stream: &mut TcpStream,
    mut tls: Option<&mut tls::TlsStream>,
    bundle: &mut Bundle,
    now: Instant,
    link: usize,
) -> io::Result<(usize, bool)> {
    let mut total = 0;
    while total < READ_BUDGET {
        let (r, n) = bundle.handle_read(now, link, |buf, max| {
            let max = max.min(READ_BUDGET - total);
            let before = buf.len();
            let r = match tls.as_deref_mut() {
                None => match sys::read::read_append(&*stream, buf, max) {
                    Ok(0) => Ok(Some(false)),
                    // A short read: the socket is drained.
                    Ok(n) if n < max => Ok(Some(true)),
                    Ok(_) => Ok(None),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(true)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
                    Err(e) => Err(e),
                },
                // Stops when the socket would block, or with `pending` set.
                Some(t) => t
                    .fill_at_most(stream, buf, max)
                    .map(|open| (!open || !t.pending()).then_some(open)),
            };
            (r, buf.len().saturating_sub(before))
        });
        total += n;
        // `Some(open)`: nothing more to read now.
        if let Some(open) = r? {
            return Ok((total, open));
        }
    }
    Ok((total, true))
}

/// One logical connection to or from a peer router, as the driver keeps it: one TCP
/// connection per configured link (striping), under the switch's wire [`Bundle`].
struct Peer {
    /// Its links, by their index in the bundle.
    links: Vec<PeerLink>,
    /// The compression setting of its sending side, for the statistics.
    compression: String,
    /// Its sending side's frames cover their payload, for the statistics.
    checksum: bool,
    label: String,
    /// Frames written and bytes read per link, with `METAMPI_TRACE`.
    trace: Option<metampi_sys::linklog::LinkLog>,
}

/// One configured link to or from a peer router.
struct PeerLink {
    /// Its current connection; `None` while it is down.
    conn: Option<WireConn>,
    /// Emulation of a slow line, applied to its sending side.
    emulation: (Option<u64>, Option<Duration>),
    /// Outgoing side: where it connects, for reconnecting (empty on the incoming side).
    addr: String,
    /// Outgoing side: its TLS end (`None`: plain).
    dialer: Option<tls::Dialer>,
    /// Outgoing side: a connector thread is working on it.
    connecting: bool,
    /// Its id in the layout.
    layout_id: u32,
    /// When its connection broke, while it is down.
    lost_at: Option<std::time::SystemTime>,
    stats: Option<std::path::PathBuf>,
}

impl PeerLink {
    /// A link not connected yet; the incoming side learns its layout id and statistics
    /// path from its hello.
    fn new(emulation: (Option<u64>, Option<Duration>), layout_id: u32) -> PeerLink {
        PeerLink {
            conn: None,
            emulation,
            addr: String::new(),
            dialer: None,
            connecting: false,
            layout_id,
            lost_at: None,
            stats: None,
        }
    }
}

/// A local rank's connection (vertical traffic).
struct RankConn {
    rank: u32,
    stream: TcpStream,
    /// Its channel offer has not arrived yet: nothing is read or written.
    offer_pending: bool,
    /// On this node: frames travel through shared-memory pipes, and the
    /// connection only rings and tells when the rank is gone.
    vchan: Option<VChan>,
    /// The rank closed its connection; its pipe is read to the end first.
    bell_eof: bool,
    /// What it sent that is not on a peer connection yet.
    inlet: Inlet,
    /// Its next read needs memory beyond the budget: not read (nor polled) until
    /// there is room.
    starved: bool,
    /// Its outlet in the switch: what waits to be written to it.
    port: usize,
    /// What its pipe has on loan (see `sys::vchan`).
    lent: Loans,
}

/// Buffers lent to a rank through its pipe, oldest first, kept until the
/// rank has copied them.
#[derive(Default)]
struct Loans {
    out: VecDeque<Bytes>,
    /// Loans made so far (the rank counts those it returned).
    made: u64,
    bytes: usize,
}

impl Loans {
    /// Drops what the rank has returned (`returned` loans in all).
    fn settle(&mut self, returned: u64) {
        let outstanding = self.made.saturating_sub(returned) as usize;
        while self.out.len() > outstanding {
            let b = self.out.pop_front().expect("longer than outstanding");
            self.bytes -= b.len();
        }
    }
}

/// Buffers at least this long go to a rank on loan rather than copied into
/// its pipe: below it a copy costs less than the rank's system call.
const LEND_MIN: usize = 16 << 10;
/// Bytes on loan to one rank at most; beyond, buffers are copied.
const LEND_MAX: usize = 8 << 20;

/// A connection that has not said who it is yet.
struct Hello {
    stream: TcpStream,
    /// On a TLS listener: the session the handshake and the hello run in.
    tls: Option<Box<tls::TlsStream>>,
    /// The handshake's challenge sent to this connection.
    nonce: [u8; auth::NONCE],
    /// The answer so far: nonce, proof, hello.
    got: Vec<u8>,
    /// A peer router's link (16-byte hello) rather than a local rank (4 bytes).
    link: bool,
    since: Instant,
    /// Its socket was ready at the last poll (or it is new): worth a read this pass.
    ready: bool,
}

/// Connections that have not introduced themselves kept at once: when another comes, the
/// oldest is dropped. A rank or router proves itself within milliseconds of connecting, so
/// only a stranger grows old here; this bounds what strangers cost a router in descriptors
/// and in poll-set size, however many connections they hold open.
const HELLOS_MAX: usize = 256;
/// Least time between two log lines about refused connections.
const REFUSAL_LOG_GAP: Duration = Duration::from_secs(10);

/// Handshake context of a link between routers.
const LINK_CTX: &str = "metampi router-router";

/// A connection that has not identified itself in this time is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dialling router waits for its peer during the handshakes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The budget `METAMPI_ROUTER_MEMORY` asks for (named in a warning when below the
/// least a router works with), for a router expecting `links_in` incoming links.
fn budget_from_env(id: usize, links_in: usize) -> Budget {
    let asked = metampi::tuning::router_memory();
    if asked < metampi::tuning::ROUTER_MEMORY_LEAST {
        tracing::warn!(
            "metampi router {id}: METAMPI_ROUTER_MEMORY={asked} is below the least a \
                 router works with; using {} MiB",
            metampi::tuning::ROUTER_MEMORY_LEAST >> 20
        );
    }
    Budget::new(asked.max(metampi::tuning::ROUTER_MEMORY_LEAST), links_in)
}

/// Bytes read from one connection per pass, so no sender starves the others.
const READ_BUDGET: usize = 4 << 20;
/// Read buffer of a rank's connection (one allocation) until the rank sends
/// larger frames; then about four of its largest frames. A router may serve
/// hundreds of ranks (SC99: 256 clients on one site).
const RANK_READ_CHUNK: usize = 64 << 10;

/// Reads once from a rank's connection onto the end of `rc.inlet.rx`, at most
/// `budget` bytes: as much as fits before the next frame would have to be split
/// across two allocations (frames are split off `rx` and travel on as slices of
/// it, so its allocation cannot grow in place). `Ok(0)` at the end of the stream.
///
/// A new allocation is at most `memory` bytes (the router's budget left), and only
/// about one frame when `tight`; `ErrorKind::OutOfMemory` when even the least that
/// works is more (a frame the rank is in the middle of always finishes).
fn read_rank(rc: &mut RankConn, budget: usize, memory: usize, tight: bool) -> io::Result<usize> {
    // An empty pipe is looked at on every pass: nothing may be reserved for it.
    if rc.vchan.as_ref().is_some_and(|v| v.peek_readable() == 0) {
        return match rc.bell_eof {
            true => Ok(0),
            false => Err(io::ErrorKind::WouldBlock.into()),
        };
    }
    let rest = match frame_size(&rc.inlet.rx)? {
        _ if rc.inlet.rx.is_empty() => 0,
        None => ENV_LEN - rc.inlet.rx.len(),
        Some(n) => n.saturating_sub(rc.inlet.rx.len()),
    };
    // Under pressure a read fills its allocation to the end and the frame left unfinished
    // there moves to the next (a copy): allocations then hold about one frame, and a
    // frame's bytes do not keep a larger allocation alive after it is acknowledged.
    let (hint, most) = match (tight, rest) {
        (_, r) if r > 0 && !rc.inlet.rx.is_empty() => (rc.inlet.frame_hint, usize::MAX),
        (true, _) => (0, memory),
        (false, _) => (rc.inlet.frame_hint, memory),
    };
    let before = rc.inlet.rx.capacity();
    let Some(max) = reserve_for_frames_within(&mut rc.inlet.rx, rest, hint, most) else {
        return Err(io::ErrorKind::OutOfMemory.into());
    };
    if rc.inlet.rx.capacity() > before {
        // A new allocation, or the whole of the old one reclaimed.
        rc.inlet.rx_block = rc.inlet.rx.capacity();
    }
    let max = max.min(budget);
    let Some(v) = &mut rc.vchan else {
        return sys::read::read_append(&rc.stream, &mut rc.inlet.rx, max);
    };
    match v.read_append(&mut rc.inlet.rx, max)? {
        0 if rc.bell_eof => Ok(0),
        0 => Err(io::ErrorKind::WouldBlock.into()),
        n => {
            // The rank may be waiting for room.
            v.notify(&rc.stream);
            Ok(n)
        }
    }
}

/// Reads a new rank's channel offer and answers it: pipes when it is on
/// `node` (this router's, hashed) and its segment can be mapped, else TCP.
/// `Err` when the rank's connection must go.
fn settle_offer(node: u64, rc: &mut RankConn) -> Result<(), String> {
    let want = OFFER_LEN - rc.inlet.rx.len();
    match sys::read::read_append(&rc.stream, &mut rc.inlet.rx, want) {
        Ok(0) => return Err("it closed the connection".into()),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => return Err(e.to_string()),
    }
    if rc.inlet.rx.len() < OFFER_LEN {
        return Ok(());
    }
    let offer = Offer::decode(&rc.inlet.rx.split_to(OFFER_LEN))?;
    rc.vchan = offer
        .filter(|o| o.node == node)
        .and_then(|o| VChan::open(&o).ok());
    rc.offer_pending = false;
    let answer = [u8::from(rc.vchan.is_some())];
    // One byte into a fresh connection's empty send buffer.
    (&rc.stream).write_all(&answer).map_err(|e| e.to_string())
}

/// Hands queued buffers to a rank's pipe, as [`flush_queue`] writes them to
/// its socket: long ones on loan where the rank takes loans, the others
/// copied.
fn flush_pipe(v: &mut VChan, bell: &TcpStream, o: &mut Outlet, lent: &mut Loans) {
    let (q, off) = (&mut o.q, &mut o.off);
    let lending = v.lending();
    if lending {
        lent.settle(v.returned());
    }
    let lendable = |b: &Bytes, lent: &Loans| {
        lending && b.len() >= LEND_MIN && lent.bytes + b.len() <= LEND_MAX
    };
    let mut wrote = false;
    while let Some(front) = q.front() {
        let front = front.slice(*off..);
        if lendable(&front, lent) {
            if !v.lend(front.as_ptr() as u64, front.len()) {
                break;
            }
            lent.made += 1;
            lent.bytes += front.len();
            lent.out.push_back(front);
            q.pop_front();
            *off = 0;
            wrote = true;
            continue;
        }
        // Copied up to the next buffer that goes on loan.
        let mut upto = 1;
        while upto < q.len().min(64) && !lendable(&q[upto], lent) {
            upto += 1;
        }
        let parts = front_slices(q, *off);
        let n = v.write_vectored(&parts[..upto]);
        if n == 0 {
            break;
        }
        wrote = true;
        consume(q, off, n);
    }
    if wrote {
        v.notify(bell);
    }
}

/// `METAMPI_ROUTER_DEBUG`, read once: a lookup per frame costs the
/// environment's lock and a scan.
fn debug_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| metampi::knobs::flag("METAMPI_ROUTER_DEBUG", false))
}

/// Where a router's loop spends its time (`METAMPI_ROUTER_PROFILE` set:
/// printed to stderr every 200 ms of traffic): how many passes, the time they took, and
/// how the waits between them ended. Tells a router that sleeps between the
/// hops of a routed message from one whose passes are slow.
struct Profile {
    since: Instant,
    passes: u64,
    body: Duration,
    longest: Duration,
    waits: sys::poll::WaitCounts,
    /// Time per part of a pass (see [`PHASES`]), and when the last part ended.
    phases: [Duration; PHASES.len()],
    mark: Instant,
    /// Link reads that got bytes and link writes that had bytes to write:
    /// how many, and the time they took.
    reads: (u64, Duration),
    writes: (u64, Duration),
}

/// The parts of a router's pass, in order, as the profile names them.
const PHASES: [&str; 6] = [
    "accept",
    "from ranks",
    "links out",
    "links in",
    "to ranks",
    "prepare wait",
];

impl Profile {
    fn from_env() -> Option<Profile> {
        metampi::knobs::flag("METAMPI_ROUTER_PROFILE", false).then(|| Profile {
            since: Instant::now(),
            passes: 0,
            body: Duration::ZERO,
            longest: Duration::ZERO,
            waits: Default::default(),
            phases: Default::default(),
            mark: Instant::now(),
            reads: Default::default(),
            writes: Default::default(),
        })
    }

    /// Ends part `k` of the pass.
    fn phase(&mut self, k: usize) {
        let now = Instant::now();
        self.phases[k] += now - self.mark;
        self.mark = now;
    }

    /// Counts a pass that began at `start`; prints and restarts every 200 ms.
    fn pass(&mut self, id: usize, start: Instant, waits: sys::poll::WaitCounts) {
        let took = start.elapsed();
        self.passes += 1;
        self.body += took;
        self.longest = self.longest.max(took);
        if self.since.elapsed() < Duration::from_millis(200) {
            return;
        }
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let each = |t: Duration| t.as_secs_f64() * 1e6 / self.passes as f64;
        let parts: Vec<String> = PHASES
            .iter()
            .zip(&self.phases)
            .map(|(name, t)| format!("{name} {:.2}", each(*t)))
            .collect();
        let io = |(n, t): (u64, Duration)| (n, t.as_secs_f64() * 1e6 / n.max(1) as f64);
        let (reads, writes) = (io(self.reads), io(self.writes));
        tracing::info!(
            "metampi router {id} profile: {} passes, {:.2} us each (longest {} us; {}); \
             {} link reads of {:.2} us, {} link writes of {:.2} us; \
             {} waits: {} ended spinning, {} slept",
            self.passes,
            each(self.body),
            self.longest.as_micros(),
            parts.join(", "),
            reads.0,
            reads.1,
            writes.0,
            writes.1,
            d(waits.waits, self.waits.waits),
            d(waits.spun, self.waits.spun),
            d(waits.blocked, self.waits.blocked),
        );
        *self = Profile {
            since: Instant::now(),
            passes: 0,
            body: Duration::ZERO,
            longest: Duration::ZERO,
            waits,
            phases: Default::default(),
            mark: Instant::now(),
            reads: Default::default(),
            writes: Default::default(),
        };
    }
}

/// The first buffers of `q` (at most 64), the front one from `off` on.
fn front_slices<'a>(q: &'a VecDeque<Bytes>, off: usize) -> Vec<IoSlice<'a>> {
    q.iter()
        .take(64)
        .enumerate()
        .map(|(i, b)| IoSlice::new(if i == 0 { &b[off..] } else { &b[..] }))
        .collect()
}

/// Drops the `n` bytes at the front of `q` (its front buffer from `off` on).
fn consume(q: &mut VecDeque<Bytes>, off: &mut usize, mut n: usize) {
    while n > 0 {
        let left = q[0].len() - *off;
        if n >= left {
            n -= left;
            *off = 0;
            q.pop_front();
        } else {
            *off += n;
            n = 0;
        }
    }
}

/// Writes queued buffers with `writev`; an error when the peer is gone.
fn flush_queue(stream: &mut TcpStream, o: &mut Outlet) -> io::Result<()> {
    let (q, off) = (&mut o.q, &mut o.off);
    while !q.is_empty() {
        match stream.write_vectored(&front_slices(q, *off)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => consume(q, off, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What one poll entry stands for.
#[derive(Clone, Copy)]
enum Slot {
    Vertical,
    Listener,
    Hello(usize),
    Rank(usize),
    Link(PeerKey, usize),
    Waker,
}

/// A router's whole state, driven by one thread: every socket is
/// non-blocking and a frame read from a rank goes onto the wide-area link in
/// the same pass, without a hand-over between threads.
struct Router {
    id: usize,
    vertical: TcpListener,
    listeners: Vec<TcpListener>,
    hellos: Vec<Hello>,
    /// Connections dropped before they proved the job secret (refused, timed out, or pushed
    /// out by newer ones), and when that was last logged with the count then.
    refusals: u64,
    refusals_logged: Option<(Instant, u64)>,
    ranks: Vec<RankConn>,
    /// The links of each peer connection (their protocol state is the switch's).
    peers: Peers<Peer>,
    /// Routing, the wire protocol's state, the queues towards ranks and the budget.
    switch: Switch,
    /// The rank read first in the next pass.
    rank_turn: usize,
    /// Most private resident memory seen when the statistics were written.
    peak_anon_kb: u64,
    /// Statistics are written (`METAMPI_ROUTER_STATS`): only then is the peak of what it
    /// holds followed, a sum over its ranks on every pass.
    stats: bool,
    connected_tx: std::sync::mpsc::Sender<Connected>,
    connected_rx: std::sync::mpsc::Receiver<Connected>,
    /// Per listener: its TLS end (`None`: plain).
    acceptors: Vec<Option<tls::Acceptor>>,
    waker: (Arc<UnixDatagram>, UnixDatagram),
    last_stats: Instant,
    /// A rank left: the statistics are written on the next pass, whatever the
    /// time, so that they are complete at the end of a job (`metampi run
    /// --monitor`), when routers are stopped.
    stats_due: bool,
    /// The job secret every connection must prove.
    key: auth::Secret,
    /// Spins before blocking while traffic flows and cores are spare
    /// (`METAMPI_ROUTER_SPIN_US`).
    spinner: sys::poll::Spinner,
    /// Hash of the node it runs on: ranks offering pipes from the same node get them.
    node: u64,
    /// `METAMPI_ROUTER_PROFILE`: where the loop's time goes.
    profile: Option<Profile>,
}

/// A link connection a connector thread made: peer, link, socket, and the
/// TLS session on it for a TLS link.
type Connected = (usize, usize, TcpStream, Option<Box<tls::TlsStream>>);

/// Starts a thread that connects link `link` of peer `peer` to `addr`,
/// retrying with backoff, and hands the connection (hello sent) to the loop.
fn spawn_connector(
    r: &Router,
    peer: usize,
    link: usize,
    addr: String,
    hello: [u8; LINK_HELLO],
    dialer: Option<tls::Dialer>,
) {
    let tx = r.connected_tx.clone();
    let waker = Arc::clone(&r.waker.0);
    let (key, id) = (r.key.clone(), r.id);
    std::thread::spawn(move || {
        let mut backoff = Duration::from_millis(10);
        // A refusal is logged when it first happens or changes, not on every retry.
        let mut last_refusal = String::new();
        loop {
            if let Ok(mut s) = TcpStream::connect(&addr) {
                let _ = s.set_nodelay(true);
                let res = match &dialer {
                    None => auth::connect(&mut s, &key, LINK_CTX, &hello).map(|()| None),
                    Some(d) => d
                        .connect(&mut s, &key, LINK_CTX, &hello, HANDSHAKE_TIMEOUT)
                        .map(|t| Some(Box::new(t))),
                };
                match res {
                    Ok(t) => {
                        if s.set_nonblocking(true).is_ok() {
                            let _ = tx.send((peer, link, s, t));
                            let _ = waker.send(&[1]);
                            return;
                        }
                    }
                    // Refusals, and a TLS link whose peer does not speak TLS.
                    Err(e)
                        if e.kind() == io::ErrorKind::PermissionDenied
                            || (dialer.is_some() && e.kind() == io::ErrorKind::InvalidData) =>
                    {
                        let why = tls::describe_error(&e);
                        if why != last_refusal {
                            tracing::warn!("metampi router {id}: link {link} to {addr}: {why}");
                            last_refusal = why;
                        }
                    }
                    Err(_) => {}
                }
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    });
}

impl Router {
    fn new(
        spec: &RouterSpec,
        vertical: TcpListener,
        listeners: Vec<TcpListener>,
    ) -> io::Result<Router> {
        let (connected_tx, connected_rx) = std::sync::mpsc::channel();
        let (w0, w1) = UnixDatagram::pair()?;
        w0.set_nonblocking(true)?;
        w1.set_nonblocking(true)?;
        let now = Instant::now();
        let key = auth::secret_from_env()?;
        let (dialers, acceptors) = tls::setup(spec, &key)?;
        let budget = budget_from_env(spec.id, spec.listen.len());
        let stats_dir = metampi::knobs::os("METAMPI_ROUTER_STATS");
        if let Some(dir) = &stats_dir {
            // Asked for statistics: a directory not there yet is made, one that cannot be is named.
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(
                    "metampi router {}: METAMPI_ROUTER_STATS={}: cannot make the directory ({e}); \
                     no statistics will be written",
                    spec.id,
                    std::path::Path::new(dir).display()
                );
            }
        }
        // One striped connection per peer router, links in spec order.
        type Links<'a> = (Vec<&'a OutLink>, Vec<Option<tls::Dialer>>);
        let mut peers: Vec<(usize, Links)> = Vec::new();
        for (l, d) in spec.out.iter().zip(dialers) {
            match peers.iter_mut().find(|p| p.0 == l.peer) {
                Some((_, (links, dialers))) => {
                    links.push(l);
                    dialers.push(d);
                }
                None => peers.push((l.peer, (vec![l], vec![d]))),
            }
        }
        let mut out = Vec::new();
        let mut bundles = Vec::new();
        for (peer, (links, dialers)) in peers {
            let comp = parse_compression(&links[0].compression).unwrap_or(Compression::Lz4);
            let slow = links.iter().any(|l| l.bytes_per_sec.is_some());
            let checksum = links.iter().any(|l| l.checksum);
            let cfg = wire_config(spec.id as u32, comp, slow, checksum, &budget);
            let bundle = Bundle::new(now, cfg, links.len())
                .map_err(|e| io::Error::other(format!("router {}: {e}", spec.id)))?;
            let peer_links = links
                .iter()
                .zip(dialers)
                .map(|(l, dialer)| PeerLink {
                    addr: l.addr.clone(),
                    dialer,
                    stats: stats_path(spec.id, l.link_id, "out"),
                    ..PeerLink::new((l.bytes_per_sec, l.latency), l.link_id)
                })
                .collect();
            bundles.push(bundle);
            out.push(Peer {
                links: peer_links,
                compression: links[0].compression.clone(),
                checksum,
                label: format!("to router {peer}"),
                trace: metampi_sys::linklog::LinkLog::open(spec.id, true, peer),
            });
        }
        let r = Router {
            id: spec.id,
            vertical,
            listeners,
            hellos: Vec::new(),
            refusals: 0,
            refusals_logged: None,
            ranks: Vec::new(),
            peers: Peers::new(out),
            switch: Switch::new(bundles, budget),
            rank_turn: 0,
            peak_anon_kb: 0,
            stats: stats_dir.is_some(),
            connected_tx,
            connected_rx,
            acceptors,
            waker: (Arc::new(w0), w1),
            last_stats: now,
            // Written on the first pass: a job shorter than the period still leaves its
            // routers' files (the launcher kills routers of this machine at the job's end).
            stats_due: stats_dir.is_some(),
            key,
            spinner: sys::poll::Spinner::from_env("METAMPI_ROUTER_SPIN_US", 50),
            node: sys::vchan::node_hash(&spec.node.clone().unwrap_or_else(metampi_sys::hostname)),
            profile: Profile::from_env(),
        };
        Ok(r)
    }

    fn start_connectors(&mut self) {
        for p in 0..self.peers.out.len() {
            for l in 0..self.peers.out[p].links.len() {
                self.connect(p, l);
            }
        }
    }

    fn connect(&mut self, p: usize, l: usize) {
        let links = self.peers.out[p].links.len();
        let link = &mut self.peers.out[p].links[l];
        if link.connecting {
            return;
        }
        link.connecting = true;
        let hello = LinkHello {
            conn: self.id as u32,
            link: l as u16,
            links: links as u16,
            layout_id: link.layout_id,
        }
        .encode();
        let addr = link.addr.clone();
        let dialer = link.dialer.clone();
        spawn_connector(self, p, l, addr, hello, dialer);
    }

    /// A link's connection broke: the wire protocol resends what was not
    /// acknowledged once it is back (the outgoing side reconnects; the
    /// incoming side waits for the peer to).
    fn link_lost(&mut self, now: Instant, key: PeerKey, link: usize, why: &str) {
        let id = self.id;
        if let Some(p) = self.peers.get_mut(key) {
            if p.links[link].conn.take().is_some() {
                p.links[link].lost_at = Some(std::time::SystemTime::now());
                if debug_enabled() {
                    tracing::warn!("metampi router {id}: link {link} {} lost ({why})", p.label);
                }
                self.switch.link_down(now, key, link);
            }
        }
        if let PeerKey::Out(k) = key {
            self.peers.out[k].links[link].connecting = false;
            self.connect(k, link);
        }
    }

    fn accept_all(&mut self, now: Instant) {
        while let Ok((s, _)) = self.vertical.accept() {
            self.new_hello(s, None, now);
        }
        for i in 0..self.listeners.len() {
            while let Ok((s, _)) = self.listeners[i].accept() {
                self.new_hello(s, Some(i), now);
            }
        }
    }

    /// A new connection on the vertical listener (`listener` is `None`) or
    /// on a link listener.
    fn new_hello(&mut self, mut s: TcpStream, listener: Option<usize>, now: Instant) {
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let _ = s.set_nodelay(true);
        let Ok(nonce) = auth::nonce() else { return };
        let acceptor = listener
            .and_then(|i| self.acceptors.get(i))
            .and_then(Option::as_ref);
        let tls = match acceptor {
            None => {
                // The challenge: 16 bytes always fit a new connection's send buffer.
                if s.write_all(&nonce).is_err() {
                    return;
                }
                None
            }
            Some(a) => {
                // The challenge waits in the session until the handshake is done.
                let mut t = match a.start() {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("metampi router {}: {e}", self.id);
                        return;
                    }
                };
                if !t
                    .write_plain(&[IoSlice::new(&nonce)])
                    .is_ok_and(|n| n == nonce.len())
                {
                    return;
                }
                Some(Box::new(t))
            }
        };
        let link = listener.is_some();
        if self.hellos.len() >= HELLOS_MAX {
            if let Some(oldest) = (0..self.hellos.len()).min_by_key(|&i| self.hellos[i].since) {
                let h = self.hellos.swap_remove(oldest);
                self.refused(
                    &h.stream,
                    &format!(
                        "{HELLOS_MAX} connections that have not introduced themselves are \
                         open; the oldest makes room"
                    ),
                    now,
                );
            }
        }
        self.hellos.push(Hello {
            stream: s,
            tls,
            nonce,
            got: Vec::new(),
            link,
            since: now,
            ready: true,
        });
    }

    /// Counts a connection dropped before it proved the secret, and logs it: the first at
    /// once, then at most one line per [`REFUSAL_LOG_GAP`] with the count since the last, so
    /// a stranger who hammers the ports cannot flood the log.
    fn refused(&mut self, stream: &TcpStream, why: &str, now: Instant) {
        self.refusals += 1;
        let since_last = match self.refusals_logged {
            Some((at, _)) if now.duration_since(at) < REFUSAL_LOG_GAP => return,
            Some((_, count)) => self.refusals - count,
            None => 1,
        };
        let from = stream.peer_addr().map(|a| a.to_string());
        let more = if since_last > 1 {
            format!(" ({since_last} refused since the last report)")
        } else {
            String::new()
        };
        tracing::warn!(
            "metampi router {}: refused a connection from {}: {why}{more}",
            self.id,
            from.as_deref().unwrap_or("?")
        );
        self.refusals_logged = Some((now, self.refusals));
    }

    fn read_hellos(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.hellos.len() {
            let h = &mut self.hellos[i];
            let need = auth::NONCE + auth::TAG + if h.link { LINK_HELLO } else { 4 };
            let want = need - h.got.len();
            let timed_out = now.duration_since(h.since) > HELLO_TIMEOUT;
            // A socket with nothing new is not read: thousands of silent connections would
            // otherwise cost a system call each on every pass of the loop.
            if !std::mem::take(&mut h.ready) && !timed_out {
                i += 1;
                continue;
            }
            // `Some(None)`: drop quietly (gone, or silent as a port scan);
            // `Some(Some(why))`: refuse and log.
            let mut drop_it: Option<Option<String>> = None;
            match h.tls.as_mut() {
                None => {
                    let mut b = [0u8; auth::NONCE + auth::TAG + LINK_HELLO];
                    match h.stream.read(&mut b[..want]) {
                        Ok(0) => drop_it = Some(None),
                        Ok(n) => h.got.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => drop_it = Some(None),
                    }
                    if timed_out && drop_it.is_none() {
                        drop_it = Some(None);
                    }
                }
                Some(t) => {
                    let mut plain = BytesMut::new();
                    match t.fill(&mut h.stream, &mut plain, want) {
                        Ok(open) => {
                            h.got.extend_from_slice(&plain);
                            if !open {
                                drop_it = Some(None);
                            }
                        }
                        Err(e) => drop_it = Some(Some(tls::describe_error(&e))),
                    }
                    if h.got.len() > need {
                        drop_it = Some(Some("it sent more than its hello".into()));
                    } else if timed_out && drop_it.is_none() && h.got.len() < need {
                        drop_it = Some(Some(if t.is_established() {
                            "no hello within the time limit".into()
                        } else {
                            "no TLS handshake within the time limit (a router without TLS?)".into()
                        }));
                    }
                }
            }
            if let Some(why) = drop_it {
                let h = self.hellos.swap_remove(i);
                match why {
                    Some(why) => self.refused(&h.stream, &why, now),
                    // Silent or gone: counted, logged only with the next refusal's count.
                    None => self.refusals += 1,
                }
                continue;
            }
            if h.got.len() < need {
                i += 1;
                continue;
            }
            let mut h = self.hellos.swap_remove(i);
            let ctx = if h.link { LINK_CTX } else { VERTICAL_CTX };
            let hello = match auth::check(&self.key, ctx, &h.nonce, &h.got) {
                Ok(hello) => hello.to_vec(),
                Err(e) => {
                    self.refused(&h.stream, &e.to_string(), now);
                    continue;
                }
            };
            let proof = self.key.acceptor_tag(ctx, &h.got[..auth::NONCE], &h.nonce);
            let sent = match h.tls.as_mut() {
                None => h.stream.write_all(&proof).is_ok(),
                Some(t) => {
                    t.write_plain(&[IoSlice::new(&proof)])
                        .is_ok_and(|n| n == proof.len())
                        && t.flush(&mut h.stream).is_ok()
                }
            };
            if !sent {
                continue;
            }
            h.got = hello;
            if h.link {
                self.attach_link(now, h);
            } else {
                self.attach_rank(h);
            }
        }
    }

    fn attach_rank(&mut self, h: Hello) {
        let rank = u32::from_le_bytes([h.got[0], h.got[1], h.got[2], h.got[3]]);
        // Messages that came before the rank are waiting in its port.
        let port = self.switch.port(rank);
        self.ranks.push(RankConn {
            rank,
            stream: h.stream,
            offer_pending: true,
            vchan: None,
            bell_eof: false,
            inlet: Inlet::new(RANK_READ_CHUNK / 4),
            starved: false,
            port,
            lent: Loans::default(),
        });
    }

    fn attach_link(&mut self, now: Instant, h: Hello) {
        let Some(LinkHello {
            conn,
            link,
            links,
            layout_id,
        }) = LinkHello::decode(&h.got)
        else {
            tracing::warn!(
                "metampi router {}: refused a connection with a bad link hello",
                self.id
            );
            return;
        };
        let (link, links) = (link as usize, links as usize);
        let id = self.id;
        let cfg = wire_config(conn, Compression::Off, false, true, self.switch.budget());
        let max = cfg.max_frame_payload();
        let make = || Bundle::new(now, cfg, links).expect("1 <= links < 65536 checked");
        if let Err(why) = self.switch.inbound_link(now, conn, link, links, make) {
            tracing::warn!("metampi router {id}: refused link {link} from router {conn}: {why}");
            return;
        }
        let p = self.peers.inbound.entry(conn).or_insert_with(|| Peer {
            links: (0..links).map(|_| PeerLink::new((None, None), 0)).collect(),
            // Only acknowledgements go back on an incoming connection.
            compression: "off".into(),
            checksum: true,
            label: format!("from router {conn}"),
            trace: metampi_sys::linklog::LinkLog::open(id, false, conn as usize),
        });
        let l = &mut p.links[link];
        l.lost_at = None;
        l.layout_id = layout_id;
        l.stats = stats_path(id, layout_id, "in");
        let mut tls = h.tls;
        if let Some(t) = tls.as_mut() {
            t.set_link_buffers();
        }
        // Only acknowledgements go back on an incoming connection: no writer.
        // A plain one may have a reader (TLS decrypts in the loop).
        let reader = (tls.is_none() && reader::enabled())
            .then(|| reader::Reader::spawn(&h.stream, max, Arc::clone(&self.waker.0)).ok())
            .flatten();
        p.links[link].conn = Some(WireConn {
            stream: h.stream,
            shaper: Shaper::new(None, None),
            tls,
            writer: None,
            reader,
        });
    }

    fn take_connected(&mut self, now: Instant) {
        while let Ok((p, l, stream, tls)) = self.connected_rx.try_recv() {
            let link = &mut self.peers.out[p].links[l];
            link.connecting = false;
            let (bps, lat) = link.emulation;
            link.lost_at = None;
            // Emulated links are slow, and TLS encrypts in the loop: the
            // writer thread is for plain links at full speed.
            let writer = (tls.is_none() && bps.is_none() && lat.is_none() && writer::enabled())
                .then(|| writer::Writer::spawn(&stream, Arc::clone(&self.waker.0)).ok())
                .flatten();
            link.conn = Some(WireConn {
                stream,
                shaper: Shaper::new(bps, lat),
                tls,
                writer,
                reader: None,
            });
            // Connectors dial only the links this router has.
            let _ = self.switch.link_up(now, PeerKey::Out(p), l);
        }
    }

    /// Frames from local ranks onto the outgoing connections, as far as the budget for
    /// them goes. The ranks are served from a rotating start, so that no rank always
    /// finds the room taken.
    fn read_ranks(&mut self, now: Instant, ready: &[bool]) {
        let n = self.ranks.len();
        let limit = self.switch.budget().from_ranks;
        let mut ranks_hold: usize = self.ranks.iter().map(|r| r.inlet.holding()).sum();
        let mut gone_ranks = Vec::new();
        self.rank_turn = if n == 0 { 0 } else { (self.rank_turn + 1) % n };
        for i in (self.rank_turn..n).chain(0..self.rank_turn) {
            if self.ranks[i].offer_pending && ready.get(i).copied().unwrap_or(true) {
                if let Err(e) = settle_offer(self.node, &mut self.ranks[i]) {
                    tracing::warn!(
                        "metampi router {}: dropping rank {}'s connection: {e}",
                        self.id,
                        self.ranks[i].rank
                    );
                    gone_ranks.push(i);
                    continue;
                }
            }
            let rc = &mut self.ranks[i];
            if rc.offer_pending {
                continue;
            }
            let others = ranks_hold - rc.inlet.holding();
            let mut readable = ready.get(i).copied().unwrap_or(true);
            if rc.vchan.is_some() {
                // The socket only rings (or ends); the pipe is always looked at.
                if readable && !rc.bell_eof {
                    rc.bell_eof = !sys::vchan::drain_bell(&rc.stream).unwrap_or(false);
                }
                readable = true;
            }
            let mut budget = READ_BUDGET;
            let mut gone = false;
            rc.starved = false;
            // Frames already read go first (they wait here after a full link,
            // whatever the socket says); then one read at a time, each followed by
            // taking the frames it completed, so that the buffer only ever holds the
            // frame in progress when it is read into (see `reserve_for_frames`).
            loop {
                if let Err(e) = self.switch.forward(now, &mut rc.inlet) {
                    tracing::warn!(
                        "metampi router {}: dropping rank {}'s connection: {e}",
                        self.id,
                        rc.rank
                    );
                    gone = true;
                    break;
                }
                let used = others + rc.inlet.holding() + self.switch.sending();
                let tight = used > limit / 2;
                if tight && rc.inlet.rx.is_empty() && rc.inlet.rx.capacity() > 0 {
                    // Room kept for this rank's next frames goes back to all ranks.
                    rc.inlet.rx = BytesMut::new();
                    rc.inlet.rx_block = 0;
                }
                if rc.inlet.held.is_some() || !readable || gone || budget == 0 {
                    break;
                }
                let memory = limit.saturating_sub(used);
                match read_rank(rc, budget, memory, tight) {
                    Ok(0) => gone = true,
                    Ok(n) => budget -= n.min(budget),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => readable = false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::OutOfMemory => {
                        rc.starved = true;
                        break;
                    }
                    Err(_) => gone = true,
                }
            }
            if gone && rc.inlet.held.is_none() {
                gone_ranks.push(i);
            }
            ranks_hold = others + rc.inlet.holding();
        }
        // Highest first, so that each index still names its rank when removed.
        gone_ranks.sort_unstable_by(|a, b| b.cmp(a));
        for i in gone_ranks {
            let rc = self.ranks.swap_remove(i);
            self.switch.drop_outlet(rc.port);
            self.stats_due = true;
        }
    }

    /// Bytes held for messages now, everything together (see [`Budget`]).
    fn holding_now(&self) -> usize {
        self.ranks.iter().map(|r| r.inlet.holding()).sum::<usize>()
            + self.pipes()
            + self.switch.to_ranks()
            + self.lent()
            + self.switch.in_bundles()
    }

    /// Bytes of the ranks' pipes it maps.
    fn pipes(&self) -> usize {
        (self.ranks.iter())
            .filter_map(|r| r.vchan.as_ref().map(VChan::mapped))
            .sum()
    }

    /// Bytes on loan to local ranks.
    fn lent(&self) -> usize {
        self.ranks.iter().map(|r| r.lent.bytes).sum()
    }

    /// Feeds a link connection's bytes to its bundle; drives its transmit side.
    fn service_peer(&mut self, now: Instant, key: PeerKey, readable: &[bool]) {
        let mut lost = Vec::new();
        let timing = self.profile.is_some();
        let mut reads = (0u64, Duration::ZERO);
        let mut writes = (0u64, Duration::ZERO);
        {
            let (Some(p), Some(bundle)) = (self.peers.get_mut(key), self.switch.bundle_mut(key))
            else {
                return;
            };
            for (l, link) in p.links.iter_mut().enumerate() {
                let Some(c) = link.conn.as_mut() else {
                    continue;
                };
                if readable.get(l).copied().unwrap_or(true) || c.pending() {
                    let t0 = timing.then(Instant::now);
                    let n = match c.read_into(bundle, now, l) {
                        Ok((n, true)) => n,
                        Ok((n, false)) => {
                            lost.push((l, "closed by the peer".to_string()));
                            n
                        }
                        Err(e) => {
                            lost.push((l, tls::describe_error(&e)));
                            0
                        }
                    };
                    if n > 0 {
                        if let Some(t0) = t0 {
                            reads.0 += 1;
                            reads.1 += t0.elapsed();
                        }
                        if let Some(t) = p.trace.as_mut() {
                            t.record(now, link.layout_id, n, true);
                        }
                    }
                }
            }
            if bundle.poll_timeout().is_some_and(|t| t <= now) {
                // TCP delivers what it holds or breaks the connection: frames
                // still in a link's socket, writer thread or delay line are
                // late, not lost (a slow line's queue holds seconds of them).
                // Asked only when a link's timer has expired (a system call).
                for (l, link) in p.links.iter().enumerate() {
                    if bundle.retransmission_due(now, l)
                        && link.conn.as_ref().is_some_and(WireConn::delivering)
                    {
                        bundle.transport_busy(now, l);
                    }
                }
                bundle.handle_timeout(now);
            }
            for (l, link) in p.links.iter_mut().enumerate() {
                let Some(c) = link.conn.as_mut() else {
                    continue;
                };
                while c.shaper.can_take(now) {
                    match bundle.poll_transmit_parts(now, l) {
                        Some(bytes) => {
                            if let Some(t) = p.trace.as_mut() {
                                t.record(now, link.layout_id, bytes.len(), false);
                            }
                            c.shaper.push(now, bytes)
                        }
                        None => break,
                    }
                }
                let t0 = (timing && c.shaper.blocked_on_socket(now)).then(Instant::now);
                if let Err(e) = c.write(now) {
                    lost.push((l, tls::describe_error(&e)));
                }
                if let Some(t0) = t0 {
                    writes.0 += 1;
                    writes.1 += t0.elapsed();
                }
            }
        }
        if let Some(p) = self.profile.as_mut() {
            p.reads.0 += reads.0;
            p.reads.1 += reads.1;
            p.writes.0 += writes.0;
            p.writes.1 += writes.1;
        }
        for (l, why) in lost {
            self.link_lost(now, key, l, &why);
        }
        self.take_events(now, key);
    }

    /// Messages the links delivered go to their ranks, while the queue
    /// towards ranks has room (otherwise the wire credit stops the sender).
    fn take_events(&mut self, now: Instant, key: PeerKey) {
        let id = self.id;
        let lent = self.lent();
        let mut silent_links = Vec::new();
        while let Some(ev) = self.switch.deliver(key, lent) {
            let Some(p) = self.peers.get(key) else {
                return;
            };
            match ev {
                Event::LinkDead { link, reason } => {
                    tracing::warn!(
                        "metampi router {id}: link l{} {} given up ({reason:?}){}",
                        p.links.get(link).map_or(0, |l| l.layout_id),
                        p.label,
                        lost_since(p.links.get(link).and_then(|l| l.lost_at))
                    );
                }
                Event::LinkSilent { link, silent } => {
                    tracing::warn!(
                        "metampi router {id}: link l{} {} silent for {:.1} s with its \
                         connection open; connecting it again",
                        p.links.get(link).map_or(0, |l| l.layout_id),
                        p.label,
                        silent.as_secs_f64()
                    );
                    silent_links.push(link);
                }
                Event::Closed(reason) => {
                    let since = p.links.iter().filter_map(|l| l.lost_at).min();
                    eprintln!(
                        "metampi router {id}: the connection {} is gone ({reason:?}){}; ending the job",
                        p.label,
                        lost_since(since)
                    );
                    std::process::exit(3);
                }
                _ => {}
            }
        }
        for link in silent_links {
            self.link_lost(now, key, link, "silent with its connection open");
        }
    }

    fn write_ranks(&mut self) {
        let mut i = 0;
        while i < self.ranks.len() {
            let rc = &mut self.ranks[i];
            if rc.offer_pending {
                // Nothing may precede the answer to its offer.
                i += 1;
                continue;
            }
            // An error: the rank is gone (its reader notices the end of stream too), and
            // so is what was queued for it.
            let _ = self.switch.flush(rc.port, |o| match &mut rc.vchan {
                None => flush_queue(&mut rc.stream, o),
                Some(_) if rc.bell_eof => Err(io::ErrorKind::BrokenPipe.into()),
                Some(v) => {
                    flush_pipe(v, &rc.stream, o, &mut rc.lent);
                    Ok(())
                }
            });
            i += 1;
        }
    }

    fn write_stats(&mut self, now: Instant) {
        if !self.stats_due && now.duration_since(self.last_stats) < Duration::from_millis(500) {
            return;
        }
        self.last_stats = now;
        self.stats_due = false;
        if let Some(dir) = metampi::knobs::os("METAMPI_ROUTER_STATS") {
            // Memory of the whole router process: the SC99 buffer case is about it.
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let kb = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let queued = self.switch.sending();
            // Its own memory, without the ranks' pipes it maps (shared memory the ranks
            // made, counted in its resident size): sampled here, the peak of the samples.
            self.peak_anon_kb = self.peak_anon_kb.max(kb("RssAnon:"));
            let text = serde_json::json!({
                "rss_kb": kb("VmRSS:"),
                "peak_rss_kb": kb("VmHWM:"),
                "ranks": self.ranks.len(),
                "pipe_ranks": self.ranks.iter().filter(|r| r.vchan.is_some()).count(),
                "loans": self.ranks.iter().map(|r| r.lent.made).sum::<u64>(),
                "to_ranks_bytes": self.switch.to_ranks(),
                "send_buffered": queued,
                "budget_bytes": self.switch.budget().total,
                "held_bytes": self.holding_now(),
                "peak_held_bytes": self.switch.budget().peak,
                "anon_kb": kb("RssAnon:"),
                "peak_anon_kb": self.peak_anon_kb,
            })
            .to_string()
                + "\n";
            let path = std::path::PathBuf::from(dir).join(format!("router-{}.json", self.id));
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        if debug_enabled() {
            let ranks: Vec<String> = self
                .ranks
                .iter()
                .map(|r| {
                    format!(
                        "rank {} tx {} held {} rx {}",
                        r.rank,
                        self.switch.outlet(r.port).q.len(),
                        r.inlet.held.is_some(),
                        r.inlet.rx.len()
                    )
                })
                .collect();
            tracing::info!(
                "router {}: to_ranks {} waiting {:?} ranks [{}] recv held {:?}",
                self.id,
                self.switch.to_ranks(),
                self.switch.queued(),
                ranks.join("; "),
                (self.switch.bundles())
                    .filter(|(k, _)| matches!(k, PeerKey::In(_)))
                    .map(|(_, b)| b.receive_buffered())
                    .collect::<Vec<_>>()
            );
        }
        for (key, p) in self.peers.iter() {
            let Some(bundle) = self.switch.bundle(key) else {
                continue;
            };
            for (l, link) in p.links.iter().enumerate() {
                if let (Some(path), Some(mut st)) = (&link.stats, bundle.link_stats(l)) {
                    let all = bundle.stats();
                    st.queued_messages = all.queued_messages;
                    st.queued_bytes = all.queued_bytes;
                    write_stats(path, &st, &p.compression, p.checksum);
                }
            }
        }
    }

    /// Ends part `k` of a profiled pass.
    fn phase(&mut self, k: usize) {
        if let Some(p) = self.profile.as_mut() {
            p.phase(k);
        }
    }

    fn run(&mut self) -> io::Result<()> {
        self.start_connectors();
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        let mut rank_ready: Vec<bool> = Vec::new();
        let mut link_ready: HashMap<PeerKey, Vec<bool>> = HashMap::new();
        let mut first = true;
        loop {
            let now = Instant::now();
            if let Some(p) = self.profile.as_mut() {
                p.mark = now;
            }
            let ready = |want: fn(&Slot) -> bool| {
                first
                    || pfds
                        .iter()
                        .zip(&slots)
                        .any(|(fd, slot)| fd.revents != 0 && want(slot))
            };
            if ready(|s| matches!(s, Slot::Waker)) {
                let mut b = [0u8; 64];
                while self.waker.1.recv(&mut b).is_ok() {}
                self.take_connected(now);
            }
            // Before accepting, which may reorder the list (the oldest makes room).
            for (fd, slot) in pfds.iter().zip(&slots) {
                if let (Slot::Hello(i), true) = (slot, fd.revents != 0) {
                    if let Some(h) = self.hellos.get_mut(*i) {
                        h.ready = true;
                    }
                }
            }
            if ready(|s| matches!(s, Slot::Vertical | Slot::Listener)) {
                self.accept_all(now);
            }
            if !self.hellos.is_empty() {
                self.read_hellos(now);
            }
            rank_ready.clear();
            rank_ready.resize(self.ranks.len(), first);
            link_ready.clear();
            for (fd, slot) in pfds.iter().zip(&slots) {
                let ready = fd.revents != 0;
                match *slot {
                    Slot::Rank(i) => {
                        if let Some(r) = rank_ready.get_mut(i) {
                            *r |= ready;
                        }
                    }
                    Slot::Link(key, l) => {
                        let v = link_ready.entry(key).or_default();
                        if v.len() <= l {
                            v.resize(l + 1, false);
                        }
                        v[l] |= ready;
                    }
                    _ => {}
                }
            }
            first = false;
            self.phase(0);
            self.read_ranks(now, &rank_ready);
            self.phase(1);
            for k in 0..self.peers.out.len() {
                let r = link_ready.remove(&PeerKey::Out(k)).unwrap_or_default();
                self.service_peer(now, PeerKey::Out(k), &r);
            }
            self.phase(2);
            let keys: Vec<u32> = self.peers.inbound.keys().copied().collect();
            for k in keys {
                let r = link_ready.remove(&PeerKey::In(k)).unwrap_or_default();
                self.service_peer(now, PeerKey::In(k), &r);
            }
            self.phase(3);
            // Delivery may have been waiting for room towards the ranks.
            self.write_ranks();
            for key in self.peers.keys() {
                self.take_events(now, key);
            }
            self.write_ranks();
            if self.stats {
                let now_held = self.holding_now();
                let b = self.switch.budget_mut();
                b.peak = b.peak.max(now_held);
            }
            self.phase(4);
            self.write_stats(now);

            // Sleep until a socket is ready or a timer is due.
            let mut wake = now + Duration::from_millis(100);
            pfds.clear();
            slots.clear();
            let mut add = |pfds: &mut Vec<libc::pollfd>, fd: i32, w: bool, slot: Slot| {
                pfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN | if w { libc::POLLOUT } else { 0 },
                    revents: 0,
                });
                slots.push(slot);
            };
            add(&mut pfds, self.vertical.as_raw_fd(), false, Slot::Vertical);
            for l in &self.listeners {
                add(&mut pfds, l.as_raw_fd(), false, Slot::Listener);
            }
            for (i, h) in self.hellos.iter().enumerate() {
                let w = h.tls.as_ref().is_some_and(|t| t.wants_write());
                add(&mut pfds, h.stream.as_raw_fd(), w, Slot::Hello(i));
            }
            let mut busy = false;
            for (i, r) in self.ranks.iter().enumerate() {
                // Held frames and ranks waiting for memory: retry soon (the links'
                // acknowledgements also wake us).
                let waits = r.inlet.held.is_some() || r.starved;
                let to_write = !self.switch.outlet(r.port).is_empty();
                busy |= waits;
                let (fd, w) = match &r.vchan {
                    // The socket only rings or ends; the pipes are looked at below.
                    Some(_) if r.bell_eof => (-1, false),
                    Some(_) => (r.stream.as_raw_fd(), false),
                    // A rank whose frame waits for link room, or whose next read for memory,
                    // is not read until there is room.
                    None if waits && !to_write => (-1, false),
                    None => (r.stream.as_raw_fd(), to_write),
                };
                add(&mut pfds, fd, w, Slot::Rank(i));
            }
            for (key, p) in self.peers.iter() {
                if let Some(t) = self.switch.bundle(key).and_then(Bundle::poll_timeout) {
                    wake = wake.min(t);
                }
                for (l, link) in p.links.iter().enumerate() {
                    let Some(c) = &link.conn else { continue };
                    if let Some(t) = c.shaper.due(now) {
                        wake = wake.min(t);
                    }
                    if c.pending() {
                        wake = now;
                    }
                    add(
                        &mut pfds,
                        c.poll_fd(),
                        c.wants_write(now),
                        Slot::Link(key, l),
                    );
                }
            }
            add(&mut pfds, self.waker.1.as_raw_fd(), false, Slot::Waker);
            if busy {
                wake = wake.min(now + Duration::from_millis(1));
            }
            if let Some(p) = self.profile.as_mut() {
                p.phase(5);
                p.pass(self.id, now, self.spinner.counts);
            }
            let timeout = wake.saturating_duration_since(Instant::now());
            let (ranks, switch) = (&self.ranks, &self.switch);
            // Pipes with work: data to forward, or room for what waits.
            let pipes_ready = || {
                ranks.iter().any(|r| {
                    r.vchan.as_ref().is_some_and(|v| {
                        (r.inlet.held.is_none() && !r.starved && v.peek_readable() > 0)
                            || (!switch.outlet(r.port).is_empty() && v.peek_writable() > 0)
                    })
                })
            };
            let arm = |on: bool| {
                let mut pipes = false;
                for v in ranks.iter().filter_map(|r| r.vchan.as_ref()) {
                    v.arm(on);
                    pipes = true;
                }
                // Ranks notify with a full barrier (`VChan::notify`), so a
                // plain one pairs with it; without pipes nothing needs one.
                if on && pipes {
                    sys::store_load_fence();
                }
            };
            self.spinner.wait_or(&mut pfds, timeout, pipes_ready, arm)?;
        }
    }
}

/// A link port that could not be listened on: the error names it, and says why a port in
/// the machine's ephemeral range is taken now and then ([`metampi_launch::ports`]).
fn listen_error(addr: &str, e: io::Error) -> io::Error {
    let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let hint = match (e.kind(), port) {
        (io::ErrorKind::AddrInUse, Some(p)) => metampi_launch::ports::in_use_hint(p),
        _ => None,
    };
    let text = match hint {
        Some(h) => format!("cannot listen on {addr}: {e}; {h}"),
        None => format!("cannot listen on {addr}: {e}"),
    };
    io::Error::new(e.kind(), text)
}

/// Runs a router until killed. Prints `METAMPI-ROUTER-READY <port>` on stdout
/// once local ranks may connect.
pub fn run(spec: &RouterSpec) -> io::Result<()> {
    run_then(spec, |_| {})
}

/// [`run`], calling `ready(port)` right after the ready line.
pub fn run_then(spec: &RouterSpec, ready: impl FnOnce(u16)) -> io::Result<()> {
    if let Some(e) = &spec.error {
        return Err(io::Error::other(e.clone()));
    }
    sys::poll::die_with_parent();
    sys::poll::keep_freed_memory();
    // The local ranks copy loans out of our memory (`sys::vchan`); under
    // Yama's scope 1 only if we say they may.
    if !sys::cma::turned_off() {
        sys::cma::let_peers_attach();
    }
    let vertical = TcpListener::bind(&spec.vertical)?;
    vertical.set_nonblocking(true)?;
    let mut listeners = Vec::new();
    for addr in &spec.listen {
        let l = TcpListener::bind(addr).map_err(|e| listen_error(addr, e))?;
        l.set_nonblocking(true)?;
        listeners.push(l);
    }
    let port = vertical.local_addr()?.port();
    let mut router = Router::new(spec, vertical, listeners)?;
    println!("METAMPI-ROUTER-READY {port}");
    io::stdout().flush()?;
    ready(port);
    router.run()
}

/// Runs a router from [`metampi_launch::meta::ROUTER_SPEC_ENV`] if this process was started as one.
/// Returns `false` when the variable is not set.
///
/// A router of a meta host started by hand finds its launcher in its
/// environment ([`metampi_launch::HELPER_ENV`]): once it listens (right after
/// its ready line) it reports to the launcher's key-value server as that
/// helper, which holds the ranks' fences until every such router has, so that
/// no rank connects to one that is not up yet; then it exits when the server
/// says that the job is over (status 0) or when that connection closes first
/// (status 1: the launcher is gone). A router that cannot report exits at
/// once: the launcher would not know it, and it would outlive the job. Routers
/// the launcher starts itself are stopped by it and do not report.
pub fn run_from_env() -> bool {
    let Some(line) = metampi::knobs::os(metampi_launch::meta::ROUTER_SPEC_ENV) else {
        return false;
    };
    metampi::log::init();
    let spec = match RouterSpec::parse(&line.to_string_lossy()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("metampi router: {e}");
            std::process::exit(2);
        }
    };
    let id = spec.id;
    let by_hand = metampi::knobs::os(metampi_launch::HELPER_ENV).is_some();
    let ready = move |_port: u16| {
        if by_hand {
            report_to_launcher(id);
        }
    };
    if let Err(e) = run_then(&spec, ready) {
        eprintln!("metampi router {id}: {e}");
        std::process::exit(1);
    }
    true
}

/// Joins the launcher's key-value server as the helper the environment names,
/// and leaves a thread that ends the process when the job is over: status 0 when
/// the server says so, 1 when the connection ends first. Exits with status 1
/// when the router cannot join.
fn report_to_launcher(id: usize) {
    let launcher = match metampi_launch::PmiClient::helper_from_env() {
        Ok(Some(launcher)) => launcher,
        Ok(None) => return,
        Err(e) => {
            eprintln!(
                "metampi router {id}: cannot report to the launcher: {e} (check that this \
                 machine reaches it at METAMPI_PMI, see `metampi run --pmi-host`)"
            );
            std::process::exit(1);
        }
    };
    let watcher = std::thread::Builder::new()
        .name("metampi-router-launcher".into())
        .spawn(move || match launcher.wait_for_end() {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!(
                    "metampi router {id}: lost the connection to the launcher ({e}); stopping"
                );
                std::process::exit(1);
            }
        });
    if let Err(e) = watcher {
        eprintln!("metampi router {id}: cannot watch the launcher: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_is_named_with_the_way_out() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap().to_string();
        let e = std::net::TcpListener::bind(&addr).unwrap_err();
        let text = listen_error(&addr, e).to_string();
        assert!(
            text.starts_with(&format!("cannot listen on {addr}: ")),
            "{text}"
        );
        // The kernel gave `held` an ephemeral port.
        if metampi_launch::ports::ephemeral_ports().is_some() {
            assert!(
                text.contains("ephemeral range") && text.contains("PORTBASE"),
                "{text}"
            );
        }
        let other = listen_error("127.0.0.1:80", io::ErrorKind::PermissionDenied.into());
        assert!(!other.to_string().contains("ephemeral"), "{other}");
    }
}
