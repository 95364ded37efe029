//! The hang report: what every rank of a running job waits in, gathered over the ranks'
//! key-value connections (`REPORT` and `STATE`, see [`crate::pmi`]). The launcher prints it
//! when it receives `SIGUSR1`, and with a stall timeout ([`JobSpec::stall_timeout`]) it asks
//! for it now and then and ends a job in which nothing has moved for that long, with the
//! report as the reason.
//!
//! [`JobSpec::stall_timeout`]: crate::JobSpec::stall_timeout

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::outcome::RankId;

/// How long ranks have to answer: a rank's report thread answers within milliseconds, so one
/// that has not answered by then is stopped, or its process is wedged.
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Why the launcher asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// `SIGUSR1`: print it, the job goes on.
    Asked,
    /// The stall timeout's periodic look.
    Stall,
    /// A viewer of the live view looks ([`crate::LiveView::want`]).
    Live,
}

/// One round of asking: who owes an answer, and the answers so far.
#[derive(Debug)]
pub(crate) struct Gathering {
    pub why: Why,
    /// When the ranks that have not answered are reported as not answering.
    pub until: Instant,
    owing: Vec<usize>,
    answers: BTreeMap<usize, (Option<Duration>, String)>,
}

impl Gathering {
    pub(crate) fn new(why: Why, owing: Vec<usize>) -> Gathering {
        Gathering {
            why,
            until: Instant::now() + ANSWER_WAIT,
            owing,
            answers: BTreeMap::new(),
        }
    }

    pub(crate) fn answer(&mut self, rank: usize, waited: Option<Duration>, text: String) {
        self.answers.insert(rank, (waited, text));
    }

    /// Every rank asked has answered.
    pub(crate) fn complete(&self) -> bool {
        self.owing.iter().all(|r| self.answers.contains_key(r))
    }

    /// Each rank's line of the report, from what was gathered and what the launcher knows.
    pub(crate) fn rows(&self, ranks: &[RankId], known: impl Fn(usize) -> Known) -> Vec<Row> {
        ranks
            .iter()
            .map(|id| {
                let now = match known(id.rank) {
                    Known::Exited => Now::Exited,
                    Known::Finalized => Now::Finalized,
                    Known::Running => match self.answers.get(&id.rank) {
                        Some((waited, text)) => Now::Answered {
                            waited: *waited,
                            text: text.clone(),
                        },
                        None if self.owing.contains(&id.rank) => Now::NoAnswer {
                            stopped: !id.by_hand && process_stopped(id.pid),
                        },
                        None => Now::Starting,
                    },
                };
                Row {
                    id: id.clone(),
                    now,
                }
            })
            .collect()
    }
}

/// What the launcher itself knows of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    Exited,
    Finalized,
    Running,
}

/// Where a rank is, as far as the report can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Now {
    Exited,
    Finalized,
    /// It answered: its oldest current wait and what it waits in (`None`: it is not in a wait).
    Answered {
        waited: Option<Duration>,
        text: String,
    },
    /// Asked, it did not answer in time; `stopped`: its process is stopped (`SIGSTOP`).
    NoAnswer {
        stopped: bool,
    },
    /// It has not finished start-up, so it cannot be asked yet.
    Starting,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub id: RankId,
    pub now: Now,
}

/// Nothing moves: at least one rank has waited `limit` or longer in one wait, and every other
/// rank that still runs has too, or does not answer. A rank that answers and is in no wait
/// (it computes) keeps the job alive, as does one whose wait is younger than `limit`, and one
/// still in start-up (slow, not known to hang: a verdict waits for it).
pub(crate) fn stalled(rows: &[Row], limit: Duration) -> bool {
    let long = |now: &Now| matches!(now, Now::Answered { waited: Some(w), .. } if *w >= limit);
    rows.iter().any(|r| long(&r.now))
        && rows.iter().all(|r| {
            long(&r.now) || matches!(r.now, Now::Exited | Now::Finalized | Now::NoAnswer { .. })
        })
}

/// The report, one line per rank, each indented by two spaces.
pub(crate) fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let _ = write!(out, "  {}: ", r.id);
        let _ = match &r.now {
            Now::Exited => out.write_str("exited"),
            Now::Finalized => out.write_str("finalized, leaving"),
            Now::Answered {
                waited: Some(w),
                text,
            } => write!(out, "waits {} in {text}", seconds(*w)),
            Now::Answered { waited: None, .. } => out.write_str("running, in no MPI wait"),
            Now::NoAnswer { stopped: true } => {
                out.write_str("does not answer: its process is stopped (SIGSTOP or a debugger)")
            }
            Now::NoAnswer { stopped: false } => {
                out.write_str(&format!("does not answer within {}", seconds(ANSWER_WAIT)))
            }
            Now::Starting => out.write_str("has not finished start-up (MPI_Init)"),
        };
        out.push('\n');
    }
    out.pop();
    out
}

/// `d` in seconds with one decimal, as the report shows times.
fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Whether process `pid` on this machine is stopped (state `T` or `t` in `/proc/PID/stat`);
/// false where that cannot be read (another machine's process, no procfs).
fn process_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "T" || state == "t")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(rank: usize) -> RankId {
        RankId {
            rank,
            pid: u32::MAX,
            host: "h".into(),
            by_hand: false,
        }
    }

    fn answered(rank: usize, ms: Option<u64>) -> Row {
        Row {
            id: id(rank),
            now: Now::Answered {
                waited: ms.map(Duration::from_millis),
                text: "barrier on MPI_COMM_WORLD".into(),
            },
        }
    }

    #[test]
    fn a_job_is_stalled_only_when_nothing_in_it_moves() {
        let limit = Duration::from_secs(5);
        let no_answer = Row {
            id: id(2),
            now: Now::NoAnswer { stopped: true },
        };
        // Two ranks long in a wait, one stopped: stalled.
        let rows = [
            answered(0, Some(6000)),
            answered(1, Some(5000)),
            no_answer.clone(),
        ];
        assert!(stalled(&rows, limit));
        // One of them computes, or has waited less than the limit: not stalled.
        assert!(!stalled(
            &[
                answered(0, Some(6000)),
                answered(1, None),
                no_answer.clone()
            ],
            limit
        ));
        assert!(!stalled(
            &[answered(0, Some(6000)), answered(1, Some(4999))],
            limit
        ));
        // Nobody answered at all: no evidence of a wait, so no verdict.
        assert!(!stalled(&[no_answer], limit));
        // A rank still starting holds the verdict back.
        let starting = Row {
            id: id(1),
            now: Now::Starting,
        };
        assert!(!stalled(&[answered(0, Some(6000)), starting], limit));
    }

    #[test]
    fn the_table_names_every_rank_and_where_it_is() {
        let rows = [
            answered(0, Some(6500)),
            Row {
                id: id(1),
                now: Now::NoAnswer { stopped: true },
            },
            answered(2, None),
            Row {
                id: id(3),
                now: Now::Finalized,
            },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[0].starts_with("  rank 0 (") && lines[0].contains("waits 6.5 s in barrier"),
            "{t}"
        );
        assert!(lines[1].contains("process is stopped"), "{t}");
        assert!(lines[2].contains("in no MPI wait"), "{t}");
        assert!(lines[3].contains("finalized"), "{t}");
    }

    #[test]
    fn a_stopped_process_is_seen_as_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!process_stopped(pid));
        let stop = std::process::Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(stop.success());
        let stopped = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            process_stopped(pid)
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(stopped);
        assert!(!process_stopped(u32::MAX));
    }
}
