//! Starting a program as a metampi job over a meta-computer description: routers between the
//! meta hosts first, then the ranks (MetaMPICH's `mpirun -meta`). The program relaunches
//! itself: routers are this executable with the router spec in their environment (its
//! `main` must call [`metampi_router::run_from_env`] first and exit when that returns
//! `true`), ranks are this executable with the arguments given.
//!
//! [`demo_description`] is the embedded three-site metacomputer of `psrsearch demo`.

use std::ffi::OsString;
use std::net::TcpListener;
use std::time::Duration;

use metampi_launch::{
    AppSpec, Binding, JobOutcome, JobSpec, LaunchMethod, OutputMode, StdinTarget,
};

/// Why a meta job could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaJobError {
    /// The description does not parse or validate.
    #[error(transparent)]
    Config(#[from] metampi_config::ConfigError),
    /// Routers or ranks could not be started.
    #[error("cannot start the job: {0}")]
    Start(#[from] std::io::Error),
    /// The launcher refused or failed.
    #[error(transparent)]
    Launch(#[from] metampi_launch::LaunchError),
    /// No block of free ports was found for the routers.
    #[error("no free block of {0} TCP ports found for the routers")]
    NoPorts(usize),
    /// The link to slow down cannot be.
    #[error("cannot slow down the link: {0}")]
    SlowLink(String),
}

/// A job to run.
#[derive(Clone, Debug)]
pub struct MetaJob {
    /// Name of the description in error messages (usually its path).
    pub description_name: String,
    /// The description text.
    pub description: String,
    /// Arguments of every rank (this executable is the program).
    pub rank_args: Vec<OsString>,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// Limit for the whole job.
    pub timeout: Duration,
    /// Forward this process's standard input to world rank 0 (a streaming search reading
    /// stdin); otherwise every rank's is empty.
    pub stdin_to_root: bool,
    /// Emulate the links between the first meta host (the data host) and the one named, both
    /// ways, at this fraction of the bandwidth the description gives, while the ranks still
    /// read the description as written: a link slower than its owners claim, for testing
    /// what that costs a static plan.
    pub slow_link: Option<(String, f64)>,
}

/// The routers' spin budget (microseconds; `0`: block at once).
const ROUTER_SPIN_ENV: &str = "METAMPI_ROUTER_SPIN_US";

/// Whether ranks learn their spin budget (`0`: keep the starting one).
const SPIN_LEARN_ENV: &str = "METAMPI_SPIN_LEARN";

/// Run `job`: parse the description, start its routers, run the ranks, stop the routers.
///
/// # Errors
/// A bad description, or routers or ranks that cannot be started. A job that runs but fails
/// is reported in the returned outcome.
pub fn run(job: &MetaJob) -> Result<JobOutcome, MetaJobError> {
    let cfg = metampi_config::parse_auto(&job.description_name, &job.description)?;
    let mut layout = cfg.layout();
    if let Some((name, factor)) = &job.slow_link {
        slow_down_link(&mut layout, name, *factor)?;
    }
    let exe = std::env::current_exe()?.into_os_string();
    // Units are large and the search is throughput-bound: routers that spin for low latency
    // would only take cycles from the clients beside them and inflate the relay CPU the
    // pilot measures (the plan then starves the data host). A user's own setting wins.
    let router_env: Vec<(OsString, OsString)> = match std::env::var_os(ROUTER_SPIN_ENV) {
        Some(_) => Vec::new(),
        None => vec![(ROUTER_SPIN_ENV.into(), "0".into())],
    };
    let (_routers, plan) =
        metampi_launch::meta::start(&layout, &exe, &["router".into()], &router_env)?;
    let mut spec = JobSpec::new()
        .app(AppSpec::new(plan.world_size, exe).args(job.rank_args.clone()))
        .hosts(plan.hosts.clone())
        .launch(LaunchMethod::Local)
        .stdin(if job.stdin_to_root {
            StdinTarget::Rank(0)
        } else {
            StdinTarget::None
        })
        .output(OutputMode::Terminal)
        .timeout(job.timeout)
        .bind(
            Binding::from_env()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        );
    for (k, v) in &plan.env {
        spec = spec.env(k, v);
    }
    // Likewise the ranks keep their starting spin budget instead of learning a longer one
    // (`METAMPI_SPIN_LEARN`): clients waiting for units would spin beside the ones computing,
    // and the pilot's speeds would move with it.
    if std::env::var_os(SPIN_LEARN_ENV).is_none() {
        spec = spec.env(SPIN_LEARN_ENV, "0");
    }
    for (k, v) in &job.env {
        spec = spec.env(k, v);
    }
    Ok(metampi_launch::run(&spec)?)
}

/// Scale the emulated bandwidth of every link between meta host 0 and `host`, both ways.
///
/// # Errors
/// No meta host of that name, the data host itself, a factor outside (0, 1], or a link
/// between the two without a `BANDWIDTH` to scale.
fn slow_down_link(
    layout: &mut metampi_config::Layout,
    host: &str,
    factor: f64,
) -> Result<(), MetaJobError> {
    let bad = |why: String| MetaJobError::SlowLink(why);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(bad(format!("factor {factor} is not within (0, 1]")));
    }
    let h = layout
        .hosts
        .iter()
        .position(|m| m.name == host)
        .ok_or_else(|| bad(format!("no meta host `{host}`")))?;
    if h == 0 {
        return Err(bad(format!("`{host}` holds the data; name a remote host")));
    }
    let mut scaled = 0;
    for l in &mut layout.links {
        if (l.from_host, l.to_host) == (0, h) || (l.from_host, l.to_host) == (h, 0) {
            let bw = l.options.bandwidth.ok_or_else(|| {
                bad(format!(
                    "a link between `{}` and `{host}` has no BANDWIDTH to scale",
                    layout.hosts[0].name
                ))
            })?;
            let bits = ((bw.bits_per_sec() as f64 * factor).round() as u64).max(1);
            l.options.bandwidth = metampi_config::Bandwidth::from_bits_per_sec(bits);
            scaled += 1;
        }
    }
    if scaled == 0 {
        return Err(bad(format!(
            "no link between `{}` and `{host}`",
            layout.hosts[0].name
        )));
    }
    Ok(())
}

/// The demo's metacomputer, after the SC99 run: the data at Jodrell Bank (a server and two
/// clients), three clients at Stuttgart behind a fast link and two at Pittsburgh behind a slow
/// transatlantic one. Compression is off so the links run at their nominal rates.
pub fn demo_description(port_base: u16) -> String {
    format!(
        "# psrsearch demo: three emulated sites on this machine\n\
         PORTBASE {port_base}\n\
         METAHOST jodrell {{ LAUNCH = local; NPROCS = 3; NODES = jb0; }}\n\
         METAHOST stuttgart {{ LAUNCH = local; NPROCS = 3; NODES = hlrs0; }}\n\
         METAHOST pittsburgh {{ LAUNCH = local; NPROCS = 2; NODES = psc0; }}\n\
         PAIR jodrell stuttgart 1 - {{ BANDWIDTH = 100Mbit; LATENCY = 5ms; COMPRESSION = off; }}\n\
         jb0 <-> hlrs0\n\
         PAIR jodrell pittsburgh 1 - {{ BANDWIDTH = 40Mbit; LATENCY = 40ms; COMPRESSION = off; }}\n\
         jb0 <-> psc0\n\
         PAIR stuttgart pittsburgh 1 - {{ BANDWIDTH = 50Mbit; LATENCY = 30ms; COMPRESSION = off; }}\n\
         hlrs0 <-> psc0\n"
    )
}

/// A port base with `count` consecutive free ports on loopback, probing from a base derived
/// from the process id so that concurrent jobs rarely collide. The ports are taken below the
/// machine's ephemeral range where there is room (10000-19500, clear of the 20000-32300 that
/// the tests' descriptions name): a port in that range can be held for a minute by a closed connection of
/// an earlier job, and a router of a later job reusing the base could not listen on it
/// ([`metampi_launch::ports`]).
///
/// # Errors
/// [`MetaJobError::NoPorts`] when 200 tries find nothing.
pub fn free_port_base(count: usize) -> Result<u16, MetaJobError> {
    let (first, span) = port_window(metampi_launch::ports::ephemeral_ports(), count);
    let mut off = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..200 {
        let base = first + off;
        let ok = (0..count as u32).all(|k| {
            u16::try_from(base + k)
                .ok()
                .is_some_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        });
        if ok {
            if let Ok(b) = u16::try_from(base) {
                return Ok(b);
            }
        }
        off = (off + 97) % span;
    }
    Err(MetaJobError::NoPorts(count))
}

/// Where [`free_port_base`] draws bases of `count` ports: the first base and how many bases.
/// 10000-19500 where that stays below the ephemeral range `eph`; else 30000-50000, the old
/// window (a machine whose ephemeral range starts that low has no safe ports to offer).
fn port_window(eph: Option<std::ops::RangeInclusive<u16>>, count: usize) -> (u32, u32) {
    const LOW: u32 = 10_000;
    const HIGH: u32 = 19_500;
    let top = eph.map_or(HIGH, |r| HIGH.min(u32::from(*r.start())));
    let need = count as u32;
    if top >= LOW + need + 1000 {
        (LOW, top - need - LOW)
    } else {
        (30_000, 20_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_bases_stay_below_the_ephemeral_range() {
        assert_eq!(port_window(Some(32768..=60999), 8), (10_000, 9_492));
        assert_eq!(port_window(None, 8), (10_000, 9_492));
        // A range that starts lower squeezes the window under it.
        assert_eq!(port_window(Some(15000..=60999), 8), (10_000, 4_992));
        // One that leaves no room falls back to the old window.
        assert_eq!(port_window(Some(1024..=65535), 8), (30_000, 20_000));
        let base = u32::from(free_port_base(4).unwrap());
        if let Some(eph) = metampi_launch::ports::ephemeral_ports() {
            if u32::from(*eph.start()) >= 11_004 {
                assert!(base + 4 <= u32::from(*eph.start()), "{base}");
            }
        }
    }

    #[test]
    fn demo_description_parses_with_three_uneven_sites() {
        let cfg = metampi_config::parse_str("demo", &demo_description(31000)).unwrap();
        let l = cfg.layout();
        assert_eq!(l.world_size, 8);
        let sizes: Vec<usize> = l.hosts.iter().map(|h| h.ranks.len()).collect();
        assert_eq!(sizes, vec![3, 3, 2]);
        let bw = |a, b| {
            l.links_between(a, b)
                .map(|k| k.options.bandwidth.unwrap().bytes_per_sec())
                .sum::<u64>()
        };
        assert_eq!(bw(0, 1), 12_500_000);
        assert_eq!(bw(0, 2), 5_000_000);
        assert_eq!(bw(2, 0), 5_000_000);
    }

    #[test]
    fn a_slowed_link_is_scaled_both_ways_and_only_there() {
        let cfg = metampi_config::parse_str("demo", &demo_description(31000)).unwrap();
        let mut l = cfg.layout();
        slow_down_link(&mut l, "pittsburgh", 0.25).unwrap();
        let bw = |a, b| {
            l.links_between(a, b)
                .map(|k| k.options.bandwidth.unwrap().bytes_per_sec())
                .sum::<u64>()
        };
        assert_eq!(bw(0, 2), 1_250_000);
        assert_eq!(bw(2, 0), 1_250_000);
        assert_eq!(bw(0, 1), 12_500_000);
        assert_eq!(bw(1, 2), 6_250_000);
        assert!(slow_down_link(&mut l, "jodrell", 0.5).is_err());
        assert!(slow_down_link(&mut l, "nowhere", 0.5).is_err());
        assert!(slow_down_link(&mut l, "stuttgart", 1.5).is_err());
    }
}
