//! A live view of a running job: where each rank is, kept up to date while someone looks.
//!
//! The launcher owns the ranks' key-value connections, so only it can ask them where they
//! wait. A [`LiveView`] given to [`JobSpec::live`] is its window: the launcher records in it
//! what it learns for free (a rank connected, finalized, exited) about once a second, and,
//! while a viewer has called [`LiveView::want`] in the last few seconds, asks every rank
//! where it waits (the hang report's `REPORT`, see [`crate::pmi`]) about once a second too.
//! A job nobody looks at is not asked anything. `metampi run --web` serves it over HTTP.
//!
//! The answers also carry each rank's traffic counters, of which the view keeps the newest
//! and the rates between the last two, and, from ranks that record a trace, the calls they
//! completed since they last answered, of which it keeps a window ([`CALLS_KEPT_FOR`], at
//! most [`CALLS_KEPT`] per rank) for a timeline.
//!
//! [`JobSpec::live`]: crate::JobSpec::live

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::answer::{RecentCalls, Traffic};
use crate::outcome::RankId;
use crate::report::{Now, Row};

/// How often the launcher refreshes the view, and asks the ranks while it is wanted.
pub(crate) const LIVE_EVERY: Duration = Duration::from_secs(1);

/// How long one [`LiveView::want`] keeps the ranks being asked: a page that polls every
/// second keeps it alive; a closed one stops the asking soon after.
const WANT_FOR: Duration = Duration::from_secs(5);

/// How long the view keeps a rank's calls after they ended (the page draws the last 10 s).
pub const CALLS_KEPT_FOR: Duration = Duration::from_secs(30);

/// The most calls the view keeps per rank: a rank that makes many a second shows its newest.
pub const CALLS_KEPT: usize = 2000;

/// A shared handle on a job's live state; clones see the same job.
#[derive(Clone, Debug, Default)]
pub struct LiveView(Arc<Mutex<Shared>>);

#[derive(Debug, Default)]
struct Shared {
    wanted_until: Option<Instant>,
    job: Option<String>,
    started: Option<Instant>,
    ended: bool,
    /// When the ranks last answered a round of asking.
    answered: Option<Instant>,
    ranks: Vec<LiveRank>,
    /// Each rank's recent calls, in the order they ended, and whether it records them.
    calls: Vec<RankCalls>,
}

#[derive(Debug, Default)]
struct RankCalls {
    recording: Option<bool>,
    calls: VecDeque<LiveCall>,
    left_out: u64,
}

/// What a viewer sees of the job at one moment.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LiveSnapshot {
    /// The job id (16 hex digits); `None` until the launcher has started it.
    pub job: Option<String>,
    /// Since the ranks were started.
    pub running_for: Duration,
    /// Every rank has ended (or the launcher is stopping them).
    pub ended: bool,
    /// How old the newest answers of the ranks are; `None` when they were never asked.
    pub answers_age: Option<Duration>,
    /// One entry per rank, in rank order.
    pub ranks: Vec<LiveRank>,
}

/// One rank in a [`LiveSnapshot`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LiveRank {
    /// Which rank, on which host, which process.
    pub id: RankId,
    /// Where it is.
    pub state: RankState,
    /// Its traffic when it last answered; `None` before it did, or from a rank that does not
    /// count.
    pub traffic: Option<LiveTraffic>,
}

/// A rank's traffic counters, as it last told them.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LiveTraffic {
    /// Messages and bytes sent and received since it started.
    pub total: Traffic,
    /// Bytes a second sent and received between its last two answers; `None` after one
    /// answer, and once it has finalized or ended.
    pub rates: Option<(f64, f64)>,
    /// When it said so, since the ranks were started.
    pub at: Duration,
}

/// One call of a rank in the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveCall {
    /// `send`, `recv`, `isend`, `wait`, `collective` or `region`.
    pub kind: String,
    /// A collective's or region's name; empty for the others.
    pub name: String,
    /// The peer's world rank, if the call had one.
    pub peer: Option<u32>,
    /// Bytes it moved.
    pub bytes: u64,
    /// When it began and ended, since the ranks were started (as the launcher's clock puts
    /// them: the rank's answer is taken to arrive as it is written).
    pub start: Duration,
    /// See `start`.
    pub end: Duration,
}

/// The ranks' recent calls, for a timeline.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LiveCalls {
    /// `Some(true)`: some rank records its calls (`--trace`); `Some(false)`: ranks were asked
    /// and none does; `None`: none has said yet.
    pub recording: Option<bool>,
    /// Since the ranks were started.
    pub now: Duration,
    /// Per rank, in rank order: its calls that ended in the window asked for, oldest first,
    /// and how many calls it left out of its answers so far (it made more between two
    /// answers than an answer carries).
    pub ranks: Vec<(usize, Vec<LiveCall>, u64)>,
}

/// Where a rank is, as far as the launcher knows.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RankState {
    /// Started, not yet connected to the key-value server (in `MPI_Init`, or a program that
    /// never calls it).
    Starting,
    /// Connected, and when last asked in no MPI wait (computing).
    Running,
    /// When last asked, in this MPI wait (the hang report's words: call, communicator, peer,
    /// tag, bytes) for this long.
    Waiting {
        /// Its oldest current wait.
        waited: Duration,
        /// What it waits in.
        call: String,
    },
    /// Asked, it did not answer within a second; `stopped`: its process is stopped.
    NoAnswer {
        /// `SIGSTOP` or a debugger holds it.
        stopped: bool,
    },
    /// It called `MPI_Finalize` and is leaving.
    Finalized,
    /// Its process ended with this exit code, or was killed by this signal.
    Exited {
        /// The exit code.
        code: Option<i32>,
        /// The signal that killed it.
        signal: Option<i32>,
    },
}

impl LiveView {
    /// A view of no job yet; give a clone to [`JobSpec::live`](crate::JobSpec::live).
    pub fn new() -> LiveView {
        LiveView::default()
    }

    /// A viewer looks: the ranks are asked where they wait about once a second for the next
    /// few seconds.
    pub fn want(&self) {
        self.lock().wanted_until = Some(Instant::now() + WANT_FOR);
    }

    /// The job as last seen.
    pub fn snapshot(&self) -> LiveSnapshot {
        let s = self.lock();
        LiveSnapshot {
            job: s.job.clone(),
            running_for: s.started.map(|t| t.elapsed()).unwrap_or_default(),
            ended: s.ended,
            answers_age: s.answered.map(|t| t.elapsed()),
            ranks: s.ranks.clone(),
        }
    }

    /// Each rank's calls that ended in the last `last`.
    pub fn calls(&self, last: Duration) -> LiveCalls {
        let s = self.lock();
        let now = s.started.map(|t| t.elapsed()).unwrap_or_default();
        let from = now.saturating_sub(last);
        let said: Vec<bool> = s.calls.iter().filter_map(|c| c.recording).collect();
        LiveCalls {
            recording: (!said.is_empty()).then(|| said.contains(&true)),
            now,
            ranks: (s.calls.iter().enumerate())
                .map(|(rank, c)| {
                    let recent = c.calls.iter().filter(|call| call.end >= from).cloned();
                    (rank, recent.collect(), c.left_out)
                })
                .collect(),
        }
    }

    pub(crate) fn wanted(&self) -> bool {
        self.lock().wanted_until.is_some_and(|t| t > Instant::now())
    }

    /// The ranks have been started.
    pub(crate) fn begin(&self, job: String, ids: &[RankId]) {
        let mut s = self.lock();
        s.job = Some(job);
        s.started = Some(Instant::now());
        s.ended = false;
        s.answered = None;
        s.ranks = ids
            .iter()
            .map(|id| LiveRank {
                id: id.clone(),
                state: RankState::Starting,
                traffic: None,
            })
            .collect();
        s.calls = ids.iter().map(|_| RankCalls::default()).collect();
    }

    /// What the launcher knows without asking: `known(rank)` is its exit status, whether it
    /// finalized, whether it connected. A rank's last answer stands until it ends or is asked
    /// again.
    pub(crate) fn refresh(&self, known: impl Fn(usize) -> (Option<ExitStatus>, bool, bool)) {
        use std::os::unix::process::ExitStatusExt;
        let mut s = self.lock();
        for r in &mut s.ranks {
            let (status, finalized, connected) = known(r.id.rank);
            r.state = match (status, &r.state) {
                (Some(st), _) => RankState::Exited {
                    code: st.code(),
                    signal: st.signal(),
                },
                (None, _) if finalized => RankState::Finalized,
                (None, RankState::Starting) if connected => RankState::Running,
                (None, other) => other.clone(),
            };
            if matches!(r.state, RankState::Exited { .. } | RankState::Finalized) {
                if let Some(t) = &mut r.traffic {
                    t.rates = None;
                }
            }
        }
    }

    /// What a rank's answer said besides where it waits: its counters and its calls since
    /// its previous answer (which arrived now).
    pub(crate) fn heard(&self, rank: usize, traffic: Option<Traffic>, calls: Option<RecentCalls>) {
        let mut s = self.lock();
        let Some(started) = s.started else {
            return;
        };
        let at = started.elapsed();
        if let (Some(total), Some(r)) = (traffic, s.ranks.get_mut(rank)) {
            let rates = r.traffic.and_then(|before| {
                let span = at.checked_sub(before.at)?.as_secs_f64();
                let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / span;
                (span > 0.0).then(|| {
                    (
                        per_s(total.sent_bytes, before.total.sent_bytes),
                        per_s(total.received_bytes, before.total.received_bytes),
                    )
                })
            });
            r.traffic = Some(LiveTraffic { total, rates, at });
        }
        if let (Some(said), Some(c)) = (calls, s.calls.get_mut(rank)) {
            c.add(said, at);
        }
    }

    /// A round of asking has ended with these rows.
    pub(crate) fn answered(&self, rows: &[Row]) {
        let mut s = self.lock();
        s.answered = Some(Instant::now());
        for row in rows {
            let Some(r) = s.ranks.get_mut(row.id.rank) else {
                continue;
            };
            if matches!(r.state, RankState::Exited { .. } | RankState::Finalized) {
                continue;
            }
            r.state = match &row.now {
                Now::Answered {
                    waited: Some(w),
                    text,
                } => RankState::Waiting {
                    waited: *w,
                    call: text.clone(),
                },
                Now::Answered { waited: None, .. } => RankState::Running,
                Now::NoAnswer { stopped } => RankState::NoAnswer { stopped: *stopped },
                Now::Finalized => RankState::Finalized,
                Now::Exited | Now::Starting => continue,
            };
        }
    }

    /// The job is over (or being stopped).
    pub(crate) fn end(&self) {
        self.lock().ended = true;
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // The state is replaced field by field; a panicking viewer leaves it consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RankCalls {
    /// Adds what a rank said at `at`, and forgets calls that ended [`CALLS_KEPT_FOR`]
    /// before, and the oldest past [`CALLS_KEPT`].
    fn add(&mut self, said: RecentCalls, at: Duration) {
        self.recording = Some(said.recording);
        self.left_out += said.left_out;
        // Newest first in the answer; kept in the order they ended.
        for call in said.calls.into_iter().rev() {
            let end = at.saturating_sub(call.ended_ago);
            self.calls.push_back(LiveCall {
                kind: call.kind,
                name: call.name,
                peer: call.peer,
                bytes: call.bytes,
                start: end.saturating_sub(call.took),
                end,
            });
        }
        let from = at.saturating_sub(CALLS_KEPT_FOR);
        while self
            .calls
            .front()
            .is_some_and(|c| c.end < from || self.calls.len() > CALLS_KEPT)
        {
            self.calls.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::CallSpan;
    use std::os::unix::process::ExitStatusExt;

    fn id(rank: usize) -> RankId {
        RankId {
            rank,
            pid: 1,
            host: "h".into(),
            by_hand: false,
        }
    }

    #[test]
    fn answers_stand_until_the_rank_ends_or_answers_again() {
        let view = LiveView::new();
        assert!(!view.wanted());
        view.want();
        assert!(view.wanted());
        view.begin("00ff".into(), &[id(0), id(1), id(2)]);
        view.refresh(|r| (None, false, r != 2));
        let states = |v: &LiveView| -> Vec<RankState> {
            v.snapshot().ranks.into_iter().map(|r| r.state).collect()
        };
        assert_eq!(
            states(&view),
            [RankState::Running, RankState::Running, RankState::Starting]
        );
        view.answered(&[Row {
            id: id(0),
            now: Now::Answered {
                waited: Some(Duration::from_secs(2)),
                text: "a receive from rank 1, tag 3".into(),
            },
        }]);
        view.refresh(|r| match r {
            1 => (Some(ExitStatus::from_raw(3 << 8)), false, true),
            2 => (None, true, true),
            _ => (None, false, true),
        });
        let s = view.snapshot();
        assert_eq!(s.job.as_deref(), Some("00ff"));
        assert!(s.answers_age.is_some());
        assert_eq!(
            states(&view),
            [
                RankState::Waiting {
                    waited: Duration::from_secs(2),
                    call: "a receive from rank 1, tag 3".into()
                },
                RankState::Exited {
                    code: Some(3),
                    signal: None
                },
                RankState::Finalized
            ]
        );
    }

    fn span(kind: &str, ago_ms: u64, took_ms: u64) -> CallSpan {
        CallSpan {
            kind: kind.into(),
            name: String::new(),
            peer: Some(1),
            bytes: 8,
            ended_ago: Duration::from_millis(ago_ms),
            took: Duration::from_millis(took_ms),
        }
    }

    #[test]
    fn counters_give_rates_between_answers() {
        let view = LiveView::new();
        view.begin("00ff".into(), &[id(0), id(1)]);
        let counted = |sent_bytes, received_bytes| Traffic {
            sent: 1,
            sent_bytes,
            received: 1,
            received_bytes,
        };
        view.heard(0, Some(counted(1000, 10)), None);
        let first = view.snapshot().ranks[0].traffic.unwrap();
        assert_eq!(first.total.sent_bytes, 1000);
        assert!(first.rates.is_none());
        std::thread::sleep(Duration::from_millis(20));
        view.heard(0, Some(counted(3000, 10)), None);
        let second = view.snapshot().ranks[0].traffic.unwrap();
        let (out, into) = second.rates.unwrap();
        let span = (second.at - first.at).as_secs_f64();
        assert!(
            (out - 2000.0 / span).abs() < 1e-6 * out,
            "{out} over {span} s"
        );
        assert_eq!(into, 0.0);
        // A rank without counters (another version) shows none.
        view.heard(1, None, None);
        assert!(view.snapshot().ranks[1].traffic.is_none());
        // Once it has finalized, a rank has totals and no rate.
        view.refresh(|r| (None, r == 0, true));
        let last = view.snapshot().ranks[0].traffic.unwrap();
        assert_eq!(last.total.sent_bytes, 3000);
        assert!(last.rates.is_none());
    }

    #[test]
    fn calls_are_kept_in_a_window_in_the_order_they_ended() {
        let view = LiveView::new();
        assert_eq!(view.calls(Duration::from_secs(10)).recording, None);
        view.begin("00ff".into(), &[id(0), id(1)]);
        // Calls are placed after the start of the job.
        std::thread::sleep(Duration::from_millis(60));
        view.heard(1, None, Some(RecentCalls::not_recording()));
        assert_eq!(view.calls(Duration::from_secs(10)).recording, Some(false));
        // Newest first, as a rank sends them.
        let said = RecentCalls::recorded(vec![span("recv", 5, 2), span("send", 40, 1)], 3);
        view.heard(0, None, Some(said));
        let c = view.calls(Duration::from_secs(10));
        assert_eq!(c.recording, Some(true));
        let (rank, calls, left_out) = &c.ranks[0];
        assert_eq!((*rank, *left_out), (0, 3));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].kind, "send");
        assert!(calls[0].end < calls[1].end);
        assert_eq!(calls[1].end - calls[1].start, Duration::from_millis(2));
        assert!(calls[1].end <= c.now);
        // Calls that ended before the window asked for are not shown...
        assert!(view.calls(Duration::ZERO).ranks[0].1.is_empty());

        // ...and those older than the window kept are forgotten, as are the oldest past
        // the count kept.
        let mut c = RankCalls::default();
        let at = Duration::from_secs(100);
        let old = CALLS_KEPT_FOR.as_millis() as u64 + 1000;
        let many = (0..CALLS_KEPT as u64 + 10)
            .map(|i| span("wait", i, 0))
            .collect();
        c.add(RecentCalls::recorded(vec![span("send", old, 1)], 0), at);
        assert_eq!(c.calls.len(), 0);
        c.add(RecentCalls::recorded(many, 0), at);
        assert_eq!(c.calls.len(), CALLS_KEPT);
        // The newest (ended 0 ms ago) is the last kept.
        assert_eq!(c.calls.back().map(|x| x.end), Some(at));
        assert_eq!(
            c.calls.front().map(|x| x.end),
            Some(at - Duration::from_millis(CALLS_KEPT as u64 - 1))
        );
    }
}
