//! A simulated network on a virtual clock (in the manner of quinn's test pair): two
//! endpoints joined by one or more links, each a pair of byte-stream pipes with latency,
//! bandwidth and seeded faults (drop, duplicate, reorder, bit flips, bytes lost inside a
//! chunk, arbitrary splits, cuts with reconnect). A pipe can also trickle chunks in
//! segments at its line rate, and a test can edit chunks with a filter.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use metampi_wire::{Bundle, Config, Envelope, Event, Link, Message, SendError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What the simulator needs from a connection; implemented for [`Link`] and [`Bundle`].
pub trait Endpoint {
    fn links(&self) -> usize;
    fn send(&mut self, now: Instant, m: Message) -> Result<(), SendError>;
    fn bytes(&mut self, now: Instant, link: usize, b: &[u8]);
    fn transmit(&mut self, now: Instant, link: usize) -> Option<Vec<u8>>;
    fn timeout(&self) -> Option<Instant>;
    fn on_timeout(&mut self, now: Instant);
    fn disconnect(&mut self, now: Instant, link: usize);
    fn reconnect(&mut self, now: Instant, link: usize);
    fn event(&mut self) -> Option<Event>;
    fn send_buffered(&self) -> u64;
    fn receive_buffered(&self) -> u64;
    fn stats(&self) -> metampi_wire::Stats;
}

impl Endpoint for Link {
    fn links(&self) -> usize {
        1
    }
    fn send(&mut self, now: Instant, m: Message) -> Result<(), SendError> {
        self.send_message(now, m)
    }
    fn bytes(&mut self, now: Instant, _link: usize, b: &[u8]) {
        self.handle_bytes(now, b)
    }
    fn transmit(&mut self, now: Instant, _link: usize) -> Option<Vec<u8>> {
        self.poll_transmit(now)
    }
    fn timeout(&self) -> Option<Instant> {
        self.poll_timeout()
    }
    fn on_timeout(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
    fn disconnect(&mut self, now: Instant, _link: usize) {
        self.handle_disconnect(now)
    }
    fn reconnect(&mut self, now: Instant, _link: usize) {
        self.handle_reconnect(now)
    }
    fn event(&mut self) -> Option<Event> {
        self.poll_event()
    }
    fn send_buffered(&self) -> u64 {
        Link::send_buffered(self)
    }
    fn receive_buffered(&self) -> u64 {
        Link::receive_buffered(self)
    }
    fn stats(&self) -> metampi_wire::Stats {
        Link::stats(self)
    }
}

impl Endpoint for Bundle {
    fn links(&self) -> usize {
        Bundle::links(self)
    }
    fn send(&mut self, now: Instant, m: Message) -> Result<(), SendError> {
        self.send_message(now, m)
    }
    fn bytes(&mut self, now: Instant, link: usize, b: &[u8]) {
        self.handle_bytes(now, link, b)
    }
    fn transmit(&mut self, now: Instant, link: usize) -> Option<Vec<u8>> {
        self.poll_transmit(now, link)
    }
    fn timeout(&self) -> Option<Instant> {
        self.poll_timeout()
    }
    fn on_timeout(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
    fn disconnect(&mut self, now: Instant, link: usize) {
        self.handle_disconnect(now, link)
    }
    fn reconnect(&mut self, now: Instant, link: usize) {
        self.handle_reconnect(now, link)
    }
    fn event(&mut self) -> Option<Event> {
        self.poll_event()
    }
    fn send_buffered(&self) -> u64 {
        Bundle::send_buffered(self)
    }
    fn receive_buffered(&self) -> u64 {
        Bundle::receive_buffered(self)
    }
    fn stats(&self) -> metampi_wire::Stats {
        Bundle::stats(self)
    }
}

/// Probabilities per chunk (one `poll_transmit` result).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub corrupt: f64,
    /// Deliver chunks in random pieces.
    pub split: bool,
    /// Cut a run of 1 to 16 KiB out of the chunk, as the router's fault proxy does when
    /// it drops a read that need not line up with frames.
    pub lose_bytes: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct PipeConfig {
    pub latency: Duration,
    /// Bytes per second; `None` is infinitely fast.
    pub bandwidth: Option<u64>,
    pub faults: Faults,
}

impl Default for PipeConfig {
    fn default() -> PipeConfig {
        PipeConfig {
            latency: Duration::from_millis(5),
            bandwidth: None,
            faults: Faults::default(),
        }
    }
}

#[derive(Debug)]
struct Pipe {
    cfg: PipeConfig,
    /// Deliver each chunk as segments of this many bytes, each when the line has carried
    /// it (as TCP segments come in), instead of all of it when its last byte has.
    segment: Option<usize>,
    busy_until: Instant,
    /// (arrival, order of sending, bytes)
    in_flight: Vec<(Instant, u64, Vec<u8>)>,
}

/// One side's view of the run.
#[derive(Default)]
pub struct Side {
    /// Messages still to send, with the earliest time to send them.
    pub outbox: VecDeque<(Instant, Message)>,
    pub sent: Vec<Message>,
    pub delivered: Vec<Message>,
    pub events: Vec<Event>,
    /// Take delivered messages only every this often (a slow application).
    pub drain_every: Option<Duration>,
    next_drain: Option<Instant>,
    pub max_send_buffered: u64,
    pub max_receive_buffered: u64,
    pub would_block: u64,
}

/// Edits a chunk on its way into a pipe (after its line time is counted).
pub type Filter = Box<dyn FnMut(&mut Vec<u8>)>;

pub struct Net<E: Endpoint> {
    pub now: Instant,
    pub start: Instant,
    pub ep: [E; 2],
    pub side: [Side; 2],
    /// pipes[link][dir]: dir 0 carries side 0 -> side 1.
    pipes: Vec<[Pipe; 2]>,
    /// filters[link][dir]
    filters: Vec<[Option<Filter>; 2]>,
    /// Per link: down until this time, then reconnects.
    down: Vec<Option<Instant>>,
    pub rng: StdRng,
    seq: u64,
    /// Steps in a row that did not advance the clock.
    stalled: u32,
    /// Cuts still to happen: (time, link, outage).
    pub cuts: Vec<(Instant, usize, Duration)>,
}

impl<E: Endpoint> Net<E> {
    pub fn new(start: Instant, ep: [E; 2], pipes: Vec<PipeConfig>, seed: u64) -> Net<E> {
        assert_eq!(pipes.len(), ep[0].links());
        let pipes = pipes
            .into_iter()
            .map(|cfg| {
                let p = || Pipe {
                    cfg,
                    segment: None,
                    busy_until: start,
                    in_flight: Vec::new(),
                };
                [p(), p()]
            })
            .collect::<Vec<_>>();
        Net {
            now: start,
            start,
            down: vec![None; pipes.len()],
            filters: pipes.iter().map(|_| [None, None]).collect(),
            pipes,
            ep,
            side: [Side::default(), Side::default()],
            rng: StdRng::seed_from_u64(seed),
            seq: 0,
            stalled: 0,
            cuts: Vec::new(),
        }
    }

    pub fn queue(&mut self, from: usize, at: Instant, m: Message) {
        self.side[from].outbox.push_back((at, m));
    }

    /// Cuts link `link` now: everything in flight is lost (a random prefix of one
    /// chunk per direction still arrives, as a half-written frame would), both ends see
    /// the disconnect and reconnect after `outage`.
    pub fn cut(&mut self, link: usize, outage: Duration) {
        for dir in 0..2 {
            let mut lost = std::mem::take(&mut self.pipes[link][dir].in_flight);
            lost.sort_by_key(|c| (c.0, c.1));
            if let Some((_, _, bytes)) = lost.first() {
                let n = self.rng.gen_range(0..=bytes.len());
                let to = 1 - dir;
                self.ep[to].bytes(self.now, link, &bytes[..n]);
            }
            self.pipes[link][dir].busy_until = self.now;
        }
        for ep in &mut self.ep {
            ep.disconnect(self.now, link);
        }
        self.down[link] = Some(self.now + outage);
    }

    /// Passes every chunk later sent on `link` in direction `dir` through `f`, which may
    /// cut bytes out of it (bytes lost inside the stream, not whole frames).
    pub fn filter(&mut self, link: usize, dir: usize, f: impl FnMut(&mut Vec<u8>) + 'static) {
        self.filters[link][dir] = Some(Box::new(f));
    }

    /// Delivers chunks on `link` (both directions) in segments of `segment` bytes at the
    /// line rate; the pipe needs a bandwidth.
    pub fn trickle(&mut self, link: usize, segment: usize) {
        for pipe in &mut self.pipes[link] {
            assert!(pipe.cfg.bandwidth.is_some() && segment > 0);
            pipe.segment = Some(segment);
        }
    }

    /// Loses every chunk now in flight on `link` in direction `dir`, without a cut.
    pub fn lose_in_flight(&mut self, link: usize, dir: usize) {
        self.pipes[link][dir].in_flight.clear();
    }

    fn transmit(&mut self) {
        for from in 0..2 {
            for link in 0..self.pipes.len() {
                if self.down[link].is_some() {
                    continue;
                }
                loop {
                    let pipe = &self.pipes[link][from];
                    if pipe.busy_until > self.now {
                        break;
                    }
                    let Some(bytes) = self.ep[from].transmit(self.now, link) else {
                        break;
                    };
                    self.push(link, from, bytes);
                }
            }
        }
    }

    fn push(&mut self, link: usize, dir: usize, mut bytes: Vec<u8>) {
        let now = self.now;
        let pipe = &mut self.pipes[link][dir];
        let f = pipe.cfg.faults;
        if let Some(bw) = pipe.cfg.bandwidth {
            let nanos = bytes.len() as u128 * 1_000_000_000 / u128::from(bw);
            pipe.busy_until = now + Duration::from_nanos(nanos as u64);
        }
        let mut arrive = pipe.busy_until.max(now) + pipe.cfg.latency;
        if let Some(filter) = &mut self.filters[link][dir] {
            filter(&mut bytes);
        }
        if self.rng.gen_bool(f.drop) {
            return;
        }
        if self.rng.gen_bool(f.corrupt) && !bytes.is_empty() {
            for _ in 0..self.rng.gen_range(1..=3) {
                let bit = self.rng.gen_range(0..bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
        }
        if self.rng.gen_bool(f.reorder) {
            let extra = self
                .rng
                .gen_range(0..=pipe.cfg.latency.as_micros() as u64 * 2 + 100);
            arrive += Duration::from_micros(extra);
        }
        // Guarded so that runs without this fault draw the same random numbers as before
        // it existed.
        if f.lose_bytes > 0.0 && !bytes.is_empty() && self.rng.gen_bool(f.lose_bytes) {
            let at = self.rng.gen_range(0..bytes.len());
            let n = self.rng.gen_range(1..=(bytes.len() - at).min(16 << 10));
            bytes.drain(at..at + n);
        }
        let mut pieces = Vec::new();
        match (pipe.segment, pipe.cfg.bandwidth) {
            (Some(seg), Some(bw)) if bytes.len() > seg => {
                // Segment k arrives when the line has carried bytes up to its end: the
                // line time of what follows it before the whole chunk would have.
                let line = |n: usize| {
                    Duration::from_nanos((n as u128 * 1_000_000_000 / u128::from(bw)) as u64)
                };
                let mut at = 0;
                while at < bytes.len() {
                    let end = (at + seg).min(bytes.len());
                    pieces.push((arrive - line(bytes.len() - end), bytes[at..end].to_vec()));
                    at = end;
                }
            }
            _ => pieces.push((arrive, bytes)),
        }
        let duplicate = self.rng.gen_bool(f.duplicate);
        for (arrive, bytes) in pieces {
            self.seq += 1;
            if duplicate {
                pipe.in_flight.push((arrive, self.seq, bytes.clone()));
                self.seq += 1;
            }
            pipe.in_flight.push((arrive, self.seq, bytes));
        }
    }

    fn deliver(&mut self) {
        for link in 0..self.pipes.len() {
            for dir in 0..2 {
                let now = self.now;
                let pipe = &mut self.pipes[link][dir];
                let mut due: Vec<_> = Vec::new();
                pipe.in_flight.retain(|c| {
                    if c.0 <= now {
                        due.push(c.clone());
                        false
                    } else {
                        true
                    }
                });
                due.sort_by_key(|c| (c.0, c.1));
                let split = pipe.cfg.faults.split;
                for (_, _, bytes) in due {
                    let to = 1 - dir;
                    if split && bytes.len() > 1 {
                        let mut at = 0;
                        while at < bytes.len() {
                            let n = self.rng.gen_range(1..=(bytes.len() - at).min(700));
                            self.ep[to].bytes(now, link, &bytes[at..at + n]);
                            at += n;
                        }
                    } else {
                        self.ep[to].bytes(now, link, &bytes);
                    }
                }
            }
        }
    }

    fn app(&mut self) {
        let now = self.now;
        for s in 0..2 {
            let side = &mut self.side[s];
            let drain = match side.drain_every {
                None => true,
                Some(every) => match side.next_drain {
                    Some(t) if now < t => false,
                    _ => {
                        side.next_drain = Some(now + every);
                        true
                    }
                },
            };
            // Other events are always taken; delivered messages only when the slow
            // application gets round to it (they stay in the link and hold credit).
            if drain {
                while let Some(e) = self.ep[s].event() {
                    match e {
                        Event::Delivered(m) => side.delivered.push(m),
                        other => side.events.push(other),
                    }
                }
            }
            while let Some((at, _)) = side.outbox.front() {
                if *at > now {
                    break;
                }
                let Some((at, m)) = side.outbox.pop_front() else {
                    break;
                };
                match self.ep[s].send(now, m.clone()) {
                    Ok(()) => side.sent.push(m),
                    Err(SendError::WouldBlock(m)) => {
                        side.would_block += 1;
                        side.outbox.push_front((at, m));
                        break;
                    }
                    Err(e) => panic!("send failed: {e}"),
                }
            }
            side.max_send_buffered = side.max_send_buffered.max(self.ep[s].send_buffered());
            side.max_receive_buffered =
                side.max_receive_buffered.max(self.ep[s].receive_buffered());
        }
    }

    /// One instant of the simulation, then advance the clock to the next thing that
    /// happens. Panics if nothing can ever happen again.
    pub fn step(&mut self) {
        for link in 0..self.down.len() {
            if self.down[link].is_some_and(|t| t <= self.now) {
                self.down[link] = None;
                for ep in &mut self.ep {
                    ep.reconnect(self.now, link);
                }
            }
        }
        while let Some(i) = self.cuts.iter().position(|c| c.0 <= self.now) {
            let (_, link, outage) = self.cuts.remove(i);
            if self.down[link].is_none() {
                self.cut(link, outage);
            }
        }
        self.deliver();
        self.app();
        self.transmit();
        self.app();

        let mut next: Option<Instant> = None;
        let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for ep in &self.ep {
            if let Some(t) = ep.timeout() {
                at(t);
            }
        }
        for (link, p) in self.pipes.iter().enumerate() {
            for pipe in p {
                for c in &pipe.in_flight {
                    at(c.0);
                }
                if pipe.busy_until > self.now && self.down[link].is_none() {
                    at(pipe.busy_until);
                }
            }
        }
        for t in self.down.iter().flatten() {
            at(*t);
        }
        for c in &self.cuts {
            at(c.0);
        }
        for s in &self.side {
            if let Some((t, _)) = s.outbox.front() {
                if *t > self.now {
                    at(*t);
                }
            }
            if let (Some(_), Some(t)) = (s.drain_every, s.next_drain) {
                if t > self.now {
                    at(t);
                }
            }
        }
        let next = next.expect("nothing left to happen");
        // A timer that stays in the past means the endpoint promised work it won't do.
        if next <= self.now {
            self.stalled += 1;
            assert!(
                self.stalled < 1000,
                "livelock at {:?}",
                self.now - self.start
            );
        } else {
            self.stalled = 0;
        }
        self.now = next.max(self.now);
        for ep in &mut self.ep {
            ep.on_timeout(self.now);
        }
        self.app();
    }

    /// Everything queued was delivered and acknowledged both ways.
    pub fn settled(&self) -> bool {
        (0..2).all(|s| {
            let other = &self.side[1 - s];
            self.side[s].outbox.is_empty()
                && other.delivered.len() == self.side[s].sent.len()
                && self.ep[s].send_buffered() == 0
        })
    }

    /// Steps until settled; panics (with the seed in the message) after `limit` of
    /// virtual time. Returns when it settled: the time of the step that settled it (`now` has moved
    /// on by then, to whatever timer came next, such as a keepalive).
    pub fn run(&mut self, limit: Duration) -> Instant {
        let deadline = self.now + limit;
        let mut at = self.now;
        while !self.settled() {
            at = self.now;
            assert!(
                self.now < deadline,
                "not settled after {limit:?}: sent {}/{} delivered {}/{} events {:?} {:?}\nstats0 {:?}\nstats1 {:?}",
                self.side[0].sent.len(),
                self.side[1].sent.len(),
                self.side[1].delivered.len(),
                self.side[0].delivered.len(),
                self.side[0].events,
                self.side[1].events,
                self.ep[0].stats(),
                self.ep[1].stats()
            );
            self.step();
        }
        at
    }

    /// Asserts exactly-once, in-order, intact delivery both ways.
    pub fn check_delivery(&self) {
        for s in 0..2 {
            let sent = &self.side[s].sent;
            let got = &self.side[1 - s].delivered;
            assert_eq!(got.len(), sent.len(), "count {s} -> {}", 1 - s);
            for (i, (a, b)) in sent.iter().zip(got).enumerate() {
                assert!(a == b, "message {i} from side {s} differs");
            }
        }
    }
}

/// A message whose bytes derive from (side, index) so any mix-up shows.
pub fn test_message(rng: &mut StdRng, side: u32, index: u32, len: usize) -> Message {
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    for (i, chunk) in data.chunks_mut(4).enumerate().take(2) {
        let v = if i == 0 { index } else { side };
        let b = v.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    Message::new(
        Envelope {
            src: side,
            dst: 1 - side,
            context: 2 + index % 3,
            tag: index as i32,
        },
        data,
    )
}

/// Message lengths of a mixed workload: mostly small, some medium, a few large.
pub fn mixed_len(rng: &mut StdRng, max: usize) -> usize {
    match rng.gen_range(0..20) {
        0 => rng.gen_range(0..=max),
        1..=3 => rng.gen_range(1000..8000).min(max),
        _ => rng.gen_range(0..200),
    }
}

/// Proptest cases: `default`, or `PROPTEST_CASES` for a longer soak, e.g.
/// `PROPTEST_CASES=5000 cargo test -p metampi-wire --release`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `Compression::Zstd` where this build has it, else `Lz4` (the `zstd` feature needs a
/// C compiler).
pub fn zstd_or_lz4() -> metampi_wire::Compression {
    if cfg!(feature = "zstd") {
        metampi_wire::Compression::Zstd
    } else {
        metampi_wire::Compression::Lz4
    }
}

pub fn config() -> metampi_wire::ConfigBuilder {
    Config::builder()
}

pub fn pair_links(now: Instant, cfg: &Config) -> [Link; 2] {
    [Link::new(now, cfg.clone()), Link::new(now, cfg.clone())]
}

pub fn pair_bundles(now: Instant, cfg: &Config, n: usize) -> [Bundle; 2] {
    [
        Bundle::new(now, cfg.clone(), n).expect("bundle"),
        Bundle::new(now, cfg.clone(), n).expect("bundle"),
    ]
}
