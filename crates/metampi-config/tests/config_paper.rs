//! The figures of the MetaMPICH paper (Pöppe, Schuch, Bemmerl) parse verbatim and resolve
//! to the layout the paper describes.

use metampi_config::{parse_str, Address, Device, Launch, PairOrigin};

/// Figure 3, "Definition of a Meta Host", verbatim.
const FIG3: &str = "METAHOST metahost_A {
    TYPE=ch_smi;
    NODES= node_a,
           node_b (192.168.0.1),
           node_c,
           node_d (ATM_PVC 0.0.42);
}
";

/// Figure 4, "Definition of the Connections between two Meta Hosts", verbatim.
const FIG4: &str = "PAIR metahost_A metahost_B 2 -
192.168.0.1 -> 192.168.0.2
ATM_PVC 0.0.42 -> ATM_PVC 0.0.42

PAIR metahost_B metahost_A 1 -
192.168.0.2 -> 192.168.0.1 \\
  ATM_PVC 0.0.42 -> ATM_PVC 0.0.42
";

/// The meta computer of Fig. 2: meta host A (Fig. 3) with 8 processes, meta host B an
/// SMP machine with 8 processors (section 4.1), connected as in Fig. 4.
fn fig2() -> String {
    format!("NUMHOSTS 2\nmetahost_A 8\nmetahost_B 8\n\n{FIG3}\n{FIG4}")
}

fn ip(s: &str) -> Address {
    Address::Ip(s.parse().expect("ip"))
}

fn pvc() -> Address {
    Address::AtmPvc("0.0.42".into())
}

#[test]
fn figure_3_alone_is_a_complete_meta_computer() {
    let cfg = parse_str("fig3.cfg", FIG3).expect("Fig. 3 parses");
    assert_eq!(cfg.hosts.len(), 1);
    let a = &cfg.hosts[0];
    assert_eq!(a.name, "metahost_A");
    assert_eq!(a.device, Device::Smi);
    let names: Vec<&str> = a.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node_a", "node_b", "node_c", "node_d"]);
    assert_eq!(a.nodes[1].addresses, [ip("192.168.0.1")]);
    assert_eq!(a.nodes[3].addresses, [pvc()]);
    // No count given anywhere: one process per node.
    assert_eq!(cfg.world_size(), 4);
    assert!(cfg.pairs.is_empty());
}

#[test]
fn figure_4_alone_names_unknown_meta_hosts() {
    let e = parse_str("fig4.cfg", FIG4).unwrap_err();
    assert_eq!(
        e.to_string(),
        "fig4.cfg:1:6: PAIR names unknown meta host 'metahost_A' (known: none)"
    );
}

#[test]
fn figure_2_meta_computer_layout() {
    let text = fig2();
    assert!(text.contains(FIG3) && text.contains(FIG4));
    let cfg = parse_str("mymetacomp.cfg", &text).expect("parses");
    let l = cfg.layout();

    // PACX numbering: A holds ranks 0-7, B ranks 8-15; routers have none.
    assert_eq!(l.world_size, 16);
    assert_eq!(
        (l.hosts[0].name.as_str(), l.hosts[0].ranks.clone()),
        ("metahost_A", 0..8)
    );
    assert_eq!(
        (l.hosts[1].name.as_str(), l.hosts[1].ranks.clone()),
        ("metahost_B", 8..16)
    );
    let counts: Vec<usize> = l.hosts[0].nodes.iter().map(|n| n.nprocs).collect();
    assert_eq!(counts, [2, 2, 2, 2]);
    assert_eq!(l.hosts[0].nodes[1].ranks, 2..4);
    // B is not defined by a METAHOST block: one SMP node of the same name (MetaMPICH).
    assert_eq!(cfg.hosts[1].nodes.len(), 1);
    assert_eq!(cfg.hosts[1].nodes[0].name, "metahost_B");
    assert_eq!(cfg.hosts[1].nodes[0].addresses, [ip("192.168.0.2"), pvc()]);
    for rank in 0..16 {
        assert_eq!(l.host_of_rank(rank), Some(usize::from(rank >= 8)));
    }
    assert_eq!(l.host_of_rank(16), None);

    // "a two-to-one router configuration": two routers on A (on node_b and node_d, where
    // the interfaces are), one on B.
    assert_eq!(l.routers.len(), 3);
    let a_routers: Vec<(usize, usize)> = l
        .routers_between(0, 1)
        .map(|r| (r.node, r.links_out.len()))
        .collect();
    assert_eq!(a_routers, [(1, 1), (3, 1)]);
    let b_routers: Vec<(usize, usize)> = l
        .routers_between(1, 0)
        .map(|r| (r.node, r.links_out.len()))
        .collect();
    assert_eq!(b_routers, [(0, 2)]);
    assert_eq!(l.hosts[0].nodes[1].routers, [0]);
    assert_eq!(l.hosts[0].nodes[3].routers, [1]);
    assert_eq!(l.hosts[1].nodes[0].routers, [2]);

    // Links: IP and ATM in each direction; each ends at the router on the far node.
    assert_eq!(l.links.len(), 4);
    let ab: Vec<(Address, Address, usize)> = l
        .links_between(0, 1)
        .map(|k| (k.src_address.clone(), k.dst_address.clone(), k.peer_router))
        .collect();
    assert_eq!(
        ab,
        [(ip("192.168.0.1"), ip("192.168.0.2"), 2), (pvc(), pvc(), 2)]
    );
    let ba: Vec<(Address, Address, usize)> = l
        .links_between(1, 0)
        .map(|k| (k.src_address.clone(), k.dst_address.clone(), k.peer_router))
        .collect();
    assert_eq!(
        ba,
        [(ip("192.168.0.2"), ip("192.168.0.1"), 0), (pvc(), pvc(), 1)]
    );
    // Ports are numbered from the default PORTBASE; each router listens for its links.
    let ports: Vec<u16> = l.links.iter().map(|k| k.port).collect();
    assert_eq!(ports, [28000, 28001, 28002, 28003]);
    assert_eq!(l.routers[2].listen.len(), 2);
    assert_eq!(l.routers[0].listen[0].port, 28002);

    assert!(cfg.pairs.iter().all(|p| p.origin == PairOrigin::Explicit));
    assert_eq!(cfg.hosts[0].launch, Launch::Local);
}

#[test]
fn section_4_1_one_process_on_the_router_nodes() {
    // "it is a good idea to run only one application process on node_b and node_d".
    let text = fig2()
        .replace("node_b (", "node_b 1 (")
        .replace("node_d (", "node_d 1 (");
    let cfg = parse_str("mymetacomp.cfg", &text).expect("parses");
    let l = cfg.layout();
    let counts: Vec<usize> = l.hosts[0].nodes.iter().map(|n| n.nprocs).collect();
    assert_eq!(counts, [3, 1, 3, 1]);
    let ranks: Vec<_> = l.hosts[0].nodes.iter().map(|n| n.ranks.clone()).collect();
    assert_eq!(ranks, [0..3, 3..4, 4..7, 7..8]);
    assert_eq!(l.locate(3), Some((0, 1)));
    assert_eq!(l.locate(9), Some((1, 0)));
}

#[test]
fn node_ranges_from_the_paper() {
    // "p4-00 - p4-63 for example would denominate 64 nodes from the cluster p4."
    let cfg = parse_str("p4.cfg", "METAHOST p4 { NODES = p4-00 - p4-63; }").expect("parses");
    let nodes = &cfg.hosts[0].nodes;
    assert_eq!(nodes.len(), 64);
    assert_eq!(nodes[0].name, "p4-00");
    assert_eq!(nodes[63].name, "p4-63");
}

#[test]
fn layout_table_for_the_paper_example() {
    let cfg = parse_str("mymetacomp.cfg", &fig2()).expect("parses");
    let table = cfg.layout().to_string();
    let expected = "\
meta computer: 2 meta hosts, 5 nodes, 16 ranks, 3 routers, 4 links

meta hosts
  #  HOST        RANKS  PROCS  NODES  TYPE    BYTEORDER  LAUNCH
  0  metahost_A  0-7    8      4      ch_smi  native     local
  1  metahost_B  8-15   8      1      auto    native     local

nodes
  HOST        NODE        ADDRESS         MAXPROCS  PROCS  RANKS  ROUTERS
  metahost_A  node_a      node_a          -         2      0-1    -
  metahost_A  node_b      192.168.0.1     -         2      2-3    r0
  metahost_A  node_c      node_c          -         2      4-5    -
  metahost_A  node_d      ATM_PVC 0.0.42  -         2      6-7    r1
  metahost_B  metahost_B  192.168.0.2     -         8      8-15   r2

routers (no world rank)
  ROUTER  PAIR                         HOST        NODE        LINKS OUT  LISTENS ON
  r0      metahost_A -> metahost_B #0  metahost_A  node_b      l0         192.168.0.1:28002 (l2)
  r1      metahost_A -> metahost_B #1  metahost_A  node_d      l1         ATM_PVC 0.0.42:28003 (l3)
  r2      metahost_B -> metahost_A #0  metahost_B  metahost_B  l2 l3      192.168.0.2:28000 (l0), ATM_PVC 0.0.42:28001 (l1)

links
  LINK  ROUTERS   FROM                                  TO                                    PORT   OPTIONS
  l0    r0 -> r2  metahost_A/node_b 192.168.0.1         metahost_B/metahost_B 192.168.0.2     28000  compress=auto tls=off
  l1    r1 -> r2  metahost_A/node_d ATM_PVC 0.0.42      metahost_B/metahost_B ATM_PVC 0.0.42  28001  compress=auto tls=off
  l2    r2 -> r0  metahost_B/metahost_B 192.168.0.2     metahost_A/node_b 192.168.0.1         28002  compress=auto tls=off
  l3    r2 -> r1  metahost_B/metahost_B ATM_PVC 0.0.42  metahost_A/node_d ATM_PVC 0.0.42      28003  compress=auto tls=off
";
    assert_eq!(table, expected, "\n{table}");
}
