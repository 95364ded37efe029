//! `metampi run` as a user runs it: the real binary, real ranks.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn metampi(args: &[&str]) -> Output {
    metampi_with_stdin(args, b"")
}

fn metampi_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Dropping the handle after writing closes the pipe, so ranks reading stdin see EOF.
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn sorted_lines(bytes: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = text(bytes).lines().map(String::from).collect();
    lines.sort();
    lines
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metampi-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_rank_runs_with_its_rank_number() {
    let out = metampi(&["run", "-n", "3", "sh", "-c", "echo $METAMPI_RANK"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&out.stdout), ["0", "1", "2"]);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn program_arguments_that_look_like_options_reach_the_program() {
    let out = metampi(&[
        "run",
        "-n",
        "1",
        "sh",
        "-c",
        "echo \"$@\"",
        "argv0",
        "-l",
        "--all",
        "-n",
        "9",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "-l --all -n 9\n");
}

#[test]
fn a_failing_rank_gives_its_exit_code_and_is_named() {
    let start = Instant::now();
    let out = metampi(&[
        "run",
        "-n",
        "3",
        "sh",
        "-c",
        "if [ $METAMPI_RANK = 1 ]; then exit 5; fi; sleep 30",
    ]);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(5));
    let err = text(&out.stderr);
    assert!(
        err.contains("metampi run: rank 1 (pid ") && err.contains("exited with code 5"),
        "{err}"
    );
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let out = metampi(&[
        "run",
        "-n",
        "2",
        "sh",
        "-c",
        "if [ $METAMPI_RANK = 0 ]; then kill -KILL $$; fi; sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(137));
    assert!(
        text(&out.stderr).contains("was killed by signal SIGKILL (9)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn timeout_exits_124() {
    let out = metampi(&["run", "--timeout", "0.5", "-n", "2", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(
        text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );
}

/// `metampi run -n 2 yes | head -2`: when the reader of its stdout goes, the launcher
/// stops the ranks and exits 141 (128 + SIGPIPE) at once, as a pipeline's program does.
#[test]
fn a_closed_stdout_ends_the_job() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["run", "--timeout", "60", "-n", "2", "yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 4];
    out.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"y\ny\n");
    let closed = Instant::now();
    drop(out);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if closed.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the job still runs 20 s after its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = closed.elapsed();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(err.is_empty(), "a closed pipe is no error to report: {err}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// A low soft descriptor limit does not cap the job (the launcher raises it to the hard
/// one); a hard limit too low for the ranks asked for is named before anything starts.
#[test]
fn the_descriptor_limit_is_raised_or_named() {
    let exe = env!("CARGO_BIN_EXE_metampi");
    let under = |limit: &str| {
        Command::new("bash")
            .arg("-c")
            .arg(format!("ulimit {limit} && exec \"$0\" run -n 30 sleep 1"))
            .arg(exe)
            .output()
            .unwrap()
    };
    let soft = under("-Sn 64");
    assert!(soft.status.success(), "{}", text(&soft.stderr));
    let hard = under("-n 64");
    assert_eq!(hard.status.code(), Some(1));
    let err = text(&hard.stderr);
    assert!(
        err.contains("30 ranks need about") && err.contains("ulimit -Hn"),
        "{err}"
    );
}

#[test]
fn mimd_programs_are_separated_by_a_colon() {
    let out = metampi(&[
        "run",
        "-n",
        "1",
        "sh",
        "-c",
        "echo A$METAMPI_RANK.$METAMPI_APPNUM",
        ":",
        "-n",
        "2",
        "sh",
        "-c",
        "echo B$METAMPI_RANK.$METAMPI_APPNUM",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&out.stdout), ["A0.0", "B1.1", "B2.1"]);
}

#[test]
fn tag_output_and_stdin_routing() {
    let out = metampi_with_stdin(&["run", "--tag-output", "-n", "2", "cat"], b"hello\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "[0] hello\n");

    let out = metampi_with_stdin(
        &["run", "--tag-output", "--stdin", "all", "-n", "2", "cat"],
        b"hello\n",
    );
    assert_eq!(sorted_lines(&out.stdout), ["[0] hello", "[1] hello"]);

    let out = metampi_with_stdin(
        &["run", "--tag-output", "--stdin", "1", "-n", "2", "cat"],
        b"hello\n",
    );
    assert_eq!(text(&out.stdout), "[1] hello\n");
}

#[test]
fn env_exports_and_local_hosts() {
    let out = metampi(&[
        "run",
        "-x",
        "GREETING=hi there",
        "--launch",
        "local",
        "--hosts",
        "a,b:2",
        "-n",
        "3",
        "sh",
        "-c",
        "echo $METAMPI_RANK $METAMPI_NODE $METAMPI_LOCAL_RANK/$METAMPI_LOCAL_SIZE $GREETING",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        sorted_lines(&out.stdout),
        ["0 a 0/1 hi there", "1 b 0/2 hi there", "2 b 1/2 hi there"]
    );
}

#[test]
fn hostfile_is_read() {
    let dir = temp_dir("hostfile");
    let file = dir.join("hosts");
    std::fs::write(&file, "# test hosts\nx slots=2\ny:1\n").unwrap();
    let out = metampi(&[
        "run",
        "--launch",
        "local",
        "--hostfile",
        file.to_str().unwrap(),
        "-n",
        "3",
        "sh",
        "-c",
        "echo $METAMPI_RANK $METAMPI_NODE",
    ]);
    assert_eq!(
        sorted_lines(&out.stdout),
        ["0 x", "1 x", "2 y"],
        "{}",
        text(&out.stderr)
    );

    std::fs::write(&file, "x slots=0\n").unwrap();
    let out = metampi(&[
        "run",
        "--hostfile",
        file.to_str().unwrap(),
        "-n",
        "1",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("hostfile line 1"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn output_dir_keeps_the_terminal_quiet() {
    let dir = temp_dir("outdir");
    let out = metampi(&[
        "run",
        "--output-dir",
        dir.to_str().unwrap(),
        "-n",
        "2",
        "sh",
        "-c",
        "echo out$METAMPI_RANK; echo err >&2",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    assert_eq!(
        std::fs::read_to_string(dir.join("rank.1.stdout")).unwrap(),
        "out1\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("rank.0.stderr")).unwrap(),
        "err\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn invalid_command_lines_are_refused_before_anything_starts() {
    let dir = temp_dir("refused");
    let marker = dir.join("started");
    let touch = format!("touch {}", marker.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run"], "required"),
        (vec!["run", "-n", "2"], "required"),
        (vec!["run", "-n", "0", "sh", "-c", &touch], "0 ranks"),
        (
            vec!["run", "-n", "2", "no-such-program-for-metampi"],
            "not found in PATH",
        ),
        (
            vec!["run", "--hosts", "a:0", "-n", "2", "sh", "-c", &touch],
            "at least 1",
        ),
        (
            vec!["run", "--hosts", "a:x", "-n", "2", "sh", "-c", &touch],
            "not a positive integer",
        ),
        (
            vec!["run", "--stdin", "5", "-n", "2", "sh", "-c", &touch],
            "stdin rank 5",
        ),
        (
            vec!["run", "--stdin", "most", "-n", "2", "sh", "-c", &touch],
            "--stdin",
        ),
        (
            vec!["run", "--debug", "4", "-n", "2", "sh", "-c", &touch],
            "debug rank 4",
        ),
        (
            vec!["run", "--timeout", "0", "-n", "2", "sh", "-c", &touch],
            "longer than zero",
        ),
        (
            vec!["run", "--launch", "rsh", "-n", "2", "sh", "-c", &touch],
            "{cmd}",
        ),
        (
            vec!["run", "-x", "1X=2", "-n", "2", "sh", "-c", &touch],
            "invalid environment variable",
        ),
        (
            vec!["run", "-n", "1", "sh", "-c", &touch, ":", "sh"],
            "-n M",
        ),
        (
            vec![
                "run",
                "--output-dir",
                "/proc/metampi/none",
                "-n",
                "1",
                "sh",
                "-c",
                &touch,
            ],
            "output directory",
        ),
    ];
    for (args, needle) in cases {
        let out = metampi(&args);
        let err = text(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?} {err}",
            out.status
        );
        assert!(err.contains(needle), "{args:?}: want {needle:?} in {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!marker.exists(), "a rank was started");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each rank's `Cpus_allowed_list` line, by rank, from ranks that print
/// `RANK LIST`.
fn cpu_lists(out: &Output) -> Vec<String> {
    let mut lines: Vec<(usize, String)> = text(&out.stdout)
        .lines()
        .map(|l| {
            let (r, list) = l.split_once(' ').unwrap();
            (r.parse().unwrap(), list.to_string())
        })
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, l)| l).collect()
}

#[test]
fn bind_to_gives_each_rank_cpus_of_its_own() {
    let show = "echo $METAMPI_RANK $(sed -n 's/^Cpus_allowed_list:\\s*//p' /proc/self/status)";
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = ours
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let k = cpus.min(4);
    let n = k.to_string();

    // Unbound, ranks may use what the launcher may.
    let out = metampi(&["run", "-n", &n, "sh", "-c", show]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        cpu_lists(&out).iter().all(|l| *l == ours),
        "{:?}",
        cpu_lists(&out)
    );

    // One hardware thread each, all different while there are enough.
    let out = metampi(&["run", "-n", &n, "--bind-to", "hwthread", "sh", "-c", show]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let lists = cpu_lists(&out);
    assert_eq!(lists.len(), k);
    for l in &lists {
        assert!(l.parse::<usize>().is_ok(), "a single CPU, not {l}");
    }
    let mut distinct = lists.clone();
    distinct.dedup();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), k, "{lists:?}");

    // More ranks than threads: they share, round-robin, and the launcher says so.
    let more = (cpus + 1).to_string();
    let out = metampi(&[
        "run",
        "-n",
        &more,
        "--bind-to",
        "hwthread",
        "sh",
        "-c",
        show,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("several ranks share one"),
        "{}",
        text(&out.stderr)
    );
    let lists = cpu_lists(&out);
    assert_eq!(
        lists[0], lists[cpus],
        "rank {cpus} wraps round to rank 0's CPU"
    );

    // Whole cores: a rank's list is a core's hardware threads, never all of ours
    // where there are several cores.
    let out = metampi(&["run", "-n", "1", "--bind-to", "core", "sh", "-c", show]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    if cpus > 1 {
        let core_of_cpu0 =
            std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list");
        match core_of_cpu0 {
            Ok(siblings) if ours.starts_with('0') => {
                assert_eq!(cpu_lists(&out)[0], siblings.trim());
            }
            _ => assert_ne!(cpu_lists(&out)[0], ours),
        }
    }
}

#[test]
fn help_documents_every_option() {
    let out = metampi(&["run", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for needle in [
        "-n",
        "--hosts",
        "--hostfile",
        "--launch",
        "-x",
        "--env-all",
        "--tag-output",
        "--output-dir",
        "--stdin",
        "--timeout",
        "--debug",
        "--bind-to",
        "METAMPI_PMI",
        "METAMPI_LOCAL_SIZE",
        "Exit status",
        ":",
    ] {
        assert!(help.contains(needle), "help lacks {needle}");
    }
}

#[test]
fn check_prints_layout_and_reports_errors_with_position() {
    let dir = std::env::temp_dir().join(format!("metampi-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.cfg");
    std::fs::write(
        &good,
        "METAHOST a { TYPE = ch_shmem; NODES = a0; NPROCS = 2; LAUNCH = local; }\n\
         METAHOST b { TYPE = ch_shmem; NODES = b0; NPROCS = 3; LAUNCH = local; }\n\
         PAIR a b 1\n a0 -> b0\n PAIR b a 1\n b0 -> a0\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("check")
        .arg(&good)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("2 meta hosts"), "{text}");
    assert!(text.contains("2-4"), "ranks of b should be 2-4: {text}");
    let bad = dir.join("bad.cfg");
    std::fs::write(&bad, "METAHOST a {\n  NODES = a0;\n  BOGUS = 1;\n}\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("check")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.cfg:3:"),
        "error must name file and line: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn meta_job_runs_across_three_emulated_sites() {
    let dir = std::env::temp_dir().join(format!("metampi-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("three.cfg");
    std::fs::write(
        &cfg,
        "PORTBASE 24600\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
         METAHOST c { LAUNCH = local; NPROCS = 2; NODES = c0; }\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n",
    )
    .unwrap();
    let exe = env!("CARGO_BIN_EXE_metampi");
    let out = std::process::Command::new(exe)
        .args(["run", "--meta"])
        .arg(&cfg)
        .args([exe, "demo-rank"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ring token      : 10 (expected 10)"),
        "{text}"
    );
    assert!(text.contains("demo: OK"), "{text}");
    // -n that contradicts the file is refused before anything starts.
    let out = std::process::Command::new(exe)
        .args(["run", "-n", "3", "--meta"])
        .arg(&cfg)
        .args([exe, "demo-rank"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("differs"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `metampi info`'s report with `vars` set; it must succeed.
fn info_with(vars: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .arg("info")
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// `metampi info` names the versions and this machine's transports, says
/// why single-copy transfer is off when it is, and lists the METAMPI_*
/// variables without printing the job secret.
#[test]
fn info_reports_versions_transports_and_variables() {
    let s = info_with(&[
        ("METAMPI_NO_CMA", "1"),
        ("METAMPI_SECRET", "0123456789abcdef"),
    ]);
    let line = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}` line in:\n{s}"))
            .to_string()
    };
    assert!(line("MPI standard").ends_with(" 3.1"), "{s}");
    assert!(line("library").contains("metampi "), "{s}");
    assert!(
        line("cross-memory attach").contains("off (METAMPI_NO_CMA)"),
        "{s}"
    );
    assert!(line("router link compression").contains("lz4"), "{s}");
    assert!(line("shared memory").contains("free"), "{s}");
    assert!(s.contains("METAMPI_NO_CMA=1"), "{s}");
    assert!(s.contains("METAMPI_SECRET=(set)"), "{s}");
    assert!(
        !s.contains("0123456789abcdef"),
        "the secret was printed:\n{s}"
    );
}

/// A misspelt `METAMPI_*` name and a value its setting refuses are named in
/// `metampi info`, with the nearest known name for the misspelling.
#[test]
fn info_names_misspelt_and_malformed_settings() {
    let s = info_with(&[
        ("METAMPI_EAGER_LIMT", "4096"),
        ("METAMPI_FORCE_TCP", "maybe"),
        ("METAMPI_SHM_RING", "262144"),
    ]);
    let line = |key: &str| {
        s.lines()
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("no `{key}` line in:\n{s}"))
            .to_string()
    };
    assert!(
        line("METAMPI_EAGER_LIMT=").contains("did you mean METAMPI_EAGER_LIMIT?"),
        "{s}"
    );
    assert!(line("METAMPI_FORCE_TCP=").contains("not on or off"), "{s}");
    assert!(!line("METAMPI_SHM_RING=").contains("warning"), "{s}");
}

/// `metampi info` prints the tuning the settings resolve to, and names a value the tuning's
/// rules replace.
#[test]
fn info_prints_the_resolved_tuning() {
    let s = info_with(&[]);
    for want in [
        "eager limits             shared memory 64 KiB, TCP 64 KiB, to other sites 512 KiB",
        "shared-memory rings      256 KiB per sender",
        "cooperative copy         from 64 KiB",
    ] {
        assert!(s.contains(want), "no `{want}` in:\n{s}");
    }
    let s = info_with(&[
        ("METAMPI_EAGER_LIMIT", "2097152"),
        ("METAMPI_SHM_RING", "100000"),
        ("METAMPI_NO_COOP", "1"),
    ]);
    for want in [
        "shared memory 2 MiB, TCP 2 MiB, to other sites 1048512 bytes",
        "<- warning: METAMPI_EAGER_LIMIT=2097152: routers take frames of at most 1 MiB",
        "shared-memory rings      128 KiB per sender",
        "<- warning: METAMPI_SHM_RING=100000: a ring is a power of two",
        "cooperative copy         off",
    ] {
        assert!(s.contains(want), "no `{want}` in:\n{s}");
    }
}

/// `kill -USR1` to the launcher prints where each rank is and the job goes on: rank 0 waits
/// for rank 1's message, rank 1 computes until the test lets it go.
#[test]
fn sigusr1_prints_where_each_rank_waits() {
    const NAME: &str = "sigusr1_prints_where_each_rank_waits";
    if let Some(go) = std::env::var_os("METAMPI_TEST_GO_FILE") {
        // A rank of the job below.
        use metampi::traits::*;
        let universe = metampi::initialize().unwrap();
        let world = universe.world();
        if world.rank() == 1 {
            println!("rank 1 computes");
            while !PathBuf::from(&go).exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
            world.process_at_rank(0).send_with_tag(&9u32, 3);
        } else {
            let _ = world.process_at_rank(1).receive_with_tag::<u32>(3);
        }
        return;
    }
    let go = temp_dir("usr1").join("go");
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["run", "-n", "2", "--timeout", "60", "-x"])
        .arg(format!("METAMPI_TEST_GO_FILE={}", go.display()))
        .arg(&exe)
        .args([NAME, "--exact", "--nocapture", "-q", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let collect = |mut from: Box<dyn std::io::Read + Send>| {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                into.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        seen
    };
    let stdout = collect(Box::new(child.stdout.take().unwrap()));
    let stderr = collect(Box::new(child.stderr.take().unwrap()));
    let t0 = Instant::now();
    // The launcher catches SIGUSR1 from before the ranks start; rank 1's line says they have.
    while !stdout.lock().unwrap().contains("rank 1 computes") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Until rank 0 has gone to sleep in its receive, the report says it is in no wait.
    let mut report = String::new();
    while !report.contains("a receive from rank 1, tag 3") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no report with rank 0's receive: {}",
            stderr.lock().unwrap()
        );
        let kill = Command::new("kill")
            .args(["-USR1", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        std::thread::sleep(Duration::from_millis(300));
        report = stderr.lock().unwrap().clone();
    }
    assert!(
        report.contains("where each rank is (asked with SIGUSR1)"),
        "{report}"
    );
    let rank1 = report
        .lines()
        .rfind(|l| l.starts_with("  rank 1 ("))
        .unwrap_or_default();
    assert!(rank1.contains("running, in no MPI wait"), "{report}");
    std::fs::write(&go, b"").unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", stderr.lock().unwrap());
}

/// A meta job that deadlocks ends after `--stall-timeout` with a report that names what each
/// rank waits for and adds the routers' queues and links.
#[test]
fn a_stalled_meta_job_reports_its_routers_too() {
    const NAME: &str = "a_stalled_meta_job_reports_its_routers_too";
    if std::env::var_os("METAMPI_TEST_DEADLOCK").is_some() {
        // A rank of the job below: each waits for the other.
        use metampi::traits::*;
        let universe = metampi::initialize().unwrap();
        let world = universe.world();
        let other = 1 - world.rank();
        let _ = world.process_at_rank(other).receive_with_tag::<u32>(4);
        return;
    }
    let dir = temp_dir("stalled-meta");
    let cfg = dir.join("two.meta");
    std::fs::write(
        &cfg,
        "PORTBASE 28500\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST b { LAUNCH = local; NPROCS = 1; NODES = b0; }\n\
         PAIR a b 1\na0 <-> b0\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["run", "--timeout", "60", "--stall-timeout", "2", "--meta"])
        .arg(&cfg)
        .args(["-x", "METAMPI_TEST_DEADLOCK=1"])
        .arg(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "-q", "--test-threads=1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("a receive from rank 1, tag 4"), "{err}");
    assert!(err.contains("routers and links:"), "{err}");
    assert!(err.contains("r0 a -> b"), "{err}");
    assert!(err.contains("messages"), "{err}");
}

#[test]
fn ranks_start_in_the_directory_wdir_names_in_every_spelling() {
    let dir = temp_dir("wdir");
    let d = dir.to_str().unwrap();
    for spelling in ["--wdir", "-wdir", "-wd", "--wd"] {
        let out = metampi(&["run", "-n", "2", spelling, d, "pwd"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let real = std::fs::canonicalize(&dir).unwrap();
        for line in sorted_lines(&out.stdout) {
            assert_eq!(
                std::fs::canonicalize(&line).unwrap(),
                real,
                "{spelling}: {line}"
            );
        }
    }
    let missing = dir.join("not-there");
    let out = metampi(&[
        "run",
        "-n",
        "1",
        "--wdir",
        missing.to_str().unwrap(),
        "true",
    ]);
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(err.contains("--wdir") && err.contains("not-there"), "{err}");
}

#[test]
fn report_bindings_names_each_ranks_cpus() {
    let out = metampi(&[
        "run",
        "--bind-to",
        "hwthread",
        "--report-bindings",
        "-n",
        "2",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for r in 0..2 {
        assert!(
            err.contains(&format!("rank {r} on ")) && err.contains("bound to CPUs "),
            "{err}"
        );
    }
    let out = metampi(&["run", "--report-bindings", "-n", "1", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("rank 0 on ") && text(&out.stderr).contains("not bound"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn open_mpi_ranks_per_node_is_understood_and_other_mappings_named() {
    // Two emulated machines with one rank each.
    let out = metampi(&[
        "run",
        "--launch",
        "local",
        "--host",
        "nodeA,nodeB",
        "--map-by",
        "ppr:1:node",
        "-n",
        "2",
        "sh",
        "-c",
        "echo $METAMPI_NODE",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&out.stdout), ["nodeA", "nodeB"]);
    let out = metampi(&["run", "--map-by", "core", "-n", "2", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("ppr:N:node") && err.contains("--bind-to"),
        "{err}"
    );
}
