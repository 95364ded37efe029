//! Dynamic processes from C (MPI-4 §11.8): `MPI_Comm_spawn` and
//! `MPI_Comm_spawn_multiple` start children through the engine's spawn (`Root::spawn`),
//! which runs them on the root's machine as a world of their own; the children find the
//! intercommunicator with `MPI_Comm_get_parent` (made in their `MPI_Init`, see `state`).
//!
//! The root's info keys: `wdir` (the children's working directory), `path` (directories,
//! `:`-separated, searched for a command without `/` before `PATH`) and `env` (lines of
//! `NAME=VALUE` added to the children's environment, Open MPI's key). Other keys are hints
//! MPI lets a library ignore (`host`, ...; stderr says so once): the children start on the
//! root's machine, all `maxprocs` of them or none (a `soft` range is not read).
//!
//! Ports and names (§11.8.4-5) are the engine's (`metampi::topology::open_port` and
//! `Root::accept`/`connect`): a port name is `metampi-port/ADDRESS/TOKEN`, names are
//! published as files in `METAMPI_NAME_DIR` (default: a folder per user in the temporary
//! directory), so jobs that share that folder find each other.

use std::ffi::{c_char, c_int, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use metampi::collective::Root;
use metampi::topology::{self as topo, Communicator, InterCommunicator};

use crate::consts::*;
use crate::err::{Fail, R};
use crate::raw;
use crate::state;

/// One program to start: what the root's arguments name.
struct App {
    command: OsString,
    args: Vec<OsString>,
    info: Handle,
}

/// The command line and setting of `app`, from its info keys.
fn command(app: &App) -> R<Command> {
    let keys = if app.info == INFO_NULL {
        Default::default()
    } else {
        crate::env::with_info(app.info, |i| i.0.clone())?
    };
    // A placement the program asked for and does not get is said once per key.
    for key in keys.keys() {
        if !matches!(key.as_str(), "wdir" | "path" | "env" | "soft") {
            warn_ignored(key);
        }
    }
    let wdir = keys.get("wdir").map(PathBuf::from);
    if let Some(d) = &wdir {
        if !d.is_dir() {
            return Err(Fail::new(
                ERR_SPAWN,
                format!("info key wdir: {} is not a directory", d.display()),
            ));
        }
    }
    let program = resolve(
        &app.command,
        keys.get("path").map(String::as_str),
        wdir.as_deref(),
    )?;
    let mut cmd = Command::new(program);
    cmd.args(&app.args);
    if let Some(d) = wdir {
        cmd.current_dir(d);
    }
    if let Some(env) = keys.get("env") {
        for line in env.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once('=') {
                Some((name, value)) if !name.is_empty() => {
                    cmd.env(name, value);
                }
                _ => {
                    return Err(Fail::new(
                        ERR_INFO_VALUE,
                        format!("info key env: {line:?} is not NAME=VALUE"),
                    ))
                }
            }
        }
    }
    Ok(cmd)
}

/// Says on stderr, once per key and process, that the spawn info key `key` is not applied.
fn warn_ignored(key: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.iter().any(|k| k == key) {
        said.push(key.to_string());
        eprintln!(
            "metampi: MPI_Comm_spawn: info key `{key}` is not applied (children start on the \
             root's machine; metampi applies wdir, path and env)"
        );
    }
}

/// Where the program `command` is: a relative path with `/` names a program in `wdir`
/// where one is given and holds it, else in the caller's working directory; a bare name
/// is looked up in the info's `path` and then left to `PATH`.
fn resolve(command: &OsString, path: Option<&str>, wdir: Option<&Path>) -> R<PathBuf> {
    let given = PathBuf::from(command);
    if command.is_empty() {
        return Err(Fail::new(ERR_SPAWN, "the command to spawn is empty"));
    }
    if given.components().count() > 1 || given.is_absolute() {
        let in_wdir = wdir.map(|d| d.join(&given)).filter(|p| p.is_file());
        return Ok(in_wdir.unwrap_or_else(|| std::path::absolute(&given).unwrap_or(given)));
    }
    let found = path
        .into_iter()
        .flat_map(|p| p.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(&given))
        .find(|p| p.is_file());
    Ok(found.unwrap_or(given))
}

/// Spawns `apps` (significant at the root only) over `comm` and returns the
/// intercommunicator's handle; `errcodes` (where not ignored) gets one success code per
/// child, on every member (as MPICH, which broadcasts them).
fn spawn(apps: R<Vec<(App, c_int)>>, root: c_int, comm: Handle, errcodes: *mut c_int) -> R<Handle> {
    let c = state::intra(comm)?;
    crate::coll::check_root(&c, root)?;
    let at_root = c.comm.rank() == root;
    let proc = c.comm.process_at_rank(root);
    let inter: InterCommunicator = if at_root {
        // A root whose arguments are wrong still enters the spawn, with nothing to start,
        // so that the other members learn of the failure instead of waiting.
        let built = apps.and_then(|apps| {
            apps.iter()
                .map(|(a, n)| Ok((command(a)?, *n)))
                .collect::<R<Vec<(Command, c_int)>>>()
        });
        match built {
            Ok(list) => {
                let (cmds, counts): (Vec<Command>, Vec<c_int>) = list.into_iter().unzip();
                proc.spawn_multiple(&cmds, &counts)?
            }
            Err(e) => {
                let _ = proc.spawn_multiple(&[], &[]);
                return Err(e);
            }
        }
    } else {
        proc.spawn_multiple(&[], &[])?
    };
    if !errcodes.is_null() {
        raw::slice_mut(errcodes, inter.remote_size())?.fill(SUCCESS);
    }
    Ok(state::new_inter(inter, c.errh.load(Ordering::Relaxed)))
}

mpi! {
    fn MPI_Comm_spawn / PMPI_Comm_spawn(
        command: *const c_char,
        argv: *const *const c_char,
        maxprocs: c_int,
        info: Handle,
        root: c_int,
        comm: Handle,
        intercomm: *mut Handle,
        errcodes: *mut c_int,
    ) {
        // The root's arguments alone are read: the others' may be anything.
        let me = state::comm(comm)?.comm.rank();
        let apps = if me == root {
            (|| {
                let app = App { command: raw::c_os_str(command)?, args: raw::argv(argv)?, info };
                Ok(vec![(app, maxprocs)])
            })()
        } else {
            Ok(Vec::new())
        };
        raw::put(intercomm, spawn(apps, root, comm, errcodes)?)
    }
    fn MPI_Comm_spawn_multiple / PMPI_Comm_spawn_multiple(
        count: c_int,
        commands: *const *const c_char,
        argvs: *const *const *const c_char,
        maxprocs: *const c_int,
        infos: *const Handle,
        root: c_int,
        comm: Handle,
        intercomm: *mut Handle,
        errcodes: *mut c_int,
    ) {
        let me = state::comm(comm)?.comm.rank();
        let apps = if me == root {
            (|| {
                if count < 1 {
                    return Err(Fail::arg(format!("count {count} is below 1")));
                }
                let (cmds, ns, is) =
                    (raw::slice(commands, count)?, raw::slice(maxprocs, count)?, raw::slice(infos, count)?);
                (0..count as usize)
                    .map(|i| {
                        let app = App {
                            command: raw::c_os_str(cmds[i])?,
                            args: raw::argv_at(argvs, i)?,
                            info: is[i],
                        };
                        Ok((app, ns[i]))
                    })
                    .collect()
            })()
        } else {
            Ok(Vec::new())
        };
        raw::put(intercomm, spawn(apps, root, comm, errcodes)?)
    }
}

/// The port name argument of a call (cut at `MPI_MAX_PORT_NAME`, as C would).
fn port_arg(p: *const c_char) -> R<String> {
    let name = raw::c_str(p)?;
    match name.len() > topo::MAX_PORT_NAME {
        true => Err(Fail::new(
            ERR_PORT,
            "a port name is longer than MPI_MAX_PORT_NAME",
        )),
        false => Ok(name),
    }
}

/// `MPI_Comm_accept` or `MPI_Comm_connect` over `comm`: the port is read at `root` only.
fn meet(port: *const c_char, root: c_int, comm: Handle, accept: bool) -> R<Handle> {
    let c = state::intra(comm)?;
    crate::coll::check_root(&c, root)?;
    // A root whose port argument is unreadable still takes part, with a name that fails,
    // so that the other members hear of it instead of waiting.
    let name = match c.comm.rank() == root {
        true => port_arg(port).unwrap_or_default(),
        false => String::new(),
    };
    let proc = c.comm.process_at_rank(root);
    let inter = match accept {
        true => proc.accept(&name)?,
        false => proc.connect(&name)?,
    };
    Ok(state::new_inter(inter, c.errh.load(Ordering::Relaxed)))
}

mpi! {
    fn MPI_Open_port / PMPI_Open_port(_info: Handle, port_name: *mut c_char) {
        state::check_init()?;
        let name = topo::open_port()?;
        raw::put_str(port_name, topo::MAX_PORT_NAME, &name).map(drop)
    }
    fn MPI_Close_port / PMPI_Close_port(port_name: *const c_char) {
        state::check_init()?;
        Ok(topo::close_port(&port_arg(port_name)?)?)
    }
    fn MPI_Comm_accept / PMPI_Comm_accept(port_name: *const c_char, _info: Handle, root: c_int, comm: Handle, newcomm: *mut Handle) {
        raw::put(newcomm, meet(port_name, root, comm, true)?)
    }
    fn MPI_Comm_connect / PMPI_Comm_connect(port_name: *const c_char, _info: Handle, root: c_int, comm: Handle, newcomm: *mut Handle) {
        raw::put(newcomm, meet(port_name, root, comm, false)?)
    }
    fn MPI_Comm_join / PMPI_Comm_join(fd: c_int, intercomm: *mut Handle) {
        state::check_init()?;
        let inter = raw::with_socket(fd, topo::join_socket)??;
        raw::put(intercomm, state::new_inter(inter, ERRORS_ARE_FATAL))
    }
    fn MPI_Publish_name / PMPI_Publish_name(service: *const c_char, _info: Handle, port_name: *const c_char) {
        state::check_init()?;
        Ok(topo::publish_name(&raw::c_str(service)?, &port_arg(port_name)?)?)
    }
    fn MPI_Lookup_name / PMPI_Lookup_name(service: *const c_char, _info: Handle, port_name: *mut c_char) {
        state::check_init()?;
        let port = topo::lookup_name(&raw::c_str(service)?)?;
        raw::put_str(port_name, topo::MAX_PORT_NAME, &port).map(drop)
    }
    fn MPI_Unpublish_name / PMPI_Unpublish_name(service: *const c_char, _info: Handle, port_name: *const c_char) {
        state::check_init()?;
        Ok(topo::unpublish_name(&raw::c_str(service)?, &port_arg(port_name)?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_found_in_the_info_path_before_path() {
        let dir = std::env::temp_dir().join(format!("metampi-spawn-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("worker"), b"").unwrap();
        let p = resolve(
            &"worker".into(),
            Some(&format!("/nonexistent:{}", dir.display())),
            None,
        )
        .unwrap();
        assert_eq!(p, dir.join("worker"));
        // Not in the info's directories: left to PATH.
        assert_eq!(
            resolve(&"ls".into(), Some("/nonexistent"), None).unwrap(),
            PathBuf::from("ls")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_relative_path_is_looked_for_in_the_working_directory_given_then_here() {
        let dir = std::env::temp_dir().join(format!("metampi-spawn-wdir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w"), b"").unwrap();
        let p = resolve(&"./w".into(), None, Some(&dir)).unwrap();
        assert_eq!(p, dir.join("./w"));
        // Not in the working directory given: the caller's.
        let here = std::env::current_dir().unwrap().join("./v");
        assert_eq!(resolve(&"./v".into(), None, Some(&dir)).unwrap(), here);
        assert!(resolve(&"./w".into(), None, None).unwrap().is_absolute());
        let _ = std::fs::remove_dir_all(&dir);
        assert!(resolve(&"".into(), None, None).is_err());
    }
}
