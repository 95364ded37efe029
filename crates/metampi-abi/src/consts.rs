//! The numbers of the two ABIs this crate is built for: MPICH 4's `mpi.h`
//! (`libmpi.so.12`) and the MPI-5 standard ABI's `mpi.h` (`libmpi_abi.so.1`,
//! built with `cfg(std_abi)`). A program compiled against either carries these
//! values in its code, so they must match to the bit. The rest of the crate
//! names them and never their values, so one implementation serves both.

#![allow(missing_docs)]

#[cfg(not(std_abi))]
pub use mpich::*;
#[cfg(std_abi)]
pub use standard::*;

use std::ffi::c_int;

// Values the two ABIs share.
pub const UNDEFINED: c_int = -32766;
pub const TAG_UB_VALUE: c_int = 0x7fff_ffff;
/// metampi's own split type: the ranks of one meta host (site).
pub const COMM_TYPE_METAMPI_SITE: c_int = 0x4d50;
pub const MAX_ERROR_STRING: usize = 512;
pub const MAX_OBJECT_NAME: usize = 128;
pub const MAX_INFO_VAL: usize = 1024;
pub const MAX_LIBRARY_VERSION_STRING: usize = 8192;
pub const VERSION: c_int = 4;
pub const SUBVERSION: c_int = 0;
/// The largest error code `MPI_Error_class` accepts: codes carry a message slot above the class.
pub const ERR_LASTCODE: c_int = 0x3fff_ffff;
// Bases of the handles this library makes (the kind bits MPICH uses for
// objects it allocates, with the object type in bits 26..29). Above every
// predefined handle of either ABI.
pub const COMM_BASE: u32 = 0x8400_0000;
pub const GROUP_BASE: u32 = 0x8800_0000;
pub const DATATYPE_BASE: u32 = 0x8c80_0000;
pub const ERRHANDLER_BASE: u32 = 0x9400_0000;
pub const OP_BASE: u32 = 0x9800_0000;
pub const INFO_BASE: u32 = 0x9c00_0000;
pub const KEYVAL_BASE: u32 = 0xa400_0000;
pub const REQUEST_BASE: u32 = 0xac00_0000;
pub const MESSAGE_BASE: u32 = 0xac80_0000;
pub const SESSION_BASE: u32 = 0xb800_0000;
/// Open files (`MPI_File`, pointer-sized in both ABIs; ours are `FILE_BASE | index`).
pub const FILE_BASE: u32 = 0x9000_0000;
/// Windows (`MPI_Win`, MPI-4 §12): MPICH's object type 8 for windows, allocated kind.
pub const WIN_BASE: u32 = 0xa000_0000;
pub const MAX_DATAREP_STRING: usize = 128;
/// Handles of one kind: base | index below this bound.
pub const INDEX_MASK: u32 = 0x007f_ffff;

/// MPICH 4's numbers.
#[cfg(not(std_abi))]
mod mpich {
    use std::ffi::c_int;

    /// A handle: an `int` in MPICH's ABI.
    pub type Handle = c_int;
    /// A handle that threads share.
    pub type AtomicHandle = std::sync::atomic::AtomicI32;

    // Null handles.
    pub const COMM_NULL: Handle = 0x0400_0000;
    pub const OP_NULL: Handle = 0x1800_0000;
    pub const GROUP_NULL: Handle = 0x0800_0000;
    pub const DATATYPE_NULL: Handle = 0x0c00_0000;
    /// `MPI_BYTE` (the library packs through it).
    pub const DATATYPE_BYTE: Handle = 0x4c00_010d;
    pub const REQUEST_NULL: Handle = 0x2c00_0000;
    pub const ERRHANDLER_NULL: Handle = 0x1400_0000;
    pub const MESSAGE_NULL: Handle = 0x2c00_0000;
    pub const MESSAGE_NO_PROC: Handle = 0x6c00_0000;
    pub const INFO_NULL: Handle = 0x1c00_0000;
    pub const INFO_ENV: Handle = 0x5c00_0001;
    pub const WIN_NULL: Handle = 0x2000_0000;
    pub const SESSION_NULL: Handle = 0x3800_0000;
    pub const KEYVAL_INVALID: c_int = 0x2400_0000;

    // Predefined objects.
    pub const COMM_WORLD: Handle = 0x4400_0000;
    pub const COMM_SELF: Handle = 0x4400_0001;
    pub const GROUP_EMPTY: Handle = 0x4800_0000;
    pub const ERRORS_ARE_FATAL: Handle = 0x5400_0000;
    pub const ERRORS_RETURN: Handle = 0x5400_0001;
    pub const ERRORS_ABORT: Handle = 0x5400_0003;

    // Predefined operations.
    pub const OP_MAX: Handle = 0x5800_0001;
    pub const OP_MIN: Handle = 0x5800_0002;
    pub const OP_SUM: Handle = 0x5800_0003;
    pub const OP_PROD: Handle = 0x5800_0004;
    pub const OP_LAND: Handle = 0x5800_0005;
    pub const OP_BAND: Handle = 0x5800_0006;
    pub const OP_LOR: Handle = 0x5800_0007;
    pub const OP_BOR: Handle = 0x5800_0008;
    pub const OP_LXOR: Handle = 0x5800_0009;
    pub const OP_BXOR: Handle = 0x5800_000a;
    pub const OP_MINLOC: Handle = 0x5800_000b;
    pub const OP_MAXLOC: Handle = 0x5800_000c;
    pub const OP_REPLACE: Handle = 0x5800_000d;
    pub const OP_NO_OP: Handle = 0x5800_000e;

    // Wildcards and special values.
    pub const ANY_SOURCE: c_int = -2;
    pub const ANY_TAG: c_int = -1;
    pub const PROC_NULL: c_int = -1;
    pub const ROOT: c_int = -3;
    /// `MPI_TYPECLASS_*` (`MPI_Type_match_size`).
    pub const TYPECLASS_REAL: c_int = 1;
    pub const TYPECLASS_INTEGER: c_int = 2;
    pub const TYPECLASS_COMPLEX: c_int = 3;

    // Attribute keys of communicators.
    pub const TAG_UB: c_int = 0x6440_0001;
    pub const HOST: c_int = 0x6440_0003;
    pub const IO: c_int = 0x6440_0005;
    pub const WTIME_IS_GLOBAL: c_int = 0x6440_0007;
    pub const UNIVERSE_SIZE: c_int = 0x6440_0009;
    pub const LASTUSEDCODE: c_int = 0x6440_000b;
    pub const APPNUM: c_int = 0x6440_000d;

    // Comparisons.
    pub const IDENT: c_int = 0;
    pub const CONGRUENT: c_int = 1;
    pub const SIMILAR: c_int = 2;
    pub const UNEQUAL: c_int = 3;

    // Thread levels.
    pub const THREAD_SINGLE: c_int = 0;
    pub const THREAD_FUNNELED: c_int = 1;
    pub const THREAD_SERIALIZED: c_int = 2;
    pub const THREAD_MULTIPLE: c_int = 3;

    // Topologies.
    pub const GRAPH: c_int = 1;
    pub const CART: c_int = 2;
    pub const DIST_GRAPH: c_int = 3;

    // MPI_Comm_split_type.
    pub const COMM_TYPE_SHARED: c_int = 1;
    pub const COMM_TYPE_HW_GUIDED: c_int = 2;
    pub const COMM_TYPE_HW_UNGUIDED: c_int = 3;

    // Datatype combiners.
    pub const COMBINER_NAMED: c_int = 1;
    pub const COMBINER_DUP: c_int = 2;
    pub const COMBINER_CONTIGUOUS: c_int = 3;
    pub const COMBINER_VECTOR: c_int = 4;
    pub const COMBINER_HVECTOR: c_int = 6;
    pub const COMBINER_INDEXED: c_int = 7;
    pub const COMBINER_HINDEXED: c_int = 9;
    pub const COMBINER_INDEXED_BLOCK: c_int = 10;
    pub const COMBINER_STRUCT: c_int = 12;
    pub const COMBINER_SUBARRAY: c_int = 13;
    pub const COMBINER_DARRAY: c_int = 14;
    pub const DISTRIBUTE_BLOCK: c_int = 121;
    pub const DISTRIBUTE_CYCLIC: c_int = 122;
    pub const DISTRIBUTE_NONE: c_int = 123;
    pub const DISTRIBUTE_DFLT_DARG: c_int = -49767;
    pub const COMBINER_F90_REAL: c_int = 15;
    pub const COMBINER_F90_COMPLEX: c_int = 16;
    pub const COMBINER_F90_INTEGER: c_int = 17;
    pub const COMBINER_RESIZED: c_int = 18;
    pub const COMBINER_HINDEXED_BLOCK: c_int = 19;

    pub const ORDER_C: c_int = 56;
    pub const ORDER_FORTRAN: c_int = 57;

    // Limits.
    pub const MAX_PROCESSOR_NAME: usize = 128;
    pub const MAX_INFO_KEY: usize = 255;
    pub const BSEND_OVERHEAD: c_int = 96;

    // Error classes.
    pub const SUCCESS: c_int = 0;
    pub const ERR_BUFFER: c_int = 1;
    pub const ERR_COUNT: c_int = 2;
    pub const ERR_TYPE: c_int = 3;
    pub const ERR_TAG: c_int = 4;
    pub const ERR_COMM: c_int = 5;
    pub const ERR_RANK: c_int = 6;
    pub const ERR_ROOT: c_int = 7;
    pub const ERR_GROUP: c_int = 8;
    pub const ERR_OP: c_int = 9;
    pub const ERR_TOPOLOGY: c_int = 10;
    pub const ERR_DIMS: c_int = 11;
    pub const ERR_ARG: c_int = 12;
    pub const ERR_UNKNOWN: c_int = 13;
    pub const ERR_TRUNCATE: c_int = 14;
    pub const ERR_OTHER: c_int = 15;
    pub const ERR_INTERN: c_int = 16;
    pub const ERR_IN_STATUS: c_int = 17;
    pub const ERR_PENDING: c_int = 18;
    pub const ERR_REQUEST: c_int = 19;
    pub const ERR_INFO_KEY: c_int = 29;
    pub const ERR_INFO_VALUE: c_int = 30;
    pub const ERR_INFO_NOKEY: c_int = 31;
    pub const ERR_NO_MEM: c_int = 34;
    pub const ERR_SPAWN: c_int = 42;
    pub const ERR_NAME: c_int = 33;
    pub const ERR_PORT: c_int = 38;
    pub const ERR_SERVICE: c_int = 41;
    pub const ERR_UNSUPPORTED_OPERATION: c_int = 44;
    pub const ERR_KEYVAL: c_int = 48;
    pub const ERR_SIZE: c_int = 51;
    pub const ERR_PROC_ABORTED: c_int = 76;
    pub const ERR_SESSION: c_int = 75;
    // The tool interface (MPI_T): its error codes, verbosities, binding, scope, classes.
    pub const T_ERR_NOT_INITIALIZED: c_int = 60;
    pub const T_ERR_INVALID_INDEX: c_int = 62;
    pub const T_ERR_INVALID_HANDLE: c_int = 64;
    pub const T_ERR_INVALID_SESSION: c_int = 67;
    pub const T_ERR_CVAR_SET_NEVER: c_int = 69;
    pub const T_ERR_PVAR_NO_STARTSTOP: c_int = 70;
    pub const T_ERR_PVAR_NO_WRITE: c_int = 71;
    pub const T_ERR_INVALID_NAME: c_int = 73;
    pub const T_ERR_INVALID: c_int = 74;
    pub const T_VERBOSITY_USER_DETAIL: c_int = 222;
    pub const T_VERBOSITY_TUNER_BASIC: c_int = 224;
    pub const T_VERBOSITY_TUNER_DETAIL: c_int = 225;
    pub const T_BIND_NO_OBJECT: c_int = 9700;
    pub const T_SCOPE_READONLY: c_int = 60439;
    pub const T_PVAR_CLASS_COUNTER: c_int = 246;
    pub const T_SOURCE_ORDERED: c_int = 0;
    /// The last predefined class; user classes (`MPI_Add_error_class`) follow.
    pub const LAST_PREDEFINED_CLASS: c_int = 78;

    // MPI-IO (MPICH's `mpio.h`).
    /// `MPI_File`: a pointer in MPICH's ABI.
    pub type FileHandle = usize;
    pub const FILE_NULL: FileHandle = 0;
    pub const MODE_CREATE: c_int = 1;
    pub const MODE_RDONLY: c_int = 2;
    pub const MODE_WRONLY: c_int = 4;
    pub const MODE_RDWR: c_int = 8;
    pub const MODE_DELETE_ON_CLOSE: c_int = 16;
    pub const MODE_UNIQUE_OPEN: c_int = 32;
    pub const MODE_EXCL: c_int = 64;
    pub const MODE_APPEND: c_int = 128;
    pub const MODE_SEQUENTIAL: c_int = 256;
    pub const SEEK_SET: c_int = 600;
    pub const SEEK_CUR: c_int = 602;
    pub const SEEK_END: c_int = 604;
    pub const DISPLACEMENT_CURRENT: i64 = -54278278;
    pub const ERR_ACCESS: c_int = 20;
    pub const ERR_AMODE: c_int = 21;
    pub const ERR_BAD_FILE: c_int = 22;
    pub const ERR_CONVERSION: c_int = 23;
    pub const ERR_DUP_DATAREP: c_int = 24;
    pub const ERR_FILE_EXISTS: c_int = 25;
    pub const ERR_FILE_IN_USE: c_int = 26;
    pub const ERR_FILE: c_int = 27;
    pub const ERR_IO: c_int = 32;
    pub const ERR_NOT_SAME: c_int = 35;
    pub const ERR_NO_SPACE: c_int = 36;
    pub const ERR_NO_SUCH_FILE: c_int = 37;
    pub const ERR_QUOTA: c_int = 39;
    pub const ERR_READ_ONLY: c_int = 40;
    pub const ERR_UNSUPPORTED_DATAREP: c_int = 43;

    // One-sided communication (MPI-4 §12).
    pub const WIN_BASE_KEY: c_int = 0x6600_0001;
    pub const WIN_SIZE_KEY: c_int = 0x6600_0003;
    pub const WIN_DISP_UNIT_KEY: c_int = 0x6600_0005;
    pub const WIN_CREATE_FLAVOR_KEY: c_int = 0x6600_0007;
    pub const WIN_MODEL_KEY: c_int = 0x6600_0009;
    pub const WIN_FLAVOR_CREATE: c_int = 1;
    pub const WIN_FLAVOR_ALLOCATE: c_int = 2;
    pub const WIN_FLAVOR_DYNAMIC: c_int = 3;
    pub const WIN_FLAVOR_SHARED: c_int = 4;
    pub const WIN_SEPARATE: c_int = 1;
    pub const WIN_UNIFIED: c_int = 2;
    pub const LOCK_EXCLUSIVE: c_int = 234;
    pub const LOCK_SHARED: c_int = 235;
    pub const MODE_NOCHECK: c_int = 1024;
    pub const MODE_NOSTORE: c_int = 2048;
    pub const MODE_NOPUT: c_int = 4096;
    pub const MODE_NOPRECEDE: c_int = 8192;
    pub const MODE_NOSUCCEED: c_int = 16384;
    pub const ERR_WIN: c_int = 45;
    pub const ERR_BASE: c_int = 46;
    pub const ERR_LOCKTYPE: c_int = 47;
    pub const ERR_RMA_CONFLICT: c_int = 49;
    pub const ERR_RMA_SYNC: c_int = 50;
    pub const ERR_DISP: c_int = 52;
    pub const ERR_ASSERT: c_int = 53;
    pub const ERR_RMA_RANGE: c_int = 55;
    pub const ERR_RMA_ATTACH: c_int = 56;
    pub const ERR_RMA_SHARED: c_int = 57;
    pub const ERR_RMA_FLAVOR: c_int = 58;

    /// `MPI_STATUS_IGNORE` and `MPI_STATUSES_IGNORE`: the address 1.
    pub const STATUS_IGNORE: usize = 1;
    /// `MPI_IN_PLACE`: the address -1.
    pub const IN_PLACE: usize = usize::MAX;
}

/// The MPI-5 standard ABI's numbers (MPI-5.0 chapter 20 and its `mpi.h`).
#[cfg(std_abi)]
mod standard {
    use std::ffi::c_int;

    /// A handle: pointer-sized in the standard ABI (small predefined values, else ours).
    pub type Handle = usize;
    /// A handle that threads share.
    pub type AtomicHandle = std::sync::atomic::AtomicUsize;

    // Null handles.
    pub const OP_NULL: Handle = 0x20;
    pub const COMM_NULL: Handle = 0x100;
    pub const GROUP_NULL: Handle = 0x108;
    pub const WIN_NULL: Handle = 0x110;
    pub const SESSION_NULL: Handle = 0x120;
    pub const MESSAGE_NULL: Handle = 0x128;
    pub const MESSAGE_NO_PROC: Handle = 0x129;
    pub const INFO_NULL: Handle = 0x130;
    pub const INFO_ENV: Handle = 0x131;
    pub const ERRHANDLER_NULL: Handle = 0x140;
    pub const REQUEST_NULL: Handle = 0x180;
    pub const DATATYPE_NULL: Handle = 0x200;
    /// `MPI_BYTE` (the library packs through it).
    pub const DATATYPE_BYTE: Handle = 0x247;
    pub const KEYVAL_INVALID: c_int = 0;

    // Predefined objects.
    pub const COMM_WORLD: Handle = 0x101;
    pub const COMM_SELF: Handle = 0x102;
    pub const GROUP_EMPTY: Handle = 0x109;
    pub const ERRORS_ARE_FATAL: Handle = 0x141;
    pub const ERRORS_ABORT: Handle = 0x142;
    pub const ERRORS_RETURN: Handle = 0x143;

    // Predefined operations.
    pub const OP_SUM: Handle = 0x21;
    pub const OP_MIN: Handle = 0x22;
    pub const OP_MAX: Handle = 0x23;
    pub const OP_PROD: Handle = 0x24;
    pub const OP_BAND: Handle = 0x28;
    pub const OP_BOR: Handle = 0x29;
    pub const OP_BXOR: Handle = 0x2a;
    pub const OP_LAND: Handle = 0x30;
    pub const OP_LOR: Handle = 0x31;
    pub const OP_LXOR: Handle = 0x32;
    pub const OP_MINLOC: Handle = 0x38;
    pub const OP_MAXLOC: Handle = 0x39;
    pub const OP_REPLACE: Handle = 0x3c;
    pub const OP_NO_OP: Handle = 0x3d;

    // Wildcards and special values.
    pub const ANY_SOURCE: c_int = -1;
    pub const ANY_TAG: c_int = -2;
    pub const PROC_NULL: c_int = -3;
    pub const ROOT: c_int = -4;
    pub const TYPECLASS_INTEGER: c_int = 192;
    pub const TYPECLASS_REAL: c_int = 193;
    pub const TYPECLASS_COMPLEX: c_int = 194;

    // Attribute keys of communicators.
    pub const TAG_UB: c_int = 501;
    pub const IO: c_int = 502;
    pub const HOST: c_int = 503;
    pub const WTIME_IS_GLOBAL: c_int = 504;
    pub const APPNUM: c_int = 505;
    pub const LASTUSEDCODE: c_int = 506;
    pub const UNIVERSE_SIZE: c_int = 507;

    // Comparisons.
    pub const IDENT: c_int = 201;
    pub const CONGRUENT: c_int = 202;
    pub const SIMILAR: c_int = 203;
    pub const UNEQUAL: c_int = 204;

    // Thread levels.
    pub const THREAD_SINGLE: c_int = 0;
    pub const THREAD_FUNNELED: c_int = 1024;
    pub const THREAD_SERIALIZED: c_int = 2048;
    pub const THREAD_MULTIPLE: c_int = 4096;

    // Topologies.
    pub const CART: c_int = 211;
    pub const GRAPH: c_int = 212;
    pub const DIST_GRAPH: c_int = 213;

    // MPI_Comm_split_type.
    pub const COMM_TYPE_SHARED: c_int = 221;
    pub const COMM_TYPE_HW_UNGUIDED: c_int = 222;
    pub const COMM_TYPE_HW_GUIDED: c_int = 223;

    // Datatype combiners.
    pub const COMBINER_NAMED: c_int = 101;
    pub const COMBINER_DUP: c_int = 102;
    pub const COMBINER_CONTIGUOUS: c_int = 103;
    pub const COMBINER_VECTOR: c_int = 104;
    pub const COMBINER_HVECTOR: c_int = 105;
    pub const COMBINER_INDEXED: c_int = 106;
    pub const COMBINER_HINDEXED: c_int = 107;
    pub const COMBINER_INDEXED_BLOCK: c_int = 108;
    pub const COMBINER_HINDEXED_BLOCK: c_int = 109;
    pub const COMBINER_STRUCT: c_int = 110;
    pub const COMBINER_SUBARRAY: c_int = 111;
    pub const COMBINER_DARRAY: c_int = 112;
    pub const DISTRIBUTE_NONE: c_int = 16;
    pub const DISTRIBUTE_BLOCK: c_int = 17;
    pub const DISTRIBUTE_CYCLIC: c_int = 18;
    pub const DISTRIBUTE_DFLT_DARG: c_int = 19;
    pub const COMBINER_F90_REAL: c_int = 113;
    pub const COMBINER_F90_COMPLEX: c_int = 114;
    pub const COMBINER_F90_INTEGER: c_int = 115;
    pub const COMBINER_RESIZED: c_int = 116;

    pub const ORDER_C: c_int = 12;
    pub const ORDER_FORTRAN: c_int = 15;

    // Limits.
    pub const MAX_PROCESSOR_NAME: usize = 256;
    pub const MAX_INFO_KEY: usize = 256;
    pub const BSEND_OVERHEAD: c_int = 512;

    // Error classes.
    pub const SUCCESS: c_int = 0;
    pub const ERR_BUFFER: c_int = 1;
    pub const ERR_COUNT: c_int = 2;
    pub const ERR_TYPE: c_int = 3;
    pub const ERR_TAG: c_int = 4;
    pub const ERR_COMM: c_int = 5;
    pub const ERR_RANK: c_int = 6;
    pub const ERR_REQUEST: c_int = 7;
    pub const ERR_ROOT: c_int = 8;
    pub const ERR_GROUP: c_int = 9;
    pub const ERR_OP: c_int = 10;
    pub const ERR_TOPOLOGY: c_int = 11;
    pub const ERR_DIMS: c_int = 12;
    pub const ERR_ARG: c_int = 13;
    pub const ERR_UNKNOWN: c_int = 14;
    pub const ERR_TRUNCATE: c_int = 15;
    pub const ERR_OTHER: c_int = 16;
    pub const ERR_INTERN: c_int = 17;
    pub const ERR_PENDING: c_int = 18;
    pub const ERR_IN_STATUS: c_int = 19;
    pub const ERR_INFO_KEY: c_int = 31;
    pub const ERR_INFO_NOKEY: c_int = 32;
    pub const ERR_INFO_VALUE: c_int = 33;
    pub const ERR_KEYVAL: c_int = 36;
    pub const ERR_NO_MEM: c_int = 39;
    pub const ERR_SIZE: c_int = 52;
    pub const ERR_SPAWN: c_int = 53;
    pub const ERR_NAME: c_int = 38;
    pub const ERR_PORT: c_int = 43;
    pub const ERR_SERVICE: c_int = 51;
    pub const ERR_UNSUPPORTED_OPERATION: c_int = 55;
    pub const ERR_PROC_ABORTED: c_int = 58;
    pub const ERR_SESSION: c_int = 60;
    // The tool interface (MPI_T): its error codes, verbosities, binding, scope, classes.
    pub const T_ERR_NOT_INITIALIZED: c_int = 1003;
    pub const T_ERR_INVALID_INDEX: c_int = 1007;
    pub const T_ERR_INVALID_HANDLE: c_int = 1010;
    pub const T_ERR_INVALID_SESSION: c_int = 1009;
    pub const T_ERR_CVAR_SET_NEVER: c_int = 1015;
    pub const T_ERR_PVAR_NO_STARTSTOP: c_int = 1017;
    pub const T_ERR_PVAR_NO_WRITE: c_int = 1016;
    pub const T_ERR_INVALID_NAME: c_int = 1011;
    pub const T_ERR_INVALID: c_int = 1006;
    pub const T_VERBOSITY_USER_DETAIL: c_int = 0x0a;
    pub const T_VERBOSITY_TUNER_BASIC: c_int = 0x11;
    pub const T_VERBOSITY_TUNER_DETAIL: c_int = 0x12;
    pub const T_BIND_NO_OBJECT: c_int = 1;
    pub const T_SCOPE_READONLY: c_int = 2;
    pub const T_PVAR_CLASS_COUNTER: c_int = 7;
    pub const T_SOURCE_ORDERED: c_int = 1;
    /// The last predefined class (`MPI_ERR_ABI`); user classes (`MPI_Add_error_class`) follow.
    pub const LAST_PREDEFINED_CLASS: c_int = 62;

    // MPI-IO.
    /// `MPI_File`: pointer-sized, as every handle of this ABI.
    pub type FileHandle = usize;
    pub const FILE_NULL: FileHandle = 0x118;
    pub const MODE_APPEND: c_int = 1;
    pub const MODE_CREATE: c_int = 2;
    pub const MODE_DELETE_ON_CLOSE: c_int = 4;
    pub const MODE_EXCL: c_int = 8;
    pub const MODE_RDONLY: c_int = 16;
    pub const MODE_RDWR: c_int = 32;
    pub const MODE_SEQUENTIAL: c_int = 64;
    pub const MODE_UNIQUE_OPEN: c_int = 128;
    pub const MODE_WRONLY: c_int = 256;
    pub const SEEK_CUR: c_int = 401;
    pub const SEEK_END: c_int = 402;
    pub const SEEK_SET: c_int = 403;
    pub const DISPLACEMENT_CURRENT: i64 = -1;
    pub const ERR_ACCESS: c_int = 20;
    pub const ERR_AMODE: c_int = 21;
    pub const ERR_BAD_FILE: c_int = 23;
    pub const ERR_CONVERSION: c_int = 25;
    pub const ERR_DUP_DATAREP: c_int = 27;
    pub const ERR_FILE_EXISTS: c_int = 28;
    pub const ERR_FILE_IN_USE: c_int = 29;
    pub const ERR_FILE: c_int = 30;
    pub const ERR_IO: c_int = 35;
    pub const ERR_NOT_SAME: c_int = 40;
    pub const ERR_NO_SPACE: c_int = 41;
    pub const ERR_NO_SUCH_FILE: c_int = 42;
    pub const ERR_QUOTA: c_int = 44;
    pub const ERR_READ_ONLY: c_int = 45;
    pub const ERR_UNSUPPORTED_DATAREP: c_int = 54;

    // One-sided communication (MPI-4 §12).
    pub const WIN_BASE_KEY: c_int = 601;
    pub const WIN_DISP_UNIT_KEY: c_int = 602;
    pub const WIN_SIZE_KEY: c_int = 603;
    pub const WIN_CREATE_FLAVOR_KEY: c_int = 604;
    pub const WIN_MODEL_KEY: c_int = 605;
    pub const WIN_FLAVOR_CREATE: c_int = 311;
    pub const WIN_FLAVOR_ALLOCATE: c_int = 312;
    pub const WIN_FLAVOR_DYNAMIC: c_int = 313;
    pub const WIN_FLAVOR_SHARED: c_int = 314;
    pub const WIN_UNIFIED: c_int = 321;
    pub const WIN_SEPARATE: c_int = 322;
    pub const LOCK_EXCLUSIVE: c_int = 301;
    pub const LOCK_SHARED: c_int = 302;
    pub const MODE_NOCHECK: c_int = 1024;
    pub const MODE_NOPRECEDE: c_int = 2048;
    pub const MODE_NOPUT: c_int = 4096;
    pub const MODE_NOSTORE: c_int = 8192;
    pub const MODE_NOSUCCEED: c_int = 16384;
    pub const ERR_ASSERT: c_int = 22;
    pub const ERR_BASE: c_int = 24;
    pub const ERR_DISP: c_int = 26;
    pub const ERR_LOCKTYPE: c_int = 37;
    pub const ERR_RMA_ATTACH: c_int = 46;
    pub const ERR_RMA_CONFLICT: c_int = 47;
    pub const ERR_RMA_RANGE: c_int = 48;
    pub const ERR_RMA_SHARED: c_int = 49;
    pub const ERR_RMA_SYNC: c_int = 50;
    pub const ERR_WIN: c_int = 56;
    pub const ERR_RMA_FLAVOR: c_int = 57;

    /// `MPI_STATUS_IGNORE` and `MPI_STATUSES_IGNORE`: the null address.
    pub const STATUS_IGNORE: usize = 0;
    /// `MPI_IN_PLACE`: the address 1.
    pub const IN_PLACE: usize = 1;
    /// `MPI_UNWEIGHTED` and `MPI_WEIGHTS_EMPTY`: the addresses 10 and 11.
    pub const UNWEIGHTED: usize = 10;
    pub const WEIGHTS_EMPTY: usize = 11;
}
