//! Binding ranks to CPUs (`metampi run --bind-to`), as mpiexec's `-bind-to`
//! does: each rank this launcher starts on its own machine gets one core (all
//! of its hardware threads) or one hardware thread, taken from the CPUs the
//! launcher itself may use. Cores come in order of their lowest CPU; hardware
//! threads spread over the cores first, so two ranks share a core only once
//! every core has one. With more ranks than units the ranks wrap round and
//! share.
//!
//! Binding keeps a rank on the same CPU for its whole run: what it measures
//! about itself early (a pilot's speed, a benchmark's warm-up) then holds
//! later, and caches stay warm.

use std::io;

/// How ranks are bound to CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Binding {
    /// The operating system places ranks (the default).
    #[default]
    None,
    /// One core per rank: every hardware thread of that core.
    Core,
    /// One hardware thread per rank, spread over cores first.
    HwThread,
}

/// The variable that gives a binding where a command line does not
/// (`metampi run`, and jobs `psrsearch` starts).
pub const BIND_ENV: &str = "METAMPI_BIND_TO";

impl std::str::FromStr for Binding {
    type Err = String;

    fn from_str(text: &str) -> Result<Binding, String> {
        match text {
            "none" => Ok(Binding::None),
            "core" => Ok(Binding::Core),
            "hwthread" => Ok(Binding::HwThread),
            _ => Err(format!("`{text}`: expected none, core or hwthread")),
        }
    }
}

impl Binding {
    /// The binding [`BIND_ENV`] asks for; [`Binding::None`] where it is unset.
    ///
    /// # Errors
    /// A value other than `none`, `core` or `hwthread`, naming the variable.
    pub fn from_env() -> Result<Binding, String> {
        match std::env::var(BIND_ENV) {
            Ok(v) => v.parse().map_err(|e| format!("{BIND_ENV}: {e}")),
            Err(_) => Ok(Binding::None),
        }
    }
}

/// The CPU sets ranks get in turn: `cpus` are the CPUs allowed, each with
/// the core it belongs to (package and core id).
pub(crate) fn units(cpus: &[(usize, (u32, u32))], binding: Binding) -> Vec<Vec<usize>> {
    // Cores in order of their lowest CPU, each with its CPUs in order.
    let mut sorted = cpus.to_vec();
    sorted.sort_by_key(|&(cpu, _)| cpu);
    let mut cores: Vec<((u32, u32), Vec<usize>)> = Vec::new();
    for (cpu, core) in sorted {
        match cores.iter_mut().find(|(c, _)| *c == core) {
            Some((_, list)) => list.push(cpu),
            None => cores.push((core, vec![cpu])),
        }
    }
    match binding {
        Binding::None => Vec::new(),
        Binding::Core => cores.into_iter().map(|(_, list)| list).collect(),
        Binding::HwThread => {
            let deepest = cores.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
            (0..deepest)
                .flat_map(|level| {
                    cores
                        .iter()
                        .filter_map(move |(_, list)| list.get(level).map(|&c| vec![c]))
                })
                .collect()
        }
    }
}

/// The CPUs this process may use, each with its core as sysfs describes it
/// (a CPU whose topology cannot be read is a core of its own).
fn allowed_cpus() -> io::Result<Vec<(usize, (u32, u32))>> {
    let cpus = crate::sys::affinity()?;
    let read = |cpu: usize, what: &str| -> Option<u32> {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    };
    Ok(cpus
        .into_iter()
        .map(|cpu| {
            let core = match (read(cpu, "physical_package_id"), read(cpu, "core_id")) {
                (Some(p), Some(c)) => (p, c),
                _ => (u32::MAX, cpu as u32),
            };
            (cpu, core)
        })
        .collect())
}

/// The CPU sets for `binding` on this machine (empty for [`Binding::None`]).
pub(crate) fn plan(binding: Binding) -> io::Result<Vec<Vec<usize>>> {
    if binding == Binding::None {
        return Ok(Vec::new());
    }
    Ok(units(&allowed_cpus()?, binding))
}

/// A CPU set as `taskset` and `lscpu` write it: runs of consecutive CPUs as `A-B`, commas
/// between (`0,4` or `0-3`).
pub(crate) fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_written_in_runs() {
        assert_eq!(cpu_list(&[0, 4]), "0,4");
        assert_eq!(cpu_list(&[3, 1, 2, 0, 8]), "0-3,8");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "");
    }

    /// 2 packages of 2 cores with 2 threads each, numbered as Linux often
    /// does: first threads 0-3, their siblings 4-7.
    fn smt_machine() -> Vec<(usize, (u32, u32))> {
        (0..8)
            .map(|cpu| (cpu, ((cpu % 4 / 2) as u32, (cpu % 2) as u32)))
            .collect()
    }

    #[test]
    fn cores_take_every_hardware_thread() {
        let u = units(&smt_machine(), Binding::Core);
        assert_eq!(u, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    }

    #[test]
    fn hardware_threads_spread_over_cores_first() {
        let u = units(&smt_machine(), Binding::HwThread);
        let flat: Vec<usize> = u.iter().map(|s| s[0]).collect();
        assert_eq!(flat, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        // Siblings numbered next to each other (0,1 one core): still one per core first.
        let adjacent: Vec<_> = (0..4).map(|cpu| (cpu, (0, cpu as u32 / 2))).collect();
        let flat: Vec<usize> = units(&adjacent, Binding::HwThread)
            .iter()
            .map(|s| s[0])
            .collect();
        assert_eq!(flat, vec![0, 2, 1, 3]);
    }

    #[test]
    fn a_restricted_mask_and_unknown_topology() {
        // Only CPUs 5 and 2 allowed, out of order.
        let some = vec![(5, (0, 1)), (2, (0, 2))];
        assert_eq!(units(&some, Binding::Core), vec![vec![2], vec![5]]);
        // Unknown topology: every CPU a core of its own.
        let unknown: Vec<_> = (0..3).map(|c| (c, (u32::MAX, c as u32))).collect();
        assert_eq!(units(&unknown, Binding::Core).len(), 3);
        assert!(units(&unknown, Binding::None).is_empty());
    }

    #[test]
    fn names_parse_and_others_are_refused() {
        assert_eq!("core".parse(), Ok(Binding::Core));
        assert_eq!("hwthread".parse(), Ok(Binding::HwThread));
        assert_eq!("none".parse(), Ok(Binding::None));
        let err = "socket".parse::<Binding>().unwrap_err();
        assert!(err.contains("socket") && err.contains("hwthread"), "{err}");
    }
}
