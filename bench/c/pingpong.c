/* Ping-pong latency and windowed streaming bandwidth between ranks 0 and 1,
 * the same measurement as crates/metampi/examples/pingpong.rs, for MPICH or
 * Open MPI. Output: "latency_us <bytes> <us>" and "bandwidth_MBps <bytes> <MB/s>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t lat_bytes = argc > 1 ? strtoul(argv[1], 0, 10) : 8;
    size_t bw_bytes = argc > 2 ? strtoul(argv[2], 0, 10) : (4u << 20);
    if (rank > 1) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    int peer = 1 - rank;
    char *buf = calloc(lat_bytes + 1, 1);
    const int iters = 20000;
    double samples[6];
    int ns = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int batch = 0; batch < 6; batch++) {
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            if (rank == 0) {
                MPI_Send(buf, (int)lat_bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)lat_bytes, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, (int)lat_bytes, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)lat_bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
        }
        double dt = MPI_Wtime() - t0;
        if (batch > 0) samples[ns++] = dt / iters / 2.0 * 1e6;
    }
    qsort(samples, ns, sizeof(double), cmp);
    if (rank == 0) printf("latency_us %zu %.3f\n", lat_bytes, samples[ns / 2]);

    enum { WINDOW = 16 };
    char *data = malloc(bw_bytes);
    memset(data, 1, bw_bytes);
    char *sink[WINDOW];
    for (int w = 0; w < WINDOW; w++) sink[w] = calloc(bw_bytes, 1);
    MPI_Request reqs[WINDOW];
    size_t reps = (256u << 20) / (bw_bytes ? bw_bytes : 1) / WINDOW + 2;
    double best = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t rep = 0; rep < reps; rep++) {
        double t0 = MPI_Wtime();
        char ack = 0;
        if (rank == 0) {
            for (int w = 0; w < WINDOW; w++) MPI_Isend(data, (int)bw_bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < WINDOW; w++) MPI_Irecv(sink[w], (int)bw_bytes, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
        double dt = MPI_Wtime() - t0;
        double mbps = (double)WINDOW * bw_bytes / dt / 1e6;
        if (rep > 0 && mbps > best) best = mbps;
    }
    if (rank == 0) printf("bandwidth_MBps %zu %.1f\n", bw_bytes, best);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
