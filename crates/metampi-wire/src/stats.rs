//! Counters and gauges of a link, readable at any time.

use std::ops::AddAssign;
use std::time::Duration;

use crate::compress::AutoMode;

/// Statistics of one link, or of a whole bundle (the sum over its links).
///
/// Counters only grow; gauges (`queued_*`, `unacked_*`, `srtt`, `send_credit`) are
/// the state at the moment the snapshot was taken.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Bytes handed out by `poll_transmit`.
    pub bytes_out: u64,
    /// Bytes given to `handle_bytes`.
    pub bytes_in: u64,
    /// Frames sent, of any kind, retransmissions included.
    pub frames_out: u64,
    /// Valid frames received, duplicates included.
    pub frames_in: u64,
    /// Records (message fragments) sent for the first time.
    pub records_out: u64,
    /// Records accepted in order.
    pub records_in: u64,
    /// Raw payload bytes of first transmissions, before compression.
    pub payload_raw_out: u64,
    /// The same payloads as they went on the wire.
    pub payload_wire_out: u64,
    /// Raw payload bytes of accepted frames, after decompression.
    pub payload_raw_in: u64,
    /// The same payloads as they came off the wire.
    pub payload_wire_in: u64,
    /// `Data` frames sent compressed.
    pub compressed_frames_out: u64,
    /// Frames `Compression::Auto` sent raw without trying to compress them: in raw mode,
    /// or pausing after frames that did not shrink.
    pub compression_skipped: u64,
    /// Gauge: what `Compression::Auto` is doing (over a bundle, the highest of its
    /// links' in the order raw, incompressible, compress).
    pub auto_mode: AutoMode,
    /// Gauge: uncompressed bytes per second the link last delivered while busy
    /// and compressing, as `Auto` measured it (0: not measured; summed over a bundle).
    pub auto_goodput_compressed: u64,
    /// Gauge: the same for raw frames.
    pub auto_goodput_raw: u64,
    /// Measurement windows `Auto` sent in the other mode to compare.
    pub auto_probes: u64,
    /// Times `Auto` changed between compressing and raw frames.
    pub auto_switches: u64,
    /// Gauge: percentage of `Auto`'s last measurement window in which the application
    /// kept the link busy; below 50 the window was not rated (over a bundle, the
    /// highest of its links').
    pub auto_busy_percent: u64,
    /// `Data` frames sent again.
    pub retransmits: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Valid `Data` frames dropped because they were already received.
    pub duplicates_in: u64,
    /// Valid `Data` frames dropped because an earlier one was missing.
    pub out_of_order_in: u64,
    /// Frames that failed a checksum or did not parse.
    pub corrupt_in: u64,
    /// `Data` frames accepted whose sender left the payload out of the checksum
    /// (its link runs without payload checksums).
    pub unchecked_frames_in: u64,
    /// Chunks of the stream that another thread read and handed over
    /// ([`crate::Bundle::handle_owned`]).
    pub chunks_handed_in: u64,
    /// Bytes skipped while looking for the next frame.
    pub skipped_bytes_in: u64,
    /// Times a partly received frame was given up because no byte of it came for the
    /// partial-frame timeout (bytes lost inside the stream); each sent a `Nack`.
    pub stalled_frames_in: u64,
    /// Negative acknowledgements sent.
    pub nacks_out: u64,
    /// Negative acknowledgements received.
    pub nacks_in: u64,
    /// Records of this link, never acknowledged, handed to other links when it died.
    pub failed_over: u64,
    /// Times the transport reconnected.
    pub reconnects: u64,
    /// Times the link was connected but silent for the `silent_reconnect` limit, and
    /// the driver was asked to connect it again.
    pub silent_reconnects: u64,
    /// Gauge: messages waiting to be framed (bundle-wide queue).
    pub queued_messages: u64,
    /// Gauge: bytes waiting to be framed (bundle-wide queue).
    pub queued_bytes: u64,
    /// Gauge: frames sent and not yet acknowledged.
    pub unacked_frames: u64,
    /// Gauge: wire payload bytes of those frames.
    pub unacked_bytes: u64,
    /// Gauge: credit the peer has granted and we have not used.
    pub send_credit: u64,
    /// Gauge: smoothed round-trip time, once measured (the largest over a bundle).
    pub srtt: Option<Duration>,
}

impl Stats {
    /// Wire bytes per raw byte of the payloads sent (1.0 before anything was sent;
    /// below 1.0 when compression pays).
    pub fn compression_ratio_out(&self) -> f64 {
        ratio(self.payload_wire_out, self.payload_raw_out)
    }

    /// Wire bytes per raw byte of the payloads received.
    pub fn compression_ratio_in(&self) -> f64 {
        ratio(self.payload_wire_in, self.payload_raw_in)
    }
}

fn ratio(wire: u64, raw: u64) -> f64 {
    if raw == 0 {
        1.0
    } else {
        wire as f64 / raw as f64
    }
}

impl AddAssign<&Stats> for Stats {
    /// Sums saturate: a gauge such as `send_credit` holds what the peer announced, and
    /// a peer may grant `u64::MAX` on every link of a bundle.
    fn add_assign(&mut self, o: &Stats) {
        self.bytes_out = self.bytes_out.saturating_add(o.bytes_out);
        self.bytes_in = self.bytes_in.saturating_add(o.bytes_in);
        self.frames_out = self.frames_out.saturating_add(o.frames_out);
        self.frames_in = self.frames_in.saturating_add(o.frames_in);
        self.records_out = self.records_out.saturating_add(o.records_out);
        self.records_in = self.records_in.saturating_add(o.records_in);
        self.payload_raw_out = self.payload_raw_out.saturating_add(o.payload_raw_out);
        self.payload_wire_out = self.payload_wire_out.saturating_add(o.payload_wire_out);
        self.payload_raw_in = self.payload_raw_in.saturating_add(o.payload_raw_in);
        self.payload_wire_in = self.payload_wire_in.saturating_add(o.payload_wire_in);
        self.compressed_frames_out = self
            .compressed_frames_out
            .saturating_add(o.compressed_frames_out);
        self.compression_skipped = self
            .compression_skipped
            .saturating_add(o.compression_skipped);
        self.unchecked_frames_in = self
            .unchecked_frames_in
            .saturating_add(o.unchecked_frames_in);
        self.chunks_handed_in = self.chunks_handed_in.saturating_add(o.chunks_handed_in);
        self.auto_mode = self.auto_mode.max(o.auto_mode);
        self.auto_goodput_compressed = self
            .auto_goodput_compressed
            .saturating_add(o.auto_goodput_compressed);
        self.auto_goodput_raw = self.auto_goodput_raw.saturating_add(o.auto_goodput_raw);
        self.auto_probes = self.auto_probes.saturating_add(o.auto_probes);
        self.auto_switches = self.auto_switches.saturating_add(o.auto_switches);
        self.auto_busy_percent = self.auto_busy_percent.max(o.auto_busy_percent);
        self.retransmits = self.retransmits.saturating_add(o.retransmits);
        self.timeouts = self.timeouts.saturating_add(o.timeouts);
        self.duplicates_in = self.duplicates_in.saturating_add(o.duplicates_in);
        self.out_of_order_in = self.out_of_order_in.saturating_add(o.out_of_order_in);
        self.corrupt_in = self.corrupt_in.saturating_add(o.corrupt_in);
        self.skipped_bytes_in = self.skipped_bytes_in.saturating_add(o.skipped_bytes_in);
        self.stalled_frames_in = self.stalled_frames_in.saturating_add(o.stalled_frames_in);
        self.nacks_out = self.nacks_out.saturating_add(o.nacks_out);
        self.nacks_in = self.nacks_in.saturating_add(o.nacks_in);
        self.failed_over = self.failed_over.saturating_add(o.failed_over);
        self.reconnects = self.reconnects.saturating_add(o.reconnects);
        self.silent_reconnects = self.silent_reconnects.saturating_add(o.silent_reconnects);
        self.queued_messages = self.queued_messages.saturating_add(o.queued_messages);
        self.queued_bytes = self.queued_bytes.saturating_add(o.queued_bytes);
        self.unacked_frames = self.unacked_frames.saturating_add(o.unacked_frames);
        self.unacked_bytes = self.unacked_bytes.saturating_add(o.unacked_bytes);
        self.send_credit = self.send_credit.saturating_add(o.send_credit);
        self.srtt = self.srtt.max(o.srtt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_sum() {
        let mut a = Stats {
            payload_raw_out: 1000,
            payload_wire_out: 250,
            srtt: Some(Duration::from_millis(3)),
            ..Stats::default()
        };
        assert_eq!(a.compression_ratio_out(), 0.25);
        assert_eq!(a.compression_ratio_in(), 1.0);
        let b = Stats {
            payload_raw_out: 1000,
            payload_wire_out: 1000,
            srtt: Some(Duration::from_millis(7)),
            ..Stats::default()
        };
        a += &b;
        assert_eq!(a.compression_ratio_out(), 0.625);
        assert_eq!(a.srtt, Some(Duration::from_millis(7)));
    }

    #[test]
    fn sums_saturate() {
        let mut a = Stats {
            send_credit: u64::MAX,
            ..Stats::default()
        };
        a += &Stats {
            send_credit: 65_536,
            ..Stats::default()
        };
        assert_eq!(a.send_credit, u64::MAX);
    }
}
