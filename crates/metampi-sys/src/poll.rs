//! Blocking wait on a set of file descriptors (`poll(2)`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Waits until one of `fds` is ready (readable, or writable where `.1` is
/// set) or the timeout passes. `EINTR` counts as a timeout.
pub fn wait(fds: &[(RawFd, bool)], timeout: Duration) -> io::Result<()> {
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
pub fn wait_fds(pfds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
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

/// Polls without sleeping for a while before blocking: a process blocked in
/// `ppoll` is woken by the kernel, which costs microseconds on a bare machine
/// and tens of them in some virtual machines, once per hop of every message (a
/// router's share of routed latency). Spins only soon after an event (traffic
/// is flowing). Where the machine has at least two idle cores (runnable
/// threads from `/proc/loadavg`) it spins hard. Where it has not, but no more
/// than two other threads per core are runnable, it yields the core between
/// looks (`sched_yield`): a rank that needs the core gets it at once, and the
/// router still sees its next frame without a wake-up (2 ranks and 2 routers
/// on 2 cores: routed 8-byte ping-pong 54-82 µs blocking, 20-34 µs yielding).
/// Busier than that, it blocks at once: a yielding spinner among many
/// computing ranks shortens their time slices (a 3-site `psrsearch` on 2
/// cores finished later, and its plans went wrong).
pub struct Spinner {
    /// Longest spin before one blocking wait; zero: never. Unless set, it
    /// learns as a rank's does (`sys::spin`): a wait that blocked and
    /// was ended by an event soon after raises it, a long one lowers it
    /// towards `base`.
    budget: Duration,
    base: Duration,
    /// Spin hard whatever the load (set explicitly).
    forced: bool,
    /// The machine's load at the last look.
    load: Load,
    checked: Option<Instant>,
    last_event: Option<Instant>,
    /// Waits so far, and how they ended: `spun` found work while spinning,
    /// `blocked` slept in the kernel (for `METAMPI_ROUTER_PROFILE`).
    pub counts: WaitCounts,
}

/// How a [`Spinner`]'s waits ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitCounts {
    pub waits: u64,
    pub spun: u64,
    pub blocked: u64,
}

/// How recent the last event must be for a wait to spin first.
const SPIN_AFTER: Duration = Duration::from_millis(10);
/// How often the machine's load is looked at again: often enough that a
/// busy moment (a job starting) does not stop a short exchange's spinning
/// (reading `/proc/loadavg` costs a few microseconds).
const LOAD_CHECK: Duration = Duration::from_millis(20);

impl Spinner {
    /// From `var` (microseconds; `0` turns spinning off, a number forces it);
    /// unset: `auto_us`, hard where cores are spare and yielding elsewhere.
    pub fn from_env(var: &str, auto_us: u64) -> Spinner {
        let set = crate::knobs::number::<u64>(var);
        let budget = Duration::from_micros(set.unwrap_or(auto_us));
        Spinner {
            budget,
            base: budget,
            forced: set.is_some(),
            load: Load::Crowded,
            checked: None,
            last_event: None,
            counts: WaitCounts::default(),
        }
    }

    /// How long the next wait may spin.
    fn spin_for(&mut self, now: Instant, timeout: Duration) -> Duration {
        if self.budget.is_zero() || self.last_event.is_none_or(|t| now - t >= SPIN_AFTER) {
            return Duration::ZERO;
        }
        if !self.forced && self.checked.is_none_or(|t| now - t >= LOAD_CHECK) {
            self.load = load(
                &std::fs::read_to_string("/proc/loadavg").unwrap_or_default(),
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            );
            self.checked = Some(now);
        }
        if !self.forced && self.load == Load::Crowded {
            return Duration::ZERO;
        }
        self.budget.min(timeout)
    }

    /// Whether a spin keeps its core (else it yields between looks).
    fn hard(&self) -> bool {
        self.forced || self.load == Load::Spare
    }

    /// As [`wait_fds`], spinning first where that pays (see [`Spinner`]),
    /// also ending when `ready` says that work arrived
    /// without a file descriptor (shared-memory pipes), and calling `arm(true)`
    /// before blocking (so writers know to ring) and `arm(false)` after.
    /// Returns 0 when `ready` ended it.
    pub fn wait_or(
        &mut self,
        pfds: &mut [libc::pollfd],
        timeout: Duration,
        ready: impl Fn() -> bool,
        arm: impl Fn(bool),
    ) -> io::Result<usize> {
        let start = Instant::now();
        self.counts.waits += 1;
        if ready() {
            self.last_event = Some(start);
            return Ok(0);
        }
        let spin = self.spin_for(start, timeout);
        if !spin.is_zero() {
            let hard = self.hard();
            loop {
                let n = wait_fds(pfds, Duration::ZERO)?;
                if n > 0 || ready() {
                    self.last_event = Some(Instant::now());
                    self.counts.spun += 1;
                    return Ok(n);
                }
                if start.elapsed() >= spin {
                    break;
                }
                if hard {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        if !left.is_zero() {
            // Announce the sleep, then look once more: a writer that
            // published before seeing the flag is caught here.
            arm(true);
            if ready() {
                arm(false);
                self.last_event = Some(Instant::now());
                return Ok(0);
            }
        }
        let n = wait_fds(pfds, left);
        if !left.is_zero() {
            arm(false);
            self.counts.blocked += 1;
        }
        let n = n?;
        if n > 0 {
            self.last_event = Some(Instant::now());
            if !spin.is_zero() && !self.forced {
                self.budget =
                    super::spin::next_budget(self.budget, self.base, start.elapsed(), true);
            }
        }
        Ok(n)
    }
}

/// How busy a machine is, for a [`Spinner`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    /// Two cores idle at least: spin hard.
    Spare,
    /// At most two runnable threads per core besides the reader: spin,
    /// yielding between looks.
    Shared,
    /// More, or unknown: block at once.
    Crowded,
}

/// A machine of `cores`'s load from the runnable count in `/proc/loadavg`
/// text (`0.50 0.40 0.30 3/345 1234`: 3 runnable, the reader included).
fn load(loadavg: &str, cores: usize) -> Load {
    match super::cpus::runnable(loadavg) {
        Some(r) if r + 2 <= cores => Load::Spare,
        Some(r) if r <= 2 * cores + 1 => Load::Shared,
        _ => Load::Crowded,
    }
}

/// Sets a socket's send and receive buffer sizes (`SO_SNDBUF`/`SO_RCVBUF`).
pub fn set_socket_buffers(fd: RawFd, bytes: usize) -> io::Result<()> {
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

/// Bytes written to a TCP socket that its peer's kernel has not acknowledged
/// yet (`SIOCOUTQ`): while there are any, the connection is still delivering.
pub fn unacked_bytes(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a socket) writes one c_int to the live `n`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// Asks the kernel to kill this process when its parent exits, so routers
/// started by a launcher never outlive it.
pub fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

/// Makes the allocator keep freed large buffers instead of returning them to
/// the kernel: a router allocates and frees megabyte frames continuously, and
/// fresh pages cost a fault and a clear each (a quarter of a router's time,
/// measured with perf).
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator tunables; called before the
    // router starts its threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn load_reads_the_runnable_count() {
        assert_eq!(load("0.10 0.20 0.30 3/345 999", 16), Load::Spare);
        assert_eq!(load("2.10 2.20 2.30 2/345 999", 2), Load::Shared);
        assert_eq!(load("2.10 2.20 2.30 4/345 999", 2), Load::Shared);
        assert_eq!(load("2.10 2.20 2.30 5/345 999", 2), Load::Shared);
        assert_eq!(load("8.00 8.00 8.00 6/345 999", 2), Load::Crowded);
        assert_eq!(load("1.00 1.00 1.00 15/345 999", 16), Load::Shared);
        assert_eq!(load("", 16), Load::Crowded);
        assert_eq!(load("garbage", 16), Load::Crowded);
    }

    /// A spinner as `from_env` makes one, with these settings, after an event.
    fn spinner(budget: Duration, forced: bool, load: Load) -> Spinner {
        Spinner {
            budget,
            base: budget,
            forced,
            load,
            checked: None,
            last_event: Some(Instant::now()),
            counts: WaitCounts::default(),
        }
    }

    /// Waits for `fd` to be readable.
    fn readable(fd: RawFd) -> [libc::pollfd; 1] {
        [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }]
    }

    #[test]
    fn spins_only_after_recent_events_and_never_when_off() {
        let now = Instant::now();
        let t = Duration::from_secs(1);
        let mut s = spinner(Duration::from_micros(50), true, Load::Crowded);
        s.last_event = None;
        assert_eq!(s.spin_for(now, t), Duration::ZERO, "no traffic yet");
        s.last_event = Some(now);
        assert_eq!(s.spin_for(now, t), Duration::from_micros(50));
        assert_eq!(
            s.spin_for(now, Duration::from_micros(5)),
            Duration::from_micros(5)
        );
        assert_eq!(
            s.spin_for(now + SPIN_AFTER * 2, t),
            Duration::ZERO,
            "traffic stopped"
        );
        assert!(s.hard(), "forced spins keep the core");
        // Unforced: hard with spare cores, yielding on a shared machine,
        // not at all on a crowded one.
        s.forced = false;
        s.checked = Some(now);
        s.load = Load::Shared;
        assert_eq!(s.spin_for(now, t), Duration::from_micros(50));
        assert!(!s.hard());
        s.load = Load::Spare;
        assert!(s.hard());
        s.load = Load::Crowded;
        assert_eq!(s.spin_for(now, t), Duration::ZERO);
        s.budget = Duration::ZERO;
        assert_eq!(s.spin_for(now, t), Duration::ZERO);
    }

    #[test]
    fn a_spinning_wait_returns_the_event() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let mut s = spinner(Duration::from_millis(50), true, Load::Crowded);
        let mut pfds = readable(b.as_raw_fd());
        // Nothing comes: the spin and then the wait run out.
        let t0 = Instant::now();
        assert_eq!(
            s.wait_or(&mut pfds, Duration::from_millis(80), || false, |_| {})
                .unwrap(),
            0
        );
        assert!(t0.elapsed() >= Duration::from_millis(80));
        // A datagram arrives while it spins.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.send(&[1]).unwrap();
        });
        s.last_event = Some(Instant::now());
        assert_eq!(
            s.wait_or(&mut pfds, Duration::from_secs(5), || false, |_| {})
                .unwrap(),
            1
        );
        assert!(pfds[0].revents & libc::POLLIN != 0);
        sender.join().unwrap();
        // The first wait slept after its spin, the second found its event spinning.
        assert_eq!((s.counts.waits, s.counts.spun, s.counts.blocked), (2, 1, 1));
    }

    /// An event that comes a millisecond after a spin of 50 µs ran out
    /// raises the budget to cover such waits; one that takes longer than a
    /// learnt budget may grow lowers it again.
    #[test]
    fn a_wait_ended_soon_after_the_spin_raises_the_budget() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let base = Duration::from_micros(50);
        let mut s = spinner(base, false, Load::Shared);
        // Not looked at again during the test: the load stays as set.
        s.checked = Some(Instant::now() + Duration::from_secs(3600));
        let mut pfds = readable(b.as_raw_fd());
        let mut wait_for = |s: &mut Spinner, after: Duration| {
            let a = a.try_clone().unwrap();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(after);
                a.send(&[1]).unwrap();
            });
            s.last_event = Some(Instant::now());
            let t0 = Instant::now();
            let n = s.wait_or(&mut pfds, Duration::from_secs(5), || false, |_| {});
            let took = t0.elapsed();
            sender.join().unwrap();
            let mut byte = [0u8; 1];
            b.recv(&mut byte).unwrap();
            assert_eq!(n.unwrap(), 1);
            took
        };
        let max = crate::spin::LEARN_MAX;
        let took = wait_for(&mut s, Duration::from_millis(1));
        // (A machine so loaded that the wait took longer halves it instead.)
        if s.counts.blocked == 1 && took < max {
            assert!(s.budget > base && s.budget <= max, "{:?}", s.budget);
        }
        // A long wait (past the longest learnt budget) halves it.
        s.budget = max;
        wait_for(&mut s, Duration::from_millis(30));
        assert_eq!(s.budget, max / 2);
        // A forced budget stays as set.
        s.forced = true;
        s.budget = base;
        wait_for(&mut s, Duration::from_millis(1));
        assert_eq!(s.budget, base);
    }

    #[test]
    fn work_without_a_descriptor_ends_the_wait_and_sleepers_arm() {
        let (_a, b) = UnixDatagram::pair().unwrap();
        let mut s = Spinner::from_env("METAMPI_TEST_UNSET_SPIN", 0);
        let mut pfds = readable(b.as_raw_fd());
        let armed = std::cell::RefCell::new(Vec::new());
        // Work already there: back at once, nobody armed.
        let t0 = Instant::now();
        let n = s
            .wait_or(
                &mut pfds,
                Duration::from_secs(5),
                || true,
                |on| armed.borrow_mut().push(on),
            )
            .unwrap();
        assert_eq!(n, 0);
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(armed.borrow().is_empty());
        // Nothing comes: armed before the sleep, disarmed after.
        s.wait_or(
            &mut pfds,
            Duration::from_millis(20),
            || false,
            |on| armed.borrow_mut().push(on),
        )
        .unwrap();
        assert_eq!(*armed.borrow(), [true, false]);
        // Work that came just as it armed: caught by the second look.
        armed.borrow_mut().clear();
        let t0 = Instant::now();
        s.wait_or(
            &mut pfds,
            Duration::from_secs(5),
            || armed.borrow().first() == Some(&true),
            |on| armed.borrow_mut().push(on),
        )
        .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(*armed.borrow(), [true, false]);
    }
}
