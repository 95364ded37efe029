/* The tool information interface (MPI_T) through the C ABI: control variables are metampi's
 * settings (read as strings), performance variables its counters, two categories, one time
 * source, no events. Run by tests/c_abi.rs with METAMPI_FORCE_TCP=1 and
 * METAMPI_EAGER_LIMIT=12345 on 2 ranks; rank 0 prints "tool: ok" or FAIL lines. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
    int provided, n, rc, i;
    /* MPI_T works before MPI_Init. */
    rc = MPI_T_cvar_get_num(&n);
    CHECK(rc == MPI_T_ERR_NOT_INITIALIZED, "MPI_T before MPI_T_init_thread gave %d", rc);
    CHECK(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS, "MPI_T_init_thread");
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);

    /* Control variables: the settings. */
    CHECK(MPI_T_cvar_get_num(&n) == MPI_SUCCESS && n > 10, "%d control variables", n);
    int found = 0;
    for (i = 0; i < n; i++) {
        char name[128], desc[1024];
        int nlen = sizeof name, dlen = sizeof desc, verb, bind, scope;
        MPI_Datatype dt;
        MPI_T_enum en;
        rc = MPI_T_cvar_get_info(i, name, &nlen, &verb, &dt, &en, desc, &dlen, &bind, &scope);
        CHECK(rc == MPI_SUCCESS && strncmp(name, "METAMPI_", 8) == 0 && (int)strlen(name) + 1 == nlen,
              "cvar %d: rc %d name %s len %d", i, rc, name, nlen);
        CHECK(dt == MPI_CHAR && bind == MPI_T_BIND_NO_OBJECT && scope == MPI_T_SCOPE_READONLY && dlen > 1,
              "cvar %s: type, binding or scope", name);
        CHECK(strstr(name, "SECRET") == NULL, "the job secret is offered as %s", name);
        if (strcmp(name, "METAMPI_EAGER_LIMIT") == 0) found = 1;
    }
    CHECK(found, "METAMPI_EAGER_LIMIT is not among the control variables");
    int idx = -1, count = 0;
    CHECK(MPI_T_cvar_get_index("METAMPI_EAGER_LIMIT", &idx) == MPI_SUCCESS && idx >= 0, "cvar index");
    CHECK(MPI_T_cvar_get_index("METAMPI_NO_SUCH", &idx) == MPI_T_ERR_INVALID_NAME, "unknown cvar name");
    MPI_T_cvar_get_index("METAMPI_EAGER_LIMIT", &idx);
    MPI_T_cvar_handle h;
    CHECK(MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) == MPI_SUCCESS && count > 8, "cvar handle");
    char *value = calloc(count, 1);
    CHECK(MPI_T_cvar_read(h, value) == MPI_SUCCESS && strcmp(value, "12345") == 0, "METAMPI_EAGER_LIMIT reads '%s'", value);
    CHECK(MPI_T_cvar_write(h, value) == MPI_T_ERR_CVAR_SET_NEVER, "writing a setting");
    free(value);
    MPI_T_cvar_handle_free(&h);
    CHECK(h == MPI_T_CVAR_HANDLE_NULL, "freed cvar handle not null");
    char small[4];
    int slen = sizeof small;
    MPI_T_cvar_get_info(idx, small, &slen, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    CHECK(slen == 4 && small[3] == 0, "a name cut to a 4-byte buffer: len %d", slen);

    /* Performance variables: counters since the handle was made. */
    int np = 0, looks = -1;
    CHECK(MPI_T_pvar_get_num(&np) == MPI_SUCCESS && np > 0, "%d performance variables", np);
    CHECK(MPI_T_pvar_get_index("metampi_socket_looks", MPI_T_PVAR_CLASS_COUNTER, &looks) == MPI_SUCCESS, "pvar index");
    CHECK(MPI_T_pvar_get_index("metampi_socket_looks", MPI_T_PVAR_CLASS_TIMER, &i) == MPI_T_ERR_INVALID_NAME, "wrong class");
    char pname[64];
    int plen = sizeof pname, verb, cls, bind, ro, cont, atomic;
    MPI_Datatype pdt;
    rc = MPI_T_pvar_get_info(looks, pname, &plen, &verb, &cls, &pdt, NULL, NULL, NULL, &bind, &ro, &cont, &atomic);
    CHECK(rc == MPI_SUCCESS && cls == MPI_T_PVAR_CLASS_COUNTER && pdt == MPI_UNSIGNED_LONG_LONG && ro && cont,
          "pvar info of %s", pname);
    MPI_T_pvar_session s;
    MPI_T_pvar_handle ph;
    unsigned long long before = 99, after = 0;
    CHECK(MPI_T_pvar_session_create(&s) == MPI_SUCCESS, "session");
    CHECK(MPI_T_pvar_handle_alloc(s, looks, NULL, &ph, &count) == MPI_SUCCESS && count == 1, "pvar handle");
    MPI_T_pvar_read(s, ph, &before);
    int token = 0;
    for (i = 0; i < 50; i++) {
        if (rank == 0) {
            MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
        }
    }
    CHECK(MPI_T_pvar_read(s, ph, &after) == MPI_SUCCESS, "pvar read");
    CHECK(before < 10 && after > before, "socket looks: %llu then %llu over TCP traffic", before, after);
    CHECK(MPI_T_pvar_start(s, ph) == MPI_T_ERR_PVAR_NO_STARTSTOP, "a continuous counter started");
    CHECK(MPI_T_pvar_reset(s, MPI_T_PVAR_ALL_HANDLES) == MPI_T_ERR_PVAR_NO_WRITE, "a read-only counter reset");
    CHECK(MPI_T_pvar_write(s, ph, &after) == MPI_T_ERR_PVAR_NO_WRITE, "a read-only counter written");
    CHECK(MPI_T_pvar_handle_free(s, &ph) == MPI_SUCCESS && ph == MPI_T_PVAR_HANDLE_NULL, "pvar handle free");
    CHECK(MPI_T_pvar_read(s, ph, &after) == MPI_T_ERR_INVALID_HANDLE, "read through a freed handle");
    CHECK(MPI_T_pvar_session_free(&s) == MPI_SUCCESS, "session free");

    /* Categories, events, the time source. */
    int nc = 0, ncv = 0, npv = 0, ncat = -1, cv[4];
    CHECK(MPI_T_category_get_num(&nc) == MPI_SUCCESS && nc == 2, "%d categories", nc);
    CHECK(MPI_T_category_get_index("metampi_settings", &i) == MPI_SUCCESS && i == 0, "settings category");
    MPI_T_category_get_info(0, NULL, NULL, NULL, NULL, &ncv, &npv, &ncat);
    CHECK(ncv == n && npv == 0 && ncat == 0, "settings category holds %d/%d/%d", ncv, npv, ncat);
    CHECK(MPI_T_category_get_cvars(0, 4, cv) == MPI_SUCCESS && cv[3] == 3, "category's cvars");
    CHECK(MPI_T_category_get_info(2, NULL, NULL, NULL, NULL, &ncv, &npv, &ncat) == MPI_T_ERR_INVALID_INDEX, "category 2");
    CHECK(MPI_T_event_get_num(&i) == MPI_SUCCESS && i == 0, "events");
    MPI_Count t0 = 0, t1 = 0;
    CHECK(MPI_T_source_get_num(&i) == MPI_SUCCESS && i == 1, "sources");
    MPI_T_source_get_timestamp(0, &t0);
    MPI_T_source_get_timestamp(0, &t1);
    CHECK(t1 >= t0 && t0 > 0, "timestamps %lld %lld", (long long)t0, (long long)t1);

    MPI_Finalize();
    /* And after MPI_Finalize, until the last MPI_T_finalize. */
    CHECK(MPI_T_cvar_get_num(&n) == MPI_SUCCESS, "MPI_T after MPI_Finalize");
    MPI_T_finalize();
    CHECK(MPI_T_cvar_get_num(&n) == MPI_T_ERR_NOT_INITIALIZED, "MPI_T after MPI_T_finalize");
    if (fails == 0) printf("tool: ok, rank %d\n", rank);
    return fails != 0;
}
