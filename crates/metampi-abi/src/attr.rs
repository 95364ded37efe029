//! Attribute caching on communicators (MPI-4 §7.7): keyvals with copy and
//! delete callbacks, the predefined attributes (`MPI_TAG_UB` and kin), and
//! `MPIR_Dup_fn` (`MPI_COMM_DUP_FN`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use metampi::topology::Communicator;

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state::{self, CommEntry, Table};

/// `MPI_Comm_copy_attr_function`.
pub type CopyFn =
    unsafe extern "C" fn(c_int, c_int, *mut c_void, *mut c_void, *mut c_void, *mut c_int) -> c_int;
/// `MPI_Comm_delete_attr_function`.
pub type DeleteFn = unsafe extern "C" fn(c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// A keyval: its callbacks and extra state.
#[derive(Clone, Copy)]
pub struct Keyval {
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    extra: isize,
}

pub static KEYVALS: Table<Keyval> = Table::new(KEYVAL_BASE);

/// Values of the predefined attributes, where a pointer to them is handed out.
static PREDEF: [AtomicI32; 7] = [const { AtomicI32::new(0) }; 7];

fn predefined(key: c_int) -> Option<isize> {
    let (slot, v) = match key {
        TAG_UB => (0, TAG_UB_VALUE),
        HOST => (1, PROC_NULL),
        IO => (2, ANY_SOURCE),
        WTIME_IS_GLOBAL => (3, 0),
        UNIVERSE_SIZE => (4, metampi::topology::SimpleCommunicator::world().size()),
        LASTUSEDCODE => (5, LAST_PREDEFINED_CLASS),
        APPNUM => (6, 0),
        _ => return None,
    };
    PREDEF[slot].store(v, Ordering::Relaxed);
    Some(&PREDEF[slot] as *const AtomicI32 as isize)
}

fn keyval(k: c_int) -> R<Keyval> {
    KEYVALS
        .get(k)
        .ok_or_else(|| Fail::new(ERR_KEYVAL, format!("{k:#x} is not a keyval")))
}

/// Copies every attribute of `old` that its keyval's copy callback keeps onto `new`.
pub fn copy_all(old: c_int, parent: &CommEntry, new: c_int) -> R {
    let attrs = parent
        .attrs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let child = state::comm(new)?;
    let mut out = Vec::new();
    for (k, v) in attrs {
        let Ok(kv) = keyval(k) else { continue };
        let Some(f) = kv.copy else { continue };
        let (rc, keep, nv) = raw::call_copy_fn(f, old, k, kv.extra, v);
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
pub fn delete_all(h: c_int) {
    let Ok(c) = state::comm(h) else { return };
    let attrs = std::mem::take(&mut *c.attrs.lock().unwrap_or_else(|p| p.into_inner()));
    for (k, v) in attrs {
        if let Ok(Keyval {
            delete: Some(f),
            extra,
            ..
        }) = keyval(k)
        {
            raw::call_delete_fn(f, h, k, v, extra);
        }
    }
}

fn set(comm: c_int, key: c_int, value: isize) -> R {
    let c = state::comm(comm)?;
    let kv = keyval(key)?;
    let old = {
        let mut a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
        let old = a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1);
        a.push((key, value));
        old
    };
    if let (Some(v), Some(f)) = (old, kv.delete) {
        raw::call_delete_fn(f, comm, key, v, kv.extra);
    }
    Ok(())
}

/// The value of attribute `key` on `comm`, if set.
pub fn get(comm: c_int, key: c_int) -> R<Option<isize>> {
    let c = state::comm(comm)?;
    if let Some(p) = predefined(key) {
        return Ok(Some(p));
    }
    keyval(key)?;
    let a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
    Ok(a.iter().find(|e| e.0 == key).map(|e| e.1))
}

fn delete(comm: c_int, key: c_int) -> R {
    let c = state::comm(comm)?;
    let kv = keyval(key)?;
    let v = {
        let mut a = c.attrs.lock().unwrap_or_else(|p| p.into_inner());
        a.iter().position(|e| e.0 == key).map(|i| a.remove(i).1)
    };
    match v {
        Some(v) => {
            if let Some(f) = kv.delete {
                let rc = raw::call_delete_fn(f, comm, key, v, kv.extra);
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
    raw::put(
        key,
        KEYVALS.insert(Keyval {
            copy,
            delete,
            extra: raw::address(extra),
        }),
    )
}

fn free_keyval(key: *mut c_int) -> R {
    let k = raw::get(key)?;
    KEYVALS
        .remove(k)
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
    fn MPI_Comm_set_attr / PMPI_Comm_set_attr(comm: c_int, key: c_int, value: *mut c_void) {
        set(comm, key, raw::address(value))
    }
    fn MPI_Attr_put / PMPI_Attr_put(comm: c_int, key: c_int, value: *mut c_void) {
        set(comm, key, raw::address(value))
    }
    fn MPI_Comm_get_attr / PMPI_Comm_get_attr(comm: c_int, key: c_int, value: *mut isize, flag: *mut c_int) {
        match get(comm, key)? {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Attr_get / PMPI_Attr_get(comm: c_int, key: c_int, value: *mut isize, flag: *mut c_int) {
        match get(comm, key)? {
            Some(v) => {
                raw::put(value, v)?;
                raw::put(flag, 1)
            }
            None => raw::put(flag, 0),
        }
    }
    fn MPI_Comm_delete_attr / PMPI_Comm_delete_attr(comm: c_int, key: c_int) {
        delete(comm, key)
    }
    fn MPI_Attr_delete / PMPI_Attr_delete(comm: c_int, key: c_int) {
        delete(comm, key)
    }
}

/// `MPI_COMM_DUP_FN` / `MPI_DUP_FN`: the copy callback that keeps the value.
#[no_mangle]
pub extern "C" fn MPIR_Dup_fn(
    _old: c_int,
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
