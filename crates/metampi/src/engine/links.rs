//! Transports: the one contract every backend meets, and the three backends.
//!
//! Contract: frames to one peer leave in the order they were queued and arrive
//! in that order (FIFO per pair), whole, each exactly once; a backend never
//! blocks the caller; it reports a lost peer instead of panicking on bad bytes.
//! The matching engine ([`super::core`]) never knows which backend carried a
//! frame. Backends, chosen per destination at start-up:
//! - `Local`: a message to oneself, handed over in memory;
//! - `Shm`: a ring in the receiver's shared segment (same machine);
//! - `Tcp`: one TCP connection per pair (other machine, or forced).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::coop::{self, PeerSlots, Table};
use super::core::{status_of, Action, Core, Pattern, Pull, RawStatus, RecvBuf, ReqId};
use super::stream::{ByteSource, StreamRx};
use crate::envelope::{Envelope, Kind, ENV_LEN, F_BIG_ENDIAN, INLINE_MAX};
use crate::error::{Error, ErrorClass};
use crate::sys::cma;
use crate::sys::ring::{Consumer, HeadWatch, Producer};
use crate::sys::shm::Segment;
use crate::sys::vchan::{self, VChan};

/// Largest `Data` fragment sent through a router.
const ROUTER_FRAGMENT: usize = 256 << 10;
/// Largest `Data` fragment on a stream.
const TCP_FRAGMENT: usize = 1 << 30;
/// Records taken from one ring per progress pass, so one busy sender cannot starve others.
const RING_BATCH: usize = 64;

/// The sleep flag a rank raises (in its own segment) before blocking, so that
/// writers know to send a wake-up datagram.
pub(crate) struct SleepFlag(*const AtomicU32);

// SAFETY: points into a shared mapping kept alive by `Links::segments`.
unsafe impl Send for SleepFlag {}

impl SleepFlag {
    /// # Safety
    /// `p` must point to a 4-byte aligned word in a live shared mapping that
    /// outlives this flag.
    pub(crate) unsafe fn new(p: *const AtomicU32) -> SleepFlag {
        SleepFlag(p)
    }

    pub(crate) fn get(&self) -> &AtomicU32 {
        // SAFETY: contract of `new`.
        unsafe { &*self.0 }
    }
}

/// Wakes the shared-memory peer whose sleep word is `flag` (wake-up socket
/// `addr`) if it sleeps in its wait loop, once per sleep: the first writer
/// to see the flag up takes it down and sends the datagram; later writers
/// (more messages, freed ring space, other peers) see it down and send
/// nothing. The sleeper looks at everything when it wakes, so one datagram
/// is all it needs. Sending one per message while the flag stayed up cost a
/// `sendto` (1.5-4 µs) each: 1000 queued 8-byte messages taken by a
/// receiver whose sender slept took 1.8 µs apiece.
/// The caller has published first (`publish_fence`), so either the sleeper
/// sees what was published before it sleeps or its flag is seen here.
/// (A failed send needs no retry: a full queue wakes the sleeper anyway.)
pub(crate) fn wake_if_asleep(wake: &UnixDatagram, flag: &AtomicU32, addr: &SocketAddr) {
    if flag.load(Ordering::Relaxed) != 0
        && flag
            .compare_exchange(1, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        WAKE_UPS.fetch_add(1, Ordering::Relaxed);
        let _ = wake.send_to_addr(&[1], addr);
    }
}

/// Wake-up datagrams this process sent to shared-memory peers (for tests,
/// `counters::wake_ups_sent`).
pub(crate) static WAKE_UPS: AtomicU64 = AtomicU64::new(0);

/// Progress passes that looked at the TCP sockets, and that skipped the
/// look (for tests, `counters::socket_looks`).
pub(crate) static SOCKET_LOOKS: AtomicU64 = AtomicU64::new(0);
pub(crate) static SOCKET_SKIPS: AtomicU64 = AtomicU64::new(0);

pub(crate) struct ShmLink {
    pub prod: Producer,
    pub peer_sleep: SleepFlag,
    pub peer_wake: SocketAddr,
    /// The peer's cooperative-copy slots (it asks us to help through them).
    pub peer_coop: PeerSlots,
}

pub(crate) struct TcpLink {
    pub stream: TcpStream,
    rx: StreamRx,
    closed: bool,
    /// A router on this node: frames go through shared-memory pipes, and the
    /// connection only rings and tells when the router is gone.
    vchan: Option<VChan>,
    /// The router closed the connection (seen while its pipe still had data).
    bell_closed: bool,
    /// The engine rank of the process at the other end, where its frames
    /// carry a rank of another world (see [`Links::add_process`]).
    src_as: Option<u32>,
}

pub(crate) enum Link {
    Local,
    Shm(ShmLink),
    Tcp(TcpLink),
    /// Frames travel through the channel at this index (a router connection
    /// shared by every peer of one remote site).
    Via(usize),
}

struct OutFrame {
    env: [u8; ENV_LEN],
    /// Payload taken from send request `.0` at offset `.1`, length `.2`.
    payload: Option<(ReqId, usize, usize)>,
    written: usize,
    /// Send request completed once this frame is out.
    done: Option<ReqId>,
}

pub(crate) struct Links {
    pub rank: u32,
    pub peers: Vec<Link>,
    outq: Vec<VecDeque<OutFrame>>,
    shm_in: Vec<(u32, Consumer)>,
    /// Index into `shm_in` by world rank (`u32::MAX`: none).
    in_at: Vec<u32>,
    self_q: VecDeque<(Envelope, Vec<u8>)>,
    pub eager_shm: usize,
    pub eager_tcp: usize,
    /// Eager limit through a router: a rendezvous handshake costs a wide-area
    /// round trip, so larger messages go eagerly there (buffered by the receiver).
    pub eager_router: usize,
    /// Point-to-point payloads through routers are in big-endian order (this
    /// meta host declares it; the sender converted them).
    pub routed_big_endian: bool,
    pub cma: bool,
    /// Our cooperative-copy slots (`None` without shared-memory peers).
    pub coop: Option<Table>,
    /// Where processes outnumber cores: the cores, and the processes here
    /// whose sleep we cannot see (help is asked only while every awake
    /// process has a core).
    pub crowd: Option<(usize, usize)>,
    /// Matched long messages to copy in the next full pass: the call that
    /// posts a request only starts it (see [`Links::progress_as`]).
    deferred: Vec<Pull>,
    /// This rank's sleep flags: in its world segment, and in the segments
    /// it made for processes that joined later (one word each, all raised
    /// together).
    pub my_sleep: Vec<SleepFlag>,
    pub wake: UnixDatagram,
    pub segments: Vec<Segment>,
    /// World ranks: channels `[world, world + routers)` are router
    /// connections, and those after them spawned or parent processes
    /// ([`Links::add_process`]), each its own rank in this engine.
    world: usize,
    routers: usize,
    /// Frames waiting in any out-queue (fast check for the progress loop).
    pending: usize,
    /// Why the job must end (a router connection broke).
    pub fatal: Option<String>,
    /// Meta host of every world rank (to name what a lost router served).
    pub sites: Vec<u32>,
    /// Progress passes since the router connections were last looked at
    /// for their end (pipes carry the data; the socket only rings).
    bell_tick: u32,
    /// Ids on router connections that are not engine ranks (a spawn across
    /// meta hosts); boxed, as nearly every process has none.
    wire: Option<Box<WireIds>>,
    /// Which sockets to read in a pass (see [`TcpWatch`]).
    tcp: TcpWatch,
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
struct TcpWatch {
    pfds: Vec<libc::pollfd>,
    /// The peer index of each of `pfds`.
    peer_of: Vec<usize>,
    /// Peers that had something in the last look.
    ready: Vec<usize>,
    /// Every open TCP link (socket or router pipe), in peer order: the
    /// peers a pass reads. Walking every peer for them took a quarter of
    /// the pass's own samples in a profile of 8-byte streaming over shared
    /// memory, where there are none (a link is 312 bytes: each kind read is
    /// a line of its own).
    streams: Vec<usize>,
    /// Links opened, closed or changed since `pfds` was made.
    stale: bool,
    /// Sockets are all a pass looks at (no ring, no router pipe): a look
    /// skipped would only spin in its place, so none is.
    alone: bool,
    /// When the last look began, and no look before `next` (set by a look
    /// that found nothing).
    began: Option<Instant>,
    next: Option<Instant>,
}

impl TcpWatch {
    /// After the reads of a look: where they brought nothing and nothing
    /// waits on the sockets (`keep_looking` unset), the next look waits twice
    /// as long as this one took (syscalls then take at most a third of a
    /// waiting rank's time, and a message on a quiet link is read at most
    /// that much later), at most [`TCP_LOOK_GAP_MAX`] (a look that lost its
    /// core to another process says nothing of what a look costs).
    fn quiet(&mut self, keep_looking: bool) {
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

/// Processes of another world reached through routers ([`Links::add_routed`]):
/// each one's id on the wire by its engine rank here, and back (routers know
/// processes by their wire id); and this process's own wire id, where it is not
/// its world rank (a child that meets parents through routers).
#[derive(Default)]
struct WireIds {
    dst: HashMap<u32, u32>,
    src: HashMap<u32, u32>,
    me: Option<u32>,
}

/// The payload of ring record `rec` whose envelope is `env` (inline or
/// after the envelope); `None` where the record is too short for it.
fn record_payload<'r>(env: &Envelope, rec: &'r [u8]) -> Option<&'r [u8]> {
    if env.is_inline() {
        rec.get(32..32 + env.len as usize)
    } else {
        rec.get(ENV_LEN..ENV_LEN + env.trailing_len())
    }
}

impl Links {
    /// The sleep word of world rank `w` when it shares memory with us.
    pub(crate) fn sleep_flag(&self, w: u32) -> Option<*const AtomicU32> {
        match self.peers.get(w as usize) {
            Some(Link::Shm(l)) => Some(l.peer_sleep.0),
            _ => None,
        }
    }

    /// Wakes world rank `w` if it sleeps (shared-memory peers; once per
    /// sleep, see [`wake_if_asleep`]).
    pub(crate) fn wake_peer(&self, w: u32) {
        if let Some(Link::Shm(l)) = self.peers.get(w as usize) {
            wake_if_asleep(&self.wake, l.peer_sleep.get(), &l.peer_wake);
        }
    }

    pub(crate) fn new(rank: u32, peers: Vec<Link>, wake: UnixDatagram) -> Links {
        let tuning = crate::tuning::current();
        let n = peers.len();
        Links {
            rank,
            peers,
            outq: (0..n).map(|_| VecDeque::new()).collect(),
            shm_in: Vec::new(),
            in_at: Vec::new(),
            self_q: VecDeque::new(),
            eager_shm: tuning.eager_shm,
            eager_tcp: tuning.eager_tcp,
            eager_router: tuning.eager_router,
            routed_big_endian: cfg!(target_endian = "big"),
            cma: false,
            coop: None,
            crowd: None,
            deferred: Vec::new(),
            my_sleep: Vec::new(),
            wake,
            segments: Vec::new(),
            world: n,
            routers: 0,
            pending: 0,
            fatal: None,
            sites: Vec::new(),
            bell_tick: 0,
            wire: None,
            tcp: TcpWatch {
                stale: true,
                ..TcpWatch::default()
            },
        }
    }

    /// Adds a process of another world reached through router channel
    /// `chan` by its wire id `wire`; returns the engine rank it gets here.
    /// Frames to it are addressed to `wire`, and frames from it (naming
    /// `wire` as their sender) are read as coming from that rank.
    pub(crate) fn add_routed(&mut self, wire: u32, chan: usize) -> u32 {
        let r = self.peers.len() as u32;
        self.peers.push(Link::Via(chan));
        self.outq.push(VecDeque::new());
        self.tcp.stale = true;
        let ids = self.wire.get_or_insert_default();
        ids.dst.insert(r, wire);
        ids.src.insert(wire, r);
        r
    }

    /// Names this process `wire` in what it sends through routers.
    pub(crate) fn set_wire_self(&mut self, wire: u32) {
        self.wire.get_or_insert_default().me = Some(wire);
    }

    /// Rewrites an envelope bound for channel `d` into wire ids where `d` is a
    /// router connection: the destination's, and this process's own.
    #[inline]
    fn to_wire(&self, d: usize, env: &mut [u8; ENV_LEN]) {
        let Some(ids) = &self.wire else {
            return;
        };
        if !self.is_router(d) {
            return;
        }
        let dst = u32::from_le_bytes([env[4], env[5], env[6], env[7]]);
        if let Some(w) = ids.dst.get(&dst) {
            env[4..8].copy_from_slice(&w.to_le_bytes());
        }
        if let Some(me) = ids.me {
            env[8..12].copy_from_slice(&me.to_le_bytes());
        }
    }

    /// The channel (index into `peers`) that carries frames to world rank `dst`.
    fn chan(&self, dst: u32) -> usize {
        match self.peers.get(dst as usize) {
            Some(Link::Via(c)) => *c,
            _ => dst as usize,
        }
    }

    /// The router channel that carries frames to world rank `w`, if one does.
    pub(crate) fn channel_to(&self, w: u32) -> Option<usize> {
        match self.peers.get(w as usize) {
            Some(Link::Via(c)) => Some(*c),
            _ => None,
        }
    }

    /// Number of world ranks.
    fn world(&self) -> usize {
        self.world
    }

    /// Whether channel `c` is a router connection.
    fn is_router(&self, c: usize) -> bool {
        c >= self.world && c < self.world + self.routers
    }

    /// Whether frames may be addressed to engine rank `dst`: a world rank or
    /// a process joined later, not a router connection.
    fn addressable(&self, dst: u32) -> bool {
        (dst as usize) < self.peers.len() && !self.is_router(dst as usize)
    }

    pub(crate) fn add_inbound(&mut self, src: u32, c: Consumer) {
        let s = src as usize;
        if self.in_at.len() <= s {
            self.in_at.resize(s + 1, u32::MAX);
        }
        self.in_at[s] = self.shm_in.len() as u32;
        self.shm_in.push((src, c));
        self.tcp.stale = true;
    }

    /// A receive's shortcut through the ring of shared-memory peer `src`:
    /// where the next message there is a plain eager one that `pat` matches,
    /// no receive posted earlier matches, and `buf` holds, it is read into
    /// `buf` and its status returned. Anything else stays for the full path
    /// (see [`super::Engine::recv_now`]).
    #[inline]
    pub(crate) fn take_ring_head(
        &mut self,
        core: &Core,
        src: u32,
        pat: &Pattern,
        buf: &mut RecvBuf,
    ) -> Option<RawStatus> {
        let i = *self.in_at.get(src as usize)?;
        let (_, cons) = self.shm_in.get_mut(i as usize)?;
        let mut got = None;
        cons.read_one(|rec| {
            let Some(mut env) = Envelope::decode(rec) else {
                return false;
            };
            env.src = src;
            if env.kind != Kind::Eager
                || !pat.matches(&env)
                || env.len as usize > buf.cap()
                || core.posted_match(&env)
            {
                return false;
            }
            let Some(payload) = record_payload(&env, rec) else {
                return false;
            };
            crate::sys::copy::copy(buf.prepare(payload.len()), payload);
            got = Some(status_of(&env, payload.len()));
            true
        })?;
        if got.is_some() {
            self.ring_freed(src);
        }
        got
    }

    /// Whether `src`'s ring holds a record now, and a watch on where its
    /// next one will be published; `None` where `src` has no ring. The rings
    /// are in this rank's own segment, mapped as long as the engine lives
    /// (`segments`).
    pub(crate) fn ring_head(&self, src: u32) -> Option<(bool, HeadWatch)> {
        let i = *self.in_at.get(src as usize)?;
        let cons = &self.shm_in.get(i as usize)?.1;
        Some((cons.has_record(), cons.watch()))
    }

    /// Whether the pass after posting a receive from `src`
    /// ([`Links::progress_ring_of`]) would find nothing to do: `src`'s ring
    /// is empty and nothing waits to go out.
    pub(crate) fn ring_pass_idle(&self, core: &Core, src: u32) -> bool {
        self.pending == 0
            && core.out.is_empty()
            && self
                .in_at
                .get(src as usize)
                .and_then(|&i| self.shm_in.get(i as usize))
                .is_some_and(|(_, c)| !c.has_record())
    }

    /// We took records from `src`'s ring: the writer may be asleep waiting
    /// for its space.
    #[inline]
    fn ring_freed(&self, src: u32) {
        if let Some(Link::Shm(l)) = self.peers.get(src as usize) {
            crate::sys::publish_fence();
            wake_if_asleep(&self.wake, l.peer_sleep.get(), &l.peer_wake);
        }
    }

    /// Adds a channel (a router connection) after the world ranks; returns
    /// its index. Router connections all come before any process added by
    /// [`Links::add_process`].
    pub(crate) fn add_channel(&mut self, link: Link) -> usize {
        debug_assert_eq!(self.peers.len(), self.world + self.routers);
        self.peers.push(link);
        self.outq.push(VecDeque::new());
        self.routers += 1;
        self.tcp.stale = true;
        self.peers.len() - 1
    }

    /// Adds a process outside the world (a spawned child, or a parent) on
    /// its own stream; returns the engine rank it gets here. Its frames
    /// name the sender by its rank in its own world, so they are read as
    /// coming from this rank instead.
    pub(crate) fn add_process(&mut self, stream: TcpStream) -> u32 {
        let r = self.peers.len() as u32;
        self.peers.push(Link::Tcp(TcpLink {
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

    /// Moves process `r` (added by [`Links::add_process`]) from its stream
    /// to shared memory: frames to it go to `prod`, its frames arrive in
    /// `cons`. Both ends switch before either sends anything (during spawn
    /// and start-up), so no frame can overtake another.
    pub(crate) fn use_shm_for(&mut self, r: u32, link: ShmLink, cons: Consumer) {
        self.peers[r as usize] = Link::Shm(link);
        self.tcp.stale = true;
        self.add_inbound(r, cons);
    }

    /// Sends frames for world rank `dst` through channel `chan`.
    pub(crate) fn route_via(&mut self, dst: u32, chan: usize) {
        self.peers[dst as usize] = Link::Via(chan);
        self.tcp.stale = true;
    }

    pub(crate) fn tcp(stream: TcpStream) -> Link {
        Self::stream(stream, None)
    }

    /// A router connection whose frames travel through `vchan` when given.
    pub(crate) fn stream(stream: TcpStream, vchan: Option<VChan>) -> Link {
        Link::Tcp(TcpLink {
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
            if let Link::Tcp(TcpLink {
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
    fn drain_bells(&mut self) {
        let routers = self.world..self.world + self.routers;
        for p in &mut self.peers[routers] {
            if let Link::Tcp(t) = p {
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
            if let Link::Tcp(t) = p {
                if !t.closed && !t.bell_closed {
                    // A pipe's writer rings when it has made room: no POLLOUT.
                    let w = !self.outq[i].is_empty() && t.vchan.is_none();
                    out.push((t.stream.as_raw_fd(), w));
                }
            }
        }
    }

    /// Starts a send of the bytes held by request `id` to `dst`.
    pub(crate) fn post_send(
        &mut self,
        core: &mut Core,
        id: ReqId,
        dst: u32,
        ctx: u32,
        tag: i32,
        sync: bool,
    ) {
        let len = core.send_bytes(id).map_or(0, |b| b.len());
        let kind = if sync { Kind::EagerSync } else { Kind::Eager };
        let d = self.chan(dst);
        let order = self.order_flag(d);
        match &self.peers[d] {
            Link::Via(_) => {}
            Link::Local => {
                let data = core.send_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
                let mut env = Envelope::new(kind, self.rank, ctx, tag, len as u64);
                env.flags |= order;
                env.dst = dst;
                env.sreq = id;
                self.self_q.push_back((env, data));
                if !sync {
                    core.complete_send(id);
                }
            }
            Link::Shm(l) => {
                let eager = self.eager_shm.min(l.prod.max_payload());
                let mut env = Envelope::new(kind, self.rank, ctx, tag, len as u64);
                env.flags |= order;
                env.dst = dst;
                env.sreq = id;
                if len <= INLINE_MAX && !sync {
                    let bytes = core.send_bytes(id).unwrap_or(&[]);
                    let frame = env.encode(Some(bytes));
                    self.queue(d, frame, None, Some(id));
                } else if len <= eager {
                    self.queue(
                        d,
                        env.encode(None),
                        Some((id, 0, len)),
                        (!sync).then_some(id),
                    );
                } else {
                    env.kind = Kind::Rts;
                    // The receiver copies it out of our buffer, with our help
                    // when we are waiting (`coop`).
                    if self.cma {
                        env.addr = core.send_bytes(id).map_or(0, |b| b.as_ptr() as u64);
                    }
                    self.queue(d, env.encode(None), None, None);
                }
            }
            Link::Tcp(t) => {
                if t.closed {
                    core.fail(
                        id,
                        Error::new(
                            ErrorClass::Other,
                            format!("connection to rank {dst} is closed"),
                        ),
                    );
                    return;
                }
                let mut env = Envelope::new(kind, self.rank, ctx, tag, len as u64);
                env.flags |= order;
                env.dst = dst;
                env.sreq = id;
                let eager = if self.is_router(d) {
                    self.eager_router
                } else {
                    self.eager_tcp
                };
                if len <= eager {
                    self.queue(
                        d,
                        env.encode(None),
                        Some((id, 0, len)),
                        (!sync).then_some(id),
                    );
                } else {
                    env.kind = Kind::Rts;
                    self.queue(d, env.encode(None), None, None);
                }
            }
        }
        self.flush(core, d);
    }

    /// Writes a small standard-mode message straight to the transport when
    /// nothing is queued before it: no request, no copy besides the write.
    /// Returns false (having done nothing) when the caller must take the
    /// request path instead.
    #[inline]
    pub(crate) fn try_send_now(
        &mut self,
        core: &mut Core,
        dst: u32,
        ctx: u32,
        tag: i32,
        bytes: &[u8],
    ) -> bool {
        let d = self.chan(dst);
        if self.outq.get(d).is_none_or(|q| !q.is_empty()) {
            return false;
        }
        let mut env = Envelope::new(Kind::Eager, self.rank, ctx, tag, bytes.len() as u64);
        env.flags |= self.order_flag(d);
        env.dst = dst;
        match &mut self.peers[d] {
            Link::Shm(l) => {
                if bytes.len() > self.eager_shm.min(l.prod.max_payload()) {
                    return false;
                }
                let written = if bytes.len() <= INLINE_MAX {
                    l.prod.try_write(&env.encode(Some(bytes)), &[])
                } else {
                    l.prod.try_write(&env.encode(None), bytes)
                };
                if !written {
                    return false;
                }
                crate::sys::publish_fence();
                wake_if_asleep(&self.wake, l.peer_sleep.get(), &l.peer_wake);
                true
            }
            Link::Tcp(t) => {
                // Where router connections carry ids other than engine ranks
                // (a spawn across meta hosts), the queue rewrites them
                // (`Links::to_wire`): the common path stays as it was.
                if t.closed || self.wire.is_some() {
                    return false;
                }
                // A router connection takes its own limit: routers refuse larger frames.
                let to_router = d >= self.world && d < self.world + self.routers;
                let eager = if to_router {
                    self.eager_router
                } else {
                    self.eager_tcp
                };
                if bytes.len() > eager {
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
                        let id = core.new_send(dst, super::core::SendBuf::Owned(bytes.to_vec()));
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
            Link::Local | Link::Via(_) => false,
        }
    }

    /// The byte-order flag of a message on channel `d`: traffic to another
    /// meta host (through a router, or straight to a rank of a directly
    /// paired one) is in this meta host's declared order (typed
    /// point-to-point data and collective schedules convert before sending;
    /// receivers of untyped bytes ignore the flag), everything else in this
    /// machine's.
    fn order_flag(&self, d: usize) -> u8 {
        let native = cfg!(target_endian = "big");
        // Where the declared order is this machine's (nearly always), the
        // channel does not matter: one comparison on the send path.
        let big = if self.routed_big_endian == native {
            native
        } else if self.is_router(d)
            || (d < self.world
                && self
                    .sites
                    .get(d)
                    .is_some_and(|s| Some(s) != self.sites.get(self.rank as usize)))
        {
            self.routed_big_endian
        } else {
            native
        };
        if big {
            F_BIG_ENDIAN
        } else {
            0
        }
    }

    fn queue(
        &mut self,
        dst: usize,
        mut env: [u8; ENV_LEN],
        payload: Option<(ReqId, usize, usize)>,
        done: Option<ReqId>,
    ) {
        self.to_wire(dst, &mut env);
        self.outq[dst].push_back(OutFrame {
            env,
            payload,
            written: 0,
            done,
        });
        self.pending += 1;
    }

    /// Turns the engine's queued actions into frames.
    fn drain_actions(&mut self, core: &mut Core) {
        while let Some(a) = core.out.pop_front() {
            match a {
                Action::Ctrl { dst, mut env } => {
                    env.dst = dst;
                    if dst == self.rank {
                        self.self_q.push_back((env, Vec::new()));
                    } else if self.addressable(dst) {
                        let c = self.chan(dst);
                        self.queue(c, env.encode(None), None, None);
                    }
                }
                Action::Pull(p) => self.deferred.push(p),
                Action::Assist { src, env } => self.assist(core, src, &env),
                Action::SendData { dst, sreq, rreq } => {
                    let Some(total) = core.send_bytes(sreq).map(<[u8]>::len) else {
                        continue;
                    };
                    if !self.addressable(dst) {
                        continue;
                    }
                    let c = self.chan(dst);
                    let chunk = match &self.peers.get(c) {
                        Some(Link::Shm(l)) => l.prod.max_payload(),
                        // Routers hold whole frames: keep them small.
                        Some(Link::Tcp(_)) if self.is_router(c) => ROUTER_FRAGMENT,
                        Some(Link::Tcp(_)) => TCP_FRAGMENT,
                        _ => continue,
                    };
                    let mut off = 0;
                    while off < total {
                        let n = chunk.min(total - off);
                        let mut env = Envelope::new(Kind::Data, self.rank, 0, 0, total as u64);
                        env.dst = dst;
                        env.rreq = rreq;
                        env.sreq = sreq;
                        env.addr = off as u64;
                        env.frag = n as u32;
                        let last = off + n == total;
                        self.queue(
                            c,
                            env.encode(None),
                            Some((sreq, off, n)),
                            last.then_some(sreq),
                        );
                        off += n;
                    }
                }
            }
        }
    }

    /// Copies a matched shared-memory rendezvous message out of its sender's
    /// memory. Where a slot is free, the sender is first asked to help
    /// (`Kind::Help`, written to its ring at once) and both copy chunks of it;
    /// a sender that is busy elsewhere leaves them all to us.
    fn pull(&mut self, core: &mut Core, p: Pull) {
        let Some((addr, len)) = core
            .matched_target(p.id)
            .map(|d| (d.as_mut_ptr() as u64, d.len()))
        else {
            return;
        };
        let c = self.chan(p.src);
        // With more processes than cores, a helper that is not running only
        // costs a system call per chunk (8 ranks on 2 cores, all busy in 2 MiB
        // broadcasts: 1.76 -> 2.15 ms with help). Point-to-point traffic
        // between two ranks while the others sleep still has a core each
        // (8 ranks on 2 cores: 1 MiB ping-pong 110 -> 78 µs); collectives,
        // whose members wake and sleep by turns, do not ask (4 ranks on 2
        // cores: all-reduce and all-to-all 7-10% slower when they did).
        let cores_free = self
            .crowd
            .is_none_or(|(cores, unseen)| p.context % 2 == 0 && unseen + self.shm_awake() <= cores);
        let open = match (self.coop.as_mut(), self.peers.get(c)) {
            (Some(t), Some(Link::Shm(_))) if cores_free => t.open(),
            _ => None,
        };
        if let Some(o) = &open {
            let mut help = Envelope::new(Kind::Help, self.rank, p.context, p.tag, len as u64);
            help.dst = p.src;
            help.sreq = p.sreq;
            help.rreq = o.tag();
            help.addr = addr;
            self.queue(c, help.encode(None), None, None);
            self.flush(core, c);
        }
        let Some(dst) = core.matched_target(p.id) else {
            // Nothing here changes the request, but a helper told where to
            // write must be done before the slot is used again.
            if let (Some(o), Some(t)) = (open, self.coop.as_mut()) {
                t.finish(o, len, &mut |_| true, &mut || process_exists(p.pid));
            }
            return;
        };
        let mut copy = |r: std::ops::Range<usize>| {
            cma::read_from(p.pid, p.remote + r.start as u64, &mut dst[r]).is_ok()
        };
        let ok = match (open, self.coop.as_mut()) {
            (Some(o), Some(t)) => t.finish(o, len, &mut copy, &mut || process_exists(p.pid)),
            _ => copy(0..len),
        };
        core.finish_pull(&p, ok);
    }

    /// Helps receiver `src` copy our send named in its `Kind::Help`: chunks
    /// claimed from its slot are written into its buffer.
    fn assist(&mut self, core: &Core, src: u32, env: &Envelope) {
        let Some(Link::Shm(l)) = self.peers.get(src as usize) else {
            return;
        };
        let (index, gen) = coop::untag(env.rreq);
        let (Some(slot), Some(bytes), Some(&pid)) = (
            l.peer_coop.slot(index),
            core.send_bytes_to(env.sreq, src),
            core.pids.get(src as usize),
        ) else {
            return;
        };
        if bytes.len() as u64 != env.len {
            return;
        }
        coop::help(slot, gen, bytes.len(), &mut |r| {
            cma::write_to(pid, env.addr + r.start as u64, &bytes[r]).is_ok()
        });
    }

    /// Writes queued frames to `dst` until its transport is full.
    fn flush(&mut self, core: &mut Core, dst: usize) {
        while let Some(f) = self.outq[dst].front_mut() {
            let payload: &[u8] = match f.payload {
                None => &[],
                Some((sreq, off, len)) => match core.send_bytes(sreq) {
                    Some(b) => &b[off..off + len],
                    None => &[],
                },
            };
            let finished = match &mut self.peers[dst] {
                Link::Shm(l) => {
                    if !l.prod.try_write(&f.env, payload) {
                        break;
                    }
                    crate::sys::publish_fence();
                    wake_if_asleep(&self.wake, l.peer_sleep.get(), &l.peer_wake);
                    true
                }
                Link::Tcp(t) => match write_frame(t, &f.env, payload, &mut f.written) {
                    Ok(done) => {
                        if done && f.env[0] == Kind::Cts as u8 {
                            t.rx.awaiting_data += 1;
                        }
                        done
                    }
                    Err(e) => {
                        t.closed = true;
                        self.tcp.stale = true;
                        let why = e.to_string();
                        self.pending -= self.outq[dst].len();
                        self.outq[dst].clear();
                        self.fail_channel(core, dst, &why);
                        return;
                    }
                },
                Link::Local | Link::Via(_) => true,
            };
            if !finished {
                break;
            }
            let f = self.outq[dst].pop_front().expect("front exists");
            self.pending -= 1;
            if let Some(id) = f.done {
                core.complete_send(id);
            }
        }
    }

    /// One non-blocking pass over every transport. Returns whether anything moved.
    pub(crate) fn progress(&mut self, core: &mut Core) -> bool {
        self.progress_as(core, false)
    }

    /// As [`Links::progress`]; `lazy` (the pass of a call that starts a
    /// request): a message from shared memory that no posted receive wants
    /// stays in its ring (so do the ones behind it), where a receive posted
    /// next takes it with one copy instead of two and no allocation; and
    /// long messages matched are copied only in the next full pass, so that
    /// a rank posting receives and then sends gets its sends out first (two
    /// ranks exchanging then copy at the same time, not one after the
    /// other). A full pass (every wait and test) moves what is left in the
    /// rings to the unexpected queue; messages left in a ring are all newer
    /// than those of the same sender in that queue, so matching order holds.
    pub(crate) fn progress_as(&mut self, core: &mut Core, lazy: bool) -> bool {
        let before = core.completions;
        let mut moved = false;
        while let Some((env, data)) = self.self_q.pop_front() {
            core.handle_incoming(&env, &data);
            moved = true;
        }
        for i in 0..self.shm_in.len() {
            moved |= self.drain_ring(core, i, lazy);
        }
        self.bell_tick = self.bell_tick.wrapping_add(1);
        if self.bell_tick % 256 == 0 {
            self.drain_bells();
        }
        let routers = self.world..self.world + self.routers;
        let looked = self.look_at_sockets();
        let mut next_ready = 0;
        let mut got = false;
        for k in 0..self.tcp.streams.len() {
            let p = self.tcp.streams[k];
            if let Link::Tcp(t) = &mut self.peers[p] {
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
                        Some(Link::Tcp(t)) if !t.closed && t.vchan.is_none())
                });
            self.tcp.quiet(got || awaited);
        }
        if !core.out.is_empty() {
            self.drain_actions(core);
        }
        if !lazy && !self.deferred.is_empty() {
            for p in std::mem::take(&mut self.deferred) {
                self.pull(core, p);
            }
            self.drain_actions(core);
            moved = true;
        }
        self.flush_pending(core);
        if !self.self_q.is_empty() {
            moved = true;
        }
        moved || core.completions != before
    }

    /// Looks (one `poll`) at the sockets of the TCP links, where a look is
    /// due, and lists in `tcp.ready`, in peer order, those with something to
    /// read; `false` where no look was due (nothing is listed).
    fn look_at_sockets(&mut self) -> bool {
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
                if let Link::Tcp(t) = l {
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
                    .any(|l| matches!(l, Link::Tcp(t) if !t.closed && t.vchan.is_some()));
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

    /// Writes what the out-queues hold, as far as the transports take it.
    fn flush_pending(&mut self, core: &mut Core) {
        if self.pending > 0 {
            for d in 0..self.outq.len() {
                if !self.outq[d].is_empty() {
                    self.flush(core, d);
                }
            }
        }
    }

    /// Takes up to [`RING_BATCH`] records from ring `i` of `shm_in` (`lazy`:
    /// see [`Links::progress_as`]); returns whether it took any.
    fn drain_ring(&mut self, core: &mut Core, i: usize, lazy: bool) -> bool {
        let (src, ref mut cons) = self.shm_in[i];
        let mut got = 0;
        while got < RING_BATCH {
            let r = cons.read_one(|rec| {
                if let Some(mut env) = Envelope::decode(rec) {
                    // The ring is the sender's alone; a process of another
                    // world names itself by a rank of that world.
                    env.src = src;
                    if (lazy && core.unwanted(&env)) || core.hold(&env) {
                        return false;
                    }
                    let Some(payload) = record_payload(&env, rec) else {
                        return true;
                    };
                    core.handle_incoming(&env, payload);
                }
                true
            });
            if r != Some(true) {
                break;
            }
            got += 1;
        }
        if got > 0 {
            self.ring_freed(src);
        }
        got > 0
    }

    /// The lazy pass after posting a receive from shared-memory peer `src`:
    /// only its ring can hold that message (and what must be matched before
    /// it), so only that ring is read. `None` where `src` has no ring (the
    /// whole lazy pass is due then).
    pub(crate) fn progress_ring_of(&mut self, core: &mut Core, src: u32) -> Option<bool> {
        let i = *self.in_at.get(src as usize).filter(|&&i| i != u32::MAX)?;
        let before = core.completions;
        let moved = self.drain_ring(core, i as usize, true);
        if !core.out.is_empty() {
            self.drain_actions(core);
        }
        self.flush_pending(core);
        Some(moved || core.completions != before)
    }

    /// Fails the requests of every peer reached through channel `c`.
    fn fail_channel(&mut self, core: &mut Core, c: usize, why: &str) {
        if c >= self.world + self.routers {
            // A process joined later: its requests alone fail.
            core.fail_peer(c as u32, why);
            return;
        }
        if self.is_router(c) && self.fatal.is_none() {
            // A lost router cuts this rank off from a whole meta host: waits on
            // any source or in collectives could never finish, so the job ends.
            let since = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.fatal = Some(format!(
                "lost the connection to its router for meta host(s) {} at unix time {since:.3} ({why})",
                self.sites_via(c)
            ));
        }
        for p in 0..self.world() {
            if self.chan(p as u32) == c {
                core.fail_peer(p as u32, why);
            }
        }
    }

    /// The meta hosts whose ranks channel `c` carries, as a list.
    fn sites_via(&self, c: usize) -> String {
        let mut v: Vec<u32> = (0..self.world())
            .filter(|&p| self.chan(p as u32) == c)
            .filter_map(|p| self.sites.get(p).copied())
            .collect();
        v.dedup();
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    }

    /// Drains the wake-up socket and the router pipes' bells after a blocking wait.
    pub(crate) fn drain_wake(&mut self) {
        let mut b = [0u8; 64];
        while self.wake.recv(&mut b).is_ok() {}
        self.drain_bells();
    }

    /// What stands between this rank and `peer` for a hang report: frames queued here for
    /// it, its shared-memory ring's unread bytes each way, and copies of long messages left
    /// for the next full pass.
    pub(crate) fn describe_peer(&self, peer: u32) -> String {
        let c = self.chan(peer);
        let queued = self.outq.get(c).map_or(0, VecDeque::len);
        let mut s = format!("{queued} frames queued for it here");
        if let Some(Link::Shm(l)) = self.peers.get(c) {
            let _ = write!(s, ", {} bytes of ours unread in its ring", l.prod.unread());
        }
        if let Some((_, cons)) =
            (self.in_at.get(peer as usize)).and_then(|&i| self.shm_in.get(i as usize))
        {
            if cons.has_record() {
                s.push_str(", records from it unread here");
            }
        }
        if !self.deferred.is_empty() {
            let _ = write!(s, ", {} copies due", self.deferred.len());
        }
        s
    }

    /// Frames waiting here for a transport, by peer, for a hang report: empty when none.
    pub(crate) fn describe_queues(&self, core: &Core) -> String {
        let mut waiting: Vec<String> = Vec::new();
        let mut total = 0;
        for (c, q) in self.outq.iter().enumerate().filter(|(_, q)| !q.is_empty()) {
            total += q.len();
            waiting.push(format!("channel {c}: {}", q.len()));
        }
        let mut s = String::new();
        if total > 0 {
            let _ = write!(s, "{total} frames wait to go out ({})", waiting.join(", "));
        }
        if total != self.pending {
            let _ = write!(s, " [{} counted as pending]", self.pending);
        }
        if !core.out.is_empty() {
            let _ = write!(s, " [{} actions not yet taken]", core.out.len());
        }
        s
    }

    /// Whether frames are queued that a transport has not taken yet.
    /// This rank and its shared-memory peers that are not asleep in `poll`
    /// (their sleep flags), for whether spinning would take a core from them.
    /// Looks at the shared-memory peers only (`shm_in`), not the whole world:
    /// it runs on every 16th pass of an oversubscribed rank's wait.
    pub(crate) fn shm_awake(&self) -> usize {
        1 + self
            .shm_in
            .iter()
            .filter(|(src, _)| {
                matches!(&self.peers[*src as usize],
                    Link::Shm(s) if s.peer_sleep.get().load(Ordering::Relaxed) == 0)
            })
            .count()
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.pending > 0 || !self.self_q.is_empty() || !self.deferred.is_empty()
    }
}

/// Writes as much of one frame as the socket (or pipe) takes; `Ok(true)`
/// when all is out.
/// Whether process `pid` still exists (a zombie counts: it can no longer
/// copy, but its parent has not looked yet; the launcher ends the job).
fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn write_frame(
    t: &mut TcpLink,
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
    t: &mut TcpLink,
    core: &mut Core,
    wire_src: Option<&HashMap<u32, u32>>,
    got: &mut bool,
) -> io::Result<bool> {
    let TcpLink {
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
