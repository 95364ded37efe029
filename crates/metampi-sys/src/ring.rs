//! Single-producer / single-consumer byte ring in shared memory (ScaMPI's
//! remote-write / local-read channel: the sender writes into the receiver's
//! memory, the receiver reads locally, and no location has two writers).
//!
//! Layout at `base`: a 128-byte control block (the consumer's `head` on a
//! cache line of its own; the ring leaves the second line, `tail`, to the
//! byte pipes of [`super::vchan`]), then `cap` bytes of data. Records are 64-byte aligned: a 64-byte envelope whose bytes 20..24
//! hold the record length, then the payload padded to 64. A record that would
//! straddle the end is preceded by a pad record that skips to the start.
//!
//! A record is published in band: its length word is stored last, with
//! `Release`, and a zero length means "nothing here yet". So a reader that
//! has caught up polls the line the next record will occupy and nothing else:
//! one cache line moves per small message, where a shared tail counter made
//! it two (the counter's line as well, on both sides).
//!
//! For that zero to be there, the reader clears the length word of each
//! record (and pad) it frees, and of every line of a record of up to
//! [`CLEAR_ALL_MAX`] bytes; the writer remembers which lines will read as
//! empty once free (one bit per line). Where its next record will start on a
//! line that last held payload the reader left alone, the writer clears the
//! word itself before publishing the current record, so payload of earlier
//! laps is never taken for a length. That line is free: the start of the
//! oldest unread record would have its bit set.
//!
//! Measured (2 ranks pinned, medians of alternating runs): the writer clearing
//! ahead on every record stored into the very line a caught-up reader polls
//! (8-byte ping-pong 0.225 µs against 0.195). The reader clearing every line
//! of what it frees, while the record is still in its cache, made 4 and 32
//! KiB messages 1.5-2.8x faster (32 KiB streaming 4.3 µs a message against
//! 1.6; the writer's next lap then finds the lines written, not shared),
//! but walking a 512 KiB record a second time slowed 4 MiB ping-pong (810
//! µs against 655); hence the limit.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of ring control at the start of each ring.
pub const CTL_BYTES: usize = 128;
/// Record alignment and envelope size.
pub const LINE: usize = 64;
/// Envelope byte that marks a pad record.
const PAD: u8 = 0xFF;
/// Offset of the record length inside the envelope (owned by the ring).
pub const REC_LEN_AT: usize = 20;
/// Records up to this size have every line's length word cleared by the
/// reader; larger ones only the first (see the module comment). It covers
/// the largest eager record (64 KiB and its envelope).
pub const CLEAR_ALL_MAX: u64 = 128 * 1024;

/// A counter on a cache line of its own.
#[repr(C, align(64))]
pub struct Line(pub AtomicU64);

/// Consumer position (`head`), then producer position (`tail`), each on its
/// own line. The record ring publishes in band and uses `head` only (the
/// producer reads it when its cached copy says the ring is full); the byte
/// pipes of [`super::vchan`] use both.
#[repr(C)]
pub struct Ctl {
    pub head: Line,
    pub tail: Line,
}

/// Bytes a record of `payload` bytes takes in the ring.
pub fn record_len(payload: usize) -> usize {
    LINE + payload.div_ceil(LINE) * LINE
}

/// The memory a ring lives in, and the only ways the ring's code touches it:
/// the mapping of a shared-memory segment in the library ([`Shm`]); loom's
/// checked atomics and cells in the model tests (`loom_model` below), which so
/// run this file's protocol code unchanged.
pub trait Memory {
    /// Records up to this size have every line's length word cleared by the
    /// reader ([`CLEAR_ALL_MAX`]; the models make it one line, to reach the
    /// writer's clearing ahead with rings of a few lines).
    const CLEAR_ALL_MAX: u64 = CLEAR_ALL_MAX;
    /// The consumer's published position.
    fn head(&self, order: Ordering) -> u64;
    fn set_head(&self, head: u64, order: Ordering);
    /// The length word of the line at data offset `off` (64-byte aligned,
    /// inside the data area).
    fn len(&self, off: u64, order: Ordering) -> u32;
    fn set_len(&self, off: u64, len: u32, order: Ordering);
    /// Stores `byte` at data offset `off`.
    ///
    /// # Safety
    /// The caller owns the byte under the ring's protocol: it is free space
    /// of the producer's, and `off` is inside the data area.
    unsafe fn set_byte(&self, off: u64, byte: u8);
    /// The byte at data offset `off`.
    ///
    /// # Safety
    /// The byte belongs to a published record the consumer holds.
    unsafe fn byte(&self, off: u64) -> u8;
    /// Writes a record at `off`: the envelope but its length word, then the
    /// payload from the next line on.
    ///
    /// # Safety
    /// `[off, off + record_len(payload.len()))` is free space the producer
    /// owns, inside the data area.
    unsafe fn write_record(&self, off: u64, env: &[u8; LINE], payload: &[u8]);
    /// Hands `f` the `len` bytes of the record at `off`.
    ///
    /// # Safety
    /// The record was published and its length read with `Acquire`, and lies
    /// inside the data area; the consumer has not freed it.
    unsafe fn with_record<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// A ring in a mapping: the control block, then the data area (the byte
/// pipes of [`super::vchan`] use the same layout).
pub struct Shm {
    pub(super) ctl: *const Ctl,
    pub(super) data: *mut u8,
}

impl Shm {
    /// # Safety
    /// `base` points to `CTL_BYTES + cap` bytes of ring memory, 64-byte
    /// aligned, that outlive every use of the value.
    pub(super) unsafe fn at(base: *mut u8) -> Shm {
        Shm {
            ctl: base as *const Ctl,
            // SAFETY: the data area follows the control block inside the mapping.
            data: unsafe { base.add(CTL_BYTES) },
        }
    }
}

impl Memory for Shm {
    #[inline(always)]
    fn head(&self, order: Ordering) -> u64 {
        // SAFETY: `ctl` is valid while the ring is (see `Shm::at`).
        unsafe { (*self.ctl).head.0.load(order) }
    }
    #[inline(always)]
    fn set_head(&self, head: u64, order: Ordering) {
        // SAFETY: as above.
        unsafe { (*self.ctl).head.0.store(head, order) }
    }
    #[inline(always)]
    fn len(&self, off: u64, order: Ordering) -> u32 {
        // SAFETY: per the trait, `off` is a line inside the data area.
        unsafe { len_word(self.data, off) }.load(order)
    }
    #[inline(always)]
    fn set_len(&self, off: u64, len: u32, order: Ordering) {
        // SAFETY: as above.
        unsafe { len_word(self.data, off) }.store(len, order)
    }
    #[inline(always)]
    unsafe fn set_byte(&self, off: u64, byte: u8) {
        // SAFETY: per the contract, inside the data area and ours to write.
        unsafe { *self.data.add(off as usize) = byte }
    }
    #[inline(always)]
    unsafe fn byte(&self, off: u64) -> u8 {
        // SAFETY: per the contract, inside the data area and published.
        unsafe { *self.data.add(off as usize) }
    }
    #[inline(always)]
    unsafe fn write_record(&self, off: u64, env: &[u8; LINE], payload: &[u8]) {
        // SAFETY: per the contract the record's space is free and ours, inside
        // the data area. The length word is left to the atomic store: the
        // reader may be polling it.
        unsafe {
            let dst = self.data.add(off as usize);
            std::ptr::copy_nonoverlapping(env.as_ptr(), dst, REC_LEN_AT);
            std::ptr::copy_nonoverlapping(
                env.as_ptr().add(REC_LEN_AT + 4),
                dst.add(REC_LEN_AT + 4),
                LINE - REC_LEN_AT - 4,
            );
            if !payload.is_empty() {
                super::copy::copy_raw(payload.as_ptr(), dst.add(LINE), payload.len());
            }
        }
    }
    #[inline(always)]
    unsafe fn with_record<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: per the contract the record is published, ours to read and
        // inside the data area.
        f(unsafe { std::slice::from_raw_parts(self.data.add(off as usize), len as usize) })
    }
}

pub struct Producer<M: Memory = Shm> {
    mem: M,
    cap: u64,
    tail: u64,
    head_cache: u64,
    /// Per line: set where the length word is zero once the line is free
    /// (never written, cleared here, or a record start the reader clears).
    clean: Vec<u64>,
}

/// The length word at a consumer's head as it was when the watch was made:
/// it turns non-zero when the next record is published. A thread that waits
/// for that record polls this one word (a load that hits its cache until the
/// writer stores) instead of taking the engine's lock for every look. Once
/// the consumer has moved on, the word is a freed line's (zero, or a later
/// record's length): a look then only sends the caller to the real consumer.
pub struct HeadWatch(*const AtomicU32);

impl HeadWatch {
    /// Whether something was published at the watched position.
    ///
    /// # Safety
    /// The ring's memory must still be mapped.
    pub unsafe fn published(&self) -> bool {
        // SAFETY: per the contract the word is mapped; it is only accessed atomically.
        unsafe { &*self.0 }.load(Ordering::Acquire) != 0
    }
}

pub struct Consumer<M: Memory = Shm> {
    mem: M,
    cap: u64,
    head: u64,
}

// SAFETY: a ring's memory is only a pair of pointers into shared memory
// whose protocol is safe from any thread as long as there is one producer
// and one consumer, each used by one thread at a time.
unsafe impl Send for Shm {}

/// The length word of the record slot at data offset `off`.
///
/// # Safety
/// `data + off` must be a 64-byte aligned line inside the data area.
unsafe fn len_word<'a>(data: *const u8, off: u64) -> &'a AtomicU32 {
    // SAFETY: per the contract the word is inside the mapping and 4-aligned;
    // both ends access it only atomically.
    unsafe { &*(data.add(off as usize + REC_LEN_AT) as *const AtomicU32) }
}

impl Producer {
    /// # Safety
    /// `base` must point to `CTL_BYTES + cap` bytes of zero-initialised ring
    /// memory, 64-byte aligned, that outlives the producer; `cap` must be a
    /// power of two and a multiple of 64; there must be only one producer for
    /// this ring in the whole job.
    pub unsafe fn new(base: *mut u8, cap: usize) -> Producer {
        // SAFETY: per the contract.
        Producer::in_memory(unsafe { Shm::at(base) }, cap)
    }
}

impl<M: Memory> Producer<M> {
    /// The producer of the ring in `mem`, of `cap` data bytes (a power of two,
    /// at least two lines), zeroed.
    pub(super) fn in_memory(mem: M, cap: usize) -> Producer<M> {
        debug_assert!(cap.is_power_of_two() && cap >= 2 * LINE);
        let head = mem.head(Ordering::Acquire);
        Producer {
            mem,
            cap: cap as u64,
            tail: head,
            head_cache: head,
            clean: vec![u64::MAX; (cap / LINE).div_ceil(64)],
        }
    }

    fn is_clean(&self, line: usize) -> bool {
        self.clean[line / 64] & (1 << (line % 64)) != 0
    }

    /// Marks lines `[a, b)` as holding payload (not clean).
    fn soil(&mut self, a: usize, b: usize) {
        self.mark(a, b, false);
    }

    fn mark_clean(&mut self, a: usize, b: usize) {
        self.mark(a, b, true);
    }

    fn mark(&mut self, a: usize, b: usize, clean: bool) {
        let mut l = a;
        while l < b {
            let (w, bit) = (l / 64, l % 64);
            let n = (64 - bit).min(b - l);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            if clean {
                self.clean[w] |= mask;
            } else {
                self.clean[w] &= !mask;
            }
            l += n;
        }
    }

    /// Bytes written and not yet taken by the consumer (as of now).
    pub fn unread(&self) -> u64 {
        self.tail - self.mem.head(Ordering::Acquire)
    }

    /// Largest payload one record may carry.
    pub fn max_payload(&self) -> usize {
        self.cap as usize / 2 - LINE
    }

    /// Appends one record: `env` (the envelope) followed by `payload`. Returns
    /// false, writing nothing, when there is no room now.
    #[inline(always)]
    pub fn try_write(&mut self, env: &[u8; LINE], payload: &[u8]) -> bool {
        debug_assert!(payload.len() <= self.max_payload());
        let rec = record_len(payload.len()) as u64;
        let off = self.tail & (self.cap - 1);
        let to_end = self.cap - off;
        let need = if rec > to_end { to_end + rec } else { rec };
        if self.cap - (self.tail - self.head_cache) < need {
            self.head_cache = self.mem.head(Ordering::Acquire);
            if self.cap - (self.tail - self.head_cache) < need {
                return false;
            }
        }
        if rec > to_end {
            // The record goes to the start, published before the pad that
            // leads the reader there.
            self.put(0, env, payload, rec);
            // SAFETY: [off, cap) is free space owned by the producer (checked
            // above) and `off` is a line inside the data area.
            unsafe { self.mem.set_byte(off, PAD) };
            self.mem.set_len(off, to_end as u32, Ordering::Release);
            let line = (off / LINE as u64) as usize;
            self.mark_clean(line, line + 1);
            self.tail += to_end;
        } else {
            self.put(off, env, payload, rec);
        }
        self.tail += rec;
        true
    }

    /// Writes a record at data offset `off`, then publishes it, having made
    /// sure the line after it reads as empty (see the module comment).
    #[inline(always)]
    fn put(&mut self, off: u64, env: &[u8; LINE], payload: &[u8], rec: u64) {
        let first = (off / LINE as u64) as usize;
        let lines = (rec / LINE as u64) as usize;
        if lines == 1 {
            // A small message's whole record (the commonest case).
            self.clean[first / 64] |= 1 << (first % 64);
        } else if rec <= M::CLEAR_ALL_MAX {
            self.mark_clean(first, first + lines);
        } else {
            self.mark_clean(first, first + 1);
            self.soil(first + 1, first + lines);
        }
        // `cap` is a power of two: a mask, not a division, on every message.
        let next = (first + lines) & (self.cap as usize / LINE - 1);
        if !self.is_clean(next) {
            // A line that last held payload the reader does not clear lies in
            // space it has already freed (module comment): free, and inside
            // the data area.
            self.mem.set_len((next * LINE) as u64, 0, Ordering::Relaxed);
            self.mark_clean(next, next + 1);
        }
        // SAFETY: [off, off + rec) is free ring space owned by the producer
        // (the caller checked), inside the data area because records never
        // straddle the end.
        unsafe { self.mem.write_record(off, env, payload) };
        self.mem.set_len(off, rec as u32, Ordering::Release);
    }
}

impl Consumer {
    /// # Safety
    /// As for [`Producer::new`], with one consumer per ring.
    pub unsafe fn new(base: *mut u8, cap: usize) -> Consumer {
        // SAFETY: per the contract.
        Consumer::in_memory(unsafe { Shm::at(base) }, cap)
    }

    /// The word the next record's publication sets, for polling without the
    /// consumer (see [`HeadWatch`]).
    pub fn watch(&self) -> HeadWatch {
        // SAFETY: `head % cap` is a line inside the data area.
        let word = unsafe { len_word(self.mem.data, self.head & (self.cap - 1)) };
        HeadWatch(word as *const AtomicU32)
    }
}

impl<M: Memory> Consumer<M> {
    /// The consumer of the ring in `mem` (as [`Producer::in_memory`]).
    pub(super) fn in_memory(mem: M, cap: usize) -> Consumer<M> {
        let head = mem.head(Ordering::Acquire);
        Consumer {
            mem,
            cap: cap as u64,
            head,
        }
    }

    /// The published length at the head (0: nothing published yet).
    fn head_len(&self) -> u64 {
        self.mem.len(self.head & (self.cap - 1), Ordering::Acquire) as u64
    }

    /// Whether a record is published at the head (one shared load).
    pub fn has_record(&self) -> bool {
        self.head_len() != 0
    }

    /// Hands the next record (envelope and payload area) to `f`, then frees it.
    /// `f` returns `false` to leave the record in place (it could not be taken
    /// now); the record is then offered again by the next call.
    #[inline]
    pub fn read_one(&mut self, f: impl FnOnce(&[u8]) -> bool) -> Option<bool> {
        loop {
            let rec = self.head_len();
            if rec == 0 {
                return None;
            }
            let off = self.head & (self.cap - 1);
            if rec < LINE as u64 || rec > self.cap - off || rec % LINE as u64 != 0 {
                // A corrupt length can only come from a bug or a foreign
                // writer: stop reading this ring rather than read out of bounds.
                return None;
            }
            // SAFETY: the record [off, off + rec) was published with Release
            // and its length read with Acquire; the producer does not touch it
            // until we advance `head`.
            let first = unsafe { self.mem.byte(off) };
            if first == PAD {
                self.clear(off, LINE as u64);
                self.head += rec;
                continue;
            }
            // SAFETY: as above, inside the data area (checked).
            let taken = unsafe { self.mem.with_record(off, rec, f) };
            if taken {
                self.clear(off, rec);
                self.head += rec;
                self.publish_head();
            }
            return Some(taken);
        }
    }

    /// Zeroes the length words of the freed record at `off` (the first line's;
    /// every line's up to [`CLEAR_ALL_MAX`]: see the module comment). The
    /// head published after it orders the stores before the producer's reuse
    /// of the space.
    fn clear(&self, off: u64, rec: u64) {
        if rec == LINE as u64 {
            // The line of the record just read, inside the data area.
            self.mem.set_len(off, 0, Ordering::Relaxed);
            return;
        }
        let end = if rec <= M::CLEAR_ALL_MAX {
            off + rec
        } else {
            off + 1
        };
        for line in (off..end).step_by(LINE) {
            // A line of the record just read, inside the data area.
            self.mem.set_len(line, 0, Ordering::Relaxed);
        }
    }

    fn publish_head(&self) {
        self.mem.set_head(self.head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Mem([u8; CTL_BYTES + 1024]);

    #[test]
    fn records_wrap_and_arrive_in_order() {
        let mut mem = Box::new(Mem([0; CTL_BYTES + 1024]));
        let base = mem.0.as_mut_ptr();
        // SAFETY: `mem` is aligned, zeroed, outlives both ends, one of each.
        let (mut p, mut c) = unsafe { (Producer::new(base, 1024), Consumer::new(base, 1024)) };
        let mut next_read = 0u32;
        for i in 0..200u32 {
            let payload = vec![i as u8; (i as usize * 7) % 300];
            let mut env = [0u8; LINE];
            env[..4].copy_from_slice(&i.to_le_bytes());
            while !p.try_write(&env, &payload) {
                let got = c.read_one(|rec| {
                    let n = u32::from_le_bytes(rec[..4].try_into().unwrap());
                    assert_eq!(n, next_read);
                    assert!(rec[LINE..LINE + (n as usize * 7) % 300]
                        .iter()
                        .all(|&b| b == n as u8));
                    true
                });
                assert_eq!(got, Some(true));
                next_read += 1;
            }
        }
        while c.read_one(|_| true).is_some() {
            next_read += 1;
        }
        assert_eq!(next_read, 200);
    }

    #[test]
    fn refused_record_is_offered_again() {
        let mut mem = Box::new(Mem([0; CTL_BYTES + 1024]));
        let base = mem.0.as_mut_ptr();
        // SAFETY: as in the test above.
        let (mut p, mut c) = unsafe { (Producer::new(base, 1024), Consumer::new(base, 1024)) };
        assert!(p.try_write(&[1; LINE], b"abc"));
        assert_eq!(c.read_one(|_| false), Some(false));
        assert_eq!(c.read_one(|rec| rec[0] == 1), Some(true));
        assert_eq!(c.read_one(|_| true), None);
    }

    /// Large records of `big_len` bytes fill whole laps of a ring of `cap`,
    /// so that small records later start where old payload lies; each payload
    /// line holds what reads as a plausible one-line record (a length word
    /// of 64). The small records then sweep two laps.
    fn old_payload_case(cap: usize, big_len: usize) {
        #[derive(Clone)]
        #[repr(C, align(64))]
        struct Chunk([u8; LINE]);
        let mut mem = vec![Chunk([0; LINE]); (CTL_BYTES + cap) / LINE];
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` is aligned, zeroed and outlives both ends, one of each.
        let (mut p, mut c) = unsafe { (Producer::new(base, cap), Consumer::new(base, cap)) };
        let big: Vec<u8> = (0..big_len)
            .map(|j| match j % LINE {
                k @ 20..24 => (LINE as u32).to_le_bytes()[k - 20],
                _ => 0x41,
            })
            .collect();
        for _ in 0..5 {
            assert!(p.try_write(&[2; LINE], &big));
            assert_eq!(
                c.read_one(|rec| rec[LINE..LINE + big_len] == big[..]),
                Some(true)
            );
        }
        for i in 0..2 * cap / LINE {
            // Byte 0 is the envelope's kind, never the pad mark.
            let mut env = [1u8; LINE];
            env[4..8].copy_from_slice(&(i as u32).to_le_bytes());
            assert!(p.try_write(&env, &[]));
            let me = |rec: &[u8]| rec[4..8] == (i as u32).to_le_bytes() && rec.len() == LINE;
            assert_eq!(c.read_one(me), Some(true), "small record {i}");
            // Caught up: nothing more, whatever the old bytes ahead say.
            assert_eq!(c.read_one(|_| true), None, "after small record {i}");
        }
        drop(mem);
    }

    #[test]
    fn old_payload_is_never_taken_for_a_record() {
        // Records the reader clears line by line, and larger ones whose
        // lines the writer clears ahead of itself: larger than
        // `CLEAR_ALL_MAX` (128 KiB), or the writer's clearing is never reached.
        old_payload_case(1024, 400);
        old_payload_case(1 << 19, 200_000);
    }

    #[test]
    fn a_reader_thread_sees_every_record_intact() {
        #[repr(C, align(64))]
        struct Big([u8; CTL_BYTES + 4096]);
        let mut mem = Box::new(Big([0; CTL_BYTES + 4096]));
        let base = mem.0.as_mut_ptr();
        // Under Miri (`.ci/miri.sh`) a thousand records, some 200 laps of the
        // ring with the reader's thread interleaved: a payload read not
        // ordered after its write is reported there as a data race.
        const N: u32 = if cfg!(miri) { 1_000 } else { 200_000 };
        // SAFETY: `mem` is aligned, zeroed and outlives both threads (joined
        // below); one producer, one consumer.
        let (mut p, mut c) = unsafe { (Producer::new(base, 4096), Consumer::new(base, 4096)) };
        let reader = std::thread::spawn(move || {
            let mut next = 0u32;
            while next < N {
                let r = c.read_one(|rec| {
                    let n = u32::from_le_bytes(rec[4..8].try_into().unwrap());
                    assert_eq!(n, next, "records in order");
                    let len = (n as usize * 37) % 1500;
                    // Compared as slices: byte by byte costs Miri minutes.
                    assert!(rec[LINE..LINE + len] == vec![n as u8; len][..]);
                    true
                });
                match r {
                    Some(_) => next += 1,
                    None => std::hint::spin_loop(),
                }
            }
        });
        for i in 0..N {
            // Byte 0 is the envelope's kind, never the pad mark.
            let mut env = [0u8; LINE];
            env[4..8].copy_from_slice(&i.to_le_bytes());
            let len = (i as usize * 37) % 1500;
            let body = vec![i as u8; len];
            while !p.try_write(&env, &body) {
                assert!(!reader.is_finished(), "the reader stopped early");
                std::thread::yield_now();
            }
        }
        reader.join().unwrap();
        drop(mem);
    }
}

/// Loom models of the ring: the producer and consumer code above, run on
/// memory whose atomics and plain bytes loom tracks, in every interleaving
/// and every outcome the memory model allows. A payload read not ordered
/// after its write, or a write into space the reader still holds, fails as
/// a data race; a stale length taken for a record fails the checks.
/// `bash .ci/loom.sh` runs them (and the sleep-flag models of `sys::sleep_flag`, which
/// use this memory).
#[cfg(all(test, loom))]
pub(super) mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU32 as LoomU32, AtomicU64 as LoomU64};
    use loom::sync::Arc;

    /// A ring of `lines` lines: the head, a length word per line, and the
    /// other bytes of each line as a cell loom checks.
    pub struct Model {
        head: LoomU64,
        lens: Vec<LoomU32>,
        lines: Vec<UnsafeCell<[u8; LINE]>>,
    }

    impl Memory for Arc<Model> {
        const CLEAR_ALL_MAX: u64 = LINE as u64;
        fn head(&self, order: Ordering) -> u64 {
            self.head.load(order)
        }
        fn set_head(&self, head: u64, order: Ordering) {
            self.head.store(head, order)
        }
        fn len(&self, off: u64, order: Ordering) -> u32 {
            self.lens[off as usize / LINE].load(order)
        }
        fn set_len(&self, off: u64, len: u32, order: Ordering) {
            self.lens[off as usize / LINE].store(len, order)
        }
        unsafe fn set_byte(&self, off: u64, byte: u8) {
            let (l, at) = (off as usize / LINE, off as usize % LINE);
            self.lines[l].with_mut(|p| {
                // SAFETY: loom checks the access; the pointer is the cell's own.
                let line = unsafe { &mut *p };
                line[at] = byte;
            });
        }
        unsafe fn byte(&self, off: u64) -> u8 {
            let (l, at) = (off as usize / LINE, off as usize % LINE);
            self.lines[l].with(|p| {
                // SAFETY: as above.
                let line = unsafe { &*p };
                line[at]
            })
        }
        unsafe fn write_record(&self, off: u64, env: &[u8; LINE], payload: &[u8]) {
            let first = off as usize / LINE;
            self.lines[first].with_mut(|p| {
                // SAFETY: as above.
                let line = unsafe { &mut *p };
                line[..REC_LEN_AT].copy_from_slice(&env[..REC_LEN_AT]);
                line[REC_LEN_AT + 4..].copy_from_slice(&env[REC_LEN_AT + 4..]);
            });
            for (i, chunk) in payload.chunks(LINE).enumerate() {
                self.lines[first + 1 + i].with_mut(|p| {
                    // SAFETY: as above.
                    let line = unsafe { &mut *p };
                    line[..chunk.len()].copy_from_slice(chunk);
                });
                // Payload over a line's length word overwrites it, as it does in
                // shared memory (a plain store there: relaxed here).
                if let Some(w) = chunk.get(REC_LEN_AT..REC_LEN_AT + 4) {
                    let w = u32::from_le_bytes(w.try_into().unwrap());
                    self.lens[first + 1 + i].store(w, Ordering::Relaxed);
                }
            }
        }
        unsafe fn with_record<R>(&self, off: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> R {
            let first = off as usize / LINE;
            let mut bytes = Vec::with_capacity(len as usize);
            for l in first..first + len as usize / LINE {
                self.lines[l].with(|p| {
                    // SAFETY: as above.
                    let line = unsafe { &*p };
                    bytes.extend_from_slice(line);
                });
                let word = self.lens[l].load(Ordering::Relaxed).to_le_bytes();
                let at = (l - first) * LINE + REC_LEN_AT;
                bytes[at..at + 4].copy_from_slice(&word);
            }
            f(&bytes)
        }
    }

    pub fn ring(lines: usize) -> Arc<Model> {
        Arc::new(Model {
            head: LoomU64::new(0),
            lens: (0..lines).map(|_| LoomU32::new(0)).collect(),
            lines: (0..lines).map(|_| UnsafeCell::new([0; LINE])).collect(),
        })
    }

    /// The payload of record `i`: its lines' length-word bytes read as a
    /// plausible one-line record, so that a length word left from an earlier
    /// lap would be taken for one.
    fn payload(i: usize, n: usize) -> Vec<u8> {
        (0..n)
            .map(|j| match j % LINE {
                k @ REC_LEN_AT..24 => (LINE as u32).to_le_bytes()[k - REC_LEN_AT],
                _ => 0x10 + i as u8,
            })
            .collect()
    }

    /// The envelope of record `i`: its number in bytes 4..8 (byte 0, the
    /// kind, is never the pad mark).
    fn env(i: u32) -> [u8; LINE] {
        let mut e = [1u8; LINE];
        e[4..8].copy_from_slice(&i.to_le_bytes());
        e
    }

    /// Sends records of the given payload sizes from one thread and takes
    /// them in another, in a ring of `lines` lines; every record must arrive
    /// whole and in order.
    fn send_and_take(lines: usize, sizes: &'static [usize], bound: usize) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(bound);
        b.check(move || {
            let mem = ring(lines);
            let cap = lines * LINE;
            let mut p = Producer::in_memory(mem.clone(), cap);
            let mut c = Consumer::in_memory(mem, cap);
            let reader = loom::thread::spawn(move || {
                let mut next = 0usize;
                while next < sizes.len() {
                    let got = c.read_one(|rec| {
                        let n = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
                        assert_eq!(n, next, "records arrive in order");
                        assert_eq!(rec.len(), record_len(sizes[n]), "whole record");
                        assert_eq!(rec[LINE..], payload(n, sizes[n])[..], "payload intact");
                        true
                    });
                    match got {
                        Some(_) => next += 1,
                        None => loom::thread::yield_now(),
                    }
                }
            });
            for (i, &n) in sizes.iter().enumerate() {
                let body = payload(i, n);
                while !p.try_write(&env(i as u32), &body) {
                    loom::thread::yield_now();
                }
            }
            reader.join().unwrap();
        });
    }

    /// One-line records round a ring of two lines: the reader clears each
    /// length word it frees, the writer reuses the line after the head.
    #[test]
    fn small_records_round_a_small_ring() {
        send_and_take(2, &[0, 0, 0, 0], 3);
    }

    /// A two-line record that does not fit before the end goes to the start
    /// behind a pad record.
    #[test]
    fn a_record_that_does_not_fit_goes_behind_a_pad() {
        send_and_take(4, &[0, 64, 64, 0], 2);
    }

    /// Records larger than the reader clears leave payload lines whose
    /// length word reads as a record; later small records start on them, so
    /// the writer clears each such line before it publishes the record in
    /// front of it.
    #[test]
    fn payload_of_earlier_laps_is_never_a_record() {
        send_and_take(4, &[64, 64, 0, 0, 0], 2);
    }
}
