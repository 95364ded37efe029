//! Start-up, the `Universe`, clocks and the job-wide abort (MPI-1.2 §7).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::engine::Shared;
pub(crate) use crate::engine::{abort_job, shared, try_shared};
pub(crate) use crate::sys::hostname;
use crate::topology::SimpleCommunicator;

/// Thread support levels (MPI-2 §8.7), ordered from least to most.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
pub enum Threading {
    /// One thread only.
    Single,
    /// Several threads, only the main one calls MPI.
    Funneled,
    /// Several threads call MPI, one at a time.
    Serialized,
    /// Any thread calls MPI at any time.
    Multiple,
}

enum State {
    Uninit,
    Running(Threading),
    Finalized,
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(State::Uninit))
}

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// The whole job: created by [`initialize`], finalizes when dropped.
pub struct Universe {
    shared: Arc<Shared>,
    buffer_size: usize,
}

impl Universe {
    /// The world communicator (`MPI_COMM_WORLD`).
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    /// Number of processes the job may usefully have, spawned ones included
    /// (`MPI_UNIVERSE_SIZE`): `METAMPI_UNIVERSE_SIZE` (`metampi run --universe-size`),
    /// else the number the job was started with.
    pub fn size(&self) -> Option<usize> {
        let started = self.shared.info.size as usize;
        match crate::knobs::number::<usize>("METAMPI_UNIVERSE_SIZE") {
            Some(0) => {
                crate::knobs::warn_once(
                    "METAMPI_UNIVERSE_SIZE",
                    "ignoring METAMPI_UNIVERSE_SIZE=0: a universe holds at least one process"
                        .into(),
                );
                Some(started)
            }
            Some(n) => Some(n),
            None => Some(started),
        }
    }

    /// Index of this process's program in a MIMD launch (`MPI_APPNUM`).
    pub fn appnum(&self) -> Option<isize> {
        Some(self.shared.info.appnum as isize)
    }

    /// Size of the buffer for buffered sends. Buffered sends copy into memory
    /// the library owns, so any size works; the value is kept for rsmpi programs.
    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    /// Sets the buffered-send buffer size (see [`Universe::buffer_size`]).
    pub fn set_buffer_size(&mut self, size: usize) {
        self.buffer_size = size;
    }

    /// Detaches the buffered-send buffer.
    pub fn detach_buffer(&mut self) {
        self.buffer_size = 0;
    }

    /// Whether this machine's ranks (and the routers they reach on it) outnumber
    /// the cores they were given: the union of their affinity masks, within any
    /// CPU quota. Oversubscribed ranks yield their core while they wait instead
    /// of spinning on it. Not in MPI; `metampi bench` prints it.
    pub fn oversubscribed(&self) -> bool {
        self.shared.oversubscribed()
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        // Unwinding from a panic: no barrier (the others may wait for this rank's
        // messages and never reach one) and no word of a clean end to the launcher,
        // which sees the rank exit with the panic's code and ends the job naming it.
        if std::thread::panicking() {
            crate::trace::flush();
            return;
        }
        // MPI_Finalize: a barrier so nobody leaves while others still need it, on a
        // context of its own that no barrier of the program can meet; then drain
        // outgoing frames and tell the launcher.
        let _ = crate::collective::barrier_impl(&SimpleCommunicator::finalizer());
        crate::trace::flush();
        self.shared.finalize();
        // MPI_Finalize is collective over connected processes: the children
        // this process started end before it does.
        crate::topology::spawn::wait_children(&self.shared);
        *state().lock().unwrap_or_else(|p| p.into_inner()) = State::Finalized;
    }
}

/// Starts the library with `Threading::Single`. `None` if already started (or finished).
pub fn initialize() -> Option<Universe> {
    initialize_with_threading(Threading::Single).map(|x| x.0)
}

/// Starts the library; every level up to `Multiple` is provided.
///
/// # Panics
/// When the launcher's bootstrap exchange fails (a message says why).
pub fn initialize_with_threading(threading: Threading) -> Option<(Universe, Threading)> {
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    if !matches!(*st, State::Uninit) {
        return None;
    }
    epoch();
    crate::log::init();
    let shared = match Shared::init() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("metampi: start-up failed: {e}");
            std::process::exit(1);
        }
    };
    crate::trace::init(shared.info.rank);
    if shared.progress_all() {
        shared.ensure_async_progress();
    }
    crate::engine::install(Arc::clone(&shared));
    *st = State::Running(threading);
    drop(st);
    if let Err(e) = crate::topology::spawn::greet_routed_parents() {
        eprintln!("metampi: start-up failed: meeting the parents: {e}");
        std::process::exit(1);
    }
    Some((
        Universe {
            shared,
            buffer_size: 0,
        },
        threading,
    ))
}

/// The thread level granted at start-up.
pub fn threading_support() -> Threading {
    match &*state().lock().unwrap_or_else(|p| p.into_inner()) {
        State::Running(t) => *t,
        _ => Threading::Single,
    }
}

/// Whether `initialize` has been called.
pub fn is_initialized() -> bool {
    !matches!(
        *state().lock().unwrap_or_else(|p| p.into_inner()),
        State::Uninit
    )
}

/// Whether the `Universe` has been dropped.
pub fn is_finalized() -> bool {
    matches!(
        *state().lock().unwrap_or_else(|p| p.into_inner()),
        State::Finalized
    )
}

/// Wall-clock seconds since an arbitrary fixed point (`MPI_Wtime`).
pub fn time() -> f64 {
    epoch().elapsed().as_secs_f64()
}

/// Resolution of [`time`] in seconds (`MPI_Wtick`).
pub fn time_resolution() -> f64 {
    1e-9
}

/// The MPI standard version whose semantics the library follows: MPI-3.1,
/// the version rsmpi requires (its programs may assert it), for every
/// operation the library offers. Some parts of that standard are absent;
/// [`library_version`] names them.
pub fn version() -> (i32, i32) {
    (3, 1)
}

/// A description of this library, with the parts of MPI-3.1 it lacks.
pub fn library_version() -> Result<String, std::string::FromUtf8Error> {
    Ok(format!(
        "metampi {} (pure Rust; MPI-3.1 without one-sided communication, MPI-IO, persistent requests, graph topologies, neighbourhood collectives or the tools interface)",
        env!("CARGO_PKG_VERSION")
    ))
}

/// What this machine offers the library, as `metampi info` prints it: the
/// facts that decide which transports and fences a job gets here. Not in
/// MPI (Open MPI's `ompi_info` and MPICH's `mpichversion` play this part).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Capabilities {
    /// Where shared-memory segments are made: `/dev/shm`, else the
    /// temporary directory.
    pub shm_dir: std::path::PathBuf,
    /// Free bytes in [`Capabilities::shm_dir`], where the system says.
    pub shm_free: Option<u64>,
    /// Ranks of one machine may copy each other's long messages once
    /// (`process_vm_readv`); otherwise those go through the rings, twice.
    pub cross_memory_attach: bool,
    /// `METAMPI_NO_CMA` turns cross-memory attach off.
    pub cross_memory_attach_off: bool,
    /// `kernel.yama.ptrace_scope`, where Yama is loaded (ranks declare their
    /// siblings allowed, which covers scope 1; 2 needs root, 3 forbids).
    pub ptrace_scope: Option<u32>,
    /// A writer to shared memory needs no full fence per message: the rare
    /// sleeper pays with `membarrier` instead.
    pub asymmetric_fences: bool,
    /// CPUs this process may run on (affinity mask and any CPU quota).
    pub cpus: usize,
    /// The routers of this build can run TLS 1.3 links (`metampi-router`'s
    /// `tls` feature).
    pub tls: bool,
    /// Compression codecs of router links.
    pub compression: Vec<&'static str>,
}

/// This machine's [`Capabilities`]; needs no [`initialize`].
pub fn capabilities() -> Capabilities {
    let shm_dir = crate::sys::shm::dir();
    Capabilities {
        shm_free: crate::sys::shm::free_bytes(),
        shm_dir,
        cross_memory_attach: !crate::sys::cma::turned_off() && crate::sys::cma::available(),
        cross_memory_attach_off: crate::sys::cma::turned_off(),
        ptrace_scope: crate::sys::cma::yama_scope(),
        asymmetric_fences: crate::sys::asymmetric_fences(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        tls: metampi_launch::router_spec::TLS_AVAILABLE,
        compression: [
            ("lz4", metampi_wire::Compression::Lz4),
            ("zstd", metampi_wire::Compression::Zstd),
        ]
        .into_iter()
        .filter(|(_, c)| c.available())
        .map(|(name, _)| name)
        .collect(),
    }
}

/// The cores this machine's ranks were given together: the union of their
/// affinity masks, within any CPU quota. A rank bound to one core
/// (`metampi run --bind-to`, `taskset`, a batch system) still learns its
/// machine's share, which its own mask does not tell. 1 before
/// [`initialize`] and after the universe is dropped. Not in MPI.
pub fn machine_cores() -> usize {
    try_shared().map_or(1, |s| s.cores())
}

/// The name of this machine (`MPI_Get_processor_name`).
pub fn processor_name() -> Result<String, std::string::FromUtf8Error> {
    Ok(hostname())
}

/// Ends the whole job the way MPI treats a fatal error, for an error of API call `call` made
/// at `at`: a message naming this rank, the call, the caller's line where that is the
/// program's own (not a line of this library's, which a helper without `#[track_caller]`
/// between would give) and the cause, then `MPI_Abort`.
#[cold]
fn fatal_in(err: &crate::Error, call: &str, at: &std::panic::Location<'_>) -> ! {
    // This file's directory is the library's source, wherever cargo put it.
    let src = file!().trim_end_matches("environment.rs");
    let place = if at.file().starts_with(src) {
        String::new()
    } else {
        format!(" at {}:{}:{}", at.file(), at.line(), at.column())
    };
    abort_job(
        1,
        &format!("{} in `{call}`{place}: {}", err.class(), err.message()),
    )
}

/// Unwraps a fallible result for the infallible rsmpi-shaped API.
pub(crate) trait OrAbort<T> {
    /// The value, or the end of the job naming API call `call` and where the program made it.
    fn or_abort_in(self, call: &'static str) -> T;
}

impl<T> OrAbort<T> for Result<T, crate::Error> {
    #[track_caller]
    #[inline(always)]
    fn or_abort_in(self, call: &'static str) -> T {
        match self {
            Ok(v) => v,
            Err(e) => fatal_in(&e, call, std::panic::Location::caller()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rsmpi's programs assert MPI 3.0 or later (its `env_inq` example does);
    /// what is missing of 3.1 must then be said somewhere a user can read it.
    #[test]
    fn reports_the_standard_rsmpi_needs_and_what_is_missing() {
        assert!(version() >= (3, 0), "{:?}", version());
        let v = library_version().unwrap();
        assert!(v.starts_with("metampi ") && v.contains("MPI-3.1"), "{v}");
        assert!(v.contains("one-sided") && v.contains("MPI-IO"), "{v}");
    }
}
