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

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use metampi_wire::Envelope as WireEnvelope;
use metampi_wire::{
    Compression, Config, Event, Link as WireLink, Message as WireMessage, SendError,
};

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
    /// `off`, `lz4`, `zstd` or `auto`.
    pub compression: String,
    /// Link id from the layout: both ends use it as the wire connection id.
    pub link_id: u32,
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
    /// `id=3;vertical=127.0.0.1:0;listen=a:1,b:2;out=host:port/BPS/LATUS/COMPRESSION/LINKID,...`
    pub fn to_line(&self) -> String {
        let out: Vec<String> = self
            .out
            .iter()
            .map(|o| {
                format!(
                    "{}/{}/{}/{}/{}",
                    o.addr,
                    o.bytes_per_sec.unwrap_or(0),
                    o.latency.map_or(0, |l| l.as_micros()),
                    o.compression,
                    o.link_id
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
                        let [addr, bps, lat, comp, id] = parts[..] else {
                            return Err(format!(
                                "bad link `{o}` (expected addr/bytes_per_sec/latency_us/compression/id)"
                            ));
                        };
                        if parse_compression(comp).is_none() {
                            return Err(format!("bad compression `{comp}` in `{o}`"));
                        }
                        let link_id: u32 =
                            id.parse().map_err(|_| format!("bad link id in `{o}`"))?;
                        let bps: u64 =
                            bps.parse().map_err(|_| format!("bad bandwidth in `{o}`"))?;
                        let lat: u64 = lat.parse().map_err(|_| format!("bad latency in `{o}`"))?;
                        spec.out.push(OutLink {
                            addr: addr.to_string(),
                            bytes_per_sec: (bps > 0).then_some(bps),
                            latency: (lat > 0).then(|| Duration::from_micros(lat)),
                            compression: comp.to_string(),
                            link_id,
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

fn parse_compression(s: &str) -> Option<Compression> {
    Some(match s {
        "off" => Compression::Off,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        "auto" => Compression::Auto,
        _ => return None,
    })
}

/// The wire configuration both ends of link `id` use. The transport is TCP,
/// which already delivers every byte: resends are only for reconnects and
/// corruption, so the retransmission timer is generous, and frames are kept
/// small so that an emulated slow line stays pipelined.
fn wire_config(id: u32, compression: Compression, slow: bool) -> Config {
    Config::builder()
        .connection_id(id)
        .max_message_len(MAX_WIRE_MESSAGE)
        .max_frame_payload(if slow { 64 << 10 } else { 1 << 20 })
        // Bundle what piles up while a frame is out, never hold a lone message.
        .flush_delay(Duration::ZERO)
        .ack_delay(Duration::from_micros(ACK_DELAY_US))
        .window(8 << 20)
        .send_buffer(8 << 20)
        .initial_rto(Duration::from_secs(1))
        .min_rto(Duration::from_millis(500))
        .compression(compression)
        .build()
        .unwrap_or_else(|_| {
            // zstd may be compiled out: fall back to lz4 rather than refuse to run.
            Config::builder()
                .connection_id(id)
                .max_message_len(MAX_WIRE_MESSAGE)
                .flush_delay(Duration::ZERO)
                .window(8 << 20)
                .send_buffer(8 << 20)
                .build()
                .expect("the default wire configuration is valid")
        })
}

/// Acknowledgement delay on router links (µs). Delayed acknowledgements cost
/// a ping-pong through two routers about 0.5 ms each way (measured with the
/// wire crate's 1 ms default), so acknowledge at once.
const ACK_DELAY_US: u64 = 0;

/// Largest frame a rank hands a router (an eager message or a rendezvous fragment).
const MAX_WIRE_MESSAGE: u64 = 1 << 20;

/// Emulated link: each chunk of bytes is serialised at the link rate after
/// the previous one (virtual finish time) and then propagates for the
/// latency; it is written to the socket when it would arrive. The wire
/// protocol is only asked for more bytes when the emulated line is idle, so
/// its retransmission timer sees the link's real round trip, not a queue.
struct Shaper {
    bytes_per_sec: Option<u64>,
    latency: Option<Duration>,
    next_free: Instant,
    queue: VecDeque<(Instant, Vec<u8>, usize)>,
}

impl Shaper {
    fn new(bytes_per_sec: Option<u64>, latency: Option<Duration>) -> Shaper {
        Shaper {
            bytes_per_sec,
            latency,
            next_free: Instant::now(),
            queue: VecDeque::new(),
        }
    }

    /// Whether the emulated line can take more bytes now.
    fn can_take(&self, now: Instant) -> bool {
        self.next_free <= now && self.queue.len() < 4096
    }

    fn push(&mut self, now: Instant, bytes: Vec<u8>) {
        let mut done = now;
        if let Some(bps) = self.bytes_per_sec {
            done =
                self.next_free.max(now) + Duration::from_secs_f64(bytes.len() as f64 / bps as f64);
            self.next_free = done;
        }
        self.queue
            .push_back((done + self.latency.unwrap_or_default(), bytes, 0));
    }

    /// Writes what is due; returns when it next wants to run, if ever.
    fn write(&mut self, s: &mut TcpStream, now: Instant) -> io::Result<Option<Instant>> {
        while let Some((due, bytes, done)) = self.queue.front_mut() {
            if *due > now {
                // Wake for the next arrival, or earlier when the line frees up.
                let free = (self.next_free > now).then_some(self.next_free);
                return Ok(Some(free.map_or(*due, |f| f.min(*due))));
            }
            match s.write(&bytes[*done..]) {
                Ok(n) => {
                    *done += n;
                    if *done == bytes.len() {
                        self.queue.pop_front();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok((self.next_free > now).then_some(self.next_free))
    }

    fn blocked_on_socket(&self, now: Instant) -> bool {
        self.queue.front().is_some_and(|f| f.0 <= now)
    }
}

/// Where a link's statistics are written while the job runs.
fn stats_path(router: usize, link: u32, side: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("METAMPI_ROUTER_STATS")?;
    Some(std::path::PathBuf::from(dir).join(format!("router-{router}-link-{link}-{side}.json")))
}

fn write_stats(path: &std::path::Path, st: &metampi_wire::Stats) {
    let text = format!(
        "{{\"bytes_out\":{},\"bytes_in\":{},\"frames_out\":{},\"frames_in\":{},\"payload_raw_out\":{},\"payload_wire_out\":{},\"compression_ratio_out\":{:.4},\"retransmits\":{},\"queued_messages\":{},\"queued_bytes\":{},\"unacked_bytes\":{}}}\n",
        st.bytes_out,
        st.bytes_in,
        st.frames_out,
        st.frames_in,
        st.payload_raw_out,
        st.payload_wire_out,
        st.compression_ratio_out(),
        st.retransmits,
        st.queued_messages,
        st.queued_bytes,
        st.unacked_bytes
    );
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Drives one link's wire state machine over its TCP connection: frames from
/// `out` (the sending side) become messages, delivered messages go to local
/// ranks. Returns when the connection ends.
fn drive(
    mut s: TcpStream,
    mut link: WireLink,
    out: Option<Receiver<Vec<u8>>>,
    waker: UnixDatagram,
    locals: Locals,
    mut shaper: Shaper,
    stats: Option<std::path::PathBuf>,
) {
    let _ = s.set_nonblocking(true);
    let _ = waker.set_nonblocking(true);
    let mut pending: Option<WireMessage> = None;
    let mut buf = vec![0u8; 256 << 10];
    let mut last_stats = Instant::now();
    loop {
        let now = Instant::now();
        // Outbound: until the protocol's send buffer is full.
        loop {
            let m = match pending.take() {
                Some(m) => m,
                None => match out.as_ref().map(|r| r.try_recv()) {
                    Some(Ok(frame)) => {
                        let e = Envelope::decode(&frame)
                            .map(|e| (e.src, e.dst, e.context, e.tag))
                            .unwrap_or_default();
                        WireMessage::new(
                            WireEnvelope {
                                src: e.0,
                                dst: e.1,
                                context: e.2,
                                tag: e.3,
                            },
                            frame,
                        )
                    }
                    _ => break,
                },
            };
            match link.send_message(now, m) {
                Ok(()) => {}
                Err(SendError::WouldBlock(m)) => {
                    pending = Some(m);
                    break;
                }
                Err(e) => {
                    eprintln!("metampi router: link refused a message: {e}");
                    return;
                }
            }
        }
        // Inbound bytes.
        loop {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => link.handle_bytes(now, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        if link.poll_timeout().is_some_and(|t| t <= now) {
            link.handle_timeout(now);
        }
        while let Some(ev) = link.poll_event() {
            match ev {
                Event::Delivered(m) => {
                    if let Err(e) = deliver(&locals, m.envelope.dst, &m.data) {
                        eprintln!(
                            "metampi router: delivery to rank {} failed: {e}",
                            m.envelope.dst
                        );
                        return;
                    }
                }
                Event::Closed(r) => {
                    eprintln!("metampi router: link closed: {r:?}");
                    return;
                }
                _ => {}
            }
        }
        while shaper.can_take(now) {
            match link.poll_transmit(now) {
                Some(bytes) => shaper.push(now, bytes),
                None => break,
            }
        }
        let shaper_due = match shaper.write(&mut s, now) {
            Ok(d) => d,
            Err(_) => return,
        };
        if let Some(p) = &stats {
            if now.duration_since(last_stats) > Duration::from_millis(500) {
                write_stats(p, &link.stats());
                last_stats = now;
            }
        }
        let mut wake = now + Duration::from_millis(100);
        if let Some(t) = link.poll_timeout() {
            wake = wake.min(t);
        }
        if let Some(t) = shaper_due {
            wake = wake.min(t);
        }
        let fds = [
            (s.as_raw_fd(), shaper.blocked_on_socket(Instant::now())),
            (waker.as_raw_fd(), false),
        ];
        let _ = crate::sys::poll::wait(&fds, wake.saturating_duration_since(Instant::now()));
        let mut b = [0u8; 64];
        while waker.recv(&mut b).is_ok() {}
    }
}

/// Runs a router until killed. Prints `METAMPI-ROUTER-READY <port>` on stdout
/// once local ranks may connect.
pub fn run(spec: &RouterSpec) -> io::Result<()> {
    crate::sys::poll::die_with_parent();
    let vertical = TcpListener::bind(&spec.vertical)?;
    let locals: Locals = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let mut links: Vec<(SyncSender<Vec<u8>>, Arc<UnixDatagram>)> = Vec::new();
    for l in &spec.out {
        let (tx, rx) = sync_channel(LINK_QUEUE);
        let (wake_tx, wake_rx) = UnixDatagram::pair()?;
        let _ = wake_tx.set_nonblocking(true);
        let l = l.clone();
        let locals = Arc::clone(&locals);
        let router = spec.id;
        std::thread::spawn(move || {
            let mut s = loop {
                match TcpStream::connect(&l.addr) {
                    Ok(s) => break s,
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            let _ = s.set_nodelay(true);
            // The acceptor learns which link (wire connection id) this is.
            if s.write_all(&l.link_id.to_le_bytes()).is_err() {
                return;
            }
            let comp = parse_compression(&l.compression).unwrap_or(Compression::Lz4);
            let slow = l.bytes_per_sec.is_some();
            let link = WireLink::new(Instant::now(), wire_config(l.link_id, comp, slow));
            let shaper = Shaper::new(l.bytes_per_sec, l.latency);
            drive(
                s,
                link,
                Some(rx),
                wake_rx,
                locals,
                shaper,
                stats_path(router, l.link_id, "out"),
            );
            eprintln!(
                "metampi router {router}: link {} to {} ended",
                l.link_id, l.addr
            );
        });
        links.push((tx, Arc::new(wake_tx)));
    }
    for addr in &spec.listen {
        let listener = TcpListener::bind(addr)?;
        let locals = Arc::clone(&locals);
        let router = spec.id;
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let locals = Arc::clone(&locals);
                std::thread::spawn(move || {
                    let mut id = [0u8; 4];
                    if conn.read_exact(&mut id).is_err() {
                        return;
                    }
                    let id = u32::from_le_bytes(id);
                    let _ = conn.set_nodelay(true);
                    let Ok((_keep, wake_rx)) = UnixDatagram::pair() else {
                        return;
                    };
                    // The receiving end accepts any frame size up to the largest a sender uses.
                    let link =
                        WireLink::new(Instant::now(), wire_config(id, Compression::Off, false));
                    let shaper = Shaper::new(None, None);
                    drive(
                        conn,
                        link,
                        None,
                        wake_rx,
                        locals,
                        shaper,
                        stats_path(router, id, "in"),
                    );
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
                    let (tx, waker) = &links[dst as usize % links.len()];
                    if tx.send(frame).is_err() {
                        return;
                    }
                    let _ = waker.send(&[1]);
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
                compression: "lz4".into(),
                link_id: 4,
            }],
        };
        assert_eq!(RouterSpec::parse(&s.to_line()).unwrap(), s);
        assert!(RouterSpec::parse("id=x;out=a/0/0").is_err());
        assert!(RouterSpec::parse("id=1").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0").is_err());
        assert!(RouterSpec::parse("id=1;out=a/0/0/gzip/1").is_err());
    }
}
