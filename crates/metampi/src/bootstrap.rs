//! A rank's side of the launcher's key-value exchange (PMI-like): the
//! client of `metampi-launch` ([`PmiClient`], which also proves the job
//! secret), with the errors the engine's start-up reports.
//!
//! Ranks publish their endpoints with `PUT`, meet at `FENCE`, and read each
//! other's with `GET`. `ABORT` asks the launcher to end the job.

use std::io;

use metampi_launch::{JobId, PmiClient, PmiClientError};

pub(crate) struct Pmi(PmiClient);

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn io_err(e: PmiClientError) -> io::Error {
    match e {
        PmiClientError::Io(e) => e,
        other => bad(format!("bootstrap exchange with the launcher: {other}")),
    }
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
        client.map(Pmi).map_err(io_err)
    }

    pub(crate) fn put(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.0.put(key, value).map_err(io_err)
    }

    pub(crate) fn get(&mut self, key: &str) -> io::Result<String> {
        self.0
            .get(key)
            .map_err(io_err)?
            .ok_or_else(|| bad(format!("no value for `{key}` in the bootstrap exchange")))
    }

    pub(crate) fn fence(&mut self) -> io::Result<()> {
        self.0.fence().map_err(io_err)
    }

    pub(crate) fn abort(&mut self, code: i32, msg: &str) -> io::Result<()> {
        self.0.abort(code, msg).map_err(io_err)
    }

    /// Says `FINALIZE` and keeps the connection: the process may go on (a
    /// spawning root waits for its children) and may still abort.
    pub(crate) fn finalize(&mut self) -> io::Result<()> {
        match self.0.request("FINALIZE").map_err(io_err)?.as_str() {
            "OK" => Ok(()),
            other => Err(bad(format!("launcher answered FINALIZE with `{other}`"))),
        }
    }
}
