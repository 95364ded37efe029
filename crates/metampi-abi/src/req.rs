//! Requests (MPI-4 §3.7, §3.9): the table behind `MPI_Request` handles, and
//! the wait/test family, cancel and persistent requests over it.
//!
//! A request is taken out of the table while a thread waits on it (MPI lets
//! only one thread complete a request), so a blocked wait holds no lock.

use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use metampi::point_to_point::Status;
use metampi::request::abi::{done_indices, wait_any_index, RawRequest};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state::{check_init, CommRef};

/// MPICH's 20-byte `MPI_Status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[cfg(not(std_abi))]
pub struct CStatus {
    pub count_lo: c_int,
    pub count_hi_and_cancelled: c_int,
    pub source: c_int,
    pub tag: c_int,
    pub error: c_int,
}

/// `MPI_Status` of the standard ABI: source, tag and error first, then five
/// words of the library's own (here the byte count and the cancelled bit).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[cfg(std_abi)]
pub struct CStatus {
    pub source: c_int,
    pub tag: c_int,
    pub error: c_int,
    pub count_lo: c_int,
    pub count_hi_and_cancelled: c_int,
    pub reserved: [c_int; 3],
}

impl CStatus {
    /// A status with these fields (the rest zero).
    pub fn new(source: c_int, tag: c_int, error: c_int, bytes: u64, cancelled: bool) -> CStatus {
        CStatus {
            count_lo: bytes as u32 as c_int,
            count_hi_and_cancelled: (((bytes >> 32) as c_int) << 1) | cancelled as c_int,
            source,
            tag,
            error,
            #[cfg(std_abi)]
            reserved: [0; 3],
        }
    }
}

/// What a completed operation reports.
#[derive(Clone, Copy, Debug)]
pub struct St {
    pub source: c_int,
    pub tag: c_int,
    pub bytes: usize,
    pub cancelled: bool,
}

impl St {
    /// The empty status of a null or inactive request (MPI-4 §3.7.3).
    pub const NONE: St = St {
        source: ANY_SOURCE,
        tag: ANY_TAG,
        bytes: 0,
        cancelled: false,
    };

    /// The status of an operation with the null process, or of a send.
    pub const EMPTY: St = St {
        source: PROC_NULL,
        tag: ANY_TAG,
        bytes: 0,
        cancelled: false,
    };

    pub fn of(s: &Status) -> St {
        St {
            source: s.source_rank(),
            tag: s.tag(),
            bytes: s.byte_count(),
            cancelled: s.is_cancelled(),
        }
    }

    /// Writes this status where `p` points, unless it is `MPI_STATUS_IGNORE`.
    pub fn write(&self, p: *mut CStatus, error: c_int) {
        if raw::status_ignored(p) {
            return;
        }
        raw::put_opt(
            p,
            CStatus::new(
                self.source,
                self.tag,
                error,
                self.bytes as u64,
                self.cancelled,
            ),
        );
    }
}

/// Bytes a status counts.
pub fn status_bytes(s: &CStatus) -> u64 {
    (s.count_lo as u32 as u64) | (((s.count_hi_and_cancelled as u32 >> 1) as u64) << 32)
}

/// What a persistent request starts each time.
#[derive(Clone)]
pub enum Spec {
    /// A persistent collective (`MPI_Bcast_init` and kin): the nonblocking
    /// operation each `MPI_Start` begins, over the arguments captured at init.
    Op(Arc<dyn Fn() -> R<Req> + Send + Sync>),
    /// A partitioned send (`MPI_Psend_init`): the send goes when every partition
    /// has been marked ready since the last start.
    Psend { send: Box<Spec>, ready: Vec<bool> },
    Send {
        buf: raw::CBuf,
        dest: c_int,
        tag: c_int,
        comm: CommRef,
        mode: metampi::point_to_point::Mode,
    },
    Recv {
        buf: raw::CBuf,
        source: c_int,
        tag: c_int,
        comm: CommRef,
    },
}

/// A request as the table holds it.
pub enum Req {
    /// In flight in the engine, with what must outlive it.
    Live {
        r: RawRequest,
        keep: Vec<Box<dyn Any + Send>>,
    },
    /// Complete since it started (the null process, a send the transport took,
    /// a collective done at once), with its result.
    Done(St, c_int),
    /// Persistent: what it does, and the operation it has under way.
    Persistent {
        spec: Spec,
        active: Option<Box<Req>>,
    },
    /// Operations that complete as one (`MPI_Isendrecv`, neighbourhood
    /// collectives); the request's status is that of the part marked `true`.
    Multi {
        parts: Vec<(bool, Req)>,
        st: St,
        fail: Option<Fail>,
    },
    /// A generalized request (`MPI_Grequest_start`): the program completes it.
    Gen(Arc<Greq>),
    /// A started partitioned send with partitions not yet ready.
    Pending,
}

/// The callbacks of a generalized request, as `MPI_Grequest_start` takes them.
pub type QueryFn = unsafe extern "C" fn(*mut c_void, *mut CStatus) -> c_int;
pub type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type CancelFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// A generalized request: the program's callbacks and state, and whether
/// `MPI_Grequest_complete` has been called (a waiting thread sleeps on `cv`).
pub struct Greq {
    query: Option<QueryFn>,
    free: Option<FreeFn>,
    cancel: Option<CancelFn>,
    extra: raw::Shared<*mut c_void>,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Greq {
    fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The status the program's query function gives, then its free function.
    fn finish(&self) -> (St, Option<Fail>) {
        let mut cs = CStatus::new(PROC_NULL, ANY_TAG, SUCCESS, 0, false);
        let mut fail = None;
        if let Some(q) = self.query {
            let rc = raw::call_grequest_query(q, self.extra.get(), &mut cs);
            if rc != SUCCESS {
                fail = Some(Fail::new(
                    rc,
                    "the generalized request's query function failed",
                ));
            }
        }
        if let Some(f) = self.free {
            let rc = raw::call_grequest_free(f, self.extra.get());
            if rc != SUCCESS && fail.is_none() {
                fail = Some(Fail::new(
                    rc,
                    "the generalized request's free function failed",
                ));
            }
        }
        if cs.error != SUCCESS && fail.is_none() {
            fail = Some(Fail::new(cs.error, "the generalized request failed"));
        }
        let st = St {
            source: cs.source,
            tag: cs.tag,
            bytes: status_bytes(&cs) as usize,
            cancelled: cs.count_hi_and_cancelled & 1 != 0,
        };
        (st, fail)
    }
}

/// Starts a generalized request.
pub fn grequest(
    query: Option<QueryFn>,
    free: Option<FreeFn>,
    cancel: Option<CancelFn>,
    extra: *mut c_void,
) -> Handle {
    let g = Arc::new(Greq {
        query,
        free,
        cancel,
        extra: raw::Shared(extra),
        done: Mutex::new(false),
        cv: Condvar::new(),
    });
    let h = insert(Req::Gen(g.clone()));
    GREQS.lock().unwrap_or_else(|p| p.into_inner()).push((h, g));
    h
}

/// Generalized requests not yet completed by the program, by handle: found here
/// by `MPI_Grequest_complete` even while a waiting thread holds the request.
static GREQS: Mutex<Vec<(Handle, Arc<Greq>)>> = Mutex::new(Vec::new());

/// `MPI_Grequest_complete`: marks `h` complete and wakes its waiter.
pub fn grequest_complete(h: Handle) -> R {
    let g = {
        let mut v = GREQS.lock().unwrap_or_else(|p| p.into_inner());
        let k = v.iter().position(|(x, _)| *x == h).ok_or_else(|| {
            Fail::new(
                ERR_REQUEST,
                format!("{h:#x} is not a generalized request in progress"),
            )
        })?;
        v.swap_remove(k).1
    };
    *g.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
    g.cv.notify_all();
    // One the program freed before completing it is finished now.
    let orphan = {
        let mut f = FREED_GEN.lock().unwrap_or_else(|p| p.into_inner());
        f.iter()
            .position(|x| Arc::ptr_eq(x, &g))
            .map(|k| f.swap_remove(k))
    };
    if let Some(o) = orphan {
        let _ = o.finish();
    }
    Ok(())
}

/// Generalized requests freed by the program before it completed them.
static FREED_GEN: Mutex<Vec<Arc<Greq>>> = Mutex::new(Vec::new());

// SAFETY-free marker: RawRequest holds engine ids and C pointers that the engine
// may use from any thread; the Rust request type is Send already.
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<RawRequest>();
}

/// The request table: handles `REQUEST_BASE | index`.
struct Slots {
    slots: Vec<Option<Req>>,
    free: Vec<usize>,
}

static REQS: Mutex<Slots> = Mutex::new(Slots {
    slots: Vec::new(),
    free: Vec::new(),
});

/// The handle of a send that completed as it started: it needs no slot in the
/// table (most small nonblocking sends), and waiting on it returns at once.
pub const REQUEST_SENT: Handle = (REQUEST_BASE | INDEX_MASK) as Handle;

fn index(h: Handle) -> Option<usize> {
    let u = h as u32;
    (u & !INDEX_MASK == REQUEST_BASE && h != REQUEST_SENT).then_some((u & INDEX_MASK) as usize)
}

pub fn insert(r: Req) -> Handle {
    let mut g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    let i = match g.free.pop() {
        Some(i) => {
            g.slots[i] = Some(r);
            i
        }
        None => {
            g.slots.push(Some(r));
            g.slots.len() - 1
        }
    };
    (REQUEST_BASE | i as u32) as Handle
}

fn take(h: Handle) -> R<Req> {
    if h == REQUEST_SENT {
        return Ok(Req::Done(St::EMPTY, SUCCESS));
    }
    let mut g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    index(h)
        .and_then(|i| g.slots.get_mut(i)?.take())
        .ok_or_else(|| Fail::new(ERR_REQUEST, format!("{h:#x} is not an active request")))
}

/// Takes request `h` out for a wait: a non-persistent one's slot is freed in the
/// same step (a wait completes it whatever happens), a persistent one's is kept for
/// [`put_back`].
fn take_for_wait(h: Handle) -> R<Req> {
    if h == REQUEST_SENT {
        return Ok(Req::Done(St::EMPTY, SUCCESS));
    }
    let mut g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    let i = index(h).ok_or_else(|| Fail::new(ERR_REQUEST, format!("{h:#x} is not a request")))?;
    match g.slots.get_mut(i) {
        Some(slot @ Some(Req::Persistent { .. })) => Ok(slot.take().expect("matched Some")),
        Some(slot @ Some(_)) => {
            let r = slot.take().expect("matched Some");
            g.free.push(i);
            Ok(r)
        }
        _ => Err(Fail::new(
            ERR_REQUEST,
            format!("{h:#x} is not an active request"),
        )),
    }
}

fn put_back(h: Handle, r: Req) {
    if let Some(i) = index(h) {
        let mut g = REQS.lock().unwrap_or_else(|p| p.into_inner());
        g.slots[i] = Some(r);
    }
}

fn release(h: Handle) {
    if let Some(i) = index(h) {
        let mut g = REQS.lock().unwrap_or_else(|p| p.into_inner());
        g.slots[i] = None;
        g.free.push(i);
    }
}

/// A new request handle for a request in flight.
pub fn live(r: RawRequest, keep: Vec<Box<dyn Any + Send>>) -> Handle {
    insert(Req::Live { r, keep })
}

/// A handle for a request as an operation started it: [`REQUEST_SENT`] for a send
/// already complete, a table slot otherwise.
pub fn handle_of(r: Req) -> Handle {
    match r {
        Req::Live { r, keep } if keep.is_empty() && r.is_sent() => match r.try_wait() {
            Ok(_) => REQUEST_SENT,
            Err(e) => insert(Req::Done(St::EMPTY, Fail::from(e).class)),
        },
        r => insert(r),
    }
}

/// Takes the request behind handle `h` out of the table for good (an operation a
/// function started through a handle, to become part of another request).
pub fn take_out(h: Handle) -> R<Req> {
    let r = take(h)?;
    release(h);
    Ok(r)
}

/// A new request handle for an operation already complete.
pub fn done(st: St) -> Handle {
    insert(Req::Done(st, SUCCESS))
}

/// Waits for `r`; returns its status and error class (SUCCESS or the failure).
fn wait_req(r: Req) -> (St, Option<Fail>) {
    match r {
        Req::Live { r, keep } => {
            let out = r.try_wait();
            drop(keep);
            match out {
                Ok(s) => (St::of(&s), None),
                Err(e) => (St::EMPTY, Some(e.into())),
            }
        }
        Req::Done(st, SUCCESS) => (st, None),
        Req::Done(st, class) => (st, Some(Fail::new(class, "the operation failed"))),
        Req::Persistent { .. } => (St::NONE, None),
        Req::Pending => (
            St::EMPTY,
            Some(Fail::new(
                ERR_REQUEST,
                "a partitioned send was waited for before every partition was marked ready",
            )),
        ),
        Req::Multi {
            parts,
            mut st,
            mut fail,
        } => {
            for (mine, p) in parts {
                let (s, f) = wait_req(p);
                if mine {
                    st = s;
                }
                fail = fail.or(f);
            }
            (st, fail)
        }
        Req::Gen(g) => {
            let mut d = g.done.lock().unwrap_or_else(|p| p.into_inner());
            while !*d {
                d = g.cv.wait(d).unwrap_or_else(|p| p.into_inner());
            }
            drop(d);
            g.finish()
        }
    }
}

/// One progress pass on `r`: its result if complete, or `r` back.
// The request comes back by value to go straight back into its table slot.
#[allow(clippy::result_large_err)]
fn test_req(r: Req) -> Result<(St, Option<Fail>), Req> {
    match r {
        Req::Live { r, keep } => match r.try_test() {
            Ok(out) => {
                drop(keep);
                Ok(match out {
                    Ok(s) => (St::of(&s), None),
                    Err(e) => (St::EMPTY, Some(e.into())),
                })
            }
            Err(r) => Err(Req::Live { r, keep }),
        },
        Req::Multi {
            parts,
            mut st,
            mut fail,
        } => {
            let mut left = Vec::new();
            for (mine, p) in parts {
                match test_req(p) {
                    Ok((s, f)) => {
                        if mine {
                            st = s;
                        }
                        fail = fail.or(f);
                    }
                    Err(p) => left.push((mine, p)),
                }
            }
            match left.is_empty() {
                true => Ok((st, fail)),
                false => Err(Req::Multi {
                    parts: left,
                    st,
                    fail,
                }),
            }
        }
        Req::Gen(g) if !g.is_done() => Err(Req::Gen(g)),
        Req::Pending => Err(Req::Pending),
        done => Ok(wait_req(done)),
    }
}

/// Waits for a request that never got a handle.
pub fn wait_now(r: Req) -> R<St> {
    finish(wait_req(r))
}

/// Completes request `h` by waiting: frees it (or makes a persistent one inactive).
pub fn wait_handle(h: Handle) -> R<St> {
    wait_handle_p(h).0
}

/// [`wait_handle`], and whether `h` was persistent (its handle stays valid).
pub fn wait_handle_p(h: Handle) -> (R<St>, bool) {
    if h == REQUEST_NULL || h == REQUEST_SENT {
        return (Ok(St::NONE), false);
    }
    let r = match take_for_wait(h) {
        Ok(r) => r,
        Err(e) => return (Err(e), false),
    };
    match r {
        Req::Persistent { spec, active } => {
            let out = active.map(|a| wait_req(*a)).unwrap_or((St::NONE, None));
            put_back(h, Req::Persistent { spec, active: None });
            (finish(out), true)
        }
        r => (finish(wait_req(r)), false),
    }
}

fn finish((st, fail): (St, Option<Fail>)) -> R<St> {
    match fail {
        Some(f) => Err(f),
        None => Ok(st),
    }
}

/// Tests request `h`: `Some(status)` when complete (and freed or made inactive).
pub fn test_handle(h: Handle) -> R<Option<St>> {
    if h == REQUEST_NULL {
        return Ok(Some(St::NONE));
    }
    match take(h)? {
        Req::Persistent { spec, active } => match active {
            None => {
                put_back(h, Req::Persistent { spec, active: None });
                Ok(Some(St::NONE))
            }
            Some(a) => match test_req(*a) {
                Ok(out) => {
                    put_back(h, Req::Persistent { spec, active: None });
                    finish(out).map(Some)
                }
                Err(a) => {
                    put_back(
                        h,
                        Req::Persistent {
                            spec,
                            active: Some(Box::new(a)),
                        },
                    );
                    Ok(None)
                }
            },
        },
        r => match test_req(r) {
            Ok(out) => {
                release(h);
                finish(out).map(Some)
            }
            Err(r) => {
                put_back(h, r);
                Ok(None)
            }
        },
    }
}

/// Whether handle `h` is a request with nothing under way (null, or inactive persistent).
fn inactive(h: Handle) -> bool {
    if h == REQUEST_NULL {
        return true;
    }
    let g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    matches!(
        index(h).and_then(|i| g.slots.get(i)?.as_ref()),
        Some(Req::Persistent { active: None, .. })
    )
}

/// Blocks until one of the active requests among `hs` completes; returns its position.
fn wait_any_of(hs: &[Handle]) -> R<Option<usize>> {
    let act: Vec<usize> = (0..hs.len()).filter(|&k| !inactive(hs[k])).collect();
    if act.is_empty() {
        return Ok(None);
    }
    let mut nap = Duration::from_micros(50);
    loop {
        if let Some(&k) = done_now(hs).first() {
            return Ok(Some(k));
        }
        // Take the requests out, block in the engine until one of their operations
        // completes, put them back. A multi-part request is complete only when all its
        // parts are, and a generalized one when the program says so: both are looked
        // at again on the next pass.
        let mut taken: Vec<(usize, Req)> = Vec::with_capacity(act.len());
        for &k in &act {
            match take(hs[k]) {
                Ok(r) => taken.push((k, r)),
                Err(e) => {
                    for (k, r) in taken {
                        put_back(hs[k], r);
                    }
                    return Err(e);
                }
            }
        }
        let generalized = taken.iter().any(|(_, r)| has_gen(r));
        let mut raws: Vec<(usize, bool, &RawRequest)> = Vec::new();
        for (k, r) in &taken {
            let whole = !matches!(r, Req::Multi { .. })
                && !matches!(r, Req::Persistent { active: Some(a), .. } if matches!(**a, Req::Multi { .. }));
            let mut v = Vec::new();
            raws_of(r, &mut v);
            raws.extend(v.into_iter().map(|x| (*k, whole, x)));
        }
        let mut ready = None;
        if generalized {
            // The program completes these from another thread: look again shortly.
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        } else if !raws.is_empty() {
            let refs: Vec<&RawRequest> = raws.iter().map(|x| x.2).collect();
            ready = wait_any_index(&refs).and_then(|i| raws[i].1.then_some(raws[i].0));
        }
        for (k, r) in taken {
            put_back(hs[k], r);
        }
        if ready.is_some() {
            return Ok(ready);
        }
    }
}

/// The engine requests under way in `r`.
fn raws_of<'a>(r: &'a Req, out: &mut Vec<&'a RawRequest>) {
    match r {
        Req::Live { r, .. } => out.push(r),
        Req::Persistent {
            active: Some(a), ..
        } => raws_of(a, out),
        Req::Multi { parts, .. } => parts.iter().for_each(|(_, p)| raws_of(p, out)),
        _ => {}
    }
}

fn has_gen(r: &Req) -> bool {
    match r {
        Req::Gen(_) => true,
        Req::Persistent {
            active: Some(a), ..
        } => has_gen(a),
        _ => false,
    }
}

fn live_of(r: &Req) -> Option<&RawRequest> {
    match r {
        Req::Live { r, .. } => Some(r),
        Req::Persistent {
            active: Some(a), ..
        } => live_of(a),
        _ => None,
    }
}

/// Whether `r` needs a test of its own to know it is complete (no single engine request).
fn composite(r: &Req) -> bool {
    match r {
        Req::Multi { .. } | Req::Gen(_) => true,
        Req::Persistent {
            active: Some(a), ..
        } => composite(a),
        _ => false,
    }
}

/// Tests the composite request `h`; when complete its result is kept in its slot as a
/// finished request. Returns whether it is complete.
fn settle(h: Handle) -> bool {
    let Ok(r) = take(h) else {
        return false;
    };
    let finished = |out: (St, Option<Fail>)| {
        Box::new(Req::Done(
            out.0,
            out.1.as_ref().map_or(SUCCESS, |f| f.class),
        ))
    };
    match r {
        Req::Persistent {
            spec,
            active: Some(a),
        } => match test_req(*a) {
            Ok(out) => {
                put_back(
                    h,
                    Req::Persistent {
                        spec,
                        active: Some(finished(out)),
                    },
                );
                true
            }
            Err(a) => {
                put_back(
                    h,
                    Req::Persistent {
                        spec,
                        active: Some(Box::new(a)),
                    },
                );
                false
            }
        },
        r => match test_req(r) {
            Ok(out) => {
                put_back(h, *finished(out));
                true
            }
            Err(r) => {
                put_back(h, r);
                false
            }
        },
    }
}

/// Positions of the active requests among `hs` that are complete now.
fn done_now(hs: &[Handle]) -> Vec<usize> {
    let g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    let mut raws = Vec::new();
    let mut composites = Vec::new();
    for (k, &h) in hs.iter().enumerate() {
        if h == REQUEST_SENT {
            out.push(k);
            continue;
        }
        let Some(r) = index(h).and_then(|i| g.slots.get(i)?.as_ref()) else {
            continue;
        };
        match r {
            Req::Done(..) => out.push(k),
            Req::Persistent {
                active: Some(a), ..
            } if matches!(**a, Req::Done(..)) => out.push(k),
            r if composite(r) => composites.push(k),
            _ => {
                if let Some(x) = live_of(r) {
                    raws.push((k, x));
                }
            }
        }
    }
    let refs: Vec<&RawRequest> = raws.iter().map(|x| x.1).collect();
    for i in done_indices(&refs) {
        out.push(raws[i].0);
    }
    drop(g);
    for k in composites {
        if settle(hs[k]) {
            out.push(k);
        }
    }
    out.sort_unstable();
    out
}

/// Starts persistent request `h`.
fn start(h: Handle) -> R {
    let r = take(h)?;
    let Req::Persistent { mut spec, active } = r else {
        put_back(h, r);
        return Err(Fail::new(
            ERR_REQUEST,
            "MPI_Start needs a persistent request",
        ));
    };
    if active.is_some() {
        put_back(h, Req::Persistent { spec, active });
        return Err(Fail::new(
            ERR_REQUEST,
            "the persistent request is already active",
        ));
    }
    let begun = match &mut spec {
        Spec::Psend { ready, send } => {
            ready.iter_mut().for_each(|r| *r = false);
            match ready.is_empty() {
                // A partitioned send of no partitions has nothing to wait for.
                true => begin(send),
                false => Ok(Req::Pending),
            }
        }
        spec => begin(spec),
    };
    match begun {
        Ok(a) => {
            put_back(
                h,
                Req::Persistent {
                    spec,
                    active: Some(Box::new(a)),
                },
            );
            Ok(())
        }
        Err(e) => {
            put_back(h, Req::Persistent { spec, active: None });
            Err(e)
        }
    }
}

/// Begins the operation `spec` describes.
fn begin(spec: &Spec) -> R<Req> {
    match spec {
        Spec::Send {
            buf,
            dest,
            tag,
            comm,
            mode,
        } => crate::p2p::start_send(comm, *buf, *dest, *tag, *mode),
        Spec::Recv {
            buf,
            source,
            tag,
            comm,
        } => crate::p2p::start_recv(comm, *buf, *source, *tag),
        Spec::Op(f) => f(),
        Spec::Psend { send, .. } => begin(send),
    }
}

/// `MPI_Pready` and kin: marks partitions of the partitioned send `h` ready; the send
/// goes when all are.
pub fn pready(h: Handle, parts: impl IntoIterator<Item = c_int>) -> R {
    let r = take(h)?;
    let (mut spec, active) = match r {
        Req::Persistent {
            spec: spec @ Spec::Psend { .. },
            active: Some(a),
        } if matches!(*a, Req::Pending) => (spec, a),
        r => {
            put_back(h, r);
            return Err(Fail::new(
                ERR_REQUEST,
                "MPI_Pready needs a started partitioned send whose partitions are not all ready",
            ));
        }
    };
    let Spec::Psend { ready, send } = &mut spec else {
        unreachable!("matched a partitioned send above")
    };
    for p in parts {
        match ready.get_mut(p as usize).filter(|_| p >= 0) {
            Some(r) => *r = true,
            None => {
                let n = ready.len();
                put_back(
                    h,
                    Req::Persistent {
                        spec,
                        active: Some(active),
                    },
                );
                return Err(Fail::arg(format!(
                    "partition {p} is not one of the send's {n}"
                )));
            }
        }
    }
    let active = match ready.iter().all(|&r| r) {
        true => match begin(send) {
            Ok(a) => Box::new(a),
            Err(e) => {
                put_back(h, Req::Persistent { spec, active: None });
                return Err(e);
            }
        },
        false => active,
    };
    put_back(
        h,
        Req::Persistent {
            spec,
            active: Some(active),
        },
    );
    Ok(())
}

/// `MPI_Parrived`: whether the partitioned receive `h` has its data (this
/// implementation delivers all partitions at once).
pub fn parrived(h: Handle) -> R<bool> {
    match take(h)? {
        r @ Req::Persistent { active: None, .. } => {
            put_back(h, r);
            Ok(true)
        }
        r @ Req::Persistent { .. } => {
            put_back(h, r);
            Ok(settle(h))
        }
        r => {
            put_back(h, r);
            Err(Fail::new(
                ERR_REQUEST,
                "MPI_Parrived needs a partitioned receive",
            ))
        }
    }
}

/// Waits for `*h` and writes its status to element `i` of `sts` (unless ignored); the
/// handle becomes `MPI_REQUEST_NULL` unless persistent. Returns whether it failed (its
/// error code is then in the status).
fn complete_into(h: &mut Handle, sts: *mut CStatus, i: usize) -> bool {
    let (st, persistent) = wait_handle_p(*h);
    let failed = match st {
        Ok(st) => {
            st.write(raw::status_at(sts, i), SUCCESS);
            false
        }
        Err(f) => {
            let code = crate::err::raise_quiet(f);
            St::EMPTY.write(raw::status_at(sts, i), code);
            true
        }
    };
    if !persistent {
        *h = REQUEST_NULL;
    }
    failed
}

mpi! {
    fn MPI_Wait / PMPI_Wait(req: *mut Handle, status: *mut CStatus) {
        check_init()?;
        let h = raw::get(req)?;
        let known = exists(h);
        let (st, persistent) = wait_handle_p(h);
        // A request that completed with an error is gone too.
        if known && !persistent {
            raw::put(req, REQUEST_NULL)?;
        }
        st?.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Test / PMPI_Test(req: *mut Handle, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        let h = raw::get(req)?;
        // One look at the table: whether `h` is a request at all, and a persistent one.
        let found = lookup(h);
        let persistent = found == Some(true);
        let out = test_handle(h);
        if out.is_err() && found == Some(false) && !exists(h) {
            raw::put(req, REQUEST_NULL)?;
        }
        match out? {
            Some(st) => {
                if !persistent {
                    raw::put(req, REQUEST_NULL)?;
                }
                st.write(status, SUCCESS);
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Waitall / PMPI_Waitall(n: c_int, reqs: *mut Handle, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        let mut failed = false;
        for (i, h) in hs.iter_mut().enumerate() {
            failed |= complete_into(h, sts, i);
        }
        if failed {
            return Err(Fail::new(ERR_IN_STATUS, "a request failed; its status says how"));
        }
        Ok(())
    }
    fn MPI_Testall / PMPI_Testall(n: c_int, reqs: *mut Handle, flag: *mut c_int, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        let act: Vec<usize> = (0..hs.len()).filter(|&k| !inactive(hs[k])).collect();
        let done = done_now(hs);
        if act.iter().any(|k| !done.contains(k)) {
            return raw::put(flag, 0);
        }
        PMPI_Waitall(n, reqs, sts);
        raw::put(flag, 1)
    }
    fn MPI_Waitany / PMPI_Waitany(n: c_int, reqs: *mut Handle, index: *mut c_int, status: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        match wait_any_of(hs)? {
            None => {
                raw::put(index, UNDEFINED)?;
                St::NONE.write(status, SUCCESS);
                Ok(())
            }
            Some(k) => {
                let persistent = is_persistent(hs[k]);
                let st = wait_handle(hs[k]);
                if !persistent {
                    hs[k] = REQUEST_NULL;
                }
                raw::put(index, k as c_int)?;
                st?.write(status, SUCCESS);
                Ok(())
            }
        }
    }
    fn MPI_Testany / PMPI_Testany(n: c_int, reqs: *mut Handle, index: *mut c_int, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        if (0..hs.len()).all(|k| inactive(hs[k])) {
            raw::put(index, UNDEFINED)?;
            St::NONE.write(status, SUCCESS);
            return raw::put(flag, 1);
        }
        match done_now(hs).first() {
            None => {
                raw::put(index, UNDEFINED)?;
                raw::put(flag, 0)
            }
            Some(&k) => {
                let persistent = is_persistent(hs[k]);
                let st = wait_handle(hs[k]);
                if !persistent {
                    hs[k] = REQUEST_NULL;
                }
                raw::put(index, k as c_int)?;
                raw::put(flag, 1)?;
                st?.write(status, SUCCESS);
                Ok(())
            }
        }
    }
    fn MPI_Waitsome / PMPI_Waitsome(n: c_int, reqs: *mut Handle, outcount: *mut c_int, indices: *mut c_int, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        if wait_any_of(hs)?.is_none() {
            return raw::put(outcount, UNDEFINED);
        }
        some(hs, outcount, indices, sts)
    }
    fn MPI_Testsome / PMPI_Testsome(n: c_int, reqs: *mut Handle, outcount: *mut c_int, indices: *mut c_int, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice_mut(reqs, n)?;
        if (0..hs.len()).all(|k| inactive(hs[k])) {
            return raw::put(outcount, UNDEFINED);
        }
        some(hs, outcount, indices, sts)
    }
    fn MPI_Request_free / PMPI_Request_free(req: *mut Handle) {
        let h = raw::get(req)?;
        let r = take(h)?;
        release(h);
        abandon(r);
        reap_freed();
        raw::put(req, REQUEST_NULL)
    }
    fn MPI_Request_get_status / PMPI_Request_get_status(h: Handle, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        known(&[h])?;
        if inactive(h) {
            St::NONE.write(status, SUCCESS);
            return raw::put(flag, 1);
        }
        let done = !done_now(&[h]).is_empty();
        if done {
            let (st, fail) = peek_done(h)?;
            if let Some(f) = fail {
                return Err(f);
            }
            st.write(status, SUCCESS);
        }
        raw::put(flag, done as c_int)
    }
    // MPI-4.1 §3.7: testall, testany and testsome that leave every request as it is (none
    // freed, none made inactive); null and inactive requests count as complete and empty.
    fn MPI_Request_get_status_all / PMPI_Request_get_status_all(n: c_int, reqs: *const Handle, flag: *mut c_int, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice(reqs, n)?;
        known(hs)?;
        let mut complete: Vec<bool> = hs.iter().map(|&h| inactive(h)).collect();
        for k in done_now(hs) {
            complete[k] = true;
        }
        if complete.contains(&false) {
            return raw::put(flag, 0);
        }
        let mut failed = false;
        for (k, &h) in hs.iter().enumerate() {
            let (st, fail) = match inactive(h) {
                true => (St::NONE, None),
                false => peek_done(h)?,
            };
            failed |= write_result(st, fail, sts, k);
        }
        raw::put(flag, 1)?;
        if failed {
            return Err(Fail::new(ERR_IN_STATUS, "a request failed; its status says how"));
        }
        Ok(())
    }
    fn MPI_Request_get_status_any / PMPI_Request_get_status_any(n: c_int, reqs: *const Handle, index: *mut c_int, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        let hs = raw::slice(reqs, n)?;
        known(hs)?;
        if hs.iter().all(|&h| inactive(h)) {
            raw::put(index, UNDEFINED)?;
            St::NONE.write(status, SUCCESS);
            return raw::put(flag, 1);
        }
        let Some(&k) = done_now(hs).first() else {
            raw::put(index, UNDEFINED)?;
            return raw::put(flag, 0);
        };
        let (st, fail) = peek_done(hs[k])?;
        raw::put(index, k as c_int)?;
        raw::put(flag, 1)?;
        if let Some(f) = fail {
            return Err(f);
        }
        st.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Request_get_status_some / PMPI_Request_get_status_some(n: c_int, reqs: *const Handle, outcount: *mut c_int, indices: *mut c_int, sts: *mut CStatus) {
        check_init()?;
        let hs = raw::slice(reqs, n)?;
        known(hs)?;
        if hs.iter().all(|&h| inactive(h)) {
            return raw::put(outcount, UNDEFINED);
        }
        let done = done_now(hs);
        let idx = raw::slice_mut(indices, done.len() as c_int)?;
        let mut failed = false;
        for (j, &k) in done.iter().enumerate() {
            let (st, fail) = peek_done(hs[k])?;
            failed |= write_result(st, fail, sts, j);
            idx[j] = k as c_int;
        }
        raw::put(outcount, done.len() as c_int)?;
        if failed {
            return Err(Fail::new(ERR_IN_STATUS, "a request failed; its status says how"));
        }
        Ok(())
    }
    fn MPI_Cancel / PMPI_Cancel(req: *mut Handle) {
        let h = raw::get(req)?;
        let r = take(h)?;
        let out = cancel(&r);
        put_back(h, r);
        out?;
        Ok(())
    }
    // MPI-4.1 §3.2: the fields of a status by function, for languages and tools that do
    // not know its layout (which differs between MPICH's ABI and the standard's).
    fn MPI_Status_get_source / PMPI_Status_get_source(status: *const CStatus, source: *mut c_int) {
        raw::put(source, status_in(status)?.source)
    }
    fn MPI_Status_set_source / PMPI_Status_set_source(status: *mut CStatus, source: c_int) {
        edit_status(status, |s| s.source = source)
    }
    fn MPI_Status_get_tag / PMPI_Status_get_tag(status: *const CStatus, tag: *mut c_int) {
        raw::put(tag, status_in(status)?.tag)
    }
    fn MPI_Status_set_tag / PMPI_Status_set_tag(status: *mut CStatus, tag: c_int) {
        edit_status(status, |s| s.tag = tag)
    }
    fn MPI_Status_get_error / PMPI_Status_get_error(status: *const CStatus, error: *mut c_int) {
        raw::put(error, status_in(status)?.error)
    }
    fn MPI_Status_set_error / PMPI_Status_set_error(status: *mut CStatus, error: c_int) {
        edit_status(status, |s| s.error = error)
    }
    fn MPI_Test_cancelled / PMPI_Test_cancelled(status: *const CStatus, flag: *mut c_int) {
        let s = raw::get(status)?;
        raw::put(flag, s.count_hi_and_cancelled & 1)
    }
    fn MPI_Start / PMPI_Start(req: *mut Handle) {
        check_init()?;
        start(raw::get(req)?)
    }
    fn MPI_Grequest_start / PMPI_Grequest_start(query: Option<QueryFn>, free: Option<FreeFn>, cancel: Option<CancelFn>, extra: *mut c_void, req: *mut Handle) {
        check_init()?;
        raw::put(req, grequest(query, free, cancel, extra))
    }
    fn MPI_Grequest_complete / PMPI_Grequest_complete(req: Handle) {
        check_init()?;
        grequest_complete(req)
    }
    fn MPI_Pready / PMPI_Pready(partition: c_int, req: Handle) {
        check_init()?;
        pready(req, [partition])
    }
    fn MPI_Pready_range / PMPI_Pready_range(lo: c_int, hi: c_int, req: Handle) {
        check_init()?;
        pready(req, lo..=hi)
    }
    fn MPI_Pready_list / PMPI_Pready_list(n: c_int, list: *const c_int, req: Handle) {
        check_init()?;
        pready(req, raw::slice(list, n)?.iter().copied())
    }
    fn MPI_Parrived / PMPI_Parrived(req: Handle, _partition: c_int, flag: *mut c_int) {
        check_init()?;
        raw::put(flag, parrived(req)? as c_int)
    }
    fn MPI_Startall / PMPI_Startall(n: c_int, reqs: *mut Handle) {
        check_init()?;
        for &h in raw::slice(reqs, n)? {
            start(h)?;
        }
        Ok(())
    }
}

/// The status at `p`; `MPI_STATUS_IGNORE` holds none, so it is an argument error.
fn status_in(p: *const CStatus) -> R<CStatus> {
    if raw::status_ignored(p as *mut CStatus) {
        return Err(Fail::arg(
            "the status argument is MPI_STATUS_IGNORE (or null)",
        ));
    }
    raw::get(p)
}

/// Changes the status at `p` with `f`.
fn edit_status(p: *mut CStatus, f: impl FnOnce(&mut CStatus)) -> R {
    let mut s = status_in(p)?;
    f(&mut s);
    raw::put(p, s)
}

fn some(hs: &mut [Handle], outcount: *mut c_int, indices: *mut c_int, sts: *mut CStatus) -> R {
    let done = done_now(hs);
    let idx = raw::slice_mut(indices, done.len() as c_int)?;
    let mut failed = false;
    for (j, &k) in done.iter().enumerate() {
        failed |= complete_into(&mut hs[k], sts, j);
        idx[j] = k as c_int;
    }
    raw::put(outcount, done.len() as c_int)?;
    if failed {
        return Err(Fail::new(
            ERR_IN_STATUS,
            "a request failed; its status says how",
        ));
    }
    Ok(())
}

/// The result of request `h`, which [`done_now`] found complete, kept in its slot as a
/// finished request: `MPI_Request_get_status` and kin look without completing it.
fn peek_done(h: Handle) -> R<(St, Option<Fail>)> {
    let r = take(h)?;
    Ok(wait_req_keep(r, h))
}

/// Writes a completed operation's result to element `i` of `sts` (unless ignored), its
/// error code in the status where it failed; returns whether it failed.
fn write_result(st: St, fail: Option<Fail>, sts: *mut CStatus, i: usize) -> bool {
    let p = raw::status_at(sts, i);
    match fail {
        None => {
            st.write(p, SUCCESS);
            false
        }
        Some(f) => {
            st.write(p, crate::err::raise_quiet(f));
            true
        }
    }
}

/// Refuses handles that name no request (freed, or never made); `MPI_REQUEST_NULL` is one.
fn known(hs: &[Handle]) -> R {
    match hs.iter().find(|&&h| h != REQUEST_NULL && !exists(h)) {
        Some(h) => Err(Fail::new(
            ERR_REQUEST,
            format!("{h:#x} is not a request (freed, or never made)"),
        )),
        None => Ok(()),
    }
}

fn wait_req_keep(r: Req, h: Handle) -> (St, Option<Fail>) {
    match r {
        Req::Persistent { spec, active } => {
            let out = active.map(|a| wait_req(*a)).unwrap_or((St::NONE, None));
            let code = out.1.as_ref().map_or(SUCCESS, |f| f.class);
            put_back(
                h,
                Req::Persistent {
                    spec,
                    active: Some(Box::new(Req::Done(out.0, code))),
                },
            );
            out
        }
        r => {
            let out = wait_req(r);
            let code = out.1.as_ref().map_or(SUCCESS, |f| f.class);
            put_back(h, Req::Done(out.0, code));
            out
        }
    }
}

/// Whether `h` names a request (one in the table, or a send complete at its start).
fn exists(h: Handle) -> bool {
    lookup(h).is_some()
}

/// `Some(persistent)` when `h` names a request, `None` otherwise.
fn lookup(h: Handle) -> Option<bool> {
    if h == REQUEST_SENT {
        return Some(false);
    }
    let g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    let r = index(h).and_then(|i| g.slots.get(i)?.as_ref())?;
    Some(matches!(r, Req::Persistent { .. }))
}

fn is_persistent(h: Handle) -> bool {
    lookup(h) == Some(true)
}

/// Lets go of a request the program freed: one in flight still completes (its
/// buffers are the program's), a generalized one when the program completes it.
fn abandon(r: Req) {
    match r {
        Req::Live { r, keep } => {
            FREED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((r, keep));
        }
        Req::Persistent {
            active: Some(a), ..
        } => abandon(*a),
        Req::Multi { parts, .. } => parts.into_iter().for_each(|(_, p)| abandon(p)),
        Req::Gen(g) if g.is_done() => {
            let _ = g.finish();
        }
        Req::Gen(g) => FREED_GEN.lock().unwrap_or_else(|p| p.into_inner()).push(g),
        _ => {}
    }
}

/// `MPI_Cancel` of every operation under way in `r`; a generalized request's cancel
/// function can fail the call.
fn cancel(r: &Req) -> R {
    match r {
        Req::Live { r, .. } => r.cancel(),
        Req::Persistent {
            active: Some(a), ..
        } => cancel(a)?,
        Req::Multi { parts, .. } => {
            for (_, p) in parts {
                cancel(p)?;
            }
        }
        Req::Gen(g) => {
            if let Some(f) = g.cancel {
                let rc = raw::call_grequest_cancel(f, g.extra.get(), g.is_done() as c_int);
                if rc != SUCCESS {
                    return Err(Fail::new(
                        rc,
                        "the generalized request's cancel function failed",
                    ));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

type Freed = (RawRequest, Vec<Box<dyn Any + Send>>);

/// Requests the program freed before they completed: finished when they can be.
static FREED: Mutex<Vec<Freed>> = Mutex::new(Vec::new());

/// Completes the freed requests that are done.
pub fn reap_freed() {
    let mut g = FREED.lock().unwrap_or_else(|p| p.into_inner());
    let mut keep = Vec::new();
    for (r, k) in g.drain(..) {
        match r.try_test() {
            Ok(_) => drop(k),
            Err(r) => keep.push((r, k)),
        }
    }
    *g = keep;
}

/// Waits for every freed request (at finalize).
pub fn drain_freed() {
    let v: Vec<Freed> = std::mem::take(&mut *FREED.lock().unwrap_or_else(|p| p.into_inner()));
    for (r, k) in v {
        let _ = r.try_wait();
        drop(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_set_and_read_where_mpichs_abi_has_them() {
        // MPICH's 20-byte status: count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG,
        // MPI_ERROR (the unit tests build this crate for MPICH's ABI).
        assert_eq!(std::mem::offset_of!(CStatus, source), 8);
        assert_eq!(std::mem::offset_of!(CStatus, error), 16);
        let mut st = CStatus::new(1, 2, SUCCESS, 12, true);
        assert_eq!(PMPI_Status_set_source(&mut st, 7), SUCCESS);
        assert_eq!(PMPI_Status_set_tag(&mut st, 8), SUCCESS);
        assert_eq!(PMPI_Status_set_error(&mut st, ERR_TAG), SUCCESS);
        let (mut source, mut tag, mut error) = (0, 0, 0);
        assert_eq!(PMPI_Status_get_source(&st, &mut source), SUCCESS);
        assert_eq!(PMPI_Status_get_tag(&st, &mut tag), SUCCESS);
        assert_eq!(PMPI_Status_get_error(&st, &mut error), SUCCESS);
        assert_eq!((source, tag, error), (7, 8, ERR_TAG));
        assert_eq!((st.source, st.tag, st.error), (7, 8, ERR_TAG));
        // The count and the cancelled bit are the library's, untouched.
        assert_eq!(status_bytes(&st), 12);
        assert_eq!(st.count_hi_and_cancelled & 1, 1);
    }

    #[test]
    fn an_ignored_status_has_no_fields() {
        assert!(status_in(STATUS_IGNORE as *const CStatus).is_err());
        assert!(status_in(std::ptr::null()).is_err());
    }
}
