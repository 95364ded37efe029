//! The environment (MPI-4 §9, §11): start and end, thread levels, clocks,
//! names and versions, memory, error handlers and strings, info objects,
//! buffered-send buffers, and Fortran handle conversion.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::consts::*;
use crate::err::{self, Fail, HandlerFn, R};
use crate::raw;
use crate::state::{self, Table};

/// MPICH's questions whether device memory may be passed as a buffer. They answer with a
/// truth value, not an error code: metampi reads and writes host memory only, so no.
macro_rules! answers_no {
    ($($name:ident / $pname:ident),*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname() -> c_int {
            0
        }
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            $pname()
        }
    )*};
}

answers_no!(
    MPIX_Query_cuda_support / PMPIX_Query_cuda_support,
    MPIX_Query_hip_support / PMPIX_Query_hip_support,
    MPIX_Query_ze_support / PMPIX_Query_ze_support
);

mpi! {
    fn MPIX_GPU_query_support / PMPIX_GPU_query_support(_gpu_type: c_int, is_supported: *mut c_int) {
        raw::put(is_supported, 0)
    }
    fn MPI_Init / PMPI_Init(_argc: *mut c_int, _argv: *mut c_void) {
        state::init(THREAD_SINGLE).map(|_| ())
    }
    fn MPI_Init_thread / PMPI_Init_thread(_argc: *mut c_int, _argv: *mut c_void, required: c_int, provided: *mut c_int) {
        let p = state::init(required)?;
        raw::put(provided, p)
    }
    fn MPI_Finalize / PMPI_Finalize() {
        state::finalize()
    }
    fn MPI_Initialized / PMPI_Initialized(flag: *mut c_int) {
        raw::put(flag, state::initialized() as c_int)
    }
    fn MPI_Finalized / PMPI_Finalized(flag: *mut c_int) {
        raw::put(flag, state::finalized() as c_int)
    }
    fn MPI_Query_thread / PMPI_Query_thread(provided: *mut c_int) {
        raw::put(provided, state::THREAD_LEVEL.load(Ordering::Relaxed))
    }
    fn MPI_Is_thread_main / PMPI_Is_thread_main(flag: *mut c_int) {
        raw::put(flag, state::is_main_thread() as c_int)
    }
    fn MPI_Abort / PMPI_Abort(comm: Handle, code: c_int) {
        state::check_init()?;
        let _ = comm;
        // The message is said once, by the library's abort (or by `metampi run` for it).
        state::abort_job(code)
    }
    fn MPI_Get_processor_name / PMPI_Get_processor_name(name: *mut c_char, len: *mut c_int) {
        let n = metampi::processor_name().unwrap_or_else(|_| "localhost".into());
        let l = raw::put_str(name, MAX_PROCESSOR_NAME, &n)?;
        raw::put(len, l)
    }
    fn MPI_Get_version / PMPI_Get_version(version: *mut c_int, subversion: *mut c_int) {
        raw::put(version, VERSION)?;
        raw::put(subversion, SUBVERSION)
    }
    fn MPI_Get_library_version / PMPI_Get_library_version(version: *mut c_char, len: *mut c_int) {
        let s = format!(
            "metampi {} (MPICH ABI, libmpi.so.12): MPI over shared memory, TCP and routed wide-area links",
            env!("CARGO_PKG_VERSION")
        );
        let l = raw::put_str(version, MAX_LIBRARY_VERSION_STRING, &s)?;
        raw::put(len, l)
    }
    fn MPI_Alloc_mem / PMPI_Alloc_mem(size: isize, _info: Handle, baseptr: *mut *mut c_void) {
        if size < 0 {
            return Err(Fail::new(ERR_SIZE, format!("size {size} is negative")));
        }
        let p = raw::alloc(size as usize);
        if p.is_null() {
            return Err(Fail::new(ERR_NO_MEM, format!("{size} bytes are not available")));
        }
        raw::put(baseptr, p)
    }
    fn MPI_Free_mem / PMPI_Free_mem(base: *mut c_void) {
        raw::free(base);
        Ok(())
    }
    fn MPI_Pcontrol / PMPI_Pcontrol(_level: c_int) {
        Ok(())
    }

    // ---- errors ----------------------------------------------------------------
    fn MPI_Error_string / PMPI_Error_string(code: c_int, s: *mut c_char, len: *mut c_int) {
        let l = raw::put_str(s, MAX_ERROR_STRING, &err::string_of(code))?;
        raw::put(len, l)
    }
    fn MPI_Error_class / PMPI_Error_class(code: c_int, class: *mut c_int) {
        if let Some(c) = err::user_class_of(code) {
            return raw::put(class, c);
        }
        if !(0..=ERR_LASTCODE).contains(&code) {
            return Err(Fail::arg(format!("{code} is not an error code")));
        }
        raw::put(class, err::class_of(code))
    }
    fn MPI_Add_error_class / PMPI_Add_error_class(class: *mut c_int) {
        raw::put(class, err::add_user_code(None)?)
    }
    fn MPI_Add_error_code / PMPI_Add_error_code(class: c_int, code: *mut c_int) {
        let known = (0..=LAST_PREDEFINED_CLASS).contains(&class)
            || err::user_class_of(class) == Some(class);
        if !known {
            return Err(Fail::arg(format!("{class} is not an error class")));
        }
        raw::put(code, err::add_user_code(Some(class))?)
    }
    fn MPI_Add_error_string / PMPI_Add_error_string(code: c_int, s: *const c_char) {
        let text = raw::c_str(s)?;
        let mut user = err::USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
        match user.iter_mut().find(|e| e.0 == code) {
            Some(e) => {
                e.2 = text;
                Ok(())
            }
            None => Err(Fail::arg(format!("{code} is not a user error class or code"))),
        }
    }
    fn MPI_Comm_create_errhandler / PMPI_Comm_create_errhandler(f: Option<HandlerFn>, h: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the error handler function is null"))?;
        raw::put(h, state::ERRHANDLERS.insert(f))
    }
    fn MPI_Errhandler_create / PMPI_Errhandler_create(f: Option<HandlerFn>, h: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the error handler function is null"))?;
        raw::put(h, state::ERRHANDLERS.insert(f))
    }
    fn MPI_Comm_set_errhandler / PMPI_Comm_set_errhandler(comm: Handle, h: Handle) {
        let c = state::comm(comm)?;
        if state::handler(h).is_none() {
            return Err(Fail::arg(format!("{h:#x} is not an error handler")));
        }
        c.errh.store(h, Ordering::Relaxed);
        Ok(())
    }
    fn MPI_Errhandler_set / PMPI_Errhandler_set(comm: Handle, h: Handle) {
        PMPI_Comm_set_errhandler(comm, h);
        Ok(())
    }
    fn MPI_Comm_get_errhandler / PMPI_Comm_get_errhandler(comm: Handle, h: *mut Handle) {
        let c = state::comm(comm)?;
        raw::put(h, c.errh.load(Ordering::Relaxed))
    }
    fn MPI_Errhandler_get / PMPI_Errhandler_get(comm: Handle, h: *mut Handle) {
        let c = state::comm(comm)?;
        raw::put(h, c.errh.load(Ordering::Relaxed))
    }
    fn MPI_Errhandler_free / PMPI_Errhandler_free(h: *mut Handle) {
        let v = raw::get(h)?;
        if state::handler(v).is_none() {
            return Err(Fail::arg(format!("{v:#x} is not an error handler")));
        }
        // Freeing a predefined handler only nulls the handle (MPI-4 §9.3.4).
        state::ERRHANDLERS.remove(v);
        raw::put(h, ERRHANDLER_NULL)
    }
    fn MPI_Comm_call_errhandler / PMPI_Comm_call_errhandler(comm: Handle, code: c_int) {
        let _ = state::comm(comm)?;
        err::raise_through("MPI_Comm_call_errhandler", comm, code);
        Ok(())
    }

    // ---- buffered sends ---------------------------------------------------------
    fn MPI_Buffer_attach / PMPI_Buffer_attach(buffer: *mut c_void, size: c_int) {
        let mut b = BSEND.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_some() {
            return Err(Fail::new(ERR_BUFFER, "a buffer is already attached"));
        }
        if size < 0 {
            return Err(Fail::new(ERR_ARG, format!("size {size} is negative")));
        }
        *b = Some((buffer as usize, size));
        Ok(())
    }
    fn MPI_Buffer_detach / PMPI_Buffer_detach(buffer: *mut *mut c_void, size: *mut c_int) {
        // Buffered sends copy into the library's own memory and are under way once
        // they return, so nothing is left to drain here.
        let b = BSEND.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (p, n) = b.unwrap_or((0, 0));
        raw::put(buffer, p as *mut c_void)?;
        raw::put(size, n)
    }

    // Buffered sends are under way once they return, their bytes in the library's memory:
    // every attached buffer is always flushed.
    fn MPI_Buffer_flush / PMPI_Buffer_flush() {
        state::check_init()
    }
    fn MPI_Buffer_iflush / PMPI_Buffer_iflush(req: *mut Handle) {
        state::check_init()?;
        raw::put(req, crate::req::done(crate::req::St::EMPTY))
    }
    fn MPI_Comm_attach_buffer / PMPI_Comm_attach_buffer(comm: Handle, buffer: *mut c_void, size: c_int) {
        state::comm(comm)?;
        attach_to(comm, buffer, size as i64)
    }
    fn MPI_Comm_attach_buffer_c / PMPI_Comm_attach_buffer_c(comm: Handle, buffer: *mut c_void, size: i64) {
        state::comm(comm)?;
        attach_to(comm, buffer, size)
    }
    fn MPI_Comm_detach_buffer / PMPI_Comm_detach_buffer(comm: Handle, buffer: *mut *mut c_void, size: *mut c_int) {
        state::comm(comm)?;
        let (p, n) = detach_from(comm)?;
        raw::put(buffer, p as *mut c_void)?;
        raw::put(size, c_int::try_from(n).unwrap_or(c_int::MAX))
    }
    fn MPI_Comm_detach_buffer_c / PMPI_Comm_detach_buffer_c(comm: Handle, buffer: *mut *mut c_void, size: *mut i64) {
        state::comm(comm)?;
        let (p, n) = detach_from(comm)?;
        raw::put(buffer, p as *mut c_void)?;
        raw::put(size, n)
    }
    fn MPI_Comm_flush_buffer / PMPI_Comm_flush_buffer(comm: Handle) {
        state::comm(comm).map(drop)
    }
    fn MPI_Comm_iflush_buffer / PMPI_Comm_iflush_buffer(comm: Handle, req: *mut Handle) {
        state::comm(comm)?;
        raw::put(req, crate::req::done(crate::req::St::EMPTY))
    }

    // ---- info objects -----------------------------------------------------------
    fn MPI_Info_create_env / PMPI_Info_create_env(_argc: c_int, _argv: *mut *mut c_char, info: *mut Handle) {
        raw::put(info, INFOS.insert(env_info()))
    }
    fn MPI_Info_create / PMPI_Info_create(info: *mut Handle) {
        raw::put(info, INFOS.insert(Info::default()))
    }
    fn MPI_Info_set / PMPI_Info_set(info: Handle, key: *const c_char, value: *const c_char) {
        let (k, v) = (raw::c_str(key)?, raw::c_str(value)?);
        if k.is_empty() || k.len() > MAX_INFO_KEY {
            return Err(Fail::new(ERR_INFO_KEY, format!("key `{k}` is empty or longer than MPI_MAX_INFO_KEY")));
        }
        if v.len() > MAX_INFO_VAL {
            return Err(Fail::new(ERR_INFO_VALUE, "value longer than MPI_MAX_INFO_VAL"));
        }
        with_info(info, |i| {
            i.0.insert(k, v);
        })
    }
    fn MPI_Info_get / PMPI_Info_get(info: Handle, key: *const c_char, valuelen: c_int, value: *mut c_char, flag: *mut c_int) {
        let k = raw::c_str(key)?;
        let v = with_info(info, |i| i.0.get(&k).cloned())?;
        match v {
            Some(v) => {
                raw::put_str(value, valuelen.max(0) as usize + 1, &v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Info_get_string / PMPI_Info_get_string(info: Handle, key: *const c_char, buflen: *mut c_int, value: *mut c_char, flag: *mut c_int) {
        let k = raw::c_str(key)?;
        let v = with_info(info, |i| i.0.get(&k).cloned())?;
        match v {
            Some(v) => {
                let cap = raw::get(buflen)?;
                if cap > 0 {
                    raw::put_str(value, cap as usize, &v)?;
                }
                raw::put(buflen, v.len() as c_int + 1)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Info_get_valuelen / PMPI_Info_get_valuelen(info: Handle, key: *const c_char, len: *mut c_int, flag: *mut c_int) {
        let k = raw::c_str(key)?;
        match with_info(info, |i| i.0.get(&k).map(|v| v.len()))? {
            Some(n) => {
                raw::put(len, n as c_int)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Info_delete / PMPI_Info_delete(info: Handle, key: *const c_char) {
        let k = raw::c_str(key)?;
        match with_info(info, |i| i.0.remove(&k))? {
            Some(_) => Ok(()),
            None => Err(Fail::new(ERR_INFO_NOKEY, format!("key `{k}` is not set"))),
        }
    }
    fn MPI_Info_get_nkeys / PMPI_Info_get_nkeys(info: Handle, n: *mut c_int) {
        let k = with_info(info, |i| i.0.len())?;
        raw::put(n, k as c_int)
    }
    fn MPI_Info_get_nthkey / PMPI_Info_get_nthkey(info: Handle, n: c_int, key: *mut c_char) {
        let k = with_info(info, |i| i.0.keys().nth(n.max(0) as usize).cloned())?
            .ok_or_else(|| Fail::arg(format!("the info object has no key number {n}")))?;
        raw::put_str(key, MAX_INFO_KEY + 1, &k).map(|_| ())
    }
    fn MPI_Info_dup / PMPI_Info_dup(info: Handle, new: *mut Handle) {
        let copy = with_info(info, |i| i.clone())?;
        raw::put(new, INFOS.insert(copy))
    }
    fn MPI_Info_free / PMPI_Info_free(info: *mut Handle) {
        let h = raw::get(info)?;
        INFOS.remove(h).ok_or_else(|| Fail::arg(format!("{h:#x} is not an info object")))?;
        raw::put(info, INFO_NULL)
    }

    // ---- Fortran handles: in the MPICH ABI a Fortran handle is the C integer ----
    fn MPI_Status_c2f / PMPI_Status_c2f(c: *const c_int, f: *mut c_int) {
        raw::slice_mut(f, STATUS_INTS)?.copy_from_slice(raw::slice(c, STATUS_INTS)?);
        Ok(())
    }
    fn MPI_Status_f2c / PMPI_Status_f2c(f: *const c_int, c: *mut c_int) {
        raw::slice_mut(c, STATUS_INTS)?.copy_from_slice(raw::slice(f, STATUS_INTS)?);
        Ok(())
    }
}

/// A status as Fortran integers (`MPI_STATUS_SIZE`).
const STATUS_INTS: c_int = (std::mem::size_of::<crate::req::CStatus>() / 4) as c_int;

static BSEND: Mutex<Option<(usize, c_int)>> = Mutex::new(None);

/// Buffers attached to a communicator or a session (MPI-4.1 §3.6.1), by its handle. As for
/// the process's buffer, buffered sends never use them (they copy into the library's own
/// memory); they are kept to be handed back by the detach.
static ATTACHED: Mutex<BTreeMap<Handle, (usize, i64)>> = Mutex::new(BTreeMap::new());

/// Attaches `buffer` of `size` bytes to communicator or session `owner` (checked valid).
pub(crate) fn attach_to(owner: Handle, buffer: *mut c_void, size: i64) -> R {
    if size < 0 {
        return Err(Fail::new(ERR_ARG, format!("size {size} is negative")));
    }
    let mut all = ATTACHED.lock().unwrap_or_else(|p| p.into_inner());
    if all.contains_key(&owner) {
        return Err(Fail::new(ERR_BUFFER, "a buffer is already attached to it"));
    }
    all.insert(owner, (buffer as usize, size));
    Ok(())
}

/// Takes back the buffer attached to `owner`: null and 0 where none is (as
/// `MPI_Buffer_detach` here, and MPICH).
pub(crate) fn detach_from(owner: Handle) -> R<(usize, i64)> {
    Ok(ATTACHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&owner)
        .unwrap_or((0, 0)))
}

/// An info object: keys in order.
#[derive(Clone, Default)]
pub struct Info(pub BTreeMap<String, String>);

pub static INFOS: Table<Info> = Table::new(INFO_BASE);

pub(crate) fn with_info<T>(h: Handle, f: impl FnOnce(&mut Info) -> T) -> R<T> {
    if h == INFO_ENV {
        return Ok(f(&mut env_info()));
    }
    let mut i = INFOS
        .get(h)
        .ok_or_else(|| Fail::arg(format!("{h:#x} is not an info object")))?;
    let out = f(&mut i);
    INFOS.set(h, i);
    Ok(out)
}

/// What `MPI_INFO_ENV` holds (MPI-4 §11.2.1): how this process was started.
fn env_info() -> Info {
    let mut i = Info::default();
    let mut args = std::env::args();
    if let Some(cmd) = args.next() {
        i.0.insert("command".into(), cmd);
    }
    let rest: Vec<String> = args.collect();
    if !rest.is_empty() {
        i.0.insert("argv".into(), rest.join(" "));
    }
    if state::initialized() {
        let n =
            metampi::topology::Communicator::size(&metampi::topology::SimpleCommunicator::world());
        i.0.insert("maxprocs".into(), n.to_string());
    }
    let level = match state::THREAD_LEVEL.load(std::sync::atomic::Ordering::Relaxed) {
        THREAD_SINGLE => "MPI_THREAD_SINGLE",
        THREAD_FUNNELED => "MPI_THREAD_FUNNELED",
        THREAD_SERIALIZED => "MPI_THREAD_SERIALIZED",
        _ => "MPI_THREAD_MULTIPLE",
    };
    i.0.insert("thread_level".into(), level.into());
    if let Ok(d) = std::env::current_dir() {
        i.0.insert("wdir".into(), d.display().to_string());
    }
    i
}

/// `MPI_Wtime`: seconds since an arbitrary point, from the engine's clock.
#[no_mangle]
pub extern "C" fn PMPI_Wtime() -> f64 {
    metampi::time()
}
#[no_mangle]
pub extern "C" fn MPI_Wtime() -> f64 {
    metampi::time()
}
/// `MPI_Wtick`.
#[no_mangle]
pub extern "C" fn PMPI_Wtick() -> f64 {
    metampi::time_resolution()
}
#[no_mangle]
pub extern "C" fn MPI_Wtick() -> f64 {
    metampi::time_resolution()
}

/// `MPI_F_STATUS_IGNORE` and `MPI_F_STATUSES_IGNORE` (`MPI_Fint *`, null as in MPICH until a
/// Fortran binding sets them).
#[no_mangle]
pub static mut MPI_F_STATUS_IGNORE: *mut c_int = std::ptr::null_mut();
#[no_mangle]
pub static mut MPI_F_STATUSES_IGNORE: *mut c_int = std::ptr::null_mut();

/// What `MPI_F08_STATUS(ES)_IGNORE` point at: a status no call writes.
static F08_IGNORE: [c_int; 2] = [0, 0];
/// `MPI_F08_STATUS_IGNORE` (mpi_f08's status-ignore sentinel).
#[no_mangle]
pub static MPI_F08_STATUS_IGNORE: crate::raw::CPtr = crate::raw::CPtr(&F08_IGNORE[0]);
/// `MPI_F08_STATUSES_IGNORE`.
#[no_mangle]
pub static MPI_F08_STATUSES_IGNORE: crate::raw::CPtr = crate::raw::CPtr(&F08_IGNORE[1]);
