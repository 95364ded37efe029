/* A DSMC-like particle Monte Carlo (PACX-MPI paper, section on P3T-DSMC): a 2-D box split into
 * slabs along x, one per rank; each step particles move ballistically (specular walls), leave
 * for the neighbouring slab when they cross its border, and collide in pairs within cells
 * (isotropic hard-sphere scattering, which keeps energy and momentum). The left half starts
 * hot, the right half cold, so heat flows across the slabs. Loosely coupled: a step talks only
 * to the two neighbours, and nothing global happens until the end.
 *
 * `--work W` evaluates each particle's cross-section factor by W Newton steps: the stand-in
 * for a real code's per-particle cost, so that the ratio of computation to communication can
 * be set. Random numbers come from a hash of (seed, step, cell, particle id), so a run's answer
 * depends only on the number of ranks and the options, not on the MPI library or on timing.
 *
 * Exchange (`--exchange`):
 *   overlap   migrants are sent with MPI_Isend, the slab collides meanwhile, and the arrivals
 *             join at the end of the step (they collide from the next step on);
 *   blocking  migrants are exchanged with MPI_Sendrecv first, then the slab collides.
 *
 * It prints one line of key=value pairs (rank 0). Plain MPI: it builds with any mpicc and runs
 * on MPICH or on metampi's C library (`metampi run -n 4 ./dsmc`). */
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCY 8          /* cells across the box */
#define TAG_COUNT 21
#define TAG_DATA 22

typedef struct {
    double x, y, vx, vy, vz;
    long long id;
} Particle;

static int W = 0;

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A uniform number in [0, 1) from a hash of three values. */
static double uniform(uint64_t a, uint64_t b, uint64_t c) {
    return (mix(mix(mix(a) ^ b) ^ c) >> 11) * (1.0 / 9007199254740992.0);
}

static double gaussian(uint64_t a, uint64_t b, uint64_t c) {
    double u1 = uniform(a, b, 2 * c), u2 = uniform(a, b, 2 * c + 1);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

/* sqrt(1 + v^2) by W Newton steps: the per-particle cost knob. */
static double cross_factor(const Particle *p) {
    double q = 1.0 + p->vx * p->vx + p->vy * p->vy + p->vz * p->vz, y = 1.0;
    for (int w = 0; w < W; w++)
        y = 0.5 * (y + q / y);
    return y;
}

typedef struct {
    Particle *p;
    size_t n, cap;
} List;

static void push(List *l, const Particle *p) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->p = realloc(l->p, l->cap * sizeof(Particle));
    }
    l->p[l->n++] = *p;
}

/* Makes room for exactly n particles, to be received into. */
static void resize(List *l, size_t n) {
    if (n > l->cap) {
        l->cap = n;
        l->p = realloc(l->p, n * sizeof(Particle));
    }
    l->n = n;
}

/* Specular reflection of one coordinate at the walls 0 and `wall` (the far wall excluded). */
static void reflect(double *pos, double *vel, double wall) {
    if (*pos < 0) {
        *pos = -*pos;
        *vel = -*vel;
    } else if (*pos >= wall) {
        *pos = nextafter(2.0 * wall - *pos, 0.0);
        *vel = -*vel;
    }
}

static int by_id(const void *a, const void *b) {
    long long x = ((const Particle *)a)->id, y = ((const Particle *)b)->id;
    return (x > y) - (x < y);
}

/* Collides the particles of each cell of [xlo, xhi) in pairs; particles outside the slab
 * (passing through to a farther rank) are left alone. Returns the collisions made. */
static long collide(List *l, int xlo, int xhi, long step, uint64_t seed, double gmax) {
    int cells = (xhi - xlo) * NCY;
    size_t *start = calloc(cells + 1, sizeof(size_t));
    Particle *sorted = malloc((l->n ? l->n : 1) * sizeof(Particle));
    double *y = malloc((l->n ? l->n : 1) * sizeof(double));
    size_t outside = 0;
    for (size_t i = 0; i < l->n; i++) {
        int cx = (int)floor(l->p[i].x) - xlo, cy = (int)l->p[i].y;
        if (cx >= 0 && cx < xhi - xlo)
            start[cx * NCY + cy + 1]++;
        else
            outside++;
    }
    for (int c = 0; c < cells; c++)
        start[c + 1] += start[c];
    size_t *fill = malloc((cells + 1) * sizeof(size_t)), rest = start[cells];
    memcpy(fill, start, (cells + 1) * sizeof(size_t));
    for (size_t i = 0; i < l->n; i++) {
        int cx = (int)floor(l->p[i].x) - xlo, cy = (int)l->p[i].y;
        if (cx >= 0 && cx < xhi - xlo)
            sorted[fill[cx * NCY + cy]++] = l->p[i];
        else
            sorted[rest++] = l->p[i];
    }
    long made = 0;
    for (int c = 0; c < cells; c++) {
        size_t a = start[c], n = start[c + 1] - a;
        Particle *cell = sorted + a;
        qsort(cell, n, sizeof(Particle), by_id); /* the order arrivals came in must not matter */
        uint64_t cell_id = (uint64_t)(xlo * NCY + c);
        for (size_t i = n; i > 1; i--) { /* a shuffle that depends on step and cell only */
            size_t j = (size_t)(uniform(seed, step, cell_id * 4096 + i) * i);
            Particle t = cell[i - 1];
            cell[i - 1] = cell[j];
            cell[j] = t;
        }
        for (size_t i = 0; i < n; i++)
            y[a + i] = cross_factor(&cell[i]);
        for (size_t i = 0; i + 1 < n; i += 2) {
            Particle *p = &cell[i], *q = &cell[i + 1];
            double gx = p->vx - q->vx, gy = p->vy - q->vy, gz = p->vz - q->vz;
            double g = sqrt(gx * gx + gy * gy + gz * gz);
            double ya = y[a + i], yb = y[a + i + 1];
            double accept = g / gmax * 2.0 * ya * yb / (ya * ya + yb * yb);
            uint64_t pair = (uint64_t)p->id * 1000003ULL + (uint64_t)q->id;
            if (uniform(seed ^ 0x5bd1e995, step, 3 * pair) >= accept)
                continue;
            double ct = 2.0 * uniform(seed ^ 0x5bd1e995, step, 3 * pair + 1) - 1.0;
            double st = sqrt(1.0 - ct * ct);
            double phi = 2.0 * M_PI * uniform(seed ^ 0x5bd1e995, step, 3 * pair + 2);
            double cx = 0.5 * (p->vx + q->vx), cy = 0.5 * (p->vy + q->vy),
                   cz = 0.5 * (p->vz + q->vz);
            double nx = g * st * cos(phi), ny = g * st * sin(phi), nz = g * ct;
            p->vx = cx + 0.5 * nx;
            p->vy = cy + 0.5 * ny;
            p->vz = cz + 0.5 * nz;
            q->vx = cx - 0.5 * nx;
            q->vy = cy - 0.5 * ny;
            q->vz = cz - 0.5 * nz;
            made++;
        }
    }
    (void)outside;
    memcpy(l->p, sorted, l->n * sizeof(Particle));
    free(start);
    free(fill);
    free(sorted);
    free(y);
    return made;
}

static void usage(void) {
    fprintf(stderr, "usage: dsmc [--particles N per rank] [--steps S] [--cells C per rank]\n"
                    "            [--work W] [--exchange overlap|blocking] [--seed S]\n");
}

int main(int argc, char **argv) {
    long per_rank = 1935, steps = 20;
    int cells_x = 16;
    uint64_t seed = 1;
    const char *exchange = "overlap";
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int a = 1; a < argc; a++) {
        const char *val = a + 1 < argc ? argv[a + 1] : NULL;
        int ok = val != NULL;
        if (!strcmp(argv[a], "--particles") && ok)
            per_rank = atol(val);
        else if (!strcmp(argv[a], "--steps") && ok)
            steps = atol(val);
        else if (!strcmp(argv[a], "--cells") && ok)
            cells_x = atoi(val);
        else if (!strcmp(argv[a], "--work") && ok)
            W = atoi(val);
        else if (!strcmp(argv[a], "--seed") && ok)
            seed = strtoull(val, NULL, 10);
        else if (!strcmp(argv[a], "--exchange") && ok)
            exchange = val;
        else
            ok = 0;
        if (!ok || per_rank < 0 || cells_x < 1) {
            if (rank == 0) {
                fprintf(stderr, "dsmc: bad option %s\n", argv[a]);
                usage();
            }
            MPI_Finalize();
            return 2;
        }
        a++;
    }
    int blocking = !strcmp(exchange, "blocking");
    if (!blocking && strcmp(exchange, "overlap")) {
        if (rank == 0)
            fprintf(stderr, "dsmc: unknown exchange %s\n", exchange);
        MPI_Finalize();
        return 2;
    }

    /* The particle as an MPI struct type, so that the same program is right between
     * machines whose layouts differ. */
    MPI_Datatype ptype, tmp;
    int lens[2] = {5, 1};
    MPI_Aint disp[2] = {offsetof(Particle, x), offsetof(Particle, id)};
    MPI_Datatype types[2] = {MPI_DOUBLE, MPI_LONG_LONG};
    MPI_Type_create_struct(2, lens, disp, types, &tmp);
    MPI_Type_create_resized(tmp, 0, sizeof(Particle), &ptype);
    MPI_Type_commit(&ptype);
    MPI_Type_free(&tmp);

    int xlo = rank * cells_x, xhi = xlo + cells_x, width = size * cells_x;
    int left = rank > 0 ? rank - 1 : MPI_PROC_NULL, right = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
    List mine = {0}, out[2] = {{0}, {0}}, in[2] = {{0}, {0}};
    for (long i = 0; i < per_rank; i++) {
        Particle p;
        p.id = (long long)rank * per_rank + i;
        p.x = xlo + uniform(seed, p.id, 1) * cells_x;
        p.y = uniform(seed, p.id, 2) * NCY;
        double temp = p.x < 0.5 * width ? 2.0 : 0.5; /* hot left, cold right */
        p.vx = sqrt(temp) * gaussian(seed, p.id, 3);
        p.vy = sqrt(temp) * gaussian(seed, p.id, 4);
        p.vz = sqrt(temp) * gaussian(seed, p.id, 5);
        push(&mine, &p);
    }
    double e0 = 0.0, e0_total = 0.0;
    for (size_t i = 0; i < mine.n; i++) {
        const Particle *p = &mine.p[i];
        e0 += 0.5 * (p->vx * p->vx + p->vy * p->vy + p->vz * p->vz);
    }
    MPI_Reduce(&e0, &e0_total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    const double dt = 0.1, gmax = 6.0;
    long collisions = 0, migrated = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long step = 0; step < steps; step++) {
        /* Move, reflect at the walls, and take out the particles leaving the slab. */
        size_t kept = 0;
        out[0].n = out[1].n = 0;
        for (size_t i = 0; i < mine.n; i++) {
            Particle p = mine.p[i];
            p.x += p.vx * dt;
            p.y += p.vy * dt;
            reflect(&p.x, &p.vx, width);
            reflect(&p.y, &p.vy, NCY);
            if (p.x < xlo)
                push(&out[0], &p);
            else if (p.x >= xhi)
                push(&out[1], &p);
            else
                mine.p[kept++] = p;
        }
        mine.n = kept;
        migrated += (long)(out[0].n + out[1].n);
        int nb[2] = {left, right}, n_out[2] = {(int)out[0].n, (int)out[1].n}, n_in[2] = {0, 0};
        if (blocking) {
            for (int s = 0; s < 2; s++) {
                MPI_Sendrecv(&n_out[s], 1, MPI_INT, nb[s], TAG_COUNT, &n_in[1 - s], 1, MPI_INT,
                             nb[1 - s], TAG_COUNT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                resize(&in[1 - s], n_in[1 - s]);
                MPI_Sendrecv(out[s].p, n_out[s], ptype, nb[s], TAG_DATA, in[1 - s].p,
                             n_in[1 - s], ptype, nb[1 - s], TAG_DATA, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
            }
            for (int s = 0; s < 2; s++)
                for (size_t i = 0; i < in[s].n; i++)
                    push(&mine, &in[s].p[i]);
            collisions += collide(&mine, xlo, xhi, step, seed, gmax);
        } else {
            MPI_Request sreq[4], creq[2];
            MPI_Status st[4]; /* MPI_STATUSES_IGNORE draws a false gcc warning */
            for (int s = 0; s < 2; s++) {
                MPI_Irecv(&n_in[s], 1, MPI_INT, nb[s], TAG_COUNT, MPI_COMM_WORLD, &creq[s]);
                MPI_Isend(&n_out[s], 1, MPI_INT, nb[s], TAG_COUNT, MPI_COMM_WORLD, &sreq[2 * s]);
                MPI_Isend(out[s].p, n_out[s], ptype, nb[s], TAG_DATA, MPI_COMM_WORLD,
                          &sreq[2 * s + 1]);
            }
            collisions += collide(&mine, xlo, xhi, step, seed, gmax);
            MPI_Waitall(2, creq, st);
            for (int s = 0; s < 2; s++) {
                resize(&in[s], n_in[s]);
                MPI_Recv(in[s].p, n_in[s], ptype, nb[s], TAG_DATA, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                for (size_t i = 0; i < in[s].n; i++)
                    push(&mine, &in[s].p[i]);
            }
            MPI_Waitall(4, sreq, st);
        }
    }
    double elapsed = MPI_Wtime() - t0;

    /* Conserved totals (count, energy, momentum), and the energy left in the hot half. */
    double local[7] = {(double)mine.n, 0, 0, 0, 0, 0, (double)collisions}, total[7];
    for (size_t i = 0; i < mine.n; i++) {
        const Particle *p = &mine.p[i];
        double e = 0.5 * (p->vx * p->vx + p->vy * p->vy + p->vz * p->vz);
        local[1] += e;
        local[2] += p->vx;
        local[3] += p->vy;
        local[4] += p->vz;
        if (p->x < 0.5 * width)
            local[5] += e;
    }
    long mig_total = 0;
    double t_max = 0;
    MPI_Reduce(local, total, 7, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&migrated, &mig_total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&elapsed, &t_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("dsmc exchange=%s ranks=%d per_rank=%ld steps=%ld work=%d time=%.4f "
               "per_step=%.6f particles=%.0f energy0=%.12e energy=%.12e hot_half=%.12e momentum=%.6e,%.6e,%.6e "
               "collisions=%.0f migrated=%ld\n",
               exchange, size, per_rank, steps, W, t_max, t_max / (steps > 0 ? steps : 1),
               total[0], e0_total, total[1], total[5], total[2], total[3], total[4], total[6], mig_total);
    free(mine.p);
    for (int s = 0; s < 2; s++) {
        free(out[s].p);
        free(in[s].p);
    }
    MPI_Type_free(&ptype);
    MPI_Finalize();
    return 0;
}
