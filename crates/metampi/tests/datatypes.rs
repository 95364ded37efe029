//! Derived datatypes at their edges: structs with no values at all (an empty struct, a
//! zero-length array) pack to nothing, unpack from nothing, and travel as empty messages
//! beside a struct that holds values. rsmpi's `struct` example does exactly this.

use metampi::traits::*;
use metampi_testkit::Ranks;

#[derive(Equivalence, Default, PartialEq, Debug)]
struct Empty;

#[derive(Equivalence, PartialEq, Debug)]
struct ZeroArray([i32; 0]);

#[derive(Equivalence, Default, PartialEq, Debug)]
struct Holder {
    before: u8,
    nothing: Empty,
    after: f64,
}

#[test]
fn structs_without_values_2() {
    Ranks::new(2).run("structs_without_values_2", |world| {
        let packed = world.pack(&ZeroArray([]));
        assert!(packed.is_empty(), "a zero-length array packs to nothing");
        let mut empty = Empty;
        // SAFETY: no bytes, no values.
        let at = unsafe { world.unpack_into(&packed, &mut empty, 0) };
        assert_eq!(at, 0);

        let holder = Holder {
            before: 7,
            nothing: Empty,
            after: 2.5,
        };
        let packed = world.pack(&holder);
        assert_eq!(
            packed.len(),
            9,
            "a u8 and an f64, the empty field adds nothing"
        );
        let mut back = Holder::default();
        // SAFETY: the bytes were packed from a `Holder`.
        unsafe { world.unpack_into(&packed, &mut back, 0) };
        assert_eq!(back, holder);

        let peer = world.process_at_rank(1 - world.rank());
        if world.rank() == 0 {
            peer.send(&Empty);
            peer.send(&holder);
        } else {
            let (got, status) = peer.receive::<Empty>();
            assert_eq!((got, status.count(u8::equivalent_datatype())), (Empty, 0));
            let (got, _) = peer.receive::<Holder>();
            assert_eq!(got, holder);
        }
    });
}
