//! Low-overhead tracing of communication calls and user regions.
//!
//! Enabled by `metampi run --trace DIR` (environment `METAMPI_TRACE=DIR`).
//! Each thread appends fixed-size events to a thread-local buffer, moved in
//! batches into a bounded per-process store; at finalize each rank writes
//! `DIR/rank-R.trace` (JSON lines). `metampi trace DIR` merges the files into
//! a Chrome/Perfetto trace and prints a summary. When tracing is off a call
//! costs one relaxed atomic load.
//!
//! ```no_run
//! let _fft = metampi::trace::region("fft"); // recorded until dropped
//! ```

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

static ENABLED: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Events kept per process; further events are counted as dropped.
const MAX_EVENTS: usize = 4 << 20;
/// Events a thread buffers before moving them to the process store.
const BATCH: usize = 4096;

/// What an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Send,
    Recv,
    ISend,
    Wait,
    /// A whole collective operation, named.
    Collective,
    Region,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::ISend => "isend",
            Kind::Wait => "wait",
            Kind::Collective => "collective",
            Kind::Region => "region",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Event {
    kind: Kind,
    /// Operation or region name (collectives, regions).
    name: &'static str,
    /// Peer world rank, -1 for none or any.
    peer: i32,
    tag: i32,
    bytes: u64,
    ctx: u32,
    start_ns: u64,
    end_ns: u64,
}

struct Store {
    dir: PathBuf,
    rank: u32,
    epoch: Instant,
    epoch_unix_ns: u64,
    /// Clock reading at `epoch`; events store raw readings, converted at flush.
    epoch_ticks: u64,
    events: Mutex<Vec<Event>>,
}

/// A cheap monotonic clock: the time-stamp counter on x86-64 (constant rate
/// on every CPU this runs on; converted to nanoseconds against `Instant` at
/// flush), `Instant` elsewhere.
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions; it only reads the counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static T0: OnceLock<Instant> = OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

static STORE: OnceLock<Store> = OnceLock::new();

thread_local! {
    static LOCAL: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

/// Turns tracing on when `METAMPI_TRACE` names a directory.
pub(crate) fn init(rank: u32) {
    let Some(dir) = std::env::var_os("METAMPI_TRACE") else {
        return;
    };
    let dir = PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "metampi: tracing disabled, cannot create {}: {e}",
            dir.display()
        );
        return;
    }
    let epoch_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let _ = STORE.set(Store {
        dir,
        rank,
        epoch: Instant::now(),
        epoch_unix_ns,
        epoch_ticks: ticks(),
        events: Mutex::new(Vec::new()),
    });
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether tracing is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A timestamp for the start of a traced call, or `None` when tracing is off.
#[inline]
pub(crate) fn start() -> Option<u64> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    Some(ticks())
}

/// Records a call that began at `start` (from [`start`]) and ends now.
#[inline]
pub(crate) fn record(
    start: Option<u64>,
    kind: Kind,
    name: &'static str,
    peer: i32,
    tag: i32,
    bytes: usize,
    ctx: u32,
) {
    let Some(start_ns) = start else { return };
    let Some(s) = STORE.get() else { return };
    let end_ns = ticks();
    let ev = Event {
        kind,
        name,
        peer,
        tag,
        bytes: bytes as u64,
        ctx,
        start_ns,
        end_ns,
    };
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.push(ev);
        if l.len() >= BATCH {
            move_to_store(&mut l, s);
        }
    });
}

fn move_to_store(local: &mut Vec<Event>, s: &Store) {
    let mut all = s.events.lock().unwrap_or_else(|p| p.into_inner());
    let room = MAX_EVENTS.saturating_sub(all.len());
    if local.len() > room {
        DROPPED.fetch_add((local.len() - room) as u64, Ordering::Relaxed);
        local.truncate(room);
    }
    all.append(local);
}

/// A user-marked region, recorded from creation until drop.
#[must_use = "the region ends when this guard is dropped"]
pub struct Region {
    name: &'static str,
    start: Option<u64>,
}

/// Marks a region of user code (for example `"fft"`) in the trace.
pub fn region(name: &'static str) -> Region {
    Region {
        name,
        start: start(),
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        record(self.start, Kind::Region, self.name, -1, 0, 0, 0);
    }
}

/// Writes this rank's events (called at finalize).
pub(crate) fn flush() {
    let Some(s) = STORE.get() else { return };
    LOCAL.with(|l| move_to_store(&mut l.borrow_mut(), s));
    let mut events = std::mem::take(&mut *s.events.lock().unwrap_or_else(|p| p.into_inner()));
    // Calibrate the counter against the monotonic clock over the whole run.
    let span_ns = s.epoch.elapsed().as_nanos().max(1) as f64;
    let per_ns = (ticks().wrapping_sub(s.epoch_ticks)) as f64 / span_ns;
    let to_ns = |t: u64| (t.saturating_sub(s.epoch_ticks) as f64 / per_ns.max(1e-9)) as u64;
    for e in &mut events {
        e.start_ns = to_ns(e.start_ns);
        e.end_ns = to_ns(e.end_ns);
    }
    let path = s.dir.join(format!("rank-{}.trace", s.rank));
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        writeln!(
            f,
            r#"{{"rank":{},"epoch_unix_ns":{},"host":"{}","dropped":{}}}"#,
            s.rank,
            s.epoch_unix_ns,
            crate::environment::hostname().replace('"', ""),
            DROPPED.load(Ordering::Relaxed)
        )?;
        for e in &events {
            writeln!(
                f,
                r#"{{"k":"{}","n":"{}","p":{},"t":{},"b":{},"c":{},"s":{},"e":{}}}"#,
                e.kind.name(),
                e.name,
                e.peer,
                e.tag,
                e.bytes,
                e.ctx,
                e.start_ns,
                e.end_ns
            )?;
        }
        f.flush()
    };
    if let Err(e) = write() {
        eprintln!("metampi: could not write trace {}: {e}", path.display());
    }
    ENABLED.store(false, Ordering::Relaxed);
}
