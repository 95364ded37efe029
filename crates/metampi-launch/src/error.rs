//! Errors that stop a job before or while it starts.
//!
//! Once every rank is running, nothing is an `Err` any more: a rank that fails is part of the
//! [`JobOutcome`](crate::JobOutcome), because the job did run and the caller needs the statuses.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::host::HostSpecError;

/// Descriptors the launcher holds per rank (its output pipes, stdin and key-value connection;
/// counted in `bench/results/2026-11-29/strangers/launcher-fds.txt`).
pub const FDS_PER_RANK: u64 = 6;

/// Why a job could not be validated or started.
///
/// Every variant is found before any rank is spawned, except [`LaunchError::Spawn`] and
/// [`LaunchError::Io`], which are raised after the ranks already started have been killed and
/// reaped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// Even with the soft descriptor limit raised to the hard one, the launcher cannot hold
    /// what the job's ranks need.
    #[error(
        "{ranks} ranks need about {need} open descriptors in the launcher ({FDS_PER_RANK} each), \
         but its limit is {limit} even after raising the soft limit to the hard one: raise the \
         hard limit (ulimit -Hn, or the nofile entry of /etc/security/limits.conf) or start \
         fewer ranks here"
    )]
    TooFewDescriptors {
        /// Ranks in the job.
        ranks: usize,
        /// Descriptors they need.
        need: u64,
        /// The limit there is.
        limit: u64,
    },

    /// The spec names no application at all.
    #[error("nothing to run: the job has no application")]
    NoApps,

    /// An application asks for zero ranks.
    #[error("application {app} (`{program}`) asks for 0 ranks; -n must be at least 1")]
    ZeroRanks {
        /// Index of the application in MIMD order.
        app: usize,
        /// Its program, for the message.
        program: String,
    },

    /// A program that would be started on this machine is not in `PATH`.
    #[error("program `{program}` not found in PATH")]
    ProgramNotFound {
        /// The program as given.
        program: String,
    },

    /// A program that would be started on this machine exists but cannot be executed.
    #[error("`{program}` is not an executable file")]
    NotExecutable {
        /// The program as given.
        program: String,
    },

    /// A host list or hostfile entry is malformed.
    #[error(transparent)]
    HostSpec(#[from] HostSpecError),

    /// `--debug` names a rank the job does not have.
    #[error("debug rank {rank} is out of range: the job has {size} ranks (0..={last})", last = size - 1)]
    DebugRankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// World size.
        size: usize,
    },

    /// `--debug` names a rank that would be started on another machine.
    #[error(
        "cannot debug rank {rank}: it is placed on remote host `{host}`, \
         and --debug only works for ranks started on this machine"
    )]
    DebugRemoteRank {
        /// The offending rank.
        rank: usize,
        /// Where it is placed.
        host: String,
    },

    /// `--debug` was asked for but `gdbserver` is not installed.
    #[error("--debug needs `gdbserver`, which was not found in PATH; install gdbserver (often packaged with gdb)")]
    GdbserverMissing,

    /// `--stdin N` names a rank the job does not have.
    #[error("stdin rank {rank} is out of range: the job has {size} ranks (0..={last})", last = size - 1)]
    StdinRankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// World size.
        size: usize,
    },

    /// `-x VAR` names a variable that is not set in the launcher's environment.
    #[error(
        "-x {name}: environment variable `{name}` is not set here, so there is no value to pass on"
    )]
    EnvNotSet {
        /// The variable name.
        name: String,
    },

    /// An environment variable name that a shell or `env` would misread.
    #[error("invalid environment variable name `{name}`: use letters, digits and `_`, not starting with a digit")]
    BadEnvName {
        /// The name as given.
        name: String,
    },

    /// The user tried to set one of the variables the launcher owns.
    #[error("`{name}` is set by the launcher for every rank and cannot be overridden")]
    ReservedEnvName {
        /// The name as given.
        name: String,
    },

    /// A `--launch` template is unusable.
    #[error("bad launch template `{template}`: {reason}")]
    BadTemplate {
        /// The template as given.
        template: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A timeout of zero would kill the job before it starts.
    #[error("the timeout must be longer than zero")]
    ZeroTimeout,

    /// The output directory could not be created or written.
    #[error("cannot use output directory `{}`: {source}", path.display())]
    OutputDir {
        /// The directory.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },

    /// The key-value (PMI) server could not be started.
    #[error("cannot start the key-value server: {0}")]
    Pmi(#[source] io::Error),

    /// A rank could not be spawned; ranks already started have been killed.
    #[error("cannot start rank {rank} (`{program}`) on {host}: {source}")]
    Spawn {
        /// The rank that failed to start.
        rank: usize,
        /// The program actually executed (for remote ranks, the launch command).
        program: String,
        /// Where it was to run.
        host: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },

    /// Any other operating-system failure while setting up the job.
    #[error("{what}: {source}")]
    Io {
        /// What the launcher was doing.
        what: &'static str,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
}
