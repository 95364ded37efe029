//! The copy-free paths: frames leave as header plus slices of the messages
//! (`poll_transmit_parts`), bytes are read straight into the decoder's buffer
//! (`handle_read`) and messages come out as the slices they arrived in
//! (`poll_message_parts`), with the same results as the copying calls; chunks
//! another thread read and cut at frame boundaries (`frame_len`) are decoded in
//! place (`handle_owned`).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use metampi_wire::{Compression, Config, Envelope, Event, Link, Message};
use proptest::prelude::*;

fn config() -> Config {
    Config::builder()
        .compression(Compression::Off)
        .max_message_len(1 << 20)
        .build()
        .expect("valid")
}

fn message(tag: i32, len: usize) -> Message {
    let data: Vec<u8> = (0..len).map(|i| (i as u32 ^ tag as u32) as u8).collect();
    Message::new(
        Envelope {
            src: 1,
            dst: 2,
            context: 3,
            tag,
        },
        data,
    )
}

/// Everything `a` sends now, as frames.
fn frames(a: &mut Link, now: Instant) -> Vec<metampi_wire::Transmit> {
    a.handle_timeout(now);
    std::iter::from_fn(|| a.poll_transmit_parts(now)).collect()
}

/// A sender that has heard the receivers' windows (a fresh link only assumes the
/// initial credit, and a receiver only grants more once it has said so).
fn sender(now: Instant, cfg: Config, receivers: &mut [&mut Link]) -> Link {
    let mut a = Link::new(now, cfg);
    for r in receivers {
        for t in frames(r, now) {
            a.handle_bytes(now, &t.to_vec());
        }
    }
    a
}

/// Messages of `lens` bytes sent by `a` one a millisecond from `t0`: the messages,
/// the stream of frames they went out in, and the time after the last.
fn send_all(a: &mut Link, t0: Instant, lens: &[usize]) -> (Vec<Message>, Vec<u8>, Instant) {
    let sent: Vec<Message> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| message(i as i32, n))
        .collect();
    let mut stream = Vec::new();
    let mut now = t0;
    for m in &sent {
        a.send_message(now, m.clone()).unwrap();
        now += Duration::from_millis(1);
        for t in frames(a, now) {
            stream.extend_from_slice(&t.to_vec());
        }
    }
    (sent, stream, now)
}

#[test]
fn a_large_message_goes_out_as_slices_of_itself_and_arrives_in_pieces() {
    let t0 = Instant::now();
    let mut b = Link::new(t0, config());
    let mut a = sender(t0, config(), &mut [&mut b]);
    let big = message(7, 200_000);
    let small = message(8, 100);
    a.send_message(t0, big.clone()).unwrap();
    a.send_message(t0, small.clone()).unwrap();
    let now = t0 + Duration::from_millis(1);
    let out = frames(&mut a, now);
    assert!(out.len() >= 4, "{} frames", out.len());
    // Every byte of the large message that is on the wire is the message's own.
    let range = big.data.as_ptr() as usize..big.data.as_ptr() as usize + big.data.len();
    let shared: usize = out
        .iter()
        .flat_map(|t| &t.parts)
        .filter(|p| range.contains(&(p.as_ptr() as usize)))
        .map(Bytes::len)
        .sum();
    // (But for a short tail, copied next to its record header.)
    assert!(shared > big.data.len() - metampi_wire::record::INLINE_BELOW);

    // The receiver reads the stream in pieces the size its buffer asks for, at most
    // 100 KB at a time, straight into that buffer.
    let stream: Vec<u8> = out.iter().flat_map(|t| t.to_vec()).collect();
    let mut at = 0;
    while at < stream.len() {
        let n = b.handle_read(now, |buf: &mut BytesMut, max| {
            let n = max.min(100_000).min(stream.len() - at);
            buf.extend_from_slice(&stream[at..at + n]);
            n
        });
        at += n;
    }
    let m = b.poll_message_parts().expect("the large message");
    assert!(m.parts.len() > 1, "in the pieces it came in");
    assert!(m.parts.iter().all(|p| !p.is_empty()));
    assert_eq!(m.len(), big.data.len());
    assert!(m.into_message() == big);
    // `poll_event` joins them.
    assert!(b.poll_event() == Some(Event::Delivered(small)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Reading into the decoder's buffer delivers what copying in does, however the
    /// reads are cut and whatever their sizes.
    #[test]
    fn reads_into_the_buffer_deliver_what_copies_do(
        lens in prop::collection::vec(0usize..150_000, 1..12),
        cuts in prop::collection::vec(1usize..70_000, 1..40),
        compress in any::<bool>(),
    ) {
        let t0 = Instant::now();
        let cfg = Config::builder()
            .compression(if compress { Compression::Lz4 } else { Compression::Off })
            .max_message_len(1 << 20)
            .build()
            .unwrap();
        let mut copied = Link::new(t0, cfg.clone());
        let mut read = Link::new(t0, cfg.clone());
        let mut a = sender(t0, cfg, &mut [&mut copied, &mut read]);
        let (sent, stream, now) = send_all(&mut a, t0, &lens);
        let (mut at, mut i) = (0, 0);
        while at < stream.len() {
            let want = cuts[i % cuts.len()];
            i += 1;
            let n = read.handle_read(now, |buf, max| {
                let n = max.min(want).min(stream.len() - at);
                buf.extend_from_slice(&stream[at..at + n]);
                n
            });
            copied.handle_bytes(now, &stream[at..at + n]);
            at += n;
        }
        let mut got = Vec::new();
        while let Some(m) = read.poll_message_parts() {
            got.push(m.into_message());
        }
        let mut want = Vec::new();
        while let Some(Event::Delivered(m)) = copied.poll_event() {
            want.push(m);
        }
        // (Not `prop_assert_eq`: the messages are too long to print.)
        prop_assert!(got == sent, "read into the buffer: {} of {} messages", got.len(), sent.len());
        prop_assert!(want == sent, "copied: {} of {} messages", want.len(), sent.len());
        prop_assert_eq!(read.stats().bytes_in, stream.len() as u64);
    }

    /// Chunks read elsewhere and handed over whole deliver what copying in does,
    /// cut anywhere or (as a reader thread cuts them) after whole frames; the
    /// latter are decoded where they lie. A check that fails when chunks are
    /// copied in: `in_place` (by the pieces' addresses).
    #[test]
    fn handed_over_chunks_deliver_what_copies_do(
        lens in prop::collection::vec(0usize..150_000, 1..10),
        cuts in prop::collection::vec(1usize..70_000, 1..40),
        at_frames in any::<bool>(),
    ) {
        let t0 = Instant::now();
        let mut owned = Link::new(t0, config());
        let mut a = sender(t0, config(), &mut [&mut owned]);
        let (sent, stream, now) = send_all(&mut a, t0, &lens);
        let mut chunks: Vec<BytesMut> = Vec::new();
        let (mut at, mut i) = (0, 0);
        while at < stream.len() {
            let mut n = cuts[i % cuts.len()].min(stream.len() - at);
            i += 1;
            if at_frames {
                // Whole frames only: at least one, then as many more as fit in `n`.
                let mut end = at + metampi_wire::frame::frame_len(&stream[at..]).unwrap();
                while let Some(f) = metampi_wire::frame::frame_len(&stream[end..]) {
                    if end + f > at + n {
                        break;
                    }
                    end += f;
                }
                n = end - at;
            }
            chunks.push(BytesMut::from(&stream[at..at + n]));
            at += n;
        }
        let mut lent = Vec::new();
        for c in chunks {
            lent.push(c.as_ptr() as usize..c.as_ptr() as usize + c.len());
            owned.handle_owned(now, c);
        }
        let mut got = Vec::new();
        let mut in_place = true;
        while let Some(m) = owned.poll_message_parts() {
            // (Fragments under 4 KiB are copied out on purpose: they would pin
            // the whole chunk.)
            in_place &= m.parts.iter().all(|p| {
                p.len() < 4096 || lent.iter().any(|r| r.contains(&(p.as_ptr() as usize)))
            });
            got.push(m.into_message());
        }
        prop_assert!(got == sent, "handed over: {} of {} messages", got.len(), sent.len());
        prop_assert_eq!(owned.stats().bytes_in, stream.len() as u64);
        if at_frames {
            prop_assert!(in_place, "a message was copied out of the chunks it came in");
        }
    }
}
