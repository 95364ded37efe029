//! A file-backed shared memory segment in `/dev/shm`, mapped read-write and shared.
//!
//! Pages of a tmpfs file are only allocated when first touched, so a segment
//! sized for every local sender costs physical memory only for the rings that
//! are really used (ScaMPI's "buffer pool per sender allocated on first use").

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where shared segments go: `/dev/shm` (tmpfs), else the temporary directory.
pub fn dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// Bytes free for an unprivileged user on the file system of [`dir`].
pub fn free_bytes() -> Option<u64> {
    let path = std::ffi::CString::new(dir().into_os_string().into_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we pass from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A mapping of a whole shared file. Unmapped on drop.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    path: PathBuf,
}

// SAFETY: the mapping is plain shared memory; all access to it goes through
// atomics or through the ring protocol, which gives each byte one writer at a time.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` only hands out raw pointers.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a new segment file of `len` bytes (fails if it exists) and maps it.
    pub fn create(path: &Path, len: usize) -> io::Result<Segment> {
        let file = Self::new_file(path)?;
        file.set_len(len as u64)?;
        Self::map(file, path, len)
    }

    /// A new file only this user may open (fails if the name exists).
    fn new_file(path: &Path) -> io::Result<std::fs::File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    }

    /// As [`Segment::create`], with every page reserved now: a full tmpfs
    /// (a container's small `/dev/shm`) then fails here, not with `SIGBUS`
    /// at the first touch of a page it cannot supply.
    pub fn create_reserved(path: &Path, len: usize) -> io::Result<Segment> {
        let file = Self::new_file(path)?;
        // SAFETY: posix_fallocate only extends the file behind a descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if rc != 0 {
            let _ = std::fs::remove_file(path);
            return Err(io::Error::from_raw_os_error(rc));
        }
        Self::map(file, path, len)
    }

    /// Maps an existing segment created by another process of the job.
    pub fn open(path: &Path, len: usize) -> io::Result<Segment> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        if file.metadata()?.len() < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared segment {} is shorter than expected", path.display()),
            ));
        }
        Self::map(file, path, len)
    }

    fn map(file: std::fs::File, path: &Path, len: usize) -> io::Result<Segment> {
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks
        // the address, and we check for MAP_FAILED before using it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment {
            ptr: ptr.cast(),
            len,
            path: path.to_path_buf(),
        })
    }

    /// Removes the file name; the mappings stay valid until every process drops them.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// The file it was made from or opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (a segment of length zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nobody uses the
        // mapping after the segment is dropped (rings borrow the segment's lifetime
        // through the engine, which drops them first).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_known() {
        assert!(free_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn a_reservation_that_cannot_be_had_fails_and_leaves_nothing() {
        let path = dir().join(format!("metampi-test-reserve-{}", std::process::id()));
        // A petabyte: more than any tmpfs (or temporary directory) holds.
        assert!(Segment::create_reserved(&path, 1 << 50).is_err());
        assert!(!path.exists());
        let seg = Segment::create_reserved(&path, 1 << 16).unwrap();
        // SAFETY: the mapping is 64 KiB long.
        unsafe { *seg.base().add((1 << 16) - 1) = 7 };
        seg.unlink();
        assert!(!path.exists());
    }
}
