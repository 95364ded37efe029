/* Dynamic processes through the C ABI: the program spawns copies of itself with
 * MPI_Comm_spawn and MPI_Comm_spawn_multiple and checks, on both sides, the parent
 * intercommunicator, arguments, MPI_APPNUM, info keys (wdir, env), point-to-point and
 * collectives over the intercommunicator, a merge, disconnecting, and a failed spawn.
 * World rank 0 of the parents prints "spawn: ok" or FAIL lines. Run by tests/c_spawn.rs. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fails = 0;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fails++;                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                         \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
        }                                                                       \
    } while (0)

/* A child of the first spawn: arguments, the parents, traffic and collectives. */
static void child_of_spawn(MPI_Comm parent, int argc, char **argv) {
    int rank, size, psize, flag, *appnum;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_remote_size(parent, &psize);
    CHECK(size == 3, "child world of %d, not 3", size);
    CHECK(argc == 3 && strcmp(argv[2], "two words") == 0, "child arguments lost (argc %d)", argc);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    CHECK(flag && *appnum == 0, "a child of MPI_Comm_spawn has MPI_APPNUM %d", flag ? *appnum : -1);
    MPI_Comm again;
    MPI_Comm_get_parent(&again);
    CHECK(again == parent, "MPI_Comm_get_parent gave another handle the second time");
    /* Each parent sends its rank to child (rank % 3); each child answers with rank*10+k. */
    for (int p = 0; p < psize; p++) {
        if (p % 3 != rank) continue;
        int v;
        MPI_Recv(&v, 1, MPI_INT, p, 7, parent, MPI_STATUS_IGNORE);
        CHECK(v == p, "child %d got %d from parent %d", rank, v, p);
        v = rank * 10 + p;
        MPI_Send(&v, 1, MPI_INT, p, 8, parent);
    }
    int b = 0;
    MPI_Bcast(&b, 1, MPI_INT, 0, parent);
    CHECK(b == 4242, "intercommunicator broadcast gave %d", b);
    int mine = 1000 + rank, theirs = 0;
    MPI_Allreduce(&mine, &theirs, 1, MPI_INT, MPI_SUM, parent);
    CHECK(theirs == psize * (psize - 1) / 2, "allreduce over the intercommunicator gave %d", theirs);
    MPI_Comm merged;
    int msize, mrank;
    MPI_Intercomm_merge(parent, 1, &merged);
    MPI_Comm_size(merged, &msize);
    MPI_Comm_rank(merged, &mrank);
    CHECK(msize == psize + 3 && mrank == psize + rank, "merged: rank %d of %d", mrank, msize);
    int sum = 0;
    MPI_Allreduce(&mrank, &sum, 1, MPI_INT, MPI_SUM, merged);
    CHECK(sum == msize * (msize - 1) / 2, "allreduce over the merge gave %d", sum);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&parent);
    MPI_Comm_get_parent(&again);
    CHECK(again == MPI_COMM_NULL, "MPI_Comm_get_parent after disconnecting is not MPI_COMM_NULL");
}

/* A child of the spawn_multiple: reports its program number, environment and directory. */
static void child_of_multiple(MPI_Comm parent) {
    int *appnum, flag, rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    char cwd[4096] = "";
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    const char *env = getenv("SPAWN_TEST_VALUE");
    int report[4] = {rank, flag ? *appnum : -1, env && strcmp(env, "forty two") == 0,
                     strcmp(cwd, "/") == 0};
    MPI_Send(report, 4, MPI_INT, 0, 9, parent);
    MPI_Comm_disconnect(&parent);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        if (argc > 1 && strcmp(argv[1], "child") == 0)
            child_of_spawn(parent, argc, argv);
        else
            child_of_multiple(parent);
        MPI_Finalize();
        return fails != 0;
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    /* 1. Three children of this program, root 0; the other members' arguments are junk. */
    char *args[] = {"child", "two words", NULL};
    MPI_Comm inter;
    int errs[3] = {-1, -1, -1}, rsize, inter_flag;
    MPI_Comm_spawn(rank == 0 ? argv[0] : "junk", rank == 0 ? args : MPI_ARGV_NULL, rank == 0 ? 3 : -5,
                   MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errs);
    MPI_Comm_test_inter(inter, &inter_flag);
    MPI_Comm_remote_size(inter, &rsize);
    CHECK(inter_flag && rsize == 3, "spawn gave %s of remote size %d", inter_flag ? "an intercommunicator" : "no intercommunicator", rsize);
    CHECK(errs[0] == MPI_SUCCESS && errs[1] == MPI_SUCCESS && errs[2] == MPI_SUCCESS, "error codes %d %d %d", errs[0], errs[1], errs[2]);
    int v = rank;
    MPI_Send(&v, 1, MPI_INT, rank % 3, 7, inter);
    MPI_Recv(&v, 1, MPI_INT, rank % 3, 8, inter, MPI_STATUS_IGNORE);
    CHECK(v == (rank % 3) * 10 + rank, "parent %d got %d back", rank, v);
    int b = 4242;
    MPI_Bcast(&b, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter);
    int theirs = 0;
    MPI_Allreduce(&rank, &theirs, 1, MPI_INT, MPI_SUM, inter);
    CHECK(theirs == 1000 + 1001 + 1002, "allreduce over the intercommunicator gave %d", theirs);
    MPI_Comm merged;
    int mrank, sum = 0;
    MPI_Intercomm_merge(inter, 0, &merged);
    MPI_Comm_rank(merged, &mrank);
    CHECK(mrank == rank, "a parent is rank %d of the merge, not %d", mrank, rank);
    MPI_Allreduce(&mrank, &sum, 1, MPI_INT, MPI_SUM, merged);
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&inter);
    CHECK(inter == MPI_COMM_NULL, "disconnect did not set the handle to MPI_COMM_NULL");

    /* 2. Two programs from the last rank: one child with wdir and env, then two without. */
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "wdir", "/");
    MPI_Info_set(info, "env", "SPAWN_TEST_VALUE=forty two\n");
    char *cmds[2] = {argv[0], argv[0]};
    int counts[2] = {1, 2};
    MPI_Info infos[2] = {info, MPI_INFO_NULL};
    int errs3[3];
    MPI_Comm_spawn_multiple(2, cmds, MPI_ARGVS_NULL, counts, infos, size - 1, MPI_COMM_WORLD, &inter, errs3);
    MPI_Info_free(&info);
    MPI_Comm_remote_size(inter, &rsize);
    CHECK(rsize == 3, "spawn_multiple gave a remote group of %d", rsize);
    if (rank == 0) {
        for (int k = 0; k < rsize; k++) {
            int r[4];
            MPI_Status st;
            MPI_Recv(r, 4, MPI_INT, MPI_ANY_SOURCE, 9, inter, &st);
            int app = st.MPI_SOURCE == 0 ? 0 : 1;
            CHECK(r[0] == st.MPI_SOURCE, "child %d says it is %d", st.MPI_SOURCE, r[0]);
            CHECK(r[1] == app, "child %d has MPI_APPNUM %d, not %d", st.MPI_SOURCE, r[1], app);
            CHECK(r[2] == (app == 0), "child %d: the env key %s", st.MPI_SOURCE, app == 0 ? "was not applied" : "leaked to the other program");
            CHECK(r[3] == (app == 0), "child %d: the wdir key %s", st.MPI_SOURCE, app == 0 ? "was not applied" : "leaked to the other program");
        }
    }
    MPI_Comm_disconnect(&inter);

    /* 3. A program that does not exist: MPI_ERR_SPAWN on every member, and the job goes on. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_spawn("/nonexistent/metampi-no-such-program", MPI_ARGV_NULL, 2, MPI_INFO_NULL, 0,
                            MPI_COMM_WORLD, &inter, MPI_ERRCODES_IGNORE);
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_SPAWN, "spawning a missing program gave class %d, not MPI_ERR_SPAWN", cls);
    MPI_Barrier(MPI_COMM_WORLD);

    int all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && all == 0) printf("spawn: ok, %d parents\n", size);
    MPI_Finalize();
    return all != 0;
}
