//! Every rank says where it runs.
//!
//! ```sh
//! cargo build --release -p metampi-cli --examples
//! target/release/metampi run -n 4 target/release/examples/hello
//! ```

use metampi::traits::*;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    let name = metampi::environment::processor_name().unwrap_or_else(|_| "?".into());
    println!(
        "hello from rank {} of {} on {name} (meta host {} of {})",
        world.rank(),
        world.size(),
        world.meta_host_of(world.rank()).unwrap_or(0),
        world.num_meta_hosts(),
    );
}
