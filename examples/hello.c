/* The same "hello" in C, built with MPICH's wrapper and run on metampi's C library:
 *
 *   mpicc.mpich -o hello_c examples/hello.c
 *   target/release/metampi run -n 4 ./hello_c
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, sum, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("hello from rank %d of %d on %s; ranks add up to %d\n", rank, size, name, sum);
    MPI_Finalize();
    return sum == size * (size - 1) / 2 ? 0 : 1;
}
