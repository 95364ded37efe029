//! Per-frame payload compression and the `Auto` policy.
//!
//! Compressed payloads start with the raw length (`u32`, little-endian) so the
//! receiver can bound its allocation before it decompresses anything.
//!
//! `Auto` decides by measured goodput: what counts is how many uncompressed bytes
//! reach the peer per second, not how well the data compresses. On a slow line
//! compression multiplies the goodput by the ratio; on a fast one (loopback, a LAN)
//! the compressor, or the peer's decompressor, is the bottleneck and raw frames get
//! through faster, and an application that waits for each message (a rendezvous
//! handshake) gets more done without the compressor's latency. A link's queue being
//! full tells these apart no better than a socket being full does, so the policy
//! measures. It sends in windows of at least [`WINDOW`] and [`WINDOW_FRAMES`] frames,
//! each in one mode, and rates a window by the uncompressed bytes of its frames
//! acknowledged per second of the link being busy (from the window's first
//! acknowledgement to its last, less the time nothing sent on the link awaited an
//! acknowledgement). Idle time is left out because the application decides it: a rate
//! over wall time would favour whichever mode made the application look busier, which
//! is the slower one. Busy time is what the mode decides: a message's wait for its
//! acknowledgement holds the compressor, the line and the peer's decompressor. So a
//! saturated link is rated by its throughput, and one that carries messages one at a
//! time by how soon each is through. When a probe is due, the next window is sent in
//! the other mode, and once it is measured the mode whose window delivered more wins,
//! by a margin of [`MARGIN`] for a change. Probes come after [`PROBE_MIN`], doubling up to
//! [`PROBE_MAX`] while the decision holds. Within the compressing mode, frames that do
//! not shrink are still sent raw, and a run of them pauses compression attempts for a
//! growing number of frames.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::frame::{Codec, DecodeError};

/// Which compression a link applies to the payloads it sends. Receivers decode whatever
/// the frame's flags say, so the two ends need not agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Compression {
    /// Never compress.
    Off,
    /// LZ4 block compression (`lz4_flex`, pure Rust): cheap enough for every frame.
    #[default]
    Lz4,
    /// zstd at [`crate::ConfigBuilder::zstd_level`]: better ratio, more CPU. Needs the
    /// `zstd` feature.
    Zstd,
    /// LZ4 or raw, whichever delivers more uncompressed bytes per second while the link
    /// is busy (measured, see [`AutoMode`]); frames that do not shrink go raw.
    Auto,
}

impl Compression {
    /// Whether this build can use it: zstd needs the `zstd` feature.
    pub fn available(self) -> bool {
        self != Compression::Zstd || cfg!(feature = "zstd")
    }
}

/// What [`Compression::Auto`] is doing on a link, in [`crate::Stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum AutoMode {
    /// The link does not use `Auto`.
    #[default]
    NotAuto,
    /// Raw frames: they delivered more per second than compressed ones.
    Raw,
    /// Compressing, but recent frames did not shrink: sending raw without trying for a
    /// while.
    Incompressible,
    /// Compressing with LZ4 (the starting mode).
    Compress,
}

impl AutoMode {
    /// `"-"`, `"raw"`, `"incompressible"` or `"compress"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AutoMode::NotAuto => "-",
            AutoMode::Raw => "raw",
            AutoMode::Incompressible => "incompressible",
            AutoMode::Compress => "compress",
        }
    }
}

/// Payloads shorter than this are never worth a compressor call.
const MIN_COMPRESS: usize = 128;
/// Consecutive frames that did not shrink before `Auto` pauses.
const AUTO_MISSES: u32 = 3;
const AUTO_MIN_PAUSE: u32 = 16;
const AUTO_MAX_PAUSE: u32 = 1024;

/// Shortest measurement window of `Auto` (sending time).
pub(crate) const WINDOW: Duration = Duration::from_millis(200);
/// Fewest frames in a measurement window, counting only those long enough to be
/// compressed (the mode makes no difference to the others).
pub(crate) const WINDOW_FRAMES: u64 = 8;
/// Fewest uncompressed bytes a window's rate is taken over: a few short messages say
/// more about timer noise than about the modes.
pub(crate) const MIN_RATED: u64 = 64 << 10;
/// How much more the other mode must deliver to be chosen.
pub(crate) const MARGIN: f64 = 1.1;
/// First wait between probes of the other mode, and the wait after a change.
pub(crate) const PROBE_MIN: Duration = Duration::from_secs(1);
/// Longest wait between probes, reached by doubling while the decision holds.
pub(crate) const PROBE_MAX: Duration = Duration::from_secs(16);
/// Windows kept while their acknowledgements come in (a dead link never acknowledges).
const MAX_CLOSED: usize = 16;

/// One encoded frame payload.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) codec: Codec,
    /// The payload as it goes on the wire: the raw parts, or one compressed buffer.
    pub(crate) parts: Vec<Bytes>,
    /// `Auto`'s measurement window the frame belongs to (0 otherwise).
    pub(crate) window: u64,
}

/// Compressor state of one link.
#[derive(Debug)]
pub(crate) struct Compressor {
    mode: Compression,
    zstd_level: i32,
    misses: u32,
    pause: u32,
    skip_left: u32,
    /// Frames `Auto` sent raw without trying: in raw mode, or paused.
    pub(crate) skipped: u64,
    /// `Auto`'s choice between compressing and raw frames.
    policy: Option<AutoPolicy>,
    /// A compressed frame's raw payload, gathered from its parts (reused).
    scratch: Vec<u8>,
}

impl Compressor {
    pub(crate) fn new(now: Instant, mode: Compression, zstd_level: i32) -> Compressor {
        Compressor {
            mode,
            zstd_level,
            misses: 0,
            pause: AUTO_MIN_PAUSE,
            skip_left: 0,
            skipped: 0,
            policy: (mode == Compression::Auto).then(|| AutoPolicy::new(now)),
            scratch: Vec::new(),
        }
    }

    /// Whether `Auto` is currently sending raw frames without trying.
    #[cfg(test)]
    fn paused(&self) -> bool {
        self.skip_left > 0
    }

    /// Encodes one frame's raw payload, given as `parts` of `raw_len` bytes in all.
    /// `idle` is how long, in all, the link has had nothing awaiting acknowledgement.
    pub(crate) fn encode(
        &mut self,
        now: Instant,
        idle: Duration,
        parts: Vec<Bytes>,
        raw_len: usize,
    ) -> Encoded {
        let (window, choice) = match &mut self.policy {
            Some(p) => p.frame(now, idle, raw_len >= MIN_COMPRESS),
            None => (0, Choice::Compress),
        };
        let raw = |parts| Encoded {
            codec: Codec::Raw,
            parts,
            window,
        };
        if raw_len < MIN_COMPRESS {
            return raw(parts);
        }
        let codec = match self.mode {
            Compression::Off => return raw(parts),
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd => Codec::Zstd,
            Compression::Auto if choice == Choice::Raw => {
                self.skipped += 1;
                return raw(parts);
            }
            Compression::Auto if self.skip_left > 0 => {
                self.skip_left -= 1;
                self.skipped += 1;
                return raw(parts);
            }
            Compression::Auto => Codec::Lz4,
        };
        // The compressors want the payload in one piece.
        self.scratch.clear();
        for p in &parts {
            self.scratch.extend_from_slice(p);
        }
        let packed = compress_with(codec, &self.scratch, self.zstd_level);
        let shrank = packed.as_ref().is_some_and(|p| p.len() * 8 <= raw_len * 7);
        if self.mode == Compression::Auto {
            self.account(shrank);
        }
        // A saving of a few bytes (say, zeros in record headers among random data) is
        // not worth the receiver's decompression.
        match packed {
            Some(p) if p.len() + raw_len / 32 < raw_len => Encoded {
                codec,
                parts: vec![Bytes::from(p)],
                window,
            },
            _ => raw(parts),
        }
    }

    /// A frame of `Auto`'s measurement window `window` with `raw_len` uncompressed
    /// payload bytes was acknowledged at `now`, when the link had been idle for `idle`
    /// in all.
    pub(crate) fn acked(&mut self, now: Instant, idle: Duration, window: u64, raw_len: usize) {
        if let Some(p) = &mut self.policy {
            if p.acked(now, idle, window, raw_len as u64) {
                // A new decision starts from a clean slate of misses.
                self.misses = 0;
                self.skip_left = 0;
                self.pause = AUTO_MIN_PAUSE;
            }
        }
    }

    /// `Auto`'s mode, measured goodput compressed and raw (bytes/s, 0 before a
    /// measurement), probes, changes of mode, and the percentage of the last window
    /// the link was busy.
    pub(crate) fn auto_state(&self) -> (AutoMode, u64, u64, u64, u64, u64) {
        let Some(p) = &self.policy else {
            return (AutoMode::NotAuto, 0, 0, 0, 0, 0);
        };
        let mode = match p.mode {
            Choice::Raw => AutoMode::Raw,
            Choice::Compress if self.skip_left > 0 => AutoMode::Incompressible,
            Choice::Compress => AutoMode::Compress,
        };
        let rate = |c: Choice| p.rate[c as usize].map_or(0, |r| r as u64);
        (
            mode,
            rate(Choice::Compress),
            rate(Choice::Raw),
            p.probes,
            p.switches,
            (p.busy_share * 100.0).round().clamp(0.0, 100.0) as u64,
        )
    }

    fn account(&mut self, shrank: bool) {
        if shrank {
            self.misses = 0;
            self.pause = AUTO_MIN_PAUSE;
            return;
        }
        self.misses += 1;
        if self.misses >= AUTO_MISSES {
            self.skip_left = self.pause;
            self.pause = (self.pause * 2).min(AUTO_MAX_PAUSE);
            // The probe after a pause decides alone: one more miss pauses again.
            self.misses = AUTO_MISSES - 1;
        }
    }
}

/// The two ways `Auto` can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    Compress = 0,
    Raw = 1,
}

impl Choice {
    fn other(self) -> Choice {
        match self {
            Choice::Compress => Choice::Raw,
            Choice::Raw => Choice::Compress,
        }
    }
}

/// Frames sent in one mode and what their acknowledgements showed.
#[derive(Debug)]
struct Window {
    id: u64,
    mode: Choice,
    start: Instant,
    /// The link's idle total when the window opened.
    idle_at_start: Duration,
    frames: u64,
    /// Frames long enough to be compressed.
    eligible: u64,
    acked_frames: u64,
    /// Time and idle total of the first and the last acknowledgement.
    first_ack: Option<(Instant, Duration)>,
    last_ack: Option<(Instant, Duration)>,
    /// Uncompressed bytes acknowledged after the first acknowledgement.
    bytes_after_first: u64,
}

impl Window {
    fn new(id: u64, mode: Choice, now: Instant, idle: Duration) -> Window {
        Window {
            id,
            mode,
            start: now,
            idle_at_start: idle,
            frames: 0,
            eligible: 0,
            acked_frames: 0,
            first_ack: None,
            last_ack: None,
            bytes_after_first: 0,
        }
    }

    fn ack(&mut self, now: Instant, idle: Duration, bytes: u64) {
        self.acked_frames += 1;
        match self.first_ack {
            // Bytes acknowledged together with the first ones were delivered before
            // the interval the rate is taken over.
            Some((first, _)) if now > first => self.bytes_after_first += bytes,
            Some(_) => {}
            None => self.first_ack = Some((now, idle)),
        }
        self.last_ack = Some((now, idle));
    }

    /// Uncompressed bytes delivered per second of the link being busy, if the window
    /// can be rated.
    fn rate(&self) -> Option<f64> {
        let ((first, idle_first), (last, idle_last)) = (self.first_ack?, self.last_ack?);
        let span = last.saturating_duration_since(first);
        let busy = span.saturating_sub(idle_last.saturating_sub(idle_first));
        let secs = busy.as_secs_f64();
        (secs > 0.0 && self.bytes_after_first >= MIN_RATED)
            .then(|| self.bytes_after_first as f64 / secs)
    }
}

/// `Auto`'s choice between compressed and raw frames by measured goodput (module
/// documentation). Pure state: the caller supplies the clock.
#[derive(Debug)]
pub(crate) struct AutoPolicy {
    mode: Choice,
    /// The window frames are being sent in.
    current: Window,
    /// Closed windows whose acknowledgements are still coming, oldest first.
    closed: VecDeque<Window>,
    /// Last goodput measured per mode (bytes/s).
    rate: [Option<f64>; 2],
    /// The window before the probe: its id and rate, once measured.
    before_probe: Option<(u64, Option<f64>)>,
    /// The probe window in flight.
    probe: Option<u64>,
    next_probe: Instant,
    interval: Duration,
    probes: u64,
    switches: u64,
    /// Share of the last closed window the link was busy (for the statistics).
    busy_share: f64,
    /// Busy share when the modes were last compared: a link that was mostly
    /// idle then (one message at a time, or an application that offered
    /// little) and is saturated now carries different traffic, so the old
    /// verdict, and the long wait it earned, no longer hold.
    compared_busy: Option<f64>,
}

/// Busy shares that mark a change of traffic (see `AutoPolicy::compared_busy`).
const BUSY_LOW: f64 = 0.5;
const BUSY_HIGH: f64 = 0.8;

impl AutoPolicy {
    pub(crate) fn new(now: Instant) -> AutoPolicy {
        AutoPolicy {
            mode: Choice::Compress,
            current: Window::new(1, Choice::Compress, now, Duration::ZERO),
            closed: VecDeque::new(),
            rate: [None, None],
            before_probe: None,
            probe: None,
            // The first probe follows the first window.
            next_probe: now,
            interval: PROBE_MIN,
            probes: 0,
            switches: 0,
            busy_share: 0.0,
            compared_busy: None,
        }
    }

    /// A data frame is about to be sent (`eligible`: long enough to be compressed):
    /// its window and the mode to send it in.
    pub(crate) fn frame(&mut self, now: Instant, idle: Duration, eligible: bool) -> (u64, Choice) {
        if self.current.frames == 0 {
            // A window starts with its first frame.
            self.current.start = now;
            self.current.idle_at_start = idle;
        }
        let (id, mode, start) = (self.current.id, self.current.mode, self.current.start);
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= WINDOW && self.current.eligible >= WINDOW_FRAMES {
            let waited = idle.saturating_sub(self.current.idle_at_start);
            self.busy_share = 1.0 - waited.as_secs_f64() / elapsed.as_secs_f64();
            if self.busy_share > BUSY_HIGH && self.compared_busy.is_some_and(|b| b < BUSY_LOW) {
                self.next_probe = self.next_probe.min(now);
                self.interval = PROBE_MIN;
            }
            let probe = self.probe.is_none() && mode == self.mode && now >= self.next_probe;
            let next_mode = if probe {
                self.probes += 1;
                self.probe = Some(id + 1);
                self.before_probe = Some((id, None));
                self.mode.other()
            } else {
                self.mode
            };
            let next = Window::new(id + 1, next_mode, now, idle);
            let done = std::mem::replace(&mut self.current, next);
            self.closed.push_back(done);
            if self.closed.len() > MAX_CLOSED {
                // Never acknowledged (a dead link's frames went elsewhere): rate it
                // with what came.
                if let Some(w) = self.closed.pop_front() {
                    self.finish(now, &w);
                }
            }
        }
        self.current.frames += 1;
        self.current.eligible += u64::from(eligible);
        (self.current.id, self.current.mode)
    }

    /// A frame of window `window` with `bytes` uncompressed payload was acknowledged.
    /// Acknowledgements come in sending order. Whether the mode changed.
    pub(crate) fn acked(&mut self, now: Instant, idle: Duration, window: u64, bytes: u64) -> bool {
        let mut changed = false;
        // Windows before this one are complete: acknowledgements are cumulative.
        while self.closed.front().is_some_and(|w| w.id < window) {
            if let Some(w) = self.closed.pop_front() {
                changed |= self.finish(now, &w);
            }
        }
        if let Some(w) = self.closed.front_mut().filter(|w| w.id == window) {
            w.ack(now, idle, bytes);
            if w.acked_frames >= w.frames {
                if let Some(w) = self.closed.pop_front() {
                    changed |= self.finish(now, &w);
                }
            }
        } else if self.current.id == window {
            self.current.ack(now, idle, bytes);
        }
        changed
    }

    /// A closed window is fully acknowledged: note its rate, and decide after a probe.
    fn finish(&mut self, now: Instant, w: &Window) -> bool {
        let rate = w.rate();
        if let Some(r) = rate {
            self.rate[w.mode as usize] = Some(r);
        }
        match self.before_probe {
            Some((id, _)) if id == w.id => {
                self.before_probe = Some((id, rate));
                return false;
            }
            _ => {}
        }
        if self.probe != Some(w.id) {
            return false;
        }
        self.probe = None;
        let before = self.before_probe.take().and_then(|(_, r)| r);
        if before.is_some() && rate.is_some() {
            self.compared_busy = Some(self.busy_share);
        }
        let (changed, rated) = match (before, rate) {
            (Some(stay), Some(other)) if other > stay * MARGIN => {
                self.mode = w.mode;
                self.switches += 1;
                self.interval = PROBE_MIN;
                (true, true)
            }
            (Some(_), Some(_)) => {
                self.interval = (self.interval * 2).min(PROBE_MAX);
                (false, true)
            }
            _ => (false, false),
        };
        // Not comparable (too little traffic in one of the two windows): probe again
        // with the next window rather than after the wait, so that a stream that
        // starts after a quiet spell (a benchmark after its warm-up, say) is measured
        // in both modes within its first windows.
        self.next_probe = if rated { now + self.interval } else { now };
        changed
    }

    /// The current decision.
    #[cfg(test)]
    pub(crate) fn mode(&self) -> Choice {
        self.mode
    }
}

fn compress_with(codec: Codec, raw: &[u8], zstd_level: i32) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len() / 2 + 16);
    out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
    match codec {
        Codec::Raw => return None,
        Codec::Lz4 => out.extend_from_slice(&lz4_flex::block::compress(raw)),
        #[cfg(feature = "zstd")]
        Codec::Zstd => out.extend_from_slice(&zstd::bulk::compress(raw, zstd_level).ok()?),
        #[cfg(not(feature = "zstd"))]
        Codec::Zstd => {
            let _ = zstd_level;
            return None;
        }
    }
    Some(out)
}

/// Decodes a payload as it came off the wire, refusing to expand past `max` bytes.
///
/// # Errors
/// [`DecodeError::Truncated`], [`DecodeError::PayloadTooLong`],
/// [`DecodeError::Decompress`] or [`DecodeError::UnsupportedCodec`].
pub fn decompress(codec: Codec, wire: &[u8], max: usize) -> Result<Bytes, DecodeError> {
    let (len, raw) = match codec {
        Codec::Raw => return Ok(Bytes::copy_from_slice(wire)),
        Codec::Lz4 => {
            let (len, body) = split_len(wire, max)?;
            let raw = lz4_flex::block::decompress(body, len)
                .map_err(|e| DecodeError::Decompress(e.to_string()))?;
            (len, raw)
        }
        #[cfg(feature = "zstd")]
        Codec::Zstd => {
            let (len, body) = split_len(wire, max)?;
            let raw = zstd::bulk::decompress(body, len)
                .map_err(|e| DecodeError::Decompress(e.to_string()))?;
            (len, raw)
        }
        #[cfg(not(feature = "zstd"))]
        Codec::Zstd => return Err(DecodeError::UnsupportedCodec(codec)),
    };
    if raw.len() != len {
        return Err(DecodeError::Decompress(format!(
            "expanded to {} bytes, header said {len}",
            raw.len()
        )));
    }
    Ok(Bytes::from(raw))
}

/// The raw-length prefix of a compressed payload, checked against `max`, and the rest.
fn split_len(wire: &[u8], max: usize) -> Result<(usize, &[u8]), DecodeError> {
    let (len, body) = wire
        .split_first_chunk::<4>()
        .ok_or(DecodeError::Truncated)?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > max {
        return Err(DecodeError::PayloadTooLong {
            len: len as u64,
            max: max as u64,
        });
    }
    Ok((len, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// One frame through `encode` in two parts, at a fixed time (so `Auto`'s windows
    /// never close); the codec and the wire bytes joined.
    fn compress(c: &mut Compressor, raw: Vec<u8>) -> (Codec, Vec<u8>) {
        let mut raw = Bytes::from(raw);
        let len = raw.len();
        let tail = raw.split_off(len / 3);
        let e = c.encode(start(), Duration::ZERO, vec![raw, tail], len);
        (e.codec, crate::record::join(&e.parts).to_vec())
    }

    fn start() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    #[test]
    fn lz4_and_zstd_round_trip_and_fall_back_to_raw() {
        let modes: &[Compression] = if cfg!(feature = "zstd") {
            &[Compression::Lz4, Compression::Zstd]
        } else {
            &[Compression::Lz4]
        };
        for &mode in modes {
            let mut c = Compressor::new(start(), mode, 3);
            let text = b"the quick brown fox ".repeat(100);
            let (codec, wire) = compress(&mut c, text.clone());
            assert_ne!(codec, Codec::Raw);
            assert!(wire.len() < text.len() / 4);
            assert_eq!(decompress(codec, &wire, 1 << 20).unwrap(), text);
            let random = noise(4000, 9);
            assert_eq!(compress(&mut c, random.clone()), (Codec::Raw, random));
        }
    }

    #[test]
    fn raw_frames_keep_their_parts() {
        let mut c = Compressor::new(start(), Compression::Off, 3);
        let parts = vec![Bytes::from(vec![1u8; 300]), Bytes::from(vec![2u8; 300])];
        let e = c.encode(start(), Duration::ZERO, parts.clone(), 600);
        assert_eq!((e.codec, e.parts), (Codec::Raw, parts));
    }

    #[test]
    fn auto_pauses_on_incompressible_data_and_probes_again() {
        let mut c = Compressor::new(start(), Compression::Auto, 3);
        let mut tried = 0;
        for i in 0..AUTO_MISSES {
            let (codec, _) = compress(&mut c, noise(1000, u64::from(i) + 1));
            assert_eq!(codec, Codec::Raw);
            tried += 1;
        }
        assert_eq!(tried, AUTO_MISSES);
        assert!(c.paused());
        assert_eq!(c.auto_state().0, AutoMode::Incompressible);
        // While paused even compressible data goes raw...
        let text = b"abcd".repeat(500);
        for _ in 0..AUTO_MIN_PAUSE {
            assert_eq!(compress(&mut c, text.clone()).0, Codec::Raw);
        }
        // ...and the probe after the pause finds it compressible and resumes.
        assert!(!c.paused());
        assert_eq!(compress(&mut c, text.clone()).0, Codec::Lz4);
        assert_eq!(c.pause, AUTO_MIN_PAUSE);
        assert_eq!(c.auto_state().0, AutoMode::Compress);
    }

    #[test]
    fn auto_backs_off_exponentially_while_data_stays_incompressible() {
        let mut c = Compressor::new(start(), Compression::Auto, 3);
        let mut pauses = Vec::new();
        let mut was_paused = false;
        for i in 0..5000u64 {
            compress(&mut c, noise(1000, i + 1));
            if c.paused() && !was_paused {
                pauses.push(c.skip_left);
            }
            was_paused = c.paused();
        }
        assert_eq!(&pauses[..4], &[16, 32, 64, 128]);
        assert!(pauses.iter().all(|&p| p <= AUTO_MAX_PAUSE));
    }

    /// A link as `Auto` sees it: frames of `FRAME` raw bytes take the longer of their
    /// line time and their CPU time, and are acknowledged a round trip after that.
    /// The application offers frames back to back, or at most at `app` bytes/s.
    #[derive(Clone, Copy)]
    struct Line {
        /// Wire bytes per second.
        wire: f64,
        /// Raw bytes per second the compressor (or the peer's decompressor) manages.
        cpu: f64,
        /// Compressed size per raw byte.
        ratio: f64,
        rtt: Duration,
        app: Option<f64>,
    }

    const FRAME: u64 = 64 << 10;

    impl Line {
        fn frame_time(&self, mode: Choice) -> f64 {
            match mode {
                Choice::Raw => FRAME as f64 / self.wire,
                Choice::Compress => {
                    (FRAME as f64 * self.ratio / self.wire).max(FRAME as f64 / self.cpu)
                }
            }
        }
    }

    /// Drives `p` over `line` from `*now` for `secs`; the modes frames were sent in,
    /// with their times.
    fn run(p: &mut AutoPolicy, now: &mut Instant, line: Line, secs: f64) -> Vec<(Instant, Choice)> {
        let end = *now + Duration::from_secs_f64(secs);
        let mut in_flight = VecDeque::new();
        let (mut idle, mut idle_since) = (Duration::ZERO, None);
        let mut sent = Vec::new();
        // When the application has the next frame ready.
        let mut offered = *now;
        while *now < end {
            // The line is free at `now`; the next frame waits for the application.
            let send = (*now).max(offered);
            while let Some(&(at, w)) = in_flight.front() {
                if at > send {
                    break;
                }
                in_flight.pop_front();
                p.acked(at, idle, w, FRAME);
                if in_flight.is_empty() {
                    idle_since = Some(at);
                }
            }
            *now = send;
            if let Some(since) = idle_since.take() {
                idle += *now - since;
            }
            let (w, mode) = p.frame(*now, idle, true);
            sent.push((*now, mode));
            *now += Duration::from_secs_f64(line.frame_time(mode));
            in_flight.push_back((*now + line.rtt, w));
            if let Some(rate) = line.app {
                offered = send + Duration::from_secs_f64(FRAME as f64 / rate);
            }
        }
        sent
    }

    fn share_raw(sent: &[(Instant, Choice)], after: Instant) -> f64 {
        let late: Vec<_> = sent.iter().filter(|s| s.0 >= after).collect();
        late.iter().filter(|s| s.1 == Choice::Raw).count() as f64 / late.len() as f64
    }

    const SLOW: Line = Line {
        wire: 12.5e6,
        cpu: 500e6,
        ratio: 0.1,
        rtt: Duration::from_millis(40),
        app: None,
    };

    const LOOPBACK: Line = Line {
        wire: 3e9,
        cpu: 800e6,
        ratio: 0.1,
        rtt: Duration::from_micros(200),
        app: None,
    };

    #[test]
    fn a_slow_line_with_compressible_data_keeps_compressing() {
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        let sent = run(&mut p, &mut now, SLOW, 30.0);
        assert_eq!(p.mode(), Choice::Compress);
        // Raw probes only: about 1 + 2 + 4 + 8 + 16 s apart, 200 ms each.
        assert!((4..=6).contains(&p.probes), "{} probes", p.probes);
        assert_eq!(p.switches, 0);
        assert!(share_raw(&sent, sent[0].0) < 0.1);
        let [c, r] = p.rate.map(Option::unwrap);
        assert!((c / 125e6 - 1.0).abs() < 0.05, "compressed {c}");
        assert!((r / 12.5e6 - 1.0).abs() < 0.05, "raw {r}");
    }

    /// A fast link whose modes tie while the application offers little (round
    /// trips dominate) earns the longest wait between probes; when a stream then
    /// saturates it, the change of traffic brings the probe forward.
    #[test]
    fn saturation_after_a_quiet_spell_is_judged_at_once() {
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        let line = Line {
            wire: 3e9,
            cpu: 800e6,
            ratio: 0.1,
            rtt: Duration::from_millis(2),
            app: Some(10e6),
        };
        run(&mut p, &mut now, line, 40.0);
        assert!(p.busy_share < BUSY_LOW, "busy {}", p.busy_share);
        assert_eq!(p.mode(), Choice::Compress, "modes tie while the line idles");
        let t0 = now;
        let sent = run(&mut p, &mut now, Line { app: None, ..line }, 3.0);
        assert_eq!(p.mode(), Choice::Raw);
        // Decided within the stream's first second; raw from then on but for
        // one probe window of compression.
        let from = sent.partition_point(|s| s.0 - t0 < Duration::from_secs(1));
        let raw = share_raw(&sent, sent[from].0);
        assert!(raw > 0.8, "raw share {raw} after the first second");
    }

    /// A link that first carries only small messages (too little to rate a window)
    /// decides as soon as a stream starts, instead of waiting out the probe interval
    /// after each unrated probe.
    #[test]
    fn a_stream_after_small_messages_is_judged_at_once() {
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        let mut idle = Duration::ZERO;
        // 3 s of 100-byte messages, one every 10 ms, each acknowledged at once.
        for _ in 0..300 {
            let (w, _) = p.frame(now, idle, true);
            p.acked(now + Duration::from_micros(200), idle, w, 100);
            now += Duration::from_millis(10);
            idle += Duration::from_micros(9800);
        }
        let t0 = now;
        let sent = run(&mut p, &mut now, LOOPBACK, 3.0);
        assert_eq!(p.mode(), Choice::Raw);
        // Both modes measured and the switch made within the stream's first second
        // (a probe window each way after the one under way); an unrated probe
        // followed by the full wait would still be compressing.
        let late = sent
            .iter()
            .filter(|s| (1000..1700).contains(&(s.0 - t0).as_millis()));
        assert!(
            late.clone().all(|s| s.1 == Choice::Raw),
            "still compressing a second into the stream"
        );
        assert!(late.count() > 100);
    }

    #[test]
    fn a_fast_line_where_the_cpu_limits_compression_goes_raw() {
        let mut now = start();
        let t0 = now;
        let mut p = AutoPolicy::new(now);
        let sent = run(&mut p, &mut now, LOOPBACK, 20.0);
        assert_eq!(p.mode(), Choice::Raw);
        assert_eq!(p.switches, 1, "no flapping");
        // Decided within the first window, its probe and their acknowledgements.
        let switched = sent.iter().position(|s| s.1 == Choice::Raw).unwrap();
        assert!(sent[switched].0 - t0 < Duration::from_millis(500));
        // Compression probes cost little afterwards.
        let late = share_raw(&sent, t0 + Duration::from_secs(1));
        assert!(late > 0.93, "raw share {late}");
        let [c, r] = p.rate.map(Option::unwrap);
        assert!(r > 3.0 * c, "raw {r} compressed {c}");
    }

    #[test]
    fn the_decision_follows_the_line_when_it_changes() {
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        run(&mut p, &mut now, LOOPBACK, 10.0);
        assert_eq!(p.mode(), Choice::Raw);
        // The line slows down: the next compression probe (within the longest wait)
        // wins and compression comes back.
        let sent = run(&mut p, &mut now, SLOW, PROBE_MAX.as_secs_f64() + 2.0);
        assert_eq!(p.mode(), Choice::Compress);
        assert_eq!(sent.last().unwrap().1, Choice::Compress);
        assert_eq!(p.switches, 2);
    }

    #[test]
    fn small_differences_do_not_change_the_mode() {
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        // Raw 5% faster than compressed: within the margin.
        let line = Line {
            wire: 1e9,
            cpu: 0.95e9,
            ratio: 0.5,
            ..LOOPBACK
        };
        run(&mut p, &mut now, line, 20.0);
        assert_eq!(p.mode(), Choice::Compress);
        assert!(p.probes >= 4);
        assert_eq!(p.switches, 0);
    }

    #[test]
    fn messages_one_at_a_time_on_a_fast_line_go_raw_sooner() {
        // The application offers a frame every 650 us, each through in well under
        // that: the link is idle most of the time, and rated by how soon a frame is
        // through (82 us of compression or 22 us on the line, then the round trip).
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        let sparse = Line {
            app: Some(100e6),
            ..LOOPBACK
        };
        run(&mut p, &mut now, sparse, 10.0);
        assert_eq!((p.mode(), p.switches), (Choice::Raw, 1));
        assert!(p.busy_share < 0.5, "busy {}", p.busy_share);
        let [c, r] = p.rate.map(Option::unwrap);
        assert!(
            (r / c - 282.0 / 222.0).abs() < 0.05,
            "raw {r} compressed {c}"
        );
    }

    #[test]
    fn an_application_slower_than_either_mode_keeps_the_mode() {
        // 5 MB/s offered on the slow line, frames always in flight: both modes carry
        // exactly what is offered.
        let mut now = start();
        let mut p = AutoPolicy::new(now);
        let line = Line {
            app: Some(5e6),
            ..SLOW
        };
        run(&mut p, &mut now, line, 20.0);
        assert_eq!((p.mode(), p.switches), (Choice::Compress, 0));
        assert!(p.probes >= 3);
        let [c, r] = p.rate.map(Option::unwrap);
        assert!(
            (c / 5e6 - 1.0).abs() < 0.05 && (r / 5e6 - 1.0).abs() < 0.05,
            "{c} {r}"
        );
    }

    #[test]
    fn incompressible_data_goes_raw_in_either_mode() {
        // The compressor's own check: whatever the policy says, noise is sent raw, and
        // after a few misses not even tried.
        let mut now = start();
        let mut c = Compressor::new(now, Compression::Auto, 3);
        let mut compressed = 0;
        for i in 0..400u64 {
            let raw = Bytes::from(noise(8000, i + 1));
            let e = c.encode(now, Duration::ZERO, vec![raw], 8000);
            compressed += u32::from(e.codec != Codec::Raw);
            now += Duration::from_millis(5);
            c.acked(now, Duration::ZERO, e.window, 8000);
        }
        assert_eq!(compressed, 0);
        assert!(c.skipped > 300, "skipped {}", c.skipped);
        assert!(matches!(
            c.auto_state().0,
            AutoMode::Incompressible | AutoMode::Raw
        ));
    }

    #[test]
    fn raw_mode_does_not_touch_the_compressor() {
        let mut now = start();
        let mut c = Compressor::new(now, Compression::Auto, 3);
        let p = c.policy.as_mut().unwrap();
        p.mode = Choice::Raw;
        p.current.mode = Choice::Raw;
        let text = Bytes::from(b"abcd".repeat(500));
        for _ in 0..10 {
            let e = c.encode(now, Duration::ZERO, vec![text.clone()], text.len());
            assert_eq!(e.codec, Codec::Raw);
            now += Duration::from_millis(1);
        }
        assert_eq!((c.skipped, c.misses), (10, 0));
        assert_eq!(c.auto_state().0, AutoMode::Raw);
    }

    #[test]
    fn hostile_compressed_payloads_are_errors() {
        assert_eq!(
            decompress(Codec::Lz4, &[1, 2], 100),
            Err(DecodeError::Truncated)
        );
        let mut big = (1000u32).to_le_bytes().to_vec();
        big.extend_from_slice(&[0; 8]);
        assert!(matches!(
            decompress(Codec::Lz4, &big, 100),
            Err(DecodeError::PayloadTooLong { .. })
        ));
        let mut c = Compressor::new(start(), Compression::Lz4, 3);
        let (codec, mut wire) = compress(&mut c, b"xyzw".repeat(100));
        wire[0] = wire[0].wrapping_add(1);
        assert!(matches!(
            decompress(codec, &wire, 1 << 20),
            Err(DecodeError::Decompress(_))
        ));
        for junk in 0..64u64 {
            let j = noise(40, junk + 100);
            let _ = decompress(Codec::Lz4, &j, 1 << 16);
            let _ = decompress(Codec::Zstd, &j, 1 << 16);
        }
    }
}
