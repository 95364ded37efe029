//! A rank's vertical channel to a router on the same machine: two byte pipes
//! (rank to router, router to rank) in one shared segment, so that a routed
//! message crosses the site's own transport, shared memory, on its way to and
//! from the wide-area link instead of two more loopback TCP hops.
//!
//! The pipes carry exactly the byte stream the TCP connection would (frames
//! back to back), so both ends parse it as before. The TCP connection stays:
//! its end tells either side that the other is gone, and it is the doorbell.
//! A side about to block raises its flag in the segment (then looks at the
//! pipes once more); whoever then writes data or frees room takes the flag
//! down and sends one byte on the connection. So a sleeper is woken once, and
//! a side that is awake pays nothing but a shared load.
//!
//! **Loans.** The router-to-rank pipe carries records: bytes (an 8-byte
//! header, then the bytes), or a loan (a header and an address): bytes that
//! stay in the router's memory, where the rank copies them from with
//! `process_vm_readv` and then counts the loan returned. A router that
//! received a long message from the wide-area link thus hands it on without
//! copying it into the pipe (its copy was a quarter of a receiving router's
//! time); the rank copies once either way. The router lends only once the
//! rank has shown it may read the router's memory (a probe at set-up), and
//! keeps what it lent until the rank returns it. The rank-to-router pipe
//! stays a plain byte stream.
//!
//! Segment layout: line 0 magic and token, line 1 the rank's flag, line 2 the
//! router's flag, line 3 the router's pid and probe address and the rank's
//! verdict on lending, line 4 the loans returned, then the rank-to-router pipe
//! and the router-to-rank pipe, each a 128-byte control block (consumer and
//! producer positions on lines of their own) and `cap` bytes.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::BytesMut;

use super::ring::{Shm, CTL_BYTES};
use super::shm::Segment;

const MAGIC: &[u8; 8] = b"MPVCHAN1";
const OFFER_MAGIC: &[u8; 4] = b"MPVO";
const HEADER: usize = 320;
const FLAG_RANK: usize = 64;
const FLAG_ROUTER: usize = 128;
/// Router's pid (u32), the rank's verdict on loans (u32: 1 yes, 2 no), the
/// address of the router's probe bytes (u64).
const LOAN_PID: usize = 192;
const LOAN_OK: usize = 196;
const LOAN_PROBE: usize = 200;
/// Loans the rank has finished copying (u64).
const RETURNED: usize = 256;
/// What a rank must read at the probe address to take loans.
static PROBE: [u8; 16] = *b"metampi vchan ok";
/// Header of a record in the router-to-rank pipe: length (u32), kind (u32).
const REC: usize = 8;
const REC_BYTES: u32 = 0;
/// A loan record adds the address (u64) after its header.
const REC_LOAN: u32 = 1;
const LOAN_REC: usize = REC + 8;
const PIPE_CTL: usize = CTL_BYTES;
/// Bytes of the offer a rank sends after its hello: magic, log2 of the pipe
/// size, its node's hash, the token naming the segment (all zero: no offer).
pub const OFFER_LEN: usize = 32;
/// Pipe sizes a router accepts.
const MIN_CAP: usize = 4 << 10;
const MAX_CAP: usize = 64 << 20;

/// What a rank proposes to its router.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offer {
    pub node: u64,
    pub token: [u8; 16],
    pub cap: usize,
}

impl Offer {
    /// The offer that proposes nothing (the rank keeps TCP).
    pub fn none() -> [u8; OFFER_LEN] {
        let mut b = [0u8; OFFER_LEN];
        b[..4].copy_from_slice(OFFER_MAGIC);
        b
    }

    pub fn encode(&self) -> [u8; OFFER_LEN] {
        let mut b = Self::none();
        b[4] = self.cap.trailing_zeros() as u8;
        b[8..16].copy_from_slice(&self.node.to_le_bytes());
        b[16..32].copy_from_slice(&self.token);
        b
    }

    /// `Err` for bytes that are not an offer at all; `Ok(None)` for "no offer".
    pub fn decode(b: &[u8]) -> Result<Option<Offer>, String> {
        if b.len() != OFFER_LEN || &b[..4] != OFFER_MAGIC {
            return Err("the rank's channel offer is malformed".into());
        }
        let token: [u8; 16] = b[16..32].try_into().expect("16 bytes");
        if token == [0; 16] {
            return Ok(None);
        }
        let cap = 1usize.checked_shl(u32::from(b[4])).unwrap_or(0);
        if !(MIN_CAP..=MAX_CAP).contains(&cap) {
            return Err(format!("the rank offered pipes of {cap} bytes"));
        }
        Ok(Some(Offer {
            node: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            token,
            cap,
        }))
    }

    fn path(&self) -> PathBuf {
        let hex = metampi_launch::auth::hex(&self.token);
        super::shm::dir().join(format!("metampi-v-{hex}"))
    }
}

/// A name's hash, to tell whether a router runs on the rank's (emulated) node.
pub fn node_hash(name: &str) -> u64 {
    crate::hash::fnv1a(name.bytes())
}

/// One end of a byte pipe: the producer's (`mine` is the tail) or the
/// consumer's (`mine` is the head). `other` caches the far end's position.
struct End<M: PipeMemory = Shm> {
    mem: M,
    cap: usize,
    mine: u64,
    other: u64,
}

/// The memory a pipe lives in, and the only ways a pipe's code touches it:
/// the shared segment in the library (`ring::Shm`); loom's checked atomics
/// and cells in the model tests (`loom_model` below), which so run the
/// pipe's code unchanged.
trait PipeMemory {
    /// The consumer's position.
    fn head(&self, order: Ordering) -> u64;
    fn set_head(&self, head: u64, order: Ordering);
    /// The producer's position.
    fn tail(&self, order: Ordering) -> u64;
    fn set_tail(&self, tail: u64, order: Ordering);
    /// Copies `n` bytes from `src` to data offset `off`.
    ///
    /// # Safety
    /// `[off, off + n)` is inside the data area and free space the producer
    /// owns; `src` is valid for reads of `n` bytes.
    unsafe fn copy_in(&self, off: usize, src: *const u8, n: usize);
    /// Copies `n` bytes from data offset `off` to `dst`.
    ///
    /// # Safety
    /// `[off, off + n)` is inside the data area, published and not yet freed;
    /// `dst` is valid for writes of `n` bytes.
    unsafe fn copy_out(&self, off: usize, dst: *mut u8, n: usize);
}

/// A pipe in the channel's segment has a ring's layout: its control block
/// (consumer and producer positions), then its data.
impl PipeMemory for Shm {
    #[inline(always)]
    fn head(&self, order: Ordering) -> u64 {
        super::ring::Memory::head(self, order)
    }
    #[inline(always)]
    fn set_head(&self, head: u64, order: Ordering) {
        super::ring::Memory::set_head(self, head, order)
    }
    #[inline(always)]
    fn tail(&self, order: Ordering) -> u64 {
        // SAFETY: `ctl` is valid while the end is (see `End::new`).
        unsafe { (*self.ctl).tail.0.load(order) }
    }
    #[inline(always)]
    fn set_tail(&self, tail: u64, order: Ordering) {
        // SAFETY: as above.
        unsafe { (*self.ctl).tail.0.store(tail, order) }
    }
    #[inline(always)]
    unsafe fn copy_in(&self, off: usize, src: *const u8, n: usize) {
        // SAFETY: per the contract.
        unsafe { super::copy::copy_raw(src, self.data.add(off), n) }
    }
    #[inline(always)]
    unsafe fn copy_out(&self, off: usize, dst: *mut u8, n: usize) {
        // SAFETY: per the contract.
        unsafe { super::copy::copy_raw(self.data.add(off), dst, n) }
    }
}

impl End {
    /// # Safety
    /// `base` points to `PIPE_CTL + cap` bytes of pipe memory, 64-byte aligned,
    /// that outlive the end; there is one producer and one consumer per pipe.
    unsafe fn new(base: *mut u8, cap: usize, producer: bool) -> End {
        // SAFETY: per the contract.
        End::in_memory(unsafe { Shm::at(base) }, cap, producer)
    }
}

impl<M: PipeMemory> End<M> {
    /// One end of the pipe in `mem`, of `cap` data bytes.
    fn in_memory(mem: M, cap: usize, producer: bool) -> End<M> {
        let (head, tail) = (mem.head(Ordering::Acquire), mem.tail(Ordering::Acquire));
        let (mine, other) = if producer { (tail, head) } else { (head, tail) };
        End {
            mem,
            cap,
            mine,
            other,
        }
    }

    /// Producer: bytes that may be written now.
    fn room(&mut self) -> usize {
        let used = (self.mine - self.other) as usize;
        if used == self.cap {
            self.other = self.mem.head(Ordering::Acquire);
        }
        self.cap - (self.mine - self.other) as usize
    }

    /// Producer: room for `want` bytes, looking at the consumer's position
    /// again if the cached one leaves too little.
    fn room_for(&mut self, want: usize) -> usize {
        let room = self.room();
        if room >= want {
            return room;
        }
        self.other = self.mem.head(Ordering::Acquire);
        self.cap - (self.mine - self.other) as usize
    }

    /// Consumer: bytes that may be read now.
    fn available(&mut self) -> usize {
        if self.mine == self.other {
            self.other = self.mem.tail(Ordering::Acquire);
        }
        (self.other - self.mine) as usize
    }

    /// Producer: copies as much of `bufs` as fits and publishes it.
    fn write(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        let mut room = self.room();
        if room < bufs.iter().map(|b| b.len()).sum::<usize>() {
            // Look again: the consumer may have freed more since we cached.
            self.other = self.mem.head(Ordering::Acquire);
            room = self.cap - (self.mine - self.other) as usize;
        }
        let mut done = 0;
        for b in bufs {
            let n = b.len().min(room - done);
            let off = (self.mine as usize + done) % self.cap;
            let first = n.min(self.cap - off);
            // SAFETY: [mine, mine + room) is free pipe space owned by the
            // producer until the tail is published; `off + first <= cap`
            // and the wrapped rest starts at 0 and is shorter than `cap`.
            unsafe {
                self.mem.copy_in(off, b.as_ptr(), first);
                self.mem.copy_in(0, b.as_ptr().add(first), n - first);
            }
            done += n;
            if n < b.len() {
                break;
            }
        }
        if done > 0 {
            self.mine += done as u64;
            self.mem.set_tail(self.mine, Ordering::Release);
        }
        done
    }

    /// Consumer: copies up to `n` bytes to `dst` and frees them.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `n` bytes.
    unsafe fn read_to(&mut self, dst: *mut u8, n: usize) -> usize {
        let mut avail = self.available();
        if avail < n {
            self.other = self.mem.tail(Ordering::Acquire);
            avail = (self.other - self.mine) as usize;
        }
        let n = n.min(avail);
        if n == 0 {
            return 0;
        }
        let off = self.mine as usize % self.cap;
        let first = n.min(self.cap - off);
        // SAFETY: [mine, mine + n) was published by the producer (Release,
        // read after an Acquire load) and is not touched by it until the head
        // moves; `dst` takes `n` bytes (the caller's contract).
        unsafe {
            self.mem.copy_out(off, dst, first);
            self.mem.copy_out(0, dst.add(first), n - first);
        }
        self.mine += n as u64;
        self.mem.set_head(self.mine, Ordering::Release);
        n
    }
}

/// Which end of the channel this process holds.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    Rank,
    Router,
}

/// One end of a vertical channel.
pub struct VChan {
    seg: Segment,
    tx: End,
    rx: End,
    side: Side,
    /// Rank: the record of the router-to-rank pipe being read.
    cur: Rec,
    /// Rank: the router's pid (loans are read from it).
    router: i32,
}

/// Where a rank is in the router-to-rank pipe's records.
#[derive(Clone, Copy)]
enum Rec {
    /// Between records.
    None,
    /// Bytes left of a bytes record.
    Bytes(usize),
    /// A loan of `len` bytes at `addr` in the router, `off` of them copied.
    Loan { addr: u64, len: usize, off: usize },
}

// SAFETY: the channel is pointers into a mapping it owns; the pipe protocol is
// safe from any thread as long as each end is used by one thread at a time,
// which `&mut self` on every moving operation ensures.
unsafe impl Send for VChan {}

impl VChan {
    fn len(cap: usize) -> usize {
        HEADER + 2 * (PIPE_CTL + cap)
    }

    /// The rank's side: a new segment for a router on node `node` (a hash),
    /// with pipes of `cap` bytes (a power of two). The file stays until
    /// [`VChan::unlink`], after the router's answer.
    pub fn create(node: u64, cap: usize) -> io::Result<(VChan, Offer)> {
        let cap = cap.clamp(MIN_CAP, MAX_CAP).next_power_of_two();
        let offer = Offer {
            node,
            token: metampi_launch::auth::nonce()?,
            cap,
        };
        let seg = Segment::create_reserved(&offer.path(), Self::len(cap))?;
        // SAFETY: the fresh mapping is at least HEADER bytes; nobody else has
        // it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), seg.base(), 8);
            std::ptr::copy_nonoverlapping(offer.token.as_ptr(), seg.base().add(8), 16);
        }
        Ok((Self::ends(seg, cap, Side::Rank), offer))
    }

    /// The router's side: maps the segment an offer names, checks that it is
    /// the rank's, and removes its name.
    pub fn open(offer: &Offer) -> io::Result<VChan> {
        let path = offer.path();
        let seg = Segment::open(&path, Self::len(offer.cap))?;
        // SAFETY: the mapping is at least HEADER bytes long (checked by `open`).
        let head = unsafe { std::slice::from_raw_parts(seg.base(), 24) };
        if &head[..8] != MAGIC || head[8..24] != offer.token {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the offered segment is not the rank's",
            ));
        }
        seg.unlink();
        let v = Self::ends(seg, offer.cap, Side::Router);
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        v.word32(LOAN_PID).store(pid, Ordering::Relaxed);
        v.word64(LOAN_PROBE)
            .store(PROBE.as_ptr() as u64, Ordering::Relaxed);
        Ok(v)
    }

    /// The rank's side, once the router took the offer: may we read the
    /// router's memory (loans; `allowed`: we want them)? Says so to the
    /// router either way.
    pub fn probe_loans(&mut self, allowed: bool) -> bool {
        let pid = self.word32(LOAN_PID).load(Ordering::Acquire) as i32;
        let at = self.word64(LOAN_PROBE).load(Ordering::Acquire);
        let mut got = [0u8; 16];
        let ok =
            allowed && pid > 0 && super::cma::read_from(pid, at, &mut got).is_ok() && got == PROBE;
        self.router = pid;
        self.word32(LOAN_OK)
            .store(if ok { 1 } else { 2 }, Ordering::Release);
        ok
    }

    /// Bytes of the shared segment both pipes live in (what they cost each side).
    pub fn mapped(&self) -> usize {
        self.seg.len()
    }

    /// The router's side: whether the rank takes loans.
    pub fn lending(&self) -> bool {
        self.word32(LOAN_OK).load(Ordering::Acquire) == 1
    }

    /// The router's side: loans the rank has finished with (they are
    /// returned in the order they were made).
    pub fn returned(&self) -> u64 {
        self.word64(RETURNED).load(Ordering::Acquire)
    }

    /// The router's side: lends `len` bytes at `addr` (they must stay there
    /// until [`VChan::returned`] counts this loan). False when the pipe has
    /// no room for the record.
    pub fn lend(&mut self, addr: u64, len: usize) -> bool {
        let mut rec = [0u8; LOAN_REC];
        rec[..4].copy_from_slice(&(len as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&REC_LOAN.to_le_bytes());
        rec[8..].copy_from_slice(&addr.to_le_bytes());
        self.tx.room_for(LOAN_REC) >= LOAN_REC && self.tx.write(&[IoSlice::new(&rec)]) == LOAN_REC
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is a 4-byte aligned offset inside the header of the
        // live mapping.
        unsafe { &*(self.seg.base().add(at) as *const AtomicU32) }
    }

    fn word64(&self, at: usize) -> &AtomicU64 {
        // SAFETY: as above, 8-byte aligned.
        unsafe { &*(self.seg.base().add(at) as *const AtomicU64) }
    }

    fn ends(seg: Segment, cap: usize, side: Side) -> VChan {
        let up = HEADER;
        let down = HEADER + PIPE_CTL + cap;
        let (tx, rx) = match side {
            Side::Rank => (up, down),
            Side::Router => (down, up),
        };
        // SAFETY: both pipes lie inside the mapping (its length is `len(cap)`),
        // 64-byte aligned; the rank produces on the up pipe and consumes the
        // down one, the router the other way round, one process each.
        let (tx, rx) = unsafe {
            (
                End::new(seg.base().add(tx), cap, true),
                End::new(seg.base().add(rx), cap, false),
            )
        };
        VChan {
            seg,
            tx,
            rx,
            side,
            cur: Rec::None,
            router: 0,
        }
    }

    /// Removes the segment's name (the mappings stay).
    pub fn unlink(&self) {
        self.seg.unlink();
    }

    fn flag(&self, side: Side) -> &AtomicU32 {
        let at = if side == Side::Rank {
            FLAG_RANK
        } else {
            FLAG_ROUTER
        };
        // SAFETY: the flag words lie inside the header of the live mapping and
        // are 64-byte aligned.
        unsafe { &*(self.seg.base().add(at) as *const AtomicU32) }
    }

    /// Copies as much of `bufs` as fits into the outgoing pipe (the
    /// router's, as one bytes record).
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        if self.side == Side::Rank {
            return self.tx.write(bufs);
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let n = self.tx.room_for(REC + total).saturating_sub(REC).min(total);
        if n == 0 {
            return 0;
        }
        let mut hdr = [0u8; REC];
        hdr[..4].copy_from_slice(&(n as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&REC_BYTES.to_le_bytes());
        let mut parts = Vec::with_capacity(bufs.len() + 1);
        parts.push(IoSlice::new(&hdr));
        let mut left = n;
        for b in bufs {
            let k = b.len().min(left);
            parts.push(IoSlice::new(&b[..k]));
            left -= k;
            if left == 0 {
                break;
            }
        }
        let wrote = self.tx.write(&parts);
        debug_assert_eq!(wrote, REC + n, "room was measured");
        n
    }

    /// The rank's side: copies up to `n` bytes of the router-to-rank pipe's
    /// records to `dst`, bytes out of the pipe and loans out of the router.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `n` bytes.
    unsafe fn read_records(&mut self, dst: *mut u8, n: usize) -> io::Result<usize> {
        let mut done = 0;
        while done < n {
            match self.cur {
                Rec::None => {
                    if self.rx.available() < REC {
                        break;
                    }
                    let mut hdr = [0u8; LOAN_REC];
                    // SAFETY: `hdr` takes REC bytes.
                    unsafe { self.rx.read_to(hdr.as_mut_ptr(), REC) };
                    let len = u32::from_le_bytes(hdr[..4].try_into().expect("4")) as usize;
                    self.cur = match u32::from_le_bytes(hdr[4..8].try_into().expect("4")) {
                        REC_BYTES => Rec::Bytes(len),
                        REC_LOAN => {
                            // The address was published with the header.
                            // SAFETY: `hdr` takes 8 more bytes.
                            unsafe { self.rx.read_to(hdr.as_mut_ptr().add(REC), 8) };
                            let addr = u64::from_le_bytes(hdr[REC..].try_into().expect("8"));
                            Rec::Loan { addr, len, off: 0 }
                        }
                        k => {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("router pipe record of unknown kind {k}"),
                            ))
                        }
                    };
                }
                Rec::Bytes(left) => {
                    // SAFETY: `dst + done` has `n - done` writable bytes.
                    let k = unsafe { self.rx.read_to(dst.add(done), left.min(n - done)) };
                    if k == 0 {
                        break;
                    }
                    done += k;
                    self.cur = if k == left {
                        Rec::None
                    } else {
                        Rec::Bytes(left - k)
                    };
                }
                Rec::Loan { addr, len, off } => {
                    let k = (len - off).min(n - done);
                    // SAFETY: `dst + done` has `k` writable bytes.
                    let to = unsafe { std::slice::from_raw_parts_mut(dst.add(done), k) };
                    super::cma::read_from(self.router, addr + off as u64, to)?;
                    done += k;
                    if off + k == len {
                        self.cur = Rec::None;
                        self.word64(RETURNED).fetch_add(1, Ordering::Release);
                    } else {
                        self.cur = Rec::Loan {
                            addr,
                            len,
                            off: off + k,
                        };
                    }
                }
            }
        }
        Ok(done)
    }

    /// Copies up to `n` bytes from the incoming pipe to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `n` bytes.
    unsafe fn read_raw(&mut self, dst: *mut u8, n: usize) -> io::Result<usize> {
        // SAFETY: forwarded contract.
        unsafe {
            match self.side {
                Side::Rank => self.read_records(dst, n),
                Side::Router => Ok(self.rx.read_to(dst, n)),
            }
        }
    }

    /// Bytes waiting in the incoming pipe.
    #[cfg(test)]
    fn readable(&mut self) -> usize {
        self.rx.available()
    }

    /// Room in the outgoing pipe.
    #[cfg(test)]
    fn writable(&mut self) -> usize {
        self.tx.room()
    }

    /// Bytes waiting in the incoming pipe (without updating the cached
    /// position, so that shared references can look).
    pub fn peek_readable(&self) -> usize {
        (self.rx.mem.tail(Ordering::Acquire) - self.rx.mine) as usize
    }

    /// Room in the outgoing pipe, likewise.
    pub fn peek_writable(&self) -> usize {
        self.tx.cap - (self.tx.mine - self.tx.mem.head(Ordering::Acquire)) as usize
    }

    /// Copies up to `dst.len()` bytes from the incoming pipe. An error only
    /// where the rank cannot copy a loan (the router is gone).
    pub fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `dst` is valid for writes of its length.
        unsafe { self.read_raw(dst.as_mut_ptr(), dst.len()) }
    }

    /// Appends up to `max` bytes from the incoming pipe to `buf`.
    pub fn read_append(&mut self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        buf.reserve(max);
        let spare = buf.spare_capacity_mut();
        let n = max.min(spare.len());
        // SAFETY: `spare` has `n` or more writable bytes owned by `buf`; only
        // the bytes copied in are then marked initialised.
        unsafe {
            let got = self.read_raw(spare.as_mut_ptr().cast(), n)?;
            buf.set_len(buf.len() + got);
            Ok(got)
        }
    }

    /// Raises (or lowers) this side's flag: "wake me with a byte". Raise
    /// every flag, then fence once, then look at the pipes once more before
    /// blocking. A rank fences with [`super::sleep_fence`] (it pairs with the
    /// cheap `publish_fence` of every writer it may sleep on, the router's
    /// `notify` among them); a router with [`super::store_load_fence`], since
    /// ranks `notify` it with a full barrier.
    pub fn arm(&self, on: bool) {
        self.flag(self.side).store(u32::from(on), Ordering::SeqCst);
    }

    /// After writing data or freeing room: wakes the other side if it sleeps.
    pub fn notify(&self, bell: &TcpStream) {
        let peer = match self.side {
            Side::Rank => Side::Router,
            Side::Router => Side::Rank,
        };
        match self.side {
            // A router sleeps far more often than a rank writes to it (without
            // spinning, between any two frames), so the rank pays the barrier
            // here, a locked instruction per routed record, rather than the
            // router a `membarrier` (interrupts to every CPU) per sleep: that
            // was a third of a receiving router's time in 4 MiB streaming.
            Side::Rank => super::store_load_fence(),
            Side::Router => super::publish_fence(),
        }
        let f = self.flag(peer);
        if f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::SeqCst) != 0 {
            // A full socket buffer already holds a wake-up.
            let mut s = bell;
            let _ = s.write(&[1]);
        }
    }
}

/// Reads the wake-up bytes waiting on a channel's connection; `false` once
/// the other side has closed it.
pub fn drain_bell(bell: &TcpStream) -> io::Result<bool> {
    let mut b = [0u8; 64];
    let mut s = bell;
    loop {
        match s.read(&mut b) {
            Ok(0) => return Ok(false),
            // A short read emptied the socket: no second call to learn so.
            Ok(n) if n < b.len() => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(cap: usize) -> (VChan, VChan) {
        let (rank, offer) = VChan::create(node_hash("n0"), cap).unwrap();
        let wire = Offer::decode(&offer.encode()).unwrap().unwrap();
        assert_eq!(wire, offer);
        let router = VChan::open(&wire).unwrap();
        assert!(!offer.path().exists(), "the router removes the name");
        (rank, router)
    }

    #[test]
    fn bytes_flow_both_ways_in_order_across_the_wrap() {
        let (mut a, mut b) = pair(4096);
        let mut sent = 0u64;
        let mut got = 0u64;
        let mut buf = vec![0u8; 1000];
        while got < 100_000 {
            let chunk: Vec<u8> = (0..777).map(|i| ((sent + i) % 251) as u8).collect();
            let n = a.write_vectored(&[IoSlice::new(&chunk[..300]), IoSlice::new(&chunk[300..])]);
            sent += n as u64;
            let k = b.read(&mut buf).unwrap();
            for (i, &x) in buf[..k].iter().enumerate() {
                assert_eq!(x, ((got + i as u64) % 251) as u8);
            }
            got += k as u64;
        }
        // And back, through `read_append`.
        assert_eq!(b.write_vectored(&[IoSlice::new(b"pong")]), 4);
        let mut m = BytesMut::from(&b"> "[..]);
        assert_eq!(a.read_append(&mut m, 100).unwrap(), 4);
        assert_eq!(&m[..], b"> pong");
        assert_eq!(a.readable(), 0);
    }

    #[test]
    fn a_full_pipe_takes_what_fits_and_no_more() {
        let (mut a, mut b) = pair(4096);
        let big = vec![7u8; 5000];
        assert_eq!(a.write_vectored(&[IoSlice::new(&big)]), 4096);
        assert_eq!(a.writable(), 0);
        assert_eq!(a.write_vectored(&[IoSlice::new(b"x")]), 0);
        let mut out = vec![0u8; 100];
        assert_eq!(b.read(&mut out).unwrap(), 100);
        assert_eq!(a.writable(), 100);
        assert_eq!(b.readable(), 3996);
    }

    /// Bytes and loans through the router-to-rank pipe arrive as one stream
    /// in order, across the wrap, and each loan is returned once copied.
    #[test]
    fn loans_and_bytes_make_one_stream() {
        let (mut rank, mut router) = pair(4096);
        assert!(!router.lending(), "no loans before the rank's probe");
        assert!(rank.probe_loans(true));
        assert!(router.lending());
        let pattern = |k: usize, i: usize| ((i * 7 + k * 13) % 251) as u8;
        let mut expect = Vec::new();
        let mut got = Vec::new();
        let mut lent: Vec<Vec<u8>> = Vec::new();
        let mut buf = vec![0u8; 1500];
        let mut drain = |rank: &mut VChan, got: &mut Vec<u8>| {
            let n = rank.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            n
        };
        for k in 0..40 {
            let small: Vec<u8> = (0..(k * 37) % 900 + 1).map(|i| pattern(k, i)).collect();
            // A full pipe takes part of it, or nothing: the rest goes next time.
            let mut sent = 0;
            while sent < small.len() {
                sent += router.write_vectored(&[IoSlice::new(&small[sent..])]);
                drain(&mut rank, &mut got);
            }
            expect.extend_from_slice(&small);
            let big: Vec<u8> = (0..20_000 + k * 1000).map(|i| pattern(k + 1, i)).collect();
            while !router.lend(big.as_ptr() as u64, big.len()) {
                drain(&mut rank, &mut got);
            }
            expect.extend_from_slice(&big);
            lent.push(big);
        }
        while got.len() < expect.len() {
            assert!(drain(&mut rank, &mut got) > 0, "the stream ended early");
        }
        assert!(got == expect, "the stream differs");
        assert_eq!(router.returned(), 40);
        assert_eq!(drain(&mut rank, &mut got), 0);
    }

    #[test]
    fn a_rank_that_refuses_gets_no_loans_and_bad_records_are_errors() {
        let (mut rank, mut router) = pair(4096);
        assert!(!rank.probe_loans(false));
        assert!(!router.lending());
        // A record of a kind nobody writes.
        let mut rec = [0u8; REC];
        rec[..4].copy_from_slice(&4u32.to_le_bytes());
        rec[4..].copy_from_slice(&9u32.to_le_bytes());
        router
            .tx
            .write(&[IoSlice::new(&rec), IoSlice::new(b"abcd")]);
        let e = rank.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    /// 64 bytes, aligned as a segment's lines are.
    #[derive(Clone)]
    #[repr(C, align(64))]
    struct Chunk([u8; 64]);

    /// The producer's and the consumer's end of a pipe of `cap` data bytes in
    /// zeroed heap memory, and that memory (keep it alive while the ends are:
    /// moving the `Vec` leaves its buffer where it is). No segment and no
    /// mapping, so that Miri runs the ends' pointer arithmetic (`.ci/miri.sh`).
    fn heap_pipe(cap: usize) -> (Vec<Chunk>, End, End) {
        let mut mem = vec![Chunk([0; 64]); (PIPE_CTL + cap).div_ceil(64)];
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` is zeroed, 64-byte aligned, `PIPE_CTL + cap` bytes or
        // more, and outlives the ends (the caller's part); one end of each kind.
        let (tx, rx) = unsafe { (End::new(base, cap, true), End::new(base, cap, false)) };
        (mem, tx, rx)
    }

    /// Byte `i` of a test stream.
    fn nth(i: u64) -> u8 {
        (i % 251) as u8
    }

    /// Writes of 0-69 bytes in three slices and reads of 0-49 go round a pipe
    /// of 64 bytes: either side meets the wrap, a full pipe takes a prefix,
    /// and every byte arrives once, in order.
    #[test]
    fn a_pipe_in_plain_memory_keeps_bytes_in_order_across_the_wrap() {
        const CAP: usize = 64;
        let (_mem, mut tx, mut rx) = heap_pipe(CAP);
        let (mut sent, mut got) = (0u64, 0u64);
        let mut out = [0u8; 64];
        let mut read = |rx: &mut End, got: &mut u64, want: usize| {
            // SAFETY: `out` takes `want` (at most 64) bytes.
            let k = unsafe { rx.read_to(out.as_mut_ptr(), want) };
            for (i, &b) in out[..k].iter().enumerate() {
                assert_eq!(b, nth(*got + i as u64), "byte {}", *got + i as u64);
            }
            *got += k as u64;
            k
        };
        for round in 0..300u64 {
            // The stream from the first byte not yet taken: what did not fit
            // last time is offered again.
            let data: Vec<u8> = (sent..sent + round * 13 % 70).map(nth).collect();
            let (a, b) = (data.len() / 3, data.len() * 2 / 3);
            let slices = [
                IoSlice::new(&data[..a]),
                IoSlice::new(&data[a..b]),
                IoSlice::new(&data[b..]),
            ];
            let n = tx.write(&slices);
            let waiting = (sent - got) as usize;
            assert_eq!(n, data.len().min(CAP - waiting), "round {round}");
            sent += n as u64;
            assert_eq!(rx.mem.tail(Ordering::Acquire), sent);
            read(&mut rx, &mut got, (round * 11 % 50) as usize);
            assert_eq!(tx.mem.head(Ordering::Acquire), got);
        }
        while read(&mut rx, &mut got, 64) > 0 {}
        assert_eq!(got, sent);
        assert!(sent > 100 * CAP as u64, "the pipe went round {sent} bytes");
    }

    /// The two ends on two threads: the bytes arrive in order, and under Miri
    /// a copy out that is not ordered after the copy in (or a copy in over
    /// bytes not yet copied out) is reported as a data race.
    #[test]
    fn a_pipe_in_plain_memory_between_two_threads() {
        const CAP: usize = 64;
        let n: u64 = if cfg!(miri) { 3_000 } else { 300_000 };
        let (mem, mut tx, mut rx) = heap_pipe(CAP);
        let reader = std::thread::spawn(move || {
            let mut got = 0u64;
            let mut out = [0u8; 40];
            while got < n {
                let want = (got % 37 + 1) as usize;
                // SAFETY: `out` takes `want` (at most 37) bytes.
                let k = unsafe { rx.read_to(out.as_mut_ptr(), want) };
                for (i, &b) in out[..k].iter().enumerate() {
                    assert_eq!(b, nth(got + i as u64), "byte {}", got + i as u64);
                }
                got += k as u64;
                if k == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut sent = 0u64;
        while sent < n {
            let data: Vec<u8> = (sent..n.min(sent + sent % 53 + 1)).map(nth).collect();
            let k = tx.write(&[IoSlice::new(&data)]);
            sent += k as u64;
            if k == 0 {
                assert!(!reader.is_finished(), "the reader stopped early");
                std::thread::yield_now();
            }
        }
        reader.join().unwrap();
        drop(mem);
    }

    #[test]
    fn offers_are_checked() {
        assert_eq!(Offer::decode(&Offer::none()), Ok(None));
        assert!(Offer::decode(&[0u8; OFFER_LEN]).is_err());
        let mut huge = Offer {
            node: 1,
            token: [9; 16],
            cap: 1 << 20,
        }
        .encode();
        huge[4] = 40;
        assert!(Offer::decode(&huge).is_err());
        // A token that names no segment (another machine) cannot be opened.
        let missing = Offer {
            node: 1,
            token: [9; 16],
            cap: 1 << 20,
        };
        assert!(VChan::open(&missing).is_err());
    }

    #[test]
    fn a_sleeper_is_rung_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let rank_bell = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (router_bell, _) = l.accept().unwrap();
        router_bell.set_nonblocking(true).unwrap();
        let (mut a, b) = pair(4096);
        // Awake: no byte.
        a.write_vectored(&[IoSlice::new(b"1")]);
        a.notify(&rank_bell);
        b.arm(true);
        crate::sleep_fence();
        a.write_vectored(&[IoSlice::new(b"2")]);
        a.notify(&rank_bell);
        a.write_vectored(&[IoSlice::new(b"3")]);
        a.notify(&rank_bell);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut got = [0u8; 8];
        let n = (&router_bell).read(&mut got).unwrap();
        assert_eq!(n, 1, "one wake-up for one sleep");
        assert!(drain_bell(&router_bell).unwrap());
        drop(rank_bell);
        assert!(!drain_bell(&router_bell).unwrap());
    }
}

/// Loom model of a byte pipe: the producer and consumer code of `End`, run
/// on memory whose positions and bytes loom tracks, in every interleaving
/// it allows (decision 0049). `bash .ci/loom.sh` runs it.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64 as LoomU64;
    use loom::sync::Arc;

    struct Model {
        head: LoomU64,
        tail: LoomU64,
        bytes: Vec<UnsafeCell<u8>>,
    }

    impl PipeMemory for Arc<Model> {
        fn head(&self, order: Ordering) -> u64 {
            self.head.load(order)
        }
        fn set_head(&self, head: u64, order: Ordering) {
            self.head.store(head, order)
        }
        fn tail(&self, order: Ordering) -> u64 {
            self.tail.load(order)
        }
        fn set_tail(&self, tail: u64, order: Ordering) {
            self.tail.store(tail, order)
        }
        unsafe fn copy_in(&self, off: usize, src: *const u8, n: usize) {
            for i in 0..n {
                // SAFETY: per the contract `src` has `n` bytes; loom checks
                // the cell's access.
                let b = unsafe { *src.add(i) };
                // SAFETY: the pointer is the cell's own.
                self.bytes[off + i].with_mut(|p| unsafe { *p = b });
            }
        }
        unsafe fn copy_out(&self, off: usize, dst: *mut u8, n: usize) {
            for i in 0..n {
                // SAFETY: the pointer is the cell's own; loom checks the access.
                let b = self.bytes[off + i].with(|p| unsafe { *p });
                // SAFETY: per the contract `dst` takes `n` bytes.
                unsafe { *dst.add(i) = b };
            }
        }
    }

    /// Bytes 0..6 written in pieces of 3 through a pipe of 4 bytes and read
    /// in pieces of up to 3 (the second write and some reads wrap) arrive
    /// whole and in order.
    #[test]
    fn bytes_arrive_in_order_through_a_small_pipe() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(1);
        b.check(|| {
            const N: usize = 6;
            const CAP: usize = 4;
            let mem = Arc::new(Model {
                head: LoomU64::new(0),
                tail: LoomU64::new(0),
                bytes: (0..CAP).map(|_| UnsafeCell::new(0)).collect(),
            });
            let mut tx = End::in_memory(mem.clone(), CAP, true);
            let mut rx = End::in_memory(mem, CAP, false);
            let reader = loom::thread::spawn(move || {
                let mut got = [0u8; N];
                let mut n = 0;
                while n < N {
                    let want = (N - n).min(3);
                    // SAFETY: `got[n..]` takes `want` bytes.
                    let k = unsafe { rx.read_to(got.as_mut_ptr().add(n), want) };
                    if k == 0 {
                        loom::thread::yield_now();
                    }
                    n += k;
                }
                assert_eq!(got, [0, 1, 2, 3, 4, 5], "bytes in order");
            });
            let data: Vec<u8> = (0..N as u8).collect();
            let mut sent = 0;
            for piece in [3, 3] {
                let mut done = 0;
                while done < piece {
                    let part = &data[sent + done..sent + piece];
                    let k = tx.write(&[IoSlice::new(part)]);
                    if k == 0 {
                        loom::thread::yield_now();
                    }
                    done += k;
                }
                sent += piece;
            }
            reader.join().unwrap();
        });
    }
}
