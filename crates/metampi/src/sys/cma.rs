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

/// The Yama security module's `kernel.yama.ptrace_scope`, where it is
/// loaded: 0 classic (any process of the same user), 1 only ancestors and
/// processes the target names (Debian's and Ubuntu's default), 2 only with
/// `CAP_SYS_PTRACE`, 3 never.
pub(crate) fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `METAMPI_NO_CMA` turns single-copy transfer off (`1`, `true`,
/// `yes`, `on`), for ranks, routers and `metampi info` alike.
pub(crate) fn turned_off() -> bool {
    matches!(
        std::env::var("METAMPI_NO_CMA").as_deref(),
        Ok("1") | Ok("true") | Ok("yes") | Ok("on")
    )
}

/// Lets any process of this user read and write this process's memory
/// (`PR_SET_PTRACER_ANY`), which Yama's scope 1 otherwise allows only to
/// ancestors: the ranks of a machine and their routers are siblings under
/// the launcher, not each other's ancestors, and copy each other's long
/// messages with `process_vm_readv`. It grants nothing beyond what scope 0
/// (and every kernel without Yama) allows; it fails harmlessly without Yama.
pub(crate) fn let_peers_attach() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with integer arguments only; it changes a Yama setting of
    // this process and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
    }
}

/// Whether this process may read and write memory of a sibling process of
/// the same user. Probed once at start-up against our own pid, which
/// exercises the kernel's permission check, except Yama's, which never
/// refuses a process itself: at scope 3 nobody may attach, at scope 2 only
/// a process with `CAP_SYS_PTRACE` (taken here to be root).
pub(crate) fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !yama_permits(yama_scope(), root) {
        return false;
    }
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

/// Whether Yama at `scope` (`None`: not loaded) lets a rank attach to a
/// sibling that declared any tracer allowed ([`let_peers_attach`]).
fn yama_permits(scope: Option<u32>, root: bool) -> bool {
    match scope {
        None | Some(0) | Some(1) => true,
        Some(2) => root,
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yama_scopes_that_permit_sibling_copies() {
        assert!(yama_permits(None, false));
        assert!(yama_permits(Some(0), false));
        assert!(yama_permits(Some(1), false));
        assert!(!yama_permits(Some(2), false));
        assert!(yama_permits(Some(2), true));
        assert!(!yama_permits(Some(3), true));
        assert!(!yama_permits(Some(7), true));
    }

    #[test]
    fn reads_and_writes_this_process() {
        let src = *b"cross-memory ok!";
        let mut dst = [0u8; 16];
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        // Containers may forbid the system call (seccomp); then it is off.
        if available() {
            read_from(pid, src.as_ptr() as u64, &mut dst).expect("a process may read itself");
            assert_eq!(dst, src);
        }
        // A bad remote address is refused, not a crash.
        assert!(read_from(pid, 8, &mut dst).is_err());
    }
}
