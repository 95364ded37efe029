//! `METAMPI_ASYNC_PROGRESS=1`: a nonblocking send goes on while its sender computes, making no
//! MPI call. The sender posts a send too long for any eager path (a rendezvous over TCP, which
//! needs the sender to answer the receiver's go-ahead), then waits outside MPI until the
//! receiver says through a file that the message arrived. Without the progress thread the
//! file never comes (checked by hand: the test then fails after its 60 s limit).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use metampi::traits::*;
use metampi_testkit::{is_rank, Ranks};

const LEN: usize = 16 << 20;

// The test's own variable (set by the parent for its ranks), not a METAMPI_* setting.
#[allow(clippy::disallowed_methods)]
fn flag_path() -> PathBuf {
    PathBuf::from(std::env::var_os("ASYNC_TEST_FLAG").expect("the test sets the flag path"))
}

fn sender_waits_outside_mpi(world: &metampi::topology::SimpleCommunicator) {
    let data = vec![7u8; LEN];
    if world.rank() == 0 {
        metampi::request::scope(|scope| {
            let req = world.process_at_rank(1).immediate_send(scope, &data[..]);
            // "Computing": no MPI call until the receiver has the whole message.
            let start = Instant::now();
            while !flag_path().exists() {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the receiver never got the message while its sender made no MPI call"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            req.wait();
        });
    } else {
        let (got, _) = world.process_at_rank(0).receive_vec::<u8>();
        assert!(got.len() == LEN && got.iter().all(|&b| b == 7));
        std::fs::write(flag_path(), b"got it").unwrap();
    }
    world.barrier();
}

#[test]
fn a_send_moves_while_its_sender_computes() {
    let flag = std::env::temp_dir().join(format!("metampi-async-flag-{}", std::process::id()));
    if !is_rank() {
        let _ = std::fs::remove_file(&flag);
    }
    Ranks::new(2)
        .force_tcp(true)
        .env("METAMPI_ASYNC_PROGRESS", "1")
        .env("ASYNC_TEST_FLAG", &flag)
        .timeout(Duration::from_secs(120))
        .run("a_send_moves_while_its_sender_computes", |world| {
            sender_waits_outside_mpi(world)
        });
    if !is_rank() {
        let _ = std::fs::remove_file(&flag);
    }
}
