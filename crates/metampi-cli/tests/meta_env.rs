//! `metampi run --meta` applying the per-meta-host settings of the description: `ENV` and
//! `ENVFILE` (the environment of a meta host's ranks and routers), `EXECPATH`, `EXECNAME`,
//! `EXECARGS` and node executables (what its ranks run), `ROUTEREXEC` and `MPIROOT` (what its
//! routers run), for meta hosts started here, through a template, through ssh and by hand;
//! and the refusals (`METAMPI_*` variables, unreadable or malformed `ENVFILE`s), which
//! `metampi check` reports too.
//!
//! As in `meta_launch.rs`, a fake `ssh` first in `PATH` records its arguments and runs the
//! remote command here with `sh -c`; every site's addresses are loopback addresses (127.0.0.2
//! for the ssh site where it can be bound, see [`ssh_site_address`]).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const EXE: &str = env!("CARGO_BIN_EXE_metampi");

/// A job secret the descriptions name with `SECRET_FILE ~/secret` (HOME is the scratch
/// directory), so that the tests can look for it.
const SECRET: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

/// A fresh directory for one test, with the fake ssh in `bin/`.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("metampi-me-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let s = Scratch { dir };
        s.script(
            "bin/ssh",
            "line=ssh\n\
             for a in \"$@\"; do line=\"$line [$a]\"; done\n\
             printf '%s\\n' \"$line\" >> \"$FAKE_SSH_LOG\"\n\
             for last in \"$@\"; do :; done\n\
             exec sh -c \"$last\"\n",
        );
        s.write("secret", &format!("{SECRET}\n"));
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `name` and returns its path as text for a description.
    fn write(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    /// Writes an executable shell script.
    fn script(&self, name: &str, body: &str) -> String {
        let p = self.write(name, &format!("#!/bin/sh\n{body}"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// `metampi ARGS...` in the scratch directory, with the fake ssh first in PATH, HOME here,
    /// `FOO=launcher` in its environment and no `BAR`.
    fn metampi(&self, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(EXE);
        cmd.args(args)
            .current_dir(&self.dir)
            .env("PATH", path)
            .env("HOME", &self.dir)
            .env("FAKE_SSH_LOG", self.path("ssh.log"))
            .env("FOO", "launcher")
            .env_remove("BAR")
            .env_remove("METAMPI_SECRET")
            .stdin(Stdio::null());
        cmd
    }

    /// `metampi run --timeout 60 --pmi-host 127.0.0.1 --meta CFG ARGS...`, run to its end.
    fn run(&self, cfg: &str, args: &[&str]) -> Output {
        let mut all = vec![
            "run",
            "--timeout",
            "60",
            "--pmi-host",
            "127.0.0.1",
            "--meta",
            cfg,
        ];
        all.extend_from_slice(args);
        self.metampi(&all).output().unwrap()
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

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = text(b).lines().map(String::from).collect();
    v.sort();
    v
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The demo job (`metampi demo-rank`: a token around all ranks, an all-reduce) succeeded.
fn assert_demo_ok(out: &Output, ranks: usize) {
    assert_ok(out);
    let stdout = text(&out.stdout);
    let token: usize = (1..ranks).sum();
    assert!(
        stdout.contains(&format!("ring token      : {token} (expected {token})")),
        "{stdout}"
    );
    assert!(stdout.contains("demo: OK"), "{stdout}");
}

/// The address of the ssh site's node: 127.0.0.2 where it can be bound (on Linux all of 127/8
/// is this machine), else 127.0.0.1, with a note, since some systems have no other loopback
/// address.
fn ssh_site_address() -> &'static str {
    static ADDRESS: OnceLock<&'static str> = OnceLock::new();
    ADDRESS.get_or_init(|| match std::net::TcpListener::bind("127.0.0.2:0") {
        Ok(_) => "127.0.0.2",
        Err(e) => {
            eprintln!("note: 127.0.0.2 cannot be bound here ({e}); the ssh site uses 127.0.0.1");
            "127.0.0.1"
        }
    })
}

/// Three meta hosts a, b, c, here, joined pairwise, with `a`, `b`, `c` added to their blocks.
fn three_sites(port_base: u16, a: &str, b: &str, c: &str) -> String {
    format!(
        "PORTBASE {port_base}\n\
         SECRET_FILE ~/secret\n\
         METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; {a} }}\n\
         METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; {b} }}\n\
         METAHOST c {{ LAUNCH = local; NPROCS = 1; NODES = c0; {c} }}\n\
         PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
    )
}

#[test]
fn meta_env_each_site_s_ranks_see_their_own_variables() {
    let s = Scratch::new("vars");
    let envfile = s.write(
        "b.env",
        "# b's settings\n\nFOO=from the file\nexport BAR=\"b b\"\nBAZ=b-file\n",
    );
    let cfg = s.write(
        "vars.cfg",
        &three_sites(
            25010,
            "ENV = FOO=alpha, BAZ=a;",
            &format!("ENVFILE = {envfile}; ENV = FOO=\"beta 'quoted'\";"),
            "",
        ),
    );
    // Precedence: ENV over ENVFILE over `-x` over what the launcher inherited.
    let out = s.run(
        &cfg,
        &[
            "-x",
            "BAZ=job",
            "sh",
            "-c",
            "echo \"$METAMPI_RANK|$FOO|$BAR|$BAZ\"",
        ],
    );
    assert_ok(&out);
    assert_eq!(
        sorted_lines(&out.stdout),
        [
            "0|alpha||a",
            "1|beta 'quoted'|b b|b-file",
            "2|beta 'quoted'|b b|b-file",
            "3|launcher||job"
        ]
    );
}

#[test]
fn meta_env_exec_settings_choose_each_site_s_program() {
    let s = Scratch::new("exec");
    // Every program says who it is, its rank and its arguments.
    let say = |name: &str| {
        format!(
            "printf '%s' \"{name} $METAMPI_RANK\"; for a in \"$@\"; do printf '|%s' \"$a\"; done; echo\n"
        )
    };
    let prog = s.script("bin/prog.sh", &say("prog"));
    s.script("bin/alpha.sh", &say("alpha"));
    let sub = s.path("sub").display().to_string();
    s.script("sub/prog.sh", &say("sub-prog"));
    let node = s.script("bin/node.sh", &say("node"));
    // a: EXECNAME alone (the command's directory); b: started through a template, EXECPATH
    // alone (the command's file name) and EXECARGS; c: node c1 has its own executable.
    let cfg = s.write(
        "exec.cfg",
        &format!(
            "PORTBASE 25030\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; EXECNAME = alpha.sh; }}\n\
             METAHOST b {{ LAUNCH = \"sh -c {{cmd}}\"; NPROCS = 1; NODES = b0 (127.0.0.1);\n\
                           EXECPATH = {sub}; EXECARGS = x 'y z'; }}\n\
             METAHOST c {{ LAUNCH = local; NPROCS = 2;\n\
                           NODES = c0, c1 : {node} : '-n \"1 2\"'; }}\n\
             AUTO_ROUTER\n"
        ),
    );
    let out = s.run(&cfg, &[&prog, "cli arg"]);
    assert_ok(&out);
    assert_eq!(
        sorted_lines(&out.stdout),
        [
            "alpha 0|cli arg",
            "node 3|-n|1 2",
            "prog 2|cli arg",
            "sub-prog 1|x|y z"
        ]
    );
    // Several programs on the command line cannot be combined with per-site programs.
    let out = s.run(&cfg, &[&prog, ":", "-n", "1", &prog]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--meta runs one program"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn meta_env_router_programs_come_from_routerexec_and_mpiroot() {
    let s = Scratch::new("routers");
    // Wrappers that record that they ran (with a variable of their meta host) and then run
    // the real router, as ROUTEREXEC must.
    let wrap = |tag: &str| {
        format!(
            "echo \"{tag} $FOO $*\" >> {log}\nexec {EXE} \"$@\"\n",
            log = s.path("routers.log").display()
        )
    };
    s.script("wrap-a.sh", &wrap("a"));
    s.script("root/bin/metampi", &wrap("b-mpiroot"));
    let root = s.path("root").display().to_string();
    // a: a relative ROUTEREXEC (from the directory metampi run started in) and ENV, which
    // its routers get too; b: MPIROOT; c: the launcher's own metampi.
    let cfg = s.write(
        "routers.cfg",
        &three_sites(
            25050,
            "ROUTEREXEC = ./wrap-a.sh; ENV = FOO=alpha;",
            &format!("MPIROOT = {root};"),
            "",
        ),
    );
    let out = s.run(&cfg, &[EXE, "demo-rank"]);
    assert_demo_ok(&out, 4);
    assert_eq!(
        sorted_lines(s.read("routers.log").as_bytes()),
        [
            "a alpha router",
            "a alpha router",
            "b-mpiroot launcher router",
            "b-mpiroot launcher router"
        ]
    );
}

#[test]
fn meta_env_each_router_gets_only_its_own_site_s_program_and_variables() {
    let s = Scratch::new("own");
    // Every router runs a wrapper that dumps its arguments and environment, then the real
    // router; meta hosts a and b start theirs through a template that logs the command line
    // it is given (what ssh would carry), c starts its own here.
    let dump = format!(
        "f={dir}/router.$SITE.$$\n\
         printf 'argv' > \"$f\"; for a in \"$0\" \"$@\"; do printf ' [%s]' \"$a\" >> \"$f\"; done\n\
         echo >> \"$f\"; env >> \"$f\"\n\
         exec {EXE} \"$@\"\n",
        dir = s.dir.display()
    );
    let wrap_a = s.script("wrap-a.sh", &dump);
    let wrap_c = s.script("wrap-c.sh", &dump);
    s.script("root/bin/metampi", &dump);
    let root = s.path("root").display().to_string();
    let launch = s.script(
        "bin/launch.sh",
        &format!(
            "host=$1; shift\n\
             printf '%s\\n' \"$*\" >> {dir}/launch.$host.log\n\
             exec sh -c \"$1\"\n",
            dir = s.dir.display()
        ),
    );
    let cfg = s.write(
        "own.cfg",
        &format!(
            "PORTBASE 25150\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = \"{launch} {{host}} {{cmd}}\"; NPROCS = 1;\n\
                           NODES = a0 (127.0.0.1); ENV = SITE=a, ONLY_A=\"alpha one\";\n\
                           ROUTEREXEC = {wrap_a}; }}\n\
             METAHOST b {{ LAUNCH = \"{launch} {{host}} {{cmd}}\"; NPROCS = 1;\n\
                           NODES = b0 (127.0.0.1); ENV = SITE=b, ONLY_B=beta; MPIROOT = {root}; }}\n\
             METAHOST c {{ LAUNCH = local; NPROCS = 1; NODES = c0; ENV = SITE=c, ONLY_C=gamma;\n\
                           ROUTEREXEC = {wrap_c}; }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
        ),
    );
    let script =
        "echo \"env $METAMPI_RANK|$SITE|$ONLY_A|$ONLY_B|$ONLY_C\" >&2; exec \"$0\" demo-rank";
    let out = s.run(&cfg, &["sh", "-c", script, EXE]);
    assert_demo_ok(&out, 3);
    let err = text(&out.stderr);
    for line in ["env 0|a|alpha one||", "env 1|b||beta|", "env 2|c|||gamma"] {
        assert!(err.contains(line), "{line}: {err}");
    }
    // (site, its router program, its variable, what no process of it may see)
    let sites = [
        (
            "a",
            wrap_a.as_str(),
            "ONLY_A=alpha one",
            ["ONLY_B=", "beta", "ONLY_C=", "gamma"],
        ),
        (
            "b",
            "root/bin/metampi",
            "ONLY_B=beta",
            ["ONLY_A=", "alpha", "ONLY_C=", "gamma"],
        ),
        (
            "c",
            wrap_c.as_str(),
            "ONLY_C=gamma",
            ["ONLY_A=", "alpha", "ONLY_B=", "beta"],
        ),
    ];
    let names: Vec<String> = std::fs::read_dir(&s.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for (site, program, own, others) in &sites {
        // Each site's two routers ran its program, with its variables and no one else's.
        let dumps: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with(&format!("router.{site}.")))
            .map(|n| s.read(n))
            .collect();
        assert_eq!(dumps.len(), 2, "{site}: {names:?}");
        for d in &dumps {
            let (argv, env) = d.split_once('\n').unwrap_or((d, ""));
            assert!(
                argv.starts_with("argv [") && argv.ends_with(&format!("{program}] [router]")),
                "{site}: {argv}"
            );
            assert!(env.lines().any(|l| l == *own), "{site}: {env}");
            assert!(env.contains("METAMPI_ROUTER_SPEC="), "{site}: {env}");
            for other in others {
                assert!(!env.contains(other), "{site} sees {other}: {env}");
            }
        }
        // What the template of a and b was given: a command line per router and rank, with
        // the site's variables and program, no other site's, never the secret.
        if *site == "c" {
            continue;
        }
        let log = s.read(&format!("launch.{site}.log"));
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{site}: {log}");
        for line in &lines {
            assert!(
                line.contains(&format!("ONLY_{}=", site.to_uppercase())),
                "{site}: {line}"
            );
            for other in others {
                assert!(
                    !line.contains(other),
                    "{site}'s command line holds {other}: {line}"
                );
            }
            assert!(!line.contains(SECRET), "{line}");
        }
        let routers: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains("METAMPI_ROUTER_SPEC="))
            .collect();
        assert_eq!(routers.len(), 2, "{site}: {log}");
        for r in routers {
            assert!(r.contains(&format!("{program} router")), "{site}: {r}");
        }
    }
}

#[test]
fn meta_env_reaches_an_ssh_site_on_its_command_lines_without_the_secret() {
    let s = Scratch::new("ssh");
    let envfile = s.write("b.env", "BAR=from b's file\n");
    let cfg = s.write(
        "ssh.cfg",
        &format!(
            "PORTBASE 25070\n\
             SECRET_FILE ~/secret\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = ssh me@b0.example.org; NPROCS = 2; NODES = b0 ({b});\n\
                           ENV = FOO=\"b b\"; ENVFILE = {envfile}; }}\n\
             PAIR a b 1\na0 <-> b0\n",
            b = ssh_site_address()
        ),
    );
    let script = "echo \"env $METAMPI_RANK|$FOO|$BAR\" >&2; exec \"$0\" demo-rank";
    let out = s.run(&cfg, &["sh", "-c", script, EXE]);
    assert_demo_ok(&out, 3);
    let err = text(&out.stderr);
    for line in [
        "env 0|launcher|",
        "env 1|b b|from b's file",
        "env 2|b b|from b's file",
    ] {
        assert!(err.contains(line), "{line}: {err}");
    }
    let log = s.read("ssh.log");
    let calls: Vec<&str> = log.lines().collect();
    // b's router and its two ranks, each with b's variables on its command line.
    assert_eq!(calls.len(), 3, "{log}");
    for call in &calls {
        assert!(call.contains("FOO=b b"), "{call}");
        assert!(call.contains("BAR=from b"), "{call}");
    }
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.contains("METAMPI_ROUTER_SPEC="))
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains(SECRET), "{log}");
}

#[test]
fn meta_env_manual_site_command_carries_its_program_and_variables() {
    let s = Scratch::new("manual");
    let cfg = s.write(
        "manual.cfg",
        "PORTBASE 25090\n\
         SECRET_FILE ~/secret\n\
         METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
         METAHOST m { LAUNCH = manual; NPROCS = 1; NODES = m0 (127.0.0.1);\n\
                      ENV = FOO=\"m m\"; EXECPATH = /opt/m; EXECARGS = --site m; }\n\
         PAIR a m 1\na0 <-> m0\n",
    );
    // Nobody runs the printed command: the job ends when the join timeout expires.
    let out = s.run(&cfg, &["--join-timeout", "1", "sh", "-c", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("( "))
        .unwrap_or_else(|| panic!("no command printed: {err}"));
    // The rank: m's variable and program; m's router: its variable and its program, and
    // nothing of meta host a's.
    assert!(line.contains(" 'FOO=m m' METAMPI_PMI="), "{line}");
    assert!(line.contains(" /opt/m/sh --site m </dev/null &"), "{line}");
    assert!(
        line.contains("env 'FOO=m m' 'METAMPI_ROUTER_SPEC=")
            && line.contains(&format!("{EXE} router </dev/null >\"$d/ready\" &")),
        "{line}"
    );
    assert_eq!(line.matches("METAMPI_ROUTER_SPEC=").count(), 1, "{line}");
    assert!(!line.contains(SECRET), "{line}");
}

#[test]
fn meta_env_refusals_name_the_meta_host_and_the_variable() {
    let s = Scratch::new("refuse");
    let refused = |name: &str, b: &str| -> (String, String) {
        let cfg = s.write(name, &three_sites(25110, "", b, ""));
        let out = s.run(&cfg, &["sh", "-c", "echo started"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}: nothing ran");
        let check = s.metampi(&["check", &cfg]).output().unwrap();
        assert_eq!(
            check.status.code(),
            Some(1),
            "{name}: {}",
            text(&check.stderr)
        );
        (err, text(&check.stderr))
    };

    let (run, check) = refused("inline.cfg", "ENV = METAMPI_RANK=7;");
    for err in [&run, &check] {
        assert!(
            err.contains("inline.cfg:4:")
                && err
                    .contains("ENV of meta host 'b' sets METAMPI_RANK: variables named METAMPI_*"),
            "{err}"
        );
    }

    let file = s.write("reserved.env", "A=1\nMETAMPI_SECRET=0000\n");
    let (run, check) = refused("file.cfg", &format!("ENVFILE = {file};"));
    for err in [&run, &check] {
        assert!(
            err.contains(&format!(
                "meta host 'b': ENVFILE {file}:2 sets METAMPI_SECRET: variables named METAMPI_*"
            )),
            "{err}"
        );
        assert!(!err.contains("0000"), "{err}");
    }

    let missing = s.path("missing.env").display().to_string();
    let (run, check) = refused("missing.cfg", &format!("ENVFILE = {missing};"));
    for err in [&run, &check] {
        assert!(
            err.contains(&format!("meta host 'b': cannot read ENVFILE {missing}: ")),
            "{err}"
        );
    }

    let bad = s.write("bad.env", "# fine\nA=1\n\nthis is not a setting\n");
    let (run, check) = refused("bad.cfg", &format!("ENVFILE = {bad};"));
    for err in [&run, &check] {
        assert!(
            err.contains(&format!(
                "meta host 'b': ENVFILE {bad}:4: expected NAME=value, found 'this is not a setting'"
            )),
            "{err}"
        );
    }
}

#[test]
fn meta_env_check_prints_each_site_s_settings() {
    let s = Scratch::new("check");
    let envfile = s.write("b.env", "A=1\n");
    let cfg = s.write(
        "check.cfg",
        &three_sites(
            25130,
            "EXECPATH = /opt/a; EXECNAME = solver; EXECARGS = -v 'x y'; ROUTEREXEC = /opt/a/r;",
            &format!("ENVFILE = {envfile}; ENV = OMP_NUM_THREADS=2, NOTE=\"two words\";"),
            "MPIROOT = /opt/metampi;",
        ),
    );
    let out = s.metampi(&["check", &cfg]).output().unwrap();
    assert_ok(&out);
    let table = text(&out.stdout);
    let section = table
        .split("\nprograms and environment\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no settings section:\n{table}"));
    let rows: Vec<Vec<&str>> = section
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    let want: Vec<Vec<&str>> = vec![
        vec!["HOST", "SETTING", "VALUE"],
        vec!["a", "EXECPATH", "/opt/a"],
        vec!["a", "EXECNAME", "solver"],
        vec!["a", "EXECARGS", "-v 'x y'"],
        vec!["a", "ROUTEREXEC", "/opt/a/r"],
        vec!["b", "ENVFILE", envfile.as_str()],
        vec!["b", "ENV", "OMP_NUM_THREADS=2"],
        vec!["b", "ENV", "NOTE=\"two words\""],
        vec![
            "c",
            "MPIROOT",
            "/opt/metampi (routers run /opt/metampi/bin/metampi)",
        ],
    ];
    assert_eq!(rows, want, "{table}");
}
