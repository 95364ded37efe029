! A Fortran program against the plain MPI API (`use mpi`), built with MPICH's mpif90: it
! runs on metampi through Debian's libmpichfort.so.12 over metampi's MPICH-ABI library.
! Every failed check prints a line; rank 0 prints "fortran suite: N checks, F failed".
module checks
  implicit none
  integer :: nchecks = 0, nfailed = 0
contains
  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    nchecks = nchecks + 1
    if (.not. ok) then
      nfailed = nfailed + 1
      print '(a,a)', 'FAIL ', what
    end if
  end subroutine
end module

program abi_suite
  use mpi
  use checks
  implicit none
  integer :: ierr, rank, nprocs, next, prev, i, req(2), status(MPI_STATUS_SIZE)
  integer :: statuses(MPI_STATUS_SIZE, 2), count, half, hrank, hsize, key, cart, dims(1)
  integer :: vec, cls, comm2, dup, errs(2), total_checks, total_failed, coords(1), src, dst
  integer(kind=MPI_ADDRESS_KIND) :: attr, val
  logical :: flag, periods(1)
  double precision :: a(10), b(10), s, mat(4, 4), col(4)
  integer, allocatable :: gathered(:)

  call MPI_Init(ierr)
  call check(ierr == MPI_SUCCESS, 'init')
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)
  next = mod(rank + 1, nprocs)
  prev = mod(rank + nprocs - 1, nprocs)

  ! point to point around a ring, nonblocking, with statuses
  a = rank
  call MPI_Irecv(b, 10, MPI_DOUBLE_PRECISION, prev, 7, MPI_COMM_WORLD, req(1), ierr)
  call MPI_Isend(a, 10, MPI_DOUBLE_PRECISION, next, 7, MPI_COMM_WORLD, req(2), ierr)
  call MPI_Waitall(2, req, statuses, ierr)
  call MPI_Get_count(statuses(:, 1), MPI_DOUBLE_PRECISION, count, ierr)
  call check(all(b == prev) .and. count == 10 .and. statuses(MPI_SOURCE, 1) == prev, 'ring')
  call check(req(1) == MPI_REQUEST_NULL, 'request nulled')
  call MPI_Sendrecv(a, 1, MPI_DOUBLE_PRECISION, next, 8, b, 1, MPI_DOUBLE_PRECISION, prev, 8, &
                    MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
  call check(b(1) == prev, 'sendrecv with MPI_STATUS_IGNORE')

  ! a row of a column-major matrix through a vector type
  do i = 1, 4
    mat(i, :) = rank * 100 + i
  end do
  call MPI_Type_vector(4, 1, 4, MPI_DOUBLE_PRECISION, vec, ierr)
  call MPI_Type_commit(vec, ierr)
  call MPI_Sendrecv(mat(2, 1), 1, vec, next, 9, col, 4, MPI_DOUBLE_PRECISION, prev, 9, &
                    MPI_COMM_WORLD, status, ierr)
  call check(all(col == prev * 100 + 2), 'vector type')
  call MPI_Type_free(vec, ierr)

  ! collectives
  call MPI_Allreduce(dble(rank), s, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check(s == nprocs * (nprocs - 1) / 2.0d0, 'allreduce')
  allocate(gathered(nprocs))
  call MPI_Allgather(rank, 1, MPI_INTEGER, gathered, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call check(gathered(nprocs) == nprocs - 1 .and. gathered(1) == 0, 'allgather')
  i = rank
  call MPI_Allreduce(MPI_IN_PLACE, i, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  call check(i == nprocs - 1, 'allreduce in place')
  i = merge(42, 0, rank == 0)
  call MPI_Bcast(i, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  call check(i == 42, 'bcast')
  call MPI_Barrier(MPI_COMM_WORLD, ierr)

  ! communicators, attributes and a Cartesian ring
  call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), rank, half, ierr)
  call MPI_Comm_rank(half, hrank, ierr)
  call MPI_Comm_size(half, hsize, ierr)
  call check(hrank == rank / 2 .and. hsize == (nprocs + 1 - mod(rank, 2)) / 2, 'split')
  call MPI_Comm_create_keyval(MPI_COMM_DUP_FN, MPI_COMM_NULL_DELETE_FN, key, 0_MPI_ADDRESS_KIND, ierr)
  val = 1234
  call MPI_Comm_set_attr(half, key, val, ierr)
  call MPI_Comm_dup(half, dup, ierr)
  call MPI_Comm_get_attr(dup, key, attr, flag, ierr)
  call check(flag .and. attr == 1234, 'attribute copied by MPI_COMM_DUP_FN')
  call MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, attr, flag, ierr)
  call check(flag .and. attr >= 32767, 'MPI_TAG_UB')
  call MPI_Comm_free(dup, ierr)
  call MPI_Comm_free_keyval(key, ierr)
  call MPI_Comm_free(half, ierr)
  dims(1) = nprocs
  periods(1) = .true.
  call MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, .false., cart, ierr)
  call MPI_Cart_shift(cart, 0, 1, src, dst, ierr)
  call MPI_Cart_coords(cart, rank, 1, coords, ierr)
  call check(src == prev .and. dst == next .and. coords(1) == rank, 'cart')
  call MPI_Comm_free(cart, ierr)

  ! errors returned to the caller
  call MPI_Comm_dup(MPI_COMM_WORLD, comm2, ierr)
  call MPI_Comm_set_errhandler(comm2, MPI_ERRORS_RETURN, ierr)
  errs = 0
  call MPI_Isend(errs, 2, MPI_INTEGER, next, 10, comm2, req(1), ierr)
  call MPI_Recv(i, 1, MPI_INTEGER, prev, 10, comm2, status, ierr)
  call MPI_Error_class(ierr, cls, errs(1))
  call check(cls == MPI_ERR_TRUNCATE, 'truncation class')
  call MPI_Wait(req(1), MPI_STATUS_IGNORE, ierr)
  call MPI_Send(i, 1, MPI_INTEGER, nprocs + 3, 0, comm2, ierr)
  call MPI_Error_class(ierr, cls, errs(1))
  call check(cls == MPI_ERR_RANK, 'bad rank class')
  call MPI_Comm_free(comm2, ierr)

  call MPI_Reduce(nchecks, total_checks, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  call MPI_Reduce(nfailed, total_failed, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,i0,a,i0,a,i0,a)', 'fortran suite: ', total_checks, ' checks, ', &
      total_failed, ' failed, ', nprocs, ' ranks'
  call MPI_Finalize(ierr)
  if (rank == 0 .and. total_failed > 0) error stop 1
end program
