//! Only processes that know the job secret may talk to a job: while a
//! two-site job runs, connections to a router from a stranger (garbage), from
//! a process with another secret, and a replayed handshake (a valid answer
//! to an earlier challenge) are refused, and the job completes correctly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use metampi::auth::VERTICAL_CTX;
use metampi::auth::{self, Secret};
use metampi::traits::*;
use metampi_testkit::{processes_of, Ranks};

const CONFIG: &str = "PORTBASE 25900\n\
     METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
     PAIR a b 1\na0 <-> b0\n";

/// This site's router (for rank 0: site 0 towards site 1), from `METAMPI_ROUTERS`.
fn router_addr() -> String {
    let v = metampi::knobs::text("METAMPI_ROUTERS").expect("a meta job");
    v.split(',')
        .find_map(|e| e.strip_prefix("0>1@"))
        .expect("a router from site 0 to site 1")
        .to_string()
}

/// Whether the router hangs up on us (refusal) rather than proving itself.
fn refused(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) | Err(_) => true,
        Ok(_) => false,
    }
}

fn attacks() {
    let addr = router_addr();
    let hello = 0u32.to_le_bytes(); // pretends to be rank 0
                                    // 1. A stranger: reads the challenge, answers with garbage.
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut na = [0u8; auth::NONCE];
    s.read_exact(&mut na).unwrap();
    s.write_all(&[0x5a; auth::NONCE + auth::TAG + 4]).unwrap();
    assert!(refused(s), "a stranger was accepted");
    // 2. Another job's secret: the full handshake with the wrong key.
    let mut s = TcpStream::connect(&addr).unwrap();
    let wrong = Secret::random().unwrap();
    let e = auth::connect(&mut s, &wrong, VERTICAL_CTX, &hello).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    // 3. A replay: a valid answer to one challenge, sent on a new connection.
    let key = metampi::auth::secret_from_env().unwrap();
    let mut first = TcpStream::connect(&addr).unwrap();
    let mut na1 = [0u8; auth::NONCE];
    first.read_exact(&mut na1).unwrap();
    let nc = auth::nonce().unwrap();
    let mut recorded = nc.to_vec();
    recorded.extend_from_slice(&key.connector_tag(VERTICAL_CTX, &na1, &nc, &hello));
    recorded.extend_from_slice(&hello);
    drop(first);
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut na2 = [0u8; auth::NONCE];
    s.read_exact(&mut na2).unwrap();
    assert_ne!(na1, na2, "challenges must differ");
    s.write_all(&recorded).unwrap();
    assert!(refused(s), "a replayed handshake was accepted");
}

#[test]
fn strangers_wrong_secrets_and_replays_are_refused() {
    Ranks::new(4)
        .meta(CONFIG)
        .run("strangers_wrong_secrets_and_replays_are_refused", |world| {
            if world.rank() == 0 {
                attacks();
            }
            // The job is undisturbed: traffic across the sites still flows.
            world.barrier();
            let peer = (world.rank() + 2) % 4;
            let (got, _) = metampi::point_to_point::send_receive::<u64, _, _, _>(
                &(world.rank() as u64 * 11),
                &world.process_at_rank(peer),
                &world.process_at_rank(peer),
            );
            assert_eq!(got, peer as u64 * 11);
            world.barrier();
        });
}

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A stranger that holds 600 silent connections to a router costs it a bounded number of
/// descriptors (the oldest unproven connections make room for new ones), and the job's own
/// traffic across the sites goes on.
#[test]
fn silent_connections_held_open_cost_a_router_a_bounded_number_of_descriptors() {
    const NAME: &str = "silent_connections_held_open_cost_a_router_a_bounded_number_of_descriptors";
    // Its own ports: the tests of this file run at once.
    let config = CONFIG.replace("PORTBASE 25900", "PORTBASE 25940");
    Ranks::new(4).meta(&config).run(NAME, |world| {
        world.barrier();
        let mut held = Vec::new();
        if world.rank() == 0 {
            let addr = router_addr();
            for _ in 0..600 {
                held.push(TcpStream::connect(&addr).unwrap());
            }
        }
        world.barrier();
        let peer = (world.rank() + 2) % 4;
        for round in 0..20u64 {
            let (got, _) = metampi::point_to_point::send_receive::<u64, _, _, _>(
                &(world.rank() as u64 * 1000 + round),
                &world.process_at_rank(peer),
                &world.process_at_rank(peer),
            );
            assert_eq!(got, peer as u64 * 1000 + round);
        }
        if world.rank() == 0 {
            let routers = processes_of(NAME, Some("METAMPI_ROUTER_SPEC="));
            assert!(!routers.is_empty(), "no router found");
            for pid in routers {
                let fds = descriptors(pid);
                // 256 unproven connections at most, beside its ranks, links and files.
                assert!(fds < 256 + 64, "router {pid} holds {fds} descriptors");
            }
        }
        world.barrier();
        drop(held);
    });
}
