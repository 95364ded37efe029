//! Blocking wait on a set of file descriptors (`poll(2)`).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Waits until one of `fds` is ready (readable, or writable where `.1` is
/// set) or the timeout passes. `EINTR` counts as a timeout.
pub(crate) fn wait(fds: &[(RawFd, bool)], timeout: Duration) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, w)| libc::pollfd {
            fd,
            events: libc::POLLIN | if w { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()` pollfds.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Waits on prepared `pollfd`s with microsecond resolution (`ppoll(2)`),
/// leaving `revents` filled in. `EINTR` counts as a timeout (no events).
pub(crate) fn wait_fds(pfds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfds` is an exclusively borrowed array of `pfds.len()` pollfds
    // and `ts` a live timespec; a null signal mask leaves the mask unchanged.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        for p in pfds.iter_mut() {
            p.revents = 0;
        }
        return Ok(0);
    }
    Ok(n as usize)
}

/// Sets a socket's send and receive buffer sizes (`SO_SNDBUF`/`SO_RCVBUF`).
pub(crate) fn set_socket_buffers(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v: libc::c_int = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: `v` is a live c_int and its size is passed; the kernel only reads it.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Asks the kernel to kill this process when its parent exits, so routers
/// started by a launcher never outlive it.
pub(crate) fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

/// Makes the allocator keep freed large buffers instead of returning them to
/// the kernel: a router allocates and frees megabyte frames continuously, and
/// fresh pages cost a fault and a clear each (a quarter of a router's time,
/// measured with perf).
pub(crate) fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator tunables; called before the
    // router starts its threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}
