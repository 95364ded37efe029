//! Resolved layouts of the example configurations: ranks, routers, links, options, ports.

use std::time::Duration;

use metampi_config::{
    parse_pacx_str, parse_str, Address, ByteOrder, Compression, Device, Format, Launch, PairOrigin,
    PortOrigin,
};

const THREE_SITES: &str = include_str!("data/three_sites.cfg");
const MPICH_STYLE: &str = include_str!("data/mpich_style.cfg");
const PACX_SEED: &str = include_str!("data/pacx_seed.hosts");

fn lo() -> Address {
    Address::Ip([127, 0, 0, 1].into())
}

#[test]
fn three_sites_ranks_and_nodes() {
    let cfg = parse_str("three_sites.cfg", THREE_SITES).expect("parses");
    let l = cfg.layout();
    assert_eq!(l.world_size, 12);
    let hosts: Vec<(&str, std::ops::Range<usize>)> = l
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h.ranks.clone()))
        .collect();
    assert_eq!(hosts, [("alpha", 0..4), ("beta", 4..10), ("gamma", 10..12)]);
    let beta: Vec<(&str, usize, Option<u32>)> = l.hosts[1]
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.nprocs, n.max_procs))
        .collect();
    assert_eq!(
        beta,
        [
            ("beta0", 2, Some(2)),
            ("beta1", 2, None),
            ("beta2", 2, None)
        ]
    );
    assert!(l.hosts.iter().all(|h| h.launch == Launch::Local));
    assert_eq!(l.hosts[2].byte_order, ByteOrder::Little);
    // LAUNCH = local and no addresses: everything is on the loopback interface.
    assert!(l
        .hosts
        .iter()
        .flat_map(|h| &h.nodes)
        .all(|n| n.address == lo()));
    assert_eq!(
        cfg.globals.secret_file.as_deref(),
        Some("~/.config/metampi/secret")
    );
    assert_eq!(cfg.globals.port_base, 29000);
    for (rank, host) in [(0, 0), (3, 0), (4, 1), (9, 1), (10, 2), (11, 2)] {
        assert_eq!(l.host_of_rank(rank), Some(host), "rank {rank}");
    }
    assert_eq!(l.host_of_rank(12), None);
}

#[test]
fn three_sites_routers_and_links() {
    let cfg = parse_str("three_sites.cfg", THREE_SITES).expect("parses");
    let l = cfg.layout();
    // alpha<->beta and alpha<->gamma: one router each way (from '<->'); beta->gamma two,
    // gamma->beta one.
    let per_pair: Vec<(usize, usize, usize)> = cfg
        .pairs
        .iter()
        .map(|p| (p.from, p.to, p.routers.len()))
        .collect();
    assert_eq!(
        per_pair,
        [
            (0, 1, 1),
            (0, 2, 1),
            (1, 0, 1),
            (1, 2, 2),
            (2, 0, 1),
            (2, 1, 1)
        ]
    );
    let origins: Vec<PairOrigin> = cfg.pairs.iter().map(|p| p.origin).collect();
    assert_eq!(
        origins,
        [
            PairOrigin::Explicit,
            PairOrigin::Explicit,
            PairOrigin::Bidirectional,
            PairOrigin::Explicit,
            PairOrigin::Bidirectional,
            PairOrigin::Explicit
        ]
    );
    assert_eq!(l.routers.len(), 7);
    assert_eq!(l.links.len(), 8);

    // Options come from the PAIR and apply to both directions of a '<->' link.
    let ab = l.links_between(0, 1).next().expect("alpha->beta");
    let ba = l.links_between(1, 0).next().expect("beta->alpha");
    for k in [ab, ba] {
        assert_eq!(
            k.options.bandwidth.map(|b| b.bits_per_sec()),
            Some(1_000_000_000)
        );
        assert_eq!(k.options.latency, Some(Duration::from_millis(5)));
        assert_eq!(k.options.compression, Compression::Lz4);
    }
    let ag = l.links_between(0, 2).next().expect("alpha->gamma");
    assert_eq!(
        ag.options.bandwidth.map(|b| b.bits_per_sec()),
        Some(2_000_000)
    );
    assert_eq!(ag.options.compression, Compression::Zstd);
    let bg: Vec<_> = l.links_between(1, 2).collect();
    assert_eq!(bg.len(), 2);
    assert!(bg
        .iter()
        .all(|k| k.options.bundle_deadline == Some(Duration::from_micros(200))));
    let gb: Vec<_> = l.links_between(2, 1).collect();
    assert!(
        gb.iter()
            .all(|k| k.options.bundle_deadline.is_none()
                && k.options.compression == Compression::Auto)
    );

    // The two-to-one setup: gamma's single router drives both links, and each ends at the
    // beta router on the node it names.
    let g_router = l.routers_between(2, 1).next().expect("gamma->beta router");
    assert_eq!(g_router.links_out.len(), 2);
    let b_routers: Vec<usize> = l.routers_between(1, 2).map(|r| r.id).collect();
    let peers: Vec<usize> = gb.iter().map(|k| k.peer_router).collect();
    assert_eq!(peers, b_routers);
    assert_eq!(g_router.listen.len(), 2);

    // Ports count up from PORTBASE, all distinct on the shared loopback address.
    let mut ports: Vec<u16> = l.links.iter().map(|k| k.port).collect();
    assert_eq!(ports[0], 29000);
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 8);
    assert!(cfg
        .pairs
        .iter()
        .flat_map(|p| &p.routers)
        .flat_map(|r| &r.links)
        .all(|k| k.port_origin == PortOrigin::Auto));
}

#[test]
fn three_sites_table() {
    let cfg = parse_str("three_sites.cfg", THREE_SITES).expect("parses");
    let table = cfg.layout().to_string();
    println!("{table}");
    assert!(
        table.starts_with("meta computer: 3 meta hosts, 5 nodes, 12 ranks, 7 routers, 8 links\n")
    );
    assert!(
        table.contains("  1  beta   4-9    6      3      auto  native     local\n"),
        "{table}"
    );
    assert!(
        table.contains("1Gbit/s +5ms compress=lz4 tls=off"),
        "{table}"
    );
    assert!(
        table.contains("100Mbit/s +20ms compress=auto tls=off bundle=200us"),
        "{table}"
    );
    assert!(table.lines().all(|line| !line.ends_with(' ')));
}

#[test]
fn mpich_style_file() {
    let cfg = parse_str("mpich_style.cfg", MPICH_STYLE).expect("parses");
    let a = &cfg.hosts[0];
    assert_eq!(a.device, Device::Usock);
    let nodes: Vec<(&str, Option<u32>)> = a
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.max_procs))
        .collect();
    assert_eq!(
        nodes,
        [("pc-01", Some(2)), ("pc-02", Some(2)), ("pc-03", Some(2))]
    );
    assert_eq!(a.nodes[1].addresses, [Address::Ip([10, 0, 0, 10].into())]);
    assert_eq!(
        a.env,
        [
            ("OMP_NUM_THREADS".into(), "1".into()),
            ("RUST_LOG".into(), "info".into())
        ]
    );
    assert_eq!(a.exec_path.as_deref(), Some("/opt/app/bin"));
    // FRONTEND given and no LAUNCH: started over ssh from the frontend, as MetaMPICH did.
    assert_eq!(a.launch, Launch::Ssh("pc-01".into()));
    let b = &cfg.hosts[1];
    assert_eq!(b.device, Device::Shmem);
    assert_eq!(b.nprocs, 4, "MAX = the node's MAXPROCS");
    assert_eq!(b.launch, Launch::Ssh("bigsmp.example.org".into()));
    assert_eq!(cfg.globals.router_timeout, Some(Duration::from_secs(20)));

    let l = cfg.layout();
    assert_eq!(l.world_size, 10);
    assert_eq!(
        l.hosts[0].nodes[1].routers.len(),
        1,
        "the router runs where gwA is"
    );
    let fwd = l.links_between(0, 1).next().expect("A->B");
    assert_eq!(
        (fwd.port, fwd.dst_address.clone()),
        (30005, Address::Ip([10, 0, 1, 1].into()))
    );
    let back = l.links_between(1, 0).next().expect("B->A");
    assert_eq!(
        (back.port, back.dst_address.clone()),
        (30000, Address::Ip([10, 0, 0, 10].into()))
    );
    let link = &cfg.pair(0, 1).expect("pair").routers[0].links[0];
    assert_eq!(link.port_origin, PortOrigin::Offset);
}

#[test]
fn pacx_seed_hostfile() {
    let cfg = parse_pacx_str("hostfile", PACX_SEED).expect("parses");
    assert_eq!(cfg.format, Format::Pacx);
    let names: Vec<&str> = cfg.hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["host1", "host2", "host3", "host4"]);
    assert_eq!(cfg.hosts[0].launch, Launch::Manual);
    assert_eq!(
        cfg.hosts[1].launch,
        Launch::Verbatim("rsh host2 mpirun -np 102 ./exename".into())
    );
    let l = cfg.layout();
    // "The two additional communication nodes are not considered in the global numbering".
    assert_eq!(l.world_size, 400);
    assert_eq!(l.hosts[2].ranks, 200..300);
    assert_eq!(l.host_of_rank(399), Some(3));
    // One generated router per ordered pair of machines.
    assert_eq!(l.routers.len(), 12);
    assert_eq!(l.links.len(), 12);
    assert!(cfg.pairs.iter().all(|p| p.origin == PairOrigin::Auto));
    assert!(l
        .links
        .iter()
        .all(|k| k.dst_address == Address::Host(l.hosts[k.to_host].name.clone())));
    // load()'s detection picks the PACX-MPI reader for it.
    assert_eq!(metampi_config::detect_format(PACX_SEED), Format::Pacx);
    assert_eq!(
        metampi_config::parse_auto("hostfile", PACX_SEED).map(|c| c.world_size()),
        Ok(400)
    );
}

#[test]
fn auto_router_fills_missing_pairs() {
    let text = "METAHOST a { LAUNCH = local; NODES = a0, a1; FRONTEND = a1; }\n\
                METAHOST b { LAUNCH = local; NODES = b0; }\n\
                METAHOST c { LAUNCH = local; NODES = c0; }\n\
                PAIR a b 1 - PORT=7100-7101\n\
                a0 <-> b0\n\
                AUTO_ROUTER\n";
    let cfg = parse_str("auto.cfg", text).expect("parses");
    assert!(cfg.globals.auto_router);
    let l = cfg.layout();
    assert_eq!(l.routers.len(), 6);
    // Generated routers run on the FRONTEND node.
    let ac = l.routers_between(0, 2).next().expect("a->c");
    assert_eq!(ac.node, 1);
    // A PAIR's port list is used in link order, forward then backward for '<->'.
    let ab = l.links_between(0, 1).next().expect("a->b");
    let ba = l.links_between(1, 0).next().expect("b->a");
    assert_eq!(ba.port, 7101);
    assert_eq!(ab.port, 7100);
}

#[test]
fn load_detects_format_from_content() {
    let dir = std::env::temp_dir().join(format!("metampi-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let cfg_path = dir.join("three.cfg");
    let hosts_path = dir.join("hostfile");
    std::fs::write(&cfg_path, THREE_SITES).expect("write");
    std::fs::write(&hosts_path, PACX_SEED).expect("write");
    assert_eq!(
        metampi_config::load(&cfg_path).map(|c| c.format),
        Ok(Format::MetaMpich)
    );
    assert_eq!(
        metampi_config::load(&hosts_path).map(|c| c.format),
        Ok(Format::Pacx)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `PAIR A B 0`: the two meta hosts' ranks connect to each other; no
/// routers, no links, both directions, and the table says so. Other pairs
/// keep their routers.
#[test]
fn direct_pairs_have_no_routers() {
    let text = "METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
                METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
                METAHOST c { LAUNCH = local; NPROCS = 1; NODES = c0; }\n\
                PAIR a b 0\n\
                PAIR b a 0 -\n\
                PAIR a c 1\na0 <-> c0\n\
                PAIR b c 1\nb0 <-> c0\n";
    let cfg = parse_str("direct.cfg", text).expect("parses");
    let l = cfg.layout();
    assert_eq!(l.direct, vec![(0, 1)]);
    assert_eq!(l.routers.len(), 4);
    assert!(l.routers.iter().all(|r| r.host == 2 || r.peer == 2));
    assert!(cfg.pair(0, 1).is_some_and(|p| p.routers.is_empty()));
    assert!(cfg.pair(1, 0).is_some_and(|p| p.routers.is_empty()));
    let table = l.to_string();
    assert!(
        table.contains("direct pairs (ranks connect to each other, no routers)\n  PAIR     RANKS  RANKS\n  a <-> b  0-1    2-3\n"),
        "{table}"
    );
    // One direct PAIR makes both directions direct.
    let one = text.replace("PAIR b a 0 -\n", "");
    let cfg = parse_str("direct.cfg", &one).expect("parses");
    assert!(cfg.pair(1, 0).is_some_and(|p| p.routers.is_empty()));
    assert_eq!(cfg.layout().direct, vec![(0, 1)]);
}
