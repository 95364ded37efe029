//! The launcher-to-rank contract (`metampi_launch::contract`) as a rank meets it: a variable a
//! launcher got wrong stops start-up with one line naming the variable and its value, before
//! anything connects.

use std::process::Command;

/// Set in the child this test starts: it only initializes.
const CHILD: &str = "METAMPI_TEST_CONTRACT_CHILD";

fn start_with(vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c.output().expect("the test binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn child() {
    if metampi::knobs::os(CHILD).is_none() {
        return;
    }
    let _ = metampi::initialize();
    // Start-up must have exited: a malformed contract is never ignored.
    eprintln!("initialized despite a malformed contract");
}

#[test]
fn a_malformed_launcher_variable_stops_start_up_naming_it() {
    // Port 9 on loopback: nothing listens, and nothing may get as far as trying.
    let base = [
        ("METAMPI_PMI", "127.0.0.1:9"),
        ("METAMPI_JOB", "00000000000000aa"),
        ("METAMPI_RANK", "1"),
        ("METAMPI_SIZE", "2"),
    ];
    for (var, value, says) in [
        ("METAMPI_SITES", "1,x", "METAMPI_SITES=`1,x`: bad count `x`"),
        (
            "METAMPI_SITES",
            "3",
            "METAMPI_SITES=`3`: counts 3 ranks, the job has 2",
        ),
        (
            "METAMPI_RANK",
            "2",
            "METAMPI_RANK=`2`: not below METAMPI_SIZE 2",
        ),
        (
            "METAMPI_APPNUM",
            "one",
            "METAMPI_APPNUM=`one`: not a whole number",
        ),
        ("METAMPI_SITE_ORDERS", "big,odd", "bad order `odd`"),
        ("METAMPI_ROUTERS", "0>1", "`0>1` is not from>to@host:port"),
    ] {
        let mut vars: Vec<(&str, &str)> = base.iter().copied().filter(|(k, _)| *k != var).collect();
        vars.push((var, value));
        let (code, stderr) = start_with(&vars);
        assert_eq!(code, Some(1), "{var}={value}: {stderr}");
        assert!(
            stderr.contains("metampi: start-up failed: ") && stderr.contains(says),
            "{var}={value}: {stderr}"
        );
        assert!(!stderr.contains("initialized despite"), "{stderr}");
    }
}
