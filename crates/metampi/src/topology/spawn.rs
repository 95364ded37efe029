//! Dynamic processes (MPI-2 §5.3) with rsmpi's names:
//! [`Root::spawn`](crate::collective::Root::spawn),
//! [`Root::spawn_multiple`](crate::collective::Root::spawn_multiple) and
//! [`Communicator::parent`](super::Communicator::parent).
//!
//! The root of the spawning communicator starts the children itself, on its
//! own machine, and hosts their start-up exchange (a
//! [`metampi_launch::PmiServer`] inside its process): the children form a
//! world of their own, as a launched job does. Every member of the spawning
//! communicator listens on a fresh port; the root gives the children those
//! addresses and the new context in `METAMPI_PARENT`, and each child
//! connects to every parent (authenticated with the job secret) before its
//! `initialize` returns. Each connection becomes one rank of the engine
//! after the world's (frames on it are read as coming from that rank), and
//! both sides hold the intercommunicator between the two groups on the
//! agreed context. In a world over several meta hosts, members on other meta
//! hosts than the root's meet the children through the routers instead: each
//! child joins the routers of the root's meta host under a wire id of its own
//! ([`ROUTED_BIT`]), and those parents greet every child before its
//! `initialize` returns.
//!
//! The root watches the children: an `ABORT` from one, or one that ends
//! without finalizing or with a failing status, ends the whole job as a
//! failing rank would; the root's finalize waits for them all.
//!
//! Children write to the root's stdout and stderr. Under `metampi run
//! --tag-output` the root labels their lines instead: `[spawn N.R] `, for
//! rank R of this process's Nth spawn (the launcher then puts the root's own
//! `[rank] ` in front). Under `metampi run --output-dir DIR` each child
//! writes files of its own there, named after the root's:
//! `rank.P.spawn.N.R.stdout` and `.stderr` (its children's names continue
//! its own).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use metampi_launch::{
    forward_lines, JobId, JobKey, PmiEvent, PmiServer, OUTPUT_DIR_ENV, OUTPUT_NAME_ENV,
    TAG_OUTPUT_ENV,
};

use super::inter::{assemble, bcast_secret, check_rooted, pack2, tell_group, InterCommunicator};
use super::{CommInner, Rank};
use crate::auth::Secret;
use crate::collective;
use crate::engine::join::{self, JoinSegment};
use crate::engine::parents::{parent_spec, PARENT_ENV, PARENT_ROUTERS_ENV, SPAWN_CTX};
use crate::environment::{abort_job, shared};
use crate::error::{Error, ErrorClass};
use crate::point_to_point::{recv_bytes, send_bytes, Mode};
use crate::Tag;

/// Wire ids of processes spawned across meta hosts have this bit set (no
/// world rank does), then the root's world rank (15 bits), the root's count
/// of such spawns (6 bits) and the child's rank (10 bits): unique in the job.
const ROUTED_BIT: u32 = 1 << 31;
/// A routed parent's greeting to each child, once it knows the children's
/// wire ids (on the intercommunicator's collective context).
const HELLO_TAG: Tag = ADDR_TAG - 1;
/// The members' listening addresses on their way to the root (on the
/// spawning communicator's collective context).
const ADDR_TAG: Tag = -(1 << 22) - (1 << 21);
/// Bytes of one address message (an IPv6 address and port fit).
const ADDR_LEN: usize = 64;
/// Variables of the parents' job that would mislead the children, which
/// are a job of their own on one machine.
const JOB_VARS: [&str; 7] = [
    "METAMPI_SITES",
    "METAMPI_SITE_ORDERS",
    "METAMPI_ROUTERS",
    "METAMPI_TRACE",
    "METAMPI_HELPER",
    "METAMPI_ROUTER_SPEC",
    "METAMPI_SECRET_FILE",
];

/// The intercommunicator to the parents (one per process, made once).
pub(crate) fn parent() -> Option<InterCommunicator> {
    static PARENT: OnceLock<Option<Arc<CommInner>>> = OnceLock::new();
    let inner = PARENT.get_or_init(|| {
        let (ctx, ranks) = shared().parent.as_ref()?;
        let world = super::SimpleCommunicator::world();
        let name = "parent intercommunicator".to_string();
        Some(Arc::clone(
            &assemble(*ctx, &world.0 .0, ranks.clone(), name).0 .0,
        ))
    });
    inner
        .as_ref()
        .map(|i| InterCommunicator(super::CommunicatorHandle(Arc::clone(i))))
}

/// The job secret that children prove to their parents: the launcher's, or
/// (a process started without one) a fresh one of this process.
fn secret() -> Result<Secret, Error> {
    static OWN: OnceLock<Option<String>> = OnceLock::new();
    if let Ok(s) = crate::auth::secret_from_env() {
        return Ok(s);
    }
    OWN.get_or_init(|| Secret::random().ok().map(|s| s.to_hex()))
        .as_deref()
        .and_then(Secret::from_hex)
        .ok_or_else(|| Error::new(ErrorClass::Spawn, "cannot make a secret for the children"))
}

fn spawn_error(what: String) -> Error {
    Error::new(ErrorClass::Spawn, what)
}

/// `MPI_Comm_spawn_multiple` over `comm` with root `root`: only the root's
/// `apps` count (program and count each).
pub(crate) fn spawn(
    comm: &CommInner,
    root: Rank,
    apps: &[(&Command, Rank)],
) -> Result<InterCommunicator, Error> {
    check_rooted(
        comm,
        root,
        "processes are spawned from an intracommunicator",
        "root",
    )?;
    let sh = shared();
    let world = sh.info.size;
    // Children start on the root's machine. Members on its meta host meet them
    // directly; in a world over several meta hosts, the others meet them
    // through the routers, as they meet the world's ranks there.
    let site = |w: u32| (w < world).then(|| super::site_of_world(w));
    let mut sites = comm.ranks.iter().filter_map(|&w| site(w));
    let first = sites.next();
    let multi = sites.any(|s| Some(s) != first);
    let root_site = site(comm.ranks[root as usize]).or(first);
    // Agreed, as members of another world see only their own world's sites:
    // 2 where the meta hosts differ and some member is of another world (such
    // processes have no wire id the routers know), 1 where they differ.
    let spread = match multi {
        true if comm.ranks.iter().any(|&w| w >= world) => 2,
        true => 1,
        false => 0,
    };
    let spread = collective::max_u32(comm, spread)?;
    let multi = spread == 1;
    if spread == 2 {
        return Err(spawn_error(
            "the spawning communicator spans meta hosts and holds processes of \
             another world: children could not reach them through the routers"
                .into(),
        ));
    }
    let me_world = comm.ranks[comm.rank as usize];
    let routed = multi && site(me_world) != root_site;
    let listener = (!routed).then(|| TcpListener::bind((sh.listen_ip, 0)));
    let port = listener
        .as_ref()
        .and_then(|l| l.as_ref().ok())
        .and_then(|l| l.local_addr().ok())
        .map_or(0, |a| a.port());
    let mine = collective::max_u32(comm, sh.next_context.load(Ordering::SeqCst))?;
    // Every member's address to the root (port 0: it could not listen), or
    // where a routed member is.
    let addr = match routed {
        true => format!("@{me_world}/{}", site(me_world).unwrap_or(0)),
        false => SocketAddr::new(sh.tcp_ip, port).to_string(),
    };
    let mut msg = [0u8; ADDR_LEN];
    msg[..addr.len().min(ADDR_LEN)].copy_from_slice(&addr.as_bytes()[..addr.len().min(ADDR_LEN)]);
    let mut base = 0u32;
    let outcome = if comm.rank == root {
        let mut addrs = Vec::with_capacity(comm.ranks.len());
        for r in 0..comm.size() {
            if r == root {
                addrs.push(addr.clone());
                continue;
            }
            let mut b = [0u8; ADDR_LEN];
            recv_bytes(comm, Some(r), Some(ADDR_TAG), &mut b, true)?;
            let end = b.iter().position(|&c| c == 0).unwrap_or(ADDR_LEN);
            addrs.push(String::from_utf8_lossy(&b[..end]).into_owned());
        }
        let routers = if multi {
            routed_children(me_world, apps, root_site.unwrap_or(0) as u32).map(|(b, r)| {
                base = b;
                Some((b, r))
            })
        } else {
            Ok(None)
        };
        Some(routers.and_then(|r| start_children(apps, mine, &addrs, r)))
    } else {
        send_bytes(comm, root, ADDR_TAG, &msg, Mode::Standard, true)?;
        None
    };
    let (ctx, total) = tell_group(comm, root, outcome)?;
    if multi {
        let mut b = base.to_le_bytes();
        collective::bcast_bytes(comm, root, &mut b)?;
        base = u32::from_le_bytes(b);
    }
    // Every member proves the root's secret, the one the children got. A launcher's job
    // secret is every member's already (and stays off the wire); where a member has none
    // (started by Hydra or Slurm, it drew its own), the root's is sent to all.
    let own = crate::auth::secret_from_env();
    let lacking = collective::max_u32(comm, u32::from(own.is_err()))?;
    let key = match own {
        Ok(s) if lacking == 0 => Ok(s),
        _ => {
            let root_secret = if comm.rank == root {
                secret().ok()
            } else {
                None
            };
            bcast_secret(comm, root, root_secret.as_ref())?
                .ok_or_else(|| spawn_error("the root has no secret for the children".into()))
        }
    };
    let got = match (&listener, key) {
        (None, _) => Ok(Vec::new()),
        (Some(Ok(l)), Ok(key)) => {
            crate::engine::accept_peers(sh.info.rank, l, &key, SPAWN_CTX, (0..total).collect())
                .map_err(|e| e.to_string())
        }
        (Some(Err(e)), _) => Err(format!("cannot listen for the children: {e}")),
        (_, Err(e)) => Err(e.to_string()),
    };
    // Shared memory with the children on this machine (see `engine::join`),
    // offered on each connection, in the children's rank order.
    let (job, me) = (&sh.info.job, sh.info.rank);
    let prepared = got.and_then(|mut streams| {
        if routed {
            return Ok(None);
        }
        streams.sort_by_key(|(r, _)| *r);
        let mut streams: Vec<TcpStream> = streams.into_iter().map(|(_, s)| s).collect();
        let own = (!crate::tuning::current().force_tcp)
            .then(|| JoinSegment::create(job, me, streams.len()).ok())
            .flatten();
        let joined = join::join_all(&mut streams, own.as_ref(), job, me)
            .map_err(|e| format!("offering shared memory: {e}"))?;
        Ok(Some((streams, joined, own)))
    });
    // Everyone returns the same: the children are there for all, or not.
    let failed = collective::max_u32(comm, u32::from(prepared.is_err()))?;
    let prepared = match prepared {
        Ok(p) if failed == 0 => p,
        Ok(_) => {
            return Err(spawn_error(
                "another member could not meet the children".into(),
            ))
        }
        Err(e) => return Err(spawn_error(format!("meeting the children: {e}"))),
    };
    let ranks = match prepared {
        Some((streams, joined, own)) => sh
            .quick(|e| join::add_peers(&mut e.links, streams, joined, own))
            .map_err(|e| spawn_error(format!("setting up the children's connections: {e}")))?,
        // Frames to the children take the router channel to the root.
        None => sh
            .quick(|e| {
                let chan = e.links.channel_to(comm.ranks[root as usize])?;
                Some(
                    (0..total)
                        .map(|k| e.links.add_routed(base + k, chan))
                        .collect(),
                )
            })
            .ok_or_else(|| spawn_error("no router leads to the root's meta host".into()))?,
    };
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    let name = format!("intercommunicator to the children of {}", comm.name());
    let inter = assemble(ctx, comm, ranks, name);
    if routed {
        // Each child waits for this before its start-up ends, so that nothing
        // it sends can come before this process knows its wire id.
        for k in 0..total as Rank {
            send_bytes(&inter.0 .0, k, HELLO_TAG, &[], Mode::Standard, true)?;
        }
    }
    Ok(inter)
}

/// The root's part where the spawning communicator spans meta hosts: the
/// first child's wire id (see [`ROUTED_BIT`]) and the routers of the root's
/// meta host `site` for the children to join (`S@ADDR,...`).
fn routed_children(
    root: u32,
    apps: &[(&Command, Rank)],
    site: u32,
) -> Result<(u32, String), Error> {
    static SPAWNS: AtomicU32 = AtomicU32::new(0);
    let serial = SPAWNS.fetch_add(1, Ordering::Relaxed);
    let total: i64 = apps.iter().map(|&(_, n)| i64::from(n.max(0))).sum();
    if root >= 1 << 15 || serial >= 1 << 6 || total > 1 << 10 {
        return Err(spawn_error(format!(
            "a spawn across meta hosts takes a root of world rank under 32768 (this one \
             {root}), at most 64 such spawns per root (this is number {}) and at most \
             1024 children (asked: {total})",
            serial + 1
        )));
    }
    let contract = crate::engine::contract().map_err(|e| spawn_error(e.to_string()))?;
    let routers = contract
        .map(|c| c.sites.routers)
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.from == site)
        .map(|r| format!("{}@{}", r.to, r.addr))
        .collect::<Vec<_>>()
        .join(",");
    Ok((ROUTED_BIT | root << 16 | serial << 10, routers))
}

/// A child's start-up with parents behind routers ends when each of them has
/// greeted it (see [`spawn`]).
pub(crate) fn greet_routed_parents() -> Result<(), Error> {
    let Ok(Some(spec)) = parent_spec() else {
        return Ok(());
    };
    let routed: Vec<usize> = (0..spec.len())
        .filter(|&i| spec.routed(i).is_some())
        .collect();
    if routed.is_empty() {
        return Ok(());
    }
    let inter = parent().ok_or_else(|| spawn_error("no parent intercommunicator".into()))?;
    for i in routed {
        recv_bytes(&inter.0 .0, Some(i as Rank), Some(HELLO_TAG), &mut [], true)?;
    }
    Ok(())
}

/// The root's part: starts every child, with the parents' addresses and a
/// context above `ctx` (the parents' largest next one; the children's
/// world starts below it), hosts their start-up and leaves a thread
/// watching them. Returns the context and the number of children.
fn start_children(
    apps: &[(&Command, Rank)],
    ctx: u32,
    addrs: &[String],
    routed: Option<(u32, String)>,
) -> Result<[u8; 8], Error> {
    let sh = shared();
    if apps.is_empty() || apps.iter().any(|&(_, n)| n <= 0) {
        return Err(Error::new(
            ErrorClass::Arg,
            "spawning needs at least one program, each with a positive count",
        ));
    }
    if let Some(i) = addrs.iter().position(|a| a.ends_with(":0")) {
        return Err(spawn_error(format!(
            "member {i} of the spawning communicator could not listen for the children"
        )));
    }
    let ctx = ctx.max(4);
    let total: usize = apps.iter().map(|&(_, n)| n as usize).sum();
    let key = secret()?;
    let job = JobId::random();
    let server = PmiServer::start_with_key(total, job, JobKey::from_hex(&key.to_hex()))
        .map_err(|e| spawn_error(format!("cannot start the children's bootstrap server: {e}")))?;
    let parents = format!("{ctx};{}", addrs.join(","));
    let node = &sh.info.nodes[sh.info.rank as usize];
    // Under --tag-output the children's lines are labelled here.
    static SPAWNS: AtomicU32 = AtomicU32::new(0);
    let spawn_no = SPAWNS.fetch_add(1, Ordering::Relaxed) + 1;
    let tag = crate::knobs::flag(TAG_OUTPUT_ENV, false);
    // Under --output-dir the children's output goes to files of their own.
    let files = crate::knobs::os(OUTPUT_DIR_ENV)
        .zip(crate::knobs::text(OUTPUT_NAME_ENV))
        .map(|(dir, stem)| (std::path::PathBuf::from(dir), stem));
    let mut forwarders = Vec::new();
    let mut kids: Vec<(Child, String)> = Vec::with_capacity(total);
    for (app, &(cmd, n)) in apps.iter().enumerate() {
        let name = cmd.get_program().to_string_lossy().into_owned();
        for _ in 0..n {
            let rank = kids.len();
            let mut c = Command::new(cmd.get_program());
            c.args(cmd.get_args());
            for v in JOB_VARS {
                c.env_remove(v);
            }
            // A grandchild's parents are a world on one machine.
            c.env_remove(PARENT_ROUTERS_ENV);
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => c.env(k, v),
                    None => c.env_remove(k),
                };
            }
            if let Some(d) = cmd.get_current_dir() {
                c.current_dir(d);
            }
            if let Some((base, routers)) = &routed {
                c.env(PARENT_ROUTERS_ENV, format!("{base};{routers}"));
            }
            let contract = metampi_launch::contract::RankEnv {
                pmi: server.addr().to_string(),
                job: job.to_string(),
                rank: rank as u32,
                size: total as u32,
                appnum: app as u32,
                node: Some(node.clone()),
                local: Some((rank as u32, total as u32)),
            };
            c.envs(contract.vars())
                .env("METAMPI_SECRET", key.to_hex())
                .env(PARENT_ENV, &parents)
                .env_remove(OUTPUT_DIR_ENV)
                .env_remove(OUTPUT_NAME_ENV)
                .stdin(Stdio::null());
            let own_files = files
                .as_ref()
                .and_then(|(dir, stem)| output_files(&mut c, dir, stem, spawn_no, rank));
            if own_files.is_none() && tag {
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            match c.spawn() {
                Ok(mut child) => {
                    let prefix = format!("[spawn {spawn_no}.{rank}] ").into_bytes();
                    let out = child.stdout.take().map(|o| {
                        forward_lines(format!("metampi-sp-out-{rank}"), o, prefix.clone(), false)
                    });
                    let err = child
                        .stderr
                        .take()
                        .map(|e| forward_lines(format!("metampi-sp-err-{rank}"), e, prefix, true));
                    // A forwarder that cannot start leaves that stream unread:
                    // the child would block on it, so it is stopped too.
                    for f in [out, err].into_iter().flatten() {
                        match f {
                            Ok(h) => forwarders.push(h),
                            Err(_) => {
                                let _ = child.kill();
                            }
                        }
                    }
                    kids.push((child, name.clone()));
                }
                Err(e) => {
                    for (k, _) in &mut kids {
                        let _ = k.kill();
                        let _ = k.wait();
                    }
                    return Err(spawn_error(format!("cannot start `{name}`: {e}")));
                }
            }
        }
    }
    let watcher = std::thread::Builder::new()
        .name("metampi-children".into())
        .spawn(move || watch(server, kids, forwarders))
        .map_err(|e| spawn_error(format!("cannot watch the children: {e}")))?;
    sh.children
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(watcher);
    Ok(pack2(ctx, total as u32))
}

/// Points child `rank` of this process's `spawn_no`th spawn at files of its
/// own in `dir` (`STEM.spawn.N.R.stdout` and `.stderr`, where `STEM` names
/// this process's files) and tells it where its own children's go. `None`,
/// leaving `c` unchanged, where they cannot be made: a root on another
/// machine than the launcher sees no such directory, and its children then
/// share its output as they would without `--output-dir`.
fn output_files(
    c: &mut Command,
    dir: &std::path::Path,
    stem: &str,
    spawn_no: u32,
    rank: usize,
) -> Option<()> {
    let name = format!("{stem}.spawn.{spawn_no}.{rank}");
    let out = std::fs::File::create(dir.join(format!("{name}.stdout"))).ok()?;
    let err = std::fs::File::create(dir.join(format!("{name}.stderr"))).ok()?;
    c.stdout(out)
        .stderr(err)
        .env(OUTPUT_DIR_ENV, dir)
        .env(OUTPUT_NAME_ENV, name);
    Some(())
}

/// How a child ended, for the job's failure message; `None` when cleanly.
fn failure(status: ExitStatus, finalized: bool) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) if finalized => None,
        (Some(0), _) => Some("exited without finalizing".into()),
        (Some(c), _) => Some(format!("exited with status {c}")),
        (None, Some(s)) => Some(format!("was killed by signal {s}")),
        (None, None) => Some(format!("ended ({status})")),
    }
}

/// Until every child has ended: an abort from one, or one ending badly,
/// ends the whole job (the other children first). Then until their
/// labelled output is written.
fn watch(server: PmiServer, mut kids: Vec<(Child, String)>, forwarders: Vec<JoinHandle<()>>) {
    let mut running = vec![true; kids.len()];
    let stop_all = |kids: &mut Vec<(Child, String)>| {
        for (k, _) in kids.iter_mut() {
            let _ = k.kill();
            let _ = k.wait();
        }
    };
    while running.iter().any(|&r| r) {
        if let Some(PmiEvent::Abort {
            rank,
            code,
            message,
        }) = server.recv_event_timeout(Duration::from_millis(50))
        {
            stop_all(&mut kids);
            abort_job(code, &format!("spawned process {rank} aborted: {message}"));
        }
        for k in 0..kids.len() {
            if !running[k] {
                continue;
            }
            let Ok(Some(status)) = kids[k].0.try_wait() else {
                continue;
            };
            running[k] = false;
            let finalized = server.rank_state(k).is_some_and(|s| s.finalized);
            if let Some(why) = failure(status, finalized) {
                let name = kids[k].1.clone();
                stop_all(&mut kids);
                abort_job(
                    status.code().filter(|&c| c != 0).unwrap_or(1),
                    &format!("spawned process {k} (`{name}`) {why}"),
                );
            }
        }
    }
    for f in forwarders {
        let _ = f.join();
    }
}

/// Waits for every child this process spawned (its finalize).
pub(crate) fn wait_children(sh: &crate::engine::Shared) {
    let handles = std::mem::take(&mut *sh.children.lock().unwrap_or_else(|p| p.into_inner()));
    for h in handles {
        let _ = h.join();
    }
}
