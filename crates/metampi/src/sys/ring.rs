//! Single-producer / single-consumer byte ring in shared memory (ScaMPI's
//! remote-write / local-read channel: the sender writes into the receiver's
//! memory, the receiver reads locally, and no location has two writers).
//!
//! Layout at `base`: a 128-byte control block (`head` and `tail`, each on its
//! own cache line so producer and consumer never write the same line), then
//! `cap` bytes of data. Records are 64-byte aligned: a 64-byte envelope whose
//! bytes 20..24 hold the record length, then the payload padded to 64. A record
//! that would straddle the end is preceded by a pad record that skips to the
//! start. The tail is published with `Release` after the record is written, so
//! a reader can never see a half-written record.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of ring control at the start of each ring.
pub(crate) const CTL_BYTES: usize = 128;
/// Record alignment and envelope size.
pub(crate) const LINE: usize = 64;
/// Envelope byte that marks a pad record.
const PAD: u8 = 0xFF;
/// Offset of the record length inside the envelope (owned by the ring).
pub(crate) const REC_LEN_AT: usize = 20;

/// A counter on a cache line of its own.
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) AtomicU64);

/// Consumer position (`head`), then producer position (`tail`), each on its
/// own line so that producer and consumer never write the same one.
#[repr(C)]
pub(crate) struct Ctl {
    pub(crate) head: Line,
    pub(crate) tail: Line,
}

/// Bytes a record of `payload` bytes takes in the ring.
pub(crate) fn record_len(payload: usize) -> usize {
    LINE + payload.div_ceil(LINE) * LINE
}

pub(crate) struct Producer {
    ctl: *const Ctl,
    data: *mut u8,
    cap: u64,
    tail: u64,
    head_cache: u64,
}

pub(crate) struct Consumer {
    ctl: *const Ctl,
    data: *const u8,
    cap: u64,
    head: u64,
    tail_cache: u64,
}

// SAFETY: a producer/consumer is only a pair of pointers into shared memory
// whose protocol is safe from any thread as long as there is one of each.
unsafe impl Send for Producer {}
// SAFETY: as above.
unsafe impl Send for Consumer {}

impl Producer {
    /// # Safety
    /// `base` must point to `CTL_BYTES + cap` bytes of zero-initialised or
    /// previously used ring memory, 64-byte aligned, that outlives the producer;
    /// `cap` must be a power of two and a multiple of 64; there must be only one
    /// producer for this ring in the whole job.
    pub(crate) unsafe fn new(base: *mut u8, cap: usize) -> Producer {
        let ctl = base as *const Ctl;
        // SAFETY: per the contract, `ctl` points to a valid control block.
        let (head, tail) = unsafe {
            (
                (*ctl).head.0.load(Ordering::Acquire),
                (*ctl).tail.0.load(Ordering::Acquire),
            )
        };
        Producer {
            ctl,
            // SAFETY: the data area follows the control block inside the mapping.
            data: unsafe { base.add(CTL_BYTES) },
            cap: cap as u64,
            tail,
            head_cache: head,
        }
    }

    /// Largest payload one record may carry.
    pub(crate) fn max_payload(&self) -> usize {
        self.cap as usize / 2 - LINE
    }

    /// Appends one record: `env` (the envelope) followed by `payload`. Returns
    /// false, writing nothing, when there is no room now.
    pub(crate) fn try_write(&mut self, env: &[u8; LINE], payload: &[u8]) -> bool {
        debug_assert!(payload.len() <= self.max_payload());
        let rec = record_len(payload.len()) as u64;
        let mut off = self.tail % self.cap;
        let to_end = self.cap - off;
        let need = if rec > to_end { to_end + rec } else { rec };
        if self.cap - (self.tail - self.head_cache) < need {
            // SAFETY: `ctl` is valid for the producer's lifetime (see `new`).
            self.head_cache = unsafe { (*self.ctl).head.0.load(Ordering::Acquire) };
            if self.cap - (self.tail - self.head_cache) < need {
                return false;
            }
        }
        if rec > to_end {
            // SAFETY: [off, cap) lies inside the data area and belongs to the
            // producer: the free-space check above covers it.
            unsafe { *self.data.add(off as usize) = PAD };
            self.tail += to_end;
            off = 0;
        }
        // SAFETY: [off, off + rec) is free ring space owned by the producer
        // until `tail` is published, and lies inside the data area because
        // records never straddle the end.
        unsafe {
            let dst = self.data.add(off as usize);
            std::ptr::copy_nonoverlapping(env.as_ptr(), dst, LINE);
            std::ptr::copy_nonoverlapping(
                (rec as u32).to_le_bytes().as_ptr(),
                dst.add(REC_LEN_AT),
                4,
            );
            std::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(LINE), payload.len());
        }
        self.tail += rec;
        // SAFETY: `ctl` is valid (see `new`).
        unsafe { (*self.ctl).tail.0.store(self.tail, Ordering::Release) };
        true
    }
}

impl Consumer {
    /// # Safety
    /// As for [`Producer::new`], with one consumer per ring.
    pub(crate) unsafe fn new(base: *mut u8, cap: usize) -> Consumer {
        let ctl = base as *const Ctl;
        // SAFETY: per the contract, `ctl` points to a valid control block.
        let (head, tail) = unsafe {
            (
                (*ctl).head.0.load(Ordering::Acquire),
                (*ctl).tail.0.load(Ordering::Acquire),
            )
        };
        Consumer {
            ctl,
            // SAFETY: the data area follows the control block inside the mapping.
            data: unsafe { base.add(CTL_BYTES) },
            cap: cap as u64,
            head,
            tail_cache: tail,
        }
    }

    /// Whether a record may be waiting (cheap: one shared load when empty).
    pub(crate) fn has_data(&mut self) -> bool {
        if self.head != self.tail_cache {
            return true;
        }
        // SAFETY: `ctl` is valid for the consumer's lifetime (see `new`).
        self.tail_cache = unsafe { (*self.ctl).tail.0.load(Ordering::Acquire) };
        self.head != self.tail_cache
    }

    /// Hands the next record (envelope and payload area) to `f`, then frees it.
    /// `f` returns `false` to leave the record in place (it could not be taken
    /// now); the record is then offered again by the next call.
    pub(crate) fn read_one(&mut self, f: impl FnOnce(&[u8]) -> bool) -> Option<bool> {
        loop {
            if !self.has_data() {
                return None;
            }
            let off = self.head % self.cap;
            // SAFETY: [head, tail_cache) was published by the producer with
            // Release and read after an Acquire load; the producer does not
            // touch it until we advance `head`.
            let first = unsafe { *self.data.add(off as usize) };
            if first == PAD {
                self.head += self.cap - off;
                continue;
            }
            // SAFETY: as above; the envelope is 64 bytes inside the data area.
            let env = unsafe { std::slice::from_raw_parts(self.data.add(off as usize), LINE) };
            let rec = u32::from_le_bytes([
                env[REC_LEN_AT],
                env[REC_LEN_AT + 1],
                env[REC_LEN_AT + 2],
                env[REC_LEN_AT + 3],
            ]) as u64;
            if rec < LINE as u64 || rec > self.cap - off || rec > self.tail_cache - self.head {
                // A corrupt length can only come from a bug or a foreign writer:
                // drop everything published so far rather than read out of bounds.
                self.head = self.tail_cache;
                self.publish_head();
                return None;
            }
            // SAFETY: the record [off, off + rec) is published and inside the data area (checked).
            let record =
                unsafe { std::slice::from_raw_parts(self.data.add(off as usize), rec as usize) };
            let taken = f(record);
            if taken {
                self.head += rec;
                self.publish_head();
            }
            return Some(taken);
        }
    }

    fn publish_head(&self) {
        // SAFETY: `ctl` is valid (see `new`).
        unsafe { (*self.ctl).head.0.store(self.head, Ordering::Release) };
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
}
