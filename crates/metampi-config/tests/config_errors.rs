//! Every error path: the position (file:line:col) and the message, in full.

use metampi_config::{parse_pacx_str, parse_str, ErrorKind};

fn err(text: &str) -> String {
    match parse_str("t.cfg", text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Two local meta hosts, ready for a PAIR section to be appended.
const TWO: &str = "METAHOST A { LAUNCH = local; NODES = a0, a1; }\nMETAHOST B { LAUNCH = local; NODES = b0, b1; }\n";

#[test]
fn unclosed_metahost_block() {
    let text = "NUMHOSTS 2\nA 4\nB 4\nMETAHOST A {\n    TYPE = ch_p4;\n    NODES = a0 (10.0.0.1),\n            a1;\n    LAUNCH = ssh a0;\n    # the closing brace is missing\n\n\n        PAIR A B 1 -\n10.0.0.1 -> B\n";
    let e = parse_str("cluster.cfg", text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cluster.cfg:12:9: expected '}' to close METAHOST block 'A' opened at 4:1, found 'PAIR'"
    );
    assert_eq!((e.line, e.col), (12, 9));
    assert!(matches!(
        e.kind,
        ErrorKind::UnclosedBlock {
            block: "METAHOST",
            ..
        }
    ));
    assert_eq!(
        e.snippet(text).as_deref(),
        Some("        PAIR A B 1 -\n        ^")
    );
    assert_eq!(
        err("METAHOST A { NODES = a0;"),
        "t.cfg:1:25: expected '}' to close METAHOST block 'A' opened at 1:1, found end of file"
    );
    assert_eq!(
        err("METAHOST A { NODES = a0\nPAIR A B 1 -\n"),
        "t.cfg:2:1: expected '}' to close METAHOST block 'A' opened at 1:1, found 'PAIR'"
    );
    assert_eq!(
        err(&format!(
            "{TWO}PAIR A B 1 - {{ LATENCY = 5ms;\nMETAHOST C {{}}\n"
        )),
        "t.cfg:4:1: expected '}' to close PAIR block 'A B' opened at 3:14, found 'METAHOST'"
    );
}

#[test]
fn unknown_keywords() {
    assert_eq!(
        err("METAHOST A { NODE = a0; }"),
        "t.cfg:1:14: unknown keyword 'NODE' in METAHOST block (expected one of TYPE, NODES, ROUTERS, \
         NPROCS, FRONTEND, USER, EXECPATH, EXECNAME, EXECARGS, ENVFILE, ENV, MPIROOT, ROUTEREXEC, \
         DEVOPTS, CONFPATH, CONFNAME, METAKEY, LAUNCH, BYTEORDER, TLSCERT, TLSKEY, TLSCA, TLSPIN, \
         TLSNAME); did you mean 'NODES'?"
    );
    assert_eq!(
        err("METAHOTS A { }"),
        "t.cfg:1:1: unknown keyword 'METAHOTS' at top level (expected one of NUMHOSTS, OPTIONS, \
         CONNECTIONS, METAHOST, PAIR, NICDEF, AUTO_ROUTER, PORTBASE, ROUTERTIMEOUT, SPLITSIZE, \
         ISEND_NUM, HETERO, EXCHANGE_ORDER, SECRET_FILE, LAUNCH, BYTEORDER, BANDWIDTH, LATENCY, \
         COMPRESSION, CHECKSUM, TLS, TLSCERT, TLSKEY, TLSCA, TLSPIN, BUNDLE_DEADLINE); did you mean 'METAHOST'?"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 - BANDWITH=1Gbit\na0 <-> b0\n")),
        "t.cfg:3:14: unknown keyword 'BANDWITH' in PAIR options (expected one of PORT, BANDWIDTH, \
         LATENCY, COMPRESSION, CHECKSUM, TLS, BUNDLE_DEADLINE); did you mean 'BANDWIDTH'?"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 -\na0 <-> b0 SPEED=1Gbit\n")),
        "t.cfg:4:11: unknown keyword 'SPEED' in link options (expected one of PORT, BANDWIDTH, \
         LATENCY, COMPRESSION, CHECKSUM, TLS, BUNDLE_DEADLINE)"
    );
    assert_eq!(
        err("NET sciA TYPE ch_smi\n"),
        "t.cfg:1:1: 'NET' is not supported by metampi: multi-device network definitions are \
         MetaMPICH-specific; metampi picks shared memory or TCP per destination by itself"
    );
    assert!(err("METAHOST A { EXTRAPROCS = a0 : 1 : /bin/x; }")
        .starts_with("t.cfg:1:14: 'EXTRAPROCS' is not supported"));
}

#[test]
fn syntax_errors() {
    assert_eq!(
        err("METAHOST A {\n TYPE = ch_p4\n NODES = x; }"),
        "t.cfg:3:2: expected ';' after the value of TYPE, found 'NODES'"
    );
    assert_eq!(err("METAHOST A { NODES = a0 (10.0.0.1:5); }"), "t.cfg:1:34: expected ',' or ')' (a port belongs on a link endpoint in a PAIR, not on a node address), found ':'");
    assert_eq!(
        err("METAHOST { }"),
        "t.cfg:1:10: expected a meta host name after METAHOST, found '{'"
    );
    assert_eq!(
        err("METAHOST A { LAUNCH = \"ssh {cmd} }"),
        "t.cfg:1:23: unterminated string: expected a closing \" on the same line"
    );
    assert_eq!(
        err("METAHOST A { NODES = a0 ? }"),
        "t.cfg:1:25: unexpected character '?'"
    );
    assert_eq!(
        err("PAIR A B\n"),
        "t.cfg:1:9: expected the number of routers (PAIR A B <n> -), found end of line"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 -\na0 b0\n")),
        "t.cfg:4:4: expected '->' or '<->' between the two ends of a link, found 'b0'"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 -\na0 -> b0 \\\n a1 <-> b1\n")),
        "t.cfg:5:5: expected the same arrow as the other links of this router line (a router line is either all '->' or all '<->'), found '<->'"
    );
    assert_eq!(err("= 3"), "t.cfg:1:1: expected a keyword such as NUMHOSTS, METAHOST, PAIR or a global setting, found '='");
}

#[test]
fn duplicate_meta_hosts() {
    assert_eq!(
        err("METAHOST A { }\nMETAHOST A { }\n"),
        "t.cfg:2:10: duplicate meta host 'A' (first defined at 1:10)"
    );
    assert_eq!(
        err("NUMHOSTS 2\nA 4\nA 2\n"),
        "t.cfg:3:1: duplicate meta host 'A' (first declared at 2:1)"
    );
    assert_eq!(
        err("NUMHOSTS 1\nA 4\nMETAHOST B { }\n"),
        "t.cfg:3:10: meta host 'B' is defined but not declared in the NUMHOSTS header at 1:1 (declared: A)"
    );
    assert_eq!(
        err("NUMHOSTS 3\nA 4\nB 4\nMETAHOST A { }\n"),
        "t.cfg:4:1: NUMHOSTS declares 3 meta host(s) but only 2 are listed before 'METAHOST'"
    );
    assert_eq!(
        err("NUMHOSTS 1\nA 4\nB 4\n"),
        "t.cfg:3:1: NUMHOSTS declares 1 meta host(s) but more are listed ('B')"
    );
    assert_eq!(
        err("# nothing\n"),
        "t.cfg:2:1: no meta hosts: expected a METAHOST block or a NUMHOSTS header"
    );
}

#[test]
fn pair_errors() {
    assert_eq!(
        err(&format!("{TWO}PAIR A C 1 -\na0 -> b0\n")),
        "t.cfg:3:8: PAIR names unknown meta host 'C' (known: A, B)"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 0 - BANDWIDTH=10Mbit\n")),
        "t.cfg:3:10: PAIR A B 0 is direct (the ranks of the two meta hosts connect to each other, no routers): it takes no router program and no link settings; give the PAIR routers to emulate or configure its links"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 0 myrouter\n")),
        "t.cfg:3:10: PAIR A B 0 is direct (the ranks of the two meta hosts connect to each other, no routers): it takes no router program and no link settings; give the PAIR routers to emulate or configure its links"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 0\nPAIR B A 1 -\nb0 -> a0\n")),
        "t.cfg:4:1: PAIR B A has routers but PAIR A B (at 3:1) is direct (0 routers): a direct pair is direct both ways; write `PAIR B A 0` or give both routers"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 0\nPAIR B A 1 -\nb0 <-> a0\n")),
        "t.cfg:5:1: PAIR A B is already defined (at 3:1)"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A A 1 -\na0 -> a1\n")),
        "t.cfg:3:8: PAIR connects meta host 'A' with itself; a PAIR needs two different meta hosts"
    );
    assert_eq!(
        err(&format!(
            "{TWO}PAIR A B 2 -\na0 -> b0\nPAIR B A 1 -\nb0 -> a0\n"
        )),
        "t.cfg:5:1: PAIR A B declares 2 router(s) but only 1 router line follows before 'PAIR'"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 -\n")),
        "t.cfg:4:1: PAIR A B declares 1 router(s) but no router lines follow before end of file"
    );
    assert_eq!(
        err(&format!(
            "{TWO}PAIR A B 1 -\na0 -> b0\na1 -> b1\nPAIR B A 1 -\nb0 -> a0\n"
        )),
        "t.cfg:5:1: PAIR A B declares 1 router(s) but another router line follows"
    );
    assert_eq!(
        err(&format!(
            "{TWO}PAIR A B 1 -\na0 -> b0\nPAIR B A 1 -\nb0 -> a0\nPAIR A B 1 -\na0 -> b0\n"
        )),
        "t.cfg:7:1: PAIR A B is already defined (at 3:1)"
    );
    assert_eq!(
        err(&format!(
            "{TWO}PAIR A B 1 -\na0 <-> b0\nPAIR B A 1 -\nb0 -> a0\n"
        )),
        "t.cfg:4:1: PAIR B A is already defined (at 5:1)"
    );
    assert_eq!(
        err(&format!("{TWO}PAIR A B 1 -\na0 -> b0\n")),
        "t.cfg:2:1: no PAIR section for B -> A: every ordered pair of meta hosts needs one (write \
         'PAIR B A 1 -' and a link line, use '<->' links in 'PAIR A B', or add AUTO_ROUTER)"
    );
}

#[test]
fn link_endpoint_errors() {
    let hosts = "METAHOST A { NODES = a0 (10.0.0.1), a1; }\nMETAHOST B { NODES = b0 (10.0.1.1), b1 (10.0.1.2); }\n";
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\n10.9.9.9 <-> b0\n")),
        "t.cfg:4:1: link endpoint '10.9.9.9' is not a node or node address of meta host 'A' (its nodes: a0(10.0.0.1), a1)"
    );
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\na0 <-> x9(10.0.1.1)\n")),
        "t.cfg:4:8: link endpoint 'x9(10.0.1.1)' is not a node or node address of meta host 'B' (no node named 'x9'; its nodes: b0(10.0.1.1), b1(10.0.1.2))"
    );
    // A node's name mistyped on a one-node meta host is not taken for a host name.
    let one = "METAHOST A { NODES = a0; }\nMETAHOST B { NODES = b0; }\n";
    assert_eq!(
        err(&format!("{one}PAIR A B 1 -\na0 <-> bo\n")),
        "t.cfg:4:8: link endpoint 'bo' is not a node or node address of meta host 'B' (no node named 'bo' (did you mean b0?); a host name that is no node's is written node(address))"
    );
    // A real host name there still is the node's address.
    assert!(parse_str(
        "t.cfg",
        &format!("{one}PAIR A B 1 -\na0 <-> b0.example.org\n")
    )
    .is_ok());
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\na0 -> b0 \\\n a1 -> b1\nPAIR B A 1 -\nb0 -> a0\n")),
        "t.cfg:5:2: expected an endpoint on node 'a0' (all links of one router line start on the node the router runs on), found 'a1' on node 'a1'"
    );
    assert_eq!(
        err(&format!(
            "{hosts}PAIR A B 1 -\na0 -> b1\nPAIR B A 1 -\nb0 -> a0\n"
        )),
        "t.cfg:4:7: link endpoint 'b1' is served by no router of PAIR B A (its routers run on: b0)"
    );
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\na0 -> 10.0.1.2\nPAIR B A 1 -\nb0 -> a0\n")),
        "t.cfg:4:7: link endpoint '10.0.1.2' (node 'b1') is served by no router of PAIR B A (its routers run on: b0)"
    );
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\na0:3 -> b0\nPAIR B A 1 -\nb0 -> a0\n")),
        "t.cfg:4:4: expected no port on the sending end of '->' (the receiving end listens; put ':N' on the right-hand endpoint), found 'a0:3'"
    );
    assert_eq!(
        err(&format!("{hosts}PAIR A B 1 -\na0 <-> 10.0.1.300\n")),
        "t.cfg:4:8: bad value '10.0.1.300' for address: expected an IPv4 address such as 192.168.0.1"
    );
    let same = "METAHOST A { NODES = a0 (10.0.0.1), a1 (10.0.0.1); }\nMETAHOST B { }\n";
    assert_eq!(
        err(&format!("{same}PAIR A B 1 -\n10.0.0.1 <-> B\n")),
        "t.cfg:4:1: link endpoint '10.0.0.1' is not a node or node address of meta host 'A' (the address belongs to several nodes (a0, a1); write node(address))"
    );
}

#[test]
fn node_range_errors() {
    assert_eq!(
        err("METAHOST A {\n  NODES = p4-10 - p4-03;\n}\n"),
        "t.cfg:2:11: bad node range 'p4-10 - p4-03': it runs backwards: 10 is greater than 3"
    );
    assert_eq!(err("METAHOST A { NODES = p4-00 - p3-63; }"), "t.cfg:1:22: bad node range 'p4-00 - p3-63': the bounds have different prefixes 'p4-' and 'p3-'");
    assert_eq!(
        err("METAHOST A { NODES = node_a - node_d; }"),
        "t.cfg:1:22: bad node range 'node_a - node_d': 'node_a' does not end in a number (a range is <prefix><number> - <prefix><number>, e.g. p4-00 - p4-63)"
    );
    assert_eq!(err("METAHOST A { NODES = p-|01 - p-|09; }"), "t.cfg:1:22: bad node range 'p-|01 - p-|09': 'p-|01' needs exactly two '|' around its number, as in p4-|01|");
    assert_eq!(err("METAHOST A { NODES = p0 - p999999; }"), "t.cfg:1:22: bad node range 'p0 - p999999': it covers 1000000 nodes; one range may cover at most 65536");
    assert_eq!(
        err("METAHOST A { NODES = p00 - p03 (10.0.0.1, 10.0.0.2); }"),
        "t.cfg:1:33: bad node range 'p00 - p03': an address on a node range must be one IPv4 address (the first node's; it counts up per node)"
    );
    assert_eq!(err("METAHOST A { NODES = p00 - p03, ! p07; }"), "t.cfg:1:33: excluded node 'p07' is not a node of meta host 'A' (its nodes: p00, p01, p02, p03)");
    assert_eq!(
        err("METAHOST A { NODES = p00, ! p00; }"),
        "t.cfg:1:27: meta host 'A' has no nodes left after the exclusions"
    );
}

#[test]
fn port_errors() {
    let local = "LAUNCH = local\nMETAHOST A { NODES = a0; }\nMETAHOST B { NODES = b0; }\nMETAHOST C { NODES = c0; }\nAUTO_ROUTER\n";
    assert_eq!(
        err(&format!(
            "{local}PAIR A B 1 -\na0 -> b0 PORT=7000\nPAIR A C 1 -\na0 -> c0 PORT=7000\n"
        )),
        "t.cfg:9:7: port 7000 on 127.0.0.1 is already used by the link at 7:7"
    );
    assert_eq!(
        err(&format!("{local}PAIR A B 1 - PORT=7000\na0 <-> b0\n")),
        "t.cfg:6:19: bad value '1 port(s)' for PORT: expected one port per link of PAIR A B without its own port (2 link(s), '<->' links count twice)"
    );
    assert_eq!(
        err(&format!("{local}PAIR A B 1 -\na0 -> b0 PORT=70000\n")),
        "t.cfg:7:15: bad value '70000' for PORT: expected a port, list or range of ports in 1..=65535 (port 70000 is out of range (expected 1..=65535))"
    );
    assert_eq!(
        err(&format!("{local}PAIR A B 1 -\na0 -> b0:9 PORT=7000\n")),
        "t.cfg:7:10: expected either PORT= or ':N' on a link, not both, found both"
    );
    assert_eq!(
        err("PORTBASE 65535\nMETAHOST A { }\nMETAHOST B { }\nPAIR A B 1 -\nA <-> B:1\n"),
        "t.cfg:5:9: bad value '1' for port offset: expected an offset that keeps PORTBASE (65535) + offset within 65535"
    );
    assert_eq!(
        err("PORT = 7000\nMETAHOST A { }\n"),
        "t.cfg:1:1: expected PORT inside a PAIR or on a link (PORTBASE sets the base for automatic ports), found PORT at top level"
    );
    assert_eq!(
        err("PORTBASE 0\nMETAHOST A { }\n"),
        "t.cfg:1:10: bad value '0' for PORTBASE: expected a TCP port in 1..=65535"
    );
}

#[test]
fn unit_errors() {
    let pair = |opt: &str| err(&format!("{TWO}PAIR A B 1 - {{ {opt}; }}\na0 <-> b0\n"));
    assert_eq!(
        pair("BANDWIDTH = 100"),
        "t.cfg:3:28: bad bandwidth '100': missing unit: say whether it counts bits or bytes, e.g. 100Mbit, 1Gbit/s or 12.5MB/s"
    );
    assert_eq!(
        pair("BANDWIDTH = 100Mbt"),
        "t.cfg:3:28: bad bandwidth '100Mbt': unknown unit 'Mbt' (expected bit/s or byte/s with an optional k, M, G, T, Ki, Mi, Gi or Ti prefix, e.g. 100Mbit, 1Gbit/s, 12.5MB/s, 64KiB/s)"
    );
    assert_eq!(
        pair("BANDWIDTH = 0Mbit"),
        "t.cfg:3:28: bad bandwidth '0Mbit': a bandwidth must be greater than zero"
    );
    assert_eq!(pair("LATENCY = 20"), "t.cfg:3:26: bad duration '20': missing unit (expected ns, us, ms, s, min or h, e.g. 20ms or 200us)");
    assert_eq!(pair("LATENCY = 20 parsecs"), "t.cfg:3:26: bad duration '20 parsecs': unknown unit 'parsecs' (expected ns, us, ms, s, min or h)");
    assert_eq!(
        pair("BUNDLE_DEADLINE = 0.5ns"),
        "t.cfg:3:34: bad duration '0.5ns': not a whole number of nanoseconds, or too large"
    );
    assert_eq!(
        pair("COMPRESSION = gzip"),
        "t.cfg:3:30: bad value 'gzip' for COMPRESSION: expected lz4, zstd, off or auto"
    );
    assert_eq!(
        pair("CHECKSUM = crc64"),
        "t.cfg:3:27: bad value 'crc64' for CHECKSUM: expected on, off or auto (on for plain TCP, off under TLS)"
    );
    assert_eq!(
        pair("TLS = maybe"),
        "t.cfg:3:22: bad value 'maybe' for TLS: expected off, auto (keys derived from the job secret, no setup) or on (the meta hosts' TLSCERT and TLSKEY)"
    );
    assert_eq!(err("ROUTERTIMEOUT 2 fortnights\nMETAHOST A { }\n"), "t.cfg:1:15: bad duration '2 fortnights': unknown unit 'fortnights' (expected ns, us, ms, s, min or h)");
    assert_eq!(
        pair("LATENCY = 5ms; LATENCY = 6ms"),
        "t.cfg:3:31: LATENCY is already set in PAIR A B (first at 3:16)"
    );
}

#[test]
fn missing_required_fields() {
    let pair = |opt: &str| err(&format!("{TWO}PAIR A B 1 - {{ {opt} }}\na0 <-> b0\n"));
    // TLS = on: see config_tls.rs for every case.
    assert_eq!(
        pair("TLS = on;"),
        "t.cfg:3:16: TLS = on for the links A -> B is missing TLSCERT: give meta host 'A' TLSCERT = <PEM certificate chain> in its METAHOST block (or at top level for every meta host); TLS = auto needs no certificates"
    );
    // A global TLS = on applies to every link, generated ones included.
    assert_eq!(
        err("TLS = on\nMETAHOST A { }\nMETAHOST B { }\nAUTO_ROUTER\n"),
        "t.cfg:1:1: TLS = on for the links A -> B is missing TLSCERT: give meta host 'A' TLSCERT = <PEM certificate chain> in its METAHOST block (or at top level for every meta host); TLS = auto needs no certificates"
    );
    assert_eq!(
        err("METAHOST A { NPROCS = MAX; NODES = a0 2, a1; }"),
        "t.cfg:1:1: meta host 'A' (process count MAX) is missing MAXPROCS: MAX means the sum of the nodes' MAXPROCS, so every node needs one (e.g. 'node1 2' or 'node1 MAXPROCS=2')"
    );
    assert_eq!(
        err("METAHOST A { LAUNCH = \"ssh {node}\"; }"),
        "t.cfg:1:23: bad value 'ssh {node}' for LAUNCH: expected a command template containing {cmd} (where the process command line goes)"
    );
    assert_eq!(err("METAHOST A { LAUNCH = ssh; }"), "t.cfg:1:23: bad value 'ssh' for LAUNCH: expected ssh followed by one destination (host, user@host or host:port)");
    assert_eq!(err("METAHOST A { LAUNCH = slurm via; }"), "t.cfg:1:23: bad value 'slurm via' for LAUNCH: expected slurm via followed by the login node's ssh destination");
    assert_eq!(err("METAHOST A { LAUNCH = slurm login.b -p debug; }"), "t.cfg:1:23: bad value 'slurm login.b -p debug' for LAUNCH: expected slurm [via LOGIN] followed by salloc options, not `login.b`");
    assert_eq!(
        err("METAHOST A { NODES = ; }"),
        "t.cfg:1:22: expected a node name (or a range such as p4-00 - p4-63), found ';'"
    );
    assert_eq!(
        err("METAHOST A { TYPE = ; }"),
        "t.cfg:1:21: expected a value for TYPE, found ';'"
    );
}

#[test]
fn value_and_capacity_errors() {
    assert_eq!(
        err("METAHOST A { TYPE = ch_ib; }"),
        "t.cfg:1:21: bad value 'ch_ib' for TYPE: expected ch_shmem, ch_p4, ch_smi, ch_usock, ch_gm, ch_mpx or auto"
    );
    assert_eq!(
        err("METAHOST A { TYPE = ch_shmem; NODES = a, b; }"),
        "t.cfg:1:21: bad value 'ch_shmem' for TYPE: expected a single-node meta host for ch_shmem (this one has 2 nodes); use ch_p4, ch_usock or ch_smi"
    );
    assert_eq!(
        err("METAHOST A { NPROCS = 10; NODES = a 2, b MAXPROCS=2; }"),
        "t.cfg:1:1: meta host 'A' needs 10 processes but the MAXPROCS of its nodes allow only 4"
    );
    assert_eq!(err("METAHOST A { NPROCS = 0; }"), "t.cfg:1:23: bad value '0' for process count: expected at least one process on meta host 'A'");
    assert_eq!(err("NUMHOSTS 1\nA 4\nMETAHOST A { NPROCS = 5; }\n"), "t.cfg:3:23: bad value '5' for NPROCS: expected the same count as the NUMHOSTS header line at 2:3");
    assert_eq!(
        err("METAHOST A { NODES = a 2 MAXPROCS=3; }"),
        "t.cfg:1:26: MAXPROCS is already set for this node (first at 1:24)"
    );
    assert_eq!(
        err("METAHOST A { TYPE = ch_p4; TYPE = ch_smi; }"),
        "t.cfg:1:28: TYPE is already set in METAHOST block 'A' (first at 1:14)"
    );
    assert_eq!(
        err("METAHOST A { BYTEORDER = middle; }"),
        "t.cfg:1:26: bad value 'middle' for BYTEORDER: expected little, big or native"
    );
    assert_eq!(
        err("NUMHOSTS 0\n"),
        "t.cfg:1:10: NUMHOSTS 0: expected at least one meta host"
    );
    assert_eq!(
        err("METAHOST A { NPROCS = 4294967296; }"),
        "t.cfg:1:1: meta host 'A' asks for 4294967296 processes; at most 2147483647 are possible"
    );
}

#[test]
fn pacx_errors() {
    let e = |t: &str| parse_pacx_str("hosts", t).unwrap_err().to_string();
    assert_eq!(
        e("host1 100 tcp\nhost2 0 tcp\n"),
        "hosts:2:7: bad value '0' for number of nodes: expected a positive whole number"
    );
    assert_eq!(
        e("host1 100 udp\n"),
        "hosts:1:11: bad value 'udp' for protocol: expected tcp"
    );
    assert_eq!(
        e("host1 100 tcp (rsh host1 mpirun\n"),
        "hosts:1:15: expected ')' to close the startup command on the same line, found end of line"
    );
    assert_eq!(
        e("host1 100\n"),
        "hosts:1:10: expected the protocol (tcp) after the number of nodes, found end of line"
    );
    assert_eq!(
        e("host1 100 tcp\nhost1 4 tcp\n"),
        "hosts:2:1: duplicate meta host 'host1' (first declared at 1:1)"
    );
    assert_eq!(
        e("# empty\n"),
        "hosts:1:1: no hosts: expected lines of the form 'host nodes protocol (startup command)'"
    );
    assert_eq!(
        e("host1 100 tcp () \n"),
        "hosts:1:15: expected a startup command inside ( ), found '()'"
    );
}

#[test]
fn slurm_meta_hosts() {
    let cfg = parse_str(
        "t.cfg",
        "METAHOST a { LAUNCH = slurm; NODES = n1; }\n\
         METAHOST b { LAUNCH = slurm via me@login.b --partition=debug '--comment=two words'; \
         NODES = m1; }\nPAIR a b 1\nn1 <-> m1\n",
    )
    .unwrap();
    assert_eq!(
        cfg.hosts[0].launch,
        metampi_config::Launch::Slurm {
            login: None,
            options: vec![]
        }
    );
    assert_eq!(
        cfg.hosts[1].launch,
        metampi_config::Launch::Slurm {
            login: Some("me@login.b".into()),
            options: vec!["--partition=debug".into(), "--comment=two words".into()]
        }
    );
    assert_eq!(
        cfg.hosts[1].launch.to_string(),
        "slurm via me@login.b --partition=debug --comment=two words"
    );
}
