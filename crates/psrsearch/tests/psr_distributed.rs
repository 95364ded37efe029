//! The distributed search gives exactly the candidates of the single-process search: on one
//! site (with one and with two servers) and on three emulated sites with uneven rank counts
//! (links probed at start-up), in request/reply, scheduled-service and dynamic mode; and with
//! one host slowed behind the plan's back, the dynamic mode moves units off it and finishes
//! sooner than the static plan.
//!
//! Each test is a multi-rank job run by `metampi::testing::Ranks` (the ranks are this test
//! executable again); the jobs of this file run one at a time.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use metampi::testing::Ranks;
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;
use psrsearch::distributed::{search_distributed, DistConfig, DistOutcome, ServiceMode};
use psrsearch::search::{dm_grid, search_file, SearchConfig};
use psrsearch::simulate::{write_simulation, Pulsar, SimConfig, SimFormat};
use psrsearch::{BasebandReader, PlanConfig};

static JOBS: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    JOBS.lock().unwrap_or_else(|p| p.into_inner())
}

fn observation() -> SimConfig {
    SimConfig {
        nchan: 2,
        npol: 1,
        bandwidth_mhz: 2.0,
        nsamples: 1 << 17,
        seed: 11,
        pulsars: vec![Pulsar {
            period_s: 0.01,
            dm: 5.0,
            duty_cycle: 0.05,
            amplitude: 1.0,
        }],
        ..SimConfig::default()
    }
}

fn search() -> SearchConfig {
    SearchConfig {
        dms: dm_grid(0.0, 10.0, 2.5),
        plan: PlanConfig::default().downsample(16).fft_len(4096),
        ..SearchConfig::default()
    }
}

/// Rank 0 writes the observation and tells everyone where; all search it distributed; the
/// root compares with the single-process search.
fn distributed_equals_single(world: &SimpleCommunicator, mode: ServiceMode, per_server: usize) {
    let file = write_observation(world);
    check_against_single(world, &file, mode, per_server, None);
    remove_observation(world, &file);
}

/// Rank 0 writes the observation; everyone learns its path.
fn write_observation(world: &SimpleCommunicator) -> PathBuf {
    let mut path = Vec::new();
    if world.rank() == 0 {
        let dir = std::env::temp_dir().join(format!("psr-dist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("obs.dada");
        write_simulation(&observation(), SimFormat::Dada8, &file).unwrap();
        path = file.to_string_lossy().into_owned().into_bytes();
    }
    let mut len = path.len() as u64;
    world.process_at_rank(0).broadcast_into(&mut len);
    path.resize(len as usize, 0);
    world.process_at_rank(0).broadcast_into(&mut path[..]);
    PathBuf::from(String::from_utf8(path).unwrap())
}

fn remove_observation(world: &SimpleCommunicator, file: &std::path::Path) {
    world.barrier();
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all(file.parent().unwrap());
    }
    world.barrier();
}

/// Search `file` distributed (collective); the root checks the candidates against the
/// single-process search and returns the outcome.
fn check_against_single(
    world: &SimpleCommunicator,
    file: &std::path::Path,
    mode: ServiceMode,
    per_server: usize,
    slow_host: Option<(&str, f64)>,
) -> Option<DistOutcome> {
    let mut config = DistConfig::new(search());
    config.mode = mode;
    config.clients_per_server = per_server;
    config.slow_host = slow_host.map(|(n, s)| (n.to_string(), s));
    let out = search_distributed(world, file, &config, &mut |_| {}).unwrap();
    if let Some(d) = &out {
        let mut reader = BasebandReader::open(file).unwrap();
        let single = search_file(&mut reader, &search(), &mut |_, _| {}).unwrap();
        assert!(!single.candidates.is_empty(), "the test pulsar is found");
        assert_eq!(d.outcome.candidates, single.candidates, "candidates differ");
        assert_eq!(d.outcome.dms, single.dms);
        assert_eq!(d.outcome.spectrum, single.spectrum);
        let units: u64 = d.hosts.iter().map(|h| h.units).sum();
        assert_eq!(units, d.allocation.input.units);
        let done: u64 = d.hosts.iter().map(|h| h.done_units).sum();
        assert_eq!(done, d.allocation.input.units, "every unit computed once");
        assert_eq!(d.mode, mode);
    }
    world.barrier();
    out
}

fn three_sites(portbase: u16) -> String {
    format!(
        "PORTBASE {portbase}\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 2; NODES = a0; }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 3; NODES = b0; }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 1; NODES = c0; }}\n\
         PAIR a b 1 - {{ BANDWIDTH = 200Mbit; LATENCY = 1ms; COMPRESSION = off; }}\n\
         a0 <-> b0\n\
         PAIR a c 1 - {{ BANDWIDTH = 50Mbit; LATENCY = 5ms; COMPRESSION = off; }}\n\
         a0 <-> c0\n\
         PAIR b c 1 - {{ BANDWIDTH = 100Mbit; COMPRESSION = off; }}\n\
         b0 <-> c0\n"
    )
}

#[test]
fn one_site_request_reply() {
    let _g = lock();
    Ranks::new(4)
        .timeout(Duration::from_secs(120))
        .run("one_site_request_reply", |w| {
            distributed_equals_single(w, ServiceMode::RequestReply, 128)
        });
}

#[test]
fn one_site_scheduled_two_servers() {
    let _g = lock();
    // 5 ranks at 2 clients per server: 2 servers, 3 clients.
    Ranks::new(5)
        .timeout(Duration::from_secs(120))
        .run("one_site_scheduled_two_servers", |w| {
            distributed_equals_single(w, ServiceMode::Scheduled, 2)
        });
}

#[test]
fn three_sites_request_reply() {
    let _g = lock();
    Ranks::new(6)
        .meta(&three_sites(23871))
        .timeout(Duration::from_secs(120))
        .run("three_sites_request_reply", |w| {
            assert_eq!(w.num_meta_hosts(), 3);
            distributed_equals_single(w, ServiceMode::RequestReply, 128)
        });
}

#[test]
fn three_sites_scheduled() {
    let _g = lock();
    Ranks::new(6)
        .meta(&three_sites(23881))
        .timeout(Duration::from_secs(120))
        .run("three_sites_scheduled", |w| {
            distributed_equals_single(w, ServiceMode::Scheduled, 128)
        });
}

#[test]
fn three_sites_dynamic() {
    let _g = lock();
    Ranks::new(6)
        .meta(&three_sites(23891))
        .timeout(Duration::from_secs(120))
        .run("three_sites_dynamic", |w| {
            distributed_equals_single(w, ServiceMode::Dynamic, 128)
        });
}

/// The data host `a` (on this small job the plan gives it every unit: moving a unit costs more
/// than computing it) sleeps after every unit, which calibration does not see. Scheduled service must wait for it; the dynamic mode
/// moves units to the other hosts and finishes sooner, with the same candidates.
#[test]
fn three_sites_slow_host_dynamic_beats_static() {
    let _g = lock();
    Ranks::new(6)
        .meta(&three_sites(23901))
        .timeout(Duration::from_secs(180))
        .run("three_sites_slow_host_dynamic_beats_static", |w| {
            let file = write_observation(w);
            let slow = Some(("site 0", SLOW_S));
            let fixed = check_against_single(w, &file, ServiceMode::Scheduled, 128, slow);
            let dynamic = check_against_single(w, &file, ServiceMode::Dynamic, 128, slow);
            if let (Some(s), Some(d)) = (fixed, dynamic) {
                let slowed = |o: &DistOutcome| o.hosts.iter().find(|h| h.name == "site 0").cloned();
                let (sb, db) = (slowed(&s).unwrap(), slowed(&d).unwrap());
                eprintln!(
                    "static: service {:.2} s, a did {}/{} units; dynamic: service {:.2} s, a did \
                     {}/{} units",
                    s.service_s, sb.done_units, sb.units, d.service_s, db.done_units, db.units
                );
                for h in s.hosts.iter().chain(&d.hosts) {
                    eprintln!("  {h:?}");
                }
                assert_eq!(sb.done_units, sb.units, "scheduled service keeps the plan");
                assert!(
                    db.done_units + 3 <= db.units,
                    "dynamic mode moved at least 3 units off the slow host"
                );
                // Static waits ≥ 33 × SLOW_S for host a; dynamic about PREFETCH × SLOW_S.
                assert!(
                    d.service_s < 0.6 * s.service_s,
                    "dynamic ({:.2} s) finishes well before static ({:.2} s)",
                    d.service_s,
                    s.service_s
                );
            }
            remove_observation(w, &file);
        });
}

/// Seconds host `b` sleeps after every unit in the slow-host test.
const SLOW_S: f64 = 0.05;
