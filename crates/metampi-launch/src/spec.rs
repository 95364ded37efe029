//! What to run: the job description, its builder, and its validation into a launch plan.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bind::Binding;
use crate::command;
use crate::error::LaunchError;
use crate::host::{self, Host, HostSpecError, HostSpecErrorKind, Placement};
use crate::remote::HostLaunch;
use crate::sys;

/// One MIMD application: `n` ranks running `program args...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSpec {
    /// Number of ranks; at least 1.
    pub n: usize,
    /// Program to run, looked up in `PATH` if it has no `/`.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl AppSpec {
    /// `n` ranks of `program` with no arguments.
    pub fn new(n: usize, program: impl Into<OsString>) -> Self {
        AppSpec {
            n,
            program: program.into(),
            args: Vec::new(),
        }
    }

    /// Appends one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// Where rank output goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputMode {
    /// Forwarded line by line to the launcher's stdout and stderr.
    #[default]
    Terminal,
    /// `DIR/rank.R.stdout` and `DIR/rank.R.stderr`; nothing on the terminal.
    Directory(PathBuf),
    /// Collected in memory, exactly as it would have appeared on the terminal, and returned in
    /// [`JobOutcome::stdout`](crate::JobOutcome::stdout) / `stderr`. Meant for tests.
    Capture,
}

/// Which ranks read the launcher's stdin; the others get `/dev/null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StdinTarget {
    /// One rank (`Rank(0)` is the default, as in mpiexec).
    Rank(usize),
    /// Every rank gets a copy.
    All,
    /// Nobody: every rank gets `/dev/null`.
    None,
}

impl Default for StdinTarget {
    fn default() -> Self {
        StdinTarget::Rank(0)
    }
}

/// How ranks placed on other machines are started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaunchMethod {
    /// `ssh -o BatchMode=yes HOST 'cd CWD && env VARS... program args...'`.
    #[default]
    Ssh,
    /// Everything starts on this machine, but each rank's `METAMPI_NODE` is the host it was
    /// placed on: emulates several machines on one box.
    Local,
    /// A user command with `{host}` and `{cmd}` placeholders, split into words like a shell
    /// would (quotes honoured, nothing expanded). `{cmd}` becomes one word holding the shell
    /// command line `env VARS... program args...`, so the template's program must hand it to
    /// a shell: `ssh -p 2222 {host} {cmd}`, `sh -c {cmd}`. A template of just `{cmd}` runs it
    /// with `sh -c`.
    Template(String),
}

/// Everything about one job. Build with the chainable setters, then [`run`](crate::run) it.
///
/// ```
/// use metampi_launch::{AppSpec, JobSpec, OutputMode, StdinTarget};
/// let spec = JobSpec::new()
///     .app(AppSpec::new(2, "/bin/sh").args(["-c", "echo rank $METAMPI_RANK"]))
///     .stdin(StdinTarget::None)
///     .output(OutputMode::Capture);
/// assert_eq!(spec.world_size(), 2);
/// spec.validate().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub(crate) apps: Vec<AppSpec>,
    pub(crate) hosts: Vec<Host>,
    pub(crate) env: Vec<EnvSetting>,
    pub(crate) env_all: bool,
    pub(crate) output: OutputMode,
    pub(crate) tag_output: bool,
    pub(crate) stdin: StdinTarget,
    pub(crate) stdin_data: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) stall_timeout: Option<Duration>,
    pub(crate) debug_ranks: Vec<usize>,
    pub(crate) launch: LaunchMethod,
    pub(crate) pmi_host: Option<String>,
    pub(crate) forward_signals: bool,
    pub(crate) join_timeout: Duration,
    pub(crate) bind: Binding,
    pub(crate) report_bindings: bool,
    pub(crate) wdir: Option<std::path::PathBuf>,
    pub(crate) watched: Vec<(u32, String)>,
    pub(crate) report_also: Option<ReportAddition>,
    pub(crate) live: Option<crate::live::LiveView>,
}

/// Text a hang report adds under the ranks' table ([`JobSpec::report_also`]).
#[derive(Clone)]
pub struct ReportAddition(pub(crate) std::sync::Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for ReportAddition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportAddition(..)")
    }
}

/// How long ranks started by hand have to connect to the launcher by default: time to open a
/// shell on each machine and paste a command.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EnvSetting {
    /// `-x VAR=value`
    Value(OsString, OsString),
    /// `-x VAR`: the launcher's own value.
    Export(OsString),
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            apps: Vec::new(),
            hosts: Vec::new(),
            env: Vec::new(),
            env_all: false,
            output: OutputMode::default(),
            tag_output: false,
            stdin: StdinTarget::default(),
            stdin_data: None,
            timeout: None,
            stall_timeout: None,
            debug_ranks: Vec::new(),
            launch: LaunchMethod::default(),
            pmi_host: None,
            forward_signals: true,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            bind: Binding::None,
            report_bindings: false,
            wdir: None,
            watched: Vec::new(),
            report_also: None,
            live: None,
        }
    }
}

/// Variables every rank gets from the launcher; users may not set them.
pub const RESERVED_ENV: [&str; 8] = {
    use crate::contract::{APPNUM, JOB, LOCAL_RANK, LOCAL_SIZE, NODE, PMI, RANK, SIZE};
    [PMI, JOB, RANK, SIZE, APPNUM, NODE, LOCAL_RANK, LOCAL_SIZE]
};

impl JobSpec {
    /// Replaces every application given so far.
    #[must_use]
    pub fn replace_apps(mut self, apps: impl IntoIterator<Item = AppSpec>) -> Self {
        self.apps = apps.into_iter().collect();
        self
    }

    /// An empty job: add at least one [`AppSpec`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a MIMD application; ranks are numbered app after app.
    #[must_use]
    pub fn app(mut self, app: AppSpec) -> Self {
        self.apps.push(app);
        self
    }

    /// Hosts to place ranks on, in order (see [`place`](crate::place)). None (the default)
    /// means every rank on this machine.
    #[must_use]
    pub fn hosts(mut self, hosts: impl IntoIterator<Item = Host>) -> Self {
        self.hosts = hosts.into_iter().collect();
        self
    }

    /// Sets `name=value` in every rank's environment (`-x VAR=value`).
    #[must_use]
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push(EnvSetting::Value(name.into(), value.into()));
        self
    }

    /// Passes the launcher's value of `name` to every rank (`-x VAR`). Ranks on this machine
    /// inherit the launcher's environment anyway; this matters for remote ranks, and makes
    /// validation fail if the variable is unset.
    #[must_use]
    pub fn export(mut self, name: impl Into<OsString>) -> Self {
        self.env.push(EnvSetting::Export(name.into()));
        self
    }

    /// Passes the launcher's whole environment to remote ranks too (local ranks always inherit
    /// it).
    #[must_use]
    pub fn env_all(mut self, yes: bool) -> Self {
        self.env_all = yes;
        self
    }

    /// Where rank output goes.
    #[must_use]
    pub fn output(mut self, mode: OutputMode) -> Self {
        self.output = mode;
        self
    }

    /// Prefix each forwarded line with `[R] ` (ignored for [`OutputMode::Directory`]).
    #[must_use]
    pub fn tag_output(mut self, yes: bool) -> Self {
        self.tag_output = yes;
        self
    }

    /// Which ranks read stdin.
    #[must_use]
    pub fn stdin(mut self, target: StdinTarget) -> Self {
        self.stdin = target;
        self
    }

    /// Feed these bytes to the stdin target instead of the launcher's own stdin (then EOF).
    #[must_use]
    pub fn stdin_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin_data = Some(data.into());
        self
    }

    /// Kill the job if it is still running after `timeout`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// End the job when nothing in it has moved for `limit`: every rank that still runs has
    /// been in one MPI wait for that long, or does not answer (a stopped process). The reason printed is the hang report: where each rank waits (the
    /// call, communicator, peer, tag, bytes) and since when. The ranks are asked every quarter
    /// of `limit` (at least every 250 ms); a job of ranks that compute is never ended by it.
    /// Without it, `SIGUSR1` to the launcher still prints the report and the job goes on.
    #[must_use]
    pub fn stall_timeout(mut self, limit: Duration) -> Self {
        self.stall_timeout = Some(limit);
        self
    }

    /// Text added under the ranks' table whenever a hang report is made (`SIGUSR1`, a
    /// stall): `metampi run --meta` adds its routers' queues and links. Called on the
    /// launcher's thread while the report is printed; it should be quick.
    #[must_use]
    pub fn report_also(mut self, text: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.report_also = Some(ReportAddition(std::sync::Arc::new(text)));
        self
    }

    /// Keep `view` up to date while the job runs: each rank's state, and, while a viewer
    /// wants it ([`LiveView::want`](crate::LiveView::want)), where it waits, asked about once
    /// a second (`metampi run --web`).
    #[must_use]
    pub fn live(mut self, view: crate::live::LiveView) -> Self {
        self.live = Some(view);
        self
    }

    /// Start these ranks under `gdbserver` and say how to attach.
    #[must_use]
    pub fn debug_ranks(mut self, ranks: impl IntoIterator<Item = usize>) -> Self {
        self.debug_ranks = ranks.into_iter().collect();
        self
    }

    /// How ranks on other machines are started.
    #[must_use]
    pub fn launch(mut self, method: LaunchMethod) -> Self {
        self.launch = method;
        self
    }

    /// The name remote ranks use to reach the key-value server (default: this machine's host
    /// name). Local ranks always use `127.0.0.1`. A loopback address here keeps the server
    /// bound to loopback even with remote ranks, which is how templates like `sh -c {cmd}` are
    /// tested on one machine.
    #[must_use]
    pub fn pmi_host(mut self, host: impl Into<String>) -> Self {
        self.pmi_host = Some(host.into());
        self
    }

    /// Catch SIGINT, SIGTERM and SIGHUP while the job runs and forward them to the ranks
    /// (default on). The previous handlers come back when the job ends.
    #[must_use]
    pub fn forward_signals(mut self, yes: bool) -> Self {
        self.forward_signals = yes;
        self
    }

    /// Watch a process the caller started for the job (a meta job's router, by the pid of
    /// its child, which the caller keeps and reaps): when it ends while the ranks run, the job
    /// is stopped and `what` ("router 1 of meta host `b` on node b0") named with its exit
    /// code or signal.
    #[must_use]
    pub fn watch(mut self, pid: u32, what: impl Into<String>) -> Self {
        self.watched.push((pid, what.into()));
        self
    }

    /// How long ranks started by hand ([`HostLaunch::Manual`]) have to connect to the launcher
    /// before the job is given up, naming them (default [`DEFAULT_JOIN_TIMEOUT`]).
    #[must_use]
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// Binds the ranks started on this machine to CPUs (default
    /// [`Binding::None`]); ranks started elsewhere are left alone.
    #[must_use]
    pub fn bind(mut self, binding: Binding) -> Self {
        self.bind = binding;
        self
    }

    /// Says on stderr, as each rank starts, which CPUs it is bound to (or that it is not).
    #[must_use]
    pub fn report_bindings(mut self, on: bool) -> Self {
        self.report_bindings = on;
        self
    }

    /// The directory every rank starts in, here and on other hosts (default: the launcher's
    /// own); a relative one is taken from the launcher's directory.
    #[must_use]
    pub fn wdir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.wdir = Some(dir.into());
        self
    }

    /// Total number of ranks.
    pub fn world_size(&self) -> usize {
        self.apps.iter().map(|a| a.n).sum()
    }

    /// Checks everything that can be checked before starting anything.
    ///
    /// Creates the output directory if one is asked for, since "can it be created" has no
    /// better test.
    ///
    /// # Errors
    /// The first problem found, as a [`LaunchError`] with a message fit for a user.
    pub fn validate(&self) -> Result<(), LaunchError> {
        self.plan().map(|_| ())
    }

    /// Validates and works out where every rank goes and how it starts.
    pub(crate) fn plan(&self) -> Result<Plan, LaunchError> {
        if self.apps.is_empty() {
            return Err(LaunchError::NoApps);
        }
        for (index, app) in self.apps.iter().enumerate() {
            if app.n == 0 {
                return Err(LaunchError::ZeroRanks {
                    app: index,
                    program: app.program.to_string_lossy().into_owned(),
                });
            }
        }
        let size = self
            .apps
            .iter()
            .try_fold(0usize, |acc, a| acc.checked_add(a.n))
            .ok_or(LaunchError::ZeroRanks {
                app: 0,
                program: "(rank count overflows)".into(),
            })?;
        // No slots: only for a machine where helpers are started by hand and no rank runs.
        if let Some(host) = self
            .hosts
            .iter()
            .find(|h| h.slots == 0 && !has_manual_helpers(h))
        {
            return Err(host_error(host));
        }
        if self.timeout == Some(Duration::ZERO) || self.stall_timeout == Some(Duration::ZERO) {
            return Err(LaunchError::ZeroTimeout);
        }
        let parse = |t: &String| {
            command::parse_template(t).map_err(|reason| LaunchError::BadTemplate {
                template: t.clone(),
                reason,
            })
        };
        let template = match &self.launch {
            LaunchMethod::Template(t) => Some(parse(t)?),
            _ => None,
        };
        // How each host's ranks start when the host says so itself.
        let mut host_starts = Vec::with_capacity(self.hosts.len());
        for h in &self.hosts {
            host_starts.push(match &h.launch {
                None => None,
                Some(HostLaunch::Local) => Some(Start::Local),
                Some(HostLaunch::Ssh(args)) => Some(Start::Ssh(args.clone())),
                Some(HostLaunch::Template { template, vars }) => Some(Start::Template {
                    words: parse(template)?,
                    vars: vars.clone(),
                }),
                Some(HostLaunch::Srun { ssh, srun }) => Some(Start::Srun {
                    ssh: ssh.clone(),
                    srun: srun.clone(),
                }),
                Some(HostLaunch::Manual { .. }) => Some(Start::Manual),
            });
        }
        let env = self.resolve_env()?;
        for h in &self.hosts {
            for (name, _) in &h.env {
                check_env_name(name)?;
                // The secret is the job's: remote command lines leave exactly that one out.
                if RESERVED_ENV.iter().any(|r| name == *r) || name == command::SECRET_ENV {
                    return Err(LaunchError::ReservedEnvName {
                        name: name.to_string_lossy().into_owned(),
                    });
                }
            }
        }

        let local_node = sys::hostname();
        let placements = host::place(
            &self.apps.iter().map(|a| a.n).collect::<Vec<_>>(),
            &self.hosts,
            &local_node,
        );
        let short_local = local_node.split('.').next().unwrap_or(&local_node);
        let is_local_host =
            |name: &str| host::is_loopback_name(name) || name == local_node || name == short_local;
        let ranks: Vec<RankPlan> = placements
            .into_iter()
            .map(|placement| {
                let own = placement.host.and_then(|h| host_starts[h].clone());
                let start = own.unwrap_or_else(|| match (placement.host, &self.launch) {
                    (None, _) | (_, LaunchMethod::Local) => Start::Local,
                    (Some(h), _) if is_local_host(&self.hosts[h].name) => Start::Local,
                    (Some(h), LaunchMethod::Template(_)) => Start::Template {
                        words: template.clone().unwrap_or_default(),
                        vars: vec![("{host}".into(), self.hosts[h].name.clone())],
                    },
                    (Some(h), _) => Start::Ssh(vec![self.hosts[h].name.clone()]),
                });
                RankPlan { placement, start }
            })
            .collect();

        for (index, app) in self.apps.iter().enumerate() {
            if ranks
                .iter()
                .any(|r| r.placement.app == index && r.start == Start::Local)
            {
                check_program(&app.program)?;
            }
        }
        let mut debug_ranks = self.debug_ranks.clone();
        debug_ranks.sort_unstable();
        debug_ranks.dedup();
        for &rank in &debug_ranks {
            let Some(plan) = ranks.get(rank) else {
                return Err(LaunchError::DebugRankOutOfRange { rank, size });
            };
            if plan.start != Start::Local {
                return Err(LaunchError::DebugRemoteRank {
                    rank,
                    host: plan.placement.node.clone(),
                });
            }
        }
        if !debug_ranks.is_empty() && find_in_path(OsStr::new("gdbserver")).is_none() {
            return Err(LaunchError::GdbserverMissing);
        }
        if let StdinTarget::Rank(rank) = self.stdin {
            if rank >= size {
                return Err(LaunchError::StdinRankOutOfRange { rank, size });
            }
        }
        if let OutputMode::Directory(dir) = &self.output {
            check_output_dir(dir)?;
        }
        // Helpers started by hand run on other machines, which must reach the server.
        let all_local = ranks.iter().all(|r| r.start == Start::Local)
            && !self.hosts.iter().any(has_manual_helpers);
        Ok(Plan {
            size,
            ranks,
            env,
            debug_ranks,
            all_local,
            pmi_host: self.pmi_host.clone().unwrap_or(local_node),
        })
    }

    fn resolve_env(&self) -> Result<Vec<(OsString, OsString)>, LaunchError> {
        let mut resolved: Vec<(OsString, OsString)> = Vec::new();
        for setting in &self.env {
            let (name, value) = match setting {
                EnvSetting::Value(name, value) => (name.clone(), value.clone()),
                EnvSetting::Export(name) => {
                    check_env_name(name)?;
                    let value = std::env::var_os(name).ok_or_else(|| LaunchError::EnvNotSet {
                        name: name.to_string_lossy().into_owned(),
                    })?;
                    (name.clone(), value)
                }
            };
            check_env_name(&name)?;
            if RESERVED_ENV.iter().any(|r| name == *r) {
                return Err(LaunchError::ReservedEnvName {
                    name: name.to_string_lossy().into_owned(),
                });
            }
            // A later setting of the same variable wins, as it would in a shell.
            resolved.retain(|(n, _)| *n != name);
            resolved.push((name, value));
        }
        if self.env_all {
            let skip = ["_", "PWD", "OLDPWD", "SHLVL", "HOSTNAME"];
            for (name, value) in std::env::vars_os() {
                let usable = check_env_name(&name).is_ok()
                    && !skip.iter().any(|s| name == *s)
                    && !RESERVED_ENV.iter().any(|r| name == *r)
                    && !resolved.iter().any(|(n, _)| *n == name);
                if usable {
                    resolved.push((name, value));
                }
            }
        }
        Ok(resolved)
    }
}

/// The validated job: where each rank goes and how it starts.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) size: usize,
    pub(crate) ranks: Vec<RankPlan>,
    /// `-x` and `--env-all` variables, resolved.
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) debug_ranks: Vec<usize>,
    /// Nothing of the job runs on another machine: no rank, no helper started by hand.
    pub(crate) all_local: bool,
    pub(crate) pmi_host: String,
}

#[derive(Debug)]
pub(crate) struct RankPlan {
    pub(crate) placement: Placement,
    pub(crate) start: Start,
}

/// How one rank starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    Local,
    /// ssh with these options and destination before the remote command.
    Ssh(Vec<String>),
    /// A template split into words, and its placeholders besides `{cmd}` with their values.
    Template {
        words: Vec<String>,
        vars: Vec<(String, String)>,
    },
    /// A one-task srun step (see [`HostLaunch::Srun`]).
    Srun {
        ssh: Option<Vec<String>>,
        srun: Vec<String>,
    },
    /// Printed for the user to start (the host's [`HostLaunch::Manual`]).
    Manual,
}

/// Whether the user starts helpers by hand on `host`.
fn has_manual_helpers(host: &Host) -> bool {
    matches!(&host.launch, Some(HostLaunch::Manual { helpers, .. }) if !helpers.is_empty())
}

fn host_error(host: &Host) -> LaunchError {
    LaunchError::HostSpec(HostSpecError::new(
        None,
        &host.to_string(),
        HostSpecErrorKind::ZeroSlots,
    ))
}

fn check_env_name(name: &OsStr) -> Result<(), LaunchError> {
    let bytes = name.as_encoded_bytes();
    let ok = !bytes.is_empty()
        && !bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(LaunchError::BadEnvName {
            name: name.to_string_lossy().into_owned(),
        })
    }
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The first executable `program` in `PATH`, as execvp would find it.
pub(crate) fn find_in_path(program: &OsStr) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| {
            // An empty PATH entry means the current directory.
            if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(program)
            } else {
                dir.join(program)
            }
        })
        .find(|candidate| is_executable_file(candidate))
}

fn check_program(program: &OsStr) -> Result<(), LaunchError> {
    let name = || program.to_string_lossy().into_owned();
    if program.is_empty() {
        return Err(LaunchError::ProgramNotFound { program: name() });
    }
    if program.as_encoded_bytes().contains(&b'/') {
        let path = Path::new(program);
        if !path.exists() {
            return Err(LaunchError::ProgramNotFound { program: name() });
        }
        if !is_executable_file(path) {
            return Err(LaunchError::NotExecutable { program: name() });
        }
        return Ok(());
    }
    match find_in_path(program) {
        Some(_) => Ok(()),
        None => Err(LaunchError::ProgramNotFound { program: name() }),
    }
}

fn check_output_dir(dir: &Path) -> Result<(), LaunchError> {
    let err = |source| LaunchError::OutputDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    // create_dir_all succeeds on an existing read-only directory; only a write tells.
    let probe = dir.join(format!(".metampi-probe-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(err)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::ManualProcess;

    fn sh(n: usize) -> AppSpec {
        AppSpec::new(n, "/bin/sh").args(["-c", "true"])
    }

    #[test]
    fn validation_catches_user_mistakes() {
        let err = |spec: JobSpec| spec.validate().unwrap_err().to_string();
        assert!(err(JobSpec::new()).contains("no application"));
        assert!(err(JobSpec::new().app(sh(0))).contains("0 ranks"));
        assert!(
            err(JobSpec::new().app(AppSpec::new(1, "no-such-program-xyz")))
                .contains("not found in PATH")
        );
        assert!(err(JobSpec::new().app(AppSpec::new(1, "/no/such/prog"))).contains("not found"));
        assert!(err(JobSpec::new().app(AppSpec::new(1, "/"))).contains("not an executable"));
        let plain = std::env::temp_dir().join(format!("metampi-noexec-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let message = err(JobSpec::new().app(AppSpec::new(1, &plain)));
        std::fs::remove_file(&plain).unwrap();
        assert!(message.contains("not an executable"), "{message}");
        assert!(err(JobSpec::new().app(sh(2)).debug_ranks([2]))
            .contains("debug rank 2 is out of range"));
        assert!(err(JobSpec::new().app(sh(2)).stdin(StdinTarget::Rank(5))).contains("stdin rank 5"));
        assert!(err(JobSpec::new().app(sh(1)).timeout(Duration::ZERO)).contains("timeout"));
        assert!(err(JobSpec::new().app(sh(1)).hosts([Host::new("a", 0)])).contains("at least 1"));
        assert!(err(JobSpec::new().app(sh(1)).env("1BAD", "x")).contains("invalid environment"));
        assert!(err(JobSpec::new().app(sh(1)).env("METAMPI_RANK", "x"))
            .contains("cannot be overridden"));
        assert!(err(JobSpec::new()
            .app(sh(1))
            .export("METAMPI_TEST_SURELY_UNSET_VAR"))
        .contains("not set"));
        assert!(err(JobSpec::new()
            .app(sh(1))
            .launch(LaunchMethod::Template("ssh {host}".into())))
        .contains("{cmd}"));
        assert!(err(JobSpec::new()
            .app(sh(1))
            .output(OutputMode::Directory("/proc/no/such".into())))
        .contains("output directory"));
    }

    #[test]
    fn gdbserver_is_required_for_debug() {
        let result = JobSpec::new().app(sh(2)).debug_ranks([1]).validate();
        match find_in_path(OsStr::new("gdbserver")) {
            Some(_) => assert!(result.is_ok()),
            None => assert!(matches!(result, Err(LaunchError::GdbserverMissing))),
        }
    }

    #[test]
    fn remote_ranks_are_not_checked_locally_and_cannot_be_debugged() {
        let spec = JobSpec::new()
            .app(AppSpec::new(2, "/only/on/the/remote/prog"))
            .hosts([Host::new("remote-node-a", 2)]);
        let plan = spec.plan().unwrap();
        assert!(!plan.all_local);
        assert_eq!(
            plan.ranks[1].start,
            Start::Ssh(vec!["remote-node-a".into()])
        );
        let err = spec.clone().debug_ranks([0]).validate().unwrap_err();
        assert!(
            matches!(err, LaunchError::DebugRemoteRank { rank: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn local_launch_tags_nodes_but_starts_here() {
        let plan = JobSpec::new()
            .app(sh(3))
            .hosts(Host::parse_list("a,b:2").unwrap())
            .launch(LaunchMethod::Local)
            .plan()
            .unwrap();
        assert!(plan.all_local);
        let nodes: Vec<_> = plan
            .ranks
            .iter()
            .map(|r| r.placement.node.as_str())
            .collect();
        assert_eq!(nodes, ["a", "b", "b"]);
    }

    #[test]
    fn localhost_entries_start_without_ssh() {
        let plan = JobSpec::new()
            .app(sh(2))
            .hosts(Host::parse_list("localhost:2").unwrap())
            .plan()
            .unwrap();
        assert!(plan.all_local);
        assert_eq!(plan.ranks[0].placement.node, sys::hostname());
    }

    #[test]
    fn env_settings_resolve_last_wins() {
        let plan = JobSpec::new()
            .app(sh(1))
            .env("A", "1")
            .env("B", "2")
            .env("A", "3")
            .export("PATH")
            .plan()
            .unwrap();
        assert_eq!(plan.env[0], ("B".into(), "2".into()));
        assert_eq!(plan.env[1], ("A".into(), "3".into()));
        assert_eq!(plan.env[2].0, "PATH");
    }

    #[test]
    fn a_host_without_slots_runs_only_helpers_started_by_hand() {
        let router = ManualProcess {
            name: "router 1".into(),
            env: Vec::new(),
            program: "metampi".into(),
            args: vec!["router".into()],
        };
        let manual = |helpers: Vec<ManualProcess>| HostLaunch::Manual {
            helpers,
            secret_file: None,
        };
        let hosts = [
            Host::new("a.a0", 1).with_launch(HostLaunch::Local),
            Host::new("c.c1", 0).with_launch(manual(vec![router])),
            Host::new("a.a1", 1).with_launch(HostLaunch::Local),
        ];
        // Even with more ranks than slots, none is placed there.
        let plan = JobSpec::new()
            .app(sh(3))
            .hosts(hosts)
            .launch(LaunchMethod::Local)
            .plan()
            .unwrap();
        let nodes: Vec<_> = plan
            .ranks
            .iter()
            .map(|r| r.placement.node.as_str())
            .collect();
        assert_eq!(nodes, ["a.a0", "a.a1", "a.a0"]);
        // Its helpers run elsewhere, so the job is not all here.
        assert!(!plan.all_local);
        // Without helpers to start there, a host without slots is refused as before.
        for launch in [HostLaunch::Local, manual(Vec::new())] {
            let message = JobSpec::new()
                .app(sh(1))
                .hosts([Host::new("x", 0).with_launch(launch)])
                .validate()
                .unwrap_err()
                .to_string();
            assert!(message.contains("at least 1"), "{message}");
        }
    }

    #[test]
    fn hosts_may_override_the_launch_method() {
        let hosts = [
            Host::new("here", 1).with_launch(HostLaunch::Local),
            Host::new("beta.b0", 1).with_launch(HostLaunch::ssh("login", Some("b0")).unwrap()),
            Host::new("gamma.g0", 1).with_launch(HostLaunch::Template {
                template: "srun -w {node} {cmd}".into(),
                vars: vec![("{node}".into(), "g0".into())],
            }),
            Host::new("delta.d0", 1).with_launch(HostLaunch::Manual {
                helpers: Vec::new(),
                secret_file: None,
            }),
        ];
        let plan = JobSpec::new()
            .app(sh(4))
            .hosts(hosts.clone())
            .launch(LaunchMethod::Local)
            .plan()
            .unwrap();
        let starts: Vec<_> = plan.ranks.iter().map(|r| r.start.clone()).collect();
        assert_eq!(
            starts,
            [
                Start::Local,
                Start::Ssh(vec!["-J".into(), "login".into(), "b0".into()]),
                Start::Template {
                    words: vec!["srun".into(), "-w".into(), "{node}".into(), "{cmd}".into()],
                    vars: vec![("{node}".into(), "g0".into())],
                },
                Start::Manual,
            ]
        );
        assert!(!plan.all_local);
        // Ranks started by hand cannot run under gdbserver here either.
        let err = JobSpec::new()
            .app(sh(4))
            .hosts(hosts)
            .debug_ranks([3])
            .validate()
            .unwrap_err();
        assert!(
            matches!(err, LaunchError::DebugRemoteRank { rank: 3, .. }),
            "{err}"
        );
        let bad = Host::new("x", 1).with_launch(HostLaunch::Template {
            template: "srun '{cmd}".into(),
            vars: Vec::new(),
        });
        let err = JobSpec::new()
            .app(sh(1))
            .hosts([bad])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("unterminated"), "{err}");
    }
}
