//! `metampi run --web`: the live view of a running meta job, read over plain HTTP from the
//! test and, where Chromium is installed, rendered by headless Chromium.
//!
//! The job is three meta hosts on this machine (four ranks, six routers: a: 0, 1; b: 2;
//! c: 3). Its ranks are this test binary run again. First they exchange messages whose sizes
//! the tests know, through shared memory and through the routers: rank 1 sends 500 bytes to
//! rank 0, rank 0 1000 bytes to rank 2, rank 2 3000 bytes to rank 3. Then rank 0 waits for a
//! message from rank 1, rank 1 computes (in traced regions) until the test lets it go, and
//! ranks 2 and 3 go to `MPI_Finalize`, whose barrier they wait in until ranks 0 and 1 get
//! there.
//!
//! The Chromium test writes its screenshot to the test's temporary directory, and to
//! `docs/img/web-view.png` when `METAMPI_SAVE_SCREENSHOT=1` (how the README's picture is
//! made: `METAMPI_SAVE_SCREENSHOT=1 cargo test --release -p metampi-cli --test cli_web`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the job has to reach the picture the tests look for.
const PATIENCE: Duration = Duration::from_secs(40);

/// The environment variable that makes this binary a rank of the job; its value is the file
/// whose appearance lets rank 1 go.
const GO_ENV: &str = "METAMPI_TEST_WEB_GO";

/// Bytes each message of the job's first exchange carries: rank 1 to 0, 0 to 2, 2 to 3.
const ONE_TO_ZERO: usize = 500;
const ZERO_TO_TWO: usize = 1000;
const TWO_TO_THREE: usize = 3000;

/// Bytes each rank has sent and received when the picture is taken (the finalization
/// barrier's messages carry none).
const BYTES: [(u64, u64); 4] = [
    (ZERO_TO_TWO as u64, ONE_TO_ZERO as u64),
    (ONE_TO_ZERO as u64, 0),
    (TWO_TO_THREE as u64, ZERO_TO_TWO as u64),
    (0, TWO_TO_THREE as u64),
];

#[test]
fn the_json_endpoints_show_ranks_and_routers_of_a_running_meta_job() {
    const NAME: &str = "the_json_endpoints_show_ranks_and_routers_of_a_running_meta_job";
    if rank_of_the_job() {
        return;
    }
    let job = Job::start(NAME, 28710, false);
    let ranks = job.wait_for_the_picture();
    let state = |r: usize| ranks[r]["state"].as_str().unwrap_or_default().to_string();
    assert!(
        ranks[0]["call"]
            .as_str()
            .is_some_and(|c| c.contains("receive from rank 1, tag 5")),
        "{ranks:?}"
    );
    assert!(ranks[0]["waited_s"].as_f64().is_some(), "{ranks:?}");
    assert_eq!(state(1), "running", "{ranks:?}");
    let hosts: Vec<&str> = ranks
        .iter()
        .map(|r| r["meta_host"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(hosts, ["a", "a", "b", "c"]);
    for r in &ranks {
        assert!(r["pid"].as_u64().is_some_and(|p| p > 0), "{r}");
    }
    // Every rank has counted what it sent and received, and the messages they took.
    for r in job.wait_for_the_bytes() {
        let t = &r["traffic"];
        for (dir, bytes) in [
            ("sent", &t["sent_bytes"]),
            ("received", &t["received_bytes"]),
        ] {
            let least = u64::from(bytes.as_u64() > Some(0));
            let messages = &t[format!("{dir}_messages").as_str()];
            assert!(messages.as_u64().is_some_and(|m| m >= least), "{r}");
        }
        assert!(t["age_s"].is_number(), "{r}");
    }
    // Rates come with a rank's second answer; since then rank 1 has sent nothing.
    wait_for(|| {
        let r = get_json(job.port, "/api/ranks")["ranks"][1]["traffic"].clone();
        (r["sent_bytes_per_s"] == 0.0 && r["received_bytes_per_s"] == 0.0).then_some(())
    });
    // Without --trace the ranks say they record no calls.
    let trace = wait_for(|| {
        let t = get_json(job.port, "/api/trace");
        (!t["recording"].is_null()).then_some(t)
    });
    assert_eq!(trace["recording"], false, "{trace}");

    let info = get_json(job.port, "/api/job");
    assert_eq!(info["world_size"], 4, "{info}");
    assert_eq!(info["ended"], false, "{info}");
    assert!(
        info["job"].as_str().is_some_and(|j| j.len() == 16),
        "{info}"
    );
    let names: Vec<&str> = (info["meta"]["hosts"].as_array().unwrap().iter())
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"], "{info}");

    // Every pair of meta hosts has a router at each end; their files appear within a second.
    let routers = wait_for(|| {
        let v = get_json(job.port, "/api/routers");
        let n = v["routers"].as_array().map_or(0, Vec::len);
        (n == 6 && v["links"].as_array().map_or(0, Vec::len) == 6).then_some(v)
    });
    assert_eq!(routers["available"], true);
    let router_names: Vec<&str> = (routers["routers"].as_array().unwrap().iter())
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(router_names.contains(&"r0 a -> b"), "{routers}");
    for link in routers["links"].as_array().unwrap() {
        for key in ["bytes_out", "srtt_ms", "retransmits", "compression_ratio"] {
            assert!(link[key].is_number(), "{key} in {link}");
        }
    }

    // The page itself, and nothing else.
    let page = get(job.port, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("/api/ranks") && !page.contains("src=\"http"));
    assert!(get(job.port, "/nothing-here").starts_with("HTTP/1.1 404"));

    job.finish();
}

#[test]
fn with_trace_the_calls_and_headless_chromium_renders_everything() {
    const NAME: &str = "with_trace_the_calls_and_headless_chromium_renders_everything";
    if rank_of_the_job() {
        return;
    }
    let job = Job::start(NAME, 28730, true);
    job.wait_for_the_picture();
    // The calls made so far, each on its rank's row of the timeline. They ended at the start
    // of the job: ask for the longest window the view keeps.
    let calls_of = |trace: &Value, rank: usize| -> Vec<(String, Option<u64>, u64)> {
        (trace["ranks"][rank]["calls"]
            .as_array()
            .into_iter()
            .flatten())
        .map(|c| {
            let name = c["name"].as_str().filter(|n| !n.is_empty());
            let what = name.or(c["kind"].as_str()).unwrap_or_default().to_string();
            (what, c["peer"].as_u64(), c["bytes"].as_u64().unwrap_or(0))
        })
        .collect()
    };
    let expected: [&[(&str, u64, usize)]; 4] = [
        &[("recv", 1, ONE_TO_ZERO), ("send", 2, ZERO_TO_TWO)],
        &[("send", 0, ONE_TO_ZERO)],
        &[("recv", 0, ZERO_TO_TWO), ("send", 3, TWO_TO_THREE)],
        &[("recv", 2, TWO_TO_THREE)],
    ];
    let trace = wait_for(|| {
        let t = get_json(job.port, "/api/trace?last=30");
        let all = (0..4).all(|r| {
            let calls = calls_of(&t, r);
            (expected[r].iter()).all(|&(what, peer, bytes)| {
                calls.contains(&(what.to_string(), Some(peer), bytes as u64))
            }) && (r != 1 || calls.iter().any(|c| c.0 == "compute"))
        });
        all.then_some(t)
    });
    assert_eq!(trace["recording"], true, "{trace}");
    for r in trace["ranks"].as_array().unwrap() {
        for c in r["calls"].as_array().unwrap() {
            let (start, end) = (c["start_s"].as_f64().unwrap(), c["end_s"].as_f64().unwrap());
            assert!(0.0 <= start && start <= end, "{c}");
            assert!(end <= trace["now_s"].as_f64().unwrap(), "{c}");
        }
    }

    let Some(chromium) = chromium() else {
        return;
    };
    job.wait_for_the_bytes();
    // The routers have written their files by the time the ranks are this far; give the page
    // what it would see a moment later too, so that the links have rates.
    wait_for(|| {
        (get_json(job.port, "/api/routers")["links"]
            .as_array()?
            .len()
            == 6)
            .then_some(())
    });
    let url = format!("http://127.0.0.1:{}/", job.port);
    let profile = job.dir.join("chromium-profile");
    let headless = |extra: &[&str]| -> String {
        let out = Command::new(&chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--virtual-time-budget=3000")
            .args(extra)
            .arg(&url)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = headless(&["--dump-dom"]);
    // What the JSON says now is what the page drew from it a moment ago.
    let ranks = get_json(job.port, "/api/ranks");
    for r in ranks["ranks"].as_array().unwrap() {
        let row = format!("data-rank=\"{}\"", r["rank"]);
        assert!(dom.contains(&row), "no {row} in:\n{dom}");
    }
    assert!(
        dom.contains("data-rank=\"0\" data-state=\"waiting\""),
        "{dom}"
    );
    assert!(dom.contains("receive from rank 1, tag 5"), "{dom}");
    for host in ["a", "b", "c"] {
        assert!(dom.contains(&format!("data-meta-host=\"{host}\"")), "{dom}");
    }
    let routers = get_json(job.port, "/api/routers");
    for r in routers["routers"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap().replace('>', "&gt;");
        assert!(dom.contains(&name), "no router {name} in:\n{dom}");
    }
    // Drawn rows only: the script that draws them is in the DOM too.
    let drawn = (dom.split("<tr class=\"link\" data-link=\"").skip(1))
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        .count();
    assert_eq!(drawn, 6, "{dom}");
    // Bytes in and out on each rank's row.
    for (rank, (sent, received)) in BYTES.iter().enumerate() {
        let row = dom
            .split(&format!("<tr class=\"rank\" data-rank=\"{rank}\""))
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .unwrap_or_default();
        assert!(
            row.contains(&format!("data-sent-bytes=\"{sent}\"")),
            "{row}"
        );
        assert!(
            row.contains(&format!("data-received-bytes=\"{received}\"")),
            "{row}"
        );
    }
    // The timeline: rank 1's regions at least (the others' calls may be older than it shows).
    assert!(dom.contains("<svg"), "{dom}");
    assert!(
        dom.contains("<rect class=\"call\" data-rank=\"1\" data-kind=\"region\""),
        "{dom}"
    );

    let shot = job.dir.join("web-view.png");
    headless(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1200,800",
        "--hide-scrollbars",
    ]);
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG: {}", shot.display());
    if std::env::var_os("METAMPI_SAVE_SCREENSHOT").is_some_and(|v| v == "1") {
        let to = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img/web-view.png");
        std::fs::write(&to, &png).unwrap();
        println!("screenshot saved to {}", to.display());
    }
    job.finish();
}

/// Runs the rank's part when this process is a rank of a test's job; false otherwise.
fn rank_of_the_job() -> bool {
    let Some(go) = std::env::var_os(GO_ENV) else {
        return false;
    };
    use metampi::traits::*;
    let universe = metampi::initialize().unwrap();
    let world = universe.world();
    let receive = |from: i32| {
        let (bytes, _) = world.process_at_rank(from).receive_vec_with_tag::<u8>(9);
        bytes.len()
    };
    match world.rank() {
        0 => {
            assert_eq!(receive(1), ONE_TO_ZERO);
            world
                .process_at_rank(2)
                .send_with_tag(&[0u8; ZERO_TO_TWO][..], 9);
            let _ = world.process_at_rank(1).receive_with_tag::<u32>(5);
        }
        1 => {
            world
                .process_at_rank(0)
                .send_with_tag(&[1u8; ONE_TO_ZERO][..], 9);
            while !Path::new(&go).exists() {
                let _compute = metampi::trace::region("compute");
                std::thread::sleep(Duration::from_millis(20));
            }
            world.process_at_rank(0).send_with_tag(&7u32, 5);
        }
        2 => {
            assert_eq!(receive(0), ZERO_TO_TWO);
            world
                .process_at_rank(3)
                .send_with_tag(&[2u8; TWO_TO_THREE][..], 9);
        }
        _ => assert_eq!(receive(2), TWO_TO_THREE),
    }
    true
}

/// A running `metampi run --web 127.0.0.1:0 --meta` job.
struct Job {
    child: Child,
    port: u16,
    dir: PathBuf,
    go: PathBuf,
    stderr: mpsc::Receiver<String>,
}

impl Job {
    /// With `trace`, the job runs with `--trace` (into the test's directory).
    fn start(name: &str, portbase: u16, trace: bool) -> Job {
        let dir =
            std::env::temp_dir().join(format!("metampi-web-{portbase}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("three.meta");
        std::fs::write(
            &cfg,
            format!(
                "PORTBASE {portbase}\n\
                 METAHOST a {{ LAUNCH = local; NPROCS = 2; NODES = a0; }}\n\
                 METAHOST b {{ LAUNCH = local; NPROCS = 1; NODES = b0; }}\n\
                 METAHOST c {{ LAUNCH = local; NPROCS = 1; NODES = c0; }}\n\
                 PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
            ),
        )
        .unwrap();
        let go = dir.join("go");
        let mut run = Command::new(env!("CARGO_BIN_EXE_metampi"));
        run.args(["run", "--timeout", "90", "--web", "127.0.0.1:0"]);
        if trace {
            run.arg("--trace").arg(dir.join("trace"));
        }
        let mut child = run
            .arg("--meta")
            .arg(&cfg)
            .arg("-x")
            .arg(format!("{GO_ENV}={}", go.display()))
            .arg(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "-q", "--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, stderr) = mpsc::channel();
        let from = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = String::new();
        let port = loop {
            let line = stderr
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("no URL on stderr:\n{seen}"));
            seen.push_str(&line);
            seen.push('\n');
            if let Some(url) = line.strip_prefix("metampi run: live view at http://127.0.0.1:") {
                break url.trim_end_matches('/').parse::<u16>().unwrap();
            }
        };
        Job {
            child,
            port,
            dir,
            go,
            stderr,
        }
    }

    /// Waits until rank 0 waits in its receive and ranks 2 and 3 in finalization; returns
    /// `/api/ranks`' ranks then.
    fn wait_for_the_picture(&self) -> Vec<Value> {
        let mut last = Value::Null;
        let t0 = Instant::now();
        loop {
            assert!(
                t0.elapsed() < PATIENCE,
                "never saw rank 0 waiting and ranks 2, 3 finalizing: {last}"
            );
            last = get_json(self.port, "/api/ranks");
            if let Some(ranks) = last["ranks"].as_array().filter(|r| r.len() == 4) {
                let state = |r: usize| ranks[r]["state"].as_str().unwrap_or_default();
                let finalizing = |r: usize| {
                    ranks[r]["call"]
                        .as_str()
                        .is_some_and(|c| c.contains("finalization"))
                };
                if state(0) == "waiting" && state(1) == "running" && finalizing(2) && finalizing(3)
                {
                    return ranks.clone();
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every rank's counters say what the job's first exchange sent and
    /// received ([`BYTES`]: answers from before it may come first); returns `/api/ranks`'
    /// ranks then.
    fn wait_for_the_bytes(&self) -> Vec<Value> {
        let t0 = Instant::now();
        loop {
            let last = get_json(self.port, "/api/ranks")["ranks"].clone();
            let counted = |r: &Value| (r["sent_bytes"].as_u64(), r["received_bytes"].as_u64());
            let all = (last.as_array().into_iter().flatten())
                .map(|r| counted(&r["traffic"]))
                .eq(BYTES.iter().map(|&(s, r)| (Some(s), Some(r))));
            if all {
                return last.as_array().unwrap().clone();
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "the ranks never counted the bytes {BYTES:?} (sent, received): {last}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Lets rank 1 go; the job must end well.
    fn finish(mut self) {
        std::fs::write(&self.go, b"").unwrap();
        let status = self.child.wait().unwrap();
        let rest: Vec<String> = self.stderr.try_iter().collect();
        assert_eq!(status.code(), Some(0), "{}", rest.join("\n"));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A failed test leaves no job behind (the launcher stops its ranks and routers).
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let _ = self.child.wait();
        }
    }
}

/// `path` over a fresh connection: the whole response, status line first.
fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn get_json(port: u16, path: &str) -> Value {
    let response = get(port, path);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_default();
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    assert!(head.contains("application/json"), "{head}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < PATIENCE, "gave up waiting");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Chromium to run, or `None` with a line saying the test is skipped; where CI requires
/// it (`CI=true` and `METAMPI_TEST_REQUIRE_CHROMIUM=1`), its absence fails the test.
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            && std::env::var("METAMPI_TEST_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "chromium is not installed and METAMPI_TEST_REQUIRE_CHROMIUM=1"
        );
        println!("skipped: chromium not installed (apt-get install chromium)");
    }
    found
}
