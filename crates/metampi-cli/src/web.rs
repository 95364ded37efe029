//! `metampi run --web ADDR`: a live view of the running job over HTTP.
//!
//! One page (`web/index.html`, embedded, no external scripts) polls four JSON endpoints:
//! - `/api/job`: job id, command, size, how long it has run, its meta hosts;
//! - `/api/ranks`: each rank's host, meta host, pid and state (starting, running, waiting in
//!   an MPI call and for how long, not answering, finalized, exited with its status), and the
//!   messages and bytes it has sent and received, with rates between its last two answers;
//! - `/api/trace`: with `--trace`, each rank's calls that ended in the last [`TIMELINE`]
//!   (kind, name, peer, bytes, start and end in seconds since the ranks started), which the
//!   page draws as a timeline; without, `"recording": false`;
//! - `/api/routers`: with `--meta`, what the routers on this machine write to
//!   `METAMPI_ROUTER_STATS`: each link's bytes, rate, frames, compression, queues, round trip
//!   and resends, and each router's memory.
//!
//! Ranks are asked where they wait (the hang report's `REPORT`), their counters and recent
//! calls only while someone polls `/api/ranks` or `/api/trace`:
//! [`metampi_launch::LiveView::want`]. Requests are served one at a time on one thread; they
//! are small and each is answered from memory or a directory of small files.

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use metampi_launch::{LiveView, RankState};
use serde_json::{json, Value};

use crate::links::{Names, Snapshot};

const PAGE: &str = include_str!("web/index.html");

/// The shortest time between the two snapshots a link's rate is measured over: the routers
/// rewrite their files twice a second, so closer reads would see no change.
const RATE_SPAN: Duration = Duration::from_millis(900);

/// How far back `/api/trace` goes unless asked (`?last=SECONDS`, up to
/// [`metampi_launch::CALLS_KEPT_FOR`]): the last seconds of each rank's calls.
const TIMELINE: Duration = Duration::from_secs(10);

/// What the page shows of the job that does not change while it runs.
#[derive(Debug, Default)]
pub struct JobInfo {
    /// The command line of the ranks.
    pub command: String,
    /// Ranks in the job.
    pub world_size: usize,
    /// With `--meta`: the description file and each meta host's name and ranks.
    pub meta: Option<(PathBuf, MetaHosts)>,
}

/// Each meta host's name and world ranks, in rank order.
pub type MetaHosts = Vec<(String, Range<usize>)>;

/// The routers' statistics directory and the names of their links.
pub struct RouterStats {
    pub dir: PathBuf,
    pub names: Names,
}

/// The server, answering on its own thread until dropped.
pub struct Web {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    state: Arc<State>,
    thread: Option<JoinHandle<()>>,
}

struct State {
    live: LiveView,
    job: Mutex<JobInfo>,
    routers: Mutex<Option<RouterStats>>,
    /// The snapshot rates are measured from, and the one before it.
    rates: Mutex<(Option<Snapshot>, Option<Snapshot>)>,
}

/// Why `--web ADDR` is refused.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("--web {0}: not an address (HOST:PORT, e.g. 127.0.0.1:8080, or a port)")]
    BadAddress(String),
    #[error(
        "--web {0} would let other machines see this job (its hosts, processes and calls) \
         with no password; give a loopback address (127.0.0.1:PORT), or add --web-public \
         if that is what you want"
    )]
    NotLoopback(String),
    #[error("--web {0}: cannot listen there: {1}")]
    Bind(String, String),
}

impl Web {
    /// Listens on `addr` (`HOST:PORT`, or a bare port on 127.0.0.1); an address other machines
    /// can reach only when `public`.
    ///
    /// # Errors
    /// An address that does not parse, is not loopback (without `public`), or cannot be bound.
    pub fn start(addr: &str, public: bool) -> Result<Web, WebError> {
        let resolved: Vec<SocketAddr> = match addr.parse::<u16>() {
            Ok(port) => vec![SocketAddr::from(([127, 0, 0, 1], port))],
            Err(_) => addr
                .to_socket_addrs()
                .map_err(|_| WebError::BadAddress(addr.into()))?
                .collect(),
        };
        let Some(&first) = resolved.first() else {
            return Err(WebError::BadAddress(addr.into()));
        };
        if !public && resolved.iter().any(|a| !a.ip().is_loopback()) {
            return Err(WebError::NotLoopback(addr.into()));
        }
        let server = tiny_http::Server::http(first)
            .map_err(|e| WebError::Bind(addr.into(), e.to_string()))?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| WebError::Bind(addr.into(), "not an IP socket".into()))?;
        let server = Arc::new(server);
        let state = Arc::new(State {
            live: LiveView::new(),
            job: Mutex::new(JobInfo::default()),
            routers: Mutex::new(None),
            rates: Mutex::new((None, None)),
        });
        let thread = {
            let (server, state) = (Arc::clone(&server), Arc::clone(&state));
            std::thread::Builder::new()
                .name("metampi-web".into())
                .spawn(move || {
                    for request in server.incoming_requests() {
                        answer(&state, request);
                    }
                })
                .ok()
        };
        Ok(Web {
            server,
            addr: bound,
            state,
            thread,
        })
    }

    /// Where the page is.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The view the launcher keeps up to date ([`metampi_launch::JobSpec::live`]).
    pub fn live(&self) -> LiveView {
        self.state.live.clone()
    }

    pub fn set_job(&self, info: JobInfo) {
        *lock(&self.state.job) = info;
    }

    pub fn set_routers(&self, stats: RouterStats) {
        *lock(&self.state.routers) = Some(stats);
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every value behind these locks is replaced whole; a panic cannot leave one half-made.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn answer(state: &State, request: tiny_http::Request) {
    let (path, query) = request.url().split_once('?').unwrap_or((request.url(), ""));
    let (path, query) = (path.to_string(), query.to_string());
    let (status, kind, body) = match path.as_str() {
        "/" | "/index.html" => (200, "text/html; charset=utf-8", PAGE.to_string()),
        "/api/job" => (200, "application/json", job_json(state).to_string()),
        "/api/ranks" => {
            state.live.want();
            (200, "application/json", ranks_json(state).to_string())
        }
        "/api/trace" => {
            state.live.want();
            (
                200,
                "application/json",
                trace_json(state, &query).to_string(),
            )
        }
        "/api/routers" => (200, "application/json", routers_json(state).to_string()),
        _ => (404, "text/plain", "not found\n".to_string()),
    };
    let mut response = tiny_http::Response::from_string(body).with_status_code(status);
    for (k, v) in [("Content-Type", kind), ("Cache-Control", "no-store")] {
        if let Ok(h) = tiny_http::Header::from_bytes(k, v) {
            response.add_header(h);
        }
    }
    // A viewer that went away mid-answer is no concern of the job's.
    let _ = request.respond(response);
}

fn job_json(state: &State) -> Value {
    let snap = state.live.snapshot();
    let job = lock(&state.job);
    let meta = job.meta.as_ref().map(|(file, hosts)| {
        json!({
            "file": file.display().to_string(),
            "hosts": hosts.iter().map(|(name, ranks)| json!({
                "name": name,
                "ranks": [ranks.start, ranks.end],
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "job": snap.job,
        "command": job.command,
        "world_size": job.world_size,
        "running_for_s": snap.running_for.as_secs_f64(),
        "ended": snap.ended,
        "meta": meta,
        "routers": lock(&state.routers).is_some(),
    })
}

fn ranks_json(state: &State) -> Value {
    let snap = state.live.snapshot();
    let job = lock(&state.job);
    let meta_host = |rank: usize| -> Option<String> {
        let (_, hosts) = job.meta.as_ref()?;
        hosts
            .iter()
            .find(|(_, r)| r.contains(&rank))
            .map(|(n, _)| n.clone())
    };
    let ranks: Vec<Value> = snap
        .ranks
        .iter()
        .map(|r| {
            let mut v = json!({
                "rank": r.id.rank,
                "host": r.id.host,
                "meta_host": meta_host(r.id.rank),
                "pid": r.id.pid,
                "by_hand": r.id.by_hand,
            });
            let (name, extra) = match &r.state {
                RankState::Starting => ("starting", json!({})),
                RankState::Running => ("running", json!({})),
                RankState::Waiting { waited, call } => (
                    "waiting",
                    json!({ "waited_s": waited.as_secs_f64(), "call": call }),
                ),
                RankState::NoAnswer { stopped } => ("no-answer", json!({ "stopped": stopped })),
                RankState::Finalized => ("finalized", json!({})),
                RankState::Exited { code, signal } => (
                    "exited",
                    json!({
                        "exit_code": code,
                        "signal": signal.map(metampi_launch::describe_signal),
                    }),
                ),
                _ => ("unknown", json!({})),
            };
            v["state"] = name.into();
            if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                v.extend(extra);
            }
            if let Some(t) = &r.traffic {
                let (out, into) = t.rates.unzip();
                v["traffic"] = json!({
                    "sent_messages": t.total.sent,
                    "sent_bytes": t.total.sent_bytes,
                    "received_messages": t.total.received,
                    "received_bytes": t.total.received_bytes,
                    "sent_bytes_per_s": out,
                    "received_bytes_per_s": into,
                    "age_s": snap.running_for.saturating_sub(t.at).as_secs_f64(),
                });
            }
            v
        })
        .collect();
    json!({
        "ranks": ranks,
        "answers_age_s": snap.answers_age.map(|d| d.as_secs_f64()),
    })
}

/// How far back `/api/trace?QUERY` goes: `last=SECONDS`, at most what the view keeps, or
/// [`TIMELINE`].
fn window(query: &str) -> Duration {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("last=")?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(TIMELINE, |s| {
            Duration::from_secs_f64(s.min(metampi_launch::CALLS_KEPT_FOR.as_secs_f64()))
        })
}

fn trace_json(state: &State, query: &str) -> Value {
    let last = window(query);
    let calls = state.live.calls(last);
    let ranks: Vec<Value> = calls
        .ranks
        .iter()
        .map(|(rank, calls, left_out)| {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({
                        "kind": c.kind,
                        "name": c.name,
                        "peer": c.peer,
                        "bytes": c.bytes,
                        "start_s": c.start.as_secs_f64(),
                        "end_s": c.end.as_secs_f64(),
                    })
                })
                .collect();
            json!({ "rank": rank, "calls": calls, "left_out": left_out })
        })
        .collect();
    json!({
        "recording": calls.recording,
        "now_s": calls.now.as_secs_f64(),
        "window_s": last.as_secs_f64(),
        "ranks": ranks,
    })
}

fn routers_json(state: &State) -> Value {
    let routers = lock(&state.routers);
    let Some(stats) = routers.as_ref() else {
        return json!({ "available": false, "links": [], "routers": [] });
    };
    let Ok(now) = Snapshot::read(&stats.dir) else {
        return json!({ "available": true, "links": [], "routers": [] });
    };
    // Rates are measured from the newest kept snapshot at least RATE_SPAN old (kept ones are
    // that far apart), so polls closer together than the routers write still see one.
    let mut rates = lock(&state.rates);
    let old_enough = |s: &Snapshot| now.at().duration_since(s.at()) >= RATE_SPAN;
    let newest_old_enough = rates.0.as_ref().is_some_and(old_enough);
    let before = if newest_old_enough {
        rates.0.as_ref()
    } else {
        rates.1.as_ref()
    };
    let mut v = now.json(before, Some(&stats.names));
    v["available"] = true.into();
    if rates.0.is_none() || newest_old_enough {
        rates.1 = rates.0.take();
        rates.0 = Some(now);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_unless_public() {
        assert!(matches!(
            Web::start("0.0.0.0:0", false),
            Err(WebError::NotLoopback(_))
        ));
        assert!(matches!(
            Web::start("no address", false),
            Err(WebError::BadAddress(_))
        ));
        let web = Web::start("127.0.0.1:0", false).unwrap();
        assert!(web.url().starts_with("http://127.0.0.1:"), "{}", web.url());
        assert!(!web.url().ends_with(":0/"));
        let web = Web::start("0", false).unwrap();
        assert!(web.url().starts_with("http://127.0.0.1:"));
    }

    #[test]
    fn the_timeline_window_is_asked_for_within_what_is_kept() {
        assert_eq!(window(""), TIMELINE);
        assert_eq!(window("x=1&last=2.5"), Duration::from_millis(2500));
        assert_eq!(window("last=1e9"), metampi_launch::CALLS_KEPT_FOR);
        for bad in ["last=-1", "last=0", "last=NaN", "last=inf", "last="] {
            assert_eq!(window(bad), TIMELINE, "{bad}");
        }
    }
}
