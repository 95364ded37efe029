//! Output forwarding, tagging, output directories and stdin distribution.

mod common;

use common::{captured, sh, sorted_lines, TempDir};
use metampi_launch::{run, AppSpec, Host, HostLaunch, JobSpec, OutputMode, StdinTarget};

#[test]
fn stdout_and_stderr_of_every_rank_are_forwarded() {
    let outcome = run(&captured(sh(
        4,
        "echo out $METAMPI_RANK; echo err $METAMPI_RANK >&2",
    )))
    .unwrap();
    assert!(outcome.success(), "{:?}", outcome.failure);
    assert_eq!(
        sorted_lines(&outcome.stdout_text()),
        ["out 0", "out 1", "out 2", "out 3"]
    );
    assert_eq!(
        sorted_lines(&outcome.stderr_text()),
        ["err 0", "err 1", "err 2", "err 3"]
    );
}

#[test]
fn tag_output_prefixes_each_line_with_its_rank() {
    let spec =
        captured(sh(3, "echo first $METAMPI_RANK; echo second $METAMPI_RANK")).tag_output(true);
    let outcome = run(&spec).unwrap();
    let lines = sorted_lines(&outcome.stdout_text());
    assert_eq!(
        lines,
        [
            "[0] first 0",
            "[0] second 0",
            "[1] first 1",
            "[1] second 1",
            "[2] first 2",
            "[2] second 2"
        ]
    );
}

#[test]
fn long_lines_from_many_ranks_never_mix() {
    // `yes` writes in large blocks, so lines arrive split across reads and pipe writes.
    const RANKS: usize = 4;
    const LINES: usize = 400;
    let filler = "x".repeat(900);
    let script = format!("yes \"rank $METAMPI_RANK {filler}\" | head -n {LINES}");
    let outcome = run(&captured(sh(RANKS, &script)).tag_output(true)).unwrap();
    assert!(outcome.success(), "{:?}", outcome.failure);
    let text = outcome.stdout_text();
    let mut per_rank = [0usize; RANKS];
    for line in text.lines() {
        let (tag, rest) = line.split_once(' ').expect("tagged line");
        let rank: usize = tag
            .trim_matches(|c| c == '[' || c == ']')
            .parse()
            .expect("rank tag");
        assert_eq!(rest, format!("rank {rank} {filler}"), "mangled line");
        per_rank[rank] += 1;
    }
    assert_eq!(per_rank, [LINES; RANKS]);
}

#[test]
fn a_trailing_partial_line_is_still_forwarded() {
    let outcome = run(&captured(sh(1, "printf 'no newline'; printf 'half' >&2"))).unwrap();
    assert_eq!(outcome.stdout_text(), "no newline\n");
    assert_eq!(outcome.stderr_text(), "half\n");
}

#[test]
fn terminal_forwarding_works_from_a_test_thread() {
    let spec = JobSpec::new()
        .app(sh(2, "echo terminal forwarding from rank $METAMPI_RANK"))
        .stdin(StdinTarget::None);
    let outcome = run(&spec).unwrap();
    assert!(outcome.success());
    assert!(outcome.stdout.is_empty(), "only Capture fills the buffers");
}

#[test]
fn output_dir_gets_one_file_per_rank_and_stream() {
    let dir = TempDir::new("outdir");
    let out = dir.0.join("nested/out");
    let spec = JobSpec::new()
        .app(sh(
            2,
            "echo out $METAMPI_RANK; printf 'err %s' $METAMPI_RANK >&2",
        ))
        .stdin(StdinTarget::None)
        .tag_output(true)
        .output(OutputMode::Directory(out.clone()));
    let outcome = run(&spec).unwrap();
    assert!(outcome.success());
    for rank in 0..2 {
        let read = |suffix: &str| {
            std::fs::read_to_string(out.join(format!("rank.{rank}.{suffix}"))).unwrap()
        };
        assert_eq!(read("stdout"), format!("out {rank}\n"));
        assert_eq!(
            read("stderr"),
            format!("err {rank}"),
            "files hold the raw bytes"
        );
    }
    assert!(outcome.stdout.is_empty() && outcome.stderr.is_empty());
}

fn stdin_job(target: Option<StdinTarget>) -> Vec<String> {
    // Every rank echoes what it reads; ranks without stdin read /dev/null and print nothing.
    let mut spec = JobSpec::new()
        .app(AppSpec::new(3, "cat"))
        .tag_output(true)
        .output(OutputMode::Capture)
        .stdin_data("hello\nworld\n");
    if let Some(target) = target {
        spec = spec.stdin(target);
    }
    let outcome = run(&spec).unwrap();
    assert!(outcome.success(), "{:?}", outcome.failure);
    sorted_lines(&outcome.stdout_text())
}

#[test]
fn stdin_goes_to_rank_0_by_default() {
    assert_eq!(stdin_job(None), ["[0] hello", "[0] world"]);
}

#[test]
fn stdin_all_copies_to_every_rank() {
    assert_eq!(
        stdin_job(Some(StdinTarget::All)),
        [
            "[0] hello",
            "[0] world",
            "[1] hello",
            "[1] world",
            "[2] hello",
            "[2] world"
        ]
    );
}

#[test]
fn stdin_to_one_chosen_rank_or_none() {
    assert_eq!(
        stdin_job(Some(StdinTarget::Rank(2))),
        ["[2] hello", "[2] world"]
    );
    assert!(stdin_job(Some(StdinTarget::None)).is_empty());
}

#[test]
fn a_rank_on_another_machine_gets_stdin_byte_for_byte_and_then_its_end() {
    // Rank 0 here, rank 1 "elsewhere", through a template that hands its command line to a
    // shell as ssh would: both read every byte value, more than a pipe holds, to the end.
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13 % 256) as u8).collect();
    let elsewhere = HostLaunch::Template {
        template: "sh -c {cmd}".into(),
        vars: Vec::new(),
    };
    let spec = JobSpec::new()
        .app(AppSpec::new(2, "cksum"))
        .hosts([
            Host::new("here", 1).with_launch(HostLaunch::Local),
            Host::new("there", 1).with_launch(elsewhere),
        ])
        .pmi_host("127.0.0.1")
        .stdin(StdinTarget::All)
        .stdin_data(data)
        .tag_output(true)
        .output(OutputMode::Capture);
    let outcome = run(&spec).unwrap();
    assert!(
        outcome.success(),
        "{:?} {}",
        outcome.failure,
        outcome.stderr_text()
    );
    let lines = sorted_lines(&outcome.stdout_text());
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("[0] ") && lines[0].ends_with(" 100000"),
        "{lines:?}"
    );
    assert_eq!(lines[0][4..], lines[1][4..], "{lines:?}");
}
