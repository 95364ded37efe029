/* The C twin of crates/metampi/examples/turns.rs: ranks take turns computing
 * for 50 us to 3 ms before an 8-byte all-reduce; prints the cost of the wait
 * per iteration. bench/turns.sh runs both. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const double works[] = {50, 150, 300, 1000, 3000};
    for (int w = 0; w < 5; w++) {
        double work = works[w];
        int iters = (int)(200000.0 / work);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int i = 0; i < iters; i++) {
            if (i % n == me) {
                double s = now();
                while ((now() - s) * 1e6 < work) {}
            }
            double x = 1, sum = 0;
            MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (sum != n) abort();
        }
        double per = (now() - t0) / iters * 1e6;
        if (!me) printf("work %6.0f us  iteration %8.1f us  overhead %6.1f us\n", work, per, per - work);
    }
    MPI_Finalize();
    return 0;
}
