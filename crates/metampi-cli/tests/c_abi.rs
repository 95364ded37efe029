//! C and Fortran programs built with MPICH's `mpicc` and `mpif90` run unchanged on metampi's MPICH-ABI library
//! (`crates/metampi-abi`), started by `metampi run`: one machine with 1-8 ranks, and three
//! emulated sites with routers between them. The same C suite built with `mpicc_abi` runs on
//! metampi's MPI-5 standard-ABI library (`crates/metampi-abi-std`) and on MPICH's.
//!
//! Needs MPICH's compiler wrapper (`mpicc.mpich`, Debian's `libmpich-dev`, which `.ci/run`
//! installs) and the built library (`cargo build --release`, which the README's test command
//! does). Where either is missing the tests say so and pass, except under CI, where they fail.
//! The standard-ABI test fetches MPICH's PyPI wheel (for `mpicc_abi`) and skips where PyPI
//! cannot be reached.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C suite built for test `tag` (tests run at once: each builds its own), or `None`
/// (with the reason printed) to skip.
fn suite(tag: &str) -> Option<PathBuf> {
    build(tag, "mpicc.mpich", "tests/c/abi_suite.c", "libmpich-dev")
}

/// `source` built with MPICH's wrapper `compiler` (from Debian's `package`) for test `tag`.
fn build(tag: &str, compiler: &str, source: &str, package: &str) -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()?
        .join("mpi-abi/libmpi.so.12");
    if !lib.is_file() {
        skip("metampi's C library is not built (cargo build --release -p metampi-abi)");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("metampi-c-abi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let exe = dir.join("abi_suite");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    match compile(compiler, &[], &exe, &src) {
        Ok(()) => Some(exe),
        Err(_) => {
            skip(&format!(
                "{compiler} is not installed (apt-get install {package})"
            ));
            None
        }
    }
}

/// `compiler FLAGS -o out src`; panics with the compiler's messages where it fails, an
/// error where it cannot be started.
fn compile(
    compiler: impl AsRef<std::ffi::OsStr>,
    flags: &[&str],
    out: &Path,
    src: &Path,
) -> std::io::Result<()> {
    let compiler = compiler.as_ref();
    let o = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()?;
    assert!(
        o.status.success(),
        "{} failed: {}",
        compiler.to_string_lossy(),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Says why a test does not run (see [`common::skip`]).
fn skip(why: &str) {
    common::skip("C-ABI tests", why);
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_in(Path::new("."), args)
}

/// `metampi ARGS` with `dir` as working directory: exit code, stdout, stderr.
fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("metampi runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check_suite(out: (i32, String, String), ranks: usize) {
    let (code, stdout, stderr) = out;
    common::assert_suite_ok(Some(code), &stdout, &stderr, ranks);
}

#[test]
fn c_suite_runs_on_one_to_eight_ranks() {
    let Some(exe) = suite("ranks") else { return };
    let exe = exe.to_str().unwrap();
    for n in [1usize, 2, 3, 8] {
        // mpiexec's spelling for one of them, as users type it.
        let np = if n == 3 { "-np" } else { "-n" };
        let out = run(&["run", "--timeout", "120", np, &n.to_string(), exe]);
        check_suite(out, n);
    }
}

#[test]
fn c_suite_runs_under_hydra() {
    // The same binary, started by MPICH's own launcher with metampi's library first on the
    // library path: the ranks find Hydra's PMI server and join one world.
    let Some(exe) = suite("hydra") else { return };
    let abi = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()
        .unwrap()
        .join("mpi-abi");
    for (n, version) in [(4usize, "1"), (3, "2")] {
        let out = Command::new("mpiexec.mpich")
            .args(["-n", &n.to_string()])
            .arg(&exe)
            .env("LD_LIBRARY_PATH", &abi)
            .env("METAMPI_PMI_VERSION", version)
            .output()
            .expect("mpiexec.mpich runs (installed with libmpich-dev)");
        let out = (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        check_suite(out, n);
    }
}

#[test]
fn c_suite_runs_across_three_emulated_sites() {
    let Some(exe) = suite("sites") else { return };
    let cfg = three_sites(exe.parent().unwrap(), 24900);
    let out = run(&[
        "run",
        "-v",
        "--timeout",
        "120",
        "--meta",
        cfg.to_str().unwrap(),
        exe.to_str().unwrap(),
    ]);
    assert!(out.2.contains("LD_LIBRARY_PATH starts with"), "{}", out.2);
    check_suite(out, 5);
}

/// A meta-computer of three sites (1 + 2 + 2 ranks, a router pair between each two) in
/// `dir`, its ports from `portbase`.
fn three_sites(dir: &Path, portbase: u16) -> PathBuf {
    let cfg = dir.join("three.cfg");
    std::fs::write(
        &cfg,
        format!(
            "PORTBASE {portbase}\n\
             METAHOST a {{ LAUNCH = local; NPROCS = 1; NODES = a0; }}\n\
             METAHOST b {{ LAUNCH = local; NPROCS = 2; NODES = b0; }}\n\
             METAHOST c {{ LAUNCH = local; NPROCS = 2; NODES = c0; }}\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n"
        ),
    )
    .unwrap();
    cfg
}

/// The MPICH release on PyPI whose wheel provides `mpicc_abi` (MPI-5 standard ABI).
const MPICH_WHEEL: &str = "5.0.2";

/// The `data/` folder of MPICH's PyPI wheel (`bin/mpicc_abi`, `bin/mpiexec`,
/// `lib/libmpi_abi.so.1`), which `bash .ci/fetch-mpich-wheel.sh` puts in the temporary folder
/// (the suite downloads nothing); `None`, with a SKIP (a failure under CI), where it is not.
fn mpich_wheel() -> Option<PathBuf> {
    let root = std::env::temp_dir().join(format!("metampi-mpich-wheel-{MPICH_WHEEL}"));
    let data = root.join(format!("mpich-{MPICH_WHEEL}.data/data"));
    if data.join("bin/mpicc_abi").is_file() {
        return Some(data);
    }
    skip(&format!(
        "MPICH {MPICH_WHEEL}'s wheel (for mpicc_abi) is not fetched: bash .ci/fetch-mpich-wheel.sh"
    ));
    None
}

#[test]
fn standard_abi_program_runs_on_metampi_and_on_mpich() {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()
        .unwrap()
        .join("mpi-abi/libmpi_abi.so.1");
    if !lib.is_file() {
        skip("metampi's standard-ABI library is not built (cargo build --release)");
        return;
    }
    let Some(wheel) = mpich_wheel() else { return };
    let dir = std::env::temp_dir().join(format!("metampi-std-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("abi_suite_std");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/abi_suite.c");
    compile(wheel.join("bin/mpicc_abi"), &[], &exe, &src)
        .expect("mpicc_abi runs (it needs a C compiler, cc)");
    let exe_s = exe.to_str().unwrap();
    for n in [1usize, 2, 3] {
        check_suite(
            run(&["run", "--timeout", "120", "-n", &n.to_string(), exe_s]),
            n,
        );
    }
    let cfg = three_sites(&dir, 25100);
    check_suite(
        run(&[
            "run",
            "--timeout",
            "120",
            "--meta",
            cfg.to_str().unwrap(),
            exe_s,
        ]),
        5,
    );
    // The same binary on MPICH's own libmpi_abi.so.1 (its RUNPATH), started by its mpiexec.
    let mpich = Command::new("timeout")
        .arg("120")
        .arg(wheel.join("bin/mpiexec"))
        .args(["-n", "2"])
        .arg(&exe)
        .output()
        .expect("timeout runs");
    let out = String::from_utf8_lossy(&mpich.stdout);
    assert!(
        out.contains("suite: ") && out.contains(" 2 ranks"),
        "the standard-ABI binary did not run on MPICH:\n{out}\n{}",
        String::from_utf8_lossy(&mpich.stderr)
    );
    // What MPICH answers differently (its own departures, e.g. from user error handlers) is
    // shown, not asserted: this test is about metampi.
    for line in out
        .lines()
        .filter(|l| l.starts_with("FAIL") || l.starts_with("suite:"))
    {
        eprintln!("on MPICH {MPICH_WHEEL}: {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tool_interface_lists_settings_and_counters_in_both_abis() {
    // tests/c/tool.c, built for MPICH's ABI and (where the wheel is here) the standard one.
    let Some(exe) = build("tool", "mpicc.mpich", "tests/c/tool.c", "libmpich-dev") else {
        return;
    };
    let mut programs = vec![exe.clone()];
    if let Some(wheel) = mpich_wheel() {
        let std_exe = exe.with_file_name("tool_std");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/tool.c");
        compile(wheel.join("bin/mpicc_abi"), &[], &std_exe, &src).expect("mpicc_abi runs");
        programs.push(std_exe);
    }
    for p in &programs {
        let (code, stdout, stderr) = run(&[
            "run",
            "--timeout",
            "60",
            "-x",
            "METAMPI_FORCE_TCP=1",
            "-x",
            "METAMPI_EAGER_LIMIT=12345",
            "-n",
            "2",
            p.to_str().unwrap(),
        ]);
        assert!(
            code == 0 && stdout.contains("tool: ok, rank 0") && stdout.contains("tool: ok, rank 1"),
            "{}: {code}\n{stdout}\n{stderr}",
            p.display()
        );
    }
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}

#[test]
fn a_c_program_learns_it_runs_on_metampi() {
    let Some(exe) = suite("version") else { return };
    let src = exe.with_file_name("version.c");
    std::fs::write(
        &src,
        "#include <mpi.h>\n#include <stdio.h>\nint main(void){char v[MPI_MAX_LIBRARY_VERSION_STRING];int n;\
         MPI_Init(0,0);MPI_Get_library_version(v,&n);printf(\"%s\\n\",v);\
         int e=MPI_Finalize();return e;}\n",
    )
    .unwrap();
    let bin = exe.with_file_name("version");
    compile("mpicc.mpich", &[], &bin, &src).unwrap();
    let (code, stdout, stderr) = run(&["run", "-n", "1", bin.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("metampi "), "{stdout}");
}

#[test]
fn a_program_bound_to_mpichs_own_library_is_refused() {
    let Some(exe) = suite("rpath") else { return };
    let src = exe.with_file_name("plain.c");
    std::fs::write(
        &src,
        "#include <mpi.h>\nint main(void){MPI_Init(0,0);return MPI_Finalize();}\n",
    )
    .unwrap();
    // Where MPICH's library sits: the folder of the libmpich.so.12 that mpicc links against.
    let lib = Command::new("mpicc.mpich")
        .arg("-print-file-name=libmpich.so.12")
        .output()
        .unwrap();
    let lib = PathBuf::from(String::from_utf8_lossy(&lib.stdout).trim());
    let Some(dir) = lib.parent().filter(|d| d.is_dir()) else {
        eprintln!("SKIP: cannot tell where MPICH's libmpich.so.12 is");
        return;
    };
    let bin = exe.with_file_name("plain_rpath");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    compile(
        "mpicc.mpich",
        &[&rpath, "-Wl,--disable-new-dtags"],
        &bin,
        &src,
    )
    .unwrap();
    let (code, _, stderr) = run(&["run", "-n", "2", bin.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("instead of metampi's") && stderr.contains("RPATH"),
        "{stderr}"
    );
}

#[test]
fn fortran_suite_runs_through_debians_fortran_binding() {
    // mpif90.mpich links libmpichfort.so.12 (Debian's), which calls metampi's library.
    let Some(exe) = build(
        "fortran",
        "mpif90.mpich",
        "tests/f/abi_suite.f90",
        "libmpich-dev gfortran",
    ) else {
        return;
    };
    for n in [1usize, 4] {
        let (code, stdout, stderr) = run(&[
            "run",
            "--timeout",
            "120",
            "-n",
            &n.to_string(),
            exe.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            stdout.contains("fortran suite: ")
                && stdout.contains(&format!("checks, 0 failed, {n} ranks")),
            "{stdout}\n{stderr}"
        );
    }
}

/// Where Debian's MPICH builds of ScaLAPACK's test programs are (`scalapack-mpi-test`).
const SCALAPACK_TESTS: &str = "/usr/lib/x86_64-linux-gnu/scalapack/mpich-tests";

/// Whether a program nobody here wrote is installed (else [`skip`]).
fn installed(path: &Path, package: &str) -> bool {
    let there = path.exists();
    if !there {
        skip(&format!(
            "{} is not installed (apt-get install {package})",
            path.display()
        ));
    }
    there
}

#[test]
fn scalapack_test_programs_built_for_mpich_pass_on_metampi() {
    // Debian's binaries, linked against libmpich.so.12 and libscalapack-mpich: BLACS on
    // top of MPI (communicators split per grid row and column, derived datatypes,
    // user operations), then LU and QR factorizations checked by their residuals.
    let dir = Path::new(SCALAPACK_TESTS);
    if !installed(dir, "scalapack-mpi-test") {
        return;
    }
    for prog in ["xdlu", "xzqr"] {
        let exe = format!("./{prog}");
        let (code, stdout, stderr) = run_in(dir, &["run", "--timeout", "120", "-n", "4", &exe]);
        assert_eq!(code, 0, "{prog}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("tests completed and passed residual checks")
                && stdout.contains(" 0 tests completed and failed residual checks")
                && !stdout.contains("FAILED"),
            "{prog}: {stdout}\n{stderr}"
        );
    }
}

#[test]
fn netpipe_built_for_mpich_checks_its_data_on_metampi() {
    // NetPIPE's integrity mode sends patterns of every size up to 64 KiB both ways and
    // checks each byte.
    let np = Path::new("/usr/bin/NPmpich2");
    if !installed(np, "netpipe-mpich2") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("metampi-netpipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "run",
            "--timeout",
            "120",
            "-n",
            "2",
            "NPmpich2",
            "-i",
            "-n",
            "200",
            "-u",
            "65536",
        ],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    // NetPIPE reports each size on stderr.
    let passed = stderr.matches("Integrity check passed").count();
    assert!(
        passed >= 20 && !format!("{stdout}{stderr}").to_lowercase().contains("fail"),
        "{passed}: {stdout}\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// MPI's profiling interface: a PMPI tool (`bench/c/pinned.c`, loaded with `LD_PRELOAD`)
/// wraps `MPI_*` and calls through to metampi's `PMPI_*`. Every rank's log shows its
/// calls, and what rank 0 sent is what rank 1 received, byte for byte (the hashes).
#[test]
fn a_pmpi_tool_wraps_metampis_calls() {
    let Some(exe) = build(
        "pmpi",
        "mpicc.mpich",
        "../../bench/c/osu_like.c",
        "libmpich-dev",
    ) else {
        return;
    };
    let dir = exe.parent().unwrap().to_path_buf();
    let tool = dir.join("libpinned.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/c/pinned.c");
    compile("mpicc.mpich", &["-O2", "-shared", "-fPIC"], &tool, &src)
        .expect("mpicc.mpich ran for the suite");
    let log = dir.join("log");
    std::fs::create_dir_all(&log).unwrap();
    let json = dir.join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .args(["run", "--timeout", "120", "-n", "3"])
        .arg(&exe)
        .args(["pingpong,allreduce,reduce,bcast", "8", "0.01", "pmpi"])
        .arg(&json)
        .env("LD_PRELOAD", &tool)
        .env("PIN_LOG", &log)
        .env("PIN_SUM", "left")
        .output()
        .expect("metampi runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let read = |r: usize| std::fs::read_to_string(log.join(format!("r{r}.txt"))).unwrap();
    let (r0, r1, r2) = (read(0), read(1), read(2));
    for (r, l) in [(0, &r0), (1, &r1), (2, &r2)] {
        for call in ["allreduce n=", "reduce n=", "bcast n="] {
            assert!(l.contains(call), "rank {r} logged no {call}:\n{l}");
        }
    }
    // Ping-pong between ranks 0 and 1: the n-th send of one is the n-th receive of the other.
    let hashes = |l: &str, what: &str| -> Vec<String> {
        l.lines()
            .filter(|x| x.contains(what))
            .filter_map(|x| x.rsplit("h=").next().map(str::to_string))
            .collect()
    };
    let sent = hashes(&r0, "MPI_Send n=8 d=1 ");
    let got = hashes(&r1, "recv n=8 s=0 ");
    assert!(!sent.is_empty() && sent == got, "{sent:?}\n{got:?}");
    assert!(
        hashes(&r2, "MPI_Send ").is_empty(),
        "rank 2 takes no part in ping-pong"
    );
}
