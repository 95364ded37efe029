/* The measurements of `metampi bench`, for a C MPI (MPICH, Open MPI), with the
 * same operations, sizes, iteration counts and JSON fields, so that
 * bench/compare_bench.sh can put both side by side.
 *
 *   mpiexec -n 4 ./osu_like OPS SIZES ITERS_SCALE LABEL OUT.json [PAIR]
 *   OPS: comma list of pingpong,pingping,bw,bibw,barrier,bcast,reduce,allreduce,
 *        gather,scatter,allgather,alltoall,pingpong_mt;  SIZES: comma list of byte counts;
 *   PAIR: the two ranks of the point-to-point operations, "0,1" by default (as --pair).
 *   MISALIGN (environment): receive buffers start this many bytes past a page boundary
 *   (as --misalign); send buffers start on one.
 *   THREADS (environment, default 4): thread pairs of pingpong_mt (as --threads); the
 *   library is asked for MPI_THREAD_MULTIPLE only when OPS has pingpong_mt. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 32

static int pair_a = 0, pair_b = 1;

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void iterations(size_t size, double scale, int *n, int *warm) {
    size_t base = (64u << 20) / (size ? size : 1);
    if (base < 20) base = 20;
    if (base > 2000) base = 2000;
    *n = (int)(base * scale);
    if (*n < 5) *n = 5;
    *warm = *n / 10 < 2 ? 2 : *n / 10;
}

static int is_bw(const char *op) { return !strcmp(op, "bw") || !strcmp(op, "bibw"); }
static int is_p2p(const char *op) {
    return !strcmp(op, "pingpong") || !strcmp(op, "pingping") || !strcmp(op, "pingpong_mt") || is_bw(op);
}

/* A zeroed buffer of n bytes starting `off` bytes past a page boundary, as metampi's bench
 * places its own (send buffers on a boundary, receive buffers MISALIGN bytes past one):
 * where two buffers start decides how fast copies between them run. */
static void *placed(size_t n, size_t off) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n + off + 1)) {
        perror("posix_memalign");
        exit(1);
    }
    memset(p, 0, n + off + 1);
    return (char *)p + off;
}

/* pingpong_mt, as metampi's bench: THREADS pairs of threads ping-pong at once, thread t of
 * each rank with thread t of the other on tag t, in five batches that the threads meet
 * between; an iteration's time is its batch's wall time over its round trips, halved. */
struct mt_arg {
    int t, first, peer, iters, batch;
    size_t size, mis;
    pthread_barrier_t *meet;
    double *times; /* thread 0's */
};

static void *mt_thread(void *p) {
    struct mt_arg *a = p;
    char *s = placed(a->size, 0), *r = placed(a->size, a->mis);
    memset(s, 1, a->size);
    for (int done = 0; done < a->iters;) {
        int k = a->iters - done < a->batch ? a->iters - done : a->batch;
        pthread_barrier_wait(a->meet);
        double t0 = MPI_Wtime();
        for (int i = 0; i < k; i++) {
            if (a->first) {
                MPI_Send(s, (int)a->size, MPI_BYTE, a->peer, a->t, MPI_COMM_WORLD);
                MPI_Recv(r, (int)a->size, MPI_BYTE, a->peer, a->t, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(r, (int)a->size, MPI_BYTE, a->peer, a->t, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(s, (int)a->size, MPI_BYTE, a->peer, a->t, MPI_COMM_WORLD);
            }
        }
        pthread_barrier_wait(a->meet);
        double per = (MPI_Wtime() - t0) / k / 2;
        if (a->times)
            for (int i = 0; i < k; i++) a->times[done + i] = per;
        done += k;
    }
    return NULL;
}

static void pingpong_threads(size_t size, int iters, double *t, int rank) {
    int threads = getenv("THREADS") ? atoi(getenv("THREADS")) : 4;
    if (threads < 1) threads = 1;
    size_t mis = getenv("MISALIGN") ? strtoul(getenv("MISALIGN"), 0, 10) % 4096 : 0;
    pthread_barrier_t meet;
    pthread_barrier_init(&meet, NULL, (unsigned)threads);
    pthread_t th[256];
    struct mt_arg args[256];
    if (threads > 256) threads = 256;
    for (int k = 0; k < threads; k++) {
        args[k] = (struct mt_arg){k, rank == pair_a, rank == pair_a ? pair_b : pair_a, iters,
                                  iters / 5 > 0 ? iters / 5 : 1, size, mis, &meet, k == 0 ? t : NULL};
        pthread_create(&th[k], NULL, mt_thread, &args[k]);
    }
    for (int k = 0; k < threads; k++) pthread_join(th[k], NULL);
    pthread_barrier_destroy(&meet);
}

enum op { PINGPONG, PINGPING, BW, BIBW, BARRIER, BCAST, REDUCE, ALLREDUCE, GATHER, SCATTER,
          ALLGATHER, ALLTOALL, PINGPONG_MT, UNKNOWN };

/* The operation named `name`, looked up once so that no string compare runs inside the
 * timed region (the Rust benchmark has none there either). */
static enum op op_of(const char *name) {
    static const char *names[] = {"pingpong", "pingping", "bw", "bibw", "barrier", "bcast", "reduce",
                                  "allreduce", "gather", "scatter", "allgather", "alltoall",
                                  "pingpong_mt"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(name, names[i])) return (enum op)i;
    return UNKNOWN;
}

/* Runs `iters` iterations; fills t[] with per-iteration seconds (0 when not taking part). */
static void run(const char *op, size_t size, int iters, double *t, int rank, int nranks, char *sbuf, char *rbuf,
                char *sbig, char *rbig, char *win, float *fs, float *fr) {
    int a = pair_a, b = pair_b, peer = rank == a ? b : a;
    int fcount = (int)(size / 4);
    MPI_Request reqs[2 * WINDOW];
    enum op k = op_of(op);
    int p2p = is_p2p(op), bw = is_bw(op);
    for (int i = 0; i < iters; i++) {
        t[i] = 0;
        if (p2p && rank != a && rank != b) continue;
        if (k == PINGPONG_MT) {
            pingpong_threads(size, iters, t, rank);
            return;
        }
        double t0 = MPI_Wtime();
        switch (k) {
        case PINGPONG:
            if (rank == a) {
                MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
            break;
        case PINGPING:
            MPI_Isend(sbuf, (int)size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &reqs[0]);
            MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Wait(&reqs[0], MPI_STATUS_IGNORE);
            break;
        case BW:
            char ack = 0;
            if (rank == a) {
                for (int w = 0; w < WINDOW; w++) MPI_Isend(sbuf, (int)size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &reqs[w]);
                MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
                MPI_Recv(&ack, 1, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                for (int w = 0; w < WINDOW; w++) MPI_Irecv(win + w * size, (int)size, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, &reqs[w]);
                MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
                MPI_Send(&ack, 1, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
            break;
        case BIBW:
            for (int w = 0; w < WINDOW; w++) MPI_Irecv(win + w * size, (int)size, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, &reqs[w]);
            for (int w = 0; w < WINDOW; w++) MPI_Isend(sbuf, (int)size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &reqs[WINDOW + w]);
            MPI_Waitall(2 * WINDOW, reqs, MPI_STATUSES_IGNORE);
            break;
        case BARRIER:
            MPI_Barrier(MPI_COMM_WORLD);
            break;
        case BCAST:
            MPI_Bcast(rbuf, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            break;
        case REDUCE:
            MPI_Reduce(fs, fr, fcount, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
            break;
        case ALLREDUCE:
            MPI_Allreduce(fs, fr, fcount, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case GATHER:
            MPI_Gather(sbuf, (int)size, MPI_BYTE, rbig, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            break;
        case SCATTER:
            MPI_Scatter(sbig, (int)size, MPI_BYTE, rbuf, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            break;
        case ALLGATHER:
            MPI_Allgather(sbuf, (int)size, MPI_BYTE, rbig, (int)size, MPI_BYTE, MPI_COMM_WORLD);
            break;
        case ALLTOALL:
            MPI_Alltoall(sbig, (int)size, MPI_BYTE, rbig, (int)size, MPI_BYTE, MPI_COMM_WORLD);
            break;
        default:
            break;
        }
        double dt = MPI_Wtime() - t0;
        t[i] = k == PINGPONG ? dt / 2 : bw ? dt / WINDOW : dt;
    }
    (void)nranks;
}

int main(int argc, char **argv) {
    int provided = MPI_THREAD_SINGLE;
    if (argc > 1 && strstr(argv[1], "pingpong_mt"))
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 6) {
        if (rank == 0) fprintf(stderr, "usage: osu_like OPS SIZES ITERS_SCALE LABEL OUT.json [PAIR]\n");
        MPI_Finalize();
        return 2;
    }
    if (argc > 6 && (sscanf(argv[6], "%d,%d", &pair_a, &pair_b) != 2 || pair_a == pair_b || pair_a < 0 ||
                     pair_b < 0 || pair_a >= n || pair_b >= n)) {
        if (rank == 0) fprintf(stderr, "osu_like: PAIR must be two different ranks below %d, like 0,1\n", n);
        MPI_Finalize();
        return 2;
    }
    char *ops = strdup(argv[1]), *sizes_s = strdup(argv[2]);
    double scale = atof(argv[3]);
    size_t sizes[64];
    int ns = 0;
    for (char *tok = strtok(sizes_s, ","); tok && ns < 64; tok = strtok(NULL, ",")) sizes[ns++] = strtoul(tok, 0, 10);
    size_t maxs = 0;
    for (int i = 0; i < ns; i++) if (sizes[i] > maxs) maxs = sizes[i];
    size_t mis = getenv("MISALIGN") ? strtoul(getenv("MISALIGN"), 0, 10) % 4096 : 0;
    char *sbuf = placed(maxs, 0), *rbuf = placed(maxs, mis);
    char *sbig = placed(maxs * n, 0), *rbig = placed(maxs * n, mis);
    float *fs = placed(maxs / 4 * sizeof(float), 0), *fr = placed(maxs / 4 * sizeof(float), mis / 4 * 4);
    /* The windows of the bandwidth tests lie end to end, `size` apart, as in metampi's bench. */
    char *win = placed(WINDOW * maxs, mis);
    /* Send buffers hold data, as metampi's bench fills them: an untouched calloc'd buffer is
     * the kernel's shared zero page, one 4 KiB page read over and over, which made large
     * single-copy (CMA) transfers look up to twice as fast as they are for real data. */
    memset(sbuf, 1, maxs);
    memset(sbig, 1, maxs * n);
    for (size_t i = 0; i < maxs / 4; i++) fs[i] = 1.0f;
    FILE *out = NULL;
    if (rank == 0) {
        out = fopen(argv[5], "w");
        fprintf(out, "{\"tool\":\"osu_like.c\",\"version\":\"1\",\"label\":\"%s\",\"ranks\":%d,\"pair\":[%d,%d],\"transport\":\"%s\",\"misalign\":%zu,\"results\":[", argv[4], n, pair_a, pair_b, "native", mis);
    }
    int first = 1;
    for (char *op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
        if (is_p2p(op) && n < 2) continue;
        if (!strcmp(op, "pingpong_mt") && provided < MPI_THREAD_MULTIPLE) {
            if (rank == 0) fprintf(stderr, "osu_like: no MPI_THREAD_MULTIPLE (got %d); skipping pingpong_mt\n", provided);
            continue;
        }
        for (int s = 0; s < ns; s++) {
            size_t size = sizes[s];
            if (!strcmp(op, "barrier") && s > 0) continue;
            if ((!strcmp(op, "reduce") || !strcmp(op, "allreduce")) && size % 4) continue;
            int iters, warm;
            iterations(size, scale, &iters, &warm);
            double *t = calloc(iters, sizeof(double)), *all = calloc((size_t)iters * n, sizeof(double));
            MPI_Barrier(MPI_COMM_WORLD);
            run(op, size, warm, t, rank, n, sbuf, rbuf, sbig, rbig, win, fs, fr);
            MPI_Barrier(MPI_COMM_WORLD);
            run(op, size, iters, t, rank, n, sbuf, rbuf, sbig, rbig, win, fs, fr);
            MPI_Gather(t, iters, MPI_DOUBLE, all, iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                double *per = calloc(iters, sizeof(double)), mean = 0;
                for (int i = 0; i < iters; i++) {
                    per[i] = 0;
                    for (int r = 0; r < n; r++) if (all[r * iters + i] > per[i]) per[i] = all[r * iters + i];
                    per[i] *= 1e6;
                    mean += per[i] / iters;
                }
                qsort(per, iters, sizeof(double), cmpd);
                double med = per[iters / 2];
                fprintf(out, "%s{\"op\":\"%s\",\"bytes\":%zu,\"iterations\":%d,\"min_us\":%.4f,\"median_us\":%.4f,\"p90_us\":%.4f,\"p99_us\":%.4f,\"max_us\":%.4f,\"mean_us\":%.4f,\"mbps\":",
                        first ? "" : ",", op, size, iters, per[0], med, per[(int)(iters * 0.9)], per[(int)(iters * 0.99)], per[iters - 1], mean);
                if (is_bw(op)) fprintf(out, "%.3f}", (strcmp(op, "bibw") ? 1.0 : 2.0) * size / (med > 0 ? med : 1e-9));
                else fprintf(out, "null}");
                first = 0;
                free(per);
            }
            free(t);
            free(all);
        }
    }
    if (rank == 0) {
        fprintf(out, "]}\n");
        fclose(out);
    }
    MPI_Finalize();
    return 0;
}
