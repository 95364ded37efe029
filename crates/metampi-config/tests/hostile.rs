//! Hostile and broken input, seeded: thousands of random texts and random mutations of
//! the example files through both parsers and the layout. Nothing may panic; errors
//! must name a line of the text. The exhaustive single-byte sweep is `config_fuzz.rs`;
//! the open-ended search is the `config` target in `fuzz/`.

use metampi_config::{parse_auto, parse_pacx_str, parse_str, ConfigError, MetaConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EXAMPLES: [&str; 3] = [
    include_str!("data/three_sites.cfg"),
    include_str!("data/mpich_style.cfg"),
    include_str!("data/pacx_seed.hosts"),
];

/// Pieces of the grammar a mutation splices in, so mutants stay near valid text.
const WORDS: &[&str] = &[
    "METAHOST",
    "PAIR",
    "NUMHOSTS",
    "AUTO_ROUTER",
    "PORTBASE",
    "NODES",
    "NPROCS",
    "LAUNCH",
    "TYPE",
    "BANDWIDTH",
    "LATENCY",
    "PIN",
    "TLS",
    "{",
    "}",
    ";",
    "=",
    ",",
    "(",
    ")",
    "-",
    "->",
    "<->",
    ":",
    "\\\n",
    "\n",
    "/*",
    "*/",
    "#",
    "\"",
    "0",
    "1",
    "65535",
    "4294967296",
    "18446744073709551616",
    "-1",
    "1.5e308",
    "100Mbit",
    "20ms",
    "0.0.0.0",
    "[::1]:0",
    "ch_smi",
    "tcp",
    "local",
    "ssh",
    "\u{feff}",
    "\u{fffd}",
    "\r\n",
    "\t",
];

fn check(text: &str, r: Result<MetaConfig, ConfigError>) {
    match r {
        Ok(cfg) => {
            let l = cfg.layout_ref();
            let _ = l.to_string();
            for rank in [0, l.world_size / 2, l.world_size] {
                let _ = l.host_of_rank(rank);
                let _ = l.locate(rank);
            }
        }
        Err(e) => {
            let lines = text.split('\n').count();
            assert!(
                e.line >= 1 && e.line as usize <= lines + 1 && e.col >= 1,
                "{e} points outside a text of {lines} lines:\n{text:?}"
            );
            let _ = e.snippet(text);
        }
    }
}

fn run(text: &str) {
    check(text, parse_str("f", text));
    check(text, parse_pacx_str("f", text));
    let _ = parse_auto("f", text);
}

fn mutate(rng: &mut StdRng, base: &str) -> String {
    let mut b = base.as_bytes().to_vec();
    for _ in 0..rng.gen_range(1..6) {
        let at = rng.gen_range(0..=b.len());
        match rng.gen_range(0..6) {
            0 if at < b.len() => b[at] = rng.gen(),
            1 => {
                let w = WORDS[rng.gen_range(0..WORDS.len())];
                b.splice(at..at, w.bytes());
            }
            2 => {
                let end = (at + rng.gen_range(0..40)).min(b.len());
                b.drain(at..end);
            }
            3 => {
                // Repeat a span: long lists, deep nesting, duplicate hosts.
                let end = (at + rng.gen_range(0..80)).min(b.len());
                let span = b[at..end].to_vec();
                for _ in 0..rng.gen_range(1..20) {
                    b.splice(at..at, span.iter().copied());
                }
            }
            4 => {
                // Splice in a piece of another example.
                let other = EXAMPLES[rng.gen_range(0..EXAMPLES.len())].as_bytes();
                let from = rng.gen_range(0..other.len());
                let to = (from + rng.gen_range(0..200)).min(other.len());
                b.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                let n = rng.gen_range(0..8);
                b.splice(at..at, (0..n).map(|_| b"0123456789"[rng.gen_range(0..10)]));
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

#[test]
fn random_texts_are_errors() {
    let mut rng = StdRng::seed_from_u64(0x4d45_5441);
    let mut refused = 0;
    for _ in 0..2000 {
        let n = rng.gen_range(0..300);
        let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        let text = String::from_utf8_lossy(&bytes);
        run(&text);
        refused += usize::from(parse_str("f", &text).is_err());
    }
    // Almost nothing random is a valid description (an empty one is).
    assert!(refused > 1900, "only {refused} of 2000 refused");
}

#[test]
fn mutated_examples_never_panic() {
    let mut rng = StdRng::seed_from_u64(0x5041_4358);
    for i in 0..3000 {
        let text = mutate(&mut rng, EXAMPLES[i % EXAMPLES.len()]);
        run(&text);
    }
}
