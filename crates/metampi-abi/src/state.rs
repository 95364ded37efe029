//! The library's state as C sees it: whether MPI is initialized, and the
//! tables that turn integer handles into the engine's objects.
//!
//! A table lock is held only to look up, insert or remove; a call that
//! blocks holds its own reference (`Arc`) to what it works on, so threads
//! never wait on each other's table locks while communicating.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use metampi::environment::Universe;
use metampi::topology::{Communicator, Group, InterCommunicator, SimpleCommunicator};

use crate::consts::*;
use crate::err::{on_comm, Fail, HandlerFn, R};

// ---- initialization -------------------------------------------------------------

static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static FINALIZED: AtomicBool = AtomicBool::new(false);
pub static THREAD_LEVEL: AtomicI32 = AtomicI32::new(THREAD_SINGLE);
static MAIN_THREAD: OnceLock<std::thread::ThreadId> = OnceLock::new();

pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

pub fn finalized() -> bool {
    FINALIZED.load(Ordering::Acquire)
}

pub fn is_main_thread() -> bool {
    MAIN_THREAD.get() == Some(&std::thread::current().id())
}

/// Whether a session started the engine and the world model has not claimed it.
static BY_SESSION: AtomicBool = AtomicBool::new(false);

/// Starts the engine for `MPI_Session_init` unless it runs already.
pub fn init_for_session() -> R {
    if finalized() {
        return Err(Fail::new(
            ERR_OTHER,
            "MPI is finalized: metampi's engine starts once per process",
        ));
    }
    if !initialized() {
        init(THREAD_MULTIPLE)?;
        BY_SESSION.store(true, Ordering::Release);
    }
    Ok(())
}

/// Ends the engine when the last session ends, if sessions alone started it.
pub fn finalize_for_sessions() -> R {
    match BY_SESSION.swap(false, Ordering::AcqRel) {
        true => finalize(),
        false => Ok(()),
    }
}

/// Starts the engine (`MPI_Init`/`MPI_Init_thread`); returns the thread level provided.
pub fn init(required: c_int) -> R<c_int> {
    // The world model may start while sessions run: it takes over their engine.
    if initialized() && BY_SESSION.swap(false, Ordering::AcqRel) {
        return Ok(THREAD_LEVEL.load(Ordering::Acquire));
    }
    if initialized() || finalized() {
        return Err(Fail::new(
            ERR_OTHER,
            "MPI is already initialized (or finalized); it can start once per process",
        ));
    }
    let want = match required {
        THREAD_SINGLE => metampi::Threading::Single,
        THREAD_FUNNELED => metampi::Threading::Funneled,
        THREAD_SERIALIZED => metampi::Threading::Serialized,
        _ => metampi::Threading::Multiple,
    };
    let (u, got) = metampi::initialize_with_threading(want)
        .ok_or_else(|| Fail::new(ERR_OTHER, "the engine did not start"))?;
    let provided = match got {
        metampi::Threading::Single => THREAD_SINGLE,
        metampi::Threading::Funneled => THREAD_FUNNELED,
        metampi::Threading::Serialized => THREAD_SERIALIZED,
        metampi::Threading::Multiple => THREAD_MULTIPLE,
    };
    *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(u);
    let _ = MAIN_THREAD.set(std::thread::current().id());
    THREAD_LEVEL.store(provided, Ordering::Release);
    let world = CommEntry::new(SimpleCommunicator::world());
    let me = CommEntry::new(SimpleCommunicator::self_comm());
    let _ = PREDEFINED.set([world, me]);
    INITIALIZED.store(true, Ordering::Release);
    // A spawned process makes its parent intercommunicator now, while the parents make
    // theirs in MPI_Comm_spawn: `new_inter` is collective over both groups.
    if let Some(p) = SimpleCommunicator::world().parent() {
        PARENT.store(new_inter(p, ERRORS_ARE_FATAL), Ordering::Release);
    }
    Ok(provided)
}

/// The handle of the intercommunicator to the parents (`MPI_Comm_get_parent`):
/// `MPI_COMM_NULL` where this process was not spawned or has freed it.
static PARENT: AtomicHandle = AtomicHandle::new(COMM_NULL);

pub fn parent() -> Handle {
    PARENT.load(Ordering::Acquire)
}

/// Forgets the parent handle when `h` is it (freed or disconnected): MPI_Comm_get_parent
/// answers `MPI_COMM_NULL` from then on.
pub fn forget_parent(h: Handle) {
    let _ = PARENT.compare_exchange(h, COMM_NULL, Ordering::AcqRel, Ordering::Acquire);
}

/// The processes the job may grow to (`MPI_UNIVERSE_SIZE`, see `Universe::size`).
pub fn universe_size() -> c_int {
    UNIVERSE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(Universe::size)
        .map_or(1, |n| n.min(c_int::MAX as usize) as c_int)
}

/// This process's program among those started together (`MPI_APPNUM`): its index in
/// the launcher's command line or in the parents' `MPI_Comm_spawn_multiple`.
pub fn appnum() -> c_int {
    UNIVERSE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(Universe::appnum)
        .map_or(0, |n| n as c_int)
}

/// Ends the engine (`MPI_Finalize`): the universe's drop synchronizes the job.
pub fn finalize() -> R {
    check_init()?;
    // Windows the program left open: their agent threads end before the engine does.
    crate::win::free_all();
    crate::attr::delete_all(COMM_SELF);
    // Requests the program freed while in flight still complete before the engine ends.
    crate::req::drain_freed();
    let u = UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take();
    FINALIZED.store(true, Ordering::Release);
    drop(u);
    Ok(())
}

/// Refuses calls before `MPI_Init` and after `MPI_Finalize`.
#[inline]
pub fn check_init() -> R {
    if !INITIALIZED.load(Ordering::Relaxed) {
        return Err(Fail::new(
            ERR_OTHER,
            "MPI is not initialized: call MPI_Init first",
        ));
    }
    if FINALIZED.load(Ordering::Relaxed) {
        return Err(Fail::new(ERR_OTHER, "MPI is finalized"));
    }
    Ok(())
}

/// Ends the whole job with `code`.
pub fn abort_job(code: c_int) -> ! {
    if initialized() && !finalized() {
        SimpleCommunicator::world().abort(code)
    }
    eprintln!("metampi: MPI_Abort called with error code {code}");
    std::process::exit(code.clamp(1, 255))
}

// ---- generic handle tables -------------------------------------------------------

/// Objects of one kind behind handles `base | index`.
pub struct Table<T> {
    base: u32,
    slots: RwLock<(Vec<Option<T>>, Vec<usize>)>,
}

impl<T: Clone> Table<T> {
    pub const fn new(base: u32) -> Table<T> {
        Table {
            base,
            slots: RwLock::new((Vec::new(), Vec::new())),
        }
    }

    fn index(&self, h: Handle) -> Option<usize> {
        let h = h as u32;
        (h & !INDEX_MASK == self.base).then_some((h & INDEX_MASK) as usize)
    }

    pub fn insert(&self, v: T) -> Handle {
        let mut g = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let (slots, free) = &mut *g;
        let i = match free.pop() {
            Some(i) => {
                slots[i] = Some(v);
                i
            }
            None => {
                slots.push(Some(v));
                slots.len() - 1
            }
        };
        (self.base | i as u32) as Handle
    }

    pub fn get(&self, h: Handle) -> Option<T> {
        let i = self.index(h)?;
        let g = self.slots.read().unwrap_or_else(|p| p.into_inner());
        g.0.get(i).and_then(|s| s.clone())
    }

    /// Replaces the object behind `h`; false when `h` names none.
    pub fn set(&self, h: Handle, v: T) -> bool {
        let Some(i) = self.index(h) else {
            return false;
        };
        let mut g = self.slots.write().unwrap_or_else(|p| p.into_inner());
        match g.0.get_mut(i) {
            Some(s @ Some(_)) => {
                *s = Some(v);
                true
            }
            _ => false,
        }
    }

    pub fn remove(&self, h: Handle) -> Option<T> {
        let i = self.index(h)?;
        let mut g = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let v = g.0.get_mut(i)?.take();
        if v.is_some() {
            g.1.push(i);
        }
        v
    }
}

// ---- communicators ---------------------------------------------------------------

/// A process topology attached to a communicator (MPI-4 §8).
#[derive(Clone, Debug, Default)]
pub enum Topo {
    #[default]
    None,
    Cart {
        dims: Vec<c_int>,
        periods: Vec<bool>,
    },
    Graph {
        index: Vec<c_int>,
        edges: Vec<c_int>,
    },
    DistGraph {
        sources: Vec<c_int>,
        sweights: Vec<c_int>,
        dests: Vec<c_int>,
        dweights: Vec<c_int>,
        weighted: bool,
    },
}

/// A communicator and what C attaches to it.
pub struct CommEntry {
    /// For an intercommunicator, the same communicator as a simple handle (point-to-point).
    pub comm: SimpleCommunicator,
    /// The intercommunicator, where this is one (duplicate, split, merge, remote group).
    pub inter: Option<InterCommunicator>,
    pub errh: AtomicHandle,
    pub attrs: Mutex<Vec<(c_int, isize)>>,
    pub topo: Mutex<Topo>,
    /// A private duplicate for neighbourhood collectives, made when a topology is
    /// attached (a collective moment): their messages never meet the program's.
    pub neigh: OnceLock<SimpleCommunicator>,
}

impl CommEntry {
    pub fn new(comm: SimpleCommunicator) -> CommEntry {
        CommEntry {
            comm,
            inter: None,
            errh: AtomicHandle::new(ERRORS_ARE_FATAL),
            attrs: Mutex::new(Vec::new()),
            topo: Mutex::new(Topo::None),
            neigh: OnceLock::new(),
        }
    }

    /// Attaches `topo`; every member of the communicator calls this at the same
    /// point (it duplicates the communicator for the neighbourhood collectives).
    pub fn set_topo(&self, topo: Topo) {
        if !matches!(topo, Topo::None) && self.neigh.get().is_none() {
            let _ = self.neigh.set(self.comm.duplicate());
        }
        *self.topo.lock().unwrap_or_else(|p| p.into_inner()) = topo;
    }

    pub fn topo(&self) -> Topo {
        self.topo.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A communicator as a call holds it: the predefined ones by reference (no
/// reference count to touch on every call), the others shared.
#[derive(Clone)]
pub enum CommRef {
    Static(&'static CommEntry),
    Shared(Arc<CommEntry>),
}

impl std::ops::Deref for CommRef {
    type Target = CommEntry;
    #[inline]
    fn deref(&self) -> &CommEntry {
        match self {
            CommRef::Static(e) => e,
            CommRef::Shared(e) => e,
        }
    }
}

static PREDEFINED: OnceLock<[CommEntry; 2]> = OnceLock::new();
pub static COMMS: Table<Arc<CommEntry>> = Table::new(COMM_BASE);

/// The communicator behind handle `h`; it becomes the one whose error handler
/// a failure of the running call invokes.
#[inline]
pub fn comm(h: Handle) -> R<CommRef> {
    check_init()?;
    let e = match h {
        COMM_WORLD | COMM_SELF => PREDEFINED
            .get()
            .map(|p| CommRef::Static(&p[(h == COMM_SELF) as usize])),
        COMM_NULL => None,
        _ => COMMS.get(h).map(CommRef::Shared),
    };
    match e {
        Some(e) => {
            if h != COMM_WORLD {
                on_comm(h);
            }
            Ok(e)
        }
        None => Err(Fail::new(
            ERR_COMM,
            format!("{h:#x} is not a communicator (freed, or never made)"),
        )),
    }
}

/// A new handle for intercommunicator `c`, with `errh` as its error handler.
pub fn new_inter(c: InterCommunicator, errh: Handle) -> Handle {
    let mut e = CommEntry::new(c.__as_simple());
    // Every member of both groups makes it here together: the moment for the private
    // duplicate that collectives on it use (`inter.rs`).
    let _ = e.neigh.set(c.duplicate().__as_simple());
    e.inter = Some(c);
    e.errh.store(errh, Ordering::Relaxed);
    COMMS.insert(Arc::new(e))
}

/// The communicator behind handle `h` if it is an intercommunicator (collectives on
/// one run in `inter.rs`).
pub fn as_inter(h: Handle) -> R<Option<CommRef>> {
    let c = comm(h)?;
    Ok(c.inter.is_some().then_some(c))
}

/// The intracommunicator behind handle `h`: collectives and topologies refuse an
/// intercommunicator (on every member, so no member waits for the others).
#[inline]
pub fn intra(h: Handle) -> R<CommRef> {
    let c = comm(h)?;
    if c.inter.is_some() {
        return Err(Fail::new(
            ERR_COMM,
            "this is an intercommunicator: metampi runs collectives on intracommunicators \
             only (MPI_Intercomm_merge makes one)",
        ));
    }
    Ok(c)
}

/// A new handle for communicator `c`, with `errh` as its error handler.
pub fn new_comm(c: SimpleCommunicator, errh: Handle) -> Handle {
    let e = CommEntry::new(c);
    e.errh.store(errh, Ordering::Relaxed);
    COMMS.insert(Arc::new(e))
}

// ---- error handlers --------------------------------------------------------------

/// What an error handler does.
#[derive(Clone, Copy)]
pub enum Handler {
    Fatal,
    Return,
    User(HandlerFn),
}

pub static ERRHANDLERS: Table<HandlerFn> = Table::new(ERRHANDLER_BASE);

pub fn handler(h: Handle) -> Option<Handler> {
    match h {
        ERRORS_ARE_FATAL | ERRORS_ABORT => Some(Handler::Fatal),
        ERRORS_RETURN => Some(Handler::Return),
        _ => ERRHANDLERS.get(h).map(Handler::User),
    }
}

/// The handler of communicator `comm` (MPI_COMM_WORLD's where it names none:
/// errors before init or on freed handles are fatal, as in MPICH).
pub fn errhandler_of(comm: Handle) -> Handler {
    if let Some(h) = crate::session::errhandler_of(comm) {
        return handler(h).unwrap_or(Handler::Fatal);
    }
    let h = match comm {
        COMM_WORLD | COMM_SELF => PREDEFINED
            .get()
            .map(|p| p[(comm == COMM_SELF) as usize].errh.load(Ordering::Relaxed)),
        _ => COMMS
            .get(comm)
            .map(|e| e.errh.load(Ordering::Relaxed))
            .or_else(|| PREDEFINED.get().map(|p| p[0].errh.load(Ordering::Relaxed))),
    };
    h.and_then(handler).unwrap_or(Handler::Fatal)
}

// ---- groups ----------------------------------------------------------------------

/// A group: world ranks in group order.
#[derive(Clone, Debug)]
pub struct WGroup(pub Arc<Vec<u32>>);

impl Group for WGroup {
    fn world_ranks(&self) -> &[u32] {
        &self.0
    }
}

pub static GROUPS: Table<WGroup> = Table::new(GROUP_BASE);

pub fn group(h: Handle) -> R<WGroup> {
    match h {
        GROUP_EMPTY => Ok(WGroup(Arc::new(Vec::new()))),
        _ => GROUPS
            .get(h)
            .ok_or_else(|| Fail::new(ERR_GROUP, format!("{h:#x} is not a group"))),
    }
}

pub fn new_group(ranks: Vec<u32>) -> Handle {
    if ranks.is_empty() {
        return GROUP_EMPTY;
    }
    GROUPS.insert(WGroup(Arc::new(ranks)))
}

/// This process's world rank.
pub fn my_world_rank() -> u32 {
    SimpleCommunicator::world().rank() as u32
}
