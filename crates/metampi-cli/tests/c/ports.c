/* Ports and names through the C ABI. Modes (argv[1]):
 *   split   one job: the world's halves meet through a published port (MPI_Open_port,
 *           MPI_Publish_name, MPI_Lookup_name, MPI_Comm_accept/_connect), then ranks 0 and
 *           1 join over a TCP socket of their own (MPI_Comm_join), and bad ports and names
 *           fail with their classes;
 *   server  a job that publishes argv[2] and accepts one client job;
 *   client  a job that looks argv[2] up and connects.
 * Rank 0 prints "ports: ok" (split) or "server: ok"/"client: ok", or FAIL lines.
 * Run by tests/c_spawn.rs. */
#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

/* Traffic both ways over `inter` (each side's rank r sends to the other's r % remote),
 * a broadcast from side `accepting`'s rank 0, reduce-scatters, and a merge. */
static void exercise(MPI_Comm inter, int accepting) {
    int rank, size, rsize;
    MPI_Comm_rank(inter, &rank);
    MPI_Comm_size(inter, &size);
    MPI_Comm_remote_size(inter, &rsize);
    int out = 100 * accepting + rank, in = -1;
    MPI_Request r;
    MPI_Isend(&out, 1, MPI_INT, rank % rsize, 3, inter, &r);
    for (int p = 0; p < rsize; p++) {
        if (p % size != rank) continue;
        MPI_Recv(&in, 1, MPI_INT, p, 3, inter, MPI_STATUS_IGNORE);
        CHECK(in == 100 * !accepting + p, "got %d from remote %d", in, p);
    }
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    int b = accepting ? 777 : 0;
    MPI_Bcast(&b, 1, MPI_INT, accepting ? (rank == 0 ? MPI_ROOT : MPI_PROC_NULL) : 0, inter);
    CHECK(b == 777 || accepting, "broadcast over the port's intercommunicator gave %d", b);
    /* Reduce-scatter: each group's 6-element vectors, summed, split among the other group. */
    int vec[6], counts[8], displ = 0, got[6];
    for (int k = 0; k < 6; k++) vec[k] = (100 * accepting + rank) * 1000 + k;
    for (int i = 0; i < size; i++) {
        counts[i] = 6 / size + (i < 6 % size);
        if (i < rank) displ += counts[i];
    }
    MPI_Reduce_scatter(vec, got, counts, MPI_INT, MPI_SUM, inter);
    for (int k = 0; k < counts[rank]; k++) {
        int want = 0;
        for (int q = 0; q < rsize; q++) want += (100 * !accepting + q) * 1000 + displ + k;
        CHECK(got[k] == want, "reduce_scatter element %d: %d, not %d", displ + k, got[k], want);
    }
    MPI_Reduce_scatter_block(vec, got, 6 / size, MPI_INT, MPI_SUM, inter);
    for (int k = 0; k < 6 / size; k++) {
        int want = 0;
        for (int q = 0; q < rsize; q++) want += (100 * !accepting + q) * 1000 + rank * (6 / size) + k;
        CHECK(got[k] == want, "reduce_scatter_block element %d: %d, not %d", k, got[k], want);
    }
    MPI_Comm merged;
    int msize, sum = 0, one = 1;
    MPI_Intercomm_merge(inter, !accepting, &merged);
    MPI_Comm_size(merged, &msize);
    CHECK(msize == size + rsize, "merge of %d + %d has %d", size, rsize, msize);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
    CHECK(sum == msize, "allreduce over the merge gave %d of %d", sum, msize);
    MPI_Comm_free(&merged);
}

static void split(void) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int accepting = rank < (size + 1) / 2;
    MPI_Comm half, inter;
    MPI_Comm_split(MPI_COMM_WORLD, accepting, rank, &half);
    char service[64], port[MPI_MAX_PORT_NAME] = "";
    snprintf(service, sizeof service, "metampi-ports-test-%d", (int)getpid());
    MPI_Bcast(service, sizeof service, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (accepting && rank == 0) {
        MPI_Open_port(MPI_INFO_NULL, port);
        MPI_Publish_name(service, MPI_INFO_NULL, port);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (accepting) {
        MPI_Comm_accept(port, MPI_INFO_NULL, 0, half, &inter);
    } else {
        int hrank;
        MPI_Comm_rank(half, &hrank);
        if (hrank == 0) MPI_Lookup_name(service, MPI_INFO_NULL, port);
        MPI_Comm_connect(port, MPI_INFO_NULL, 0, half, &inter);
    }
    exercise(inter, accepting);
    MPI_Comm_disconnect(&inter);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    if (accepting && rank == 0) {
        int cls, rc;
        rc = MPI_Unpublish_name(service, MPI_INFO_NULL, port);
        CHECK(rc == MPI_SUCCESS, "unpublishing gave %d", rc);
        rc = MPI_Lookup_name(service, MPI_INFO_NULL, port);
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_NAME, "looking up a withdrawn name gave class %d", cls);
        MPI_Close_port(port);
        /* The closed port, and a name that is no port: MPI_ERR_PORT, nobody waits. */
        rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_PORT, "connecting to a closed port gave class %d", cls);
        rc = MPI_Comm_accept("tcp://nowhere", MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_PORT, "accepting on a name that is no port gave class %d", cls);
    }
    MPI_Comm_free(&half);

    /* MPI_Comm_join between ranks 0 and 1 over a loopback socket of their own. */
    if (size >= 2 && rank < 2) {
        int fd = -1, lport = 0;
        if (rank == 0) {
            int ls = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {0};
            socklen_t len = sizeof a;
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            bind(ls, (struct sockaddr *)&a, sizeof a);
            listen(ls, 1);
            getsockname(ls, (struct sockaddr *)&a, &len);
            lport = ntohs(a.sin_port);
            MPI_Send(&lport, 1, MPI_INT, 1, 11, MPI_COMM_WORLD);
            fd = accept(ls, NULL, NULL);
            close(ls);
        } else {
            struct sockaddr_in a = {0};
            MPI_Recv(&lport, 1, MPI_INT, 0, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            fd = socket(AF_INET, SOCK_STREAM, 0);
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            a.sin_port = htons(lport);
            CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect to rank 0's socket");
        }
        MPI_Comm joined;
        int rs = 0, v = rank + 40, w = -1;
        CHECK(MPI_Comm_join(fd, &joined) == MPI_SUCCESS, "MPI_Comm_join failed");
        MPI_Comm_remote_size(joined, &rs);
        CHECK(rs == 1, "joined intercommunicator has a remote group of %d", rs);
        MPI_Sendrecv(&v, 1, MPI_INT, 0, 5, &w, 1, MPI_INT, 0, 5, joined, MPI_STATUS_IGNORE);
        CHECK(w == (1 - rank) + 40, "over the joined intercommunicator: %d", w);
        MPI_Comm_disconnect(&joined);
        close(fd);
    }
}

/* Two jobs: the server publishes `service` and accepts, the client connects. */
static void two_jobs(int server, const char *service) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm inter;
    if (server) {
        if (rank == 0) {
            MPI_Open_port(MPI_INFO_NULL, port);
            MPI_Publish_name(service, MPI_INFO_NULL, port);
        }
        MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
        if (rank == 0) {
            MPI_Unpublish_name(service, MPI_INFO_NULL, port);
            MPI_Close_port(port);
        }
    } else {
        if (rank == 0) {
            /* The server may not have published yet: look again for a while. */
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
            for (int i = 0; i < 600 && MPI_Lookup_name(service, MPI_INFO_NULL, port) != MPI_SUCCESS; i++)
                usleep(50000);
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        }
        MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    }
    exercise(inter, server);
    MPI_Comm_disconnect(&inter);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "split";
    if (strcmp(mode, "split") == 0)
        split();
    else
        two_jobs(strcmp(mode, "server") == 0, argc > 2 ? argv[2] : "metampi-ports-test");
    int all = 0, rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && all == 0) printf("%s: ok\n", strcmp(mode, "split") == 0 ? "ports" : mode);
    MPI_Finalize();
    return all != 0;
}
