//! The engine's counters as performance variables, for the C library's tool interface
//! (`MPI_T_pvar_*` in `metampi-abi`). Each is a process-wide count since start-up that only
//! grows; a reader takes differences. Not part of the Rust API.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter: its name, what it counts, where it lives.
pub struct Pvar {
    pub name: &'static str,
    pub desc: &'static str,
    value: &'static AtomicU64,
}

impl Pvar {
    /// The count now.
    pub fn read(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Every counter, in a fixed order (a tool's index into it).
pub fn all() -> &'static [Pvar] {
    use crate::engine;
    static ALL: [Pvar; 8] = [
        Pvar {
            name: "metampi_coop_chunks_helped",
            desc: "chunks of long shared-memory messages this process copied into receivers' \
                   buffers while its sends waited (cooperative copy)",
            value: &engine::coop::HELPED,
        },
        Pvar {
            name: "metampi_spin_receives",
            desc: "blocking receives that took their message by watching a shared-memory \
                   peer's ring instead of being posted",
            value: &engine::SPIN_RECEIVES,
        },
        Pvar {
            name: "metampi_thread_wake_ups",
            desc: "wake-ups of a thread of this process asleep in a wait, by another thread",
            value: &engine::WAKE_UPS,
        },
        Pvar {
            name: "metampi_idle_thread_wake_ups",
            desc: "wake-ups of a sleeping thread that found its wait not over",
            value: &engine::IDLE_WAKE_UPS,
        },
        Pvar {
            name: "metampi_wake_datagrams_sent",
            desc: "wake-up datagrams sent to shared-memory peers asleep in their waits",
            value: &engine::links::WAKE_UPS,
        },
        Pvar {
            name: "metampi_socket_looks",
            desc: "progress passes that polled this process's TCP sockets",
            value: &engine::links::SOCKET_LOOKS,
        },
        Pvar {
            name: "metampi_socket_skips",
            desc: "progress passes that skipped polling the sockets (the last looks found nothing)",
            value: &engine::links::SOCKET_SKIPS,
        },
        Pvar {
            name: "metampi_staged_payload_bytes",
            desc: "payload bytes of long messages from TCP or router pipes that went through the \
                   staging buffer (copied twice) instead of straight into the receive buffer",
            value: &engine::stream::STAGED_PAYLOAD,
        },
    ];
    &ALL
}
