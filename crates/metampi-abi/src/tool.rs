//! The tool information interface (MPI-4 §15.3, `MPI_T_*`): what a performance tool or a
//! curious user can list and read without knowing metampi.
//!
//! - **Control variables** are metampi's settings (`metampi::knobs::KNOBS`, the job secret
//!   left out): each a string (`MPI_CHAR`) holding the value this process was started with,
//!   empty where the setting is unset (its default applies). They are read at start-up, so
//!   their scope is `MPI_T_SCOPE_READONLY` and writing one is `MPI_T_ERR_CVAR_SET_NEVER`.
//! - **Performance variables** are the engine's counters (`metampi::pvars`): counters
//!   (`MPI_T_PVAR_CLASS_COUNTER`, `MPI_UNSIGNED_LONG_LONG`), continuous and read-only; a
//!   handle reads the count since it was allocated.
//! - **Categories**: `metampi_settings` (every control variable) and `metampi_counters`
//!   (every performance variable).
//! - **Events**: none. **Sources**: one, the monotonic clock `MPI_Wtime` reads, in
//!   nanoseconds.
//!
//! These calls return their error codes and never invoke an error handler (MPI's rule for
//! `MPI_T`); they work before `MPI_Init` and after `MPI_Finalize`, between
//! `MPI_T_init_thread` and the matching `MPI_T_finalize`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use metampi::knobs::{Kind, KNOBS};

use crate::consts::*;
use crate::raw;

/// What a failing `MPI_T` call returns.
type T<V = ()> = Result<V, c_int>;

/// Defines `MPI_T_*` functions: the body's error is returned as it is, a panic becomes
/// `MPI_T_ERR_INVALID`.
macro_rules! mpi_t {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),* $(,)?) $body:block)*) => {$(
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            let run = || -> T { $body };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                Ok(Ok(())) => SUCCESS,
                Ok(Err(code)) => code,
                Err(_) => T_ERR_INVALID,
            }
        }
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

/// `MPI_T_PVAR_ALL_HANDLES` of MPICH's ABI is this exported constant (the standard ABI's is
/// the value 1 itself): a tool passes its value, 1, which no handle here has.
#[cfg(not(std_abi))]
#[no_mangle]
pub static MPI_T_PVAR_ALL_HANDLES: usize = ALL_HANDLES;
const ALL_HANDLES: usize = 1;

/// Nested `MPI_T_init_thread` calls not yet finalized.
static OPEN: AtomicUsize = AtomicUsize::new(0);

fn check_open() -> T {
    match OPEN.load(Ordering::Acquire) {
        0 => Err(T_ERR_NOT_INITIALIZED),
        _ => Ok(()),
    }
}

/// The longest value a control variable gives (its count, NUL included).
const CVAR_LEN: c_int = 1024;

/// The settings a tool sees, in a fixed order.
fn cvars() -> &'static [&'static metampi::knobs::Knob] {
    static LIST: OnceLock<Vec<&'static metampi::knobs::Knob>> = OnceLock::new();
    LIST.get_or_init(|| {
        KNOBS
            .iter()
            .filter(|k| !k.name.contains("SECRET"))
            .collect()
    })
}

const CATEGORIES: [(&str, &str); 2] = [
    (
        "metampi_settings",
        "metampi's settings (METAMPI_* environment variables)",
    ),
    (
        "metampi_counters",
        "counters of metampi's engine in this process",
    ),
];

/// Writes `s` as MPI_T does (§15.3.3): nothing where the buffer or its length is null or
/// zero; else at most `*len` bytes, NUL included. `*len` becomes the length written (or
/// needed), NUL included.
fn put_name(buf: *mut c_char, len: *mut c_int, s: &str) -> T {
    if len.is_null() {
        return Ok(());
    }
    let cap = raw::get(len as *const c_int).map_err(|_| T_ERR_INVALID)?;
    let need = s.len() as c_int + 1;
    if buf.is_null() || cap <= 0 {
        raw::put_opt(len, need);
        return Ok(());
    }
    let wrote = raw::put_str(buf, cap as usize, s).map_err(|_| T_ERR_INVALID)?;
    raw::put_opt(len, wrote + 1);
    Ok(())
}

/// Index `i` into a list of `n`.
fn index(i: c_int, n: usize) -> T<usize> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or(T_ERR_INVALID_INDEX)
}

fn verbosity(k: &metampi::knobs::Knob) -> c_int {
    match k.kind {
        Kind::Launcher => T_VERBOSITY_USER_DETAIL,
        _ => T_VERBOSITY_TUNER_BASIC,
    }
}

fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::Flag => "on/off",
        Kind::Number => "a whole number",
        Kind::Size => "a size in bytes (K, M, G suffixes)",
        Kind::Seconds => "seconds",
        Kind::Text => "text",
        Kind::Launcher => "set by the launcher",
    }
}

/// The value of setting `k` in this process: what its variable holds, or empty.
fn cvar_value(k: &metampi::knobs::Knob) -> String {
    let mut v = metampi::knobs::text(k.name).unwrap_or_default();
    v.truncate(CVAR_LEN as usize - 1);
    v
}

/// A control variable's handle: its index, above the values null and `ALL_HANDLES` take.
const CVAR_BASE: usize = 0x1000;

fn cvar_of(h: usize) -> T<&'static metampi::knobs::Knob> {
    h.checked_sub(CVAR_BASE)
        .and_then(|i| cvars().get(i).copied())
        .ok_or(T_ERR_INVALID_HANDLE)
}

/// A performance-variable session: its handles, each a variable and the count it started
/// from.
#[derive(Default)]
struct Session {
    handles: HashMap<usize, (usize, u64)>,
}

static SESSIONS: Mutex<Option<HashMap<usize, Session>>> = Mutex::new(None);
/// Session and handle numbers, never reused; above the cvar handles' range.
static NEXT: AtomicUsize = AtomicUsize::new(0x10_0000);

fn with_sessions<V>(f: impl FnOnce(&mut HashMap<usize, Session>) -> T<V>) -> T<V> {
    let mut g = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// The variable behind `handle` in `session`, and its count at allocation.
fn pvar_handle(session: usize, handle: usize) -> T<(usize, u64)> {
    with_sessions(|all| {
        let s = all.get(&session).ok_or(T_ERR_INVALID_SESSION)?;
        s.handles.get(&handle).copied().ok_or(T_ERR_INVALID_HANDLE)
    })
}

/// Nanoseconds on the clock of source 0.
fn now_ns() -> i64 {
    (metampi::time() * 1e9) as i64
}

mpi_t! {
    fn MPI_T_init_thread / PMPI_T_init_thread(required: c_int, provided: *mut c_int) {
        // Every call here is safe from any thread.
        let _ = required;
        raw::put(provided, THREAD_MULTIPLE).map_err(|_| T_ERR_INVALID)?;
        OPEN.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
    fn MPI_T_finalize / PMPI_T_finalize() {
        OPEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(drop)
            .map_err(|_| T_ERR_NOT_INITIALIZED)?;
        if OPEN.load(Ordering::Acquire) == 0 {
            with_sessions(|all| {
                all.clear();
                Ok(())
            })?;
        }
        Ok(())
    }

    // ---- control variables ----
    fn MPI_T_cvar_get_num / PMPI_T_cvar_get_num(num: *mut c_int) {
        check_open()?;
        raw::put(num, cvars().len() as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_cvar_get_info / PMPI_T_cvar_get_info(
        i: c_int, name: *mut c_char, name_len: *mut c_int, verb: *mut c_int,
        datatype: *mut Handle, enumtype: *mut usize, desc: *mut c_char, desc_len: *mut c_int,
        bind: *mut c_int, scope: *mut c_int,
    ) {
        check_open()?;
        let k = cvars()[index(i, cvars().len())?];
        put_name(name, name_len, k.name)?;
        raw::put_opt(verb, verbosity(k));
        raw::put_opt(datatype, crate::types::predefined_char());
        raw::put_opt(enumtype, 0);
        let text = format!("{} ({}; empty: unset, the default applies)", k.help, kind_word(k.kind));
        put_name(desc, desc_len, &text)?;
        raw::put_opt(bind, T_BIND_NO_OBJECT);
        raw::put_opt(scope, T_SCOPE_READONLY);
        Ok(())
    }
    fn MPI_T_cvar_get_index / PMPI_T_cvar_get_index(name: *const c_char, i: *mut c_int) {
        check_open()?;
        let name = raw::c_str(name).map_err(|_| T_ERR_INVALID)?;
        let at = cvars().iter().position(|k| k.name == name).ok_or(T_ERR_INVALID_NAME)?;
        raw::put(i, at as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_cvar_handle_alloc / PMPI_T_cvar_handle_alloc(i: c_int, _obj: *mut c_void, handle: *mut usize, count: *mut c_int) {
        check_open()?;
        let at = index(i, cvars().len())?;
        raw::put(handle, CVAR_BASE + at).map_err(|_| T_ERR_INVALID)?;
        raw::put(count, CVAR_LEN).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_cvar_handle_free / PMPI_T_cvar_handle_free(handle: *mut usize) {
        check_open()?;
        cvar_of(raw::get(handle).map_err(|_| T_ERR_INVALID)?)?;
        raw::put(handle, 0).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_cvar_read / PMPI_T_cvar_read(handle: usize, buf: *mut c_void) {
        check_open()?;
        let k = cvar_of(handle)?;
        raw::put_str(buf as *mut c_char, CVAR_LEN as usize, &cvar_value(k))
            .map(drop)
            .map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_cvar_write / PMPI_T_cvar_write(handle: usize, _buf: *const c_void) {
        check_open()?;
        cvar_of(handle)?;
        // Settings are read once, at start-up: set the variable before the job starts.
        Err(T_ERR_CVAR_SET_NEVER)
    }

    // ---- performance variables ----
    fn MPI_T_pvar_get_num / PMPI_T_pvar_get_num(num: *mut c_int) {
        check_open()?;
        raw::put(num, metampi::pvars::all().len() as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_get_info / PMPI_T_pvar_get_info(
        i: c_int, name: *mut c_char, name_len: *mut c_int, verb: *mut c_int, class: *mut c_int,
        datatype: *mut Handle, enumtype: *mut usize, desc: *mut c_char, desc_len: *mut c_int,
        bind: *mut c_int, readonly: *mut c_int, continuous: *mut c_int, atomic: *mut c_int,
    ) {
        check_open()?;
        let all = metampi::pvars::all();
        let p = &all[index(i, all.len())?];
        put_name(name, name_len, p.name)?;
        raw::put_opt(verb, T_VERBOSITY_TUNER_DETAIL);
        raw::put_opt(class, T_PVAR_CLASS_COUNTER);
        raw::put_opt(datatype, crate::types::predefined_ull());
        raw::put_opt(enumtype, 0);
        put_name(desc, desc_len, p.desc)?;
        raw::put_opt(bind, T_BIND_NO_OBJECT);
        raw::put_opt(readonly, 1);
        raw::put_opt(continuous, 1);
        raw::put_opt(atomic, 0);
        Ok(())
    }
    fn MPI_T_pvar_get_index / PMPI_T_pvar_get_index(name: *const c_char, class: c_int, i: *mut c_int) {
        check_open()?;
        let name = raw::c_str(name).map_err(|_| T_ERR_INVALID)?;
        let at = metampi::pvars::all()
            .iter()
            .position(|p| p.name == name)
            .filter(|_| class == T_PVAR_CLASS_COUNTER)
            .ok_or(T_ERR_INVALID_NAME)?;
        raw::put(i, at as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_session_create / PMPI_T_pvar_session_create(session: *mut usize) {
        check_open()?;
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        with_sessions(|all| {
            all.insert(id, Session::default());
            Ok(())
        })?;
        raw::put(session, id).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_session_free / PMPI_T_pvar_session_free(session: *mut usize) {
        check_open()?;
        let id = raw::get(session).map_err(|_| T_ERR_INVALID)?;
        with_sessions(|all| all.remove(&id).map(drop).ok_or(T_ERR_INVALID_SESSION))?;
        raw::put(session, 0).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_handle_alloc / PMPI_T_pvar_handle_alloc(session: usize, i: c_int, _obj: *mut c_void, handle: *mut usize, count: *mut c_int) {
        check_open()?;
        let all = metampi::pvars::all();
        let at = index(i, all.len())?;
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        with_sessions(|sessions| {
            let s = sessions.get_mut(&session).ok_or(T_ERR_INVALID_SESSION)?;
            s.handles.insert(id, (at, all[at].read()));
            Ok(())
        })?;
        raw::put(handle, id).map_err(|_| T_ERR_INVALID)?;
        raw::put(count, 1).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_handle_free / PMPI_T_pvar_handle_free(session: usize, handle: *mut usize) {
        check_open()?;
        let h = raw::get(handle).map_err(|_| T_ERR_INVALID)?;
        with_sessions(|all| {
            let s = all.get_mut(&session).ok_or(T_ERR_INVALID_SESSION)?;
            s.handles.remove(&h).map(drop).ok_or(T_ERR_INVALID_HANDLE)
        })?;
        raw::put(handle, 0).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_start / PMPI_T_pvar_start(session: usize, handle: usize) {
        check_open()?;
        if handle != ALL_HANDLES {
            pvar_handle(session, handle)?;
        }
        // Every variable here counts from its handle's allocation on, always.
        Err(T_ERR_PVAR_NO_STARTSTOP)
    }
    fn MPI_T_pvar_stop / PMPI_T_pvar_stop(session: usize, handle: usize) {
        check_open()?;
        if handle != ALL_HANDLES {
            pvar_handle(session, handle)?;
        }
        Err(T_ERR_PVAR_NO_STARTSTOP)
    }
    fn MPI_T_pvar_read / PMPI_T_pvar_read(session: usize, handle: usize, buf: *mut c_void) {
        check_open()?;
        let (at, from) = pvar_handle(session, handle)?;
        let now = metampi::pvars::all()[at].read();
        raw::put(buf as *mut u64, now.wrapping_sub(from)).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_pvar_write / PMPI_T_pvar_write(session: usize, handle: usize, _buf: *const c_void) {
        check_open()?;
        pvar_handle(session, handle)?;
        Err(T_ERR_PVAR_NO_WRITE)
    }
    fn MPI_T_pvar_reset / PMPI_T_pvar_reset(session: usize, handle: usize) {
        check_open()?;
        if handle != ALL_HANDLES {
            pvar_handle(session, handle)?;
        }
        Err(T_ERR_PVAR_NO_WRITE)
    }
    fn MPI_T_pvar_readreset / PMPI_T_pvar_readreset(session: usize, handle: usize, _buf: *mut c_void) {
        check_open()?;
        pvar_handle(session, handle)?;
        Err(T_ERR_PVAR_NO_WRITE)
    }

    // ---- categories ----
    fn MPI_T_category_get_num / PMPI_T_category_get_num(num: *mut c_int) {
        check_open()?;
        raw::put(num, CATEGORIES.len() as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_category_get_info / PMPI_T_category_get_info(
        i: c_int, name: *mut c_char, name_len: *mut c_int, desc: *mut c_char, desc_len: *mut c_int,
        num_cvars: *mut c_int, num_pvars: *mut c_int, num_categories: *mut c_int,
    ) {
        check_open()?;
        let at = index(i, CATEGORIES.len())?;
        put_name(name, name_len, CATEGORIES[at].0)?;
        put_name(desc, desc_len, CATEGORIES[at].1)?;
        let (c, p) = match at {
            0 => (cvars().len(), 0),
            _ => (0, metampi::pvars::all().len()),
        };
        raw::put_opt(num_cvars, c as c_int);
        raw::put_opt(num_pvars, p as c_int);
        raw::put_opt(num_categories, 0);
        Ok(())
    }
    fn MPI_T_category_get_index / PMPI_T_category_get_index(name: *const c_char, i: *mut c_int) {
        check_open()?;
        let name = raw::c_str(name).map_err(|_| T_ERR_INVALID)?;
        let at = CATEGORIES.iter().position(|c| c.0 == name).ok_or(T_ERR_INVALID_NAME)?;
        raw::put(i, at as c_int).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_category_get_cvars / PMPI_T_category_get_cvars(i: c_int, len: c_int, out: *mut c_int) {
        check_open()?;
        let n = match index(i, CATEGORIES.len())? {
            0 => cvars().len(),
            _ => 0,
        };
        fill_indices(out, len, n)
    }
    fn MPI_T_category_get_pvars / PMPI_T_category_get_pvars(i: c_int, len: c_int, out: *mut c_int) {
        check_open()?;
        let n = match index(i, CATEGORIES.len())? {
            0 => 0,
            _ => metampi::pvars::all().len(),
        };
        fill_indices(out, len, n)
    }
    fn MPI_T_category_get_categories / PMPI_T_category_get_categories(i: c_int, _len: c_int, _out: *mut c_int) {
        check_open()?;
        index(i, CATEGORIES.len()).map(drop)
    }
    fn MPI_T_category_get_num_events / PMPI_T_category_get_num_events(i: c_int, num: *mut c_int) {
        check_open()?;
        index(i, CATEGORIES.len())?;
        raw::put(num, 0).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_category_get_events / PMPI_T_category_get_events(i: c_int, _len: c_int, _out: *mut c_int) {
        check_open()?;
        index(i, CATEGORIES.len()).map(drop)
    }
    fn MPI_T_category_changed / PMPI_T_category_changed(stamp: *mut c_int) {
        check_open()?;
        // The variables and categories are fixed for the life of the process.
        raw::put(stamp, 0).map_err(|_| T_ERR_INVALID)
    }

    // ---- enumerations: none is used ----
    fn MPI_T_enum_get_info / PMPI_T_enum_get_info(_e: usize, _num: *mut c_int, _name: *mut c_char, _len: *mut c_int) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_enum_get_item / PMPI_T_enum_get_item(_e: usize, _i: c_int, _value: *mut c_int, _name: *mut c_char, _len: *mut c_int) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }

    // ---- events: none; the one source ----
    fn MPI_T_event_get_num / PMPI_T_event_get_num(num: *mut c_int) {
        check_open()?;
        raw::put(num, 0).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_event_get_index / PMPI_T_event_get_index(_name: *const c_char, _i: *mut c_int) {
        check_open()?;
        Err(T_ERR_INVALID_NAME)
    }
    fn MPI_T_event_get_info / PMPI_T_event_get_info(
        _i: c_int, _name: *mut c_char, _name_len: *mut c_int, _verb: *mut c_int,
        _types: *mut Handle, _displs: *mut isize, _num: *mut c_int, _enumtype: *mut usize,
        _info: *mut Handle, _desc: *mut c_char, _desc_len: *mut c_int, _bind: *mut c_int,
    ) {
        check_open()?;
        Err(T_ERR_INVALID_INDEX)
    }
    fn MPI_T_event_handle_alloc / PMPI_T_event_handle_alloc(_i: c_int, _obj: *mut c_void, _info: Handle, _reg: *mut usize) {
        check_open()?;
        Err(T_ERR_INVALID_INDEX)
    }
    fn MPI_T_event_handle_free / PMPI_T_event_handle_free(_reg: usize, _data: *mut c_void, _cb: *mut c_void) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_handle_get_info / PMPI_T_event_handle_get_info(_reg: usize, _info: *mut Handle) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_handle_set_info / PMPI_T_event_handle_set_info(_reg: usize, _info: Handle) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_register_callback / PMPI_T_event_register_callback(_reg: usize, _safety: c_int, _info: Handle, _data: *mut c_void, _cb: *mut c_void) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_callback_get_info / PMPI_T_event_callback_get_info(_reg: usize, _safety: c_int, _info: *mut Handle) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_callback_set_info / PMPI_T_event_callback_set_info(_reg: usize, _safety: c_int, _info: Handle) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_set_dropped_handler / PMPI_T_event_set_dropped_handler(_reg: usize, _cb: *mut c_void) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_read / PMPI_T_event_read(_e: usize, _i: c_int, _buf: *mut c_void) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_copy / PMPI_T_event_copy(_e: usize, _buf: *mut c_void) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_get_timestamp / PMPI_T_event_get_timestamp(_e: usize, _stamp: *mut i64) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_event_get_source / PMPI_T_event_get_source(_e: usize, _source: *mut c_int) {
        check_open()?;
        Err(T_ERR_INVALID_HANDLE)
    }
    fn MPI_T_source_get_num / PMPI_T_source_get_num(num: *mut c_int) {
        check_open()?;
        raw::put(num, 1).map_err(|_| T_ERR_INVALID)
    }
    fn MPI_T_source_get_info / PMPI_T_source_get_info(
        i: c_int, name: *mut c_char, name_len: *mut c_int, desc: *mut c_char, desc_len: *mut c_int,
        ordering: *mut c_int, ticks: *mut i64, max_ticks: *mut i64, info: *mut Handle,
    ) {
        check_open()?;
        index(i, 1)?;
        put_name(name, name_len, "metampi_wtime")?;
        put_name(desc, desc_len, "this process's monotonic clock (MPI_Wtime's), in nanoseconds")?;
        raw::put_opt(ordering, T_SOURCE_ORDERED);
        raw::put_opt(ticks, 1_000_000_000);
        raw::put_opt(max_ticks, i64::MAX);
        if !info.is_null() {
            raw::put_opt(info, crate::env::INFOS.insert(crate::env::Info::default()));
        }
        Ok(())
    }
    fn MPI_T_source_get_timestamp / PMPI_T_source_get_timestamp(i: c_int, stamp: *mut i64) {
        check_open()?;
        index(i, 1)?;
        raw::put(stamp, now_ns()).map_err(|_| T_ERR_INVALID)
    }
}

/// Writes the first `len` of the indices `0..n` (the variables of a category).
fn fill_indices(out: *mut c_int, len: c_int, n: usize) -> T {
    let want = (len.max(0) as usize).min(n);
    let dst = raw::slice_mut(out, want as c_int).map_err(|_| T_ERR_INVALID)?;
    for (i, d) in dst.iter_mut().enumerate() {
        *d = i as c_int;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_length_rules_of_mpi_t() {
        let mut buf = [0 as c_char; 8];
        let mut len: c_int = 0;
        put_name(buf.as_mut_ptr(), &mut len, "metampi").unwrap();
        assert_eq!(len, 8, "zero length: the length needed, NUL included");
        len = 4;
        put_name(buf.as_mut_ptr(), &mut len, "metampi").unwrap();
        assert_eq!(len, 4, "cut to the buffer");
        assert_eq!(buf[3], 0);
        len = 8;
        put_name(buf.as_mut_ptr(), &mut len, "metampi").unwrap();
        assert_eq!(len, 8);
    }

    #[test]
    fn the_secret_is_no_control_variable() {
        assert!(!cvars().is_empty());
        assert!(cvars().iter().all(|k| !k.name.contains("SECRET")));
        assert!(cvars().iter().any(|k| k.name == "METAMPI_EAGER_LIMIT"));
    }
}
