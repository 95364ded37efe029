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
