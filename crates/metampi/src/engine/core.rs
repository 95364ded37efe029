//! Matching engine and request table: no I/O.
//!
//! Posted receives and unexpected messages are kept in arrival order and
//! matched on (context, source, tag) with wildcards, which together with FIFO
//! transports gives MPI's non-overtaking rule (MPI-1.2 §3.5). Unexpected
//! messages are kept per source (with their arrival number, for wildcard
//! receives), so that a receive from one source does not scan the others'.
//! Control messages the engine wants sent are queued in `out` for the
//! transport layer.

use std::collections::VecDeque;
use std::task::Waker;

use crate::envelope::{Envelope, Kind, F_BIG_ENDIAN};
use crate::error::{truncate_message, Error, ErrorClass};
use crate::sys::cma;
use crate::sys::rawbuf::{RecvPtr, SendPtr};

pub(crate) type ReqId = u64;

/// The id of a send that completed while it was being started (an eager
/// message the transport took at once): it holds no slot, and taking it
/// needs no lock. No slot ever has this id (generation and index all ones).
pub(crate) const SENT: ReqId = u64::MAX;

/// What a completed receive reports, in world ranks and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawStatus {
    pub src: u32,
    pub tag: i32,
    pub len: usize,
    pub cancelled: bool,
    /// The payload is big-endian (the sender's meta host declares that order).
    pub big_endian: bool,
}

pub(crate) enum SendBuf {
    Borrowed(SendPtr),
    Owned(Vec<u8>),
}

impl SendBuf {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            SendBuf::Borrowed(p) => p.bytes(),
            SendBuf::Owned(v) => v,
        }
    }
}

pub(crate) enum RecvBuf {
    /// Receive into the user's buffer; longer messages are a truncation error.
    Borrowed(RecvPtr),
    /// Receive into a fresh vector of the message's size.
    Owned(Vec<u8>),
}

impl RecvBuf {
    pub(crate) fn cap(&self) -> usize {
        match self {
            RecvBuf::Borrowed(p) => p.len(),
            RecvBuf::Owned(_) => usize::MAX,
        }
    }

    /// Makes room for `len` bytes and returns the destination slice.
    #[inline]
    pub(crate) fn prepare(&mut self, len: usize) -> &mut [u8] {
        match self {
            RecvBuf::Borrowed(p) => &mut p.bytes_mut()[..len],
            RecvBuf::Owned(v) => {
                v.clear();
                v.resize(len, 0);
                v
            }
        }
    }

    fn slice_at(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        match self {
            RecvBuf::Borrowed(p) => p.bytes_mut().get_mut(off..off.checked_add(len)?),
            RecvBuf::Owned(v) => v.get_mut(off..off.checked_add(len)?),
        }
    }
}

/// A request a thread waits for, as a hang report names it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiting {
    /// A send to engine rank `dst` (not yet taken by the receiver); a collective schedule's
    /// request is a send to no peer.
    Send { dst: u32, bytes: usize },
    /// A receive matching `pat` into `cap` bytes (`usize::MAX`: any length).
    Recv { pat: Pattern, cap: usize },
}

/// Matching criteria of a receive or probe. `None` is a wildcard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pattern {
    pub ctx: u32,
    pub src: Option<u32>,
    pub tag: Option<i32>,
}

impl Pattern {
    pub(crate) fn matches(&self, env: &Envelope) -> bool {
        env.context == self.ctx
            && self.src.is_none_or(|s| s == env.src)
            && self.tag.is_none_or(|t| t == env.tag)
    }
}

enum State {
    Free,
    Send {
        dst: u32,
        buf: SendBuf,
    },
    Recv {
        pat: Pattern,
        buf: RecvBuf,
        matched: bool,
        got: usize,
    },
}

struct Slot {
    gen: u32,
    state: State,
    done: bool,
    status: RawStatus,
    error: Option<Error>,
    waker: Option<Waker>,
    /// Nobody waits for the result: free the slot on completion.
    detached: bool,
}

/// The status of a receive that got message `env` (`len` bytes of it).
pub(crate) fn status_of(env: &Envelope, len: usize) -> RawStatus {
    RawStatus {
        src: env.src,
        tag: env.tag,
        len,
        cancelled: false,
        big_endian: env.flags & F_BIG_ENDIAN != 0,
    }
}

/// A message that arrived before a matching receive was posted.
pub(crate) struct Unexpected {
    pub env: Envelope,
    /// The payload of an eager message (empty for a rendezvous request).
    pub data: Vec<u8>,
}

/// Unexpected messages in arrival order per source world rank, each with
/// its arrival number. A root that receives from many ranks which run ahead
/// of it (eager gathers, say) holds many messages of later calls: one queue
/// for all made every receive scan the other sources' (8 ranks on 2 cores,
/// linear gather of 8 bytes: 56 µs per call at the root).
struct UnexpectedQueue {
    /// One queue per world rank, then one for sources outside the world
    /// (a peer's bytes may name any; they stay matchable by wildcards only).
    by_src: Vec<VecDeque<(u64, Unexpected)>>,
    /// Payload bytes queued per source (same buckets).
    bytes: Vec<usize>,
    next: u64,
    len: usize,
}

impl UnexpectedQueue {
    fn new(world: usize) -> UnexpectedQueue {
        UnexpectedQueue {
            by_src: (0..=world).map(|_| VecDeque::new()).collect(),
            bytes: vec![0; world + 1],
            next: 0,
            len: 0,
        }
    }

    /// The queue of source `src`.
    fn bucket(&self, src: u32) -> usize {
        (src as usize).min(self.by_src.len() - 1)
    }

    fn push(&mut self, u: Unexpected) {
        let s = self.bucket(u.env.src);
        self.bytes[s] += u.data.len();
        self.by_src[s].push_back((self.next, u));
        self.next += 1;
        self.len += 1;
    }

    /// Source and index of the earliest message `pat` matches: the first
    /// match of its source, or for any source the earliest of each source's
    /// first match (arrival order, as one queue had it).
    #[inline]
    fn position(&self, pat: &Pattern) -> Option<(usize, usize)> {
        if self.len == 0 {
            return None;
        }
        self.position_in_queues(pat)
    }

    fn position_in_queues(&self, pat: &Pattern) -> Option<(usize, usize)> {
        let first = |s: usize| {
            let q = self.by_src.get(s)?;
            let i = q.iter().position(|(_, u)| pat.matches(&u.env))?;
            Some((q[i].0, s, i))
        };
        let found = match pat.src {
            Some(s) => first(self.bucket(s)),
            None => (0..self.by_src.len()).filter_map(first).min(),
        };
        found.map(|(_, s, i)| (s, i))
    }

    #[inline(always)]
    fn take(&mut self, pat: &Pattern) -> Option<Unexpected> {
        if self.len == 0 {
            return None;
        }
        self.take_queued(pat)
    }

    fn take_queued(&mut self, pat: &Pattern) -> Option<Unexpected> {
        let (s, i) = self.position(pat)?;
        let (_, u) = self.by_src[s].remove(i)?;
        self.bytes[s] -= u.data.len();
        self.len -= 1;
        Some(u)
    }

    fn bytes_from(&self, src: u32) -> usize {
        self.bytes[self.bucket(src)]
    }

    /// The envelopes queued from `src`, oldest first.
    fn from(&self, src: u32) -> impl Iterator<Item = &Envelope> {
        self.by_src[self.bucket(src)].iter().map(|(_, u)| &u.env)
    }

    #[inline]
    fn find(&self, pat: &Pattern) -> Option<&Unexpected> {
        let (s, i) = self.position(pat)?;
        Some(&self.by_src[s][i].1)
    }
}

/// Queued collective bytes from one sender past which its further
/// unwanted collective messages wait in their ring ([`Core::hold`]).
pub(crate) const HOLD_BYTES: usize = 1 << 20;

/// Work for the transport layer.
pub(crate) enum Action {
    /// Send a payload-less control envelope.
    Ctrl { dst: u32, env: Envelope },
    /// Stream the data of send request `sreq` to `dst` for its request `rreq`.
    SendData { dst: u32, sreq: ReqId, rreq: u64 },
    /// Copy a matched rendezvous message out of the sender's memory, with
    /// its help where it can give it (`engine::coop`).
    Pull(Pull),
    /// Help the receiver `src` copy our send: its `Kind::Help` envelope.
    Assist { src: u32, env: Envelope },
}

/// A matched shared-memory rendezvous message to copy from the sender.
pub(crate) struct Pull {
    pub id: ReqId,
    pub src: u32,
    pub pid: i32,
    pub sreq: u64,
    /// The sender's buffer, in its address space.
    pub remote: u64,
    pub context: u32,
    pub tag: i32,
}

/// The result of a completed request, taken out of the table.
pub(crate) struct Completed {
    pub status: RawStatus,
    pub result: Result<(), Error>,
    pub data: Option<Vec<u8>>,
}

impl Completed {
    /// What a send that completed without error reports.
    pub(crate) fn sent() -> Completed {
        Completed {
            status: RawStatus::default(),
            result: Ok(()),
            data: None,
        }
    }
}

pub(crate) struct Core {
    pub rank: u32,
    slots: Vec<Slot>,
    free: Vec<u32>,
    posted: VecDeque<ReqId>,
    unexpected: UnexpectedQueue,
    pub out: VecDeque<Action>,
    pub wakers: Vec<Waker>,
    /// Process ids by world rank, for cross-memory attach (0 = not local).
    pub pids: Vec<i32>,
    /// Number of completions since start: lets waiters notice progress.
    pub completions: u64,
    /// Futures currently registered and not yet complete.
    pub async_waiters: usize,
    /// Passes under way that ignore every [`Core::hold`]: probes (one for a
    /// held sender's later message has no receive posted) and a wait's last
    /// pass before it sleeps.
    pub unheld: usize,
    /// Shared-memory rendezvous messages at least this long are copied with
    /// the sender's help ([`Action::Pull`]); `usize::MAX`: never.
    pub coop_min: usize,
    /// Payload buffers of unexpected eager messages already delivered, kept
    /// for the next ones ([`Core::payload_copy`]).
    spare: Vec<Vec<u8>>,
}

/// Unexpected payloads from this size on go into recycled buffers: a fresh
/// allocation of some KiB is fresh pages (faults, zeroing) whenever the
/// allocator has just given the heap's top back, which a stream of them
/// does over and over. Measured (2 ranks pinned, each sending 32 messages
/// of 32 KiB to the other before receiving, `bench --ops bibw`): a fifth
/// of the time in page faults, brk and munmap.
const SPARE_MIN: usize = 16 << 10;
/// Buffers kept, and the largest capacity kept (bounds the pool at 8 MiB).
const SPARE_COUNT: usize = 64;
const SPARE_MAX: usize = 128 << 10;

impl Core {
    pub(crate) fn new(rank: u32, size: usize) -> Core {
        Core {
            rank,
            slots: Vec::new(),
            free: Vec::new(),
            posted: VecDeque::new(),
            unexpected: UnexpectedQueue::new(size),
            out: VecDeque::new(),
            wakers: Vec::new(),
            pids: vec![0; size],
            completions: 0,
            async_waiters: 0,
            unheld: 0,
            coop_min: usize::MAX,
            spare: Vec::new(),
        }
    }

    /// A copy of an unexpected message's payload, in a recycled buffer
    /// where one is big enough.
    fn payload_copy(&mut self, payload: &[u8]) -> Vec<u8> {
        if payload.len() >= SPARE_MIN {
            // At most SPARE_COUNT to look at, against a copy of kilobytes.
            if let Some(i) = self
                .spare
                .iter()
                .position(|v| v.capacity() >= payload.len())
            {
                let mut v = self.spare.swap_remove(i);
                v.clear();
                crate::sys::copy::extend(&mut v, payload);
                return v;
            }
        }
        let mut v = Vec::with_capacity(payload.len());
        crate::sys::copy::extend(&mut v, payload);
        v
    }

    /// Keeps a delivered payload's buffer for [`Core::payload_copy`].
    fn recycle(&mut self, v: Vec<u8>) {
        if !(SPARE_MIN..=SPARE_MAX).contains(&v.capacity()) {
            return;
        }
        if self.spare.len() < SPARE_COUNT {
            self.spare.push(v);
            return;
        }
        // Full: a larger buffer replaces the smallest, so that the pool
        // follows a program whose messages grow.
        if let Some((i, _)) = self
            .spare
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.capacity())
        {
            if self.spare[i].capacity() < v.capacity() {
                self.spare[i] = v;
            }
        }
    }

    #[inline(always)]
    fn alloc(&mut self, state: State) -> ReqId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    state: State::Free,
                    done: false,
                    status: RawStatus::default(),
                    error: None,
                    waker: None,
                    detached: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[idx as usize];
        s.gen = s.gen.wrapping_add(1);
        s.state = state;
        s.done = false;
        s.status = RawStatus::default();
        s.error = None;
        s.waker = None;
        s.detached = false;
        ((s.gen as u64) << 32) | idx as u64
    }

    #[inline]
    fn slot(&mut self, id: ReqId) -> Option<&mut Slot> {
        let s = self.slots.get_mut((id & 0xffff_ffff) as usize)?;
        (s.gen == (id >> 32) as u32 && !matches!(s.state, State::Free)).then_some(s)
    }

    /// What request `id` is, for a hang report; `None` when it is done or gone.
    pub(crate) fn describe(&self, id: ReqId) -> Option<Waiting> {
        let s = self
            .slots
            .get((id & 0xffff_ffff) as usize)
            .filter(|s| s.gen == (id >> 32) as u32 && !s.done)?;
        match &s.state {
            State::Free => None,
            State::Send { dst, buf } => Some(Waiting::Send {
                dst: *dst,
                bytes: buf.bytes().len(),
            }),
            State::Recv { pat, buf, .. } => Some(Waiting::Recv {
                pat: *pat,
                cap: buf.cap(),
            }),
        }
    }

    /// The messages from `src` that arrived before a receive wanted them, for a hang
    /// report: kind, context, tag and bytes of the first few, and how many in all.
    pub(crate) fn unexpected_from(&self, src: u32) -> String {
        let all: Vec<&Envelope> = self.unexpected.from(src).collect();
        let first: Vec<String> = (all.iter().take(4))
            .map(|e| {
                format!(
                    "{:?} context {} tag {} {} bytes",
                    e.kind, e.context, e.tag, e.len
                )
            })
            .collect();
        match all.len() {
            0 => String::new(),
            1 => format!(
                "1 message from rank {src} waits unmatched here ({})",
                first.join("; ")
            ),
            n => format!(
                "{n} messages from rank {src} wait unmatched here ({}{})",
                first.join("; "),
                if n > 4 { "; ..." } else { "" }
            ),
        }
    }

    /// The receives posted on context `ctx` and not yet matched (what a collective on it
    /// waits for), for a hang report.
    pub(crate) fn posted_on(&self, ctx: u32) -> Vec<Pattern> {
        self.posted
            .iter()
            .filter_map(
                |&id| match &self.slots.get((id & 0xffff_ffff) as usize)?.state {
                    State::Recv { pat, .. } if pat.ctx == ctx => Some(*pat),
                    _ => None,
                },
            )
            .collect()
    }

    /// Whether some send or receive is still under way (posted and not complete): what the
    /// progress thread of `METAMPI_ASYNC_PROGRESS` works for.
    pub(crate) fn any_incomplete(&self) -> bool {
        self.slots
            .iter()
            .any(|s| !s.done && !matches!(s.state, State::Free))
    }

    /// Whether request `id` is done, or no longer there to wait for (a thread waiting for
    /// it should look).
    pub(crate) fn done_or_gone(&self, id: ReqId) -> bool {
        self.slots
            .get((id & 0xffff_ffff) as usize)
            .is_none_or(|s| s.gen != (id >> 32) as u32 || matches!(s.state, State::Free) || s.done)
    }

    #[inline]
    fn complete(&mut self, id: ReqId, status: RawStatus, error: Option<Error>) {
        let mut had_waker = false;
        let mut detached = false;
        if let Some(s) = self.slot(id) {
            if s.done {
                return;
            }
            s.done = true;
            detached = s.detached;
            s.status = status;
            s.error = error;
            if let Some(w) = s.waker.take() {
                had_waker = true;
                self.wakers.push(w);
            }
        }
        if had_waker {
            self.async_waiters = self.async_waiters.saturating_sub(1);
        }
        self.completions += 1;
        if detached {
            self.release(id);
        }
    }

    /// Lets the request finish on its own; its slot is freed when it completes.
    pub(crate) fn detach(&mut self, id: ReqId) {
        let done = match self.slot(id) {
            Some(s) => {
                s.detached = true;
                s.done
            }
            None => false,
        };
        if done {
            self.release(id);
        }
    }

    pub(crate) fn is_done(&mut self, id: ReqId) -> bool {
        id == SENT || self.slot(id).is_some_and(|s| s.done)
    }

    /// Frees send `id` if it has already completed without error; returns
    /// the id to hand out for it ([`SENT`] then).
    pub(crate) fn settle_send(&mut self, id: ReqId) -> ReqId {
        match self.slot(id) {
            Some(s) if s.done && s.error.is_none() => {
                self.release(id);
                SENT
            }
            _ => id,
        }
    }

    /// Registers a waker; returns false if the request is already done.
    pub(crate) fn set_waker(&mut self, id: ReqId, w: &Waker) -> bool {
        let mut added = false;
        let done = match self.slot(id) {
            Some(s) if !s.done => {
                added = s.waker.is_none();
                s.waker = Some(w.clone());
                false
            }
            _ => true,
        };
        if added {
            self.async_waiters += 1;
        }
        !done
    }

    /// Takes the result of a completed request and frees its slot.
    pub(crate) fn take(&mut self, id: ReqId) -> Option<Completed> {
        if id == SENT {
            return Some(Completed::sent());
        }
        let idx = (id & 0xffff_ffff) as u32;
        let s = self.slot(id)?;
        if !s.done {
            return None;
        }
        let state = std::mem::replace(&mut s.state, State::Free);
        let status = s.status;
        let result = match s.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.free.push(idx);
        let data = match state {
            State::Recv {
                buf: RecvBuf::Owned(v),
                ..
            } => Some(v),
            _ => None,
        };
        Some(Completed {
            status,
            result,
            data,
        })
    }

    /// As [`Core::take`], for a request whose result is its status alone (a
    /// send, or a receive into a borrowed buffer): nothing else is built, and
    /// an owned buffer would be dropped.
    pub(crate) fn take_status(&mut self, id: ReqId) -> Option<Result<RawStatus, Error>> {
        if id == SENT {
            return Some(Ok(RawStatus::default()));
        }
        let idx = (id & 0xffff_ffff) as u32;
        let s = self.slot(id)?;
        if !s.done {
            return None;
        }
        s.state = State::Free;
        let r = match s.error.take() {
            Some(e) => Err(e),
            None => Ok(s.status),
        };
        self.free.push(idx);
        Some(r)
    }

    /// Releases a request whose result nobody will read (after completion).
    pub(crate) fn release(&mut self, id: ReqId) {
        let _ = self.take(id);
    }

    // ---- sends -------------------------------------------------------------

    pub(crate) fn new_send(&mut self, dst: u32, buf: SendBuf) -> ReqId {
        self.alloc(State::Send { dst, buf })
    }

    pub(crate) fn send_bytes(&self, id: ReqId) -> Option<&[u8]> {
        self.send_slot(id).map(|(_, _, b)| b)
    }

    /// Send request `id`'s slot, destination and bytes, if it is live.
    fn send_slot(&self, id: ReqId) -> Option<(&Slot, u32, &[u8])> {
        let s = self.slots.get((id & 0xffff_ffff) as usize)?;
        match &s.state {
            State::Send { dst, buf } if s.gen == (id >> 32) as u32 => Some((s, *dst, buf.bytes())),
            _ => None,
        }
    }

    /// As [`Core::send_bytes`], for a send to world rank `dst` only.
    pub(crate) fn send_bytes_to(&self, id: ReqId, dst: u32) -> Option<&[u8]> {
        self.send_slot(id)
            .filter(|(s, d, _)| *d == dst && !s.done)
            .map(|(_, _, b)| b)
    }

    pub(crate) fn complete_send(&mut self, id: ReqId) {
        self.complete(id, RawStatus::default(), None);
    }

    pub(crate) fn fail(&mut self, id: ReqId, err: Error) {
        self.complete(id, RawStatus::default(), Some(err));
    }

    /// Fails every unfinished request that involves `peer` (a lost connection).
    pub(crate) fn fail_peer(&mut self, peer: u32, why: &str) {
        let ids: Vec<ReqId> = (0..self.slots.len())
            .filter_map(|i| {
                let s = &self.slots[i];
                let involved = match &s.state {
                    State::Send { dst, .. } => *dst == peer,
                    State::Recv { pat, .. } => pat.src == Some(peer),
                    State::Free => false,
                };
                (involved && !s.done).then_some(((s.gen as u64) << 32) | i as u64)
            })
            .collect();
        for id in ids {
            self.posted.retain(|&p| p != id);
            self.fail(
                id,
                Error::new(
                    ErrorClass::Other,
                    format!("connection to rank {peer} lost: {why}"),
                ),
            );
        }
    }

    // ---- receives ----------------------------------------------------------

    /// Posts a receive: matches the oldest fitting unexpected message or queues.
    pub(crate) fn post_recv(&mut self, pat: Pattern, buf: RecvBuf) -> ReqId {
        let id = self.alloc(State::Recv {
            pat,
            buf,
            matched: false,
            got: 0,
        });
        if let Some(u) = self.unexpected.take(&pat) {
            self.deliver_unexpected(id, u);
        } else {
            self.posted.push_back(id);
        }
        id
    }

    /// Whether a posted receive matches `env`.
    pub(crate) fn posted_match(&self, env: &Envelope) -> bool {
        self.first_posted(env).is_some()
    }

    /// A receive's shortcut through the unexpected queue: where the first
    /// message `pat` matches there is a plain eager one that `buf` holds, it
    /// is taken into `buf` and its status returned (`Some(Some(_))`);
    /// `Some(None)` where the first match needs the full path (a rendezvous,
    /// a synchronous send, a truncation); `None` where nothing matches.
    #[inline]
    pub(crate) fn take_unexpected_eager(
        &mut self,
        pat: &Pattern,
        buf: &mut RecvBuf,
    ) -> Option<Option<RawStatus>> {
        if self.unexpected.len == 0 {
            return None;
        }
        let u = self.unexpected.find(pat)?;
        if u.env.kind != Kind::Eager || u.data.len() > buf.cap() {
            return Some(None);
        }
        let u = self.unexpected.take(pat)?;
        let status = status_of(&u.env, u.data.len());
        match buf {
            RecvBuf::Owned(v) => *v = u.data,
            RecvBuf::Borrowed(_) => {
                crate::sys::copy::copy(buf.prepare(u.data.len()), &u.data);
                self.recycle(u.data);
            }
        }
        Some(Some(status))
    }

    /// Receives a message already taken by a matched probe.
    pub(crate) fn post_recv_matched(&mut self, u: Unexpected, buf: RecvBuf) -> ReqId {
        let pat = Pattern {
            ctx: u.env.context,
            src: Some(u.env.src),
            tag: Some(u.env.tag),
        };
        let id = self.alloc(State::Recv {
            pat,
            buf,
            matched: false,
            got: 0,
        });
        self.deliver_unexpected(id, u);
        id
    }

    /// Looks for a matching unexpected message without taking it.
    pub(crate) fn probe(&self, pat: Pattern) -> Option<RawStatus> {
        self.unexpected.find(&pat).map(|u| RawStatus {
            src: u.env.src,
            tag: u.env.tag,
            len: u.env.len as usize,
            cancelled: false,
            big_endian: u.env.flags & F_BIG_ENDIAN != 0,
        })
    }

    /// Takes a matching unexpected message out of the queue (matched probe).
    pub(crate) fn take_unexpected(&mut self, pat: Pattern) -> Option<Unexpected> {
        self.unexpected.take(&pat)
    }

    /// Cancels a receive that has not matched yet. Returns whether it did.
    pub(crate) fn cancel(&mut self, id: ReqId) -> bool {
        let Some(pos) = self.posted.iter().position(|&p| p == id) else {
            return false;
        };
        self.posted.remove(pos);
        self.complete(
            id,
            RawStatus {
                cancelled: true,
                ..RawStatus::default()
            },
            None,
        );
        true
    }

    fn deliver_unexpected(&mut self, id: ReqId, u: Unexpected) {
        match u.env.kind {
            Kind::Rts => self.start_rendezvous(id, &u.env),
            _ => {
                self.deliver_eager(id, &u.env, &u.data);
                self.recycle(u.data);
            }
        }
    }

    fn deliver_eager(&mut self, id: ReqId, env: &Envelope, payload: &[u8]) {
        super::traffic::received(payload.len());
        // The commonest case in one look at the slot: a plain eager message
        // that fits, for a receive nobody awaits as a future.
        let quick = env.kind == Kind::Eager
            && match self.slot(id) {
                Some(Slot {
                    state: State::Recv { buf, matched, .. },
                    done: done @ false,
                    status,
                    error,
                    waker: None,
                    detached: false,
                    ..
                }) if payload.len() <= buf.cap() => {
                    *matched = true;
                    crate::sys::copy::copy(buf.prepare(payload.len()), payload);
                    *done = true;
                    *status = status_of(env, payload.len());
                    *error = None;
                    true
                }
                _ => false,
            };
        if quick {
            self.completions += 1;
            return;
        }
        let mut err = None;
        if let Some(Slot {
            state: State::Recv { buf, matched, .. },
            ..
        }) = self.slot(id)
        {
            *matched = true;
            if payload.len() > buf.cap() {
                err = Some(truncate_message(payload.len(), buf.cap(), env.tag, env.src));
            } else {
                crate::sys::copy::copy(buf.prepare(payload.len()), payload);
            }
        }
        self.finish_eager(id, env, payload.len(), err);
    }

    /// Completes receive `id` of the eager message `env` (`len` bytes).
    #[inline]
    fn finish_eager(&mut self, id: ReqId, env: &Envelope, len: usize, err: Option<Error>) {
        let status = status_of(env, len);
        if env.kind == Kind::EagerSync {
            let mut ack = Envelope::new(Kind::SyncAck, self.rank, env.context, env.tag, 0);
            ack.sreq = env.sreq;
            self.out.push_back(Action::Ctrl {
                dst: env.src,
                env: ack,
            });
        }
        self.complete(id, status, err);
    }

    /// The first posted receive that `env` matches, taken out of the posted
    /// queue.
    fn take_posted(&mut self, env: &Envelope) -> Option<ReqId> {
        match self.first_posted(env)? {
            // Receives are mostly matched in the order they were posted.
            0 => self.posted.pop_front(),
            i => self.posted.remove(i),
        }
    }

    /// Where in the posted queue the first receive `env` matches is.
    #[inline]
    fn first_posted(&self, env: &Envelope) -> Option<usize> {
        if self.posted.is_empty() {
            return None;
        }
        self.posted.iter().position(|&id| {
            matches!(&self.slots[(id & 0xffff_ffff) as usize].state,
                State::Recv { pat, .. } if pat.matches(env))
        })
    }

    /// A stream has read the envelope of eager message `env` and not yet its
    /// payload: where a posted receive matches it and can hold it, that
    /// receive is matched now and the payload can be read straight into its
    /// buffer ([`Core::matched_target`], then [`Core::eager_done`]). Nothing can
    /// come between on that stream, so the matching order is the arrival order.
    pub(crate) fn claim_eager(&mut self, env: &Envelope) -> Option<ReqId> {
        let len = env.len as usize;
        let i = self.first_posted(env)?;
        // A receive too small to hold it is matched when the payload is in,
        // and fails then with the truncation error.
        let first = self.posted[i];
        match &self.slot(first)?.state {
            State::Recv { buf, .. } if buf.cap() >= len => {}
            _ => return None,
        }
        let id = self.posted.remove(i)?;
        super::traffic::received(len);
        let s = self.slot(id)?;
        s.status.len = len;
        if let State::Recv { buf, matched, .. } = &mut s.state {
            *matched = true;
            buf.prepare(len);
        }
        Some(id)
    }

    /// The prepared buffer of matched receive `id`, as long as its status
    /// says: where a claimed eager message is read to, or a [`Pull`] copies.
    pub(crate) fn matched_target(&mut self, id: ReqId) -> Option<&mut [u8]> {
        let s = self.slot(id)?;
        let len = s.status.len;
        match &mut s.state {
            State::Recv {
                buf, matched: true, ..
            } => buf.slice_at(0, len),
            _ => None,
        }
    }

    /// The payload of claimed eager message `env` is in receive `id`'s buffer.
    pub(crate) fn eager_done(&mut self, id: ReqId, env: &Envelope) {
        self.finish_eager(id, env, env.len as usize, None);
    }

    /// As [`Core::handle_incoming`] for an eager message whose payload the
    /// caller owns: unexpected, it is queued without a copy.
    pub(crate) fn handle_eager_owned(&mut self, env: &Envelope, payload: Vec<u8>) {
        match self.take_posted(env) {
            Some(id) => self.deliver_eager(id, env, &payload),
            None => self.unexpected.push(Unexpected {
                env: *env,
                data: payload,
            }),
        }
    }

    fn start_rendezvous(&mut self, id: ReqId, env: &Envelope) {
        let len = env.len as usize;
        let status = status_of(env, len);
        let pid = self.pids.get(env.src as usize).copied().unwrap_or(0);
        let help = len >= self.coop_min && !self.exchanging_with(env.src, self.coop_min);
        let mut fin = Envelope::new(Kind::Fin, self.rank, env.context, env.tag, 0);
        fin.sreq = env.sreq;
        let Some(Slot {
            state: State::Recv { buf, matched, .. },
            ..
        }) = self.slot(id)
        else {
            return;
        };
        *matched = true;
        if len > buf.cap() {
            // The sender must still finish: tell it the data will not be read.
            let err = truncate_message(len, buf.cap(), env.tag, env.src);
            self.out.push_back(Action::Ctrl {
                dst: env.src,
                env: fin,
            });
            self.complete(id, status, Some(err));
            return;
        }
        // A vector of the announced size must be possible: a corrupt or hostile RTS
        // fails this receive (the sender is told to finish) instead of the allocator
        // aborting the process.
        if let RecvBuf::Owned(v) = buf {
            if v.try_reserve_exact(len).is_err() {
                let err = Error::new(
                    ErrorClass::Count,
                    format!("cannot allocate {len} bytes for an incoming message"),
                );
                self.out.push_back(Action::Ctrl {
                    dst: env.src,
                    env: fin,
                });
                self.complete(id, status, Some(err));
                return;
            }
        }
        super::traffic::received(len);
        let dst = buf.prepare(len);
        let pulls = env.addr != 0 && pid > 0;
        if pulls && help {
            // Copied with the sender's help once the links have asked for it.
            if let Some(s) = self.slot(id) {
                s.status = status;
            }
            self.out.push_back(Action::Pull(Pull {
                id,
                src: env.src,
                pid,
                sreq: env.sreq,
                remote: env.addr,
                context: env.context,
                tag: env.tag,
            }));
            return;
        }
        if pulls && cma::read_from(pid, env.addr, dst).is_ok() {
            self.out.push_back(Action::Ctrl {
                dst: env.src,
                env: fin,
            });
            self.complete(id, status, None);
            return;
        }
        if len == 0 {
            self.out.push_back(Action::Ctrl {
                dst: env.src,
                env: fin,
            });
            self.complete(id, status, None);
            return;
        }
        if let Some(s) = self.slot(id) {
            s.status = status;
        }
        self.ask_for_data(id, env.src, env.sreq, env.context, env.tag, len);
    }

    /// Asks the sender of a matched rendezvous message to stream its data
    /// (TCP, or no cross-memory attach).
    fn ask_for_data(&mut self, id: ReqId, src: u32, sreq: u64, context: u32, tag: i32, len: usize) {
        let mut cts = Envelope::new(Kind::Cts, self.rank, context, tag, len as u64);
        cts.sreq = sreq;
        cts.rreq = id;
        self.out.push_back(Action::Ctrl { dst: src, env: cts });
    }

    /// Whether a send of ours of at least `min` bytes to `peer` is unfinished:
    /// then the peer copies from us while we copy from it, both cores are
    /// busy, and asking for help would only cut our copy into chunks.
    fn exchanging_with(&self, peer: u32, min: usize) -> bool {
        self.slots.iter().any(|s| {
            !s.done && matches!(&s.state, State::Send { dst, buf } if *dst == peer && buf.bytes().len() >= min)
        })
    }

    /// Ends a [`Pull`]: `ok`, the data is in place and the sender is told to
    /// finish; otherwise it is asked to stream the data instead.
    pub(crate) fn finish_pull(&mut self, p: &Pull, ok: bool) {
        let Some(s) = self.slot(p.id) else { return };
        let status = s.status;
        if ok {
            let mut fin = Envelope::new(Kind::Fin, self.rank, p.context, p.tag, 0);
            fin.sreq = p.sreq;
            self.out.push_back(Action::Ctrl {
                dst: p.src,
                env: fin,
            });
            self.complete(p.id, status, None);
        } else {
            self.ask_for_data(p.id, p.src, p.sreq, p.context, p.tag, status.len);
        }
    }

    /// Where the payload of a `Data` fragment should land, if the request is live.
    pub(crate) fn data_target(&mut self, env: &Envelope) -> Option<&mut [u8]> {
        match &mut self.slot(env.rreq)?.state {
            State::Recv {
                buf, matched: true, ..
            } => buf.slice_at(env.addr as usize, env.frag as usize),
            _ => None,
        }
    }

    /// Accounts a `Data` fragment already written to its target.
    pub(crate) fn data_done(&mut self, env: &Envelope) {
        let Some(s) = self.slot(env.rreq) else { return };
        let total = s.status.len;
        let finished = match &mut s.state {
            State::Recv { got, .. } => {
                *got += env.frag as usize;
                *got >= total
            }
            _ => false,
        };
        if finished {
            let st = s.status;
            self.complete(env.rreq, st, None);
        }
    }

    /// Whether any posted receive's pattern satisfies `f`.
    fn any_posted(&self, f: impl Fn(&Pattern) -> bool) -> bool {
        self.posted.iter().any(|&id| {
            matches!(&self.slots[(id & 0xffff_ffff) as usize].state,
                State::Recv { pat, .. } if f(pat))
        })
    }

    /// Whether a posted receive names a sender for which `from` holds.
    pub(crate) fn posted_from(&self, from: impl Fn(u32) -> bool) -> bool {
        self.any_posted(|pat| pat.src.is_some_and(&from))
    }

    /// Whether `env` starts a message that no posted receive matches (it
    /// would go to the unexpected queue).
    pub(crate) fn unwanted(&self, env: &Envelope) -> bool {
        matches!(env.kind, Kind::Eager | Kind::EagerSync | Kind::Rts)
            && !self.any_posted(|pat| pat.matches(env))
    }

    /// Whether even a full progress pass should leave `env` in its
    /// shared-memory ring: the eager message of a collective that no posted
    /// receive wants, from a sender that already has [`HOLD_BYTES`] queued
    /// here, while nothing of ours waits on that sender (no receive from it
    /// or from any source posted, no send to it unfinished) and no pass
    /// ignores holds ([`Core::unheld`]: probes, and a wait about to sleep).
    ///
    /// Flow control: a root that runs ahead (a loop of broadcasts) would
    /// otherwise grow the queue without bound, each message costing an
    /// allocation of fresh pages and a second copy (2 ranks, 32 KiB
    /// broadcasts: 17-21 µs a call, against 5 through the rendezvous path
    /// one byte higher). Held, the sender waits for ring space instead.
    /// Liveness: a rank that waits on anything and makes no progress for
    /// its spin budget drains every held message before it sleeps, so a
    /// hold delays a program that relies on unbounded buffering (one where
    /// we wait on a third rank that waits on the held sender, say) by that
    /// budget at most, and never stops it.
    #[inline]
    pub(crate) fn hold(&self, env: &Envelope) -> bool {
        matches!(env.kind, Kind::Eager | Kind::EagerSync)
            && env.context % 2 == 1
            && self.unheld == 0
            && self.unexpected.bytes_from(env.src) >= HOLD_BYTES
            && !self.any_posted(|pat| pat.src.is_none_or(|s| s == env.src))
            && !self
                .slots
                .iter()
                .any(|s| !s.done && matches!(s.state, State::Send { dst, .. } if dst == env.src))
    }

    /// Handles one envelope (and its payload) from any transport.
    pub(crate) fn handle_incoming(&mut self, env: &Envelope, payload: &[u8]) {
        match env.kind {
            Kind::Eager | Kind::EagerSync | Kind::Rts => match self.take_posted(env) {
                Some(id) => {
                    if env.kind == Kind::Rts {
                        self.start_rendezvous(id, env);
                    } else {
                        self.deliver_eager(id, env, payload);
                    }
                }
                None => {
                    let data = self.payload_copy(payload);
                    self.unexpected.push(Unexpected { env: *env, data });
                }
            },
            Kind::Cts => self.out.push_back(Action::SendData {
                dst: env.src,
                sreq: env.sreq,
                rreq: env.rreq,
            }),
            Kind::Data => {
                if let Some(dst) = self.data_target(env) {
                    if dst.len() == payload.len() {
                        crate::sys::copy::copy(dst, payload);
                        self.data_done(env);
                    }
                }
            }
            Kind::Fin | Kind::SyncAck => self.complete_send(env.sreq),
            Kind::Help => self.out.push_back(Action::Assist {
                src: env.src,
                env: *env,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eager(src: u32, tag: i32, data: &[u8]) -> Envelope {
        Envelope::new(Kind::Eager, src, 0, tag, data.len() as u64)
    }

    fn owned(core: &mut Core, src: Option<u32>, tag: Option<i32>) -> ReqId {
        core.post_recv(Pattern { ctx: 0, src, tag }, RecvBuf::Owned(Vec::new()))
    }

    #[test]
    fn wildcard_receives_keep_per_sender_order() {
        let mut c = Core::new(0, 4);
        c.handle_incoming(&eager(1, 5, b"a"), b"a");
        c.handle_incoming(&eager(2, 5, b"x"), b"x");
        c.handle_incoming(&eager(1, 5, b"b"), b"b");
        let r1 = owned(&mut c, Some(1), None);
        let r2 = owned(&mut c, None, None);
        let r3 = owned(&mut c, None, Some(5));
        assert_eq!(c.take(r1).unwrap().data.unwrap(), b"a");
        assert_eq!(c.take(r2).unwrap().data.unwrap(), b"x");
        assert_eq!(c.take(r3).unwrap().data.unwrap(), b"b");
    }

    /// Unexpected messages are kept per source; a wildcard receive still
    /// takes the earliest arrival, not the lowest source's.
    #[test]
    fn wildcard_receives_take_the_earliest_arrival_across_sources() {
        let mut c = Core::new(0, 4);
        c.handle_incoming(&eager(3, 7, b"c"), b"c");
        c.handle_incoming(&eager(1, 8, b"a"), b"a");
        c.handle_incoming(&eager(2, 7, b"b"), b"b");
        let any = owned(&mut c, None, None);
        let tag7 = owned(&mut c, None, Some(7));
        let from1 = owned(&mut c, Some(1), None);
        assert_eq!(c.take(any).unwrap().data.unwrap(), b"c");
        assert_eq!(c.take(tag7).unwrap().data.unwrap(), b"b");
        assert_eq!(c.take(from1).unwrap().data.unwrap(), b"a");
        assert!(c
            .probe(Pattern {
                ctx: 0,
                src: None,
                tag: None
            })
            .is_none());
    }

    /// A peer's bytes may name any source: such a message costs no memory
    /// per named rank, and only a wildcard receive can take it.
    #[test]
    fn a_source_outside_the_world_is_kept_for_wildcards() {
        let mut c = Core::new(0, 4);
        c.handle_incoming(&eager(4_000_000_000, 1, b"x"), b"x");
        c.handle_incoming(&eager(3, 1, b"y"), b"y");
        let from3 = owned(&mut c, Some(3), None);
        let any = owned(&mut c, None, None);
        assert_eq!(c.take(from3).unwrap().data.unwrap(), b"y");
        assert_eq!(c.take(any).unwrap().data.unwrap(), b"x");
    }

    #[test]
    fn posted_receives_match_in_posting_order_and_contexts_separate() {
        let mut c = Core::new(0, 4);
        let a = owned(&mut c, None, None);
        let b = owned(&mut c, Some(3), Some(1));
        let mut other_ctx = eager(3, 1, b"z");
        other_ctx.context = 9;
        c.handle_incoming(&other_ctx, b"z");
        assert!(!c.is_done(a));
        c.handle_incoming(&eager(3, 1, b"p"), b"p");
        c.handle_incoming(&eager(3, 1, b"q"), b"q");
        assert_eq!(c.take(a).unwrap().data.unwrap(), b"p");
        assert_eq!(c.take(b).unwrap().data.unwrap(), b"q");
        assert!(c
            .probe(Pattern {
                ctx: 9,
                src: None,
                tag: None
            })
            .is_some());
    }

    #[test]
    fn unexpected_payload_buffers_are_reused() {
        let mut c = Core::new(0, 2);
        let pat = Pattern {
            ctx: 0,
            src: Some(1),
            tag: None,
        };
        let mut out = vec![0u8; 32 << 10];
        let mut kept = None;
        for round in 0..3u8 {
            let payload = vec![round; 32 << 10];
            c.handle_incoming(&eager(1, 0, &payload), &payload);
            // The second and third messages land in the buffer kept from the one before.
            let at = c.unexpected.find(&pat).map(|u| u.data.as_ptr());
            assert!(c.spare.is_empty());
            if round > 0 {
                assert_eq!(at, kept, "round {round}");
            }
            // SAFETY: `out` outlives the receive, which completes here.
            let mut buf = RecvBuf::Borrowed(unsafe { RecvPtr::new(&mut out) });
            let st = c.take_unexpected_eager(&pat, &mut buf).flatten().unwrap();
            assert_eq!((st.len, &out), (32 << 10, &payload));
            kept = c.spare.last().map(|v| v.as_ptr());
            assert_eq!(kept, at);
        }
        // Small payloads are left to the allocator.
        c.handle_incoming(&eager(1, 0, b"abc"), b"abc");
        assert_eq!(c.spare.len(), 1);
    }

    #[test]
    fn truncation_is_an_error_and_sync_is_acked() {
        let mut c = Core::new(0, 2);
        let mut small = [0u8; 2];
        // SAFETY: `small` outlives the request, which completes below.
        let buf = RecvBuf::Borrowed(unsafe { RecvPtr::new(&mut small) });
        let id = c.post_recv(
            Pattern {
                ctx: 0,
                src: None,
                tag: None,
            },
            buf,
        );
        let mut env = eager(1, 0, b"abc");
        env.kind = Kind::EagerSync;
        env.sreq = 77;
        c.handle_incoming(&env, b"abc");
        let done = c.take(id).unwrap();
        assert_eq!(done.result.unwrap_err().class(), ErrorClass::Truncate);
        match c.out.pop_front() {
            Some(Action::Ctrl { dst: 1, env }) => {
                assert_eq!((env.kind, env.sreq), (Kind::SyncAck, 77))
            }
            _ => panic!("expected a sync ack"),
        }
    }

    #[test]
    fn rendezvous_without_cma_asks_for_data() {
        let mut c = Core::new(0, 2);
        let id = owned(&mut c, Some(1), None);
        let mut rts = Envelope::new(Kind::Rts, 1, 0, 4, 10);
        rts.sreq = 5;
        c.handle_incoming(&rts, &[]);
        let Some(Action::Ctrl { env: cts, .. }) = c.out.pop_front() else {
            panic!("no cts")
        };
        assert_eq!(cts.kind, Kind::Cts);
        for (off, part) in [(0u64, &b"hello"[..]), (5, b"world")] {
            let mut d = Envelope::new(Kind::Data, 1, 0, 4, 10);
            d.rreq = cts.rreq;
            d.addr = off;
            d.frag = 5;
            assert!(!c.is_done(id));
            c.handle_incoming(&d, part);
        }
        assert_eq!(c.take(id).unwrap().data.unwrap(), b"helloworld");
    }

    #[test]
    fn cancel_only_unmatched() {
        let mut c = Core::new(0, 2);
        let id = owned(&mut c, None, None);
        assert!(c.cancel(id));
        assert!(c.take(id).unwrap().status.cancelled);
        let id = owned(&mut c, None, None);
        c.handle_incoming(&eager(1, 0, b"k"), b"k");
        assert!(!c.cancel(id));
    }
}
