//! Cooperative copy of large shared-memory messages.
//!
//! A receiver that matched a rendezvous message used to copy it alone with
//! `process_vm_readv` while the sender, usually waiting for that very send,
//! idled. Now the receiver asks the sender for help (`Kind::Help`) and both
//! copy: the receiver reads chunks from the sender's buffer, the sender writes
//! chunks into the receiver's, each claiming the next chunk from one counter
//! in a slot of the receiver's segment. A sender busy elsewhere simply never
//! claims anything; one that comes late finds every chunk taken, or the slot
//! on a later generation, and does nothing.
//!
//! The receiver waits for the chunks its helper claimed before it completes
//! the receive (a claimed chunk is being copied, never waiting on anything
//! else), and copies again any chunk the helper could not write.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per segment: concurrent cooperative receives of one rank.
pub(crate) const SLOTS: usize = 32;
/// Bytes of the slot table at the end of each segment.
pub(crate) const TABLE_BYTES: usize = SLOTS * std::mem::size_of::<Slot>();
/// Chunks per message at most (one bit each in [`Slot::failed`]).
const MAX_CHUNKS: usize = 64;
/// Smallest chunk: below this a system call per chunk costs more than a
/// second core saves.
const MIN_CHUNK: usize = 64 << 10;
/// The bytes a chunk's own cost (a system call that pins the other side's
/// pages) is worth in copying: about 2 µs against 11 GB/s through
/// `process_vm_readv` on the machine it was measured on.
const CALL_BYTES: usize = 24 << 10;

/// One cooperative transfer, in shared memory.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// Generation (high 32 bits) and the next chunk to claim (low 32).
    claim: AtomicU64,
    /// Chunks the helper finished (copied or failed).
    helped: AtomicU64,
    /// Chunks the helper could not copy, one bit each.
    failed: AtomicU64,
}

/// Bytes per chunk of a message of `len` bytes. Two copiers of `c` chunks
/// take about `c / 2` chunk costs plus half the copying plus up to one chunk
/// of waiting for the other at the end; the sum is least near
/// `c = sqrt(len / CALL_BYTES)`, taken even so that two copiers that start
/// together end together: 2 chunks of 128 KiB messages, 4 of 256 KiB and
/// 512 KiB, 6 of 1 MiB, 14 of 4 MiB. A rank whose helper is busy with a copy
/// of its own (both exchanging) copies alone, and fewer chunks suit it too.
pub(crate) fn chunk_len(len: usize) -> usize {
    let even = 2
        * ((len as f64 / CALL_BYTES as f64).sqrt() / 2.0)
            .round()
            .max(1.0) as usize;
    len.div_ceil(even)
        .max(len.div_ceil(MAX_CHUNKS))
        .next_multiple_of(4096)
        .max(MIN_CHUNK)
}

/// Chunks of a message of `len` bytes.
pub(crate) fn chunks(len: usize) -> usize {
    len.div_ceil(chunk_len(len))
}

/// The byte range of chunk `k` of a message of `len` bytes.
pub(crate) fn chunk_range(len: usize, k: usize) -> std::ops::Range<usize> {
    let c = chunk_len(len);
    k * c..((k + 1) * c).min(len)
}

impl Slot {
    /// Claims the next chunk of generation `gen` (of `n`), if any is left.
    pub(crate) fn claim(&self, gen: u32, n: usize) -> Option<usize> {
        let mut v = self.claim.load(Ordering::Acquire);
        loop {
            let next = (v & 0xffff_ffff) as usize;
            if (v >> 32) as u32 != gen || next >= n {
                return None;
            }
            match self
                .claim
                .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(next),
                Err(now) => v = now,
            }
        }
    }

    /// The helper finished chunk `k`; `ok`: its bytes are in place.
    pub(crate) fn helped(&self, k: usize, ok: bool) {
        if !ok {
            self.failed.fetch_or(1 << k, Ordering::Relaxed);
        }
        // Release: the receiver that sees the count sees the bytes (and the bit).
        self.helped.fetch_add(1, Ordering::Release);
    }

    /// Leaves nothing of generation `gen` to claim.
    fn close(&self, gen: u32, n: usize) {
        self.claim
            .store(((gen as u64) << 32) | n as u64, Ordering::Release);
    }
}

/// Chunks this process copied as a helper (for tests, `counters::chunks_helped`).
pub(crate) static HELPED: AtomicU64 = AtomicU64::new(0);

/// A chunk copier: copies chunk `k` (its byte range), returns whether it did.
pub(crate) type CopyChunk<'a> = &'a mut dyn FnMut(std::ops::Range<usize>) -> bool;

/// The helper's side: copies chunks of generation `gen` of a `len`-byte
/// message until none is left. Returns how many it copied.
pub(crate) fn help(slot: &Slot, gen: u32, len: usize, copy: CopyChunk<'_>) -> usize {
    let n = chunks(len);
    let mut did = 0;
    while let Some(k) = slot.claim(gen, n) {
        let ok = copy(chunk_range(len, k));
        slot.helped(k, ok);
        did += 1;
    }
    HELPED.fetch_add(did as u64, Ordering::Relaxed);
    did
}

/// The receiver's slots in its own segment: which are in use, and the
/// generation each is on (only the receiver opens and closes them).
pub(crate) struct Table {
    base: *const Slot,
    busy: u64,
    gens: [u32; SLOTS],
}

// SAFETY: `base` points into a shared mapping kept alive by `Links::segments`;
// the slots are atomics.
unsafe impl Send for Table {}

/// A slot of another rank's table (the sender's view).
pub(crate) struct PeerSlots(*const Slot);

// SAFETY: as for `Table`; shared use only touches the atomics.
unsafe impl Send for PeerSlots {}
// SAFETY: as above.
unsafe impl Sync for PeerSlots {}

impl PeerSlots {
    /// # Safety
    /// `base` must point to [`TABLE_BYTES`] of 64-byte aligned shared memory
    /// that outlives this value.
    pub(crate) unsafe fn new(base: *const u8) -> PeerSlots {
        PeerSlots(base.cast())
    }

    pub(crate) fn slot(&self, i: usize) -> Option<&Slot> {
        // SAFETY: contract of `new`; `i` is checked against the table size.
        (i < SLOTS).then(|| unsafe { &*self.0.add(i) })
    }
}

/// An open cooperative transfer on the receiver's side.
pub(crate) struct Open {
    pub index: usize,
    pub gen: u32,
}

impl Open {
    /// The value `Kind::Help` carries in `rreq` to name the slot.
    pub(crate) fn tag(&self) -> u64 {
        ((self.gen as u64) << 32) | self.index as u64
    }
}

/// Slot index and generation from a `Kind::Help`'s `rreq`.
pub(crate) fn untag(rreq: u64) -> (usize, u32) {
    ((rreq & 0xffff_ffff) as usize, (rreq >> 32) as u32)
}

impl Table {
    /// # Safety
    /// As [`PeerSlots::new`]; and only this process opens slots there.
    pub(crate) unsafe fn new(base: *const u8) -> Table {
        Table {
            base: base.cast(),
            busy: 0,
            gens: [0; SLOTS],
        }
    }

    fn slot(&self, i: usize) -> &Slot {
        // SAFETY: contract of `new`; callers pass indices below `SLOTS`.
        unsafe { &*self.base.add(i) }
    }

    /// Starts a transfer on a free slot (none free: the caller copies alone).
    pub(crate) fn open(&mut self) -> Option<Open> {
        let index = (!self.busy).trailing_zeros() as usize;
        if index >= SLOTS {
            return None;
        }
        self.busy |= 1 << index;
        self.gens[index] = self.gens[index].wrapping_add(1);
        let gen = self.gens[index];
        let s = self.slot(index);
        s.helped.store(0, Ordering::Relaxed);
        s.failed.store(0, Ordering::Relaxed);
        // Release: a helper that sees the generation sees the counters reset.
        s.claim.store((gen as u64) << 32, Ordering::Release);
        Some(Open { index, gen })
    }

    /// The receiver's side of transfer `o` of `len` bytes: copies what it
    /// claims, waits for what the helper claimed (`alive` says, now and
    /// then, whether the helper still exists), then copies what the helper
    /// could not. Returns whether every byte is in place; the slot is free again.
    pub(crate) fn finish(
        &mut self,
        o: Open,
        len: usize,
        copy: CopyChunk<'_>,
        alive: &mut dyn FnMut() -> bool,
    ) -> bool {
        let n = chunks(len);
        let s = self.slot(o.index);
        let mut ok = true;
        let mut mine = 0u64;
        while let Some(k) = s.claim(o.gen, n) {
            ok &= copy(chunk_range(len, k));
            mine |= 1 << k;
        }
        let theirs = n - mine.count_ones() as usize;
        let mut spins = 0u32;
        let redo = loop {
            if s.helped.load(Ordering::Acquire) as usize >= theirs {
                break s.failed.load(Ordering::Relaxed);
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
                if spins % 4096 == 0 && !alive() {
                    // The helper is gone, perhaps mid-chunk: everything
                    // not copied here is copied here now.
                    s.close(o.gen, n);
                    break !mine;
                }
            } else {
                std::hint::spin_loop();
            }
        };
        for k in (0..n).filter(|k| redo & (1 << k) != 0) {
            ok &= copy(chunk_range(len, k));
        }
        self.busy &= !(1 << o.index);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[repr(C, align(64))]
    struct Mem([u8; TABLE_BYTES]);

    /// The receiver's and a helper's view of one table in `mem`. Taken from
    /// `&mut`: the views write the slots' atomics, which a pointer from `&Mem`
    /// (plain bytes, no `UnsafeCell`) may not do (Miri's Stacked Borrows says so).
    fn views(mem: &mut Mem) -> (Table, PeerSlots) {
        let base = mem.0.as_mut_ptr() as *const u8;
        // SAFETY: `mem` is 64-byte aligned and table-sized, and the tests keep
        // it alive longer than both views and do not touch it meanwhile.
        unsafe { (Table::new(base), PeerSlots::new(base)) }
    }

    /// One transfer opened on a fresh table: the table, the open transfer,
    /// and the helper's slot of it with its generation.
    fn opened(mem: &mut Mem) -> (Table, PeerSlots, Open, usize, u32) {
        let (mut table, peer) = views(mem);
        let o = table.open().unwrap();
        let (index, gen) = untag(o.tag());
        (table, peer, o, index, gen)
    }

    #[test]
    fn chunks_cover_the_message() {
        for len in [1, 64 << 10, (64 << 10) + 1, 1 << 20, 4 << 20, 100_000_007] {
            let n = chunks(len);
            assert!(n <= MAX_CHUNKS, "{len}: {n} chunks");
            let mut end = 0;
            for k in 0..n {
                let r = chunk_range(len, k);
                assert_eq!(r.start, end);
                assert!(!r.is_empty());
                end = r.end;
            }
            assert_eq!(end, len);
        }
    }

    /// Receiver and helper on two threads copy one message between two
    /// buffers: every byte arrives, each chunk is copied once, and a helper
    /// of an older generation copies nothing.
    #[test]
    fn two_copiers_share_one_message() {
        let mut mem = Box::new(Mem([0; TABLE_BYTES]));
        let (mut table, peer) = views(&mut mem);
        let len = (4 << 20) + 12345;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
        for round in 0..20 {
            let dst: Vec<AtomicUsize> = (0..chunks(len)).map(|_| AtomicUsize::new(0)).collect();
            let out = std::sync::Mutex::new(vec![0u8; len]);
            let o = table.open().expect("a free slot");
            let (index, gen) = untag(o.tag());
            let copy = |r: std::ops::Range<usize>| {
                dst[r.start / chunk_len(len)].fetch_add(1, Ordering::Relaxed);
                out.lock().unwrap()[r.clone()].copy_from_slice(&src[r]);
                true
            };
            let helper_did = std::thread::scope(|sc| {
                let h = sc.spawn(|| {
                    let slot = peer.slot(index).unwrap();
                    // A stale request names the previous generation.
                    assert_eq!(help(slot, gen.wrapping_sub(1), len, &mut |_| true), 0);
                    help(slot, gen, len, &mut |r| copy(r))
                });
                let mut c = |r| copy(r);
                assert!(table.finish(o, len, &mut c, &mut || true));
                h.join().unwrap()
            });
            assert!(
                dst.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
            assert!(*out.lock().unwrap() == src, "round {round}");
            assert!(helper_did <= chunks(len));
            // Late help after the receive finished takes nothing.
            assert_eq!(help(peer.slot(index).unwrap(), gen, len, &mut |_| true), 0);
        }
    }

    /// Chunks the helper reports as failed are copied by the receiver.
    #[test]
    fn failed_chunks_are_copied_again() {
        let mut mem = Box::new(Mem([0; TABLE_BYTES]));
        let (mut table, peer, o, index, gen) = opened(&mut mem);
        let len = 1 << 20;
        // The helper claims everything first and fails every other chunk.
        let slot = peer.slot(index).unwrap();
        let mut k = 0;
        assert_eq!(
            help(slot, gen, len, &mut |_| {
                k += 1;
                k % 2 == 0
            }),
            chunks(len)
        );
        let mut again = Vec::new();
        let mut c = |r: std::ops::Range<usize>| {
            again.push(r.start / chunk_len(len));
            true
        };
        assert!(table.finish(o, len, &mut c, &mut || true));
        let expect: Vec<usize> = (0..chunks(len)).step_by(2).collect();
        assert_eq!(again, expect);
    }

    /// A helper that claimed chunks and vanished: the receiver notices and
    /// copies the claimed chunks itself.
    #[test]
    fn a_vanished_helper_is_covered() {
        let mut mem = Box::new(Mem([0; TABLE_BYTES]));
        let (mut table, peer, o, index, gen) = opened(&mut mem);
        let len = 1 << 20;
        let slot = peer.slot(index).unwrap();
        assert_eq!(slot.claim(gen, chunks(len)), Some(0));
        assert_eq!(slot.claim(gen, chunks(len)), Some(1));
        let mut copied = Vec::new();
        let mut c = |r: std::ops::Range<usize>| {
            copied.push(r.start / chunk_len(len));
            true
        };
        assert!(table.finish(o, len, &mut c, &mut || false));
        copied.sort_unstable();
        assert_eq!(copied, (0..chunks(len)).collect::<Vec<_>>());
        // The slot is free and reusable.
        assert_eq!(table.open().unwrap().index, index);
    }

    #[test]
    fn the_table_fits_and_runs_out() {
        let mut mem = Box::new(Mem([0; TABLE_BYTES]));
        let (mut table, _) = views(&mut mem);
        let open: Vec<Open> = (0..SLOTS).map(|_| table.open().unwrap()).collect();
        assert!(table.open().is_none());
        assert_eq!(open.iter().map(|o| o.index).max(), Some(SLOTS - 1));
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }
}
