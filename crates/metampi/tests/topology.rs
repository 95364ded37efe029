//! The topology API on a meta computer: sites in PACX-MPI order, the
//! communicator of one site (MetaMPICH's MPI_COMM_LOCAL) and of one machine.

use metampi::testing::Ranks;
use metampi::traits::*;

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
