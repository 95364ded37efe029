//! Everything that touches C's memory: reading and writing through the
//! pointers a C caller passes, buffers made of a pointer, a count and a
//! datatype, and requests over them. This is the crate's one module with
//! `unsafe`; the rest is safe code over what it hands out.
//!
//! The contract is MPI's: a pointer argument is either one of the special
//! values the standard names (null where allowed, `MPI_STATUS_IGNORE`,
//! `MPI_IN_PLACE`) or valid for what the function's signature says, and a
//! buffer holds `count` elements of its datatype until its operation completes.
//! The helpers check the special values; the rest they must take on trust,
//! as every C MPI library does.

use std::ffi::{c_char, c_int, c_void, CStr};

use metampi::datatype::{
    AsDatatype, Buffer, BufferMut, Collection, DatatypeRef, Pointer, PointerMut,
};
use metampi::request::abi::RawRequest;
use metampi::request::{Request, Scope};
use metampi::Count;

use crate::consts::{IN_PLACE, STATUS_IGNORE};
use crate::err::{Fail, R};

/// Writes `v` through `p`; null is an argument error.
pub fn put<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(Fail::arg("an output argument is a null pointer"));
    }
    // SAFETY: MPI's contract: an output argument points at a `T` the caller owns.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `v` through `p` unless `p` is null (optional outputs).
pub fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as in `put`.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads the value at `p`; null is an argument error.
pub fn get<T: Copy>(p: *const T) -> Result<T, Fail> {
    if p.is_null() {
        return Err(Fail::arg("an input argument is a null pointer"));
    }
    // SAFETY: MPI's contract: an input argument points at a `T`.
    Ok(unsafe { p.read_unaligned() })
}

/// The `n` values at `p` (an empty list for `n <= 0`).
pub fn slice<'a, T>(p: *const T, n: c_int) -> Result<&'a [T], Fail> {
    if n <= 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Fail::arg("an array argument is a null pointer"));
    }
    // SAFETY: MPI's contract: an array argument holds the count the call names.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// The `n` values at `p`, writable.
pub fn slice_mut<'a, T>(p: *mut T, n: c_int) -> Result<&'a mut [T], Fail> {
    if n <= 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Fail::arg("an array argument is a null pointer"));
    }
    // SAFETY: MPI's contract: an output array holds the count the call names.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n as usize) })
}

/// A C string argument.
pub fn c_str(p: *const c_char) -> Result<String, Fail> {
    if p.is_null() {
        return Err(Fail::arg("a string argument is a null pointer"));
    }
    // SAFETY: MPI's contract: a string argument is NUL-terminated.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Longest argument vector read from a caller (a missing terminator stops here, not at a
/// fault far beyond).
const MAX_ARGV: usize = 1 << 16;

/// A NULL-terminated array of C strings (a spawn's `argv`), as the bytes they hold;
/// a null array (`MPI_ARGV_NULL`) is empty.
pub fn argv(p: *const *const c_char) -> Result<Vec<std::ffi::OsString>, Fail> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    if p.is_null() {
        return Ok(out);
    }
    loop {
        // SAFETY: MPI's contract: `argv` is an array of string pointers ended by a null one;
        // reading stops at that null entry.
        let s = unsafe { p.add(out.len()).read_unaligned() };
        if s.is_null() {
            return Ok(out);
        }
        if out.len() == MAX_ARGV {
            return Err(Fail::arg(format!(
                "an argument vector has no null entry in its first {MAX_ARGV}"
            )));
        }
        // SAFETY: each entry before the terminator is a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(s) }.to_bytes();
        out.push(std::ffi::OsStr::from_bytes(bytes).to_os_string());
    }
}

/// Entry `i` of an array of argument vectors (`MPI_Comm_spawn_multiple`), read as
/// [`argv`]; a null array (`MPI_ARGVS_NULL`) gives empty vectors.
pub fn argv_at(p: *const *const *const c_char, i: usize) -> Result<Vec<std::ffi::OsString>, Fail> {
    if p.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: MPI's contract: the array holds one argument vector per command (the call's
    // count, which callers check `i` against).
    argv(unsafe { p.add(i).read_unaligned() })
}

/// Runs `f` on the connected socket `fd` of the caller (`MPI_Comm_join`), which keeps it:
/// it is not closed here.
pub fn with_socket<T>(fd: c_int, f: impl FnOnce(&mut std::net::TcpStream) -> T) -> Result<T, Fail> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(Fail::arg(format!("{fd} is not a file descriptor")));
    }
    // SAFETY: MPI's contract: `fd` is an open socket connected to the other process for
    // the length of the call; ManuallyDrop leaves it open, as the caller owns it.
    let mut s = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    Ok(f(&mut s))
}

/// A C string argument as the bytes it holds (a program's name, which need not be UTF-8).
pub fn c_os_str(p: *const c_char) -> Result<std::ffi::OsString, Fail> {
    use std::os::unix::ffi::OsStrExt;
    if p.is_null() {
        return Err(Fail::arg("a string argument is a null pointer"));
    }
    // SAFETY: MPI's contract: a string argument is NUL-terminated.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Ok(std::ffi::OsStr::from_bytes(bytes).to_os_string())
}

/// Copies `s` into the C buffer `p` of `cap` bytes (NUL included, cut to fit)
/// and returns the length written without the NUL.
pub fn put_str(p: *mut c_char, cap: usize, s: &str) -> Result<c_int, Fail> {
    if p.is_null() {
        return Err(Fail::arg("a string output argument is a null pointer"));
    }
    let n = s.len().min(cap.saturating_sub(1));
    // SAFETY: MPI's contract: the output holds `cap` bytes (MPI_MAX_* of the call).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), p as *mut u8, n);
        *p.add(n) = 0;
    }
    Ok(n as c_int)
}

/// Whether a status pointer is `MPI_STATUS_IGNORE` (or null, which some codes pass).
pub fn status_ignored<T>(p: *mut T) -> bool {
    p.is_null() || p as usize == STATUS_IGNORE
}

/// Element `i` of a status array, or null when the array is ignored.
pub fn status_at<T>(p: *mut T, i: usize) -> *mut T {
    if status_ignored(p) {
        return std::ptr::null_mut();
    }
    p.wrapping_add(i)
}

/// Whether a buffer argument is `MPI_IN_PLACE`.
pub fn in_place(p: *const c_void) -> bool {
    p as usize == IN_PLACE
}

/// `p` moved by `bytes`.
pub fn offset(p: *const c_void, bytes: isize) -> *mut c_void {
    (p as *mut u8).wrapping_offset(bytes) as *mut c_void
}

/// The address of `p` as an integer (`MPI_Get_address`).
pub fn address(p: *const c_void) -> isize {
    p as isize
}

/// Copies `n` bytes between C buffers that do not overlap.
pub fn copy_bytes(from: *const c_void, to: *mut c_void, n: usize) {
    if n == 0 || std::ptr::eq(from, to) {
        return;
    }
    // SAFETY: callers pass two buffers of at least `n` bytes each, from MPI arguments.
    unsafe { std::ptr::copy(from as *const u8, to as *mut u8, n) };
}

/// The `n` bytes at `p`, read.
pub fn bytes<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: callers pass a C buffer of at least `n` bytes.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }
}

/// The `n` bytes at `p`, written.
pub fn bytes_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        return &mut [];
    }
    // SAFETY: callers pass a C buffer of at least `n` bytes.
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
}

/// A C buffer: base address, element count and datatype, as every MPI call names one.
#[derive(Clone, Copy, Debug)]
pub struct CBuf {
    pub ptr: *mut c_void,
    pub count: Count,
    pub dt: DatatypeRef<'static>,
}

impl CBuf {
    pub fn new(ptr: *const c_void, count: Count, dt: DatatypeRef<'static>) -> CBuf {
        CBuf {
            ptr: ptr as *mut c_void,
            count,
            dt,
        }
    }
}

// SAFETY: a CBuf is an address, a count and a datatype id: C memory that MPI lets
// any thread of the program hand to the library (persistent requests keep one).
unsafe impl Send for CBuf {}
// SAFETY: as above; the library only reads the description through `&CBuf`.
unsafe impl Sync for CBuf {}

// SAFETY: the C caller's buffer holds `count` elements of `dt` (MPI's contract).
unsafe impl Collection for CBuf {
    fn count(&self) -> Count {
        self.count
    }
}
// SAFETY: as above: readable for the elements the datatype describes.
unsafe impl Pointer for CBuf {
    fn pointer(&self) -> *const c_void {
        self.ptr
    }
}
// SAFETY: as above: a receive buffer is writable for the elements the datatype describes.
unsafe impl PointerMut for CBuf {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr
    }
}
// SAFETY: the datatype is the one the C caller named for this buffer.
unsafe impl AsDatatype for CBuf {
    type Out = DatatypeRef<'static>;
    fn as_datatype(&self) -> DatatypeRef<'static> {
        self.dt
    }
}
// SAFETY: see the impls above.
unsafe impl Buffer for CBuf {}
// SAFETY: see the impls above.
unsafe impl BufferMut for CBuf {}

/// The scope of requests over C buffers: the C program keeps them alive until
/// the request completes, as MPI requires of it.
#[derive(Clone, Copy, Debug, Default)]
pub struct CScope;

// SAFETY: C's MPI contract keeps a request's buffer valid until it completes;
// nothing here frees one.
unsafe impl<'a> Scope<'a> for CScope {
    fn register(&self) {}
    unsafe fn unregister(&self) {}
}

/// A request over a C buffer, detached from the Rust borrow that made it.
pub fn detach<'a, D: ?Sized>(r: Request<'a, D, CScope>) -> RawRequest {
    // SAFETY: the buffer is C memory the program keeps valid until the request
    // completes (MPI's contract); what else the request borrowed (operations,
    // counts) the request table keeps alive beside it.
    unsafe { r.into_raw() }
}

/// A data conversion function of `MPI_Register_datarep` (`count` an `int`).
pub type DatarepFn = unsafe extern "C" fn(
    *mut c_void,
    crate::consts::Handle,
    c_int,
    *mut c_void,
    i64,
    *mut c_void,
) -> c_int;
/// A data conversion function of `MPI_Register_datarep_c` (`count` an `MPI_Count`).
pub type DatarepFnC = unsafe extern "C" fn(
    *mut c_void,
    crate::consts::Handle,
    i64,
    *mut c_void,
    i64,
    *mut c_void,
) -> c_int;
/// The file-extent function of a registered data representation.
pub type DatarepExtentFn =
    unsafe extern "C" fn(crate::consts::Handle, *mut isize, *mut c_void) -> c_int;

/// One of a data representation's conversion functions.
#[derive(Clone, Copy)]
pub enum Conversion {
    Int(DatarepFn),
    Count(DatarepFnC),
}

/// Calls conversion `f` on `count` elements of `dt` at `userbuf` and the file
/// representation at `filebuf` (starting at element `position`); its return code.
pub fn call_conversion(
    f: Conversion,
    userbuf: *mut c_void,
    dt: crate::consts::Handle,
    count: usize,
    filebuf: *mut c_void,
    position: i64,
    extra: usize,
) -> c_int {
    match f {
        Conversion::Int(f) => {
            let Ok(n) = c_int::try_from(count) else {
                return crate::consts::ERR_COUNT;
            };
            // SAFETY: `f` is the function the program registered for this representation;
            // the buffers hold `count` elements of `dt` in memory and in the file's form.
            unsafe { f(userbuf, dt, n, filebuf, position, extra as *mut c_void) }
        }
        // SAFETY: as above.
        Conversion::Count(f) => unsafe {
            f(
                userbuf,
                dt,
                count as i64,
                filebuf,
                position,
                extra as *mut c_void,
            )
        },
    }
}

/// Calls a representation's extent function on `dt`: its return code and the extent.
pub fn call_datarep_extent(
    f: DatarepExtentFn,
    dt: crate::consts::Handle,
    extra: usize,
) -> (c_int, isize) {
    let mut ext: isize = 0;
    // SAFETY: `f` is the extent function the program registered; it writes one MPI_Aint.
    let rc = unsafe { f(dt, &mut ext, extra as *mut c_void) };
    (rc, ext)
}

/// Calls a C reduction function `f(invec, inoutvec, len, datatype)`.
pub fn call_user_op(
    f: crate::types::UserFn,
    invec: *const c_void,
    inout: *mut c_void,
    len: c_int,
    dt: crate::consts::Handle,
) {
    let (mut len, mut dt) = (len, dt);
    // SAFETY: `f` is the function the program registered with MPI_Op_create;
    // the buffers hold `len` elements of its datatype, laid out as the datatype says.
    unsafe { f(invec as *mut c_void, inout, &mut len, &mut dt) };
}

/// Calls a C reduction function of `MPI_Op_create_c`: `f(invec, inoutvec, len, datatype)`
/// with the length as an `MPI_Count`.
pub fn call_user_op_c(
    f: crate::types::UserFnC,
    invec: *const c_void,
    inout: *mut c_void,
    len: i64,
    dt: crate::consts::Handle,
) {
    let (mut len, mut dt) = (len, dt);
    // SAFETY: as in `call_user_op`: `f` is the function the program registered with
    // MPI_Op_create_c, over buffers of `len` elements of its datatype.
    unsafe { f(invec as *mut c_void, inout, &mut len, &mut dt) };
}

/// Calls a C error handler function `f(&comm, &code)`.
pub fn call_errhandler(f: crate::err::HandlerFn, comm: crate::consts::Handle, code: c_int) {
    let (mut comm, mut code) = (comm, code);
    // SAFETY: `f` is the function the program registered with MPI_Comm_create_errhandler.
    unsafe { f(&mut comm, &mut code) };
}

/// Calls a C file error handler function `f(&file, &code)`: an `MPI_File` is
/// pointer-sized in both ABIs, wider than MPICH's integer handles.
pub fn call_file_errhandler(
    f: crate::err::HandlerFn,
    file: crate::consts::FileHandle,
    code: c_int,
) {
    let (mut file, mut code) = (file, code);
    // SAFETY: `f` is a function the program registered with a create_errhandler call; the
    // C types of all of them take a pointer to the object's handle and one to the code, and
    // a file's handler reads an `MPI_File` (this pointer-sized value) through the first.
    unsafe {
        f(
            &mut file as *mut crate::consts::FileHandle as *mut crate::consts::Handle,
            &mut code,
        )
    };
}

/// Takes (`Some(exclusive)`) or releases (`None`) an advisory `flock` on `f`, waiting
/// while another open description of the file holds a conflicting one (`File::lock`
/// arrived after the workspace's minimum Rust version).
pub fn flock(f: &std::fs::File, take: Option<bool>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let op = match take {
        Some(true) => libc::LOCK_EX,
        Some(false) => libc::LOCK_SH,
        None => libc::LOCK_UN,
    };
    loop {
        // SAFETY: flock only reads its two integers; the descriptor is `f`'s, open while
        // `f` is borrowed.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Calls an attribute copy function; returns `(error, keep, new value)`.
pub fn call_copy_fn(
    f: crate::attr::CopyFn,
    old: crate::consts::Handle,
    key: c_int,
    extra: isize,
    value: isize,
) -> (c_int, bool, isize) {
    let mut out: isize = 0;
    let mut flag: c_int = 0;
    // SAFETY: `f` is the copy callback the program registered with the keyval; the
    // value pointers are the attribute values it stored, opaque to this library.
    let rc = unsafe {
        f(
            old,
            key,
            extra as *mut c_void,
            value as *mut c_void,
            &mut out as *mut isize as *mut c_void,
            &mut flag,
        )
    };
    (rc, flag != 0, out)
}

/// Calls an attribute delete function; returns its error code.
pub fn call_delete_fn(
    f: crate::attr::DeleteFn,
    obj: crate::consts::Handle,
    key: c_int,
    value: isize,
    extra: isize,
) -> c_int {
    // SAFETY: `f` is the delete callback the program registered with the keyval.
    unsafe { f(obj, key, value as *mut c_void, extra as *mut c_void) }
}

/// Memory from `MPI_Alloc_mem`, aligned for any type.
pub fn alloc(size: usize) -> *mut c_void {
    // SAFETY: malloc with a size; a null result is reported by the caller.
    unsafe { libc::malloc(size.max(1)) }
}

/// Frees memory from [`alloc`].
pub fn free(p: *mut c_void) {
    // SAFETY: `p` came from `alloc` (MPI_Free_mem's contract) or is null.
    unsafe { libc::free(p) }
}

/// Keeps a value that is shared only by reference (`Sync`) alive beside a
/// request, wherever the request completes.
pub struct Kept<T: Sync>(#[allow(dead_code)] pub Box<T>);

// SAFETY: the value is only ever reached through shared references (it is
// `Sync`) while kept, and dropping it on another thread touches nothing
// thread-bound: what is kept here are closures over plain function pointers
// and integers (user reduction operations).
unsafe impl<T: Sync> Send for Kept<T> {}

/// A private copy of a C buffer's data, laid out as the original (for
/// `MPI_IN_PLACE`): `base` is where element 0 would start.
pub struct Temp {
    pub _mem: Vec<u128>,
    pub base: *const c_void,
}

// SAFETY: `base` points into `_mem`'s heap memory, which moves with the value
// and is reached only through the request that keeps it.
unsafe impl Send for Temp {}

/// Calls a language binding's copy proxy with the user's copy function; `(error, keep, value)`.
pub fn call_copy_proxy(
    proxy: crate::attr::CopyProxy,
    f: Option<crate::attr::CopyFn>,
    obj: crate::consts::Handle,
    key: c_int,
    extra: isize,
    kind: c_int,
    value: isize,
) -> (c_int, bool, isize) {
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: the proxy is the function the binding registered with MPII_Keyval_set_proxy;
    // it receives the user's callback and values as the binding stored them.
    let rc = unsafe {
        proxy(
            f,
            obj,
            key,
            extra as *mut c_void,
            kind,
            value as *mut c_void,
            &mut out,
            &mut flag,
        )
    };
    (rc, flag != 0, out as isize)
}

/// Calls a language binding's delete proxy with the user's delete function.
pub fn call_delete_proxy(
    proxy: crate::attr::DeleteProxy,
    f: Option<crate::attr::DeleteFn>,
    obj: crate::consts::Handle,
    key: c_int,
    kind: c_int,
    value: isize,
    extra: isize,
) -> c_int {
    // SAFETY: as for `call_copy_proxy`.
    unsafe {
        proxy(
            f,
            obj,
            key,
            kind,
            value as *mut c_void,
            extra as *mut c_void,
        )
    }
}

/// A C caller's pointer (or several) held past the call that passed it: the
/// arguments of a persistent collective, the state of a generalized request.
#[derive(Clone, Copy, Debug)]
pub struct Shared<T: Copy>(pub T);

impl<T: Copy> Shared<T> {
    pub fn get(&self) -> T {
        self.0
    }
}

// SAFETY: MPI's contract: what such a pointer points at stays valid, and is not
// touched by the program against the rules, until the request that holds it is
// freed; the library reaches it only from the thread that starts or completes
// the request.
unsafe impl<T: Copy> Send for Shared<T> {}
// SAFETY: as for Send; the pointer itself is only copied.
unsafe impl<T: Copy> Sync for Shared<T> {}

/// Calls a generalized request's query function.
pub fn call_grequest_query(
    f: crate::req::QueryFn,
    extra: *mut c_void,
    st: &mut crate::req::CStatus,
) -> c_int {
    // SAFETY: the program gave `f` and `extra` to MPI_Grequest_start for this call.
    unsafe { f(extra, st) }
}

/// Calls a generalized request's free function.
pub fn call_grequest_free(f: crate::req::FreeFn, extra: *mut c_void) -> c_int {
    // SAFETY: as in `call_grequest_query`.
    unsafe { f(extra) }
}

/// Calls a generalized request's cancel function.
pub fn call_grequest_cancel(f: crate::req::CancelFn, extra: *mut c_void, complete: c_int) -> c_int {
    // SAFETY: as in `call_grequest_query`.
    unsafe { f(extra, complete) }
}

/// Maps `len` bytes of file `f` (a segment under `/dev/shm`) shared and writable: the
/// memory of `MPI_Win_allocate_shared`, which every process mapping the file loads and
/// stores directly.
pub fn map_shared(f: &std::fs::File, len: usize) -> std::io::Result<*mut c_void> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh mapping chosen by the kernel (null hint) touches no existing memory;
    // the descriptor is `f`'s, open while `f` is borrowed, and the file is at least `len`
    // bytes long (its creator sized it before any process maps it).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p)
}

/// Unmaps a mapping [`map_shared`] made (at `MPI_Win_free`).
pub fn unmap(p: *mut c_void, len: usize) {
    // SAFETY: `p` and `len` are those of a live mapping from `map_shared`; the window that
    // owned it is gone, and MPI forbids the program to use its memory after MPI_Win_free.
    unsafe { libc::munmap(p, len.max(1)) };
}

/// A pointer-valued data symbol of the ABI (`MPI_UNWEIGHTED`, `MPI_WEIGHTS_EMPTY`).
#[repr(transparent)]
pub struct CPtr(pub *const c_int);
// SAFETY: the pointer is the address of an immutable static, read by C only as an address.
unsafe impl Sync for CPtr {}
