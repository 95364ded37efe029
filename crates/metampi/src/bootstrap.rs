//! A rank's side of the job's key-value exchange, with the errors the engine's start-up
//! reports: the client of `metampi run`'s server ([`PmiClient`], which also proves the job
//! secret), or of the PMI-1 or PMI-2 server of another process manager (Hydra's `mpiexec`,
//! Slurm's `srun`; [`WireClient`]).
//!
//! Ranks publish their endpoints with `put`, meet at `fence`, and read each other's with
//! `get`. `abort` asks the process manager to end the job.

use std::io;

use metampi_launch::pmi_wire::{WireClient, WireError};
use metampi_launch::{JobId, PmiClient, PmiClientError, ReportFn};

pub(crate) enum Pmi {
    /// `metampi run`'s server.
    Launcher(PmiClient),
    /// Another process manager's.
    Wire(WireClient),
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn io_err(e: PmiClientError) -> io::Error {
    match e {
        PmiClientError::Io(e) => e,
        other => bad(format!("bootstrap exchange with the launcher: {other}")),
    }
}

fn wire_err(e: WireError) -> io::Error {
    io::Error::other(e.to_string())
}

impl Pmi {
    /// Connects to `addr` (`host:port`, or `unix:PATH` for ranks on the
    /// launcher's machine, in whatever network namespace) as `rank` of `job`.
    pub(crate) fn connect(addr: &str, job: &str, rank: u32) -> io::Result<Pmi> {
        let job: JobId = job
            .parse()
            .map_err(|_| bad(format!("METAMPI_JOB `{job}` is not a job id")))?;
        let client = match addr.strip_prefix("unix:") {
            Some(path) => PmiClient::connect_unix(path, job, rank as usize),
            None => PmiClient::connect(addr, job, rank as usize),
        };
        client.map(Pmi::Launcher).map_err(io_err)
    }

    /// Joins the process manager named by `PMI_FD` or `PMI_PORT`; `None` where there is none.
    pub(crate) fn from_process_manager() -> io::Result<Option<WireClient>> {
        WireClient::from_env(&crate::knobs::text).map_err(wire_err)
    }

    /// Whether this is another process manager's exchange, which has no job secret.
    pub(crate) fn is_foreign(&self) -> bool {
        matches!(self, Pmi::Wire(_))
    }

    pub(crate) fn put(&mut self, key: &str, value: &str) -> io::Result<()> {
        match self {
            Pmi::Launcher(c) => c.put(key, value).map_err(io_err),
            Pmi::Wire(c) => c.put(key, value).map_err(wire_err),
        }
    }

    pub(crate) fn get(&mut self, key: &str) -> io::Result<String> {
        let value = match self {
            Pmi::Launcher(c) => c.get(key).map_err(io_err)?,
            Pmi::Wire(c) => c.get(key).map_err(wire_err)?,
        };
        value.ok_or_else(|| bad(format!("no value for `{key}` in the bootstrap exchange")))
    }

    pub(crate) fn fence(&mut self) -> io::Result<()> {
        match self {
            Pmi::Launcher(c) => c.fence().map_err(io_err),
            Pmi::Wire(c) => c.fence().map_err(wire_err),
        }
    }

    /// Whether the process manager prints an abort's message itself (`metampi run` does).
    pub(crate) fn prints_aborts(&self) -> bool {
        matches!(self, Pmi::Launcher(_))
    }

    pub(crate) fn abort(&mut self, code: i32, msg: &str) -> io::Result<()> {
        match self {
            Pmi::Launcher(c) => c.abort(code, msg).map_err(io_err),
            Pmi::Wire(c) => {
                // Hydra ends every process as soon as it reads the abort, and may not have
                // forwarded what this rank just wrote on stderr (the reason) by then.
                std::thread::sleep(std::time::Duration::from_millis(100));
                c.abort(code, msg).map_err(wire_err)
            }
        }
    }

    /// Has `metampi run`'s client answer the launcher's `REPORT` from now on with `answer`
    /// (what this rank waits in); other process managers do not ask.
    pub(crate) fn answer_reports(&mut self, answer: ReportFn) -> io::Result<()> {
        match self {
            Pmi::Launcher(c) => c.answer_reports(answer).map_err(io_err),
            Pmi::Wire(_) => Ok(()),
        }
    }

    /// Says the rank leaves cleanly. To `metampi run` that is `FINALIZE`, keeping the
    /// connection: the process may go on (a spawning root waits for its children) and may
    /// still abort.
    pub(crate) fn finalize(&mut self) -> io::Result<()> {
        match self {
            Pmi::Launcher(c) => match c.request("FINALIZE").map_err(io_err)?.as_str() {
                "OK" => Ok(()),
                other => Err(bad(format!("launcher answered FINALIZE with `{other}`"))),
            },
            Pmi::Wire(c) => c.finalize().map_err(wire_err),
        }
    }
}
