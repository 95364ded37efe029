//! Single-copy transfer to and from another process's memory
//! (`process_vm_readv`, `process_vm_writev`), used for large shared-memory
//! messages: the receiver reads the sender's buffer, and a sender that has
//! nothing else to do writes part of it into the receiver's (`engine::coop`).

use std::io;

/// Copies `dst.len()` bytes from address `remote` in process `pid` into `dst`.
///
/// Safe to call with any `remote`: the kernel validates the remote range and
/// returns `EFAULT` for a bad one; only `dst` (a valid `&mut [u8]`) is written here.
pub fn read_from(pid: i32, remote: u64, dst: &mut [u8]) -> io::Result<()> {
    transfer(pid, remote, dst.as_mut_ptr(), dst.len(), false)
}

/// Copies `src` to address `remote` in process `pid`.
///
/// Only the other process's memory is written, and the kernel validates the
/// range there (`EFAULT` for a bad one); what lands there is the caller's
/// agreement with that process.
pub fn write_to(pid: i32, remote: u64, src: &[u8]) -> io::Result<()> {
    transfer(pid, remote, src.as_ptr().cast_mut(), src.len(), true)
}

/// Bytes per bounced system call (the kernel's copy is still in L2 when
/// `memcpy` reads it; 512 KiB was faster than 256 KiB in 4 of 5 alternating
/// pairs of 1 and 4 MiB transfers, and than 32-128 KiB).
const BOUNCE: usize = 512 << 10;

/// Shorter transfers are copied directly: the penalty is per page copied, and
/// a probe or short chunk is not worth a second copy.
const BOUNCE_MIN: usize = 16 << 10;

/// Whether `METAMPI_CMA_BOUNCE=0` turns the bounce off (for measuring it).
fn bounce_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::knobs::flag("METAMPI_CMA_BOUNCE", true))
}

thread_local! {
    /// A page more than [`BOUNCE`], so that a run of it can start at any offset
    /// within a page.
    static BOUNCE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Bounced transfers made on this thread.
    static BOUNCES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `len` bytes between `local` and `remote` in `pid`; `write`: local to remote.
///
/// A transfer whose placement is slow for the kernel's `rep movsb`
/// ([`super::copy`]; 1 MiB in 630-780 µs against 100-140, which MPICH and
/// Open MPI pay too) goes through a buffer of ours placed 64 bytes before the
/// source (reading) or after the destination (writing), which makes both
/// copies fast: 1 MiB in 130-200 µs.
fn transfer(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> io::Result<()> {
    let (dst, src) = if write {
        (remote as usize, local as usize)
    } else {
        (local as usize, remote as usize)
    };
    if len >= BOUNCE_MIN && super::copy::aliased(dst, src) && bounce_allowed() {
        let done = BOUNCE_BUF.with(|b| {
            let mut b = b.try_borrow_mut().ok()?;
            Some(bounced(pid, remote, local, len, write, &mut b))
        });
        if let Some(r) = done {
            return r;
        }
    }
    direct(pid, remote, local, len, write)
}

/// [`transfer`] through `buf`, [`BOUNCE`] bytes at a time.
fn bounced(
    pid: i32,
    remote: u64,
    local: *mut u8,
    len: usize,
    write: bool,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    #[cfg(test)]
    BOUNCES.with(|n| n.set(n.get() + 1));
    if buf.len() < BOUNCE + 4096 {
        *buf = vec![0; BOUNCE + 4096];
    }
    // Where our run starts within a page: 64 bytes past the remote
    // destination, or 64 bytes before the remote source. Chunks are whole
    // pages apart, so every chunk keeps that placement.
    let want = if write {
        (remote as usize).wrapping_add(64)
    } else {
        (remote as usize).wrapping_sub(64)
    } & 4095;
    let pad = want.wrapping_sub(buf.as_ptr() as usize) & 4095;
    let run = &mut buf[pad..pad + BOUNCE];
    let mut done = 0usize;
    while done < len {
        let c = (len - done).min(BOUNCE);
        let there = remote + done as u64;
        if write {
            // SAFETY: the caller lent `len` readable bytes at `local`, and
            // `done + c <= len`; `run` is ours and holds `c` bytes.
            super::copy::copy(&mut run[..c], unsafe {
                std::slice::from_raw_parts(local.add(done), c)
            });
            direct(pid, there, run.as_mut_ptr(), c, true)?;
        } else {
            direct(pid, there, run.as_mut_ptr(), c, false)?;
            // SAFETY: the caller lent `len` writable bytes at `local` (mutably,
            // when reading), `done + c <= len`, and `run` does not overlap them.
            super::copy::copy(
                unsafe { std::slice::from_raw_parts_mut(local.add(done), c) },
                &run[..c],
            );
        }
        done += c;
    }
    Ok(())
}

/// One or more system calls moving `len` bytes, copied by the kernel.
fn direct(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> io::Result<()> {
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
pub fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `METAMPI_NO_CMA` turns single-copy transfer off (`1`, `true`,
/// `yes`, `on`), for ranks, routers and `metampi info` alike.
pub fn turned_off() -> bool {
    crate::knobs::flag("METAMPI_NO_CMA", false)
}

/// Lets any process of this user read and write this process's memory
/// (`PR_SET_PTRACER_ANY`), which Yama's scope 1 otherwise allows only to
/// ancestors: the ranks of a machine and their routers are siblings under
/// the launcher, not each other's ancestors, and copy each other's long
/// messages with `process_vm_readv`. It grants nothing beyond what scope 0
/// (and every kernel without Yama) allows; it fails harmlessly without Yama.
pub fn let_peers_attach() {
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
pub fn available() -> bool {
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

    /// Transfers whose placement is bounced arrive whole, in both directions,
    /// for lengths around the bounce size; other placements are not bounced.
    #[test]
    fn bounced_transfers_arrive_whole() {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if !available() {
            eprintln!("skipped: this process may not use process_vm_readv on itself");
            return;
        }
        let bounces = || BOUNCES.with(|n| n.get());
        let cap = 2 * BOUNCE + 3 * 4096;
        let src: Vec<u8> = (0..cap).map(|i| (i * 7 + i / 4093) as u8).collect();
        for len in [BOUNCE_MIN, 100_000, BOUNCE, BOUNCE + 1, 2 * BOUNCE + 777] {
            for d in [0usize, 1, 16, 31, 32, 4000] {
                // Source at a page offset of 40, destination `d` bytes past it.
                let s_off = (40usize.wrapping_sub(src.as_ptr() as usize)) & 4095;
                let mut dst = vec![0u8; cap + 8192];
                let d_off = ((src.as_ptr() as usize + s_off + d)
                    .wrapping_sub(dst.as_ptr() as usize))
                    & 4095;
                let want = &src[s_off..s_off + len];
                let slow = crate::copy::aliased(d, 0);

                let before = bounces();
                let at = want.as_ptr() as u64;
                read_from(pid, at, &mut dst[d_off..d_off + len]).expect("read");
                assert!(dst[d_off..d_off + len] == *want, "read of {len} at +{d}");
                assert_eq!(
                    bounces() - before,
                    usize::from(slow),
                    "read of {len} at +{d}"
                );

                dst.iter_mut().for_each(|b| *b = 0);
                let before = bounces();
                let to = dst[d_off..].as_ptr() as u64;
                write_to(pid, to, want).expect("write");
                let got = std::hint::black_box(&dst);
                assert!(got[d_off..d_off + len] == *want, "write of {len} at +{d}");
                assert!(got[..d_off].iter().all(|&b| b == 0), "write before +{d}");
                assert_eq!(got[d_off + len], 0, "write past {len} at +{d}");
                assert_eq!(
                    bounces() - before,
                    usize::from(slow),
                    "write of {len} at +{d}"
                );
            }
        }
        // A bad remote range fails through the bounce too.
        let mut dst = vec![0u8; BOUNCE_MIN + 4096];
        let off = (8usize.wrapping_add(16).wrapping_sub(dst.as_ptr() as usize)) & 4095;
        assert!(read_from(pid, 8, &mut dst[off..off + BOUNCE_MIN]).is_err());
    }
}
