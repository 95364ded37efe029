//! What a finished job reports: per-rank statuses and the first failure.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use crate::pmi::JobId;

/// Exit code of a launcher whose job hit its timeout, as `timeout(1)` uses.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// The result of a job that started: it may still have failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobOutcome {
    /// The job's id (`METAMPI_JOB`).
    pub job: JobId,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankResult>,
    /// The first failure, which made the launcher stop the job; `None` if every rank exited 0
    /// (after `FINALIZE`, for ranks that connected to the key-value server).
    pub failure: Option<JobFailure>,
    /// Forwarded stdout, only with [`OutputMode::Capture`](crate::OutputMode::Capture).
    pub stdout: Vec<u8>,
    /// Forwarded stderr, only with [`OutputMode::Capture`](crate::OutputMode::Capture).
    pub stderr: Vec<u8>,
}

impl JobOutcome {
    /// No failure.
    pub fn success(&self) -> bool {
        self.failure.is_none()
    }

    /// The exit status a launcher process should end with: 0 on success, otherwise as
    /// [`JobFailure::exit_code`]. Always in `0..=255`.
    pub fn exit_code(&self) -> i32 {
        self.failure.as_ref().map_or(0, JobFailure::exit_code)
    }

    /// Captured stdout as text (lossy), for tests.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Captured stderr as text (lossy), for tests.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankResult {
    /// Who it was.
    pub id: RankId,
    /// Its wait status; ranks killed during cleanup show the signal that ended them. `None`
    /// for a rank started by hand (the launcher has no process to wait for) and if the status
    /// could not be collected (something else in this process reaped it).
    pub status: Option<ExitStatus>,
}

/// Identifies a rank in messages: rank, pid and host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankId {
    /// Global rank.
    pub rank: usize,
    /// Pid of the process the launcher started (ssh for remote ranks, gdbserver for debugged
    /// ones); 0 for a rank started by hand.
    pub pid: u32,
    /// `METAMPI_NODE` of the rank.
    pub host: String,
    /// The user started it with a printed command; the launcher has no process for it.
    pub by_hand: bool,
}

impl fmt::Display for RankId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.by_hand {
            write!(f, "rank {} (started by hand on {})", self.rank, self.host)
        } else {
            write!(f, "rank {} (pid {} on {})", self.rank, self.pid, self.host)
        }
    }
}

/// Identifies in messages a helper that the user starts by hand next to the ranks (a router
/// of a meta job), see [`HostLaunch::Manual`](crate::HostLaunch::Manual).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HelperId {
    /// Its index among the job's helpers (its `METAMPI_HELPER`).
    pub index: usize,
    /// What it is (`router 4`), as the caller named it.
    pub name: String,
    /// The host it runs on.
    pub host: String,
}

impl fmt::Display for HelperId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (started by hand on {})", self.name, self.host)
    }
}

/// Why a job was stopped. `Display` gives the one-line message the launcher prints.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobFailure {
    /// A rank exited with a non-zero code.
    Exited {
        /// Who.
        rank: RankId,
        /// Its exit code.
        code: i32,
    },
    /// A rank was killed by a signal it did not get from the launcher.
    Signaled {
        /// Who.
        rank: RankId,
        /// The signal number.
        signal: i32,
    },
    /// A rank sent `ABORT`.
    Aborted {
        /// Who.
        rank: RankId,
        /// The code it asked for.
        code: i32,
        /// Its message.
        message: String,
    },
    /// A rank connected to the key-value server, then exited 0 without `FINALIZE`: it left
    /// the job without saying so, and its peers may be waiting for it.
    NoFinalize {
        /// Who.
        rank: RankId,
    },
    /// The launcher could not collect a rank's exit status.
    Lost {
        /// Who.
        rank: RankId,
        /// The `waitpid` error.
        reason: String,
    },
    /// Ranks or helpers started by hand did not connect to the launcher within the join
    /// timeout.
    NotJoined {
        /// The ranks that did not, in rank order.
        ranks: Vec<RankId>,
        /// The helpers that did not, by index.
        helpers: Vec<HelperId>,
        /// The join timeout.
        after: Duration,
    },
    /// A helper started by hand closed its connection to the launcher while the ranks ran:
    /// it ended, was stopped, or its machine lost the network.
    HelperLeft {
        /// Who.
        helper: HelperId,
    },
    /// A process of the job that is not a rank (a meta job's router, see
    /// [`JobSpec::watch`](crate::JobSpec::watch)) ended while the ranks ran.
    ProcessEnded {
        /// What it is ("router 1 of meta host `b` on node b0").
        what: String,
        /// Its pid (for a process on another machine: of its ssh or srun).
        pid: u32,
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// The signal that killed it, when one did.
        signal: Option<i32>,
    },
    /// A rank started by hand closed its connection to the launcher without `FINALIZE`: it
    /// crashed, was killed, or its machine lost the network. (The launcher cannot tell which:
    /// it has no process to wait for.)
    Vanished {
        /// Who.
        rank: RankId,
    },
    /// Nothing in the job moved for its stall timeout
    /// ([`JobSpec::stall_timeout`](crate::JobSpec::stall_timeout)).
    Stalled {
        /// The stall timeout.
        after: Duration,
        /// The hang report: a line per rank, saying where it waits.
        report: String,
    },
    /// The job ran longer than its timeout.
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The launcher received a signal and stopped the job.
    Interrupted {
        /// The signal number.
        signal: i32,
    },
    /// The reader of the launcher's stdout went (`metampi run ... | head`), and the
    /// launcher stopped the job as a pipeline's program stops at `SIGPIPE`.
    OutputClosed,
}

impl JobFailure {
    /// The rank at fault, if one is.
    pub fn rank(&self) -> Option<&RankId> {
        match self {
            JobFailure::Exited { rank, .. }
            | JobFailure::Signaled { rank, .. }
            | JobFailure::Aborted { rank, .. }
            | JobFailure::NoFinalize { rank }
            | JobFailure::Vanished { rank }
            | JobFailure::Lost { rank, .. } => Some(rank),
            JobFailure::NotJoined { ranks, .. } => ranks.first(),
            JobFailure::Timeout { .. }
            | JobFailure::Stalled { .. }
            | JobFailure::Interrupted { .. }
            | JobFailure::OutputClosed
            | JobFailure::ProcessEnded { .. }
            | JobFailure::HelperLeft { .. } => None,
        }
    }

    /// The launcher's exit status for this failure: the rank's own code; 128 + signal for a
    /// signal, as shells report it; the abort code (1 if it was 0, low 8 bits otherwise);
    /// 124 for a timeout, also for ranks or helpers started by hand that never joined; 1 for a
    /// rank that skipped `FINALIZE`, vanished or was lost, and for a helper that left.
    pub fn exit_code(&self) -> i32 {
        let low_byte_nonzero = |code: i32| match code & 0xff {
            0 => 1,
            c => c,
        };
        match self {
            JobFailure::Exited { code, .. } => low_byte_nonzero(*code),
            JobFailure::Signaled { signal, .. } | JobFailure::Interrupted { signal } => {
                (128 + signal).min(255)
            }
            JobFailure::Aborted { code, .. } => low_byte_nonzero(*code),
            JobFailure::NoFinalize { .. }
            | JobFailure::Lost { .. }
            | JobFailure::Vanished { .. }
            | JobFailure::HelperLeft { .. }
            | JobFailure::ProcessEnded { .. } => 1,
            JobFailure::Timeout { .. }
            | JobFailure::Stalled { .. }
            | JobFailure::NotJoined { .. } => TIMEOUT_EXIT_CODE,
            JobFailure::OutputClosed => 128 + libc::SIGPIPE,
        }
    }

    /// Classifies a wait status; `None` for success.
    pub(crate) fn from_status(rank: RankId, status: ExitStatus) -> Option<JobFailure> {
        if let Some(signal) = status.signal() {
            return Some(JobFailure::Signaled { rank, signal });
        }
        match status.code() {
            Some(0) => None,
            Some(code) => Some(JobFailure::Exited { rank, code }),
            // Neither code nor signal: stopped/continued, which wait() does not report.
            None => Some(JobFailure::Exited { rank, code: 1 }),
        }
    }
}

impl fmt::Display for JobFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobFailure::Exited { rank, code } => write!(f, "{rank} exited with code {code}"),
            JobFailure::Signaled { rank, signal } => {
                write!(f, "{rank} was killed by signal {}", describe_signal(*signal))
            }
            JobFailure::Aborted {
                rank,
                code,
                message,
            } => write!(f, "{rank} called abort with code {code}: {message}"),
            JobFailure::NoFinalize { rank } => write!(
                f,
                "{rank} exited with code 0 without calling finalize; the job cannot complete without it"
            ),
            JobFailure::Lost { rank, reason } => {
                write!(f, "{rank} could not be waited for: {reason}")
            }
            JobFailure::Vanished { rank } => write!(
                f,
                "{rank} closed its connection to the launcher without calling finalize \
                 (it crashed, was killed, or its machine lost the network)"
            ),
            JobFailure::NotJoined {
                ranks,
                helpers,
                after,
            } => {
                let mut nodes: Vec<&str> = ranks.iter().map(|r| r.host.as_str()).collect();
                for h in helpers {
                    if !nodes.contains(&h.host.as_str()) {
                        nodes.push(&h.host);
                    }
                }
                nodes.dedup();
                let numbers: Vec<String> = ranks.iter().map(|r| r.rank.to_string()).collect();
                let mut who = Vec::new();
                if !ranks.is_empty() {
                    let ranks = if ranks.len() == 1 { "rank" } else { "ranks" };
                    who.push(format!("{ranks} {}", numbers.join(", ")));
                }
                if !helpers.is_empty() {
                    let names: Vec<&str> = helpers.iter().map(|h| h.name.as_str()).collect();
                    who.push(names.join(", "));
                }
                let (command, machine) = if nodes.len() == 1 {
                    ("command", "that machine")
                } else {
                    ("commands", "those machines")
                };
                write!(
                    f,
                    "{} (started by hand on {nodes}) did not join within {}: run the {command} \
                     printed for {nodes} on {machine}, and check that it can reach this one \
                     (--pmi-host) and find its program; stopping the job",
                    who.join(" and "),
                    describe_duration(*after),
                    nodes = nodes.join(", "),
                )
            }
            JobFailure::ProcessEnded {
                what,
                pid,
                code,
                signal,
            } => {
                write!(f, "{what} (pid {pid}) ")?;
                match (code, signal) {
                    (_, Some(s)) => write!(f, "was killed by signal {}", describe_signal(*s))?,
                    (Some(c), None) => write!(f, "exited with code {c}")?,
                    (None, None) => f.write_str("ended")?,
                }
                f.write_str(" while the job ran; stopping the job")
            }
            JobFailure::HelperLeft { helper } => write!(
                f,
                "{helper} closed its connection to the launcher while the job ran (it ended, \
                 was stopped, or its machine lost the network); stopping the job"
            ),
            JobFailure::Stalled { after, report } => write!(
                f,
                "nothing in the job moved for {} (stall timeout); where each rank is:\n{report}\n\
                 stopping all ranks",
                describe_duration(*after)
            ),
            JobFailure::Timeout { after } => write!(
                f,
                "job timed out after {}; killing all ranks",
                describe_duration(*after)
            ),
            JobFailure::Interrupted { signal } => write!(
                f,
                "received {}; stopping all ranks",
                describe_signal(*signal)
            ),
            JobFailure::OutputClosed => write!(
                f,
                "its standard output was closed (the reading end of a pipe ended); stopping \
                 all ranks"
            ),
        }
    }
}

/// `SIGKILL (9)`, or `signal 42` for numbers without a name.
pub fn describe_signal(signal: i32) -> String {
    match signal_name(signal) {
        Some(name) => format!("{name} ({signal})"),
        None => format!("{signal}"),
    }
}

/// The conventional name of a signal number on this platform.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: &[(i32, &str)] = &[
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGCHLD, "SIGCHLD"),
        (libc::SIGCONT, "SIGCONT"),
        (libc::SIGSTOP, "SIGSTOP"),
        (libc::SIGTSTP, "SIGTSTP"),
        (libc::SIGTTIN, "SIGTTIN"),
        (libc::SIGTTOU, "SIGTTOU"),
        (libc::SIGURG, "SIGURG"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGVTALRM, "SIGVTALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGWINCH, "SIGWINCH"),
        (libc::SIGIO, "SIGIO"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == signal)
        .map(|(_, name)| *name)
}

fn describe_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.3} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> RankId {
        RankId {
            rank: 2,
            pid: 1234,
            host: "hostA".into(),
            by_hand: false,
        }
    }

    fn by_hand(rank: usize, host: &str) -> RankId {
        RankId {
            rank,
            pid: 0,
            host: host.into(),
            by_hand: true,
        }
    }

    #[test]
    fn ranks_started_by_hand_are_named_by_machine() {
        let f = JobFailure::NotJoined {
            ranks: vec![
                by_hand(3, "gamma.g0"),
                by_hand(4, "gamma.g0"),
                by_hand(6, "gamma.g1"),
            ],
            helpers: Vec::new(),
            after: Duration::from_secs(30),
        };
        assert_eq!(
            f.to_string(),
            "ranks 3, 4, 6 (started by hand on gamma.g0, gamma.g1) did not join within 30 s: \
             run the commands printed for gamma.g0, gamma.g1 on those machines, and check that \
             it can reach this one (--pmi-host) and find its program; stopping the job"
        );
        assert_eq!(f.exit_code(), TIMEOUT_EXIT_CODE);
        assert_eq!(f.rank().map(|r| r.rank), Some(3));
        let f = JobFailure::Vanished {
            rank: by_hand(5, "delta.d0"),
        };
        assert_eq!(
            f.to_string(),
            "rank 5 (started by hand on delta.d0) closed its connection to the launcher \
             without calling finalize (it crashed, was killed, or its machine lost the network)"
        );
        assert_eq!(f.exit_code(), 1);
    }

    #[test]
    fn helpers_started_by_hand_are_named_with_the_ranks() {
        let helper = |index: usize, host: &str| HelperId {
            index,
            name: format!("router {}", index + 7),
            host: host.into(),
        };
        let f = JobFailure::NotJoined {
            ranks: vec![by_hand(3, "gamma.g0")],
            helpers: vec![helper(0, "gamma.g1"), helper(1, "gamma.g0")],
            after: Duration::from_secs(30),
        };
        assert_eq!(
            f.to_string(),
            "rank 3 and router 7, router 8 (started by hand on gamma.g0, gamma.g1) did not \
             join within 30 s: run the commands printed for gamma.g0, gamma.g1 on those \
             machines, and check that it can reach this one (--pmi-host) and find its program; \
             stopping the job"
        );
        let f = JobFailure::NotJoined {
            ranks: Vec::new(),
            helpers: vec![helper(0, "gamma.g1")],
            after: Duration::from_secs(2),
        };
        assert_eq!(
            f.to_string(),
            "router 7 (started by hand on gamma.g1) did not join within 2 s: run the command \
             printed for gamma.g1 on that machine, and check that it can reach this one \
             (--pmi-host) and find its program; stopping the job"
        );
        assert_eq!(f.exit_code(), TIMEOUT_EXIT_CODE);
        assert_eq!(f.rank(), None);
        let f = JobFailure::HelperLeft {
            helper: helper(1, "gamma.g0"),
        };
        assert_eq!(
            f.to_string(),
            "router 8 (started by hand on gamma.g0) closed its connection to the launcher while \
             the job ran (it ended, was stopped, or its machine lost the network); stopping the \
             job"
        );
        assert_eq!(f.exit_code(), 1);
    }

    #[test]
    fn messages_name_rank_pid_host_and_cause() {
        let f = JobFailure::Signaled {
            rank: id(),
            signal: libc::SIGKILL,
        };
        assert_eq!(
            f.to_string(),
            "rank 2 (pid 1234 on hostA) was killed by signal SIGKILL (9)"
        );
        let f = JobFailure::Exited {
            rank: id(),
            code: 3,
        };
        assert_eq!(
            f.to_string(),
            "rank 2 (pid 1234 on hostA) exited with code 3"
        );
        let f = JobFailure::Aborted {
            rank: id(),
            code: 5,
            message: "no input".into(),
        };
        assert_eq!(
            f.to_string(),
            "rank 2 (pid 1234 on hostA) called abort with code 5: no input"
        );
        assert_eq!(describe_signal(63), "63");
        assert_eq!(
            JobFailure::Timeout {
                after: Duration::from_millis(1500)
            }
            .to_string(),
            "job timed out after 1.500 s; killing all ranks"
        );
    }

    #[test]
    fn exit_codes() {
        let code = |f: JobFailure| f.exit_code();
        assert_eq!(
            code(JobFailure::Exited {
                rank: id(),
                code: 3
            }),
            3
        );
        assert_eq!(
            code(JobFailure::Signaled {
                rank: id(),
                signal: 9
            }),
            137
        );
        assert_eq!(
            code(JobFailure::Aborted {
                rank: id(),
                code: 0,
                message: String::new()
            }),
            1
        );
        assert_eq!(
            code(JobFailure::Aborted {
                rank: id(),
                code: 7,
                message: String::new()
            }),
            7
        );
        assert_eq!(
            code(JobFailure::Aborted {
                rank: id(),
                code: 256,
                message: String::new()
            }),
            1
        );
        assert_eq!(
            code(JobFailure::Aborted {
                rank: id(),
                code: -1,
                message: String::new()
            }),
            255
        );
        assert_eq!(
            code(JobFailure::Timeout {
                after: Duration::from_secs(1)
            }),
            124
        );
        assert_eq!(
            code(JobFailure::Interrupted {
                signal: libc::SIGINT
            }),
            130
        );
        assert_eq!(code(JobFailure::NoFinalize { rank: id() }), 1);
    }

    #[test]
    fn statuses_classify() {
        assert_eq!(JobFailure::from_status(id(), ExitStatus::from_raw(0)), None);
        assert_eq!(
            JobFailure::from_status(id(), ExitStatus::from_raw(3 << 8)),
            Some(JobFailure::Exited {
                rank: id(),
                code: 3
            })
        );
        assert_eq!(
            JobFailure::from_status(id(), ExitStatus::from_raw(libc::SIGSEGV)),
            Some(JobFailure::Signaled {
                rank: id(),
                signal: libc::SIGSEGV
            })
        );
    }
}
