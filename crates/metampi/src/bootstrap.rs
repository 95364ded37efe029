//! Client of the launcher's key-value exchange (PMI-like), see `metampi-launch`.
//!
//! Ranks publish their endpoints with `PUT`, meet at `FENCE`, and read each
//! other's with `GET`. `ABORT` asks the launcher to end the job.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

/// The connection to the launcher: TCP, or a Unix socket (`unix:PATH`) for
/// ranks on the launcher's machine, in whatever network namespace.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub(crate) struct Pmi {
    reader: BufReader<Conn>,
    writer: Conn,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Pmi {
    pub(crate) fn connect(addr: &str, job: &str, rank: u32) -> io::Result<Pmi> {
        let (reader, writer) = match addr.strip_prefix("unix:") {
            Some(path) => {
                let s = UnixStream::connect(path)?;
                (Conn::Unix(s.try_clone()?), Conn::Unix(s))
            }
            None => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                (Conn::Tcp(s.try_clone()?), Conn::Tcp(s))
            }
        };
        let mut p = Pmi {
            reader: BufReader::new(reader),
            writer,
        };
        // Prove the job secret to the launcher, and check its proof back.
        let key = std::env::var("METAMPI_SECRET").ok();
        match key.as_deref().and_then(metampi_launch::JobKey::from_hex) {
            Some(key) => {
                let reply = p.call("AUTH")?;
                let challenge = reply
                    .strip_prefix("CHALLENGE ")
                    .ok_or_else(|| bad(format!("launcher answered AUTH with `{reply}`")))?;
                let job_id = job
                    .parse()
                    .map_err(|_| bad(format!("METAMPI_JOB `{job}` is not a job id")))?;
                let (line, expect) = key
                    .hello(challenge, job_id, rank as usize)
                    .ok_or_else(|| bad("cannot answer the launcher's challenge".into()))?;
                let reply = p.call(&line)?;
                if reply.strip_prefix("OK ") != Some(expect.as_str()) {
                    return Err(bad("the launcher did not prove the job secret".into()));
                }
            }
            None => {
                p.call(&format!("HELLO {job} {rank}"))?;
            }
        }
        Ok(p)
    }

    fn call(&mut self, line: &str) -> io::Result<String> {
        self.writer.write_all(format!("{line}\n").as_bytes())?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(bad("launcher closed the bootstrap connection".into()));
        }
        let reply = reply.trim_end().to_string();
        if let Some(e) = reply.strip_prefix("ERR") {
            return Err(bad(format!("launcher refused `{line}`:{e}")));
        }
        Ok(reply)
    }

    pub(crate) fn put(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.call(&format!("PUT {key} {value}")).map(drop)
    }

    pub(crate) fn get(&mut self, key: &str) -> io::Result<String> {
        let r = self.call(&format!("GET {key}"))?;
        r.strip_prefix("VAL ")
            .map(str::to_string)
            .ok_or_else(|| bad(format!("no value for `{key}` in the bootstrap exchange")))
    }

    pub(crate) fn fence(&mut self) -> io::Result<()> {
        self.call("FENCE").map(drop)
    }

    pub(crate) fn abort(&mut self, code: i32, msg: &str) -> io::Result<()> {
        let one_line = msg.replace('\n', " | ");
        self.call(&format!("ABORT {code} {one_line}")).map(drop)
    }

    pub(crate) fn finalize(&mut self) -> io::Result<()> {
        self.call("FINALIZE").map(drop)
    }
}
