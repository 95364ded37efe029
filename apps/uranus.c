/* A URANUS-like relaxation solver (PACX-MPI paper, section on URANUS): a 3-D structured grid
 * of V variables split over a Cartesian process grid, an overlap of two cells on every face, a
 * relaxation sweep per iteration and a residual all-reduce.
 *
 * The equation is -L u = f / sqrt(1 + u^2) for each variable, where L is the Laplacian taken
 * with spacing 1 plus a quarter of it taken with spacing 2, so every cell reads two cells deep
 * in each direction (the reason for the two-cell overlap). A Jacobi sweep solves it. `--work W`
 * evaluates the right-hand side's square root by W Newton steps: the stand-in for URANUS's
 * costly per-cell physics, so that the ratio of computation to communication can be set.
 *
 * Variants (`--variant`), as in the paper's table:
 *   blocking   halos exchanged with MPI_Sendrecv on subarray datatypes, then the sweep;
 *   overlap    halos posted with MPI_Irecv/MPI_Isend, the interior swept meanwhile, the rim
 *              after MPI_Waitall (the same arithmetic, so the same answer as blocking);
 *   pipelined  a rank sweeps with the newest halo it has received so far ("message
 *              pipelining"): faces are sent when the previous send of that face is done and
 *              taken when they have arrived; the residual comes from an MPI_Iallreduce that
 *              is read an iteration later. Answers depend on timing; with --tol it converges
 *              to the same solution in some more iterations.
 *
 * It prints one line of key=value pairs (rank 0). Plain MPI: it builds with any mpicc and runs
 * on MPICH or on metampi's C library (`metampi run -n 4 ./uranus`). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H 2 /* overlap: cells of halo on each face */
#define TAG_HALO 11
#define TAG_COUNT 99

static int V = 5;         /* variables per cell */
static int W = 0;         /* Newton steps per cell and variable */
static int lx[3], L[3];   /* owned cells, and with the halo, per dimension */
static double *fx[3];     /* the source's factor along each dimension */
static const double A1 = 1.0, A2 = 0.25;

static size_t at(int v, int i, int j, int k) {
    return (((size_t)v * L[0] + i) * L[1] + j) * L[2] + k;
}

static void usage(void) {
    fprintf(stderr, "usage: uranus [--variant blocking|overlap|pipelined] [--grid NXxNYxNZ]\n"
                    "              [--iters K] [--tol T] [--max-iters K] [--work W] [--vars V]\n");
}

/* One relaxation of the cells in [lo, hi) (array indices), skipping the interior box
 * [ilo, ihi) when `rim_only`; returns the sum of squared changes. */
static double sweep(const double *u, double *un, const int lo[3], const int hi[3],
                    const int ilo[3], const int ihi[3], int rim_only) {
    const double diag = 6.0 * (A1 + A2);
    const size_t s0 = (size_t)L[1] * L[2], s1 = L[2];
    double change = 0.0;
    for (int v = 0; v < V; v++)
        for (int i = lo[0]; i < hi[0]; i++)
            for (int j = lo[1]; j < hi[1]; j++)
                for (int k = lo[2]; k < hi[2]; k++) {
                    if (rim_only && i >= ilo[0] && i < ihi[0] && j >= ilo[1] && j < ihi[1] &&
                        k >= ilo[2] && k < ihi[2])
                        continue;
                    size_t c = at(v, i, j, k);
                    double near = u[c - s0] + u[c + s0] + u[c - s1] + u[c + s1] + u[c - 1] + u[c + 1];
                    double far = u[c - 2 * s0] + u[c + 2 * s0] + u[c - 2 * s1] + u[c + 2 * s1] +
                                 u[c - 2] + u[c + 2];
                    double q = 1.0 + u[c] * u[c], y = 1.0;
                    for (int w = 0; w < W; w++)
                        y = 0.5 * (y + q / y);
                    double f = (v + 1) * fx[0][i] * fx[1][j] * fx[2][k] / y;
                    double n = (A1 * near + A2 * far + f) / diag;
                    change += (n - u[c]) * (n - u[c]);
                    un[c] = n;
                }
    return change;
}

/* The box of owned cells of face (d, side): the two layers sent (halo = 0) or the two halo
 * layers received (halo = 1). */
static void face_box(int d, int side, int halo, int start[3], int size[3]) {
    for (int e = 0; e < 3; e++) {
        start[e] = H;
        size[e] = lx[e];
    }
    size[d] = H;
    start[d] = side == 0 ? (halo ? 0 : H) : (halo ? lx[d] + H : lx[d]);
}

static MPI_Datatype face_type(int d, int side, int halo) {
    int sizes[4] = {V, L[0], L[1], L[2]}, subs[4], starts[4], st[3], sz[3];
    face_box(d, side, halo, st, sz);
    subs[0] = V;
    starts[0] = 0;
    for (int e = 0; e < 3; e++) {
        subs[e + 1] = sz[e];
        starts[e + 1] = st[e];
    }
    MPI_Datatype t;
    MPI_Type_create_subarray(4, sizes, subs, starts, MPI_ORDER_C, MPI_DOUBLE, &t);
    MPI_Type_commit(&t);
    return t;
}

/* Copies a face between the grid and a packed buffer (the pipelined variant's own copies). */
static void face_copy(double *grid, double *buf, int d, int side, int halo, int to_grid) {
    int st[3], sz[3];
    face_box(d, side, halo, st, sz);
    size_t n = 0;
    for (int v = 0; v < V; v++)
        for (int i = st[0]; i < st[0] + sz[0]; i++)
            for (int j = st[1]; j < st[1] + sz[1]; j++)
                for (int k = st[2]; k < st[2] + sz[2]; k++, n++) {
                    if (to_grid)
                        grid[at(v, i, j, k)] = buf[n];
                    else
                        buf[n] = grid[at(v, i, j, k)];
                }
}

static int face_len(int d) {
    int st[3], sz[3];
    face_box(d, 0, 0, st, sz);
    return V * sz[0] * sz[1] * sz[2];
}

static MPI_Comm cart;
static int lo_nb[3], hi_nb[3];
static MPI_Datatype send_t[3][2], recv_t[3][2];
/* Statuses of a wait on all faces (MPI_STATUSES_IGNORE draws a false gcc warning). */
static MPI_Status statuses[12];

/* Every face to its neighbour and every halo from it, with MPI_Sendrecv on subarray types. */
static void exchange_blocking(double *u, MPI_Comm comm) {
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++) {
            /* Face s goes to the neighbour on side s, whose halo on the other side takes it;
             * the tag is the receiving halo's side. */
            int to = s ? hi_nb[d] : lo_nb[d], from = s ? lo_nb[d] : hi_nb[d];
            MPI_Sendrecv(u, 1, send_t[d][s], to, TAG_HALO + 2 * d + (1 - s), u, 1,
                         recv_t[d][1 - s], from, TAG_HALO + 2 * d + (1 - s), comm,
                         MPI_STATUS_IGNORE);
        }
}

/* The pipelined variant: takes every face the neighbour has sent that has arrived, the newest
 * into both grids' halo; returns how many. Probing, rather than a receive kept posted, leaves
 * no receive to cancel at the end. The tag names the receiving halo's side. */
static int take_faces(double *u, double *un, double *buf, int d, int s, int nb, long *got) {
    int n = 0, there = 1;
    while (there) {
        MPI_Iprobe(nb, TAG_HALO + 2 * d + s, cart, &there, MPI_STATUS_IGNORE);
        if (there) {
            MPI_Recv(buf, face_len(d), MPI_DOUBLE, nb, TAG_HALO + 2 * d + s, cart,
                     MPI_STATUS_IGNORE);
            n++;
        }
    }
    if (n) {
        face_copy(u, buf, d, s, 1, 1);
        face_copy(un, buf, d, s, 1, 1);
        *got += n;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *variant = "blocking";
    int grid[3] = {48, 48, 48}, iters = 10, max_iters = 100000;
    double tol = 0.0;
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int a = 1; a < argc; a++) {
        const char *val = a + 1 < argc ? argv[a + 1] : NULL;
        int ok = val != NULL;
        if (!strcmp(argv[a], "--variant") && ok)
            variant = val;
        else if (!strcmp(argv[a], "--grid") && ok)
            ok = sscanf(val, "%dx%dx%d", &grid[0], &grid[1], &grid[2]) == 3;
        else if (!strcmp(argv[a], "--iters") && ok)
            iters = atoi(val);
        else if (!strcmp(argv[a], "--max-iters") && ok)
            max_iters = atoi(val);
        else if (!strcmp(argv[a], "--tol") && ok)
            tol = atof(val);
        else if (!strcmp(argv[a], "--work") && ok)
            W = atoi(val);
        else if (!strcmp(argv[a], "--vars") && ok)
            V = atoi(val);
        else
            ok = 0;
        if (!ok) {
            if (rank == 0) {
                fprintf(stderr, "uranus: bad option %s\n", argv[a]);
                usage();
            }
            MPI_Finalize();
            return 2;
        }
        a++;
    }
    int pipelined = !strcmp(variant, "pipelined"), overlap = !strcmp(variant, "overlap");
    if (!pipelined && !overlap && strcmp(variant, "blocking")) {
        if (rank == 0)
            fprintf(stderr, "uranus: unknown variant %s\n", variant);
        MPI_Finalize();
        return 2;
    }

    int dims[3] = {0, 0, 0}, periods[3] = {0, 0, 0}, coords[3];
    MPI_Dims_create(size, 3, dims);
    MPI_Cart_create(MPI_COMM_WORLD, 3, dims, periods, 0, &cart);
    MPI_Cart_coords(cart, rank, 3, coords);
    for (int d = 0; d < 3; d++) {
        MPI_Cart_shift(cart, d, 1, &lo_nb[d], &hi_nb[d]);
        int base = grid[d] / dims[d], extra = grid[d] % dims[d];
        lx[d] = base + (coords[d] < extra);
        int first = coords[d] * base + (coords[d] < extra ? coords[d] : extra);
        if (lx[d] < H) {
            if (rank == 0)
                fprintf(stderr, "uranus: grid %d too small for %d ranks along dimension %d\n",
                        grid[d], dims[d], d);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        L[d] = lx[d] + 2 * H;
        fx[d] = malloc(sizeof(double) * L[d]);
        for (int i = 0; i < L[d]; i++) /* zero on the halo of the global boundary too */
            fx[d][i] = sin(M_PI * (first + i - H + 1) / (grid[d] + 1));
    }
    size_t cells = (size_t)V * L[0] * L[1] * L[2];
    double *u = calloc(cells, sizeof(double)), *un = calloc(cells, sizeof(double));
    int own_lo[3] = {H, H, H}, own_hi[3], in_lo[3], in_hi[3];
    for (int d = 0; d < 3; d++) {
        own_hi[d] = lx[d] + H;
        in_lo[d] = 2 * H; /* cells whose stencil stays inside the owned block */
        in_hi[d] = lx[d] > 2 * H ? lx[d] : 2 * H;
    }

    double *sbuf[3][2], *rbuf[3][2];
    MPI_Request sreq[3][2], resreq = MPI_REQUEST_NULL;
    long sent[3][2] = {{0}}, got[3][2] = {{0}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++) {
            send_t[d][s] = face_type(d, s, 0);
            recv_t[d][s] = face_type(d, s, 1);
            sbuf[d][s] = malloc(sizeof(double) * face_len(d));
            rbuf[d][s] = malloc(sizeof(double) * face_len(d));
            sreq[d][s] = MPI_REQUEST_NULL;
        }
    MPI_Comm rescomm, confcomm; /* the pipelined variant's residuals and confirmations */
    MPI_Comm_dup(cart, &rescomm);
    MPI_Comm_dup(cart, &confcomm);
    long started = 0, confirms = 0;
    MPI_Barrier(cart);
    double t0 = MPI_Wtime(), t_sweep = 0.0, residual = -1.0, res_local = 0.0, res_sum = 0.0;
    int it = 0, stale = 0, limit = tol > 0 ? max_iters : iters;
    for (it = 0; it < limit; it++) {
        double change = 0.0;
        int stale_now = 0;
        if (pipelined) {
            /* The residual read here is an iteration or more old and was summed while faces
             * were stale: with old halos every block settles on its own, far from the
             * solution. So a small one is confirmed by a sweep after a full exchange. */
            int done, confirm = 0;
            MPI_Test(&resreq, &done, MPI_STATUS_IGNORE);
            if (done && it > 0) {
                residual = sqrt(res_sum);
                confirm = tol > 0 && residual < tol;
            }
            for (int d = 0; d < 3 && !confirm; d++)
                for (int s = 0; s < 2; s++) {
                    int nb = s ? hi_nb[d] : lo_nb[d], done;
                    if (nb == MPI_PROC_NULL)
                        continue;
                    /* The neighbour's face, if a newer one came; then wait for the next. The
                     * tag names the face as seen by the receiver: my high face is its low. */
                    if (!take_faces(u, un, rbuf[d][s], d, s, nb, &got[d][s]))
                        stale_now++;
                    MPI_Test(&sreq[d][s], &done, MPI_STATUS_IGNORE);
                    if (done) {
                        face_copy(u, sbuf[d][s], d, s, 0, 0);
                        MPI_Isend(sbuf[d][s], face_len(d), MPI_DOUBLE, nb,
                                  TAG_HALO + 2 * d + (1 - s), cart, &sreq[d][s]);
                        sent[d][s]++;
                    }
                }
            if (confirm)
                exchange_blocking(u, confcomm);
            double t1 = MPI_Wtime();
            change = sweep(u, un, own_lo, own_hi, in_lo, in_hi, 0);
            t_sweep += MPI_Wtime() - t1;
            if (confirm) {
                double sum;
                MPI_Allreduce(&change, &sum, 1, MPI_DOUBLE, MPI_SUM, confcomm);
                residual = sqrt(sum);
                confirms++;
            }
            if (resreq == MPI_REQUEST_NULL) {
                res_local = change;
                MPI_Iallreduce(&res_local, &res_sum, 1, MPI_DOUBLE, MPI_SUM, rescomm, &resreq);
                started++;
            }
        } else {
            MPI_Request reqs[12];
            int nreq = 0;
            if (overlap) {
                for (int d = 0; d < 3; d++)
                    for (int s = 0; s < 2; s++) {
                        int to = s ? hi_nb[d] : lo_nb[d], from = s ? lo_nb[d] : hi_nb[d];
                        MPI_Irecv(u, 1, recv_t[d][1 - s], from, TAG_HALO + 2 * d + (1 - s), cart,
                                  &reqs[nreq++]);
                        MPI_Isend(u, 1, send_t[d][s], to, TAG_HALO + 2 * d + (1 - s), cart,
                                  &reqs[nreq++]);
                    }
            } else {
                exchange_blocking(u, cart);
            }
            double t1 = MPI_Wtime();
            if (overlap) {
                change = sweep(u, un, in_lo, in_hi, in_lo, in_hi, 0);
                t_sweep += MPI_Wtime() - t1;
                MPI_Waitall(nreq, reqs, statuses);
                t1 = MPI_Wtime();
                change += sweep(u, un, own_lo, own_hi, in_lo, in_hi, 1);
            } else {
                change = sweep(u, un, own_lo, own_hi, in_lo, in_hi, 0);
            }
            t_sweep += MPI_Wtime() - t1;
            MPI_Allreduce(&change, &res_sum, 1, MPI_DOUBLE, MPI_SUM, cart);
            residual = sqrt(res_sum);
        }
        stale += stale_now;
        double *t = u;
        u = un;
        un = t;
        if (tol > 0 && residual >= 0 && residual < tol) {
            it++;
            break;
        }
    }
    double elapsed = MPI_Wtime() - t0;

    if (pipelined) {
        /* Drain. Ranks may have started different numbers of residual reductions: the ones
         * behind start more until all have started as many (on their own communicator, so
         * this agreement on `cart` cannot be confused with them). */
        long mine = started, most = 0;
        MPI_Allreduce(&mine, &most, 1, MPI_LONG, MPI_MAX, cart);
        MPI_Wait(&resreq, MPI_STATUS_IGNORE);
        for (; mine < most; mine++) { /* nonblocking: a blocking one would not match */
            MPI_Iallreduce(&res_local, &res_sum, 1, MPI_DOUBLE, MPI_SUM, rescomm, &resreq);
            MPI_Wait(&resreq, MPI_STATUS_IGNORE);
        }
        /* Every send is finished (taking the neighbour's faces meanwhile: it may be waiting
         * for its own send in the same way); the neighbours say how many they sent, and the
         * ones not yet taken are received. */
        MPI_Request creq[12];
        long theirs[3][2] = {{0}};
        int nc = 0;
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++) {
                int nb = s ? hi_nb[d] : lo_nb[d], done = 0;
                if (nb == MPI_PROC_NULL)
                    continue;
                while (!done) {
                    MPI_Test(&sreq[d][s], &done, MPI_STATUS_IGNORE);
                    take_faces(u, un, rbuf[d][s], d, s, nb, &got[d][s]);
                }
                MPI_Irecv(&theirs[d][s], 1, MPI_LONG, nb, TAG_COUNT + 2 * d + s, cart,
                          &creq[nc++]);
                MPI_Isend(&sent[d][s], 1, MPI_LONG, nb, TAG_COUNT + 2 * d + (1 - s), cart,
                          &creq[nc++]);
            }
        MPI_Waitall(nc, creq, statuses);
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                for (long left = theirs[d][s] - got[d][s]; left > 0; left--)
                    MPI_Recv(rbuf[d][s], face_len(d), MPI_DOUBLE, s ? hi_nb[d] : lo_nb[d],
                             TAG_HALO + 2 * d + s, cart, MPI_STATUS_IGNORE);
    }

    double sum = 0.0, total = 0.0, t_max = 0.0, sweep_max = 0.0;
    for (int v = 0; v < V; v++)
        for (int i = H; i < own_hi[0]; i++)
            for (int j = H; j < own_hi[1]; j++)
                for (int k = H; k < own_hi[2]; k++)
                    sum += u[at(v, i, j, k)];
    long stale_total = 0, stale_l = stale;
    MPI_Reduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, 0, cart);
    MPI_Reduce(&elapsed, &t_max, 1, MPI_DOUBLE, MPI_MAX, 0, cart);
    MPI_Reduce(&t_sweep, &sweep_max, 1, MPI_DOUBLE, MPI_MAX, 0, cart);
    MPI_Reduce(&stale_l, &stale_total, 1, MPI_LONG, MPI_SUM, 0, cart);
    if (rank == 0)
        printf("uranus variant=%s ranks=%d dims=%dx%dx%d grid=%dx%dx%d vars=%d work=%d iters=%d "
               "time=%.4f per_iter=%.5f sweep=%.4f residual=%.12e checksum=%.12e stale=%ld confirms=%ld\n",
               variant, size, dims[0], dims[1], dims[2], grid[0], grid[1], grid[2], V, W, it,
               t_max, t_max / (it > 0 ? it : 1), sweep_max, residual, total, stale_total, confirms);

    for (int d = 0; d < 3; d++) {
        for (int s = 0; s < 2; s++) {
            MPI_Type_free(&send_t[d][s]);
            MPI_Type_free(&recv_t[d][s]);
            free(sbuf[d][s]);
            free(rbuf[d][s]);
        }
        free(fx[d]);
    }
    free(u);
    free(un);
    MPI_Comm_free(&rescomm);
    MPI_Comm_free(&confcomm);
    MPI_Comm_free(&cart);
    MPI_Finalize();
    return 0;
}
