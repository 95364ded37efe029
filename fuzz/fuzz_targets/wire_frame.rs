//! Frame, payload and stream decoding of `metampi-wire` on arbitrary bytes: nothing may
//! panic, whatever arrives from the network.
#![no_main]

use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use metampi_wire::frame::{self, Decoded};
use metampi_wire::{decompress, record, Config, Link};

fuzz_target!(|data: &[u8]| {
    // One frame at the front, at the default and the largest limit; if it checks out,
    // its payload through decompression and record parsing.
    for limit in [64 << 10, frame::MAX_PAYLOAD] {
        if let Ok(Decoded::Frame { header, payload, .. }) = frame::decode(data, limit) {
            if let Ok(raw) = decompress(header.codec, payload, limit) {
                let _ = record::decode_payload(&raw);
            }
        }
    }
    // The bytes as a payload directly (checksums would hide most of it otherwise).
    let _ = record::decode_payload(&Bytes::copy_from_slice(data));

    // The whole state machine on the bytes as a stream, split where the first byte says.
    let t0 = Instant::now();
    let mut link = Link::new(t0, Config::default());
    let mid = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    for (i, part) in [&data[..mid], &data[mid..]].into_iter().enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        link.handle_bytes(now, part);
        while link.poll_transmit(now).is_some() {}
        while link.poll_event().is_some() {}
        if let Some(t) = link.poll_timeout() {
            link.handle_timeout(t);
        }
    }
});
