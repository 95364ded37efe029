//! `metampi run --trace` + `metampi trace`: exact message counts and bytes
//! per pair for a job with known traffic, and a valid trace-event file; with
//! `--meta`, one track per router link and bytes per pair of meta hosts; a timeline
//! PNG that decodes, with a row per rank and per link.

use std::process::Command;

/// Runs a traced 64-byte ping-pong bench (`metampi run ARGS --trace DIR
/// metampi bench ...`: 20 timed + 2 warm-up round trips), then `metampi
/// trace DIR`, and returns the summary it prints.
fn traced_pingpong(run_args: &[&str], dir: &std::path::Path) -> String {
    let exe = env!("CARGO_BIN_EXE_metampi");
    let st = Command::new(exe)
        .arg("run")
        .args(run_args)
        .arg("--trace")
        .arg(dir)
        .args([
            exe,
            "bench",
            "--ops",
            "pingpong",
            "--sizes",
            "64:64",
            "--iters-scale",
            "0.01",
        ])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let out = Command::new(exe).arg("trace").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Width and height of the timeline PNG at `path`, decoded whole (so a broken file fails).
fn timeline_size(path: &std::path::Path) -> (u32, u32) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    (info.width, info.height)
}

#[test]
fn traced_job_counts_messages_exactly() {
    let dir = std::env::temp_dir().join(format!("metampi-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // pingpong of 64 bytes with --iters-scale 0.01: 20 timed + 2 warm-up round trips.
    let summary = traced_pingpong(&["-n", "4"], &dir);
    let pair_lines: Vec<Vec<u64>> = summary
        .lines()
        .skip_while(|l| !l.starts_with("messages by rank pair"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        pair_lines,
        vec![vec![0, 1, 22, 22 * 64], vec![1, 0, 22, 22 * 64]],
        "{summary}"
    );
    assert!(summary.contains("trace of 4 ranks"), "{summary}");

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    let mut sends = 0;
    for e in evs {
        let ph = e["ph"].as_str().unwrap();
        assert!(ph == "X" || ph == "M", "{e}");
        assert!(e["pid"].is_number() && e["tid"].is_number(), "{e}");
        if ph == "X" {
            assert!(
                e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0,
                "{e}"
            );
            if e["cat"] == "send" {
                sends += 1;
                assert_eq!(e["args"]["bytes"], 64);
            }
        }
    }
    assert_eq!(sends, 44);
    let rank_tracks = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0)
        .count();
    assert_eq!(rank_tracks, 4);
    assert!(
        !evs.iter().any(|e| e["pid"] == 1),
        "no routers, no link tracks"
    );
    // A labelled row per rank: four rows of 28 pixels between the caption and the axis.
    let (w, h) = timeline_size(&dir.join("timeline.png"));
    assert_eq!(w, 1400);
    assert!(h >= 4 * 28 + 100, "{h}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_of_an_empty_directory_is_an_error() {
    let dir = std::env::temp_dir().join(format!("metampi-trace-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("trace")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no rank-*.trace files"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two meta hosts of one rank each, joined by one router pair striped over
/// two links each way: the ping-pong between ranks 0 and 1 goes through both
/// routers.
const TWO_SITES: &str = "PORTBASE 26470
METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }
METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }
PAIR a b 1 - { COMPRESSION = off; }
a0 <-> b0, a0 <-> b0
";

#[test]
fn traced_meta_job_has_router_link_tracks_and_site_pair_bytes() {
    let dir = std::env::temp_dir().join(format!("metampi-trace-meta-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("two.meta");
    std::fs::write(&cfg, TWO_SITES).unwrap();
    let tdir = dir.join("trace");
    let cfg = cfg.to_string_lossy().into_owned();
    let summary = traced_pingpong(&["--meta", &cfg], &tdir);
    // from, to, messages, payload, wire
    let site_rows: Vec<Vec<String>> = summary
        .lines()
        .skip_while(|l| !l.starts_with("bytes by meta-host pair"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(site_rows.len(), 2, "{summary}");
    for (row, (from, to)) in site_rows.iter().zip([("a", "b"), ("b", "a")]) {
        assert_eq!((row[0].as_str(), row[1].as_str()), (from, to), "{summary}");
        // 20 timed and 2 warm-up messages of 64 bytes each way.
        assert_eq!(row[2], "22", "{summary}");
        assert_eq!(row[3], (22 * 64).to_string(), "{summary}");
        // Each message also carries its 64-byte envelope through the routers.
        let wire: u64 = row[4].parse().unwrap();
        assert!(wire >= 22 * (64 + 64), "{summary}");
    }

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tdir.join("trace.json")).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    let names: Vec<(u64, String)> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 1)
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // Layout links l0, l1 go from router 0 to router 1, l2, l3 back; each
    // router traces both ends it holds of the links that carried traffic.
    for want in [
        "router 0 link 0 (to router 1)",
        "router 1 link 0 (from router 0)",
        "router 1 link 2 (to router 0)",
        "router 0 link 2 (from router 1)",
    ] {
        assert!(names.iter().any(|(_, n)| n == want), "{want}: {names:?}");
    }
    // Bytes router 0 wrote towards router 1 on its links, and bytes router 1 read from them.
    let link_bytes = |track: &str, cat: &str| -> u64 {
        let tid = names.iter().find(|(_, n)| n == track).unwrap().0;
        evs.iter()
            .filter(|e| e["pid"] == 1 && e["tid"] == tid && e["cat"] == cat)
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .sum()
    };
    let written = link_bytes("router 0 link 0 (to router 1)", "link-out");
    let read = link_bytes("router 1 link 0 (from router 0)", "link-in");
    assert!(written >= 22 * 128, "{written}");
    assert!(read > 0 && read <= written, "{read} of {written}");
    // Two rank rows and a row per traced link end.
    let (w, h) = timeline_size(&tdir.join("timeline.png"));
    assert_eq!(w, 1400);
    assert!(h >= 2 * 28 + 4 * 18 + 100, "{h}");
    let _ = std::fs::remove_dir_all(&dir);
}
