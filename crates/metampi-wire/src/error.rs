//! Errors of sending, and the reasons a link or bundle closes.

use std::time::Duration;

use thiserror::Error;

use crate::frame::DecodeError;
use crate::record::Message;

/// Why `send_message` refused a message; the message comes back unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SendError {
    /// The send buffer is full; wait for [`crate::Event::Writable`] and try again
    /// (MPI's resource exhaustion turned into back-pressure).
    #[error("send buffer full")]
    WouldBlock(Message),
    /// Longer than the configured `max_message_len` (MPI_ERR_COUNT).
    #[error("message of {} bytes exceeds the maximum", .0.data.len())]
    TooLarge(Message),
    /// Every link of the connection is dead (MPI_ERR_OTHER).
    #[error("connection closed")]
    Closed(Message),
}

impl SendError {
    /// The message that was not sent.
    pub fn into_message(self) -> Message {
        match self {
            SendError::WouldBlock(m) | SendError::TooLarge(m) | SendError::Closed(m) => m,
        }
    }
}

/// A checksummed frame from the peer that breaks the protocol: a bug or an attack, never
/// line noise. It closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A frame's payload did not decode.
    #[error("bad payload: {0}")]
    Payload(#[from] DecodeError),
    /// A frame for another connection or link arrived on this one.
    #[error("frame for connection {connection} link {link} arrived on connection {expected_connection} link {expected_link}")]
    WrongLink {
        /// Connection id in the frame.
        connection: u32,
        /// Link index in the frame.
        link: u8,
        /// This end's connection id.
        expected_connection: u32,
        /// This end's link index.
        expected_link: u8,
    },
    /// The peer acknowledged a frame that was never sent.
    #[error("acknowledgement {ack} beyond the {sent} frames sent")]
    AckBeyondSent {
        /// The acknowledgement.
        ack: u64,
        /// Frames sent so far.
        sent: u64,
    },
    /// The peer sent more than the credit it was granted.
    #[error("peer exceeded its credit: {used} bytes used, {granted} granted")]
    FlowControl {
        /// Credit the peer has used with this frame.
        used: u64,
        /// Credit granted.
        granted: u64,
    },
    /// A message longer than this end accepts.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    MessageTooLarge {
        /// Announced length.
        len: u64,
        /// Configured maximum.
        max: u64,
    },
    /// Fragments of one message disagree (envelope, length or overlap).
    #[error("fragments of message {id} are inconsistent")]
    InconsistentFragment {
        /// Message id.
        id: u64,
    },
    /// A frame this end sent could not be decoded again for failover (a bug).
    #[error("own frame did not decode for failover: {0}")]
    Internal(DecodeError),
}

/// Why a link (or, for [`crate::Event::Closed`], a whole connection) stopped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// No valid frame arrived for this long (the configured idle timeout).
    #[error("no frame from the peer for {0:?}")]
    IdleTimeout(Duration),
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolError),
    /// The application closed it.
    #[error("closed locally")]
    Local,
}
