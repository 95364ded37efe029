//! Hostile and broken input: random and mutated bytes never panic, and checksummed
//! frames that break the protocol close the connection with the right reason.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use metampi_wire::frame::{self, FrameKind, Header, StreamDecoder};
use metampi_wire::record::{self, Record};
use metampi_wire::{
    decompress, CloseReason, Codec, Compression, Config, Envelope, Event, Link, Message,
    ProtocolError, INITIAL_CREDIT,
};
use proptest::prelude::*;

/// Feeds `bytes` to a fresh link in pieces 1 µs apart and exercises every output, then
/// lets its timers run. Time only moves forward, as for a real driver: a timer run ahead
/// of the input would find a frame still arriving silent for that long.
fn feed(bytes: &[u8], pieces: &[usize]) -> Link {
    let t0 = Instant::now();
    let mut l = Link::new(t0, Config::default());
    let drain = |l: &mut Link, now| {
        while l.poll_transmit(now).is_some() {}
        while l.poll_event().is_some() {}
    };
    let mut at = 0;
    let mut i = 0;
    let mut now = t0;
    while at < bytes.len() {
        let n = pieces
            .get(i)
            .copied()
            .unwrap_or(usize::MAX)
            .clamp(1, bytes.len() - at);
        now = t0 + Duration::from_micros(i as u64);
        l.handle_bytes(now, &bytes[at..at + n]);
        drain(&mut l, now);
        if l.poll_timeout().is_some_and(|t| t <= now) {
            l.handle_timeout(now);
        }
        at += n;
        i += 1;
    }
    // Whatever is left incomplete is given up here, among the other timers.
    for _ in 0..4 {
        let Some(t) = l.poll_timeout() else { break };
        now = now.max(t);
        l.handle_timeout(now);
        drain(&mut l, now);
    }
    let _ = l.stats();
    l
}

/// A real stream: what a link sends for a mix of messages, and how many records.
fn real_stream(compression: Compression) -> (Vec<u8>, u64) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let cfg = Config::builder().compression(compression).build().unwrap();
    let mut l = Link::new(t0, cfg);
    for i in 0..6 {
        let len = [0, 10, 300, 5000, 40_000, 20][i];
        let data: Vec<u8> = (0..len).map(|j| (j % 7) as u8 * (i as u8)).collect();
        let env = Envelope {
            src: 1,
            dst: 2,
            context: 3,
            tag: i as i32,
        };
        l.send_message(t0, Message::new(env, data)).unwrap();
    }
    let now = t0 + Duration::from_millis(1);
    l.handle_timeout(now);
    while let Some(b) = l.poll_transmit(now) {
        out.extend_from_slice(&b);
    }
    (out, l.stats().records_out)
}

#[cfg(feature = "zstd")]
const MODES: [Compression; 3] = [Compression::Off, Compression::Lz4, Compression::Zstd];
#[cfg(not(feature = "zstd"))]
const MODES: [Compression; 3] = [Compression::Off, Compression::Lz4, Compression::Auto];

fn data_frame(connection: u32, seq: u64, ack: u64, records: &[Record]) -> Vec<u8> {
    let mut payload = Vec::new();
    for r in records {
        r.encode(&mut payload);
    }
    let h = Header {
        kind: FrameKind::Data,
        codec: Codec::Raw,
        failover: false,
        unchecked: false,
        link: 0,
        connection,
        seq,
        ack,
        credit: INITIAL_CREDIT,
        len: 0,
    };
    let mut out = Vec::new();
    frame::encode(&h, &payload, &mut out);
    out
}

fn rec(id: u64, offset: u64, len: usize, total: u64) -> Record {
    Record {
        envelope: Envelope::default(),
        id,
        total,
        offset,
        data: Bytes::from(vec![9u8; len]),
    }
}

fn closed_with(frames: &[Vec<u8>]) -> Option<CloseReason> {
    let t0 = Instant::now();
    let mut l = Link::new(
        t0,
        Config::builder().max_message_len(100_000).build().unwrap(),
    );
    for f in frames {
        l.handle_bytes(t0, f);
    }
    let mut reason = None;
    while let Some(e) = l.poll_event() {
        if let Event::Closed(r) = e {
            reason = Some(r);
        }
    }
    assert_eq!(reason.as_ref(), l.close_reason());
    reason
}

#[test]
fn protocol_violations_close_with_their_reason() {
    use ProtocolError as P;
    let protocol = |frames: &[Vec<u8>]| match closed_with(frames) {
        Some(CloseReason::Protocol(p)) => p,
        other => panic!("expected a protocol error, got {other:?}"),
    };
    assert!(closed_with(&[data_frame(0, 0, 0, &[rec(0, 0, 10, 10)])]).is_none());
    assert!(matches!(
        protocol(&[data_frame(7, 0, 0, &[rec(0, 0, 10, 10)])]),
        P::WrongLink { connection: 7, .. }
    ));
    assert!(matches!(
        protocol(&[data_frame(0, 0, 5, &[rec(0, 0, 10, 10)])]),
        P::AckBeyondSent { ack: 5, sent: 0 }
    ));
    let over = [
        data_frame(0, 0, 0, &[rec(0, 0, 60_000, 60_000)]),
        data_frame(0, 1, 0, &[rec(1, 0, 6000, 6000)]),
    ];
    assert!(matches!(protocol(&over), P::FlowControl { .. }));
    assert!(matches!(
        protocol(&[data_frame(0, 0, 0, &[rec(0, 0, 10, 200_000)])]),
        P::MessageTooLarge {
            len: 200_000,
            max: 100_000
        }
    ));
    let mut other = rec(0, 10, 10, 20);
    other.envelope.tag = 5;
    assert!(matches!(
        protocol(&[
            data_frame(0, 0, 0, &[rec(0, 0, 10, 20)]),
            data_frame(0, 1, 0, &[other])
        ]),
        P::InconsistentFragment { id: 0 }
    ));
    // A checksummed frame whose payload is not records.
    let h = Header {
        kind: FrameKind::Data,
        codec: Codec::Lz4,
        failover: false,
        unchecked: false,
        link: 0,
        connection: 0,
        seq: 0,
        ack: 0,
        credit: 0,
        len: 0,
    };
    let mut junk = Vec::new();
    frame::encode(&h, b"\x10\0\0\0not lz4 at all", &mut junk);
    assert!(matches!(protocol(&[junk]), P::Payload(_)));
}

#[test]
fn bytes_after_close_are_ignored() {
    let mut frames = vec![data_frame(9, 0, 0, &[rec(0, 0, 1, 1)])];
    frames.push(data_frame(0, 0, 0, &[rec(0, 0, 1, 1)]));
    let t0 = Instant::now();
    let mut l = Link::new(t0, Config::default());
    for f in &frames {
        l.handle_bytes(t0, f);
    }
    let events: Vec<_> = std::iter::from_fn(|| l.poll_event()).collect();
    assert!(
        events.iter().all(|e| !matches!(e, Event::Delivered(_))),
        "{events:?}"
    );
    assert!(l.poll_transmit(t0).is_none());
}

#[test]
fn a_real_stream_decodes_whole_and_in_any_split() {
    for mode in MODES {
        let (stream, records) = real_stream(mode);
        assert_eq!(records, 6);
        let l = feed(&stream, &[]);
        assert!(l.close_reason().is_none());
        let st = l.stats();
        assert_eq!((st.corrupt_in, st.skipped_bytes_in), (0, 0));
        assert_eq!(st.records_in, records);
        let l = feed(&stream, &[1, 2, 3, 47, 48, 49, 1000, 1, 7]);
        assert_eq!(l.stats().records_in, records);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(2000)))]

    #[test]
    fn random_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        max in 0usize..100_000,
    ) {
        let _ = frame::decode(&bytes, max);
        let _ = record::decode_payload(&Bytes::from(bytes.clone()));
        for codec in [Codec::Raw, Codec::Lz4, Codec::Zstd] {
            let _ = decompress(codec, &bytes, max);
        }
        let mut d = StreamDecoder::new(max);
        d.push(&bytes);
        while d.next_frame().is_some() {}
        feed(&bytes, &[5, 100, 3]);
    }

    #[test]
    fn random_bytes_behind_a_valid_magic_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = frame::MAGIC.to_vec();
        bytes.push(frame::VERSION);
        bytes.extend_from_slice(&tail);
        feed(&bytes, &[]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(300)))]

    /// Bit flips, cut-outs, insertions and repeats in a real stream never panic.
    #[test]
    fn mutated_streams_never_panic(
        edits in proptest::collection::vec((0u8..4, any::<u32>(), any::<u32>(), any::<u8>()), 1..20),
        pieces in proptest::collection::vec(1usize..5000, 0..10),
        mode in 0usize..3,
    ) {
        let mut s = real_stream(MODES[mode]).0;
        for (op, a, b, v) in edits {
            let at = a as usize % s.len().max(1);
            match op {
                0 => { if !s.is_empty() { s[at] ^= 1 << (v % 8); } }
                1 => { let end = (at + b as usize % 300).min(s.len()); s.drain(at..end); }
                2 => { s.insert(at.min(s.len()), v); }
                _ => {
                    let end = (at + b as usize % 200).min(s.len());
                    let copy = s[at..end].to_vec();
                    s.splice(at..at, copy);
                }
            }
        }
        feed(&s, &pieces);
    }

    /// Frames with valid checksums but arbitrary header fields and payloads (what a
    /// buggy or hostile peer can send) never panic; the link either copes or closes.
    #[test]
    fn checksummed_garbage_never_panics(
        frames in proptest::collection::vec(
            (1u8..=4, 0u8..3, any::<bool>(), 0u8..2, 0u32..2, 0u64..4, 0u64..4, any::<u64>(),
             proptest::collection::vec(any::<u8>(), 0..200),
             proptest::option::of((any::<u64>(), any::<u64>(), any::<u64>(), 0usize..100))),
            1..8),
    ) {
        let mut stream = Vec::new();
        for (kind, codec, failover, link, connection, seq, ack, credit, junk, record) in frames {
            let kind = match kind { 1 => FrameKind::Data, 2 => FrameKind::Ack, 3 => FrameKind::Nack, _ => FrameKind::Resume };
            let codec = match codec { 0 => Codec::Raw, 1 => Codec::Lz4, _ => Codec::Zstd };
            let mut payload = junk;
            if let Some((id, total, offset, len)) = record {
                let r = Record { envelope: Envelope::default(), id: id % 4, total: total % 1000, offset: offset % 1000, data: Bytes::from(vec![1u8; len]) };
                payload.clear();
                r.encode(&mut payload);
            }
            let h = Header { kind, codec, failover, unchecked: kind == FrameKind::Data && ack % 2 == 1, link, connection, seq, ack, credit, len: 0 };
            frame::encode(&h, &payload, &mut stream);
        }
        feed(&stream, &[]);
    }
}
