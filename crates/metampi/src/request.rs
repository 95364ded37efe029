//! Nonblocking requests and scopes (MPI-1.2 §3.7), in rsmpi's shape.
//!
//! A scoped request borrows its buffer for `'a`; the scope makes sure every
//! request is completed before the buffers can be used again.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::datatype::RecvLayout;
use crate::engine::core::{Completed, RawStatus, ReqId, SENT};
use crate::engine::report::{in_call, Call};
use crate::environment::shared;
use crate::environment::OrAbort;
use crate::error::Error;
use crate::point_to_point::{finish, Started, Status};
use crate::topology::CommInner;
use crate::Rank;

/// What to do with a completed request's data, in the buffer it borrows for `'b`.
pub(crate) enum Post<'b> {
    None,
    /// A dense receive: its bytes are converted in place if they arrived in
    /// the other byte order.
    Dense(RecvLayout<'b>),
    /// Unpack a non-dense receive into the user's buffer (capacity in bytes).
    Unpack(RecvLayout<'b>, usize),
}

// SAFETY: the layout is an exclusive borrow of the user's buffer (`&mut [u8]` is `Send`),
// held as an address only so that the engine may write the buffer meanwhile; it is used
// once the request completes, by the thread completing it.
unsafe impl Send for Post<'_> {}

/// Keeps track of requests that borrow data for `'a`.
///
/// # Safety
/// `unregister` must only be called for a registered request.
pub unsafe trait Scope<'a> {
    /// Records one more outstanding request.
    fn register(&self);
    /// Records that a request completed.
    ///
    /// # Safety
    /// Only for a request that was registered.
    unsafe fn unregister(&self);
}

/// The scope of requests over `'static` data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StaticScope;

// SAFETY: 'static data cannot be freed while a request is in flight.
unsafe impl Scope<'static> for StaticScope {
    fn register(&self) {}
    unsafe fn unregister(&self) {}
}

/// A scope for requests over borrowed data, made by [`scope`].
#[derive(Debug)]
pub struct LocalScope<'a> {
    num_requests: Cell<usize>,
    phantom: PhantomData<Cell<&'a ()>>,
}

impl Drop for LocalScope<'_> {
    fn drop(&mut self) {
        if self.num_requests.get() != 0 {
            // Buffers are about to be released while the library may still
            // write them: the only safe way out is to stop the process.
            eprintln!(
                "metampi: a request scope ended with {} requests not completed",
                self.num_requests.get()
            );
            std::process::abort();
        }
    }
}

// SAFETY: counts registrations; the Drop above enforces completion.
unsafe impl<'a> Scope<'a> for &LocalScope<'a> {
    fn register(&self) {
        self.num_requests.set(self.num_requests.get() + 1);
    }
    unsafe fn unregister(&self) {
        self.num_requests
            .set(self.num_requests.get().saturating_sub(1));
    }
}

/// Runs `f` with a scope; every request made in it must complete inside it.
pub fn scope<'a, F, R>(f: F) -> R
where
    F: FnOnce(&LocalScope<'a>) -> R,
{
    let s = LocalScope {
        num_requests: Cell::new(0),
        phantom: PhantomData,
    };
    f(&s)
}

/// How a request's status is made.
enum End {
    /// From the engine's slot, its source named as [`Sender`] says.
    Slot(Sender),
    /// The request completed as it started (its id is
    /// [`crate::engine::core::SENT`]: no slot): its status, made then, and
    /// for a receive into a non-contiguous buffer the packed bytes still to
    /// unpack (taken once, by the wait).
    Ready(Status, Cell<Option<Vec<u8>>>),
}

/// Who the status of a request still in the engine names as its source.
enum Sender {
    /// This communicator rank: the one a receive named (only its messages
    /// match). Keeps no reference to the communicator, whose count would be
    /// touched twice per request.
    Named(Rank),
    /// The sender's world rank in the terms of the communicator (which the
    /// request keeps: the user may free theirs meanwhile): a receive from any
    /// source, a send, a collective.
    Comm(Arc<CommInner>),
}

impl Sender {
    fn status(&self, raw: RawStatus) -> Status {
        match self {
            Sender::Named(r) => Status::named(*r, raw),
            Sender::Comm(comm) => Status::from_raw(comm, raw),
        }
    }
}

pub(crate) struct Inflight<'a, D: ?Sized> {
    id: ReqId,
    end: End,
    /// The communicator's context (for the trace).
    ctx: u32,
    data: &'a D,
    post: Post<'a>,
}

impl<D: ?Sized> Inflight<'_, D> {
    /// Whether the result is in.
    fn is_done(&self, e: &mut crate::engine::Engine) -> bool {
        matches!(self.end, End::Ready(..)) || e.core.is_done(self.id)
    }

    /// The status of a request that completed as it started and leaves its
    /// wait nothing to do (no bytes to unpack or convert): `finish` would
    /// only look.
    #[inline]
    fn ready_status(&self) -> Option<Status> {
        match (&self.end, &self.post) {
            (End::Ready(st, _), Post::None) => Some(*st),
            (End::Ready(st, _), Post::Dense(_)) if !st.foreign => Some(*st),
            _ => None,
        }
    }

    /// [`Request::try_wait`] for a request that is still in flight, or whose
    /// bytes must be unpacked or converted.
    #[inline(never)]
    fn wait_slow(mut self) -> Result<Status, Error> {
        match (&self.end, &self.post) {
            // A send, or a receive into a dense buffer: the status is the
            // whole result (no `Completed` to build and take apart).
            (End::Slot(sender), Post::None | Post::Dense(_)) => {
                let raw = shared().wait_status(self.id)?;
                let st = sender.status(raw);
                if st.foreign {
                    finish(
                        Completed {
                            status: raw,
                            result: Ok(()),
                            data: None,
                        },
                        &st,
                        &mut self.post,
                    )?;
                }
                Ok(st)
            }
            _ => {
                let c = self.outcome();
                self.complete(c)
            }
        }
    }

    /// Waits for the result.
    fn outcome(&self) -> (Status, Completed) {
        match &self.end {
            End::Ready(st, data) => {
                let mut c = Completed::sent();
                c.data = data.take();
                (*st, c)
            }
            End::Slot(sender) => {
                let c = shared().wait(self.id);
                (sender.status(c.status), c)
            }
        }
    }

    /// The result if it is in (one progress pass).
    fn try_outcome(&self) -> Option<(Status, Completed)> {
        match &self.end {
            End::Ready(..) => Some(self.outcome()),
            End::Slot(sender) => shared().test(self.id).map(|c| (sender.status(c.status), c)),
        }
    }

    fn complete(mut self, (st, c): (Status, Completed)) -> Result<Status, Error> {
        finish(c, &st, &mut self.post)?;
        Ok(st)
    }
}

/// A nonblocking operation in flight. Must be completed (wait/test) before drop.
#[must_use]
pub struct Request<'a, D: ?Sized, S: Scope<'a> = StaticScope> {
    inner: Option<Inflight<'a, D>>,
    scope: S,
    phantom: PhantomData<Cell<&'a ()>>,
}

impl<'a, D: ?Sized, S: Scope<'a>> Request<'a, D, S> {
    /// A request for engine request `id` on `comm`.
    #[inline]
    pub(crate) fn new(
        id: ReqId,
        comm: &Arc<CommInner>,
        data: &'a D,
        scope: S,
        post: Post<'a>,
    ) -> Self {
        let end = if id == SENT {
            End::Ready(
                Status::from_raw(comm, Completed::sent().status),
                Cell::new(None),
            )
        } else {
            End::Slot(Sender::Comm(Arc::clone(comm)))
        };
        Self::with_end(id, end, comm.ctx, data, scope, post)
    }

    /// A request for a receive into a borrowed buffer as
    /// [`crate::point_to_point::start_recv`] started it.
    /// `src`: the rank it receives from (`None`: any).
    #[inline]
    pub(crate) fn started(
        started: Started,
        comm: &Arc<CommInner>,
        src: Option<Rank>,
        data: &'a D,
        scope: S,
        post: Post<'a>,
    ) -> Self {
        match started.done {
            // Completed at once, without error: into a borrowed buffer, or
            // packed bytes that `finish` unpacks at the wait.
            Some(c) => {
                let end = End::Ready(Status::from_raw(comm, c.status), Cell::new(c.data));
                Self::with_end(SENT, end, comm.ctx, data, scope, post)
            }
            None => match src {
                Some(r) => {
                    let end = End::Slot(Sender::Named(r));
                    Self::with_end(started.id, end, comm.ctx, data, scope, post)
                }
                None => Self::new(started.id, comm, data, scope, post),
            },
        }
    }

    #[inline]
    fn with_end(id: ReqId, end: End, ctx: u32, data: &'a D, scope: S, post: Post<'a>) -> Self {
        scope.register();
        Request {
            inner: Some(Inflight {
                id,
                end,
                ctx,
                data,
                post,
            }),
            scope,
            phantom: PhantomData,
        }
    }

    #[inline]
    fn take(&mut self) -> Inflight<'a, D> {
        let i = self.inner.take().expect("a request is completed once");
        // SAFETY: registered in `new`, unregistered exactly once here.
        unsafe { self.scope.unregister() };
        i
    }

    /// Waits for completion and returns the status; errors end the job.
    #[track_caller]
    pub fn wait(self) -> Status {
        self.try_wait().or_abort_in("wait")
    }

    /// Waits for completion; errors (truncation, lost peer) come back as `Err`.
    #[inline(always)]
    pub fn try_wait(mut self) -> Result<Status, Error> {
        let t = crate::trace::start();
        let i = self.take();
        let ctx = i.ctx;
        // Most waits find the request complete since it started (a send the
        // transport took, a receive whose message was there): that check stays
        // inline, the rest is out of line.
        let st = match i.ready_status() {
            Some(st) => st,
            None => i.wait_slow()?,
        };
        if t.is_some() {
            crate::trace::record(
                t,
                crate::trace::Kind::Wait,
                "",
                -1,
                st.tag(),
                st.byte_count(),
                ctx,
            );
        }
        Ok(st)
    }

    /// Waits and drops the status.
    pub fn wait_without_status(self) {
        let _ = self.wait();
    }

    /// Waits and returns the borrowed data.
    #[track_caller]
    pub fn wait_for_data(mut self) -> &'a D {
        let i = self.take();
        let data = i.data;
        let c = i.outcome();
        i.complete(c).or_abort_in("wait_for_data");
        data
    }

    /// The status if complete, else the request back.
    pub fn test(self) -> Result<Status, Self> {
        self.test_with_data().map(|(s, _)| s)
    }

    /// The status and data if complete, else the request back.
    #[track_caller]
    pub fn test_with_data(mut self) -> Result<(Status, &'a D), Self> {
        let got = self.inner.as_ref().expect("a live request").try_outcome();
        match got {
            Some(c) => {
                let i = self.take();
                let data = i.data;
                Ok((i.complete(c).or_abort_in("test_with_data"), data))
            }
            None => Err(self),
        }
    }

    /// Asks to cancel the request; it must still be waited for.
    pub fn cancel(&self) {
        if let Some(i) = &self.inner {
            shared().with(|e| e.core.cancel(i.id));
        }
    }

    /// Moves the request into a shorter scope.
    pub fn shrink_scope_to<'b, S2>(mut self, scope: S2) -> Request<'b, D, S2>
    where
        'a: 'b,
        S2: Scope<'b>,
    {
        let i = self.take();
        scope.register();
        Request {
            inner: Some(i),
            scope,
            phantom: PhantomData,
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> Drop for Request<'a, D, S> {
    fn drop(&mut self) {
        if self.inner.is_some() && !std::thread::panicking() {
            panic!("request was dropped without being completed");
        }
    }
}

/// The data is not shown: until the request completes, the library may be writing it.
impl<'a, D: ?Sized, S: Scope<'a>> std::fmt::Debug for Request<'a, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Some(i) => write!(f, "Request {{ id: {}, in flight }}", i.id),
            None => write!(f, "Request {{ completed }}"),
        }
    }
}

/// Waits for any request in `requests`, removes it and returns its index and status.
pub fn wait_any<'a, D, S: Scope<'a>>(
    requests: &mut Vec<Request<'a, D, S>>,
) -> Option<(usize, Status)> {
    if requests.is_empty() {
        return None;
    }
    let _call = in_call(Call::Several("a wait for any of several requests"));
    let idx = shared().wait_until(|e| {
        requests
            .iter()
            .position(|r| r.inner.as_ref().expect("live").is_done(e))
    });
    let r = requests.remove(idx);
    Some((idx, r.wait()))
}

/// Waits on drop.
#[derive(Debug)]
pub struct WaitGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(Option<Request<'a, D, S>>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for WaitGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.wait();
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        WaitGuard(Some(r))
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for Request<'a, D, S> {
    fn from(mut g: WaitGuard<'a, D, S>) -> Self {
        g.0.take().expect("a guard holds its request until dropped")
    }
}

/// Cancels, then waits, on drop.
#[derive(Debug)]
pub struct CancelGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(WaitGuard<'a, D, S>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for CancelGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = &self.0 .0 {
            r.cancel();
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        CancelGuard(WaitGuard::from(r))
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(g: WaitGuard<'a, D, S>) -> Self {
        CancelGuard(g)
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<CancelGuard<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(mut g: CancelGuard<'a, D, S>) -> Self {
        WaitGuard(g.0 .0.take())
    }
}

/// Runs `f` with a scope and a collection of requests (`multiple_scope`).
pub fn multiple_scope<'a, F, R, D>(reserve: usize, f: F) -> R
where
    D: 'a + ?Sized,
    F: FnOnce(&LocalScope<'a>, &mut RequestCollection<'a, D>) -> R,
{
    scope(|s| {
        let mut coll = RequestCollection {
            reqs: Vec::with_capacity(reserve),
        };
        f(s, &mut coll)
    })
}

/// A set of requests completed together (`MPI_Waitany`/`Waitsome`/`Waitall`).
pub struct RequestCollection<'a, D: ?Sized> {
    reqs: Vec<Option<Inflight<'a, D>>>,
}

type Done<'a, D> = (usize, Status, &'a D);

impl<'a, D: ?Sized> RequestCollection<'a, D> {
    /// Number of requests not yet completed.
    pub fn incomplete(&self) -> usize {
        self.reqs.iter().filter(|r| r.is_some()).count()
    }

    /// Adds a request; returns its index (stable).
    pub fn add<S: Scope<'a>>(&mut self, mut req: Request<'a, D, S>) -> usize {
        let i = req.take();
        self.reqs.push(Some(i));
        self.reqs.len() - 1
    }

    #[track_caller]
    fn finish_at(&mut self, idx: usize, c: (Status, Completed)) -> Done<'a, D> {
        let i = self.reqs[idx].take().expect("a live slot");
        let data = i.data;
        (idx, i.complete(c).or_abort_in("finish_at"), data)
    }

    fn done_ids(&self, e: &mut crate::engine::Engine) -> Vec<usize> {
        self.reqs
            .iter()
            .enumerate()
            .filter_map(|(k, r)| r.as_ref().filter(|i| i.is_done(e)).map(|_| k))
            .collect()
    }

    fn take_done(&mut self, idxs: Vec<usize>, result: &mut Vec<Done<'a, D>>) {
        result.reserve(idxs.len());
        for k in idxs {
            let c = self.reqs[k].as_ref().expect("live").outcome();
            result.push(self.finish_at(k, c));
        }
    }

    /// Waits for one request; `None` when none is left.
    pub fn wait_any(&mut self) -> Option<Done<'a, D>> {
        if self.incomplete() == 0 {
            return None;
        }
        let _call = in_call(Call::Several("a wait for any of several requests"));
        let k = shared().wait_until(|e| self.done_ids(e).first().copied());
        let c = self.reqs[k].as_ref().expect("live").outcome();
        Some(self.finish_at(k, c))
    }

    /// Waits for at least one request and returns every completed one.
    pub fn wait_some(&mut self, result: &mut Vec<Done<'a, D>>) {
        result.clear();
        if self.incomplete() == 0 {
            return;
        }
        let _call = in_call(Call::Several("a wait for some of several requests"));
        let idxs = shared().wait_until(|e| Some(self.done_ids(e)).filter(|v| !v.is_empty()));
        self.take_done(idxs, result);
    }

    /// Waits for all requests.
    pub fn wait_all(&mut self, result: &mut Vec<Done<'a, D>>) {
        result.clear();
        let mut idxs = Vec::with_capacity(self.reqs.len());
        idxs.extend((0..self.reqs.len()).filter(|&k| self.reqs[k].is_some()));
        self.take_done(idxs, result);
    }

    /// One completed request, if any.
    pub fn test_any(&mut self) -> Option<Done<'a, D>> {
        let idxs = shared().with(|e| {
            e.progress();
            self.done_ids(e)
        });
        let k = *idxs.first()?;
        let c = self.reqs[k].as_ref().expect("live").outcome();
        Some(self.finish_at(k, c))
    }

    /// Every completed request.
    pub fn test_some(&mut self, result: &mut Vec<Done<'a, D>>) {
        result.clear();
        let idxs = shared().with(|e| {
            e.progress();
            self.done_ids(e)
        });
        self.take_done(idxs, result);
    }

    /// All requests if all are complete; otherwise nothing and `false`.
    pub fn test_all(&mut self, result: &mut Vec<Done<'a, D>>) -> bool {
        result.clear();
        let (all, idxs) = shared().with(|e| {
            e.progress();
            let d = self.done_ids(e);
            (d.len() == self.incomplete(), d)
        });
        if !all {
            return false;
        }
        self.take_done(idxs, result);
        true
    }
}

impl<D: ?Sized> Drop for RequestCollection<'_, D> {
    fn drop(&mut self) {
        if self.incomplete() != 0 && !std::thread::panicking() {
            panic!("some requests have not completed");
        }
    }
}

/// What the C ABI library (`metampi-abi`) needs of requests beyond rsmpi's API:
/// requests whose buffers C owns, tested without ending the job on an error.
/// Not part of the Rust API.
#[doc(hidden)]
pub mod abi {
    use super::*;

    /// A request whose buffer the caller keeps alive, as C's MPI contract says.
    pub type RawRequest = Request<'static, (), StaticScope>;

    impl<'a, D: ?Sized, S: Scope<'a>> Request<'a, D, S> {
        /// This request without its borrow.
        ///
        /// # Safety
        /// The buffer the request was made over must stay valid, and untouched
        /// by anything else, until the returned request completes.
        pub unsafe fn into_raw(mut self) -> RawRequest {
            let i = self.take();
            Request {
                inner: Some(Inflight {
                    id: i.id,
                    end: i.end,
                    ctx: i.ctx,
                    data: &(),
                    // SAFETY: only the lifetime changes: the caller keeps the buffer the
                    // layout views until the request completes (this function's contract).
                    post: unsafe { std::mem::transmute::<Post<'a>, Post<'static>>(i.post) },
                }),
                scope: StaticScope,
                phantom: PhantomData,
            }
        }

        /// Whether this is a send that completed as it started (the transport
        /// took the message): its wait has nothing to do.
        pub fn is_sent(&self) -> bool {
            self.inner
                .as_ref()
                .is_some_and(|i| matches!((&i.end, &i.post), (End::Ready(..), Post::None)))
        }

        /// The result if it is in (one progress pass), errors included; the
        /// request back otherwise.
        pub fn try_test(mut self) -> Result<Result<Status, Error>, Self> {
            let got = self.inner.as_ref().expect("a live request").try_outcome();
            match got {
                Some(c) => Ok(self.take().complete(c)),
                None => Err(self),
            }
        }
    }

    /// Waits until one of `requests` is complete and returns its index; the
    /// request stays where it is, for the caller to wait on. `None` for none.
    pub fn wait_any_index<'a, D: ?Sized, S: Scope<'a>>(
        requests: &[&Request<'a, D, S>],
    ) -> Option<usize> {
        if requests.is_empty() {
            return None;
        }
        let _call = in_call(Call::Several("a wait for any of several requests"));
        Some(shared().wait_until(|e| {
            requests
                .iter()
                .position(|r| r.inner.as_ref().is_some_and(|i| i.is_done(e)))
        }))
    }

    /// The indices of `requests` that are complete, after one progress pass.
    pub fn done_indices<'a, D: ?Sized, S: Scope<'a>>(
        requests: &[&Request<'a, D, S>],
    ) -> Vec<usize> {
        shared().with(|e| {
            e.progress();
            requests
                .iter()
                .enumerate()
                .filter(|(_, r)| r.inner.as_ref().is_some_and(|i| i.is_done(e)))
                .map(|(k, _)| k)
                .collect()
        })
    }
}
