//! Start-up measurements for the static plan: what a unit costs a client in CPU, how much of
//! a core each client gets while all of them compute, which ranks share a computer, what the
//! servers spend per unit and what moving a byte through a socket costs.
//!
//! Why CPU time as well as wall time: emulated meta hosts share this machine's cores, and
//! other users' work comes and goes. A block timed on the wall clock while seven clients share
//! two cores says how crowded the machine was at that moment, not what the block costs. The
//! thread's CPU time (Linux `/proc/thread-self/schedstat`, in nanoseconds) does not depend on
//! the others, and CPU time over wall time is the share of a core the thread got. The plan
//! ([`crate::balance`]) needs both: the cost of a unit and the cores the job gets, and combines
//! them with how many clients will compute at once. Where the OS gives no thread CPU time,
//! the wall time under full load stands in for the cost and machines are not modelled.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Instant;

use super::codec::Msg;
use crate::dedisperse::{DedispersionPlan, Workspace};
use crate::voltages::Voltages;

/// CPU seconds this thread has run, where the OS says (Linux).
pub(crate) fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// CPU seconds of several threads, each adding its own when it ends: a thread that has ended
/// is gone from `/proc`, and the process-wide total counts in 10 ms steps.
#[derive(Debug, Default)]
pub(crate) struct CpuMeter(Mutex<f64>);

impl CpuMeter {
    /// Run `f` on this thread and add the CPU it took.
    pub(crate) fn track<T>(&self, f: impl FnOnce() -> T) -> T {
        let (out, cpu) = thread_cpu_of(f);
        if let Some(c) = cpu {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) += c;
        }
        out
    }

    /// Seconds so far (0 where the OS gives no thread CPU time).
    pub(crate) fn total(&self) -> f64 {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `f`'s result and the CPU seconds this thread spent in it, where the OS says.
pub(crate) fn thread_cpu_of<T>(f: impl FnOnce() -> T) -> (T, Option<f64>) {
    let c0 = thread_cpu_s();
    let out = f();
    let cpu = c0.and_then(|c0| thread_cpu_s().map(|c1| (c1 - c0).max(0.0)));
    (out, cpu)
}

/// Names the computer this rank runs on: ranks with the same key share its cores. The
/// kernel's boot id tells emulated meta hosts (even in network namespaces with hostnames of
/// their own) that they are one machine; the host name stands in where there is none.
pub(crate) fn machine_key() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| metampi::processor_name().ok())
        .unwrap_or_default();
    // FNV-1a: stable across processes and builds, unlike the std hasher's random keys.
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The routers of this job that run on this machine as processes beside this rank (the same
/// parent, which launched both: `psrsearch demo`, `search --meta`, the test harness), found by
/// the router specification in their environment. Empty where there is no `/proc` or the
/// routers run elsewhere.
pub(crate) fn sibling_routers() -> Vec<u32> {
    let parent = |pid: u32| -> Option<u32> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Field 4 (the parent) is the second after the command name's last `)`.
        s.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let Some(mine) = parent(std::process::id()) else {
        return Vec::new();
    };
    let marker = format!("{}=", metampi_launch::meta::ROUTER_SPEC_ENV);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent(pid) == Some(mine))
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| {
                    env.split(|&b| b == 0)
                        .any(|v| v.starts_with(marker.as_bytes()))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// CPU seconds the live threads of `pids` have run (`/proc/PID/task/*/schedstat`, in
/// nanoseconds; a router's threads live as long as it does).
pub(crate) fn processes_cpu_s(pids: &[u32]) -> f64 {
    let mut ns = 0u64;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    ns as f64 * 1e-9
}

/// Cores this process's machine gave the job's ranks on it (the union of their affinity
/// masks: a rank bound to one core by `--bind-to` or `taskset` would see one core alone).
pub(crate) fn cores() -> usize {
    metampi::environment::machine_cores()
}

/// A synthetic block of small integers (the values of 8-bit data), so it packs, travels and
/// unpacks like a real unit; with `whole` false the values have fractions, as a filterbank's
/// sub-channels do, and travel as `f32` as theirs do.
pub(crate) fn synthetic_block(plan: &DedispersionPlan, whole: bool) -> Voltages {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let band = plan.band();
    let mut block = Voltages::zeros(band.nchan(), band.npol, plan.fft_len());
    let fraction = if whole { 0.0 } else { 0.25 };
    for z in block.as_mut_slice() {
        z.re = rng.gen_range(-20i32..20) as f32 + fraction;
        z.im = rng.gen_range(-20i32..20) as f32 + fraction;
    }
    block
}

/// What a client's work on units cost while measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnitCost {
    /// Wall seconds per unit.
    pub wall_s: f64,
    /// CPU seconds per unit, if the OS says.
    pub cpu_s: Option<f64>,
}

/// Everything a client does per unit, on a synthetic one: decode the message, dedisperse at
/// every DM, encode the result. Its workspace, warm, then serves the client's real units.
pub(crate) struct UnitBench<'a> {
    plan: &'a DedispersionPlan,
    ws: Workspace,
    message: Vec<u8>,
}

impl<'a> UnitBench<'a> {
    /// Prepare, and run one unit so that allocations and caches are warm. `whole`: units
    /// hold small integers (8-bit files); else they travel as `f32` (sub-channels).
    pub(crate) fn new(plan: &'a DedispersionPlan, whole: bool) -> Self {
        let message = Msg::Data {
            block: 0,
            voltages: synthetic_block(plan, whole),
        }
        .encode();
        let mut b = UnitBench {
            plan,
            ws: plan.workspace(),
            message,
        };
        b.one();
        b
    }

    fn one(&mut self) {
        let Ok(Msg::Data { block, voltages }) = Msg::decode(&self.message) else {
            // The message was encoded above from a valid block; it always decodes.
            return;
        };
        let power = self.plan.process_block(&mut self.ws, block, &voltages);
        std::hint::black_box(
            Msg::Result {
                block,
                power: power.data,
            }
            .encode(),
        );
    }

    /// The warm workspace, for the client's real units.
    pub(crate) fn into_workspace(self) -> Workspace {
        self.ws
    }

    /// Units until `window_s` has passed and at least `min_units` are done.
    pub(crate) fn run(&mut self, window_s: f64, min_units: usize) -> UnitCost {
        let cpu0 = thread_cpu_s();
        let t = Instant::now();
        let mut n = 0usize;
        while n < min_units.max(1) || t.elapsed().as_secs_f64() < window_s {
            self.one();
            n += 1;
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu0.and_then(|c0| thread_cpu_s().map(|c1| c1 - c0));
        UnitCost {
            wall_s: wall / n as f64,
            cpu_s: cpu.map(|c| c / n as f64).filter(|c| *c > 0.0),
        }
    }
}

/// CPU (where the OS says, else wall) seconds for `f`.
pub(crate) fn cpu_of<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let (out, cpu) = thread_cpu_of(f);
    (out, cpu.unwrap_or_else(|| t.elapsed().as_secs_f64()))
}

/// CPU seconds a server spends taking one result back: decoding the message (the transfer
/// itself is counted by [`socket_cost_per_byte`]).
pub(crate) fn result_decode_s(plan: &DedispersionPlan) -> f64 {
    let n = plan.dms().len() * plan.band().nchan() * plan.samples_per_block();
    let message = Msg::Result {
        block: 0,
        power: vec![1.0; n],
    }
    .encode();
    std::hint::black_box(Msg::decode(&message).is_ok());
    let (_, s) = cpu_of(|| {
        for _ in 0..3 {
            std::hint::black_box(Msg::decode(&message).is_ok());
        }
    });
    s / 3.0
}

/// CPU seconds per byte to move data through a loopback TCP connection, writer and reader
/// together: the cost of one hop through a socket (a rank to its router, router to router).
/// `None` where the OS gives no thread CPU time or the loopback cannot be used.
pub(crate) fn socket_cost_per_byte() -> Option<f64> {
    const CHUNK: usize = 256 << 10;
    const TOTAL: usize = 32 * CHUNK;
    thread_cpu_s()?;
    let listener = TcpListener::bind("127.0.0.1:0").ok()?;
    let addr = listener.local_addr().ok()?;
    let writer = std::thread::spawn(move || -> Option<f64> {
        let mut s = TcpStream::connect(addr).ok()?;
        let chunk = vec![0x5au8; CHUNK];
        // The first chunk warms the connection up; the reader does not count it either.
        s.write_all(&chunk).ok()?;
        let c0 = thread_cpu_s()?;
        for _ in 0..TOTAL / CHUNK {
            s.write_all(&chunk).ok()?;
        }
        Some(thread_cpu_s()? - c0)
    });
    // The listener moves into the reader, so that it is closed when reading stops for any
    // reason and a writer blocked on a full socket gets an error instead of waiting forever.
    let read = (move || -> Option<f64> {
        let (mut s, _) = listener.accept().ok()?;
        let mut buf = vec![0u8; CHUNK];
        s.read_exact(&mut buf).ok()?;
        let c0 = thread_cpu_s()?;
        let mut left = TOTAL;
        while left > 0 {
            let k = s.read(&mut buf[..left.min(CHUNK)]).ok()?;
            if k == 0 {
                return None;
            }
            left -= k;
        }
        Some(thread_cpu_s()? - c0)
    })();
    let written = writer.join().ok()??;
    Some((written + read?) / TOTAL as f64)
}
