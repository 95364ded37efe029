//! Transport tuning: the limits and budgets a rank's start-up applies, as one value. It is
//! resolved once per process from the `METAMPI_*` settings ([`Tuning::from_env`], read
//! through [`crate::knobs`]) or built and checked with [`TuningBuilder`]; both go through
//! the same rules, and `metampi info` prints what they resolve to.

use std::sync::OnceLock;
use std::time::Duration;

/// Largest eager payload through a router: routers take frames of at most 1 MiB, the
/// 64-byte envelope included.
pub const MAX_ROUTED_EAGER: usize = (1 << 20) - 64;
/// A waiting thread's spin before it sleeps, where `METAMPI_SPIN_US` is unset: with a core
/// to itself, and where ranks outnumber cores (decisions 0015, 0018).
pub const SPIN_DEFAULT: Duration = Duration::from_micros(200);
/// See [`SPIN_DEFAULT`].
pub const SPIN_CROWDED: Duration = Duration::from_micros(1000);

/// Bounds of a shared-memory ring (bytes per sender; a power of two).
pub const RING_MIN: usize = 64 << 10;
/// See [`RING_MIN`].
pub const RING_MAX: usize = 1 << 30;

/// The resolved tuning of a rank's transports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// Largest eager message over shared memory (`METAMPI_EAGER_LIMIT`; 64 KiB, measured in
    /// decision 0010).
    pub eager_shm: usize,
    /// Largest eager message over TCP (`METAMPI_EAGER_LIMIT`; 64 KiB).
    pub eager_tcp: usize,
    /// Largest eager message to another site (`METAMPI_EAGER_ROUTER`, else
    /// `METAMPI_EAGER_LIMIT`; 512 KiB; at most [`MAX_ROUTED_EAGER`]).
    pub eager_router: usize,
    /// Bytes of each shared-memory ring between two ranks (`METAMPI_SHM_RING`; 256 KiB; a
    /// power of two from [`RING_MIN`] to [`RING_MAX`]).
    pub shm_ring: usize,
    /// Socket buffers asked for on TCP links (`METAMPI_TCP_BUF`; 4 MiB; 0 leaves the
    /// kernel's autotuning).
    pub tcp_buf: usize,
    /// Shared-memory messages from this size on are copied by both sides
    /// (`METAMPI_COOP_MIN`; 64 KiB); `None`: never (`METAMPI_NO_COOP`).
    pub coop_min: Option<usize>,
    /// A waiting thread's spin before it sleeps (`METAMPI_SPIN_US`); `None`:
    /// [`SPIN_DEFAULT`], [`SPIN_CROWDED`] where ranks outnumber cores.
    pub spin: Option<Duration>,
    /// The spin budget learns from how soon sleeps end (`METAMPI_SPIN_LEARN`; on unless the
    /// spin is set).
    pub spin_learn: bool,
    /// Bytes of each shared-memory pipe to a router on the rank's node
    /// (`METAMPI_ROUTER_PIPE`); `None`: by the machine's CPUs ([`Tuning::router_pipe_bytes`]).
    pub router_pipe: Option<usize>,
    /// Ranks talk to a router on their node through shared-memory pipes
    /// (`METAMPI_NO_ROUTER_SHM` turns it off).
    pub router_pipes: bool,
    /// Every link between ranks is TCP (`METAMPI_FORCE_TCP`).
    pub force_tcp: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            // Its record (envelope included) must stay within the ring's `CLEAR_ALL_MAX`
            // (decision 0010).
            eager_shm: 64 << 10,
            eager_tcp: 64 << 10,
            eager_router: 512 << 10,
            shm_ring: 256 << 10,
            tcp_buf: 4 << 20,
            // Every rendezvous, with the eager limit at 64 KiB (decision 0012).
            coop_min: Some(64 << 10),
            spin: None,
            spin_learn: true,
            router_pipe: None,
            router_pipes: true,
            force_tcp: false,
        }
    }
}

/// A tuning value the rules refuse, named by its setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={value}: {problem}")]
pub struct TuningError {
    /// The `METAMPI_*` setting it comes from.
    pub setting: &'static str,
    /// The value asked for.
    pub value: String,
    /// What is wrong, and what the lenient reading of the environment uses instead.
    pub problem: String,
}

/// Builds a [`Tuning`] from the defaults, checking the result.
///
/// ```
/// use metampi::tuning::TuningBuilder;
/// let t = TuningBuilder::new().eager_limit(32 << 10).shm_ring(1 << 20).build().unwrap();
/// assert_eq!((t.eager_shm, t.eager_router, t.shm_ring), (32 << 10, 32 << 10, 1 << 20));
/// assert!(TuningBuilder::new().shm_ring(100_000).build().is_err());
/// ```
#[derive(Debug, Clone, Default)]
pub struct TuningBuilder {
    t: Tuning,
    /// The routed limit came from [`TuningBuilder::eager_limit`] (a refusal names that).
    router_from_limit: bool,
}

impl TuningBuilder {
    /// The defaults.
    pub fn new() -> TuningBuilder {
        TuningBuilder::default()
    }

    /// Every eager limit (shared memory, TCP, routed).
    #[must_use]
    pub fn eager_limit(mut self, bytes: usize) -> Self {
        self.t.eager_shm = bytes;
        self.t.eager_tcp = bytes;
        self.t.eager_router = bytes;
        self.router_from_limit = true;
        self
    }

    /// The routed eager limit alone.
    #[must_use]
    pub fn eager_router(mut self, bytes: usize) -> Self {
        self.t.eager_router = bytes;
        self.router_from_limit = false;
        self
    }

    /// Bytes of each shared-memory ring.
    #[must_use]
    pub fn shm_ring(mut self, bytes: usize) -> Self {
        self.t.shm_ring = bytes;
        self
    }

    /// TCP socket buffers (0: the kernel's).
    #[must_use]
    pub fn tcp_buf(mut self, bytes: usize) -> Self {
        self.t.tcp_buf = bytes;
        self
    }

    /// Cooperative copies from this size on, or none.
    #[must_use]
    pub fn coop_min(mut self, bytes: Option<usize>) -> Self {
        self.t.coop_min = bytes;
        self
    }

    /// A fixed spin before sleeping (which does not learn), or the default.
    #[must_use]
    pub fn spin(mut self, spin: Option<Duration>) -> Self {
        self.t.spin = spin;
        self.t.spin_learn = spin.is_none();
        self
    }

    /// Whether the spin budget learns.
    #[must_use]
    pub fn spin_learn(mut self, on: bool) -> Self {
        self.t.spin_learn = on;
        self
    }

    /// Bytes of each rank-router pipe, or chosen by CPU count.
    #[must_use]
    pub fn router_pipe(mut self, bytes: Option<usize>) -> Self {
        self.t.router_pipe = bytes;
        self
    }

    /// Whether ranks use shared-memory pipes to a router on their node.
    #[must_use]
    pub fn router_pipes(mut self, on: bool) -> Self {
        self.t.router_pipes = on;
        self
    }

    /// TCP between every pair of ranks.
    #[must_use]
    pub fn force_tcp(mut self, on: bool) -> Self {
        self.t.force_tcp = on;
        self
    }

    /// The tuning, if every value keeps the rules.
    ///
    /// # Errors
    /// The first value the rules refuse.
    pub fn build(self) -> Result<Tuning, TuningError> {
        let (t, refused) = self.build_lenient();
        match refused.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(t),
        }
    }

    /// The tuning with each refused value replaced by the nearest allowed one, and what
    /// was refused.
    pub fn build_lenient(self) -> (Tuning, Vec<TuningError>) {
        let mut t = self.t;
        let mut refused = Vec::new();
        if t.eager_router > MAX_ROUTED_EAGER {
            refused.push(TuningError {
                setting: if self.router_from_limit {
                    "METAMPI_EAGER_LIMIT"
                } else {
                    "METAMPI_EAGER_ROUTER"
                },
                value: t.eager_router.to_string(),
                problem: format!(
                    "routers take frames of at most 1 MiB; using {MAX_ROUTED_EAGER} for routed messages"
                ),
            });
            t.eager_router = MAX_ROUTED_EAGER;
        }
        let ring = t
            .shm_ring
            .clamp(RING_MIN, RING_MAX)
            .checked_next_power_of_two()
            .unwrap_or(RING_MAX)
            .min(RING_MAX);
        if ring != t.shm_ring {
            refused.push(TuningError {
                setting: "METAMPI_SHM_RING",
                value: t.shm_ring.to_string(),
                problem: format!(
                    "a ring is a power of two from {RING_MIN} to {RING_MAX} bytes; using {ring}"
                ),
            });
            t.shm_ring = ring;
        }
        (t, refused)
    }
}

/// `METAMPI_ROUTER_MEMORY` unless set: what one router may hold for messages.
pub const ROUTER_MEMORY_DEFAULT: u64 = 128 << 20;
/// The least router budget taken: a few of the largest frames each way.
pub const ROUTER_MEMORY_LEAST: u64 = 16 << 20;
/// The least a rank-router pipe is given however many ranks share the router.
const ROUTER_PIPE_LEAST: usize = 16 << 10;

/// Bytes one router may hold for messages, all its ranks and links together
/// (`METAMPI_ROUTER_MEMORY`), as asked for: a router uses at least
/// [`ROUTER_MEMORY_LEAST`].
pub fn router_memory() -> u64 {
    crate::knobs::size("METAMPI_ROUTER_MEMORY").unwrap_or(ROUTER_MEMORY_DEFAULT)
}

impl Tuning {
    /// Bytes of each rank-router pipe: as set, else 256 KiB on a machine of under four CPUs
    /// and 1 MiB from four (decision 0023).
    pub fn router_pipe_bytes(&self) -> usize {
        self.router_pipe
            .unwrap_or(if crate::sys::cpus::online() >= 4 {
                1 << 20
            } else {
                256 << 10
            })
    }

    /// Bytes of each pipe (one each way) of a rank whose router serves `ranks` ranks: the
    /// pipes of them all take at most an eighth of the router's budget ([`router_memory`]),
    /// however many they are, unless `METAMPI_ROUTER_PIPE` sets the size.
    pub fn router_pipe_bytes_among(&self, ranks: usize) -> usize {
        let usual = self.router_pipe_bytes();
        if self.router_pipe.is_some() {
            return usual;
        }
        let budget = router_memory().max(ROUTER_MEMORY_LEAST) as usize;
        (budget / 16 / ranks.max(1)).clamp(ROUTER_PIPE_LEAST, usual)
    }

    /// A builder starting from the defaults.
    pub fn builder() -> TuningBuilder {
        TuningBuilder::new()
    }

    /// The tuning the `METAMPI_*` settings of this process ask for, with the values the
    /// rules refuse replaced (see [`TuningBuilder::build_lenient`]), and what was refused.
    pub fn from_env() -> (Tuning, Vec<TuningError>) {
        use crate::knobs::{flag, number};
        let mut b = TuningBuilder::new();
        if let Some(n) = number::<usize>("METAMPI_EAGER_LIMIT") {
            b = b.eager_limit(n);
        }
        if let Some(n) = number::<usize>("METAMPI_EAGER_ROUTER") {
            b = b.eager_router(n);
        }
        if let Some(n) = number::<usize>("METAMPI_SHM_RING") {
            b = b.shm_ring(n);
        }
        if let Some(n) = number::<usize>("METAMPI_TCP_BUF") {
            b = b.tcp_buf(n);
        }
        if flag("METAMPI_NO_COOP", false) {
            b = b.coop_min(None);
        } else if let Some(n) = number::<usize>("METAMPI_COOP_MIN") {
            b = b.coop_min(Some(n));
        }
        if let Some(us) = number::<u64>("METAMPI_SPIN_US") {
            b = b.spin(Some(Duration::from_micros(us)));
        } else {
            b = b.spin_learn(flag("METAMPI_SPIN_LEARN", true));
        }
        b = b
            .router_pipe(number::<usize>("METAMPI_ROUTER_PIPE"))
            .router_pipes(!flag("METAMPI_NO_ROUTER_SHM", false))
            .force_tcp(flag("METAMPI_FORCE_TCP", false));
        b.build_lenient()
    }
}

/// This process's tuning, resolved on first use; what the rules refused is named in a
/// warning then (by rank 0 of a job).
pub(crate) fn current() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(|| {
        let (t, refused) = Tuning::from_env();
        for e in refused {
            crate::knobs::warn_once(e.setting, format!("{e}"));
        }
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_keep_the_rules() {
        assert_eq!(TuningBuilder::new().build(), Ok(Tuning::default()));
    }

    #[test]
    fn refused_values_are_named_and_replaced_by_the_nearest_allowed() {
        let e = TuningBuilder::new()
            .eager_limit(2 << 20)
            .build()
            .unwrap_err();
        assert_eq!(e.setting, "METAMPI_EAGER_LIMIT");
        let e = TuningBuilder::new()
            .eager_router(2 << 20)
            .build()
            .unwrap_err();
        assert_eq!(e.setting, "METAMPI_EAGER_ROUTER");
        let (t, refused) = TuningBuilder::new().eager_limit(2 << 20).build_lenient();
        assert_eq!((t.eager_shm, t.eager_router), (2 << 20, MAX_ROUTED_EAGER));
        assert_eq!(refused.len(), 1);
        for (asked, got) in [(100_000, 128 << 10), (1, RING_MIN), (usize::MAX, RING_MAX)] {
            let (t, refused) = TuningBuilder::new().shm_ring(asked).build_lenient();
            assert_eq!(t.shm_ring, got, "{asked}");
            assert!(
                refused[0]
                    .to_string()
                    .starts_with(&format!("METAMPI_SHM_RING={asked}: ")),
                "{}",
                refused[0]
            );
        }
        assert!(TuningBuilder::new().shm_ring(1 << 20).build().is_ok());
    }

    #[test]
    fn a_fixed_spin_does_not_learn() {
        let t = TuningBuilder::new()
            .spin(Some(Duration::from_micros(5)))
            .build()
            .unwrap();
        assert_eq!(
            (t.spin, t.spin_learn),
            (Some(Duration::from_micros(5)), false)
        );
    }
}
