//! Regression test for the SC99 failure (seed 000, Pickles et al.): servers
//! polling with `MPI_Recv` on any source and any tag intercepted messages of
//! a collective operation under PACX-MPI.
//!
//! Here a server rank loops on `receive` with any source and any tag while
//! the client ranks run collectives among themselves and over the world
//! (the server and the clients alike through nonblocking collectives, which
//! the server starts before polling), and send it requests. Every message the server receives must be
//! a well-formed client request; collective traffic travels in a context of
//! its own and must never reach it.

use metampi::collective::SystemOperation;
use metampi::request::scope;
use metampi::topology::{Color, SimpleCommunicator};
use metampi::traits::*;
use metampi_testkit::Ranks;

const MAGIC: u64 = 0x5c99_5c99;
const REQUESTS: u64 = 40;

#[test]
fn sc99_server_shm_4() {
    Ranks::new(4).run("sc99_server_shm_4", server_and_clients);
}

#[test]
fn sc99_server_shm_7() {
    Ranks::new(7).run("sc99_server_shm_7", server_and_clients);
}

#[test]
fn sc99_server_tcp_5() {
    Ranks::new(5)
        .force_tcp(true)
        .run("sc99_server_tcp_5", server_and_clients);
}

/// As at SC99: the server's requests and the collectives cross sites
/// through routers (1 + 3 + 4 ranks on three emulated meta hosts).
#[test]
fn sc99_server_three_sites() {
    let config = "PORTBASE 32200\n\
        METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; }\n\
        METAHOST c { LAUNCH = local; NPROCS = 4; NODES = c0, c1; }\n\
        PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n";
    Ranks::new(8)
        .meta(config)
        .run("sc99_server_three_sites", server_and_clients);
}

fn server_and_clients(world: &SimpleCommunicator) {
    let (n, me) = (world.size(), world.rank());
    let server = n - 1;
    let clients = world.split_by_color(if me == server {
        Color::undefined()
    } else {
        Color::with_value(0)
    });
    // World collectives the server takes part in while it polls. The long
    // broadcast runs as several messages, some to and through the server.
    let mut long = if me == 0 {
        vec![7u64; 30_000]
    } else {
        vec![0u64; 30_000]
    };
    let mine = [me as i64; 8];
    let mut sum = [0i64; 8];
    let mut gathered = vec![0i64; n as usize];
    let me64 = me as i64;
    if me == server {
        scope(|s| {
            let r1 = world
                .process_at_rank(0)
                .immediate_broadcast_into(s, &mut long[..]);
            let r2 =
                world.immediate_all_reduce_into(s, &mine[..], &mut sum[..], SystemOperation::sum());
            let r3 = world.immediate_barrier();
            let r4 = world.immediate_all_gather_into(s, &me64, &mut gathered[..]);
            serve(world, server);
            r4.wait();
            r3.wait();
            r2.wait();
            r1.wait();
        });
    } else {
        let clients = clients.expect("clients have a colour");
        // The same immediate calls as the server's (a blocking collective
        // does not match an immediate one, MPI-3.1 §5.12), waited for
        // between the rounds of requests.
        client(world, &clients, server, me);
        scope(|s| {
            world
                .process_at_rank(0)
                .immediate_broadcast_into(s, &mut long[..])
                .wait();
            client(world, &clients, server, me + 1000);
            world
                .immediate_all_reduce_into(s, &mine[..], &mut sum[..], SystemOperation::sum())
                .wait();
            world.immediate_barrier().wait();
            world
                .immediate_all_gather_into(s, &me64, &mut gathered[..])
                .wait();
        });
        // Tell the server this client is done.
        world
            .process_at_rank(server)
            .send_with_tag(&[MAGIC, me as u64, u64::MAX][..], 1);
    }
    assert!(long.iter().all(|&x| x == 7));
    assert_eq!(sum, [(0..n as i64).sum::<i64>(); 8]);
    assert_eq!(gathered, (0..n as i64).collect::<Vec<_>>());
    world.barrier();
}

/// Answers requests until every client has said it is done; every message
/// must be a request `[MAGIC, client, seq]`.
fn serve(world: &SimpleCommunicator, server: i32) {
    let mut done = 0;
    let mut served = vec![0u64; server as usize];
    while done < server {
        let (msg, st) = world.any_process().receive_vec::<u64>();
        let from = st.source_rank();
        assert!(
            msg.len() == 3 && msg[0] == MAGIC && msg[1] == from as u64,
            "the server received a message that is not a request (collective traffic?): \
             {} values from rank {from} with tag {}",
            msg.len(),
            st.tag()
        );
        if msg[2] == u64::MAX {
            done += 1;
            continue;
        }
        served[from as usize] += 1;
        world
            .process_at_rank(from)
            .send_with_tag(&(msg[2] * 2), st.tag());
    }
    assert!(served.iter().all(|&k| k == 2 * REQUESTS));
}

/// Collectives among the clients, with requests to the server in between
/// (tags vary, as the SC99 code used tags for request types).
fn client(world: &SimpleCommunicator, clients: &SimpleCommunicator, server: i32, salt: i32) {
    let (k, me) = (clients.size(), clients.rank());
    for i in 0..REQUESTS {
        let seq = i + salt as u64 * 100;
        let tag = (i % 5) as i32;
        world
            .process_at_rank(server)
            .send_with_tag(&[MAGIC, world.rank() as u64, seq][..], tag);
        match i % 4 {
            0 => {
                let mut v = vec![me as u64; 5000];
                clients
                    .process_at_rank((i as i32) % k)
                    .broadcast_into(&mut v[..]);
                assert!(v.iter().all(|&x| x == ((i as i32) % k) as u64));
            }
            1 => {
                let mut s = 0u64;
                clients.all_reduce_into(&(me as u64), &mut s, SystemOperation::sum());
                assert_eq!(s, (0..k as u64).sum::<u64>());
            }
            2 => {
                let send: Vec<u64> = (0..k as u64).collect();
                let mut out = vec![0u64; k as usize];
                clients.all_to_all_into(&send[..], &mut out[..]);
                assert!(out.iter().all(|&x| x == me as u64));
            }
            _ => clients.barrier(),
        }
        let (reply, st) = world.process_at_rank(server).receive_with_tag::<u64>(tag);
        assert_eq!((reply, st.tag()), (seq * 2, tag));
    }
}
