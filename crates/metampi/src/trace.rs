//! Low-overhead tracing of communication calls, user regions and router links.
//!
//! Enabled by `metampi run --trace DIR` (environment `METAMPI_TRACE=DIR`).
//! Ranks: each thread writes fixed-size events straight into a chunk of a
//! per-process arena that it claimed for itself (no lock, no copy, no
//! allocation per event); at finalize each rank writes `DIR/rank-R.trace`
//! (JSON lines). Routers: each connection to a peer router appends one
//! 16-byte record per frame written and per read into a file mapping
//! (`DIR/router-R-{out,in}-P.trace`), so what they recorded survives the
//! `SIGKILL` that ends a router. `metampi trace DIR` merges all files into a
//! Chrome/Perfetto trace and prints a summary. When tracing is off a call
//! costs one relaxed atomic load.
//!
//! Memory is bounded: the arena holds [`MAX_EVENTS`] events and a router
//! file [`LINK_RECORDS`] records; further events are counted as dropped.
//!
//! While the job runs, the launcher's live view (`metampi run --web`) asks a
//! rank about once a second for the calls it completed since it last asked
//! (`recent`): the report thread reads them out of the arena as the writers
//! publish them, without stopping them, and keeps how far it has read.
//!
//! ```no_run
//! let _fft = metampi::trace::region("fft"); // recorded until dropped
//! ```

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metampi_launch::CallSpan;

static ENABLED: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Events kept per process; further events are counted as dropped.
pub const MAX_EVENTS: usize = 4 << 20;
/// Events in one chunk of the arena, the unit a thread claims at a time.
const CHUNK: usize = 1024;
/// Arena bytes backed at start-up (200 K events, a few ms), so that a short
/// job takes no page fault while it records: a fault costs about 1 us, as
/// much as 30 records.
const PREFAULT: usize = 8 << 20;

/// What an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Send = 1,
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

/// One recorded call: 40 bytes, timestamps in raw clock ticks.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Event {
    start: u64,
    end: u64,
    bytes: u64,
    /// Peer world rank, -1 for none or any.
    peer: i32,
    tag: i32,
    ctx: u32,
    kind: Kind,
    /// Index into [`NAMES`] (collective and region names), 0 for none.
    name: u8,
}

/// Names of collectives and regions seen so far; an event stores the index.
/// Only named events (whole collectives, user regions) take this lock.
static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

fn intern(name: &'static str) -> u8 {
    if name.is_empty() {
        return 0;
    }
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if names.is_empty() {
        names.push("");
    }
    if let Some(i) = names.iter().position(|n| *n == name) {
        return i as u8;
    }
    if names.len() > u8::MAX as usize {
        // More distinct names than an index holds: the event keeps its kind.
        return 0;
    }
    names.push(name);
    (names.len() - 1) as u8
}

/// Fixed-capacity event storage shared by the threads of a process: an
/// anonymous mapping reserved once (pages are only backed when touched). Threads claim chunks by
/// incrementing `next`; a chunk has one writer, which publishes how many of
/// its slots are filled in `filled`.
struct Arena {
    base: *mut Event,
    chunks: usize,
    next: AtomicUsize,
    filled: Box<[AtomicU32]>,
}

// SAFETY: `base` points to a mapping that is never unmapped. Each chunk is
// written only by the thread that claimed it (`next` hands every index out
// once); readers read only slots below the count published in `filled` with
// release/acquire ordering.
unsafe impl Sync for Arena {}
// SAFETY: as above; the arena owns no thread-bound state.
unsafe impl Send for Arena {}

impl Arena {
    fn new(events: usize) -> Option<Arena> {
        let chunks = events / CHUNK;
        let len = chunks * CHUNK * std::mem::size_of::<Event>();
        // SAFETY: a fresh private anonymous mapping; the kernel picks the
        // address and we check for MAP_FAILED before using it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: `p..p+len` is the mapping just made; the call is advice
        // about it (back the first pages now). Failure only costs speed, so
        // the result is ignored. No MADV_HUGEPAGE: with the usual
        // `defrag = madvise` a fault may then stall in direct compaction
        // (a 3x slower run seen here), a spike in the traced program.
        unsafe {
            libc::madvise(p, PREFAULT.min(len), libc::MADV_POPULATE_WRITE);
        }
        Some(Arena {
            base: p.cast(),
            chunks,
            next: AtomicUsize::new(0),
            filled: (0..chunks).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// Chunks claimed so far.
    fn used(&self) -> usize {
        self.next.load(Ordering::Acquire).min(self.chunks)
    }

    /// The events of chunk `c` (below [`Arena::used`]) that its writer has published.
    fn published(&self, c: usize) -> &[Event] {
        let n = self.filled[c].load(Ordering::Acquire) as usize;
        // SAFETY: chunk `c` lies inside the mapping; its first `n` slots
        // (`n` is at most CHUNK) were written before `n` was published
        // (release store in `Arena::put`), and nobody writes them again.
        unsafe { std::slice::from_raw_parts(self.base.add(c * CHUNK), n) }
    }

    /// The events of every chunk, as far as their writers have published them.
    fn events(&self) -> Vec<Event> {
        let mut out = Vec::new();
        for c in 0..self.used() {
            out.extend_from_slice(self.published(c));
        }
        out
    }

    /// The `max` events that ended last among those published since `seen`
    /// (per chunk, how many were read before; brought up to date), newest
    /// first, and how many others were new.
    ///
    /// A chunk has one writer, which records each call as it ends, so its
    /// events are in the order they ended: a chunk is read from its end
    /// back, and no further once its events are older than all `max` kept.
    fn newest_since(&self, seen: &mut Vec<u32>, max: usize) -> (Vec<Event>, u64) {
        let used = self.used();
        if seen.len() < used {
            seen.resize(used, 0);
        }
        let mut kept: BinaryHeap<Reverse<ByEnd>> = BinaryHeap::with_capacity(max + 1);
        let mut new = 0u64;
        for (c, seen) in seen.iter_mut().enumerate().take(used) {
            let events = self.published(c);
            let Some(fresh) = events.get(*seen as usize..).filter(|f| !f.is_empty()) else {
                continue;
            };
            new += fresh.len() as u64;
            *seen = events.len() as u32;
            for e in fresh.iter().rev() {
                let older = kept.peek().is_some_and(|Reverse(k)| e.end <= k.0.end);
                if kept.len() == max && older {
                    break;
                }
                kept.push(Reverse(ByEnd(*e)));
                if kept.len() > max {
                    kept.pop();
                }
            }
        }
        // Ascending by `Reverse`: the newest first.
        let kept: Vec<Event> = kept.into_sorted_vec().into_iter().map(|r| r.0 .0).collect();
        let others = new - kept.len() as u64;
        (kept, others)
    }
}

/// An event ordered by when it ended.
struct ByEnd(Event);

impl PartialEq for ByEnd {
    fn eq(&self, other: &Self) -> bool {
        self.0.end == other.0.end
    }
}

impl Eq for ByEnd {}

impl PartialOrd for ByEnd {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByEnd {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.end.cmp(&other.0.end)
    }
}

struct Store {
    dir: PathBuf,
    rank: u32,
    epoch: Instant,
    epoch_unix_ns: u64,
    /// Clock reading at `epoch`; events store raw readings, converted at flush.
    epoch_ticks: u64,
    arena: Arena,
}

impl Store {
    /// Counter ticks per nanosecond, the counter calibrated against the monotonic clock
    /// over the run so far (`now` is a reading taken just before).
    fn ticks_per_ns(&self, now: u64) -> f64 {
        let span_ns = self.epoch.elapsed().as_nanos().max(1) as f64;
        (now.wrapping_sub(self.epoch_ticks) as f64 / span_ns).max(1e-9)
    }
}

/// A cheap monotonic clock: the time-stamp counter on x86-64 (constant rate
/// on every CPU this runs on; converted to nanoseconds against `Instant` at
/// flush; 14 ns here against 35-50 ns for `Instant::now` in a VM), `Instant`
/// elsewhere.
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

/// This thread's place in the arena: the next slot and the end of its chunk
/// (global event indices). `pos == end` means "claim a chunk first".
#[derive(Clone, Copy)]
struct Cursor {
    pos: usize,
    end: usize,
}

thread_local! {
    // A const-initialised `Cell` of plain data: no lazy initialisation or
    // destructor registration on the recording path.
    static CURSOR: Cell<Cursor> = const { Cell::new(Cursor { pos: 0, end: 0 }) };
}

/// Turns tracing on when `METAMPI_TRACE` names a directory.
pub(crate) fn init(rank: u32) {
    let Some(dir) = trace_dir() else { return };
    if open_store(dir, rank) {
        ENABLED.store(true, Ordering::Relaxed);
        crate::engine::report::calls_from(recent);
    }
}

fn open_store(dir: PathBuf, rank: u32) -> bool {
    let Some(arena) = Arena::new(MAX_EVENTS) else {
        tracing::warn!("metampi: tracing disabled, cannot reserve memory for events");
        return false;
    };
    STORE
        .set(Store {
            dir,
            rank,
            epoch: Instant::now(),
            epoch_unix_ns: unix_ns(),
            epoch_ticks: ticks(),
            arena,
        })
        .is_ok()
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
    let Some(start) = start else { return };
    let end = ticks();
    let Some(s) = STORE.get() else { return };
    let ev = Event {
        start,
        end,
        bytes: bytes as u64,
        peer,
        tag,
        ctx,
        kind,
        name: if name.is_empty() { 0 } else { intern(name) },
    };
    let mut c = CURSOR.get();
    if s.arena.put(&mut c, ev) {
        CURSOR.set(c);
    } else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

impl Arena {
    /// Writes `ev` at cursor `c`, the calling thread's (claiming a fresh chunk
    /// first when its own is full), and publishes it; false when the arena is
    /// used up.
    #[inline(always)]
    fn put(&self, c: &mut Cursor, ev: Event) -> bool {
        if c.pos == c.end {
            match claim(self) {
                Some(fresh) => *c = fresh,
                None => return false,
            }
        }
        // SAFETY: `c.pos` is inside the chunk this thread claimed (`pos < end`,
        // and `end` is within the arena), so no other thread touches the slot.
        unsafe { self.base.add(c.pos).write(ev) };
        self.filled[c.pos / CHUNK].store((c.pos % CHUNK + 1) as u32, Ordering::Release);
        c.pos += 1;
        true
    }
}

/// Gives this thread a fresh chunk; `None` when the arena is used up.
#[cold]
fn claim(arena: &Arena) -> Option<Cursor> {
    if arena.next.load(Ordering::Relaxed) >= arena.chunks {
        return None;
    }
    let chunk = arena.next.fetch_add(1, Ordering::AcqRel);
    if chunk >= arena.chunks {
        return None;
    }
    Some(Cursor {
        pos: chunk * CHUNK,
        end: (chunk + 1) * CHUNK,
    })
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

/// Per chunk of the arena, how many of its events [`recent`] has handed out.
static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The calls this process completed since the previous call of this
/// function (the launcher's live view asks about once a second), newest
/// first, at most `max`, timed back from now; and how many more there were.
/// `None` when tracing is off. Once the trace is written (at finalize) there
/// are no more, but the process still says that it records.
pub(crate) fn recent(max: usize) -> Option<(Vec<CallSpan>, u64)> {
    let s = STORE.get()?;
    let (events, others) = {
        let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
        s.arena.newest_since(&mut seen, max)
    };
    let now = ticks();
    let per_ns = s.ticks_per_ns(now);
    let span =
        |from: u64, to: u64| Duration::from_nanos((to.saturating_sub(from) as f64 / per_ns) as u64);
    let names = NAMES.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let calls = events
        .iter()
        .map(|e| CallSpan {
            kind: e.kind.name().into(),
            name: names.get(e.name as usize).copied().unwrap_or("").into(),
            peer: u32::try_from(e.peer).ok(),
            bytes: e.bytes,
            ended_ago: span(e.end, now),
            took: span(e.start, e.end),
        })
        .collect();
    Some((calls, others))
}

/// Writes this rank's events (called at finalize).
pub(crate) fn flush() {
    let Some(s) = STORE.get() else { return };
    ENABLED.store(false, Ordering::Relaxed);
    let events = s.arena.events();
    let names = NAMES.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let per_ns = s.ticks_per_ns(ticks());
    let to_ns = |t: u64| (t.saturating_sub(s.epoch_ticks) as f64 / per_ns) as u64;
    let path = s.dir.join(format!("rank-{}.trace", s.rank));
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        writeln!(
            f,
            r#"{{"rank":{},"site":{},"epoch_unix_ns":{},"host":"{}","dropped":{}}}"#,
            s.rank,
            crate::topology::site_of_world(s.rank),
            s.epoch_unix_ns,
            crate::sys::hostname().replace('"', ""),
            DROPPED.load(Ordering::Relaxed)
        )?;
        for e in &events {
            writeln!(
                f,
                r#"{{"k":"{}","n":"{}","p":{},"t":{},"b":{},"c":{},"s":{},"e":{}}}"#,
                e.kind.name(),
                names
                    .get(e.name as usize)
                    .copied()
                    .unwrap_or("")
                    .replace(['"', '\\'], ""),
                e.peer,
                e.tag,
                e.bytes,
                e.ctx,
                to_ns(e.start),
                to_ns(e.end)
            )?;
        }
        f.flush()
    };
    if let Err(e) = write() {
        tracing::warn!("metampi: could not write trace {}: {e}", path.display());
    }
}

use metampi_sys::linklog::{trace_dir, unix_ns};
pub use metampi_sys::linklog::{
    LinkLog, LINK_HEADER, LINK_MAGIC, LINK_RECEIVED, LINK_RECORD, LINK_RECORDS,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// One store for the whole test binary (tests run in one process).
    fn enable() {
        static ONCE: OnceLock<()> = OnceLock::new();
        ONCE.get_or_init(|| {
            assert!(open_store(std::env::temp_dir(), 0));
            ENABLED.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    fn events_from_several_threads_are_all_kept() {
        enable();
        std::thread::scope(|sc| {
            for th in 0..4 {
                sc.spawn(move || {
                    for i in 0..3000 {
                        record(start(), Kind::Send, "", th, 7, i, 0);
                    }
                    drop(region("work"));
                });
            }
        });
        // Other tests of this binary may record too: look at this test's events only.
        let evs = STORE.get().unwrap().arena.events();
        for th in 0..4 {
            let mine: Vec<_> = evs
                .iter()
                .filter(|e| e.peer == th && e.kind == Kind::Send && e.tag == 7)
                .collect();
            assert_eq!(mine.len(), 3000);
            assert!(mine.iter().enumerate().all(|(i, e)| e.bytes == i as u64));
            assert!(mine.iter().all(|e| e.end >= e.start));
        }
        let names = NAMES.lock().unwrap().clone();
        assert!(evs
            .iter()
            .any(|e| e.kind == Kind::Region && names[e.name as usize] == "work"));
    }

    #[test]
    fn the_newest_calls_are_read_once_across_chunks() {
        let arena = Arena::new(CHUNK * 4).unwrap();
        let ev = |end: u64| Event {
            start: end - 1,
            end,
            bytes: end,
            peer: 1,
            tag: 0,
            ctx: 0,
            kind: Kind::Send,
            name: 0,
        };
        // Two threads' chunks, their calls interleaved in time.
        let (mut a, mut b) = (Cursor { pos: 0, end: 0 }, Cursor { pos: 0, end: 0 });
        for t in 1..=10 {
            assert!(arena.put(if t % 2 == 0 { &mut a } else { &mut b }, ev(10 * t)));
        }
        let mut seen = Vec::new();
        let (newest, others) = arena.newest_since(&mut seen, 3);
        let ends: Vec<u64> = newest.iter().map(|e| e.end).collect();
        assert_eq!((ends, others), (vec![100, 90, 80], 7));
        // Nothing new: nothing read again.
        let (none, others) = arena.newest_since(&mut seen, 3);
        assert!(none.is_empty() && others == 0);
        // A third thread's chunk and more of the first's: only those.
        let mut c = Cursor { pos: 0, end: 0 };
        assert!(arena.put(&mut c, ev(105)));
        assert!(arena.put(&mut a, ev(110)));
        let (newest, others) = arena.newest_since(&mut seen, 5);
        let ends: Vec<u64> = newest.iter().map(|e| e.end).collect();
        assert_eq!((ends, others), (vec![110, 105], 0));
        // With none to keep, all are counted.
        assert!(arena.put(&mut b, ev(120)));
        let (none, others) = arena.newest_since(&mut seen, 0);
        assert!(none.is_empty() && others == 1);
    }

    #[test]
    #[ignore = "timing: cargo test --release -p metampi --lib trace::tests::record_cost -- --ignored --nocapture"]
    fn record_cost() {
        let n = 2_000_000u64;
        let per_call = |n: u64| {
            let t = Instant::now();
            for i in 0..n {
                let s = start();
                record(s, Kind::Send, "", 1, 0, i as usize, 0);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let off = if enabled() { f64::NAN } else { per_call(n) };
        enable();
        for round in 0..3 {
            let on = per_call(n / 2);
            eprintln!("round {round}: off {off:.1} ns, on {on:.1} ns per call");
        }
    }
}
