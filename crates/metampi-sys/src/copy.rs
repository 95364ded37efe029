//! Copies of message data that stay fast where `rep movsb` is not.
//!
//! `rep movsb`, which glibc's `memcpy` uses from a few KiB up to about the L2
//! size and the kernel uses for every copy to or from user memory, runs 10-15x
//! slower on AMD Zen when the destination lies 1 to 31 bytes past the source
//! modulo 4 KiB (each store looks like it might feed the loads just ahead of
//! it). Measured on this project's EPYC machine with glibc 2.36: a 256 KiB
//! `memcpy` 88 µs instead of 6; a 1 MiB `process_vm_readv` 630-780 µs instead
//! of 100-140, which MPICH and Open MPI pay too. Buffers land that way by
//! chance (two heap vectors, a slice that starts a few bytes in, a ring
//! position), so every copy of message data goes through here.

/// Destinations this far past the source (modulo a page) are the slow case:
/// 1-31 measured slow, 32-64 and every backward distance fast.
const ALIAS_SPAN: usize = 32;

/// Pieces of this size are below glibc's threshold for `rep movsb` (2 KiB
/// with SSE2, more with AVX), so each goes through its vector loop, which
/// checks for the aliasing itself: a 256 KiB copy at +16 bytes takes 6.2 µs
/// in 1 KiB pieces (42 GB/s) against 88 µs in one call.
const PIECE: usize = 1024;

/// Whether copying to `dst` from `src` is the slow case (see the module docs).
#[inline]
pub fn aliased(dst: usize, src: usize) -> bool {
    let d = dst.wrapping_sub(src) & 4095;
    d != 0 && d < ALIAS_SPAN
}

/// `dst.copy_from_slice(src)`, in pieces where the placement is slow.
///
/// # Panics
/// Where the lengths differ, as `copy_from_slice` does.
#[inline]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: two slices of `src.len()` bytes, one of them borrowed mutably,
    // so they cannot overlap.
    unsafe { copy_raw(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// [`copy`] between raw pointers.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for
/// `len` bytes, the two not overlapping.
#[inline]
pub unsafe fn copy_raw(src: *const u8, dst: *mut u8, len: usize) {
    if len > PIECE && aliased(dst as usize, src as usize) {
        let mut done = 0;
        while done < len {
            let n = PIECE.min(len - done);
            // SAFETY: `done + n <= len`, inside both ranges the caller vouched for.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
            done += n;
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

/// `v.extend_from_slice(src)` through [`copy`].
pub fn extend(v: &mut Vec<u8>, src: &[u8]) {
    v.reserve(src.len());
    let at = v.len();
    // SAFETY: `reserve` made room for `src.len()` bytes past `at`, all of
    // which are written before the length covers them; a `&mut Vec` and a
    // `&[u8]` cannot overlap.
    unsafe {
        copy_raw(src.as_ptr(), v.as_mut_ptr().add(at), src.len());
        v.set_len(at + src.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_placements_are_the_short_forward_ones() {
        assert!(!aliased(0x1000, 0x1000));
        assert!(aliased(0x1001, 0x1000));
        assert!(aliased(0x1010, 0x1000));
        assert!(aliased(0x101f, 0x1000));
        assert!(!aliased(0x1020, 0x1000));
        assert!(!aliased(0x1000, 0x1010)); // destination behind the source
        assert!(aliased(0x2005, 0x1ff0)); // across a page boundary
        assert!(aliased(0x7005, 0x1ff0)); // only the offset within a page counts
    }

    /// Whether `v` is zero outside `[at, at + len)`. Compared as slices:
    /// byte by byte, the test took Miri minutes (`.ci/miri.sh`).
    fn untouched(v: &[u8], at: usize, len: usize) -> bool {
        let zero = vec![0u8; v.len()];
        v[..at] == zero[..at] && v[at + len..] == zero[at + len..]
    }

    #[test]
    fn copies_arrive_whole_at_every_placement() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for len in [0, 1, PIECE, PIECE + 1, 3 * PIECE + 17, 33_000] {
            for d in [0usize, 1, 16, 31, 32, 4000] {
                let mut dst = vec![0u8; len + 8192 + 2];
                let at = ((src.as_ptr() as usize + d).wrapping_sub(dst.as_ptr() as usize)) & 4095;
                copy(&mut dst[at..at + len], &src[..len]);
                assert!(dst[at..at + len] == src[..len], "copy of {len} at +{d}");
                assert!(untouched(&dst, at, len));
                let mut again = vec![0u8; len + 8192 + 2];
                // SAFETY: both ranges hold `len` bytes and are separate vectors.
                unsafe { copy_raw(src.as_ptr(), again.as_mut_ptr().add(at), len) };
                assert!(
                    again[at..at + len] == src[..len],
                    "raw copy of {len} at +{d}"
                );
                assert!(untouched(&again, at, len));
                let mut grown = vec![9u8; 3];
                extend(&mut grown, &src[..len]);
                assert!(grown[..3] == [9, 9, 9] && grown[3..] == src[..len]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn unequal_lengths_panic_like_copy_from_slice() {
        let src = vec![1u8; 5000];
        let mut dst = vec![0u8; 4999 + 8192];
        let at = ((src.as_ptr() as usize + 16).wrapping_sub(dst.as_ptr() as usize)) & 4095;
        copy(&mut dst[at..at + 4999], &src);
    }
}
