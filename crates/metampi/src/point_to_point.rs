//! Point-to-point communication (MPI-1.2 §3), in rsmpi's shape, plus
//! fallible `try_*` forms and owned nonblocking operations with futures.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::datatype::{
    pack, Buffer, BufferMut, Datatype, Equivalence, Packed, UncommittedDatatype,
};
use crate::engine::core::{
    Completed, Pattern, RawStatus, RecvBuf, ReqId, SendBuf, Unexpected, SENT,
};
use crate::engine::Pass;
use crate::environment::shared;
use crate::environment::OrAbort;
use crate::error::{truncate, Error, ErrorClass};
use crate::lend::{self, RecvInto};
use crate::request::{Post, Request, Scope};
use crate::topology::sealed::AsHandle;
use crate::topology::{AsCommunicator, CommInner};
use crate::trace;
use crate::{Count, Rank, Tag};

/// The outcome of a receive (MPI-1.2 §3.2.5).
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct Status {
    source: Rank,
    tag: Tag,
    bytes: usize,
    cancelled: bool,
    /// The payload arrived in the other byte order and must be converted.
    pub(crate) foreign: bool,
}

impl Status {
    #[inline]
    pub(crate) fn from_raw(comm: &CommInner, raw: RawStatus) -> Status {
        Status::named(comm.comm_of(raw.src), raw)
    }

    /// A status whose source is communicator rank `source`.
    pub(crate) fn named(source: Rank, raw: RawStatus) -> Status {
        Status {
            source,
            tag: raw.tag,
            bytes: raw.len,
            cancelled: raw.cancelled,
            foreign: raw.big_endian != cfg!(target_endian = "big"),
        }
    }

    /// Rank of the sender in the communicator.
    pub fn source_rank(&self) -> Rank {
        self.source
    }

    /// Tag of the message.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// Number of elements of datatype `d` received.
    pub fn count<D: Datatype>(&self, d: D) -> Count {
        let size = crate::datatype::size_of_type(d.type_id());
        self.bytes.checked_div(size).unwrap_or(0) as Count
    }

    /// Bytes received.
    pub fn byte_count(&self) -> usize {
        self.bytes
    }

    /// Whether the request was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Status {{ source_rank: {}, tag: {} }}",
            self.source, self.tag
        )
    }
}

/// Send modes (MPI-1.2 §3.4).
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Standard,
    Synchronous,
    Buffered,
    Ready,
}

#[inline]
fn check_tag(tag: Tag) -> Result<(), Error> {
    if tag < 0 {
        return Err(negative_tag(tag));
    }
    Ok(())
}

/// Kept out of line: every send checks its tag, and the message's
/// formatting would otherwise sit in each caller's code.
#[cold]
#[inline(never)]
fn negative_tag(tag: Tag) -> Error {
    Error::new(ErrorClass::Tag, format!("tag {tag} is negative"))
}

/// Posts a send of `data` to communicator rank `dst`.
pub(crate) fn post_send(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    data: SendBuf,
    mode: Mode,
    coll: bool,
) -> Result<ReqId, Error> {
    if !coll {
        check_tag(tag)?;
    }
    let w = comm.world_of(dst)?;
    let ctx = comm.ctx + coll as u32;
    let sync = mode == Mode::Synchronous;
    let id = shared().with_then(|e| {
        let id = e.core.new_send(w, data);
        e.links.post_send(&mut e.core, id, w, ctx, tag, sync);
        if mode == Mode::Buffered {
            e.core.detach(id);
        }
        let id = e.core.settle_send(id);
        (id, if id == SENT { Pass::None } else { Pass::Lazy })
    });
    Ok(id)
}

/// What a receive from `src` with `tag` matches.
#[inline]
fn recv_pattern(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    coll: bool,
) -> Result<Pattern, Error> {
    if let Some(t) = tag {
        if !coll {
            check_tag(t)?;
        }
    }
    Ok(Pattern {
        ctx: comm.ctx + coll as u32,
        src: src.map(|r| comm.world_of(r)).transpose()?,
        tag,
    })
}

/// Posts a receive into `buf`.
pub(crate) fn post_recv(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    buf: RecvBuf,
    coll: bool,
) -> Result<ReqId, Error> {
    let pat = recv_pattern(comm, src, tag, coll)?;
    let pass = pat.src.map_or(Pass::Lazy, Pass::From);
    Ok(shared().with_then(|e| (e.core.post_recv(pat, buf), pass)))
}

/// A receive as started: its request, or its result where the message was
/// there already (the id is then [`SENT`]: no slot).
pub(crate) struct Started {
    pub id: ReqId,
    pub done: Option<Now>,
}

/// A receive that completed as it started, which cannot have failed: its
/// status, and the bytes where it received into a buffer of its own (a
/// `Completed` without the result, 32 bytes fewer to move on every receive).
pub(crate) struct Now {
    pub status: RawStatus,
    pub data: Option<Vec<u8>>,
}

impl Started {
    /// A receive that completed as it started, with `status`, into `buf`.
    fn now(status: RawStatus, buf: RecvBuf) -> Started {
        let data = match buf {
            RecvBuf::Owned(v) => Some(v),
            RecvBuf::Borrowed(_) => None,
        };
        Started {
            id: SENT,
            done: Some(Now { status, data }),
        }
    }

    /// Waits for the result.
    pub(crate) fn wait(self) -> Completed {
        match self.done {
            Some(Now { status, data }) => Completed {
                status,
                result: Ok(()),
                data,
            },
            None => shared().wait(self.id),
        }
    }
}

/// Starts a receive into `buf`: completed at once where the message due to
/// it is waiting ([`crate::engine::Engine::recv_now`]), posted otherwise.
/// `blocking`: the caller waits for it next, so it may first watch the
/// source's ring for a while (`Shared::recv_spin`).
#[inline]
pub(crate) fn start_recv(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    mut buf: RecvBuf,
    coll: bool,
    blocking: bool,
) -> Result<Started, Error> {
    let pat = recv_pattern(comm, src, tag, coll)?;
    if blocking {
        if let Some(status) = shared().recv_spin(&pat, &mut buf) {
            return Ok(Started::now(status, buf));
        }
    }
    Ok(shared().with_then(|e| match e.recv_now(&pat, &mut buf) {
        Some(status) => (Started::now(status, buf), Pass::None),
        None => {
            let id = e.core.post_recv(pat, buf);
            let pass = match pat.src {
                // `recv_now` just saw the ring empty: the pass would only look again.
                Some(s) if e.links.ring_pass_idle(&e.core, s) => Pass::None,
                Some(s) => Pass::From(s),
                None => Pass::Lazy,
            };
            (Started { id, done: None }, pass)
        }
    }))
}

/// Sends small standard-mode messages without a request when the transport
/// can take them at once. Returns whether it did.
#[inline]
pub(crate) fn send_now(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    bytes: &[u8],
    mode: Mode,
    coll: bool,
) -> Result<bool, Error> {
    if !matches!(mode, Mode::Standard | Mode::Ready) {
        return Ok(false);
    }
    if !coll {
        check_tag(tag)?;
    }
    let w = comm.world_of(dst)?;
    let ctx = comm.ctx + coll as u32;
    Ok(shared().quick(|e| e.links.try_send_now(&mut e.core, w, ctx, tag, bytes)))
}

/// Blocking send of packed user data in `mode`.
#[inline]
fn send_packed(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    packed: Packed<'_>,
    mode: Mode,
) -> Result<(), Error> {
    // The transport takes most small sends at once: that check inline, the
    // rest out of line.
    if mode != Mode::Buffered && send_now(comm, dst, tag, packed.bytes(), mode, false)? {
        return Ok(());
    }
    send_packed_slow(comm, dst, tag, packed, mode)
}

/// [`send_packed`] where the transport did not take the message at once
/// (or it is a buffered send): a request, and a wait for it.
#[inline(never)]
fn send_packed_slow(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    packed: Packed<'_>,
    mode: Mode,
) -> Result<(), Error> {
    lend::send_wait(comm, dst, tag, packed, mode, false)
}

/// Blocking send of raw bytes (collectives use it on the collective context).
pub(crate) fn send_bytes(
    comm: &CommInner,
    dst: Rank,
    tag: Tag,
    bytes: &[u8],
    mode: Mode,
    coll: bool,
) -> Result<(), Error> {
    if send_now(comm, dst, tag, bytes, mode, coll)? {
        return Ok(());
    }
    lend::send_wait(comm, dst, tag, Packed::Dense(bytes), mode, coll)
}

/// Blocking receive of raw bytes into `buf`; the length received is in the status.
pub(crate) fn recv_bytes(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    buf: &mut [u8],
    coll: bool,
) -> Result<Status, Error> {
    let t = if coll { None } else { trace::start() };
    let st = lend::recv_wait(comm, src, tag, RecvInto::bytes(buf), coll)?;
    trace_recv(t, comm, &st);
    Ok(st)
}

/// Records a completed user receive in the trace.
fn trace_recv(t: Option<u64>, comm: &CommInner, st: &Status) {
    if t.is_some() {
        let peer = comm.world_of(st.source).map_or(-1, |w| w as i32);
        trace::record(t, trace::Kind::Recv, "", peer, st.tag, st.bytes, comm.ctx);
    }
}

/// Blocking receive of a message of any length.
pub(crate) fn recv_vec_bytes(
    comm: &CommInner,
    src: Option<Rank>,
    tag: Option<Tag>,
    coll: bool,
) -> Result<(Vec<u8>, Status), Error> {
    let t = if coll { None } else { trace::start() };
    let c = start_recv(comm, src, tag, RecvBuf::Owned(Vec::new()), coll, true)?.wait();
    c.result?;
    let st = Status::from_raw(comm, c.status);
    trace_recv(t, comm, &st);
    Ok((c.data.unwrap_or_default(), st))
}

/// The bytes of `buf` as they go to communicator rank `dst`: converted to
/// this meta host's declared byte order when it differs from the machine's
/// and `dst` is on another meta host (the receiver makes right).
#[inline(always)]
fn pack_for<'b, B: Buffer + ?Sized>(comm: &CommInner, dst: Rank, buf: &'b B) -> Packed<'b> {
    let p = pack(buf);
    if !shared().info.swap_routed {
        return p;
    }
    swapped_for(comm, dst, buf.as_datatype().type_id(), p)
}

/// [`pack_for`] where this meta host declares another byte order than the
/// machine's (only in tests of that conversion, in practice): out of line.
#[cold]
#[inline(never)]
fn swapped_for<'b>(comm: &CommInner, dst: Rank, type_id: u32, p: Packed<'b>) -> Packed<'b> {
    let info = &shared().info;
    if !comm.world_of(dst).is_ok_and(|w| info.swap_to(w)) {
        return p;
    }
    let mut v = p.bytes().to_vec();
    crate::datatype::swap_packed(&crate::datatype::type_map(type_id), &mut v);
    Packed::Packed(v)
}

/// Finishes a completed receive: truncation check and unpacking.
pub(crate) fn finish(c: Completed, st: &Status, post: &mut Post<'_>) -> Result<(), Error> {
    c.result?;
    match post {
        Post::Unpack(layout, cap) => {
            let mut data = c.data.unwrap_or_default();
            if data.len() > *cap {
                return Err(truncate(data.len(), *cap));
            }
            if st.foreign {
                crate::datatype::swap_packed(&layout.tm, &mut data);
            }
            layout.unpack(&data);
        }
        Post::Dense(layout) if st.foreign => layout.swap_received(st.bytes),
        _ => {}
    }
    Ok(())
}

/// Converts received signature bytes into `count` values of `T`.
fn vec_from_bytes<T: Equivalence>(mut data: Vec<u8>, st: &Status) -> Result<Vec<T>, Error> {
    let dt = T::equivalent_datatype();
    if st.foreign {
        crate::datatype::swap_packed(&crate::datatype::type_map(dt.type_id()), &mut data);
    }
    let size = crate::datatype::size_of_type(dt.type_id());
    if size == 0 {
        return Ok(Vec::new());
    }
    if data.len() % size != 0 {
        return Err(Error::new(
            ErrorClass::Type,
            format!(
                "received {} bytes, not a whole number of {size}-byte elements",
                data.len()
            ),
        ));
    }
    let n = data.len() / size;
    Ok(crate::datatype::vec_from_packed(data, n))
}

fn one_from_bytes<T: Equivalence>(data: Vec<u8>, st: &Status) -> Result<T, Error> {
    let mut v = vec_from_bytes::<T>(data, st)?;
    if v.len() != 1 {
        return Err(Error::new(
            ErrorClass::Count,
            format!("expected exactly one value, received {}", v.len()),
        ));
    }
    Ok(v.remove(0))
}

/// The source side of a receive: a specific process or any process.
///
/// # Safety
/// `source_rank` must be a rank of the communicator or the wildcard.
#[allow(unsafe_code)] // rsmpi's API
pub unsafe trait Source: AsCommunicator {
    /// Rank to receive from; `None` is the wildcard.
    #[doc(hidden)]
    fn source(&self) -> Option<Rank>;

    /// Rank to receive from (`-2` for any source, as `MPI_ANY_SOURCE`).
    fn source_rank(&self) -> Rank {
        self.source().unwrap_or(-2)
    }

    /// Blocks until a matching message is there; does not receive it.
    #[track_caller]
    fn probe_with_tag(&self, tag: Tag) -> Status {
        self.try_probe_with_tag(Some(tag))
            .or_abort_in("probe_with_tag")
    }

    /// [`Source::probe_with_tag`] for any tag.
    #[track_caller]
    fn probe(&self) -> Status {
        self.try_probe_with_tag(None).or_abort_in("probe")
    }

    /// Fallible probe; `None` tag is any tag.
    fn try_probe_with_tag(&self, tag: Option<Tag>) -> Result<Status, Error> {
        let comm = &self.as_communicator().as_handle().0;
        let pat = pattern(comm, self.source(), tag)?;
        let raw = probing(pat, || shared().wait_until(|e| e.core.probe(pat)));
        Ok(Status::from_raw(comm, raw))
    }

    /// Takes a matching message out of the queue, to be received with [`Message`].
    #[track_caller]
    fn matched_probe_with_tag(&self, tag: Tag) -> (Message, Status) {
        self.try_matched_probe(Some(tag))
            .or_abort_in("matched_probe_with_tag")
    }

    /// [`Source::matched_probe_with_tag`] for any tag.
    #[track_caller]
    fn matched_probe(&self) -> (Message, Status) {
        self.try_matched_probe(None).or_abort_in("matched_probe")
    }

    /// Fallible matched probe; `None` tag is any tag.
    fn try_matched_probe(&self, tag: Option<Tag>) -> Result<(Message, Status), Error> {
        let comm = &self.as_communicator().as_handle().0;
        let pat = pattern(comm, self.source(), tag)?;
        let u = probing(pat, || shared().wait_until(|e| e.core.take_unexpected(pat)));
        Ok(Message::new(comm, u))
    }

    /// Receives one value with `tag`.
    #[track_caller]
    fn receive_with_tag<Msg: Equivalence>(&self, tag: Tag) -> (Msg, Status) {
        self.try_receive_with_tag(Some(tag))
            .or_abort_in("receive_with_tag")
    }

    /// Receives one value with any tag.
    #[track_caller]
    fn receive<Msg: Equivalence>(&self) -> (Msg, Status) {
        self.try_receive_with_tag(None).or_abort_in("receive")
    }

    /// Fallible receive of one value; `None` tag is any tag.
    fn try_receive_with_tag<Msg: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<(Msg, Status), Error> {
        let comm = &self.as_communicator().as_handle().0;
        let direct = crate::datatype::value_from::<Msg, Status>(|bytes| {
            let st = recv_bytes(comm, self.source(), tag, bytes, false)?;
            if st.foreign {
                let tm = crate::datatype::type_map(Msg::equivalent_datatype().type_id());
                crate::datatype::swap_packed(&tm, bytes);
            }
            Ok((st.bytes, st))
        })?;
        if let Some(got) = direct {
            return Ok(got);
        }
        let (data, st) = recv_vec_bytes(comm, self.source(), tag, false)?;
        Ok((one_from_bytes(data, &st)?, st))
    }

    /// Receives into `buf` with `tag`.
    #[track_caller]
    fn receive_into_with_tag<Buf: BufferMut + ?Sized>(&self, buf: &mut Buf, tag: Tag) -> Status {
        self.try_receive_into_with_tag(buf, Some(tag))
            .or_abort_in("receive_into_with_tag")
    }

    /// Receives into `buf` with any tag.
    #[track_caller]
    fn receive_into<Buf: BufferMut + ?Sized>(&self, buf: &mut Buf) -> Status {
        self.try_receive_into_with_tag(buf, None)
            .or_abort_in("receive_into")
    }

    /// Fallible receive into `buf`: a longer message is `ErrorClass::Truncate`.
    fn try_receive_into_with_tag<Buf: BufferMut + ?Sized>(
        &self,
        buf: &mut Buf,
        tag: Option<Tag>,
    ) -> Result<Status, Error> {
        let t = trace::start();
        let comm = &self.as_communicator().as_handle().0;
        let st = lend::recv_wait(comm, self.source(), tag, RecvInto::of(buf), false)?;
        trace_recv(t, comm, &st);
        Ok(st)
    }

    /// Receives a message of any length into a new vector.
    #[track_caller]
    fn receive_vec_with_tag<Msg: Equivalence>(&self, tag: Tag) -> (Vec<Msg>, Status) {
        self.try_receive_vec_with_tag(Some(tag))
            .or_abort_in("receive_vec_with_tag")
    }

    /// [`Source::receive_vec_with_tag`] for any tag.
    #[track_caller]
    fn receive_vec<Msg: Equivalence>(&self) -> (Vec<Msg>, Status) {
        self.try_receive_vec_with_tag(None)
            .or_abort_in("receive_vec")
    }

    /// Fallible receive into a new vector.
    fn try_receive_vec_with_tag<Msg: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<(Vec<Msg>, Status), Error> {
        let comm = &self.as_communicator().as_handle().0;
        let (data, st) = recv_vec_bytes(comm, self.source(), tag, false)?;
        Ok((vec_from_bytes(data, &st)?, st))
    }

    /// Starts a receive into `buf` with `tag`; complete it before the scope ends.
    #[track_caller]
    fn immediate_receive_into_with_tag<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a mut Buf,
        tag: Tag,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        self.try_immediate_receive_into(scope, buf, Some(tag))
            .or_abort_in("immediate_receive_into_with_tag")
    }

    /// [`Source::immediate_receive_into_with_tag`] for any tag.
    #[track_caller]
    fn immediate_receive_into<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a mut Buf,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        self.try_immediate_receive_into(scope, buf, None)
            .or_abort_in("immediate_receive_into")
    }

    /// Fallible nonblocking receive; `None` tag is any tag.
    #[inline]
    fn try_immediate_receive_into<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a mut Buf,
        tag: Option<Tag>,
    ) -> Result<Request<'a, Buf, Sc>, Error>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let comm = &self.as_communicator().as_handle().0;
        lend::recv_request(comm, self.source(), tag, buf, scope)
    }

    /// Starts a receive of one value with `tag`.
    #[track_caller]
    fn immediate_receive_with_tag<Msg: Equivalence>(&self, tag: Tag) -> ReceiveFuture<Msg> {
        ReceiveFuture::post(
            &self.as_communicator().as_handle().0,
            self.source(),
            Some(tag),
        )
        .or_abort_in("immediate_receive_with_tag")
    }

    /// Starts a receive of one value with any tag.
    #[track_caller]
    fn immediate_receive<Msg: Equivalence>(&self) -> ReceiveFuture<Msg> {
        ReceiveFuture::post(&self.as_communicator().as_handle().0, self.source(), None)
            .or_abort_in("immediate_receive")
    }

    /// Starts a receive of a message of any length into an owned vector
    /// (no scope needed); `.await` it or call `wait`.
    #[track_caller]
    fn immediate_receive_vec<Msg: Equivalence>(&self) -> ReceiveVecFuture<Msg> {
        self.try_immediate_receive_vec(None)
            .or_abort_in("immediate_receive_vec")
    }

    /// Fallible [`Source::immediate_receive_vec`]; `None` tag is any tag.
    fn try_immediate_receive_vec<Msg: Equivalence>(
        &self,
        tag: Option<Tag>,
    ) -> Result<ReceiveVecFuture<Msg>, Error> {
        let comm = &self.as_communicator().as_handle().0;
        let id = post_recv(comm, self.source(), tag, RecvBuf::Owned(Vec::new()), false)?;
        Ok(ReceiveVecFuture {
            id: Some(id),
            comm: Arc::clone(comm),
            phantom: PhantomData,
        })
    }

    /// Whether a matching message is waiting (one progress pass).
    fn immediate_probe_with_tag(&self, tag: Tag) -> Option<Status> {
        immediate_probe(self, Some(tag))
    }

    /// [`Source::immediate_probe_with_tag`] for any tag.
    fn immediate_probe(&self) -> Option<Status> {
        immediate_probe(self, None)
    }

    /// Takes a matching message if one is waiting.
    fn immediate_matched_probe_with_tag(&self, tag: Tag) -> Option<(Message, Status)> {
        immediate_matched_probe(self, Some(tag))
    }

    /// [`Source::immediate_matched_probe_with_tag`] for any tag.
    fn immediate_matched_probe(&self) -> Option<(Message, Status)> {
        immediate_matched_probe(self, None)
    }
}

fn pattern(comm: &CommInner, src: Option<Rank>, tag: Option<Tag>) -> Result<Pattern, Error> {
    if let Some(t) = tag {
        check_tag(t)?;
    }
    Ok(Pattern {
        ctx: comm.ctx,
        src: src.map(|r| comm.world_of(r)).transpose()?,
        tag,
    })
}

/// Runs a probe with the collective flow-control hold lifted (see
/// `Core::hold`): the message probed for may wait behind held ones.
fn probing<R>(pat: Pattern, f: impl FnOnce() -> R) -> R {
    let _call = crate::engine::report::in_call(crate::engine::report::Call::Probe { pat });
    shared().quick(|e| e.core.unheld += 1);
    let r = f();
    shared().quick(|e| e.core.unheld -= 1);
    r
}

#[track_caller]
fn immediate_probe<S: Source + ?Sized>(s: &S, tag: Option<Tag>) -> Option<Status> {
    let comm = &s.as_communicator().as_handle().0;
    let pat = pattern(comm, s.source(), tag).or_abort_in("immediate_probe");
    probing(pat, || {
        shared().with(|e| {
            e.progress();
            e.core.probe(pat)
        })
    })
    .map(|raw| Status::from_raw(comm, raw))
}

#[track_caller]
fn immediate_matched_probe<S: Source + ?Sized>(
    s: &S,
    tag: Option<Tag>,
) -> Option<(Message, Status)> {
    let comm = &s.as_communicator().as_handle().0;
    let pat = pattern(comm, s.source(), tag).or_abort_in("immediate_matched_probe");
    probing(pat, || {
        shared().with(|e| {
            e.progress();
            e.core.take_unexpected(pat)
        })
    })
    .map(|u| Message::new(comm, u))
}

#[allow(unsafe_code)] // rsmpi's API
                      // SAFETY: the wildcard is always valid.
unsafe impl Source for crate::topology::AnyProcess<'_> {
    fn source(&self) -> Option<Rank> {
        None
    }
}

#[allow(unsafe_code)] // rsmpi's API
                      // SAFETY: a Process always holds a rank checked against its communicator.
unsafe impl Source for crate::topology::Process<'_> {
    fn source(&self) -> Option<Rank> {
        Some(self.rank())
    }
}

/// The destination side of a send.
pub trait Destination: AsCommunicator {
    /// Rank to send to.
    fn destination_rank(&self) -> Rank;

    /// Sends `buf` with `tag` (standard mode: may return before it is received).
    #[track_caller]
    fn send_with_tag<Buf: Buffer + ?Sized>(&self, buf: &Buf, tag: Tag) {
        self.try_send_with_mode(buf, tag, Mode::Standard)
            .or_abort_in("send_with_tag")
    }

    /// Sends `buf` with tag 0.
    fn send<Buf: Buffer + ?Sized>(&self, buf: &Buf) {
        self.send_with_tag(buf, 0)
    }

    /// Fallible standard send.
    fn try_send_with_tag<Buf: Buffer + ?Sized>(&self, buf: &Buf, tag: Tag) -> Result<(), Error> {
        self.try_send_with_mode(buf, tag, Mode::Standard)
    }

    #[doc(hidden)]
    fn try_send_with_mode<Buf: Buffer + ?Sized>(
        &self,
        buf: &Buf,
        tag: Tag,
        mode: Mode,
    ) -> Result<(), Error> {
        let t = trace::start();
        let comm = &self.as_communicator().as_handle().0;
        let dst = self.destination_rank();
        let packed = pack_for(comm, dst, buf);
        let len = packed.bytes().len();
        let r = send_packed(comm, dst, tag, packed, mode);
        if t.is_some() {
            let peer = comm.world_of(dst).map_or(-1, |w| w as i32);
            trace::record(t, trace::Kind::Send, "", peer, tag, len, comm.ctx);
        }
        r
    }

    /// Buffered send: returns at once, the library keeps a copy.
    #[track_caller]
    fn buffered_send_with_tag<Buf: Buffer + ?Sized>(&self, buf: &Buf, tag: Tag) {
        self.try_send_with_mode(buf, tag, Mode::Buffered)
            .or_abort_in("buffered_send_with_tag")
    }

    /// Buffered send with tag 0.
    fn buffered_send<Buf: Buffer + ?Sized>(&self, buf: &Buf) {
        self.buffered_send_with_tag(buf, 0)
    }

    /// Synchronous send: returns only after the receiver has matched it.
    #[track_caller]
    fn synchronous_send_with_tag<Buf: Buffer + ?Sized>(&self, buf: &Buf, tag: Tag) {
        self.try_send_with_mode(buf, tag, Mode::Synchronous)
            .or_abort_in("synchronous_send_with_tag")
    }

    /// Synchronous send with tag 0.
    fn synchronous_send<Buf: Buffer + ?Sized>(&self, buf: &Buf) {
        self.synchronous_send_with_tag(buf, 0)
    }

    /// Ready send.
    ///
    /// # Safety
    /// The matching receive must already be posted (MPI's rule for ready mode);
    /// this library then behaves as a standard send.
    #[track_caller]
    #[allow(unsafe_code)] // rsmpi's API
    unsafe fn ready_send_with_tag<Buf: Buffer + ?Sized>(&self, buf: &Buf, tag: Tag) {
        self.try_send_with_mode(buf, tag, Mode::Ready)
            .or_abort_in("ready_send_with_tag")
    }

    /// Ready send with tag 0.
    ///
    /// # Safety
    /// See [`Destination::ready_send_with_tag`].
    #[allow(unsafe_code)] // rsmpi's API
    unsafe fn ready_send<Buf: Buffer + ?Sized>(&self, buf: &Buf) {
        // SAFETY: forwarded contract.
        unsafe { self.ready_send_with_tag(buf, 0) }
    }

    #[doc(hidden)]
    fn immediate_with_mode<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
        tag: Tag,
        mode: Mode,
    ) -> Result<Request<'a, Buf, Sc>, Error>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        let t = trace::start();
        let comm = &self.as_communicator().as_handle().0;
        let dst = self.destination_rank();
        let packed = pack_for(comm, dst, buf);
        let len = packed.bytes().len();
        let request = lend::send_request(comm, dst, tag, packed, mode, buf, scope)?;
        if t.is_some() {
            let peer = comm.world_of(dst).map_or(-1, |w| w as i32);
            trace::record(t, trace::Kind::ISend, "", peer, tag, len, comm.ctx);
        }
        Ok(request)
    }

    /// Starts a standard send with `tag`.
    #[track_caller]
    fn immediate_send_with_tag<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
        tag: Tag,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_with_mode(scope, buf, tag, Mode::Standard)
            .or_abort_in("immediate_send_with_tag")
    }

    /// Starts a standard send with tag 0.
    fn immediate_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_send_with_tag(scope, buf, 0)
    }

    /// Starts a buffered send with `tag`.
    #[track_caller]
    fn immediate_buffered_send_with_tag<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
        tag: Tag,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_with_mode(scope, buf, tag, Mode::Buffered)
            .or_abort_in("immediate_buffered_send_with_tag")
    }

    /// Starts a buffered send with tag 0.
    fn immediate_buffered_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_buffered_send_with_tag(scope, buf, 0)
    }

    /// Starts a synchronous send with `tag`.
    #[track_caller]
    fn immediate_synchronous_send_with_tag<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
        tag: Tag,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_with_mode(scope, buf, tag, Mode::Synchronous)
            .or_abort_in("immediate_synchronous_send_with_tag")
    }

    /// Starts a synchronous send with tag 0.
    fn immediate_synchronous_send<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_synchronous_send_with_tag(scope, buf, 0)
    }

    /// Starts a ready send with `tag`.
    ///
    /// # Safety
    /// See [`Destination::ready_send_with_tag`].
    #[track_caller]
    #[allow(unsafe_code)] // rsmpi's API
    unsafe fn immediate_ready_send_with_tag<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
        tag: Tag,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_with_mode(scope, buf, tag, Mode::Ready)
            .or_abort_in("immediate_ready_send_with_tag")
    }

    /// Starts a ready send with tag 0.
    ///
    /// # Safety
    /// See [`Destination::ready_send_with_tag`].
    #[allow(unsafe_code)] // rsmpi's API
    unsafe fn immediate_ready_send<'a, Sc, Buf>(
        &self,
        scope: Sc,
        buf: &'a Buf,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        // SAFETY: forwarded contract.
        unsafe { self.immediate_ready_send_with_tag(scope, buf, 0) }
    }

    /// Starts a send of an owned vector (no scope needed). The vector comes
    /// back from `wait` or `.await`.
    #[track_caller]
    fn immediate_send_owned<T: Equivalence>(&self, data: Vec<T>, tag: Tag) -> SendFuture<T> {
        self.try_immediate_send_owned(data, tag)
            .or_abort_in("immediate_send_owned")
    }

    /// Fallible [`Destination::immediate_send_owned`].
    fn try_immediate_send_owned<T: Equivalence>(
        &self,
        data: Vec<T>,
        tag: Tag,
    ) -> Result<SendFuture<T>, Error> {
        owned_send(self, data, tag, Mode::Standard)
    }

    /// Starts a synchronous send of an owned vector: it completes once the receiver has
    /// matched it with a receive, whatever the message's length, so a sender that keeps
    /// a few in flight never runs ahead of the receives its peer has posted.
    #[track_caller]
    fn immediate_synchronous_send_owned<T: Equivalence>(
        &self,
        data: Vec<T>,
        tag: Tag,
    ) -> SendFuture<T> {
        self.try_immediate_synchronous_send_owned(data, tag)
            .or_abort_in("immediate_synchronous_send_owned")
    }

    /// Fallible [`Destination::immediate_synchronous_send_owned`].
    fn try_immediate_synchronous_send_owned<T: Equivalence>(
        &self,
        data: Vec<T>,
        tag: Tag,
    ) -> Result<SendFuture<T>, Error> {
        owned_send(self, data, tag, Mode::Synchronous)
    }
}

/// Starts a send of an owned vector in `mode` (the owned sends of [`Destination`]).
fn owned_send<D: Destination + ?Sized, T: Equivalence>(
    dest: &D,
    data: Vec<T>,
    tag: Tag,
    mode: Mode,
) -> Result<SendFuture<T>, Error> {
    let comm = &dest.as_communicator().as_handle().0;
    let dst = dest.destination_rank();
    lend::send_owned(comm, dst, tag, data, |d| pack_for(comm, dst, d), mode)
}

impl Destination for crate::topology::Process<'_> {
    fn destination_rank(&self) -> Rank {
        self.rank()
    }
}

// ---- matched probe --------------------------------------------------------------

/// A message taken out of the queue by a matched probe (MPI-3 `MPI_Mprobe`).
#[must_use]
pub struct Message {
    msg: Option<Unexpected>,
    comm: Arc<CommInner>,
}

impl Message {
    fn new(comm: &Arc<CommInner>, u: Unexpected) -> (Message, Status) {
        let st = Status::from_raw(
            comm,
            RawStatus {
                src: u.env.src,
                tag: u.env.tag,
                len: u.env.len as usize,
                cancelled: false,
                big_endian: u.env.flags & crate::envelope::F_BIG_ENDIAN != 0,
            },
        );
        (
            Message {
                msg: Some(u),
                comm: Arc::clone(comm),
            },
            st,
        )
    }

    /// Whether this is the message of the null process (never, here).
    pub fn is_no_proc(&self) -> bool {
        false
    }

    /// The message, taken out to be received (once).
    fn take(&mut self) -> Unexpected {
        self.msg.take().expect("a Message is received once")
    }

    fn post(&mut self, rb: RecvBuf) -> ReqId {
        let u = self.take();
        shared().with(|e| e.core.post_recv_matched(u, rb))
    }

    /// Receives the message as one value.
    #[track_caller]
    pub fn matched_receive<Msg: Equivalence>(mut self) -> (Msg, Status) {
        let id = self.post(RecvBuf::Owned(Vec::new()));
        let c = shared().wait(id);
        let st = Status::from_raw(&self.comm, c.status);
        c.result.or_abort_in("matched_receive");
        (
            one_from_bytes(c.data.unwrap_or_default(), &st).or_abort_in("matched_receive"),
            st,
        )
    }

    /// Receives the message into `buf`.
    #[track_caller]
    pub fn matched_receive_into<Buf: BufferMut + ?Sized>(mut self, buf: &mut Buf) -> Status {
        let msg = self.take();
        lend::matched_wait(&self.comm, msg, RecvInto::of(buf)).or_abort_in("matched_receive_into")
    }

    /// Starts receiving the message into `buf`.
    pub fn immediate_matched_receive_into<'a, Sc, Buf>(
        mut self,
        scope: Sc,
        buf: &'a mut Buf,
    ) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let msg = self.take();
        lend::matched_request(&self.comm, msg, buf, scope)
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        if self.msg.is_some() && !std::thread::panicking() {
            panic!("matched message dropped without receiving.");
        }
    }
}

/// Receiving a matched message into a new vector.
pub trait MatchedReceiveVec {
    /// Receives the whole message.
    fn matched_receive_vec<Msg: Equivalence>(self) -> (Vec<Msg>, Status);
}

impl MatchedReceiveVec for (Message, Status) {
    #[track_caller]
    fn matched_receive_vec<Msg: Equivalence>(self) -> (Vec<Msg>, Status) {
        let (mut m, _) = self;
        let id = m.post(RecvBuf::Owned(Vec::new()));
        let c = shared().wait(id);
        let st = Status::from_raw(&m.comm, c.status);
        c.result.or_abort_in("matched_receive_vec");
        (
            vec_from_bytes(c.data.unwrap_or_default(), &st).or_abort_in("matched_receive_vec"),
            st,
        )
    }
}

// ---- futures ------------------------------------------------------------------------

fn poll_request(id: ReqId, cx: &mut Context<'_>) -> Poll<Completed> {
    let sh = shared();
    let mut e = sh.lock();
    e.progress();
    if let Some(c) = e.core.take(id) {
        sh.unlock_after_progress(e);
        return Poll::Ready(c);
    }
    e.core.set_waker(id, cx.waker());
    sh.unlock_after_progress(e);
    sh.ensure_async_progress();
    Poll::Pending
}

/// A receive of one value that completes later (`immediate_receive`). Also a
/// `Future`, woken by the library's progress, not by user polling.
#[must_use]
pub struct ReceiveFuture<T> {
    inner: ReceiveVecFuture<T>,
}

impl<T: Equivalence> ReceiveFuture<T> {
    fn post(comm: &Arc<CommInner>, src: Option<Rank>, tag: Option<Tag>) -> Result<Self, Error> {
        let id = post_recv(comm, src, tag, RecvBuf::Owned(Vec::new()), false)?;
        Ok(ReceiveFuture {
            inner: ReceiveVecFuture {
                id: Some(id),
                comm: Arc::clone(comm),
                phantom: PhantomData,
            },
        })
    }

    /// Waits for the value.
    #[track_caller]
    pub fn get(self) -> (T, Status) {
        let (v, st) = self.inner.wait().or_abort_in("get");
        (into_one(v).or_abort_in("get"), st)
    }

    /// The value if it has arrived, else the future back.
    #[track_caller]
    pub fn r#try(mut self) -> Result<(T, Status), Self> {
        match self.inner.test() {
            Some(r) => {
                let (v, st) = r.or_abort_in("r");
                Ok((into_one(v).or_abort_in("r"), st))
            }
            None => Err(self),
        }
    }
}

fn into_one<T>(mut v: Vec<T>) -> Result<T, Error> {
    if v.len() != 1 {
        return Err(Error::new(
            ErrorClass::Count,
            format!("expected one value, received {}", v.len()),
        ));
    }
    Ok(v.remove(0))
}

impl<T: Equivalence> std::future::Future for ReceiveFuture<T> {
    type Output = Result<(T, Status), Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner)
            .poll(cx)
            .map(|r| r.and_then(|(v, st)| Ok((into_one(v)?, st))))
    }
}

/// An owned receive of a vector that completes later; also a `Future`.
#[must_use]
pub struct ReceiveVecFuture<T> {
    id: Option<ReqId>,
    comm: Arc<CommInner>,
    phantom: PhantomData<fn() -> T>,
}

impl<T: Equivalence> ReceiveVecFuture<T> {
    fn convert(&self, c: Completed) -> Result<(Vec<T>, Status), Error> {
        let st = Status::from_raw(&self.comm, c.status);
        c.result?;
        Ok((vec_from_bytes(c.data.unwrap_or_default(), &st)?, st))
    }

    /// Blocks until the message is there.
    pub fn wait(mut self) -> Result<(Vec<T>, Status), Error> {
        let id = self.id.take().expect("a live future");
        let c = shared().wait(id);
        self.convert(c)
    }

    /// The message if it is there.
    pub fn test(&mut self) -> Option<Result<(Vec<T>, Status), Error>> {
        let id = self.id?;
        let c = shared().test(id)?;
        self.id = None;
        Some(self.convert(c))
    }

    /// Cancels the receive if it has not matched yet; returns whether it did.
    pub fn cancel(&mut self) -> bool {
        match self.id {
            Some(id) => shared().with(|e| e.core.cancel(id)),
            None => false,
        }
    }
}

impl<T: Equivalence> std::future::Future for ReceiveVecFuture<T> {
    type Output = Result<(Vec<T>, Status), Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(id) = self.id else {
            return Poll::Ready(Err(Error::new(
                ErrorClass::Arg,
                "future polled after completion",
            )));
        };
        match poll_request(id, cx) {
            Poll::Ready(c) => {
                self.id = None;
                Poll::Ready(self.convert(c))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T> Drop for ReceiveVecFuture<T> {
    fn drop(&mut self) {
        // An abandoned receive must not match later messages: cancel it, or
        // if it already matched let it finish on its own.
        if let (Some(id), Some(sh)) = (self.id, crate::environment::try_shared()) {
            sh.with(|e| {
                if !e.core.cancel(id) {
                    e.core.detach(id);
                } else {
                    e.core.release(id);
                }
            });
        }
    }
}

/// An owned send that completes later; gives the vector back. Also a `Future`.
#[must_use]
pub struct SendFuture<T> {
    id: Option<ReqId>,
    data: Option<Vec<T>>,
}

impl<T> SendFuture<T> {
    /// The future of send `id` over `data`, which it keeps until the send completes.
    pub(crate) fn new(id: ReqId, data: Vec<T>) -> SendFuture<T> {
        SendFuture {
            id: Some(id),
            data: Some(data),
        }
    }

    /// Blocks until the send is complete and returns the vector.
    pub fn wait(mut self) -> Result<Vec<T>, Error> {
        let id = self.id.take().expect("a live future");
        shared().wait(id).result?;
        Ok(self.data.take().unwrap_or_default())
    }

    /// The vector back if the send is complete.
    pub fn test(&mut self) -> Option<Result<Vec<T>, Error>> {
        let id = self.id?;
        let c = shared().test(id)?;
        self.id = None;
        Some(c.result.map(|_| self.data.take().unwrap_or_default()))
    }
}

impl<T> Unpin for SendFuture<T> {}

impl<T> std::future::Future for SendFuture<T> {
    type Output = Result<Vec<T>, Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(id) = self.id else {
            return Poll::Ready(Err(Error::new(
                ErrorClass::Arg,
                "future polled after completion",
            )));
        };
        match poll_request(id, cx) {
            Poll::Ready(c) => {
                self.id = None;
                Poll::Ready(c.result.map(|_| self.data.take().unwrap_or_default()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T> Drop for SendFuture<T> {
    fn drop(&mut self) {
        // The engine may still read the vector: wait before freeing it.
        if let (Some(id), Some(sh)) = (self.id, crate::environment::try_shared()) {
            let _ = sh.wait(id);
        }
    }
}

// ---- send-receive ---------------------------------------------------------------------

/// Sends `msg` to `destination` with `sendtag` and receives a value from
/// `source` with `receivetag`, without deadlock (MPI-1.2 §3.10).
pub fn send_receive_with_tags<M, D, R, S>(
    msg: &M,
    destination: &D,
    sendtag: Tag,
    source: &S,
    receivetag: Tag,
) -> (R, Status)
where
    M: Equivalence,
    D: Destination,
    R: Equivalence,
    S: Source,
{
    let f = source.immediate_receive_with_tag::<R>(receivetag);
    destination.send_with_tag(msg, sendtag);
    f.get()
}

/// [`send_receive_with_tags`] with send tag 0 and any receive tag.
pub fn send_receive<R, M, D, S>(msg: &M, destination: &D, source: &S) -> (R, Status)
where
    M: Equivalence,
    D: Destination,
    R: Equivalence,
    S: Source,
{
    let f = source.immediate_receive::<R>();
    destination.send(msg);
    f.get()
}

/// Sends a buffer and receives into another.
pub fn send_receive_into_with_tags<M, D, B, S>(
    msg: &M,
    destination: &D,
    sendtag: Tag,
    buf: &mut B,
    source: &S,
    receivetag: Tag,
) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    crate::request::scope(|scope| {
        let r = source.immediate_receive_into_with_tag(scope, buf, receivetag);
        destination.send_with_tag(msg, sendtag);
        r.wait()
    })
}

/// [`send_receive_into_with_tags`] with send tag 0 and any receive tag.
pub fn send_receive_into<M, D, B, S>(msg: &M, destination: &D, buf: &mut B, source: &S) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    crate::request::scope(|scope| {
        let r = source.immediate_receive_into(scope, buf);
        destination.send(msg);
        r.wait()
    })
}

/// Sends the contents of `buf` and replaces them with the received message.
pub fn send_receive_replace_into_with_tags<B, D, S>(
    buf: &mut B,
    destination: &D,
    sendtag: Tag,
    source: &S,
    receivetag: Tag,
) -> Status
where
    B: BufferMut + Buffer + ?Sized,
    D: Destination,
    S: Source,
{
    replace(buf, destination, sendtag, source, Some(receivetag))
}

/// [`send_receive_replace_into_with_tags`] with send tag 0 and any receive tag.
pub fn send_receive_replace_into<B, D, S>(buf: &mut B, destination: &D, source: &S) -> Status
where
    B: BufferMut + Buffer + ?Sized,
    D: Destination,
    S: Source,
{
    replace(buf, destination, 0, source, None)
}

/// Sends a copy of `buf` (converted for the destination's meta host like
/// every typed send) and receives into `buf`.
#[track_caller]
fn replace<B, D, S>(
    buf: &mut B,
    destination: &D,
    sendtag: Tag,
    source: &S,
    tag: Option<Tag>,
) -> Status
where
    B: BufferMut + Buffer + ?Sized,
    D: Destination,
    S: Source,
{
    let comm = &destination.as_communicator().as_handle().0;
    let dst = destination.destination_rank();
    let copy = match pack_for(comm, dst, &*buf) {
        Packed::Dense(b) => b.to_vec(),
        Packed::Packed(v) => v,
    };
    let id = post_send(
        comm,
        dst,
        sendtag,
        SendBuf::Owned(copy),
        Mode::Standard,
        false,
    )
    .or_abort_in("replace");
    let st = source
        .try_receive_into_with_tag(buf, tag)
        .or_abort_in("replace");
    shared().wait(id).result.or_abort_in("replace");
    st
}
