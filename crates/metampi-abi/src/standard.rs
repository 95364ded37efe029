//! What only the MPI-5 standard ABI has (`cfg(std_abi)`): the ABI's own version and
//! sizes, and handles as integers (`MPI_Comm_toint`/`MPI_Comm_fromint` and kin, the
//! standard ABI's replacement for MPICH's `c2f`/`f2c` macros).
//!
//! A handle's integer is its value: the predefined ones are small, the ones this
//! library makes are `base | index` below 2^32, so the round trip is exact.

use std::ffi::c_int;

use crate::consts::*;
use crate::env::{Info, INFOS};
use crate::raw;

/// The version of the standard ABI this library implements.
const ABI_VERSION: (c_int, c_int) = (1, 0);

mpi! {
    fn MPI_Abi_get_version / PMPI_Abi_get_version(major: *mut c_int, minor: *mut c_int) {
        raw::put(major, ABI_VERSION.0)?;
        raw::put(minor, ABI_VERSION.1)
    }
    fn MPI_Abi_get_info / PMPI_Abi_get_info(info: *mut Handle) {
        let mut i = Info::default();
        for (k, n) in [
            ("mpi_aint_size", std::mem::size_of::<isize>()),
            ("mpi_count_size", std::mem::size_of::<i64>()),
            ("mpi_offset_size", std::mem::size_of::<i64>()),
        ] {
            i.0.insert(k.to_string(), n.to_string());
        }
        raw::put(info, INFOS.insert(i))
    }
}

/// Defines `MPI_<Kind>_toint` / `MPI_<Kind>_fromint` and their `PMPI_` twins.
macro_rules! int_handles {
    ($($to:ident / $pto:ident, $from:ident / $pfrom:ident;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $pto(h: Handle) -> c_int {
            h as u32 as c_int
        }
        #[no_mangle]
        pub extern "C" fn $to(h: Handle) -> c_int {
            $pto(h)
        }
        #[no_mangle]
        pub extern "C" fn $pfrom(i: c_int) -> Handle {
            i as u32 as Handle
        }
        #[no_mangle]
        pub extern "C" fn $from(i: c_int) -> Handle {
            $pfrom(i)
        }
    )*};
}

int_handles! {
    MPI_Comm_toint / PMPI_Comm_toint, MPI_Comm_fromint / PMPI_Comm_fromint;
    MPI_Errhandler_toint / PMPI_Errhandler_toint, MPI_Errhandler_fromint / PMPI_Errhandler_fromint;
    MPI_File_toint / PMPI_File_toint, MPI_File_fromint / PMPI_File_fromint;
    MPI_Group_toint / PMPI_Group_toint, MPI_Group_fromint / PMPI_Group_fromint;
    MPI_Info_toint / PMPI_Info_toint, MPI_Info_fromint / PMPI_Info_fromint;
    MPI_Message_toint / PMPI_Message_toint, MPI_Message_fromint / PMPI_Message_fromint;
    MPI_Op_toint / PMPI_Op_toint, MPI_Op_fromint / PMPI_Op_fromint;
    MPI_Request_toint / PMPI_Request_toint, MPI_Request_fromint / PMPI_Request_fromint;
    MPI_Session_toint / PMPI_Session_toint, MPI_Session_fromint / PMPI_Session_fromint;
    MPI_Type_toint / PMPI_Type_toint, MPI_Type_fromint / PMPI_Type_fromint;
    MPI_Win_toint / PMPI_Win_toint, MPI_Win_fromint / PMPI_Win_fromint;
}
