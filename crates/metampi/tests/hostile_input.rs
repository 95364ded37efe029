//! Hostile and broken input from peers, seeded: random and mutated 64-byte envelopes
//! through the envelope decoder, and random, mutated and lying streams through the
//! rank's TCP reader, and through the stream codec alone, into its matching engine
//! (`metampi::fuzzing`). Nothing may panic;
//! the decoder refuses what it cannot re-encode, and a bad stream closes the link. The
//! open-ended search is the `rank_stream` and `stream_codec` targets in `fuzz/`.

use metampi::fuzzing::{decode_envelope, rank_stream, stream_codec, ENVELOPE_LEN};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Envelope kinds on the wire: eager, eager-sync, RTS, CTS, data, FIN, sync-ack.
const KINDS: std::ops::RangeInclusive<u8> = 1..=7;

/// A well-formed envelope as a peer would send it (layout in `src/envelope.rs`).
#[allow(clippy::too_many_arguments)]
fn envelope(
    kind: u8,
    ctx: u32,
    tag: i32,
    len: u64,
    sreq: u64,
    rreq: u64,
    addr: u64,
    frag: u32,
) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0] = kind;
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    b[12..16].copy_from_slice(&ctx.to_le_bytes());
    b[16..20].copy_from_slice(&tag.to_le_bytes());
    b[24..32].copy_from_slice(&len.to_le_bytes());
    b[32..40].copy_from_slice(&sreq.to_le_bytes());
    b[40..48].copy_from_slice(&rreq.to_le_bytes());
    b[48..56].copy_from_slice(&addr.to_le_bytes());
    b[56..60].copy_from_slice(&frag.to_le_bytes());
    b
}

/// A number biased towards edges.
fn num(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..5) {
        0 => 0,
        1 | 2 => rng.gen_range(0..200),
        3 => u64::MAX - rng.gen_range(0..4),
        _ => rng.gen(),
    }
}

/// A plausible frame: an envelope with fields near what the engine expects (request
/// ids of the first slots, offsets inside the posted buffers), then a payload that may
/// or may not be as long as the envelope says.
fn frame(rng: &mut StdRng) -> Vec<u8> {
    let kind = rng.gen_range(KINDS);
    let ctx = [0, 2, 4, 9][rng.gen_range(0..4)];
    let tag = [0, 7, -1, i32::MAX][rng.gen_range(0..4)];
    let id = |rng: &mut StdRng| (1u64 << 32) | rng.gen_range(0..5);
    let len = num(rng);
    let frag = rng.gen_range(0..300);
    let mut f = envelope(kind, ctx, tag, len, id(rng), id(rng), num(rng), frag).to_vec();
    let body = match kind {
        1 | 2 => (len as usize).min(400),
        5 => frag as usize,
        _ => 0,
    };
    let body = if rng.gen_bool(0.8) {
        body
    } else {
        rng.gen_range(0..100)
    };
    f.extend((0..body).map(|i| i as u8));
    f
}

#[test]
fn envelopes_random_and_mutated() {
    let mut rng = StdRng::seed_from_u64(21);
    let mut refused = 0;
    for i in 0..20_000 {
        let b: Vec<u8> = if i % 2 == 0 {
            (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect()
        } else {
            let mut e = envelope(
                rng.gen_range(KINDS),
                rng.gen(),
                rng.gen(),
                num(&mut rng),
                rng.gen(),
                rng.gen(),
                rng.gen(),
                rng.gen(),
            );
            for _ in 0..rng.gen_range(0..3) {
                e[rng.gen_range(0..ENVELOPE_LEN)] ^= 1 << rng.gen_range(0..8);
            }
            e.to_vec()
        };
        refused += usize::from(decode_envelope(&b).is_none());
    }
    // Short buffers, unknown kinds and inline lies are refused; real ones are not.
    assert!((5_000..15_000).contains(&refused), "{refused} refused");
}

#[test]
fn random_streams() {
    let mut rng = StdRng::seed_from_u64(22);
    for _ in 0..500 {
        let b: Vec<u8> = (0..rng.gen_range(0..600)).map(|_| rng.gen()).collect();
        rank_stream(&b).unwrap();
        stream_codec(&b);
    }
}

#[test]
fn mutated_streams() {
    let mut rng = StdRng::seed_from_u64(23);
    for _ in 0..1500 {
        let mut s = Vec::new();
        for _ in 0..rng.gen_range(1..8) {
            s.extend(frame(&mut rng));
        }
        if rng.gen_bool(0.5) {
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..s.len());
                s[at] ^= 1 << rng.gen_range(0..8);
            }
        }
        if !plausible_large_message(&s) {
            rank_stream(&s).unwrap();
            // The codec alone, with no socket, cut into chunks the first byte picks.
            let mut cut = vec![rng.gen()];
            cut.extend_from_slice(&s);
            stream_codec(&cut);
        }
    }
}

/// Whether the stream announces a rendezvous of more than 1 MiB that could really be
/// allocated: a receive into a vector of the message's size then gets (and zeroes) that
/// much memory, as it asked to, which only costs time here.
fn plausible_large_message(mut s: &[u8]) -> bool {
    while let Some((kind, len, trailing)) = decode_envelope(s) {
        if kind == 3 && len > 1 << 20 && len < 1 << 46 {
            return true;
        }
        let next = usize::try_from(trailing).map_or(usize::MAX, |t| t.saturating_add(ENVELOPE_LEN));
        s = s.get(next..).unwrap_or_default();
    }
    false
}

/// Found by `mutated_streams`: an RTS announcing 2^64 - 1 bytes, matched by a receive
/// into a vector of the message's size (context 4 in the harness), panicked with
/// "capacity overflow" in the engine's `RecvBuf::prepare`. The receive now fails with
/// `Count` and the sender is told to finish.
#[test]
fn regression_rts_larger_than_any_vector() {
    let rts: [u8; 64] = [
        3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, // kind RTS, dst 0, src 1, context 4
        0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // tag 0, len
        1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // sreq, rreq
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // addr, frag
    ];
    rank_stream(&rts).unwrap();
    // Below `isize::MAX` but above any address space: the allocator refuses it.
    let mut big = rts;
    big[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    rank_stream(&big).unwrap();
}
