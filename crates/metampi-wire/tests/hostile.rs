//! Hostile and broken input, seeded: random bytes through every decoder, mutated real
//! streams, and random scripts of checksummed frames (the checksums hold, the fields
//! lie) through a link and a bundle. Nothing may panic; decoders return errors and
//! protocol violations close the connection. The same script is the `wire_link` fuzz
//! target in `fuzz/`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use metampi_wire::frame::{self, Decoded, FrameKind, Header, StreamDecoder, StreamItem};
use metampi_wire::record::{self, Record};
use metampi_wire::{decompress, Bundle, Codec, Compression, Config, Envelope, Link, Message};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CONN: u32 = 7;

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.gen_range(0..max);
    (0..n).map(|_| rng.gen()).collect()
}

/// Every decoder on `bytes`; returns how many of them refused it.
fn decode_all(bytes: &[u8]) -> usize {
    let mut refused = 0;
    match frame::decode(bytes, frame::MAX_PAYLOAD) {
        Err(_) => refused += 1,
        Ok(Decoded::Frame {
            header, payload, ..
        }) => {
            if let Ok(raw) = decompress(header.codec, payload, 1 << 20) {
                let _ = record::decode_payload(&raw);
            }
        }
        Ok(Decoded::Incomplete(_)) => {}
    }
    refused += usize::from(record::decode_payload(&Bytes::copy_from_slice(bytes)).is_err());
    for codec in [Codec::Lz4, Codec::Zstd] {
        refused += usize::from(decompress(codec, bytes, 1 << 20).is_err());
    }
    let mut d = StreamDecoder::new(1 << 20);
    for part in bytes.chunks(7) {
        d.push(part);
        while let Some(item) = d.next_frame() {
            if let StreamItem::Frame(h, p) = item {
                let _ = decompress(h.codec, &p, 1 << 20);
            }
        }
    }
    refused
}

/// Feeds `bytes` to a fresh link in pieces and drains every output.
fn feed_link(bytes: &[u8], piece: usize) {
    let t0 = Instant::now();
    let mut l = Link::new(t0, Config::default());
    for (i, part) in bytes.chunks(piece.max(1)).enumerate() {
        let now = t0 + Duration::from_millis(i as u64);
        l.handle_bytes(now, part);
        while l.poll_transmit(now).is_some() {}
        while l.poll_event().is_some() {}
    }
}

/// What a link writes for a few messages of assorted sizes.
fn real_stream(compression: Compression) -> Vec<u8> {
    let t0 = Instant::now();
    let cfg = Config::builder().compression(compression).build().unwrap();
    let mut l = Link::new(t0, cfg);
    for (i, len) in [0usize, 17, 700, 9000, 70_000].into_iter().enumerate() {
        let env = Envelope {
            src: 1,
            dst: 2,
            context: 3,
            tag: i as i32,
        };
        let data: Vec<u8> = (0..len).map(|j| (j % 13) as u8).collect();
        l.send_message(t0, Message::new(env, data)).unwrap();
    }
    let now = t0 + Duration::from_millis(5);
    l.handle_timeout(now);
    let mut out = Vec::new();
    while let Some(b) = l.poll_transmit(now) {
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn random_bytes_are_refused() {
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..3000 {
        let mut b = random_bytes(&mut rng, 400);
        if rng.gen_bool(0.5) && b.len() >= 4 {
            b[..4].copy_from_slice(&frame::MAGIC);
        }
        // Random bytes never carry a valid checksum or record layout.
        assert!(decode_all(&b) >= 3, "accepted {b:?}");
        feed_link(&b, rng.gen_range(1..64));
    }
}

#[test]
fn mutated_real_streams_never_panic() {
    let mut rng = StdRng::seed_from_u64(2);
    let streams = [
        real_stream(Compression::Off),
        real_stream(Compression::Lz4),
        real_stream(Compression::Auto),
    ];
    for i in 0..600 {
        let mut s = streams[i % streams.len()].clone();
        for _ in 0..rng.gen_range(1..4) {
            let at = rng.gen_range(0..s.len());
            match rng.gen_range(0..3) {
                0 => s[at] ^= 1 << rng.gen_range(0..8),
                1 => {
                    let end = (at + rng.gen_range(1..100)).min(s.len());
                    s.drain(at..end);
                }
                _ => {
                    let end = (at + rng.gen_range(1..100)).min(s.len());
                    let span = s[at..end].to_vec();
                    s.splice(at..at, span);
                }
            }
        }
        decode_all(&s[..s.len().min(20_000)]);
        feed_link(&s, rng.gen_range(1..5000));
    }
}

/// A number biased towards the values that matter: small ones, edges, anything.
fn num(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..6) {
        0 => 0,
        1 | 2 => rng.gen_range(0..256),
        3 => u64::MAX - rng.gen_range(0..256),
        4 => 1 << rng.gen_range(0..64),
        _ => rng.gen(),
    }
}

/// A frame with valid checksums and lying fields; the bundle link it goes to.
fn checked_frame(rng: &mut StdRng) -> (Vec<u8>, usize) {
    let kind = [
        FrameKind::Data,
        FrameKind::Data,
        FrameKind::Ack,
        FrameKind::Nack,
        FrameKind::Resume,
    ][rng.gen_range(0..5)];
    let codec = [Codec::Raw, Codec::Raw, Codec::Lz4, Codec::Zstd][rng.gen_range(0..4)];
    let link = rng.gen_range(0..4u8);
    let header = Header {
        kind,
        codec,
        failover: rng.gen_bool(0.2),
        unchecked: rng.gen_bool(0.2),
        link,
        connection: if rng.gen_bool(0.1) { rng.gen() } else { CONN },
        seq: num(rng),
        ack: num(rng),
        credit: num(rng),
        len: 0,
    };
    let mut payload = Vec::new();
    if kind == FrameKind::Data {
        for _ in 0..rng.gen_range(1..4) {
            let n = rng.gen_range(0..600);
            Record {
                envelope: Envelope {
                    src: num(rng) as u32,
                    dst: 0,
                    context: 0,
                    tag: num(rng) as i32,
                },
                id: num(rng),
                total: num(rng),
                offset: num(rng),
                data: Bytes::from(vec![0x3c; n]),
            }
            .encode(&mut payload);
        }
        if codec != Codec::Raw {
            let mut wrapped = (num(rng) as u32).to_le_bytes().to_vec();
            wrapped.extend_from_slice(&payload);
            payload = wrapped;
        }
    } else if rng.gen_bool(0.3) {
        payload = random_bytes(rng, 100);
    }
    let mut out = Vec::new();
    frame::encode(&header, &payload, &mut out);
    (out, usize::from(link))
}

#[test]
fn checksummed_lies_never_panic() {
    let mut rng = StdRng::seed_from_u64(3);
    let config = Config::builder()
        .connection_id(CONN)
        .window(64 << 10)
        .max_message_len(16 << 10)
        .build()
        .unwrap();
    for _ in 0..2000 {
        let t0 = Instant::now();
        let mut now = t0;
        let mut link = Link::new(t0, config.clone());
        let mut bundle = Bundle::new(t0, config.clone(), 3).unwrap();
        for _ in 0..20 {
            match rng.gen_range(0..8) {
                0..=4 => {
                    let (f, on) = checked_frame(&mut rng);
                    link.handle_bytes(now, &f);
                    bundle.handle_bytes(now, on, &f);
                }
                5 => {
                    let env = Envelope {
                        src: 0,
                        dst: 1,
                        context: 0,
                        tag: 0,
                    };
                    let msg = Message::new(env, vec![1u8; rng.gen_range(0..20_000)]);
                    let _ = link.send_message(now, msg.clone());
                    let _ = bundle.send_message(now, msg);
                }
                6 => {
                    now += Duration::from_millis(rng.gen_range(0..100_000));
                    link.handle_timeout(now);
                    bundle.handle_timeout(now);
                }
                _ => {
                    let on = rng.gen_range(0..4);
                    if rng.gen_bool(0.5) {
                        link.handle_disconnect(now);
                        bundle.handle_disconnect(now, on);
                    } else {
                        link.handle_reconnect(now);
                        bundle.handle_reconnect(now, on);
                    }
                }
            }
            while link.poll_transmit(now).is_some() {}
            for on in 0..4 {
                while bundle.poll_transmit(now, on).is_some() {}
            }
            while link.poll_event().is_some() {}
            while bundle.poll_event().is_some() {}
            assert!(link.receive_buffered() <= config.window());
        }
    }
}

/// Found by the `wire_link` fuzz target (script `[0, 0, 0, 0, 0, 5]`): one checksummed
/// `Data` frame on link 0 of a bundle granting credit `u64::MAX`. `Bundle::stats` summed
/// the per-link `send_credit` gauges with `+`, which overflowed (a panic with overflow
/// checks, a wrong figure without). Sums now saturate.
#[test]
fn regression_bundle_stats_with_unlimited_credit() {
    const FRAME: [u8; 96] = [
        77, 80, 87, 70, 1, 1, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        255, 255, 255, 255, 255, 255, 255, 255, 48, 0, 0, 0, 145, 168, 241, 243, 206, 151, 79, 119,
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let t0 = Instant::now();
    let config = Config::builder().connection_id(CONN).build().unwrap();
    let mut bundle = Bundle::new(t0, config, 3).unwrap();
    bundle.handle_bytes(t0, 0, &FRAME);
    while bundle.poll_transmit(t0, 0).is_some() {}
    while bundle.poll_event().is_some() {}
    assert_eq!(bundle.stats().send_credit, u64::MAX);
}
