//! Inclusive and exclusive scan (MPI-1.2 §4.9.7, MPI-2.2 §5.11.2): recursive
//! doubling, and the chain as a baseline. Both apply the operation in rank
//! order.

#![forbid(unsafe_code)]

use super::schedule::{Builder, Reg};
use crate::Rank;

/// Recursive doubling (MPICH): `partial` covers a growing block of ranks
/// around this one, `result` the ranks up to this one. Returns whether
/// `result` was written (an exclusive scan leaves rank 0's alone).
pub(super) fn recursive_doubling(
    b: &mut Builder,
    partial: Reg,
    result: Reg,
    tmp: Reg,
    commutative: bool,
    exclusive: bool,
) -> bool {
    let (n, me) = (b.n, b.me);
    b.phase();
    doubling_over(
        b,
        n,
        me,
        &|x| x,
        [partial, result, tmp],
        commutative,
        exclusive,
    )
}

/// [`recursive_doubling`] over the ranks of `list` (ascending), in list
/// order; ranks outside the list only take the phase. Hierarchical scans
/// run it inside each site and then among the sites.
pub(super) fn list_recursive_doubling(
    b: &mut Builder,
    list: &[Rank],
    regs: [Reg; 3],
    commutative: bool,
    exclusive: bool,
) -> bool {
    b.phase();
    let Some(me) = list.iter().position(|&r| r == b.me) else {
        return false;
    };
    let abs = |x: Rank| list[x as usize];
    doubling_over(
        b,
        list.len() as Rank,
        me as Rank,
        &abs,
        regs,
        commutative,
        exclusive,
    )
}

/// The exchange of recursive doubling among `n` ranks, this one being
/// `me`, where `abs` maps an index to the communicator rank.
fn doubling_over(
    b: &mut Builder,
    n: Rank,
    me: Rank,
    abs: &dyn Fn(Rank) -> Rank,
    [mut partial, result, mut tmp]: [Reg; 3],
    commutative: bool,
    exclusive: bool,
) -> bool {
    let mut have = !exclusive;
    let mut pending: Option<bool> = None;
    let (mut mask, mut k) = (1, 0);
    while mask < n {
        let dst = me ^ mask;
        if dst < n {
            if let Some(from_lower) = pending.take() {
                fold(
                    b,
                    &mut partial,
                    &mut tmp,
                    result,
                    &mut have,
                    from_lower,
                    commutative,
                );
            }
            b.send(abs(dst), k, partial);
            b.recv(abs(dst), k, tmp);
            b.round();
            pending = Some(dst < me);
        }
        mask <<= 1;
        k += 1;
    }
    if let Some(from_lower) = pending {
        fold(
            b,
            &mut partial,
            &mut tmp,
            result,
            &mut have,
            from_lower,
            commutative,
        );
        b.round();
    }
    have
}

fn fold(
    b: &mut Builder,
    partial: &mut Reg,
    tmp: &mut Reg,
    result: Reg,
    have: &mut bool,
    from_lower: bool,
    commutative: bool,
) {
    if from_lower {
        b.apply(*tmp, *partial);
        if *have {
            b.apply(*tmp, result);
        } else {
            b.copy(*tmp, result);
            *have = true;
        }
    } else if commutative {
        b.apply(*tmp, *partial);
    } else {
        b.apply(*partial, *tmp);
        std::mem::swap(partial, tmp);
    }
}

/// The chain: rank r waits for the prefix of ranks below it, combines and
/// passes it on. Returns where the result lies, if this rank has one.
pub(super) fn linear(b: &mut Builder, acc: Reg, tmp: Reg, exclusive: bool) -> Option<Reg> {
    let (n, me) = (b.n, b.me);
    b.phase();
    if me > 0 {
        b.recv(me - 1, 0, tmp);
        b.round();
        b.apply(tmp, acc);
    }
    if me + 1 < n {
        b.send(me + 1, 0, acc);
    }
    b.round();
    match (exclusive, me > 0) {
        (false, _) => Some(acc),
        (true, true) => Some(tmp),
        (true, false) => None,
    }
}
