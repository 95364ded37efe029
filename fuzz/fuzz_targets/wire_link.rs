//! The link state machines behind the checksums: `wire_frame` mostly stops at the CRCs,
//! so here the input is a script of well-formed frames (valid checksums, fuzzed
//! sequence, acknowledgement and credit fields, record headers and fragments, codecs),
//! raw bytes, sends, timer ticks and reconnects, fed to a `Link` and to a three-link
//! `Bundle`. That reaches acknowledgement and credit handling, reassembly and bundle
//! failover, with bytes copied in and, every other step, handed over as a reader thread
//! hands them (`handle_owned`). Protocol violations must close the connection; nothing may
//! panic.
#![no_main]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use metampi_wire::frame::{self, FrameKind, Header};
use metampi_wire::record::Record;
use metampi_wire::{Bundle, Codec, Config, Envelope, Link, Message};

const CONN: u32 = 7;

/// Reads the script; zeros once it runs out.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }

    /// A number biased towards the values that matter: small ones, edges, anything.
    fn num(&mut self) -> u64 {
        match self.byte() % 8 {
            0 => 0,
            1..=3 => u64::from(self.byte()),
            4 => u64::from(self.byte()) << 8 | u64::from(self.byte()),
            5 => u64::MAX - u64::from(self.byte()),
            6 => 1 << (self.byte() % 64),
            _ => {
                let mut a = [0u8; 8];
                let b = self.bytes(8);
                a[..b.len()].copy_from_slice(b);
                u64::from_le_bytes(a)
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut now = t0;
    let config = Config::builder()
        .connection_id(CONN)
        .window(64 << 10)
        .max_message_len(16 << 10)
        .build()
        .expect("valid config");
    let mut link = Link::new(t0, config.clone());
    let mut bundle = Bundle::new(t0, config, 3).expect("three links");
    let mut s = Script(data);
    for step in 0..128 {
        // Every other step, bytes go over as a reader thread hands them (the decoder takes
        // the buffer over, `handle_owned`) rather than copied in.
        let owned = step % 2 == 1;
        if s.0.is_empty() {
            break;
        }
        match s.byte() % 8 {
            0..=3 => {
                let (bytes, on) = checked_frame(&mut s);
                feed(&mut link, &mut bundle, now, on, &bytes, owned);
            }
            4 => {
                let n = usize::from(s.byte());
                let raw = s.bytes(n).to_vec();
                let on = usize::from(s.byte() % 3);
                feed(&mut link, &mut bundle, now, on, &raw, owned);
            }
            5 => {
                let env = Envelope {
                    src: s.num() as u32,
                    dst: s.num() as u32,
                    context: s.num() as u32,
                    tag: s.num() as i32,
                };
                let len = (s.num() % (20 << 10)) as usize;
                let msg = Message::new(env, vec![0xa5; len]);
                let _ = link.send_message(now, msg.clone());
                let _ = bundle.send_message(now, msg);
            }
            6 => {
                now += Duration::from_millis(s.num() % 100_000);
                link.handle_timeout(now);
                bundle.handle_timeout(now);
            }
            _ => {
                let on = usize::from(s.byte() % 4);
                if s.byte() & 1 == 0 {
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
        let _ = (link.poll_timeout(), bundle.poll_timeout());
        let _ = (link.stats(), bundle.stats(), bundle.link_stats(3));
        let _ = (link.receive_buffered(), bundle.receive_buffered());
    }
});

/// `bytes` into the link and into link `on` of the bundle, copied or handed over.
fn feed(link: &mut Link, bundle: &mut Bundle, now: Instant, on: usize, bytes: &[u8], owned: bool) {
    if owned {
        link.handle_owned(now, BytesMut::from(bytes));
        bundle.handle_owned(now, on, BytesMut::from(bytes));
    } else {
        link.handle_bytes(now, bytes);
        bundle.handle_bytes(now, on, bytes);
    }
}

/// One frame with valid checksums; the bundle link index it goes to.
fn checked_frame(s: &mut Script<'_>) -> (Vec<u8>, usize) {
    let sel = s.byte();
    let kind = match sel % 8 {
        0..=3 => FrameKind::Data,
        4 | 5 => FrameKind::Ack,
        6 => FrameKind::Nack,
        _ => FrameKind::Resume,
    };
    let codec = match (sel >> 3) % 8 {
        6 => Codec::Lz4,
        7 => Codec::Zstd,
        _ => Codec::Raw,
    };
    let lb = s.byte();
    let link = lb % 4;
    let header = Header {
        kind,
        codec,
        failover: sel & 0x40 != 0,
        unchecked: lb & 0x10 != 0,
        link,
        connection: if sel & 0x80 != 0 {
            s.num() as u32
        } else {
            CONN
        },
        seq: s.num(),
        ack: s.num(),
        credit: s.num(),
        len: 0,
    };
    let mut payload = Vec::new();
    if kind == FrameKind::Data {
        for _ in 0..=s.byte() % 4 {
            let n = (s.num() % 600) as usize;
            let fragment = s.bytes(n).to_vec();
            Record {
                envelope: Envelope {
                    src: s.num() as u32,
                    dst: 0,
                    context: 0,
                    tag: s.num() as i32,
                },
                id: s.num(),
                total: s.num(),
                offset: s.num(),
                data: Bytes::from(fragment),
            }
            .encode(&mut payload);
        }
        if codec != Codec::Raw {
            // The raw length in front of whatever follows; a real compressor is not
            // needed to reach the decoders' checks.
            let mut wrapped = (s.num() as u32).to_le_bytes().to_vec();
            wrapped.extend_from_slice(&payload);
            payload = wrapped;
        }
    } else if s.byte() & 1 == 1 {
        let n = usize::from(s.byte());
        payload.extend_from_slice(s.bytes(n));
    }
    let mut out = Vec::new();
    frame::encode(&header, &payload, &mut out);
    (out, usize::from(link))
}
