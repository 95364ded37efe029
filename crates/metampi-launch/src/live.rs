//! A live view of a running job: where each rank is, kept up to date while someone looks.
//!
//! The launcher owns the ranks' key-value connections, so only it can ask them where they
//! wait. A [`LiveView`] given to [`JobSpec::live`] is its window: the launcher records in it
//! what it learns for free (a rank connected, finalized, exited) about once a second, and,
//! while a viewer has called [`LiveView::want`] in the last few seconds, asks every rank
//! where it waits (the hang report's `REPORT`, see [`crate::pmi`]) about once a second too.
//! A job nobody looks at is not asked anything. `metampi run --web` serves it over HTTP.
//!
//! [`JobSpec::live`]: crate::JobSpec::live

use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::outcome::RankId;
use crate::report::{Now, Row};

/// How often the launcher refreshes the view, and asks the ranks while it is wanted.
pub(crate) const LIVE_EVERY: Duration = Duration::from_secs(1);

/// How long one [`LiveView::want`] keeps the ranks being asked: a page that polls every
/// second keeps it alive; a closed one stops the asking soon after.
const WANT_FOR: Duration = Duration::from_secs(5);

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
            })
            .collect();
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
