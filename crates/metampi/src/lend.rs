//! Lending user buffers to the engine: the one place where a point-to-point call's borrowed
//! buffer becomes the raw view (`SendPtr`, `RecvPtr`) that the engine keeps in its request
//! table. That table is reached by every thread and has no lifetimes, so the borrow has to
//! be kept by whoever posted the request. Every function here keeps it in one of three ways:
//! - it waits for the request before returning (the blocking calls);
//! - it registers the request with a [`Scope`], whose contract (rsmpi's) is that every
//!   request completes before the scope ends, and so before the borrow does;
//! - it hands the memory to an owner that keeps it until completion ([`SendFuture`] holds
//!   the vector and its drop waits; forgetting it leaks the vector, never frees it).
//!
//! No raw view of a user buffer leaves this module another way, so the rest of the
//! point-to-point API is safe code. A function that posts fails only before it posts (a bad
//! tag or rank): an error never leaves a request behind with a borrowed buffer.

use std::sync::Arc;

use crate::datatype::{BufferMut, Equivalence, Packed, RecvLayout};
use crate::engine::core::{RecvBuf, SendBuf, Unexpected, SENT};
use crate::environment::shared;
use crate::error::Error;
use crate::point_to_point::{finish, post_send, send_now, start_recv, Mode, SendFuture, Status};
use crate::request::{Post, Request, Scope};
use crate::sys::rawbuf::{RecvPtr, SendPtr};
use crate::topology::CommInner;
use crate::{Rank, Tag};

/// Where a receive lands, ready to post: the engine's view of the buffer and what to do
/// with it when the receive completes. Made only here; posted only by the functions below.
pub(crate) struct RecvInto<'b> {
    buf: RecvBuf,
    post: Post<'b>,
}

impl<'b> RecvInto<'b> {
    /// A receive into a typed buffer: straight into it where its layout is dense, into a
    /// vector of the engine's to unpack at completion otherwise.
    pub(crate) fn of<B: BufferMut + ?Sized>(buf: &'b mut B) -> RecvInto<'b> {
        let layout = RecvLayout::of(buf);
        match layout.dense_raw() {
            Some((ptr, len)) => RecvInto {
                // SAFETY: the view is posted only by this module's functions, which keep
                // `'b` (the layout's exclusive borrow) until the request completes; the
                // layout in `post` touches the bytes only after that (`finish`).
                buf: RecvBuf::Borrowed(unsafe { RecvPtr::from_raw(ptr, len) }),
                post: Post::Dense(layout),
            },
            None => {
                let cap = layout.capacity();
                RecvInto {
                    buf: RecvBuf::Owned(Vec::new()),
                    post: Post::Unpack(layout, cap),
                }
            }
        }
    }

    /// A receive of raw bytes into `buf`.
    pub(crate) fn bytes(buf: &'b mut [u8]) -> RecvInto<'b> {
        RecvInto {
            // SAFETY: as in `of`: posted only by this module, which keeps `'b` until the
            // request completes.
            buf: RecvBuf::Borrowed(unsafe { RecvPtr::new(buf) }),
            post: Post::None,
        }
    }
}

/// The rsmpi shape of a nonblocking receive: the request keeps `buf` for `'a` and gives it
/// back shared once complete (`Request::wait_for_data`), while the engine writes it until
/// then. Both views come from one raw pointer, so neither is derived from the other.
fn split_for_request<'a, B: BufferMut + ?Sized>(buf: &'a mut B) -> (RecvInto<'a>, &'a B) {
    let p: *mut B = buf;
    // SAFETY: `p` is the caller's exclusive borrow for `'a`. The engine writes through the
    // first view until the request completes; the request reads the second only after
    // that (`Inflight` hands its data out only from a completed request).
    unsafe { (RecvInto::of(&mut *p), &*p) }
}

/// Blocking receive into `into`: posts, waits, converts or unpacks.
pub(crate) fn recv_wait(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    into: RecvInto<'_>,
    coll: bool,
) -> Result<Status, Error> {
    let RecvInto { buf, mut post } = into;
    let c = start_recv(comm, src, tag, buf, coll, true)?.wait();
    let st = Status::from_raw(comm, c.status);
    finish(c, &st, &mut post)?;
    Ok(st)
}

/// Nonblocking receive into `buf`, completed through the request (and its scope).
pub(crate) fn recv_request<'a, B, S>(
    comm: &Arc<CommInner>,
    src: Option<Rank>,
    tag: Option<Tag>,
    buf: &'a mut B,
    scope: S,
) -> Result<Request<'a, B, S>, Error>
where
    B: 'a + BufferMut + ?Sized,
    S: Scope<'a>,
{
    let (RecvInto { buf: rb, post }, data) = split_for_request(buf);
    let started = start_recv(comm, src, tag, rb, false, false)?;
    Ok(Request::started(started, comm, src, data, scope, post))
}

/// Blocking receive of the message a matched probe took.
pub(crate) fn matched_wait(
    comm: &CommInner,
    msg: Unexpected,
    into: RecvInto<'_>,
) -> Result<Status, Error> {
    let RecvInto { buf, mut post } = into;
    let id = shared().with(|e| e.core.post_recv_matched(msg, buf));
    let c = shared().wait(id);
    let st = Status::from_raw(comm, c.status);
    finish(c, &st, &mut post)?;
    Ok(st)
}

/// Nonblocking receive of the message a matched probe took.
pub(crate) fn matched_request<'a, B, S>(
    comm: &Arc<CommInner>,
    msg: Unexpected,
    buf: &'a mut B,
    scope: S,
) -> Request<'a, B, S>
where
    B: 'a + BufferMut + ?Sized,
    S: Scope<'a>,
{
    let (RecvInto { buf: rb, post }, data) = split_for_request(buf);
    let id = shared().with(|e| e.core.post_recv_matched(msg, rb));
    Request::new(id, comm, data, scope, post)
}

/// The engine's buffer for `packed`: the caller's bytes where they are dense, the packed
/// vector otherwise. Private: only the functions below post it, each keeping the borrow.
fn lent(packed: Packed<'_>) -> SendBuf {
    match packed {
        // SAFETY: posted only by this module's functions, which keep the bytes borrowed
        // until the request completes (module docs).
        Packed::Dense(b) => SendBuf::Borrowed(unsafe { SendPtr::new(b) }),
        Packed::Packed(v) => SendBuf::Owned(v),
    }
}

/// Blocking send of `packed` in `mode` (a buffered send copies the bytes and returns).
pub(crate) fn send_wait(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    packed: Packed<'_>,
    mode: Mode,
    coll: bool,
) -> Result<(), Error> {
    if mode == Mode::Buffered {
        let copy = SendBuf::Owned(packed.bytes().to_vec());
        post_send(comm, dst, tag, copy, mode, coll)?;
        return Ok(());
    }
    let id = post_send(comm, dst, tag, lent(packed), mode, coll)?;
    shared().wait(id).result
}

/// Nonblocking send of `packed` (the bytes of `data`) in `mode`, completed through the
/// request (and its scope). A small message the transport takes at once needs no request
/// slot: the request comes back complete, as a blocking send would have returned.
pub(crate) fn send_request<'a, D, S>(
    comm: &Arc<CommInner>,
    dst: Rank,
    tag: Tag,
    packed: Packed<'a>,
    mode: Mode,
    data: &'a D,
    scope: S,
) -> Result<Request<'a, D, S>, Error>
where
    D: 'a + ?Sized,
    S: Scope<'a>,
{
    // Buffered mode copies the bytes out before the call returns, which a standard send
    // the transport takes at once does too.
    let buffered = mode == Mode::Buffered;
    let mode = if buffered { Mode::Standard } else { mode };
    let id = if send_now(comm, dst, tag, packed.bytes(), mode, false)? {
        SENT
    } else if buffered {
        let copy = SendBuf::Owned(packed.bytes().to_vec());
        post_send(comm, dst, tag, copy, mode, false)?
    } else {
        post_send(comm, dst, tag, lent(packed), mode, false)?
    };
    Ok(Request::new(id, comm, data, scope, Post::None))
}

/// Nonblocking send of an owned vector, `packed` being its bytes as they go to `dst`.
pub(crate) fn send_owned<T: Equivalence>(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    data: Vec<T>,
    packed: impl FnOnce(&[T]) -> Packed<'_>,
    mode: Mode,
) -> Result<SendFuture<T>, Error> {
    // The vector's heap memory does not move when the vector does, and the future keeps
    // the vector until the send completes: lending it is keeping it (module docs).
    let id = post_send(comm, dst, tag, lent(packed(&data)), mode, false)?;
    Ok(SendFuture::new(id, data))
}
