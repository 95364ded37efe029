/* A C program against the plain MPI API, for metampi's C libraries: built with MPICH's
 * mpicc (MPICH's ABI) or with mpicc_abi (the MPI-5 standard ABI, where mpi.h defines
 * MPI_ABI_VERSION), run by `metampi run` on 1-8 ranks and across emulated sites.
 * Every check that fails prints a line; rank 0 prints "suite: N checks, F failed". */
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks = 0, failed = 0, rank = 0, size = 1;
/* The same source runs on MPICH for comparison; a few checks are of metampi's own words. */
static int on_metampi = 0;

#define CHECK(cond, ...) do { checks++; if (!(cond)) { failed++; \
    printf("FAIL rank %d line %d: ", rank, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static void p2p(void) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    /* every send mode around a ring */
    int out[4], in[4];
    for (int m = 0; m < 4; m++) out[m] = rank * 100 + m;
    MPI_Request rq[8];
    for (int m = 0; m < 4; m++) MPI_Irecv(&in[m], 1, MPI_INT, prev, m, MPI_COMM_WORLD, &rq[m]);
    MPI_Barrier(MPI_COMM_WORLD); /* receives are posted everywhere: ready mode is legal */
    MPI_Send(&out[0], 1, MPI_INT, next, 0, MPI_COMM_WORLD);
    MPI_Ssend(&out[1], 1, MPI_INT, next, 1, MPI_COMM_WORLD);
    MPI_Bsend(&out[2], 1, MPI_INT, next, 2, MPI_COMM_WORLD);
    MPI_Rsend(&out[3], 1, MPI_INT, next, 3, MPI_COMM_WORLD);
    MPI_Status st[4];
    MPI_Waitall(4, rq, st);
    for (int m = 0; m < 4; m++) {
        CHECK(in[m] == prev * 100 + m, "mode %d got %d", m, in[m]);
        CHECK(st[m].MPI_SOURCE == prev && st[m].MPI_TAG == m, "mode %d status %d/%d", m, st[m].MPI_SOURCE, st[m].MPI_TAG);
        CHECK(rq[m] == MPI_REQUEST_NULL, "request not nulled");
    }
    /* nonblocking sends of a large message, wildcard receive, get_count. The tag stays
     * named: a rank further round the ring may already be sending its tag-14 messages,
     * which a receive of any source and any tag may legally match first. */
    int n = 100000;
    double *big = malloc(n * sizeof(double)), *got = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++) big[i] = rank + i * 0.5;
    MPI_Isend(big, n, MPI_DOUBLE, next, 9, MPI_COMM_WORLD, &rq[0]);
    MPI_Status s;
    MPI_Recv(got, n, MPI_DOUBLE, MPI_ANY_SOURCE, 9, MPI_COMM_WORLD, &s);
    MPI_Wait(&rq[0], MPI_STATUS_IGNORE);
    int cnt;
    MPI_Get_count(&s, MPI_DOUBLE, &cnt);
    CHECK(cnt == n && s.MPI_SOURCE == prev && s.MPI_TAG == 9, "large: count %d source %d", cnt, s.MPI_SOURCE);
    CHECK(got[n - 1] == prev + (n - 1) * 0.5, "large payload");
    free(big); free(got);
    /* persistent requests, started twice */
    int ps = rank, pr = -1;
    MPI_Send_init(&ps, 1, MPI_INT, next, 11, MPI_COMM_WORLD, &rq[0]);
    MPI_Recv_init(&pr, 1, MPI_INT, prev, 11, MPI_COMM_WORLD, &rq[1]);
    for (int it = 0; it < 2; it++) {
        ps = rank + it;
        MPI_Startall(2, rq);
        MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        CHECK(pr == prev + it, "persistent round %d got %d", it, pr);
        CHECK(rq[0] != MPI_REQUEST_NULL, "persistent request stays");
    }
    MPI_Request_free(&rq[0]); MPI_Request_free(&rq[1]);
    /* probe, then receive what the probe saw; matched probe */
    MPI_Send(&ps, 1, MPI_INT, next, 12, MPI_COMM_WORLD);
    MPI_Probe(prev, 12, MPI_COMM_WORLD, &s);
    MPI_Get_count(&s, MPI_INT, &cnt);
    CHECK(cnt == 1 && s.MPI_TAG == 12, "probe count %d", cnt);
    MPI_Recv(&pr, 1, MPI_INT, prev, 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Message msg;
    MPI_Isend(&ps, 1, MPI_INT, next, 13, MPI_COMM_WORLD, &rq[0]);
    MPI_Mprobe(MPI_ANY_SOURCE, 13, MPI_COMM_WORLD, &msg, &s);
    MPI_Mrecv(&pr, 1, MPI_INT, &msg, &s);
    MPI_Wait(&rq[0], MPI_STATUS_IGNORE);
    CHECK(msg == MPI_MESSAGE_NULL && s.MPI_SOURCE == prev, "mprobe/mrecv");
    /* waitany / testsome over receives from everyone */
    int *vals = calloc(size, sizeof(int));
    MPI_Request *rs = malloc(size * sizeof(MPI_Request));
    for (int r = 0; r < size; r++) MPI_Irecv(&vals[r], 1, MPI_INT, r, 14, MPI_COMM_WORLD, &rs[r]);
    for (int r = 0; r < size; r++) MPI_Send(&rank, 1, MPI_INT, r, 14, MPI_COMM_WORLD);
    int seen = 0, idx;
    while (seen < size) { MPI_Waitany(size, rs, &idx, &s); CHECK(idx >= 0 && s.MPI_SOURCE == idx, "waitany index %d", idx); seen++; }
    MPI_Waitany(size, rs, &idx, &s);
    CHECK(idx == MPI_UNDEFINED, "waitany on all-null gives MPI_UNDEFINED");
    for (int r = 0; r < size; r++) CHECK(vals[r] == r, "waitany value");
    free(vals); free(rs);
    /* sendrecv and sendrecv_replace; the null process */
    int a = rank, b = -1;
    MPI_Sendrecv(&a, 1, MPI_INT, next, 15, &b, 1, MPI_INT, prev, 15, MPI_COMM_WORLD, &s);
    CHECK(b == prev, "sendrecv got %d", b);
    MPI_Sendrecv_replace(&a, 1, MPI_INT, next, 16, prev, 16, MPI_COMM_WORLD, &s);
    CHECK(a == prev, "sendrecv_replace got %d", a);
    MPI_Recv(&b, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &s);
    CHECK(s.MPI_SOURCE == MPI_PROC_NULL && s.MPI_TAG == MPI_ANY_TAG, "proc_null status");
    /* cancel a receive nobody sends to */
    MPI_Irecv(&b, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &rq[0]);
    MPI_Cancel(&rq[0]);
    MPI_Wait(&rq[0], &s);
    int flag;
    MPI_Test_cancelled(&s, &flag);
    CHECK(flag, "receive cancelled");
    /* iprobe finds nothing on an unused tag */
    MPI_Iprobe(MPI_ANY_SOURCE, 998, MPI_COMM_WORLD, &flag, &s);
    CHECK(!flag, "iprobe on an unused tag");
}

static void datatypes(void) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    /* a column of a 4x4 matrix */
    double m[16], col[4];
    for (int i = 0; i < 16; i++) m[i] = rank * 100 + i;
    MPI_Datatype column;
    MPI_Type_vector(4, 1, 4, MPI_DOUBLE, &column);
    MPI_Type_commit(&column);
    int sz; MPI_Aint lb, ext;
    MPI_Type_size(column, &sz);
    MPI_Type_get_extent(column, &lb, &ext);
    CHECK(sz == 32 && lb == 0 && ext == 13 * 8, "vector size %d extent %ld", sz, (long)ext);
    MPI_Sendrecv(&m[1], 1, column, next, 20, col, 4, MPI_DOUBLE, prev, 20, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int i = 0; i < 4; i++) CHECK(col[i] == prev * 100 + 1 + 4 * i, "column %d: %g", i, col[i]);
    /* a struct with padding */
    struct item { char c; double d; int i[3]; } items[3], recv_items[3];
    int bl[3] = {1, 1, 3};
    MPI_Aint disp[3], base;
    MPI_Get_address(&items[0], &base);
    MPI_Get_address(&items[0].c, &disp[0]);
    MPI_Get_address(&items[0].d, &disp[1]);
    MPI_Get_address(&items[0].i, &disp[2]);
    for (int k = 0; k < 3; k++) disp[k] = MPI_Aint_diff(disp[k], base);
    MPI_Datatype types[3] = {MPI_CHAR, MPI_DOUBLE, MPI_INT}, st0, st;
    MPI_Type_create_struct(3, bl, disp, types, &st0);
    MPI_Type_create_resized(st0, 0, sizeof(struct item), &st);
    MPI_Type_commit(&st);
    for (int k = 0; k < 3; k++) { items[k].c = 'a' + k; items[k].d = rank + k * 0.25; items[k].i[0] = k; items[k].i[2] = -k; }
    MPI_Sendrecv(items, 3, st, next, 21, recv_items, 3, st, prev, 21, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (int k = 0; k < 3; k++)
        CHECK(recv_items[k].c == 'a' + k && recv_items[k].d == prev + k * 0.25 && recv_items[k].i[2] == -k, "struct item %d", k);
    int ni, na, nt, comb;
    MPI_Type_get_envelope(st0, &ni, &na, &nt, &comb);
    CHECK(comb == MPI_COMBINER_STRUCT && ni == 4 && na == 3 && nt == 3, "struct envelope %d %d %d %d", comb, ni, na, nt);
    /* a 2x2 block out of a 4x4 array (subarray), received contiguous */
    int sizes[2] = {4, 4}, subs[2] = {2, 2}, starts[2] = {1, 2};
    MPI_Datatype sa;
    MPI_Type_create_subarray(2, sizes, subs, starts, MPI_ORDER_C, MPI_DOUBLE, &sa);
    MPI_Type_commit(&sa);
    MPI_Type_get_extent(sa, &lb, &ext);
    CHECK(ext == 16 * 8, "subarray extent %ld", (long)ext);
    double blk[4];
    MPI_Sendrecv(m, 1, sa, next, 22, blk, 4, MPI_DOUBLE, prev, 22, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK(blk[0] == prev * 100 + 6 && blk[1] == prev * 100 + 7 && blk[2] == prev * 100 + 10 && blk[3] == prev * 100 + 11,
          "subarray block %g %g %g %g", blk[0], blk[1], blk[2], blk[3]);
    /* pack and unpack */
    char packed[256]; int pos = 0, psize;
    MPI_Pack_size(1, column, MPI_COMM_WORLD, &psize);
    CHECK(psize == 32, "pack size %d", psize);
    MPI_Pack(&m[2], 1, column, packed, sizeof packed, &pos, MPI_COMM_WORLD);
    int one = 7; MPI_Pack(&one, 1, MPI_INT, packed, sizeof packed, &pos, MPI_COMM_WORLD);
    CHECK(pos == 36, "pack position %d", pos);
    double unp[4]; int seven = 0; pos = 0;
    MPI_Unpack(packed, sizeof packed, &pos, unp, 4, MPI_DOUBLE, MPI_COMM_WORLD);
    MPI_Unpack(packed, sizeof packed, &pos, &seven, 1, MPI_INT, MPI_COMM_WORLD);
    CHECK(unp[3] == rank * 100 + 14 && seven == 7, "unpack %g %d", unp[3], seven);
    /* indexed, and get_elements on a short message */
    int ibl[2] = {2, 1}, idisp[2] = {0, 5};
    MPI_Datatype ix;
    MPI_Type_indexed(2, ibl, idisp, MPI_INT, &ix);
    MPI_Type_commit(&ix);
    int src[6] = {1, 2, 3, 4, 5, 6}, dst[6] = {0};
    MPI_Status s;
    MPI_Sendrecv(src, 2, MPI_INT, next, 23, dst, 1, ix, prev, 23, MPI_COMM_WORLD, &s);
    int el, cnt;
    MPI_Get_elements(&s, ix, &el);
    MPI_Get_count(&s, ix, &cnt);
    CHECK(el == 2 && cnt == MPI_UNDEFINED && dst[0] == 1 && dst[1] == 2, "get_elements %d count %d", el, cnt);
    char name[MPI_MAX_OBJECT_NAME]; int len;
    MPI_Type_get_name(MPI_DOUBLE, name, &len);
    CHECK(strcmp(name, "MPI_DOUBLE") == 0, "type name %s", name);
    /* the Fortran type of a class and size, as ScaLAPACK's BLACS asks at start */
    MPI_Datatype m8 = MPI_DATATYPE_NULL, m4 = MPI_DATATYPE_NULL;
    MPI_Type_match_size(MPI_TYPECLASS_REAL, 8, &m8);
    MPI_Type_match_size(MPI_TYPECLASS_INTEGER, 4, &m4);
    MPI_Type_size(m8, &sz);
    CHECK(m8 == MPI_REAL8 && m4 == MPI_INTEGER4 && sz == 8, "match_size %zx %zx", (size_t)m8, (size_t)m4);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Type_match_size(MPI_TYPECLASS_REAL, 3, &m8);
    int cls = -1; MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_ARG, "match_size of a size no type has: class %d", cls);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    /* a type's contents outlive the handles it was made of (their copies are the caller's) */
    MPI_Datatype inner, outer, got[1];
    int gi[1]; MPI_Aint ga[1];
    MPI_Type_contiguous(2, MPI_INT, &inner);
    MPI_Type_contiguous(3, inner, &outer);
    MPI_Type_free(&inner);
    MPI_Type_get_contents(outer, 1, 0, 1, gi, ga, got);
    MPI_Type_get_envelope(got[0], &ni, &na, &nt, &comb);
    CHECK(gi[0] == 3 && comb == MPI_COMBINER_CONTIGUOUS && ni == 1 && nt == 1, "contents after free: %d %d", gi[0], comb);
    MPI_Type_free(&got[0]); MPI_Type_free(&outer);
    /* attributes on datatypes: copied by MPI_Type_dup through the callback, deleted on free */
    int tkey, tval = 42, *tgot = NULL, tflag = 0;
    MPI_Type_create_keyval(MPI_TYPE_DUP_FN, MPI_TYPE_NULL_DELETE_FN, &tkey, NULL);
    MPI_Datatype tdup, tbase;
    MPI_Type_contiguous(2, MPI_INT, &tbase);
    MPI_Type_set_attr(tbase, tkey, &tval);
    MPI_Type_dup(tbase, &tdup);
    MPI_Type_get_attr(tdup, tkey, &tgot, &tflag);
    CHECK(tflag && tgot == &tval, "type attribute copied by dup: %d", tflag);
    MPI_Type_delete_attr(tdup, tkey);
    MPI_Type_get_attr(tdup, tkey, &tgot, &tflag);
    CHECK(!tflag, "type attribute deleted");
    MPI_Type_free(&tdup); MPI_Type_free(&tbase); MPI_Type_free_keyval(&tkey);
    /* Fortran 90 kinds: predefined types, with their own combiner */
    MPI_Datatype f4, f8;
    MPI_Type_create_f90_integer(9, &f4);
    MPI_Type_create_f90_real(15, MPI_UNDEFINED, &f8);
    int s4, s8;
    MPI_Type_size(f4, &s4); MPI_Type_size(f8, &s8);
    MPI_Type_get_envelope(f4, &ni, &na, &nt, &comb);
    CHECK(s4 == 4 && s8 == 8 && comb == MPI_COMBINER_F90_INTEGER, "f90 types %d %d %d", s4, s8, comb);
    MPI_Type_free(&column); MPI_Type_free(&st); MPI_Type_free(&st0); MPI_Type_free(&sa); MPI_Type_free(&ix);
    CHECK(column == MPI_DATATYPE_NULL, "freed type is nulled");
    /* external32 is big-endian */
    {
        int x[2] = {0x01020304, -2}, y[2] = {0, 0};
        unsigned char ext32[8];
        MPI_Aint epos = 0, esz = 0;
        MPI_Pack_external_size("external32", 2, MPI_INT, &esz);
        MPI_Pack_external("external32", x, 2, MPI_INT, ext32, sizeof ext32, &epos);
        MPI_Aint upos = 0;
        MPI_Unpack_external("external32", ext32, sizeof ext32, &upos, y, 2, MPI_INT);
        CHECK(esz == 8 && epos == 8 && upos == 8 && ext32[0] == 1 && ext32[3] == 4 && ext32[4] == 0xff && y[0] == x[0] && y[1] == -2,
              "external32: size %ld bytes %02x %02x back %x %d", (long)esz, ext32[0], ext32[3], y[0], y[1]);
    }
    /* a distributed array: 4x6 ints, rows in blocks and columns cyclic over a 2x2 grid */
    {
        int gs[2] = {4, 6}, dist[2] = {MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_CYCLIC};
        int da[2] = {MPI_DISTRIBUTE_DFLT_DARG, MPI_DISTRIBUTE_DFLT_DARG}, ps[2] = {2, 2};
        MPI_Datatype darr;
        MPI_Type_create_darray(4, 1, 2, gs, dist, da, ps, MPI_ORDER_C, MPI_INT, &darr);
        MPI_Type_commit(&darr);
        int dsz, g[24], out[6], dpos = 0;
        MPI_Aint dlb, dext;
        MPI_Type_size(darr, &dsz);
        MPI_Type_get_extent(darr, &dlb, &dext);
        for (int i = 0; i < 24; i++) g[i] = i;
        MPI_Pack(g, 1, darr, out, sizeof out, &dpos, MPI_COMM_WORLD);
        CHECK(dsz == 24 && dlb == 0 && dext == 96 && out[0] == 1 && out[2] == 5 && out[3] == 7 && out[5] == 11,
              "darray size %d extent %ld: %d %d %d %d", dsz, (long)dext, out[0], out[2], out[3], out[5]);
        MPI_Type_free(&darr);
    }
}

static int copies = 0, deletes = 0;
static int copy_fn(MPI_Comm c, int k, void *extra, void *in, void *out, int *flag) {
    (void)c; (void)k; (void)extra; copies++; *(void **)out = in; *flag = 1; return MPI_SUCCESS;
}
static int delete_fn(MPI_Comm c, int k, void *v, void *extra) { (void)c; (void)k; (void)v; (void)extra; deletes++; return MPI_SUCCESS; }

static void comms(void) {
    MPI_Comm dup, half, shm, cart;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    int res;
    MPI_Comm_compare(MPI_COMM_WORLD, dup, &res);
    CHECK(res == MPI_CONGRUENT, "dup compares %d", res);
    /* a message on the duplicate never matches a receive on the world */
    int x = rank, y = -1, flag;
    MPI_Send(&x, 1, MPI_INT, rank, 30, dup);
    MPI_Iprobe(rank, 30, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    CHECK(!flag, "contexts kept apart");
    MPI_Recv(&y, 1, MPI_INT, rank, 30, dup, MPI_STATUS_IGNORE);
    CHECK(y == rank, "self message on dup");
    /* split in halves, reversed order */
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    int hr, hs;
    MPI_Comm_rank(half, &hr); MPI_Comm_size(half, &hs);
    CHECK(hs == (size + 1 - rank % 2) / 2, "half size %d", hs);
    int sum = 0;
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, half);
    int expect = 0;
    for (int r = rank % 2; r < size; r += 2) expect += r;
    CHECK(sum == expect, "half sum %d expected %d", sum, expect);
    MPI_Comm undef;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, 0, &undef);
    CHECK((rank == 0) == (undef == MPI_COMM_NULL), "undefined colour gives MPI_COMM_NULL");
    if (undef != MPI_COMM_NULL) MPI_Comm_free(&undef);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm);
    int ss; MPI_Comm_size(shm, &ss);
    CHECK(ss >= 1 && ss <= size, "shared split size %d", ss);
    /* groups: the even ranks */
    MPI_Group world, evens;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int nev = (size + 1) / 2, *ev = malloc(nev * sizeof(int));
    for (int i = 0; i < nev; i++) ev[i] = 2 * i;
    MPI_Group_incl(world, nev, ev, &evens);
    int gr, gs;
    MPI_Group_rank(evens, &gr); MPI_Group_size(evens, &gs);
    CHECK(gs == nev && gr == (rank % 2 ? MPI_UNDEFINED : rank / 2), "group rank %d size %d", gr, gs);
    MPI_Comm ec;
    MPI_Comm_create(MPI_COMM_WORLD, evens, &ec);
    CHECK((rank % 2 == 0) == (ec != MPI_COMM_NULL), "comm_create membership");
    if (ec != MPI_COMM_NULL) { int es; MPI_Comm_size(ec, &es); CHECK(es == nev, "created size"); MPI_Comm_free(&ec); }
    int tr[1] = {0}, out[1];
    MPI_Group_translate_ranks(evens, 1, tr, world, out);
    CHECK(out[0] == 0, "translate %d", out[0]);
    MPI_Group_free(&evens); MPI_Group_free(&world); free(ev);
    /* names and attributes with callbacks */
    MPI_Comm_set_name(dup, "my-dup");
    char name[MPI_MAX_OBJECT_NAME]; int len;
    MPI_Comm_get_name(dup, name, &len);
    CHECK(strcmp(name, "my-dup") == 0 && len == 6, "comm name %s", name);
    int key; static int value = 77;
    MPI_Comm_create_keyval(copy_fn, delete_fn, &key, NULL);
    MPI_Comm_set_attr(dup, key, &value);
    MPI_Comm dup2;
    MPI_Comm_dup(dup, &dup2);
    int *got; MPI_Comm_get_attr(dup2, key, &got, &flag);
    CHECK(flag && got == &value && copies == 1, "attribute copied");
    MPI_Comm_free(&dup2);
    CHECK(deletes == 1 && dup2 == MPI_COMM_NULL, "attribute deleted on free");
    int *ub; MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    CHECK(flag && *ub >= 32767, "MPI_TAG_UB");
    MPI_Comm_free_keyval(&key);
    /* a periodic ring as a Cartesian grid */
    int dims[1] = {0}, periods[1] = {1};
    MPI_Dims_create(size, 1, dims);
    MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
    int src, dst, coords[1], topo;
    MPI_Cart_shift(cart, 0, 1, &src, &dst);
    MPI_Cart_coords(cart, rank, 1, coords);
    MPI_Topo_test(cart, &topo);
    CHECK(topo == MPI_CART && src == (rank + size - 1) % size && dst == (rank + 1) % size && coords[0] == rank, "cart shift %d %d", src, dst);
    int d2[2] = {0, 0};
    MPI_Dims_create(12, 2, d2);
    CHECK(d2[0] == 4 && d2[1] == 3, "dims_create %d %d", d2[0], d2[1]);
    /* intercommunicators: the even and the odd ranks, point-to-point across, then merged */
    if (size >= 2) {
        MPI_Comm side, ic, merged;
        int color = rank % 2;
        MPI_Comm_split(MPI_COMM_WORLD, color, rank, &side);
        /* the leaders: world ranks 0 (evens) and 1 (odds) */
        MPI_Intercomm_create(side, 0, MPI_COMM_WORLD, color ? 0 : 1, 77, &ic);
        int inter = 0, rsize = 0, lsize = 0;
        MPI_Comm_test_inter(ic, &inter);
        MPI_Comm_remote_size(ic, &rsize);
        MPI_Comm_size(ic, &lsize);
        CHECK(inter && lsize + rsize == size && rsize == (color ? (size + 1) / 2 : size / 2),
              "intercomm sizes %d %d %d", inter, lsize, rsize);
        int lrank; MPI_Comm_rank(ic, &lrank);
        int peer = -1, mine = rank;
        if (lrank == 0) /* local rank 0 of each side swaps world ranks with remote rank 0 */
            MPI_Sendrecv(&mine, 1, MPI_INT, 0, 5, &peer, 1, MPI_INT, 0, 5, ic, MPI_STATUS_IGNORE);
        CHECK(lrank != 0 || peer == (color ? 0 : 1), "intercomm message from %d", peer);
        MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);
        /* collectives between the groups: the evens' rank 0 broadcasts to the odds, each
           side gets the sum of the other's ranks, the evens' rank 0 gathers the odds' */
        int rc = MPI_Barrier(ic);
        CHECK(rc == MPI_SUCCESS, "barrier on intercomm: %d", rc);
        int val = color ? -1 : 4242;
        int broot = color ? 0 : (lrank == 0 ? MPI_ROOT : MPI_PROC_NULL);
        MPI_Bcast(&val, 1, MPI_INT, broot, ic);
        CHECK(val == 4242, "bcast across: %d", val);
        int other = 0, expect = 0;
        MPI_Allreduce(&rank, &other, 1, MPI_INT, MPI_SUM, ic);
        for (int r = 0; r < size; r++) if (r % 2 != color) expect += r;
        CHECK(other == expect, "allreduce across: %d expected %d", other, expect);
        int got[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
        MPI_Gather(&rank, 1, MPI_INT, got, 1, MPI_INT, broot, ic);
        if (!color && lrank == 0)
            CHECK(got[0] == 1 && (rsize < 2 || got[1] == 3), "gather across: %d %d", got[0], got[1]);
        /* alltoallw across: one int to each remote process, displacements in bytes */
        {
            int sw[8], rw[8], cw[8], dw[8];
            MPI_Datatype tw[8];
            for (int i = 0; i < rsize && i < 8; i++) { sw[i] = rank * 10 + i; rw[i] = -1; cw[i] = 1; dw[i] = i * (int)sizeof(int); tw[i] = MPI_INT; }
            if (rsize <= 8) {
                MPI_Alltoallw(sw, cw, dw, tw, rw, cw, dw, tw, ic);
                /* remote process i is world rank 2i + 1 - color; it sent me its block lrank */
                int ok = 1;
                for (int i = 0; i < rsize; i++) ok &= rw[i] == (2 * i + 1 - color) * 10 + lrank;
                CHECK(ok, "alltoallw across: %d", rw[0]);
            }
        }
        int cls = -1;
        rc = MPI_Scan(&rank, &other, 1, MPI_INT, MPI_SUM, ic);
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_COMM, "scan on an intercommunicator is an error: %d", cls);
        /* split by shared memory: the members of each side on this machine, or no
           communicator where the other side has none here */
        {
            int odd[2] = {color, 1}, on_node[2];
            MPI_Allreduce(odd, on_node, 2, MPI_INT, MPI_SUM, shm);
            int mine_here = color ? on_node[0] : on_node[1] - on_node[0];
            int theirs_here = on_node[1] - mine_here;
            MPI_Comm ish = MPI_COMM_NULL, iund = MPI_COMM_NULL;
            rc = MPI_Comm_split_type(ic, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &ish);
            int ishi = 0, ishl = -1, ishr = -1;
            if (ish != MPI_COMM_NULL) {
                MPI_Comm_test_inter(ish, &ishi);
                MPI_Comm_size(ish, &ishl);
                MPI_Comm_remote_size(ish, &ishr);
                MPI_Comm_free(&ish);
            }
            CHECK(rc == MPI_SUCCESS && (theirs_here == 0 ? ishl == -1 : ishi && ishl == mine_here && ishr == theirs_here),
                  "split_type shared on an intercomm: rc %d sizes %d %d, expected %d %d", rc, ishl, ishr, mine_here, theirs_here);
            rc = MPI_Comm_split_type(ic, MPI_UNDEFINED, rank, MPI_INFO_NULL, &iund);
            CHECK(rc == MPI_SUCCESS && iund == MPI_COMM_NULL, "split_type undefined on an intercomm");
        }
        MPI_Intercomm_merge(ic, color, &merged);
        int msize, mrank;
        MPI_Comm_size(merged, &msize);
        MPI_Comm_rank(merged, &mrank);
        /* the evens (low) come first */
        CHECK(msize == size && mrank == (color ? size / 2 + (size % 2) + rank / 2 : rank / 2), "merge %d %d", msize, mrank);
        MPI_Comm_free(&merged); MPI_Comm_free(&ic); MPI_Comm_free(&side);
    }
    MPI_Comm_free(&cart); MPI_Comm_free(&shm); MPI_Comm_free(&half); MPI_Comm_free(&dup);
}

static void user_max_c(void *in, void *inout, MPI_Count *len, MPI_Datatype *dt) {
    (void)dt;
    for (MPI_Count i = 0; i < *len; i++) if (((int *)in)[i] > ((int *)inout)[i]) ((int *)inout)[i] = ((int *)in)[i];
}
static void user_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    if (*dt != MPI_INT) { printf("FAIL user op got datatype %#zx\n", (size_t)*dt); return; }
    for (int i = 0; i < *len; i++) if (((int *)in)[i] > ((int *)inout)[i]) ((int *)inout)[i] = ((int *)in)[i];
}

static void collectives(void) {
    int root = size - 1;
    double v = rank + 1.0, s = 0;
    MPI_Reduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, root, MPI_COMM_WORLD);
    if (rank == root) CHECK(s == size * (size + 1) / 2.0, "reduce %g", s);
    int b = rank == root ? 1234 : 0;
    MPI_Bcast(&b, 1, MPI_INT, root, MPI_COMM_WORLD);
    CHECK(b == 1234, "bcast %d", b);
    int inplace[2] = {rank, 1};
    MPI_Allreduce(MPI_IN_PLACE, inplace, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(inplace[0] == size * (size - 1) / 2 && inplace[1] == size, "allreduce in place %d %d", inplace[0], inplace[1]);
    struct { double v; int i; } mine = {(double)((rank * 7) % size), rank}, best;
    MPI_Allreduce(&mine, &best, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    CHECK(best.v == size - 1, "maxloc value %g at %d", best.v, best.i);
    MPI_Op op;
    MPI_Op_create(user_max, 1, &op);
    int um = (rank * 5) % (size + 3), ur;
    MPI_Allreduce(&um, &ur, 1, MPI_INT, op, MPI_COMM_WORLD);
    int emax = 0;
    for (int r = 0; r < size; r++) if ((r * 5) % (size + 3) > emax) emax = (r * 5) % (size + 3);
    CHECK(ur == emax, "user op %d expected %d", ur, emax);
    MPI_Op_free(&op);
    MPI_Op_create_c(user_max_c, 1, &op);
    ur = -1;
    MPI_Allreduce(&um, &ur, 1, MPI_INT, op, MPI_COMM_WORLD);
    CHECK(ur == emax, "large-count user op %d expected %d", ur, emax);
    MPI_Op_free(&op);
    int *all = malloc(size * 2 * sizeof(int)), *cnts = malloc(size * sizeof(int)), *dsp = malloc(size * sizeof(int));
    int pair[2] = {rank, -rank};
    MPI_Gather(pair, 2, MPI_INT, all, 2, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0) for (int r = 0; r < size; r++) CHECK(all[2 * r] == r && all[2 * r + 1] == -r, "gather %d", r);
    MPI_Allgather(pair, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(all[2 * r] == r, "allgather %d", r);
    for (int r = 0; r < size; r++) all[r] = -1;
    all[rank] = rank * 3;
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(all[r] == r * 3, "allgather in place %d", r);
    int piece;
    MPI_Scatter(all, 1, MPI_INT, &piece, 1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(piece == rank * 3, "scatter %d", piece);
    /* varying counts: rank r contributes r+1 values */
    int total = size * (size + 1) / 2, mine_n = rank + 1;
    int *vin = malloc(mine_n * sizeof(int)), *vall = malloc(total * sizeof(int));
    for (int i = 0; i < mine_n; i++) vin[i] = rank;
    for (int r = 0, d = 0; r < size; r++) { cnts[r] = r + 1; dsp[r] = d; d += r + 1; }
    MPI_Allgatherv(vin, mine_n, MPI_INT, vall, cnts, dsp, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(vall[dsp[r] + r] == r, "allgatherv %d", r);
    MPI_Gatherv(vin, mine_n, MPI_INT, vall, cnts, dsp, MPI_INT, root, MPI_COMM_WORLD);
    memset(vin, 0, mine_n * sizeof(int));
    MPI_Scatterv(vall, cnts, dsp, MPI_INT, vin, mine_n, MPI_INT, root, MPI_COMM_WORLD);
    CHECK(vin[mine_n - 1] == rank, "scatterv %d", vin[mine_n - 1]);
    /* all-to-all: element r goes to rank r */
    int *a2 = malloc(size * sizeof(int)), *b2 = malloc(size * sizeof(int));
    for (int r = 0; r < size; r++) a2[r] = rank * 1000 + r;
    MPI_Alltoall(a2, 1, MPI_INT, b2, 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(b2[r] == r * 1000 + rank, "alltoall %d", r);
    for (int r = 0; r < size; r++) { cnts[r] = 1; dsp[r] = size - 1 - r; }
    MPI_Alltoallv(a2, cnts, dsp, MPI_INT, b2, cnts, dsp, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) CHECK(b2[size - 1 - r] == r * 1000 + (size - 1 - rank), "alltoallv %d", r);
    /* scans and reduce-scatter */
    int sc, ex = -1;
    MPI_Scan(&mine_n, &sc, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Exscan(&mine_n, &ex, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sc == (rank + 1) * (rank + 2) / 2, "scan %d", sc);
    if (rank > 0) CHECK(ex == rank * (rank + 1) / 2, "exscan %d", ex);
    for (int r = 0; r < size; r++) a2[r] = r;
    int rsb;
    MPI_Reduce_scatter_block(a2, &rsb, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(rsb == rank * size, "reduce_scatter_block %d", rsb);
    for (int r = 0; r < size; r++) cnts[r] = 1;
    MPI_Reduce_scatter(a2, &rsb, cnts, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(rsb == rank, "reduce_scatter %d", rsb);
    /* nonblocking collectives overlapped */
    MPI_Request rq[3];
    double nv = rank, ns = 0;
    int nb = rank == 0 ? 55 : 0;
    MPI_Iallreduce(&nv, &ns, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &rq[0]);
    MPI_Ibcast(&nb, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq[1]);
    MPI_Ibarrier(MPI_COMM_WORLD, &rq[2]);
    MPI_Waitall(3, rq, MPI_STATUSES_IGNORE);
    CHECK(ns == size * (size - 1) / 2.0 && nb == 55, "nonblocking collectives %g %d", ns, nb);
    /* alltoallw: to each peer an int and a double, described by a type per peer */
    {
        int *wc = malloc(size * sizeof(int)), *wd = malloc(size * sizeof(int));
        MPI_Datatype *wt = malloc(size * sizeof(MPI_Datatype));
        struct { int i; double d; } *ws = malloc(size * 16), *wr = malloc(size * 16);
        for (int r = 0; r < size; r++) {
            wc[r] = 1; wd[r] = r * 16;
            wt[r] = (r % 2) ? MPI_DOUBLE : MPI_INT;
            ws[r].i = rank * 10 + r; ws[r].d = rank + r / 10.0;
            wr[r].i = -1; wr[r].d = -1;
        }
        /* a double goes to odd peers, an int to even ones: displacement picks the field */
        for (int r = 0; r < size; r++) if (r % 2) wd[r] = r * 16 + 8;
        int *rd = malloc(size * sizeof(int));
        MPI_Datatype *rt = malloc(size * sizeof(MPI_Datatype));
        for (int r = 0; r < size; r++) { rt[r] = (rank % 2) ? MPI_DOUBLE : MPI_INT; rd[r] = r * 16 + ((rank % 2) ? 8 : 0); }
        MPI_Alltoallw(ws, wc, wd, wt, wr, wc, rd, rt, MPI_COMM_WORLD);
        int ok = 1;
        for (int r = 0; r < size; r++)
            ok &= (rank % 2) ? wr[r].d == r + rank / 10.0 : wr[r].i == r * 10 + rank;
        CHECK(ok, "alltoallw");
        free(wc); free(wd); free(wt); free(ws); free(wr); free(rd); free(rt);
    }
    free(all); free(cnts); free(dsp); free(vin); free(vall); free(a2); free(b2);
}

static int handler_calls = 0;
static void my_handler(MPI_Comm *c, int *code, ...) { (void)c; (void)code; handler_calls++; }

static void errors(void) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    /* truncation seen from C: 4 ints into a buffer of 2 */
    int four[4] = {1, 2, 3, 4}, two[2];
    MPI_Request rq;
    MPI_Isend(four, 4, MPI_INT, next, 40, c, &rq);
    MPI_Status s;
    int rc = MPI_Recv(two, 2, MPI_INT, prev, 40, c, &s);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    int cls;
    MPI_Error_class(rc, &cls);
    CHECK(rc != MPI_SUCCESS && cls == MPI_ERR_TRUNCATE, "truncation rc %d class %d", rc, cls);
    char msg[MPI_MAX_ERROR_STRING]; int len;
    /* a user error class and code of it, with strings */
    {
        int ucls = 0, ucode = 0, back = -1, ulen = 0, *last = NULL, lflag = 0;
        char ustr[MPI_MAX_ERROR_STRING];
        MPI_Add_error_class(&ucls);
        MPI_Add_error_code(ucls, &ucode);
        MPI_Add_error_string(ucode, "the suite's own error");
        MPI_Error_class(ucode, &back);
        MPI_Error_string(ucode, ustr, &ulen);
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_LASTUSEDCODE, &last, &lflag);
        CHECK(ucls > MPI_ERR_LASTCODE && back == ucls && strcmp(ustr, "the suite's own error") == 0 && lflag && *last >= ucls,
              "user error class %d code %d: class back %d, string %s", ucls, ucode, back, ustr);
    }
    MPI_Error_string(rc, msg, &len);
    CHECK(len > 0 && (!on_metampi || strstr(msg, "MPI_Recv") != NULL), "error string: %s", msg);
    rc = MPI_Send(four, 1, MPI_INT, size + 5, 0, c);
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RANK, "bad rank class %d", cls);
    rc = MPI_Send(four, 1, MPI_INT, next, -3, c);
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_TAG, "bad tag class %d", cls);
    rc = MPI_Send(four, -1, MPI_INT, next, 0, c);
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_COUNT, "bad count class %d", cls);
    /* a function metampi does not implement answers through the handler, on MPI_COMM_WORLD */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
#ifdef MPI_ABI_VERSION
    MPI_Info finfo = MPI_INFO_NULL;
    rc = MPI_Abi_get_fortran_info(&finfo);
    const char *unsupported = "MPI_Abi_get_fortran_info";
#else
    rc = MPIX_Comm_failure_ack(MPI_COMM_WORLD);
    const char *unsupported = "MPIX_Comm_failure_ack";
#endif
    MPI_Error_class(rc, &cls);
    MPI_Error_string(rc, msg, &len);
    if (on_metampi) /* MPICH implements it */
        CHECK(cls == MPI_ERR_UNSUPPORTED_OPERATION && strstr(msg, unsupported), "unsupported: %d %s", cls, msg);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    int commutes = 1;
    MPI_Op_commutative(MPI_REPLACE, &commutes);
    CHECK(parent == MPI_COMM_NULL && !commutes, "no parent, MPI_REPLACE keeps order");
    /* a user handler is called */
    MPI_Errhandler eh;
    MPI_Comm_create_errhandler(my_handler, &eh);
    MPI_Comm_set_errhandler(c, eh);
    rc = MPI_Send(four, 1, MPI_INT, next, -3, c);
    CHECK(handler_calls == 1 && rc != MPI_SUCCESS, "user handler calls %d", handler_calls);
    MPI_Errhandler_free(&eh);
    MPI_Comm_free(&c);
}

#ifdef MPI_ABI_VERSION
/* What only the standard ABI has: its version, its sizes, and handles as integers. */
static void standard_abi(void) {
    int major = -1, minor = -1;
    CHECK(MPI_Abi_get_version(&major, &minor) == MPI_SUCCESS && major == MPI_ABI_VERSION,
          "abi version %d.%d", major, minor);
    MPI_Info info;
    char v[MPI_MAX_INFO_VAL];
    int vlen = sizeof v, flag = 0;
    MPI_Abi_get_info(&info);
    MPI_Info_get_string(info, "mpi_aint_size", &vlen, v, &flag);
    CHECK(flag && atoi(v) == (int)sizeof(MPI_Aint), "mpi_aint_size %d %s", flag, v);
    MPI_Info_free(&info);
    CHECK(sizeof(MPI_Status) == 32 && sizeof(MPI_Comm) == sizeof(void *), "sizes");
    CHECK(MPI_Comm_fromint(MPI_Comm_toint(MPI_COMM_WORLD)) == MPI_COMM_WORLD, "toint world");
    MPI_Comm d;
    MPI_Comm_dup(MPI_COMM_SELF, &d);
    CHECK(MPI_Comm_fromint(MPI_Comm_toint(d)) == d, "toint dup");
    MPI_Comm_free(&d);
    CHECK(MPI_Type_fromint(MPI_Type_toint(MPI_DOUBLE)) == MPI_DOUBLE, "toint double");
}
#endif

/* ---- MPI-4 extras: persistent and neighbourhood collectives, Isendrecv, partitioned
 * point-to-point, generalized requests, sessions ---- */
static int greq_query(void *extra, MPI_Status *st) {
    MPI_Status_set_elements(st, MPI_INT, *(int *)extra);
    MPI_Status_set_cancelled(st, 0);
    st->MPI_SOURCE = 42;
    st->MPI_TAG = 7;
    return MPI_SUCCESS;
}
static int greq_frees = 0;
static int greq_free(void *extra) { (void)extra; greq_frees++; return MPI_SUCCESS; }
static int greq_cancel(void *extra, int complete) { (void)extra; (void)complete; return MPI_SUCCESS; }

static void mpi4(void) {
    int prev = (rank + size - 1) % size, next = (rank + 1) % size;
    /* persistent allreduce and bcast, started three times with new data */
    MPI_Request pr[2];
    int in = 0, sum = 0, b = 0;
    MPI_Allreduce_init(&in, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &pr[0]);
    MPI_Bcast_init(&b, 1, MPI_INT, size - 1, MPI_COMM_WORLD, MPI_INFO_NULL, &pr[1]);
    for (int it = 0; it < 3; it++) {
        in = rank + it;
        b = rank == size - 1 ? 100 + it : -1;
        MPI_Startall(2, pr);
        MPI_Waitall(2, pr, MPI_STATUSES_IGNORE);
        CHECK(sum == size * (size - 1) / 2 + size * it && b == 100 + it, "persistent round %d: sum %d bcast %d", it, sum, b);
    }
    CHECK(pr[0] != MPI_REQUEST_NULL, "persistent collective request stays");
    MPI_Request_free(&pr[0]);
    MPI_Request_free(&pr[1]);
    /* neighbourhood collectives on a periodic ring and on a distributed graph */
    int dims[1] = {size}, periods[1] = {1};
    MPI_Comm ring;
    MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &ring);
    int nb[2] = {-1, -1};
    MPI_Neighbor_allgather(&rank, 1, MPI_INT, nb, 1, MPI_INT, ring);
    CHECK(nb[0] == prev && nb[1] == next, "neighbor_allgather %d %d", nb[0], nb[1]);
    int out[2] = {rank * 10, rank * 10 + 1}, got[2] = {-1, -1};
    MPI_Request nr;
    MPI_Ineighbor_alltoall(out, 1, MPI_INT, got, 1, MPI_INT, ring, &nr);
    /* a user message with any tag must not take the neighbourhood traffic */
    int flag = 1;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, ring, &flag, MPI_STATUS_IGNORE);
    MPI_Wait(&nr, MPI_STATUS_IGNORE);
    /* the block from the left neighbour is the one it sent rightwards, and back */
    CHECK(!flag && got[0] == prev * 10 + 1 && got[1] == next * 10, "neighbor_alltoall %d %d (probe %d)", got[0], got[1], flag);
    MPI_Comm_free(&ring);
    int srcs[1] = {prev}, dsts[1] = {next}, from = -1;
    MPI_Comm dg;
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, srcs, MPI_UNWEIGHTED, 1, dsts, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &dg);
    MPI_Request dr;
    MPI_Neighbor_allgather_init(&rank, 1, MPI_INT, &from, 1, MPI_INT, dg, MPI_INFO_NULL, &dr);
    MPI_Start(&dr);
    MPI_Wait(&dr, MPI_STATUS_IGNORE);
    CHECK(from == prev, "persistent neighbor_allgather on a graph %d", from);
    MPI_Request_free(&dr);
    MPI_Comm_free(&dg);
    /* Isendrecv and Isendrecv_replace around the ring */
    int v = -1, r = rank;
    MPI_Request ir[2];
    MPI_Status st;
    MPI_Isendrecv(&rank, 1, MPI_INT, next, 3, &v, 1, MPI_INT, prev, 3, MPI_COMM_WORLD, &ir[0]);
    MPI_Isendrecv_replace(&r, 1, MPI_INT, next, 4, prev, 4, MPI_COMM_WORLD, &ir[1]);
    MPI_Wait(&ir[0], &st);
    /* (Debian's MPICH 4.0 reports another source here; MPI-4 says the status is the receive's) */
    CHECK(v == prev && ir[0] == MPI_REQUEST_NULL && (!on_metampi || (st.MPI_SOURCE == prev && st.MPI_TAG == 3)),
          "isendrecv %d from %d tag %d", v, st.MPI_SOURCE, st.MPI_TAG);
    MPI_Wait(&ir[1], MPI_STATUS_IGNORE);
    CHECK(r == prev, "isendrecv_replace %d", r);
    /* partitioned: 4 partitions of 2 ints, marked ready out of order */
    int pbuf[8], qbuf[8];
    MPI_Request ps, pq;
    MPI_Psend_init(pbuf, 4, 2, MPI_INT, next, 8, MPI_COMM_WORLD, MPI_INFO_NULL, &ps);
    MPI_Precv_init(qbuf, 4, 2, MPI_INT, prev, 8, MPI_COMM_WORLD, MPI_INFO_NULL, &pq);
    for (int it = 0; it < 2; it++) {
        for (int i = 0; i < 8; i++) { pbuf[i] = rank * 100 + it * 10 + i; qbuf[i] = -1; }
        MPI_Start(&pq);
        MPI_Start(&ps);
        MPI_Pready(3, ps);
        int list[2] = {0, 2};
        MPI_Pready_list(2, list, ps);
        MPI_Pready_range(1, 1, ps);
        int arrived = 0;
        while (!arrived) MPI_Parrived(pq, 3, &arrived);
        MPI_Wait(&ps, MPI_STATUS_IGNORE);
        MPI_Wait(&pq, MPI_STATUS_IGNORE);
        CHECK(qbuf[0] == prev * 100 + it * 10 && qbuf[7] == prev * 100 + it * 10 + 7, "partitioned round %d: %d %d", it, qbuf[0], qbuf[7]);
    }
    MPI_Request_free(&ps);
    MPI_Request_free(&pq);
    /* a generalized request completed by the program */
    int elems = 5, done = 0, count = -1;
    MPI_Request g;
    MPI_Grequest_start(greq_query, greq_free, greq_cancel, &elems, &g);
    MPI_Test(&g, &done, MPI_STATUS_IGNORE);
    CHECK(!done, "generalized request pending");
    MPI_Grequest_complete(g);
    MPI_Wait(&g, &st);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == 5 && st.MPI_SOURCE == 42 && st.MPI_TAG == 7 && greq_frees == 1 && g == MPI_REQUEST_NULL,
          "generalized request: count %d source %d frees %d", count, st.MPI_SOURCE, greq_frees);
    /* sessions: the world process set, and a communicator made from its group */
    MPI_Session ses;
    MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &ses);
    int npsets = 0, len = 0;
    MPI_Session_get_num_psets(ses, MPI_INFO_NULL, &npsets);
    char pname[64];
    int found = 0;
    for (int i = 0; i < npsets; i++) {
        len = sizeof pname;
        MPI_Session_get_nth_pset(ses, MPI_INFO_NULL, i, &len, pname);
        found |= strcmp(pname, "mpi://WORLD") == 0;
    }
    MPI_Group wg;
    MPI_Comm sc;
    MPI_Group_from_session_pset(ses, "mpi://WORLD", &wg);
    MPI_Comm_create_from_group(wg, "org.metampi.suite", MPI_INFO_NULL, MPI_ERRORS_RETURN, &sc);
    int ssize = 0, total = 0;
    MPI_Comm_size(sc, &ssize);
    MPI_Allreduce(&rank, &total, 1, MPI_INT, MPI_SUM, sc);
    CHECK(found && ssize == size && total == size * (size - 1) / 2, "session world: found %d size %d sum %d", found, ssize, total);
    /* (Debian's MPICH 4.0 reads past its list here instead of answering an error) */
    if (on_metampi) {
        int rc = MPI_Session_get_nth_pset(ses, MPI_INFO_NULL, npsets, &len, pname), cls = -1;
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_ARG, "nth pset past the end: class %d", cls);
    }
    MPI_Comm_free(&sc);
    MPI_Group_free(&wg);
    MPI_Session_finalize(&ses);
    CHECK(ses == MPI_SESSION_NULL, "session nulled");
}

/* ---- MPI-4.1: the fields of a status by function, the status of many requests without
 * completing them, removable error classes and codes, the pair type of a value and an
 * index. MPICH 4.0's mpi.h (MPICH's ABI here) has none of them. ---- */
#if MPI_VERSION > 4 || (MPI_VERSION == 4 && MPI_SUBVERSION >= 1)
static void mpi41(void) {
    int prev = (rank + size - 1) % size, next = (rank + 1) % size;
    /* status fields set and read back; the count beside them stays */
    MPI_Status st;
    int src = -1, tag = -1, err = -1, count = -1;
    MPI_Status_set_elements(&st, MPI_INT, 3);
    MPI_Status_set_source(&st, 11);
    MPI_Status_set_tag(&st, 22);
    MPI_Status_set_error(&st, MPI_ERR_TAG);
    MPI_Status_get_source(&st, &src);
    MPI_Status_get_tag(&st, &tag);
    MPI_Status_get_error(&st, &err);
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(src == 11 && tag == 22 && err == MPI_ERR_TAG && st.MPI_SOURCE == 11 && st.MPI_TAG == 22 &&
          st.MPI_ERROR == MPI_ERR_TAG && count == 3,
          "status fields: source %d tag %d error %d count %d", src, tag, err, count);

    /* get_status_all/any/some on a complete receive and send (and a null request) leave them
     * as they are: MPI_Waitall completes them afterwards */
    int out = rank, in = -1, flag = 0, idx = -2, n = -2, ids[3] = {-1, -1, -1};
    MPI_Request rq[3];
    MPI_Status sts[3];
    MPI_Irecv(&in, 1, MPI_INT, prev, 50, MPI_COMM_WORLD, &rq[0]);
    MPI_Isend(&out, 1, MPI_INT, next, 50, MPI_COMM_WORLD, &rq[1]);
    rq[2] = MPI_REQUEST_NULL;
    while (!flag) MPI_Request_get_status_all(3, rq, &flag, sts);
    MPI_Get_count(&sts[2], MPI_INT, &count);
    CHECK(in == prev && sts[0].MPI_SOURCE == prev && sts[0].MPI_TAG == 50 && rq[0] != MPI_REQUEST_NULL &&
          rq[1] != MPI_REQUEST_NULL && sts[2].MPI_SOURCE == MPI_ANY_SOURCE && sts[2].MPI_TAG == MPI_ANY_TAG && count == 0,
          "get_status_all: %d from %d tag %d; null's status %d %d count %d", in, sts[0].MPI_SOURCE,
          sts[0].MPI_TAG, sts[2].MPI_SOURCE, sts[2].MPI_TAG, count);
    flag = 0;
    MPI_Request_get_status_any(3, rq, &idx, &flag, &st);
    CHECK(flag && (idx == 0 || idx == 1) && (idx != 0 || st.MPI_SOURCE == prev), "get_status_any: flag %d index %d", flag, idx);
    MPI_Request_get_status_some(3, rq, &n, ids, MPI_STATUSES_IGNORE);
    CHECK(n == 2 && ids[0] == 0 && ids[1] == 1, "get_status_some: %d [%d %d]", n, ids[0], ids[1]);
    sts[0].MPI_SOURCE = -7;
    int rc = MPI_Waitall(3, rq, sts);
    CHECK(rc == MPI_SUCCESS && sts[0].MPI_SOURCE == prev && rq[0] == MPI_REQUEST_NULL && rq[1] == MPI_REQUEST_NULL,
          "waitall after get_status: rc %d source %d", rc, sts[0].MPI_SOURCE);

    /* an inactive persistent request and a null one: complete and empty, no index */
    MPI_Request pr[2];
    MPI_Recv_init(&in, 1, MPI_INT, prev, 51, MPI_COMM_WORLD, &pr[0]);
    pr[1] = MPI_REQUEST_NULL;
    flag = 0;
    st.MPI_SOURCE = -7;
    MPI_Request_get_status_any(2, pr, &idx, &flag, &st);
    CHECK(flag && idx == MPI_UNDEFINED && st.MPI_SOURCE == MPI_ANY_SOURCE, "get_status_any of inactive: flag %d index %d source %d", flag, idx, st.MPI_SOURCE);
    MPI_Request_get_status_some(2, pr, &n, ids, MPI_STATUSES_IGNORE);
    flag = 0;
    MPI_Request_get_status_all(2, pr, &flag, MPI_STATUSES_IGNORE);
    CHECK(n == MPI_UNDEFINED && flag, "get_status_some/all of inactive: %d %d", n, flag);
    /* started, with nothing sent to it before the barrier: not complete, then complete */
    MPI_Start(&pr[0]);
    flag = 1;
    MPI_Request_get_status_any(2, pr, &idx, &flag, &st);
    CHECK(!flag && idx == MPI_UNDEFINED, "get_status_any of a pending receive: flag %d index %d", flag, idx);
    MPI_Request_get_status_some(2, pr, &n, ids, MPI_STATUSES_IGNORE);
    flag = 1;
    MPI_Request_get_status_all(2, pr, &flag, MPI_STATUSES_IGNORE);
    CHECK(n == 0 && !flag, "get_status_some/all of a pending receive: %d %d", n, flag);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Send(&out, 1, MPI_INT, next, 51, MPI_COMM_WORLD);
    for (flag = 0; !flag;) MPI_Request_get_status_any(2, pr, &idx, &flag, &st);
    CHECK(idx == 0 && st.MPI_SOURCE == prev && st.MPI_TAG == 51 && pr[0] != MPI_REQUEST_NULL, "get_status_any of the receive: %d from %d", idx, st.MPI_SOURCE);
    /* (MPICH 5.0 gives an empty status here, as if get_status_any had completed it) */
    MPI_Wait(&pr[0], &st);
    CHECK(in == prev && st.MPI_SOURCE == prev && pr[0] != MPI_REQUEST_NULL, "persistent receive after get_status: %d from %d", in, st.MPI_SOURCE);
    MPI_Request_free(&pr[0]);

    /* error classes and codes come off in the reverse order they went on; the value may be
     * given again (errors of calls on no communicator: MPI_COMM_WORLD's handler on metampi,
     * MPI_COMM_SELF's on MPICH) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int ecls = 0, ecode = 0, cls = -1, len = 0, again = 0, *last = NULL;
    char msg[MPI_MAX_ERROR_STRING] = "";
    MPI_Add_error_class(&ecls);
    MPI_Add_error_code(ecls, &ecode);
    MPI_Add_error_string(ecode, "the suite's removable error");
    rc = MPI_Remove_error_class(ecls);
    MPI_Error_class(rc, &cls);
    CHECK(rc != MPI_SUCCESS && (!on_metampi || cls == MPI_ERR_ARG), "a class with a code is removed: rc %d class %d", rc, cls);
    CHECK(MPI_Remove_error_code(ecode) != MPI_SUCCESS, "a code with a string is removed");
    CHECK(MPI_Remove_error_class(MPI_ERR_TAG) != MPI_SUCCESS, "a predefined class is removed");
    CHECK(MPI_Remove_error_string(ecode) == MPI_SUCCESS && MPI_Remove_error_code(ecode) == MPI_SUCCESS &&
          MPI_Remove_error_class(ecls) == MPI_SUCCESS, "string, code and class are not removed in turn");
    if (on_metampi) { /* (MPICH 5.0 reads freed memory here) */
        MPI_Error_string(ecode, msg, &len);
        CHECK(strstr(msg, "removable") == NULL, "a removed code keeps its string: %s", msg);
    }
    CHECK(MPI_Remove_error_class(ecls) != MPI_SUCCESS, "a class is removed twice");
    MPI_Add_error_class(&again);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_LASTUSEDCODE, &last, &flag);
    CHECK(flag && *last >= again && (!on_metampi || again == ecls), "class after removal %d (was %d), last used %d", again, ecls, flag ? *last : -1);
    MPI_Remove_error_class(again);

    /* the pair types of MPI_MINLOC and MPI_MAXLOC, and one at work */
    MPI_Datatype pt[8];
    MPI_Type_get_value_index(MPI_FLOAT, MPI_INT, &pt[0]);
    MPI_Type_get_value_index(MPI_DOUBLE, MPI_INT, &pt[1]);
    MPI_Type_get_value_index(MPI_LONG, MPI_INT, &pt[2]);
    MPI_Type_get_value_index(MPI_SHORT, MPI_INT, &pt[3]);
    MPI_Type_get_value_index(MPI_INT, MPI_INT, &pt[4]);
    MPI_Type_get_value_index(MPI_LONG_DOUBLE, MPI_INT, &pt[5]);
    MPI_Type_get_value_index(MPI_CHAR, MPI_INT, &pt[6]);
    MPI_Type_get_value_index(MPI_INT, MPI_FLOAT, &pt[7]);
    CHECK(pt[0] == MPI_FLOAT_INT && pt[1] == MPI_DOUBLE_INT && pt[2] == MPI_LONG_INT && pt[3] == MPI_SHORT_INT &&
          pt[4] == MPI_2INT && pt[5] == MPI_LONG_DOUBLE_INT && pt[6] == MPI_DATATYPE_NULL && pt[7] == MPI_DATATYPE_NULL,
          "value_index: C pairs");
    if (on_metampi) { /* (MPICH 5.0 has no Fortran pairs here) */
        MPI_Datatype f[3];
        MPI_Type_get_value_index(MPI_REAL, MPI_REAL, &f[0]);
        MPI_Type_get_value_index(MPI_DOUBLE_PRECISION, MPI_DOUBLE_PRECISION, &f[1]);
        MPI_Type_get_value_index(MPI_INTEGER, MPI_INTEGER, &f[2]);
        CHECK(f[0] == MPI_2REAL && f[1] == MPI_2DOUBLE_PRECISION && f[2] == MPI_2INTEGER, "value_index: Fortran pairs");
    }
    MPI_Datatype bad = MPI_FLOAT_INT;
    rc = MPI_Type_get_value_index(MPI_DATATYPE_NULL, MPI_INT, &bad);
    MPI_Error_class(rc, &cls);
    CHECK(rc != MPI_SUCCESS && cls == MPI_ERR_TYPE, "value_index of MPI_DATATYPE_NULL: rc %d class %d", rc, cls);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
    struct { float v; int i; } mine = {(float)((rank + 1) % size), rank}, least = {-1, -1};
    MPI_Allreduce(&mine, &least, 1, pt[0], MPI_MINLOC, MPI_COMM_WORLD);
    CHECK(least.v == 0 && least.i == (size - 1) % size, "minloc over the pair type: %g at %d", least.v, least.i);

    /* Buffers attached to a communicator, flushed, handed back. */
    char cbuf[4096];
    void *back = NULL;
    int bsize = 0, brc, bcls = 0;
    MPI_Request fr;
    CHECK(MPI_Comm_attach_buffer(MPI_COMM_WORLD, cbuf, sizeof cbuf) == MPI_SUCCESS, "comm attach");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    brc = MPI_Comm_attach_buffer(MPI_COMM_WORLD, cbuf, sizeof cbuf);
    MPI_Error_class(brc, &bcls);
    CHECK(brc != MPI_SUCCESS && (bcls == MPI_ERR_BUFFER || !on_metampi), "a second attach gave class %d", bcls);
    int bv = rank + 500, bw = -1;
    MPI_Bsend(&bv, 1, MPI_INT, next, 71, MPI_COMM_WORLD);
    MPI_Recv(&bw, 1, MPI_INT, prev, 71, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK(bw == prev + 500, "bsend over the communicator's buffer gave %d", bw);
    CHECK(MPI_Comm_flush_buffer(MPI_COMM_WORLD) == MPI_SUCCESS && MPI_Buffer_flush() == MPI_SUCCESS, "flush");
    CHECK(MPI_Comm_iflush_buffer(MPI_COMM_WORLD, &fr) == MPI_SUCCESS && MPI_Wait(&fr, MPI_STATUS_IGNORE) == MPI_SUCCESS, "iflush");
    CHECK(MPI_Comm_detach_buffer(MPI_COMM_WORLD, &back, &bsize) == MPI_SUCCESS && back == cbuf && bsize == (int)sizeof cbuf,
          "detach gave %p of %d", back, bsize);
    brc = MPI_Comm_detach_buffer(MPI_COMM_WORLD, &back, &bsize);
    CHECK(brc == MPI_SUCCESS && back == NULL && bsize == 0, "detaching nothing gave %d, %p of %d", brc, back, bsize);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}
#endif

/* ---- MPICH's ABI only: MPI-1's names that MPI-3 removed (old programs still call them),
 * and MPICH's MPIX_ extensions that programs ask before passing device memory. ---- */
#ifndef MPI_ABI_VERSION
static void mpich_only(void) {
    struct { int i; double d; } s;
    MPI_Aint a0, a1, g0, ext = 0, lb = -1, ub = 0;
    MPI_Address(&s.i, &a0);
    MPI_Address(&s.d, &a1);
    MPI_Get_address(&s.i, &g0);
    CHECK(a0 == g0, "MPI_Address and MPI_Get_address differ");
    int bls[2] = {1, 1};
    MPI_Aint ds[2] = {0, a1 - a0};
    MPI_Datatype ts[2] = {MPI_INT, MPI_DOUBLE}, st, hv, hi;
    CHECK(MPI_Type_struct(2, bls, ds, ts, &st) == MPI_SUCCESS, "MPI_Type_struct");
    MPI_Type_commit(&st);
    MPI_Type_extent(st, &ext);
    MPI_Type_lb(st, &lb);
    MPI_Type_ub(st, &ub);
    CHECK(ext == (MPI_Aint)sizeof s && lb == 0 && ub == ext, "struct extent %ld lb %ld ub %ld", (long)ext, (long)lb, (long)ub);
    MPI_Type_hvector(3, 1, 2 * sizeof(int), MPI_INT, &hv);
    MPI_Type_extent(hv, &ext);
    CHECK(ext == 5 * (MPI_Aint)sizeof(int), "hvector extent %ld", (long)ext);
    MPI_Aint hd[2] = {0, 3 * sizeof(int)};
    MPI_Type_hindexed(2, bls, hd, MPI_INT, &hi);
    MPI_Type_extent(hi, &ext);
    CHECK(ext == 4 * (MPI_Aint)sizeof(int), "hindexed extent %ld", (long)ext);
    MPI_Type_free(&st); MPI_Type_free(&hv); MPI_Type_free(&hi);
    int cls, code, cuda = -1;
    MPI_Add_error_class(&cls);
    MPI_Add_error_code(cls, &code);
    CHECK(MPIX_Delete_error_code(code) == MPI_SUCCESS && MPIX_Delete_error_class(cls) == MPI_SUCCESS,
          "MPIX_Delete_error_code/class");
    if (on_metampi) { /* host memory only: the answers are no, not an error code */
        CHECK(MPIX_Query_cuda_support() == 0, "MPIX_Query_cuda_support says yes");
        CHECK(MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &cuda) == MPI_SUCCESS && cuda == 0, "GPU query %d", cuda);
    }
}
#endif

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int flag, liblen;
    MPI_Get_library_version(lib, &liblen);
    on_metampi = strncmp(lib, "metampi", 7) == 0;
    MPI_Initialized(&flag);
    CHECK(flag && provided == MPI_THREAD_MULTIPLE, "init: flag %d provided %d", flag, provided);
    int bufsize = 1 << 16;
    void *bbuf = malloc(bufsize);
    MPI_Buffer_attach(bbuf, bufsize);
    p2p();
    datatypes();
    comms();
    collectives();
    errors();
    mpi4();
#if MPI_VERSION > 4 || (MPI_VERSION == 4 && MPI_SUBVERSION >= 1)
    mpi41();
#endif
#ifdef MPI_ABI_VERSION
    standard_abi();
#else
    mpich_only();
#endif
    MPI_Buffer_detach(&bbuf, &bufsize);
    free(bbuf);
    int all_failed = 0, all_checks = 0;
    MPI_Reduce(&failed, &all_failed, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    double t = MPI_Wtime();
    CHECK(t > 0 && MPI_Wtick() > 0, "wtime");
    if (rank == 0) printf("suite: %d checks, %d failed, %d ranks\n", all_checks, all_failed, size);
    MPI_Finalize();
    MPI_Finalized(&flag);
    return (all_failed || !flag) ? 1 : 0;
}
