//! The environment contract with ranks, MIMD numbering, placement and launch methods.

mod common;

use std::collections::BTreeMap;

use common::{captured, sh, sorted_lines};
use metampi_launch::{run, Host, JobOutcome, JobSpec, LaunchMethod};

const PRINT_ENV: &str = "echo $METAMPI_RANK $METAMPI_SIZE $METAMPI_APPNUM $METAMPI_LOCAL_RANK \
                         $METAMPI_LOCAL_SIZE $METAMPI_NODE $METAMPI_JOB $METAMPI_PMI";

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    size: usize,
    app: usize,
    local_rank: usize,
    local_size: usize,
    node: String,
    job: String,
    pmi: String,
}

/// Rank -> what it saw, from lines printed with [`PRINT_ENV`].
fn seen(outcome: &JobOutcome) -> BTreeMap<usize, Seen> {
    assert!(
        outcome.success(),
        "{:?}\n{}",
        outcome.failure,
        outcome.stderr_text()
    );
    outcome
        .stdout_text()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 8, "line {line:?}");
            let n = |i: usize| f[i].parse::<usize>().unwrap();
            (
                n(0),
                Seen {
                    size: n(1),
                    app: n(2),
                    local_rank: n(3),
                    local_size: n(4),
                    node: f[5].to_string(),
                    job: f[6].to_string(),
                    pmi: f[7].to_string(),
                },
            )
        })
        .collect()
}

fn machine_name() -> String {
    let out = std::process::Command::new("uname")
        .arg("-n")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn every_rank_gets_the_metampi_variables() {
    let outcome = run(&captured(sh(3, PRINT_ENV))).unwrap();
    let seen = seen(&outcome);
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    let node = machine_name();
    for (rank, s) in &seen {
        assert_eq!(
            (s.size, s.app, s.local_rank, s.local_size),
            (3, 0, *rank, 3)
        );
        assert_eq!(s.node, node);
        assert_eq!(s.job, outcome.job.to_string());
        assert_eq!(s.job.len(), 16);
        // Ranks on this machine bootstrap over the server's Unix socket.
        let path = s.pmi.strip_prefix("unix:").expect("local PMI socket");
        assert!(
            path.ends_with(&format!("metampi-pmi-{}.sock", s.job)),
            "{path}"
        );
    }
}

#[test]
fn mimd_apps_are_numbered_contiguously() {
    let spec = captured(sh(2, PRINT_ENV))
        .app(sh(3, PRINT_ENV))
        .app(sh(1, PRINT_ENV));
    let seen = seen(&run(&spec).unwrap());
    let apps: Vec<(usize, usize, usize)> = seen.iter().map(|(r, s)| (*r, s.app, s.size)).collect();
    assert_eq!(
        apps,
        [
            (0, 0, 6),
            (1, 0, 6),
            (2, 1, 6),
            (3, 1, 6),
            (4, 1, 6),
            (5, 2, 6)
        ]
    );
}

#[test]
fn job_ids_differ_between_jobs() {
    let a = run(&captured(sh(1, "true"))).unwrap();
    let b = run(&captured(sh(1, "true"))).unwrap();
    assert_ne!(a.job, b.job);
}

#[test]
fn extra_variables_reach_every_rank() {
    let spec = captured(sh(2, "echo \"$GREETING|$PATH_COPY\""))
        .env("GREETING", "hello world")
        .env("PATH_COPY", std::env::var_os("PATH").unwrap());
    let outcome = run(&spec).unwrap();
    let want = format!("hello world|{}", std::env::var("PATH").unwrap());
    assert_eq!(sorted_lines(&outcome.stdout_text()), [want.clone(), want]);
}

#[test]
fn local_launch_emulates_several_machines() {
    let spec = captured(sh(5, PRINT_ENV))
        .hosts(Host::parse_list("siteA:2,siteB:2").unwrap())
        .launch(LaunchMethod::Local);
    let seen = seen(&run(&spec).unwrap());
    let layout: Vec<(&str, usize, usize)> = seen
        .values()
        .map(|s| (s.node.as_str(), s.local_rank, s.local_size))
        .collect();
    // Four slots, then the fifth rank wraps round to the first host.
    assert_eq!(
        layout,
        [
            ("siteA", 0, 3),
            ("siteA", 1, 3),
            ("siteB", 0, 2),
            ("siteB", 1, 2),
            ("siteA", 2, 3)
        ]
    );
    assert!(seen.values().all(|s| s.pmi.starts_with("unix:")));
}

#[test]
fn template_launch_carries_env_and_awkward_arguments_through_a_shell() {
    // `sh -c {cmd}` stands in for ssh: the rank's whole environment and argv travel inside one
    // shell command line, exactly as they would to a remote machine.
    let script =
        "printf '%s|' \"$METAMPI_NODE\" \"$METAMPI_RANK\" \"$METAMPI_PMI\" \"$MSG\" \"$@\"; echo";
    let spec = JobSpec::new()
        .app(
            metampi_launch::AppSpec::new(2, "/bin/sh")
                .args(["-c", script, "argv0", "a b", "it's", "$HOME", ""]),
        )
        .hosts(Host::parse_list("remote-a,remote-b").unwrap())
        .launch(LaunchMethod::Template("sh -c {cmd}".into()))
        .pmi_host("127.0.0.1")
        .env("MSG", "x 'y' \"z\"")
        .stdin(metampi_launch::StdinTarget::None)
        .output(metampi_launch::OutputMode::Capture);
    let outcome = run(&spec).unwrap();
    assert!(
        outcome.success(),
        "{:?} {}",
        outcome.failure,
        outcome.stderr_text()
    );
    let lines = sorted_lines(&outcome.stdout_text());
    assert_eq!(lines.len(), 2);
    for (rank, (line, node)) in lines.iter().zip(["remote-a", "remote-b"]).enumerate() {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(fields[0], node);
        assert_eq!(fields[1], rank.to_string());
        assert!(fields[2].starts_with("127.0.0.1:"), "{line}");
        assert_eq!(
            &fields[3..],
            ["x 'y' \"z\"", "a b", "it's", "$HOME", "", ""]
        );
    }
}

#[test]
fn host_variables_win_over_the_job_s_for_local_and_remote_ranks() {
    // Host a's ranks start here, host b's through `sh -c {cmd}` (the remote path: the
    // variables travel on the command line).
    let hosts = [
        Host::new("a", 1)
            .with_launch(metampi_launch::HostLaunch::Local)
            .with_env([("SITE", "a"), ("WHO", "first")])
            .with_env([("WHO", "a's own")]),
        Host::new("b", 2)
            .with_launch(metampi_launch::HostLaunch::Template {
                template: "sh -c {cmd}".into(),
                vars: Vec::new(),
            })
            .with_env([("SITE", "b 'quoted'")]),
    ];
    let spec = captured(sh(3, "echo \"$METAMPI_RANK|$SITE|$WHO\""))
        .hosts(hosts)
        .pmi_host("127.0.0.1")
        .env("SITE", "job")
        .env("WHO", "job");
    let outcome = run(&spec).unwrap();
    assert!(outcome.success(), "{}", outcome.stderr_text());
    assert_eq!(
        sorted_lines(&outcome.stdout_text()),
        ["0|a|a's own", "1|b 'quoted'|job", "2|b 'quoted'|job"]
    );
}

#[test]
fn host_variables_may_not_replace_the_launcher_s() {
    for name in ["METAMPI_RANK", "METAMPI_SECRET", "1BAD"] {
        let spec = captured(sh(1, "true")).hosts([Host::new("a", 1).with_env([(name, "x")])]);
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.contains(name) && (err.contains("cannot be overridden") || err.contains("invalid")),
            "{err}"
        );
    }
}
