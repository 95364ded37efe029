//! Requests (MPI-4 §3.7, §3.9): the table behind `MPI_Request` handles, and
//! the wait/test family, cancel and persistent requests over it.
//!
//! A request is taken out of the table while a thread waits on it (MPI lets
//! only one thread complete a request), so a blocked wait holds no lock.

use std::any::Any;
use std::ffi::c_int;
use std::sync::Mutex;

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
}

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
        Req::Persistent { .. } => (St::EMPTY, None),
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
        return (Ok(St::EMPTY), false);
    }
    let r = match take_for_wait(h) {
        Ok(r) => r,
        Err(e) => return (Err(e), false),
    };
    match r {
        Req::Persistent { spec, active } => {
            let out = active.map(|a| wait_req(*a)).unwrap_or((St::EMPTY, None));
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
        return Ok(Some(St::EMPTY));
    }
    match take(h)? {
        Req::Persistent { spec, active } => match active {
            None => {
                put_back(h, Req::Persistent { spec, active: None });
                Ok(Some(St::EMPTY))
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
    // Take the requests out, see which is done (blocking in the engine), put back.
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
    let mut ready = None;
    for (k, r) in &taken {
        if matches!(r, Req::Done(..))
            || matches!(r, Req::Persistent { active: Some(a), .. } if matches!(**a, Req::Done(..)))
        {
            ready = Some(*k);
            break;
        }
    }
    if ready.is_none() {
        let raws: Vec<(usize, &RawRequest)> = taken
            .iter()
            .filter_map(|(k, r)| live_of(r).map(|x| (*k, x)))
            .collect();
        let refs: Vec<&RawRequest> = raws.iter().map(|x| x.1).collect();
        ready = wait_any_index(&refs).map(|i| raws[i].0);
    }
    for (k, r) in taken {
        put_back(hs[k], r);
    }
    Ok(ready)
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

/// Positions of the active requests among `hs` that are complete now.
fn done_now(hs: &[Handle]) -> Vec<usize> {
    let g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    let mut raws = Vec::new();
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
    out.sort_unstable();
    out
}

/// Starts persistent request `h`.
fn start(h: Handle) -> R {
    let r = take(h)?;
    let Req::Persistent { spec, active } = r else {
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
    let begun = match &spec {
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
        let (st, persistent) = wait_handle_p(h);
        let st = st?;
        if !persistent {
            raw::put(req, REQUEST_NULL)?;
        }
        st.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Test / PMPI_Test(req: *mut Handle, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        let h = raw::get(req)?;
        let persistent = is_persistent(h);
        match test_handle(h)? {
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
                St::EMPTY.write(status, SUCCESS);
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
            St::EMPTY.write(status, SUCCESS);
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
        // A request freed while in flight still completes; its buffers are the program's.
        match r {
            Req::Live { r, keep } => {
                FREED.lock().unwrap_or_else(|p| p.into_inner()).push((r, keep));
            }
            Req::Persistent { active: Some(a), .. } => {
                if let Req::Live { r, keep } = *a {
                    FREED.lock().unwrap_or_else(|p| p.into_inner()).push((r, keep));
                }
            }
            _ => {}
        }
        reap_freed();
        raw::put(req, REQUEST_NULL)
    }
    fn MPI_Request_get_status / PMPI_Request_get_status(h: Handle, flag: *mut c_int, status: *mut CStatus) {
        check_init()?;
        if inactive(h) {
            St::EMPTY.write(status, SUCCESS);
            return raw::put(flag, 1);
        }
        let done = !done_now(&[h]).is_empty();
        if done {
            // Peek: wait (it is complete) and keep the result as a finished request.
            let r = take(h)?;
            let (st, fail) = wait_req_keep(r, h);
            if let Some(f) = fail {
                return Err(f);
            }
            st.write(status, SUCCESS);
        }
        raw::put(flag, done as c_int)
    }
    fn MPI_Cancel / PMPI_Cancel(req: *mut Handle) {
        let h = raw::get(req)?;
        let r = take(h)?;
        if let Some(x) = live_of(&r) {
            x.cancel();
        }
        put_back(h, r);
        Ok(())
    }
    fn MPI_Test_cancelled / PMPI_Test_cancelled(status: *const CStatus, flag: *mut c_int) {
        let s = raw::get(status)?;
        raw::put(flag, s.count_hi_and_cancelled & 1)
    }
    fn MPI_Start / PMPI_Start(req: *mut Handle) {
        check_init()?;
        start(raw::get(req)?)
    }
    fn MPI_Startall / PMPI_Startall(n: c_int, reqs: *mut Handle) {
        check_init()?;
        for &h in raw::slice(reqs, n)? {
            start(h)?;
        }
        Ok(())
    }
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

fn wait_req_keep(r: Req, h: Handle) -> (St, Option<Fail>) {
    match r {
        Req::Persistent { spec, active } => {
            let out = active.map(|a| wait_req(*a)).unwrap_or((St::EMPTY, None));
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

fn is_persistent(h: Handle) -> bool {
    let g = REQS.lock().unwrap_or_else(|p| p.into_inner());
    matches!(
        index(h).and_then(|i| g.slots.get(i)?.as_ref()),
        Some(Req::Persistent { .. })
    )
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
