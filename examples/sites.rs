//! Several sites: the same program on a meta computer. Ranks learn their meta host, make a
//! communicator per site (MetaMPICH's `MPI_COMM_LOCAL`), reduce inside each site first and
//! then across sites over the routers: one message per site crosses the wide-area links.
//!
//! `metampi run --meta examples/two-sites.cfg target/release/examples/sites`

use metampi::collective::SystemOperation;
use metampi::traits::*;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let rank = world.rank();
    let site = world.meta_host_of(rank).expect("a rank of the world");
    let local = world.split_meta_host();

    // Sum of the world's ranks, in two steps.
    let mut site_sum = 0i64;
    local.all_reduce_into(&(rank as i64), &mut site_sum, SystemOperation::sum());
    // One leader per site joins the cross-site step.
    let leaders = world
        .split_by_color(metampi::topology::Color::with_value(if local.rank() == 0 {
            0
        } else {
            1
        }))
        .expect("every rank has a colour");
    let mut total = 0i64;
    if local.rank() == 0 {
        leaders.all_reduce_into(&site_sum, &mut total, SystemOperation::sum());
    }
    local.process_at_rank(0).broadcast_into(&mut total);
    let n = world.size() as i64;
    assert_eq!(total, n * (n - 1) / 2);
    println!(
        "rank {rank}: site {site} of {} ({} ranks there), site sum {site_sum}, world sum {total}",
        world.num_meta_hosts(),
        local.size()
    );
}
