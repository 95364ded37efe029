//! A real slow line between two sites: two network namespaces whose veth
//! pair `tc tbf` limits to 2 Mbit/s each way (SC97's line). A 256 KiB frame
//! takes a second on it, so messages streamed across leave seconds of frames
//! queued in the routers' sockets, longer than the retransmission timeout and
//! than any round trip measured with small frames; TCP also pauses inside
//! frames while it recovers the token bucket's drops. The messages must
//! arrive intact and be sent once: the wire protocol's timers used to resend
//! whole windows of such queued frames, over and over, and the job never
//! finished. Skipped, with a message, where namespaces or `tc` are missing.

use std::time::Duration;

use metampi::traits::*;
use metampi_testkit::{is_rank, link_total, NetnsPair, Ranks, StatsDir};

const NAME: &str = "a_slow_line_queues_without_resending";
const RATE: &str = "2mbit";
const LEN: usize = 256 << 10;
const MESSAGES: usize = 8;

#[test]
fn a_slow_line_queues_without_resending() {
    let stats = StatsDir::new(NAME);
    let mut _ns = None;
    let cfg = if is_rank() {
        String::new() // ranks do not read it
    } else {
        let made = NetnsPair::create(NAME).and_then(|ns| ns.limit(RATE).map(|()| ns));
        let ns = match made {
            Ok(ns) => ns,
            Err(e) => {
                eprintln!("SKIPPED {NAME}: cannot make a shaped pair of namespaces here ({e})");
                return;
            }
        };
        let cfg = format!(
            "PORTBASE 29600\n\
             METAHOST a {{ LAUNCH = netns {}; NPROCS = 1; NODES = a0 ({}); }}\n\
             METAHOST b {{ LAUNCH = netns {}; NPROCS = 1; NODES = b0 ({}); }}\n\
             PAIR a b 1 - {{ COMPRESSION = off; }}\na0 <-> b0\n",
            ns.names[0], ns.addrs[0], ns.names[1], ns.addrs[1]
        );
        _ns = Some(ns);
        cfg
    };
    let dir = stats.path().to_path_buf();
    let outcome = Ranks::new(2)
        .meta(&cfg)
        .router_stats(&stats)
        .timeout(Duration::from_secs(120))
        .outcome(NAME, move |world| {
            let fill = |k: usize| -> Vec<u8> { (0..LEN).map(|i| (i * 31 + k * 7) as u8).collect() };
            if world.rank() == 0 {
                // 2 MiB at 0.25 MB/s: the last frame waits about 8 s.
                let bufs: Vec<Vec<u8>> = (0..MESSAGES).map(fill).collect();
                let peer = world.process_at_rank(1);
                metampi::request::scope(|scope| {
                    let reqs: Vec<_> = bufs
                        .iter()
                        .enumerate()
                        .map(|(k, b)| peer.immediate_send_with_tag(scope, &b[..], k as i32))
                        .collect();
                    for r in reqs {
                        r.wait();
                    }
                });
            } else {
                let peer = world.process_at_rank(0);
                for k in 0..MESSAGES {
                    let (got, status) = peer.receive_vec::<u8>();
                    assert_eq!(status.tag(), k as i32);
                    assert!(got == fill(k), "message {k} arrived changed");
                }
            }
            world.barrier();
            if world.rank() == 0 {
                // The routers write their statistics every second.
                std::thread::sleep(Duration::from_millis(2500));
                let sent = link_total(&dir, "out", "payload_raw_out");
                assert!(sent >= (MESSAGES * LEN) as u64, "statistics: {sent} bytes");
                let resent = link_total(&dir, "out", "retransmits");
                let timeouts = link_total(&dir, "out", "timeouts");
                let nacks = link_total(&dir, "out", "nacks_in");
                assert_eq!(
                    (resent, timeouts, nacks),
                    (0, 0, 0),
                    "frames resent, timeouts, nacks on a line that lost nothing"
                );
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
