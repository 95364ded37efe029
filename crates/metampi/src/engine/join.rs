//! Shared memory with processes that join after start-up (spawned children
//! and their parents, see `topology::spawn`). Each side makes one segment
//! per spawn, laid out as a world segment is (a sleep word, one ring per
//! peer, a cooperative-copy table), and offers it on each fresh connection
//! before any frame flows: the path, the ring it keeps for that peer, and
//! its job and rank (the name of its wake-up socket). A pair whose two ends
//! both mapped the other's segment (the same machine) switches to the rings;
//! any other pair keeps its TCP connection. The offers go out to every peer
//! before any is read, so the two groups cannot wait on each other.
//!
//! These peers know no process id of each other, so long messages between
//! them take the copy-through-the-ring rendezvous, not cross-memory attach;
//! the copy table is there for the layout and never asked.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::coop::{self, PeerSlots};
use super::links::{ShmLink, SleepFlag};
use super::{ring_cap, SEG_CTL};
use crate::sys::ring::{Consumer, Producer, CTL_BYTES};
use crate::sys::shm::Segment;

/// How long a peer may take to answer an offer.
const OFFER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest offer line accepted.
const MAX_OFFER: usize = 1024;

/// This side's segment for the peers of one spawn.
pub(crate) struct JoinSegment {
    seg: Segment,
    rings: usize,
}

fn ring_bytes() -> usize {
    CTL_BYTES + ring_cap()
}

fn segment_len(rings: usize) -> usize {
    SEG_CTL + rings * ring_bytes() + coop::TABLE_BYTES
}

impl JoinSegment {
    /// A segment with one ring for each of `rings` peers, every page
    /// reserved now (a full `/dev/shm` fails here, not later with `SIGBUS`).
    pub(crate) fn create(job: &str, rank: u32, rings: usize) -> io::Result<JoinSegment> {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let path = crate::sys::shm::dir().join(format!("metampi-{job}-{rank}-join{n}"));
        let seg = Segment::create_reserved(&path, segment_len(rings))?;
        Ok(JoinSegment { seg, rings })
    }

    /// This side's sleep word in the segment, raised with the others.
    pub(crate) fn sleep_flag(&self) -> SleepFlag {
        // SAFETY: the first word of the segment, which lives as long as the
        // engine keeps it (`Links::segments`).
        unsafe { SleepFlag::new(self.seg.base() as *const AtomicU32) }
    }

    pub(crate) fn into_segment(self) -> Segment {
        self.seg
    }
}

/// A peer's offer.
struct Offer {
    path: PathBuf,
    len: usize,
    /// The ring of its segment kept for us.
    ring: usize,
    job: String,
    rank: u32,
}

fn read_line(s: &mut TcpStream) -> io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < MAX_OFFER {
        s.read_exact(&mut b)?;
        if b[0] == b'\n' {
            return String::from_utf8(line)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "offer is not text"));
        }
        line.push(b[0]);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "offer line too long",
    ))
}

fn parse_offer(line: &str) -> Option<Offer> {
    let mut w = line.split(' ');
    if w.next()? != "S" {
        return None;
    }
    let offer = Offer {
        path: PathBuf::from(w.next()?),
        len: w.next()?.parse().ok()?,
        ring: w.next()?.parse().ok()?,
        job: w.next()?.to_string(),
        rank: w.next()?.parse().ok()?,
    };
    w.next().is_none().then_some(offer)
}

/// What replaces a peer's stream: the link to it, its ring into ours, and
/// its segment (kept mapped with the engine's).
pub(crate) struct Joined {
    pub link: ShmLink,
    pub cons: Consumer,
    pub peer_segment: Segment,
}

/// Maps `offer`'s segment, and checks that it holds the ring it names.
fn map(offer: &Offer) -> Option<Segment> {
    let rings = offer
        .len
        .checked_sub(SEG_CTL + coop::TABLE_BYTES)?
        .checked_div(ring_bytes())?;
    if offer.ring >= rings || offer.len != segment_len(rings) || !is_segment_path(&offer.path) {
        return None;
    }
    Segment::open(&offer.path, offer.len).ok()
}

/// Only files in the shared-memory directory named as ours are mapped.
fn is_segment_path(path: &Path) -> bool {
    path.parent() == Some(crate::sys::shm::dir().as_path())
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("metampi-") && !n.contains('/'))
}

/// Offers shared memory on every stream (the peer on `streams[i]` gets ring
/// `i` of `mine`; `None`: offer nothing) and returns, per stream, what to
/// use instead of it where both sides mapped each other's segment. The
/// streams must be blocking; they are left so.
pub(crate) fn join_all(
    streams: &mut [TcpStream],
    mine: Option<&JoinSegment>,
    job: &str,
    rank: u32,
) -> io::Result<Vec<Option<Joined>>> {
    for (i, s) in streams.iter_mut().enumerate() {
        s.set_read_timeout(Some(OFFER_TIMEOUT))?;
        let line = match mine {
            Some(m) if i < m.rings => format!(
                "S {} {} {i} {job} {rank}\n",
                m.seg_path().display(),
                segment_len(m.rings)
            ),
            _ => "-\n".to_string(),
        };
        s.write_all(line.as_bytes())?;
    }
    let mut mapped = Vec::with_capacity(streams.len());
    for s in streams.iter_mut() {
        let offer = parse_offer(&read_line(s)?);
        let seg = offer.as_ref().and_then(map);
        let ok = mine.is_some() && seg.is_some();
        s.write_all(&[u8::from(ok)])?;
        mapped.push(offer.zip(seg).filter(|_| ok));
    }
    let mut out = Vec::with_capacity(streams.len());
    for (i, (s, m)) in streams.iter_mut().zip(mapped).enumerate() {
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack)?;
        s.set_read_timeout(None)?;
        let joined = match (m, mine) {
            (Some((offer, peer_segment)), Some(own)) if ack[0] == 1 => {
                Some(link(own, i, &offer, peer_segment)?)
            }
            _ => None,
        };
        out.push(joined);
    }
    // Every peer that maps our segment has done so by now.
    if let Some(m) = mine {
        m.seg.unlink();
    }
    Ok(out)
}

impl JoinSegment {
    fn seg_path(&self) -> &Path {
        self.seg.path()
    }
}

/// Adds the peers on `streams` to `links` as processes joined later, each
/// on shared memory where `joined` says so (its stream then closes), and
/// keeps `own` where any peer uses it. Returns their engine ranks.
pub(crate) fn add_peers(
    links: &mut super::links::Links,
    streams: Vec<TcpStream>,
    joined: Vec<Option<Joined>>,
    own: Option<JoinSegment>,
) -> io::Result<Vec<u32>> {
    let mut ranks = Vec::with_capacity(streams.len());
    let mut used = false;
    for (s, j) in streams.into_iter().zip(joined) {
        super::configure_stream(&s)?;
        let r = links.add_process(s);
        if let Some(j) = j {
            links.segments.push(j.peer_segment);
            links.use_shm_for(r, j.link, j.cons);
            used = true;
        }
        ranks.push(r);
    }
    if let Some(own) = own.filter(|_| used) {
        links.my_sleep.push(own.sleep_flag());
        links.segments.push(own.into_segment());
    }
    Ok(ranks)
}

/// The link to the peer of `offer` (its ring `offer.ring` in its segment
/// is ours to write) and our ring `i` for its frames.
fn link(own: &JoinSegment, i: usize, offer: &Offer, peer_segment: Segment) -> io::Result<Joined> {
    let rb = ring_bytes();
    let cap = ring_cap();
    let base = peer_segment.base();
    // SAFETY: `map` checked that ring `offer.ring` lies inside the peer's
    // segment; only we write it (the peer kept it for us); the segment stays
    // mapped as long as the engine (`Links::segments`).
    let prod = unsafe { Producer::new(base.add(SEG_CTL + offer.ring * rb), cap) };
    // SAFETY: ring `i` of our own segment was kept for this peer alone.
    let cons = unsafe { Consumer::new(own.seg.base().add(SEG_CTL + i * rb), cap) };
    // SAFETY: the peer's sleep word, the first of its segment.
    let peer_sleep = unsafe { SleepFlag::new(base as *const AtomicU32) };
    // SAFETY: the copy table follows the rings, line aligned (the segment is
    // page aligned, `SEG_CTL` and ring sizes are lines), inside the mapping.
    let peer_coop = unsafe { PeerSlots::new(base.add(offer.len - coop::TABLE_BYTES)) };
    let peer_wake =
        SocketAddr::from_abstract_name(format!("metampi-{}-{}", offer.job, offer.rank))?;
    Ok(Joined {
        link: ShmLink {
            prod,
            peer_sleep,
            peer_wake,
            peer_coop,
        },
        cons,
        peer_segment,
    })
}
