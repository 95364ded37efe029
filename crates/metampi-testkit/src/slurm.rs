//! A private one-node Slurm cluster of this machine for tests: `slurmctld` and `slurmd` of
//! Debian's `slurm-wlm` (with `munge`), started by the test on private ports and directories,
//! the node declaring 8 CPUs whatever the machine has, and stopped when the handle is dropped.
//! [`Slurm::start`] says why where the daemons cannot run (not installed, not root, no munge
//! key), so that a test can skip with that message.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One cluster at a time per test process: clusters of one process would share ports,
/// directories and the node's name.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A running one-node cluster; stopped when dropped.
pub struct Slurm {
    _turn: MutexGuard<'static, ()>,
    dir: PathBuf,
    node: String,
    daemons: Vec<Child>,
    /// Whether this handle started munged (and so stops it).
    own_munge: bool,
}

impl Slurm {
    /// Starts munge (if it is not running), `slurmctld` and `slurmd`, and waits until the node
    /// is idle; `Err` says why not.
    pub fn start() -> Result<Slurm, String> {
        for tool in ["slurmctld", "slurmd", "srun", "salloc", "munged"] {
            let found = metampi::knobs::os("PATH")
                .iter()
                .flat_map(std::env::split_paths)
                .chain(["/usr/sbin".into(), "/sbin".into()])
                .any(|d| d.join(tool).is_file());
            if !found {
                return Err(format!(
                    "{tool} is not installed (apt-get install slurm-wlm munge)"
                ));
            }
        }
        // The daemons run as root here, as on a cluster.
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if !root {
            return Err("starting slurmctld and slurmd here needs root".into());
        }
        if !std::path::Path::new("/etc/munge/munge.key").is_file() {
            return Err("munge has no key (/etc/munge/munge.key)".into());
        }
        let munge_up = Command::new("pgrep")
            .args(["-x", "munged"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !munge_up {
            let _ = std::fs::create_dir_all("/run/munge");
            let _ = Command::new("chown")
                .args(["munge:munge", "/run/munge"])
                .status();
            let ok = Command::new("/usr/sbin/munged")
                .arg("--force")
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err("munged does not start".into());
            }
        }
        // A test that failed while holding the cluster poisons the lock, not the next test.
        let turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("metampi-slurm-{}", std::process::id()));
        for sub in ["state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let node = Command::new("hostname")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .map_err(|e| e.to_string())?;
        let port = 20000 + (std::process::id() % 20000) as u16;
        let d = dir.display();
        // task/affinity, as on clusters: srun's binding options are then understood.
        let conf = format!(
            "ClusterName=metampitest\nSlurmctldHost={node}\nSlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\nMpiDefault=none\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             ReturnToService=2\nSlurmdParameters=config_overrides\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
             SlurmctldPort={port}\nSlurmdPort={}\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             NodeName={node} NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 \
             ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN\n\
             PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
            port + 1
        );
        std::fs::write(dir.join("slurm.conf"), conf).map_err(|e| e.to_string())?;
        let mut slurm = Slurm {
            _turn: turn,
            dir,
            node,
            daemons: Vec::new(),
            own_munge: !munge_up,
        };
        for daemon in ["slurmctld", "slurmd"] {
            // `-D`: in the foreground, so that dropping the handle stops it.
            let child = Command::new(format!("/usr/sbin/{daemon}"))
                .args(["-D", "-f"])
                .arg(slurm.conf())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{daemon} does not start: {e}"))?;
            slurm.daemons.push(child);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = slurm.command("sinfo").args(["-h", "-o", "%T"]).output();
            if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle") {
                return Ok(slurm);
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(slurm.dir.join("log/slurmctld.log"))
                    .unwrap_or_default();
                return Err(format!(
                    "the node did not come up in 30 s; slurmctld's log:\n{log}"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The cluster's configuration file (what `SLURM_CONF` names).
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// The name of its one node (this machine's host name).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// A Slurm command (`srun`, `salloc`, `squeue`...) for this cluster: `SLURM_CONF` set, and
    /// none of the variables of an allocation the test itself might run in.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        // Only Slurm's own variables are read here, not metampi's settings.
        #[allow(clippy::disallowed_methods)]
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLURM_") {
                c.env_remove(name);
            }
        }
        c.env("SLURM_CONF", self.conf());
        c
    }

    /// The jobs the cluster still has (`squeue`'s id and state per line).
    pub fn jobs(&self) -> String {
        self.command("squeue")
            .args(["-h", "-o", "%i %T"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // slurmd waits for its steps to end; one whose srun was killed may never do, so it
        // gets a few seconds, then SIGKILL.
        for d in &mut self.daemons {
            let _ = Command::new("kill").arg(d.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(d.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        if self.own_munge {
            let _ = Command::new("pkill").args(["-x", "munged"]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
