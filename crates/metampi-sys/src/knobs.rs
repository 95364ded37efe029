//! The `METAMPI_*` environment variables: the one place the library reads
//! them, with one parser per kind of value.
//!
//! Every variable the library, the launcher or the tests read is listed in
//! [`KNOBS`] with what it holds. Reading goes through [`flag`], [`number`],
//! [`text`] and [`os`]; a value that does not parse is named in a warning
//! (once per variable) and the default is used, so a typo slows a job down
//! visibly instead of silently. [`check_names`] warns about `METAMPI_*`
//! names nobody reads (a misspelt knob), with the nearest known name.
//! `metampi info` shows the verdict on each variable set ([`report`]).
//!
//! Nothing else in the crate calls `std::env::var` (clippy's
//! `disallowed-methods`, configured in the crate's `clippy.toml`).

#![allow(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::ffi::OsString;
use std::str::FromStr;
use std::sync::Mutex;

/// What a variable holds, which decides how it is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// On or off: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`
    /// (any case; empty is off).
    Flag,
    /// A whole number (bytes, microseconds, a count).
    Number,
    /// Bytes: a whole number with an optional binary suffix (`64K`, `128M`, `1G`).
    Size,
    /// Seconds, fractions allowed.
    Seconds,
    /// Text the reader checks itself (a path, a list, an algorithm table).
    Text,
    /// Set by the launcher for its ranks; not a user setting.
    Launcher,
}

/// A known variable.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// The full name, `METAMPI_...`.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// What it does, in a few words.
    pub help: &'static str,
}

const fn knob(name: &'static str, kind: Kind, help: &'static str) -> Knob {
    Knob { name, kind, help }
}

use Kind::{Flag, Launcher, Number, Seconds, Size, Text};

/// Every `METAMPI_*` variable read anywhere in the project.
pub const KNOBS: &[Knob] = &[
    // Tuning of the library.
    knob(
        "METAMPI_ASYMMETRIC_FENCE",
        Flag,
        "0: a full fence per shared-memory message instead of membarrier",
    ),
    knob(
        "METAMPI_ASYNC_PROGRESS",
        Flag,
        "1: a thread moves nonblocking transfers while the program computes",
    ),
    knob(
        "METAMPI_CMA_BOUNCE",
        Flag,
        "0: no bounce copy where single-copy transfer is refused",
    ),
    knob(
        "METAMPI_COLL_ALG",
        Text,
        "force collective algorithms: op=alg,op=alg",
    ),
    knob(
        "METAMPI_COOP_MIN",
        Number,
        "bytes from which two ranks copy a long message together",
    ),
    knob(
        "METAMPI_EAGER_LIMIT",
        Number,
        "bytes up to which a message goes eagerly",
    ),
    knob(
        "METAMPI_EAGER_ROUTER",
        Number,
        "eager limit for messages through routers, bytes",
    ),
    knob(
        "METAMPI_FORCE_TCP",
        Flag,
        "1: TCP between ranks even on one machine",
    ),
    knob(
        "METAMPI_LINK_TIMEOUT",
        Seconds,
        "seconds a router link may stay silent before it is given up",
    ),
    knob(
        "METAMPI_NO_CMA",
        Flag,
        "1: no single-copy transfer (cross-memory attach)",
    ),
    knob(
        "METAMPI_NO_COOP",
        Flag,
        "1: no cooperative copy of long messages",
    ),
    knob(
        "METAMPI_NO_ROUTER_LOANS",
        Flag,
        "1: routers copy instead of lending buffers",
    ),
    knob(
        "METAMPI_NO_ROUTER_SHM",
        Flag,
        "1: ranks reach a router on their machine by TCP",
    ),
    knob(
        "METAMPI_NO_SHM_COLL",
        Flag,
        "1: no shared-memory collectives",
    ),
    knob(
        "METAMPI_ROUTER_MEMORY",
        Size,
        "bytes one router may hold for messages, all ranks and links together (default 128M)",
    ),
    knob(
        "METAMPI_ROUTER_PIPE",
        Number,
        "bytes of each rank-router shared-memory pipe",
    ),
    knob(
        "METAMPI_ROUTER_READER",
        Flag,
        "1: routers read links on a thread of their own",
    ),
    knob(
        "METAMPI_ROUTER_SPIN_US",
        Number,
        "microseconds a router spins before it sleeps",
    ),
    knob(
        "METAMPI_ROUTER_WRITER",
        Flag,
        "routers write links on a thread of their own (default: with 4 or more CPUs)",
    ),
    knob(
        "METAMPI_SHM_BARRIER",
        Text,
        "shared-memory barrier: flat or dissemination",
    ),
    knob(
        "METAMPI_SHM_RING",
        Number,
        "bytes of each shared-memory ring between two ranks",
    ),
    knob(
        "METAMPI_SPIN_LEARN",
        Flag,
        "0: keep the spin budget fixed instead of learning it",
    ),
    knob(
        "METAMPI_SPIN_US",
        Number,
        "microseconds a waiting rank spins before it sleeps",
    ),
    knob(
        "METAMPI_TCP_BUF",
        Number,
        "socket buffer bytes of TCP links",
    ),
    // Diagnostics.
    knob("METAMPI_ROUTER_DEBUG", Flag, "1: routers log their links"),
    knob(
        "METAMPI_ROUTER_PROFILE",
        Flag,
        "1: routers print where their loop's time goes",
    ),
    knob(
        "METAMPI_ROUTER_STATS",
        Text,
        "directory where routers and ranks write traffic counts",
    ),
    knob(
        "METAMPI_TRACE",
        Text,
        "directory where each rank writes its event trace",
    ),
    knob(
        "METAMPI_LOG",
        Text,
        "which diagnostics are printed: a level (`warn`) or per target (`metampi_router=off,info`)",
    ),
    // Launcher and tools.
    knob(
        "METAMPI_ABI_DIR",
        Text,
        "directory of the C ABI libraries the launcher puts first",
    ),
    knob("METAMPI_BIND_TO", Text, "CPU binding the launcher applies"),
    knob(
        "METAMPI_PROGRESS",
        Launcher,
        "ranks may draw progress on the terminal",
    ),
    knob(
        "METAMPI_SECRET",
        Text,
        "the job secret (set by the launcher)",
    ),
    knob("METAMPI_SECRET_FILE", Text, "file holding the job secret"),
    knob(
        "METAMPI_UNIVERSE_SIZE",
        Number,
        "processes the job may grow to by spawning (MPI_UNIVERSE_SIZE; default: the world's size)",
    ),
    knob(
        "METAMPI_NAME_DIR",
        Text,
        "folder of published service names (MPI_Publish_name); jobs that share it find each other",
    ),
    knob(
        "METAMPI_PMI_VERSION",
        Text,
        "1 or 2: the PMI protocol spoken with Hydra or Slurm (unset: 2 where offered)",
    ),
    knob("METAMPI_TAG_OUTPUT", Launcher, "rank-tagged output"),
    knob("METAMPI_OUTPUT_DIR", Launcher, "per-rank output directory"),
    knob("METAMPI_OUTPUT_NAME", Launcher, "per-rank output file name"),
    knob(
        "METAMPI_SOAK_MESSAGES",
        Number,
        "messages per rank in the soak tests",
    ),
    // The launcher-to-rank contract.
    knob("METAMPI_APPNUM", Launcher, "the rank's application number"),
    knob(
        "METAMPI_DIRECT",
        Launcher,
        "site pairs that connect without routers",
    ),
    knob(
        "METAMPI_HELPER",
        Launcher,
        "started by hand through the launcher's helper",
    ),
    knob("METAMPI_JOB", Launcher, "the job's id"),
    knob(
        "METAMPI_LOCAL_RANK",
        Launcher,
        "rank among the job's ranks on this machine",
    ),
    knob(
        "METAMPI_LOCAL_SIZE",
        Launcher,
        "ranks of the job on this machine",
    ),
    knob(
        "METAMPI_NODE",
        Launcher,
        "the machine's name as the launcher knows it",
    ),
    knob(
        "METAMPI_PARENT",
        Launcher,
        "the spawning job of a spawned one",
    ),
    knob(
        "METAMPI_PARENT_ROUTERS",
        Launcher,
        "routers of the spawning job",
    ),
    knob("METAMPI_PMI", Launcher, "the launcher's bootstrap address"),
    knob("METAMPI_RANK", Launcher, "the rank"),
    knob("METAMPI_ROUTERS", Launcher, "router addresses per site"),
    knob(
        "METAMPI_ROUTER_SPEC",
        Launcher,
        "a router's own configuration",
    ),
    knob("METAMPI_SITES", Launcher, "ranks per site"),
    knob("METAMPI_SITE_ORDERS", Launcher, "byte order per site"),
    knob("METAMPI_SIZE", Launcher, "ranks in the job"),
    knob("METAMPI_TCP_IP", Launcher, "address ranks listen on"),
];

/// Names of the test harness's own variables.
const TEST_PREFIX: &str = "METAMPI_TEST_";

/// The known variable called `name`.
pub fn known(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

/// Warns once per variable, and in a job only on rank 0: every rank sees the
/// same environment. Also for values a reader accepted and another rule refused
/// (`metampi::tuning`'s).
pub fn warn_once(name: &str, msg: String) {
    // `PMI_RANK`: a rank started by Hydra or Slurm (`metampi_launch::pmi_wire`).
    let rank = std::env::var("METAMPI_RANK").or_else(|_| std::env::var("PMI_RANK"));
    if rank.is_ok_and(|r| r.trim() != "0") {
        return;
    }
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string())
    {
        tracing::warn!("metampi: {msg}");
    }
}

/// The boolean dialect every flag shares; `None` for anything else.
pub fn parse_flag(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// `name` as text, `None` when unset (or not UTF-8, which is warned about).
pub fn text(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            warn_once(name, format!("ignoring {name}: its value is not UTF-8"));
            None
        }
    }
}

/// `name` as the operating system holds it (paths).
pub fn os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// Flag `name`: `default` when unset or malformed (malformed is warned about).
pub fn flag(name: &str, default: bool) -> bool {
    let Some(v) = text(name) else {
        return default;
    };
    parse_flag(&v).unwrap_or_else(|| {
        warn_once(
            name,
            format!(
                "ignoring {name}={v}: not on or off (use 1 or 0); using {}",
                u8::from(default)
            ),
        );
        default
    })
}

/// Seconds above zero, as `METAMPI_LINK_TIMEOUT` takes them.
fn parse_seconds(v: &str) -> Option<f64> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|&s| s > 0.0 && s.is_finite())
}

/// What a [`Size`] value must be.
const SIZE_WHAT: &str = "a size in bytes (such as 65536, 64K, 128M or 1G)";

/// Bytes written as a whole number with an optional binary suffix: `K`, `M` or `G`
/// (`KiB`, `MiB`, `GiB` and `KB`, `MB`, `GB` read the same; any case).
pub fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// What a value of `kind` must be, where `value` is not that.
fn refused(kind: Kind, value: &str) -> Option<&'static str> {
    match kind {
        Flag => parse_flag(value)
            .is_none()
            .then_some("on or off (use 1 or 0)"),
        Number => value
            .trim()
            .parse::<u64>()
            .is_err()
            .then_some("a whole number"),
        Seconds => parse_seconds(value)
            .is_none()
            .then_some("a number of seconds above 0"),
        Size => parse_size(value).is_none().then_some(SIZE_WHAT),
        Text | Launcher => None,
    }
}

/// `name` read by `parse`; `None` when unset or malformed (malformed is
/// warned about: it should have been `what`).
fn parsed<T>(name: &str, what: &str, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    let v = text(name)?;
    let out = parse(&v);
    if out.is_none() {
        warn_once(
            name,
            format!("ignoring {name}={v}: not {what}; using the default"),
        );
    }
    out
}

/// Number `name`, `None` when unset or malformed (malformed is warned about).
pub fn number<T: FromStr>(name: &str) -> Option<T> {
    parsed(name, "a whole number", |v| v.trim().parse().ok())
}

/// Bytes in `name` ([`parse_size`]); `None` when unset or malformed (warned about).
pub fn size(name: &str) -> Option<u64> {
    parsed(name, SIZE_WHAT, parse_size)
}

/// Seconds in `name`, above zero; `None` when unset or malformed (warned about).
pub fn seconds(name: &str) -> Option<f64> {
    parsed(name, "a number of seconds above 0", parse_seconds)
}

/// What is wrong with the variable `name` set to `value`, if anything: an
/// unknown name (with the nearest known one) or a value its kind refuses.
pub fn verdict(name: &str, value: &str) -> Option<String> {
    if name.starts_with(TEST_PREFIX) {
        return None;
    }
    let Some(k) = known(name) else {
        let near = KNOBS
            .iter()
            .map(|k| (distance(name, k.name), k.name))
            .min()
            .filter(|&(d, _)| d <= 3);
        return Some(match near {
            Some((_, n)) => format!("{name} is not a metampi setting (did you mean {n}?)"),
            None => format!("{name} is not a metampi setting"),
        });
    };
    refused(k.kind, value).map(|what| format!("{name}={value} is not {what}"))
}

/// Every `METAMPI_*` variable set here: name, value (a secret hidden), and
/// what is wrong with it (`verdict`), sorted by name.
pub fn report() -> Vec<(String, String, Option<String>)> {
    let mut out: Vec<_> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with("METAMPI_").then_some((k, v))
        })
        .map(|(k, v)| {
            let value = v.to_string_lossy().into_owned();
            let why = verdict(&k, &value);
            let shown = if k.contains("SECRET") && !k.ends_with("_FILE") {
                "(set)".to_string()
            } else {
                value
            };
            (k, shown, why)
        })
        .collect();
    out.sort();
    out
}

/// Warns (once per process) about each `METAMPI_*` variable set here that
/// nobody reads or whose value its kind refuses.
pub fn check_names() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        for (name, _, why) in report() {
            if let Some(why) = why {
                warn_once(&name, why);
            }
        }
    });
}

/// Edit distance between two names (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_boolean_dialect() {
        for on in ["1", "true", "YES", " on "] {
            assert_eq!(parse_flag(on), Some(true), "{on}");
        }
        for off in ["0", "false", "No", "off", ""] {
            assert_eq!(parse_flag(off), Some(false), "{off}");
        }
        assert_eq!(parse_flag("banana"), None);
        assert_eq!(parse_flag("2"), None);
    }

    #[test]
    fn malformed_and_misspelt_values_are_named() {
        let v = verdict("METAMPI_EAGER_LIMIT", "banana").expect("refused");
        assert!(v.contains("METAMPI_EAGER_LIMIT=banana"), "{v}");
        assert!(verdict("METAMPI_EAGER_LIMIT", "4096").is_none());
        let v = verdict("METAMPI_EAGER_LIMT", "4096").expect("unknown");
        assert!(v.contains("did you mean METAMPI_EAGER_LIMIT"), "{v}");
        let v = verdict("METAMPI_NO_SHM_COL", "1").expect("unknown");
        assert!(v.contains("METAMPI_NO_SHM_COLL"), "{v}");
        assert!(verdict("METAMPI_FORCE_TCP", "maybe").is_some());
        assert!(verdict("METAMPI_LINK_TIMEOUT", "-1").is_some());
        assert!(verdict("METAMPI_LINK_TIMEOUT", "0.5").is_none());
        assert!(verdict("METAMPI_TEST_ANYTHING", "x").is_none());
        assert!(verdict("METAMPI_COMPLETELY_DIFFERENT_THING", "x")
            .is_some_and(|v| !v.contains("did you mean")));
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size(" 128m "), Some(128 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("2 MB"), Some(2 << 20));
        for bad in ["", "M", "12T", "1.5M", "-4K", "99999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        let v = verdict("METAMPI_ROUTER_MEMORY", "lots").expect("refused");
        assert!(v.contains("a size in bytes"), "{v}");
        assert!(verdict("METAMPI_ROUTER_MEMORY", "64M").is_none());
    }

    #[test]
    fn every_name_is_listed_once() {
        let mut names: Vec<_> = KNOBS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a knob is listed twice");
        assert!(names.iter().all(|n| n.starts_with("METAMPI_")));
    }
}
