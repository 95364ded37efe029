//! Job launching for metampi: the part of `metampi run` (ScaMPI's mpimon, MPICH's mpiexec)
//! that is a library, so the rank-side test helpers can start multi-rank jobs in-process.
//!
//! A job is described by a [`JobSpec`] (one or more MIMD [`AppSpec`]s, hosts, environment,
//! output and stdin handling, timeout, debugging) and started with [`run`], which blocks until
//! every rank has ended and returns a [`JobOutcome`].
//!
//! # What a rank gets
//! Each rank runs in its own process group with these variables, the contract with the
//! rank-side library (typed in [`contract`], which launchers write and ranks parse):
//!
//! | variable | value |
//! |---|---|
//! | `METAMPI_PMI` | `host:port` of the job's key-value server ([`PmiServer`]); `127.0.0.1:PORT` for ranks on this machine |
//! | `METAMPI_JOB` | the job id, 16 hex digits, random per job |
//! | `METAMPI_RANK`, `METAMPI_SIZE` | global rank and world size |
//! | `METAMPI_APPNUM` | index of the rank's MIMD application |
//! | `METAMPI_NODE` | host the rank is placed on; equal values share a machine |
//! | `METAMPI_LOCAL_RANK`, `METAMPI_LOCAL_SIZE` | index and count among ranks with the same node |
//! | `METAMPI_TAG_OUTPUT` | `1` with [`JobSpec::tag_output`] (a rank labels its spawned processes' lines too) |
//! | `METAMPI_OUTPUT_DIR`, `METAMPI_OUTPUT_NAME` | with [`OutputMode::Directory`]: the directory (absolute) and `rank.R`, the stem of the rank's files there (a rank's spawned processes get files of their own) |
//!
//! Ranks are numbered app after app; placement fills each host's slots in order, then wraps
//! round-robin ([`place`]). The key-value protocol is described in [`pmi`].
//!
//! # Ranks started by other process managers
//! A rank that MPICH's `mpiexec` (Hydra) or Slurm's `srun --mpi=pmi2` started has no
//! `METAMPI_PMI`; it speaks their PMI-1 or PMI-2 instead, through [`pmi_wire`], and builds a
//! one-site contract ([`contract::Contract::under_process_manager`]) from what they say.
//!
//! # Ranks on other machines
//! Ranks on other hosts start through ssh or a command template ([`LaunchMethod`], or per
//! host with [`Host::with_launch`] and a [`HostLaunch`]), carrying their environment on the
//! command line and the job secret on the first line of their stdin; they are stopped when that
//! stdin closes (see [`HostLaunch`] and [`spawn_remote`]), also a rank that reads the
//! launcher's stdin, which comes framed so that the end of the data is not the end of the
//! connection. A host whose ranks are started by hand gets one printed command
//! ([`manual_command`]), which also starts the host's helpers (a meta job's routers there; a
//! host may have helpers and no ranks); the launcher waits for its ranks and helpers to
//! connect ([`JobSpec::join_timeout`]), learns that they ended from their key-value
//! connections, and tells the helpers when the job is over (see [`pmi`]).
//!
//! # Failure handling
//! The first rank to exit non-zero, die by a signal, `ABORT`, or exit 0 after connecting to
//! the key-value server but without `FINALIZE` ends the job, as does the end of any other
//! process the caller asked the launcher to watch ([`JobSpec::watch`]: a meta job's routers); so do the timeout and
//! SIGINT/SIGTERM/SIGHUP to the launcher. One line names the cause on stderr, the other ranks
//! get SIGTERM, then SIGKILL after two seconds, and everything is reaped.
//! [`JobOutcome::exit_code`] gives the launcher's exit status.
//!
//! # Example
//! ```
//! use metampi_launch::{run, AppSpec, JobSpec, OutputMode, StdinTarget};
//!
//! let spec = JobSpec::new()
//!     .app(AppSpec::new(3, "/bin/sh").args(["-c", "echo rank $METAMPI_RANK of $METAMPI_SIZE"]))
//!     .stdin(StdinTarget::None)
//!     .tag_output(true)
//!     .output(OutputMode::Capture);
//! let outcome = run(&spec)?;
//! assert!(outcome.success());
//! let mut lines: Vec<_> = outcome.stdout_text().lines().map(String::from).collect();
//! lines.sort();
//! assert_eq!(lines, ["[0] rank 0 of 3", "[1] rank 1 of 3", "[2] rank 2 of 3"]);
//! # Ok::<(), metampi_launch::LaunchError>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod answer;
pub mod auth;
mod bind;
mod command;
pub mod contract;
mod error;
mod host;
mod job;
mod live;
pub mod meta;
mod outcome;
pub mod pmi;
pub mod pmi_wire;
pub mod ports;
mod remote;
mod report;
pub mod router_spec;
pub mod slurm;
mod spec;
mod stdio;
mod sys;

pub use answer::{Answer, Ask, CallSpan, RecentCalls, Traffic};
pub use bind::{Binding, BIND_ENV};
pub use error::LaunchError;
pub use host::{place, Host, HostSpecError, HostSpecErrorKind, Placement};
pub use job::{run, KILL_GRACE};
pub use live::{
    LiveCall, LiveCalls, LiveRank, LiveSnapshot, LiveTraffic, LiveView, RankState, CALLS_KEPT,
    CALLS_KEPT_FOR,
};
pub use outcome::{
    describe_signal, signal_name, HelperId, JobFailure, JobOutcome, RankId, RankResult,
    TIMEOUT_EXIT_CODE,
};
pub use pmi::{
    JobId, JobKey, PmiClient, PmiClientError, PmiEvent, PmiServer, ProtocolError, RankPmiState,
    ReportFn, Request, HELPER_ENV, MAX_LINE,
};
pub use remote::{manual_command, spawn_remote, HostLaunch, ManualProcess, SecretSource};
pub use spec::{
    AppSpec, JobSpec, LaunchMethod, OutputMode, ReportAddition, StdinTarget, DEFAULT_JOIN_TIMEOUT,
    RESERVED_ENV,
};
pub use stdio::{forward_lines, OUTPUT_DIR_ENV, OUTPUT_NAME_ENV, TAG_OUTPUT_ENV};
pub use sys::affinity;
