//! The shared-memory backend: a ring per sender in the receiver's segment for
//! eager frames and rendezvous requests, long messages copied out of the
//! sender's memory (`sys::cma`) with its help where it is waiting
//! ([`super::super::coop`]), and the sleep flags and wake-up datagrams that
//! let either side block. Its eager limit is the smaller of the tuned one and
//! what a ring record holds; its fragment is a ring record.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::super::coop::{self, PeerSlots};
use super::super::core::{status_of, Core, Pattern, Pull, RawStatus, RecvBuf};
use super::{Link, Links};
use crate::envelope::{Envelope, Kind, ENV_LEN, INLINE_MAX};
use crate::sys::cma;
use crate::sys::ring::{Consumer, HeadWatch, Producer};
use crate::sys::sleep_flag;

/// Records taken from one ring per progress pass, so one busy sender cannot starve others.
const RING_BATCH: usize = 64;

/// The sleep flag a rank raises (in its own segment) before blocking, so that
/// writers know to send a wake-up datagram.
pub(crate) struct SleepFlag(*const AtomicU32);

// SAFETY: points into a shared mapping kept alive by `Links::segments`.
unsafe impl Send for SleepFlag {}

impl SleepFlag {
    /// # Safety
    /// `p` must point to a 4-byte aligned word in a live shared mapping that
    /// outlives this flag.
    pub(crate) unsafe fn new(p: *const AtomicU32) -> SleepFlag {
        SleepFlag(p)
    }

    pub(crate) fn get(&self) -> &AtomicU32 {
        // SAFETY: contract of `new`.
        unsafe { &*self.0 }
    }
}

/// Wakes the shared-memory peer whose sleep word is `flag` (wake-up socket
/// `addr`) if it sleeps in its wait loop, once per sleep: the first writer
/// to see the flag up takes it down and sends the datagram; later writers
/// (more messages, freed ring space, other peers) see it down and send
/// nothing. The sleeper looks at everything when it wakes, so one datagram
/// is all it needs. Sending one per message while the flag stayed up cost a
/// `sendto` (1.5-4 µs) each: 1000 queued 8-byte messages taken by a
/// receiver whose sender slept took 1.8 µs apiece.
/// The caller has published and fenced first (`sys::sleep_flag`), so either
/// the sleeper sees what was published before it sleeps or its flag is seen here.
/// (A failed send needs no retry: a full queue wakes the sleeper anyway.)
fn wake_if_asleep(wake: &UnixDatagram, flag: &AtomicU32, addr: &SocketAddr) {
    if sleep_flag::take(flag) {
        send_wake(wake, addr);
    }
}

/// The wake-up datagram to a sleeper whose flag this process took down.
fn send_wake(wake: &UnixDatagram, addr: &SocketAddr) {
    WAKE_UPS.fetch_add(1, Ordering::Relaxed);
    let _ = wake.send_to_addr(&[1], addr);
}

/// After publishing to a peer's memory: the writer's fence, then the wake-up
/// where the peer sleeps ([`sleep_flag::must_wake_after_publish`]).
#[inline(always)]
fn published(wake: &UnixDatagram, flag: &AtomicU32, addr: &SocketAddr) {
    if sleep_flag::must_wake_after_publish(flag, crate::sys::publish_fence) {
        send_wake(wake, addr);
    }
}

/// Wake-up datagrams this process sent to shared-memory peers (for tests,
/// `counters::wake_ups_sent`).
pub(crate) static WAKE_UPS: AtomicU64 = AtomicU64::new(0);

pub(crate) struct ShmLink {
    pub prod: Producer,
    pub peer_sleep: SleepFlag,
    pub peer_wake: SocketAddr,
    /// The peer's cooperative-copy slots (it asks us to help through them).
    pub peer_coop: PeerSlots,
}

/// The payload of ring record `rec` whose envelope is `env` (inline or
/// after the envelope); `None` where the record is too short for it.
fn record_payload<'r>(env: &Envelope, rec: &'r [u8]) -> Option<&'r [u8]> {
    if env.is_inline() {
        rec.get(32..32 + env.len as usize)
    } else {
        rec.get(ENV_LEN..ENV_LEN + env.trailing_len())
    }
}

/// Whether process `pid` still exists (a zombie counts: it can no longer
/// copy, but its parent has not looked yet; the launcher ends the job).
fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

impl Links {
    /// The sleep word of world rank `w` when it shares memory with us.
    pub(crate) fn sleep_flag(&self, w: u32) -> Option<*const AtomicU32> {
        match self.peers.get(w as usize) {
            Some(Link::Shm(l)) => Some(l.peer_sleep.0),
            _ => None,
        }
    }

    /// Wakes world rank `w` if it sleeps (shared-memory peers; once per
    /// sleep, see [`wake_if_asleep`]).
    pub(crate) fn wake_peer(&self, w: u32) {
        if let Some(Link::Shm(l)) = self.peers.get(w as usize) {
            wake_if_asleep(&self.wake, l.peer_sleep.get(), &l.peer_wake);
        }
    }

    pub(crate) fn add_inbound(&mut self, src: u32, c: Consumer) {
        let s = src as usize;
        if self.in_at.len() <= s {
            self.in_at.resize(s + 1, u32::MAX);
        }
        self.in_at[s] = self.shm_in.len() as u32;
        self.shm_in.push((src, c));
        self.tcp.stale = true;
    }

    /// A receive's shortcut through the ring of shared-memory peer `src`:
    /// where the next message there is a plain eager one that `pat` matches,
    /// no receive posted earlier matches, and `buf` holds, it is read into
    /// `buf` and its status returned. Anything else stays for the full path
    /// (see [`super::Engine::recv_now`]).
    #[inline]
    pub(crate) fn take_ring_head(
        &mut self,
        core: &Core,
        src: u32,
        pat: &Pattern,
        buf: &mut RecvBuf,
    ) -> Option<RawStatus> {
        let i = *self.in_at.get(src as usize)?;
        let (_, cons) = self.shm_in.get_mut(i as usize)?;
        let mut got = None;
        cons.read_one(|rec| {
            let Some(mut env) = Envelope::decode(rec) else {
                return false;
            };
            env.src = src;
            if env.kind != Kind::Eager
                || !pat.matches(&env)
                || env.len as usize > buf.cap()
                || core.posted_match(&env)
            {
                return false;
            }
            let Some(payload) = record_payload(&env, rec) else {
                return false;
            };
            crate::sys::copy::copy(buf.prepare(payload.len()), payload);
            got = Some(status_of(&env, payload.len()));
            true
        })?;
        if got.is_some() {
            self.ring_freed(src);
        }
        got
    }

    /// Whether `src`'s ring holds a record now, and a watch on where its
    /// next one will be published; `None` where `src` has no ring. The rings
    /// are in this rank's own segment, mapped as long as the engine lives
    /// (`segments`).
    pub(crate) fn ring_head(&self, src: u32) -> Option<(bool, HeadWatch)> {
        let i = *self.in_at.get(src as usize)?;
        let cons = &self.shm_in.get(i as usize)?.1;
        Some((cons.has_record(), cons.watch()))
    }

    /// Whether the pass after posting a receive from `src`
    /// ([`Links::progress_ring_of`]) would find nothing to do: `src`'s ring
    /// is empty and nothing waits to go out.
    pub(crate) fn ring_pass_idle(&self, core: &Core, src: u32) -> bool {
        self.pending == 0
            && core.out.is_empty()
            && self
                .in_at
                .get(src as usize)
                .and_then(|&i| self.shm_in.get(i as usize))
                .is_some_and(|(_, c)| !c.has_record())
    }

    /// We took records from `src`'s ring: the writer may be asleep waiting
    /// for its space.
    #[inline]
    fn ring_freed(&self, src: u32) {
        if let Some(Link::Shm(l)) = self.peers.get(src as usize) {
            published(&self.wake, l.peer_sleep.get(), &l.peer_wake);
        }
    }

    /// Moves process `r` (added by [`Links::add_process`]) from its stream
    /// to shared memory: frames to it go to `prod`, its frames arrive in
    /// `cons`. Both ends switch before either sends anything (during spawn
    /// and start-up), so no frame can overtake another.
    pub(crate) fn use_shm_for(&mut self, r: u32, link: ShmLink, cons: Consumer) {
        self.peers[r as usize] = Link::Shm(link);
        self.tcp.stale = true;
        self.add_inbound(r, cons);
    }

    /// Copies a matched shared-memory rendezvous message out of its sender's
    /// memory. Where a slot is free, the sender is first asked to help
    /// (`Kind::Help`, written to its ring at once) and both copy chunks of it;
    /// a sender that is busy elsewhere leaves them all to us.
    pub(super) fn pull(&mut self, core: &mut Core, p: Pull) {
        let Some((addr, len)) = core
            .matched_target(p.id)
            .map(|d| (d.as_mut_ptr() as u64, d.len()))
        else {
            return;
        };
        let c = self.chan(p.src);
        // With more processes than cores, a helper that is not running only
        // costs a system call per chunk (8 ranks on 2 cores, all busy in 2 MiB
        // broadcasts: 1.76 -> 2.15 ms with help). Point-to-point traffic
        // between two ranks while the others sleep still has a core each
        // (8 ranks on 2 cores: 1 MiB ping-pong 110 -> 78 µs); collectives,
        // whose members wake and sleep by turns, do not ask (4 ranks on 2
        // cores: all-reduce and all-to-all 7-10% slower when they did).
        let cores_free = self
            .crowd
            .is_none_or(|(cores, unseen)| p.context % 2 == 0 && unseen + self.shm_awake() <= cores);
        let open = match (self.coop.as_mut(), self.peers.get(c)) {
            (Some(t), Some(Link::Shm(_))) if cores_free => t.open(),
            _ => None,
        };
        if let Some(o) = &open {
            let mut help = Envelope::new(Kind::Help, self.rank, p.context, p.tag, len as u64);
            help.dst = p.src;
            help.sreq = p.sreq;
            help.rreq = o.tag();
            help.addr = addr;
            self.queue(c, help.encode(None), None, None);
            self.flush(core, c);
        }
        let Some(dst) = core.matched_target(p.id) else {
            // Nothing here changes the request, but a helper told where to
            // write must be done before the slot is used again.
            if let (Some(o), Some(t)) = (open, self.coop.as_mut()) {
                t.finish(o, len, &mut |_| true, &mut || process_exists(p.pid));
            }
            return;
        };
        let mut copy = |r: std::ops::Range<usize>| {
            cma::read_from(p.pid, p.remote + r.start as u64, &mut dst[r]).is_ok()
        };
        let ok = match (open, self.coop.as_mut()) {
            (Some(o), Some(t)) => t.finish(o, len, &mut copy, &mut || process_exists(p.pid)),
            _ => copy(0..len),
        };
        core.finish_pull(&p, ok);
    }

    /// Helps receiver `src` copy our send named in its `Kind::Help`: chunks
    /// claimed from its slot are written into its buffer.
    pub(super) fn assist(&mut self, core: &Core, src: u32, env: &Envelope) {
        let Some(Link::Shm(l)) = self.peers.get(src as usize) else {
            return;
        };
        let (index, gen) = coop::untag(env.rreq);
        let (Some(slot), Some(bytes), Some(&pid)) = (
            l.peer_coop.slot(index),
            core.send_bytes_to(env.sreq, src),
            core.pids.get(src as usize),
        ) else {
            return;
        };
        if bytes.len() as u64 != env.len {
            return;
        }
        coop::help(slot, gen, bytes.len(), &mut |r| {
            cma::write_to(pid, env.addr + r.start as u64, &bytes[r]).is_ok()
        });
    }

    /// Takes up to [`RING_BATCH`] records from ring `i` of `shm_in` (`lazy`:
    /// see [`Links::progress_as`]); returns whether it took any.
    pub(super) fn drain_ring(&mut self, core: &mut Core, i: usize, lazy: bool) -> bool {
        let (src, ref mut cons) = self.shm_in[i];
        let mut got = 0;
        while got < RING_BATCH {
            let r = cons.read_one(|rec| {
                if let Some(mut env) = Envelope::decode(rec) {
                    // The ring is the sender's alone; a process of another
                    // world names itself by a rank of that world.
                    env.src = src;
                    if (lazy && core.unwanted(&env)) || core.hold(&env) {
                        return false;
                    }
                    let Some(payload) = record_payload(&env, rec) else {
                        return true;
                    };
                    core.handle_incoming(&env, payload);
                }
                true
            });
            if r != Some(true) {
                break;
            }
            got += 1;
        }
        if got > 0 {
            self.ring_freed(src);
        }
        got > 0
    }

    /// The lazy pass after posting a receive from shared-memory peer `src`:
    /// only its ring can hold that message (and what must be matched before
    /// it), so only that ring is read. `None` where `src` has no ring (the
    /// whole lazy pass is due then).
    pub(crate) fn progress_ring_of(&mut self, core: &mut Core, src: u32) -> Option<bool> {
        let i = *self.in_at.get(src as usize).filter(|&&i| i != u32::MAX)?;
        let before = core.completions;
        let moved = self.drain_ring(core, i as usize, true);
        if !core.out.is_empty() {
            self.drain_actions(core);
        }
        self.flush_pending(core);
        Some(moved || core.completions != before)
    }

    /// Whether frames are queued that a transport has not taken yet.
    /// This rank and its shared-memory peers that are not asleep in `poll`
    /// (their sleep flags), for whether spinning would take a core from them.
    /// Looks at the shared-memory peers only (`shm_in`), not the whole world:
    /// it runs on every 16th pass of an oversubscribed rank's wait.
    pub(crate) fn shm_awake(&self) -> usize {
        1 + self
            .shm_in
            .iter()
            .filter(|(src, _)| {
                matches!(&self.peers[*src as usize],
                    Link::Shm(s) if s.peer_sleep.get().load(Ordering::Relaxed) == 0)
            })
            .count()
    }
}

impl ShmLink {
    /// The largest payload sent eagerly to this peer: the tuned limit, or
    /// what one ring record holds where that is less.
    #[inline(always)]
    pub(super) fn eager(&self, tuned: usize) -> usize {
        tuned.min(self.prod.max_payload())
    }

    /// Writes one frame into the peer's ring if it has room, then publishes
    /// it and wakes the peer if it sleeps; false (nothing written) when full.
    #[inline(always)]
    pub(super) fn write(
        &mut self,
        env: &[u8; ENV_LEN],
        payload: &[u8],
        wake: &UnixDatagram,
    ) -> bool {
        if !self.prod.try_write(env, payload) {
            return false;
        }
        published(wake, self.peer_sleep.get(), &self.peer_wake);
        true
    }

    /// [`Links::try_send_now`] to this peer: an eager message written into its
    /// ring at once (inline in the envelope where small enough); false where it
    /// is too long for that or the ring is full.
    #[inline(always)]
    pub(super) fn send_now(
        &mut self,
        env: &Envelope,
        bytes: &[u8],
        tuned: usize,
        wake: &UnixDatagram,
    ) -> bool {
        if bytes.len() > self.eager(tuned) {
            return false;
        }
        if bytes.len() <= INLINE_MAX {
            self.write(&env.encode(Some(bytes)), &[], wake)
        } else {
            self.write(&env.encode(None), bytes, wake)
        }
    }
}

impl Links {
    /// Queues a message to shared-memory channel `d`: inline in its envelope
    /// when tiny, eager up to the link's limit, else a rendezvous request
    /// (the receiver copies from our buffer, with our help when we wait).
    pub(super) fn post_shm(&mut self, core: &mut Core, d: usize, mut env: Envelope, sync: bool) {
        let Link::Shm(l) = &self.peers[d] else {
            return;
        };
        let eager = l.eager(self.eager_shm);
        let id = env.sreq;
        let len = env.len as usize;
        if len <= INLINE_MAX && !sync {
            let bytes = core.send_bytes(id).unwrap_or(&[]);
            let frame = env.encode(Some(bytes));
            self.queue(d, frame, None, Some(id));
        } else {
            if len > eager && self.cma {
                env.addr = core.send_bytes(id).map_or(0, |b| b.as_ptr() as u64);
            }
            self.queue_send(d, env, sync, eager);
        }
    }
}
