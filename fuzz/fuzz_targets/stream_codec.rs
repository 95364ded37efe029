//! The rank side of a peer's byte stream without sockets: the stream codec
//! (`engine/stream.rs`) reads the input in chunks its first byte picks, with stalls between
//! them, and delivers frames to the matching engine, which has receives posted. A malformed
//! stream must be refused; nothing may panic or over-read a buffer, whatever the split.
//!
//! Run with `-malloc_limit_mb=16777216`, as `rank_stream`: a rendezvous into a vector of the
//! message's size allocates what the sender announces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metampi::fuzzing::stream_codec;

fuzz_target!(|data: &[u8]| {
    stream_codec(data);
});
