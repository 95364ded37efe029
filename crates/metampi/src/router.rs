//! The router process that carries traffic between meta hosts (sites),
//! after MetaMPICH's router and PACX-MPI's two daemons.
//!
//! Vertical: every rank of the router's site connects to it (one TCP
//! connection, the rank's hello first) and sends it frames for ranks on the
//! router's peer site. Horizontal: the router sends those frames over its
//! outgoing links to the peer site's router, which writes them to the
//! destination rank's vertical connection unchanged, so the rank sees the
//! original sender ("pretending to be the real sender"). Frames are the
//! library's own 64-byte envelopes plus payload; the destination world rank
//! is in the envelope.
//!
//! Ordering: all frames of one (source, destination) pair take the same
//! vertical connection, the same link (chosen by destination) and the same
//! delivering connection, each FIFO, so MPI's non-overtaking rule holds.
//!
//! This first router is threads and blocking sockets with optional link
//! emulation (bandwidth as a virtual-finish-time token bucket, latency as a
//! delay line); bundling, compression, striping, acknowledgements and
//! credits come with the `metampi-wire` protocol.

use std::collections::HashMap;
use std::io::{self, BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::envelope::{Envelope, ENV_LEN};

/// Frames a link queues before senders block (bounds router memory).
const LINK_QUEUE: usize = 256;
/// How long a frame waits for its destination rank to connect.
const DELIVERY_WAIT: Duration = Duration::from_secs(120);

/// One outgoing link of a router.
#[derive(Clone, Debug, PartialEq)]
pub struct OutLink {
    /// `host:port` of the peer router's listener.
    pub addr: String,
    /// Emulated bandwidth in bytes per second.
    pub bytes_per_sec: Option<u64>,
    /// Emulated one-way latency.
    pub latency: Option<Duration>,
}

/// What a router needs to know: written by the meta launcher as one line.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterSpec {
    pub id: usize,
    /// Where local ranks connect (`127.0.0.1:0` picks a free port).
    pub vertical: String,
    /// Where the peer site's routers connect.
    pub listen: Vec<String>,
    pub out: Vec<OutLink>,
}

impl RouterSpec {
    /// `id=3;vertical=127.0.0.1:0;listen=a:1,b:2;out=host:port/BPS/LATUS,...`
    pub fn to_line(&self) -> String {
        let out: Vec<String> = self
            .out
            .iter()
            .map(|o| {
                format!(
                    "{}/{}/{}",
                    o.addr,
                    o.bytes_per_sec.unwrap_or(0),
                    o.latency.map_or(0, |l| l.as_micros())
                )
            })
            .collect();
        format!(
            "id={};vertical={};listen={};out={}",
            self.id,
            self.vertical,
            self.listen.join(","),
            out.join(",")
        )
    }

    /// Parses [`RouterSpec::to_line`].
    pub fn parse(line: &str) -> Result<RouterSpec, String> {
        let mut spec = RouterSpec {
            id: 0,
            vertical: "127.0.0.1:0".into(),
            listen: Vec::new(),
            out: Vec::new(),
        };
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        for field in line.trim().split(';') {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| format!("router spec field `{field}` has no `=`"))?;
            match k {
                "id" => spec.id = v.parse().map_err(|_| format!("bad router id `{v}`"))?,
                "vertical" => spec.vertical = v.to_string(),
                "listen" => spec.listen = list(v),
                "out" => {
                    for o in list(v) {
                        let parts: Vec<&str> = o.split('/').collect();
                        let [addr, bps, lat] = parts[..] else {
                            return Err(format!(
                                "bad link `{o}` (expected addr/bytes_per_sec/latency_us)"
                            ));
                        };
                        let bps: u64 =
                            bps.parse().map_err(|_| format!("bad bandwidth in `{o}`"))?;
                        let lat: u64 = lat.parse().map_err(|_| format!("bad latency in `{o}`"))?;
                        spec.out.push(OutLink {
                            addr: addr.to_string(),
                            bytes_per_sec: (bps > 0).then_some(bps),
                            latency: (lat > 0).then(|| Duration::from_micros(lat)),
                        });
                    }
                }
                other => return Err(format!("unknown router spec field `{other}`")),
            }
        }
        if spec.out.is_empty() {
            return Err("a router needs at least one outgoing link".into());
        }
        Ok(spec)
    }
}

/// Reads one frame (envelope and payload); `None` at a clean end of stream.
fn read_frame(s: &mut impl Read) -> io::Result<Option<(u32, Vec<u8>)>> {
    let mut env = [0u8; ENV_LEN];
    match s.read_exact(&mut env) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let e = Envelope::decode(&env)
        .filter(|e| !e.is_inline())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed envelope"))?;
    let n = e.trailing_len();
    if std::env::var_os("METAMPI_ROUTER_DEBUG").is_some() {
        eprintln!(
            "router frame {:?} src {} dst {} len {} frag {} trailing {n}",
            e.kind, e.src, e.dst, e.len, e.frag
        );
    }
    if n > 64 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame larger than 64 MiB",
        ));
    }
    let mut frame = Vec::with_capacity(ENV_LEN + n);
    frame.extend_from_slice(&env);
    frame.resize(ENV_LEN + n, 0);
    s.read_exact(&mut frame[ENV_LEN..])?;
    Ok(Some((e.dst, frame)))
}

type Locals = Arc<(Mutex<HashMap<u32, Arc<Mutex<TcpStream>>>>, Condvar)>;

fn deliver(locals: &Locals, dst: u32, frame: &[u8]) -> io::Result<()> {
    let (map, cv) = &**locals;
    let deadline = Instant::now() + DELIVERY_WAIT;
    let mut g = map.lock().unwrap_or_else(|p| p.into_inner());
    let conn = loop {
        if let Some(c) = g.get(&dst) {
            break Arc::clone(c);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("rank {dst} never connected to this router"),
            ));
        }
        g = cv
            .wait_timeout(g, left)
            .map(|r| r.0)
            .unwrap_or_else(|p| p.into_inner().0);
    };
    drop(g);
    let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
    c.write_all(frame)
}

/// Sends queued frames on one link, imposing the emulated bandwidth and latency.
fn link_writer(link: OutLink, rx: Receiver<(Instant, Vec<u8>)>) {
    let mut s = loop {
        match TcpStream::connect(&link.addr) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = s.set_nodelay(true);
    let mut next_free = Instant::now();
    while let Ok((queued, frame)) = rx.recv() {
        if let Some(lat) = link.latency {
            let due = queued + lat;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        if s.write_all(&frame).is_err() {
            eprintln!("metampi router: link to {} lost", link.addr);
            return;
        }
        if let Some(bps) = link.bytes_per_sec {
            let now = Instant::now();
            next_free =
                next_free.max(now) + Duration::from_secs_f64(frame.len() as f64 / bps as f64);
            if next_free > now {
                std::thread::sleep(next_free - now);
            }
        }
    }
}

/// Runs a router until killed. Prints `METAMPI-ROUTER-READY <port>` on stdout
/// once local ranks may connect.
pub fn run(spec: &RouterSpec) -> io::Result<()> {
    crate::sys::poll::die_with_parent();
    let vertical = TcpListener::bind(&spec.vertical)?;
    let locals: Locals = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let mut links: Vec<SyncSender<(Instant, Vec<u8>)>> = Vec::new();
    for l in &spec.out {
        let (tx, rx) = sync_channel(LINK_QUEUE);
        let l = l.clone();
        std::thread::spawn(move || link_writer(l, rx));
        links.push(tx);
    }
    for addr in &spec.listen {
        let listener = TcpListener::bind(addr)?;
        let locals = Arc::clone(&locals);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let locals = Arc::clone(&locals);
                std::thread::spawn(move || loop {
                    match read_frame(&mut conn) {
                        Ok(Some((dst, frame))) => {
                            if let Err(e) = deliver(&locals, dst, &frame) {
                                eprintln!("metampi router: delivery to rank {dst} failed: {e}");
                                return;
                            }
                        }
                        Ok(None) => return,
                        Err(e) => {
                            eprintln!("metampi router: incoming link broken: {e}");
                            return;
                        }
                    }
                });
            }
        });
    }
    println!("METAMPI-ROUTER-READY {}", vertical.local_addr()?.port());
    io::stdout().flush()?;
    for conn in vertical.incoming() {
        let mut conn = conn?;
        let mut hello = [0u8; 4];
        if conn.read_exact(&mut hello).is_err() {
            continue;
        }
        let rank = u32::from_le_bytes(hello);
        let _ = conn.set_nodelay(true);
        let writer = Arc::new(Mutex::new(conn.try_clone()?));
        {
            let (map, cv) = &*locals;
            map.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(rank, writer);
            cv.notify_all();
        }
        let links = links.clone();
        std::thread::spawn(move || loop {
            match read_frame(&mut conn) {
                Ok(Some((dst, frame))) => {
                    let l = &links[dst as usize % links.len()];
                    if l.send((Instant::now(), frame)).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        });
    }
    Ok(())
}

/// Reads the ready line of a router started as a child process.
pub fn read_ready(out: &mut impl BufRead) -> io::Result<u16> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "router exited before it was ready",
            ));
        }
        if let Some(p) = line.trim().strip_prefix("METAMPI-ROUTER-READY ") {
            return p
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad router ready line"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_errors() {
        let s = RouterSpec {
            id: 2,
            vertical: "127.0.0.1:0".into(),
            listen: vec!["127.0.0.1:29000".into()],
            out: vec![OutLink {
                addr: "127.0.0.1:29001".into(),
                bytes_per_sec: Some(12_500_000),
                latency: Some(Duration::from_millis(20)),
            }],
        };
        assert_eq!(RouterSpec::parse(&s.to_line()).unwrap(), s);
        assert!(RouterSpec::parse("id=x;out=a/0/0").is_err());
        assert!(RouterSpec::parse("id=1").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0").is_err());
    }
}
