//! The byte-stream codec of rank links (a TCP connection, or a router's shared-memory pipes):
//! frames of a 64-byte envelope and its payload, decoded by [`StreamRx`] without any I/O of
//! its own. Bytes come from a [`ByteSource`] and frames go to a [`FrameSink`] (the matching
//! core); the link drives it with its socket or pipe, the tests and the `stream_codec` fuzz
//! target with byte slices.
//!
//! The codec asks the source for bytes rather than being handed them (`handle_bytes`) so that
//! a large payload is read straight into the receive buffer it matched: staging it first cost
//! a quarter of the time of every 1 MiB message over TCP (decision 0047,
//! `docs/decisions/0047-stream-codec-reads-from-a-source.md`). Routers, which only
//! forward frames, share the envelope check ([`decode_head`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::core::{Core, ReqId};
use crate::envelope::{decode_head, Envelope, Kind, ENV_LEN};

/// Payload bytes of messages read straight to their target (long eager ones
/// and rendezvous data) that came through the staging buffer instead, and
/// so were copied twice (for `counters::staged_payload_bytes`).
pub(crate) static STAGED_PAYLOAD: AtomicU64 = AtomicU64::new(0);

/// Largest eager payload accepted from a stream peer; more is a protocol error.
const MAX_EAGER_WIRE: usize = 64 << 20;
/// Bytes of the stream staging buffer.
const RX_BUF: usize = 256 << 10;
/// Payloads at least this large are read directly into their target.
const DIRECT_MIN: usize = 16 << 10;
/// What a staging read takes after a frame whose payload went straight to
/// its target: the next envelope and a little, not most of the next
/// payload. Large messages come in runs (a rendezvous's fragments, a
/// stream of long sends), and a full read would stage up to 256 KiB of the
/// next one only to copy it again: the receiving rank of a routed 4 MiB
/// stream spent a third of its time on that copy.
const SMALL_FILL: usize = 4 << 10;

/// Where a stream's bytes come from.
pub(crate) trait ByteSource {
    /// Reads into `buf`: `Ok(None)` when nothing is there now, an error when the stream
    /// failed or closed.
    fn read_into(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;

    /// Whether a read that gives less than asked means the source is drained for now (a
    /// socket), so the codec stops at the next frame boundary instead of paying a read that
    /// finds nothing.
    fn short_read_drains(&self) -> bool;
}

/// Where decoded frames go: the matching core, whose methods these are.
pub(crate) trait FrameSink {
    /// A whole frame with its payload.
    fn frame(&mut self, env: &Envelope, payload: &[u8]);
    /// The eager message `env` matched a posted receive that can hold it; its payload goes to
    /// [`FrameSink::claimed_target`], then [`FrameSink::claimed_done`].
    fn claim_eager(&mut self, env: &Envelope) -> Option<ReqId>;
    fn claimed_target(&mut self, id: ReqId) -> Option<&mut [u8]>;
    fn claimed_done(&mut self, id: ReqId, env: &Envelope);
    /// An eager payload nobody has asked for, handed over without a copy.
    fn staged(&mut self, env: &Envelope, payload: Vec<u8>);
    /// Where the payload of rendezvous fragment `env` goes, if its receive is alive; then
    /// [`FrameSink::data_done`].
    fn data_target(&mut self, env: &Envelope) -> Option<&mut [u8]>;
    fn data_done(&mut self, env: &Envelope);
}

impl FrameSink for Core {
    fn frame(&mut self, env: &Envelope, payload: &[u8]) {
        self.handle_incoming(env, payload);
    }
    fn claim_eager(&mut self, env: &Envelope) -> Option<ReqId> {
        Core::claim_eager(self, env)
    }
    fn claimed_target(&mut self, id: ReqId) -> Option<&mut [u8]> {
        self.matched_target(id)
    }
    fn claimed_done(&mut self, id: ReqId, env: &Envelope) {
        self.eager_done(id, env);
    }
    fn staged(&mut self, env: &Envelope, payload: Vec<u8>) {
        self.handle_eager_owned(env, payload);
    }
    fn data_target(&mut self, env: &Envelope) -> Option<&mut [u8]> {
        Core::data_target(self, env)
    }
    fn data_done(&mut self, env: &Envelope) {
        Core::data_done(self, env);
    }
}

/// The receive side of one stream: a staging buffer, so that one read usually brings in
/// several small frames, and the frame in progress.
pub(crate) struct StreamRx {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    env: Option<Envelope>,
    body: Body,
    body_got: usize,
    /// The last frame begun had a payload read straight to its target:
    /// the next read into the staging buffer takes only [`SMALL_FILL`].
    big: bool,
    /// `Cts` frames written on this stream whose `Data` has not begun to
    /// arrive: staging reads take only [`SMALL_FILL`] meanwhile, so that
    /// the first fragment's payload goes straight to the receive buffer too
    /// (a full read staged 256 KiB of it and copied it again: a quarter of
    /// every 1 MiB message over TCP).
    pub(super) awaiting_data: u32,
}

#[derive(Default)]
enum Body {
    #[default]
    None,
    /// An eager payload nobody has asked for yet (queued as it is, no copy).
    Staged(Vec<u8>),
    /// An eager payload read straight into the posted receive it matched.
    Eager(ReqId),
    /// Rendezvous data read straight into the receiver's buffer.
    Direct,
    /// Bytes for a request that no longer exists.
    Discard,
}

impl Default for StreamRx {
    fn default() -> Self {
        StreamRx {
            buf: vec![0; RX_BUF],
            start: 0,
            end: 0,
            env: None,
            body: Body::None,
            body_got: 0,
            big: false,
            awaiting_data: 0,
        }
    }
}

impl StreamRx {
    /// The receive a broken stream's frame in progress had claimed, for the link to fail it
    /// (a wildcard receive names no peer to fail it by).
    pub(crate) fn take_claimed(&mut self) -> Option<ReqId> {
        match std::mem::take(&mut self.body) {
            Body::Eager(id) => Some(id),
            _ => None,
        }
    }

    /// Decodes every complete frame `src` has now, without blocking, into `sink`; whether a
    /// frame was delivered. `src_of` names the engine rank of a frame's wire source (a
    /// router connection carries other worlds' ids). `got`: set when bytes came in.
    ///
    /// # Errors
    /// The source's errors; `InvalidData` for a malformed envelope or an eager payload over
    /// 64 MiB. The stream is unusable after an error.
    pub(crate) fn pump(
        &mut self,
        src: &mut impl ByteSource,
        sink: &mut impl FrameSink,
        src_of: impl Fn(u32) -> u32,
        got: &mut bool,
    ) -> io::Result<bool> {
        let mut moved = false;
        // A socket read gave less than asked: at a frame boundary, stop rather
        // than pay a read that finds nothing (a small message's second syscall).
        let mut drained = false;
        loop {
            let avail = self.end - self.start;
            let Some(env) = self.env else {
                if let Some(mut env) = decode_head(&self.buf[self.start..self.end])? {
                    env.src = src_of(env.src);
                    self.start += ENV_LEN;
                    if self.begin(env, sink)? {
                        moved = true;
                    }
                    continue;
                }
                if drained {
                    return Ok(moved);
                }
                let max = if self.big || self.awaiting_data > 0 {
                    SMALL_FILL
                } else {
                    RX_BUF
                };
                let Some(short) = self.fill(src, max)? else {
                    return Ok(moved);
                };
                drained = short;
                *got = true;
                continue;
            };
            let n = env.trailing_len();
            let need = n - self.body_got;
            if avail > 0 {
                let k = avail.min(need);
                let bytes = &self.buf[self.start..self.start + k];
                match &mut self.body {
                    Body::Staged(v) => crate::sys::copy::extend(v, bytes),
                    Body::Direct | Body::Eager(_) => match target(sink, &self.body, &env) {
                        Some(dst) => {
                            STAGED_PAYLOAD.fetch_add(k as u64, Ordering::Relaxed);
                            crate::sys::copy::copy(
                                &mut dst[self.body_got..self.body_got + k],
                                bytes,
                            )
                        }
                        None => self.body = Body::Discard,
                    },
                    _ => {}
                }
                self.start += k;
                self.body_got += k;
            } else if need >= DIRECT_MIN && matches!(self.body, Body::Direct | Body::Eager(_)) {
                let got_now = match target(sink, &self.body, &env) {
                    Some(dst) => src.read_into(&mut dst[self.body_got..])?,
                    None => {
                        self.body = Body::Discard;
                        continue;
                    }
                };
                match got_now {
                    None => return Ok(moved),
                    Some(k) => {
                        self.body_got += k;
                        *got = true;
                    }
                }
            } else {
                let max = match self.body {
                    // The payload's tail, the next envelope and a little.
                    Body::Direct | Body::Eager(_) => need + SMALL_FILL,
                    _ => RX_BUF,
                };
                let Some(short) = self.fill(src, max)? else {
                    return Ok(moved);
                };
                drained = short;
                *got = true;
            }
            if self.body_got == n {
                match std::mem::take(&mut self.body) {
                    Body::Staged(v) => sink.staged(&env, v),
                    Body::Eager(id) => sink.claimed_done(id, &env),
                    Body::Direct => sink.data_done(&env),
                    _ => {}
                }
                self.env = None;
                moved = true;
            }
        }
    }

    /// Starts frame `env`, whose envelope is consumed: delivers it at once where its payload
    /// is empty or already buffered (true), else decides where the payload goes.
    fn begin(&mut self, env: Envelope, sink: &mut impl FrameSink) -> io::Result<bool> {
        let n = env.trailing_len();
        if n == 0 {
            sink.frame(&env, &[]);
            self.big = false;
            return Ok(true);
        }
        if env.kind != Kind::Data && n > MAX_EAGER_WIRE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "eager message too large",
            ));
        }
        // Whole small frame already buffered: hand it over in place.
        if env.kind != Kind::Data && self.end - self.start >= n {
            sink.frame(&env, &self.buf[self.start..self.start + n]);
            self.start += n;
            self.big = false;
            return Ok(true);
        }
        self.body_got = 0;
        self.body = if env.kind == Kind::Data {
            self.awaiting_data = self.awaiting_data.saturating_sub(1);
            if sink.data_target(&env).is_some() {
                Body::Direct
            } else {
                Body::Discard
            }
        } else if let Some(id) = sink.claim_eager(&env) {
            Body::Eager(id)
        } else {
            Body::Staged(Vec::with_capacity(n))
        };
        self.big = n >= DIRECT_MIN && matches!(self.body, Body::Direct | Body::Eager(_));
        self.env = Some(env);
        Ok(false)
    }

    /// Reads up to `max` more bytes into the staging buffer; `None` when
    /// nothing is there, else whether the source is drained (see
    /// [`ByteSource::short_read_drains`]).
    fn fill(&mut self, src: &mut impl ByteSource, max: usize) -> io::Result<Option<bool>> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < ENV_LEN {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let to = self.buf.len().min(self.end.saturating_add(max));
        match src.read_into(&mut self.buf[self.end..to])? {
            None => Ok(None),
            Some(k) => {
                let short = src.short_read_drains() && self.end + k < to;
                self.end += k;
                Ok(Some(short))
            }
        }
    }
}

/// Where the payload of `env` is read straight to.
fn target<'a>(sink: &'a mut impl FrameSink, body: &Body, env: &Envelope) -> Option<&'a mut [u8]> {
    match body {
        Body::Direct => sink.data_target(env),
        Body::Eager(id) => sink.claimed_target(*id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's bytes, given out in chunks of the sizes in `sizes` (in turn), with nothing
    /// there at every other read when `stalls`.
    struct Chunks {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
        stalls: bool,
        socket: bool,
    }

    impl ByteSource for Chunks {
        fn read_into(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
            self.turn += 1;
            if self.at == self.data.len() || (self.stalls && self.turn % 2 == 0) {
                return Ok(None);
            }
            let k = self.sizes[self.turn % self.sizes.len()]
                .min(buf.len())
                .min(self.data.len() - self.at);
            buf[..k].copy_from_slice(&self.data[self.at..self.at + k]);
            self.at += k;
            Ok(Some(k))
        }

        fn short_read_drains(&self) -> bool {
            self.socket
        }
    }

    /// A message as it arrived: kind, source, tag, payload.
    type Delivered = (Kind, u32, i32, Vec<u8>);

    /// Records what arrives, in order, whichever way the codec delivered it.
    #[derive(Default)]
    struct Record {
        /// Claim eager messages whose tag is even.
        claim: bool,
        got: Vec<Delivered>,
        claimed: Vec<Vec<u8>>,
        /// The receive buffer of rendezvous request 1.
        data: Vec<u8>,
        data_frags: Vec<(u64, u32)>,
    }

    impl FrameSink for Record {
        fn frame(&mut self, env: &Envelope, payload: &[u8]) {
            self.got
                .push((env.kind, env.src, env.tag, payload.to_vec()));
        }
        fn claim_eager(&mut self, env: &Envelope) -> Option<ReqId> {
            (self.claim && env.tag % 2 == 0).then(|| {
                self.claimed.push(vec![0; env.len as usize]);
                (self.claimed.len() - 1) as ReqId
            })
        }
        fn claimed_target(&mut self, id: ReqId) -> Option<&mut [u8]> {
            self.claimed.get_mut(id as usize).map(|v| &mut v[..])
        }
        fn claimed_done(&mut self, id: ReqId, env: &Envelope) {
            let v = self.claimed[id as usize].clone();
            self.got.push((env.kind, env.src, env.tag, v));
        }
        fn staged(&mut self, env: &Envelope, payload: Vec<u8>) {
            self.got.push((env.kind, env.src, env.tag, payload));
        }
        fn data_target(&mut self, env: &Envelope) -> Option<&mut [u8]> {
            let (at, n) = (env.addr as usize, env.frag as usize);
            (env.rreq == 1).then(|| &mut self.data[at..at + n])
        }
        fn data_done(&mut self, env: &Envelope) {
            self.data_frags.push((env.addr, env.frag));
        }
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn frame(out: &mut Vec<u8>, env: Envelope, payload: &[u8]) {
        out.extend_from_slice(&env.encode(None));
        out.extend_from_slice(payload);
    }

    fn data(rreq: u64, addr: u64, payload: &[u8]) -> Envelope {
        let mut e = Envelope::new(Kind::Data, 1, 0, 0, 0);
        (e.rreq, e.addr, e.frag) = (rreq, addr, payload.len() as u32);
        e
    }

    /// Small, empty and large eager messages, a control frame, rendezvous fragments (one
    /// for a receive that is gone) and a synchronous send; and what must arrive.
    fn stream() -> (Vec<u8>, Vec<Delivered>, Vec<u8>) {
        let mut s = Vec::new();
        let mut want = Vec::new();
        let mut eager = |s: &mut Vec<u8>, kind, tag: i32, p: Vec<u8>| {
            frame(s, Envelope::new(kind, 1, 2, tag, p.len() as u64), &p);
            want.push((kind, 1, tag, p));
        };
        eager(&mut s, Kind::Eager, 1, bytes(5, 1));
        eager(&mut s, Kind::Eager, 3, Vec::new());
        eager(&mut s, Kind::Eager, 2, bytes(40 << 10, 2));
        let rendezvous = bytes(50 << 10, 3);
        frame(
            &mut s,
            data(1, 0, &rendezvous[..20 << 10]),
            &rendezvous[..20 << 10],
        );
        frame(&mut s, data(9, 0, &bytes(300, 4)), &bytes(300, 4));
        frame(
            &mut s,
            data(1, 20 << 10, &rendezvous[20 << 10..]),
            &rendezvous[20 << 10..],
        );
        eager(&mut s, Kind::EagerSync, 4, bytes(100, 5));
        eager(&mut s, Kind::Eager, 6, bytes(17 << 10, 6));
        let rts = Envelope::new(Kind::Rts, 1, 2, 8, 1 << 20);
        frame(&mut s, rts, &[]);
        want.push((Kind::Rts, 1, 8, Vec::new()));
        (s, want, rendezvous)
    }

    fn run(src: &mut Chunks, sink: &mut Record) -> io::Result<()> {
        let mut rx = StreamRx::default();
        for _ in 0..1_000_000 {
            let mut got = false;
            rx.pump(src, sink, |s| s, &mut got)?;
            if src.at == src.data.len() && !got {
                return Ok(());
            }
        }
        panic!(
            "the codec stopped taking bytes at {} of {}",
            src.at,
            src.data.len()
        );
    }

    #[test]
    fn every_split_of_a_stream_delivers_the_same_frames() {
        let (s, want, rendezvous) = stream();
        for sizes in [
            vec![1],
            vec![7, 64, 3],
            vec![4096],
            vec![ENV_LEN],
            vec![usize::MAX],
        ] {
            for (claim, stalls, socket) in [
                (false, false, true),
                (true, false, true),
                (true, true, false),
                (false, true, false),
            ] {
                let mut src = Chunks {
                    data: s.clone(),
                    at: 0,
                    sizes: sizes.clone(),
                    turn: 0,
                    stalls,
                    socket,
                };
                let mut sink = Record {
                    claim,
                    data: vec![0; rendezvous.len()],
                    ..Record::default()
                };
                run(&mut src, &mut sink).unwrap();
                let case = format!("chunks {sizes:?}, claim {claim}, stalls {stalls}");
                assert_eq!(sink.got.len(), want.len(), "{case}");
                for (got, want) in sink.got.iter().zip(&want) {
                    assert_eq!(got, want, "{case}");
                }
                assert_eq!(sink.data, rendezvous, "{case}");
                assert_eq!(
                    sink.data_frags,
                    [(0, 20 << 10), (20 << 10, 30 << 10)],
                    "{case}"
                );
                // A frame already whole in the staging buffer goes to `frame`, which matches
                // it there: how many are claimed first depends on the split.
                assert!(sink.claimed.len() <= if claim { 3 } else { 0 }, "{case}");
            }
        }
    }

    #[test]
    fn malformed_and_oversized_frames_are_errors() {
        let sink = || Record::default();
        let source = |data: Vec<u8>| Chunks {
            data,
            at: 0,
            sizes: vec![usize::MAX],
            turn: 0,
            stalls: false,
            socket: true,
        };
        let mut junk = vec![0xee; ENV_LEN];
        junk.extend_from_slice(&[0; 8]);
        let e = run(&mut source(junk), &mut sink()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let mut huge = Vec::new();
        frame(
            &mut huge,
            Envelope::new(Kind::Eager, 1, 0, 0, (64 << 20) + 1),
            &[],
        );
        let e = run(&mut source(huge), &mut sink()).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        // The router's check agrees on what an envelope is.
        assert!(decode_head(&[0xee; ENV_LEN]).is_err());
        assert_eq!(decode_head(&[0; ENV_LEN - 1]).unwrap(), None);
    }

    #[test]
    fn sources_are_renamed_and_a_broken_frame_gives_back_its_claim() {
        let mut s = Vec::new();
        frame(&mut s, Envelope::new(Kind::Eager, 7, 0, 1, 3), b"abc");
        frame(&mut s, Envelope::new(Kind::Eager, 7, 0, 2, 100), &[1; 10]);
        let mut src = Chunks {
            data: s,
            at: 0,
            sizes: vec![usize::MAX],
            turn: 0,
            stalls: false,
            socket: true,
        };
        let mut sink = Record {
            claim: true,
            ..Record::default()
        };
        let mut rx = StreamRx::default();
        let mut got = false;
        rx.pump(&mut src, &mut sink, |w| w + 100, &mut got).unwrap();
        assert_eq!(sink.got, [(Kind::Eager, 107, 1, b"abc".to_vec())]);
        // The second message's payload stops short: its claimed receive is the link's to fail.
        assert_eq!(rx.take_claimed(), Some(0));
        assert_eq!(rx.take_claimed(), None);
    }
}
