//! `metampi run --trace` + `metampi trace`: exact message counts and bytes
//! per pair for a job with known traffic, and a valid trace-event file.

use std::process::Command;

#[test]
fn traced_job_counts_messages_exactly() {
    let dir = std::env::temp_dir().join(format!("metampi-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = env!("CARGO_BIN_EXE_metampi");
    // pingpong of 64 bytes with --iters-scale 0.01: 20 timed + 2 warm-up round trips.
    let st = Command::new(exe)
        .arg("run")
        .arg("--trace")
        .arg(&dir)
        .args([
            "-n",
            "4",
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
    let out = Command::new(exe).arg("trace").arg(&dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
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
    assert_eq!(evs.iter().filter(|e| e["ph"] == "M").count(), 4);
    let png = std::fs::read(dir.join("timeline.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
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
