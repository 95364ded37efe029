//! What this rank waits in, for the launcher's hang report (`metampi run --stall-timeout`,
//! `SIGUSR1` to the launcher).
//!
//! A thread that has waited past its spin in [`Shared::wait_until_for`] enters itself here
//! with a description of its wait (the request it waits for, read from the engine, or the
//! call it is in where the wait names no request) and the time its wait began; it leaves when
//! the wait ends or moves. The launcher's `REPORT` is answered from this list by the
//! key-value client's thread ([`answer`]), without the engine's lock, so a rank whose threads
//! hold or wait for that lock still answers. Only waits that sleep are entered: the fast path
//! pays nothing. The answer also carries the rank's traffic counters ([`super::traffic`])
//! and, for the live view's timeline, the calls the trace recorded since it was last asked
//! (the trace, a layer above, registers where they come from: [`calls_from`]).
//!
//! [`Shared::wait_until_for`]: super::Shared::wait_until_for

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metampi_launch::{Answer, Ask, CallSpan, RecentCalls};

use super::core::{Pattern, ReqId, Waiting};
use super::Engine;

/// The most calls one answer carries: the live view asks about once a second and draws the
/// last seconds, so a rank that makes more shows its newest.
const RECENT_CALLS: usize = 200;

/// The calls completed since the last look, newest first, at most the number given, and how
/// many more there were; `None` when not recording.
pub(crate) type RecentFn = fn(usize) -> Option<(Vec<CallSpan>, u64)>;

/// Where the calls come from: set by the trace when it starts recording.
static CALLS: OnceLock<RecentFn> = OnceLock::new();

/// From now on, answers asked for calls take them from `recent`.
pub(crate) fn calls_from(recent: RecentFn) {
    let _ = CALLS.set(recent);
}

/// The threads of this process in a wait that has slept: an id, when the wait began, and
/// what it waits for.
static WAITS: Mutex<Vec<(u64, Instant, String)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// What the calling thread is in, for waits that name no request (probes, waits for any
    /// of several requests, shared-memory collectives); `None` for a thread that is not to
    /// be reported (the progress thread of futures).
    static CALL: Cell<Option<Call>> = const { Cell::new(Some(Call::Unnamed)) };
}

/// A call a thread may wait in without one request to name.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    /// Nothing recorded.
    Unnamed,
    /// A probe on context `ctx` for `src` and `tag` (engine rank, `None`: any).
    Probe { pat: Pattern },
    /// A wait for one, some or all of several requests.
    Several(&'static str),
    /// A collective through shared memory on context `ctx`.
    Collective { name: &'static str, ctx: u32 },
}

/// Restores the thread's previous call when dropped.
pub(crate) struct InCall(Option<Call>);

impl Drop for InCall {
    fn drop(&mut self) {
        CALL.with(|c| c.set(self.0));
    }
}

/// Records that this thread is in `call` until the guard drops. Two thread-local stores:
/// cheap enough for every probe and shared-memory collective.
#[inline]
pub(crate) fn in_call(call: Call) -> InCall {
    InCall(CALL.with(|c| c.replace(Some(call))))
}

/// Keeps this thread (the progress thread of futures, which waits on behalf of others) out
/// of reports.
pub(crate) fn never_report() {
    CALL.with(|c| c.set(None));
}

/// This thread's entry in the list; removed when dropped.
pub(super) struct Entered(u64);

impl Drop for Entered {
    fn drop(&mut self) {
        lock().retain(|(id, ..)| *id != self.0);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(u64, Instant, String)>> {
    WAITS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Enters this thread, waiting since `since` for `want` (or in its recorded call), as `e`
/// describes it; `None` for a thread kept out of reports.
pub(super) fn enter(e: &Engine, want: Option<ReqId>, since: Instant) -> Option<Entered> {
    let call = CALL.with(Cell::get)?;
    let text = describe(e, want, call);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock().push((id, since, text));
    Some(Entered(id))
}

/// The answer to the launcher's `REPORT`: where this rank waits ([`waits`]), its traffic, and
/// when asked, the calls it completed since it was last asked.
pub(crate) fn answer(ask: Ask) -> Answer {
    let (waited, text) = waits();
    let calls = match ask {
        Ask::Wait => None,
        Ask::WaitAndCalls => Some(match CALLS.get().and_then(|recent| recent(RECENT_CALLS)) {
            Some((calls, left_out)) => RecentCalls::recorded(calls, left_out),
            None => RecentCalls::not_recording(),
        }),
    };
    Answer {
        waited,
        text,
        traffic: Some(super::traffic::total()),
        calls,
    }
}

/// The oldest wait's age, and every waiting thread's description with its age; `None` and an
/// empty text when no thread waits.
fn waits() -> (Option<Duration>, String) {
    let waits = lock();
    let now = Instant::now();
    let oldest = waits.iter().map(|(_, since, _)| now - *since).max();
    let mut text = String::new();
    for (_, since, what) in waits.iter() {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(what);
        if waits.len() > 1 {
            let _ = write!(text, " ({:.1} s)", (now - *since).as_secs_f64());
        }
    }
    (oldest, text)
}

fn describe(e: &Engine, want: Option<ReqId>, call: Call) -> String {
    let mut s = describe_wait(e, want, call);
    let queues = e.links.describe_queues(&e.core);
    if !queues.is_empty() {
        let _ = write!(s, "; {}", queues.trim_start());
    }
    s
}

fn describe_wait(e: &Engine, want: Option<ReqId>, call: Call) -> String {
    if let Some(id) = want {
        if let Some((name, ctx)) = e.describe_pass_work(id) {
            return collective(e, name, ctx);
        }
        match e.core.describe(id) {
            Some(Waiting::Recv { pat, cap }) => {
                let mut s = format!("a receive {}", pattern(&pat));
                if cap != usize::MAX {
                    let _ = write!(s, " into {cap} bytes");
                }
                // What did come from that rank: a tag or communicator that differs shows here.
                if let Some(src) = pat.src {
                    let u = e.core.unexpected_from(src);
                    if !u.is_empty() {
                        let _ = write!(s, "; {u}");
                    }
                }
                return s;
            }
            Some(Waiting::Send { dst, bytes }) => {
                return format!(
                    "a send of {bytes} bytes to rank {dst}, not yet taken by its receiver ({})",
                    e.links.describe_peer(dst)
                )
            }
            None => {}
        }
    }
    match call {
        Call::Probe { pat } => format!("a probe {}", pattern(&pat)),
        Call::Several(what) => what.to_string(),
        Call::Collective { name, ctx } => collective(e, name, ctx),
        Call::Unnamed => "a wait of the library (its call is not recorded)".into(),
    }
}

/// A collective on context `ctx`, with the ranks its posted receives wait for.
fn collective(e: &Engine, name: &str, ctx: u32) -> String {
    let mut s = format!("{name} on {}", communicator(ctx));
    let mut from: Vec<String> = e
        .core
        .posted_on(ctx)
        .iter()
        .map(|p| p.src.map_or_else(|| "any rank".into(), |r| r.to_string()))
        .collect();
    from.dedup();
    if !from.is_empty() {
        let _ = write!(s, ", waiting for messages from rank {}", from.join(", "));
    }
    for p in e.core.posted_on(ctx) {
        if let Some(src) = p.src {
            let u = e.core.unexpected_from(src);
            if !u.is_empty() {
                let _ = write!(s, "; {u}");
            }
        }
    }
    s
}

/// `from rank R, tag T, on COMM` with wildcards spelt out (ranks are world ranks).
fn pattern(p: &Pattern) -> String {
    let src = p
        .src
        .map_or_else(|| "any rank".into(), |r| format!("rank {r}"));
    let tag = p
        .tag
        .map_or_else(|| "any tag".into(), |t| format!("tag {t}"));
    format!("from {src}, {tag}, on {}", communicator(p.ctx))
}

/// A communicator by its context id (point-to-point context even, collective context odd).
fn communicator(ctx: u32) -> String {
    let kind = if ctx % 2 == 1 { " (collective)" } else { "" };
    match ctx & !1 {
        0 => format!("MPI_COMM_WORLD{kind}"),
        2 => format!("MPI_COMM_SELF{kind}"),
        4 => "the finalization barrier".into(),
        c => format!("the communicator of context {c}{kind}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_communicators_read_as_a_user_names_them() {
        let p = Pattern {
            ctx: 0,
            src: Some(1),
            tag: None,
        };
        assert_eq!(pattern(&p), "from rank 1, any tag, on MPI_COMM_WORLD");
        assert_eq!(communicator(1), "MPI_COMM_WORLD (collective)");
        assert_eq!(communicator(5), "the finalization barrier");
        assert_eq!(communicator(8), "the communicator of context 8");
    }

    #[test]
    fn calls_nest_and_unwind() {
        let outer = in_call(Call::Several("a wait for all of 3 requests"));
        {
            let _inner = in_call(Call::Collective {
                name: "barrier",
                ctx: 1,
            });
            assert!(matches!(
                CALL.with(Cell::get),
                Some(Call::Collective { .. })
            ));
        }
        assert!(matches!(CALL.with(Cell::get), Some(Call::Several(_))));
        drop(outer);
        assert!(matches!(CALL.with(Cell::get), Some(Call::Unnamed)));
    }
}
