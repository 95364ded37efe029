//! A link's reader thread: the link's socket is read by a thread of its own, so that
//! the router's loop decodes, checks and delivers what came while the kernel copies
//! the next bytes. On the 16-core machine of issue 3 the receiving router was the
//! busiest process of a routed stream, and most of its time went to those reads.
//!
//! The thread reads as the loop would ([`frame::reserve_for_frames`], so frames do not
//! straddle allocations) and hands over whole frames only, each chunk a buffer of its
//! own that the link's decoder takes over without a copy
//! ([`metampi_wire::Bundle::handle_owned`]). The unfinished frame at the end of a read
//! stays with the thread until the rest of it comes, unless it waits longer than
//! [`PARTIAL_HOLD`] with the socket drained: then it goes over as it is (the decoder
//! copies it and the bytes that finish it, as it would have anyway), so that the
//! decoder's give-up of a frame whose bytes were lost inside the stream still sees the
//! silence it judges by. Bytes that do not start a frame go over at once, for the
//! decoder to resynchronise on.
//!
//! At most [`QUEUE_LIMIT`] bytes wait in the inbox; beyond them the thread stops reading
//! and TCP's window holds the sender back, as a loop that stops reading would.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use metampi_wire::frame;

/// Bytes the inbox may hold before the thread stops reading.
const QUEUE_LIMIT: usize = 8 << 20;

/// Bytes per read: the kernel holds the socket's lock through a read, and the loop's
/// acknowledgements on the same socket wait for it (the writer thread's reads showed
/// what that costs: 117 µs a read while it wrote whole frames; see `writer`).
const READ_BYTES: usize = 128 << 10;

/// How long an unfinished frame is held while nothing more arrives.
const PARTIAL_HOLD: Duration = Duration::from_millis(20);

/// Whether links get reader threads: `METAMPI_ROUTER_READER=1` (`0` or unset: the loop
/// reads). Off by default until measured where every process has a core of its own
/// (`bench/device_check.sh router`); on a machine with fewer cores than the routed
/// path has processes, the thread only competes for them.
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| metampi::knobs::flag("METAMPI_ROUTER_READER", false))
}

/// What the thread read and the loop has not taken yet.
#[derive(Default)]
pub(super) struct Inbox {
    /// Chunks in stream order.
    pub(super) chunks: VecDeque<BytesMut>,
    /// Their bytes together.
    bytes: usize,
    /// The peer closed the connection (after the chunks).
    pub(super) closed: bool,
    /// The read error that ended the thread (after the chunks).
    pub(super) failed: Option<io::Error>,
    /// The loop let the link go: the thread ends.
    stop: bool,
}

impl Inbox {
    /// Takes every chunk waiting.
    pub(super) fn take(&mut self) -> VecDeque<BytesMut> {
        self.bytes = 0;
        std::mem::take(&mut self.chunks)
    }
}

struct Shared {
    inbox: Mutex<Inbox>,
    /// Rung when the loop takes chunks (room again) or lets the link go.
    room: Condvar,
}

/// The loop's end of a reader thread.
pub(super) struct Reader {
    shared: Arc<Shared>,
    /// A clone of the link's socket, shut down when the reader goes so that a thread
    /// waiting on it ends.
    stream: TcpStream,
}

impl Reader {
    /// Starts a reader for `stream` (non-blocking), whose frames carry at most
    /// `max_payload` bytes; `waker` wakes the loop.
    pub(super) fn spawn(
        stream: &TcpStream,
        max_payload: usize,
        waker: Arc<UnixDatagram>,
    ) -> io::Result<Reader> {
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            room: Condvar::new(),
        });
        let s = stream.try_clone()?;
        let theirs = Arc::clone(&shared);
        let frame_max = frame::HEADER_LEN + max_payload;
        std::thread::Builder::new()
            .name("metampi-link-reader".into())
            .spawn(move || read_loop(&s, &theirs, &waker, frame_max))?;
        Ok(Reader {
            shared,
            stream: stream.try_clone()?,
        })
    }

    /// The inbox, locked; taking chunks makes room for the thread.
    pub(super) fn inbox(&self) -> MutexGuard<'_, Inbox> {
        lock(&self.shared.inbox)
    }

    /// Tells the thread there is room again (after [`Inbox::take`]).
    pub(super) fn made_room(&self) {
        self.shared.room.notify_one();
    }

    /// Whether the loop has something to take.
    pub(super) fn pending(&self) -> bool {
        let inbox = self.inbox();
        !inbox.chunks.is_empty() || inbox.closed || inbox.failed.is_some()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        lock(&self.shared.inbox).stop = true;
        self.shared.room.notify_one();
        // Ends a thread waiting on the socket; the link is being given up (or the
        // router ends) when its reader goes.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the thread stands in the stream.
#[derive(Default)]
struct Cutter {
    /// Bytes read and not handed over.
    buf: BytesMut,
    /// Bytes of a frame whose start went over unfinished that are still to come
    /// (they go over as they arrive).
    owed: usize,
    /// Since when the front of `buf` has been an unfinished frame with the socket
    /// drained.
    held_since: Option<Instant>,
}

impl Cutter {
    /// What the frame at the front of `buf` still lacks (0 when `buf` is empty), as
    /// [`frame::reserve_for_frames`] wants it.
    fn rest(&self) -> usize {
        let have = self.buf.len();
        if self.owed > 0 {
            return self.owed;
        }
        if have == 0 {
            return 0;
        }
        match frame::frame_len(&self.buf) {
            Some(total) => total.saturating_sub(have).max(1),
            None if have < frame::HEADER_LEN => frame::HEADER_LEN - have,
            None => 1,
        }
    }

    /// The bytes to hand over now: owed bytes, then whole frames; bytes that cannot
    /// start a frame; and, with `drained` (the socket had nothing more), an unfinished
    /// frame held for [`PARTIAL_HOLD`]. `None` when nothing goes yet.
    fn cut(&mut self, now: Instant, drained: bool) -> Option<BytesMut> {
        let mut end = self.owed.min(self.buf.len());
        self.owed -= end;
        if self.owed == 0 {
            while let Some(f) = frame::frame_len(&self.buf[end..]) {
                if end + f > self.buf.len() {
                    break;
                }
                end += f;
            }
            let left = &self.buf[end..];
            let partial = frame::frame_len(left);
            if partial.is_none() && left.len() >= frame::HEADER_LEN {
                // Not a frame's start: the decoder resynchronises on it.
                end = self.buf.len();
                self.held_since = None;
            } else if left.is_empty() || !drained {
                self.held_since = None;
            } else {
                let since = *self.held_since.get_or_insert(now);
                if now.duration_since(since) >= PARTIAL_HOLD {
                    // The rest of that frame goes over as it comes.
                    self.owed = partial.map_or(0, |t| t - left.len());
                    end = self.buf.len();
                    self.held_since = None;
                }
            }
        }
        (end > 0).then(|| self.buf.split_to(end))
    }
}

/// Reads the socket until it ends, fails or the loop lets the link go.
fn read_loop(s: &TcpStream, shared: &Shared, waker: &UnixDatagram, frame_max: usize) {
    let mut c = Cutter::default();
    // Spins as the loop does before sleeping: a thread that slept in `poll` after
    // every small message made each one wait for its wake-up (routed 8-byte
    // ping-pong 41-52 µs against 28-35 without the thread, on 2 cores).
    let mut spinner = metampi_sys::poll::Spinner::from_env("METAMPI_ROUTER_SPIN_US", 50);
    loop {
        {
            let mut inbox = lock(&shared.inbox);
            while inbox.bytes >= QUEUE_LIMIT && !inbox.stop {
                inbox = shared
                    .room
                    .wait_timeout(inbox, Duration::from_millis(100))
                    .map_or_else(|p| p.into_inner().0, |(g, _)| g);
            }
            if inbox.stop {
                return;
            }
        }
        let rest = c.rest();
        let limit = frame::reserve_for_frames(&mut c.buf, rest, frame_max).min(READ_BYTES);
        let (drained, end) = match metampi_sys::read::read_append(s, &mut c.buf, limit) {
            Ok(0) => (true, Some(None)),
            Ok(n) => (n < limit, None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => (true, None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => (false, None),
            Err(e) => (true, Some(Some(e))),
        };
        let now = Instant::now();
        let chunk = match end {
            // Everything goes at the end, finished or not.
            Some(_) => (!c.buf.is_empty()).then(|| c.buf.split()),
            None => c.cut(now, drained),
        };
        if chunk.is_some() || end.is_some() {
            let mut inbox = lock(&shared.inbox);
            let was_empty = inbox.chunks.is_empty();
            if let Some(ch) = chunk {
                inbox.bytes += ch.len();
                inbox.chunks.push_back(ch);
            }
            let over = end.is_some() || inbox.stop;
            match end {
                Some(None) => inbox.closed = true,
                Some(Some(e)) => inbox.failed = Some(e),
                None => {}
            }
            drop(inbox);
            if was_empty {
                let _ = waker.send(&[1]);
            }
            if over {
                return;
            }
        }
        if drained {
            // Bytes, the end, or the time to hand an unfinished frame over.
            let wait = match c.held_since {
                Some(t) => PARTIAL_HOLD.saturating_sub(now.duration_since(t)),
                None if c.buf.is_empty() || c.owed > 0 => Duration::from_millis(100),
                None => PARTIAL_HOLD,
            };
            let mut pfd = [libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let _ = spinner.wait_or(
                &mut pfd,
                wait.max(Duration::from_millis(1)),
                || false,
                |_| {},
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metampi_wire::frame::{encode, FrameKind, Header};

    fn frame_bytes(len: usize, seq: u64) -> Vec<u8> {
        let h = Header {
            kind: FrameKind::Data,
            codec: metampi_wire::Codec::Raw,
            failover: false,
            unchecked: false,
            link: 0,
            connection: 1,
            seq,
            ack: 0,
            credit: 0,
            len: len as u32,
        };
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut out = Vec::new();
        encode(&h, &payload, &mut out);
        out
    }

    #[test]
    fn whole_frames_go_at_once_and_an_unfinished_one_after_a_while() {
        let (a, b, c) = (
            frame_bytes(100, 1),
            frame_bytes(5000, 2),
            frame_bytes(10, 3),
        );
        let mut cut = Cutter::default();
        let t0 = Instant::now();
        cut.buf.extend_from_slice(&a);
        cut.buf.extend_from_slice(&b[..3000]);
        // The whole frame goes, the unfinished one stays while bytes keep coming.
        assert_eq!(cut.cut(t0, false).unwrap()[..], a[..]);
        assert!(cut.cut(t0, false).is_none());
        // The frame is 48 + 5000 bytes.
        assert_eq!(cut.rest(), 2048);
        // Drained: held for a while, then handed over as it is, and its rest after it.
        assert!(cut.cut(t0, true).is_none());
        assert!(cut.cut(t0 + PARTIAL_HOLD / 2, true).is_none());
        assert_eq!(cut.cut(t0 + PARTIAL_HOLD, true).unwrap()[..], b[..3000]);
        assert_eq!(cut.rest(), 2048);
        cut.buf.extend_from_slice(&b[3000..4000]);
        assert_eq!(cut.cut(t0, false).unwrap()[..], b[3000..4000]);
        cut.buf.extend_from_slice(&b[4000..]);
        cut.buf.extend_from_slice(&c);
        let got = cut.cut(t0, false).unwrap();
        assert_eq!(got[..1048], b[4000..]);
        assert_eq!(got[1048..], c[..]);
        assert!(cut.buf.is_empty() && cut.rest() == 0);
    }

    #[test]
    fn bytes_that_start_no_frame_go_at_once() {
        let mut cut = Cutter::default();
        let t0 = Instant::now();
        // Too short to tell: kept.
        cut.buf.extend_from_slice(&[7u8; 20]);
        assert!(cut.cut(t0, false).is_none());
        assert_eq!(cut.rest(), frame::HEADER_LEN - 20);
        cut.buf.extend_from_slice(&[7u8; 40]);
        assert_eq!(cut.cut(t0, false).unwrap().len(), 60);
        // A frame after garbage goes with it: the decoder finds it.
        let f = frame_bytes(10, 1);
        cut.buf.extend_from_slice(&[9u8; 50]);
        cut.buf.extend_from_slice(&f);
        assert_eq!(cut.cut(t0, false).unwrap().len(), 50 + f.len());
    }
}
