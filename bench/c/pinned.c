/* A PMPI layer that takes away the two freedoms MPI leaves an implementation in
 * ordinary programs, so that one unchanged binary can be compared bit for bit on
 * two MPI libraries (bench/pinned_compare.sh):
 *   - which message a blocking wildcard receive (MPI_Recv from MPI_ANY_SOURCE) takes when several are
 *     waiting: PIN_ANY_SOURCE=asc|desc waits for a first message, lets the others
 *     arrive (PIN_WAIT_US, default 20000), and then takes the lowest (highest)
 *     source that has one;
 *   - how a reduction associates the members' values: PIN_SUM=left|right gathers
 *     every contribution of an MPI_SUM over MPI_DOUBLE (MPI_Reduce, MPI_Allreduce)
 *     and adds them as ((x0 + x1) + x2) + ... or x0 + (x1 + (x2 + ...)).
 * PIN_REPLAY=DIR instead has each blocking wildcard receive take the source that the
 * same receive took in the run that wrote the PIN_LOG in DIR (MPICH's ABI numbering of
 * MPI_ANY_SOURCE, -2), so that a run's arrival order can be replayed on another library.
 * PIN_LOG=DIR writes DIR/rN.txt per world rank: every send, receive, broadcast and
 * reduction with a hash of the data it carried (packed, so derived datatypes are
 * compared by content), for finding the first call where two runs part.
 *   mpicc.mpich -O2 -shared -fPIC -o libpinned.so bench/c/pinned.c
 *   LD_PRELOAD=./libpinned.so PIN_ANY_SOURCE=asc PIN_SUM=left mpiexec -n 4 ./a.out */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *log_file;
static long seq;

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* The hash of `count` elements of `t` at `buf`, packed (the datatype's content). */
static uint64_t content(const void *buf, int count, MPI_Datatype t, MPI_Comm c) {
    int size = 0, pos = 0;
    PMPI_Pack_size(count, t, c, &size);
    unsigned char *tmp = malloc((size_t)size + 1);
    PMPI_Pack(buf, count, t, tmp, size, &pos, c);
    uint64_t h = fnv1a(tmp, (size_t)pos);
    free(tmp);
    return h;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    const char *dir = getenv("PIN_LOG");
    if (!dir) return;
    if (!log_file) {
        int r = 0;
        char name[4096];
        PMPI_Comm_rank(MPI_COMM_WORLD, &r);
        snprintf(name, sizeof name, "%s/r%d.txt", dir, r);
        log_file = fopen(name, "w");
        if (!log_file) return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(log_file, "%ld ", seq++);
    vfprintf(log_file, fmt, ap);
    fputc('\n', log_file);
    va_end(ap);
}

/* The sources a PIN_LOG of an earlier run shows this rank's wildcard receives took. */
static int *replay;
static long nreplay, next_replay;

static void load_replay(const char *dir) {
    int r = 0;
    char name[4096], line[512];
    PMPI_Comm_rank(MPI_COMM_WORLD, &r);
    snprintf(name, sizeof name, "%s/r%d.txt", dir, r);
    FILE *f = fopen(name, "r");
    if (!f) {
        fprintf(stderr, "pinned: PIN_REPLAY: cannot read %s\n", name);
        PMPI_Abort(MPI_COMM_WORLD, 2);
    }
    long cap = 1024;
    replay = malloc(sizeof *replay * (size_t)cap);
    while (fgets(line, sizeof line, f)) {
        char *got = strstr(line, " got=");
        if (strncmp(strchr(line, ' ') + 1, "recv ", 5) != 0 || !strstr(line, " s=-2 ") || !got)
            continue;
        if (nreplay == cap) replay = realloc(replay, sizeof *replay * (size_t)(cap *= 2));
        replay[nreplay++] = atoi(got + 5);
    }
    fclose(f);
}

/* The source a wildcard receive of `tag` on `c` is pinned to, or MPI_ANY_SOURCE. */
static int pinned_source(int tag, MPI_Comm c) {
    const char *from_log = getenv("PIN_REPLAY");
    if (from_log) {
        if (!replay) load_replay(from_log);
        if (next_replay < nreplay) return replay[next_replay++];
        return MPI_ANY_SOURCE;
    }
    const char *order = getenv("PIN_ANY_SOURCE");
    if (!order) return MPI_ANY_SOURCE;
    const char *w = getenv("PIN_WAIT_US");
    MPI_Status first;
    PMPI_Probe(MPI_ANY_SOURCE, tag, c, &first);
    usleep(w ? (useconds_t)atoi(w) : 20000);
    int n = 0;
    PMPI_Comm_size(c, &n);
    for (int k = 0; k < n; k++) {
        int s = order[0] == 'd' ? n - 1 - k : k, flag = 0;
        PMPI_Iprobe(s, tag, c, &flag, MPI_STATUS_IGNORE);
        if (flag) return s;
    }
    return first.MPI_SOURCE;
}

/* A sum of doubles in a fixed association; root < 0 for the all- form. Returns 0
 * where the call is not one it pins. */
static int pinned_sum(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root,
                      MPI_Comm c) {
    const char *assoc = getenv("PIN_SUM");
    if (!assoc || t != MPI_DOUBLE || op != MPI_SUM) return 0;
    int me = 0, size = 0;
    PMPI_Comm_rank(c, &me);
    PMPI_Comm_size(c, &size);
    const void *mine = s == MPI_IN_PLACE ? r : s;
    double *all = malloc(sizeof(double) * (size_t)n * (size_t)size + 1);
    if (root < 0)
        PMPI_Allgather(mine, n, t, all, n, t, c);
    else
        PMPI_Gather(mine, n, t, all, n, t, root, c);
    if (root < 0 || me == root) {
        double *out = r;
        for (int i = 0; i < n; i++) {
            double a;
            if (assoc[0] == 'l') {
                a = all[i];
                for (int k = 1; k < size; k++) a = a + all[(size_t)k * n + i];
            } else {
                a = all[(size_t)(size - 1) * n + i];
                for (int k = size - 2; k >= 0; k--) a = all[(size_t)k * n + i] + a;
            }
            out[i] = a;
        }
    }
    free(all);
    return 1;
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    uint64_t in = content(s == MPI_IN_PLACE ? r : s, n, t, c);
    int e = pinned_sum(s, r, n, t, op, -1, c) ? MPI_SUCCESS : PMPI_Allreduce(s, r, n, t, op, c);
    say("allreduce n=%d in=%016llx out=%016llx", n, (unsigned long long)in,
        (unsigned long long)content(r, n, t, c));
    return e;
}

int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
    int me = 0;
    PMPI_Comm_rank(c, &me);
    uint64_t in = content(s == MPI_IN_PLACE ? r : s, n, t, c);
    int e = pinned_sum(s, r, n, t, op, root, c) ? MPI_SUCCESS
                                                 : PMPI_Reduce(s, r, n, t, op, root, c);
    say("reduce n=%d root=%d in=%016llx out=%016llx", n, root, (unsigned long long)in,
        me == root ? (unsigned long long)content(r, n, t, c) : 0ULL);
    return e;
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
    int e = PMPI_Bcast(b, n, t, root, c);
    say("bcast n=%d root=%d h=%016llx", n, root, (unsigned long long)content(b, n, t, c));
    return e;
}

#define SEND(NAME, PNAME)                                                                  \
    int NAME(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c) {           \
        say(#NAME " n=%d d=%d tag=%d h=%016llx", n, d, tag,                                \
            (unsigned long long)content(b, n, t, c));                                      \
        return PNAME(b, n, t, d, tag, c);                                                  \
    }
SEND(MPI_Send, PMPI_Send)
SEND(MPI_Rsend, PMPI_Rsend)
SEND(MPI_Ssend, PMPI_Ssend)

int MPI_Isend(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c, MPI_Request *q) {
    say("MPI_Isend n=%d d=%d tag=%d h=%016llx", n, d, tag, (unsigned long long)content(b, n, t, c));
    return PMPI_Isend(b, n, t, d, tag, c, q);
}

int MPI_Recv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Status *st) {
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int from = s == MPI_ANY_SOURCE ? pinned_source(tag, c) : s;
    int e = PMPI_Recv(b, n, t, from, tag, c, st);
    say("recv n=%d s=%d tag=%d got=%d h=%016llx", n, s, tag, st->MPI_SOURCE,
        (unsigned long long)content(b, n, t, c));
    return e;
}

/* Nonblocking receives are hashed when a wait or test completes them. */
struct pending {
    MPI_Request req;
    void *buf;
    int count, source, tag;
    MPI_Datatype type;
    MPI_Comm comm;
};
static struct pending pend[4096];
static int npend;

int MPI_Irecv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Request *q) {
    int e = PMPI_Irecv(b, n, t, s, tag, c, q);
    if (npend < (int)(sizeof pend / sizeof pend[0]))
        pend[npend++] = (struct pending){*q, b, n, s, tag, t, c};
    return e;
}

static void completed(MPI_Request r, const MPI_Status *st) {
    for (int i = 0; i < npend; i++)
        if (pend[i].req == r) {
            struct pending *p = &pend[i];
            say("irecv n=%d s=%d tag=%d got=%d h=%016llx", p->count, p->source, p->tag,
                st->MPI_SOURCE, (unsigned long long)content(p->buf, p->count, p->type, p->comm));
            *p = pend[--npend];
            return;
        }
}

/* MPI_Waitall (flag NULL) or MPI_Testall, logging the receives it completes. */
static int all(int n, MPI_Request *q, int *flag, MPI_Status *st) {
    MPI_Request *before = malloc(sizeof *before * (size_t)(n + 1));
    MPI_Status *own = malloc(sizeof *own * (size_t)(n + 1));
    memcpy(before, q, sizeof *before * (size_t)n);
    if (st == MPI_STATUSES_IGNORE) st = own;
    int e = flag ? PMPI_Testall(n, q, flag, st) : PMPI_Waitall(n, q, st);
    if (!flag || *flag)
        for (int i = 0; i < n; i++) completed(before[i], &st[i]);
    free(before);
    free(own);
    return e;
}

int MPI_Waitall(int n, MPI_Request *q, MPI_Status *st) { return all(n, q, NULL, st); }

int MPI_Testall(int n, MPI_Request *q, int *flag, MPI_Status *st) { return all(n, q, flag, st); }

int MPI_Wait(MPI_Request *q, MPI_Status *st) {
    MPI_Request before = *q;
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    int e = PMPI_Wait(q, st);
    completed(before, st);
    return e;
}

int MPI_Sendrecv(const void *sb, int sn, MPI_Datatype stype, int d, int stag, void *rb, int rn,
                 MPI_Datatype rtype, int s, int rtag, MPI_Comm c, MPI_Status *st) {
    MPI_Status own;
    if (st == MPI_STATUS_IGNORE) st = &own;
    uint64_t out = content(sb, sn, stype, c);
    int e = PMPI_Sendrecv(sb, sn, stype, d, stag, rb, rn, rtype, s, rtag, c, st);
    say("sendrecv d=%d s=%d sent=%016llx got=%016llx", d, s, (unsigned long long)out,
        (unsigned long long)content(rb, rn, rtype, c));
    return e;
}

int MPI_Finalize(void) {
    if (log_file) fclose(log_file);
    log_file = NULL;
    return PMPI_Finalize();
}
