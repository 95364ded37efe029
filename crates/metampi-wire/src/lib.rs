//! The wire protocol of metampi's inter-site router links, as deterministic state
//! machines over byte buffers (sans-IO, in the manner of `quinn-proto`).
//!
//! There are no sockets, threads or clocks here: the caller feeds stream bytes with
//! `handle_bytes(now, ..)`, writes out what `poll_transmit(now)` returns, calls
//! `handle_timeout(now)` when `poll_timeout()` says, and takes [`Event`]s from
//! `poll_event()`. The same inputs always give the same outputs, which is what lets the
//! tests run lossy, reordering, corrupting and disconnecting networks on a virtual clock.
//!
//! Key types:
//! - [`Link`]: a reliable, ordered, flow-controlled connection over one byte stream.
//! - [`Bundle`]: one connection striped over several links (MetaMPICH's parallel TCP
//!   connections per site pair), still delivering messages in order, and moving a dead
//!   link's traffic to the others.
//! - [`Message`] / [`Envelope`]: what travels: source and destination world rank,
//!   context, tag, bytes.
//! - [`Config`] / [`ConfigBuilder`]: windows, bundling delay, [`Compression`], timers.
//! - [`Stats`]: per-link counters (bytes, frames, compression ratio, retransmits, queue
//!   depth).
//! - [`frame`] and [`record`]: the byte layouts, usable on their own (`docs/wire-protocol.md`).
//!
//! Guarantees: every message is delivered exactly once, in send order, with the bytes it
//! was sent with, or the connection reports [`Event::Closed`]; a peer can never make this
//! end hold more than its receive window; malformed bytes never panic.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use metampi_wire::{Config, Envelope, Event, Link, Message};
//!
//! let mut now = Instant::now();
//! let mut a = Link::new(now, Config::default());
//! let mut b = Link::new(now, Config::default());
//! let env = Envelope { src: 0, dst: 5, context: 2, tag: 7 };
//! a.send_message(now, Message::new(env, &b"hello"[..])).unwrap();
//!
//! // A perfect, instantaneous network: move bytes until nothing moves.
//! let mut got = None;
//! for _ in 0..20 {
//!     now += Duration::from_micros(100);
//!     a.handle_timeout(now);
//!     b.handle_timeout(now);
//!     while let Some(bytes) = a.poll_transmit(now) {
//!         b.handle_bytes(now, &bytes);
//!     }
//!     while let Some(bytes) = b.poll_transmit(now) {
//!         a.handle_bytes(now, &bytes);
//!     }
//!     while let Some(ev) = b.poll_event() {
//!         if let Event::Delivered(m) = ev {
//!             got = Some(m);
//!         }
//!     }
//! }
//! let m = got.expect("delivered");
//! assert_eq!((m.envelope, &m.data[..]), (env, &b"hello"[..]));
//! assert_eq!(a.send_buffered(), 0, "acknowledged");
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bundle;
mod compress;
mod config;
mod error;
pub mod frame;
mod link;
mod link_state;
mod queue;
mod reassembly;
pub mod record;
mod stats;

pub use bundle::{Bundle, Event};
pub use compress::{decompress, AutoMode, Compression};
pub use config::{Config, ConfigBuilder, ConfigError, INITIAL_CREDIT};
pub use error::{CloseReason, ProtocolError, SendError};
pub use frame::{Codec, DecodeError};
pub use link::Link;
pub use link_state::Transmit;
pub use record::{Envelope, Message, MessageParts};
pub use stats::Stats;
