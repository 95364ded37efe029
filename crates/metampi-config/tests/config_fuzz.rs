//! "Never panics", deterministically: every prefix of the example files, and single-byte
//! mutations (replace, insert, delete) at every position, through every entry point. Errors
//! must point inside the text.

use metampi_config::{parse_auto, parse_pacx_str, parse_str, ConfigError};

const FIG2: &str = "NUMHOSTS 2\nmetahost_A 8\nmetahost_B 8\n\nMETAHOST metahost_A {\n    TYPE=ch_smi;\n    NODES= node_a,\n           node_b (192.168.0.1),\n           node_c,\n           node_d (ATM_PVC 0.0.42);\n}\n\nPAIR metahost_A metahost_B 2 -\n192.168.0.1 -> 192.168.0.2\nATM_PVC 0.0.42 -> ATM_PVC 0.0.42\n\nPAIR metahost_B metahost_A 1 -\n192.168.0.2 -> 192.168.0.1 \\\n  ATM_PVC 0.0.42 -> ATM_PVC 0.0.42\n";

const EXAMPLES: [(&str, &str); 4] = [
    ("fig2.cfg", FIG2),
    ("three_sites.cfg", include_str!("data/three_sites.cfg")),
    ("mpich_style.cfg", include_str!("data/mpich_style.cfg")),
    ("pacx_seed.hosts", include_str!("data/pacx_seed.hosts")),
];

/// A few bytes that matter to the grammar, and one that breaks UTF-8 (it becomes U+FFFD
/// after lossy decoding).
const BYTES: &[u8] = b"{};=(:->\n\xff";

fn check_error(e: &ConfigError, text: &str) {
    let lines = text.split('\n').count();
    assert!(
        e.line >= 1 && e.line as usize <= lines + 1,
        "{e} (text has {lines} lines)\n{text}"
    );
    assert!(e.col >= 1, "{e}");
    assert!(!e.to_string().is_empty());
    let _ = e.snippet(text);
}

fn run_all(text: &str) {
    run(text, true);
}

/// Parses `text` in both languages; `display` also renders the layout table.
fn run(text: &str, display: bool) {
    for r in [parse_str("f", text), parse_pacx_str("f", text)] {
        match r {
            Ok(cfg) => {
                let l = cfg.layout_ref();
                if display {
                    let _ = l.to_string();
                }
                for rank in [
                    0,
                    l.world_size / 2,
                    l.world_size.saturating_sub(1),
                    l.world_size,
                ] {
                    let _ = l.host_of_rank(rank);
                    let _ = l.locate(rank);
                }
            }
            Err(e) => check_error(&e, text),
        }
    }
}

#[test]
fn examples_parse() {
    for (name, text) in EXAMPLES {
        assert!(
            parse_auto(name, text).is_ok(),
            "{name}: {:?}",
            parse_auto(name, text).err().map(|e| e.to_string())
        );
    }
}

#[test]
fn every_prefix() {
    for (_, text) in EXAMPLES {
        for (i, _) in text.char_indices() {
            run_all(&text[..i]);
            let _ = parse_auto("f", &text[..i]);
        }
    }
}

#[test]
fn single_byte_mutations() {
    for (_, text) in EXAMPLES {
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            for &b in BYTES {
                let mut replaced = bytes.to_vec();
                replaced[i] = b;
                run(&String::from_utf8_lossy(&replaced), false);
                let mut inserted = bytes.to_vec();
                inserted.insert(i, b);
                run(&String::from_utf8_lossy(&inserted), false);
            }
            let mut deleted = bytes.to_vec();
            deleted.remove(i);
            run(&String::from_utf8_lossy(&deleted), false);
        }
    }
}

#[test]
fn hostile_inputs() {
    let big = "9".repeat(5000);
    let cases = [
        String::new(),
        "\n\n\n".into(),
        "NUMHOSTS 18446744073709551615\n".into(),
        format!("NUMHOSTS {big}\n"),
        "METAHOST a { NODES = p0 - p65535; NPROCS = 2147483647; }".into(),
        "METAHOST a { NODES = p0 - p65535, q0 - q65535; }\nMETAHOST b { }\nAUTO_ROUTER\n".into(),
        format!("METAHOST a {{ NODES = p{big} - p{big}; }}"),
        "METAHOST a { NPROCS = 2147483647; }\nMETAHOST b { NPROCS = 1; }".into(),
        "PAIR a b 18446744073709551615 -\n".into(),
        format!("METAHOST a {{ }}\nMETAHOST b {{ }}\nPAIR a b 1 - {{ BANDWIDTH = {big}Tbit; LATENCY = {big}h; }}\na <-> b\n"),
        format!("METAHOST a {{ }}\nMETAHOST b {{ }}\nPAIR a b 1 - {{ LATENCY = 0.{big}s; }}\na <-> b\n"),
        "METAHOST a { NODES = a0 (255.255.255.255), a1; }".into(),
        "METAHOST a { NODES = p0 - p9 (255.255.255.250); }".into(),
        "PORTBASE 65535\nMETAHOST a { }\nMETAHOST b { }\nAUTO_ROUTER\n".into(),
        "{".repeat(10_000),
        "METAHOST a {".to_owned() + &"NODES = x,".repeat(2000),
        "\\".into(),
        "/* unterminated".into(),
        "[::1".into(),
        "\u{feff}METAHOST a { }".into(),
        "METAHOST \u{1F600} { NODES = \u{e9}t\u{e9}0 - \u{e9}t\u{e9}3; }".into(),
        "METAHOST a { }\nMETAHOST b { }\nPAIR a b 1 - { PIN = sha\u{e9}\u{20ac}x:00; }\na <-> b\n".into(),
        "METAHOST a { }\nMETAHOST b { }\nPAIR a b 1 -\na <-> b:18446744073709551615\n".into(),
        "METAHOST a { LAUNCH = \"{\u{e9}}{cmd}\"; }".into(),
        format!("{}\n", "h 1 tcp\n".repeat(300)),
    ];
    for c in &cases {
        run_all(c);
    }
    // The last one has 300 hosts of the same name: an error, not a 300x300 router mesh.
    assert!(parse_pacx_str("f", &cases[cases.len() - 1]).is_err());
}
