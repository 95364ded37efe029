//! The measurement loops, run on every rank.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use metampi::collective::SystemOperation;
use metampi::topology::SimpleCommunicator;
use metampi::traits::*;

use super::report::{BenchReport, Row, Stats};
use super::BenchArgs;
use crate::progress::Progress;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    PingPong,
    /// Ping-pong of several thread pairs at once, each on its own tag (`--threads`).
    PingPongMt,
    PingPing,
    Bw,
    BiBw,
    Barrier,
    Bcast,
    Reduce,
    AllReduce,
    Gather,
    Scatter,
    AllGather,
    AllToAll,
}

impl Op {
    const ALL: [Op; 12] = [
        Op::PingPong,
        Op::PingPing,
        Op::Bw,
        Op::BiBw,
        Op::Barrier,
        Op::Bcast,
        Op::Reduce,
        Op::AllReduce,
        Op::Gather,
        Op::Scatter,
        Op::AllGather,
        Op::AllToAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::PingPong => "pingpong",
            Op::PingPongMt => "pingpong_mt",
            Op::PingPing => "pingping",
            Op::Bw => "bw",
            Op::BiBw => "bibw",
            Op::Barrier => "barrier",
            Op::Bcast => "bcast",
            Op::Reduce => "reduce",
            Op::AllReduce => "allreduce",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
            Op::AllGather => "allgather",
            Op::AllToAll => "alltoall",
        }
    }

    fn is_p2p(self) -> bool {
        matches!(
            self,
            Op::PingPong | Op::PingPongMt | Op::PingPing | Op::Bw | Op::BiBw
        )
    }

    /// Bandwidth operations report MB/s; the others latency.
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Op::Bw | Op::BiBw)
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub ops: Vec<Op>,
    pub sizes: Vec<usize>,
    pub pair: (i32, i32),
    pub iters_scale: f64,
    /// Seconds one point may take (0: no limit); see [`fit_iterations`].
    pub seconds_per_size: f64,
    /// Bytes past a page boundary where receive buffers start.
    pub misalign: usize,
    /// Thread pairs of `pingpong_mt`.
    pub threads: usize,
}

/// A buffer that starts `offset` bytes past a page boundary. Where two
/// buffers start decides how fast copies between them run, so the benches
/// on both sides place theirs alike rather than take what the allocator
/// gives (which differs with the sizes in a sweep and between a warm-up and
/// the run after it).
struct Placed<T> {
    store: Vec<T>,
    at: usize,
    len: usize,
}

impl<T: Copy> Placed<T> {
    fn new(len: usize, fill: T, offset: usize) -> Placed<T> {
        let size = std::mem::size_of::<T>();
        let store = vec![fill; len + (4096 + offset) / size + 1];
        // A multiple of `size`: the vector is aligned to it, and so is the
        // offset once rounded down.
        let pad = (offset / size * size).wrapping_sub(store.as_ptr() as usize) & 4095;
        Placed {
            at: pad / size,
            store,
            len,
        }
    }
}

impl<T> std::ops::Deref for Placed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.store[self.at..self.at + self.len]
    }
}

impl<T> std::ops::DerefMut for Placed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.store[self.at..self.at + self.len]
    }
}

fn parse_size(s: &str) -> Result<usize> {
    metampi::knobs::parse_size(s)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| anyhow::anyhow!("`{s}` is not a size (bytes, with optional K, M or G)"))
}

impl Config {
    pub fn from_args(a: &BenchArgs) -> Result<Config> {
        let mut ops = Vec::new();
        for name in a.ops.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "all" => ops.extend(Op::ALL),
                "p2p" => ops.extend(Op::ALL.iter().copied().filter(|o| o.is_p2p())),
                "coll" => ops.extend(Op::ALL.iter().copied().filter(|o| !o.is_p2p())),
                // Not in the groups: it needs threads, and its own count of them.
                "pingpong_mt" => ops.push(Op::PingPongMt),
                n => match Op::ALL.iter().find(|o| o.name() == n) {
                    Some(&o) => ops.push(o),
                    None => bail!("unknown operation `{n}` (see --help)"),
                },
            }
        }
        ops.dedup();
        let sizes = if let Some((lo, hi)) = a.sizes.split_once(':') {
            let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
            if lo > hi {
                bail!("--sizes: {lo} is larger than {hi}");
            }
            let mut v = Vec::new();
            if lo == 0 {
                v.push(0);
            }
            let mut s = lo.max(1).next_power_of_two();
            while s <= hi {
                v.push(s);
                s *= 2;
            }
            v
        } else {
            a.sizes
                .split(',')
                .map(parse_size)
                .collect::<Result<Vec<_>>>()?
        };
        let pair: Vec<i32> = a
            .pair
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|_| anyhow::anyhow!("--pair must be two ranks like `0,1`"))?;
        if pair.len() != 2 || pair[0] == pair[1] {
            bail!("--pair must name two different ranks like `0,1`");
        }
        if a.iters_scale <= 0.0 {
            bail!("--iters-scale must be positive");
        }
        if !(a.seconds_per_size >= 0.0 && a.seconds_per_size.is_finite()) {
            bail!("--seconds-per-size must be a number of seconds, 0 or more");
        }
        if a.threads == 0 {
            bail!("--threads must be at least 1");
        }
        Ok(Config {
            ops,
            sizes,
            pair: (pair[0], pair[1]),
            iters_scale: a.iters_scale,
            seconds_per_size: a.seconds_per_size,
            misalign: a.misalign.into(),
            threads: a.threads,
        })
    }
}

/// Iterations and warm-up for a message size: many for small messages,
/// fewer for large ones, so each point takes a similar time.
fn iterations(size: usize, scale: f64) -> (usize, usize) {
    let base = ((64usize << 20) / size.max(1)).clamp(20, 2000);
    let n = ((base as f64 * scale) as usize).max(5);
    (n, (n / 10).max(2))
}

/// Fewest measured iterations a time limit leaves.
const MIN_ITERS: usize = 3;

/// Iterations and warm-up once a probe iteration took `probe` seconds on the slowest rank:
/// as many as fit `budget` seconds (0: no limit), never more than `(iters, warm)` asked
/// for, at least [`MIN_ITERS`]; the probe counts as one warm-up iteration.
/// Warm-up and measured iterations then add up to what they did before the limit existed
/// wherever it does not cut.
fn fit_iterations((iters, warm): (usize, usize), probe: f64, budget: f64) -> (usize, usize) {
    let fit = if budget > 0.0 && probe > 0.0 {
        ((budget / probe) as usize).max(MIN_ITERS)
    } else {
        usize::MAX
    };
    let fitted = iters.min(fit);
    // A cut count gets a warm-up in proportion; the count asked for keeps its own.
    let warm = if fitted < iters {
        warm.min((fitted / 10).max(1))
    } else {
        warm
    };
    (fitted, warm.saturating_sub(1))
}

const WINDOW: usize = 32;

/// Per-iteration seconds on this rank (empty when it takes no part).
fn run_op(world: &SimpleCommunicator, op: Op, size: usize, iters: usize, cfg: &Config) -> Vec<f64> {
    let (pair, misalign) = (cfg.pair, cfg.misalign);
    let me = world.rank();
    let mut times = Vec::with_capacity(iters);
    let (a, b) = pair;
    let in_pair = me == a || me == b;
    if op.is_p2p() && !in_pair {
        return times;
    }
    if op == Op::PingPongMt {
        let peer = world.process_at_rank(if me == a { b } else { a });
        return pingpong_threads(peer, me == a, size, iters, cfg.threads, misalign);
    }
    let n = world.size() as usize;
    let root = world.process_at_rank(0);
    let sbuf = Placed::new(size, 1u8, 0);
    let mut rbuf = Placed::new(size, 0u8, misalign);
    let fcount = size / 4;
    let fs = Placed::new(fcount, 1.0f32, 0);
    let mut fr = Placed::new(fcount, 0.0f32, misalign);
    let sbig = Placed::new(size * n, 1u8, 0);
    let mut rbig = Placed::new(size * n, 0u8, misalign);
    // The windows lie end to end in one block, as separate small vectors would.
    let windows = if op.is_bandwidth() { WINDOW } else { 0 };
    let mut block = Placed::new(size * windows, 0u8, misalign);
    let mut wins: Vec<&mut [u8]> = if size == 0 {
        (0..windows).map(|_| &mut [][..]).collect()
    } else {
        block.chunks_mut(size).collect()
    };
    for _ in 0..iters {
        let t0 = metampi::time();
        match op {
            // Measured by `pingpong_threads` (returned above).
            Op::PingPongMt => {}
            Op::PingPong => {
                let peer = world.process_at_rank(if me == a { b } else { a });
                if me == a {
                    peer.send(&sbuf[..]);
                    peer.receive_into(&mut rbuf[..]);
                } else {
                    peer.receive_into(&mut rbuf[..]);
                    peer.send(&sbuf[..]);
                }
            }
            Op::PingPing => {
                let peer = world.process_at_rank(if me == a { b } else { a });
                metampi::request::scope(|s| {
                    let r = peer.immediate_send(s, &sbuf[..]);
                    peer.receive_into(&mut rbuf[..]);
                    r.wait();
                });
            }
            Op::Bw => {
                let peer = world.process_at_rank(if me == a { b } else { a });
                if me == a {
                    metampi::request::scope(|s| {
                        let reqs: Vec<_> = (0..WINDOW)
                            .map(|_| peer.immediate_send(s, &sbuf[..]))
                            .collect();
                        for r in reqs {
                            r.wait();
                        }
                    });
                    let _ = peer.receive::<u8>();
                } else {
                    metampi::request::scope(|s| {
                        let reqs: Vec<_> = wins
                            .iter_mut()
                            .map(|w| peer.immediate_receive_into(s, &mut w[..]))
                            .collect();
                        for r in reqs {
                            r.wait();
                        }
                    });
                    peer.send(&0u8);
                }
            }
            Op::BiBw => {
                let peer = world.process_at_rank(if me == a { b } else { a });
                metampi::request::scope(|s| {
                    let recvs: Vec<_> = wins
                        .iter_mut()
                        .map(|w| peer.immediate_receive_into(s, &mut w[..]))
                        .collect();
                    let sends: Vec<_> = (0..WINDOW)
                        .map(|_| peer.immediate_send(s, &sbuf[..]))
                        .collect();
                    for r in sends {
                        r.wait();
                    }
                    for r in recvs {
                        r.wait();
                    }
                });
            }
            Op::Barrier => world.barrier(),
            Op::Bcast => root.broadcast_into(&mut rbuf[..]),
            Op::Reduce => {
                if me == 0 {
                    root.reduce_into_root(&fs[..], &mut fr[..], SystemOperation::sum());
                } else {
                    root.reduce_into(&fs[..], SystemOperation::sum());
                }
            }
            Op::AllReduce => world.all_reduce_into(&fs[..], &mut fr[..], SystemOperation::sum()),
            Op::Gather => {
                if me == 0 {
                    root.gather_into_root(&sbuf[..], &mut rbig[..]);
                } else {
                    root.gather_into(&sbuf[..]);
                }
            }
            Op::Scatter => {
                if me == 0 {
                    root.scatter_into_root(&sbig[..], &mut rbuf[..]);
                } else {
                    root.scatter_into(&mut rbuf[..]);
                }
            }
            Op::AllGather => world.all_gather_into(&sbuf[..], &mut rbig[..]),
            Op::AllToAll => world.all_to_all_into(&sbig[..], &mut rbig[..]),
        }
        let dt = metampi::time() - t0;
        times.push(match op {
            Op::PingPong => dt / 2.0,
            Op::Bw | Op::BiBw => dt / WINDOW as f64,
            _ => dt,
        });
    }
    times
}

/// `threads` pairs of threads ping-pong at once, thread `t` of each rank with thread `t` of
/// the other on tag `t` (as OSU's `osu_latency_mt`). The iterations run in five batches, the
/// threads meeting between batches: an iteration's time is its batch's
/// wall time over the batch's round trips, halved (one way), so it counts every pair's
/// messages while all of them run.
fn pingpong_threads(
    peer: metampi::topology::Process<'_>,
    first: bool,
    size: usize,
    iters: usize,
    threads: usize,
    misalign: usize,
) -> Vec<f64> {
    let batch = (iters / 5).max(1);
    let meet = std::sync::Barrier::new(threads);
    let meet = &meet;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let tag = t as i32;
                    let sbuf = Placed::new(size, 1u8, 0);
                    let mut rbuf = Placed::new(size, 0u8, misalign);
                    // Thread 0's clock spans each whole batch (every thread meets it at both
                    // ends), so it alone keeps times.
                    let mut times = Vec::with_capacity(if t == 0 { iters } else { 0 });
                    let mut done = 0;
                    while done < iters {
                        let k = batch.min(iters - done);
                        meet.wait();
                        let t0 = metampi::time();
                        for _ in 0..k {
                            if first {
                                peer.send_with_tag(&sbuf[..], tag);
                                peer.receive_into_with_tag(&mut rbuf[..], tag);
                            } else {
                                peer.receive_into_with_tag(&mut rbuf[..], tag);
                                peer.send_with_tag(&sbuf[..], tag);
                            }
                        }
                        meet.wait();
                        if t == 0 {
                            let per = (metampi::time() - t0) / k as f64 / 2.0;
                            times.extend(std::iter::repeat_n(per, k));
                        }
                        done += k;
                    }
                    times
                })
            })
            .collect();
        let mut times = Vec::new();
        for h in handles {
            match h.join() {
                Ok(t) if times.is_empty() => times = t,
                Ok(_) => {}
                // A failed thread fails the bench rather than leaving a hole in it.
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        times
    })
}

pub fn rank_main(cfg: &Config, args: &BenchArgs) -> Result<u8> {
    // Threads of one rank call the library at once only in `pingpong_mt`; the other
    // operations run on one thread, as a C MPI then needs no thread support.
    let threading = if cfg.ops.contains(&Op::PingPongMt) {
        metampi::Threading::Multiple
    } else {
        metampi::Threading::Single
    };
    let (universe, _) = metampi::initialize_with_threading(threading)
        .ok_or_else(|| anyhow::anyhow!("metampi is already initialized"))?;
    let world = universe.world();
    let size = world.size();
    let (a, b) = cfg.pair;
    let p2p_ok = a < size && b < size && a >= 0 && b >= 0;
    let me = world.rank();
    let mut report = BenchReport::new(
        size,
        args.label.clone(),
        cfg.pair,
        universe.oversubscribed(),
    );
    report.misalign = cfg.misalign;
    report.threads = cfg.ops.contains(&Op::PingPongMt).then_some(cfg.threads);
    if me == 0 {
        report.print_header();
        if !p2p_ok && cfg.ops.iter().any(|o| o.is_p2p()) {
            eprintln!("metampi bench: --pair {a},{b} is outside a world of {size}; skipping point-to-point operations");
        }
    }
    let skip = |op: Op, bytes: usize| {
        (op.is_p2p() && (!p2p_ok || size < 2))
            || (matches!(op, Op::Barrier) && bytes != cfg.sizes[0])
            || (matches!(op, Op::Reduce | Op::AllReduce) && bytes % 4 != 0)
    };
    let points = cfg
        .ops
        .iter()
        .flat_map(|&op| cfg.sizes.iter().map(move |&b| (op, b)))
        .filter(|&(op, b)| !skip(op, b))
        .count();
    let mut progress = (me == 0).then(|| Ticker::start(points as u64));
    let mut point = 0u64;
    for &op in &cfg.ops {
        if op.is_p2p() && (!p2p_ok || size < 2) {
            continue;
        }
        if me == 0 {
            report.print_op_header(op);
        }
        for &bytes in &cfg.sizes {
            if skip(op, bytes) {
                continue;
            }
            if let Some(p) = &mut progress {
                let size = match bytes {
                    b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
                    b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
                    b => format!("{b} B"),
                };
                p.begin(point, format!("{} {size}", op.name()));
            }
            point += 1;
            world.barrier();
            // One timed iteration, the slowest rank's time known to all, so that every rank
            // picks the same count.
            let t0 = Instant::now();
            let _ = run_op(&world, op, bytes, 1, cfg);
            let mine = t0.elapsed().as_secs_f64();
            let mut probe = 0f64;
            world.all_reduce_into(&mine, &mut probe, SystemOperation::max());
            let asked = iterations(bytes, cfg.iters_scale);
            let (iters, warm) = fit_iterations(asked, probe, cfg.seconds_per_size);
            let _ = run_op(&world, op, bytes, warm, cfg);
            world.barrier();
            let mine = run_op(&world, op, bytes, iters, cfg);
            // Per iteration, the slowest rank's time is the operation's time.
            let mut all = vec![0f64; iters * size as usize];
            let padded: Vec<f64> = if mine.is_empty() {
                vec![0.0; iters]
            } else {
                mine
            };
            world.all_gather_into(&padded[..], &mut all[..]);
            if me == 0 {
                let per_iter: Vec<f64> = (0..iters)
                    .map(|i| {
                        (0..size as usize)
                            .map(|r| all[r * iters + i])
                            .fold(0.0, f64::max)
                    })
                    .collect();
                let stats = Stats::from_seconds(&per_iter);
                let row = Row::new(op, bytes, iters, &stats);
                if let Some(p) = &mut progress {
                    p.end();
                }
                report.print_row(&row);
                report.results.push(row);
            }
        }
    }
    drop(progress);
    if me == 0 {
        if let Some(p) = &args.json {
            std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
            println!("# wrote {}", p.display());
        }
        if let Some(p) = &args.csv {
            std::fs::write(p, report.to_csv())?;
            println!("# wrote {}", p.display());
        }
        if let Some(p) = &args.plot {
            super::plot::write_plot(std::slice::from_ref(&report), p)?;
            println!("# wrote {}", p.display());
        }
    }
    drop(universe);
    Ok(0)
}

/// Rank 0's progress line for a sweep. It is drawn from a thread, and only
/// once a point has run for a while: rank 0's table rows reach the terminal
/// through the launcher's pipe, so a line drawn right after a row could land
/// before the row itself.
struct Ticker {
    state: Arc<Mutex<TickState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct TickState {
    progress: Progress,
    /// Index, name and start of the point being measured.
    current: Option<(u64, String, Instant)>,
}

/// A point is shown once it has run this long.
const SHOW_AFTER: Duration = Duration::from_millis(500);

impl Ticker {
    fn start(points: u64) -> Ticker {
        let progress = Progress::for_rank("metampi bench", points);
        let active = progress.active();
        let state = Arc::new(Mutex::new(TickState {
            progress,
            current: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = active.then(|| {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                    let TickState { progress, current } = &mut *st;
                    if let Some((i, what, t0)) = current {
                        if t0.elapsed() >= SHOW_AFTER {
                            let what = format!("{what}, {:.0} s", t0.elapsed().as_secs_f64());
                            progress.update(*i, &what, true);
                        }
                    }
                }
            })
        });
        Ticker {
            state,
            stop,
            thread,
        }
    }

    fn begin(&mut self, index: u64, what: String) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.current = Some((index, what, Instant::now()));
    }

    /// Erases the line before a row is printed.
    fn end(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.current = None;
        st.progress.clear();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_limit_caps_iterations_and_keeps_a_floor() {
        // Fast points run the count asked for, with its warm-up less the probe.
        assert_eq!(fit_iterations((2000, 200), 1e-6, 2.0), (2000, 199));
        // A slow point runs what fits the limit, at least three.
        assert_eq!(fit_iterations((2000, 200), 0.01, 2.0), (200, 19));
        assert_eq!(fit_iterations((20, 2), 10.0, 2.0), (3, 0));
        // No limit.
        assert_eq!(fit_iterations((20, 2), 10.0, 0.0), (20, 1));
    }

    #[test]
    fn sizes_and_ops_parse() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert!(parse_size("x").is_err());
        let (n, w) = iterations(16 << 20, 1.0);
        assert!(n >= 20 && w >= 2);
        assert!(iterations(8, 1.0).0 > iterations(1 << 20, 1.0).0);
    }
}
