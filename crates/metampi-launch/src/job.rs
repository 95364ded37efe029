//! Running a job: start the key-value server, spawn every rank in its own process group,
//! watch them, stop them all on the first failure, reap everything.
//!
//! Nothing here polls: every rank has a thread blocked in `waitpid`, and the monitor blocks on
//! one channel that carries rank exits, aborts from the key-value server and signals to the
//! launcher, with the timeout as the receive deadline.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::answer::Ask;
use crate::command::{self, RemoteStdin};
use crate::error::LaunchError;
use crate::live::{LiveView, LIVE_EVERY};
use crate::outcome::{HelperId, JobFailure, JobOutcome, RankId, RankResult};
use crate::pmi::{JobId, JobKey, PmiEvent, PmiServer, HELPER_ENV};
use crate::remote::{self, HostLaunch, ManualProcess, SecretSource};
use crate::report::{self, Gathering, Known, Why};
use crate::spec::{JobSpec, OutputMode, Plan, RankPlan, ReportAddition, Start, StdinTarget};
use crate::stdio::{self, PumpTarget, Sink, StdinPump, Stream};
use crate::sys::{self, SignalSubscription};

/// Time between SIGTERM and SIGKILL when stopping a job.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Prefix of every line the launcher itself prints.
const WHO: &str = "metampi run";

/// Runs a job to completion and reports how every rank ended.
///
/// Validates `spec` first ([`JobSpec::validate`]), so nothing starts for a bad spec. Then
/// every rank is started in its own process group with the `METAMPI_*` environment, output is
/// forwarded as configured, and the call blocks until all ranks have ended. The first failure
/// (non-zero exit, death by signal, `ABORT`, exit without `FINALIZE` after connecting, the
/// timeout, or SIGINT/SIGTERM/SIGHUP to this process) is printed to stderr as one line; the
/// remaining ranks get SIGTERM (or the signal the launcher received), SIGKILL after
/// [`KILL_GRACE`], and are reaped before this returns.
///
/// Safe to call from any thread, also several jobs at once (e.g. parallel tests); output
/// forwarding uses std's stdout/stderr locks, so lines never mix.
///
/// # Errors
/// Validation errors, and failures to set up or spawn; in the latter case ranks already
/// started are killed and reaped first. A job that starts and then fails is an `Ok` whose
/// [`JobOutcome::failure`] says why.
pub fn run(spec: &JobSpec) -> Result<JobOutcome, LaunchError> {
    let plan = spec.plan()?;
    // Every rank costs the launcher descriptors; a low soft limit (ulimit -Sn 64 allows 8
    // ranks) is raised to the hard one, and a job that needs more is refused up front.
    if let Ok(limit) = sys::raise_fd_limit() {
        let need = crate::error::FDS_PER_RANK * plan.size as u64 + 32;
        if limit < need {
            return Err(LaunchError::TooFewDescriptors {
                ranks: plan.size,
                need,
                limit,
            });
        }
    }
    let job = JobId::random();
    let (events_tx, events) = mpsc::channel::<Event>();
    let helpers = helpers(spec);

    // Ranks on other machines must reach the server; when all are here (or remote ranks are
    // told a loopback address, as tests do), stay off the network.
    let loopback_pmi = plan
        .pmi_host
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_loopback());
    let bind_ip = if plan.all_local || loopback_pmi {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    // Every job has a secret its processes prove to each other (challenge and
    // response); the caller may have chosen it (meta jobs share it with routers).
    let secret = match plan.env.iter().find(|(k, _)| k == "METAMPI_SECRET") {
        Some((_, v)) => v.to_string_lossy().into_owned(),
        None => job_secret().map_err(|source| LaunchError::Io {
            what: "cannot make the job secret",
            source,
        })?,
    };
    let key = JobKey::from_hex(&secret).ok_or(LaunchError::Io {
        what: "METAMPI_SECRET must be 64 hexadecimal digits",
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let pmi = {
        let tx = events_tx.clone();
        PmiServer::bind(
            bind_ip,
            plan.size,
            helpers.len(),
            job,
            Box::new(move |event| {
                // The monitor outlives the server, so the receiver is still there.
                let _ = tx.send(Event::Pmi(event));
            }),
            // Ranks on this machine bootstrap over a Unix socket: it reaches them in
            // any network namespace (emulated sites) and keeps them off the network.
            true,
            Some(key),
        )
        .map_err(LaunchError::Pmi)?
    };

    let _signals = if spec.forward_signals {
        let tx = events_tx.clone();
        Some(
            SignalSubscription::new(move |signal| {
                let _ = tx.send(Event::Signal(signal));
            })
            .map_err(|source| LaunchError::Io {
                what: "cannot install signal handlers",
                source,
            })?,
        )
    } else {
        None
    };

    // One thread per watched process, blocked until it ends; it does not reap it (the
    // caller does), and outlives the job harmlessly when the process outlives it.
    for (pid, what) in &spec.watched {
        let (tx, pid, what) = (events_tx.clone(), *pid, what.clone());
        let watcher = std::thread::Builder::new()
            .name(format!("metampi-watch-{pid}"))
            .spawn(move || {
                if let Ok(status) = sys::wait_exit_unreaped(pid) {
                    let _ = tx.send(Event::Watched { what, pid, status });
                }
            });
        if let Err(source) = watcher {
            return Err(LaunchError::Io {
                what: "cannot start a thread to watch the job's helpers",
                source,
            });
        }
    }

    let capture = match spec.output {
        OutputMode::Capture => Some((
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
        )),
        _ => None,
    };
    let here = || {
        std::env::current_dir().map_err(|source| LaunchError::Io {
            what: "cannot determine the working directory for remote ranks",
            source,
        })
    };
    let cwd = match &spec.wdir {
        Some(dir) if dir.is_absolute() => Some(dir.clone()),
        Some(dir) => Some(here()?.join(dir)),
        None if plan.all_local => None,
        None => Some(here()?),
    };
    if let (Some(dir), true) = (&cwd, plan.all_local) {
        if !dir.is_dir() {
            return Err(LaunchError::Io {
                what: "the ranks' working directory (--wdir) is not a directory here",
                source: io::Error::new(io::ErrorKind::NotFound, dir.display().to_string()),
            });
        }
    }
    // CPUs for the ranks started on this machine, in turn (`--bind-to`).
    let binding = crate::bind::plan(spec.bind).map_err(|source| LaunchError::Io {
        what: "cannot read the CPUs this process may use",
        source,
    })?;
    let here = plan
        .ranks
        .iter()
        .filter(|r| r.start == Start::Local)
        .count();
    if !binding.is_empty() && here > binding.len() {
        let units = match (spec.bind, binding.len()) {
            (crate::Binding::Core, 1) => "core",
            (crate::Binding::Core, _) => "cores",
            (_, 1) => "hardware thread",
            _ => "hardware threads",
        };
        tracing::warn!(
            "{WHO}: {here} ranks bound to {} {units} here: several ranks share one",
            binding.len()
        );
    }
    let (done_tx, done_rx) = mpsc::channel();
    let started_at = Instant::now();
    let mut ctx = StartContext {
        binding,
        bound: 0,
        spec,
        plan: &plan,
        job,
        pmi_port: pmi.addr().port(),
        pmi_unix: pmi.unix_path(),
        secret,
        cwd: cwd.as_deref(),
        capture: capture.clone(),
        done: done_tx,
        events: events_tx.clone(),
        forwarders: 0,
    };

    let mut ids: Vec<RankId> = Vec::with_capacity(plan.size);
    let mut stdin_targets: Vec<PumpTarget> = Vec::new();
    // The stdin of every remote rank that does not read the launcher's: held open while the
    // job runs, since its end tells the remote side that the launcher is gone.
    let mut keep_open: Vec<ChildStdin> = Vec::new();
    let mut by_hand: Vec<(usize, ManualProcess)> = Vec::new();
    for rank_plan in &plan.ranks {
        match start_rank(&mut ctx, rank_plan) {
            Ok(started) => {
                ids.push(started.id);
                stdin_targets.extend(started.stdin);
                keep_open.extend(started.keep_open);
                by_hand.extend(started.by_hand);
            }
            Err(e) => {
                kill_started(&ids, &events);
                return Err(e);
            }
        }
    }
    let forwarders = ctx.forwarders;
    let secret = std::mem::take(&mut ctx.secret);
    drop(ctx);
    if !by_hand.is_empty() || !helpers.is_empty() {
        let pmi_addr = format!("{}:{}", plan.pmi_host, pmi.addr().port());
        print_manual_commands(
            spec,
            &plan,
            &by_hand,
            &helpers,
            &[
                (crate::contract::PMI, pmi_addr),
                (crate::contract::JOB, job.to_string()),
            ],
            cwd.as_deref().unwrap_or(Path::new(".")),
            &secret,
        );
    }

    let stdin_pump = if stdin_targets.is_empty() {
        None
    } else {
        match StdinPump::start(spec.stdin_data.clone(), stdin_targets) {
            Ok(pump) => Some(pump),
            Err(source) => {
                kill_started(&ids, &events);
                return Err(LaunchError::Io {
                    what: "cannot start stdin forwarding",
                    source,
                });
            }
        }
    };

    let helper_ids: Vec<HelperId> = helpers.iter().map(|(_, id, _)| id.clone()).collect();
    let mut monitor = Monitor {
        ids: &ids,
        statuses: vec![None; plan.size],
        alive: ids.iter().filter(|id| !id.by_hand).count(),
        by_hand_alive: ids.iter().filter(|id| id.by_hand).count(),
        joined: vec![false; plan.size],
        helpers: &helper_ids,
        helpers_joined: vec![false; helper_ids.len()],
        events: &events,
        pmi: &pmi,
        stall: spec.stall_timeout,
        also: spec.report_also.as_ref(),
        gathering: None,
        next_look: spec.stall_timeout.map(|s| Instant::now() + look_every(s)),
        live: spec.live.as_ref(),
        next_live: spec.live.as_ref().map(|_| Instant::now()),
    };
    if let Some(live) = &spec.live {
        live.begin(job.to_string(), &ids);
    }
    let deadline = spec.timeout.map(|t| started_at + t);
    let join = (!by_hand.is_empty() || !helpers.is_empty())
        .then(|| (Instant::now() + spec.join_timeout, spec.join_timeout));
    let failure = monitor.watch(deadline, spec.timeout.unwrap_or_default(), join);
    if let Some(failure) = &failure {
        // `metampi run ... | head` ends as quietly as the pipeline's other programs.
        if !matches!(failure, JobFailure::OutputClosed) {
            eprintln!("{WHO}: {failure}");
        }
        let first = match failure {
            JobFailure::Interrupted { signal } => *signal,
            _ => libc::SIGTERM,
        };
        monitor.stop_all(first);
    }
    monitor.refresh_live();
    if let Some(live) = &spec.live {
        live.end();
    }

    if let Some(pump) = stdin_pump {
        pump.stop();
    }
    drop(keep_open);
    // Ranks are gone; their pipes close unless a leftover child of theirs holds them open.
    let mut pending =
        stdio::wait_forwarders(&done_rx, forwarders, Instant::now() + stdio::OUTPUT_GRACE);
    if pending > 0 {
        signal_groups(&ids, libc::SIGKILL);
        pending = stdio::wait_forwarders(&done_rx, pending, Instant::now() + stdio::OUTPUT_GRACE);
        if pending > 0 {
            eprintln!(
                "{WHO}: {pending} output stream(s) still open after every rank exited \
                 (a process outside the ranks' process groups holds them); not waiting for them"
            );
        }
    }
    let statuses = std::mem::take(&mut monitor.statuses);
    drop(pmi);
    sweep_segments(job);

    let take = |buffer: Arc<Mutex<Vec<u8>>>| {
        std::mem::take(&mut *buffer.lock().unwrap_or_else(PoisonError::into_inner))
    };
    let (stdout, stderr) = match capture {
        Some((out, err)) => (take(out), take(err)),
        None => (Vec::new(), Vec::new()),
    };
    Ok(JobOutcome {
        job,
        ranks: ids
            .into_iter()
            .zip(statuses)
            .map(|(id, status)| RankResult { id, status })
            .collect(),
        failure,
        stdout,
        stderr,
    })
}

/// Shared stdout and stderr buffers for [`OutputMode::Capture`].
type CaptureBuffers = (Arc<Mutex<Vec<u8>>>, Arc<Mutex<Vec<u8>>>);

enum Event {
    Exited {
        rank: usize,
        status: io::Result<ExitStatus>,
    },
    Pmi(PmiEvent),
    Signal(i32),
    /// The reader of the launcher's stdout has gone.
    OutputClosed,
    /// A process of the job that is not a rank ([`JobSpec::watch`]) ended.
    Watched {
        what: String,
        pid: u32,
        status: ExitStatus,
    },
}

/// What starting one rank produced.
struct Started {
    id: RankId,
    /// Its stdin, when it reads the launcher's.
    stdin: Option<PumpTarget>,
    /// The stdin of a remote rank that must stay open while the job runs.
    keep_open: Option<ChildStdin>,
    /// A rank started by hand: what its command must run.
    by_hand: Option<(usize, ManualProcess)>,
}

struct StartContext<'a> {
    /// CPU sets for the ranks started here, in turn, and how many were given.
    binding: Vec<Vec<usize>>,
    bound: usize,
    spec: &'a JobSpec,
    plan: &'a Plan,
    job: JobId,
    pmi_port: u16,
    pmi_unix: Option<&'a Path>,
    /// The job secret (64 hex digits) unless the job's environment sets one.
    secret: String,
    cwd: Option<&'a Path>,
    capture: Option<CaptureBuffers>,
    done: Sender<()>,
    events: Sender<Event>,
    forwarders: usize,
}

/// Spawns one rank with its forwarders and waiter thread, or, for a rank started by hand,
/// works out what its command must run. On error, the rank (if it started) has been killed and
/// reaped.
fn start_rank(ctx: &mut StartContext<'_>, rank_plan: &RankPlan) -> Result<Started, LaunchError> {
    let placement = &rank_plan.placement;
    let rank = placement.rank;
    let app = &ctx.spec.apps[placement.app];
    let debug_port = if ctx.plan.debug_ranks.contains(&rank) {
        Some(free_port().map_err(|source| LaunchError::Io {
            what: "cannot find a free port for gdbserver",
            source,
        })?)
    } else {
        None
    };

    let pmi = match (&rank_plan.start, ctx.pmi_unix) {
        (Start::Local, Some(path)) => format!("unix:{}", path.display()),
        (Start::Local, None) => format!("127.0.0.1:{}", ctx.pmi_port),
        _ => format!("{}:{}", ctx.plan.pmi_host, ctx.pmi_port),
    };
    let mut env: Vec<(OsString, OsString)> = ctx.plan.env.clone();
    // The host's own variables win over the job's (plan() refused reserved names).
    if let Some(h) = placement.host {
        for (k, v) in &ctx.spec.hosts[h].env {
            env.retain(|(n, _)| n != k);
            env.push((k.clone(), v.clone()));
        }
    }
    if !env.iter().any(|(k, _)| k == "METAMPI_SECRET") {
        env.push(("METAMPI_SECRET".into(), ctx.secret.clone().into()));
    }
    let contract = crate::contract::RankEnv {
        pmi,
        job: ctx.job.to_string(),
        rank: to_u32(rank),
        size: to_u32(ctx.plan.size),
        appnum: to_u32(placement.app),
        node: Some(placement.node.clone()),
        local: Some((to_u32(placement.local_rank), to_u32(placement.local_size))),
    };
    env.extend(
        contract
            .vars()
            .into_iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env.retain(|(k, _)| {
        k != stdio::TAG_OUTPUT_ENV && k != stdio::OUTPUT_DIR_ENV && k != stdio::OUTPUT_NAME_ENV
    });
    if ctx.spec.tag_output {
        env.push((stdio::TAG_OUTPUT_ENV.into(), "1".into()));
    }
    if let OutputMode::Directory(dir) = &ctx.spec.output {
        // Absolute, since a rank may change its directory before it spawns.
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        env.push((stdio::OUTPUT_DIR_ENV.into(), dir.into_os_string()));
        env.push((
            stdio::OUTPUT_NAME_ENV.into(),
            stdio::output_stem(rank).into(),
        ));
    }

    let reads_stdin = match ctx.spec.stdin {
        StdinTarget::All => true,
        StdinTarget::Rank(r) => r == rank,
        StdinTarget::None => false,
    };
    // Invariant: plan() sets all_local = false when any rank is remote, and run() resolves
    // cwd in exactly that case, so the fallback is never used for an ssh rank.
    let cwd = ctx.cwd.unwrap_or(Path::new("."));
    let remote_stdin = if reads_stdin {
        RemoteStdin::Forward
    } else {
        RemoteStdin::Watch
    };
    let Some(argv) = command::rank_argv(&rank_plan.start, debug_port, app, &env, cwd, remote_stdin)
    else {
        return Ok(Started {
            id: RankId {
                rank,
                pid: 0,
                host: placement.node.clone(),
                by_hand: true,
            },
            stdin: None,
            keep_open: None,
            // Start::Manual comes only from a host's HostLaunch, so the rank has a host.
            by_hand: placement.host.map(|h| {
                (
                    h,
                    ManualProcess {
                        name: format!("rank {rank}"),
                        env,
                        program: app.program.clone(),
                        args: app.args.clone(),
                    },
                )
            }),
        });
    };
    let remote = rank_plan.start != Start::Local;
    let program_display = argv
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let spawn_error = |source: io::Error| LaunchError::Spawn {
        rank,
        program: program_display.clone(),
        host: placement.node.clone(),
        source,
    };
    let Some((program, args)) = argv.split_first() else {
        return Err(spawn_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty launch command",
        )));
    };

    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0);
    if !remote {
        // Remote ranks carry their environment inside the command line instead.
        cmd.envs(env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())));
    }
    sys::kill_when_parent_dies(&mut cmd);
    if !remote {
        if let Some(dir) = ctx.cwd {
            cmd.current_dir(dir);
        }
    }
    if !remote && !ctx.binding.is_empty() {
        let cpus = &ctx.binding[ctx.bound % ctx.binding.len()];
        sys::bind_to(&mut cmd, cpus);
        ctx.bound += 1;
        if ctx.spec.report_bindings {
            eprintln!(
                "{WHO}: rank {rank} on {} bound to CPUs {}",
                placement.node,
                crate::bind::cpu_list(cpus)
            );
        }
    } else if ctx.spec.report_bindings {
        let why = if remote {
            "started on another host"
        } else {
            "--bind-to none"
        };
        eprintln!("{WHO}: rank {rank} on {} not bound ({why})", placement.node);
    }
    // A remote rank's stdin carries the job secret first, and then either the launcher's
    // stdin or nothing until the job ends.
    cmd.stdin(if reads_stdin || remote {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    match &ctx.spec.output {
        OutputMode::Directory(dir) => {
            let file = |suffix: &str| {
                let path = dir.join(format!("{}.{suffix}", stdio::output_stem(rank)));
                File::create(&path).map_err(|source| LaunchError::OutputDir { path, source })
            };
            cmd.stdout(file("stdout")?).stderr(file("stderr")?);
        }
        _ => {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
    }

    if let Some(port) = debug_port {
        let quoted = String::from_utf8_lossy(&command::shell_quote(&app.program)).into_owned();
        eprintln!(
            "{WHO}: rank {rank} waits for a debugger under gdbserver; attach with: \
             gdb -ex 'target remote 127.0.0.1:{port}' {quoted}"
        );
    }

    let mut child = cmd.spawn().map_err(&spawn_error)?;
    let pid = child.id();
    let id = RankId {
        rank,
        pid,
        host: placement.node.clone(),
        by_hand: false,
    };
    let kill_and_reap = |err: io::Error| {
        let _ = sys::kill_group(pid, libc::SIGKILL);
        let _ = sys::wait_pid(pid);
        spawn_error(err)
    };

    let prefix = if ctx.spec.tag_output {
        format!("[{rank}] ").into_bytes()
    } else {
        Vec::new()
    };
    let sinks = match &ctx.capture {
        Some((out, err)) => (
            Sink::Capture(Arc::clone(out)),
            Sink::Capture(Arc::clone(err)),
        ),
        None => (
            Sink::Terminal(Stream::Stdout),
            Sink::Terminal(Stream::Stderr),
        ),
    };
    if let Some(out) = child.stdout.take() {
        // A closed stdout ends the job, as it ends a pipeline's other programs.
        let closed: Option<stdio::OnClosed> = ctx.capture.is_none().then(|| {
            let tx = ctx.events.clone();
            Box::new(move || {
                let _ = tx.send(Event::OutputClosed);
            }) as stdio::OnClosed
        });
        stdio::spawn_forwarder(
            format!("metampi-out-{rank}"),
            out,
            prefix.clone(),
            sinks.0,
            ctx.done.clone(),
            closed,
        )
        .map_err(kill_and_reap)?;
        ctx.forwarders += 1;
    }
    if let Some(err) = child.stderr.take() {
        stdio::spawn_forwarder(
            format!("metampi-err-{rank}"),
            err,
            prefix,
            sinks.1,
            ctx.done.clone(),
            None,
        )
        .map_err(kill_and_reap)?;
        ctx.forwarders += 1;
    }
    if remote {
        // After the forwarders: should the command be gone already, its message still shows.
        let secret = env
            .iter()
            .find(|(k, _)| k == command::SECRET_ENV)
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        remote::write_secret_line(&mut child, &secret);
    }
    let stdin = child.stdin.take();
    let (stdin, keep_open) = if reads_stdin {
        (
            stdin.map(|stdin| PumpTarget {
                stdin,
                framed: remote,
            }),
            None,
        )
    } else {
        (None, stdin)
    };
    // std's Child neither kills nor reaps on drop; the waiter below owns the reaping.
    drop(child);
    let events = ctx.events.clone();
    std::thread::Builder::new()
        .name(format!("metampi-wait-{rank}"))
        .stack_size(64 * 1024)
        .spawn(move || {
            let status = sys::wait_pid(pid);
            let _ = events.send(Event::Exited { rank, status });
        })
        .map_err(kill_and_reap)?;
    Ok(Started {
        id,
        stdin,
        keep_open,
        by_hand: None,
    })
}

/// The helpers of the hosts started by hand (routers of a meta job's machines started by
/// hand), numbered in the order their commands are printed (see [`print_order`]): each with
/// its host, its name for messages, and what it runs.
fn helpers(spec: &JobSpec) -> Vec<(usize, HelperId, ManualProcess)> {
    let mut out = Vec::new();
    for h in print_order(spec) {
        let Some(HostLaunch::Manual { helpers, .. }) = &spec.hosts[h].launch else {
            continue;
        };
        for p in helpers {
            let id = HelperId {
                index: out.len(),
                name: p.name.clone(),
                host: spec.hosts[h].name.clone(),
            };
            out.push((h, id, p.clone()));
        }
    }
    out
}

/// The hosts started by hand, in the order their commands are printed: those without ranks
/// first (in a meta job, machines with routers only, which carry what the others' ranks send),
/// then the others, each group in host order.
fn print_order(spec: &JobSpec) -> Vec<usize> {
    let mut hosts: Vec<usize> = (0..spec.hosts.len())
        .filter(|&h| matches!(spec.hosts[h].launch, Some(HostLaunch::Manual { .. })))
        .collect();
    hosts.sort_by_key(|&h| (spec.hosts[h].slots > 0, h));
    hosts
}

/// Prints, for every host whose ranks or helpers are started by hand, the one command to run
/// there (see [`remote::manual_command`]), on stderr, in [`print_order`]. Each helper gets the
/// variables of `server` (`METAMPI_PMI`, `METAMPI_JOB`) and its index in [`HELPER_ENV`], so
/// that it can say that it is up and learn when the job ends.
fn print_manual_commands(
    spec: &JobSpec,
    plan: &Plan,
    by_hand: &[(usize, ManualProcess)],
    helpers: &[(usize, HelperId, ManualProcess)],
    server: &[(&str, String)],
    cwd: &Path,
    secret: &str,
) {
    let mut inline = false;
    for h in print_order(spec) {
        let host = &spec.hosts[h];
        let Some(HostLaunch::Manual { secret_file, .. }) = &host.launch else {
            continue;
        };
        let ranks: Vec<ManualProcess> = by_hand
            .iter()
            .filter(|(x, _)| *x == h)
            .map(|(_, p)| p.clone())
            .collect();
        let mine: Vec<ManualProcess> = helpers
            .iter()
            .filter(|(x, _, _)| *x == h)
            .map(|(_, id, p)| {
                let mut p = p.clone();
                let index = id.index.to_string();
                let vars = server.iter().map(|(k, v)| (*k, v.as_str()));
                for (k, v) in vars.chain([(HELPER_ENV, index.as_str())]) {
                    p.env.retain(|(n, _)| n.as_os_str() != k);
                    p.env.push((k.into(), v.into()));
                }
                p
            })
            .collect();
        if ranks.is_empty() && mine.is_empty() {
            continue;
        }
        let source = match secret_file {
            Some(path) => SecretSource::File(path.clone()),
            None => {
                inline = true;
                SecretSource::Inline(secret.to_string())
            }
        };
        let numbers: Vec<usize> = plan
            .ranks
            .iter()
            .filter(|r| r.placement.host == Some(h))
            .map(|r| r.placement.rank)
            .collect();
        let mut what = Vec::new();
        if !numbers.is_empty() {
            what.push(describe_ranks(&numbers));
        }
        what.extend(mine.iter().map(|p| p.name.clone()));
        eprintln!(
            "{WHO}: start {} on {} by hand: run this command in a shell on that machine:",
            what.join(", "),
            host.name
        );
        eprintln!("{}", remote::manual_command(cwd, &source, &mine, &ranks));
    }
    if inline {
        eprintln!(
            "{WHO}: note: these commands contain the job secret (whoever sees them can join \
             the job); a secret file that the machines share keeps it out of them"
        );
    }
    let who = match (by_hand.is_empty(), helpers.is_empty()) {
        (false, true) => "the ranks",
        (true, false) => "the processes",
        _ => "the ranks and the other processes",
    };
    eprintln!(
        "{WHO}: waiting up to {} s for {who} started by hand to join",
        spec.join_timeout.as_secs()
    );
}

/// `rank 3` or `ranks 3-5` for consecutive ranks, `ranks 1, 4` otherwise.
fn describe_ranks(ranks: &[usize]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        [first, .., last] if last - first + 1 == ranks.len() => format!("ranks {first}-{last}"),
        _ => format!(
            "ranks {}",
            ranks
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Stops the ranks started so far after a failed start, and waits for their waiters.
fn kill_started(ids: &[RankId], events: &Receiver<Event>) {
    signal_groups(ids, libc::SIGKILL);
    let mut remaining = ids.iter().filter(|id| !id.by_hand).count();
    while remaining > 0 {
        match events.recv() {
            Ok(Event::Exited { .. }) => remaining -= 1,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

fn signal_groups(ids: &[RankId], signal: i32) {
    // Ranks started by hand have no process here (pid 0, which kill_group refuses anyway).
    for id in ids.iter().filter(|id| !id.by_hand) {
        // ESRCH just means the whole group is already gone.
        let _ = sys::kill_group(id.pid, signal);
        // A stopped rank (SIGSTOP, a debugger let go of) acts on the signal only once it
        // runs again; SIGCONT makes it end within the grace period rather than at the KILL.
        if signal != libc::SIGKILL {
            let _ = sys::kill_group(id.pid, libc::SIGCONT);
        }
    }
}

/// A port that was free a moment ago, for gdbserver to listen on.
fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

struct Monitor<'a> {
    ids: &'a [RankId],
    statuses: Vec<Option<ExitStatus>>,
    /// Ranks the launcher started that have not exited.
    alive: usize,
    /// Ranks started by hand whose connection to the key-value server has not closed.
    by_hand_alive: usize,
    /// Which ranks have said `HELLO`.
    joined: Vec<bool>,
    /// The helpers started by hand, by index.
    helpers: &'a [HelperId],
    /// Which helpers have said `HELPER`.
    helpers_joined: Vec<bool>,
    events: &'a Receiver<Event>,
    pmi: &'a PmiServer,
    /// The stall timeout, and when the ranks are next asked where they are.
    stall: Option<Duration>,
    next_look: Option<Instant>,
    /// What the report adds under the ranks' table.
    also: Option<&'a ReportAddition>,
    /// A hang report being gathered.
    gathering: Option<Gathering>,
    /// The live view to keep up to date, and when it is next refreshed.
    live: Option<&'a LiveView>,
    next_live: Option<Instant>,
}

/// How often a job with stall timeout `limit` is looked at.
fn look_every(limit: Duration) -> Duration {
    (limit / 4).max(Duration::from_millis(250))
}

impl Monitor<'_> {
    /// Blocks until every rank has exited cleanly or something fails; returns the failure.
    /// `join` is the deadline (and the timeout it came from) for ranks and helpers started by
    /// hand to connect. A helper that leaves while ranks run fails the job; helpers that
    /// have not joined when the ranks are done are not waited for.
    fn watch(
        &mut self,
        deadline: Option<Instant>,
        timeout: Duration,
        join: Option<(Instant, Duration)>,
    ) -> Option<JobFailure> {
        while self.alive + self.by_hand_alive > 0 {
            let waiting: Vec<RankId> = self
                .ids
                .iter()
                .filter(|id| id.by_hand && !self.joined[id.rank])
                .cloned()
                .collect();
            let waiting_helpers: Vec<HelperId> = self
                .helpers
                .iter()
                .filter(|h| !self.helpers_joined[h.index])
                .cloned()
                .collect();
            let join = join.filter(|_| !waiting.is_empty() || !waiting_helpers.is_empty());
            let until = match (deadline, join) {
                (Some(d), Some((j, _))) => Some(d.min(j)),
                (d, j) => d.or(j.map(|(j, _)| j)),
            };
            // The report's own times: its answers' deadline, or the next look for a stall.
            let look = match &self.gathering {
                Some(g) => Some(g.until),
                None => match (self.next_look, self.next_live) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            };
            let limit = until;
            let until = match (until, look) {
                (Some(u), Some(l)) => Some(u.min(l)),
                (u, l) => u.or(l),
            };
            let event = match until {
                Some(until) => {
                    match self
                        .events
                        .recv_timeout(until.saturating_duration_since(Instant::now()))
                    {
                        Ok(event) => event,
                        Err(RecvTimeoutError::Timeout) if limit.is_none_or(|l| l > until) => {
                            // Only the report's time has come.
                            if let Some(failure) = self.report_time() {
                                return Some(failure);
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            return Some(match (deadline, join) {
                                (Some(d), _) if d <= until => {
                                    JobFailure::Timeout { after: timeout }
                                }
                                (_, Some((_, after))) => JobFailure::NotJoined {
                                    ranks: waiting,
                                    helpers: waiting_helpers,
                                    after,
                                },
                                _ => JobFailure::Timeout { after: timeout },
                            })
                        }
                        Err(RecvTimeoutError::Disconnected) => return None,
                    }
                }
                // run() holds a sender for the whole job, so this cannot disconnect.
                None => self.events.recv().ok()?,
            };
            match event {
                Event::Exited { rank, status } => {
                    if let Some(failure) = self.record_exit(rank, status) {
                        return Some(failure);
                    }
                    self.refresh_live();
                }
                Event::Pmi(PmiEvent::Abort {
                    rank,
                    code,
                    message,
                }) => {
                    return Some(JobFailure::Aborted {
                        rank: self.ids[rank].clone(),
                        code,
                        message,
                    })
                }
                Event::Pmi(PmiEvent::Joined { rank }) => {
                    if let Some(j) = self.joined.get_mut(rank) {
                        *j = true;
                    }
                }
                Event::Pmi(PmiEvent::Left { rank }) => {
                    if let Some(failure) = self.record_departure(rank) {
                        return Some(failure);
                    }
                }
                Event::Pmi(PmiEvent::Report {
                    rank,
                    waited,
                    text,
                    traffic,
                    calls,
                }) => {
                    // Counters and calls are news whenever they come, a round under way or
                    // not (an answer after its round's deadline still carries them).
                    if let Some(live) = self.live {
                        live.heard(rank, traffic, calls);
                    }
                    let Some(g) = &mut self.gathering else {
                        continue;
                    };
                    g.answer(rank, waited, text);
                    if g.complete() {
                        if let Some(failure) = self.finish_report() {
                            return Some(failure);
                        }
                    }
                }
                Event::Signal(libc::SIGUSR1) => {
                    // Asked again while gathering: the round under way answers both.
                    match &mut self.gathering {
                        Some(g) => g.why = Why::Asked,
                        None => self.ask(Why::Asked),
                    }
                }
                Event::Pmi(PmiEvent::HelperJoined { helper }) => {
                    if let Some(j) = self.helpers_joined.get_mut(helper) {
                        *j = true;
                    }
                }
                Event::Pmi(PmiEvent::HelperLeft { helper }) => {
                    if let Some(id) = self.helpers.get(helper) {
                        return Some(JobFailure::HelperLeft { helper: id.clone() });
                    }
                }
                Event::Signal(signal) => return Some(JobFailure::Interrupted { signal }),
                Event::OutputClosed => return Some(JobFailure::OutputClosed),
                Event::Watched { what, pid, status } => {
                    return Some(JobFailure::ProcessEnded {
                        what,
                        pid,
                        code: status.code(),
                        signal: status.signal(),
                    })
                }
            }
        }
        None
    }

    /// Starts a round of asking the ranks where they are.
    fn ask(&mut self, why: Why) {
        // Only the live view draws the calls: other rounds do not make ranks gather them.
        let ask = match why {
            Why::Live => Ask::WaitAndCalls,
            _ => Ask::Wait,
        };
        let mut g = Gathering::new(why, self.pmi.ask_reports(ask));
        if g.complete() {
            // Nobody to ask (all still starting, or finalized): report at once.
            g.until = Instant::now();
        }
        self.gathering = Some(g);
    }

    /// The report's deadline, the next look for a stall, or the live view's refresh has come.
    fn report_time(&mut self) -> Option<JobFailure> {
        if self.gathering.is_some() {
            return self.finish_report();
        }
        let now = Instant::now();
        if self.next_live.is_some_and(|t| t <= now) {
            self.next_live = Some(now + LIVE_EVERY);
            self.refresh_live();
            // The round also serves a stall look that falls due meanwhile: its rows are judged.
            if self.live.is_some_and(LiveView::wanted) {
                self.ask(Why::Live);
                return None;
            }
        }
        if self.next_look.is_some_and(|t| t <= now) {
            self.ask(Why::Stall);
        }
        None
    }

    /// Records in the live view what the launcher knows without asking the ranks.
    fn refresh_live(&self) {
        let Some(live) = self.live else {
            return;
        };
        live.refresh(|rank| {
            let pmi = self.pmi.rank_state(rank).unwrap_or_default();
            let status = self.statuses.get(rank).copied().flatten();
            (status, pmi.finalized, pmi.connected)
        });
    }

    /// Ends a round: prints the report when it was asked for; with a stall timeout, judges
    /// whether the job still moves (and plans the next look).
    fn finish_report(&mut self) -> Option<JobFailure> {
        let g = self.gathering.take()?;
        let rows = g.rows(self.ids, |rank| {
            if self.statuses.get(rank).is_some_and(Option::is_some) {
                Known::Exited
            } else if self.pmi.rank_state(rank).is_some_and(|s| s.finalized) {
                Known::Finalized
            } else {
                Known::Running
            }
        });
        if let Some(live) = self.live {
            live.answered(&rows);
        }
        let stalled = self
            .stall
            .is_some_and(|limit| report::stalled(&rows, limit));
        if let Some(limit) = self.stall {
            self.next_look = Some(Instant::now() + look_every(limit));
        }
        if g.why != Why::Asked && !stalled {
            return None;
        }
        let mut table = report::table(&rows);
        if let Some(also) = self.also {
            let more = (also.0)();
            if !more.is_empty() {
                table.push('\n');
                table.push_str(&more);
            }
        }
        if g.why == Why::Asked {
            eprintln!("{WHO}: where each rank is (asked with SIGUSR1):\n{table}");
        }
        let after = self.stall.filter(|_| stalled)?;
        Some(JobFailure::Stalled {
            after,
            report: table,
        })
    }

    /// A rank's key-value connection closed. That is how a rank started by hand ends (the
    /// launcher has no process to wait for); ranks it started are judged by their exit.
    fn record_departure(&mut self, rank: usize) -> Option<JobFailure> {
        let id = self.ids.get(rank)?.clone();
        if !id.by_hand {
            return None;
        }
        self.by_hand_alive -= 1;
        let pmi = self.pmi.rank_state(rank).unwrap_or_default();
        if let Some((code, message)) = pmi.abort {
            return Some(JobFailure::Aborted {
                rank: id,
                code,
                message,
            });
        }
        if pmi.finalized {
            None
        } else {
            Some(JobFailure::Vanished { rank: id })
        }
    }

    fn record_exit(&mut self, rank: usize, status: io::Result<ExitStatus>) -> Option<JobFailure> {
        self.alive -= 1;
        let id = self.ids[rank].clone();
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                return Some(JobFailure::Lost {
                    rank: id,
                    reason: e.to_string(),
                })
            }
        };
        self.statuses[rank] = Some(status);
        let pmi = self.pmi.rank_state(rank).unwrap_or_default();
        match JobFailure::from_status(id.clone(), status) {
            // A rank that aborted and then exited is reported as the abort it was; the server
            // records the abort before it answers OK, so it is visible by now.
            Some(_) if pmi.abort.is_some() => {
                pmi.abort.map(|(code, message)| JobFailure::Aborted {
                    rank: id,
                    code,
                    message,
                })
            }
            Some(failure) => Some(failure),
            None if pmi.connected && !pmi.finalized => Some(JobFailure::NoFinalize { rank: id }),
            None => None,
        }
    }

    /// SIGTERM (or `first`) to every rank's group, SIGKILL after the grace period or a second
    /// signal to the launcher, then reap everything.
    fn stop_all(&mut self, first: i32) {
        signal_groups(self.ids, first);
        let grace_end = Instant::now() + KILL_GRACE;
        let mut killed = false;
        while self.alive > 0 {
            let event = if killed {
                match self.events.recv() {
                    Ok(event) => event,
                    Err(_) => return,
                }
            } else {
                match self
                    .events
                    .recv_timeout(grace_end.saturating_duration_since(Instant::now()))
                {
                    Ok(event) => event,
                    Err(RecvTimeoutError::Timeout) => {
                        signal_groups(self.ids, libc::SIGKILL);
                        killed = true;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
            match event {
                Event::Exited { rank, status } => {
                    self.alive -= 1;
                    self.statuses[rank] = status.ok();
                }
                Event::Signal(libc::SIGUSR1) => {}
                Event::Signal(_) if !killed => {
                    eprintln!("{WHO}: second signal; killing all ranks now");
                    signal_groups(self.ids, libc::SIGKILL);
                    killed = true;
                }
                Event::Signal(_) | Event::Pmi(_) | Event::OutputClosed | Event::Watched { .. } => {}
            }
        }
    }
}

/// The job secret: the launcher's own `METAMPI_SECRET` when it has one (a
/// job started inside a job, or by a user who chose it), else 256 random bits.
/// Removes what this job's ranks left in this machine's shared-memory
/// directory. Ranks unlink their segments once every local peer has mapped
/// them, so only a job that died during start-up leaves any; without this,
/// each such job would keep its rings' pages until the machine reboots.
fn sweep_segments(job: JobId) {
    let dir = if Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let prefix = format!("metampi-{job}-");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn job_secret() -> io::Result<String> {
    if let Ok(s) = std::env::var("METAMPI_SECRET") {
        return Ok(s);
    }
    Ok(crate::auth::hex(&crate::auth::random_bytes::<32>()?))
}

/// A count or index of ranks as the contract carries it (no job comes near 2^32 processes).
fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
