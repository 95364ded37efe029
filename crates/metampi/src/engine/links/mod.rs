//! Transports: the one contract every backend meets, and where each backend lives.
//!
//! Contract: frames to one peer leave in the order they were queued and arrive
//! in that order (FIFO per pair), whole, each exactly once; a backend never
//! blocks the caller; it reports a lost peer instead of panicking on bad bytes.
//! The matching engine ([`super::core`]) never knows which backend carried a
//! frame. Backends, chosen per destination at start-up, one module each:
//! - `Local` ([`local`]): a message to oneself, handed over in memory;
//! - `Shm` ([`shm`]): a ring in the receiver's shared segment (same machine),
//!   long messages copied from the sender's memory (with its help);
//! - `Stream` ([`byte_stream`]): a byte stream per pair, a TCP connection (other
//!   machine, or forced), or a router's shared-memory pipe with the connection as
//!   its doorbell; frames coded by [`super::stream`];
//! - `Via` ([`routed`]): to a rank of another site, through the stream of the
//!   router connection that serves it.
//!
//! This module keeps what all share: the out-queues, the send and progress
//! passes that hand each frame to its backend, and failure of a channel. A new
//! backend is a variant of [`Link`], a module here with its eager limit,
//! fragment size, write and read, and an arm in `post_send`, `try_send_now`,
//! `flush` and `progress_as`.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;

use super::coop::Table;
use super::core::{Action, Core, Pull, ReqId};
use crate::envelope::{Envelope, Kind, ENV_LEN};
use crate::sys::ring::Consumer;
use crate::sys::shm::Segment;

mod byte_stream;
mod local;
mod routed;
#[allow(unsafe_code)]
mod shm;

pub(crate) use byte_stream::StreamLink;
use byte_stream::{TcpWatch, TCP_FRAGMENT};
pub(crate) use byte_stream::{SOCKET_LOOKS, SOCKET_SKIPS};
use routed::{WireIds, ROUTER_FRAGMENT};
pub(crate) use shm::WAKE_UPS;
pub(crate) use shm::{ShmLink, SleepFlag};

pub(crate) enum Link {
    Local,
    Shm(ShmLink),
    Stream(StreamLink),
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

impl Links {
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

    /// The channel (index into `peers`) that carries frames to world rank `dst`.
    fn chan(&self, dst: u32) -> usize {
        match self.peers.get(dst as usize) {
            Some(Link::Via(c)) => *c,
            _ => dst as usize,
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

    /// Starts a send of the bytes held by request `id` to `dst`: its backend
    /// queues it eagerly or as a rendezvous request, by its own eager limit.
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
        super::traffic::sent(len);
        let kind = if sync { Kind::EagerSync } else { Kind::Eager };
        let d = self.chan(dst);
        let mut env = Envelope::new(kind, self.rank, ctx, tag, len as u64);
        env.flags |= self.order_flag(d);
        env.dst = dst;
        env.sreq = id;
        match &self.peers[d] {
            Link::Via(_) => {}
            Link::Local => self.post_local(core, env, sync),
            Link::Shm(_) => self.post_shm(core, d, env, sync),
            Link::Stream(_) => self.post_stream(core, d, env, sync),
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
        let took = match &mut self.peers[d] {
            Link::Shm(l) => l.send_now(&env, bytes, self.eager_shm, &self.wake),
            Link::Stream(_) => self.stream_send_now(core, d, &env, bytes),
            Link::Local | Link::Via(_) => false,
        };
        if took {
            super::traffic::sent(bytes.len());
        }
        took
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

    /// Queues the message of send `env.sreq` on channel `d`: eagerly (its payload
    /// follows the envelope) up to `eager` bytes, else as a rendezvous request.
    /// A standard-mode eager send is complete once its frame is out.
    fn queue_send(&mut self, d: usize, mut env: Envelope, sync: bool, eager: usize) {
        let (id, len) = (env.sreq, env.len as usize);
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
                        Some(Link::Stream(_)) if self.is_router(c) => ROUTER_FRAGMENT,
                        Some(Link::Stream(_)) => TCP_FRAGMENT,
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
                    if !l.write(&f.env, payload, &self.wake) {
                        break;
                    }
                    true
                }
                Link::Stream(t) => match t.write(&f.env, payload, &mut f.written) {
                    Ok(done) => done,
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
        let mut moved = self.drain_self(core);
        for i in 0..self.shm_in.len() {
            moved |= self.drain_ring(core, i, lazy);
        }
        self.bell_tick = self.bell_tick.wrapping_add(1);
        if self.bell_tick % 256 == 0 {
            self.drain_bells();
        }
        moved |= self.read_streams(core);
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

    pub(crate) fn has_pending(&self) -> bool {
        self.pending > 0 || !self.self_q.is_empty() || !self.deferred.is_empty()
    }
}

#[cfg(test)]
mod tests {
    //! The local and byte-stream backends against the contract at the top of
    //! this module, without processes: two engines in one thread.

    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::super::core::{Pattern, RecvBuf, SendBuf};
    use super::*;

    fn wake() -> UnixDatagram {
        let (w, _) = UnixDatagram::pair().unwrap();
        w.set_nonblocking(true).unwrap();
        w
    }

    /// Ranks 0 and 1 joined by a loopback TCP connection.
    fn stream_pair() -> ((Links, Core), (Links, Core)) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        for s in [&a, &b] {
            s.set_nonblocking(true).unwrap();
        }
        let l0 = Links::new(0, vec![Link::Local, Links::tcp(a)], wake());
        let l1 = Links::new(1, vec![Links::tcp(b), Link::Local], wake());
        ((l0, Core::new(0, 2)), (l1, Core::new(1, 2)))
    }

    /// Runs progress passes on both ends until `done` holds (at most 20 s).
    fn drive(
        a: &mut (Links, Core),
        b: &mut (Links, Core),
        mut done: impl FnMut(&mut Core) -> bool,
    ) {
        let t0 = Instant::now();
        while !done(&mut b.1) {
            a.0.progress(&mut a.1);
            b.0.progress(&mut b.1);
            assert!(t0.elapsed() < Duration::from_secs(20), "no progress");
        }
    }

    fn message(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_stream_delivers_every_size_whole_and_in_order() {
        let (mut a, mut b) = stream_pair();
        let eager = a.0.eager_tcp;
        // Inline, eager, at the eager limit, just past it (rendezvous), and
        // several fragments' worth.
        let sizes = [0, 1, 100, eager, eager + 1, 3 << 20, 5];
        let pat = Pattern {
            ctx: 0,
            src: Some(0),
            tag: Some(5),
        };
        let recvs: Vec<ReqId> = sizes
            .iter()
            .map(|_| b.1.post_recv(pat, RecvBuf::Owned(Vec::new())))
            .collect();
        let sends: Vec<ReqId> = sizes
            .iter()
            .enumerate()
            .map(|(k, &len)| {
                let id = a.1.new_send(1, SendBuf::Owned(message(len, k as u8)));
                a.0.post_send(&mut a.1, id, 1, 0, 5, false);
                id
            })
            .collect();
        let mut got = vec![None; sizes.len()];
        drive(&mut a, &mut b, |core| {
            for (k, &r) in recvs.iter().enumerate() {
                if got[k].is_none() {
                    got[k] = core.take(r).map(|c| c.data.unwrap());
                }
            }
            got.iter().all(Option::is_some)
        });
        for (k, &len) in sizes.iter().enumerate() {
            assert_eq!(
                got[k].as_deref(),
                Some(&message(len, k as u8)[..]),
                "message {k}"
            );
        }
        for id in sends {
            while a.1.take(id).is_none() {
                a.0.progress(&mut a.1);
            }
        }
        assert!(!a.0.has_pending());
    }

    #[test]
    fn a_synchronous_send_to_oneself_completes_when_received() {
        let mut l = Links::new(0, vec![Link::Local], wake());
        let mut core = Core::new(0, 1);
        let plain = core.new_send(0, SendBuf::Owned(vec![1, 2, 3]));
        l.post_send(&mut core, plain, 0, 0, 1, false);
        // A standard-mode send to oneself is buffered: done at once.
        assert!(core.take(plain).unwrap().result.is_ok());
        let sync = core.new_send(0, SendBuf::Owned(vec![4]));
        l.post_send(&mut core, sync, 0, 0, 2, true);
        l.progress(&mut core);
        assert!(core.take(sync).is_none(), "done before it was received");
        let pat = |tag| Pattern {
            ctx: 0,
            src: Some(0),
            tag: Some(tag),
        };
        let r2 = core.post_recv(pat(2), RecvBuf::Owned(Vec::new()));
        let r1 = core.post_recv(pat(1), RecvBuf::Owned(Vec::new()));
        for _ in 0..4 {
            l.progress(&mut core);
        }
        assert_eq!(core.take(r1).unwrap().data.unwrap(), [1, 2, 3]);
        assert_eq!(core.take(r2).unwrap().data.unwrap(), [4]);
        assert!(core.take(sync).unwrap().result.is_ok());
    }

    #[test]
    fn a_closed_stream_fails_the_sends_to_it() {
        let (mut a, b) = stream_pair();
        drop(b);
        let t0 = Instant::now();
        // The end is seen on a pass (a read of the socket), or by a write;
        // sends written before it complete as sent.
        loop {
            a.0.progress(&mut a.1);
            let id = a.1.new_send(1, SendBuf::Owned(message(4096, 1)));
            a.0.post_send(&mut a.1, id, 1, 0, 5, false);
            a.0.progress(&mut a.1);
            if a.1.take(id).is_some_and(|c| c.result.is_err()) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "a send to a closed peer never failed"
            );
        }
        let Link::Stream(t) = &a.0.peers[1] else {
            panic!("not a stream")
        };
        assert!(t.closed);
    }
}
