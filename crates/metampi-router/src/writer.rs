//! A link's writer thread: large frames are written to the link's socket by a
//! thread of their own, so that the router's loop copies and checksums the
//! next frames while the kernel copies this one. On a machine with cores to
//! spare this is what bounds a routed stream: the loop alone spent about half
//! its time in the socket writes of a 4 MiB stream (`METAMPI_ROUTER_PROFILE`).
//!
//! Small frames stay in the loop (a hand-over costs a wake-up), except while
//! the thread has frames queued: a link's frames go out in order.
//!
//! While the thread writes, it also reads what comes back on the socket (the
//! peer's acknowledgements) into an inbox the loop takes them from: a read by
//! the loop waited for the socket's lock, which the writing thread takes
//! again and again (117 µs a read on average, against 5 µs without it). One
//! lock around the inbox and every read of the socket keeps the bytes in
//! order whoever reads them.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metampi_wire::Transmit;

/// Frames this large or larger go to the thread.
pub(super) const HAND_OVER_BYTES: usize = 32 << 10;

/// Bytes the thread may hold unwritten; beyond them frames wait in the
/// link's queue, as they would for a full socket.
const QUEUE_LIMIT: usize = 4 << 20;

/// Bytes per write, so that the thread looks for incoming bytes often.
const WRITE_BYTES: usize = 64 << 10;

/// Whether links get writer threads: `METAMPI_ROUTER_WRITER` (`1` always,
/// `0` never); unset, where the machine has four cores or more (on fewer the
/// thread competes with the ranks for a core).
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let cores = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4);
        metampi::knobs::flag("METAMPI_ROUTER_WRITER", cores)
    })
}

/// The loop's end of a writer thread.
pub(super) struct Writer {
    tx: Sender<Transmit>,
    shared: Arc<Shared>,
    /// A clone of the link's socket, shut down when the writer goes so that
    /// a thread blocked on it ends (the descriptor it holds would otherwise
    /// keep the connection open).
    stream: TcpStream,
}

struct Shared {
    /// Bytes handed over and not yet written.
    queued: AtomicUsize,
    /// The loop stopped handing frames over because the queue was full: the
    /// thread rings the loop's waker once it has room.
    waiting: AtomicBool,
    /// The write error that ended the thread.
    failed: Mutex<Option<io::Error>>,
    /// What the thread read from the socket, not yet taken by the loop.
    inbox: Mutex<Inbox>,
}

/// Bytes read from the link by the thread. Its lock is held for every read
/// of the socket, by either side.
#[derive(Default)]
pub(super) struct Inbox {
    pub(super) bytes: Vec<u8>,
    /// The peer closed the connection.
    pub(super) closed: bool,
}

impl Writer {
    /// Starts a writer for `stream` (non-blocking); `waker` wakes the loop.
    pub(super) fn spawn(stream: &TcpStream, waker: Arc<UnixDatagram>) -> io::Result<Writer> {
        let (tx, rx) = channel::<Transmit>();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            failed: Mutex::new(None),
            inbox: Mutex::new(Inbox::default()),
        });
        let mut s = stream.try_clone()?;
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("metampi-link-writer".into())
            .spawn(move || {
                for t in rx {
                    if let Err(e) = write_frame(&mut s, &t, &theirs, &waker) {
                        *lock(&theirs.failed) = Some(e);
                        let _ = waker.send(&[1]);
                        return;
                    }
                    let left = theirs.queued.fetch_sub(t.len(), Ordering::AcqRel) - t.len();
                    // Idle again: the loop reads the socket itself from now
                    // on, and must look (it may be blocked, not watching it).
                    let room = left < QUEUE_LIMIT && theirs.waiting.swap(false, Ordering::AcqRel);
                    if left == 0 || room {
                        let _ = waker.send(&[1]);
                    }
                }
            })?;
        Ok(Writer {
            tx,
            shared,
            stream: stream.try_clone()?,
        })
    }

    /// Whether frames wait in the thread (later ones must follow them, and
    /// the socket is read by the thread).
    pub(super) fn busy(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) > 0
    }

    /// Hands `t` over, or gives it back when the thread holds its limit (the
    /// loop is woken once it has room).
    pub(super) fn offer(&self, t: Transmit) -> io::Result<Result<(), Transmit>> {
        self.check()?;
        if self.shared.queued.load(Ordering::Acquire) >= QUEUE_LIMIT {
            self.shared.waiting.store(true, Ordering::Release);
            // The thread may have drained between the look and the flag.
            if self.shared.queued.load(Ordering::Acquire) >= QUEUE_LIMIT {
                return Ok(Err(t));
            }
            self.shared.waiting.store(false, Ordering::Release);
        }
        self.shared.queued.fetch_add(t.len(), Ordering::AcqRel);
        let len = t.len();
        if self.tx.send(t).is_err() {
            self.shared.queued.fetch_sub(len, Ordering::AcqRel);
            self.check()?;
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        Ok(Ok(()))
    }

    /// The inbox, locked: take its bytes first, and hold it while reading
    /// the socket directly.
    pub(super) fn inbox(&self) -> MutexGuard<'_, Inbox> {
        lock(&self.shared.inbox)
    }

    /// The error that ended the thread, if it ended.
    pub(super) fn check(&self) -> io::Result<()> {
        match lock(&self.shared.failed).as_ref() {
            Some(e) => Err(io::Error::new(e.kind(), e.to_string())),
            None => Ok(()),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Ends a thread blocked on a socket the peer no longer reads; the
        // link is being given up (or the router ends) when its writer goes.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes the whole frame, waiting for room in the socket as needed, and
/// reads what arrived between the writes (unless the loop is reading).
fn write_frame(
    s: &mut TcpStream,
    t: &Transmit,
    shared: &Shared,
    waker: &UnixDatagram,
) -> io::Result<()> {
    let total = t.len();
    let mut done = 0;
    while done < total {
        let mut iov = [IoSlice::new(&[]); super::MAX_IOV];
        let n = super::io_slices_upto(t, done, WRITE_BYTES, &mut iov);
        match s.write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => done += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Room, or bytes to read, or a timeout to look again.
                metampi_sys::poll::wait(&[(s.as_raw_fd(), true)], Duration::from_millis(100))?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        read_incoming(s, shared, waker);
    }
    Ok(())
}

/// Moves what the socket holds into the inbox, if the loop is not reading.
fn read_incoming(s: &mut TcpStream, shared: &Shared, waker: &UnixDatagram) {
    let Ok(mut inbox) = shared.inbox.try_lock() else {
        return;
    };
    if inbox.closed {
        return;
    }
    let was_empty = inbox.bytes.is_empty();
    let mut buf = [0u8; 16 << 10];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                inbox.closed = true;
                break;
            }
            Ok(n) => inbox.bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // WouldBlock, or an error the loop's next read (or write) finds.
            Err(_) => break,
        }
    }
    if was_empty && (inbox.closed || !inbox.bytes.is_empty()) {
        let _ = waker.send(&[1]);
    }
}
