//! Point-to-point communication (MPI-4 §3): every send mode, blocking and
//! nonblocking and persistent receives, send-receive, probes and matched
//! probes, and the counts a status holds. Each call goes straight to the
//! engine the Rust API uses.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use metampi::datatype::abi as dtabi;
use metampi::datatype::UncommittedDatatype;
use metampi::point_to_point::{Destination, Message, Mode, Source};
use metampi::topology::Communicator;

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw::{self, CBuf, CScope};
use crate::req::{self, CStatus, Req, Spec, St};
use crate::state::{self, CommEntry};
use crate::types;

fn check_tag(tag: c_int) -> R {
    if !(0..=TAG_UB_VALUE).contains(&tag) {
        return Err(Fail::new(
            ERR_TAG,
            format!("tag {tag} is outside 0..=MPI_TAG_UB"),
        ));
    }
    Ok(())
}

fn check_rank(c: &CommEntry, r: c_int, what: &str) -> R {
    if r < 0 || r >= c.comm.target_size() {
        return Err(Fail::new(
            ERR_RANK,
            format!(
                "{what} {r} is not a rank of a communicator of {}",
                c.comm.target_size()
            ),
        ));
    }
    Ok(())
}

fn recv_tag(tag: c_int) -> R<Option<c_int>> {
    if tag == ANY_TAG {
        return Ok(None);
    }
    check_tag(tag)?;
    Ok(Some(tag))
}

/// Blocking send in `mode`.
fn send(
    buf: *const c_void,
    count: c_int,
    dt: Handle,
    dest: c_int,
    tag: c_int,
    comm: Handle,
    mode: Mode,
) -> R {
    let c = state::comm(comm)?;
    let b = types::buf(buf, count, dt)?;
    if dest == PROC_NULL {
        return Ok(());
    }
    check_tag(tag)?;
    check_rank(&c, dest, "destination")?;
    c.comm
        .process_at_rank(dest)
        .try_send_with_mode(&b, tag, mode)?;
    Ok(())
}

/// Starts a send: the request, or a finished one where the transport took it at once.
pub fn start_send(c: &CommEntry, b: CBuf, dest: c_int, tag: c_int, mode: Mode) -> R<Req> {
    if dest == PROC_NULL {
        return Ok(Req::Done(St::EMPTY, SUCCESS));
    }
    check_tag(tag)?;
    check_rank(c, dest, "destination")?;
    let r = c
        .comm
        .process_at_rank(dest)
        .immediate_with_mode(CScope, &b, tag, mode)?;
    Ok(Req::Live {
        r: raw::detach(r),
        keep: Vec::new(),
    })
}

/// Starts a receive.
pub fn start_recv(c: &CommEntry, mut b: CBuf, source: c_int, tag: c_int) -> R<Req> {
    let tag = recv_tag(tag)?;
    let r = match source {
        PROC_NULL => return Ok(Req::Done(St::EMPTY, SUCCESS)),
        ANY_SOURCE => c
            .comm
            .any_process()
            .try_immediate_receive_into(CScope, &mut b, tag)?,
        s => {
            check_rank(c, s, "source")?;
            c.comm
                .process_at_rank(s)
                .try_immediate_receive_into(CScope, &mut b, tag)?
        }
    };
    Ok(Req::Live {
        r: raw::detach(r),
        keep: Vec::new(),
    })
}

fn isend(
    buf: *const c_void,
    count: c_int,
    dt: Handle,
    dest: c_int,
    tag: c_int,
    comm: Handle,
    req: *mut Handle,
    mode: Mode,
) -> R {
    let c = state::comm(comm)?;
    let b = types::buf(buf, count, dt)?;
    let r = start_send(&c, b, dest, tag, mode)?;
    raw::put(req, req::handle_of(r))
}

/// The elements of a partitioned transfer: `partitions` of `count` each. Partitioned
/// messages travel as one message on the communicator with the tag given.
fn partitioned(partitions: c_int, count: c_int) -> R<c_int> {
    if partitions < 0 || count < 0 {
        return Err(Fail::new(
            ERR_COUNT,
            format!("{partitions} partitions of {count} elements: neither may be negative"),
        ));
    }
    partitions.checked_mul(count).ok_or_else(|| {
        Fail::new(
            ERR_COUNT,
            format!("{partitions} partitions of {count} elements exceed 2^31-1 elements"),
        )
    })
}

fn send_init(
    buf: *const c_void,
    count: c_int,
    dt: Handle,
    dest: c_int,
    tag: c_int,
    comm: Handle,
    req: *mut Handle,
    mode: Mode,
) -> R {
    let c = state::comm(comm)?;
    let b = types::buf(buf, count, dt)?;
    if dest != PROC_NULL {
        check_tag(tag)?;
        check_rank(&c, dest, "destination")?;
    }
    let spec = Spec::Send {
        buf: b,
        dest,
        tag,
        comm: c,
        mode,
    };
    raw::put(req, req::insert(Req::Persistent { spec, active: None }))
}

fn recv_init(
    buf: *mut c_void,
    count: c_int,
    dt: Handle,
    source: c_int,
    tag: c_int,
    comm: Handle,
    req: *mut Handle,
) -> R {
    let c = state::comm(comm)?;
    let b = types::buf(buf, count, dt)?;
    recv_tag(tag)?;
    if source >= 0 {
        check_rank(&c, source, "source")?;
    }
    let spec = Spec::Recv {
        buf: b,
        source,
        tag,
        comm: c,
    };
    raw::put(req, req::insert(Req::Persistent { spec, active: None }))
}

/// A blocking receive from `source` (a rank, `MPI_ANY_SOURCE` or `MPI_PROC_NULL`).
fn recv_into(c: &CommEntry, mut b: CBuf, source: c_int, tag: c_int) -> R<St> {
    let tag = recv_tag(tag)?;
    let s = match source {
        PROC_NULL => return Ok(St::EMPTY),
        ANY_SOURCE => c
            .comm
            .any_process()
            .try_receive_into_with_tag(&mut b, tag)?,
        s => {
            check_rank(c, s, "source")?;
            c.comm
                .process_at_rank(s)
                .try_receive_into_with_tag(&mut b, tag)?
        }
    };
    Ok(St::of(&s))
}

fn probe_status(c: &CommEntry, source: c_int, tag: c_int, block: bool) -> R<Option<St>> {
    let t = recv_tag(tag)?;
    let s = match (source, block) {
        (PROC_NULL, _) => return Ok(Some(St::EMPTY)),
        (ANY_SOURCE, true) => Some(c.comm.any_process().try_probe_with_tag(t)?),
        (ANY_SOURCE, false) => match t {
            Some(t) => c.comm.any_process().immediate_probe_with_tag(t),
            None => c.comm.any_process().immediate_probe(),
        },
        (s, block) => {
            check_rank(c, s, "source")?;
            let p = c.comm.process_at_rank(s);
            match (block, t) {
                (true, _) => Some(p.try_probe_with_tag(t)?),
                (false, Some(t)) => p.immediate_probe_with_tag(t),
                (false, None) => p.immediate_probe(),
            }
        }
    };
    Ok(s.map(|s| St::of(&s)))
}

/// A send and a receive under way at once (`MPI_Sendrecv`): the receive's status.
fn exchange(
    c: &CommEntry,
    sb: CBuf,
    dest: c_int,
    stag: c_int,
    rb: CBuf,
    source: c_int,
    rtag: c_int,
) -> R<St> {
    let r = start_recv(c, rb, source, rtag)?;
    let s = start_send(c, sb, dest, stag, Mode::Standard);
    let sent = s.and_then(req::wait_now);
    let got = req::wait_now(r)?;
    sent?;
    Ok(got)
}

/// `MPI_Isendrecv`: the receive and the send started, as one request with the
/// receive's status. The send's arguments are checked before the receive is posted,
/// so a refused call leaves nothing under way. `keep` (a packed copy the send reads)
/// lives as long as the send.
fn exchange_start(
    c: &CommEntry,
    sb: CBuf,
    dest: c_int,
    stag: c_int,
    rb: CBuf,
    source: c_int,
    rtag: c_int,
    keep: Option<Vec<u8>>,
) -> R<Req> {
    if dest != PROC_NULL {
        check_tag(stag)?;
        check_rank(c, dest, "destination")?;
    }
    let r = start_recv(c, rb, source, rtag)?;
    let mut s = start_send(c, sb, dest, stag, Mode::Standard)?;
    if let (Req::Live { keep: k, .. }, Some(t)) = (&mut s, keep) {
        k.push(Box::new(t));
    }
    Ok(Req::Multi {
        parts: vec![(true, r), (false, s)],
        st: St::EMPTY,
        fail: None,
    })
}

/// `count` elements of `b` (at `buf`) packed into a byte buffer, and a buffer over it
/// to send from (send-receive-replace receives into the original).
fn packed_copy(buf: *const c_void, count: c_int, b: &CBuf) -> R<(CBuf, Vec<u8>)> {
    let id = b.dt.type_id();
    let mut tmp = vec![0u8; dtabi::layout(id).size * count.max(0) as usize];
    types::pack_into(buf, count.max(0) as usize, id, &mut tmp);
    let sb = types::buf(
        tmp.as_ptr() as *const c_void,
        tmp.len() as c_int,
        DATATYPE_BYTE,
    )?;
    Ok((sb, tmp))
}

/// Messages taken by matched probes, behind `MPI_Message` handles.
static MESSAGES: Mutex<Vec<Option<Message>>> = Mutex::new(Vec::new());

fn new_message(m: Message) -> Handle {
    let mut g = MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
    let i = match g.iter().position(Option::is_none) {
        Some(i) => {
            g[i] = Some(m);
            i
        }
        None => {
            g.push(Some(m));
            g.len() - 1
        }
    };
    (MESSAGE_BASE | i as u32) as Handle
}

fn take_message(h: Handle) -> R<Message> {
    let u = h as u32;
    let mut g = MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
    if u & !INDEX_MASK == MESSAGE_BASE {
        if let Some(m) = g.get_mut((u & INDEX_MASK) as usize).and_then(Option::take) {
            return Ok(m);
        }
    }
    Err(Fail::new(
        ERR_REQUEST,
        format!("{h:#x} is not a matched message"),
    ))
}

fn mprobe(c: &CommEntry, source: c_int, tag: c_int, block: bool) -> R<Option<(Handle, St)>> {
    let t = recv_tag(tag)?;
    let got = match (source, block) {
        (PROC_NULL, _) => return Ok(Some((MESSAGE_NO_PROC, St::EMPTY))),
        (ANY_SOURCE, true) => Some(c.comm.any_process().try_matched_probe(t)?),
        (ANY_SOURCE, false) => match t {
            Some(t) => c.comm.any_process().immediate_matched_probe_with_tag(t),
            None => c.comm.any_process().immediate_matched_probe(),
        },
        (s, block) => {
            check_rank(c, s, "source")?;
            let p = c.comm.process_at_rank(s);
            match (block, t) {
                (true, _) => Some(p.try_matched_probe(t)?),
                (false, Some(t)) => p.immediate_matched_probe_with_tag(t),
                (false, None) => p.immediate_matched_probe(),
            }
        }
    };
    Ok(got.map(|(m, s)| (new_message(m), St::of(&s))))
}

mpi! {
    fn MPI_Send / PMPI_Send(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle) {
        send(buf, count, dt, dest, tag, comm, Mode::Standard)
    }
    fn MPI_Ssend / PMPI_Ssend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle) {
        send(buf, count, dt, dest, tag, comm, Mode::Synchronous)
    }
    fn MPI_Bsend / PMPI_Bsend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle) {
        send(buf, count, dt, dest, tag, comm, Mode::Buffered)
    }
    fn MPI_Rsend / PMPI_Rsend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle) {
        send(buf, count, dt, dest, tag, comm, Mode::Ready)
    }
    fn MPI_Isend / PMPI_Isend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        isend(buf, count, dt, dest, tag, comm, req, Mode::Standard)
    }
    fn MPI_Issend / PMPI_Issend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        isend(buf, count, dt, dest, tag, comm, req, Mode::Synchronous)
    }
    fn MPI_Ibsend / PMPI_Ibsend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        isend(buf, count, dt, dest, tag, comm, req, Mode::Buffered)
    }
    fn MPI_Irsend / PMPI_Irsend(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        isend(buf, count, dt, dest, tag, comm, req, Mode::Ready)
    }
    fn MPI_Send_init / PMPI_Send_init(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        send_init(buf, count, dt, dest, tag, comm, req, Mode::Standard)
    }
    fn MPI_Ssend_init / PMPI_Ssend_init(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        send_init(buf, count, dt, dest, tag, comm, req, Mode::Synchronous)
    }
    fn MPI_Bsend_init / PMPI_Bsend_init(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        send_init(buf, count, dt, dest, tag, comm, req, Mode::Buffered)
    }
    fn MPI_Rsend_init / PMPI_Rsend_init(buf: *const c_void, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        send_init(buf, count, dt, dest, tag, comm, req, Mode::Ready)
    }
    fn MPI_Recv_init / PMPI_Recv_init(buf: *mut c_void, count: c_int, dt: Handle, source: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        recv_init(buf, count, dt, source, tag, comm, req)
    }
    fn MPI_Psend_init / PMPI_Psend_init(buf: *const c_void, partitions: c_int, count: c_int, dt: Handle, dest: c_int, tag: c_int, comm: Handle, _info: Handle, req: *mut Handle) {
        let n = partitioned(partitions, count)?;
        let mut h = REQUEST_NULL;
        send_init(buf, n, dt, dest, tag, comm, &mut h, Mode::Standard)?;
        let Req::Persistent { spec, .. } = req::take_out(h)? else {
            return Err(Fail::new(ERR_INTERN, "send_init made no persistent request"));
        };
        let spec = Spec::Psend { send: Box::new(spec), ready: vec![false; partitions as usize] };
        raw::put(req, req::insert(Req::Persistent { spec, active: None }))
    }
    fn MPI_Precv_init / PMPI_Precv_init(buf: *mut c_void, partitions: c_int, count: c_int, dt: Handle, source: c_int, tag: c_int, comm: Handle, _info: Handle, req: *mut Handle) {
        if source == ANY_SOURCE || tag == ANY_TAG {
            return Err(Fail::arg("a partitioned receive names its source and tag (no wildcards)"));
        }
        recv_init(buf, partitioned(partitions, count)?, dt, source, tag, comm, req)
    }
    fn MPI_Recv / PMPI_Recv(buf: *mut c_void, count: c_int, dt: Handle, source: c_int, tag: c_int, comm: Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        let b = types::buf(buf, count, dt)?;
        let st = recv_into(&c, b, source, tag)?;
        st.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Irecv / PMPI_Irecv(buf: *mut c_void, count: c_int, dt: Handle, source: c_int, tag: c_int, comm: Handle, req: *mut Handle) {
        let c = state::comm(comm)?;
        let b = types::buf(buf, count, dt)?;
        let r = start_recv(&c, b, source, tag)?;
        raw::put(req, req::insert(r))
    }
    fn MPI_Sendrecv / PMPI_Sendrecv(sbuf: *const c_void, scount: c_int, sdt: Handle, dest: c_int, stag: c_int,
        rbuf: *mut c_void, rcount: c_int, rdt: Handle, source: c_int, rtag: c_int, comm: Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        let sb = types::buf(sbuf, scount, sdt)?;
        let rb = types::buf(rbuf, rcount, rdt)?;
        exchange(&c, sb, dest, stag, rb, source, rtag)?.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Sendrecv_replace / PMPI_Sendrecv_replace(buf: *mut c_void, count: c_int, dt: Handle, dest: c_int, stag: c_int,
        source: c_int, rtag: c_int, comm: Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        let b = types::buf(buf, count, dt)?;
        let (sb, _tmp) = packed_copy(buf, count, &b)?;
        exchange(&c, sb, dest, stag, b, source, rtag)?.write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Isendrecv / PMPI_Isendrecv(sbuf: *const c_void, scount: c_int, sdt: Handle, dest: c_int, stag: c_int,
        rbuf: *mut c_void, rcount: c_int, rdt: Handle, source: c_int, rtag: c_int, comm: Handle, req: *mut Handle) {
        let c = state::comm(comm)?;
        let sb = types::buf(sbuf, scount, sdt)?;
        let rb = types::buf(rbuf, rcount, rdt)?;
        raw::put(req, req::insert(exchange_start(&c, sb, dest, stag, rb, source, rtag, None)?))
    }
    fn MPI_Isendrecv_replace / PMPI_Isendrecv_replace(buf: *mut c_void, count: c_int, dt: Handle, dest: c_int, stag: c_int,
        source: c_int, rtag: c_int, comm: Handle, req: *mut Handle) {
        let c = state::comm(comm)?;
        let b = types::buf(buf, count, dt)?;
        let (sb, tmp) = packed_copy(buf, count, &b)?;
        raw::put(req, req::insert(exchange_start(&c, sb, dest, stag, b, source, rtag, Some(tmp))?))
    }
    fn MPI_Probe / PMPI_Probe(source: c_int, tag: c_int, comm: Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        if let Some(st) = probe_status(&c, source, tag, true)? {
            st.write(status, SUCCESS);
        }
        Ok(())
    }
    fn MPI_Iprobe / PMPI_Iprobe(source: c_int, tag: c_int, comm: Handle, flag: *mut c_int, status: *mut CStatus) {
        let c = state::comm(comm)?;
        match probe_status(&c, source, tag, false)? {
            Some(st) => {
                st.write(status, SUCCESS);
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Mprobe / PMPI_Mprobe(source: c_int, tag: c_int, comm: Handle, msg: *mut Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        if let Some((m, st)) = mprobe(&c, source, tag, true)? {
            st.write(status, SUCCESS);
            raw::put(msg, m)?;
        }
        Ok(())
    }
    fn MPI_Improbe / PMPI_Improbe(source: c_int, tag: c_int, comm: Handle, flag: *mut c_int, msg: *mut Handle, status: *mut CStatus) {
        let c = state::comm(comm)?;
        match mprobe(&c, source, tag, false)? {
            Some((m, st)) => {
                st.write(status, SUCCESS);
                raw::put(msg, m)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Mrecv / PMPI_Mrecv(buf: *mut c_void, count: c_int, dt: Handle, msg: *mut Handle, status: *mut CStatus) {
        state::check_init()?;
        let h = raw::get(msg)?;
        let mut b = types::buf(buf, count, dt)?;
        if h == MESSAGE_NO_PROC {
            St::EMPTY.write(status, SUCCESS);
            return raw::put(msg, MESSAGE_NULL);
        }
        let m = take_message(h)?;
        raw::put(msg, MESSAGE_NULL)?;
        let r = m.immediate_matched_receive_into(CScope, &mut b);
        let s = raw::detach(r).try_wait()?;
        St::of(&s).write(status, SUCCESS);
        Ok(())
    }
    fn MPI_Imrecv / PMPI_Imrecv(buf: *mut c_void, count: c_int, dt: Handle, msg: *mut Handle, req: *mut Handle) {
        state::check_init()?;
        let h = raw::get(msg)?;
        let mut b = types::buf(buf, count, dt)?;
        if h == MESSAGE_NO_PROC {
            raw::put(msg, MESSAGE_NULL)?;
            return raw::put(req, req::done(St::EMPTY));
        }
        let m = take_message(h)?;
        raw::put(msg, MESSAGE_NULL)?;
        let r = m.immediate_matched_receive_into(CScope, &mut b);
        raw::put(req, req::live(raw::detach(r), Vec::new()))
    }
    fn MPI_Get_count / PMPI_Get_count(status: *const CStatus, dt: Handle, count: *mut c_int) {
        let s = raw::get(status)?;
        let size = types::size_of(dt)? as u64;
        let bytes = req::status_bytes(&s);
        let n = match size {
            0 => 0,
            s if bytes % s != 0 => UNDEFINED,
            s => c_int::try_from(bytes / s).unwrap_or(UNDEFINED),
        };
        raw::put(count, n)
    }
    fn MPI_Get_elements / PMPI_Get_elements(status: *const CStatus, dt: Handle, count: *mut c_int) {
        let s = raw::get(status)?;
        let id = types::type_id_any(dt)?;
        let n = dtabi::elements(id, req::status_bytes(&s) as usize)
            .and_then(|n| c_int::try_from(n).ok())
            .unwrap_or(UNDEFINED);
        raw::put(count, n)
    }
    fn MPI_Get_elements_x / PMPI_Get_elements_x(status: *const CStatus, dt: Handle, count: *mut i64) {
        let s = raw::get(status)?;
        let id = types::type_id_any(dt)?;
        let n = dtabi::elements(id, req::status_bytes(&s) as usize).map_or(UNDEFINED as i64, |n| n as i64);
        raw::put(count, n)
    }
    fn MPI_Status_set_elements / PMPI_Status_set_elements(status: *mut CStatus, dt: Handle, count: c_int) {
        let mut s = raw::get(status as *const CStatus)?;
        let b = types::size_of(dt)? as u64 * count.max(0) as u64;
        s.count_lo = b as u32 as c_int;
        s.count_hi_and_cancelled = (((b >> 32) as c_int) << 1) | (s.count_hi_and_cancelled & 1);
        raw::put(status, s)
    }
    fn MPI_Status_set_cancelled / PMPI_Status_set_cancelled(status: *mut CStatus, flag: c_int) {
        let mut s = raw::get(status as *const CStatus)?;
        s.count_hi_and_cancelled = (s.count_hi_and_cancelled & !1) | (flag != 0) as c_int;
        raw::put(status, s)
    }
}
