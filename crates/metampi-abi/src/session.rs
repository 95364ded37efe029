//! Sessions (MPI-4 §11.3): `MPI_Session_init` and the process sets a session
//! sees, `mpi://WORLD` and `mpi://SELF`, their groups, and communicators made
//! from a group without a parent (`MPI_Comm_create_from_group`).
//!
//! A session shares the engine with the world model: the first of the two to
//! start starts it, `MPI_Init` after a session takes over the session's engine,
//! and the engine ends with `MPI_Finalize` or, when sessions alone started it,
//! with the last `MPI_Session_finalize` (metampi's engine starts once per process).

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use metampi::topology::Communicator;

use crate::consts::*;
use crate::err::{self, Fail, R};
use crate::raw;
use crate::state::{self, Table};

/// A session: its error handler (the rest is the engine's).
#[derive(Clone)]
pub struct Session {
    errh: Handle,
}

static SESSIONS: Table<Session> = Table::new(SESSION_BASE);
/// How many sessions are open.
static OPEN: Mutex<usize> = Mutex::new(0);

/// The process sets every session sees, in `MPI_Session_get_nth_pset` order.
const PSETS: [&str; 2] = ["mpi://WORLD", "mpi://SELF"];

/// The session behind `h`; a failure of the running call goes to its error handler.
fn session(h: Handle) -> R<Session> {
    let s = SESSIONS
        .get(h)
        .ok_or_else(|| Fail::new(ERR_SESSION, format!("{h:#x} is not a session")))?;
    err::on_comm(h);
    Ok(s)
}

/// The error handler of session `h`, if `h` is one (for `state::errhandler_of`).
pub fn errhandler_of(h: Handle) -> Option<Handle> {
    ((h as u32) & !INDEX_MASK == SESSION_BASE)
        .then(|| SESSIONS.get(h).map(|s| s.errh))
        .flatten()
}

/// World ranks of process set `name`.
fn pset(name: &str) -> R<Vec<u32>> {
    match name.to_ascii_lowercase().as_str() {
        "mpi://world" => {
            Ok((0..metampi::topology::SimpleCommunicator::world().size() as u32).collect())
        }
        "mpi://self" => Ok(vec![state::my_world_rank()]),
        _ => Err(Fail::arg(format!(
            "no process set is called {name:?} (there are {})",
            PSETS.join(" and ")
        ))),
    }
}

fn new_info(pairs: &[(&str, String)]) -> Handle {
    let mut i = crate::env::Info::default();
    for (k, v) in pairs {
        i.0.insert(k.to_string(), v.clone());
    }
    crate::env::INFOS.insert(i)
}

mpi! {
    fn MPI_Session_init / PMPI_Session_init(_info: Handle, errh: Handle, out: *mut Handle) {
        if errh != ERRHANDLER_NULL && state::handler(errh).is_none() {
            return Err(Fail::arg(format!("{errh:#x} is not an error handler")));
        }
        state::init_for_session()?;
        let errh = if errh == ERRHANDLER_NULL { ERRORS_ARE_FATAL } else { errh };
        *OPEN.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        raw::put(out, SESSIONS.insert(Session { errh }))
    }
    fn MPI_Session_finalize / PMPI_Session_finalize(h: *mut Handle) {
        let s = raw::get(h)?;
        session(s)?;
        SESSIONS.remove(s);
        raw::put(h, SESSION_NULL)?;
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        *open = open.saturating_sub(1);
        if *open == 0 {
            drop(open);
            state::finalize_for_sessions()?;
        }
        Ok(())
    }
    fn MPI_Session_get_num_psets / PMPI_Session_get_num_psets(h: Handle, _info: Handle, n: *mut c_int) {
        session(h)?;
        raw::put(n, PSETS.len() as c_int)
    }
    fn MPI_Session_get_nth_pset / PMPI_Session_get_nth_pset(h: Handle, _info: Handle, n: c_int, len: *mut c_int, name: *mut c_char) {
        session(h)?;
        let p = usize::try_from(n).ok().and_then(|n| PSETS.get(n)).ok_or_else(|| {
            Fail::arg(format!("there is no process set {n}: there are {}", PSETS.len()))
        })?;
        let cap = raw::get(len)?;
        // A length of 0 asks how long the name is (with its terminating NUL).
        if cap > 0 {
            raw::put_str(name, cap as usize, p)?;
        }
        raw::put(len, p.len() as c_int + 1)
    }
    fn MPI_Session_get_info / PMPI_Session_get_info(h: Handle, info: *mut Handle) {
        session(h)?;
        let level = match state::THREAD_LEVEL.load(Ordering::Relaxed) {
            THREAD_SINGLE => "MPI_THREAD_SINGLE",
            THREAD_FUNNELED => "MPI_THREAD_FUNNELED",
            THREAD_SERIALIZED => "MPI_THREAD_SERIALIZED",
            _ => "MPI_THREAD_MULTIPLE",
        };
        raw::put(info, new_info(&[("thread_level", level.to_string())]))
    }
    fn MPI_Session_get_pset_info / PMPI_Session_get_pset_info(h: Handle, name: *const c_char, info: *mut Handle) {
        session(h)?;
        let ranks = pset(&raw::c_str(name)?)?;
        raw::put(info, new_info(&[("mpi_size", ranks.len().to_string())]))
    }
    fn MPI_Group_from_session_pset / PMPI_Group_from_session_pset(h: Handle, name: *const c_char, grp: *mut Handle) {
        session(h)?;
        let ranks = pset(&raw::c_str(name)?)?;
        raw::put(grp, state::new_group(ranks))
    }
    fn MPI_Comm_create_from_group / PMPI_Comm_create_from_group(grp: Handle, stringtag: *const c_char, _info: Handle, errh: Handle, new: *mut Handle) {
        state::check_init()?;
        let g = state::group(grp)?;
        let tag = crate::comm::string_tag(&raw::c_str(stringtag)?);
        let world = state::comm(COMM_WORLD)?;
        let s = world.comm.split_by_subgroup_with_tag(&g, tag).ok_or_else(|| {
            Fail::new(ERR_GROUP, "this process is not a member of the group")
        })?;
        let errh = if errh == ERRHANDLER_NULL { ERRORS_ARE_FATAL } else { errh };
        raw::put(new, state::new_comm(s, errh))
    }
    fn MPI_Session_set_errhandler / PMPI_Session_set_errhandler(h: Handle, errh: Handle) {
        session(h)?;
        if state::handler(errh).is_none() {
            return Err(Fail::arg(format!("{errh:#x} is not an error handler")));
        }
        SESSIONS.set(h, Session { errh });
        Ok(())
    }
    fn MPI_Session_get_errhandler / PMPI_Session_get_errhandler(h: Handle, errh: *mut Handle) {
        raw::put(errh, session(h)?.errh)
    }
    fn MPI_Session_create_errhandler / PMPI_Session_create_errhandler(f: Option<err::HandlerFn>, h: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the error handler function is null"))?;
        raw::put(h, state::ERRHANDLERS.insert(f))
    }
    fn MPI_Session_call_errhandler / PMPI_Session_call_errhandler(h: Handle, code: c_int) {
        session(h)?;
        err::raise_through("MPI_Session_call_errhandler", h, code);
        Ok(())
    }
}

mpi! {
    // Buffers attached to a session (MPI-4.1), kept beside the communicators' (`env`).
    fn MPI_Session_attach_buffer / PMPI_Session_attach_buffer(s: Handle, buffer: *mut c_void, size: c_int) {
        session(s)?;
        crate::env::attach_to(s, buffer, size as i64)
    }
    fn MPI_Session_attach_buffer_c / PMPI_Session_attach_buffer_c(s: Handle, buffer: *mut c_void, size: i64) {
        session(s)?;
        crate::env::attach_to(s, buffer, size)
    }
    fn MPI_Session_detach_buffer / PMPI_Session_detach_buffer(s: Handle, buffer: *mut *mut c_void, size: *mut c_int) {
        session(s)?;
        let (p, n) = crate::env::detach_from(s)?;
        raw::put(buffer, p as *mut c_void)?;
        raw::put(size, c_int::try_from(n).unwrap_or(c_int::MAX))
    }
    fn MPI_Session_detach_buffer_c / PMPI_Session_detach_buffer_c(s: Handle, buffer: *mut *mut c_void, size: *mut i64) {
        session(s)?;
        let (p, n) = crate::env::detach_from(s)?;
        raw::put(buffer, p as *mut c_void)?;
        raw::put(size, n)
    }
    fn MPI_Session_flush_buffer / PMPI_Session_flush_buffer(s: Handle) {
        session(s).map(drop)
    }
    fn MPI_Session_iflush_buffer / PMPI_Session_iflush_buffer(s: Handle, req: *mut Handle) {
        session(s)?;
        raw::put(req, crate::req::done(crate::req::St::EMPTY))
    }
}
