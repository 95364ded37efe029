//! The router's core without sockets, threads or a clock of its own (sans-IO): which peer
//! connection a rank's frame takes, what a rank may still send before it waits, where a
//! message from a peer goes and when no more are taken, and what a link's connecting and
//! breaking mean for the wire protocol.
//!
//! The driver (`lib.rs`) owns every descriptor. It reads a rank's bytes into that rank's
//! [`Inlet`] and calls [`Switch::forward`]; feeds a link's bytes to the peer's bundle
//! ([`Switch::bundle_mut`]) and sends what the bundle transmits; calls
//! [`Switch::deliver`] to move the messages the bundle completed onto the ranks' [`Outlet`]s;
//! and writes an outlet to its rank through [`Switch::flush`], which keeps the count of
//! bytes held for ranks. The tests at the bottom drive two switches over a simulated
//! network on a virtual clock: the ordering and back-pressure promises of the crate's
//! documentation are checked there.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use metampi_sys::envelope::{Envelope, ENV_LEN};
use metampi_wire::{Bundle, Event, Message as WireMessage, SendError};

/// Largest frame a rank hands a router (an eager message or a rendezvous fragment).
pub(crate) const MAX_WIRE_MESSAGE: u64 = 1 << 20;

/// A link's receive window holds the largest message whole, and more is not needed
/// to keep a fast link busy.
pub(crate) const WINDOW_LEAST: u64 = 2 << 20;
pub(crate) const WINDOW_MOST: u64 = 8 << 20;

/// A peer router as this one knows it: one it dials (by its place among the spec's
/// peers), or one that dialled it (by that router's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    Out(usize),
    In(u32),
}

/// Something kept per peer router: the ones this router dials, in the spec's order, and
/// those that dialled it, by their id.
pub(crate) struct Peers<T> {
    pub out: Vec<T>,
    pub inbound: HashMap<u32, T>,
}

impl<T> Peers<T> {
    pub fn new(out: Vec<T>) -> Peers<T> {
        Peers {
            out,
            inbound: HashMap::new(),
        }
    }

    pub fn get(&self, key: PeerKey) -> Option<&T> {
        match key {
            PeerKey::Out(k) => self.out.get(k),
            PeerKey::In(id) => self.inbound.get(&id),
        }
    }

    pub fn get_mut(&mut self, key: PeerKey) -> Option<&mut T> {
        match key {
            PeerKey::Out(k) => self.out.get_mut(k),
            PeerKey::In(id) => self.inbound.get_mut(&id),
        }
    }

    /// Every peer with its key: the ones this router dials, then those that dialled it.
    pub fn keys(&self) -> Vec<PeerKey> {
        (0..self.out.len())
            .map(PeerKey::Out)
            .chain(self.inbound.keys().map(|&id| PeerKey::In(id)))
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (PeerKey, &T)> {
        (self.out.iter().enumerate())
            .map(|(k, p)| (PeerKey::Out(k), p))
            .chain(self.inbound.iter().map(|(&id, p)| (PeerKey::In(id), p)))
    }
}

/// What one router may hold for messages (`METAMPI_ROUTER_MEMORY`), however many ranks
/// and links it serves. Each direction has a share of its own, so that neither waits for
/// room the other holds (such a wait could close a cycle through the peer site):
/// - an eighth for the shared-memory pipes of the ranks on its node (the ranks size them
///   by how many share the router: `Tuning::router_pipe_bytes_among`);
/// - three eighths for messages from local ranks until the peer router has acknowledged them:
///   read buffers (whole allocations), frames waiting for link room, send buffers. A
///   rank is not read while its next read would need memory beyond it, so its socket
///   or pipe fills and holds the rank back;
/// - a quarter for the receive windows of incoming links (the credit the peer routers'
///   senders may use);
/// - a quarter for messages queued or lent to local ranks; beyond it no message is
///   taken from the links, whose credit then holds the peer routers back.
#[derive(Debug)]
pub(crate) struct Budget {
    pub total: usize,
    pub from_ranks: usize,
    pub to_ranks: usize,
    /// Each incoming link's receive window: the quarter shared by the links it expects.
    pub window: u64,
    /// Each outgoing connection's send buffer.
    pub send_buffer: u64,
    /// Most bytes held at once, everything together.
    pub peak: usize,
}

impl Budget {
    pub fn new(total: u64, links_in: usize) -> Budget {
        let total = usize::try_from(total).unwrap_or(usize::MAX / 2);
        let from_ranks = total / 8 * 3;
        Budget {
            total,
            from_ranks,
            to_ranks: total / 4,
            window: (total as u64 / 4 / links_in.max(1) as u64).clamp(WINDOW_LEAST, WINDOW_MOST),
            send_buffer: (from_ranks as u64 / 2).min(8 << 20),
            peak: 0,
        }
    }
}

/// What a local rank sent that is not on a peer connection yet: the bytes read from it
/// and a frame the peer connection could not take.
pub(crate) struct Inlet {
    /// Bytes read, whole frames at the front; the driver reads onto its end.
    pub rx: BytesMut,
    /// A frame the peer connection could not take yet (by peer); reading waits for it.
    pub held: Option<(usize, WireMessage)>,
    /// The largest frame expected (the largest seen so far): reads into `rx` leave
    /// room for one.
    pub frame_hint: usize,
    /// Bytes of the allocation `rx` reads into (what it holds of the budget).
    pub rx_block: usize,
}

impl Inlet {
    pub fn new(frame_hint: usize) -> Inlet {
        Inlet {
            rx: BytesMut::new(),
            held: None,
            frame_hint,
            rx_block: 0,
        }
    }

    /// Bytes it holds of the budget for messages from ranks: the allocation its read
    /// buffer fills (frames split off it keep it alive; they are also in a send buffer,
    /// a small overcount) and a frame waiting for link room.
    pub fn holding(&self) -> usize {
        let block = if self.rx.capacity() > 0 {
            self.rx_block
        } else {
            0
        };
        block + self.held.as_ref().map_or(0, |(_, m)| m.data.len())
    }
}

/// What waits to be written to one local rank, connected or not yet.
#[derive(Default)]
pub(crate) struct Outlet {
    pub q: VecDeque<Bytes>,
    /// Bytes of `q`'s front already written.
    pub off: usize,
}

impl Outlet {
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Bytes still to write.
    pub fn len(&self) -> usize {
        self.q.iter().map(Bytes::len).sum::<usize>() - self.off
    }
}

/// One peer connection's protocol state.
struct Wire {
    bundle: Bundle,
    /// Per link: it has been connected before (a new connection is a reconnect).
    seen: Vec<bool>,
}

/// A link's hello was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LinkRefused {
    /// The link index is not below the number of links it announced.
    NoSuchLink { link: usize, links: usize },
    /// The peer announced another number of links than its earlier ones did.
    LinkCount { announced: usize, earlier: usize },
    /// An outgoing link this router does not have.
    Unknown,
}

impl std::fmt::Display for LinkRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkRefused::NoSuchLink { link, links } => {
                write!(f, "link {link} of {links} does not exist")
            }
            LinkRefused::LinkCount { announced, earlier } => {
                write!(f, "it announced {announced} links, earlier {earlier}")
            }
            LinkRefused::Unknown => write!(f, "no such link"),
        }
    }
}

/// Hello of a link connection: magic, sending router (wire connection id),
/// link index, number of links, the link's id in the layout.
pub(crate) const LINK_MAGIC: &[u8; 4] = b"MPLK";
pub(crate) const LINK_HELLO: usize = 16;

/// What a link says of itself when it connects (after the authentication).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkHello {
    /// The dialling router's id (its wire connection id).
    pub conn: u32,
    pub link: u16,
    pub links: u16,
    /// The link's id in the layout (for statistics and traces).
    pub layout_id: u32,
}

impl LinkHello {
    pub fn encode(&self) -> [u8; LINK_HELLO] {
        let mut h = [0u8; LINK_HELLO];
        h[..4].copy_from_slice(LINK_MAGIC);
        h[4..8].copy_from_slice(&self.conn.to_le_bytes());
        h[8..10].copy_from_slice(&self.link.to_le_bytes());
        h[10..12].copy_from_slice(&self.links.to_le_bytes());
        h[12..16].copy_from_slice(&self.layout_id.to_le_bytes());
        h
    }

    /// `None` for anything but a link hello naming one of its links.
    pub fn decode(g: &[u8]) -> Option<LinkHello> {
        let g: &[u8; LINK_HELLO] = g.get(..LINK_HELLO)?.try_into().ok()?;
        let h = LinkHello {
            conn: u32::from_le_bytes([g[4], g[5], g[6], g[7]]),
            link: u16::from_le_bytes([g[8], g[9]]),
            links: u16::from_le_bytes([g[10], g[11]]),
            layout_id: u32::from_le_bytes([g[12], g[13], g[14], g[15]]),
        };
        (&g[..4] == LINK_MAGIC && h.link < h.links).then_some(h)
    }
}

/// The routing core of one router.
pub(crate) struct Switch {
    peers: Peers<Wire>,
    /// Towards local ranks, by port; `ports` names each rank's.
    outlets: Vec<Outlet>,
    ports: HashMap<u32, usize>,
    /// Bytes in all outlets.
    to_ranks: usize,
    budget: Budget,
}

impl Switch {
    /// A switch whose outgoing peer connections are `out`, in the spec's order.
    pub fn new(out: Vec<Bundle>, budget: Budget) -> Switch {
        let out = (out.into_iter())
            .map(|bundle| Wire {
                seen: vec![false; bundle.links()],
                bundle,
            })
            .collect();
        Switch {
            peers: Peers::new(out),
            outlets: Vec::new(),
            ports: HashMap::new(),
            to_ranks: 0,
            budget,
        }
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    pub fn budget_mut(&mut self) -> &mut Budget {
        &mut self.budget
    }

    pub fn bundle(&self, key: PeerKey) -> Option<&Bundle> {
        self.peers.get(key).map(|w| &w.bundle)
    }

    pub fn bundle_mut(&mut self, key: PeerKey) -> Option<&mut Bundle> {
        self.peers.get_mut(key).map(|w| &mut w.bundle)
    }

    pub fn bundles(&self) -> impl Iterator<Item = (PeerKey, &Bundle)> {
        self.peers.iter().map(|(k, w)| (k, &w.bundle))
    }

    /// Bytes the outgoing connections hold until their peers acknowledge them.
    pub fn sending(&self) -> usize {
        (self.peers.out.iter())
            .map(|w| w.bundle.send_buffered() as usize)
            .sum()
    }

    /// Bytes the peer connections hold: send buffers and reassembly.
    pub fn in_bundles(&self) -> usize {
        let recv: u64 = (self.peers.inbound.values())
            .map(|w| w.bundle.receive_buffered())
            .sum();
        self.sending() + recv as usize
    }

    /// Bytes queued towards local ranks.
    pub fn to_ranks(&self) -> usize {
        self.to_ranks
    }

    /// The port of `rank`, made on first use: messages for a rank that has not connected
    /// yet wait in it.
    pub fn port(&mut self, rank: u32) -> usize {
        *self.ports.entry(rank).or_insert_with(|| {
            self.outlets.push(Outlet::default());
            self.outlets.len() - 1
        })
    }

    pub fn outlet(&self, port: usize) -> &Outlet {
        &self.outlets[port]
    }

    /// Queued bytes per rank, for the debug log.
    pub fn queued(&self) -> Vec<(u32, usize)> {
        (self.ports.iter())
            .map(|(&r, &p)| (r, self.outlets[p].q.len()))
            .filter(|q| q.1 > 0)
            .collect()
    }

    /// Link `link` of a known peer connection is connected: for a link connected before,
    /// the wire protocol resends what the old connection did not deliver.
    pub fn link_up(&mut self, now: Instant, key: PeerKey, link: usize) -> Result<(), LinkRefused> {
        let w = self.peers.get_mut(key).ok_or(LinkRefused::Unknown)?;
        let links = w.seen.len();
        let seen = (w.seen.get_mut(link)).ok_or(LinkRefused::NoSuchLink { link, links })?;
        if std::mem::replace(seen, true) {
            w.bundle.handle_reconnect(now, link);
        }
        Ok(())
    }

    /// Link `link` of `links` from router `conn` is connected: its connection is made
    /// (with `make`) on its first link; a link count other than the earlier links' is
    /// refused.
    pub fn inbound_link(
        &mut self,
        now: Instant,
        conn: u32,
        link: usize,
        links: usize,
        make: impl FnOnce() -> Bundle,
    ) -> Result<(), LinkRefused> {
        if link >= links {
            return Err(LinkRefused::NoSuchLink { link, links });
        }
        let w = self.peers.inbound.entry(conn).or_insert_with(|| Wire {
            bundle: make(),
            seen: vec![false; links],
        });
        if w.seen.len() != links {
            return Err(LinkRefused::LinkCount {
                announced: links,
                earlier: w.seen.len(),
            });
        }
        self.link_up(now, PeerKey::In(conn), link)
    }

    /// Link `link` of a peer connection broke.
    pub fn link_down(&mut self, now: Instant, key: PeerKey, link: usize) {
        if let Some(w) = self.peers.get_mut(key) {
            w.bundle.handle_disconnect(now, link);
        }
    }

    /// Hands the frame held back and then the whole frames at the front of `inlet.rx` to
    /// the connection towards their destination, until one does not fit (it is held);
    /// the error says why the rank's connection must go.
    pub fn forward(&mut self, now: Instant, inlet: &mut Inlet) -> Result<(), String> {
        let out = &mut self.peers.out;
        let mut next = inlet.held.take();
        loop {
            let (p, m) = match next.take() {
                Some(held) => held,
                None => {
                    let frame = match take_frame(&mut inlet.rx) {
                        Ok(Ok(frame)) => frame,
                        Ok(Err(_)) => return Ok(()),
                        Err(e) => return Err(e.to_string()),
                    };
                    if out.is_empty() {
                        return Err("a frame for another site, and this router has no peer".into());
                    }
                    inlet.frame_hint = inlet.frame_hint.max(frame.len());
                    let m = wire_message(frame);
                    // All frames of one destination take one connection: their order holds.
                    (m.envelope.dst as usize % out.len(), m)
                }
            };
            match out[p].bundle.send_message(now, m) {
                Ok(()) => {}
                Err(SendError::WouldBlock(m)) => {
                    inlet.held = Some((p, m));
                    return Ok(());
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Moves the messages peer `key` delivered onto the outlets of their ranks, while the
    /// share for ranks has room (`lent`: bytes on loan to ranks, which count against it);
    /// otherwise the message stays in the bundle and its credit holds the sender back.
    /// Returns the first other event (a link given up, the connection closed).
    pub fn deliver(&mut self, key: PeerKey, lent: usize) -> Option<Event> {
        loop {
            if self.to_ranks + lent >= self.budget.to_ranks {
                return None;
            }
            let w = self.peers.get_mut(key)?;
            // A message that came in several fragments is written as they are
            // (`writev`), not joined first.
            if let Some(m) = w.bundle.poll_message_parts() {
                self.to_ranks += m.len();
                let port = self.port(m.envelope.dst);
                self.outlets[port].q.extend(m.parts);
                continue;
            }
            match w.bundle.poll_event()? {
                Event::Delivered(m) => {
                    self.to_ranks += m.data.len();
                    let port = self.port(m.envelope.dst);
                    self.outlets[port].q.push_back(m.data);
                }
                ev @ (Event::LinkDead { .. } | Event::LinkSilent { .. } | Event::Closed(_)) => {
                    return Some(ev)
                }
                _ => {}
            }
        }
    }

    /// Writes the outlet of `port` with `write`, which takes what it can; an error from it
    /// means the rank is gone, and what was queued for it is dropped.
    pub fn flush(
        &mut self,
        port: usize,
        write: impl FnOnce(&mut Outlet) -> io::Result<()>,
    ) -> io::Result<()> {
        let o = &mut self.outlets[port];
        let before = o.len();
        let res = write(o);
        let after = o.len();
        self.to_ranks -= before - after;
        if res.is_err() {
            self.drop_outlet(port);
        }
        res
    }

    /// The rank of `port` left: what was queued for it goes.
    pub fn drop_outlet(&mut self, port: usize) {
        let o = &mut self.outlets[port];
        self.to_ranks -= o.len();
        o.q.clear();
        o.off = 0;
    }
}

/// The size of the frame (envelope and payload) at the front of `rx`, once its
/// envelope is there.
pub(crate) fn frame_size(rx: &[u8]) -> io::Result<Option<usize>> {
    let Some(e) = metampi_sys::envelope::decode_head(rx)? else {
        return Ok(None);
    };
    let n = e.trailing_len();
    if n as u64 > MAX_WIRE_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {n} bytes is larger than a router takes"),
        ));
    }
    Ok(Some(ENV_LEN + n))
}

/// The next whole frame (envelope and payload) at the front of `rx`, or the
/// number of bytes the frame in progress needs.
fn take_frame(rx: &mut BytesMut) -> io::Result<Result<Bytes, usize>> {
    let Some(n) = frame_size(rx)? else {
        return Ok(Err(ENV_LEN));
    };
    if rx.len() < n {
        return Ok(Err(n));
    }
    if crate::debug_enabled() {
        if let Some(e) = Envelope::decode(&rx[..ENV_LEN]) {
            tracing::info!(
                "router frame {:?} src {} dst {} len {} frag {} trailing {}",
                e.kind,
                e.src,
                e.dst,
                e.len,
                e.frag,
                n - ENV_LEN
            );
        }
    }
    Ok(Ok(rx.split_to(n).freeze()))
}

/// A rank's frame as a wire message: the envelope's addressing, the frame unchanged.
fn wire_message(frame: Bytes) -> WireMessage {
    let e = Envelope::decode(&frame[..ENV_LEN])
        .map(|e| (e.src, e.dst, e.context, e.tag))
        .unwrap_or_default();
    WireMessage::new(
        metampi_wire::Envelope {
            src: e.0,
            dst: e.1,
            context: e.2,
            tag: e.3,
        },
        frame,
    )
}

#[cfg(test)]
mod tests {
    //! Two switches joined by striped links on a virtual clock: the links are pairs of
    //! byte pipes with a latency, which a test may cut (what is in flight is lost, a
    //! prefix of it may arrive) and reconnect; ranks are byte streams handed over in
    //! pieces of random size.

    use super::*;
    use metampi_sys::envelope::Kind;
    use metampi_wire::Compression;
    use std::time::Duration;

    /// xorshift64*: enough randomness for chunk sizes and lengths, and reproducible.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
        }
    }

    /// Payload byte `i` of frame `seq` from `src` to `dst`: any mix-up shows.
    fn byte(src: u32, dst: u32, seq: u32, i: usize) -> u8 {
        (src.wrapping_mul(31) ^ dst.wrapping_mul(17) ^ seq.wrapping_mul(7) ^ i as u32) as u8
    }

    fn frame(src: u32, dst: u32, seq: u32, len: usize) -> Vec<u8> {
        let mut e = Envelope::new(Kind::Eager, src, 7, seq as i32, len as u64);
        e.dst = dst;
        let mut f = e.encode(None).to_vec();
        f.extend((0..len).map(|i| byte(src, dst, seq, i)));
        f
    }

    struct Sender {
        rank: u32,
        /// Its byte stream, and how much of it the router has read.
        stream: Vec<u8>,
        read: usize,
        inlet: Inlet,
        /// Frames it sends, per destination.
        sent: HashMap<u32, u32>,
    }

    struct Receiver {
        rank: u32,
        port: usize,
        got: Vec<u8>,
    }

    struct Site {
        id: u32,
        switch: Switch,
        senders: Vec<Sender>,
        receivers: Vec<Receiver>,
        /// The receivers read what the router writes them.
        draining: bool,
        events: Vec<Event>,
    }

    /// Chunks in flight one way on one connection, with the time each arrives.
    type Pipe = VecDeque<(Instant, Vec<u8>)>;

    /// A cut in the schedule: when, whose outgoing connection, which link, for how long.
    type Cut = (Duration, usize, usize, Duration);

    struct Net {
        start: Instant,
        now: Instant,
        latency: Duration,
        links: usize,
        sites: [Site; 2],
        /// pipes[site][link][dir]: site's outgoing connection, dir 0 towards the peer
        /// (frames), dir 1 back (acknowledgements).
        pipes: Vec<Vec<[Pipe; 2]>>,
        /// Per site and link: down until then.
        down: Vec<Vec<Option<Instant>>>,
        cuts: Vec<Cut>,
        rng: Rng,
        largest: usize,
    }

    fn bundle(id: u32, budget: &Budget, links: usize, start: Instant) -> Bundle {
        let cfg = crate::wire_config(id, Compression::Off, false, true, budget);
        Bundle::new(start, cfg, links).expect("bundle")
    }

    impl Net {
        /// Ranks 0..3 on site 0, 3..6 on site 1; each sends `frames` frames to each rank
        /// of the other site, interleaved, of lengths from `len`.
        fn new(
            links: usize,
            memory: u64,
            frames: u32,
            seed: u64,
            len: impl Fn(&mut Rng) -> usize,
        ) -> Net {
            let start = Instant::now();
            let mut rng = Rng(seed | 1);
            let mut largest = 0;
            let sites = [0u32, 1].map(|id| {
                let budget = Budget::new(memory, links);
                let out = vec![bundle(id, &budget, links, start)];
                let mut switch = Switch::new(out, budget);
                let local = id * 3..id * 3 + 3;
                let remote = (1 - id) * 3..(1 - id) * 3 + 3;
                let senders = (local.clone())
                    .map(|rank| {
                        let mut order: Vec<u32> = (remote.clone())
                            .flat_map(|d| std::iter::repeat_n(d, frames as usize))
                            .collect();
                        for i in (1..order.len()).rev() {
                            order.swap(i, rng.below(i as u64 + 1) as usize);
                        }
                        let mut sent = HashMap::new();
                        let mut stream = Vec::new();
                        for d in order {
                            let seq = sent.entry(d).or_insert(0);
                            let n = len(&mut rng);
                            largest = largest.max(n + ENV_LEN);
                            stream.extend(frame(rank, d, *seq, n));
                            *seq += 1;
                        }
                        Sender {
                            rank,
                            stream,
                            read: 0,
                            inlet: Inlet::new(16 << 10),
                            sent,
                        }
                    })
                    .collect();
                let receivers = (local)
                    .map(|rank| Receiver {
                        rank,
                        port: switch.port(rank),
                        got: Vec::new(),
                    })
                    .collect();
                Site {
                    id,
                    switch,
                    senders,
                    receivers,
                    draining: true,
                    events: Vec::new(),
                }
            });
            let mut net = Net {
                start,
                now: start,
                latency: Duration::from_millis(5),
                links,
                sites,
                pipes: (0..2)
                    .map(|_| (0..links).map(|_| Default::default()).collect())
                    .collect(),
                down: vec![vec![None; links]; 2],
                cuts: Vec::new(),
                rng,
                largest,
            };
            for s in 0..2 {
                for l in 0..links {
                    net.connect(s, l);
                }
            }
            net
        }

        /// Both ends of site `s`'s outgoing link `l` are connected (again).
        fn connect(&mut self, s: usize, l: usize) {
            let (now, links) = (self.now, self.links);
            self.sites[s]
                .switch
                .link_up(now, PeerKey::Out(0), l)
                .unwrap();
            let (peer, id) = (&mut self.sites[1 - s], s as u32);
            let b = bundle(id, peer.switch.budget(), links, now);
            let inbound = peer.switch.inbound_link(now, id, l, links, || b);
            inbound.unwrap();
        }

        /// Cuts site `s`'s outgoing link `l` for `outage`.
        fn cut(&mut self, s: usize, l: usize, outage: Duration) {
            for dir in 0..2 {
                let lost = std::mem::take(&mut self.pipes[s][l][dir]);
                // A connection that breaks may have delivered part of what it carried.
                if let Some((_, bytes)) = lost.into_iter().next() {
                    let n = self.rng.below(bytes.len() as u64 + 1) as usize;
                    self.feed(s, l, dir, &bytes[..n]);
                }
            }
            self.sites[s].switch.link_down(self.now, PeerKey::Out(0), l);
            self.sites[1 - s]
                .switch
                .link_down(self.now, PeerKey::In(s as u32), l);
            self.down[s][l] = Some(self.now + outage);
        }

        /// Bytes arriving on site `s`'s outgoing link `l` in direction `dir`.
        fn feed(&mut self, s: usize, l: usize, dir: usize, bytes: &[u8]) {
            let (to, key) = match dir {
                0 => (1 - s, PeerKey::In(s as u32)),
                _ => (s, PeerKey::Out(0)),
            };
            let b = self.sites[to].switch.bundle_mut(key).unwrap();
            b.handle_bytes(self.now, l, bytes);
        }

        /// One instant; returns whether anything moved.
        fn step(&mut self) -> bool {
            let now = self.now;
            let mut moved = false;
            for s in 0..2 {
                for l in 0..self.links {
                    if self.down[s][l].is_some_and(|t| t <= now) {
                        self.down[s][l] = None;
                        self.connect(s, l);
                    }
                }
            }
            while let Some(i) = (self.cuts.iter()).position(|c| self.start + c.0 <= now) {
                let (_, s, l, outage) = self.cuts.remove(i);
                if self.down[s][l].is_none() {
                    self.cut(s, l, outage);
                }
            }
            // Ranks to the router: a piece of the stream at a time, while nothing is held.
            for site in &mut self.sites {
                for r in &mut site.senders {
                    let before = (r.read, r.inlet.rx.len(), r.inlet.held.is_some());
                    site.switch.forward(now, &mut r.inlet).unwrap();
                    if r.inlet.held.is_none() && r.read < r.stream.len() {
                        let n = 1 + self.rng.below(96 << 10) as usize;
                        let end = (r.read + n).min(r.stream.len());
                        r.inlet.rx.extend_from_slice(&r.stream[r.read..end]);
                        r.read = end;
                        site.switch.forward(now, &mut r.inlet).unwrap();
                    }
                    moved |= before != (r.read, r.inlet.rx.len(), r.inlet.held.is_some());
                }
            }
            // Onto the links, and off them.
            for s in 0..2 {
                for l in 0..self.links {
                    if self.down[s][l].is_some() {
                        continue;
                    }
                    for dir in 0..2 {
                        let (from, key) = match dir {
                            0 => (s, PeerKey::Out(0)),
                            _ => (1 - s, PeerKey::In(s as u32)),
                        };
                        let b = self.sites[from].switch.bundle_mut(key).unwrap();
                        while let Some(t) = b.poll_transmit(now, l) {
                            self.pipes[s][l][dir].push_back((now + self.latency, t));
                            moved = true;
                        }
                        while (self.pipes[s][l][dir].front()).is_some_and(|c| c.0 <= now) {
                            let (_, bytes) = self.pipes[s][l][dir].pop_front().unwrap();
                            self.feed(s, l, dir, &bytes);
                            moved = true;
                        }
                    }
                }
            }
            // Timers, delivery to the ranks' queues, and the ranks reading them.
            for site in &mut self.sites {
                for key in site.switch.peers.keys() {
                    let b = site.switch.bundle_mut(key).unwrap();
                    if b.poll_timeout().is_some_and(|t| t <= now) {
                        b.handle_timeout(now);
                    }
                    let before = site.switch.to_ranks();
                    while let Some(ev) = site.switch.deliver(key, 0) {
                        site.events.push(ev);
                    }
                    moved |= site.switch.to_ranks() != before;
                }
                let before = site.switch.to_ranks();
                if site.draining {
                    for r in &mut site.receivers {
                        let got = &mut r.got;
                        let res = site.switch.flush(r.port, |o| {
                            for b in o.q.drain(..) {
                                got.extend_from_slice(&b[std::mem::take(&mut o.off)..]);
                            }
                            Ok(())
                        });
                        res.unwrap();
                    }
                    moved |= site.switch.to_ranks() != before;
                }
            }
            moved
        }

        /// When the next thing happens, if anything will.
        fn next(&self) -> Option<Instant> {
            let pipes = (self.pipes.iter().flatten().flatten()).filter_map(|p| p.front());
            let timers = (self.sites.iter())
                .flat_map(|s| s.switch.bundles().filter_map(|(_, b)| b.poll_timeout()));
            let cuts = self.cuts.iter().map(|c| self.start + c.0);
            (pipes.map(|c| c.0))
                .chain(timers)
                .chain(cuts)
                .chain(self.down.iter().flatten().flatten().copied())
                .min()
        }

        /// Runs until virtual time `until` has passed since the start.
        fn run_for(&mut self, until: Duration) {
            let end = self.start + until;
            let mut same = 0;
            while self.now < end {
                if self.step() && same < 10_000 {
                    same += 1;
                    continue;
                }
                same = 0;
                let next = self.next().unwrap_or(end).min(end);
                // Timers already due are served at the next instant.
                self.now = next.max(self.now + Duration::from_micros(10));
            }
        }

        /// Asserts that every rank got every frame sent to it, once, intact and in
        /// order per sender; returns the frames checked.
        fn check(&self) -> usize {
            let mut expected: HashMap<(u32, u32), u32> = HashMap::new();
            for s in &self.sites {
                for r in &s.senders {
                    assert_eq!(r.read, r.stream.len(), "rank {} not all read", r.rank);
                    for (&d, &n) in &r.sent {
                        expected.insert((r.rank, d), n);
                    }
                }
                let stuck: Vec<_> = (s.events.iter())
                    .filter(|e| matches!(e, Event::Closed(_)))
                    .collect();
                assert!(stuck.is_empty(), "site {}: {stuck:?}", s.id);
            }
            let mut frames = 0;
            for s in &self.sites {
                for r in &s.receivers {
                    let mut next: HashMap<u32, u32> = HashMap::new();
                    let mut at = 0;
                    while at < r.got.len() {
                        let e = Envelope::decode(&r.got[at..]).expect("an envelope");
                        assert_eq!(e.dst, r.rank);
                        let seq = next.entry(e.src).or_insert(0);
                        assert_eq!(e.tag as u32, *seq, "{} -> {} out of order", e.src, e.dst);
                        let body = &r.got[at + ENV_LEN..at + ENV_LEN + e.len as usize];
                        for (i, &b) in body.iter().enumerate() {
                            assert_eq!(b, byte(e.src, e.dst, *seq, i), "frame {seq} byte {i}");
                        }
                        *seq += 1;
                        at += ENV_LEN + e.len as usize;
                        frames += 1;
                    }
                    for (src, n) in next {
                        assert_eq!(
                            expected.remove(&(src, r.rank)),
                            Some(n),
                            "{src} -> {}",
                            r.rank
                        );
                    }
                }
            }
            assert!(expected.is_empty(), "never arrived: {expected:?}");
            frames
        }
    }

    fn mixed(rng: &mut Rng) -> usize {
        match rng.below(20) {
            0 => rng.below(256 << 10) as usize,
            1..=4 => 1000 + rng.below(16 << 10) as usize,
            _ => rng.below(200) as usize,
        }
    }

    /// The module documentation's ordering promise: all frames of a (source,
    /// destination) pair arrive in send order, once, whatever link carried them and
    /// however often links break.
    #[test]
    fn frames_arrive_in_order_per_pair_over_striped_links_that_break() {
        for seed in [1, 2, 3] {
            let mut net = Net::new(3, 64 << 20, 60, seed, mixed);
            let ms = Duration::from_millis;
            net.cuts = vec![
                (ms(2), 0, 1, ms(30)),
                (ms(9), 1, 0, ms(5)),
                (ms(20), 0, 2, ms(200)),
                (ms(40), 1, 1, ms(50)),
                (ms(41), 0, 0, ms(10)),
            ];
            net.run_for(Duration::from_secs(5));
            let frames = net.check();
            assert_eq!(frames, 2 * 3 * 3 * 60);
            for s in &net.sites {
                assert_eq!(s.switch.to_ranks(), 0);
                assert_eq!(s.switch.sending(), 0, "site {} still sending", s.id);
            }
        }
    }

    /// The back-pressure promise: ranks that do not read fill the router's share for
    /// ranks and no more; the rest stays in the peer's send buffer and then with the
    /// sending ranks, whose frames the router stops taking. Once the ranks read,
    /// everything arrives in order.
    #[test]
    fn ranks_that_do_not_read_hold_their_senders_back_within_the_budget() {
        let big = |rng: &mut Rng| (16 << 10) + rng.below(48 << 10) as usize;
        let mut net = Net::new(2, 16 << 20, 50, 7, big);
        net.sites[1].draining = false;
        net.run_for(Duration::from_secs(3));
        let (largest, site0, site1) = (net.largest, &net.sites[0], &net.sites[1]);
        let b = site1.switch.budget();
        assert!(
            site1.switch.to_ranks() <= b.to_ranks + largest,
            "{}",
            site1.switch.to_ranks()
        );
        assert!(
            site1.switch.to_ranks() >= b.to_ranks - largest,
            "the share was not used"
        );
        let sending = site0.switch.sending() as u64;
        assert!(
            sending <= site0.switch.budget().send_buffer + largest as u64,
            "{sending}"
        );
        // The senders are held: a frame waits in each, and their streams are not all read.
        assert!(site0.senders.iter().all(|r| r.inlet.held.is_some()));
        assert!(site0.senders.iter().any(|r| r.read < r.stream.len()));
        // Site 1's own traffic was not held up by it.
        assert!(site1.senders.iter().all(|r| r.read == r.stream.len()));
        net.sites[1].draining = true;
        net.run_for(Duration::from_secs(10));
        assert_eq!(net.check(), 2 * 3 * 3 * 50);
    }

    #[test]
    fn a_link_hello_says_who_dials_and_which_link() {
        let h = LinkHello {
            conn: 3,
            link: 1,
            links: 4,
            layout_id: 77,
        };
        assert_eq!(LinkHello::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(LinkHello::decode(&bad), None);
        assert_eq!(LinkHello::decode(&h.encode()[..10]), None);
        let beyond = LinkHello { link: 4, ..h };
        assert_eq!(LinkHello::decode(&beyond.encode()), None);
    }

    #[test]
    fn links_that_disagree_with_their_connection_are_refused() {
        let now = Instant::now();
        let budget = Budget::new(16 << 20, 2);
        let mut sw = Switch::new(vec![bundle(0, &budget, 2, now)], budget);
        let b = |n| bundle(5, &Budget::new(16 << 20, 2), n, now);
        assert_eq!(sw.inbound_link(now, 5, 0, 2, || b(2)), Ok(()));
        assert_eq!(
            sw.inbound_link(now, 5, 1, 3, || b(3)),
            Err(LinkRefused::LinkCount {
                announced: 3,
                earlier: 2
            })
        );
        assert_eq!(
            sw.inbound_link(now, 6, 2, 2, || b(2)),
            Err(LinkRefused::NoSuchLink { link: 2, links: 2 })
        );
        assert_eq!(
            sw.link_up(now, PeerKey::Out(1), 0),
            Err(LinkRefused::Unknown)
        );
        assert_eq!(
            sw.link_up(now, PeerKey::Out(0), 2),
            Err(LinkRefused::NoSuchLink { link: 2, links: 2 })
        );
        // Connected again after a break: accepted, and the wire protocol resends.
        sw.link_down(now, PeerKey::In(5), 0);
        assert_eq!(sw.inbound_link(now, 5, 0, 2, || b(2)), Ok(()));
    }

    /// Bytes from a rank that are not frames cost that rank its connection, not the router.
    #[test]
    fn a_rank_sending_garbage_is_dropped_with_a_reason() {
        let now = Instant::now();
        let budget = Budget::new(16 << 20, 1);
        let mut sw = Switch::new(vec![bundle(0, &budget, 1, now)], budget);
        let mut inlet = Inlet::new(1024);
        inlet.rx.extend_from_slice(&[0xff; ENV_LEN]);
        assert!(sw.forward(now, &mut inlet).is_err());
        let mut inlet = Inlet::new(1024);
        let mut e = Envelope::new(Kind::Eager, 0, 7, 0, MAX_WIRE_MESSAGE + 1);
        e.dst = 4;
        inlet.rx.extend_from_slice(&e.encode(None));
        let why = sw.forward(now, &mut inlet).unwrap_err();
        assert!(why.contains("larger than a router takes"), "{why}");
        // No peer at all: the frame cannot go anywhere.
        let mut lone = Switch::new(Vec::new(), Budget::new(16 << 20, 1));
        let mut inlet = Inlet::new(1024);
        inlet.rx.extend_from_slice(&frame(0, 4, 0, 10));
        assert!(lone.forward(now, &mut inlet).is_err());
    }

    #[test]
    fn a_budget_splits_into_shares_that_fit_it() {
        for (total, links) in [
            (16u64 << 20, 1),
            (128 << 20, 1),
            (128 << 20, 4),
            (1 << 30, 64),
        ] {
            let b = Budget::new(total, links);
            let windows = b.window as usize * links;
            let pipes = b.total / 8;
            assert!(
                b.from_ranks + b.to_ranks + pipes <= b.total - b.total / 4,
                "{b:?}"
            );
            // The windows' quarter, except where each must hold the largest message.
            assert!(windows <= b.total / 4 || b.window == WINDOW_LEAST, "{b:?}");
            assert!(b.window >= MAX_WIRE_MESSAGE + (64 << 10), "{b:?}");
            assert!(b.send_buffer as usize <= b.from_ranks, "{b:?}");
        }
        // The default keeps the windows a fast line needs.
        assert_eq!(Budget::new(128 << 20, 4).window, WINDOW_MOST);
    }
}
