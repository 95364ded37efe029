//! Single-copy transfer to and from another process's memory
//! (`process_vm_readv`, `process_vm_writev`), used for large shared-memory
//! messages: the receiver reads the sender's buffer, and a sender that has
//! nothing else to do writes part of it into the receiver's (`engine::coop`).

use std::io;

/// Copies `dst.len()` bytes from address `remote` in process `pid` into `dst`.
///
/// Safe to call with any `remote`: the kernel validates the remote range and
/// returns `EFAULT` for a bad one; only `dst` (a valid `&mut [u8]`) is written here.
pub(crate) fn read_from(pid: i32, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    transfer(pid, remote, dst.as_mut_ptr(), dst.len(), false)
}

/// Copies `src` to address `remote` in process `pid`.
///
/// Only the other process's memory is written, and the kernel validates the
/// range there (`EFAULT` for a bad one); what lands there is the caller's
/// agreement with that process.
pub(crate) fn write_to(pid: i32, remote: u64, src: &[u8]) -> io::Result<()> {
    transfer(pid, remote, src.as_ptr().cast_mut(), src.len(), true)
}

/// `len` bytes between `local` and `remote` in `pid`; `write`: local to remote.
fn transfer(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let here = libc::iovec {
            // SAFETY: `done < len`, so the pointer stays inside the caller's slice.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let there = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `here` covers the rest of a slice the caller lent us (written
        // only when reading, and then the caller lent it mutably); the remote
        // iovec is only touched by the kernel in the other address space.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &here, 1, &there, 1, 0)
            } else {
                libc::process_vm_readv(pid, &here, 1, &there, 1, 0)
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cross-memory transfer moved nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether this process may read and write memory of a sibling process of
/// the same user. Probed once at start-up against our own pid, which
/// exercises the same permission check in the kernel.
pub(crate) fn available() -> bool {
    let src = [0x5au8; 16];
    let mut dst = [0u8; 16];
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    read_from(pid, src.as_ptr() as u64, &mut dst).is_ok()
        && dst == src
        && write_to(pid, dst.as_mut_ptr() as u64, &[0xa5; 16]).is_ok()
        // The kernel wrote `dst` behind the compiler's back.
        && std::hint::black_box(&dst).iter().all(|&b| b == 0xa5)
}
