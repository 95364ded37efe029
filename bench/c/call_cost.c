/* What one MPI call costs a single process, apart from any communication: a send to
 * MPI_PROC_NULL, MPI_Comm_rank, a message to oneself (MPI_Isend, MPI_Recv, MPI_Wait on
 * MPI_COMM_SELF) and MPI_Wtime, each in a loop of N calls (default 2000000).
 *   mpicc.mpich -O2 -o call_cost bench/c/call_cost.c
 *   metampi run -n 1 ./call_cost;  mpiexec.mpich -n 1 ./call_cost */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const int n = argc > 1 ? atoi(argv[1]) : 2000000;
    char out[8] = {0}, in[8];
    int x;
    double t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) MPI_Send(out, 8, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    for (int i = 0; i < n; i++) MPI_Comm_rank(MPI_COMM_WORLD, &x);
    double t2 = MPI_Wtime();
    for (int i = 0; i < n / 4; i++) {
        MPI_Request q;
        MPI_Isend(out, 8, MPI_BYTE, 0, 0, MPI_COMM_SELF, &q);
        MPI_Recv(in, 8, MPI_BYTE, 0, 0, MPI_COMM_SELF, MPI_STATUS_IGNORE);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    double t3 = MPI_Wtime();
    for (int i = 0; i < n; i++) MPI_Wtime();
    double t4 = MPI_Wtime();
    printf("send to MPI_PROC_NULL %.1f ns, MPI_Comm_rank %.1f ns, "
           "MPI_Isend+MPI_Recv+MPI_Wait to self %.1f ns, MPI_Wtime %.1f ns\n",
           (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, (t3 - t2) / (n / 4) * 1e9, (t4 - t3) / n * 1e9);
    MPI_Finalize();
    return 0;
}
