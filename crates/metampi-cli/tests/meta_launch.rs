//! `metampi run --meta` with meta hosts started through ssh, a command template, and by hand,
//! next to meta hosts on this machine: the real binary, real routers, real ranks exchanging
//! messages between sites (`metampi demo-rank`: a token around the ring of all ranks, then an
//! all-reduce).
//!
//! There is no sshd here: a fake `ssh` (a shell script first in `PATH`) records its arguments
//! and runs the remote command on this machine with `sh -c`, which is what sshd does with it
//! on the far side (asked to, it also plays a connection that dies: see [`Scratch::new`]).
//! Commands printed for meta hosts started by hand are run with `sh -c` too. Sites' addresses
//! are loopback addresses (127.0.0.2 for the ssh site where it can be bound, see
//! [`ssh_site_address`]), and `--pmi-host 127.0.0.1` tells "remote" ranks where the launcher
//! is.

mod common;

use common::assert_demo_ok;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_metampi");

/// A fresh directory for one test, with the fake ssh in `bin/`.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("metampi-ml-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let ssh = dir.join("bin/ssh");
        // One write per call, so lines of concurrent calls do not mix.
        std::fs::write(
            &ssh,
            "#!/bin/sh\n\
             # Fake ssh: records its arguments, then runs the remote command (the last\n\
             # argument) here, as sshd would hand it to the login shell; the host\n\
             # `unreachable` fails as real ssh would.\n\
             line=ssh\n\
             for a in \"$@\"; do line=\"$line [$a]\"; done\n\
             printf '%s\\n' \"$line\" >> \"$FAKE_SSH_LOG\"\n\
             case \"$*\" in *unreachable*)\n\
             echo 'ssh: Could not resolve hostname unreachable' >&2; exit 255;; esac\n\
             for last in \"$@\"; do :; done\n\
             # A command holding FAKE_SSH_DROP loses its connection after\n\
             # FAKE_SSH_DROP_AFTER seconds. As with sshd, it runs apart from ssh (its own\n\
             # session: what stops ssh does not reach it) with its stdio through pipes\n\
             # that end with the connection.\n\
             if [ -n \"${FAKE_SSH_DROP:-}\" ]; then case \"$last\" in *\"$FAKE_SSH_DROP\"*)\n\
             d=$(mktemp -d) && mkfifo \"$d/i\" \"$d/o\" \"$d/e\" || exit 255\n\
             exec 3<&0\n\
             setsid sh -c \"$last\" <\"$d/i\" >\"$d/o\" 2>\"$d/e\" &\n\
             cat <&3 >\"$d/i\" & i=$!\n\
             cat \"$d/o\" & o=$!\n\
             cat \"$d/e\" >&2 & e=$!\n\
             sleep \"$FAKE_SSH_DROP_AFTER\"\n\
             kill $i $o $e 2>/dev/null; rm -rf \"$d\"\n\
             echo 'client_loop: send disconnect: Broken pipe' >&2; exit 255;; esac; fi\n\
             exec sh -c \"$last\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn ssh_log(&self) -> String {
        std::fs::read_to_string(self.path("ssh.log")).unwrap_or_default()
    }

    /// `metampi run --meta CFG --pmi-host 127.0.0.1 ARGS...` with the fake ssh first in PATH
    /// and HOME in the scratch directory.
    fn metampi(&self, cfg: &Path, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(EXE);
        cmd.args([
            "run",
            "--timeout",
            "60",
            "--pmi-host",
            "127.0.0.1",
            "--meta",
        ])
        .arg(cfg)
        .args(args)
        .env("PATH", path)
        .env("HOME", &self.dir)
        .env("FAKE_SSH_LOG", self.path("ssh.log"))
        .env_remove("METAMPI_SECRET");
        cmd
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_with_stdin(mut cmd: Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A job secret the description names with `SECRET_FILE ~/secret` (HOME is the scratch
/// directory), so that the test knows it.
const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The address of the ssh site's node: 127.0.0.2 where it can be bound (on Linux all of 127/8
/// is this machine), so that what reaches that node can be told from what stays at 127.0.0.1;
/// else 127.0.0.1, with a note, since some systems have no other loopback address.
fn ssh_site_address() -> &'static str {
    static ADDRESS: OnceLock<&'static str> = OnceLock::new();
    ADDRESS.get_or_init(|| match std::net::TcpListener::bind("127.0.0.2:0") {
        Ok(_) => "127.0.0.2",
        Err(e) => {
            eprintln!(
                "note: 127.0.0.2 cannot be bound here ({e}); the ssh site uses 127.0.0.1, so \
                 these tests cannot tell its addresses from the launcher's"
            );
            "127.0.0.1"
        }
    })
}

/// Sites a (here, 1 rank), b (through ssh, 2 ranks), c (here, 2 ranks), all pairs joined. b's
/// node has its own address ([`ssh_site_address`]).
fn ssh_sites(s: &Scratch, port_base: u16) -> PathBuf {
    s.write("secret", &format!("{SECRET}\n"));
    s.write(
        "ssh.cfg",
        &format!(
            "PORTBASE {port_base}\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = ssh me@b0.example.org; NPROCS = 2; NODES = b0 ({}); }}\n\
             METAHOST c {{ LAUNCH = local; NPROCS = 2; NODES = c0; }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n",
            ssh_site_address()
        ),
    )
}

#[test]
fn meta_launch_ssh_site_runs_with_local_sites() {
    let s = Scratch::new("ssh");
    let cfg = ssh_sites(&s, 24810);
    let out = run_with_stdin(s.metampi(&cfg, &[EXE, "demo-rank"]), b"");
    assert_demo_ok(&out, 5);
    let log = s.ssh_log();
    let calls: Vec<&str> = log.lines().collect();
    // Meta host b: its two routers (to a and to c) and its two ranks, each through ssh with
    // BatchMode to the destination of LAUNCH (one node: no jump host).
    assert_eq!(calls.len(), 4, "{log}");
    for call in &calls {
        assert!(
            call.starts_with("ssh [-o] [BatchMode=yes] [me@b0.example.org] [sh -c "),
            "{call}"
        );
        assert!(call.contains("cd "), "{call}");
    }
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.contains("METAMPI_ROUTER_SPEC="))
            .count(),
        2,
        "{log}"
    );
    // b's routers listen for its ranks on the node's address, and its ranks are told so;
    // they reach the launcher at --pmi-host.
    let b = ssh_site_address();
    assert!(log.contains(&format!("vertical={b}:0;")), "{log}");
    assert!(log.contains(&format!("1>0@{b}:")), "{log}");
    assert!(log.contains("METAMPI_PMI=127.0.0.1:"), "{log}");
    // The secret travels on stdin, never in an argument list that ps would show.
    assert!(!log.contains(SECRET), "{log}");
}

#[test]
fn meta_launch_ssh_rank_that_dies_ends_the_job_and_is_named() {
    let s = Scratch::new("ssh-crash");
    let cfg = ssh_sites(&s, 24830);
    // Rank 2 (on b, through ssh) exits with 7 at once; the others would wait for it forever.
    let script = "if [ \"$METAMPI_RANK\" = 2 ]; then exit 7; fi; exec \"$0\" demo-rank";
    let t0 = std::time::Instant::now();
    let out = run_with_stdin(s.metampi(&cfg, &["sh", "-c", script, EXE]), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(err.contains("rank 2 (pid "), "{err}");
    assert!(err.contains("on b.b0) exited with code 7"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

#[test]
fn meta_launch_ssh_ranks_get_stdin_and_their_output_comes_back() {
    let s = Scratch::new("ssh-stdin");
    let cfg = ssh_sites(&s, 24850);
    let cmd = s.metampi(
        &cfg,
        &[
            "--stdin",
            "all",
            "--tag-output",
            "sh",
            "-c",
            "read l; echo \"$METAMPI_NODE $l\"",
        ],
    );
    let out = run_with_stdin(cmd, b"hello there\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[0] a.a0 hello there",
            "[1] b.b0 hello there",
            "[2] b.b0 hello there",
            "[3] c.c0 hello there",
            "[4] c.c0 hello there"
        ]
    );
}

/// Whether process `pid` still runs (a zombie does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(!stat.rsplit_once(") ")?.1.starts_with('Z')))
        .unwrap_or(false)
}

/// Kills the process group of `pid`, if it still runs.
fn kill_group_of(pid: u32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name: state, ppid, pgrp.
    let pgrp = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().nth(2).map(String::from));
    if let Some(pgrp) = pgrp {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgrp}")])
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn meta_launch_ssh_rank_reading_stdin_stops_when_its_connection_dies() {
    let s = Scratch::new("ssh-drop");
    let cfg = ssh_sites(&s, 24970);
    let pid_file = s.path("rank1.pid");
    // Rank 1 (on b, through ssh) reads a line of the launcher's stdin, then waits, as do the
    // others; its ssh connection dies after 3 s.
    let script = format!(
        "if [ \"$METAMPI_RANK\" = 1 ]; then echo $$ > {}; read l; echo \"rank 1 read $l\"; fi; \
         exec sleep 120",
        pid_file.display()
    );
    let mut cmd = s.metampi(&cfg, &["--stdin", "1", "sh", "-c", &script]);
    cmd.env("FAKE_SSH_DROP", " METAMPI_RANK=1 ")
        .env("FAKE_SSH_DROP_AFTER", "3");
    let out = run_with_stdin(cmd, b"hello\n");
    let err = text(&out.stderr);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("rank 1 did not start: {err}"));
    // The rank on the far side is stopped, not left waiting for ever.
    let t0 = Instant::now();
    while running(pid) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = running(pid);
    kill_group_of(pid);
    assert!(
        !left,
        "rank 1 still runs on the far side 10 s after the job ended: {err}"
    );
    // The launcher reports the rank whose ssh ended, with ssh's status.
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(err.contains("rank 1 (pid "), "{err}");
    assert!(err.contains("on b.b0) exited with code 255"), "{err}");
    assert!(
        text(&out.stdout).contains("rank 1 read hello"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn meta_launch_template_site_fills_in_node_and_host() {
    let s = Scratch::new("template");
    let cfg = s.write(
        "template.cfg",
        "PORTBASE 24870\n\
         METAHOST a { LAUNCH = local; NPROCS = 2; NODES = a0; }\n\
         METAHOST b { LAUNCH = \"env WHERE={host}/{node} sh -c {cmd}\"; NPROCS = 2; NODES = b0 (127.0.0.1); }\n\
         PAIR a b 1\na0 <-> b0\n",
    );
    let script = "echo \"where $METAMPI_RANK ${WHERE:-here}\" >&2; exec \"$0\" demo-rank";
    let out = run_with_stdin(s.metampi(&cfg, &["sh", "-c", script, EXE]), b"");
    assert_demo_ok(&out, 4);
    let err = text(&out.stderr);
    for line in [
        "where 0 here",
        "where 1 here",
        "where 2 b/b0",
        "where 3 b/b0",
    ] {
        assert!(err.contains(line), "{line}: {err}");
    }
    assert!(s.ssh_log().is_empty());
}

/// Sites a (here, 1 rank), b (here, 2 ranks), c (by hand, 2 ranks on c0).
fn manual_sites(s: &Scratch, port_base: u16) -> PathBuf {
    s.write("secret", &format!("{SECRET}\n"));
    s.write(
        "manual.cfg",
        &format!(
            "PORTBASE {port_base}\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
             METAHOST c {{ LAUNCH = manual; NPROCS = 2; NODES = c0 (127.0.0.1); }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
        ),
    )
}

/// A command printed for a machine started by hand, run there (here) with `sh -c` in a
/// process group of its own.
struct ByHand {
    pgid: u32,
    done: mpsc::Receiver<std::io::Result<Output>>,
}

impl ByHand {
    fn start(s: &Scratch, line: &str, env: &[(&str, &str)]) -> ByHand {
        let child = Command::new("sh")
            .arg("-c")
            .arg(line)
            .envs(env.iter().copied())
            .env("HOME", &s.dir)
            .env_remove("METAMPI_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let (tx, done) = mpsc::channel();
        // A thread waits, so that the test can wait with a limit (recv_timeout).
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        ByHand { pgid, done }
    }

    /// Its output, once it has ended within `limit`; whatever it left running is killed.
    fn finish(self, limit: Duration) -> Option<Output> {
        let out = self.done.recv_timeout(limit).ok().and_then(Result::ok);
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pgid)])
            .stderr(Stdio::null())
            .status();
        out
    }
}

/// Starts `cmd` with stderr piped; runs every command it prints for a machine started by hand
/// (the lines that open a subshell) as soon as it appears. Returns the launcher's output and
/// the commands it printed.
fn run_printing_commands(s: &Scratch, cmd: Command) -> (Output, Vec<(String, ByHand)>) {
    let (out, started) = run_printing_commands_with(s, cmd, &[], None, &mut |_, _| {});
    let started = started
        .into_iter()
        .map(|(_, line, job)| (line, job))
        .collect();
    (out, started)
}

/// [`run_printing_commands`], with `env` added to the commands' environment, the command for
/// machine `late` started 2 s after it is printed, and `started_one` called with the machine
/// and process group of each command as it starts. Returns the machine (`c.c0`), the text and
/// the running command of each.
fn run_printing_commands_with(
    s: &Scratch,
    mut cmd: Command,
    env: &[(&str, &str)],
    late: Option<&str>,
    started_one: &mut dyn FnMut(&str, u32),
) -> (Output, Vec<(String, String, ByHand)>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let mut r = BufReader::new(stdout);
        std::io::Read::read_to_end(&mut r, &mut v).unwrap();
        v
    });
    let mut stderr = Vec::new();
    let mut started = Vec::new();
    let mut machine = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        // `metampi run: start ... on MACHINE by hand: run this command ...`
        if let Some((head, _)) = line.split_once(" by hand: ") {
            machine = head.rsplit(" on ").next().unwrap_or_default().to_string();
        }
        if line.starts_with("( ") {
            let job = if late == Some(machine.as_str()) {
                ByHand::start(s, &format!("sleep 2; {line}"), env)
            } else {
                ByHand::start(s, &line, env)
            };
            started_one(&machine, job.pgid);
            started.push((machine.clone(), line.clone(), job));
        }
        stderr.extend_from_slice(line.as_bytes());
        stderr.push(b'\n');
    }
    let status = child.wait().unwrap();
    let out = Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr,
    };
    (out, started)
}

#[test]
fn meta_launch_manual_site_runs_the_printed_command() {
    let s = Scratch::new("manual");
    let cfg = manual_sites(&s, 24890);
    let (out, by_hand) = run_printing_commands(
        &s,
        s.metampi(&cfg, &["--join-timeout", "30", EXE, "demo-rank"]),
    );
    let err = text(&out.stderr);
    assert_eq!(by_hand.len(), 1, "one command for node c0: {err}");
    assert!(
        err.contains("start ranks 3-4, router 4, router 5 on c.c0 by hand"),
        "{err}"
    );
    assert!(err.contains("waiting up to 30 s"), "{err}");
    // The command reads the secret from SECRET_FILE on its machine.
    let (line, job) = by_hand.into_iter().next().unwrap();
    assert!(
        line.contains("METAMPI_SECRET=$(cat \"$HOME\"/secret)"),
        "{line}"
    );
    assert!(!line.contains(SECRET), "{line}");
    assert!(!err.contains("contain the job secret"), "{err}");
    assert_demo_ok(&out, 5);
    // The command ends by itself once its ranks are done (and its routers' grace is over).
    let by_hand = job
        .finish(Duration::from_secs(30))
        .expect("the command run by hand ended");
    assert!(
        by_hand.status.success(),
        "{:?}\n{}\n{}",
        by_hand.status,
        text(&by_hand.stdout),
        text(&by_hand.stderr)
    );
}

#[test]
fn meta_launch_manual_rank_that_dies_ends_the_job_and_is_named() {
    let s = Scratch::new("manual-crash");
    let cfg = manual_sites(&s, 24910);
    // Rank 3 (by hand, on c) joins and is killed a moment later, while rank 0 is still
    // asleep, so the job cannot have finished.
    let script = "case $METAMPI_RANK in \
        3) \"$0\" demo-rank & p=$!; sleep 1; kill -9 $p; exit 9;; \
        0) sleep 5;; \
        esac; exec \"$0\" demo-rank";
    let (out, by_hand) = run_printing_commands(
        &s,
        s.metampi(&cfg, &["--join-timeout", "30", "sh", "-c", script, EXE]),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "rank 3 (started by hand on c.c0) closed its connection to the launcher without \
             calling finalize"
        ),
        "{err}"
    );
    for (_, job) in by_hand {
        job.finish(Duration::from_secs(10));
    }
}

#[test]
fn meta_launch_manual_ranks_that_never_join_are_named() {
    let s = Scratch::new("manual-absent");
    let cfg = manual_sites(&s, 24930);
    let t0 = std::time::Instant::now();
    // Nobody runs the printed command.
    let out = run_with_stdin(
        s.metampi(&cfg, &["--join-timeout", "1", EXE, "demo-rank"]),
        b"",
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(
        err.contains(
            "ranks 3, 4 and router 4, router 5 (started by hand on c.c0) did not join within 1 s"
        ),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
}

/// Sites a (here, 1 rank), b (here, 2 ranks), c (by hand): its node c0 runs its 2 ranks, c1
/// (no ranks) its routers 4 and 5, to a and to b.
fn router_node_sites(s: &Scratch, port_base: u16) -> PathBuf {
    s.write("secret", &format!("{SECRET}\n"));
    s.write(
        "routers.cfg",
        &format!(
            "PORTBASE {port_base}\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
             METAHOST c {{ LAUNCH = manual; NPROCS = 2; NODES = c0 (127.0.0.1), c1 0 (127.0.0.1); }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c1\nPAIR b c 1\nb0 <-> c1\n"
        ),
    )
}

#[test]
fn meta_launch_manual_routers_without_ranks_join_and_leave_with_the_job() {
    let s = Scratch::new("manual-routers");
    let cfg = router_node_sites(&s, 25170);
    // Links that are gone would end a router only after a minute here. The routers' machine
    // is started last, as may happen: the ranks wait for its routers.
    let (out, by_hand) = run_printing_commands_with(
        &s,
        s.metampi(&cfg, &["--join-timeout", "30", EXE, "demo-rank"]),
        &[("METAMPI_LINK_TIMEOUT", "60")],
        Some("c.c1"),
        &mut |_, _| {},
    );
    let err = text(&out.stderr);
    assert_demo_ok(&out, 5);
    // Both commands end with the job: the routers of c1 are told that it is over.
    let machines: Vec<String> = by_hand.iter().map(|(m, _, _)| m.clone()).collect();
    let mut lines = Vec::new();
    for (machine, line, job) in by_hand {
        let t0 = Instant::now();
        let out = job
            .finish(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{machine}: still running 10 s after the job ended"));
        assert!(
            out.status.success(),
            "{machine}: {:?}\n{}",
            out.status,
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("lost the connection"),
            "{}",
            text(&out.stderr)
        );
        eprintln!("{machine} ended {:?} after the launcher", t0.elapsed());
        lines.push(line);
    }
    // The routers-only machine's command comes first; its routers report to the launcher.
    assert_eq!(machines, ["c.c1", "c.c0"], "{err}");
    assert!(
        err.contains("start router 4, router 5 on c.c1 by hand"),
        "{err}"
    );
    assert!(err.contains("start ranks 3-4 on c.c0 by hand"), "{err}");
    assert!(
        err.contains("for the ranks and the other processes started by hand"),
        "{err}"
    );
    for helper in ["METAMPI_HELPER=0 ", "METAMPI_HELPER=1 "] {
        assert!(lines[0].contains(helper), "{}", lines[0]);
    }
    assert!(lines[0].contains("METAMPI_PMI=127.0.0.1:"), "{}", lines[0]);
    assert!(!lines[1].contains("METAMPI_HELPER"), "{}", lines[1]);
}

#[test]
fn meta_launch_manual_routers_without_ranks_that_never_join_are_named() {
    let s = Scratch::new("manual-routers-absent");
    let cfg = router_node_sites(&s, 24990);
    // Nobody runs the printed commands.
    let out = run_with_stdin(
        s.metampi(&cfg, &["--join-timeout", "1", EXE, "demo-rank"]),
        b"",
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(
        err.contains(
            "ranks 3, 4 and router 4, router 5 (started by hand on c.c0, c.c1) did not join \
             within 1 s: run the commands printed for c.c0, c.c1 on those machines"
        ),
        "{err}"
    );
}

#[test]
fn meta_launch_manual_router_that_goes_away_ends_the_job_and_is_named() {
    let s = Scratch::new("manual-router-gone");
    let cfg = router_node_sites(&s, 25190);
    // The ranks take their time to start; meanwhile the command on c1 is stopped (Ctrl-C
    // there, say), and its routers with it.
    let script = "sleep 10; exec \"$0\" demo-rank";
    let t0 = Instant::now();
    let (out, by_hand) = run_printing_commands_with(
        &s,
        s.metampi(&cfg, &["--join-timeout", "30", "sh", "-c", script, EXE]),
        &[],
        None,
        &mut |machine, pgid| {
            if machine == "c.c1" {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(1500));
                    let _ = Command::new("kill")
                        .args(["-TERM", "--", &format!("-{pgid}")])
                        .status();
                });
            }
        },
    );
    let err = text(&out.stderr);
    for (_, _, job) in by_hand {
        job.finish(Duration::from_secs(1));
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "(started by hand on c.c1) closed its connection to the launcher while the job ran"
        ),
        "{err}"
    );
    // Noticed when it happened, not when the ranks would have needed the routers.
    assert!(t0.elapsed() < Duration::from_secs(7), "{:?}", t0.elapsed());
}

#[test]
fn meta_launch_refuses_pacx_startup_commands_and_bad_destinations() {
    let s = Scratch::new("refuse");
    // A PACX-MPI hostfile whose second machine has a startup command: that command would
    // start the machine's own MPI.
    let pacx = s.write(
        "pacx.hosts",
        "localhost 1 tcp
host2 1 tcp (rsh host2 mpirun -np 3 ./exename)
",
    );
    let out = run_with_stdin(s.metampi(&pacx, &["true"]), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "meta host `host2`: the PACX-MPI startup command `rsh host2 mpirun -np 3 ./exename`"
        ),
        "{err}"
    );
    assert!(err.contains("LAUNCH = ssh HOST"), "{err}");
    let cfg = s.write(
        "bad.cfg",
        "METAHOST a { LAUNCH = local; NODES = a0; }
         METAHOST b { LAUNCH = ssh b0:http; NODES = b0 (127.0.0.1); }
         PAIR a b 1
a0 <-> b0
",
    );
    let out = run_with_stdin(s.metampi(&cfg, &["true"]), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("meta host `b`: LAUNCH = ssh b0:http: ssh destination `b0:http`: port `http` is not a port number"),
        "{err}"
    );
    // Nothing was started through ssh.
    assert!(s.ssh_log().is_empty());
}

#[test]
fn meta_launch_ssh_failure_is_reported_with_ssh_s_own_message() {
    let s = Scratch::new("ssh-fails");
    let cfg = s.write(
        "unreachable.cfg",
        "PORTBASE 24950\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST b { LAUNCH = ssh unreachable; NPROCS = 1; NODES = b0 (127.0.0.1); }\n\
         PAIR a b 1\na0 <-> b0\n",
    );
    let out = run_with_stdin(s.metampi(&cfg, &[EXE, "demo-rank"]), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ssh: Could not resolve hostname unreachable"),
        "{err}"
    );
    assert!(
        err.contains("router 1 of meta host `b` on node b0 did not start"),
        "{err}"
    );
}

#[test]
fn a_router_killed_in_a_quiet_job_ends_it_at_once_named() {
    let s = Scratch::new("quiet");
    let cfg = s.write(
        "three.cfg",
        "PORTBASE 24970\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST b { LAUNCH = local; NPROCS = 2; NODES = b0; }\n\
         METAHOST c { LAUNCH = local; NPROCS = 2; NODES = c0; }\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n",
    );
    // The ranks only sleep: no rank talks to a router, so only the launcher can notice.
    let mut job = Command::new(EXE)
        .args(["run", "--timeout", "60", "--meta"])
        .arg(&cfg)
        .args(["sh", "-c", "echo up; exec sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Every rank up means every router is ready.
    let mut out = BufReader::new(job.stdout.take().unwrap());
    for _ in 0..5 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "up\n");
    }
    let children = Command::new("pgrep")
        .args(["-P", &job.id().to_string(), "-f", " router$"])
        .output()
        .unwrap();
    let router: u32 = text(&children.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no router among the launcher's children"));
    let t0 = Instant::now();
    Command::new("kill")
        .args(["-KILL", &router.to_string()])
        .status()
        .unwrap();
    let status = job.wait().unwrap();
    let took = t0.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut job.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}\n{stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("(pid {router}) was killed by signal SIGKILL")),
        "{stderr}"
    );
    assert!(stderr.contains("router "), "{stderr}");
    assert!(stderr.contains("of meta host `"), "{stderr}");
}
