//! Which listening ports a meta job can count on.
//!
//! Linux gives every outgoing TCP connection a local port from its ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default). Once such a connection
//! closes, its port stays in TIME_WAIT for a minute, and a listener cannot bind that port
//! meanwhile, `SO_REUSEADDR` or not (that only helps where the old socket had it too). A job
//! makes dozens of connections, so a router port inside the range fails now and then with
//! "Address already in use" in the job after (seen in `bench/psr_plan.sh`, whose searches
//! reuse the demo's port base, then drawn from 30000-50000). Ports below the range are never
//! handed out that way.

use std::ops::RangeInclusive;

/// This machine's ephemeral port range; `None` where it cannot be read (not Linux).
pub fn ephemeral_ports() -> Option<RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_range(&text)
}

fn parse_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    (lo <= hi).then_some(lo..=hi)
}

/// The ports of `ports` (each a router's listening port) that lie in `ephemeral`, as
/// inclusive runs of consecutive ports, for a warning.
pub fn in_range(ports: &[u16], ephemeral: &RangeInclusive<u16>) -> Vec<RangeInclusive<u16>> {
    let mut inside: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|p| ephemeral.contains(p))
        .collect();
    inside.sort_unstable();
    inside.dedup();
    let mut runs: Vec<RangeInclusive<u16>> = Vec::new();
    for p in inside {
        match runs.last_mut() {
            Some(r) if r.end().checked_add(1) == Some(p) => *r = *r.start()..=p,
            _ => runs.push(p..=p),
        }
    }
    runs
}

/// What to tell a user whose router could not listen on `port` because it was in use,
/// where the port lies in this machine's ephemeral range; `None` otherwise.
pub fn in_use_hint(port: u16) -> Option<String> {
    let eph = ephemeral_ports()?;
    eph.contains(&port).then(|| {
        format!(
            "port {port} lies in this machine's ephemeral range {}-{}, where a connection that \
             closed within the last minute can hold it: choose a PORTBASE (and PORTs) below {}",
            eph.start(),
            eph.end(),
            eph.start()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proc_file_parses() {
        assert_eq!(parse_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_range("1024 65535"), Some(1024..=65535));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("32768"), None);
        assert_eq!(parse_range("x y"), None);
    }

    #[test]
    fn ports_inside_come_back_as_runs() {
        let eph = 32768..=60999;
        let ports = [28000, 40002, 40000, 40001, 40001, 50000, 61000, 32768];
        assert_eq!(
            in_range(&ports, &eph),
            vec![32768..=32768, 40000..=40002, 50000..=50000]
        );
        assert!(in_range(&[28000, 28001], &eph).is_empty());
        assert_eq!(in_range(&[65535], &(1024..=65535)), vec![65535..=65535]);
    }

    #[test]
    fn this_machine_reads_its_range() {
        if let Some(r) = ephemeral_ports() {
            assert!(r.start() <= r.end());
            assert!(in_use_hint(*r.start()).is_some());
            if *r.start() > 1 {
                assert_eq!(in_use_hint(r.start() - 1), None);
            }
        }
    }
}
