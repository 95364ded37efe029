//! The crate's only unsafe island: thin safe wrappers over the few POSIX calls std does not
//! offer (process-group signals, `waitpid` by pid, `poll`, `gethostname`, signal handlers).

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Sends `signal` to the process group `pgid`.
///
/// Refuses `pgid` 0 and 1: `kill(0)` and `kill(-1)` would hit the launcher's own group or every
/// process the user owns.
pub(crate) fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is negated so only the process
    // group is addressed, and the check above rules out the broadcast values 0 and -1.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit (at most 2^20, as
/// the kernel may refuse more); returns the soft limit it ends with.
pub(crate) fn raise_fd_limit() -> io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given, which lives on our stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let target = r.rlim_max.min(1 << 20);
    if r.rlim_cur < target {
        let want = libc::rlimit {
            rlim_cur: target,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            r.rlim_cur = target;
        }
    }
    Ok(r.rlim_cur)
}

/// Blocks until child `pid` ends and reaps it.
pub(crate) fn wait_pid(pid: u32) -> io::Result<ExitStatus> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable c_int for the duration of the call.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Blocks until child `pid` ends and returns how, without reaping it (`waitid` with
/// `WNOWAIT`): its owner still reaps it, so the pid cannot be reused while the owner may
/// signal it.
pub(crate) fn wait_exit_unreaped(pid: u32) -> io::Result<ExitStatus> {
    let pid =
        libc::id_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid and writable for the duration of the call.
        let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            // SAFETY: waitid succeeded for a child that exited, so si_status is the field
            // the kernel filled.
            let status = unsafe { info.si_status() };
            return Ok(match info.si_code {
                libc::CLD_EXITED => ExitStatus::from_raw((status & 0xff) << 8),
                _ => ExitStatus::from_raw(status & 0x7f),
            });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// This machine's host name, or `localhost` if it has none.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call; one byte is held
    // back so the result is NUL-terminated even if the kernel truncates it.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if r != 0 {
        return "localhost".to_string();
    }
    match CStr::from_bytes_until_nul(&buf) {
        Ok(name) if !name.is_empty() => name.to_string_lossy().into_owned(),
        _ => "localhost".to_string(),
    }
}

/// Takes the socket a process manager handed this process as descriptor `fd` (`PMI_FD`),
/// once: a second call, a descriptor that is not open or one that is not a socket is an
/// error, so a wrong number in the environment cannot make this process close a file it uses.
/// The descriptor becomes close-on-exec, as programs this rank starts are not part of its PMI
/// conversation.
pub(crate) fn inherited_socket(fd: RawFd) -> io::Result<OwnedFd> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if fd < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a negative descriptor",
        ));
    }
    // SAFETY: `st` is a plain C struct fstat fills; `fd` is only inspected.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, which outlives the call, and has no other effect.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is not a socket"),
        ));
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the process manager's socket is already in use",
        ));
    }
    // SAFETY: F_SETFD only changes the descriptor's close-on-exec flag.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (fstat succeeded) and is a socket the process manager
    // passed for exactly this use; `TAKEN` makes this the one owner in this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe, both ends close-on-exec so ranks do not inherit them.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // Close-on-exec from the start: a rank spawned by another thread between `pipe` and a
    // later `fcntl` would inherit the write end and keep the read end from ever seeing EOF.
    // SAFETY: `fds` is a valid array of two c_ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else yet.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((read, write))
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `read(2)` on a borrowed fd (the launcher's stdin, which std only offers buffered).
pub(crate) fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the pointer and length describe `buf`, which is writable and outlives the call.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            // Invariant: n >= 0 was just checked, so the cast is lossless.
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Whether the peer of connected socket `fd` has closed it: a peek finds end of file (or the
/// connection was reset). Does not block and consumes nothing.
pub(crate) fn peer_closed(fd: RawFd) -> io::Result<bool> {
    let mut byte = 0u8;
    // SAFETY: the pointer and length describe `byte`, writable for the duration of the call;
    // MSG_PEEK leaves the data in the socket and MSG_DONTWAIT keeps the call from blocking.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        return Ok(n == 0);
    }
    let err = io::Error::last_os_error();
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(false),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Ok(true),
        _ => Err(err),
    }
}

/// Waits until one of `fds` has one of its `events` (filled into `revents`), at most
/// `timeout` (`None`: no limit); returns how many have. A signal counts as a timeout.
pub(crate) fn poll_fds(
    fds: &mut [libc::pollfd],
    timeout: Option<std::time::Duration>,
) -> io::Result<usize> {
    // Rounded up, so a deadline a fraction of a millisecond away is not polled with 0 in a loop.
    let ms = timeout.map_or(-1, |t| {
        (t.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
    });
    // SAFETY: `fds` is a valid slice of pollfd structs and its length is passed along.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(err)
        };
    }
    Ok(r as usize)
}

/// Which of two fds became ready in [`poll_either`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    First,
    Second,
}

/// Like [`poll_either`], giving up after `timeout` (`None`).
pub(crate) fn poll_either_for(
    first: RawFd,
    second: RawFd,
    timeout: std::time::Duration,
) -> io::Result<Option<Ready>> {
    let mut fds = [first, second].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid array of two pollfd structs and its length is passed along.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if r < 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(None)
        } else {
            Err(err)
        };
    }
    Ok(if fds[1].revents != 0 {
        Some(Ready::Second)
    } else if fds[0].revents != 0 {
        Some(Ready::First)
    } else {
        None
    })
}

/// Blocks until `first` or `second` is readable (or hung up / invalid, which also makes a read
/// return at once). `second` wins ties so a cancellation fd is never starved.
pub(crate) fn poll_either(first: RawFd, second: RawFd) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            fd: first,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: second,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd structs and its length is passed along.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if fds[1].revents != 0 {
            return Ok(Ready::Second);
        }
        if fds[0].revents != 0 {
            return Ok(Ready::First);
        }
    }
}

/// Makes the rank die with SIGKILL if the thread that spawned it goes away, so a launcher
/// killed hard (or a test process aborted) does not leave ranks running. The spawning thread
/// is the one blocked in `run` until every rank is reaped, so this never fires early.
#[cfg(target_os = "linux")]
pub(crate) fn kill_when_parent_dies(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it calls prctl and getppid, allocates nothing and
    // takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect; then no signal will come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn kill_when_parent_dies(_cmd: &mut Command) {}

/// The CPUs this process may run on (its affinity mask), in increasing order.
///
/// # Errors
/// What `sched_getaffinity` reports.
pub fn affinity() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this process; the size is that of `set`, which the call fills.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `c` of the set, and `c` is below its size.
    Ok((0..n)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Makes the process `cmd` starts run only on `cpus`.
pub(crate) fn bind_to(cmd: &mut Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let n = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus.iter().filter(|&&c| c < n) {
        // SAFETY: CPU_SET writes bit `c` of the set, and `c` is below its size.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes one system call on a set
    // built before the fork, allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Signals the launcher catches while a job runs: the first three end the job (the ranks get
/// them first), `SIGUSR1` asks for the hang report ([`crate::report`]).
pub(crate) const FORWARDED_SIGNALS: [i32; 4] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1];

type SignalCallback = Box<dyn Fn(i32) + Send>;

struct Registry {
    next_id: u64,
    subscribers: Vec<(u64, SignalCallback)>,
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_id: 0,
    subscribers: Vec::new(),
    saved: Vec::new(),
});

/// Write end of the self-pipe the handler reports signals through; -1 until it exists.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
static DISPATCHER: OnceLock<Result<(), String>> = OnceLock::new();

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let saved_errno = unsafe { *libc::__errno_location() };
    // Signal numbers fit in a byte on every Unix; the truncation is the wire format.
    let byte = signal as u8;
    // SAFETY: write is async-signal-safe; the buffer is a local byte. The pipe is
    // non-blocking, so a full pipe drops the report instead of hanging the handler.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
    #[cfg(target_os = "linux")]
    // SAFETY: as above; restoring errno keeps the interrupted code's view intact.
    unsafe {
        *libc::__errno_location() = saved_errno;
    }
}

/// While alive, SIGINT, SIGTERM, SIGHUP and SIGUSR1 to this process are caught and handed to `callback`
/// (on a dispatcher thread, not in the handler). Several subscriptions may exist at once (jobs
/// run from parallel test threads); the previous dispositions come back when the last one drops.
pub(crate) struct SignalSubscription {
    id: u64,
}

impl SignalSubscription {
    pub(crate) fn new(callback: impl Fn(i32) + Send + 'static) -> io::Result<Self> {
        DISPATCHER
            .get_or_init(start_dispatcher)
            .clone()
            .map_err(io::Error::other)?;
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        if registry.subscribers.is_empty() {
            for &signal in &FORWARDED_SIGNALS {
                // SAFETY: a zeroed sigaction is a valid "default" value that sigaction overwrites.
                let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                // Restart interrupted syscalls: rank I/O threads must not see EINTR.
                action.sa_flags = libc::SA_RESTART;
                // SAFETY: sa_mask is a valid sigset_t inside `action`.
                unsafe { libc::sigemptyset(&mut action.sa_mask) };
                // SAFETY: zeroed is valid for the out-parameter that sigaction fills.
                let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: both pointers are valid sigaction structs; the handler only does
                // async-signal-safe work.
                if unsafe { libc::sigaction(signal, &action, &mut old) } != 0 {
                    let err = io::Error::last_os_error();
                    restore(&mut registry.saved);
                    return Err(err);
                }
                registry.saved.push((signal, old));
            }
        }
        let id = registry.next_id;
        registry.next_id += 1;
        registry.subscribers.push((id, Box::new(callback)));
        Ok(SignalSubscription { id })
    }
}

impl Drop for SignalSubscription {
    fn drop(&mut self) {
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        registry.subscribers.retain(|(id, _)| *id != self.id);
        if registry.subscribers.is_empty() {
            restore(&mut registry.saved);
        }
    }
}

fn restore(saved: &mut Vec<(libc::c_int, libc::sigaction)>) {
    for (signal, old) in saved.drain(..) {
        // SAFETY: `old` was filled by sigaction earlier and is a valid disposition.
        unsafe { libc::sigaction(signal, &old, std::ptr::null_mut()) };
    }
}

fn start_dispatcher() -> Result<(), String> {
    let (read, write) = pipe().map_err(|e| format!("cannot create signal pipe: {e}"))?;
    set_nonblocking(write.as_raw_fd()).map_err(|e| format!("cannot set up signal pipe: {e}"))?;
    std::thread::Builder::new()
        .name("metampi-signals".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut byte = [0u8; 1];
            while let Ok(1) = read_fd(read.as_raw_fd(), &mut byte) {
                let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
                for (_, callback) in &registry.subscribers {
                    callback(i32::from(byte[0]));
                }
            }
        })
        .map_err(|e| format!("cannot start signal thread: {e}"))?;
    // The write end lives for the rest of the process: the handler may fire at any time.
    SIGNAL_PIPE.store(
        std::os::fd::IntoRawFd::into_raw_fd(write),
        Ordering::Relaxed,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_broadcast_process_groups() {
        assert!(kill_group(0, 0).is_err());
        assert!(kill_group(1, 0).is_err());
        assert!(kill_group(u32::MAX, 0).is_err());
    }

    #[test]
    fn hostname_is_not_empty() {
        assert!(!hostname().is_empty());
    }

    #[test]
    fn poll_prefers_the_second_fd() {
        let (r1, w1) = pipe().unwrap();
        let (r2, w2) = pipe().unwrap();
        let mut w1 = std::fs::File::from(w1);
        let mut w2 = std::fs::File::from(w2);
        use std::io::Write;
        w1.write_all(b"x").unwrap();
        assert_eq!(
            poll_either(r1.as_raw_fd(), r2.as_raw_fd()).unwrap(),
            Ready::First
        );
        w2.write_all(b"y").unwrap();
        assert_eq!(
            poll_either(r1.as_raw_fd(), r2.as_raw_fd()).unwrap(),
            Ready::Second
        );
        let mut buf = [0u8; 4];
        assert_eq!(read_fd(r2.as_raw_fd(), &mut buf).unwrap(), 1);
        assert_eq!(&buf[..1], b"y");
    }
}
