//! `metampi info`: the library's versions and what this machine offers it
//! (shared memory, single-copy transfer, fences, CPUs, link features), and
//! the `METAMPI_*` variables set here, so that a slow or refused job can be
//! explained before it runs.

use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {}

/// Bytes in the largest binary unit that divides them.
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn execute(_args: InfoArgs) -> anyhow::Result<u8> {
    let (major, minor) = metampi::environment::version();
    let c = metampi::environment::capabilities();
    let mut rows: Vec<(&str, String)> = vec![
        ("library", metampi::environment::library_version()?),
        ("MPI standard", format!("{major}.{minor}")),
        (
            "threading",
            "multiple (every level up to MPI_THREAD_MULTIPLE)".into(),
        ),
        ("host", metampi::environment::processor_name()?),
        ("CPUs for this process", c.cpus.to_string()),
        (
            "shared memory",
            match c.shm_free {
                Some(free) => format!("{} ({} free)", c.shm_dir.display(), gib(free)),
                None => format!("{} (free space unknown)", c.shm_dir.display()),
            },
        ),
    ];
    let scope = c
        .ptrace_scope
        .map_or("no Yama".to_string(), |s| format!("Yama ptrace_scope {s}"));
    rows.push((
        "cross-memory attach",
        if c.cross_memory_attach {
            format!("yes: long messages on a machine are copied once ({scope})")
        } else if c.cross_memory_attach_off {
            "off (METAMPI_NO_CMA): long messages on a machine are copied twice".into()
        } else {
            format!("not permitted ({scope}): long messages on a machine are copied twice")
        },
    ));
    rows.push((
        "shared-memory fences",
        if c.asymmetric_fences {
            "asymmetric (membarrier): no full fence per message".into()
        } else {
            "a full fence per message (no membarrier)".into()
        },
    ));
    rows.push(("router link compression", c.compression.join(", ")));
    rows.push((
        "router link TLS",
        if c.tls {
            "TLS 1.3 (rustls)"
        } else {
            "not built (feature `tls` off)"
        }
        .into(),
    ));
    // The transport tuning these settings resolve to (defaults where unset).
    let (t, refused) = metampi::tuning::Tuning::from_env();
    rows.push((
        "eager limits",
        format!(
            "shared memory {}, TCP {}, to other sites {}",
            size(t.eager_shm),
            size(t.eager_tcp),
            size(t.eager_router)
        ),
    ));
    rows.push((
        "shared-memory rings",
        format!("{} per sender", size(t.shm_ring)),
    ));
    rows.push((
        "TCP socket buffers",
        if t.tcp_buf == 0 {
            "the kernel's autotuning".into()
        } else {
            size(t.tcp_buf)
        },
    ));
    rows.push((
        "cooperative copy",
        t.coop_min
            .map_or("off".into(), |n| format!("from {}", size(n))),
    ));
    rows.push(("spin before sleeping", {
        use metampi::tuning::{SPIN_CROWDED, SPIN_DEFAULT};
        let how = if t.spin_learn { "learnt" } else { "fixed" };
        match t.spin {
            Some(d) => format!("{} µs, {how}", d.as_micros()),
            None => format!(
                "{} µs ({} µs where ranks outnumber cores), {how}",
                SPIN_DEFAULT.as_micros(),
                SPIN_CROWDED.as_micros()
            ),
        }
    }));
    rows.push((
        "rank-router pipes",
        if t.router_pipes && !t.force_tcp {
            format!("{} each way", size(t.router_pipe_bytes()))
        } else {
            "off: TCP to routers".into()
        },
    ));
    if t.force_tcp {
        rows.push(("links between ranks", "TCP only (METAMPI_FORCE_TCP)".into()));
    }
    for e in &refused {
        rows.push(("", format!("<- warning: {e}")));
    }
    // Each METAMPI_* variable set here, with what is wrong with it: a misspelt
    // name or a value its kind refuses (the library warns about the same at start).
    let vars = metampi::knobs::report();
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &rows {
        println!("{k:width$}  {v}");
    }
    if vars.is_empty() {
        println!("{:width$}  none", "METAMPI_* variables");
    } else {
        for (i, (k, v, why)) in vars.iter().enumerate() {
            let label = if i == 0 { "METAMPI_* variables" } else { "" };
            match why {
                None => println!("{label:width$}  {k}={v}"),
                Some(why) => println!("{label:width$}  {k}={v}  <- warning: {why}"),
            }
        }
    }
    Ok(0)
}
