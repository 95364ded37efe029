//! Attribute caching on communicators (MPI-4 §7.7): keyvals with copy and
//! delete callbacks, the predefined attributes (`MPI_TAG_UB` and kin), and
//! `MPIR_Dup_fn` (`MPI_COMM_DUP_FN`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state::{self, CommEntry, Table};

/// `MPI_Comm_copy_attr_function`.
pub type CopyFn =
    unsafe extern "C" fn(Handle, c_int, *mut c_void, *mut c_void, *mut c_void, *mut c_int) -> c_int;
/// `MPI_Comm_delete_attr_function`.
pub type DeleteFn = unsafe extern "C" fn(Handle, c_int, *mut c_void, *mut c_void) -> c_int;

/// `MPII_Attr_copy_proxy`: how a language binding (Fortran) has its copy callbacks called:
/// `(user function, object, keyval, extra, attribute type, value, out value, out flag)`.
pub type CopyProxy = unsafe extern "C" fn(
    Option<CopyFn>,
    Handle,
    c_int,
    *mut c_void,
    c_int,
    *mut c_void,
    *mut *mut c_void,
    *mut c_int,
) -> c_int;
/// `MPII_Attr_delete_proxy`: `(user function, object, keyval, attribute type, value, extra)`.
pub type DeleteProxy =
    unsafe extern "C" fn(Option<DeleteFn>, Handle, c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// How an attribute value was given (MPICH's `MPIR_Attr_type`): a C pointer, or an
/// integer from Fortran (address-sized or `int`).
pub const ATTR_PTR: c_int = 0;
pub const ATTR_AINT: c_int = 1;
pub const ATTR_INT: c_int = 3;

/// A keyval: its callbacks, extra state, and the proxies that call them where a
/// language binding made it.
#[derive(Clone, Copy)]
pub struct Keyval {
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    extra: isize,
    proxy: Option<(Option<CopyProxy>, Option<DeleteProxy>)>,
}

impl Keyval {
    /// Runs the copy callback: `(error, keep, new value)`; none keeps nothing.
    fn copy(&self, obj: Handle, key: c_int, value: isize, kind: c_int) -> (c_int, bool, isize) {
        match self.proxy {
            Some((Some(p), _)) => {
                raw::call_copy_proxy(p, self.copy, obj, key, self.extra, kind, value)
            }
            Some((None, _)) => (SUCCESS, false, 0),
            None => match self.copy {
                Some(f) => raw::call_copy_fn(f, obj, key, self.extra, value),
                None => (SUCCESS, false, 0),
            },
        }
    }

    /// Runs the delete callback; its error code.
    fn delete(&self, obj: Handle, key: c_int, value: isize, kind: c_int) -> c_int {
        match self.proxy {
            Some((_, Some(p))) => {
                raw::call_delete_proxy(p, self.delete, obj, key, kind, value, self.extra)
            }
            Some((_, None)) => SUCCESS,
            None => match self.delete {
                Some(f) => raw::call_delete_fn(f, obj, key, value, self.extra),
                None => SUCCESS,
            },
        }
    }
}

pub static KEYVALS: Table<Keyval> = Table::new(KEYVAL_BASE);

/// Values of the predefined attributes, where a pointer to them is handed out.
static PREDEF: [AtomicI32; 7] = [const { AtomicI32::new(0) }; 7];

/// A predefined attribute: the address of its value (what C gets) and the value.
fn predefined(key: c_int) -> Option<(isize, c_int)> {
    // MPICH's Fortran names each predefined attribute one above C's (0x64400002 for
    // MPI_TAG_UB): both reach the same value.
    let key = if key & 0x7fff_ff00 == 0x6440_0000 && key & 1 == 0 {
        key - 1
    } else {
        key
    };
    let (slot, v) = match key {
        TAG_UB => (0, TAG_UB_VALUE),
        HOST => (1, PROC_NULL),
        IO => (2, ANY_SOURCE),
        WTIME_IS_GLOBAL => (3, 0),
        UNIVERSE_SIZE => (4, crate::state::universe_size()),
        LASTUSEDCODE => (5, crate::err::last_used_code()),
        APPNUM => (6, crate::state::appnum()),
        _ => return None,
    };
    PREDEF[slot].store(v, Ordering::Relaxed);
    Some((&PREDEF[slot] as *const AtomicI32 as isize, v))
}

/// Refuses a handle that names no keyval (attributes of windows, kept in `win`).
pub fn check_keyval(k: c_int) -> R {
    keyval(k).map(|_| ())
}

/// Runs keyval `key`'s delete callback on `value`, an attribute of object `obj` (a window).
pub fn run_delete(obj: Handle, key: c_int, value: isize) -> R {
    let rc = keyval(key)?.delete(obj, key, value, ATTR_PTR);
    if rc != SUCCESS {
        return Err(Fail::new(
            crate::err::class_of(rc),
            "the attribute delete callback failed",
        ));
    }
    Ok(())
}

fn keyval(k: c_int) -> R<Keyval> {
    KEYVALS
        .get(k as Handle)
        .ok_or_else(|| Fail::new(ERR_KEYVAL, format!("{k:#x} is not a keyval")))
}

/// Copies every attribute of `old` that its keyval's copy callback keeps onto `new`.
pub fn copy_all(old: Handle, parent: &CommEntry, new: Handle) -> R {
    let attrs = parent
        .attrs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let child = state::comm(new)?;
    let mut out = Vec::new();
    for (k, v) in attrs {
        let Ok(kv) = keyval(k) else { continue };
        let (rc, keep, nv) = kv.copy(old, k, v, kind_of(old, k));
        if rc != SUCCESS {
            return Err(Fail::new(
                crate::err::class_of(rc),
                "an attribute copy callback failed",
            ));
        }
        if keep {
            out.push((k, nv));
        }
    }
    *child.attrs.lock().unwrap_or_else(|p| p.into_inner()) = out;
    Ok(())
}

/// Runs the delete callbacks of every attribute on communicator `h` (free, finalize).
pub fn delete_all(h: Handle) {
    let Ok(c) = state::comm(h) else { return };
    let attrs = std::mem::take(&mut *c.attrs.lock().unwrap_or_else(|p| p.into_inner()));
    for (k, v) in attrs {
        if let Ok(kv) = keyval(k) {
            kv.delete(h, k, v, kind_of(h, k));
        }
    }
}

/// Attribute kinds other than `ATTR_PTR`, by (object handle, keyval).
static KINDS: std::sync::Mutex<Vec<(Handle, c_int, c_int)>> = std::sync::Mutex::new(Vec::new());

fn kind_of(obj: Handle, key: c_int) -> c_int {
    let k = KINDS.lock().unwrap_or_else(|p| p.into_inner());
    k.iter()
        .find(|e| e.0 == obj && e.1 == key)
        .map_or(ATTR_PTR, |e| e.2)
}

fn set_kind(obj: Handle, key: c_int, kind: c_int) {
    let mut k = KINDS.lock().unwrap_or_else(|p| p.into_inner());
    k.retain(|e| !(e.0 == obj && e.1 == key));
    if kind != ATTR_PTR {
        k.push((obj, key, kind));
    }
}

fn set(comm: Handle, key: c_int, value: isize) -> R {
    set_typed(comm, key, value, ATTR_PTR)
}

fn set_typed(comm: Handle, key: c_int, value: isize, kind: c_int) -> R {
    let c = state::comm(comm)?;
    let kv = keyval(key)?;
    let old = {
        let mut a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
        let old = a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1);
        a.push((key, value));
        old
    };
    let old_kind = kind_of(comm, key);
    set_kind(comm, key, kind);
    if let Some(v) = old {
        kv.delete(comm, key, v, old_kind);
    }
    Ok(())
}

/// The value of attribute `key` on `comm`, if set.
pub fn get(comm: Handle, key: c_int) -> R<Option<isize>> {
    let c = state::comm(comm)?;
    if let Some((p, _)) = predefined(key) {
        return Ok(Some(p));
    }
    keyval(key)?;
    let a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
    Ok(a.iter().find(|e| e.0 == key).map(|e| e.1))
}

fn delete(comm: Handle, key: c_int) -> R {
    let c = state::comm(comm)?;
    let kv = keyval(key)?;
    let v = {
        let mut a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
        a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1)
    };
    match v {
        Some(v) => {
            let kind = kind_of(comm, key);
            set_kind(comm, key, ATTR_PTR);
            {
                let rc = kv.delete(comm, key, v, kind);
                if rc != SUCCESS {
                    return Err(Fail::new(
                        crate::err::class_of(rc),
                        "the attribute delete callback failed",
                    ));
                }
            }
            Ok(())
        }
        None => Err(Fail::new(ERR_KEYVAL, "the attribute is not set")),
    }
}

fn create_keyval(
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    extra: *mut c_void,
    key: *mut c_int,
) -> R {
    // The standard ABI names MPI_COMM_DUP_FN by the address 1 (MPICH by MPIR_Dup_fn).
    #[cfg(std_abi)]
    let copy = match copy {
        Some(f) if f as usize == 1 => Some(MPIR_Dup_fn as CopyFn),
        f => f,
    };
    let k = KEYVALS.insert(Keyval {
        copy,
        delete,
        extra: raw::address(extra),
        proxy: None,
    });
    raw::put(key, k as c_int)
}

fn free_keyval(key: *mut c_int) -> R {
    let k = raw::get(key)?;
    KEYVALS
        .remove(k as Handle)
        .ok_or_else(|| Fail::new(ERR_KEYVAL, format!("{k:#x} is not a keyval")))?;
    raw::put(key, KEYVAL_INVALID)
}

mpi! {
    fn MPI_Comm_create_keyval / PMPI_Comm_create_keyval(copy: Option<CopyFn>, delete: Option<DeleteFn>, key: *mut c_int, extra: *mut c_void) {
        create_keyval(copy, delete, extra, key)
    }
    fn MPI_Keyval_create / PMPI_Keyval_create(copy: Option<CopyFn>, delete: Option<DeleteFn>, key: *mut c_int, extra: *mut c_void) {
        create_keyval(copy, delete, extra, key)
    }
    fn MPI_Comm_free_keyval / PMPI_Comm_free_keyval(key: *mut c_int) {
        free_keyval(key)
    }
    fn MPI_Keyval_free / PMPI_Keyval_free(key: *mut c_int) {
        free_keyval(key)
    }
    fn MPI_Comm_set_attr / PMPI_Comm_set_attr(comm: Handle, key: c_int, value: *mut c_void) {
        set(comm, key, raw::address(value))
    }
    fn MPI_Attr_put / PMPI_Attr_put(comm: Handle, key: c_int, value: *mut c_void) {
        set(comm, key, raw::address(value))
    }
    fn MPI_Comm_get_attr / PMPI_Comm_get_attr(comm: Handle, key: c_int, value: *mut isize, flag: *mut c_int) {
        match get(comm, key)? {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Attr_get / PMPI_Attr_get(comm: Handle, key: c_int, value: *mut isize, flag: *mut c_int) {
        match get(comm, key)? {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Comm_delete_attr / PMPI_Comm_delete_attr(comm: Handle, key: c_int) {
        delete(comm, key)
    }
    fn MPI_Attr_delete / PMPI_Attr_delete(comm: Handle, key: c_int) {
        delete(comm, key)
    }
}

// ---- attributes of datatypes (MPI-4 §7.7.4) -------------------------------------------

/// Attributes set on datatypes: (datatype handle, keyval, value).
static TYPE_ATTRS: std::sync::Mutex<Vec<(Handle, c_int, isize)>> =
    std::sync::Mutex::new(Vec::new());

fn type_attrs() -> std::sync::MutexGuard<'static, Vec<(Handle, c_int, isize)>> {
    TYPE_ATTRS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies the attributes of datatype `old` that their copy callbacks keep onto `new`
/// (`MPI_Type_dup`).
pub fn type_copy_all(old: Handle, new: Handle) -> R {
    let attrs: Vec<(c_int, isize)> = type_attrs()
        .iter()
        .filter(|e| e.0 == old)
        .map(|e| (e.1, e.2))
        .collect();
    for (k, v) in attrs {
        let Ok(kv) = keyval(k) else { continue };
        let (rc, keep, nv) = kv.copy(old, k, v, ATTR_PTR);
        if rc != SUCCESS {
            return Err(Fail::new(
                crate::err::class_of(rc),
                "an attribute copy callback failed",
            ));
        }
        if keep {
            type_attrs().push((new, k, nv));
        }
    }
    Ok(())
}

/// Runs the delete callbacks of every attribute on datatype `h` (`MPI_Type_free`).
pub fn type_delete_all(h: Handle) {
    let gone: Vec<(c_int, isize)> = {
        let mut a = type_attrs();
        let gone = a.iter().filter(|e| e.0 == h).map(|e| (e.1, e.2)).collect();
        a.retain(|e| e.0 != h);
        gone
    };
    for (k, v) in gone {
        if let Ok(kv) = keyval(k) {
            kv.delete(h, k, v, ATTR_PTR);
        }
    }
}

/// Removes attribute `key` of datatype `dt`, running its delete callback; false if unset.
fn type_delete(dt: Handle, key: c_int) -> R<bool> {
    let kv = keyval(key)?;
    let old = {
        let mut a = type_attrs();
        let i = a.iter().position(|e| e.0 == dt && e.1 == key);
        i.map(|i| a.remove(i).2)
    };
    let Some(v) = old else { return Ok(false) };
    let rc = kv.delete(dt, key, v, ATTR_PTR);
    if rc != SUCCESS {
        return Err(Fail::new(
            crate::err::class_of(rc),
            "the attribute delete callback failed",
        ));
    }
    Ok(true)
}

mpi! {
    fn MPI_Type_create_keyval / PMPI_Type_create_keyval(copy: Option<CopyFn>, delete: Option<DeleteFn>, key: *mut c_int, extra: *mut c_void) {
        create_keyval(copy, delete, extra, key)
    }
    fn MPI_Type_free_keyval / PMPI_Type_free_keyval(key: *mut c_int) {
        free_keyval(key)
    }
    fn MPI_Type_set_attr / PMPI_Type_set_attr(dt: Handle, key: c_int, value: *mut c_void) {
        crate::types::type_id_any(dt)?;
        type_delete(dt, key)?;
        type_attrs().push((dt, key, raw::address(value)));
        Ok(())
    }
    fn MPI_Type_get_attr / PMPI_Type_get_attr(dt: Handle, key: c_int, value: *mut isize, flag: *mut c_int) {
        crate::types::type_id_any(dt)?;
        keyval(key)?;
        let v = type_attrs().iter().find(|e| e.0 == dt && e.1 == key).map(|e| e.2);
        match v {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Type_delete_attr / PMPI_Type_delete_attr(dt: Handle, key: c_int) {
        crate::types::type_id_any(dt)?;
        if !type_delete(dt, key)? {
            return Err(Fail::new(ERR_KEYVAL, "the attribute is not set"));
        }
        Ok(())
    }
    // Keyvals for windows; the attributes themselves live in `win`.
    fn MPI_Win_create_keyval / PMPI_Win_create_keyval(copy: Option<CopyFn>, delete: Option<DeleteFn>, key: *mut c_int, extra: *mut c_void) {
        create_keyval(copy, delete, extra, key)
    }
    fn MPI_Win_free_keyval / PMPI_Win_free_keyval(key: *mut c_int) {
        free_keyval(key)
    }
}

/// `MPI_COMM_DUP_FN` / `MPI_DUP_FN`: the copy callback that keeps the value.
#[no_mangle]
pub extern "C" fn MPIR_Dup_fn(
    _old: Handle,
    _key: c_int,
    _extra: *mut c_void,
    value_in: *mut c_void,
    value_out: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    raw::put_opt(value_out as *mut *mut c_void, value_in);
    raw::put_opt(flag, 1);
    SUCCESS
}

// ---- what MPICH's Fortran binding (libmpichfort.so.12) calls ----------------------------

/// `MPII_Keyval_set_proxy`: the Fortran binding's callbacks are called through these.
#[no_mangle]
pub extern "C" fn MPII_Keyval_set_proxy(
    key: c_int,
    copy: Option<CopyProxy>,
    delete: Option<DeleteProxy>,
) {
    if let Some(mut kv) = KEYVALS.get(key as Handle) {
        kv.proxy = Some((copy, delete));
        KEYVALS.set(key as Handle, kv);
    }
}

/// `MPII_Comm_set_attr`: an attribute given as `kind` (a Fortran integer, or a pointer).
#[no_mangle]
pub extern "C" fn MPII_Comm_set_attr(
    comm: Handle,
    key: c_int,
    value: *mut c_void,
    kind: c_int,
) -> c_int {
    crate::err::ret("MPI_Comm_set_attr", || {
        set_typed(comm, key, raw::address(value), kind)
    })
}

/// `MPII_Comm_get_attr`: the value written as `kind` asks (pointer, address-sized or `int`).
#[no_mangle]
pub extern "C" fn MPII_Comm_get_attr(
    comm: Handle,
    key: c_int,
    out: *mut c_void,
    flag: *mut c_int,
    kind: c_int,
) -> c_int {
    crate::err::ret("MPI_Comm_get_attr", || {
        state::comm(comm)?;
        let v = match predefined(key) {
            // A language that asks for an integer gets the value, C the value's address.
            Some((p, v)) => Some(if kind == ATTR_PTR { p } else { v as isize }),
            None => get(comm, key)?,
        };
        match v {
            Some(v) => {
                if kind == ATTR_INT {
                    raw::put(out as *mut c_int, v as c_int)?;
                } else {
                    raw::put(out as *mut isize, v)?;
                }
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    })
}

/// `MPII_Type_set_attr`: datatype attributes are not kept yet.
#[no_mangle]
pub extern "C" fn MPII_Type_set_attr(
    _t: Handle,
    _key: c_int,
    _v: *mut c_void,
    _kind: c_int,
) -> c_int {
    crate::err::unsupported("MPI_Type_set_attr")
}
/// `MPII_Type_get_attr`.
#[no_mangle]
pub extern "C" fn MPII_Type_get_attr(
    _t: Handle,
    _key: c_int,
    _v: *mut c_void,
    _f: *mut c_int,
    _kind: c_int,
) -> c_int {
    crate::err::unsupported("MPI_Type_get_attr")
}
/// `MPII_Win_set_attr`: window attributes from Fortran are not wired to `win.rs` yet.
#[no_mangle]
pub extern "C" fn MPII_Win_set_attr(
    _w: Handle,
    _key: c_int,
    _v: *mut c_void,
    _kind: c_int,
) -> c_int {
    crate::err::unsupported("MPI_Win_set_attr")
}
/// `MPII_Win_get_attr`.
#[no_mangle]
pub extern "C" fn MPII_Win_get_attr(
    _w: Handle,
    _key: c_int,
    _v: *mut c_void,
    _f: *mut c_int,
    _kind: c_int,
) -> c_int {
    crate::err::unsupported("MPI_Win_get_attr")
}
/// `MPII_Grequest_set_lang_f77`: nothing to mark. Generalized requests call their callbacks
/// with C's arguments, so from Fortran they are not supported yet (docs/c-abi.md).
#[no_mangle]
pub extern "C" fn MPII_Grequest_set_lang_f77(_req: Handle) {}
