//! The unsafe islands: shared memory, rings, cross-memory attach, `poll`
//! and reads into uninitialised buffer space.
//!
//! Everything outside this module is safe code. Each item here documents the
//! invariant its callers must keep.

pub(crate) mod cma;
pub(crate) mod cpus;
pub(crate) mod poll;
pub(crate) mod rawbuf;
pub(crate) mod read;
pub(crate) mod ring;
pub(crate) mod shm;
pub(crate) mod vchan;

/// A full memory barrier between a store to shared memory and a load of a
/// peer's sleep flag (the Dekker pairs of the rings, pipes and collective
/// flags). On x86-64 a locked add to the stack is such a barrier and costs a
/// fraction of `mfence`, which `fence(SeqCst)` compiles to (Linux's
/// `smp_mb` makes the same choice); elsewhere it is `fence(SeqCst)`.
#[inline(always)]
pub(crate) fn store_load_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: ors zero into the word at the stack pointer, which belongs to
    // this thread and keeps its value; the flags it changes are not declared
    // preserved; the asm is not `nomem`, so the compiler keeps memory accesses
    // on their side of it.
    unsafe {
        std::arch::asm!("lock or dword ptr [rsp], 0", options(nostack))
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
