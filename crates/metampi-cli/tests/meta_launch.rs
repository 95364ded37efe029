//! `metampi run --meta` with meta hosts started through ssh, a command template, and by hand,
//! next to meta hosts on this machine: the real binary, real routers, real ranks exchanging
//! messages between sites (`metampi demo-rank`: a token around the ring of all ranks, then an
//! all-reduce).
//!
//! There is no sshd here: a fake `ssh` (a shell script first in `PATH`) records its arguments
//! and runs the remote command on this machine with `sh -c`, which is what sshd does with it
//! on the far side. Commands printed for meta hosts started by hand are run with `sh -c` too.
//! Every site's addresses are 127.0.0.1, and `--pmi-host 127.0.0.1` tells "remote" ranks where
//! the launcher is.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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

fn assert_demo_ok(out: &Output, ranks: usize) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    let token: usize = (1..ranks).sum();
    assert!(
        stdout.contains(&format!("ring token      : {token} (expected {token})")),
        "{stdout}"
    );
    assert!(stdout.contains("demo: OK"), "{stdout}");
}

/// A job secret the description names with `SECRET_FILE ~/secret` (HOME is the scratch
/// directory), so that the test knows it.
const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Sites a (here, 1 rank), b (through ssh, 2 ranks), c (here, 2 ranks), all pairs joined. b's
/// node has its own address, 127.0.0.2 (all of 127/8 is this machine), so that what reaches
/// it can be told from what stays at 127.0.0.1.
fn ssh_sites(s: &Scratch, port_base: u16) -> PathBuf {
    s.write("secret", &format!("{SECRET}\n"));
    s.write(
        "ssh.cfg",
        &format!(
            "PORTBASE {port_base}\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = ssh me@b0.example.org; NPROCS = 2; NODES = b0 (127.0.0.2); }}\n\
             METAHOST c {{ LAUNCH = local; NPROCS = 2; NODES = c0; }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
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
    assert!(log.contains("vertical=127.0.0.2:0;"), "{log}");
    assert!(log.contains("1>0@127.0.0.2:"), "{log}");
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
    fn start(s: &Scratch, line: &str) -> ByHand {
        let child = Command::new("sh")
            .arg("-c")
            .arg(line)
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
fn run_printing_commands(s: &Scratch, mut cmd: Command) -> (Output, Vec<(String, ByHand)>) {
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
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("( ") {
            started.push((line.clone(), ByHand::start(s, &line)));
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
        err.contains("ranks 3, 4 (started by hand on c.c0) did not join within 1 s"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
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
