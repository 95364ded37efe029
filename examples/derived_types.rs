//! Derived datatypes: a struct sent as itself (`#[derive(Equivalence)]`), and one column of
//! a row-major matrix sent without copying it out first (a strided vector type).
//!
//! `metampi run -n 2 target/release/examples/derived_types`

use metampi::datatype::{MutView, UserDatatype, View};
use metampi::traits::*;

#[derive(Equivalence, Debug, Default, Clone, Copy, PartialEq)]
struct Particle {
    position: [f64; 3],
    charge: f32,
    id: u32,
}

const ROWS: usize = 4;
const COLS: usize = 5;

fn main() {
    let universe = metampi::initialize().expect("initialize once");
    let world = universe.world();
    if world.size() < 2 {
        eprintln!("derived_types needs 2 ranks");
        return;
    }
    let rank = world.rank();
    if rank > 1 {
        return;
    }
    let peer = world.process_at_rank(1 - rank);

    // Structs travel as structs, whatever their layout in memory.
    if rank == 0 {
        let particles: Vec<Particle> = (0..3)
            .map(|i| Particle {
                position: [i as f64, 2.0 * i as f64, -1.0],
                charge: -1.0,
                id: 10 + i,
            })
            .collect();
        peer.send(&particles[..]);
    } else {
        let (particles, _) = peer.receive_vec::<Particle>();
        assert_eq!(particles.len(), 3);
        assert_eq!(particles[2].id, 12);
        assert_eq!(particles[2].position, [2.0, 4.0, -1.0]);
        println!(
            "received {} particles, last {:?}",
            particles.len(),
            particles[2]
        );
    }

    // Column 2 of a ROWS x COLS matrix: ROWS blocks of one value, COLS values apart.
    let column = UserDatatype::vector(ROWS as i32, 1, COLS as i32, &f64::equivalent_datatype());
    if rank == 0 {
        let matrix: Vec<f64> = (0..ROWS * COLS).map(|i| i as f64).collect();
        // SAFETY: the view covers ROWS strided values from element 2, all inside `matrix`.
        let view = unsafe { View::with_count_and_datatype(&matrix[2..], 1, &column) };
        peer.send(&view);
    } else {
        let mut into = [0.0f64; ROWS * COLS];
        // SAFETY: as above, inside `into`.
        let mut view = unsafe { MutView::with_count_and_datatype(&mut into[2..], 1, &column) };
        peer.receive_into(&mut view);
        let col: Vec<f64> = (0..ROWS).map(|r| into[r * COLS + 2]).collect();
        assert_eq!(col, vec![2.0, 7.0, 12.0, 17.0]);
        println!("column 2 arrived in place: {col:?}");
    }
}
