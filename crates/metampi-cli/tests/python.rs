//! Python programs through mpi4py (its PyPI wheel, unchanged) on metampi's C library, started
//! by `metampi run`: point-to-point and collectives on three ranks, and `mpi4py.futures`,
//! whose `MPIPoolExecutor` spawns its workers (`MPI_Comm_spawn`). The wheel comes from
//! `bash .ci/fetch-mpi4py.sh` (the suite downloads nothing); without it, or without the built
//! library, the tests say so and pass, except under CI, where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const WHAT: &str = "Python (mpi4py) tests";
/// The mpi4py release `.ci/fetch-mpi4py.sh` installs.
const MPI4PY: &str = "4.1.2";

/// The folder holding the `mpi4py` package, or `None` (with the reason printed) to skip.
fn mpi4py() -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_BIN_EXE_metampi"))
        .parent()?
        .join("mpi-abi/libmpi.so");
    let site = std::env::temp_dir().join(format!("metampi-mpi4py-{MPI4PY}"));
    if !lib.exists() {
        common::skip(
            WHAT,
            "metampi's C library is not built (cargo build --release)",
        );
        return None;
    }
    if !site.join("mpi4py/__init__.py").is_file() {
        common::skip(
            WHAT,
            &format!("mpi4py {MPI4PY} is not installed: bash .ci/fetch-mpi4py.sh"),
        );
        return None;
    }
    Some(site)
}

/// `metampi run ARGS python3 SCRIPT` with mpi4py importable: status, stdout, stderr.
fn run_python(site: &Path, args: &[&str], script: &str, tag: &str) -> (bool, String, String) {
    let dir = std::env::temp_dir().join(format!("metampi-python-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prog.py");
    std::fs::write(&file, script).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metampi"))
        .env("PYTHONPATH", site)
        .args(["run", "--timeout", "120"])
        .args(args)
        .arg("python3")
        .arg(&file)
        .output()
        .expect("metampi runs");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mpi4py_programs_run_on_metampi() {
    let Some(site) = mpi4py() else { return };
    let script = r#"
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert MPI.Get_library_version().startswith("metampi"), MPI.Get_library_version()
# Pickled objects around a ring, and a buffer allreduce.
got = comm.sendrecv({"from": rank}, dest=(rank + 1) % size, source=(rank - 1) % size)
assert got["from"] == (rank - 1) % size, got
total = comm.allreduce(rank)
assert total == size * (size - 1) // 2, total
print(f"python: rank {rank} of {size} ok", flush=True)
"#;
    let (ok, stdout, stderr) = run_python(&site, &["-n", "3"], script, "ring");
    assert!(ok, "{stdout}\n{stderr}");
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("python: rank {r} of 3 ok")),
            "{stdout}\n{stderr}"
        );
    }
}

#[test]
fn mpi4py_futures_spawns_its_workers() {
    let Some(site) = mpi4py() else { return };
    let script = r#"
import math, os
from mpi4py.futures import MPIPoolExecutor
if __name__ == "__main__":
    with MPIPoolExecutor(max_workers=2) as ex:
        got = list(ex.map(math.sqrt, [1, 4, 9, 16, 25]))
        pids = {ex.submit(os.getpid).result() for _ in range(4)}
    assert got == [1.0, 2.0, 3.0, 4.0, 5.0], got
    assert os.getpid() not in pids, "the work ran in the parent"
    print("futures:", got, flush=True)
"#;
    let (ok, stdout, stderr) = run_python(&site, &["-n", "1"], script, "futures");
    assert!(
        ok && stdout.contains("futures: [1.0, 2.0, 3.0, 4.0, 5.0]"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn the_universe_size_sets_how_many_workers_mpi4py_futures_starts() {
    let Some(site) = mpi4py() else { return };
    let script = r#"
import os
from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor
if __name__ == "__main__":
    usize = MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE)
    with MPIPoolExecutor() as ex:
        ex.submit(os.getpid).result()
        print("universe", usize, "workers", ex.num_workers, flush=True)
"#;
    // Hydra's spelling, as mpi4py's documentation writes it.
    let (ok, stdout, stderr) = run_python(&site, &["-usize", "4", "-n", "1"], script, "usize");
    assert!(
        ok && stdout.contains("universe 4 workers 3"),
        "{stdout}\n{stderr}"
    );
}
