//! Which CPUs this process may run on, to tell whether a machine's ranks
//! outnumber the cores they were given.
//!
//! `std::thread::available_parallelism` counts one process's affinity mask.
//! A rank pinned to one core (`taskset`, a batch system's binding) would then
//! see a machine of one core and believe itself oversubscribed, though every
//! rank has a core of its own. Ranks exchange their masks instead, and the
//! cores a machine's ranks have are the union of them.

/// This process's affinity mask as a bitmap in hexadecimal, lowest CPU in the
/// last digit; `None` where the system does not say.
pub fn affinity_hex() -> Option<String> {
    metampi_launch::affinity().ok().map(|cpus| to_hex(&cpus))
}

fn to_hex(cpus: &[usize]) -> String {
    let top = cpus.iter().max().map_or(0, |&c| c / 4);
    let mut digits = vec![0u8; top + 1];
    for &c in cpus {
        digits[c / 4] |= 1 << (c % 4);
    }
    digits
        .iter()
        .rev()
        .map(|&d| char::from_digit(u32::from(d), 16).unwrap_or('0'))
        .collect()
}

/// CPUs in the union of hexadecimal masks; masks that do not parse are
/// skipped (an older rank, a foreign value).
pub fn union_count<'a>(masks: impl IntoIterator<Item = &'a str>) -> usize {
    let mut union: Vec<u8> = Vec::new();
    for m in masks {
        let Some(digits) = m
            .chars()
            .rev()
            .map(|ch| ch.to_digit(16).map(|d| d as u8))
            .collect::<Option<Vec<u8>>>()
        else {
            continue;
        };
        if union.len() < digits.len() {
            union.resize(digits.len(), 0);
        }
        for (u, d) in union.iter_mut().zip(digits) {
            *u |= d;
        }
    }
    union.iter().map(|d| d.count_ones() as usize).sum()
}

/// The cores a machine's ranks can use: the union of their masks, but no more
/// than a CPU quota allows. `available_parallelism` is the smaller of this
/// process's mask and the quota, so where it is below our own mask's size the
/// quota is what binds.
pub fn machine_cores(own_mask: usize, union: usize) -> usize {
    let ap = std::thread::available_parallelism().map_or(1, |n| n.get());
    let union = union.max(1);
    if ap < own_mask {
        union.min(ap)
    } else {
        union
    }
}

/// CPUs online on this machine, whatever this process's mask (1 where the
/// system does not say).
pub fn online() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The runnable threads in `/proc/loadavg` text, the reader included.
pub fn runnable(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').next())
        .and_then(|r| r.parse::<usize>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn online_cpus_include_this_process_s() {
        let mine = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(online() >= mine, "{} online, {mine} in this mask", online());
    }

    #[test]
    fn masks_round_trip_and_unite() {
        assert_eq!(to_hex(&[0]), "1");
        assert_eq!(to_hex(&[1]), "2");
        assert_eq!(to_hex(&[0, 1, 2, 3, 4]), "1f");
        assert_eq!(to_hex(&[9]), "200");
        assert_eq!(union_count(["1", "2"]), 2);
        assert_eq!(union_count(["3", "2"]), 2);
        assert_eq!(union_count(["1", "1"]), 1);
        assert_eq!(union_count(["200", "1f"]), 6);
        assert_eq!(union_count(["xyz", "1"]), 1);
        let own = affinity_hex().expect("Linux reports an affinity mask");
        assert!(union_count([own.as_str()]) >= 1);
    }
}
