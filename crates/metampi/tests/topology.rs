//! The topology API on a meta computer: sites in PACX-MPI order, the
//! communicator of one site (MetaMPICH's MPI_COMM_LOCAL) and of one machine.

use metampi::traits::*;
use metampi_testkit::Ranks;

const CONFIG: &str = "PORTBASE 23500\n\
    METAHOST a { LAUNCH = local; NPROCS = 1; NODES = a0; }\n\
    METAHOST b { LAUNCH = local; NPROCS = 3; NODES = b0; }\n\
    METAHOST c { LAUNCH = local; NPROCS = 4; NODES = c0, c1; }\n\
    PAIR a b 1\na0 <-> b0\nPAIR a c 1\na0 <-> c0\nPAIR b c 1\nb0 <-> c0\n";

#[test]
fn sites_and_machines_follow_the_description() {
    Ranks::new(8)
        .meta(CONFIG)
        .run("sites_and_machines_follow_the_description", |world| {
            assert_eq!(world.size(), 8);
            assert_eq!(world.num_meta_hosts(), 3);
            let expect = [0, 1, 1, 1, 2, 2, 2, 2];
            for r in 0..8 {
                assert_eq!(world.meta_host_of(r).unwrap(), expect[r as usize]);
            }
            let site = world.split_meta_host();
            let my_site = expect[world.rank() as usize];
            assert_eq!(site.size(), [1, 3, 4][my_site]);
            assert_eq!(site.num_meta_hosts(), 1);
            let node = world.split_shared(0);
            // c has two machines of two ranks; a and b one machine each.
            assert_eq!(node.size(), [1, 3, 2][my_site]);
            assert_eq!(world.num_nodes(), 4);
            // Site communicators work: a sum over the site.
            let mut sum = 0i32;
            site.all_reduce_into(
                &world.rank(),
                &mut sum,
                metampi::collective::SystemOperation::sum(),
            );
            assert_eq!(sum, [0, 6, 22][my_site]);
            assert!(world.meta_host_of(8).is_err());
        });
}

/// A Cartesian grid on one machine: numbering, shifts, sub-grids, errors, and a halo
/// exchange over it; the seventh process has no cell.
#[test]
fn cartesian_grid_numbers_shifts_and_splits() {
    use metampi::topology::{CartesianLayout, Topology};
    use metampi::ErrorClass;
    Ranks::new(7).run("cartesian_grid_numbers_shifts_and_splits", |world| {
        // Invalid arguments come back as errors, before anything is sent.
        let err = |r: Result<_, metampi::Error>| r.map(|_| ()).unwrap_err().class();
        assert_eq!(
            err(world.try_create_cartesian_communicator(&[2, 4], &[false, false], false)),
            ErrorClass::Arg
        );
        assert_eq!(
            err(world.try_create_cartesian_communicator(&[2, 0], &[false, false], false)),
            ErrorClass::Dims
        );
        assert_eq!(
            err(world.try_create_cartesian_communicator(&[2, 3], &[false], false)),
            ErrorClass::Arg
        );

        // Collective over the world: before the process without a cell leaves.
        assert_eq!(world.duplicate().topology(), Topology::Undefined);
        let cart = world.create_cartesian_communicator(&[2, 3], &[false, true], false);
        let Some(cart) = cart else {
            assert_eq!(world.rank(), 6, "only the process without a cell gets none");
            assert_eq!(world.cartesian_map(&[2, 3], &[false, true]), None);
            return;
        };
        assert_eq!(cart.size(), 6);
        assert_eq!(cart.rank(), world.rank(), "no reordering asked for");
        assert_eq!(cart.num_dimensions(), 2);
        let me = cart.rank();
        let CartesianLayout {
            dims,
            periods,
            coords,
        } = cart.get_layout();
        assert_eq!((dims, periods), (vec![2, 3], vec![false, true]));
        assert_eq!(coords, vec![me / 3, me % 3]);
        for r in 0..6 {
            assert_eq!(cart.coordinates_to_rank(&cart.rank_to_coordinates(r)), r);
        }
        assert_eq!(
            cart.coordinates_to_rank(&[1, -1]),
            5,
            "periodic dimension wraps"
        );
        assert_eq!(
            cart.try_coordinates_to_rank(&[2, 0]).unwrap_err().class(),
            ErrorClass::Arg
        );
        assert_eq!(
            cart.try_rank_to_coordinates(6).unwrap_err().class(),
            ErrorClass::Rank
        );
        assert_eq!(cart.try_shift(2, 1).unwrap_err().class(), ErrorClass::Dims);
        // Shifts: rows end, columns wrap.
        let (up, down) = cart.shift(0, 1);
        assert_eq!(up, (me >= 3).then(|| me - 3));
        assert_eq!(down, (me < 3).then(|| me + 3));
        let (left, right) = cart.shift(1, 1);
        assert_eq!(left, Some(me / 3 * 3 + (me % 3 + 2) % 3));
        assert_eq!(right, Some(me / 3 * 3 + (me % 3 + 1) % 3));
        assert_eq!(cart.shift(1, 3), (Some(me), Some(me)));
        // A halo exchange along the periodic dimension: everyone sends its rank right.
        let (left, right) = (left.unwrap(), right.unwrap());
        let (got, _): (i32, _) = metampi::point_to_point::send_receive(
            &me,
            &cart.process_at_rank(right),
            &cart.process_at_rank(left),
        );
        assert_eq!(got, left);
        // Sub-grids: rows and columns.
        let row = cart.subgroup(&[false, true]);
        assert_eq!((row.size(), row.rank()), (3, me % 3));
        assert_eq!(row.get_layout().dims, vec![3]);
        assert_eq!(row.get_layout().periods, vec![true]);
        let col = cart.subgroup(&[true, false]);
        assert_eq!((col.size(), col.rank()), (2, me / 3));
        let mut sum = 0;
        col.all_reduce_into(&me, &mut sum, metampi::collective::SystemOperation::sum());
        assert_eq!(sum, 2 * (me % 3) + 3, "column sums its two members");
        let none = cart.subgroup(&[false, false]);
        assert_eq!((none.size(), none.num_dimensions()), (1, 0));
        // A duplicate keeps the grid.
        assert_eq!(cart.duplicate().topology(), Topology::Cartesian);
        // Without sites or machines to keep together, reordering changes nothing.
        assert_eq!(world.cartesian_map(&[2, 3], &[false, true]), Some(me));
    });
}

/// With `reorder`, a grid over two sites puts each site in a slab across the grid's longest
/// dimension: 2 grid edges between the sites instead of the 4 that rank order gives, and the
/// program still talks over every edge.
#[test]
fn cartesian_reorder_keeps_sites_together() {
    const TWO_SITES: &str = "PORTBASE 23560\n\
        METAHOST a { LAUNCH = local; NPROCS = 4; NODES = a0; }\n\
        METAHOST b { LAUNCH = local; NPROCS = 4; NODES = b0; }\n\
        PAIR a b 1\na0 <-> b0\n";
    Ranks::new(8)
        .meta(TWO_SITES)
        .run("cartesian_reorder_keeps_sites_together", |world| {
            let cut = |c: &metampi::topology::CartesianCommunicator| {
                let mut n = 0;
                for r in 0..c.size() {
                    let xy = c.rank_to_coordinates(r);
                    for d in 0..2 {
                        let mut next = xy.clone();
                        next[d] += 1;
                        if let Ok(s) = c.try_coordinates_to_rank(&next) {
                            n += (c.meta_host_of(r).unwrap() != c.meta_host_of(s).unwrap()) as i32;
                        }
                    }
                }
                n
            };
            let plain = world
                .create_cartesian_communicator(&[2, 4], &[false, false], false)
                .unwrap();
            assert_eq!(cut(&plain), 4);
            let cart = world
                .create_cartesian_communicator(&[2, 4], &[false, false], true)
                .unwrap();
            assert_eq!(cut(&cart), 2);
            assert_eq!(
                world.cartesian_map(&[2, 4], &[false, false]),
                Some(cart.rank())
            );
            // The reordered grid carries messages over every edge, across sites too.
            for d in 0..2 {
                let (from, to) = cart.shift(d, 1);
                let mut got = -1;
                match (from, to) {
                    (Some(f), Some(t)) => {
                        got = metampi::point_to_point::send_receive(
                            &cart.rank(),
                            &cart.process_at_rank(t),
                            &cart.process_at_rank(f),
                        )
                        .0;
                    }
                    (None, Some(t)) => cart.process_at_rank(t).send(&cart.rank()),
                    (Some(f), None) => got = cart.process_at_rank(f).receive::<i32>().0,
                    (None, None) => {}
                }
                assert_eq!(got, from.unwrap_or(-1));
            }
        });
}

#[derive(Clone, Debug, PartialEq)]
struct Tuning(i32);
impl metampi::traits::CommAttribute for Tuning {
    const CLONE_ON_DUP: bool = true;
}

#[derive(Clone, Debug, PartialEq)]
struct Scratch(Vec<u8>);
impl metampi::traits::CommAttribute for Scratch {}

/// Attributes cached on a communicator: per type, replaced by a later set, seen through every
/// handle of the same communicator, and copied to a duplicate only where the type asks.
#[test]
fn attributes_are_cached_per_communicator() {
    Ranks::new(2).run("attributes_are_cached_per_communicator", |world| {
        let mut w = metampi::topology::SimpleCommunicator::world();
        assert_eq!(w.get_attr::<Tuning>(), None);
        w.set_attr(Tuning(10));
        w.set_attr(Scratch(vec![1, 2]));
        let first = w.get_attr::<Tuning>().cloned();
        assert_eq!(first, Some(Tuning(10)));
        // `world` is another handle of the same communicator.
        assert_eq!(world.get_attr::<Scratch>(), Some(&Scratch(vec![1, 2])));
        let mut dup = w.duplicate();
        assert_eq!(dup.get_attr::<Tuning>(), Some(&Tuning(10)));
        assert_eq!(dup.get_attr::<Scratch>(), None, "not copied on duplication");
        // Set through a trait object; the original keeps its own value.
        let d: &mut dyn Communicator = &mut dup;
        d.set_attr(Tuning(11));
        assert_eq!(dup.get_attr::<Tuning>(), Some(&Tuning(11)));
        assert_eq!(w.get_attr::<Tuning>(), Some(&Tuning(10)));
        // A reference taken before a replacement stays valid.
        let old = world.get_attr::<Tuning>().unwrap();
        w.set_attr(Tuning(12));
        assert_eq!(old, &Tuning(10));
        assert_eq!(world.get_attr::<Tuning>(), Some(&Tuning(12)));
    });
}

/// Ranks bound to a hardware thread each see one CPU in their own mask, yet
/// learn their machine's cores from everyone's: the union of the distinct
/// CPUs they were given.
#[test]
fn bound_ranks_learn_their_machines_cores() {
    const N: usize = 2;
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    Ranks::new(N)
        .bind(metampi_launch::Binding::HwThread)
        .env("EXPECT_CORES", N.min(cpus).to_string())
        .run("bound_ranks_learn_their_machines_cores", |world| {
            let own = std::thread::available_parallelism().map_or(0, |c| c.get());
            assert_eq!(own, 1, "rank {} is bound to one CPU", world.rank());
            let expect: usize = metampi::knobs::text("EXPECT_CORES")
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(metampi::environment::machine_cores(), expect);
        });
}
