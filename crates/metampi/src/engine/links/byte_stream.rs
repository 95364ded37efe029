//! The byte-stream backend: frames coded by [`super::super::stream`] over a
//! TCP connection (to a rank of another machine, to a spawned or parent
//! process, or to a router), or over a shared-memory pipe to a router on this
//! node, whose connection then only rings and tells when the router is gone.
//! Its eager limit is the TCP one, or the router one on a router connection;
//! fragments are [`TCP_FRAGMENT`] (the routed backend's are smaller). Sockets
//! are looked at with one `poll` per pass ([`TcpWatch`]).

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::super::core::{Core, SendBuf};
use super::super::stream::{ByteSource, StreamRx};
use super::{Link, Links, OutFrame};
use crate::envelope::{Envelope, Kind};
use crate::error::{Error, ErrorClass};
use crate::sys::vchan::{self, VChan};

/// Largest `Data` fragment on a stream.
pub(super) const TCP_FRAGMENT: usize = 1 << 30;

/// Progress passes that looked at the TCP sockets, and that skipped the
/// look (for tests, `counters::socket_looks`).
pub(crate) static SOCKET_LOOKS: AtomicU64 = AtomicU64::new(0);

pub(crate) static SOCKET_SKIPS: AtomicU64 = AtomicU64::new(0);

pub(crate) struct StreamLink {
    pub stream: TcpStream,
    pub(super) rx: StreamRx,
    pub(super) closed: bool,
    /// A router on this node: frames go through shared-memory pipes, and the
    /// connection only rings and tells when the router is gone.
    vchan: Option<VChan>,
    /// The router closed the connection (seen while its pipe still had data).
    bell_closed: bool,
    /// The engine rank of the process at the other end, where its frames
    /// carry a rank of another world (see [`Links::add_process`]).
    src_as: Option<u32>,
}

/// The sockets of the TCP links (those without a router pipe), looked at
/// with one `poll` per pass instead of a `read` each, and only those with
/// bytes (or an end) read; a lone socket is read without the `poll`. After
/// a look whose reads brought nothing, the next waits twice as long as that
/// one took (see [`TcpWatch::quiet`]), where the pass has memory to look at
/// in between (rings, router pipes). A rank talking over shared memory
/// while its TCP peers are quiet paid a `read` per peer on every pass of its
/// wait: 2000 8-byte round trips between the two ranks of one of 4 emulated
/// machines (6 TCP peers each) made 72,000 `recvfrom` calls, now 8,700
/// `ppoll` and `recvfrom` calls, and took 5-10 µs one-way, now 1.5-5.
#[derive(Default)]
pub(super) struct TcpWatch {
    pub(super) pfds: Vec<libc::pollfd>,
    /// The peer index of each of `pfds`.
    pub(super) peer_of: Vec<usize>,
    /// Peers that had something in the last look.
    pub(super) ready: Vec<usize>,
    /// Every open TCP link (socket or router pipe), in peer order: the
    /// peers a pass reads. Walking every peer for them took a quarter of
    /// the pass's own samples in a profile of 8-byte streaming over shared
    /// memory, where there are none (a link is 312 bytes: each kind read is
    /// a line of its own).
    pub(super) streams: Vec<usize>,
    /// Links opened, closed or changed since `pfds` was made.
    pub(super) stale: bool,
    /// Sockets are all a pass looks at (no ring, no router pipe): a look
    /// skipped would only spin in its place, so none is.
    pub(super) alone: bool,
    /// When the last look began, and no look before `next` (set by a look
    /// that found nothing).
    pub(super) began: Option<Instant>,
    pub(super) next: Option<Instant>,
}

impl TcpWatch {
    /// After the reads of a look: where they brought nothing and nothing
    /// waits on the sockets (`keep_looking` unset), the next look waits twice
    /// as long as this one took (syscalls then take at most a third of a
    /// waiting rank's time, and a message on a quiet link is read at most
    /// that much later), at most [`TCP_LOOK_GAP_MAX`] (a look that lost its
    /// core to another process says nothing of what a look costs).
    pub(super) fn quiet(&mut self, keep_looking: bool) {
        self.next = match self.began.take() {
            Some(t) if !keep_looking && !self.alone => {
                let now = Instant::now();
                Some(now + (2 * (now - t)).min(TCP_LOOK_GAP_MAX))
            }
            _ => None,
        };
    }
}

/// The longest wait between two looks at quiet TCP sockets.
const TCP_LOOK_GAP_MAX: Duration = Duration::from_micros(4);

/// Writes as much of one frame as the socket (or pipe) takes; `Ok(true)`
/// when all is out.
fn write_frame(
    t: &mut StreamLink,
    env: &[u8],
    payload: &[u8],
    written: &mut usize,
) -> io::Result<bool> {
    let total = env.len() + payload.len();
    if let Some(v) = &mut t.vchan {
        if t.bell_closed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "peer closed the connection",
            ));
        }
        let before = *written;
        while *written < total {
            let n = if *written < env.len() {
                v.write_vectored(&[IoSlice::new(&env[*written..]), IoSlice::new(payload)])
            } else {
                v.write_vectored(&[IoSlice::new(&payload[*written - env.len()..])])
            };
            if n == 0 {
                break;
            }
            *written += n;
        }
        if *written > before {
            v.notify(&t.stream);
        }
        return Ok(*written == total);
    }
    let s = &mut t.stream;
    while *written < total {
        let r = if *written < env.len() {
            s.write_vectored(&[IoSlice::new(&env[*written..]), IoSlice::new(payload)])
        } else {
            s.write(&payload[*written - env.len()..])
        };
        match r {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "peer closed the connection",
                ))
            }
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn read_some(
    s: &mut TcpStream,
    pipe: Option<&mut VChan>,
    buf: &mut [u8],
) -> io::Result<Option<usize>> {
    if let Some(v) = pipe {
        let n = v.read(buf)?;
        if n == 0 {
            return Ok(None);
        }
        // The router may be waiting for room.
        v.notify(s);
        return Ok(Some(n));
    }
    loop {
        match s.read(buf) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ))
            }
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A link's bytes as the stream codec reads them: its router pipe where it has one, else
/// its socket.
struct LinkBytes<'a> {
    stream: &'a mut TcpStream,
    pipe: Option<&'a mut VChan>,
}

impl ByteSource for LinkBytes<'_> {
    fn read_into(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        read_some(self.stream, self.pipe.as_deref_mut(), buf)
    }

    fn short_read_drains(&self) -> bool {
        self.pipe.is_none()
    }
}

/// Reads every complete frame available on a stream without blocking.
/// `wire_src`: on a router connection, the engine ranks of processes named
/// there by another id ([`Links::add_routed`]).
fn read_stream(
    t: &mut StreamLink,
    core: &mut Core,
    wire_src: Option<&HashMap<u32, u32>>,
    got: &mut bool,
) -> io::Result<bool> {
    let StreamLink {
        stream,
        rx,
        vchan,
        src_as,
        ..
    } = t;
    let src_as = *src_as;
    let src_of = |wire: u32| {
        src_as
            .or_else(|| wire_src.and_then(|m| m.get(&wire).copied()))
            .unwrap_or(wire)
    };
    let mut bytes = LinkBytes {
        stream,
        pipe: vchan.as_mut(),
    };
    rx.pump(&mut bytes, core, src_of, got)
}

impl Links {
    /// Adds a process outside the world (a spawned child, or a parent) on
    /// its own stream; returns the engine rank it gets here. Its frames
    /// name the sender by its rank in its own world, so they are read as
    /// coming from this rank instead.
    pub(crate) fn add_process(&mut self, stream: TcpStream) -> u32 {
        let r = self.peers.len() as u32;
        self.peers.push(Link::Stream(StreamLink {
            stream,
            rx: StreamRx::default(),
            closed: false,
            vchan: None,
            bell_closed: false,
            src_as: Some(r),
        }));
        self.outq.push(VecDeque::new());
        self.tcp.stale = true;
        r
    }

    pub(crate) fn tcp(stream: TcpStream) -> Link {
        Self::stream(stream, None)
    }

    /// A router connection whose frames travel through `vchan` when given.
    pub(crate) fn stream(stream: TcpStream, vchan: Option<VChan>) -> Link {
        Link::Stream(StreamLink {
            stream,
            rx: StreamRx::default(),
            closed: false,
            vchan,
            bell_closed: false,
            src_as: None,
        })
    }

    /// Raises or lowers this rank's "wake me" flag on every router pipe.
    pub(crate) fn arm_pipes(&self, on: bool) {
        for p in &self.peers[self.world..self.world + self.routers] {
            if let Link::Stream(StreamLink {
                vchan: Some(v),
                closed: false,
                ..
            }) = p
            {
                v.arm(on);
            }
        }
    }

    /// Reads the wake-up bytes of every router pipe's connection, noting
    /// the ones the router has closed.
    pub(super) fn drain_bells(&mut self) {
        let routers = self.world..self.world + self.routers;
        for p in &mut self.peers[routers] {
            if let Link::Stream(t) = p {
                if t.vchan.is_some() && !t.closed && !t.bell_closed {
                    t.bell_closed = !vchan::drain_bell(&t.stream).unwrap_or(false);
                }
            }
        }
    }

    /// File descriptors to wait on when blocking.
    /// With `.1` set where the wait should also end when the socket can take more.
    pub(crate) fn poll_fds(&self, out: &mut Vec<(RawFd, bool)>) {
        out.clear();
        out.push((self.wake.as_raw_fd(), false));
        for (i, p) in self.peers.iter().enumerate() {
            if let Link::Stream(t) = p {
                if !t.closed && !t.bell_closed {
                    // A pipe's writer rings when it has made room: no POLLOUT.
                    let w = !self.outq[i].is_empty() && t.vchan.is_none();
                    out.push((t.stream.as_raw_fd(), w));
                }
            }
        }
    }

    /// Looks (one `poll`) at the sockets of the TCP links, where a look is
    /// due, and lists in `tcp.ready`, in peer order, those with something to
    /// read; `false` where no look was due (nothing is listed).
    pub(super) fn look_at_sockets(&mut self) -> bool {
        let w = &mut self.tcp;
        if !w.stale {
            // No socket to look at until a link opens.
            if w.pfds.is_empty() {
                return false;
            }
            if let Some(next) = w.next {
                if Instant::now() < next {
                    SOCKET_SKIPS.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        if w.stale {
            w.pfds.clear();
            w.peer_of.clear();
            w.streams.clear();
            for (p, l) in self.peers.iter().enumerate() {
                if let Link::Stream(t) = l {
                    if !t.closed {
                        w.streams.push(p);
                    }
                    if !t.closed && t.vchan.is_none() {
                        w.pfds.push(libc::pollfd {
                            fd: t.stream.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        });
                        w.peer_of.push(p);
                    }
                }
            }
            w.stale = false;
            w.alone = self.shm_in.is_empty()
                && !self
                    .peers
                    .iter()
                    .any(|l| matches!(l, Link::Stream(t) if !t.closed && t.vchan.is_some()));
            if w.pfds.is_empty() {
                return false;
            }
        }
        SOCKET_LOOKS.fetch_add(1, Ordering::Relaxed);
        // Sockets alone get no gap, so their looks need no clock.
        w.began = (!w.alone).then(Instant::now);
        // One socket is read as it is: a `poll` would only add a syscall.
        // A failed look reads every socket, as each pass did before.
        let all =
            w.pfds.len() == 1 || crate::sys::poll::wait_fds(&mut w.pfds, Duration::ZERO).is_err();
        for (pfd, &p) in w.pfds.iter().zip(&w.peer_of) {
            if all || pfd.revents != 0 {
                w.ready.push(p);
            }
        }
        true
    }
}

impl StreamLink {
    /// Writes as much of one frame as the socket (or pipe) takes; `Ok(true)`
    /// when all is out. A clear-to-send written means data will follow on
    /// this stream, which its reader counts on.
    pub(super) fn write(
        &mut self,
        env: &[u8],
        payload: &[u8],
        written: &mut usize,
    ) -> io::Result<bool> {
        let done = write_frame(self, env, payload, written)?;
        if done && env[0] == Kind::Cts as u8 {
            self.rx.awaiting_data += 1;
        }
        Ok(done)
    }
}

impl Links {
    /// Queues a message on stream channel `d`: eager up to the stream's limit
    /// (a router connection's own, as routers refuse larger frames), else a
    /// rendezvous request; fails it at once where the stream is closed.
    pub(super) fn post_stream(&mut self, core: &mut Core, d: usize, env: Envelope, sync: bool) {
        let Link::Stream(t) = &self.peers[d] else {
            return;
        };
        let id = env.sreq;
        if t.closed {
            core.fail(
                id,
                Error::new(
                    ErrorClass::Other,
                    format!("connection to rank {} is closed", env.dst),
                ),
            );
            return;
        }
        self.queue_send(d, env, sync, self.stream_eager(d));
    }

    /// The eager limit on stream channel `d`.
    #[inline]
    pub(super) fn stream_eager(&self, d: usize) -> usize {
        if self.is_router(d) {
            self.eager_router
        } else {
            self.eager_tcp
        }
    }

    /// [`Links::try_send_now`] on stream channel `d`, whose out-queue is empty.
    #[inline]
    pub(super) fn stream_send_now(
        &mut self,
        core: &mut Core,
        d: usize,
        env: &Envelope,
        bytes: &[u8],
    ) -> bool {
        let eager = self.stream_eager(d);
        let Link::Stream(t) = &mut self.peers[d] else {
            return false;
        };
        // Where router connections carry ids other than engine ranks
        // (a spawn across meta hosts), the queue rewrites them
        // (`Links::to_wire`): the common path stays as it was.
        if t.closed || self.wire.is_some() || bytes.len() > eager {
            return false;
        }
        let frame = env.encode(None);
        let mut written = 0;
        match write_frame(t, &frame, bytes, &mut written) {
            Ok(true) => true,
            Ok(false) if written == 0 => false,
            Ok(false) => {
                // Partly written: the rest must follow before anything
                // else, from a copy the library owns.
                let id = core.new_send(env.dst, SendBuf::Owned(bytes.to_vec()));
                core.detach(id);
                self.outq[d].push_back(OutFrame {
                    env: frame,
                    payload: Some((id, 0, bytes.len())),
                    written,
                    done: Some(id),
                });
                self.pending += 1;
                true
            }
            Err(_) => false,
        }
    }

    /// Reads every open stream that has something: router pipes on every
    /// pass (memory, no syscall), sockets where the look found bytes or an
    /// end. Returns whether a frame came.
    pub(super) fn read_streams(&mut self, core: &mut Core) -> bool {
        let mut moved = false;
        let routers = self.world..self.world + self.routers;
        let looked = self.look_at_sockets();
        let mut next_ready = 0;
        let mut got = false;
        for k in 0..self.tcp.streams.len() {
            let p = self.tcp.streams[k];
            if let Link::Stream(t) = &mut self.peers[p] {
                // Pipes are read every pass (memory, no syscall); sockets
                // when the look found something there.
                let due = t.vchan.is_some() || {
                    let r = self.tcp.ready.get(next_ready) == Some(&p);
                    next_ready += usize::from(r);
                    r
                };
                if !t.closed && due {
                    let wire_src = match &self.wire {
                        Some(ids) if routers.contains(&p) => Some(&ids.src),
                        _ => None,
                    };
                    // Bytes from a pipe say nothing of the sockets.
                    let mut from_pipe = false;
                    let got = if t.vchan.is_some() {
                        &mut from_pipe
                    } else {
                        &mut got
                    };
                    let r = read_stream(t, core, wire_src, got);
                    let r = match (r, &mut t.vchan) {
                        // What the router wrote before it went is read first.
                        (Ok(false), Some(v)) if t.bell_closed && v.peek_readable() == 0 => {
                            Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "peer closed the connection",
                            ))
                        }
                        (r, _) => r,
                    };
                    match r {
                        Ok(m) => moved |= m,
                        Err(e) => {
                            t.closed = true;
                            self.tcp.stale = true;
                            let why = e.to_string();
                            // A receive the broken message had claimed (a
                            // wildcard one names no peer to fail it by).
                            if let Some(id) = t.rx.take_claimed() {
                                core.fail(
                                    id,
                                    Error::new(
                                        ErrorClass::Other,
                                        format!("connection lost mid-message: {why}"),
                                    ),
                                );
                            }
                            self.fail_channel(core, p, &why);
                        }
                    }
                }
            }
        }
        if looked {
            self.tcp.ready.clear();
            // Quiet sockets are looked at again after the gap, unless a
            // receive waits for a message on one of them: then the look is
            // what the rank is waiting for, not a cost to its other links.
            let awaited = !got
                && !self.tcp.alone
                && core.posted_from(|s| {
                    matches!(self.peers.get(s as usize),
                        Some(Link::Stream(t)) if !t.closed && t.vchan.is_none())
                });
            self.tcp.quiet(got || awaited);
        }
        moved
    }
}
