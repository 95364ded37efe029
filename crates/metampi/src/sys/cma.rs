//! Single-copy transfer from another process's memory (`process_vm_readv`),
//! used for large shared-memory messages (the rendezvous read).

use std::io;

/// Copies `dst.len()` bytes from address `remote` in process `pid` into `dst`.
///
/// Safe to call with any `remote`: the kernel validates the remote range and
/// returns `EFAULT` for a bad one; only `dst` (a valid `&mut [u8]`) is written here.
pub(crate) fn read_from(pid: i32, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` covers the writable tail of `dst`; the remote iovec
        // is only read by the kernel in the other address space, never here.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv read nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process may read memory of a sibling process of the same user.
/// Probed once at start-up against our own parent-less address (our own pid),
/// which exercises the same permission check path in the kernel.
pub(crate) fn available() -> bool {
    let src = [0x5au8; 16];
    let mut dst = [0u8; 16];
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    read_from(pid, src.as_ptr() as u64, &mut dst).is_ok() && dst == src
}
