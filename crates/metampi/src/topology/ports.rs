//! Ports (MPI-4 §11.8.4): two groups started apart, in one job or in two, meet through a
//! port name one of them opened, as [`Root::accept`](crate::collective::Root::accept) and
//! [`Root::connect`](crate::collective::Root::connect) (`MPI_Comm_accept`,
//! `MPI_Comm_connect`), and hold an intercommunicator between them.
//!
//! A port is a TCP listener of the process that opened it and a random token; its name,
//! `metampi-port/ADDR/TOKEN`, is all another process needs to connect, and the token is the
//! secret both sides prove in the job-secret handshake (`auth`), so a stranger who did not
//! get the name is refused. The meeting:
//! 1. every member of the accepting group listens on a fresh port, its root gathers the
//!    addresses and waits on the port for the connecting root;
//! 2. the two roots exchange their group sizes, their groups' next free context (the larger
//!    is the intercommunicator's) and the accepting members' addresses;
//! 3. every connecting member connects to every accepting member (each connection
//!    authenticated with the token), both offer shared memory on each (`engine::join`, as
//!    a spawn's two worlds do), and each connection becomes one engine rank.
//!
//! The members must reach each other over TCP: one machine, or one network. A group that
//! spans meta hosts does not meet another through the routers here.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::inter::{assemble, bcast_secret, check_rooted, pack2, tell_group, InterCommunicator};
use super::{CommInner, Rank};
use crate::auth::Secret;
use crate::collective;
use crate::engine::join::{self, JoinSegment};
use crate::environment::shared;
use crate::error::{Error, ErrorClass};
use crate::point_to_point::{recv_bytes, send_bytes, Mode};
use crate::Tag;

/// Handshake context of every connection a port leads to.
const PORT_CTX: &str = "metampi port";
/// What a port name starts with.
const PREFIX: &str = "metampi-port/";
/// Bytes of one member address on its way to the root (an IPv6 address and port fit).
const ADDR_LEN: usize = 64;
/// The accepting members' addresses to their root (on the group's collective context;
/// apart from the tag a spawn uses for the same step).
const ADDR_TAG: Tag = -(1 << 22) - (1 << 21) - 8;
/// How long the roots wait on each other once connected, and a member on an offer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest port name (`MPI_MAX_PORT_NAME` of MPICH's ABI; the standard ABI's is
/// 1024): the names made here fit both.
pub const MAX_PORT_NAME: usize = 256;

/// The ports this process opened and has not closed, by name.
static OPEN: Mutex<Option<HashMap<String, Arc<TcpListener>>>> = Mutex::new(None);

fn port_error(what: impl Into<String>) -> Error {
    Error::new(ErrorClass::Port, what)
}

/// Opens a port (`MPI_Open_port`): a listener on this process's address for processes of
/// this job or another to connect to, and its name.
///
/// # Errors
/// `ErrorClass::Port` where no listener or token can be made.
pub fn open_port() -> Result<String, Error> {
    let sh = shared();
    let listener = TcpListener::bind((sh.listen_ip, 0))
        .map_err(|e| port_error(format!("cannot listen for a port: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| port_error(format!("cannot name the port: {e}")))?
        .port();
    let token = Secret::random().map_err(|e| port_error(format!("no token for the port: {e}")))?;
    let name = format!(
        "{PREFIX}{}/{}",
        SocketAddr::new(sh.tcp_ip, port),
        token.to_hex()
    );
    OPEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(name.clone(), Arc::new(listener));
    Ok(name)
}

/// Closes a port this process opened (`MPI_Close_port`); a connection already accepted
/// is not affected.
///
/// # Errors
/// `ErrorClass::Port` for a name this process has no open port of.
pub fn close_port(name: &str) -> Result<(), Error> {
    OPEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .remove(name.trim())
        .map(drop)
        .ok_or_else(|| port_error(format!("`{name}` is not a port this process opened")))
}

/// A port name's address and token.
fn parse(name: &str) -> Result<(SocketAddr, Secret), Error> {
    let bad = || {
        port_error(format!(
            "`{name}` is not a metampi port name (metampi-port/ADDRESS/TOKEN, from MPI_Open_port)"
        ))
    };
    let rest = name.trim().strip_prefix(PREFIX).ok_or_else(bad)?;
    let (addr, token) = rest.rsplit_once('/').ok_or_else(bad)?;
    Ok((
        addr.parse().map_err(|_| bad())?,
        Secret::from_hex(token).ok_or_else(bad)?,
    ))
}

/// The accepting side (`MPI_Comm_accept`, collective over `comm`): `port` is read at
/// `root` only, which must have opened it.
pub(crate) fn accept(comm: &CommInner, root: Rank, port: &str) -> Result<InterCommunicator, Error> {
    check_rooted(
        comm,
        root,
        "a port is accepted on an intracommunicator",
        "root",
    )?;
    let sh = shared();
    let token_at_root = match comm.rank == root {
        true => Some(parse(port).and_then(|(_, token)| {
            let listener = OPEN
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(HashMap::new)
                .get(port.trim())
                .cloned()
                .ok_or_else(|| port_error(format!("`{port}` is not a port this process opened")))?;
            Ok((listener, token))
        })),
        false => None,
    };
    // Every member listens for the connecting group and tells the root where.
    let listener = TcpListener::bind((sh.listen_ip, 0)).ok();
    let addr = listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map_or_else(String::new, |a| {
            SocketAddr::new(sh.tcp_ip, a.port()).to_string()
        });
    let mine = collective::max_u32(comm, sh.next_context.load(Ordering::SeqCst))?;
    let mut msg = [0u8; ADDR_LEN];
    msg[..addr.len().min(ADDR_LEN)].copy_from_slice(&addr.as_bytes()[..addr.len().min(ADDR_LEN)]);
    let mut token = None;
    let outcome = match token_at_root {
        Some(found) => {
            let mut addrs = Vec::with_capacity(comm.ranks.len());
            for r in 0..comm.size() {
                let mut b = msg;
                if r != root {
                    recv_bytes(comm, Some(r), Some(ADDR_TAG), &mut b, true)?;
                }
                addrs.push(b);
            }
            Some(found.and_then(|(l, t)| {
                token = Some(t.clone());
                meet_as_acceptor(&l, &t, mine, &addrs)
            }))
        }
        None => {
            send_bytes(comm, root, ADDR_TAG, &msg, Mode::Standard, true)?;
            None
        }
    };
    // The root tells the group the context and the number of connecting members, and
    // the token, which only the root read from the port's name.
    let (ctx, remote) = tell_group(comm, root, outcome)?;
    let key = bcast_secret(comm, root, token.as_ref())?
        .ok_or_else(|| port_error("the root's token did not arrive"))?;
    // The connecting members come as soon as their root has met ours: one that does not
    // within the exchange time fails the accept instead of leaving this group waiting.
    let deadline = Some(std::time::Instant::now() + EXCHANGE_TIMEOUT);
    let streams = match &listener {
        Some(l) => {
            let expected = (0..remote).collect();
            crate::engine::accept_peers_until(sh.info.rank, l, &key, PORT_CTX, expected, deadline)
                .map(|mut s| {
                    s.sort_by_key(|(r, _)| *r);
                    s.into_iter().map(|(_, s)| s).collect::<Vec<_>>()
                })
                .map_err(|e| e.to_string())
        }
        None => Err("cannot listen for the connecting group".to_string()),
    };
    finish(comm, ctx, streams, "accepted")
}

/// The accepting root's meeting with the connecting root on `port`: returns the context
/// and the connecting group's size, packed for `tell_group`.
fn meet_as_acceptor(
    port: &TcpListener,
    token: &Secret,
    mine: u32,
    addrs: &[[u8; ADDR_LEN]],
) -> Result<[u8; 8], Error> {
    if addrs.iter().any(|a| a[0] == 0) {
        return Err(port_error(
            "a member could not listen for the connecting group",
        ));
    }
    let me = shared().info.rank;
    let mut got = crate::engine::accept_peers(me, port, token, PORT_CTX, vec![0])
        .map_err(|e| port_error(format!("waiting on the port: {e}")))?;
    let (_, mut s) = got
        .pop()
        .ok_or_else(|| port_error("no connection on the port"))?;
    let io = |e: std::io::Error| port_error(format!("meeting the connecting root: {e}"));
    s.set_read_timeout(Some(EXCHANGE_TIMEOUT)).map_err(io)?;
    let mut head = [0u8; 8];
    s.read_exact(&mut head).map_err(io)?;
    let (remote, theirs) = (le(&head[..4]), le(&head[4..]));
    if remote == 0 || remote > 1 << 20 {
        return Err(port_error(format!(
            "the connecting group has {remote} members"
        )));
    }
    let ctx = mine.max(theirs).max(4);
    let mut out = Vec::with_capacity(8 + addrs.len() * ADDR_LEN);
    out.extend_from_slice(&pack2(addrs.len() as u32, ctx));
    for a in addrs {
        out.extend_from_slice(a);
    }
    s.write_all(&out).map_err(io)?;
    Ok(pack2(ctx, remote))
}

/// The connecting side (`MPI_Comm_connect`, collective over `comm`): `port` is read at
/// `root` only.
pub(crate) fn connect(
    comm: &CommInner,
    root: Rank,
    port: &str,
) -> Result<InterCommunicator, Error> {
    check_rooted(
        comm,
        root,
        "a port is connected to from an intracommunicator",
        "root",
    )?;
    let sh = shared();
    let mine = collective::max_u32(comm, sh.next_context.load(Ordering::SeqCst))?;
    let mut addrs: Vec<u8> = Vec::new();
    let mut token = None;
    let outcome = (comm.rank == root).then(|| {
        let (at, key) = parse(port)?;
        let io = |e: std::io::Error| port_error(format!("connecting to port {at}: {e}"));
        let mut s = TcpStream::connect_timeout(&at, EXCHANGE_TIMEOUT).map_err(io)?;
        crate::auth::connect(&mut s, &key, PORT_CTX, &0u32.to_le_bytes()).map_err(io)?;
        s.set_read_timeout(Some(EXCHANGE_TIMEOUT)).map_err(io)?;
        s.write_all(&pack2(comm.ranks.len() as u32, mine))
            .map_err(io)?;
        let mut head = [0u8; 8];
        s.read_exact(&mut head).map_err(io)?;
        let (remote, ctx) = (le(&head[..4]), le(&head[4..]));
        if remote == 0 || remote > 1 << 20 {
            return Err(port_error(format!(
                "the accepting group has {remote} members"
            )));
        }
        addrs.resize(remote as usize * ADDR_LEN, 0);
        s.read_exact(&mut addrs).map_err(io)?;
        token = Some(key);
        Ok(pack2(ctx, remote))
    });
    let (ctx, remote) = tell_group(comm, root, outcome)?;
    addrs.resize(remote as usize * ADDR_LEN, 0);
    collective::bcast_bytes(comm, root, &mut addrs)?;
    let key = bcast_secret(comm, root, token.as_ref())?
        .ok_or_else(|| port_error("the root's token did not arrive"))?;
    let me = (comm.rank as u32).to_le_bytes();
    let streams = addrs
        .chunks(ADDR_LEN)
        .enumerate()
        .map(|(j, a)| {
            let end = a.iter().position(|&c| c == 0).unwrap_or(ADDR_LEN);
            let at = String::from_utf8_lossy(&a[..end]).into_owned();
            let mut s = TcpStream::connect(at.as_str()).map_err(|e| {
                format!("connecting to member {j} of the accepting group at {at}: {e}")
            })?;
            crate::auth::connect(&mut s, &key, PORT_CTX, &me)
                .map_err(|e| format!("authenticating with member {j} at {at}: {e}"))?;
            Ok(s)
        })
        .collect::<Result<Vec<_>, String>>();
    finish(comm, ctx, streams, "connected")
}

/// Both sides' end: shared memory offered on every connection, the connections made
/// engine ranks, the intercommunicator on `ctx`. Every member returns the same.
fn finish(
    comm: &CommInner,
    ctx: u32,
    streams: Result<Vec<TcpStream>, String>,
    how: &str,
) -> Result<InterCommunicator, Error> {
    let sh = shared();
    let (job, me) = (&sh.info.job, sh.info.rank);
    let prepared = streams.and_then(|mut streams| {
        let own = (!crate::tuning::current().force_tcp)
            .then(|| JoinSegment::create(job, me, streams.len()).ok())
            .flatten();
        let joined = join::join_all(&mut streams, own.as_ref(), job, me)
            .map_err(|e| format!("offering shared memory: {e}"))?;
        Ok((streams, joined, own))
    });
    let failed = collective::max_u32(comm, u32::from(prepared.is_err()))?;
    let (streams, joined, own) = match prepared {
        Ok(p) if failed == 0 => p,
        Ok(_) => return Err(port_error("another member could not meet the other group")),
        Err(e) => return Err(port_error(e)),
    };
    let ranks = sh
        .quick(|e| join::add_peers(&mut e.links, streams, joined, own))
        .map_err(|e| port_error(format!("setting up the connections: {e}")))?;
    sh.next_context.fetch_max(ctx + 2, Ordering::SeqCst);
    let name = format!("intercommunicator {how} on a port from {}", comm.name());
    Ok(assemble(ctx, comm, ranks, name))
}

/// The intercommunicator between this process and the one at the other end of `socket`
/// (`MPI_Comm_join`, MPI-2 §5.4.4; both call it). One side opens a port and sends its
/// name through the socket, the other connects: which is which, a random draw exchanged
/// first decides. The socket is left blocking and otherwise unused.
///
/// # Errors
/// `ErrorClass::Port` where the socket fails or the meeting does.
pub fn join(socket: &mut TcpStream) -> Result<InterCommunicator, Error> {
    let io = |e: std::io::Error| port_error(format!("joining over the socket: {e}"));
    socket.set_nonblocking(false).map_err(io)?;
    let me = super::SimpleCommunicator::self_comm();
    loop {
        let mine = crate::auth::nonce().map_err(io)?;
        let mut theirs = [0u8; crate::auth::NONCE];
        socket.write_all(&mine).map_err(io)?;
        socket.read_exact(&mut theirs).map_err(io)?;
        match mine.cmp(&theirs) {
            // Equal draws (one in 2^128) would leave both waiting: draw again.
            std::cmp::Ordering::Equal => continue,
            std::cmp::Ordering::Less => {
                let port = open_port()?;
                let len = (port.len() as u16).to_le_bytes();
                let sent = socket
                    .write_all(&len)
                    .and_then(|()| socket.write_all(port.as_bytes()));
                let inter = sent.map_err(io).and_then(|()| accept(&me.0 .0, 0, &port));
                let _ = close_port(&port);
                return inter;
            }
            std::cmp::Ordering::Greater => {
                let mut len = [0u8; 2];
                socket.read_exact(&mut len).map_err(io)?;
                let mut name = vec![0u8; u16::from_le_bytes(len) as usize];
                socket.read_exact(&mut name).map_err(io)?;
                return connect(&me.0 .0, 0, &String::from_utf8_lossy(&name));
            }
        }
    }
}

/// The folder of published names: `METAMPI_NAME_DIR`, else one per user in the temporary
/// directory (every job of the user on this machine shares it).
fn name_dir() -> std::path::PathBuf {
    match crate::knobs::os("METAMPI_NAME_DIR") {
        Some(d) => d.into(),
        None => {
            let user = crate::knobs::os("USER").map_or_else(String::new, |u| {
                u.to_string_lossy()
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            });
            std::env::temp_dir().join(format!("metampi-names-{user}"))
        }
    }
}

/// The file of service `name`: its bytes spelled in hexadecimal, so that any name is one
/// safe file name.
fn name_file(service: &str) -> Result<std::path::PathBuf, Error> {
    if service.is_empty() || service.len() > 1024 {
        return Err(Error::new(
            ErrorClass::Service,
            "a service name has 1 to 1024 bytes",
        ));
    }
    let hex: String = service.bytes().map(|b| format!("{b:02x}")).collect();
    let mut path = name_dir();
    // Long names become a chain of folders, each under the file-name limit.
    let chunks: Vec<&str> = hex
        .as_bytes()
        .chunks(200)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    for c in &chunks {
        path.push(c);
    }
    path.set_extension("port");
    Ok(path)
}

/// Publishes `port` under `service` (`MPI_Publish_name`) where every job that shares the
/// name folder (`METAMPI_NAME_DIR`) finds it.
///
/// # Errors
/// `ErrorClass::Service` where the name is published already or cannot be written.
pub fn publish_name(service: &str, port: &str) -> Result<(), Error> {
    let path = name_file(service)?;
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorClass::Service,
            format!(
                "cannot publish `{service}` in {}: {e}",
                name_dir().display()
            ),
        )
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    // Written aside, then linked into place: a reader sees all of it or nothing, and a
    // second publisher of the name fails instead of replacing the first.
    let tmp = path.with_extension(format!("{}.part", std::process::id()));
    std::fs::write(&tmp, port.trim()).map_err(fail)?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::new(
            ErrorClass::Service,
            format!("`{service}` is published already (MPI_Unpublish_name it first)"),
        )),
        Err(e) => Err(fail(e)),
    }
}

/// The port published under `service` (`MPI_Lookup_name`).
///
/// # Errors
/// `ErrorClass::Name` where nothing is published under it.
pub fn lookup_name(service: &str) -> Result<String, Error> {
    let path = name_file(service).map_err(|e| Error::new(ErrorClass::Name, e.message()))?;
    std::fs::read_to_string(&path).map_err(|_| {
        Error::new(
            ErrorClass::Name,
            format!(
                "no port is published as `{service}` (in {})",
                name_dir().display()
            ),
        )
    })
}

/// Withdraws `service` (`MPI_Unpublish_name`), which must name `port`.
///
/// # Errors
/// `ErrorClass::Service` where `service` is not published, or names another port.
pub fn unpublish_name(service: &str, port: &str) -> Result<(), Error> {
    let path = name_file(service)?;
    match std::fs::read_to_string(&path) {
        Ok(p) if p == port.trim() => std::fs::remove_file(&path).map_err(|e| {
            Error::new(
                ErrorClass::Service,
                format!("cannot unpublish `{service}`: {e}"),
            )
        }),
        Ok(_) => Err(Error::new(
            ErrorClass::Service,
            format!("`{service}` is published with another port"),
        )),
        Err(_) => Err(Error::new(
            ErrorClass::Service,
            format!("`{service}` is not published"),
        )),
    }
}

fn le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_published_once_found_and_withdrawn() {
        let service = format!("metampi test/{} ü", std::process::id());
        let port = "metampi-port/127.0.0.1:1/00";
        assert_eq!(lookup_name(&service).unwrap_err().class(), ErrorClass::Name);
        publish_name(&service, port).unwrap();
        assert_eq!(lookup_name(&service).unwrap(), port);
        assert_eq!(
            publish_name(&service, port).unwrap_err().class(),
            ErrorClass::Service
        );
        assert_eq!(
            unpublish_name(&service, "other").unwrap_err().class(),
            ErrorClass::Service
        );
        unpublish_name(&service, port).unwrap();
        assert_eq!(lookup_name(&service).unwrap_err().class(), ErrorClass::Name);
        assert_eq!(
            unpublish_name(&service, port).unwrap_err().class(),
            ErrorClass::Service
        );
        // A long name still makes a usable path.
        let long = "x".repeat(900);
        publish_name(&long, port).unwrap();
        assert_eq!(lookup_name(&long).unwrap(), port);
        unpublish_name(&long, port).unwrap();
    }

    #[test]
    fn a_port_name_is_its_address_and_token() {
        let t = Secret::random().unwrap();
        let name = format!("metampi-port/127.0.0.1:4000/{}", t.to_hex());
        let (at, key) = parse(&name).unwrap();
        assert_eq!(at, "127.0.0.1:4000".parse().unwrap());
        assert_eq!(key.to_hex(), t.to_hex());
        let v6 = format!("metampi-port/[::1]:4000/{}\n", t.to_hex());
        assert_eq!(parse(&v6).unwrap().0, "[::1]:4000".parse().unwrap());
        assert!(name.len() <= MAX_PORT_NAME);
        for bad in [
            "",
            "tcp://127.0.0.1:4000",
            "metampi-port/127.0.0.1:4000",
            "metampi-port/127.0.0.1/00",
            "metampi-port/nowhere:1/abcd",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Port, "{bad}");
        }
    }
}
