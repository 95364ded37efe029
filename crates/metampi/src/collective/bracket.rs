//! The order in which a reduction combines the members' vectors, written
//! down once so that a path which holds every vector at once (the
//! shared-memory slots) combines them exactly as the message schedules do.
//! Floating-point sums depend on that order in their last bits, and MPI
//! advises that a reduction give the same result whenever it is applied to
//! the same arguments; without this a program's sums changed once a
//! communicator's shared-memory region took over from the schedules.
//! Recursive doubling and the binomial tree are also MPICH's choices for
//! small vectors, so the results are bitwise MPICH's there too.

#![forbid(unsafe_code)]

use super::allreduce::prev_pow2;
use super::bcast::span;
use crate::Rank;

/// Steps `(a, b)`: member `b`'s running value becomes `value(a) ∘ value(b)`
/// (MPI's `inoutvec = invec ∘ inoutvec`, `a` the lower block); after the
/// last step the result is member `result`'s value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub steps: Vec<(usize, usize)>,
    pub result: usize,
}

/// All-reduce by recursive doubling (`allreduce::recursive_doubling`): of
/// the first `2 * rem` members each odd one takes its even neighbour's
/// vector first, then blocks of consecutive members double.
pub(crate) fn doubling(n: usize) -> Plan {
    let mut steps = Vec::with_capacity(n.saturating_sub(1));
    if n == 0 {
        return Plan { steps, result: 0 };
    }
    let p2 = prev_pow2(n as Rank) as usize;
    let rem = n - p2;
    let mut at: Vec<usize> = (0..p2)
        .map(|q| {
            if q < rem {
                steps.push((2 * q, 2 * q + 1));
                2 * q + 1
            } else {
                q + rem
            }
        })
        .collect();
    let mut mask = 1;
    while mask < p2 {
        for q in (0..p2).step_by(2 * mask) {
            steps.push((at[q], at[q + mask]));
            at[q] = at[q + mask];
        }
        mask <<= 1;
    }
    Plan {
        steps,
        result: at[0],
    }
}

/// Reduce to `root` along the binomial tree (`reduce::binomial`): over
/// ranks relative to the root for a commutative operation, else over true
/// ranks from 0 (the result then travels to the root unchanged).
pub(crate) fn binomial(n: usize, root: usize, commutative: bool) -> Plan {
    let mut steps = Vec::with_capacity(n.saturating_sub(1));
    if n == 0 {
        return Plan { steps, result: 0 };
    }
    let base = if commutative { root % n } else { 0 };
    let result = subtree(0, span(0, n as Rank) as usize, n, base, &mut steps);
    Plan { steps, result }
}

/// The block of relative ranks `rel..rel + size`: its own vector, then each
/// child's block in turn (`acc = acc ∘ child`).
fn subtree(
    rel: usize,
    size: usize,
    n: usize,
    base: usize,
    steps: &mut Vec<(usize, usize)>,
) -> usize {
    let mut acc = (rel + base) % n;
    let mut mask = 1;
    while mask < size && rel + mask < n {
        let child = subtree(rel + mask, mask, n, base, steps);
        steps.push((acc, child));
        acc = child;
        mask <<= 1;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan as an expression over member numbers.
    fn show(p: &Plan, n: usize) -> String {
        let mut v: Vec<String> = (0..n).map(|m| m.to_string()).collect();
        for &(a, b) in &p.steps {
            v[b] = format!("({} {})", v[a], v[b]);
        }
        v[p.result].clone()
    }

    #[test]
    fn doubling_pairs_blocks_of_consecutive_members() {
        assert_eq!(show(&doubling(1), 1), "0");
        assert_eq!(show(&doubling(2), 2), "(0 1)");
        assert_eq!(show(&doubling(3), 3), "((0 1) 2)");
        assert_eq!(show(&doubling(4), 4), "((0 1) (2 3))");
        assert_eq!(show(&doubling(5), 5), "(((0 1) 2) (3 4))");
        assert_eq!(show(&doubling(6), 6), "(((0 1) (2 3)) (4 5))");
        assert_eq!(show(&doubling(8), 8), "(((0 1) (2 3)) ((4 5) (6 7)))");
    }

    #[test]
    fn binomial_follows_the_tree_from_the_root() {
        assert_eq!(show(&binomial(3, 0, true), 3), "((0 1) 2)");
        assert_eq!(show(&binomial(3, 1, true), 3), "((1 2) 0)");
        assert_eq!(show(&binomial(3, 1, false), 3), "((0 1) 2)");
        assert_eq!(show(&binomial(4, 2, true), 4), "((2 3) (0 1))");
        assert_eq!(show(&binomial(5, 0, true), 5), "(((0 1) (2 3)) 4)");
        assert_eq!(show(&binomial(6, 0, true), 6), "(((0 1) (2 3)) (4 5))");
    }

    #[test]
    fn every_member_is_combined_once() {
        for n in 1..40 {
            for p in [
                doubling(n),
                binomial(n, n / 3, true),
                binomial(n, n - 1, false),
            ] {
                assert_eq!(p.steps.len(), n - 1, "{n}: {p:?}");
                let mut alive = vec![true; n];
                for &(a, b) in &p.steps {
                    assert!(alive[a] && alive[b] && a != b, "{n}: {p:?}");
                    alive[a] = false;
                }
                assert_eq!(alive.iter().filter(|&&x| x).count(), 1);
                assert!(alive[p.result]);
            }
        }
    }
}
