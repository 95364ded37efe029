//! Link tuning: a builder with defaults for a wide-area router link, validated once.

use std::time::Duration;

use thiserror::Error;

use crate::compress::Compression;
use crate::frame::MAX_PAYLOAD;
use crate::record::MESSAGE_OVERHEAD;

/// Credit both ends assume before the first frame arrives; every receive window must be
/// at least this large, so the assumption can never overrun a receiver.
pub const INITIAL_CREDIT: u64 = 64 << 10;

/// Smallest `max_frame_payload` accepted: room for a record header and a useful fragment.
const MIN_FRAME_PAYLOAD: usize = 4096;

/// Longest timer accepted; keeps `now + timer` far from `Instant`'s range.
const MAX_TIMER: Duration = Duration::from_secs(24 * 3600);

/// Validated link settings. Both ends of a link must use the same `connection_id`, and a
/// receiver must accept the sender's `max_frame_payload` and `max_message_len`;
/// everything else may differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub(crate) connection_id: u32,
    pub(crate) window: u64,
    pub(crate) send_buffer: u64,
    pub(crate) max_frame_payload: usize,
    pub(crate) max_message_len: u64,
    pub(crate) flush_delay: Duration,
    pub(crate) ack_delay: Duration,
    pub(crate) compression: Compression,
    pub(crate) zstd_level: i32,
    pub(crate) initial_rto: Duration,
    pub(crate) min_rto: Duration,
    pub(crate) max_rto: Duration,
    pub(crate) keepalive: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) silent_reconnect: Option<Duration>,
    pub(crate) partial_frame_timeout: Duration,
    pub(crate) payload_checksum: bool,
}

impl Config {
    /// A builder holding the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// Receive window in bytes of credit (message bytes plus a fixed per-message charge).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Largest message `send_message` accepts and a receiver reassembles.
    pub fn max_message_len(&self) -> u64 {
        self.max_message_len
    }

    /// Send buffer in bytes of credit: messages accepted and not yet acknowledged.
    pub fn send_buffer(&self) -> u64 {
        self.send_buffer
    }

    /// Largest raw (uncompressed) frame payload.
    pub fn max_frame_payload(&self) -> usize {
        self.max_frame_payload
    }
}

impl Default for Config {
    fn default() -> Config {
        let b = ConfigBuilder::default();
        Config {
            connection_id: b.connection_id,
            window: b.window,
            send_buffer: b.send_buffer,
            max_frame_payload: b.max_frame_payload,
            max_message_len: b.max_message_len,
            flush_delay: b.flush_delay,
            ack_delay: b.ack_delay,
            compression: b.compression,
            zstd_level: b.zstd_level,
            initial_rto: b.initial_rto,
            min_rto: b.min_rto,
            max_rto: b.max_rto,
            keepalive: b.keepalive,
            idle_timeout: b.idle_timeout,
            silent_reconnect: b.silent_reconnect,
            partial_frame_timeout: b.partial_frame_timeout,
            payload_checksum: b.payload_checksum,
        }
    }
}

/// Builder for [`Config`]: `Default`, chainable setters, then [`ConfigBuilder::build`].
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    connection_id: u32,
    window: u64,
    send_buffer: u64,
    max_frame_payload: usize,
    max_message_len: u64,
    flush_delay: Duration,
    ack_delay: Duration,
    compression: Compression,
    zstd_level: i32,
    initial_rto: Duration,
    min_rto: Duration,
    max_rto: Duration,
    keepalive: Duration,
    idle_timeout: Duration,
    silent_reconnect: Option<Duration>,
    partial_frame_timeout: Duration,
    payload_checksum: bool,
}

impl Default for ConfigBuilder {
    fn default() -> ConfigBuilder {
        ConfigBuilder {
            connection_id: 0,
            window: 4 << 20,
            send_buffer: 4 << 20,
            max_frame_payload: 64 << 10,
            max_message_len: 1 << 20,
            flush_delay: Duration::from_micros(200),
            ack_delay: Duration::from_millis(1),
            compression: Compression::Lz4,
            zstd_level: 3,
            initial_rto: Duration::from_millis(250),
            min_rto: Duration::from_millis(20),
            max_rto: Duration::from_secs(5),
            keepalive: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            silent_reconnect: None,
            partial_frame_timeout: Duration::from_millis(200),
            payload_checksum: true,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> ConfigBuilder {
            self.$name = value;
            self
        }
    };
}

impl ConfigBuilder {
    setter!(
        /// Connection id carried in every frame; frames with another id close the link
        /// (a mis-wired or foreign peer). Default 0.
        connection_id: u32
    );
    setter!(
        /// Receive window: bytes of credit the peer may have outstanding at this end,
        /// which bounds the memory it can make us hold. Default 4 MiB.
        window: u64
    );
    setter!(
        /// Send buffer: bytes of credit accepted by `send_message` and not yet
        /// acknowledged. Default 4 MiB.
        send_buffer: u64
    );
    setter!(
        /// Largest raw frame payload; more pending bytes than this flush at once.
        /// Default 64 KiB.
        max_frame_payload: usize
    );
    setter!(
        /// Largest message. Default 1 MiB.
        max_message_len: u64
    );
    setter!(
        /// How long a small message may wait for others to share its frame. Zero sends
        /// whatever is queued at each `poll_transmit`. Default 200 µs.
        flush_delay: Duration
    );
    setter!(
        /// How long an acknowledgement may wait for a frame to ride on. Default 1 ms.
        ack_delay: Duration
    );
    setter!(
        /// Payload compression of outgoing frames. Default [`Compression::Lz4`].
        compression: Compression
    );
    setter!(
        /// zstd level for [`Compression::Zstd`] (-7..=22). Default 3.
        zstd_level: i32
    );
    setter!(
        /// Retransmission timeout before the first round-trip sample. Default 250 ms.
        initial_rto: Duration
    );
    setter!(
        /// Floor of the retransmission timeout. Default 20 ms.
        min_rto: Duration
    );
    setter!(
        /// Ceiling of the backed-off retransmission timeout. Default 5 s.
        max_rto: Duration
    );
    setter!(
        /// Idle time after which an empty acknowledgement is sent so the peer knows this
        /// end is alive. Default 1 s.
        keepalive: Duration
    );
    setter!(
        /// Time without a valid frame from the peer (also while disconnected) after which
        /// the link is declared dead. Default 10 s.
        idle_timeout: Duration
    );

    /// Asks the driver to connect a link again once it has been connected and silent
    /// (not a byte from the peer) for `after`: [`crate::Event::LinkSilent`]. A TCP
    /// connection that backs off after repeated losses neither delivers nor breaks,
    /// sometimes for longer than the idle timeout; a new connection starts afresh. The
    /// link then gets a full idle timeout from that moment before it is given up, once
    /// per silence (bytes must arrive before it is asked again). Must lie between the
    /// keepalive and the idle timeout, so that a healthy idle link is never taken for
    /// a silent one. Default: never (the driver cannot reconnect, or does not want to).
    pub fn silent_reconnect(mut self, after: Duration) -> ConfigBuilder {
        self.silent_reconnect = Some(after);
        self
    }
    setter!(
        /// How long a partly received frame may go without a single new byte before it
        /// is given up: bytes lost inside the stream leave a valid header waiting for
        /// payload that is not coming. The receiver then resyncs inside the bytes it
        /// holds and sends a `Nack`, so the sender resends at once instead of after its
        /// retransmission timeout. The wait is at least twice the smoothed round trip
        /// where this end has measured one, and doubles (up to `max_rto`, never below
        /// this value) each time a give-up proves premature because the rest of the
        /// frame arrives after all. Silence is what counts, not the time a frame takes,
        /// so a slow line that keeps bytes coming is never cut short; keep this above the
        /// longest pause a healthy transport makes inside a frame (TCP after a lost
        /// segment or an idle period: about one round trip). Default 200 ms.
        partial_frame_timeout: Duration
    );
    setter!(
        /// Whether this end's frame checksums cover the payload. Off, they cover the
        /// header alone: a corrupted payload byte is then caught only by what carries
        /// the frames (TCP's 16-bit sum, or TLS, which authenticates every byte). The
        /// receiver follows each frame's flag, so the ends may differ. Default on.
        payload_checksum: bool
    );

    /// Checks the settings against each other.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that is out of range.
    pub fn build(self) -> Result<Config, ConfigError> {
        let invalid =
            |field: &'static str, reason: String| Err(ConfigError::Invalid { field, reason });
        if self.window < INITIAL_CREDIT {
            return invalid("window", format!("must be at least {INITIAL_CREDIT} bytes"));
        }
        if !(MIN_FRAME_PAYLOAD..=MAX_PAYLOAD).contains(&self.max_frame_payload) {
            return invalid(
                "max_frame_payload",
                format!("must be within {MIN_FRAME_PAYLOAD}..={MAX_PAYLOAD}"),
            );
        }
        // A message is reassembled whole before it is delivered, so the window must hold
        // the largest one, or sender and receiver would wait on each other forever.
        let largest = self.max_message_len.saturating_add(MESSAGE_OVERHEAD);
        if largest > self.window {
            return invalid(
                "max_message_len",
                format!(
                    "plus {MESSAGE_OVERHEAD} bytes overhead must fit the window of {} bytes",
                    self.window
                ),
            );
        }
        if largest > self.send_buffer {
            return invalid(
                "send_buffer",
                format!("must hold the largest message ({largest} bytes with overhead)"),
            );
        }
        if self.compression == Compression::Zstd && !cfg!(feature = "zstd") {
            return Err(ConfigError::ZstdUnavailable);
        }
        if !(-7..=22).contains(&self.zstd_level) {
            return invalid("zstd_level", "must be within -7..=22".into());
        }
        let timers = [
            ("flush_delay", self.flush_delay),
            ("ack_delay", self.ack_delay),
            ("max_rto", self.max_rto),
            ("idle_timeout", self.idle_timeout),
            ("partial_frame_timeout", self.partial_frame_timeout),
        ];
        if let Some((field, _)) = timers.iter().find(|t| t.1 > MAX_TIMER) {
            return invalid(field, format!("must be at most {MAX_TIMER:?}"));
        }
        if self.min_rto.is_zero()
            || self.min_rto > self.initial_rto
            || self.initial_rto > self.max_rto
        {
            return invalid(
                "min_rto",
                "need 0 < min_rto <= initial_rto <= max_rto".into(),
            );
        }
        if self.keepalive.is_zero() || self.keepalive >= self.idle_timeout {
            return invalid("keepalive", "need 0 < keepalive < idle_timeout".into());
        }
        if let Some(after) = self.silent_reconnect {
            if after <= self.keepalive || after >= self.idle_timeout {
                return invalid(
                    "silent_reconnect",
                    "need keepalive < silent_reconnect < idle_timeout".into(),
                );
            }
        }
        // Zero would give up every frame still arriving at the next timeout call.
        if self.partial_frame_timeout.is_zero() {
            return invalid("partial_frame_timeout", "must be above zero".into());
        }
        Ok(Config {
            connection_id: self.connection_id,
            window: self.window,
            send_buffer: self.send_buffer,
            max_frame_payload: self.max_frame_payload,
            max_message_len: self.max_message_len,
            flush_delay: self.flush_delay,
            ack_delay: self.ack_delay,
            compression: self.compression,
            zstd_level: self.zstd_level,
            initial_rto: self.initial_rto,
            min_rto: self.min_rto,
            max_rto: self.max_rto,
            keepalive: self.keepalive,
            idle_timeout: self.idle_timeout,
            silent_reconnect: self.silent_reconnect,
            partial_frame_timeout: self.partial_frame_timeout,
            payload_checksum: self.payload_checksum,
        })
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting is out of range or inconsistent with another.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The setter's name.
        field: &'static str,
        /// What is expected.
        reason: String,
    },
    /// `Compression::Zstd` in a build without the `zstd` feature.
    #[error("zstd compression requested but this build has no `zstd` feature")]
    ZstdUnavailable,
    /// A bundle needs 1 to 255 links.
    #[error("a bundle needs 1 to 255 links, not {0}")]
    Links(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build() {
        assert_eq!(Config::builder().build().unwrap(), Config::default());
    }

    #[test]
    fn zstd_needs_the_feature() {
        let built = Config::builder().compression(Compression::Zstd).build();
        if cfg!(feature = "zstd") {
            assert!(built.is_ok());
        } else {
            assert_eq!(built, Err(ConfigError::ZstdUnavailable));
        }
    }

    #[test]
    fn inconsistent_settings_name_the_field() {
        let field = |b: ConfigBuilder| match b.build() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(field(Config::builder().window(1000)), "window");
        assert_eq!(
            field(Config::builder().max_message_len(4 << 20)),
            "max_message_len"
        );
        assert_eq!(field(Config::builder().send_buffer(1 << 20)), "send_buffer");
        assert_eq!(
            field(Config::builder().max_frame_payload(100)),
            "max_frame_payload"
        );
        assert_eq!(
            field(Config::builder().min_rto(Duration::from_secs(1))),
            "min_rto"
        );
        assert_eq!(
            field(Config::builder().keepalive(Duration::from_secs(10))),
            "keepalive"
        );
        assert_eq!(field(Config::builder().zstd_level(40)), "zstd_level");
        assert_eq!(
            field(Config::builder().idle_timeout(Duration::MAX)),
            "idle_timeout"
        );
        assert_eq!(
            field(Config::builder().partial_frame_timeout(Duration::ZERO)),
            "partial_frame_timeout"
        );
        for after in [Duration::from_millis(500), Duration::from_secs(10)] {
            assert_eq!(
                field(Config::builder().silent_reconnect(after)),
                "silent_reconnect"
            );
        }
        assert!(Config::builder()
            .silent_reconnect(Duration::from_secs(5))
            .build()
            .is_ok());
        assert_eq!(
            field(Config::builder().partial_frame_timeout(Duration::MAX)),
            "partial_frame_timeout"
        );
    }
}
