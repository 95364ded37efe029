//! The rank side of a peer connection: the 64-byte envelope decoder on its own, then the
//! whole byte stream through the TCP reader into the matching engine (eager, rendezvous,
//! data fragments, acknowledgements), with receives posted. A malformed stream must close
//! the connection; nothing may panic or over-read a buffer.
//!
//! Run with `ASAN_OPTIONS=allocator_may_return_null=1` and `-malloc_limit_mb=16777216`:
//! a rendezvous into a vector of the message's size allocates what the sender announces,
//! and an impossible size must come back as an error, not as an allocator abort.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metampi::fuzzing::{decode_envelope, rank_stream, ENVELOPE_LEN};

/// Request to send (rendezvous) on the wire.
const RTS: u8 = 3;

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks(ENVELOPE_LEN) {
        let _ = decode_envelope(chunk);
    }
    if plausible_huge_message(data) {
        return;
    }
    rank_stream(data).expect("loopback sockets");
});

/// Whether the stream announces a rendezvous of more than 1 GiB that this machine might
/// really allocate. A receiver that asked for a message of any length gets that memory
/// (MPI semantics); only sizes no allocator can serve must fail, and those stay in.
fn plausible_huge_message(mut data: &[u8]) -> bool {
    while let Some((kind, len, trailing)) = decode_envelope(data) {
        if kind == RTS && len > 1 << 30 && len < 1 << 46 {
            return true;
        }
        let next = usize::try_from(trailing).map_or(usize::MAX, |t| t.saturating_add(ENVELOPE_LEN));
        data = data.get(next..).unwrap_or_default();
    }
    false
}
