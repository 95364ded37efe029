//! Errors as C sees them: error classes and codes, their strings, and the
//! error handlers (MPI-4 §9.3) that decide whether an error returns or ends the job.
//!
//! A failing call makes an error code that carries its class and an index into
//! a table of messages, so `MPI_Error_string` can say what went wrong in that
//! call, not only which class it was.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Mutex;

use metampi::ErrorClass;

use crate::consts::*;
use crate::state;

/// A C error handler function: `(MPI_Comm *, int *, ...)`.
pub type HandlerFn = unsafe extern "C" fn(*mut Handle, *mut c_int);

/// An MPI error on its way to the caller: class and message.
#[derive(Debug, Clone)]
pub struct Fail {
    pub class: c_int,
    pub msg: String,
}

/// What a call's body returns.
pub type R<T = ()> = Result<T, Fail>;

impl Fail {
    pub fn new(class: c_int, msg: impl Into<String>) -> Fail {
        Fail {
            class,
            msg: msg.into(),
        }
    }
    pub fn arg(msg: impl Into<String>) -> Fail {
        Fail::new(ERR_ARG, msg)
    }
}

impl From<metampi::Error> for Fail {
    fn from(e: metampi::Error) -> Fail {
        let class = match e.class() {
            ErrorClass::Rank => ERR_RANK,
            ErrorClass::Tag => ERR_TAG,
            ErrorClass::Count => ERR_COUNT,
            ErrorClass::Truncate => ERR_TRUNCATE,
            ErrorClass::Comm => ERR_COMM,
            ErrorClass::Type => ERR_TYPE,
            ErrorClass::Arg => ERR_ARG,
            ErrorClass::Dims => ERR_DIMS,
            ErrorClass::WouldBlock => ERR_PENDING,
            ErrorClass::Spawn => ERR_SPAWN,
            ErrorClass::Port => ERR_PORT,
            ErrorClass::Name => ERR_NAME,
            ErrorClass::Service => ERR_SERVICE,
            _ => ERR_OTHER,
        };
        Fail::new(class, e.message())
    }
}

thread_local! {
    /// The communicator whose error handler a failing call invokes: the one it
    /// looked up last (MPI_COMM_WORLD's for calls on no communicator).
    static CURRENT: Cell<Handle> = const { Cell::new(COMM_WORLD) };
}

/// Notes that the running call works on communicator `h` (for its error handler).
pub fn on_comm(h: Handle) {
    CURRENT.with(|c| c.set(h));
}

thread_local! {
    /// The file whose error handler a failing MPI-IO call invokes (files have handlers of
    /// their own, MPI-4 §14.7); `None` outside MPI-IO calls, which use [`CURRENT`].
    static FILE: Cell<Option<FileHandle>> = const { Cell::new(None) };
}

/// Notes that the running call works on file `fh` (`None`: on no file).
pub fn on_file(fh: Option<FileHandle>) {
    FILE.with(|c| c.set(fh));
}

thread_local! {
    /// The window whose error handler a failing one-sided call invokes (windows have
    /// handlers of their own, MPI-4 §9.3.2); `None` outside such calls.
    static WIN: Cell<Option<Handle>> = const { Cell::new(None) };
}

/// Notes that the running call works on window `w` (`None`: on no window).
pub fn on_win(w: Option<Handle>) {
    WIN.with(|c| c.set(w));
}

/// Messages of recent error codes; a code is `class | (slot + 1) << 8`.
struct Messages {
    ring: Vec<String>,
    next: usize,
}

const RING: usize = 1 << 14;

static MESSAGES: Mutex<Messages> = Mutex::new(Messages {
    ring: Vec::new(),
    next: 0,
});

/// User error classes and codes (MPI_Add_error_class/code/string, MPI-4.1 §9.5): (code,
/// its class, its string, empty while it has none), in increasing code order. They are
/// numbered from `USER_BASE`, above `MPI_ERR_LASTCODE` as MPI asks, classes and codes from
/// one sequence; a value removed (`MPI_Remove_error_class`/`_code`) is given out again.
pub static USER_CLASSES: Mutex<Vec<(c_int, c_int, String)>> = Mutex::new(Vec::new());
const USER_BASE: c_int = ERR_LASTCODE + 1;

/// A new user error class (`None`) or code of `class`: the lowest value not in use.
pub fn add_user_code(class: Option<c_int>) -> R<c_int> {
    let mut user = USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
    // The list is in code order from USER_BASE: the first gap is the lowest free value.
    let k = (0..user.len())
        .find(|&k| user[k].0 != USER_BASE + k as c_int)
        .unwrap_or(user.len());
    let code = c_int::try_from(k)
        .ok()
        .and_then(|k| USER_BASE.checked_add(k))
        .ok_or_else(|| Fail::new(ERR_OTHER, "no more user error classes and codes"))?;
    user.insert(k, (code, class.unwrap_or(code), String::new()));
    Ok(code)
}

/// What `MPI_Remove_error_*` takes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Class,
    Code,
    String,
}

/// `MPI_Remove_error_class`, `_code` and `_string` (MPI-4.1 §9.5): undoes an
/// `MPI_Add_error_*`. A class goes only once its codes are gone, and a class or code only
/// once its string is (removal runs in the reverse order of addition); the predefined
/// classes and codes stay. Removing the string of a value that has none is allowed.
///
/// # Errors
/// `MPI_ERR_ARG`, naming the value and what is still attached to it.
pub fn remove_user(code: c_int, what: Removal) -> R {
    let mut user = USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(k) = user.iter().position(|e| e.0 == code) else {
        return Err(Fail::arg(if (0..USER_BASE).contains(&code) {
            format!(
                "{code} is a predefined error class or code: only values made by \
                 MPI_Add_error_class or MPI_Add_error_code can be removed"
            )
        } else {
            format!("{code} is not a user error class or code (removed already, or never added)")
        }));
    };
    let class = user[k].1;
    let is_class = class == code;
    match what {
        Removal::String => {
            user[k].2.clear();
            return Ok(());
        }
        Removal::Class if !is_class => {
            return Err(Fail::arg(format!(
                "{code} is an error code of class {class}, not a class \
                 (MPI_Remove_error_code removes it)"
            )));
        }
        Removal::Code if is_class => {
            return Err(Fail::arg(format!(
                "{code} is an error class, not a code (MPI_Remove_error_class removes it)"
            )));
        }
        _ => {}
    }
    let codes = user.iter().filter(|e| e.1 == code && e.0 != code).count();
    if codes > 0 {
        return Err(Fail::arg(format!(
            "error class {code} still has {codes} error code(s): remove them first \
             (MPI_Remove_error_code)"
        )));
    }
    if !user[k].2.is_empty() {
        return Err(Fail::arg(format!(
            "{code} still has its error string: remove that first (MPI_Remove_error_string)"
        )));
    }
    user.remove(k);
    Ok(())
}

mpi! {
    fn MPI_Remove_error_class / PMPI_Remove_error_class(class: c_int) {
        remove_user(class, Removal::Class)
    }
    fn MPI_Remove_error_code / PMPI_Remove_error_code(code: c_int) {
        remove_user(code, Removal::Code)
    }
    fn MPI_Remove_error_string / PMPI_Remove_error_string(code: c_int) {
        remove_user(code, Removal::String)
    }
    // MPICH's names for the same before MPI-4.1 (its `mpi.h` 4.0 declares these).
    fn MPIX_Delete_error_class / PMPIX_Delete_error_class(class: c_int) {
        remove_user(class, Removal::Class)
    }
    fn MPIX_Delete_error_code / PMPIX_Delete_error_code(code: c_int) {
        remove_user(code, Removal::Code)
    }
    fn MPIX_Delete_error_string / PMPIX_Delete_error_string(code: c_int) {
        remove_user(code, Removal::String)
    }
}

/// The class of a user error code or class.
pub fn user_class_of(code: c_int) -> Option<c_int> {
    if code < USER_BASE {
        return None;
    }
    let user = USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
    user.iter().find(|e| e.0 == code).map(|e| e.1)
}

/// The value of the `MPI_LASTUSEDCODE` attribute.
pub fn last_used_code() -> c_int {
    let user = USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
    user.last().map_or(LAST_PREDEFINED_CLASS, |e| e.0)
}

fn make_code(class: c_int, msg: String) -> c_int {
    let mut m = MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
    let slot = m.next % RING;
    if m.ring.len() <= slot {
        m.ring.push(msg);
    } else {
        m.ring[slot] = msg;
    }
    m.next += 1;
    (class & 0xff) | (((slot + 1) as c_int) << 8)
}

/// The class of an error code.
pub fn class_of(code: c_int) -> c_int {
    if let Some(c) = user_class_of(code) {
        return c;
    }
    if (0..=0xff).contains(&code) {
        code
    } else {
        code & 0xff
    }
}

/// The text of an error code: what went wrong in that call, or the class's description.
pub fn string_of(code: c_int) -> String {
    let class = class_of(code);
    let slot = (code >> 8) as usize;
    if slot > 0 && code >= 0 {
        let m = MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.ring.get(slot - 1) {
            return format!("{}: {s}", class_name(class));
        }
    }
    if code >= USER_BASE {
        let user = USER_CLASSES.lock().unwrap_or_else(|p| p.into_inner());
        return match user.iter().find(|e| e.0 == code) {
            Some(e) => e.2.clone(),
            None => format!(
                "MPI error: {code} is not an error code (a user class or code removed, or never added)"
            ),
        };
    }
    format!("{}: {}", class_name(class), class_text(class))
}

pub fn class_name(class: c_int) -> &'static str {
    match class {
        SUCCESS => "MPI_SUCCESS",
        ERR_BUFFER => "MPI_ERR_BUFFER",
        ERR_COUNT => "MPI_ERR_COUNT",
        ERR_TYPE => "MPI_ERR_TYPE",
        ERR_TAG => "MPI_ERR_TAG",
        ERR_COMM => "MPI_ERR_COMM",
        ERR_RANK => "MPI_ERR_RANK",
        ERR_ROOT => "MPI_ERR_ROOT",
        ERR_GROUP => "MPI_ERR_GROUP",
        ERR_OP => "MPI_ERR_OP",
        ERR_TOPOLOGY => "MPI_ERR_TOPOLOGY",
        ERR_DIMS => "MPI_ERR_DIMS",
        ERR_ARG => "MPI_ERR_ARG",
        ERR_UNKNOWN => "MPI_ERR_UNKNOWN",
        ERR_TRUNCATE => "MPI_ERR_TRUNCATE",
        ERR_OTHER => "MPI_ERR_OTHER",
        ERR_INTERN => "MPI_ERR_INTERN",
        ERR_IN_STATUS => "MPI_ERR_IN_STATUS",
        ERR_PENDING => "MPI_ERR_PENDING",
        ERR_REQUEST => "MPI_ERR_REQUEST",
        ERR_INFO_KEY => "MPI_ERR_INFO_KEY",
        ERR_INFO_VALUE => "MPI_ERR_INFO_VALUE",
        ERR_INFO_NOKEY => "MPI_ERR_INFO_NOKEY",
        ERR_NO_MEM => "MPI_ERR_NO_MEM",
        ERR_SPAWN => "MPI_ERR_SPAWN",
        ERR_UNSUPPORTED_OPERATION => "MPI_ERR_UNSUPPORTED_OPERATION",
        ERR_KEYVAL => "MPI_ERR_KEYVAL",
        ERR_SIZE => "MPI_ERR_SIZE",
        ERR_PROC_ABORTED => "MPI_ERR_PROC_ABORTED",
        ERR_SESSION => "MPI_ERR_SESSION",
        ERR_ACCESS => "MPI_ERR_ACCESS",
        ERR_AMODE => "MPI_ERR_AMODE",
        ERR_BAD_FILE => "MPI_ERR_BAD_FILE",
        ERR_CONVERSION => "MPI_ERR_CONVERSION",
        ERR_DUP_DATAREP => "MPI_ERR_DUP_DATAREP",
        ERR_FILE_EXISTS => "MPI_ERR_FILE_EXISTS",
        ERR_FILE_IN_USE => "MPI_ERR_FILE_IN_USE",
        ERR_FILE => "MPI_ERR_FILE",
        ERR_IO => "MPI_ERR_IO",
        ERR_NOT_SAME => "MPI_ERR_NOT_SAME",
        ERR_NO_SPACE => "MPI_ERR_NO_SPACE",
        ERR_NO_SUCH_FILE => "MPI_ERR_NO_SUCH_FILE",
        ERR_QUOTA => "MPI_ERR_QUOTA",
        ERR_READ_ONLY => "MPI_ERR_READ_ONLY",
        ERR_UNSUPPORTED_DATAREP => "MPI_ERR_UNSUPPORTED_DATAREP",
        ERR_WIN => "MPI_ERR_WIN",
        ERR_BASE => "MPI_ERR_BASE",
        ERR_LOCKTYPE => "MPI_ERR_LOCKTYPE",
        ERR_RMA_CONFLICT => "MPI_ERR_RMA_CONFLICT",
        ERR_RMA_SYNC => "MPI_ERR_RMA_SYNC",
        ERR_DISP => "MPI_ERR_DISP",
        ERR_ASSERT => "MPI_ERR_ASSERT",
        ERR_RMA_RANGE => "MPI_ERR_RMA_RANGE",
        ERR_RMA_ATTACH => "MPI_ERR_RMA_ATTACH",
        ERR_RMA_SHARED => "MPI_ERR_RMA_SHARED",
        ERR_RMA_FLAVOR => "MPI_ERR_RMA_FLAVOR",
        _ => "MPI error",
    }
}

fn class_text(class: c_int) -> &'static str {
    match class {
        SUCCESS => "no error",
        ERR_BUFFER => "invalid buffer pointer",
        ERR_COUNT => "invalid count argument",
        ERR_TYPE => "invalid datatype",
        ERR_TAG => "invalid tag",
        ERR_COMM => "invalid communicator",
        ERR_RANK => "invalid rank",
        ERR_ROOT => "invalid root",
        ERR_GROUP => "invalid group",
        ERR_OP => "invalid operation",
        ERR_TOPOLOGY => "invalid topology",
        ERR_DIMS => "invalid dimension argument",
        ERR_ARG => "invalid argument",
        ERR_TRUNCATE => "message truncated",
        ERR_OTHER => "other error",
        ERR_INTERN => "internal error",
        ERR_IN_STATUS => "error code is in status",
        ERR_PENDING => "pending request",
        ERR_REQUEST => "invalid request",
        ERR_UNSUPPORTED_OPERATION => "operation not supported by metampi",
        ERR_KEYVAL => "invalid keyval",
        ERR_SESSION => "invalid session",
        ERR_ACCESS => "permission denied",
        ERR_AMODE => "invalid access mode",
        ERR_BAD_FILE => "invalid file name",
        ERR_FILE_EXISTS => "file exists",
        ERR_FILE => "invalid file handle",
        ERR_IO => "input/output error",
        ERR_NOT_SAME => "arguments differ between the processes of a collective call",
        ERR_NO_SPACE => "no space left on device",
        ERR_NO_SUCH_FILE => "no such file",
        ERR_QUOTA => "quota exceeded",
        ERR_READ_ONLY => "read-only file or file system",
        ERR_UNSUPPORTED_DATAREP => "unsupported data representation",
        ERR_WIN => "invalid window",
        ERR_BASE => "invalid base address",
        ERR_LOCKTYPE => "invalid lock type",
        ERR_RMA_CONFLICT => "conflicting accesses to a window",
        ERR_RMA_SYNC => "wrong synchronization of one-sided calls",
        ERR_DISP => "invalid displacement",
        ERR_ASSERT => "invalid assertion",
        ERR_RMA_RANGE => "target memory is outside the window",
        ERR_RMA_ATTACH => "memory cannot be attached",
        ERR_RMA_SHARED => "memory cannot be shared",
        ERR_RMA_FLAVOR => "wrong flavor of window",
        _ => "unknown error class",
    }
}

/// How a failing call ends: through the error handler of the communicator (or,
/// in MPI-IO calls, the file) it worked on. Returns the code the call returns (when
/// the handler returns).
pub fn raise(func: &str, fail: Fail) -> c_int {
    let comm = CURRENT.with(|c| c.replace(COMM_WORLD));
    let file = FILE.with(|c| c.take());
    let win = WIN.with(|c| c.take());
    let code = make_code(fail.class, format!("{func}: {}", fail.msg));
    let handler = match (file, win) {
        (Some(fh), _) => crate::io::errhandler_of(fh),
        (None, Some(w)) => crate::win::errhandler_of(w),
        (None, None) => state::errhandler_of(comm),
    };
    match handler {
        state::Handler::Return => code,
        state::Handler::User(f) => {
            match (file, win) {
                (Some(fh), _) => crate::raw::call_file_errhandler(f, fh, code),
                (None, Some(w)) => crate::raw::call_errhandler(f, w, code),
                (None, None) => crate::raw::call_errhandler(f, comm, code),
            }
            code
        }
        state::Handler::Fatal => {
            eprintln!(
                "metampi: {func}: {}: {} (MPI_ERRORS_ARE_FATAL: the job ends)",
                class_name(fail.class),
                fail.msg
            );
            state::abort_job(code.max(1))
        }
    }
}

/// `MPI_*_call_errhandler`: invokes the error handler of object `h` (a communicator
/// or a session) with `code`, as a failing call on it would.
pub fn raise_through(func: &str, h: Handle, code: c_int) {
    match state::errhandler_of(h) {
        state::Handler::Return => {}
        state::Handler::User(f) => crate::raw::call_errhandler(f, h, code),
        state::Handler::Fatal => {
            eprintln!(
                "metampi: {func}: {} (MPI_ERRORS_ARE_FATAL: the job ends)",
                string_of(code)
            );
            state::abort_job(code.max(1))
        }
    }
}

/// Runs a call's body: its result, or the error through the handler. A panic
/// inside the library becomes MPI_ERR_INTERN instead of unwinding into C.
#[inline(always)]
pub fn ret(func: &str, body: impl FnOnce() -> R) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            CURRENT.with(|c| c.set(COMM_WORLD));
            SUCCESS
        }
        Ok(Err(f)) => raise(func, f),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic inside the library".into());
            raise(func, Fail::new(ERR_INTERN, msg))
        }
    }
}

/// The body of every exported function metampi does not implement yet.
pub fn unsupported(func: &str) -> c_int {
    raise(
        func,
        Fail::new(
            ERR_UNSUPPORTED_OPERATION,
            "not implemented by metampi (see docs/c-abi.md for what is)",
        ),
    )
}

/// An error code for `fail` without invoking a handler (an error reported in a
/// status of a multi-request call, whose call then fails with MPI_ERR_IN_STATUS).
pub fn raise_quiet(fail: Fail) -> c_int {
    make_code(fail.class, fail.msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the user classes are the process's, shared by every test thread.
    #[test]
    fn user_errors_are_removed_in_reverse_order_and_their_values_reused() {
        let class = add_user_code(None).unwrap();
        let code = add_user_code(Some(class)).unwrap();
        let set_string = |c: c_int, s: &str| {
            let mut user = USER_CLASSES.lock().unwrap();
            user.iter_mut().find(|e| e.0 == c).unwrap().2 = s.into();
        };
        set_string(code, "mine");
        assert_eq!((class, code), (USER_BASE, USER_BASE + 1));
        assert_eq!(last_used_code(), code);
        assert_eq!(string_of(code), "mine");

        let refused = |c, what| remove_user(c, what).unwrap_err();
        assert!(refused(class, Removal::Class)
            .msg
            .contains("still has 1 error code"));
        assert!(refused(code, Removal::Code).msg.contains("error string"));
        assert!(refused(code, Removal::Class).msg.contains("not a class"));
        assert!(refused(class, Removal::Code).msg.contains("not a code"));
        assert!(refused(ERR_TAG, Removal::Class).msg.contains("predefined"));
        assert_eq!(refused(USER_BASE + 9, Removal::Code).class, ERR_ARG);

        remove_user(code, Removal::String).unwrap();
        remove_user(code, Removal::Code).unwrap();
        assert_eq!(last_used_code(), class);
        assert_eq!(user_class_of(code), None);
        assert!(string_of(code).contains("not an error code"));
        assert!(remove_user(code, Removal::Code).is_err());

        // The freed value is the lowest free one: given again.
        let again = add_user_code(Some(class)).unwrap();
        assert_eq!(again, code);
        remove_user(again, Removal::Code).unwrap();
        // A class's own string goes first too.
        set_string(class, "my class");
        assert!(refused(class, Removal::Class).msg.contains("error string"));
        remove_user(class, Removal::String).unwrap();
        remove_user(class, Removal::Class).unwrap();
        assert_eq!(last_used_code(), LAST_PREDEFINED_CLASS);
        assert_eq!(add_user_code(None).unwrap(), USER_BASE);
    }
}
