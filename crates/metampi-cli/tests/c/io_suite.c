/* MPI-IO (MPI-4 chapter 14) through metampi's C library: a C program built with MPICH's
 * mpicc, run by `metampi run` on 1 and 3 ranks. argv[1] is a directory for its files.
 * Every check that fails prints a line; rank 0 prints "io suite: N checks, F failed, R ranks". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks = 0, failed = 0, rank = 0, size = 1;

#define CHECK(cond, ...) do { checks++; if (!(cond)) { failed++; \
    printf("FAIL rank %d line %d: ", rank, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static char dir[512];

static void path(char *out, const char *name) {
    snprintf(out, 600, "%s/%s", dir, name);
}

static int error_class(int code) {
    int c = -1;
    MPI_Error_class(code, &c);
    return c;
}

/* Explicit offsets, the individual pointer, sizes, and errors through the file's handler. */
static void basics(void) {
    char name[600];
    path(name, "basics");
    MPI_File fh;
    int rc = MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
    CHECK(rc == MPI_SUCCESS, "open: %d", rc);
    MPI_File_set_size(fh, 0);
    int amode;
    MPI_File_get_amode(fh, &amode);
    CHECK(amode == (MPI_MODE_CREATE | MPI_MODE_RDWR), "amode %d", amode);
    /* each rank writes 10 ints at its own offset */
    int out[10], in[11];
    for (int i = 0; i < 10; i++) out[i] = rank * 100 + i;
    MPI_Status st;
    rc = MPI_File_write_at(fh, (MPI_Offset)rank * 10 * sizeof(int), out, 10, MPI_INT, &st);
    int n = -1;
    MPI_Get_count(&st, MPI_INT, &n);
    CHECK(rc == MPI_SUCCESS && n == 10, "write_at rc %d count %d", rc, n);
    MPI_File_sync(fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_sync(fh);
    MPI_Offset fsize = -1;
    MPI_File_get_size(fh, &fsize);
    CHECK(fsize == (MPI_Offset)size * 10 * sizeof(int), "size %lld", (long long)fsize);
    /* read the next rank's block through the individual pointer */
    int other = (rank + 1) % size;
    MPI_File_seek(fh, (MPI_Offset)other * 10 * sizeof(int), MPI_SEEK_SET);
    memset(in, -1, sizeof in);
    MPI_File_read(fh, in, 10, MPI_INT, &st);
    MPI_Get_count(&st, MPI_INT, &n);
    CHECK(n == 10 && in[0] == other * 100 && in[9] == other * 100 + 9 && in[10] == -1,
          "read other: n %d in[0] %d in[9] %d", n, in[0], in[9]);
    MPI_Offset pos;
    MPI_File_get_position(fh, &pos);
    CHECK(pos == (MPI_Offset)(other + 1) * 10 * sizeof(int), "position %lld", (long long)pos);
    /* a read past the end returns what there is */
    MPI_File_read_at(fh, fsize - 2 * sizeof(int), in, 5, MPI_INT, &st);
    MPI_Get_count(&st, MPI_INT, &n);
    CHECK(n == 2, "short read count %d", n);
    /* nonblocking at an offset */
    MPI_Request rq;
    memset(in, 0, sizeof in);
    MPI_File_iread_at(fh, (MPI_Offset)rank * 10 * sizeof(int), in, 10, MPI_INT, &rq);
    MPI_Wait(&rq, &st);
    CHECK(in[3] == rank * 100 + 3, "iread_at got %d", in[3]);
    MPI_Barrier(MPI_COMM_WORLD);
    /* set_size and preallocate are collective */
    MPI_File_set_size(fh, 5);
    MPI_File_get_size(fh, &fsize);
    CHECK(fsize == 5, "set_size: %lld", (long long)fsize);
    MPI_Barrier(MPI_COMM_WORLD); /* everyone has seen size 5 before rank 0 grows it */
    MPI_File_preallocate(fh, 64);
    MPI_File_preallocate(fh, 16);
    MPI_File_get_size(fh, &fsize);
    CHECK(fsize == 64, "preallocate: %lld", (long long)fsize);
    /* the file's error handler is MPI_ERRORS_RETURN by default */
    MPI_Errhandler eh;
    MPI_File_get_errhandler(fh, &eh);
    CHECK(eh == MPI_ERRORS_RETURN, "default file errhandler");
    rc = MPI_File_seek(fh, -1, MPI_SEEK_SET);
    CHECK(rc != MPI_SUCCESS && error_class(rc) == MPI_ERR_ARG, "negative seek: %d", rc);
    MPI_Group g, wg;
    int cmp;
    MPI_File_get_group(fh, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_compare(g, wg, &cmp);
    CHECK(cmp == MPI_IDENT, "group compare %d", cmp);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    rc = MPI_File_close(&fh);
    CHECK(rc == MPI_SUCCESS && fh == MPI_FILE_NULL, "close");
    MPI_Barrier(MPI_COMM_WORLD);
    /* read-only: writing fails, creating with it is an amode error */
    rc = MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh);
    CHECK(rc == MPI_SUCCESS, "reopen read-only");
    rc = MPI_File_write_at(fh, 0, out, 1, MPI_INT, MPI_STATUS_IGNORE);
    CHECK(error_class(rc) == MPI_ERR_READ_ONLY, "write to read-only: class %d", error_class(rc));
    MPI_File_close(&fh);
    rc = MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_RDONLY | MPI_MODE_CREATE, MPI_INFO_NULL, &fh);
    CHECK(error_class(rc) == MPI_ERR_AMODE, "RDONLY|CREATE: class %d", error_class(rc));
    /* MPI_MODE_EXCL on a file that exists */
    rc = MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_RDWR | MPI_MODE_CREATE | MPI_MODE_EXCL, MPI_INFO_NULL, &fh);
    CHECK(rc != MPI_SUCCESS && error_class(rc) == MPI_ERR_FILE_EXISTS, "EXCL: class %d", error_class(rc));
    CHECK(fh == MPI_FILE_NULL || rc != MPI_SUCCESS, "EXCL handle");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        rc = MPI_File_delete(name, MPI_INFO_NULL);
        CHECK(rc == MPI_SUCCESS, "delete: %d", rc);
        rc = MPI_File_delete(name, MPI_INFO_NULL);
        CHECK(error_class(rc) == MPI_ERR_NO_SUCH_FILE, "delete again: class %d", error_class(rc));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* opening a missing file returns through MPI_FILE_NULL's handler */
    path(name, "missing/nothing");
    rc = MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh);
    CHECK(error_class(rc) == MPI_ERR_NO_SUCH_FILE, "missing: class %d", error_class(rc));
    char msg[MPI_MAX_ERROR_STRING];
    int len;
    MPI_Error_string(rc, msg, &len);
    CHECK(strstr(msg, "MPI_File_open") != NULL, "message: %s", msg);
}

static int handler_calls = 0;
static MPI_File handler_file = MPI_FILE_NULL;
static void on_error(MPI_File *f, int *code, ...) {
    handler_calls++;
    handler_file = *f;
    (void)code;
}

/* A user handler on a file, and MPI_File_call_errhandler. */
static void handlers(void) {
    char name[600];
    path(name, "handlers");
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_CREATE | MPI_MODE_RDWR | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &fh);
    MPI_Errhandler eh, got;
    MPI_File_create_errhandler(on_error, &eh);
    MPI_File_set_errhandler(fh, eh);
    MPI_File_get_errhandler(fh, &got);
    CHECK(got == eh, "get_errhandler");
    int rc = MPI_File_seek(fh, 0, 12345);
    CHECK(rc != MPI_SUCCESS && handler_calls == 1 && handler_file == fh, "handler calls %d", handler_calls);
    MPI_File_call_errhandler(fh, MPI_ERR_OTHER);
    CHECK(handler_calls == 2, "call_errhandler: %d", handler_calls);
    MPI_File_close(&fh);
    MPI_Errhandler_free(&eh);
    /* the default for new files is MPI_FILE_NULL's handler */
    MPI_File_get_errhandler(MPI_FILE_NULL, &got);
    CHECK(got == MPI_ERRORS_RETURN, "FILE_NULL handler");
}

/* A view with a vector filetype: each rank owns every size-th int of the file. */
static void views(void) {
    char name[600];
    path(name, "views");
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_CREATE | MPI_MODE_RDWR | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &fh);
    MPI_Datatype one, ftype;
    MPI_Type_vector(1, 1, size, MPI_INT, &one);
    MPI_Type_create_resized(one, 0, (MPI_Aint)size * sizeof(int), &ftype);
    MPI_Type_commit(&ftype);
    MPI_Type_free(&one);
    MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ftype, "native", MPI_INFO_NULL);
    int out[8], in[8];
    for (int i = 0; i < 8; i++) out[i] = i * size + rank;
    MPI_Status st;
    MPI_File_write_all(fh, out, 8, MPI_INT, &st);
    int n = -1;
    MPI_Get_count(&st, MPI_INT, &n);
    CHECK(n == 8, "write_all count %d", n);
    MPI_Offset off;
    MPI_File_get_byte_offset(fh, 3, &off);
    CHECK(off == (MPI_Offset)(rank + 3 * size) * sizeof(int), "byte offset %lld", (long long)off);
    MPI_File_sync(fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_sync(fh);
    /* the whole file as plain ints: 0, 1, 2, ... */
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL);
    int all[64];
    MPI_File_read_at_all(fh, 0, all, 8 * size, MPI_INT, &st);
    MPI_Get_count(&st, MPI_INT, &n);
    int ok = n == 8 * size;
    for (int i = 0; i < 8 * size; i++) ok &= all[i] == i;
    CHECK(ok, "interleaved file: n %d all[1] %d", n, all[1]);
    /* back through the strided view, with a split collective */
    MPI_File_set_view(fh, (MPI_Offset)rank * sizeof(int), MPI_INT, ftype, "native", MPI_INFO_NULL);
    memset(in, 0, sizeof in);
    MPI_File_read_all_begin(fh, in, 8, MPI_INT);
    MPI_File_read_all_end(fh, in, &st);
    CHECK(memcmp(in, out, sizeof in) == 0, "strided read: in[7] %d", in[7]);
    MPI_Offset disp;
    MPI_Datatype et, ft;
    char rep[MPI_MAX_DATAREP_STRING];
    MPI_File_get_view(fh, &disp, &et, &ft, rep);
    CHECK(disp == (MPI_Offset)rank * sizeof(int) && et == MPI_INT && strcmp(rep, "native") == 0, "get_view");
    MPI_Type_free(&ft);
    int rc = MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "no-such-representation", MPI_INFO_NULL);
    CHECK(error_class(rc) == MPI_ERR_UNSUPPORTED_DATAREP, "unknown representation: class %d", error_class(rc));
    MPI_Type_free(&ftype);
    MPI_File_close(&fh);
}

/* A registered representation for MPI_INT: every byte XORed with 0x5a in the file. */
static int xor_ints(void *userbuf, MPI_Datatype dt, int count, void *filebuf, MPI_Offset pos, void *extra) {
    (void)pos; (void)extra;
    if (dt != MPI_INT) return MPI_ERR_TYPE;
    unsigned char *u = userbuf, *f = filebuf;
    for (int i = 0; i < count * (int)sizeof(int); i++) f[i] = u[i] ^ 0x5a;
    return MPI_SUCCESS;
}
static int unxor_ints(void *userbuf, MPI_Datatype dt, int count, void *filebuf, MPI_Offset pos, void *extra) {
    (void)pos; (void)extra;
    if (dt != MPI_INT) return MPI_ERR_TYPE;
    unsigned char *u = userbuf, *f = filebuf;
    for (int i = 0; i < count * (int)sizeof(int); i++) u[i] = f[i] ^ 0x5a;
    return MPI_SUCCESS;
}
static int same_extent(MPI_Datatype dt, MPI_Aint *ext, void *extra) {
    (void)extra;
    MPI_Aint lb;
    return MPI_Type_get_extent(dt, &lb, ext);
}
static int double_extent(MPI_Datatype dt, MPI_Aint *ext, void *extra) {
    (void)extra;
    MPI_Aint lb;
    MPI_Type_get_extent(dt, &lb, ext);
    *ext *= 2;
    return MPI_SUCCESS;
}

/* Data representations: external32 (big-endian in the file) and registered ones. */
static void datareps(void) {
    char name[600];
    path(name, "datareps");
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_CREATE | MPI_MODE_RDWR | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &fh);
    int out[2] = {0x01020304, 0x0a0b0c00 + rank}, in[2] = {0, 0};
    unsigned char raw[8];
    MPI_Status st;
    CHECK(MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "external32", MPI_INFO_NULL) == MPI_SUCCESS, "external32 view");
    MPI_File_write_at(fh, 2 * rank, out, 2, MPI_INT, &st);
    MPI_File_read_at(fh, 2 * rank, in, 2, MPI_INT, &st);
    CHECK(in[0] == out[0] && in[1] == out[1], "external32 round trip %x %x", in[0], in[1]);
    MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
    MPI_File_read_at(fh, 8 * rank, raw, 8, MPI_BYTE, &st);
    CHECK(raw[0] == 1 && raw[3] == 4 && raw[4] == 0x0a && raw[7] == rank, "external32 bytes %02x %02x %02x %02x",
          raw[0], raw[3], raw[4], raw[7]);
    /* Registered (by every process, for itself): duplicates refused, a size change
     * refused, the functions applied. */
    int rc = MPI_Register_datarep("metampi-xor", unxor_ints, xor_ints, same_extent, NULL);
    CHECK(rc == MPI_SUCCESS, "register: %d", rc);
    rc = MPI_Register_datarep("metampi-xor", unxor_ints, xor_ints, same_extent, NULL);
    CHECK(error_class(rc) == MPI_ERR_DUP_DATAREP, "registered twice: class %d", error_class(rc));
    rc = MPI_Register_datarep("external32", unxor_ints, xor_ints, same_extent, NULL);
    CHECK(error_class(rc) == MPI_ERR_DUP_DATAREP, "registered external32: class %d", error_class(rc));
    MPI_Register_datarep("metampi-wide", unxor_ints, xor_ints, double_extent, NULL);
    rc = MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "metampi-wide", MPI_INFO_NULL);
    CHECK(rc != MPI_SUCCESS, "a representation that doubles sizes was taken");
    CHECK(MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "metampi-xor", MPI_INFO_NULL) == MPI_SUCCESS, "xor view");
    char rep[MPI_MAX_DATAREP_STRING];
    MPI_Offset disp;
    MPI_Datatype et, ft;
    MPI_File_get_view(fh, &disp, &et, &ft, rep);
    CHECK(strcmp(rep, "metampi-xor") == 0, "get_view datarep %s", rep);
    MPI_File_write_at(fh, 2 * rank, out, 2, MPI_INT, &st);
    in[0] = in[1] = 0;
    MPI_File_read_at(fh, 2 * rank, in, 2, MPI_INT, &st);
    CHECK(in[0] == out[0] && in[1] == out[1], "xor round trip %x %x", in[0], in[1]);
    MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
    MPI_File_read_at(fh, 8 * rank, raw, 8, MPI_BYTE, &st);
    unsigned char *o = (unsigned char *)out;
    CHECK(raw[0] == (o[0] ^ 0x5a) && raw[7] == (o[7] ^ 0x5a), "xor bytes in the file %02x", raw[0]);
    MPI_File_close(&fh);
}

/* The shared pointer: ordered writes in rank order, then independent shared writes. */
static void shared(void) {
    char name[600];
    path(name, "shared");
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, name, MPI_MODE_CREATE | MPI_MODE_RDWR | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &fh);
    MPI_File_set_view(fh, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL);
    /* rank r writes r+1 copies of r */
    int out[16], in[64];
    for (int i = 0; i <= rank; i++) out[i] = rank;
    MPI_File_write_ordered(fh, out, rank + 1, MPI_INT, MPI_STATUS_IGNORE);
    MPI_Offset pos;
    MPI_File_get_position_shared(fh, &pos);
    int total = size * (size + 1) / 2;
    CHECK(pos == total, "shared position %lld after ordered", (long long)pos);
    MPI_File_sync(fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_read_at(fh, 0, in, total, MPI_INT, MPI_STATUS_IGNORE);
    int ok = 1, at = 0;
    for (int r = 0; r < size; r++)
        for (int i = 0; i <= r; i++) ok &= in[at++] == r;
    CHECK(ok, "ordered layout: in[1] %d", in[1]);
    /* read it back ordered */
    MPI_File_seek_shared(fh, 0, MPI_SEEK_SET);
    memset(in, -1, sizeof in);
    MPI_File_read_ordered(fh, in, rank + 1, MPI_INT, MPI_STATUS_IGNORE);
    ok = 1;
    for (int i = 0; i <= rank; i++) ok &= in[i] == rank;
    CHECK(ok, "read_ordered: in[0] %d", in[0]);
    /* every rank appends 4 ints with write_shared: each block whole, somewhere */
    MPI_File_seek_shared(fh, 0, MPI_SEEK_END);
    for (int i = 0; i < 4; i++) out[i] = 1000 + rank;
    MPI_File_write_shared(fh, out, 4, MPI_INT, MPI_STATUS_IGNORE);
    MPI_File_sync(fh);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_get_position_shared(fh, &pos);
    CHECK(pos == total + 4 * size, "shared position %lld after write_shared", (long long)pos);
    MPI_File_read_at(fh, total, in, 4 * size, MPI_INT, MPI_STATUS_IGNORE);
    int seen[64] = {0};
    ok = 1;
    for (int b = 0; b < size; b++) {
        int r = in[4 * b] - 1000;
        ok &= r >= 0 && r < size && !seen[r];
        if (r >= 0 && r < size) seen[r] = 1;
        for (int i = 1; i < 4; i++) ok &= in[4 * b + i] == in[4 * b];
    }
    CHECK(ok, "write_shared blocks: %d %d %d %d", in[0], in[4], in[8], in[3]);
    MPI_File_close(&fh);
}

/* Files of MPI_COMM_SELF: each rank its own, with MPI_MODE_APPEND and atomicity. */
static void self_files(void) {
    char name[600], leaf[64];
    snprintf(leaf, sizeof leaf, "self-%d", rank);
    path(name, leaf);
    MPI_File fh;
    MPI_File_open(MPI_COMM_SELF, name, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
    char text[] = "hello";
    MPI_File_write(fh, text, 5, MPI_CHAR, MPI_STATUS_IGNORE);
    MPI_File_close(&fh);
    MPI_File_open(MPI_COMM_SELF, name, MPI_MODE_WRONLY | MPI_MODE_APPEND, MPI_INFO_NULL, &fh);
    MPI_Offset pos;
    MPI_File_get_position(fh, &pos);
    CHECK(pos == 5, "append position %lld", (long long)pos);
    MPI_File_set_atomicity(fh, 1);
    int flag = 0;
    MPI_File_get_atomicity(fh, &flag);
    CHECK(flag == 1, "atomicity");
    MPI_File_write(fh, " world", 6, MPI_CHAR, MPI_STATUS_IGNORE);
    int rc = MPI_File_read_at(fh, 0, text, 1, MPI_CHAR, MPI_STATUS_IGNORE);
    CHECK(error_class(rc) == MPI_ERR_ACCESS, "read of write-only: class %d", error_class(rc));
    MPI_File_close(&fh);
    MPI_File_open(MPI_COMM_SELF, name, MPI_MODE_RDONLY | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &fh);
    char back[16] = {0};
    MPI_File_read(fh, back, 11, MPI_CHAR, MPI_STATUS_IGNORE);
    CHECK(strcmp(back, "hello world") == 0, "appended: %s", back);
    MPI_File_close(&fh);
    FILE *f = fopen(name, "r");
    CHECK(f == NULL, "deleted on close");
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    snprintf(dir, sizeof dir, "%s", argc > 1 ? argv[1] : ".");
    basics();
    handlers();
    views();
    datareps();
    shared();
    self_files();
    int all_failed = 0, all_checks = 0;
    MPI_Reduce(&failed, &all_failed, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("io suite: %d checks, %d failed, %d ranks\n", all_checks, all_failed, size);
    MPI_Finalize();
    return all_failed != 0;
}
