//! One memory budget per router (`METAMPI_ROUTER_MEMORY`): many senders push
//! megabyte messages through a slow emulated line, more than the budget, and the
//! router that carries them holds no more than its budget for messages (its own
//! count, and its private resident memory) while every message arrives intact.

use std::time::Duration;

use metampi::traits::*;
use metampi_testkit::{stats_number as number, Ranks, StatsDir};

const NAME: &str = "many_senders_share_one_router_budget";
const SENDERS: usize = 12;
const MESSAGES: usize = 2;
const LEN: usize = 1 << 20;
const BUDGET: u64 = 16 << 20;

/// Twelve senders on site a, one receiver on site b, over 200 Mbit/s: the
/// senders offer 24 MiB at once, the line takes 25 MB/s.
const CONFIG: &str = "PORTBASE 28300\n\
     METAHOST a { LAUNCH = local; NPROCS = 12; NODES = a0; }\n\
     METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }\n\
     PAIR a b 1 - { BANDWIDTH = 200Mbit; LATENCY = 20ms; COMPRESSION = off; }\n\
     a0 <-> b0\n";

fn message(src: usize, k: usize) -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + src * 31 + k) as u8).collect()
}

#[test]
fn many_senders_share_one_router_budget() {
    let dir = StatsDir::new(NAME);
    let d = dir.path().to_path_buf();
    let outcome = Ranks::new(SENDERS + 1)
        .meta(CONFIG)
        .router_stats(&dir)
        .env("METAMPI_ROUTER_MEMORY", "16M")
        .timeout(Duration::from_secs(180))
        .outcome(NAME, move |world| {
            let me = world.rank() as usize;
            if me < SENDERS {
                for k in 0..MESSAGES {
                    let m = message(me, k);
                    world
                        .process_at_rank(SENDERS as i32)
                        .send_with_tag(&m[..], k as i32);
                }
            } else {
                let mut got = [0usize; SENDERS];
                for _ in 0..SENDERS * MESSAGES {
                    let (m, st) = world.any_process().receive_vec::<u8>();
                    let src = st.source_rank() as usize;
                    assert_eq!(st.tag() as usize, got[src], "from {src}: out of order");
                    assert!(m == message(src, got[src]), "from {src}: damaged");
                    got[src] += 1;
                }
                // The routers write their statistics twice a second.
                std::thread::sleep(Duration::from_millis(1200));
                let text = std::fs::read_to_string(d.join("router-0.json")).unwrap_or_default();
                assert_eq!(number(&text, "budget_bytes"), Some(BUDGET), "{text}");
                // Its own count: at most the budget and one frame it was in the middle of.
                let peak = number(&text, "peak_held_bytes").expect("peak in statistics");
                assert!(peak <= BUDGET + LEN as u64, "held {peak} bytes: {text}");
                // It was used: the senders offered more than the line could take at once.
                assert!(peak >= BUDGET / 4, "held only {peak} bytes: {text}");
                // What the process holds of its own, code and start-up included.
                let anon = number(&text, "peak_anon_kb").expect("memory in statistics") << 10;
                assert!(anon <= BUDGET + (16 << 20), "private memory {anon}: {text}");
            }
            world.barrier();
        });
    let Some(outcome) = outcome else {
        return; // a rank or a router of the job
    };
    if let Some(f) = &outcome.failure {
        panic!("{NAME} failed: {f}");
    }
}
