//! The fences between publishing to shared memory and looking at a peer's sleep flag.

/// The barrier a writer needs between publishing to shared memory (a ring
/// record, freed ring space, a collective flag) and loading the reader's
/// sleep flag. Where the kernel offers `membarrier(GLOBAL_EXPEDITED)` the
/// pair is asymmetric: the rare side, a process going to sleep, pays with
/// [`sleep_fence`] (which makes every running registered process execute a
/// full barrier), and the writer, once per message, only stops the compiler
/// from reordering. Elsewhere it is [`store_load_fence`] and `sleep_fence`
/// does nothing more than the flag's own sequentially consistent store.
#[inline(always)]
pub fn publish_fence() {
    if asymmetric() {
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    } else {
        store_load_fence();
    }
}

/// The sleeper's half of [`publish_fence`]: call after raising the sleep
/// flag and before looking for work a last time. Either a writer's publish
/// is visible to that look, or the writer sees the flag.
pub fn sleep_fence() {
    if asymmetric() {
        #[cfg(target_os = "linux")]
        // SAFETY: membarrier takes two integers and touches no memory of ours.
        unsafe {
            libc::syscall(libc::SYS_membarrier, MEMBARRIER_GLOBAL_EXPEDITED, 0);
        }
    } else {
        store_load_fence();
    }
}

#[cfg(target_os = "linux")]
const MEMBARRIER_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;

/// Whether this process registered for expedited global memory barriers, so
/// that writers may skip their store-load barrier (see [`publish_fence`]).
/// `METAMPI_ASYMMETRIC_FENCE=0` turns it off; it must then be off for every
/// process of the job on the machine (the launcher passes it to all).
#[inline(always)]
/// Whether [`publish_fence`] is the cheap half of an asymmetric pair here.
pub fn asymmetric_fences() -> bool {
    asymmetric()
}

fn asymmetric() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if !crate::knobs::flag("METAMPI_ASYMMETRIC_FENCE", true) {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            const QUERY: libc::c_int = 0;
            const REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;
            let need = i64::from(MEMBARRIER_GLOBAL_EXPEDITED | REGISTER_GLOBAL_EXPEDITED);
            // SAFETY: as in `sleep_fence`.
            let offered = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0) };
            if offered <= 0 || offered & need != need {
                return false;
            }
            // SAFETY: as above; registering affects only this process.
            unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_GLOBAL_EXPEDITED, 0) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        false
    })
}

/// A full memory barrier between a store to shared memory and a load of a
/// peer's sleep flag (the Dekker pairs of the rings, pipes and collective
/// flags). On x86-64 a locked add to the stack is such a barrier and costs a
/// fraction of `mfence`, which `fence(SeqCst)` compiles to (Linux's
/// `smp_mb` makes the same choice); elsewhere it is `fence(SeqCst)`.
#[inline(always)]
pub fn store_load_fence() {
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
