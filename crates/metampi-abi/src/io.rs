//! MPI-IO (MPI-4 §14): files opened together by the members of a communicator, read
//! and written through views, at explicit offsets or through individual and shared file
//! pointers, over POSIX files (`std::fs`, positioned reads and writes).
//!
//! How it is built:
//! - A view (§14.3) is the displacement plus the filetype tiled from it; the data a call
//!   moves is a stream of bytes that `View::segments` maps onto byte ranges of the file,
//!   from the filetype's blocks (`datatype::abi::blocks`). Data representations: `native`
//!   (and the same `internal`), `external32` (each value big-endian, sizes as in memory, as
//!   `MPI_Pack_external`), and those the program registers whose values keep their size
//!   (`MPI_Register_datarep`: its conversion functions run on the whole access at once).
//! - Each member opens the file itself; collective calls (open, close, set_view, set_size,
//!   ordered accesses, seek_shared) agree over a duplicate of the communicator, so that a
//!   failure on one member fails the call on every member instead of leaving them waiting.
//!   The collective data accesses (`_all`) are each member's own access: POSIX makes every
//!   write visible to the other processes once it returns, which is what MPI asks of them.
//! - The nonblocking (`MPI_File_i*`) and split collective (`_begin`/`_end`) forms complete
//!   inside the call that starts them; the request comes back finished.
//! - The shared file pointer: a number in memory when the communicator has one process;
//!   otherwise an 8-byte side file that rank 0 creates at open (beside the data file, else in
//!   the temporary directory) and removes at close, read and updated under an exclusive
//!   `flock`, so concurrent `MPI_File_write_shared` calls of several processes each get a
//!   range of their own.
//! - Errors go through the file's error handler (§14.7): `MPI_ERRORS_RETURN` by default,
//!   the handler of `MPI_FILE_NULL` for `MPI_File_open`, `MPI_File_delete` and bad handles.

use std::ffi::{c_char, c_int, c_void, OsString};
use std::fs::{File as OsFile, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metampi::collective::{CommunicatorCollectives, Root, SystemOperation};
use metampi::datatype::abi as dtabi;
use metampi::topology::{Communicator, SimpleCommunicator};

use crate::consts::*;
use crate::env::{Info, INFOS};
use crate::err::{self, Fail, HandlerFn, R};
use crate::raw;
use crate::req::{self, CStatus, St};
use crate::state::{self, Table};
use crate::types::{self, DtEntry, Sub, TYPES};

/// Defines exported MPI-IO functions as `mpi!` does, with the error going to the handler
/// of the file the call names (of `MPI_FILE_NULL` until it has looked the file up).
macro_rules! io_mpi {
    ($(fn $name:ident / $pname:ident ($($a:ident : $t:ty),* $(,)?) $body:block)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pname($($a: $t),*) -> c_int {
            err::on_file(Some(FILE_NULL));
            let rc = err::ret(stringify!($name), || $body);
            err::on_file(None);
            rc
        }
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> c_int {
            $pname($($a),*)
        }
    )*};
}

// ---- open files ------------------------------------------------------------------

/// An open file, as every member of its communicator holds it.
pub struct FileObj {
    os: OsFile,
    path: PathBuf,
    amode: c_int,
    /// A duplicate of the communicator the file was opened on: the file's collectives
    /// never match the program's own messages.
    comm: SimpleCommunicator,
    errh: AtomicHandle,
    shared: SharedPtr,
    st: Mutex<FileState>,
}

/// What changes on an open file.
struct FileState {
    view: Arc<View>,
    /// The individual file pointer, in etypes of the view.
    pos: i64,
    atomic: bool,
    info: Info,
    /// The status of a split collective begun and not yet ended.
    split: Option<St>,
}

static FILES: Table<Arc<FileObj>> = Table::new(FILE_BASE);

/// The error handler of `MPI_FILE_NULL`: the one each newly opened file starts with.
static NULL_ERRH: AtomicHandle = AtomicHandle::new(ERRORS_RETURN);

/// The table key of file handle `fh`.
fn key(fh: FileHandle) -> Option<Handle> {
    u32::try_from(fh).ok().map(|u| u as Handle)
}

/// The open file behind `fh`; it becomes the one whose handler a failure invokes.
fn file(fh: FileHandle) -> R<Arc<FileObj>> {
    state::check_init()?;
    let f = key(fh).and_then(|h| FILES.get(h)).ok_or_else(|| {
        if fh == FILE_NULL {
            Fail::new(ERR_FILE, "MPI_FILE_NULL is not an open file")
        } else {
            Fail::new(
                ERR_FILE,
                format!("{fh:#x} is not an open file (closed, or never opened)"),
            )
        }
    })?;
    err::on_file(Some(fh));
    Ok(f)
}

/// The error handler of file `fh` (`MPI_FILE_NULL`'s for a handle that names no file).
pub fn errhandler_of(fh: FileHandle) -> state::Handler {
    let h = key(fh)
        .filter(|_| fh != FILE_NULL)
        .and_then(|h| FILES.get(h))
        .map_or_else(
            || NULL_ERRH.load(Ordering::Relaxed),
            |f| f.errh.load(Ordering::Relaxed),
        );
    state::handler(h).unwrap_or(state::Handler::Return)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The MPI error class of a failed file system call.
fn io_fail(e: &std::io::Error, what: impl std::fmt::Display) -> Fail {
    let class = match e.kind() {
        ErrorKind::NotFound => ERR_NO_SUCH_FILE,
        ErrorKind::AlreadyExists => ERR_FILE_EXISTS,
        ErrorKind::PermissionDenied => ERR_ACCESS,
        ErrorKind::ReadOnlyFilesystem => ERR_READ_ONLY,
        ErrorKind::StorageFull => ERR_NO_SPACE,
        ErrorKind::QuotaExceeded => ERR_QUOTA,
        ErrorKind::IsADirectory | ErrorKind::NotADirectory => ERR_BAD_FILE,
        _ => ERR_IO,
    };
    Fail::new(class, format!("{what}: {e}"))
}

/// Makes one member's outcome of a collective step everyone's: every member fails when
/// one does (with that member's class), so none goes on to wait for the others.
fn agree<T>(comm: &SimpleCommunicator, mine: R<T>) -> R<T> {
    let class: c_int = mine.as_ref().err().map_or(0, |f| f.class);
    let mut worst: c_int = 0;
    comm.try_all_reduce_into(&class, &mut worst, SystemOperation::max())?;
    match mine {
        Ok(_) if worst != 0 => Err(Fail::new(
            worst,
            "the call failed on another member of the file's communicator",
        )),
        r => r,
    }
}

/// Broadcasts rank 0's value.
fn from_root(comm: &SimpleCommunicator, v: &mut i64) -> R {
    Ok(comm.process_at_rank(0).try_broadcast_into(v)?)
}

// ---- views -----------------------------------------------------------------------

/// A view (MPI-4 §14.3): where the data stream of the file's accesses lies in the file.
struct View {
    disp: u64,
    etype: Sub,
    ftype: Sub,
    /// Bytes of one etype.
    esize: u64,
    /// Blocks `(offset, length)` of one filetype element, adjacent ones merged.
    blocks: Vec<(u64, u64)>,
    /// Data bytes of one filetype element.
    fsize: u64,
    fextent: u64,
    /// The filetype is one block filling its extent: the stream is the file from `disp`.
    contiguous: bool,
    datarep: String,
    rep: Rep,
}

/// How the file holds the values a view moves (MPI-4 §14.5).
#[derive(Clone, Copy)]
enum Rep {
    /// As memory holds them (`native`, `internal`).
    Native,
    /// Each value big-endian, sizes as in memory (as `MPI_Pack_external` here).
    External32,
    /// Converted by the program's functions (`MPI_Register_datarep`).
    User(UserRep),
}

/// A data representation the program registered.
#[derive(Clone, Copy)]
struct UserRep {
    read: Option<raw::Conversion>,
    write: Option<raw::Conversion>,
    extent: raw::DatarepExtentFn,
    extra: usize,
}

/// The registered representations, by name (never removed, as MPI has no call for it).
static DATAREPS: Mutex<Vec<(String, UserRep)>> = Mutex::new(Vec::new());

fn register_datarep(
    name: *const c_char,
    read: Option<raw::Conversion>,
    write: Option<raw::Conversion>,
    extent: Option<raw::DatarepExtentFn>,
    extra: *mut c_void,
) -> R {
    let name = raw::c_str(name)?;
    if name.is_empty() || name.len() >= MAX_DATAREP_STRING {
        return Err(Fail::arg(format!(
            "a data representation's name has 1 to {} bytes",
            MAX_DATAREP_STRING - 1
        )));
    }
    let extent = extent.ok_or_else(|| {
        Fail::arg("the file-extent function of a data representation may not be null")
    })?;
    let mut all = DATAREPS.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(name.as_str(), "native" | "internal" | "external32")
        || all.iter().any(|(n, _)| *n == name)
    {
        return Err(Fail::new(
            ERR_DUP_DATAREP,
            format!("data representation `{name}` exists already"),
        ));
    }
    all.push((
        name,
        UserRep {
            read,
            write,
            extent,
            extra: extra as usize,
        },
    ));
    Ok(())
}

/// A registered representation keeps every value's size (its conversions work in place,
/// byte order for instance): the file extent it gives a predefined etype must be the
/// memory's, since views are laid out with memory's sizes.
fn check_file_extent(u: &UserRep, etype: Handle, name: &str) -> R {
    if TYPES.get(etype).is_some() {
        return Ok(());
    }
    let (rc, ext) = raw::call_datarep_extent(u.extent, etype, u.extra);
    if rc != SUCCESS {
        return Err(Fail::new(
            ERR_CONVERSION,
            format!("the extent function of `{name}` returned error {rc}"),
        ));
    }
    let native = types::layout(etype)?.extent as isize;
    if ext != native {
        return Err(Fail::new(
            ERR_UNSUPPORTED_DATAREP,
            format!(
                "`{name}` gives the etype {ext} bytes in the file, memory {native}: metampi \
                 takes representations that keep each value's size"
            ),
        ));
    }
    Ok(())
}

impl View {
    /// The view every file starts with: bytes from the start of the file.
    fn bytes() -> View {
        View {
            disp: 0,
            etype: Sub::Named(DATATYPE_BYTE),
            ftype: Sub::Named(DATATYPE_BYTE),
            esize: 1,
            blocks: vec![(0, 1)],
            fsize: 1,
            fextent: 1,
            contiguous: true,
            datarep: "native".into(),
            rep: Rep::Native,
        }
    }

    fn new(disp: i64, etype: Handle, ftype: Handle, datarep: &str) -> R<View> {
        let rep = match datarep {
            "native" | "internal" => Rep::Native,
            "external32" => Rep::External32,
            _ => {
                let found = DATAREPS
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .find(|(n, _)| n == datarep)
                    .map(|(_, u)| *u);
                let u = found.ok_or_else(|| {
                    Fail::new(
                        ERR_UNSUPPORTED_DATAREP,
                        format!(
                            "data representation `{datarep}`: metampi offers `native`, \
                             `internal`, `external32` and those MPI_Register_datarep made"
                        ),
                    )
                })?;
                check_file_extent(&u, etype, datarep)?;
                Rep::User(u)
            }
        };
        let disp = u64::try_from(disp)
            .map_err(|_| Fail::arg(format!("displacement {disp} is negative")))?;
        let el = types::layout(etype)?;
        let fid = types::type_id_any(ftype)?;
        let fl = dtabi::layout(fid);
        if el.size == 0 || fl.size == 0 {
            return Err(Fail::new(
                ERR_TYPE,
                "the etype and the filetype must hold data",
            ));
        }
        if fl.size % el.size != 0 {
            return Err(Fail::new(
                ERR_TYPE,
                format!(
                    "the filetype ({} bytes) is not made of etypes ({} bytes each)",
                    fl.size, el.size
                ),
            ));
        }
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        for (off, len) in dtabi::blocks(fid) {
            let off = u64::try_from(off).map_err(|_| {
                Fail::new(
                    ERR_TYPE,
                    "a filetype's displacements must not be negative (MPI-4 §14.3)",
                )
            })?;
            match blocks.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += len as u64,
                _ => blocks.push((off, len as u64)),
            }
        }
        let contiguous = blocks.len() == 1 && blocks[0].0 == 0 && fl.extent == fl.size;
        let sub = |h: Handle| TYPES.get(h).map_or(Sub::Named(h), Sub::Derived);
        Ok(View {
            disp,
            etype: sub(etype),
            ftype: sub(ftype),
            esize: el.size as u64,
            blocks,
            fsize: fl.size as u64,
            fextent: fl.extent.max(1) as u64,
            contiguous,
            datarep: datarep.into(),
            rep,
        })
    }

    /// The file byte ranges `(offset, length)` that hold bytes `from..from + len` of the
    /// data stream, in stream order.
    fn segments(&self, from: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        if self.contiguous {
            return vec![(self.disp + from, len)];
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        let (mut tile, mut skip, mut left) = (from / self.fsize, from % self.fsize, len);
        while left > 0 {
            let base = self.disp + tile * self.fextent;
            for &(off, blen) in &self.blocks {
                if skip >= blen {
                    skip -= blen;
                    continue;
                }
                let take = (blen - skip).min(left);
                let at = base + off + skip;
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == at => last.1 += take,
                    _ => out.push((at, take)),
                }
                skip = 0;
                left -= take;
                if left == 0 {
                    break;
                }
            }
            tile += 1;
        }
        out
    }

    /// The file offset of byte `b` of the data stream.
    fn byte_at(&self, b: u64) -> u64 {
        if self.contiguous {
            return self.disp + b;
        }
        let (tile, mut r) = (b / self.fsize, b % self.fsize);
        for &(off, len) in &self.blocks {
            if r < len {
                return self.disp + tile * self.fextent + off + r;
            }
            r -= len;
        }
        self.disp + (tile + 1) * self.fextent
    }

    /// Bytes of the data stream that lie before file offset `end`.
    fn stream_before(&self, end: u64) -> u64 {
        let Some(rel) = end.checked_sub(self.disp) else {
            return 0;
        };
        if self.contiguous {
            return rel;
        }
        let (tiles, rem) = (rel / self.fextent, rel % self.fextent);
        let part: u64 = self
            .blocks
            .iter()
            .map(|&(off, len)| rem.saturating_sub(off).min(len))
            .sum();
        tiles * self.fsize + part
    }

    /// The view position (in etypes) of the end of a file of `size` bytes.
    fn end_position(&self, size: u64) -> i64 {
        self.stream_before(size).div_ceil(self.esize) as i64
    }
}

/// A new handle for a datatype of a view (`MPI_File_get_view`): the predefined one
/// itself, a derived one as a new handle the caller frees.
fn type_out(t: &Sub) -> Handle {
    match t {
        Sub::Named(h) => *h,
        Sub::Derived(e) => TYPES.insert(Arc::new(DtEntry {
            id: e.id,
            committed: e.committed,
            name: Mutex::new(String::new()),
            env: e.env.clone(),
        })),
    }
}

// ---- the shared file pointer -------------------------------------------------------

/// The shared file pointer of a file, in etypes of its view.
enum SharedPtr {
    /// The communicator has one process.
    Local(Mutex<i64>),
    /// An 8-byte little-endian side file, updated under an exclusive `flock`; the mutex
    /// orders the threads of this process, which share one open file description.
    Side {
        path: PathBuf,
        file: OsFile,
        threads: Mutex<()>,
    },
}

/// Releases a `flock` when dropped.
struct Flock<'a>(&'a OsFile);

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        let _ = raw::flock(self.0, None);
    }
}

fn flock(f: &OsFile, exclusive: bool) -> R<Flock<'_>> {
    raw::flock(f, Some(exclusive)).map_err(|e| io_fail(&e, "locking the file"))?;
    Ok(Flock(f))
}

impl SharedPtr {
    /// Sets the pointer to `f(old)`; returns `old`.
    fn update(&self, f: impl FnOnce(i64) -> R<i64>) -> R<i64> {
        match self {
            SharedPtr::Local(m) => {
                let mut g = lock(m);
                let old = *g;
                *g = f(old)?;
                Ok(old)
            }
            SharedPtr::Side { file, threads, .. } => {
                let _t = lock(threads);
                let _l = flock(file, true)?;
                let old = read_ptr(file)?;
                let new = f(old)?;
                file.write_all_at(&new.to_le_bytes(), 0)
                    .map_err(|e| io_fail(&e, "writing the shared file pointer"))?;
                Ok(old)
            }
        }
    }

    fn get(&self) -> R<i64> {
        match self {
            SharedPtr::Local(m) => Ok(*lock(m)),
            SharedPtr::Side { file, threads, .. } => {
                let _t = lock(threads);
                let _l = flock(file, false)?;
                read_ptr(file)
            }
        }
    }

    fn set(&self, v: i64) -> R {
        self.update(|_| Ok(v)).map(|_| ())
    }
}

fn read_ptr(f: &OsFile) -> R<i64> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 0)
        .map_err(|e| io_fail(&e, "reading the shared file pointer"))?;
    Ok(i64::from_le_bytes(b))
}

/// Side files made by this process, for unique names.
static SIDE_FILES: AtomicU64 = AtomicU64::new(0);

/// Rank 0's side file for the shared pointer of `path`: beside it (so that every machine
/// of a shared file system sees it), else in the temporary directory.
fn make_side(path: &Path, init: i64) -> R<(PathBuf, OsFile)> {
    let name = format!(
        ".{}.metampi-shfp-{}-{}",
        path.file_name()
            .map_or("file".into(), |n| n.to_string_lossy()),
        std::process::id(),
        SIDE_FILES.fetch_add(1, Ordering::Relaxed)
    );
    let dirs = [
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        std::env::temp_dir(),
    ];
    let mut last = None;
    for d in dirs {
        let p = d.join(&name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => {
                f.write_all_at(&init.to_le_bytes(), 0)
                    .map_err(|e| io_fail(&e, "initializing the shared file pointer"))?;
                return Ok((p, f));
            }
            Err(e) => last = Some(io_fail(&e, format!("creating {}", p.display()))),
        }
    }
    Err(last.unwrap_or_else(|| Fail::new(ERR_IO, "no directory for the shared file pointer")))
}

/// The shared file pointer of a file being opened (collective over `comm`).
fn open_shared(comm: &SimpleCommunicator, path: &Path, init: i64) -> R<SharedPtr> {
    if comm.size() == 1 {
        return Ok(SharedPtr::Local(Mutex::new(init)));
    }
    let mine = if comm.rank() == 0 {
        Some(make_side(path, init))
    } else {
        None
    };
    let mut len: i64 = match &mine {
        Some(Ok((p, _))) => p.as_os_str().len() as i64,
        _ => -1,
    };
    from_root(comm, &mut len)?;
    if len < 0 {
        return Err(match mine {
            Some(Err(f)) => f,
            _ => Fail::new(
                ERR_IO,
                "rank 0 could not create the shared file pointer's side file",
            ),
        });
    }
    let mut name = match &mine {
        Some(Ok((p, _))) => p.as_os_str().as_bytes().to_vec(),
        _ => vec![0u8; len as usize],
    };
    comm.process_at_rank(0).try_broadcast_into(&mut name[..])?;
    let path = PathBuf::from(OsString::from_vec(name));
    let file = match mine {
        Some(Ok((_, f))) => Ok(f),
        _ => OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_fail(&e, format!("opening {}", path.display()))),
    };
    let file = agree(comm, file)?;
    Ok(SharedPtr::Side {
        path,
        file,
        threads: Mutex::new(()),
    })
}

// ---- opening and closing ---------------------------------------------------------

/// Checks an access mode (MPI-4 §14.2.1).
fn check_amode(amode: c_int) -> R {
    let rw = [MODE_RDONLY, MODE_RDWR, MODE_WRONLY]
        .iter()
        .filter(|&&m| amode & m != 0)
        .count();
    let known = MODE_RDONLY
        | MODE_RDWR
        | MODE_WRONLY
        | MODE_CREATE
        | MODE_EXCL
        | MODE_DELETE_ON_CLOSE
        | MODE_UNIQUE_OPEN
        | MODE_APPEND
        | MODE_SEQUENTIAL;
    let bad = if rw != 1 {
        "exactly one of MPI_MODE_RDONLY, MPI_MODE_RDWR and MPI_MODE_WRONLY must be given"
    } else if amode & !known != 0 {
        "it has bits that are no MPI_MODE_* value"
    } else if amode & MODE_RDONLY != 0 && amode & (MODE_CREATE | MODE_EXCL) != 0 {
        "MPI_MODE_CREATE and MPI_MODE_EXCL cannot go with MPI_MODE_RDONLY"
    } else if amode & MODE_RDWR != 0 && amode & MODE_SEQUENTIAL != 0 {
        "MPI_MODE_SEQUENTIAL cannot go with MPI_MODE_RDWR"
    } else {
        return Ok(());
    };
    Err(Fail::new(
        ERR_AMODE,
        format!("access mode {amode:#x}: {bad}"),
    ))
}

/// `name` without the file system prefix (`ufs:`, `nfs:`...) ROMIO lets programs give.
fn os_path(name: &str) -> PathBuf {
    const PREFIXES: [&str; 7] = [
        "ufs:", "nfs:", "lustre:", "gpfs:", "xfs:", "pvfs2:", "panfs:",
    ];
    let n = PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    PathBuf::from(n)
}

/// Opens the file for this process; `create` for the one member that may create it.
fn open_os(path: &Path, amode: c_int, create: bool) -> R<OsFile> {
    let mut o = OpenOptions::new();
    o.read(amode & (MODE_RDONLY | MODE_RDWR) != 0)
        .write(amode & (MODE_WRONLY | MODE_RDWR) != 0);
    if create && amode & MODE_CREATE != 0 {
        if amode & MODE_EXCL != 0 {
            o.create_new(true);
        } else {
            o.create(true);
        }
    }
    o.open(path)
        .map_err(|e| io_fail(&e, format!("opening {}", path.display())))
}

fn open(comm_h: Handle, name: *const c_char, amode: c_int, info: Handle) -> R<FileHandle> {
    let c = state::intra(comm_h)?;
    let path = os_path(&raw::c_str(name)?);
    check_amode(amode)?;
    let comm = c.comm.duplicate();
    let (mut lo, mut hi): (c_int, c_int) = (0, 0);
    comm.try_all_reduce_into(&amode, &mut lo, SystemOperation::min())?;
    comm.try_all_reduce_into(&amode, &mut hi, SystemOperation::max())?;
    if lo != hi {
        return Err(Fail::new(
            ERR_NOT_SAME,
            "the members of the communicator gave different access modes",
        ));
    }
    // Rank 0 creates the file (alone, so that MPI_MODE_EXCL fails nowhere else), then
    // the others open what it made.
    let first = if comm.rank() == 0 {
        Some(open_os(&path, amode, true))
    } else {
        None
    };
    let mut class = match &first {
        Some(Err(f)) => f.class as i64,
        _ => 0,
    };
    from_root(&comm, &mut class)?;
    if class != 0 {
        return Err(match first {
            Some(Err(f)) => f,
            _ => Fail::new(
                class as c_int,
                format!(
                    "opening {} failed on rank 0 of the communicator",
                    path.display()
                ),
            ),
        });
    }
    let os = match first {
        Some(r) => r,
        None => open_os(&path, amode, false),
    };
    let os = agree(&comm, os)?;
    let size = os
        .metadata()
        .map_err(|e| io_fail(&e, format!("reading the size of {}", path.display())))?
        .len();
    // MPI_MODE_APPEND starts both pointers at the end (in the initial view's bytes).
    let start = if amode & MODE_APPEND != 0 {
        size as i64
    } else {
        0
    };
    let shared = open_shared(&comm, &path, start)?;
    let f = FileObj {
        os,
        path,
        amode,
        comm,
        errh: AtomicHandle::new(NULL_ERRH.load(Ordering::Relaxed)),
        shared,
        st: Mutex::new(FileState {
            view: Arc::new(View::bytes()),
            pos: start,
            atomic: false,
            info: INFOS.get(info).unwrap_or_default(),
            split: None,
        }),
    };
    Ok(FILES.insert(Arc::new(f)) as u32 as FileHandle)
}

fn close(fh: *mut FileHandle) -> R {
    let h = raw::get(fh)?;
    let f = file(h)?;
    // Every member is done with the file before it goes.
    f.comm.try_barrier()?;
    if let Some(k) = key(h) {
        FILES.remove(k);
    }
    err::on_file(Some(FILE_NULL));
    if f.comm.rank() == 0 {
        if let SharedPtr::Side { path, .. } = &f.shared {
            let _ = std::fs::remove_file(path);
        }
        if f.amode & MODE_DELETE_ON_CLOSE != 0 {
            std::fs::remove_file(&f.path)
                .map_err(|e| io_fail(&e, format!("deleting {}", f.path.display())))?;
        }
    }
    raw::put(fh, FILE_NULL)
}

// ---- data access -------------------------------------------------------------------

/// Where an access starts.
#[derive(Clone, Copy, PartialEq)]
enum At {
    /// An explicit offset, in etypes of the view.
    Offset(i64),
    /// The individual file pointer.
    Own,
    /// The shared file pointer.
    Shared,
}

#[derive(Clone, Copy, PartialEq)]
enum Dir {
    Read,
    Write,
}

/// A memory buffer of the program: `n` elements of engine datatype `id`.
struct Mem {
    ptr: *mut c_void,
    n: usize,
    id: u32,
    /// The datatype's handle (what a registered conversion function is given).
    dt: Handle,
    /// Data bytes in all.
    bytes: u64,
}

fn mem(buf: *const c_void, count: i64, dt: Handle) -> R<Mem> {
    let n = usize::try_from(count)
        .map_err(|_| Fail::new(ERR_COUNT, format!("count {count} is negative")))?;
    let id = types::committed_id(dt)?;
    let bytes = (n as u64)
        .checked_mul(dtabi::layout(id).size as u64)
        .ok_or_else(|| Fail::new(ERR_COUNT, format!("count {count} is too large")))?;
    Ok(Mem {
        ptr: buf as *mut c_void,
        n,
        id,
        dt,
        bytes,
    })
}

/// Writes the first `data.len()` bytes of the packed form of `m` into its elements.
fn scatter(m: &Mem, data: &[u8]) {
    let l = dtabi::layout(m.id);
    if l.size == 0 {
        return;
    }
    let full = (data.len() / l.size).min(m.n);
    let at = types::unpack_from(data, m.ptr, full, m.id);
    let mut rest = &data[at..];
    let base = raw::offset(m.ptr, full as isize * l.extent as isize);
    for (off, len) in dtabi::blocks(m.id) {
        if rest.is_empty() {
            break;
        }
        let k = len.min(rest.len());
        raw::bytes_mut(raw::offset(base, off), k).copy_from_slice(&rest[..k]);
        rest = &rest[k..];
    }
}

/// Reads the file ranges `segs` into `out`; the bytes read before the end of the file.
fn read_segments(os: &OsFile, segs: &[(u64, u64)], out: &mut [u8]) -> R<usize> {
    let mut at = 0usize;
    for &(off, len) in segs {
        let dst = &mut out[at..at + len as usize];
        let mut got = 0usize;
        while got < dst.len() {
            match os.read_at(&mut dst[got..], off + got as u64) {
                Ok(0) => return Ok(at + got),
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_fail(&e, "reading the file")),
            }
        }
        at += dst.len();
    }
    Ok(at)
}

/// Checks that the file's access mode allows `dir` from position kind `at`.
fn check_access(f: &FileObj, dir: Dir, at: At) -> R {
    if dir == Dir::Read && f.amode & MODE_WRONLY != 0 {
        return Err(Fail::new(
            ERR_ACCESS,
            "the file was opened MPI_MODE_WRONLY: it cannot be read",
        ));
    }
    if dir == Dir::Write && f.amode & MODE_RDONLY != 0 {
        return Err(Fail::new(
            ERR_READ_ONLY,
            "the file was opened MPI_MODE_RDONLY: it cannot be written",
        ));
    }
    if at != At::Shared && f.amode & MODE_SEQUENTIAL != 0 {
        return Err(Fail::new(
            ERR_UNSUPPORTED_OPERATION,
            "the file was opened MPI_MODE_SEQUENTIAL: only the shared file pointer moves in it",
        ));
    }
    Ok(())
}

/// Moves `m` between memory and the view's stream from position `pos` (etypes); the
/// bytes moved.
fn transfer(f: &FileObj, view: &View, atomic: bool, pos: i64, m: &Mem, dir: Dir) -> R<u64> {
    let pos =
        u64::try_from(pos).map_err(|_| Fail::arg(format!("file position {pos} is negative")))?;
    if m.bytes == 0 {
        return Ok(0);
    }
    let from = pos
        .checked_mul(view.esize)
        .ok_or_else(|| Fail::arg(format!("file position {pos} is too large")))?;
    let segs = view.segments(from, m.bytes);
    let mut data = vec![0u8; m.bytes as usize];
    // Atomic mode (§14.6.1): a whole access against any other of any process.
    match dir {
        Dir::Read => {
            let _l = if atomic {
                Some(flock(&f.os, false)?)
            } else {
                None
            };
            let got = read_segments(&f.os, &segs, &mut data)?;
            let size = dtabi::layout(m.id).size.max(1);
            let full = got / size;
            match view.rep {
                Rep::Native => scatter(m, &data[..got]),
                Rep::External32 => {
                    types::swap_external32(&mut data[..full * size], full, m.id);
                    scatter(m, &data[..got]);
                }
                Rep::User(u) => match u.read {
                    Some(read) => {
                        let fb = data.as_mut_ptr() as *mut c_void;
                        converted(raw::call_conversion(
                            read, m.ptr, m.dt, full, fb, 0, u.extra,
                        ))?;
                    }
                    None => scatter(m, &data[..got]),
                },
            }
            Ok(got as u64)
        }
        Dir::Write => {
            match view.rep {
                Rep::User(UserRep {
                    write: Some(write),
                    extra,
                    ..
                }) => {
                    let fb = data.as_mut_ptr() as *mut c_void;
                    converted(raw::call_conversion(write, m.ptr, m.dt, m.n, fb, 0, extra))?;
                }
                rep => {
                    types::pack_into(m.ptr, m.n, m.id, &mut data);
                    if let Rep::External32 = rep {
                        types::swap_external32(&mut data, m.n, m.id);
                    }
                }
            }
            let _l = if atomic {
                Some(flock(&f.os, true)?)
            } else {
                None
            };
            let mut at = 0usize;
            for &(off, len) in &segs {
                f.os.write_all_at(&data[at..at + len as usize], off)
                    .map_err(|e| io_fail(&e, format!("writing {}", f.path.display())))?;
                at += len as usize;
            }
            Ok(m.bytes)
        }
    }
}

/// A registered conversion function's return code as an error.
fn converted(rc: c_int) -> R {
    match rc {
        SUCCESS => Ok(()),
        rc => Err(Fail::new(
            ERR_CONVERSION,
            format!("a data conversion function returned error {rc}"),
        )),
    }
}

/// An independent (or per-member collective) access; its status.
fn access(fh: FileHandle, at: At, buf: *const c_void, count: i64, dt: Handle, dir: Dir) -> R<St> {
    let f = file(fh)?;
    let m = mem(buf, count, dt)?;
    check_access(&f, dir, at)?;
    let (view, atomic, own) = {
        let s = lock(&f.st);
        (s.view.clone(), s.atomic, s.pos)
    };
    let etypes = m.bytes.div_ceil(view.esize) as i64;
    let start = match at {
        At::Offset(o) => o,
        At::Own => own,
        At::Shared => f.shared.update(|p| Ok(p + etypes))?,
    };
    let moved = transfer(&f, &view, atomic, start, &m, dir)?;
    if at == At::Own {
        lock(&f.st).pos = start + moved.div_ceil(view.esize) as i64;
    }
    Ok(St {
        bytes: moved as usize,
        ..St::EMPTY
    })
}

/// An ordered access (collective): the members' data in rank order from the shared
/// file pointer, which moves past all of it.
fn ordered(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, dir: Dir) -> R<St> {
    let f = file(fh)?;
    let m = mem(buf, count, dt)?;
    check_access(&f, dir, At::Shared)?;
    let (view, atomic) = {
        let s = lock(&f.st);
        (s.view.clone(), s.atomic)
    };
    let mine = m.bytes.div_ceil(view.esize) as i64;
    let mut all = vec![0i64; f.comm.size() as usize];
    f.comm.try_all_gather_into(&mine, &mut all[..])?;
    let rank = f.comm.rank() as usize;
    let total: i64 = all.iter().sum();
    // Rank 0 moves the pointer; the broadcast carries where it was (or -class on failure).
    let mut base: i64 = 0;
    let mut fail = None;
    if rank == 0 {
        match f.shared.update(|p| Ok(p + total)) {
            Ok(p) => base = p,
            Err(e) => {
                base = -(e.class as i64).max(1);
                fail = Some(e);
            }
        }
    }
    from_root(&f.comm, &mut base)?;
    if base < 0 {
        return Err(fail.unwrap_or_else(|| {
            Fail::new(
                (-base) as c_int,
                "rank 0 could not move the shared file pointer",
            )
        }));
    }
    let start = base + all[..rank].iter().sum::<i64>();
    let moved = transfer(&f, &view, atomic, start, &m, dir)?;
    Ok(St {
        bytes: moved as usize,
        ..St::EMPTY
    })
}

fn ordered_into(
    fh: FileHandle,
    buf: *const c_void,
    count: i64,
    dt: Handle,
    dir: Dir,
    status: *mut CStatus,
) -> R {
    ordered(fh, buf, count, dt, dir)?.write(status, SUCCESS);
    Ok(())
}

fn blocking(
    fh: FileHandle,
    at: At,
    buf: *const c_void,
    count: i64,
    dt: Handle,
    dir: Dir,
    status: *mut CStatus,
) -> R {
    access(fh, at, buf, count, dt, dir)?.write(status, SUCCESS);
    Ok(())
}

/// A nonblocking access: done here; the request comes back complete.
fn nonblocking(
    fh: FileHandle,
    at: At,
    buf: *const c_void,
    count: i64,
    dt: Handle,
    dir: Dir,
    rq: *mut Handle,
) -> R {
    let st = access(fh, at, buf, count, dt, dir)?;
    raw::put(rq, req::done(st))
}

/// The `_begin` of a split collective: done here; `_end` gives its status.
fn begin(f: FileHandle, st: impl FnOnce() -> R<St>) -> R {
    if lock(&file(f)?.st).split.is_some() {
        return Err(Fail::new(
            ERR_OTHER,
            "a split collective is already under way on this file (MPI-4 §14.4.5)",
        ));
    }
    let st = st()?;
    lock(&file(f)?.st).split = Some(st);
    Ok(())
}

fn end(fh: FileHandle, status: *mut CStatus) -> R {
    let st = lock(&file(fh)?.st)
        .split
        .take()
        .ok_or_else(|| Fail::new(ERR_OTHER, "no split collective was begun on this file"))?;
    st.write(status, SUCCESS);
    Ok(())
}

/// The new position of a seek from `cur` (etypes); `end` is the end of the file's position.
fn seek_to(offset: i64, whence: c_int, cur: i64, end: impl FnOnce() -> R<i64>) -> R<i64> {
    let base = match whence {
        SEEK_SET => 0,
        SEEK_CUR => cur,
        SEEK_END => end()?,
        _ => {
            return Err(Fail::arg(format!(
                "whence {whence} is not MPI_SEEK_SET, MPI_SEEK_CUR or MPI_SEEK_END"
            )))
        }
    };
    match base.checked_add(offset) {
        Some(p) if p >= 0 => Ok(p),
        _ => Err(Fail::arg(format!(
            "seeking by {offset} would move the file pointer before the start of the view"
        ))),
    }
}

fn file_size(f: &FileObj) -> R<u64> {
    Ok(f.os
        .metadata()
        .map_err(|e| io_fail(&e, format!("reading the size of {}", f.path.display())))?
        .len())
}

/// Sets the file's size on rank 0 (`grow_only`: only ever larger), for every member.
fn resize(fh: FileHandle, size: i64, grow_only: bool) -> R {
    let f = file(fh)?;
    let mine = (|| {
        let size =
            u64::try_from(size).map_err(|_| Fail::arg(format!("size {size} is negative")))?;
        if f.amode & MODE_RDONLY != 0 {
            return Err(Fail::new(
                ERR_READ_ONLY,
                "the file was opened MPI_MODE_RDONLY: its size cannot change",
            ));
        }
        if f.comm.rank() == 0 && (!grow_only || file_size(&f)? < size) {
            f.os.set_len(size)
                .map_err(|e| io_fail(&e, format!("resizing {}", f.path.display())))?;
        }
        Ok(())
    })();
    agree(&f.comm, mine)
}

fn set_view(
    fh: FileHandle,
    disp: i64,
    etype: Handle,
    ftype: Handle,
    datarep: *const c_char,
    info: Handle,
) -> R {
    let f = file(fh)?;
    let mine = (|| {
        let rep = raw::c_str(datarep)?;
        let disp = if disp == DISPLACEMENT_CURRENT {
            if f.amode & MODE_SEQUENTIAL == 0 {
                return Err(Fail::arg(
                    "MPI_DISPLACEMENT_CURRENT is for files opened MPI_MODE_SEQUENTIAL",
                ));
            }
            let view = lock(&f.st).view.clone();
            view.byte_at(f.shared.get()?.max(0) as u64 * view.esize) as i64
        } else {
            disp
        };
        View::new(disp, etype, ftype, &rep)
    })();
    let view = agree(&f.comm, mine)?;
    {
        let mut s = lock(&f.st);
        s.view = Arc::new(view);
        s.pos = 0;
        if let Some(i) = INFOS.get(info) {
            s.info.0.extend(i.0);
        }
    }
    // Both pointers restart at the view's start; nobody uses the shared one before
    // rank 0 has reset it.
    let reset = if f.comm.rank() == 0 {
        f.shared.set(0)
    } else {
        Ok(())
    };
    agree(&f.comm, reset)
}

fn seek_shared(fh: FileHandle, offset: i64, whence: c_int) -> R {
    let f = file(fh)?;
    let mine = if f.comm.rank() == 0 {
        let view = lock(&f.st).view.clone();
        f.shared
            .update(|cur| {
                seek_to(
                    offset,
                    whence,
                    cur,
                    || Ok(view.end_position(file_size(&f)?)),
                )
            })
            .map(|_| ())
    } else {
        Ok(())
    };
    agree(&f.comm, mine)
}

fn errh_out(fh: FileHandle) -> R<Handle> {
    if fh == FILE_NULL {
        state::check_init()?;
        return Ok(NULL_ERRH.load(Ordering::Relaxed));
    }
    Ok(file(fh)?.errh.load(Ordering::Relaxed))
}

io_mpi! {
    fn MPI_File_open / PMPI_File_open(comm: Handle, name: *const c_char, amode: c_int, info: Handle, fh: *mut FileHandle) {
        raw::put(fh, open(comm, name, amode, info)?)
    }
    fn MPI_File_close / PMPI_File_close(fh: *mut FileHandle) {
        close(fh)
    }
    fn MPI_File_delete / PMPI_File_delete(name: *const c_char, _info: Handle) {
        state::check_init()?;
        let path = os_path(&raw::c_str(name)?);
        std::fs::remove_file(&path).map_err(|e| io_fail(&e, format!("deleting {}", path.display())))
    }
    fn MPI_File_get_size / PMPI_File_get_size(fh: FileHandle, size: *mut i64) {
        raw::put(size, file_size(&*file(fh)?)? as i64)
    }
    fn MPI_File_set_size / PMPI_File_set_size(fh: FileHandle, size: i64) {
        resize(fh, size, false)
    }
    fn MPI_File_preallocate / PMPI_File_preallocate(fh: FileHandle, size: i64) {
        resize(fh, size, true)
    }
    fn MPI_File_sync / PMPI_File_sync(fh: FileHandle) {
        let f = file(fh)?;
        f.os.sync_all().map_err(|e| io_fail(&e, format!("syncing {}", f.path.display())))
    }
    fn MPI_File_get_amode / PMPI_File_get_amode(fh: FileHandle, amode: *mut c_int) {
        raw::put(amode, file(fh)?.amode)
    }
    fn MPI_File_get_group / PMPI_File_get_group(fh: FileHandle, grp: *mut Handle) {
        let f = file(fh)?;
        let g = f.comm.group();
        raw::put(grp, state::new_group(metampi::topology::Group::world_ranks(&g).to_vec()))
    }
    fn MPI_File_get_info / PMPI_File_get_info(fh: FileHandle, info: *mut Handle) {
        let i = lock(&file(fh)?.st).info.clone();
        raw::put(info, INFOS.insert(i))
    }
    fn MPI_File_set_info / PMPI_File_set_info(fh: FileHandle, info: Handle) {
        let f = file(fh)?;
        if let Some(i) = INFOS.get(info) {
            lock(&f.st).info.0.extend(i.0);
        }
        Ok(())
    }
    fn MPI_File_get_atomicity / PMPI_File_get_atomicity(fh: FileHandle, flag: *mut c_int) {
        raw::put(flag, lock(&file(fh)?.st).atomic as c_int)
    }
    fn MPI_File_set_atomicity / PMPI_File_set_atomicity(fh: FileHandle, flag: c_int) {
        let f = file(fh)?;
        let (mut lo, mut hi): (c_int, c_int) = (0, 0);
        let on = (flag != 0) as c_int;
        f.comm.try_all_reduce_into(&on, &mut lo, SystemOperation::min())?;
        f.comm.try_all_reduce_into(&on, &mut hi, SystemOperation::max())?;
        if lo != hi {
            return Err(Fail::new(ERR_NOT_SAME, "the members gave different atomicity flags"));
        }
        lock(&f.st).atomic = on != 0;
        Ok(())
    }
    fn MPI_File_set_view / PMPI_File_set_view(fh: FileHandle, disp: i64, etype: Handle, ftype: Handle, datarep: *const c_char, info: Handle) {
        set_view(fh, disp, etype, ftype, datarep, info)
    }
    fn MPI_Register_datarep / PMPI_Register_datarep(name: *const c_char, read: Option<raw::DatarepFn>, write: Option<raw::DatarepFn>, extent: Option<raw::DatarepExtentFn>, extra: *mut c_void) {
        register_datarep(name, read.map(raw::Conversion::Int), write.map(raw::Conversion::Int), extent, extra)
    }
    fn MPI_Register_datarep_c / PMPI_Register_datarep_c(name: *const c_char, read: Option<raw::DatarepFnC>, write: Option<raw::DatarepFnC>, extent: Option<raw::DatarepExtentFn>, extra: *mut c_void) {
        register_datarep(name, read.map(raw::Conversion::Count), write.map(raw::Conversion::Count), extent, extra)
    }
    fn MPI_File_get_view / PMPI_File_get_view(fh: FileHandle, disp: *mut i64, etype: *mut Handle, ftype: *mut Handle, datarep: *mut c_char) {
        let v = lock(&file(fh)?.st).view.clone();
        raw::put(disp, v.disp as i64)?;
        raw::put_str(datarep, MAX_DATAREP_STRING, &v.datarep)?;
        raw::put(etype, type_out(&v.etype))?;
        raw::put(ftype, type_out(&v.ftype))
    }
    fn MPI_File_get_byte_offset / PMPI_File_get_byte_offset(fh: FileHandle, offset: i64, disp: *mut i64) {
        let v = lock(&file(fh)?.st).view.clone();
        let o = u64::try_from(offset).map_err(|_| Fail::arg(format!("offset {offset} is negative")))?;
        raw::put(disp, v.byte_at(o * v.esize) as i64)
    }
    fn MPI_File_get_type_extent / PMPI_File_get_type_extent(fh: FileHandle, dt: Handle, extent: *mut isize) {
        file(fh)?;
        raw::put(extent, types::layout(dt)?.extent as isize)
    }
    fn MPI_File_get_type_extent_c / PMPI_File_get_type_extent_c(fh: FileHandle, dt: Handle, extent: *mut i64) {
        file(fh)?;
        raw::put(extent, types::layout(dt)?.extent as i64)
    }
    fn MPI_File_seek / PMPI_File_seek(fh: FileHandle, offset: i64, whence: c_int) {
        let f = file(fh)?;
        if f.amode & MODE_SEQUENTIAL != 0 {
            return Err(Fail::new(ERR_UNSUPPORTED_OPERATION, "the file was opened MPI_MODE_SEQUENTIAL: it has no individual file pointer"));
        }
        let (view, cur) = {
            let s = lock(&f.st);
            (s.view.clone(), s.pos)
        };
        let p = seek_to(offset, whence, cur, || Ok(view.end_position(file_size(&f)?)))?;
        lock(&f.st).pos = p;
        Ok(())
    }
    fn MPI_File_get_position / PMPI_File_get_position(fh: FileHandle, offset: *mut i64) {
        raw::put(offset, lock(&file(fh)?.st).pos)
    }
    fn MPI_File_seek_shared / PMPI_File_seek_shared(fh: FileHandle, offset: i64, whence: c_int) {
        seek_shared(fh, offset, whence)
    }
    fn MPI_File_get_position_shared / PMPI_File_get_position_shared(fh: FileHandle, offset: *mut i64) {
        raw::put(offset, file(fh)?.shared.get()?)
    }

    // ---- error handlers ------------------------------------------------------------
    fn MPI_File_create_errhandler / PMPI_File_create_errhandler(f: Option<HandlerFn>, h: *mut Handle) {
        let f = f.ok_or_else(|| Fail::arg("the error handler function is null"))?;
        raw::put(h, state::ERRHANDLERS.insert(f))
    }
    fn MPI_File_set_errhandler / PMPI_File_set_errhandler(fh: FileHandle, h: Handle) {
        if state::handler(h).is_none() {
            return Err(Fail::arg(format!("{h:#x} is not an error handler")));
        }
        if fh == FILE_NULL {
            state::check_init()?;
            NULL_ERRH.store(h, Ordering::Relaxed);
        } else {
            file(fh)?.errh.store(h, Ordering::Relaxed);
        }
        Ok(())
    }
    fn MPI_File_get_errhandler / PMPI_File_get_errhandler(fh: FileHandle, h: *mut Handle) {
        raw::put(h, errh_out(fh)?)
    }
    fn MPI_File_call_errhandler / PMPI_File_call_errhandler(fh: FileHandle, code: c_int) {
        errh_out(fh)?;
        match errhandler_of(fh) {
            state::Handler::Return => Ok(()),
            state::Handler::User(f) => {
                raw::call_file_errhandler(f, fh, code);
                Ok(())
            }
            state::Handler::Fatal => {
                eprintln!("metampi: MPI_File_call_errhandler: {} (MPI_ERRORS_ARE_FATAL: the job ends)", err::string_of(code));
                state::abort_job(code.max(1))
            }
        }
    }
}

/// `MPI_File_c2f`: a Fortran handle is the handle's low 32 bits (ours fit in them).
#[cfg(not(std_abi))]
#[no_mangle]
pub extern "C" fn PMPI_File_c2f(fh: FileHandle) -> c_int {
    fh as u32 as c_int
}
#[cfg(not(std_abi))]
#[no_mangle]
pub extern "C" fn MPI_File_c2f(fh: FileHandle) -> c_int {
    PMPI_File_c2f(fh)
}
/// `MPI_File_f2c`.
#[cfg(not(std_abi))]
#[no_mangle]
pub extern "C" fn PMPI_File_f2c(f: c_int) -> FileHandle {
    f as u32 as FileHandle
}
#[cfg(not(std_abi))]
#[no_mangle]
pub extern "C" fn MPI_File_f2c(f: c_int) -> FileHandle {
    PMPI_File_f2c(f)
}

// The data access calls (MPI-4 §14.4), `int` counts then `MPI_Count` ones (`_c`).
io_mpi! {
    fn MPI_File_read / PMPI_File_read(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write / PMPI_File_write(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_read_all / PMPI_File_read_all(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write_all / PMPI_File_write_all(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_read_at / PMPI_File_read_at(fh: FileHandle, offset: i64, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write_at / PMPI_File_write_at(fh: FileHandle, offset: i64, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_read_at_all / PMPI_File_read_at_all(fh: FileHandle, offset: i64, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write_at_all / PMPI_File_write_at_all(fh: FileHandle, offset: i64, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_read_shared / PMPI_File_read_shared(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Shared, buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write_shared / PMPI_File_write_shared(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Shared, buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_read_ordered / PMPI_File_read_ordered(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        ordered_into(fh, buf, count.into(), dt, Dir::Read, status)
    }
    fn MPI_File_write_ordered / PMPI_File_write_ordered(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, status: *mut CStatus) {
        ordered_into(fh, buf, count.into(), dt, Dir::Write, status)
    }
    fn MPI_File_iread / PMPI_File_iread(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count.into(), dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite / PMPI_File_iwrite(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count.into(), dt, Dir::Write, rq)
    }
    fn MPI_File_iread_all / PMPI_File_iread_all(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count.into(), dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_all / PMPI_File_iwrite_all(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count.into(), dt, Dir::Write, rq)
    }
    fn MPI_File_iread_at / PMPI_File_iread_at(fh: FileHandle, offset: i64, buf: *mut c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_at / PMPI_File_iwrite_at(fh: FileHandle, offset: i64, buf: *const c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Write, rq)
    }
    fn MPI_File_iread_at_all / PMPI_File_iread_at_all(fh: FileHandle, offset: i64, buf: *mut c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_at_all / PMPI_File_iwrite_at_all(fh: FileHandle, offset: i64, buf: *const c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count.into(), dt, Dir::Write, rq)
    }
    fn MPI_File_iread_shared / PMPI_File_iread_shared(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Shared, buf, count.into(), dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_shared / PMPI_File_iwrite_shared(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Shared, buf, count.into(), dt, Dir::Write, rq)
    }
    fn MPI_File_read_all_begin / PMPI_File_read_all_begin(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle) {
        begin(fh, || access(fh, At::Own, buf, count.into(), dt, Dir::Read))
    }
    fn MPI_File_write_all_begin / PMPI_File_write_all_begin(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle) {
        begin(fh, || access(fh, At::Own, buf, count.into(), dt, Dir::Write))
    }
    fn MPI_File_read_at_all_begin / PMPI_File_read_at_all_begin(fh: FileHandle, offset: i64, buf: *mut c_void, count: c_int, dt: Handle) {
        begin(fh, || access(fh, At::Offset(offset), buf, count.into(), dt, Dir::Read))
    }
    fn MPI_File_write_at_all_begin / PMPI_File_write_at_all_begin(fh: FileHandle, offset: i64, buf: *const c_void, count: c_int, dt: Handle) {
        begin(fh, || access(fh, At::Offset(offset), buf, count.into(), dt, Dir::Write))
    }
    fn MPI_File_read_ordered_begin / PMPI_File_read_ordered_begin(fh: FileHandle, buf: *mut c_void, count: c_int, dt: Handle) {
        begin(fh, || ordered(fh, buf, count.into(), dt, Dir::Read))
    }
    fn MPI_File_write_ordered_begin / PMPI_File_write_ordered_begin(fh: FileHandle, buf: *const c_void, count: c_int, dt: Handle) {
        begin(fh, || ordered(fh, buf, count.into(), dt, Dir::Write))
    }
}

io_mpi! {
    fn MPI_File_read_c / PMPI_File_read_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_c / PMPI_File_write_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_read_all_c / PMPI_File_read_all_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_all_c / PMPI_File_write_all_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Own, buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_read_at_c / PMPI_File_read_at_c(fh: FileHandle, offset: i64, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_at_c / PMPI_File_write_at_c(fh: FileHandle, offset: i64, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_read_at_all_c / PMPI_File_read_at_all_c(fh: FileHandle, offset: i64, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_at_all_c / PMPI_File_write_at_all_c(fh: FileHandle, offset: i64, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Offset(offset), buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_read_shared_c / PMPI_File_read_shared_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Shared, buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_shared_c / PMPI_File_write_shared_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        blocking(fh, At::Shared, buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_read_ordered_c / PMPI_File_read_ordered_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, status: *mut CStatus) {
        ordered_into(fh, buf, count, dt, Dir::Read, status)
    }
    fn MPI_File_write_ordered_c / PMPI_File_write_ordered_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, status: *mut CStatus) {
        ordered_into(fh, buf, count, dt, Dir::Write, status)
    }
    fn MPI_File_iread_c / PMPI_File_iread_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count, dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_c / PMPI_File_iwrite_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count, dt, Dir::Write, rq)
    }
    fn MPI_File_iread_all_c / PMPI_File_iread_all_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count, dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_all_c / PMPI_File_iwrite_all_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Own, buf, count, dt, Dir::Write, rq)
    }
    fn MPI_File_iread_at_c / PMPI_File_iread_at_c(fh: FileHandle, offset: i64, buf: *mut c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count, dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_at_c / PMPI_File_iwrite_at_c(fh: FileHandle, offset: i64, buf: *const c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count, dt, Dir::Write, rq)
    }
    fn MPI_File_iread_at_all_c / PMPI_File_iread_at_all_c(fh: FileHandle, offset: i64, buf: *mut c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count, dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_at_all_c / PMPI_File_iwrite_at_all_c(fh: FileHandle, offset: i64, buf: *const c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Offset(offset), buf, count, dt, Dir::Write, rq)
    }
    fn MPI_File_iread_shared_c / PMPI_File_iread_shared_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Shared, buf, count, dt, Dir::Read, rq)
    }
    fn MPI_File_iwrite_shared_c / PMPI_File_iwrite_shared_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle, rq: *mut Handle) {
        nonblocking(fh, At::Shared, buf, count, dt, Dir::Write, rq)
    }
    fn MPI_File_read_all_begin_c / PMPI_File_read_all_begin_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle) {
        begin(fh, || access(fh, At::Own, buf, count, dt, Dir::Read))
    }
    fn MPI_File_write_all_begin_c / PMPI_File_write_all_begin_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle) {
        begin(fh, || access(fh, At::Own, buf, count, dt, Dir::Write))
    }
    fn MPI_File_read_at_all_begin_c / PMPI_File_read_at_all_begin_c(fh: FileHandle, offset: i64, buf: *mut c_void, count: i64, dt: Handle) {
        begin(fh, || access(fh, At::Offset(offset), buf, count, dt, Dir::Read))
    }
    fn MPI_File_write_at_all_begin_c / PMPI_File_write_at_all_begin_c(fh: FileHandle, offset: i64, buf: *const c_void, count: i64, dt: Handle) {
        begin(fh, || access(fh, At::Offset(offset), buf, count, dt, Dir::Write))
    }
    fn MPI_File_read_ordered_begin_c / PMPI_File_read_ordered_begin_c(fh: FileHandle, buf: *mut c_void, count: i64, dt: Handle) {
        begin(fh, || ordered(fh, buf, count, dt, Dir::Read))
    }
    fn MPI_File_write_ordered_begin_c / PMPI_File_write_ordered_begin_c(fh: FileHandle, buf: *const c_void, count: i64, dt: Handle) {
        begin(fh, || ordered(fh, buf, count, dt, Dir::Write))
    }
}

// The ends of split collectives: the accesses were done by their `_begin`.
io_mpi! {
    fn MPI_File_read_all_end / PMPI_File_read_all_end(fh: FileHandle, _buf: *mut c_void, status: *mut CStatus) {
        end(fh, status)
    }
    fn MPI_File_write_all_end / PMPI_File_write_all_end(fh: FileHandle, _buf: *const c_void, status: *mut CStatus) {
        end(fh, status)
    }
    fn MPI_File_read_at_all_end / PMPI_File_read_at_all_end(fh: FileHandle, _buf: *mut c_void, status: *mut CStatus) {
        end(fh, status)
    }
    fn MPI_File_write_at_all_end / PMPI_File_write_at_all_end(fh: FileHandle, _buf: *const c_void, status: *mut CStatus) {
        end(fh, status)
    }
    fn MPI_File_read_ordered_end / PMPI_File_read_ordered_end(fh: FileHandle, _buf: *mut c_void, status: *mut CStatus) {
        end(fh, status)
    }
    fn MPI_File_write_ordered_end / PMPI_File_write_ordered_end(fh: FileHandle, _buf: *const c_void, status: *mut CStatus) {
        end(fh, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view of 4-byte etypes where the filetype keeps the second of every three
    /// etypes (a block at 4 of 4 bytes, extent 12), from displacement 8.
    fn strided() -> View {
        View {
            disp: 8,
            blocks: vec![(4, 4)],
            fsize: 4,
            fextent: 12,
            contiguous: false,
            esize: 4,
            ..View::bytes()
        }
    }

    #[test]
    fn a_contiguous_view_is_the_file_from_its_displacement() {
        let v = View {
            disp: 100,
            ..View::bytes()
        };
        assert_eq!(v.segments(5, 10), vec![(105, 10)]);
        assert_eq!(v.byte_at(7), 107);
        assert_eq!(v.stream_before(50), 0);
        assert_eq!(v.end_position(130), 30);
    }

    #[test]
    fn a_strided_view_maps_the_stream_onto_every_tile() {
        let v = strided();
        // Stream bytes 2..10: the last 2 of tile 0, all of tile 1, the first 2 of tile 2.
        assert_eq!(v.segments(2, 8), vec![(14, 2), (24, 4), (36, 2)]);
        assert_eq!(v.segments(0, 0), vec![]);
        assert_eq!(v.byte_at(4), 24);
        // A file of 30 bytes holds tiles 0 (bytes 12..16) and 1 (24..28) of the view.
        assert_eq!(v.stream_before(30), 8);
        assert_eq!(v.stream_before(26), 6);
        assert_eq!(v.end_position(26), 2);
        assert_eq!(v.stream_before(4), 0);
    }

    #[test]
    fn adjacent_ranges_of_a_stream_merge() {
        // Two blocks that touch across the tile boundary: (8, 4) then the next tile's (0, 4).
        let v = View {
            blocks: vec![(0, 4), (8, 4)],
            fsize: 8,
            fextent: 12,
            contiguous: false,
            ..View::bytes()
        };
        assert_eq!(v.segments(4, 8), vec![(8, 8)]);
    }

    #[test]
    fn access_modes_need_exactly_one_direction() {
        assert!(check_amode(MODE_RDWR | MODE_CREATE).is_ok());
        assert_eq!(
            check_amode(MODE_RDWR | MODE_WRONLY).unwrap_err().class,
            ERR_AMODE
        );
        assert_eq!(check_amode(MODE_CREATE).unwrap_err().class, ERR_AMODE);
        assert_eq!(
            check_amode(MODE_RDONLY | MODE_EXCL).unwrap_err().class,
            ERR_AMODE
        );
        assert_eq!(
            check_amode(MODE_RDWR | MODE_SEQUENTIAL).unwrap_err().class,
            ERR_AMODE
        );
        assert!(check_amode(MODE_WRONLY | MODE_SEQUENTIAL | MODE_APPEND).is_ok());
    }

    #[test]
    fn romio_prefixes_are_not_part_of_the_path() {
        assert_eq!(os_path("ufs:/tmp/x"), PathBuf::from("/tmp/x"));
        assert_eq!(os_path("/tmp/ufs:x"), PathBuf::from("/tmp/ufs:x"));
    }
}
