/* One-sided communication (MPI-4 chapter 12) through metampi's C library: a C program built
 * with MPICH's mpicc, run by `metampi run` on 1 and 3 ranks (and by MPICH's mpiexec, to check
 * the test itself). Every check that fails prints a line; rank 0 prints
 * "rma suite: N checks, F failed, R ranks". On MPICH, set MPIR_CVAR_ASYNC_PROGRESS=1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int checks = 0, failed = 0, rank = 0, size = 1;

#define CHECK(cond, ...) do { checks++; if (!(cond)) { failed++; \
    printf("FAIL rank %d line %d: ", rank, __LINE__); printf(__VA_ARGS__); printf("\n"); \
    fflush(stdout); } } while (0)

static int error_class(int code) {
    int c = -1;
    MPI_Error_class(code, &c);
    return c;
}

/* Fence epochs: every rank puts to, accumulates into and gets from every rank. */
static void fence(void) {
    /* A multiple of 16 bytes: MPICH 4.0.2 misplaces the parts of other sizes on one host. */
    int n = (size + 8 + 3) / 4 * 4;
    int *base = NULL;
    MPI_Win win;
    int rc = MPI_Win_allocate(n * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    CHECK(rc == MPI_SUCCESS && base != NULL, "allocate rc %d", rc);
    for (int i = 0; i < n; i++) base[i] = -1;
    base[size] = 0;
    int flag = 0, *model = NULL, *flavor = NULL, *unit = NULL;
    MPI_Aint *wsize = NULL;
    void *wbase = NULL;
    MPI_Win_get_attr(win, MPI_WIN_BASE, &wbase, &flag);
    CHECK(flag && wbase == base, "WIN_BASE %p vs %p", wbase, (void *)base);
    MPI_Win_get_attr(win, MPI_WIN_SIZE, &wsize, &flag);
    CHECK(flag && *wsize == (MPI_Aint)(n * sizeof(int)), "WIN_SIZE %ld", flag ? (long)*wsize : -1L);
    MPI_Win_get_attr(win, MPI_WIN_DISP_UNIT, &unit, &flag);
    CHECK(flag && *unit == (int)sizeof(int), "WIN_DISP_UNIT");
    MPI_Win_get_attr(win, MPI_WIN_CREATE_FLAVOR, &flavor, &flag);
    CHECK(flag && *flavor == MPI_WIN_FLAVOR_ALLOCATE, "WIN_CREATE_FLAVOR");
    MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &flag);
    CHECK(flag && (*model == MPI_WIN_UNIFIED || *model == MPI_WIN_SEPARATE), "WIN_MODEL");

    MPI_Win_fence(0, win);
    int one = rank + 1;
    for (int t = 0; t < size; t++) {
        MPI_Put(&rank, 1, MPI_INT, t, rank, 1, MPI_INT, win);
        MPI_Accumulate(&one, 1, MPI_INT, t, size, 1, MPI_INT, MPI_SUM, win);
    }
    /* a strided target: three ints every other slot from size+2, at the right neighbour */
    MPI_Datatype every_other;
    MPI_Type_vector(3, 1, 2, MPI_INT, &every_other);
    MPI_Type_commit(&every_other);
    int three[3] = {rank * 10 + 1, rank * 10 + 2, rank * 10 + 3};
    MPI_Put(three, 3, MPI_INT, (rank + 1) % size, size + 2, 1, every_other, win);
    MPI_Win_fence(0, win);
    for (int r = 0; r < size; r++) CHECK(base[r] == r, "slot %d holds %d", r, base[r]);
    CHECK(base[size] == size * (size + 1) / 2, "sum %d", base[size]);
    int left = (rank + size - 1) % size;
    CHECK(base[size + 2] == left * 10 + 1 && base[size + 3] == -1 && base[size + 4] == left * 10 + 2 &&
          base[size + 6] == left * 10 + 3, "strided put: %d %d %d %d", base[size + 2], base[size + 3],
          base[size + 4], base[size + 6]);
    int got[2] = {-5, -5};
    MPI_Get(got, 1, MPI_INT, (rank + 1) % size, size, 1, MPI_INT, win);
    MPI_Win_fence(MPI_MODE_NOSUCCEED, win);
    CHECK(got[0] == size * (size + 1) / 2 && got[1] == -5, "get %d %d", got[0], got[1]);
    MPI_Type_free(&every_other);
    rc = MPI_Win_free(&win);
    CHECK(rc == MPI_SUCCESS && win == MPI_WIN_NULL, "free rc %d", rc);
}

/* Passive target on a rank that computes without calling MPI: the others' exclusive locks,
 * accumulates and gets complete while it only sleeps and reads its own memory. */
static void passive(void) {
    int busy = size - 1;
    int *base = NULL;
    MPI_Win win;
    MPI_Win_allocate(4 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    base[0] = 0;
    base[1] = 42;
    MPI_Barrier(MPI_COMM_WORLD);
    if (size == 1) {
        int v = 5;
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        MPI_Put(&v, 1, MPI_INT, 0, 0, 1, MPI_INT, win);
        MPI_Win_unlock(0, win);
        CHECK(base[0] == 5, "self put under lock: %d", base[0]);
    } else if (rank == busy) {
        volatile int *seen = base;
        int waited = 0;
        /* no MPI call until the others' updates are all there (10 s at most) */
        while (seen[0] < size - 1 && waited < 10000) {
            usleep(1000);
            waited++;
        }
        CHECK(seen[0] == size - 1, "the busy rank saw %d of %d updates", seen[0], size - 1);
    } else {
        int one = 1, got = -1;
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, busy, 0, win);
        MPI_Accumulate(&one, 1, MPI_INT, busy, 0, 1, MPI_INT, MPI_SUM, win);
        MPI_Win_unlock(busy, win);
        MPI_Win_lock(MPI_LOCK_SHARED, busy, 0, win);
        MPI_Get(&got, 1, MPI_INT, busy, 1, 1, MPI_INT, win);
        MPI_Win_flush(busy, win);
        CHECK(got == 42, "get from the busy rank: %d", got);
        /* a request-based get */
        MPI_Request rq;
        got = -1;
        MPI_Rget(&got, 1, MPI_INT, busy, 1, 1, MPI_INT, win, &rq);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        CHECK(got == 42, "rget from the busy rank: %d", got);
        MPI_Win_unlock(busy, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
}

/* A shared counter: every rank fetches-and-adds under lock_all; compare-and-swap elects one. */
static void atomics(void) {
    long *base = NULL;
    MPI_Win win;
    MPI_Win_allocate(2 * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    base[0] = 0;
    base[1] = -1;
    MPI_Barrier(MPI_COMM_WORLD);
    enum { ROUNDS = 10 };
    long mine[ROUNDS], one = 1;
    MPI_Win_lock_all(0, win);
    for (int i = 0; i < ROUNDS; i++) {
        MPI_Fetch_and_op(&one, &mine[i], MPI_LONG, 0, 0, MPI_SUM, win);
        MPI_Win_flush(0, win);
    }
    long me = rank, minus = -1, old = -2;
    MPI_Compare_and_swap(&me, &minus, &old, MPI_LONG, 0, 1, win);
    MPI_Win_unlock_all(win);
    long *all = malloc(sizeof(long) * ROUNDS * size);
    MPI_Allgather(mine, ROUNDS, MPI_LONG, all, ROUNDS, MPI_LONG, MPI_COMM_WORLD);
    char *hit = calloc(ROUNDS * size, 1);
    int distinct = 1;
    for (int i = 0; i < ROUNDS * size; i++) {
        if (all[i] < 0 || all[i] >= ROUNDS * size || hit[all[i]]) distinct = 0;
        else hit[all[i]] = 1;
    }
    CHECK(distinct, "fetch_and_op gave every value 0..%d once", ROUNDS * size - 1);
    int won = old == -1, winners = 0;
    MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(winners == 1, "%d ranks won the compare-and-swap", winners);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        CHECK(base[0] == ROUNDS * size, "counter %ld", base[0]);
        CHECK(base[1] >= 0 && base[1] < size, "swapped in %ld", base[1]);
        MPI_Win_unlock(0, win);
    }
    free(all);
    free(hit);
    MPI_Win_free(&win);
}

/* Post-start-complete-wait around a ring: each rank puts into its right neighbour. */
static void pscw(void) {
    int *buf = NULL;
    MPI_Alloc_mem(2 * sizeof(int), MPI_INFO_NULL, &buf);
    buf[0] = buf[1] = -1;
    MPI_Win win;
    MPI_Win_create(buf, 2 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Group world, left_g, right_g;
    MPI_Win_get_group(win, &world);
    int gsize = -1;
    MPI_Group_size(world, &gsize);
    CHECK(gsize == size, "window group size %d", gsize);
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    MPI_Group_incl(world, 1, &left, &left_g);
    MPI_Group_incl(world, 1, &right, &right_g);
    for (int round = 0; round < 3; round++) {
        MPI_Win_post(left_g, 0, win);
        MPI_Win_start(right_g, 0, win);
        int v = rank * 100 + round;
        MPI_Put(&v, 1, MPI_INT, right, 0, 1, MPI_INT, win);
        MPI_Win_complete(win);
        MPI_Win_wait(win);
        CHECK(buf[0] == left * 100 + round, "round %d: %d", round, buf[0]);
    }
    MPI_Group_free(&left_g);
    MPI_Group_free(&right_g);
    MPI_Group_free(&world);
    MPI_Win_free(&win);
    MPI_Free_mem(buf);
}

/* A dynamic window: attached memory addressed by absolute displacements. */
static void dynamic(void) {
    MPI_Win win;
    MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    int *mem = malloc(4 * sizeof(int));
    for (int i = 0; i < 4; i++) mem[i] = -1;
    MPI_Win_attach(win, mem, 4 * sizeof(int));
    MPI_Aint mine, *addrs = malloc(sizeof(MPI_Aint) * size);
    MPI_Get_address(mem, &mine);
    MPI_Allgather(&mine, 1, MPI_AINT, addrs, 1, MPI_AINT, MPI_COMM_WORLD);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int v[2] = {rank * 10, rank * 10 + 1};
    MPI_Win_fence(0, win);
    MPI_Put(v, 2, MPI_INT, right, MPI_Aint_add(addrs[right], sizeof(int)), 2, MPI_INT, win);
    MPI_Win_fence(0, win);
    CHECK(mem[0] == -1 && mem[1] == left * 10 && mem[2] == left * 10 + 1 && mem[3] == -1,
          "dynamic: %d %d %d %d", mem[0], mem[1], mem[2], mem[3]);
    MPI_Win_detach(win, mem);
    MPI_Win_free(&win);
    free(mem);
    free(addrs);
}

/* Shared memory: every rank stores into its part; all load every part directly. */
static void shared(void) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int nrank, nsize;
    MPI_Comm_rank(node, &nrank);
    MPI_Comm_size(node, &nsize);
    int *mine = NULL;
    MPI_Win win;
    int rc = MPI_Win_allocate_shared(4 * sizeof(int), sizeof(int), MPI_INFO_NULL, node, &mine, &win);
    CHECK(rc == MPI_SUCCESS, "allocate_shared rc %d", rc);
    MPI_Win_lock_all(0, win);
    for (int i = 0; i < 4; i++) mine[i] = nrank * 100 + i;
    MPI_Win_sync(win);
    MPI_Barrier(node);
    MPI_Win_sync(win);
    for (int r = 0; r < nsize; r++) {
        MPI_Aint qsize = -1;
        int unit = -1;
        int *p = NULL;
        MPI_Win_shared_query(win, r, &qsize, &unit, &p);
        CHECK(qsize == 4 * sizeof(int) && unit == sizeof(int) && p != NULL, "query %d: size %ld unit %d",
              r, (long)qsize, unit);
        if (p) CHECK(p[0] == r * 100 && p[3] == r * 100 + 3, "rank %d's part: %d %d", r, p[0], p[3]);
    }
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Comm_free(&node);
}

static int handler_calls = 0;
static void on_error(MPI_Win *win, int *code, ...) {
    (void)win;
    (void)code;
    handler_calls++;
}

/* Errors go through the window's handler: MPI_ERRORS_RETURN, then one of the program's. */
static void errors(void) {
    int buf[4];
    MPI_Win win;
    MPI_Win_create(buf, sizeof buf, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Errhandler eh;
    MPI_Win_get_errhandler(win, &eh);
    CHECK(eh == MPI_ERRORS_ARE_FATAL, "a window's handler starts as MPI_ERRORS_ARE_FATAL");
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    int rc = MPI_Win_unlock(0, win);
    CHECK(error_class(rc) == MPI_ERR_RMA_SYNC, "unlock without lock: class %d", error_class(rc));
    rc = MPI_Win_lock(12345, 0, 0, win);
    CHECK(rc != MPI_SUCCESS, "a bad lock type fails");
    MPI_Errhandler mine;
    MPI_Win_create_errhandler(on_error, &mine);
    MPI_Win_set_errhandler(win, mine);
    MPI_Win_call_errhandler(win, MPI_ERR_OTHER);
    CHECK(handler_calls == 1, "the program's handler ran %d times", handler_calls);
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&mine);
    char name[MPI_MAX_OBJECT_NAME];
    int len = 0;
    MPI_Win_set_name(win, "rma-suite");
    MPI_Win_get_name(win, name, &len);
    CHECK(strcmp(name, "rma-suite") == 0 && len == 9, "name %s", name);
    MPI_Win_free(&win);
}

int main(int argc, char **argv) {
    /* MPI_THREAD_MULTIPLE lets MPICH make asynchronous progress (MPIR_CVAR_ASYNC_PROGRESS=1),
     * which the passive-target check needs there; metampi's windows progress by themselves. */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fence();
    passive();
    atomics();
    pscw();
    dynamic();
    shared();
    errors();
    int all_failed = 0, all_checks = 0;
    MPI_Reduce(&failed, &all_failed, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("rma suite: %d checks, %d failed, %d ranks\n", all_checks, all_failed, size);
    MPI_Finalize();
    return all_failed != 0;
}
