//! One-sided communication (MPI-4 §12): windows, puts, gets and accumulates, and the
//! three ways of synchronising them (fence, post-start-complete-wait, lock/unlock).
//!
//! How it is built:
//! - Every member of a window runs an *agent* thread for it that blocks in a receive on a
//!   private duplicate of the window's communicator (`req`) and serves what arrives there:
//!   the operations other members (and this one) aim at its memory, flushes, lock requests,
//!   post and complete tokens, and the replies of other members' agents. A thread blocked in
//!   a receive drives metampi's engine, so passive-target operations progress while the
//!   target's program computes without calling MPI, and the agent never polls.
//! - An operation is one message to the target's agent, which applies it to its memory
//!   through the target datatype's blocks (sent as a list of `(offset, len)`: the origin
//!   names the target datatype, the target has no handle for it). The agent applies
//!   messages one at a time in arrival order, so an accumulate is atomic per element and
//!   the operations of one origin to one target are applied in the order issued.
//! - What must come back (get data, a lock grant, the acknowledgement of a flush) comes
//!   as a reply message to the origin's agent, which files it by the tag the origin chose
//!   and wakes the waiting program thread (a condition variable in this process). Agents
//!   send replies without blocking, so two agents answering each other never deadlock.
//! - A flush is a round trip to the target's agent: messages of one origin to one agent
//!   arrive in order, so its acknowledgement means every earlier operation is applied.
//!   Fence is a flush of every target touched since the last one and a barrier on a second
//!   duplicate (`coll`) that the agents never receive on. Gets and fetching operations wait
//!   for their reply inside the call, so they, and the request-based forms, complete at once.
//! - Errors a target finds in an operation that has no reply (a put outside a dynamic
//!   window's attached memory) are kept by its agent and reported by the origin's next
//!   flush, unlock, complete or fence. Errors go through the window's error handler
//!   (`MPI_ERRORS_ARE_FATAL` unless the program sets another).
//! - `MPI_Win_allocate_shared` maps one POSIX shared-memory segment (a file under `/dev/shm`
//!   that rank 0 creates and removes once every member has mapped it), with the members'
//!   parts contiguous in rank order; it needs all members on one host.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use metampi::collective::{CommunicatorCollectives, Root};
use metampi::datatype::abi as dtabi;
use metampi::point_to_point::{Destination, SendFuture, Source};
use metampi::topology::{Communicator, SimpleCommunicator};
use metampi::Count;

use crate::consts::*;
use crate::env::{Info, INFOS};
use crate::err::{self, Fail, HandlerFn, R};
use crate::raw;
use crate::req::{self, St};
use crate::state::{self, Table};
use crate::types::{self, COp, Sub};

/// Defines exported one-sided functions as `mpi!` does, with the error going to the
/// handler of the window the call names once it has looked the window up.
macro_rules! win_mpi {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),* $(,)?) $body:block)*) => {$(
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            err::on_win(None);
            let rc = err::ret(stringify!($name), || $body);
            err::on_win(None);
            rc
        }
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

// ---- messages between origins and agents -------------------------------------------

/// Kinds of message an agent receives (the first byte).
mod kind {
    pub const PUT: u8 = 1;
    pub const GET: u8 = 2;
    pub const ACC: u8 = 3;
    pub const GET_ACC: u8 = 4;
    pub const CAS: u8 = 5;
    pub const FLUSH: u8 = 6;
    pub const LOCK: u8 = 7;
    pub const UNLOCK: u8 = 8;
    pub const REPLY: u8 = 9;
    pub const POST: u8 = 10;
    pub const DONE: u8 = 11;
    pub const STOP: u8 = 12;
}

/// Builds a message: fixed-width little-endian fields, byte strings with their length.
struct Enc(Vec<u8>);

impl Enc {
    fn new(kind: u8) -> Enc {
        Enc(vec![kind])
    }
    fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(self, v: i64) -> Enc {
        self.u64(v as u64)
    }
    fn bytes(self, b: &[u8]) -> Enc {
        let mut e = self.u64(b.len() as u64);
        e.0.extend_from_slice(b);
        e
    }
    fn target(self, t: &Target) -> Enc {
        let mut e = self
            .i64(t.addr)
            .u64(t.count)
            .i64(t.extent)
            .u64(t.blocks.len() as u64);
        for &(off, len) in &t.blocks {
            e = e.i64(off).u64(len);
        }
        e
    }
}

/// Reads a message [`Enc`] built; `None` where it ends early.
struct Dec<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    fn u64(&mut self) -> Option<u64> {
        let v = self.b.get(self.at..self.at + 8)?;
        self.at += 8;
        Some(u64::from_le_bytes(v.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        self.u64().map(|v| v as i64)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        let v = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(v)
    }
    fn target(&mut self) -> Option<Target> {
        let (addr, count, extent, n) = (self.i64()?, self.u64()?, self.i64()?, self.u64()?);
        let mut blocks = Vec::with_capacity(n.min(1 << 16) as usize);
        for _ in 0..n {
            blocks.push((self.i64()?, self.u64()?));
        }
        Some(Target {
            addr,
            count,
            extent,
            blocks,
        })
    }
}

/// Target memory as an operation names it: `count` elements of a datatype (its blocks and
/// extent) from `addr`, a byte offset into the target's window (an absolute address in a
/// dynamic window).
#[derive(Clone, Debug, PartialEq)]
struct Target {
    addr: i64,
    count: u64,
    extent: i64,
    blocks: Vec<(i64, u64)>,
}

impl Target {
    /// Bytes of data the target memory holds.
    fn bytes(&self) -> usize {
        self.count as usize * self.blocks.iter().map(|b| b.1 as usize).sum::<usize>()
    }

    /// The lowest and one past the highest byte touched, relative to the window; `None`
    /// when no byte is.
    fn span(&self) -> Option<(i64, i64)> {
        if self.bytes() == 0 {
            return None;
        }
        let lo = self.blocks.iter().map(|b| b.0).min()?;
        let hi = self.blocks.iter().map(|b| b.0 + b.1 as i64).max()?;
        let last = (self.count as i64 - 1) * self.extent;
        Some((self.addr + lo.min(lo + last), self.addr + hi.max(hi + last)))
    }

    /// The byte ranges `(address relative to the window, len)` in signature order.
    fn ranges(&self) -> impl Iterator<Item = (i64, usize)> + '_ {
        (0..self.count as i64).flat_map(move |i| {
            self.blocks
                .iter()
                .filter(|b| b.1 > 0)
                .map(move |&(off, len)| (self.addr + i * self.extent + off, len as usize))
        })
    }
}

/// The target memory's data, packed (`base`: where the window starts in this process).
fn gather(base: usize, t: &Target) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.bytes());
    for (a, len) in t.ranges() {
        out.extend_from_slice(raw::bytes(at(base, a), len));
    }
    out
}

/// Writes packed `data` into the target memory.
fn scatter(base: usize, t: &Target, data: &[u8]) {
    let mut from = 0;
    for (a, len) in t.ranges() {
        raw::bytes_mut(at(base, a), len).copy_from_slice(&data[from..from + len]);
        from += len;
    }
}

fn at(base: usize, rel: i64) -> *mut c_void {
    (base as i64).wrapping_add(rel) as usize as *mut c_void
}

// ---- the agent ---------------------------------------------------------------------

/// What an agent hands the program's threads of its process: replies by tag, and the
/// post and complete tokens of PSCW by the rank that sent them.
struct Mailbox {
    m: Mutex<Mail>,
    cv: Condvar,
}

#[derive(Default)]
struct Mail {
    replies: HashMap<u64, R<Vec<u8>>>,
    posts: Vec<u32>,
    dones: Vec<u32>,
    /// The agent has ended (the window is freed, or its receive failed).
    dead: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mailbox {
    fn deliver(&self, f: impl FnOnce(&mut Mail)) {
        f(&mut lock(&self.m));
        self.cv.notify_all();
    }

    /// Waits until `ready` takes what it needs from the mail (returns `Some`).
    fn wait_for<T>(&self, mut ready: impl FnMut(&mut Mail) -> Option<T>) -> R<T> {
        let mut m = lock(&self.m);
        loop {
            if let Some(v) = ready(&mut m) {
                return Ok(v);
            }
            if m.dead {
                return Err(Fail::new(
                    ERR_INTERN,
                    "the window's agent thread has ended (the window is being freed)",
                ));
            }
            m = self.cv.wait(m).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Memory regions attached to a dynamic window: `(address, len)`.
type Attached = Arc<Mutex<Vec<(usize, usize)>>>;

/// The agent of one window in this process.
struct Agent {
    req: Arc<SimpleCommunicator>,
    me: i32,
    base: usize,
    size: usize,
    dynamic: Option<Attached>,
    mail: Arc<Mailbox>,
    /// Lock holders `(rank, exclusive)` and waiting requests `(rank, tag, exclusive)`.
    holders: Vec<(i32, bool)>,
    queue: VecDeque<(i32, u64, bool)>,
    /// The first error of an operation without a reply, by origin, for its next flush.
    errors: HashMap<i32, Fail>,
    /// Replies on their way (sent without blocking; see the module's notes).
    sends: Vec<SendFuture<u8>>,
}

impl Agent {
    fn run(mut self) {
        loop {
            self.sends.retain_mut(|s| s.test().is_none());
            let Ok((msg, st)) = self.req.any_process().try_receive_vec_with_tag::<u8>(None) else {
                break;
            };
            if !self.handle(st.source_rank(), &msg) {
                break;
            }
        }
        self.mail.deliver(|m| m.dead = true);
    }

    /// Serves one message; false on the stop message.
    fn handle(&mut self, src: i32, msg: &[u8]) -> bool {
        match msg.first() {
            Some(&kind::STOP) => false,
            Some(&k) => {
                // A message that does not decode comes from no origin of this library: dropped.
                let _ = self.serve(src, k, &mut Dec { b: msg, at: 1 });
                true
            }
            None => true,
        }
    }

    fn serve(&mut self, src: i32, k: u8, d: &mut Dec<'_>) -> Option<()> {
        match k {
            kind::PUT => {
                let t = d.target()?;
                let data = d.bytes()?;
                match self.check(&t, data.len()) {
                    Ok(()) => scatter(self.base, &t, data),
                    Err(f) => self.note(src, f),
                }
            }
            kind::GET => {
                let tag = d.u64()?;
                let t = d.target()?;
                let r = self.check(&t, t.bytes()).map(|()| gather(self.base, &t));
                self.reply(src, tag, r);
            }
            kind::ACC => {
                let (op, basic) = (d.i64()? as Handle, d.i64()? as Handle);
                let t = d.target()?;
                let data = d.bytes()?;
                if let Err(f) = self.accumulate(op, basic, &t, data) {
                    self.note(src, f);
                }
            }
            kind::GET_ACC => {
                let tag = d.u64()?;
                let (op, basic) = (d.i64()? as Handle, d.i64()? as Handle);
                let t = d.target()?;
                let data = d.bytes()?;
                let r = self.accumulate(op, basic, &t, data);
                self.reply(src, tag, r);
            }
            kind::CAS => {
                let tag = d.u64()?;
                let t = d.target()?;
                let (new, cmp) = (d.bytes()?, d.bytes()?);
                let r = self.check(&t, new.len()).map(|()| {
                    let old = gather(self.base, &t);
                    if old == cmp {
                        scatter(self.base, &t, new);
                    }
                    old
                });
                self.reply(src, tag, r);
            }
            kind::FLUSH => {
                let tag = d.u64()?;
                let r = self.errors.remove(&src).map_or(Ok(Vec::new()), Err);
                self.reply(src, tag, r);
            }
            kind::LOCK => {
                let tag = d.u64()?;
                let excl = d.u64()? != 0;
                self.queue.push_back((src, tag, excl));
                self.grant();
            }
            kind::UNLOCK => {
                let tag = d.u64()?;
                if let Some(i) = self.holders.iter().position(|h| h.0 == src) {
                    self.holders.remove(i);
                }
                let r = self.errors.remove(&src).map_or(Ok(Vec::new()), Err);
                self.reply(src, tag, r);
                self.grant();
            }
            kind::REPLY => {
                let tag = d.u64()?;
                let class = d.i64()? as c_int;
                let text = String::from_utf8_lossy(d.bytes()?).into_owned();
                let data = d.bytes()?.to_vec();
                let r = match class {
                    SUCCESS => Ok(data),
                    c => Err(Fail::new(c, format!("at rank {src}: {text}"))),
                };
                self.mail.deliver(|m| {
                    m.replies.insert(tag, r);
                });
            }
            kind::POST => self.mail.deliver(|m| m.posts[src as usize] += 1),
            kind::DONE => {
                // Acknowledged, so that what the origin does after MPI_Win_complete (a
                // barrier, say) finds the token here.
                let tag = d.u64()?;
                self.mail.deliver(|m| m.dones[src as usize] += 1);
                self.reply(src, tag, Ok(Vec::new()));
            }
            _ => {}
        }
        Some(())
    }

    /// Grants waiting lock requests in order while they are compatible with the holders.
    fn grant(&mut self) {
        while let Some(&(rank, tag, excl)) = self.queue.front() {
            let free = if excl {
                self.holders.is_empty()
            } else {
                self.holders.iter().all(|h| !h.1)
            };
            if !free {
                break;
            }
            self.queue.pop_front();
            self.holders.push((rank, excl));
            self.reply(rank, tag, Ok(Vec::new()));
        }
    }

    fn note(&mut self, src: i32, f: Fail) {
        self.errors.entry(src).or_insert(f);
    }

    /// Whether the target memory lies in the window (in attached memory, when dynamic),
    /// and `data` bytes fill it.
    fn check(&self, t: &Target, data: usize) -> R {
        if data != t.bytes() {
            return Err(Fail::new(
                ERR_TYPE,
                format!(
                    "the origin sends {data} bytes for {} bytes of target memory",
                    t.bytes()
                ),
            ));
        }
        let Some((lo, hi)) = t.span() else {
            return Ok(());
        };
        let inside = match &self.dynamic {
            None => lo >= 0 && hi <= self.size as i64,
            Some(a) => lock(a)
                .iter()
                .any(|&(b, l)| lo >= b as i64 && hi <= (b + l) as i64),
        };
        if inside {
            return Ok(());
        }
        Err(Fail::new(
            ERR_RMA_RANGE,
            match &self.dynamic {
                None => format!(
                    "bytes {lo}..{hi} of the window at rank {} lie outside its {} bytes",
                    self.me, self.size
                ),
                Some(_) => format!(
                    "addresses {lo:#x}..{hi:#x} at rank {} are not in memory attached to the window",
                    self.me
                ),
            },
        ))
    }

    /// Applies `op` (a predefined operation, `MPI_REPLACE` or `MPI_NO_OP`) of the origin's
    /// `data` to the target memory; the memory's former contents, packed.
    fn accumulate(&self, op: Handle, basic: Handle, t: &Target, data: &[u8]) -> R<Vec<u8>> {
        let old = gather(self.base, t);
        if op == OP_NO_OP {
            return Ok(old);
        }
        self.check(t, data.len())?;
        if op == OP_REPLACE {
            scatter(self.base, t, data);
            return Ok(old);
        }
        let COp::Sys(sys) = types::op(op)? else {
            return Err(Fail::new(
                ERR_OP,
                "one-sided accumulates take predefined operations only (MPI-4 §12.3.4)",
            ));
        };
        let dt = types::dtype(basic)?;
        let esize = types::size_of(basic)?.max(1);
        let n = (data.len() / esize) as Count;
        let mut acc = old.clone();
        let a = raw::CBuf::new(data.as_ptr() as *const c_void, n, dt);
        let mut b = raw::CBuf::new(acc.as_mut_ptr() as *const c_void, n, dt);
        metampi::collective::try_reduce_local_into(&a, &mut b, sys)?;
        scatter(self.base, t, &acc);
        Ok(old)
    }

    /// Sends the reply with `tag` to the agent of `to` (or files it here, for this process).
    fn reply(&mut self, to: i32, tag: u64, r: R<Vec<u8>>) {
        if to == self.me {
            self.mail.deliver(|m| {
                m.replies.insert(tag, r);
            });
            return;
        }
        let msg = match r {
            Ok(data) => Enc::new(kind::REPLY)
                .u64(tag)
                .i64(SUCCESS as i64)
                .bytes(&[])
                .bytes(&data),
            Err(f) => Enc::new(kind::REPLY)
                .u64(tag)
                .i64(f.class as i64)
                .bytes(f.msg.as_bytes())
                .bytes(&[]),
        };
        if let Ok(s) = self
            .req
            .process_at_rank(to)
            .try_immediate_send_owned(msg.0, 0)
        {
            self.sends.push(s);
        }
    }
}

// ---- windows -------------------------------------------------------------------------

/// How the window's memory came to be, and so how `MPI_Win_free` lets it go.
enum Memory {
    /// The program's (`MPI_Win_create`) or none (dynamic).
    Program,
    /// From [`raw::alloc`] (`MPI_Win_allocate`).
    Alloc(usize),
    /// A shared mapping of `len` bytes at `addr` (`MPI_Win_allocate_shared`).
    Shm { addr: usize, len: usize },
}

/// Another member's part of the window: where (in this process, for shared windows; else
/// in its own), how large, and its displacement unit.
#[derive(Clone, Copy, Debug)]
struct Peer {
    base: usize,
    size: usize,
    disp_unit: i64,
}

/// The synchronisation state of this process on a window.
#[derive(Default)]
struct Sync {
    fence: bool,
    locks: HashMap<i32, c_int>,
    lock_all: bool,
    /// The targets of an access epoch begun by `MPI_Win_start`.
    access: Option<Vec<i32>>,
    /// The origins of an exposure epoch begun by `MPI_Win_post`.
    exposure: Option<Vec<i32>>,
    /// Targets with operations not yet flushed.
    touched: BTreeSet<i32>,
}

/// A window as each member holds it.
pub struct WinObj {
    req: Arc<SimpleCommunicator>,
    coll: SimpleCommunicator,
    /// World ranks of the members, in window rank order.
    world: Vec<u32>,
    rank: i32,
    flavor: c_int,
    peers: Vec<Peer>,
    mem: Memory,
    mail: Arc<Mailbox>,
    agent: Mutex<Option<std::thread::JoinHandle<()>>>,
    tags: AtomicU64,
    errh: AtomicHandle,
    name: Mutex<String>,
    info: Mutex<Info>,
    sync: Mutex<Sync>,
    attached: Attached,
    attrs: Mutex<Vec<(c_int, isize)>>,
    /// Values the predefined attributes point at (`MPI_Win_get_attr` hands out addresses).
    attr_size: isize,
    attr_disp: c_int,
    attr_flavor: c_int,
    attr_model: c_int,
}

static WINS: Table<Arc<WinObj>> = Table::new(WIN_BASE);

/// The window behind `h`; it becomes the one whose handler a failure invokes.
fn win(h: Handle) -> R<Arc<WinObj>> {
    state::check_init()?;
    let w = WINS.get(h).ok_or_else(|| {
        if h == WIN_NULL {
            Fail::new(ERR_WIN, "MPI_WIN_NULL is not a window")
        } else {
            Fail::new(
                ERR_WIN,
                format!("{h:#x} is not a window (freed, or never made)"),
            )
        }
    })?;
    err::on_win(Some(h));
    Ok(w)
}

/// The error handler of window `h` (MPI_COMM_WORLD's for a handle that names none).
pub fn errhandler_of(h: Handle) -> state::Handler {
    match WINS.get(h) {
        Some(w) => state::handler(w.errh.load(Ordering::Relaxed)).unwrap_or(state::Handler::Fatal),
        None => state::errhandler_of(COMM_WORLD),
    }
}

/// Makes a window over this member's `base`/`size` on communicator `comm_h` (collective).
fn create(
    comm_h: Handle,
    base: usize,
    size: usize,
    disp_unit: i64,
    flavor: c_int,
    mem: Memory,
    info: Handle,
    shm: Option<&[usize]>,
) -> R<Handle> {
    let c = state::intra(comm_h)?;
    let req = Arc::new(c.comm.duplicate());
    let coll = c.comm.duplicate();
    let n = coll.size() as usize;
    let rank = coll.rank();
    let mine = [base as u64, size as u64, disp_unit as u64];
    let mut all = vec![0u64; 3 * n];
    coll.try_all_gather_into(&mine[..], &mut all[..])?;
    let peers: Vec<Peer> = (0..n)
        .map(|r| Peer {
            base: match shm {
                // Where the member's part lies in this process's mapping.
                Some(offsets) => base.wrapping_sub(offsets[rank as usize]) + offsets[r],
                None => all[3 * r] as usize,
            },
            size: all[3 * r + 1] as usize,
            disp_unit: all[3 * r + 2] as i64,
        })
        .collect();
    let world = metampi::topology::Group::world_ranks(&c.comm.group()).to_vec();
    let mail = Arc::new(Mailbox {
        m: Mutex::new(Mail {
            posts: vec![0; n],
            dones: vec![0; n],
            ..Mail::default()
        }),
        cv: Condvar::new(),
    });
    let attached: Attached = Arc::default();
    let agent = Agent {
        req: Arc::clone(&req),
        me: rank,
        base,
        size,
        dynamic: (flavor == WIN_FLAVOR_DYNAMIC).then(|| Arc::clone(&attached)),
        mail: Arc::clone(&mail),
        holders: Vec::new(),
        queue: VecDeque::new(),
        errors: HashMap::new(),
        sends: Vec::new(),
    };
    let thread = std::thread::Builder::new()
        .name(format!("metampi-win-agent-{rank}"))
        .spawn(move || agent.run())
        .map_err(|e| Fail::new(ERR_NO_MEM, format!("no thread for the window's agent: {e}")))?;
    let w = WinObj {
        req,
        coll,
        world,
        rank,
        flavor,
        peers,
        mem,
        mail,
        agent: Mutex::new(Some(thread)),
        tags: AtomicU64::new(1),
        errh: AtomicHandle::new(ERRORS_ARE_FATAL),
        name: Mutex::new(String::new()),
        info: Mutex::new(INFOS.get(info).unwrap_or_default()),
        sync: Mutex::new(Sync::default()),
        attached,
        attrs: Mutex::new(Vec::new()),
        attr_size: size as isize,
        attr_disp: disp_unit as c_int,
        attr_flavor: flavor,
        attr_model: WIN_UNIFIED,
    };
    let h = WINS.insert(Arc::new(w));
    lock(&LIVE).push(h);
    Ok(h)
}

fn size_ok(size: i64) -> R<usize> {
    usize::try_from(size)
        .map_err(|_| Fail::new(ERR_SIZE, format!("window size {size} is negative")))
}

fn disp_ok(d: i64) -> R<i64> {
    if d <= 0 || d > c_int::MAX as i64 {
        return Err(Fail::new(
            ERR_DISP,
            format!("displacement unit {d} is not a positive int"),
        ));
    }
    Ok(d)
}

fn win_create(
    base: *mut c_void,
    size: i64,
    disp: i64,
    info: Handle,
    comm: Handle,
    out: *mut Handle,
) -> R {
    let (size, disp) = (size_ok(size)?, disp_ok(disp)?);
    raw::put(
        out,
        create(
            comm,
            raw::address(base) as usize,
            size,
            disp,
            WIN_FLAVOR_CREATE,
            Memory::Program,
            info,
            None,
        )?,
    )
}

fn win_allocate(
    size: i64,
    disp: i64,
    info: Handle,
    comm: Handle,
    baseptr: *mut c_void,
    out: *mut Handle,
) -> R {
    let (size, disp) = (size_ok(size)?, disp_ok(disp)?);
    let p = raw::alloc(size);
    if p.is_null() {
        return Err(Fail::new(
            ERR_NO_MEM,
            format!("{size} bytes are not available"),
        ));
    }
    let a = raw::address(p) as usize;
    match create(
        comm,
        a,
        size,
        disp,
        WIN_FLAVOR_ALLOCATE,
        Memory::Alloc(a),
        info,
        None,
    ) {
        Ok(h) => {
            raw::put(baseptr as *mut *mut c_void, p)?;
            raw::put(out, h)
        }
        Err(f) => {
            raw::free(p);
            Err(f)
        }
    }
}

/// Names of shared segments this process made.
static SEGMENTS: AtomicU64 = AtomicU64::new(0);

fn win_allocate_shared(
    size: i64,
    disp: i64,
    info: Handle,
    comm: Handle,
    baseptr: *mut c_void,
    out: *mut Handle,
) -> R {
    let (size, disp) = (size_ok(size)?, disp_ok(disp)?);
    let c = state::intra(comm)?;
    let agree = c.comm.duplicate();
    let n = agree.size() as usize;
    let me = agree.rank() as usize;
    // One host for all members: the processes sharing memory with this one are all of them.
    let node = agree.split_shared(0);
    if node.size() as usize != n {
        return Err(Fail::new(
            ERR_RMA_SHARED,
            format!(
                "the communicator's {n} processes are not all on one host ({} are on this one): \
                 MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) gives one that is",
                node.size()
            ),
        ));
    }
    let mut sizes = vec![0u64; n];
    agree.try_all_gather_into(&(size as u64), &mut sizes[..])?;
    let offsets: Vec<usize> = sizes
        .iter()
        .scan(0usize, |acc, &s| {
            let o = *acc;
            *acc += s as usize;
            Some(o)
        })
        .collect();
    let total: usize = sizes.iter().map(|&s| s as usize).sum();
    // Rank 0 makes the segment and names it by its process id and a counter.
    let mut id = [0u64; 3];
    let mut made = None;
    if me == 0 {
        let seq = SEGMENTS.fetch_add(1, Ordering::Relaxed);
        let path = segment_path(std::process::id() as u64, seq);
        let ok = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|f| f.set_len(total.max(1) as u64))
            .is_ok();
        id = [ok as u64, std::process::id() as u64, seq];
        made = Some(path);
    }
    agree.process_at_rank(0).try_broadcast_into(&mut id[..])?;
    let path = segment_path(id[1], id[2]);
    let mapped = match id[0] {
        0 => Err(std::io::Error::other("rank 0 could not create it")),
        _ => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|f| raw::map_shared(&f, total)),
    };
    let mut oks = vec![0u64; n];
    agree.try_all_gather_into(&(mapped.is_ok() as u64), &mut oks[..])?;
    if let Some(p) = made {
        // Every member has mapped it (or failed to): the name is no longer needed.
        let _ = std::fs::remove_file(p);
    }
    if oks.contains(&0) {
        if let Ok(p) = &mapped {
            raw::unmap(*p, total);
        }
        return Err(Fail::new(
            ERR_NO_MEM,
            match mapped {
                Err(e) => format!("shared memory segment {}: {e}", path.display()),
                Ok(_) => "another member could not map the shared memory segment".into(),
            },
        ));
    }
    let Ok(p) = mapped else {
        return Err(Fail::new(ERR_INTERN, "the segment mapped nowhere"));
    };
    let addr = raw::address(p) as usize;
    let mine = addr + offsets[me];
    let h = create(
        comm,
        mine,
        size,
        disp,
        WIN_FLAVOR_SHARED,
        Memory::Shm { addr, len: total },
        info,
        Some(&offsets),
    );
    match h {
        Ok(h) => {
            raw::put(baseptr as *mut *mut c_void, mine as *mut c_void)?;
            raw::put(out, h)
        }
        Err(f) => {
            raw::unmap(p, total);
            Err(f)
        }
    }
}

fn segment_path(pid: u64, seq: u64) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/metampi-win-{pid}-{seq}"))
}

/// Ends window `h`'s agent and frees what the window owns (`MPI_Win_free`, after the barrier).
fn dispose(h: Handle, w: &WinObj) {
    let _ = w
        .req
        .process_at_rank(w.rank)
        .try_send_with_tag(&Enc::new(kind::STOP).0[..], 0);
    if let Some(t) = lock(&w.agent).take() {
        let _ = t.join();
    }
    match w.mem {
        Memory::Program => {}
        Memory::Alloc(a) => raw::free(a as *mut c_void),
        Memory::Shm { addr, len } => raw::unmap(addr as *mut c_void, len),
    }
    let attrs = std::mem::take(&mut *lock(&w.attrs));
    for (k, v) in attrs {
        let _ = crate::attr::run_delete(h, k, v);
    }
}

/// Handles of the windows not yet freed (for `MPI_Finalize`).
static LIVE: Mutex<Vec<Handle>> = Mutex::new(Vec::new());

/// Ends the agents of the windows the program did not free (`MPI_Finalize`).
pub fn free_all() {
    let live = std::mem::take(&mut *lock(&LIVE));
    for h in live {
        if let Some(w) = WINS.remove(h) {
            dispose(h, &w);
        }
    }
}

impl WinObj {
    fn size(&self) -> i32 {
        self.peers.len() as i32
    }

    fn send(&self, to: i32, msg: Enc) -> R {
        self.req
            .process_at_rank(to)
            .try_send_with_tag(&msg.0[..], 0)?;
        Ok(())
    }

    /// Sends the message `build(tag)` to `to`'s agent and waits for its reply.
    fn call(&self, to: i32, build: impl FnOnce(u64) -> Enc) -> R<Vec<u8>> {
        let tag = self.tags.fetch_add(1, Ordering::Relaxed);
        self.send(to, build(tag))?;
        self.mail.wait_for(|m| m.replies.remove(&tag))?
    }

    fn check_rank(&self, r: c_int) -> R {
        if r < 0 || r >= self.size() {
            return Err(Fail::new(
                ERR_RANK,
                format!("{r} is not a rank of a window of {}", self.size()),
            ));
        }
        Ok(())
    }

    /// Refuses an operation on `target` outside an access epoch to it; notes it for flushes.
    fn access(&self, target: c_int) -> R {
        self.check_rank(target)?;
        let mut s = lock(&self.sync);
        let open = s.fence
            || s.lock_all
            || s.locks.contains_key(&target)
            || s.access.as_ref().is_some_and(|g| g.contains(&target));
        if !open {
            return Err(Fail::new(
                ERR_RMA_SYNC,
                format!(
                    "no access epoch to rank {target} is open (MPI_Win_fence, MPI_Win_start, \
                     MPI_Win_lock or MPI_Win_lock_all opens one)"
                ),
            ));
        }
        s.touched.insert(target);
        Ok(())
    }

    /// The target memory `count` elements of `dt` at displacement `disp` name at `rank`.
    fn target(&self, rank: c_int, disp: isize, count: i64, dt: Handle) -> R<Target> {
        if count < 0 {
            return Err(Fail::new(
                ERR_COUNT,
                format!("target count {count} is negative"),
            ));
        }
        let id = types::committed_id(dt)?;
        let l = dtabi::layout(id);
        let p = self.peers[rank as usize];
        let addr = match self.flavor {
            WIN_FLAVOR_DYNAMIC => disp as i64,
            _ => (disp as i64)
                .checked_mul(p.disp_unit)
                .ok_or_else(|| Fail::new(ERR_DISP, format!("displacement {disp} overflows")))?,
        };
        let t = Target {
            addr,
            count: count as u64,
            extent: l.extent as i64,
            blocks: dtabi::blocks(id)
                .into_iter()
                .map(|(o, n)| (o as i64, n as u64))
                .collect(),
        };
        if self.flavor != WIN_FLAVOR_DYNAMIC {
            if let Some((lo, hi)) = t.span() {
                if lo < 0 || hi > p.size as i64 {
                    return Err(Fail::new(
                        ERR_RMA_RANGE,
                        format!(
                            "bytes {lo}..{hi} of the window at rank {rank} lie outside its {} bytes",
                            p.size
                        ),
                    ));
                }
            }
        }
        Ok(t)
    }

    fn flush(&self, target: i32) -> R {
        lock(&self.sync).touched.remove(&target);
        self.call(target, |tag| Enc::new(kind::FLUSH).u64(tag))
            .map(|_| ())
    }

    /// Flushes every target touched since the last flush; the first error.
    fn flush_touched(&self) -> R {
        let targets = std::mem::take(&mut lock(&self.sync).touched);
        let mut first = Ok(());
        for t in targets {
            let r = self
                .call(t, |tag| Enc::new(kind::FLUSH).u64(tag))
                .map(|_| ());
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn has_passive(&self, target: i32) -> bool {
        let s = lock(&self.sync);
        s.lock_all || s.locks.contains_key(&target)
    }

    /// Window ranks of the world ranks of group `g`.
    fn ranks_of(&self, g: Handle) -> R<Vec<i32>> {
        let g = state::group(g)?;
        g.0.iter()
            .map(|w| {
                self.world
                    .iter()
                    .position(|x| x == w)
                    .map(|i| i as i32)
                    .ok_or_else(|| {
                        Fail::new(
                            ERR_GROUP,
                            format!("world rank {w} of the group is not a member of the window"),
                        )
                    })
            })
            .collect()
    }
}

/// Bytes of `count` elements of `dt` at `p`, packed (what an origin sends).
fn pack(p: *const c_void, count: i64, dt: Handle) -> R<Vec<u8>> {
    if count < 0 {
        return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
    }
    let id = types::committed_id(dt)?;
    let mut v = vec![0u8; count as usize * dtabi::layout(id).size];
    types::pack_into(p, count as usize, id, &mut v);
    Ok(v)
}

/// Writes packed `data` into `count` elements of `dt` at `p` (what an origin receives).
fn unpack(data: &[u8], p: *mut c_void, count: i64, dt: Handle) -> R {
    if count < 0 {
        return Err(Fail::new(ERR_COUNT, format!("count {count} is negative")));
    }
    let id = types::committed_id(dt)?;
    let need = count as usize * dtabi::layout(id).size;
    if need != data.len() {
        return Err(Fail::new(
            ERR_TRUNCATE,
            format!(
                "{} bytes of target data do not fill {need} bytes of the origin buffer",
                data.len()
            ),
        ));
    }
    types::unpack_from(data, p, count as usize, id);
    Ok(())
}

/// The predefined datatype every element of `dt` is made of (accumulates apply their
/// operation per element of it).
fn basic_of(dt: Handle) -> R<Handle> {
    fn leaf(s: &Sub, out: &mut Option<Handle>) -> bool {
        match s {
            Sub::Named(h) => match *out {
                None => {
                    *out = Some(*h);
                    true
                }
                Some(o) => o == *h,
            },
            Sub::Derived(e) => !e.env.types.is_empty() && e.env.types.iter().all(|s| leaf(s, out)),
        }
    }
    let Some(e) = types::TYPES.get(dt) else {
        types::type_id_any(dt)?;
        return Ok(dt);
    };
    let mut out = None;
    if !e.env.types.is_empty() && e.env.types.iter().all(|s| leaf(s, &mut out)) {
        if let Some(h) = out {
            return Ok(h);
        }
    }
    Err(Fail::new(
        ERR_TYPE,
        "an accumulate's datatype must be made of one predefined datatype (MPI-4 §12.3.4)",
    ))
}

/// An accumulate's operation: a predefined one, `MPI_REPLACE` or `MPI_NO_OP`.
fn acc_op(op: Handle) -> R {
    if op == OP_REPLACE || op == OP_NO_OP {
        return Ok(());
    }
    match types::op(op)? {
        COp::Sys(_) => Ok(()),
        COp::User { .. } => Err(Fail::new(
            ERR_OP,
            "one-sided accumulates take predefined operations only (MPI-4 §12.3.4)",
        )),
    }
}

// ---- operations ----------------------------------------------------------------------

fn put(
    o: *const c_void,
    oc: i64,
    odt: Handle,
    rank: c_int,
    disp: isize,
    tc: i64,
    tdt: Handle,
    wh: Handle,
) -> R {
    let w = win(wh)?;
    let data = pack(o, oc, odt)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.access(rank)?;
    let t = w.target(rank, disp, tc, tdt)?;
    size_match(data.len(), t.bytes())?;
    w.send(rank, Enc::new(kind::PUT).target(&t).bytes(&data))
}

fn get(
    o: *mut c_void,
    oc: i64,
    odt: Handle,
    rank: c_int,
    disp: isize,
    tc: i64,
    tdt: Handle,
    wh: Handle,
) -> R {
    let w = win(wh)?;
    types::committed_id(odt)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.access(rank)?;
    let t = w.target(rank, disp, tc, tdt)?;
    size_match(types::size_of(odt)? * oc.max(0) as usize, t.bytes())?;
    let data = w.call(rank, |tag| Enc::new(kind::GET).u64(tag).target(&t))?;
    unpack(&data, o, oc, odt)
}

fn size_match(origin: usize, target: usize) -> R {
    if origin != target {
        return Err(Fail::new(
            ERR_TYPE,
            format!("the origin has {origin} bytes of data, the target memory {target}"),
        ));
    }
    Ok(())
}

fn accumulate(
    o: *const c_void,
    oc: i64,
    odt: Handle,
    rank: c_int,
    disp: isize,
    tc: i64,
    tdt: Handle,
    op: Handle,
    wh: Handle,
) -> R {
    let w = win(wh)?;
    acc_op(op)?;
    let data = pack(o, oc, odt)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.access(rank)?;
    let t = w.target(rank, disp, tc, tdt)?;
    size_match(data.len(), t.bytes())?;
    let basic = basic_of(tdt)?;
    w.send(
        rank,
        Enc::new(kind::ACC)
            .i64(op as i64)
            .i64(basic as i64)
            .target(&t)
            .bytes(&data),
    )
}

fn get_accumulate(
    o: *const c_void,
    oc: i64,
    odt: Handle,
    r: *mut c_void,
    rc: i64,
    rdt: Handle,
    rank: c_int,
    disp: isize,
    tc: i64,
    tdt: Handle,
    op: Handle,
    wh: Handle,
) -> R {
    let w = win(wh)?;
    acc_op(op)?;
    // MPI_NO_OP ignores the origin buffer (it may be null with any count).
    let data = if op == OP_NO_OP {
        Vec::new()
    } else {
        pack(o, oc, odt)?
    };
    types::committed_id(rdt)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.access(rank)?;
    let t = w.target(rank, disp, tc, tdt)?;
    if op != OP_NO_OP {
        size_match(data.len(), t.bytes())?;
    }
    size_match(types::size_of(rdt)? * rc.max(0) as usize, t.bytes())?;
    let basic = basic_of(tdt)?;
    let old = w.call(rank, |tag| {
        Enc::new(kind::GET_ACC)
            .u64(tag)
            .i64(op as i64)
            .i64(basic as i64)
            .target(&t)
            .bytes(&data)
    })?;
    unpack(&old, r, rc, rdt)
}

fn compare_and_swap(
    o: *const c_void,
    c: *const c_void,
    r: *mut c_void,
    dt: Handle,
    rank: c_int,
    disp: isize,
    wh: Handle,
) -> R {
    let w = win(wh)?;
    let new = pack(o, 1, dt)?;
    let cmp = pack(c, 1, dt)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.access(rank)?;
    let t = w.target(rank, disp, 1, dt)?;
    let old = w.call(rank, |tag| {
        Enc::new(kind::CAS)
            .u64(tag)
            .target(&t)
            .bytes(&new)
            .bytes(&cmp)
    })?;
    unpack(&old, r, 1, dt)
}

/// A request that is complete already: the operations of this module finish (locally)
/// within the call that starts them.
fn done_request(rq: *mut Handle) -> R {
    raw::put(rq, req::done(St::EMPTY))
}

win_mpi! {
    // ---- making and freeing windows --------------------------------------------------
    fn MPI_Win_create / PMPI_Win_create(base: *mut c_void, size: isize, disp: c_int, info: Handle, comm: Handle, out: *mut Handle) {
        win_create(base, size as i64, disp as i64, info, comm, out)
    }
    fn MPI_Win_create_c / PMPI_Win_create_c(base: *mut c_void, size: isize, disp: isize, info: Handle, comm: Handle, out: *mut Handle) {
        win_create(base, size as i64, disp as i64, info, comm, out)
    }
    fn MPI_Win_allocate / PMPI_Win_allocate(size: isize, disp: c_int, info: Handle, comm: Handle, baseptr: *mut c_void, out: *mut Handle) {
        win_allocate(size as i64, disp as i64, info, comm, baseptr, out)
    }
    fn MPI_Win_allocate_c / PMPI_Win_allocate_c(size: isize, disp: isize, info: Handle, comm: Handle, baseptr: *mut c_void, out: *mut Handle) {
        win_allocate(size as i64, disp as i64, info, comm, baseptr, out)
    }
    fn MPI_Win_allocate_shared / PMPI_Win_allocate_shared(size: isize, disp: c_int, info: Handle, comm: Handle, baseptr: *mut c_void, out: *mut Handle) {
        win_allocate_shared(size as i64, disp as i64, info, comm, baseptr, out)
    }
    fn MPI_Win_allocate_shared_c / PMPI_Win_allocate_shared_c(size: isize, disp: isize, info: Handle, comm: Handle, baseptr: *mut c_void, out: *mut Handle) {
        win_allocate_shared(size as i64, disp as i64, info, comm, baseptr, out)
    }
    fn MPI_Win_create_dynamic / PMPI_Win_create_dynamic(info: Handle, comm: Handle, out: *mut Handle) {
        raw::put(out, create(comm, 0, 0, 1, WIN_FLAVOR_DYNAMIC, Memory::Program, info, None)?)
    }
    fn MPI_Win_free / PMPI_Win_free(wp: *mut Handle) {
        let h = raw::get(wp)?;
        let w = win(h)?;
        // An epoch left open is the program's error; the window is freed all the same, since
        // the other members wait for this one in the barrier below.
        let open = {
            let s = lock(&w.sync);
            !s.locks.is_empty() || s.lock_all || s.access.is_some() || s.exposure.is_some()
        };
        let mut flushed = w.flush_touched();
        if open && flushed.is_ok() {
            flushed = Err(Fail::new(ERR_RMA_SYNC, "an epoch was still open on the window (unlock, complete or wait first); the window is freed"));
        }
        // Every member's operations on this one's memory are complete once all have come here.
        w.coll.try_barrier()?;
        WINS.remove(h);
        lock(&LIVE).retain(|&l| l != h);
        dispose(h, &w);
        err::on_win(None);
        raw::put(wp, WIN_NULL)?;
        flushed
    }
    fn MPI_Win_attach / PMPI_Win_attach(wh: Handle, base: *mut c_void, size: isize) {
        let w = win(wh)?;
        if w.flavor != WIN_FLAVOR_DYNAMIC {
            return Err(Fail::new(ERR_RMA_FLAVOR, "only a window of MPI_Win_create_dynamic takes attached memory"));
        }
        let size = size_ok(size as i64)?;
        lock(&w.attached).push((raw::address(base) as usize, size));
        Ok(())
    }
    fn MPI_Win_detach / PMPI_Win_detach(wh: Handle, base: *const c_void) {
        let w = win(wh)?;
        if w.flavor != WIN_FLAVOR_DYNAMIC {
            return Err(Fail::new(ERR_RMA_FLAVOR, "only a window of MPI_Win_create_dynamic has attached memory"));
        }
        let a = raw::address(base) as usize;
        let mut m = lock(&w.attached);
        let i = m.iter().position(|e| e.0 == a).ok_or_else(|| {
            Fail::new(ERR_RMA_ATTACH, format!("no memory at {a:#x} is attached to the window"))
        })?;
        m.remove(i);
        Ok(())
    }
    fn MPI_Win_shared_query / PMPI_Win_shared_query(wh: Handle, rank: c_int, size: *mut isize, disp: *mut c_int, baseptr: *mut c_void) {
        let (s, d, b) = shared_query(wh, rank)?;
        raw::put(size, s as isize)?;
        raw::put(disp, d as c_int)?;
        raw::put(baseptr as *mut *mut c_void, b as *mut c_void)
    }
    fn MPI_Win_shared_query_c / PMPI_Win_shared_query_c(wh: Handle, rank: c_int, size: *mut isize, disp: *mut isize, baseptr: *mut c_void) {
        let (s, d, b) = shared_query(wh, rank)?;
        raw::put(size, s as isize)?;
        raw::put(disp, d as isize)?;
        raw::put(baseptr as *mut *mut c_void, b as *mut c_void)
    }

    // ---- what a window is ------------------------------------------------------------
    fn MPI_Win_get_group / PMPI_Win_get_group(wh: Handle, g: *mut Handle) {
        let w = win(wh)?;
        raw::put(g, state::new_group(w.world.clone()))
    }
    fn MPI_Win_set_name / PMPI_Win_set_name(wh: Handle, name: *const c_char) {
        let w = win(wh)?;
        *lock(&w.name) = raw::c_str(name)?;
        Ok(())
    }
    fn MPI_Win_get_name / PMPI_Win_get_name(wh: Handle, name: *mut c_char, len: *mut c_int) {
        let n = match wh {
            WIN_NULL => "MPI_WIN_NULL".to_string(),
            _ => lock(&win(wh)?.name).clone(),
        };
        let l = raw::put_str(name, MAX_OBJECT_NAME, &n)?;
        raw::put(len, l)
    }
    fn MPI_Win_set_info / PMPI_Win_set_info(wh: Handle, info: Handle) {
        let w = win(wh)?;
        if let Some(i) = INFOS.get(info) {
            lock(&w.info).0.extend(i.0);
        }
        Ok(())
    }
    fn MPI_Win_get_info / PMPI_Win_get_info(wh: Handle, info: *mut Handle) {
        let w = win(wh)?;
        let i = lock(&w.info).clone();
        raw::put(info, INFOS.insert(i))
    }
    fn MPI_Win_get_attr / PMPI_Win_get_attr(wh: Handle, key: c_int, value: *mut isize, flag: *mut c_int) {
        let w = win(wh)?;
        let v = match key {
            WIN_BASE_KEY => Some(w.peers[w.rank as usize].base as isize),
            WIN_SIZE_KEY => Some(&w.attr_size as *const isize as isize),
            WIN_DISP_UNIT_KEY => Some(&w.attr_disp as *const c_int as isize),
            WIN_CREATE_FLAVOR_KEY => Some(&w.attr_flavor as *const c_int as isize),
            WIN_MODEL_KEY => Some(&w.attr_model as *const c_int as isize),
            _ => {
                crate::attr::check_keyval(key)?;
                lock(&w.attrs).iter().find(|e| e.0 == key).map(|e| e.1)
            }
        };
        match v {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Win_set_attr / PMPI_Win_set_attr(wh: Handle, key: c_int, value: *mut c_void) {
        let w = win(wh)?;
        crate::attr::check_keyval(key)?;
        let old = {
            let mut a = lock(&w.attrs);
            let old = a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1);
            a.push((key, raw::address(value)));
            old
        };
        match old {
            Some(v) => crate::attr::run_delete(wh, key, v),
            None => Ok(()),
        }
    }
    fn MPI_Win_delete_attr / PMPI_Win_delete_attr(wh: Handle, key: c_int) {
        let w = win(wh)?;
        crate::attr::check_keyval(key)?;
        let old = {
            let mut a = lock(&w.attrs);
            a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1)
        };
        match old {
            Some(v) => crate::attr::run_delete(wh, key, v),
            None => Err(Fail::new(ERR_KEYVAL, "the attribute is not set")),
        }
    }

    // ---- error handlers --------------------------------------------------------------
    fn MPI_Win_create_errhandler / PMPI_Win_create_errhandler(f: Option<HandlerFn>, h: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the error handler function is null"))?;
        raw::put(h, state::ERRHANDLERS.insert(f))
    }
    fn MPI_Win_set_errhandler / PMPI_Win_set_errhandler(wh: Handle, h: Handle) {
        let w = win(wh)?;
        if state::handler(h).is_none() {
            return Err(Fail::arg(format!("{h:#x} is not an error handler")));
        }
        w.errh.store(h, Ordering::Relaxed);
        Ok(())
    }
    fn MPI_Win_get_errhandler / PMPI_Win_get_errhandler(wh: Handle, h: *mut Handle) {
        let w = win(wh)?;
        raw::put(h, w.errh.load(Ordering::Relaxed))
    }
    fn MPI_Win_call_errhandler / PMPI_Win_call_errhandler(wh: Handle, code: c_int) {
        win(wh)?;
        err::on_win(None);
        match errhandler_of(wh) {
            state::Handler::Return => Ok(()),
            state::Handler::User(f) => {
                raw::call_errhandler(f, wh, code);
                Ok(())
            }
            state::Handler::Fatal => {
                eprintln!("metampi: MPI_Win_call_errhandler: {} (MPI_ERRORS_ARE_FATAL: the job ends)", err::string_of(code));
                state::abort_job(code.max(1))
            }
        }
    }

    // ---- communication -----------------------------------------------------------------
    fn MPI_Put / PMPI_Put(o: *const c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, wh: Handle) {
        put(o, oc as i64, odt, rank, disp, tc as i64, tdt, wh)
    }
    fn MPI_Put_c / PMPI_Put_c(o: *const c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, wh: Handle) {
        put(o, oc, odt, rank, disp, tc, tdt, wh)
    }
    fn MPI_Rput / PMPI_Rput(o: *const c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, wh: Handle, rq: *mut Handle) {
        put(o, oc as i64, odt, rank, disp, tc as i64, tdt, wh)?;
        done_request(rq)
    }
    fn MPI_Rput_c / PMPI_Rput_c(o: *const c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, wh: Handle, rq: *mut Handle) {
        put(o, oc, odt, rank, disp, tc, tdt, wh)?;
        done_request(rq)
    }
    fn MPI_Get / PMPI_Get(o: *mut c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, wh: Handle) {
        get(o, oc as i64, odt, rank, disp, tc as i64, tdt, wh)
    }
    fn MPI_Get_c / PMPI_Get_c(o: *mut c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, wh: Handle) {
        get(o, oc, odt, rank, disp, tc, tdt, wh)
    }
    fn MPI_Rget / PMPI_Rget(o: *mut c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, wh: Handle, rq: *mut Handle) {
        get(o, oc as i64, odt, rank, disp, tc as i64, tdt, wh)?;
        done_request(rq)
    }
    fn MPI_Rget_c / PMPI_Rget_c(o: *mut c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, wh: Handle, rq: *mut Handle) {
        get(o, oc, odt, rank, disp, tc, tdt, wh)?;
        done_request(rq)
    }
    fn MPI_Accumulate / PMPI_Accumulate(o: *const c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, op: Handle, wh: Handle) {
        accumulate(o, oc as i64, odt, rank, disp, tc as i64, tdt, op, wh)
    }
    fn MPI_Accumulate_c / PMPI_Accumulate_c(o: *const c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, op: Handle, wh: Handle) {
        accumulate(o, oc, odt, rank, disp, tc, tdt, op, wh)
    }
    fn MPI_Raccumulate / PMPI_Raccumulate(o: *const c_void, oc: c_int, odt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, op: Handle, wh: Handle, rq: *mut Handle) {
        accumulate(o, oc as i64, odt, rank, disp, tc as i64, tdt, op, wh)?;
        done_request(rq)
    }
    fn MPI_Raccumulate_c / PMPI_Raccumulate_c(o: *const c_void, oc: i64, odt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, op: Handle, wh: Handle, rq: *mut Handle) {
        accumulate(o, oc, odt, rank, disp, tc, tdt, op, wh)?;
        done_request(rq)
    }
    fn MPI_Get_accumulate / PMPI_Get_accumulate(o: *const c_void, oc: c_int, odt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, op: Handle, wh: Handle) {
        get_accumulate(o, oc as i64, odt, r, rc as i64, rdt, rank, disp, tc as i64, tdt, op, wh)
    }
    fn MPI_Get_accumulate_c / PMPI_Get_accumulate_c(o: *const c_void, oc: i64, odt: Handle, r: *mut c_void, rc: i64, rdt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, op: Handle, wh: Handle) {
        get_accumulate(o, oc, odt, r, rc, rdt, rank, disp, tc, tdt, op, wh)
    }
    fn MPI_Rget_accumulate / PMPI_Rget_accumulate(o: *const c_void, oc: c_int, odt: Handle, r: *mut c_void, rc: c_int, rdt: Handle, rank: c_int, disp: isize, tc: c_int, tdt: Handle, op: Handle, wh: Handle, rq: *mut Handle) {
        get_accumulate(o, oc as i64, odt, r, rc as i64, rdt, rank, disp, tc as i64, tdt, op, wh)?;
        done_request(rq)
    }
    fn MPI_Rget_accumulate_c / PMPI_Rget_accumulate_c(o: *const c_void, oc: i64, odt: Handle, r: *mut c_void, rc: i64, rdt: Handle, rank: c_int, disp: isize, tc: i64, tdt: Handle, op: Handle, wh: Handle, rq: *mut Handle) {
        get_accumulate(o, oc, odt, r, rc, rdt, rank, disp, tc, tdt, op, wh)?;
        done_request(rq)
    }
    fn MPI_Fetch_and_op / PMPI_Fetch_and_op(o: *const c_void, r: *mut c_void, dt: Handle, rank: c_int, disp: isize, op: Handle, wh: Handle) {
        get_accumulate(o, 1, dt, r, 1, dt, rank, disp, 1, dt, op, wh)
    }
    fn MPI_Compare_and_swap / PMPI_Compare_and_swap(o: *const c_void, c: *const c_void, r: *mut c_void, dt: Handle, rank: c_int, disp: isize, wh: Handle) {
        compare_and_swap(o, c, r, dt, rank, disp, wh)
    }

    // ---- synchronisation ---------------------------------------------------------------
    fn MPI_Win_fence / PMPI_Win_fence(assert: c_int, wh: Handle) {
        let w = win(wh)?;
        let flushed = w.flush_touched();
        w.coll.try_barrier()?;
        lock(&w.sync).fence = assert & MODE_NOSUCCEED == 0;
        flushed
    }
    fn MPI_Win_lock / PMPI_Win_lock(kind_: c_int, rank: c_int, _assert: c_int, wh: Handle) {
        let w = win(wh)?;
        let excl = match kind_ {
            LOCK_EXCLUSIVE => true,
            LOCK_SHARED => false,
            k => return Err(Fail::new(ERR_LOCKTYPE, format!("lock type {k} is neither MPI_LOCK_EXCLUSIVE nor MPI_LOCK_SHARED"))),
        };
        if rank == PROC_NULL {
            return Ok(());
        }
        w.check_rank(rank)?;
        {
            let s = lock(&w.sync);
            if s.lock_all || s.locks.contains_key(&rank) {
                return Err(Fail::new(ERR_RMA_SYNC, format!("rank {rank} of the window is locked already by this process")));
            }
        }
        w.call(rank, |tag| Enc::new(kind::LOCK).u64(tag).u64(excl as u64))?;
        lock(&w.sync).locks.insert(rank, kind_);
        Ok(())
    }
    fn MPI_Win_unlock / PMPI_Win_unlock(rank: c_int, wh: Handle) {
        let w = win(wh)?;
        if rank == PROC_NULL {
            return Ok(());
        }
        w.check_rank(rank)?;
        {
            let mut s = lock(&w.sync);
            if s.locks.remove(&rank).is_none() {
                return Err(Fail::new(ERR_RMA_SYNC, format!("rank {rank} of the window is not locked by this process (MPI_Win_lock)")));
            }
            s.touched.remove(&rank);
        }
        w.call(rank, |tag| Enc::new(kind::UNLOCK).u64(tag)).map(|_| ())
    }
    fn MPI_Win_lock_all / PMPI_Win_lock_all(_assert: c_int, wh: Handle) {
        let w = win(wh)?;
        {
            let s = lock(&w.sync);
            if s.lock_all || !s.locks.is_empty() {
                return Err(Fail::new(ERR_RMA_SYNC, "the window is locked already by this process"));
            }
        }
        for r in 0..w.size() {
            w.call(r, |tag| Enc::new(kind::LOCK).u64(tag).u64(0))?;
        }
        lock(&w.sync).lock_all = true;
        Ok(())
    }
    fn MPI_Win_unlock_all / PMPI_Win_unlock_all(wh: Handle) {
        let w = win(wh)?;
        {
            let mut s = lock(&w.sync);
            if !s.lock_all {
                return Err(Fail::new(ERR_RMA_SYNC, "the window is not locked by MPI_Win_lock_all"));
            }
            s.lock_all = false;
            s.touched.clear();
        }
        let mut first = Ok(());
        for r in 0..w.size() {
            let got = w.call(r, |tag| Enc::new(kind::UNLOCK).u64(tag)).map(|_| ());
            if first.is_ok() {
                first = got;
            }
        }
        first
    }
    fn MPI_Win_flush / PMPI_Win_flush(rank: c_int, wh: Handle) {
        flush_one(rank, wh)
    }
    fn MPI_Win_flush_local / PMPI_Win_flush_local(rank: c_int, wh: Handle) {
        flush_one(rank, wh)
    }
    fn MPI_Win_flush_all / PMPI_Win_flush_all(wh: Handle) {
        flush_all(wh)
    }
    fn MPI_Win_flush_local_all / PMPI_Win_flush_local_all(wh: Handle) {
        flush_all(wh)
    }
    fn MPI_Win_sync / PMPI_Win_sync(wh: Handle) {
        win(wh)?;
        // The window's memory is one copy (MPI_WIN_UNIFIED): a memory fence is all it takes.
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
    fn MPI_Win_post / PMPI_Win_post(g: Handle, _assert: c_int, wh: Handle) {
        let w = win(wh)?;
        let origins = w.ranks_of(g)?;
        {
            let mut s = lock(&w.sync);
            if s.exposure.is_some() {
                return Err(Fail::new(ERR_RMA_SYNC, "an exposure epoch (MPI_Win_post) is open already"));
            }
            s.exposure = Some(origins.clone());
        }
        for &o in &origins {
            w.send(o, Enc::new(kind::POST))?;
        }
        Ok(())
    }
    fn MPI_Win_start / PMPI_Win_start(g: Handle, _assert: c_int, wh: Handle) {
        let w = win(wh)?;
        let targets = w.ranks_of(g)?;
        if lock(&w.sync).access.is_some() {
            return Err(Fail::new(ERR_RMA_SYNC, "an access epoch (MPI_Win_start) is open already"));
        }
        for &t in &targets {
            w.mail.wait_for(|m| {
                (m.posts[t as usize] > 0).then(|| m.posts[t as usize] -= 1)
            })?;
        }
        lock(&w.sync).access = Some(targets);
        Ok(())
    }
    fn MPI_Win_complete / PMPI_Win_complete(wh: Handle) {
        let w = win(wh)?;
        let targets = lock(&w.sync).access.take().ok_or_else(|| {
            Fail::new(ERR_RMA_SYNC, "no access epoch (MPI_Win_start) is open")
        })?;
        let flushed = w.flush_touched();
        for &t in &targets {
            w.call(t, |tag| Enc::new(kind::DONE).u64(tag))?;
        }
        flushed
    }
    fn MPI_Win_wait / PMPI_Win_wait(wh: Handle) {
        let w = win(wh)?;
        let origins = lock(&w.sync).exposure.take().ok_or_else(|| {
            Fail::new(ERR_RMA_SYNC, "no exposure epoch (MPI_Win_post) is open")
        })?;
        for &o in &origins {
            w.mail.wait_for(|m| {
                (m.dones[o as usize] > 0).then(|| m.dones[o as usize] -= 1)
            })?;
        }
        Ok(())
    }
    fn MPI_Win_test / PMPI_Win_test(wh: Handle, flag: *mut c_int) {
        let w = win(wh)?;
        let mut s = lock(&w.sync);
        let Some(origins) = s.exposure.clone() else {
            return Err(Fail::new(ERR_RMA_SYNC, "no exposure epoch (MPI_Win_post) is open"));
        };
        let all = {
            let mut m = lock(&w.mail.m);
            let all = origins.iter().all(|&o| m.dones[o as usize] > 0);
            if all {
                for &o in &origins {
                    m.dones[o as usize] -= 1;
                }
            }
            all
        };
        if all {
            s.exposure = None;
        }
        raw::put(flag, all as c_int)
    }
}

fn flush_one(rank: c_int, wh: Handle) -> R {
    let w = win(wh)?;
    if rank == PROC_NULL {
        return Ok(());
    }
    w.check_rank(rank)?;
    if !w.has_passive(rank) {
        return Err(Fail::new(
            ERR_RMA_SYNC,
            format!("rank {rank} of the window is not locked by this process (flushes need a passive-target epoch)"),
        ));
    }
    w.flush(rank)
}

fn flush_all(wh: Handle) -> R {
    let w = win(wh)?;
    {
        let s = lock(&w.sync);
        if !s.lock_all && s.locks.is_empty() {
            return Err(Fail::new(
                ERR_RMA_SYNC,
                "the window is not locked by this process (flushes need a passive-target epoch)",
            ));
        }
    }
    w.flush_touched()
}

/// `(size, displacement unit, base address in this process)` of `rank`'s part of the window.
fn shared_query(wh: Handle, rank: c_int) -> R<(usize, i64, usize)> {
    let w = win(wh)?;
    if rank != PROC_NULL {
        w.check_rank(rank)?;
    }
    let p = match w.flavor {
        WIN_FLAVOR_SHARED if rank == PROC_NULL => w
            .peers
            .iter()
            .find(|p| p.size > 0)
            .copied()
            .unwrap_or(w.peers[0]),
        WIN_FLAVOR_SHARED => w.peers[rank as usize],
        // Other windows share only this process's own memory with it (MPI-4.1 §12.2.3).
        WIN_FLAVOR_CREATE | WIN_FLAVOR_ALLOCATE if rank == w.rank => w.peers[rank as usize],
        _ => Peer {
            base: 0,
            size: 0,
            disp_unit: 1,
        },
    };
    Ok((
        p.size,
        p.disp_unit,
        if p.size == 0 && w.flavor != WIN_FLAVOR_SHARED {
            0
        } else {
            p.base
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode_as_built() {
        let t = Target {
            addr: 24,
            count: 3,
            extent: 16,
            blocks: vec![(0, 4), (8, 4)],
        };
        let m = Enc::new(kind::GET_ACC)
            .u64(7)
            .i64(-3)
            .target(&t)
            .bytes(b"abc");
        let mut d = Dec { b: &m.0, at: 1 };
        assert_eq!(m.0[0], kind::GET_ACC);
        assert_eq!(d.u64(), Some(7));
        assert_eq!(d.i64(), Some(-3));
        assert_eq!(d.target(), Some(t));
        assert_eq!(d.bytes(), Some(&b"abc"[..]));
        assert_eq!(d.u64(), None);
    }

    #[test]
    fn target_ranges_and_span_follow_the_blocks() {
        let t = Target {
            addr: 100,
            count: 2,
            extent: 16,
            blocks: vec![(0, 4), (8, 4)],
        };
        let r: Vec<_> = t.ranges().collect();
        assert_eq!(r, vec![(100, 4), (108, 4), (116, 4), (124, 4)]);
        assert_eq!(t.span(), Some((100, 128)));
        assert_eq!(t.bytes(), 16);
        let none = Target { count: 0, ..t };
        assert_eq!(none.span(), None);
    }

    #[test]
    fn gather_and_scatter_are_inverse() {
        let mut mem = [0u8; 32];
        let base = mem.as_mut_ptr() as usize;
        let t = Target {
            addr: 2,
            count: 2,
            extent: 8,
            blocks: vec![(0, 2), (4, 1)],
        };
        scatter(base, &t, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&mem[..12], &[0, 0, 1, 2, 0, 0, 3, 0, 0, 0, 4, 5]);
        assert_eq!(mem[14], 6);
        assert_eq!(gather(base, &t), vec![1, 2, 3, 4, 5, 6]);
    }
}
