//! Errors with MPI-like error classes (MPI-1.2 §7.3).

use std::fmt;

/// The class of an error, after MPI's error classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// `MPI_ERR_RANK`: a rank outside the communicator.
    Rank,
    /// `MPI_ERR_TAG`: a negative tag or one above the upper bound.
    Tag,
    /// `MPI_ERR_COUNT`: a count that does not fit.
    Count,
    /// `MPI_ERR_TRUNCATE`: a message longer than the receive buffer.
    Truncate,
    /// `MPI_ERR_COMM`: an invalid or freed communicator.
    Comm,
    /// `MPI_ERR_TYPE`: a datatype mismatch.
    Type,
    /// `MPI_ERR_ARG`: another invalid argument.
    Arg,
    /// `MPI_ERR_DIMS`: an invalid dimension or number of dimensions of a grid.
    Dims,
    /// `MPI_ERR_PENDING`/would-block: the operation cannot complete now.
    WouldBlock,
    /// `MPI_ERR_SPAWN`: processes could not be started (MPI-2 §5.3).
    Spawn,
    /// `MPI_ERR_PORT`: a port name that names no open port (MPI-2 §5.4).
    Port,
    /// `MPI_ERR_NAME`: a service name that is not published.
    Name,
    /// `MPI_ERR_SERVICE`: a service name that cannot be published or unpublished.
    Service,
    /// `MPI_ERR_OTHER`: transport failure, lost peer, internal error.
    Other,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorClass::Rank => "MPI_ERR_RANK",
            ErrorClass::Tag => "MPI_ERR_TAG",
            ErrorClass::Count => "MPI_ERR_COUNT",
            ErrorClass::Truncate => "MPI_ERR_TRUNCATE",
            ErrorClass::Comm => "MPI_ERR_COMM",
            ErrorClass::Type => "MPI_ERR_TYPE",
            ErrorClass::Arg => "MPI_ERR_ARG",
            ErrorClass::Dims => "MPI_ERR_DIMS",
            ErrorClass::WouldBlock => "MPI_ERR_PENDING",
            ErrorClass::Spawn => "MPI_ERR_SPAWN",
            ErrorClass::Port => "MPI_ERR_PORT",
            ErrorClass::Name => "MPI_ERR_NAME",
            ErrorClass::Service => "MPI_ERR_SERVICE",
            ErrorClass::Other => "MPI_ERR_OTHER",
        };
        f.write_str(s)
    }
}

/// An error from a fallible (`try_*`) operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct Error {
    class: ErrorClass,
    message: String,
}

impl Error {
    pub(crate) fn new(class: ErrorClass, message: impl Into<String>) -> Error {
        Error {
            class,
            message: message.into(),
        }
    }

    /// The MPI-like class of this error.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// The human-readable description.
    pub fn message(&self) -> &str {
        &self.message
    }
}

pub(crate) fn truncate(len: usize, cap: usize) -> Error {
    Error::new(
        ErrorClass::Truncate,
        format!("message of {len} bytes does not fit a receive buffer of {cap} bytes"),
    )
}

/// [`truncate`] for a message whose envelope is at hand: its tag and sender named too.
pub(crate) fn truncate_message(len: usize, cap: usize, tag: i32, world_src: u32) -> Error {
    Error::new(
        ErrorClass::Truncate,
        format!(
            "message of {len} bytes (tag {tag}, from world rank {world_src}) does not fit a \
             receive buffer of {cap} bytes"
        ),
    )
}
