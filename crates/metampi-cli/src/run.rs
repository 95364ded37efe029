//! `metampi run`: maps the mpiexec-style command line onto a
//! [`metampi_launch::JobSpec`] and runs it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use metampi_launch::{
    AppSpec, Binding, Host, HostLaunch, JobSpec, LaunchMethod, OutputMode, StdinTarget,
};

/// Exit status for a command line or job description that is refused before anything starts;
/// the same as clap uses for its own usage errors.
const USAGE_EXIT: u8 = 2;

const ABOUT: &str = "Start a job of N ranks (mpiexec-style)";

const LONG_ABOUT: &str = "\
Start a job of N ranks of PROGRAM (mpiexec-style) and wait for all of them.

Several programs form one MIMD job when separated by a lone `:`, each with its own -n:
    metampi run -n 1 master : -n 4 worker --fast
Ranks are numbered program after program (master is rank 0, workers 1..=4). Options of
`metampi run` go before the first PROGRAM; everything after it belongs to the program, even
arguments that look like options (`metampi run -n 2 ls -l`).

Every rank gets these environment variables:
    METAMPI_PMI          host:port of the job's key-value server
    METAMPI_JOB          job id (16 hex digits, random per job)
    METAMPI_RANK         global rank
    METAMPI_SIZE         number of ranks in the job
    METAMPI_APPNUM       index of the rank's program in a MIMD job
    METAMPI_NODE         host the rank is placed on (same value = same machine)
    METAMPI_LOCAL_RANK   index among the ranks on the same node
    METAMPI_LOCAL_SIZE   number of ranks on the same node
    METAMPI_PROGRESS     1 when this command's stderr is a terminal (tools may draw progress
                         on /dev/tty, since rank output reaches the terminal through pipes)
    METAMPI_TAG_OUTPUT   1 under --tag-output (processes a rank spawns get `[spawn N.R] `)
    METAMPI_UNIVERSE_SIZE  N under --universe-size N (MPI_UNIVERSE_SIZE)

Placement: --hosts a,b:4 gives a one slot and b four; ranks fill the slots in order and, if
there are more ranks than slots, wrap round-robin over the hosts. Without --hosts or
--hostfile every rank runs on this machine, except inside a Slurm allocation (SLURM_JOB_ID
set): there the allocated nodes are the hosts, their task counts the slots, and every rank
starts as its own one-task `srun` step on its node (--launch slurm; --launch local keeps them
here).

When a rank exits non-zero, is killed by a signal, calls abort, or exits after connecting to
the key-value server without calling finalize, when a router of a --meta job ends, or when the
timeout expires or this command gets SIGINT/SIGTERM/SIGHUP, one line on stderr names the cause (rank, pid, host, code or signal),
the other ranks get SIGTERM and, two seconds later, SIGKILL. When the reader of this command's
stdout goes (`metampi run ... | head`), the ranks are stopped the same way, without a word.
`kill -USR1` to this command prints where each rank waits (the hang report; with --meta also
the routers' queues and links) while the job goes on; --stall-timeout ends a job that no longer
moves with that report. --web ADDR serves the same, live, as a page (and JSON) for a browser.
The launcher holds about 6 descriptors per rank: it raises its soft limit on open files to the
hard one, and refuses a job the hard limit cannot hold before starting any rank.

Exit status: 0 when every rank succeeded; otherwise the failing rank's exit code, 128+N for a
rank killed by signal N (or for signal N received by the launcher), the abort code (1 if it was
0), 124 for a timeout or a stall, 141 when stdout closed, 2 for a refused command line, 1 for a failure to
start.";

const AFTER_LONG_HELP: &str = "\
Examples:
    metampi run -n 4 ./solver input.dat
    metampi run -n 3 sh -c 'echo rank $METAMPI_RANK of $METAMPI_SIZE'
    metampi run --tag-output --stdin all -n 2 cat
    metampi run --hosts node1,node2:4 -x OMP_NUM_THREADS=2 -n 5 ./app
    metampi run --launch local --hosts siteA:2,siteB:2 -n 4 ./app     # emulate two machines
    metampi run --launch 'ssh -p 2222 {host} {cmd}' --hostfile hosts.txt -n 8 ./app
    metampi run --debug 0 -n 2 ./app                                   # rank 0 under gdbserver
    metampi run --web 127.0.0.1:8080 --meta sites.cfg ./app            # watch it at that URL
    salloc -N 2 -n 8 metampi run -n 8 ./app                            # srun steps on Slurm's nodes

Hostfile lines: `host`, `host:N` or `host slots=N`; `#` starts a comment.

mpiexec's spellings work too, with Hydra's meaning: -np N, -hosts A,B, -ppn N (N ranks on each
of -hosts), -f/-hostfile/-machinefile FILE, -genv/-env VAR VALUE, -genvall, -wdir DIR; and
mpirun's --host A:2,B, --map-by ppr:N:node, -wd DIR, -n4 and --version (table in README.md). An unknown option before the program is named (with the
closest real one) instead of being taken for the program. Programs built
against MPICH (mpicc.mpich) load metampi's C library: -v shows from where.";

/// Arguments of `metampi run`.
#[derive(Debug, Args)]
#[command(about = ABOUT, long_about = LONG_ABOUT, after_long_help = AFTER_LONG_HELP)]
pub struct RunArgs {
    /// Number of ranks for the (first) program (with --meta: taken from the file)
    #[arg(short = 'n', value_name = "N", required_unless_present = "meta")]
    np: Option<usize>,

    /// Say what the launcher sets up (where programs built against MPICH find metampi's
    /// C library)
    #[arg(short = 'v', long)]
    verbose: bool,

    /// Run across the meta computer described in FILE (MetaMPICH description language or
    /// PACX hostfile, see `metampi check`): routers between the meta hosts are started first,
    /// ranks are numbered meta host after meta host. Each meta host starts as its LAUNCH says:
    /// here (local, netns NAME), through ssh or a command template, or by hand (manual: the
    /// command to run on each of its machines is printed on stderr). A meta host's ENV and
    /// ENVFILE go to its ranks and routers; EXECPATH, EXECNAME, EXECARGS and node
    /// executables choose its ranks' program, ROUTEREXEC and MPIROOT its routers'
    #[arg(long, value_name = "FILE", conflicts_with_all = ["hosts", "hostfile"])]
    meta: Option<PathBuf>,

    /// Hosts to place ranks on, in order: `a,b:4` gives a one slot and b four
    #[arg(long, value_name = "HOST[:SLOTS],...", conflicts_with = "hostfile")]
    hosts: Option<String>,

    /// Read hosts from FILE: lines `host`, `host:N` or `host slots=N`; `#` comments
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,

    /// How to start ranks on hosts other than this one: `ssh` (default outside Slurm); `slurm`
    /// (a one-task srun step per rank on its node; the default inside a Slurm allocation, whose
    /// nodes and task counts are the hosts unless --hosts or --hostfile name others); `local`
    /// (start them here but report the assigned host as METAMPI_NODE, to emulate several
    /// machines); or a command template with {host} and {cmd}, e.g. 'ssh -p 2222 {host} {cmd}',
    /// where {cmd} becomes one word holding the rank's shell command line
    #[arg(long, value_name = "ssh|slurm|local|TEMPLATE", value_parser = parse_launch)]
    launch: Option<LaunchChoice>,

    /// Set VAR to VALUE for every rank, or pass this shell's VAR on (repeatable)
    #[arg(short = 'x', value_name = "VAR[=VALUE]")]
    export: Vec<String>,

    /// Pass this shell's whole environment to remote ranks too (local ranks always inherit it)
    #[arg(long)]
    env_all: bool,

    /// Prefix every output line with `[RANK] ` (lines of processes a rank spawns: `[RANK] [spawn N.R] `)
    #[arg(long)]
    tag_output: bool,

    /// Write DIR/rank.R.stdout and DIR/rank.R.stderr instead of forwarding output to the terminal
    /// (processes rank R spawns: DIR/rank.R.spawn.N.C.stdout and .stderr)
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,

    /// Which ranks read this command's stdin: a rank number, `all`, or `none` (the others get
    /// /dev/null)
    #[arg(long, value_name = "0|all|none|N", default_value = "0", value_parser = parse_stdin)]
    stdin: StdinTarget,

    /// Bind each rank started on this machine to CPUs of its own, from those this command may
    /// use: `core` gives a rank a whole core (all its hardware threads), `hwthread` one hardware
    /// thread, spread over the cores first; `none` leaves placement to the operating system.
    /// With more ranks than cores (or threads) they share them round-robin, with a note.
    /// Default: the METAMPI_BIND_TO variable, else none
    #[arg(long, value_name = "none|core|hwthread", value_parser = clap::builder::ValueParser::new(str::parse::<Binding>))]
    bind_to: Option<Binding>,

    /// Print, as each rank starts, the CPUs it is bound to (or that it is not)
    #[arg(long)]
    report_bindings: bool,

    /// Start every rank in DIR, on this machine and on other hosts (default: this command's
    /// directory); a relative DIR is taken from this command's directory
    #[arg(long, value_name = "DIR")]
    wdir: Option<PathBuf>,

    /// How many processes the job may grow to by spawning: what MPI_UNIVERSE_SIZE says
    /// (mpi4py.futures starts that many minus the world's size as workers); default: -n
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    universe_size: Option<u32>,

    /// Kill the job after SECS seconds (fractions allowed); exit status 124
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    timeout: Option<Duration>,

    /// End the job when nothing in it has moved for SECS seconds: every rank still running has
    /// been in one MPI wait that long, or does not answer (a stopped process). The reason printed is the hang report: for each rank the call it
    /// waits in, communicator, peer, tag, bytes and for how long; exit status 124. Ranks that
    /// compute are never ended by it. Without it, SIGUSR1 to this command prints the same
    /// report and the job goes on
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    stall_timeout: Option<Duration>,

    /// Record every communication call and `metampi::trace::region` of every rank into DIR
    /// (merge and summarise with `metampi trace DIR`); same as METAMPI_TRACE=DIR
    #[arg(long, value_name = "DIR")]
    trace: Option<PathBuf>,

    /// Start these ranks under gdbserver and print how to attach gdb: `0,2` or `1-3`
    #[arg(long, value_name = "RANKS", value_parser = parse_ranks)]
    debug: Option<RankList>,

    /// Name or address by which ranks on other machines reach this launcher (default: this
    /// machine's host name)
    #[arg(long, value_name = "HOST")]
    pmi_host: Option<String>,

    /// With --meta: how long ranks and routers of meta hosts started by hand (LAUNCH = manual)
    /// have to join after their commands are printed, in seconds (exit status 124 when they do
    /// not)
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, default_value = "300")]
    join_timeout: Duration,

    /// With --meta: print the routers' per-link statistics (bytes sent, rate, frames,
    /// compression, queues, round trip, resends) on stderr every SECS seconds while the job
    /// runs, and their totals at its end. Kept in METAMPI_ROUTER_STATS where that is set (see
    /// `metampi links`). Only routers on this machine (LAUNCH local or netns) appear: those
    /// started elsewhere (ssh, by hand) write their files on their own machines
    #[arg(long, value_name = "SECS", requires = "meta")]
    monitor: Option<f64>,

    /// Serve a live view of the job at ADDR (HOST:PORT or a port; port 0 picks a free one; the
    /// URL is printed on stderr): a page with each rank's host, state and the MPI call it
    /// waits in, and with --meta the routers' links (rate, queues, compression, resends,
    /// round trip), polling the JSON at /api/job, /api/ranks and /api/routers. Ranks are asked
    /// where they wait about once a second while a page is open. Only loopback addresses,
    /// unless --web-public
    #[arg(long, value_name = "ADDR")]
    web: Option<String>,

    /// Let --web listen on an address other machines can reach: the view has no password, and
    /// shows the job's hosts, processes and calls to whoever reaches it
    #[arg(long, requires = "web")]
    web_public: bool,

    /// PROGRAM and its arguments; more programs after a lone `:`, each as `-n M PROGRAM ARGS...`
    #[arg(
        value_name = "PROGRAM [ARGS]... [: -n M PROGRAM2 [ARGS]...]",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// Runs the job; returns the process exit status.
///
/// # Errors
/// Failures to start the job (spawning, sockets). Refused command lines are reported here and
/// give [`USAGE_EXIT`] instead, so nothing is started for them.
pub fn execute(mut args: RunArgs) -> anyhow::Result<u8> {
    // Bound before anything starts, so that a refused or busy address starts nothing.
    let web = match args
        .web
        .as_deref()
        .map(|a| crate::web::Web::start(a, args.web_public))
    {
        Some(Ok(web)) => Some(web),
        Some(Err(e)) => {
            eprintln!("metampi run: error: {e}");
            return Ok(USAGE_EXIT);
        }
        None => None,
    };
    let mut web_meta = None;
    // A meta job starts its routers first; they live until the job has ended.
    let mut running_routers = None;
    let mut meta_plan = None;
    let mut monitor = None;
    let mut report_dir = None;
    let mut routers_report = None;
    if let Some(path) = args.meta.clone() {
        let cfg = match metampi_config::load(&path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("metampi run: error: {e}");
                return Ok(USAGE_EXIT);
            }
        };
        let layout = cfg.layout();
        // ENV and ENVFILE of every meta host, read before anything starts.
        let mut host_env = Vec::with_capacity(cfg.hosts.len());
        for h in &cfg.hosts {
            match h.environment() {
                Ok(vars) => host_env.push(vars),
                Err(e) => {
                    eprintln!("metampi run: error: {e}");
                    return Ok(USAGE_EXIT);
                }
            }
        }
        // SECRET_FILE: the job secret every site shares (a site started by hand
        // needs the same one); otherwise a fresh one is made for this job.
        if let Some(file) = &cfg.globals.secret_file {
            let path = metampi_config::home_path(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading SECRET_FILE {}", path.display()))?;
            if metampi::auth::Secret::from_hex(&text).is_none() {
                eprintln!(
                    "metampi run: error: SECRET_FILE {} must hold 64 hexadecimal digits (e.g. `openssl rand -hex 32`)",
                    path.display()
                );
                return Ok(USAGE_EXIT);
            }
            // Read by the routers and the launcher started below (one thread so far).
            std::env::set_var("METAMPI_SECRET", text.trim());
        }
        match args.np {
            Some(n) if n != layout.world_size => {
                eprintln!(
                    "metampi run: error: -n {n} differs from the {} ranks that {} describes",
                    layout.world_size,
                    path.display()
                );
                return Ok(USAGE_EXIT);
            }
            _ => args.np = Some(layout.world_size),
        }
        let exe = std::env::current_exe()?.into_os_string();
        // Routers record their links into the trace directory too.
        let mut router_env: Vec<(OsString, OsString)> = Vec::new();
        if let Some(dir) = &args.trace {
            let abs = trace_dir(dir)?;
            write_sites(&abs, &layout)?;
            router_env.push(("METAMPI_TRACE".into(), abs.into_os_string()));
        }
        if let Some(secs) = args.monitor {
            if !(secs > 0.0 && secs.is_finite()) {
                eprintln!("metampi run: error: --monitor takes a positive number of seconds");
                return Ok(USAGE_EXIT);
            }
            let dir = crate::links::StatsDir::for_job()
                .context("making a directory for the routers' statistics")?;
            if dir.own() {
                router_env.push(("METAMPI_ROUTER_STATS".into(), dir.path().into()));
            }
            let every = Duration::from_secs_f64(secs);
            monitor = Some((dir, crate::links::link_names(&cfg), every));
        } else if web.is_some()
            || cfg.hosts.iter().all(|h| {
                matches!(
                    h.launch,
                    metampi_config::Launch::Local | metampi_config::Launch::Netns(_)
                )
            })
        {
            // The routers' statistics serve the hang report (`SIGUSR1`, `--stall-timeout`)
            // and the live view, where they run on this machine and write where the launcher
            // reads.
            let dir = crate::links::StatsDir::for_job()
                .context("making a directory for the routers' statistics")?;
            if dir.own() {
                router_env.push(("METAMPI_ROUTER_STATS".into(), dir.path().into()));
            }
            report_dir = Some(dir);
        }
        let names = crate::links::link_names(&cfg);
        let path = (monitor.as_ref().map(|m| m.0.path()))
            .or(report_dir.as_ref().map(|d| d.path()))
            .map(Path::to_path_buf);
        if let (Some(web), Some(dir)) = (&web, &path) {
            web.set_routers(crate::web::RouterStats {
                dir: dir.clone(),
                names: names.clone(),
            });
        }
        web_meta = Some(
            (layout.hosts.iter())
                .map(|h| (h.name.clone(), h.ranks.clone()))
                .collect::<Vec<_>>(),
        );
        routers_report = path.map(|p| (p, names));
        let opts = metampi_launch::meta::StartOptions {
            secret_file: cfg.globals.secret_file.clone(),
            ..router_options(&cfg, &layout, &host_env, &exe)
        };
        let started = metampi_launch::meta::start_with_options(
            &layout,
            &exe,
            &["router".into()],
            &router_env,
            &opts,
            &mut |a| Ok(a.to_string()),
        );
        let (routers, plan) = match started {
            Ok(started) => started,
            // A description that cannot be launched is refused like a bad command line.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                eprintln!("metampi run: error: {e}");
                return Ok(USAGE_EXIT);
            }
            Err(e) => return Err(anyhow::Error::new(e).context("starting the routers")),
        };
        running_routers = Some(routers);
        meta_plan = Some((cfg, host_env, plan));
    }
    // Per node of a meta job: its meta host's variables, and, where meta hosts run their own
    // programs or sit in network namespaces (`ip netns exec`), its own application. (Nodes
    // started by hand with routers but no ranks are hosts without slots: no application.)
    let mut meta_hosts = None;
    let mut meta_apps = None;
    if let Some((cfg, host_env, plan)) = &meta_plan {
        let nodes = &plan.nodes;
        meta_hosts = Some(
            plan.hosts
                .iter()
                .zip(nodes)
                .map(|(host, &(h, _))| host.clone().with_env(host_env[h].clone()))
                .collect::<Vec<_>>(),
        );
        let netns = plan.prefixes.iter().any(|p| !p.is_empty());
        let own = cfg
            .hosts
            .iter()
            .any(metampi_config::MetaHost::sets_rank_command);
        if netns || own {
            let apps = match split_apps(plan.world_size, &args.command) {
                Ok(apps) => apps,
                Err(e) => {
                    eprintln!("metampi run: error: {e:#}");
                    return Ok(USAGE_EXIT);
                }
            };
            let [app] = &apps[..] else {
                eprintln!(
                    "metampi run: error: --meta runs one program (each meta host may choose its \
                     own with EXECPATH, EXECNAME, EXECARGS or node executables) when a meta host \
                     does so or runs in a network namespace"
                );
                return Ok(USAGE_EXIT);
            };
            meta_apps = Some(
                nodes
                    .iter()
                    .zip(&plan.hosts)
                    .zip(&plan.prefixes)
                    .filter(|((_, host), _)| host.slots > 0)
                    .map(|((&(h, n), host), pre)| {
                        let (program, args) = cfg.hosts[h].rank_command(n, &app.program, &app.args);
                        match pre.split_first() {
                            None => AppSpec::new(host.slots, program).args(args),
                            Some((p, rest)) => AppSpec::new(host.slots, p)
                                .args(rest)
                                .arg(program)
                                .args(args),
                        }
                    })
                    .collect::<Vec<_>>(),
            );
        }
    }
    // As a shell would take it back, for the live view's title.
    let command = (args.command.iter())
        .map(|w| {
            let w = w.to_string_lossy();
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
            if plain {
                w.into_owned()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    let meta_file = args.meta.clone();
    let spec = match build_spec(args).map(|mut spec| {
        if let (Some((_, _, plan)), Some(hosts)) = (&meta_plan, meta_hosts) {
            spec = spec.hosts(hosts).launch(LaunchMethod::Local);
            for (pid, what) in running_routers
                .as_ref()
                .map(|r| r.processes())
                .unwrap_or_default()
            {
                spec = spec.watch(pid, what);
            }
            if let Some(apps) = meta_apps {
                spec = spec.replace_apps(apps);
            }
            for (k, v) in &plan.env {
                spec = spec.env(k, v);
            }
        }
        spec
    }) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("metampi run: error: {e:#}");
            return Ok(USAGE_EXIT);
        }
    };
    if let Err(e) = spec.validate() {
        eprintln!("metampi run: error: {e}");
        return Ok(USAGE_EXIT);
    }
    let spec = match routers_report {
        Some((dir, names)) => spec.report_also(move || crate::links::report(&dir, &names)),
        None => spec,
    };
    let spec = match &web {
        Some(web) => {
            web.set_job(crate::web::JobInfo {
                command,
                world_size: spec.world_size(),
                meta: meta_file.zip(web_meta),
            });
            eprintln!("metampi run: live view at {}", web.url());
            spec.live(web.live())
        }
        None => spec,
    };
    let monitor =
        monitor.map(|(dir, names, every)| crate::links::Monitor::start(dir, names, every));
    let outcome = metampi_launch::run(&spec);
    if let Some(m) = monitor {
        m.finish();
    }
    drop(report_dir);
    let outcome = outcome?;
    // exit_code() is documented to be in 0..=255.
    Ok(u8::try_from(outcome.exit_code()).unwrap_or(1))
}

fn build_spec(args: RunArgs) -> anyhow::Result<JobSpec> {
    let mut named = None;
    if let Some(list) = &args.hosts {
        named = Some(Host::parse_list(list)?);
    }
    if let Some(path) = &args.hostfile {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read hostfile {}", path.display()))?;
        named =
            Some(Host::parse_hostfile(&text).with_context(|| format!("in {}", path.display()))?);
    }
    let hosts = match slurm_hosts(&args, named.clone())? {
        Some(hosts) => Some(hosts),
        None => named,
    };
    let method = match &args.launch {
        Some(LaunchChoice::Method(m)) => m.clone(),
        Some(LaunchChoice::Slurm) | None => LaunchMethod::default(),
    };
    let mut spec = JobSpec::new()
        .launch(method)
        .env_all(args.env_all)
        .tag_output(args.tag_output)
        .stdin(args.stdin)
        .join_timeout(args.join_timeout)
        .bind(match args.bind_to {
            Some(b) => b,
            None => Binding::from_env().map_err(anyhow::Error::msg)?,
        });
    spec = spec.report_bindings(args.report_bindings);
    if let Some(dir) = &args.wdir {
        spec = spec.wdir(dir);
    }
    if let Some(host) = args.pmi_host {
        spec = spec.pmi_host(host);
    }
    for app in split_apps(args.np.unwrap_or(0), &args.command)? {
        spec = spec.app(app);
    }
    if let Some(hosts) = hosts {
        spec = spec.hosts(hosts);
    }
    for setting in &args.export {
        spec = match setting.split_once('=') {
            Some((name, value)) => spec.env(name, value),
            None => spec.export(setting),
        };
    }
    if let Some(dir) = args.output_dir {
        spec = spec.output(OutputMode::Directory(dir));
    }
    if let Some(n) = args.universe_size {
        spec = spec.env("METAMPI_UNIVERSE_SIZE", n.to_string());
    }
    if let Some(timeout) = args.timeout {
        spec = spec.timeout(timeout);
    }
    if let Some(limit) = args.stall_timeout {
        spec = spec.stall_timeout(limit);
    }
    if let Some(dir) = &args.trace {
        spec = spec.env("METAMPI_TRACE", trace_dir(dir)?.into_os_string());
    }
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        spec = spec.env(crate::progress::PROGRESS_ENV, "1");
    }
    if let Some(RankList(ranks)) = args.debug {
        spec = spec.debug_ranks(ranks);
    }
    if let Some(dir) = abi_dir() {
        // Programs built with MPICH's mpicc (or the standard ABI's mpicc_abi) load metampi's
        // C library instead of another MPI's.
        let mut path = dir.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
            path.push(":");
            path.push(old);
        }
        if args.verbose {
            eprintln!(
                "metampi run: LD_LIBRARY_PATH starts with {} (metampi's libmpi.so.12, libmpich.so.12 \
                 and libmpi_abi.so.1)",
                dir.display()
            );
        }
        for program in programs(&args.command) {
            check_mpi_library(&program, &path, &dir)?;
        }
        spec = spec.env("LD_LIBRARY_PATH", path);
    } else {
        // Without metampi's C libraries a program built against MPICH's or the standard ABI
        // would load another MPI's and start as separate worlds of one: refuse it.
        for program in programs(&args.command) {
            if let Some(lib) = mpi_library_of(&program) {
                bail!(
                    "{} is built against an MPI C library ({lib}), and metampi's C libraries \
                     are not found (METAMPI_ABI_DIR, or mpi-abi/ beside this metampi): build \
                     them (cargo build --release) or set METAMPI_ABI_DIR to \
                     target/release/mpi-abi of the build",
                    program.display()
                );
            }
        }
        if args.verbose {
            eprintln!(
                "metampi run: metampi's C libraries are not built (cargo build --release); \
                 programs built against MPICH or the standard ABI would load another MPI's"
            );
        }
    }
    Ok(spec)
}

/// The MPI C library (`libmpi.so.12`, `libmpich.so.12` or `libmpi_abi.so.1`) that `program`
/// links, by `ldd`; `None` for programs that link none, and where there is no `ldd`.
fn mpi_library_of(program: &Path) -> Option<String> {
    let out = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| {
            let name = line.split_whitespace().next()?;
            matches!(name, "libmpi.so.12" | "libmpich.so.12" | "libmpi_abi.so.1")
                .then(|| name.to_string())
        })
}

/// The programs of a command line (`A args : -n 2 B args`), found through PATH as a shell
/// would; those not found are left to the launcher, which names them.
fn programs(command: &[OsString]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (i, segment) in command.split(|w| w == ":").enumerate() {
        let rest = if i == 0 {
            Some(segment)
        } else {
            parse_np(segment).ok().map(|(_, r)| r)
        };
        let Some(p) = rest.and_then(|r| r.first()) else {
            continue;
        };
        let p = PathBuf::from(p);
        if p.components().count() > 1 {
            out.push(p);
        } else if let Some(found) = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(&p))
            .find(|c| c.is_file())
        {
            out.push(found);
        }
    }
    out
}

/// Refuses a program that would load another MPI's `libmpi.so.12`/`libmpich.so.12` (MPICH's
/// ABI) or `libmpi_abi.so.1` (the standard ABI) even with metampi's first on the library path (an RPATH baked in at link time wins over
/// `LD_LIBRARY_PATH`): its ranks would start as separate worlds of one, not as this job.
/// Programs that link no MPI library, and machines without `ldd`, pass.
fn check_mpi_library(program: &Path, ld_path: &OsStr, abi: &Path) -> anyhow::Result<()> {
    let Ok(out) = std::process::Command::new("ldd")
        .arg(program)
        .env("LD_LIBRARY_PATH", ld_path)
        .output()
    else {
        return Ok(());
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, rest)) = line.trim().split_once(" => ") else {
            continue;
        };
        if !matches!(name, "libmpi.so.12" | "libmpich.so.12" | "libmpi_abi.so.1") {
            continue;
        }
        let Some(path) = rest.split_whitespace().next().map(PathBuf::from) else {
            continue;
        };
        let dir = path.parent().and_then(|d| d.canonicalize().ok());
        if dir.as_deref() != Some(abi) {
            bail!(
                "{} loads {name} from {} instead of metampi's ({}): it would run as separate \
                 worlds of one. It carries an RPATH to that library; relink it without \
                 -Wl,-rpath (or with --enable-new-dtags) so that LD_LIBRARY_PATH decides",
                program.display(),
                path.display(),
                abi.display()
            );
        }
    }
    Ok(())
}

/// The folder with metampi's C libraries under the ABIs' names (`libmpi.so.12`,
/// `libmpich.so.12`, `libmpi_abi.so.1`): `METAMPI_ABI_DIR`, or `mpi-abi/` beside this
/// executable (where `cargo build` puts it), when one of the libraries is there.
pub fn abi_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("METAMPI_ABI_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe().ok()?.parent()?.join("mpi-abi"),
    };
    // The links dangle until the library is built: ask for the file behind them.
    ["libmpi.so.12", "libmpi_abi.so.1"]
        .iter()
        .any(|l| dir.join(l).is_file())
        .then(|| dir.canonicalize().unwrap_or(dir))
}

/// How each router of a meta job starts: `P router`, where `P` is its PAIR header's executable,
/// its meta host's `ROUTEREXEC` or `MPIROOT/bin/metampi`, else `exe` (the launcher's own
/// metampi), with its meta host's `ENV` and `ENVFILE` variables (`host_env`, per meta host).
/// `metampi_launch::meta` gives each router only its own command and variables, whatever starts it.
fn router_options(
    cfg: &metampi_config::MetaConfig,
    layout: &metampi_config::Layout,
    host_env: &[Vec<(String, String)>],
    exe: &OsStr,
) -> metampi_launch::meta::StartOptions {
    metampi_launch::meta::StartOptions {
        router_commands: layout
            .routers
            .iter()
            .map(|r| metampi_launch::meta::RouterCommand {
                program: cfg.hosts[r.host].router_program(r.exec.as_deref(), exe),
                args: vec!["router".into()],
            })
            .collect(),
        host_env: host_env
            .iter()
            .map(|vars| vars.iter().map(|(k, v)| (k.into(), v.into())).collect())
            .collect(),
        ..Default::default()
    }
}

/// Creates the trace directory and returns its absolute path (ranks and routers may run
/// elsewhere).
fn trace_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating trace directory {}", dir.display()))?;
    std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))
}

/// Writes `DIR/sites.json` for `metampi trace`: the meta hosts' names and the meta host of
/// every router, so that link traffic can be summed per pair of meta hosts.
fn write_sites(dir: &Path, layout: &metampi_config::Layout) -> anyhow::Result<()> {
    let v = serde_json::json!({
        "sites": layout.hosts.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
        "routers": layout.routers.iter().map(|r| r.host).collect::<Vec<_>>(),
    });
    let path = dir.join("sites.json");
    std::fs::write(&path, format!("{v}\n")).with_context(|| format!("writing {}", path.display()))
}

/// Splits `PROGRAM ARGS... : -n M PROGRAM2 ARGS2... : ...` into apps.
fn split_apps(first_n: usize, command: &[OsString]) -> anyhow::Result<Vec<AppSpec>> {
    let mut apps = Vec::new();
    for (index, segment) in command.split(|word| word == ":").enumerate() {
        let (n, rest) = if index == 0 {
            (first_n, segment)
        } else {
            parse_np(segment)
                .with_context(|| format!("in program {} (after `:` number {index})", index + 1))?
        };
        let Some((program, program_args)) = rest.split_first() else {
            bail!("program {} has no PROGRAM to run", index + 1);
        };
        apps.push(AppSpec::new(n, program.clone()).args(program_args.iter().cloned()));
    }
    Ok(apps)
}

/// Reads the leading `-n M` or `-nM` of a MIMD segment.
fn parse_np(segment: &[OsString]) -> anyhow::Result<(usize, &[OsString])> {
    let first = segment.first().and_then(|w| w.to_str()).unwrap_or("");
    let (value, rest): (&OsStr, &[OsString]) = if first == "-n" {
        match segment.get(1) {
            Some(value) => (value, &segment[2..]),
            None => bail!("`{first}` needs a number"),
        }
    } else if let Some(value) = first.strip_prefix("-n") {
        (OsStr::new(value), &segment[1..])
    } else {
        bail!("each program after `:` must start with `-n M`");
    };
    let text = value.to_string_lossy();
    let n = text
        .parse::<usize>()
        .with_context(|| format!("`{text}` is not a rank count"))?;
    Ok((n, rest))
}

/// `--launch`: one of the launcher's methods, or srun steps in a Slurm allocation.
#[derive(Debug, Clone)]
enum LaunchChoice {
    Method(LaunchMethod),
    Slurm,
}

fn parse_launch(text: &str) -> Result<LaunchChoice, String> {
    match text {
        "ssh" => Ok(LaunchChoice::Method(LaunchMethod::Ssh)),
        "local" => Ok(LaunchChoice::Method(LaunchMethod::Local)),
        "slurm" => Ok(LaunchChoice::Slurm),
        t if t.contains("{cmd}") => Ok(LaunchChoice::Method(LaunchMethod::Template(t.to_string()))),
        _ => Err("expected `ssh`, `slurm`, `local`, or a command template containing {cmd}".into()),
    }
}

/// The hosts of a job placed by Slurm: the allocation's nodes (or the hosts the user named, in
/// that order), each rank started by its own srun step. `None` when ranks are not placed by
/// Slurm: another `--launch`, or none given outside an allocation or with --meta.
fn slurm_hosts(args: &RunArgs, named: Option<Vec<Host>>) -> anyhow::Result<Option<Vec<Host>>> {
    let get = |k: &str| std::env::var(k).ok();
    let in_allocation = get("SLURM_JOB_ID").is_some_and(|j| !j.is_empty());
    match &args.launch {
        Some(LaunchChoice::Slurm) => {}
        None if in_allocation && args.meta.is_none() && named.is_none() => {}
        _ => return Ok(None),
    }
    let hosts = match named {
        None => metampi_launch::slurm::allocation_hosts(&get)
            .map_err(|e| anyhow::anyhow!("--launch slurm: {e}"))?,
        Some(hosts) => hosts
            .into_iter()
            .map(|h| {
                let launch = HostLaunch::srun(None, &h.name, &[], None)
                    .map_err(|e| anyhow::anyhow!("--launch slurm: {e}"))?;
                Ok(h.with_launch(launch))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    Ok(Some(hosts))
}

fn parse_stdin(text: &str) -> Result<StdinTarget, String> {
    match text {
        "all" => Ok(StdinTarget::All),
        "none" => Ok(StdinTarget::None),
        n => n
            .parse::<usize>()
            .map(StdinTarget::Rank)
            .map_err(|_| "expected a rank number, `all` or `none`".into()),
    }
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    // Written so that NaN is refused too.
    if secs.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return Err("the timeout must be longer than zero".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// Ranks given as `0,2,5-7`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RankList(Vec<usize>);

fn parse_ranks(text: &str) -> Result<RankList, String> {
    let mut ranks = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}` is not a rank number"))
        };
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi {
                    return Err(format!("empty rank range `{part}`"));
                }
                ranks.extend(lo..=hi);
            }
            None => ranks.push(number(part)?),
        }
    }
    Ok(RankList(ranks))
}

#[cfg(test)]
mod hydra_tests {
    use super::hydra_spellings;
    use std::ffi::OsString;

    fn rewrite(args: &[&str]) -> Result<Vec<String>, String> {
        let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        hydra_spellings(argv).map(|v| v.iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn mpiexec_spellings_become_metampi_options() {
        let got = rewrite(&[
            "metampi", "run", "-np", "4", "-hosts", "a,b", "-ppn", "2", "-genv", "K", "V",
            "-genvall", "./prog", "-np", "9", "-genv",
        ])
        .unwrap();
        assert_eq!(
            got,
            [
                "metampi",
                "run",
                "-n",
                "4",
                "--hosts",
                "a:2,b:2",
                "-x",
                "K=V",
                "--env-all",
                "./prog",
                "-np",
                "9",
                "-genv"
            ]
        );
        let got = rewrite(&[
            "metampi",
            "run",
            "-f",
            "hosts.txt",
            "--timeout",
            "-np",
            "./p",
        ])
        .unwrap();
        // `--timeout` takes a value: `-np` is that value, not an option, and `./p` the program.
        assert_eq!(
            got,
            [
                "metampi",
                "run",
                "--hostfile",
                "hosts.txt",
                "--timeout",
                "-np",
                "./p"
            ]
        );
        assert_eq!(
            rewrite(&["metampi", "check", "-np"]).unwrap(),
            ["metampi", "check", "-np"]
        );
    }

    #[test]
    fn unknown_options_are_named_and_common_spellings_understood() {
        let err = rewrite(&["metampi", "run", "--tag-ouptut", "-n", "2", "./p"]).unwrap_err();
        assert!(err.contains("unknown option `--tag-ouptut`"), "{err}");
        assert!(err.contains("did you mean `--tag-output`?"), "{err}");
        let err = rewrite(&["metampi", "run", "-n", "2", "--no-such", "./p"]).unwrap_err();
        assert!(err.contains("unknown option `--no-such`"), "{err}");
        assert_eq!(
            rewrite(&["metampi", "run", "-usize", "5", "-n", "1", "./p"]).unwrap(),
            ["metampi", "run", "--universe-size", "5", "-n", "1", "./p"]
        );
        assert_eq!(
            rewrite(&["metampi", "run", "-wdir", "/tmp", "-n", "2", "./p"]).unwrap(),
            ["metampi", "run", "--wdir", "/tmp", "-n", "2", "./p"]
        );
        assert_eq!(
            rewrite(&[
                "metampi",
                "run",
                "--host",
                "a,b",
                "--map-by",
                "ppr:2:node",
                "./p"
            ])
            .unwrap(),
            ["metampi", "run", "--hosts", "a:2,b:2", "./p"]
        );
        let err = rewrite(&["metampi", "run", "--map-by", "ppr:0:node", "./p"]).unwrap_err();
        assert!(err.contains("only ppr:N:node"), "{err}");
        // After the program, everything is the program's.
        assert_eq!(
            rewrite(&["metampi", "run", "-n", "1", "./p", "--wdir", "-n9"]).unwrap(),
            ["metampi", "run", "-n", "1", "./p", "--wdir", "-n9"]
        );
        assert_eq!(
            rewrite(&["metampi", "run", "-n4", "--timeout=5", "./p"]).unwrap(),
            ["metampi", "run", "-n", "4", "--timeout=5", "./p"]
        );
        assert_eq!(
            rewrite(&["metampi", "run", "--host", "a:2,b", "-n", "3", "./p"]).unwrap(),
            ["metampi", "run", "--hosts", "a:2,b", "-n", "3", "./p"]
        );
        assert_eq!(
            rewrite(&["metampi", "run", "--version"]).unwrap(),
            ["metampi", "--version"]
        );
    }

    #[test]
    fn mpiexec_spellings_with_mistakes_are_named() {
        assert!(rewrite(&["metampi", "run", "-ppn", "2", "./p"])
            .unwrap_err()
            .contains("-hosts"));
        assert!(
            rewrite(&["metampi", "run", "-hosts", "a", "-ppn", "x", "./p"])
                .unwrap_err()
                .contains("-ppn")
        );
        assert!(rewrite(&["metampi", "run", "-np"])
            .unwrap_err()
            .contains("-np needs a value"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Wrapper::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|w| w.run)
    }

    #[test]
    fn program_arguments_may_look_like_options() {
        let args = parse(&["-n", "2", "ls", "-l", "--all", "-n", "5"]).unwrap();
        assert_eq!(args.np, Some(2));
        assert_eq!(args.command, ["ls", "-l", "--all", "-n", "5"]);
    }

    #[test]
    fn options_before_the_program_are_parsed() {
        let args = parse(&[
            "--tag-output",
            "-x",
            "A=1",
            "-x",
            "B",
            "--stdin",
            "all",
            "--timeout",
            "1.5",
            "--debug",
            "0,2-3",
            "-n",
            "4",
            "prog",
        ])
        .unwrap();
        assert!(args.tag_output);
        assert_eq!(args.export, ["A=1", "B"]);
        assert_eq!(args.stdin, StdinTarget::All);
        assert_eq!(args.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(args.debug, Some(RankList(vec![0, 2, 3])));
    }

    #[test]
    fn bad_option_values_are_refused() {
        assert!(parse(&["-n", "x", "prog"]).is_err());
        assert!(parse(&["-n", "2"]).is_err());
        assert!(parse(&["--stdin", "some", "-n", "2", "prog"]).is_err());
        assert!(parse(&["--timeout", "0", "-n", "2", "prog"]).is_err());
        assert!(parse(&["--timeout", "-3", "-n", "2", "prog"]).is_err());
        assert!(parse(&["--debug", "3-1", "-n", "2", "prog"]).is_err());
        assert!(parse(&["--launch", "rsh", "-n", "2", "prog"]).is_err());
        assert!(parse(&["--hosts", "a", "--hostfile", "f", "-n", "2", "prog"]).is_err());
    }

    #[test]
    fn mimd_segments_split_on_a_lone_colon() {
        let command: Vec<OsString> = [
            "a", "x", ":", "-n", "3", "b", "-v", ":", "-n2", "c", ":", "-n", "1", "d",
        ]
        .map(OsString::from)
        .to_vec();
        let apps = split_apps(2, &command).unwrap();
        let shape: Vec<_> = apps
            .iter()
            .map(|a| (a.n, a.program.clone(), a.args.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (2, "a".into(), 1),
                (3, "b".into(), 1),
                (2, "c".into(), 0),
                (1, "d".into(), 0)
            ]
        );
    }

    fn meta(text: &str) -> (metampi_config::MetaConfig, metampi_config::Layout) {
        let cfg = metampi_config::parse_str("t.cfg", text).unwrap_or_else(|e| panic!("{e}"));
        let layout = cfg.layout();
        (cfg, layout)
    }

    #[test]
    fn routers_run_this_metampi_unless_a_meta_host_says_otherwise() {
        let exe = OsStr::new("/me/metampi");
        let (cfg, layout) = meta(
            "METAHOST a { LAUNCH = local; NODES = a0; ENV = A=\"1 2\"; }\n\
             METAHOST b { LAUNCH = local; NODES = b0; ROUTEREXEC = /x/r; }\n\
             METAHOST c { LAUNCH = local; NODES = c0; MPIROOT = /opt/m; }\n\
             PAIR a b 1\na0 <-> b0\nPAIR a c 1 /pair/r\na0 -> c0\nPAIR c a 1\nc0 -> a0\n\
             PAIR b c 1\nb0 <-> c0\n",
        );
        let host_env: Vec<_> = cfg.hosts.iter().map(|h| h.environment().unwrap()).collect();
        let opts = router_options(&cfg, &layout, &host_env, exe);
        let programs: Vec<(usize, String)> = layout
            .routers
            .iter()
            .zip(&opts.router_commands)
            .map(|(r, c)| {
                assert_eq!(c.args, ["router"]);
                (r.host, c.program.to_string_lossy().into_owned())
            })
            .collect();
        assert_eq!(programs.len(), layout.routers.len());
        for (host, program) in &programs {
            let want = match host {
                0 => ["/me/metampi", "/pair/r"].contains(&program.as_str()),
                1 => program == "/x/r",
                _ => program == "/opt/m/bin/metampi",
            };
            assert!(want, "meta host {host}: {program}");
        }
        // The PAIR header's executable is for that PAIR's router only.
        assert_eq!(programs.iter().filter(|(_, p)| p == "/pair/r").count(), 1);
        assert_eq!(
            opts.host_env,
            [vec![("A".into(), "1 2".into())], Vec::new(), Vec::new()]
        );
    }

    #[test]
    fn mimd_mistakes_are_explained() {
        let err = |words: &[&str]| {
            let command: Vec<OsString> = words.iter().map(OsString::from).collect();
            format!("{:#}", split_apps(1, &command).unwrap_err())
        };
        assert!(err(&["a", ":", "b"]).contains("must start with `-n M`"));
        assert!(err(&["a", ":", "-n"]).contains("needs a number"));
        assert!(err(&["a", ":", "-n", "x", "b"]).contains("not a rank count"));
        assert!(err(&["a", ":", "-n", "2"]).contains("has no PROGRAM"));
        assert!(err(&[":", "-n", "2", "b"]).contains("program 1 has no PROGRAM"));
        assert!(err(&["a", ":"]).contains("program 2"));
    }
}

/// Rewrites the `mpiexec` (Hydra) spellings users type after `metampi run` into metampi's
/// options, with Hydra's meaning: `-np N`, `-hosts A,B`, `-ppn N` (N slots on each of
/// `-hosts`), `-f`/`-hostfile`/`-machinefile FILE`, `-genv`/`-env VAR VALUE`,
/// `-genvall`/`-envall`, and mpirun's `--host`, `-n4` and `--version`; an option before the
/// program that is none of these nor metampi's is an error naming it. Only options before
/// the program are touched; the program's own arguments pass unchanged. Other commands' arguments are returned as they are.
pub fn hydra_spellings(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if argv.get(1).and_then(|a| a.to_str()) != Some("run") {
        return Ok(argv);
    }
    // metampi run's own options that take a value, from its definition.
    let cmd = <RunArgs as clap::Args>::augment_args(clap::Command::new("run"));
    let mut valued: Vec<String> = Vec::new();
    let mut known: Vec<String> = vec!["-h".into(), "--help".into()];
    for a in cmd.get_arguments().filter(|a| !a.is_positional()) {
        let names: Vec<String> = a
            .get_short()
            .map(|c| format!("-{c}"))
            .into_iter()
            .chain(a.get_long().map(|l| format!("--{l}")))
            .collect();
        if a.get_action().takes_values() {
            valued.extend(names.iter().cloned());
        }
        known.extend(names);
    }
    let unknown = |a: &str| {
        let longs: Vec<&str> = known.iter().map(String::as_str).collect();
        let hint = match metampi_config::closest(a, &longs) {
            Some(c) => format!("; did you mean `{c}`?"),
            None => String::new(),
        };
        format!(
            "unknown option `{a}`{hint} (options come before the program; see `metampi run \
             --help`)"
        )
    };
    let mut out: Vec<OsString> = argv[..2].to_vec();
    let mut rest = argv[2..].iter();
    let mut ppn: Option<String> = None;
    let mut hosts_at: Option<usize> = None;
    let value = |opt: &str, v: Option<&OsString>| -> Result<OsString, String> {
        v.cloned().ok_or_else(|| format!("{opt} needs a value"))
    };
    while let Some(arg) = rest.next() {
        let Some(a) = arg.to_str() else {
            out.push(arg.clone());
            break;
        };
        match a {
            "-np" => {
                out.push("-n".into());
                out.push(value(a, rest.next())?);
            }
            // As mpiexec and mpirun answer it.
            "--version" | "-version" | "-V" => {
                return Ok(vec![argv[0].clone(), "--version".into()])
            }
            // Open MPI's spelling (and Hydra's short one), with the same `a:2,b` syntax.
            "--host" | "-host" => {
                out.push("--hosts".into());
                hosts_at = Some(out.len());
                out.push(value(a, rest.next())?);
            }
            "-ppn" => ppn = Some(value(a, rest.next())?.to_string_lossy().into_owned()),
            "-hosts" | "--hosts" => {
                out.push("--hosts".into());
                hosts_at = Some(out.len());
                out.push(value(a, rest.next())?);
            }
            "-f" | "-hostfile" | "-machinefile" => {
                out.push("--hostfile".into());
                out.push(value(a, rest.next())?);
            }
            "-genv" | "-env" => {
                let k = value(a, rest.next())?;
                let v = value(a, rest.next())?;
                let mut kv = k;
                kv.push("=");
                kv.push(v);
                out.push("-x".into());
                out.push(kv);
            }
            "-genvall" | "-envall" => out.push("--env-all".into()),
            // Hydra's spelling of the universe size.
            "-usize" => {
                out.push("--universe-size".into());
                out.push(value(a, rest.next())?);
            }
            // Hydra's and Open MPI's spellings of the ranks' directory.
            "-wdir" | "-wd" | "--wd" => {
                out.push("--wdir".into());
                out.push(value(a, rest.next())?);
            }
            // Open MPI's ranks per node; other mappings are refused with what to use instead.
            "--map-by" | "-map-by" => {
                let v = value(a, rest.next())?.to_string_lossy().into_owned();
                let n = v
                    .strip_prefix("ppr:")
                    .and_then(|r| r.strip_suffix(":node"))
                    .filter(|n| n.parse::<usize>().is_ok_and(|n| n > 0));
                match n {
                    Some(n) => ppn = Some(n.to_string()),
                    None => {
                        return Err(format!(
                            "{a} {v}: only ppr:N:node is understood (N ranks on each of \
                             --hosts); ranks fill hosts in order otherwise, and --bind-to \
                             core|hwthread places them on CPUs"
                        ))
                    }
                }
            }
            "--" => {
                out.push(arg.clone());
                break;
            }
            _ if valued.iter().any(|v| v == a) => {
                out.push(arg.clone());
                if let Some(v) = rest.next() {
                    out.push(v.clone());
                }
            }
            // `--opt=value` of an option of ours.
            _ if a.starts_with("--")
                && a.split_once('=')
                    .is_some_and(|(o, _)| known.iter().any(|k| k == o)) =>
            {
                out.push(arg.clone())
            }
            _ if known.iter().any(|k| k == a) => out.push(arg.clone()),
            // A value stuck to a short option: `-n4`, `-xVAR=1`.
            _ if a.len() > 2 && !a.starts_with("--") && valued.iter().any(|v| v == &a[..2]) => {
                out.push(a[..2].into());
                out.push(a[2..].into());
            }
            _ if a.starts_with('-') && a.len() > 1 => return Err(unknown(a)),
            _ => {
                out.push(arg.clone());
                break;
            }
        }
    }
    out.extend(rest.cloned());
    if let Some(n) = ppn {
        if n.parse::<usize>().map_or(true, |n| n == 0) {
            return Err(format!(
                "-ppn takes a positive number of processes per host, not `{n}`"
            ));
        }
        let Some(at) = hosts_at else {
            return Err(
                "-ppn (or --map-by ppr:N:node) needs -hosts (the hosts that get that many ranks \
                 each)"
                    .into(),
            );
        };
        let list = out[at].to_string_lossy().into_owned();
        let with: Vec<String> = list
            .split(',')
            .map(|h| format!("{}:{n}", h.split(':').next().unwrap_or(h)))
            .collect();
        out[at] = with.join(",").into();
    }
    Ok(out)
}
