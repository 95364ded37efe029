//! Attribute caching on communicators (MPI-1.2 §5.7), in rsmpi's shape: a library caches its
//! own data on a communicator it is handed, keyed by the data's type.
//!
//! Unlike rsmpi, attribute types must be `Send + Sync`: communicators are shared between
//! threads here. A value replaced by a later `set_attr` is kept (and dropped) with the
//! communicator, because `get_attr` may have handed out a reference to it through another
//! handle of the same communicator (every `world()` is one).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Mutex;

use crate::topology::Communicator;

/// Data a communicator can carry, one value per type (`MPI_Comm_create_keyval`: the type is
/// the key).
pub trait CommAttribute: 'static + Sized + Clone + Send + Sync {
    /// Whether a duplicate of the communicator gets a clone of the value (`MPI_Comm_dup`'s
    /// copy callback); by default it gets none.
    const CLONE_ON_DUP: bool = false;
}

/// A stored value, type-erased.
trait Value: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// A clone for a duplicate communicator, if the type asks for one.
    fn for_duplicate(&self) -> Option<Box<dyn Value>>;
}

impl<A: CommAttribute> Value for A {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn for_duplicate(&self) -> Option<Box<dyn Value>> {
        A::CLONE_ON_DUP.then(|| Box::new(self.clone()) as Box<dyn Value>)
    }
}

/// The attributes of one communicator.
#[derive(Default)]
pub(crate) struct Attributes {
    /// The current value of each type: an index into `values`.
    current: HashMap<TypeId, usize>,
    /// Every value ever set, boxed: never moved or dropped before the communicator, so
    /// references that `get_attr` handed out stay valid.
    values: Vec<Box<dyn Value>>,
}

impl Attributes {
    fn set(&mut self, id: TypeId, v: Box<dyn Value>) {
        self.values.push(v);
        self.current.insert(id, self.values.len() - 1);
    }

    /// The attributes a duplicate starts with.
    pub(crate) fn for_duplicate(&self) -> Attributes {
        let mut dup = Attributes::default();
        for (&id, &i) in &self.current {
            if let Some(v) = self.values[i].for_duplicate() {
                dup.set(id, v);
            }
        }
        dup
    }
}

fn lock(m: &Mutex<Attributes>) -> std::sync::MutexGuard<'_, Attributes> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Getting and setting attributes, on any communicator (`MPI_Comm_get_attr`,
/// `MPI_Comm_set_attr`).
pub trait AnyCommunicator {
    /// This communicator's value of type `A`, if one was set (here or, for a type that
    /// clones on duplication, on the communicator this one duplicates).
    fn get_attr<A: CommAttribute>(&self) -> Option<&A>;

    /// Sets this communicator's value of type `A`, replacing any earlier one.
    fn set_attr<A: CommAttribute>(&mut self, val: A);
}

impl<C: ?Sized + Communicator> AnyCommunicator for C {
    fn get_attr<A: CommAttribute>(&self) -> Option<&A> {
        let inner = &self.as_handle().0;
        let attrs = lock(&inner.attrs);
        let i = *attrs.current.get(&TypeId::of::<A>())?;
        let p: *const A = attrs.values[i].as_any().downcast_ref::<A>()?;
        drop(attrs);
        // SAFETY: the value is boxed in `values`, which only ever grows, so it is neither
        // moved nor dropped until the `CommInner` is; `self` holds an `Arc` to that
        // `CommInner` for at least the returned lifetime. `A: Sync`, so sharing it between
        // threads is sound.
        Some(unsafe { &*p })
    }

    fn set_attr<A: CommAttribute>(&mut self, val: A) {
        lock(&self.as_handle().0.attrs).set(TypeId::of::<A>(), Box::new(val));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Kept(i32);
    impl CommAttribute for Kept {
        const CLONE_ON_DUP: bool = true;
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Local(i32);
    impl CommAttribute for Local {}

    #[test]
    fn duplicates_get_clones_only_of_types_that_ask() {
        let mut a = Attributes::default();
        a.set(TypeId::of::<Kept>(), Box::new(Kept(1)));
        a.set(TypeId::of::<Local>(), Box::new(Local(2)));
        a.set(TypeId::of::<Kept>(), Box::new(Kept(3)));
        assert_eq!(a.values.len(), 3, "the replaced value is kept");
        let d = a.for_duplicate();
        assert_eq!(d.current.len(), 1);
        let i = d.current[&TypeId::of::<Kept>()];
        assert_eq!(d.values[i].as_any().downcast_ref::<Kept>(), Some(&Kept(3)));
    }
}
