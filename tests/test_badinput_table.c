/* The bad-input table of docs/safety.md, API half (issue 8): every row is one
 * call with a bad argument and the exact code it must return. Rows are
 * numbered as in the document; ROW() checks that they come in order, so a
 * row cannot be dropped or renumbered here without the count changing.
 *
 * DLOCK_TABLE_MARKDOWN=1 prints each row as a markdown table line (the
 * document's table is made from that output).
 *
 * Needs redis-server (skips with 77 without it): handles are made on a real
 * client, and the wrong-password rows need a server with requirepass. */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int g_row, g_markdown;

/* Row n: `call` (the text shown in the table as the input) must return want. */
#define ROW(n, surface, input, call, want, msg)                                          \
    do {                                                                                 \
        ASSERT_MSG((n) == g_row + 1, "row %d follows row %d", (n), g_row);               \
        g_row = (n);                                                                     \
        int row_got_ = (call);                                                           \
        const char *row_msg_ = (msg);                                                    \
        ASSERT_MSG(row_got_ == (want), "row %d (%s, %s): got %d (%s), want %s%s%s", (n),  \
                   (surface), (input), row_got_, dlock_strerror(row_got_), #want,        \
                   row_msg_ ? "; message: " : "", row_msg_ ? row_msg_ : "");             \
        if (g_markdown)                                                                  \
            printf("| %d | `%s` | %s | `%s` | `test_badinput_table` |\n", (n), (surface), \
                   (input), #want);                                                      \
    } while (0)

static dlock_client *g_last; /* the client of the last client_new row */

static int client_with(const dlock_options *o)
{
    dlock_client_free(g_last);
    g_last = NULL;
    int rc = dlock_client_new(o, &g_last);
    ASSERT_MSG(rc == DLOCK_OK || g_last != NULL, "*out not set on failure");
    if (rc != DLOCK_OK) ASSERT_MSG(dlock_errmsg(g_last)[0] != '\0', "empty message, code %d", rc);
    return rc;
}

static int client_url(const char *url)
{
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    o.connect_timeout_ms = 500;
    return client_with(&o);
}

static const char *last_msg(void)
{
    return g_last ? dlock_errmsg(g_last) : NULL;
}

/* A TCP port on 127.0.0.1 that refuses connections (bound, never listened on). */
static int g_dead_fd = -1;
static int dead_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    g_dead_fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(g_dead_fd >= 0);
    ASSERT(bind(g_dead_fd, (struct sockaddr *)&a, sizeof a) == 0);
    ASSERT(getsockname(g_dead_fd, (struct sockaddr *)&a, &len) == 0);
    return ntohs(a.sin_port);
}

int main(void)
{
    th_init("badinput_table");
    g_markdown = getenv("DLOCK_TABLE_MARKDOWN") != NULL;
    th_server *srv = th_server_start(NULL);
    th_server_opts po = {0, "s3cret-pw"};
    th_server *auth = th_server_start(&po);
    dlock_client *c = th_client(srv, 0);
    char url[128], buf[256];
    int port = dead_port();

    /* ---- URLs, one per scheme (nothing connects) ---- */
    ROW(1, "dlock_client_new", "url `redis://127.0.0.1:0` (port 0)",
        client_url("redis://127.0.0.1:0"), DLOCK_EINVAL, last_msg());
    ROW(2, "dlock_client_new", "url `redis://127.0.0.1:6379/x` (db not a number)",
        client_url("redis://127.0.0.1:6379/x"), DLOCK_EINVAL, last_msg());
    ROW(3, "dlock_client_new", "url `rediss://:6380` (empty host)",
        client_url("rediss://:6380"), DLOCK_EINVAL, last_msg());
    ROW(4, "dlock_client_new", "url `unix://` (no path)", client_url("unix://"), DLOCK_EINVAL,
        last_msg());
    ROW(5, "dlock_client_new", "url `unix:///tmp/x.sock?db=-2`",
        client_url("unix:///tmp/x.sock?db=-2"), DLOCK_EINVAL, last_msg());
    ROW(6, "dlock_client_new", "url `redlock://` (no node)", client_url("redlock://"),
        DLOCK_EINVAL, last_msg());
    ROW(7, "dlock_client_new", "url `redlock://a:1,,b:2` (empty node)",
        client_url("redlock://a:1,,b:2"), DLOCK_EINVAL, last_msg());
    ROW(8, "dlock_client_new", "url `redis-sentinel://127.0.0.1:26379` (no master name)",
        client_url("redis-sentinel://127.0.0.1:26379"), DLOCK_EINVAL, last_msg());
    ROW(9, "dlock_client_new", "url `redis-cluster://` (no seed)",
        client_url("redis-cluster://"), DLOCK_EINVAL, last_msg());
    ROW(10, "dlock_client_new", "url `http://127.0.0.1:6379` (unknown scheme)",
        client_url("http://127.0.0.1:6379"), DLOCK_EINVAL, last_msg());
    ROW(11, "dlock_client_new", "url `redis://u:Sup3rSecretPw@h:abc`; the message must not "
        "contain the password", client_url("redis://u:Sup3rSecretPw@h:abc"), DLOCK_EINVAL,
        last_msg());
    ASSERT_MSG(!strstr(last_msg(), "Sup3rSecretPw"), "password in message: %s", last_msg());

    /* ---- client options ---- */
    {
        dlock_options o;
        dlock_options_init(&o);
        o.url = th_server_url(srv);
        o.connect_timeout_ms = -1;
        ROW(12, "dlock_client_new", "`connect_timeout_ms = -1`", client_with(&o), DLOCK_EINVAL,
            last_msg());
        dlock_options_init(&o);
        o.url = th_server_url(srv);
        o.watchdog_lease_ms = 10;
        ROW(13, "dlock_client_new", "`watchdog_lease_ms = 10` (under 30 ms)", client_with(&o),
            DLOCK_EINVAL, last_msg());
        dlock_options_init(&o);
        o.url = th_server_url(srv);
        o.wait_replicas = -1;
        ROW(14, "dlock_client_new", "`wait_replicas = -1`", client_with(&o), DLOCK_EINVAL,
            last_msg());
        dlock_options_init(&o);
        o.url = th_server_url(srv);
        o.fence_url = th_server_url(srv);
        ROW(15, "dlock_client_new", "`fence_url` with a `redis://` (not RedLock) url",
            client_with(&o), DLOCK_EINVAL, last_msg());
        snprintf(url, sizeof url, "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
                 th_server_port(srv), th_server_port(srv), th_server_port(srv));
        dlock_options_init(&o);
        o.url = url;
        o.wait_replicas = 1;
        ROW(16, "dlock_client_new", "`wait_replicas = 1` with a `redlock://` url",
            client_with(&o), DLOCK_EINVAL, last_msg());
        dlock_options_init(&o);
        o.url = "rediss://127.0.0.1:6380";
        o.tls_cert_file = "/nonexistent/client.pem";
        ROW(17, "dlock_client_new", "`tls_cert_file` without `tls_key_file` (half a client "
            "cert)", client_with(&o), DLOCK_EINVAL, last_msg());
        dlock_options_init(&o);
        o.url = "rediss://127.0.0.1:6380";
        o.tls_ca_file = "/nonexistent/ca.pem";
        ROW(18, "dlock_client_new", "`tls_ca_file` that does not exist", client_with(&o),
            DLOCK_ETLS, last_msg());
        snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
        dlock_options_init(&o);
        o.url = url;
        o.connect_timeout_ms = 500;
        ROW(19, "dlock_client_new", "unreachable server (a port that refuses)", client_with(&o),
            DLOCK_EIO, last_msg());
        snprintf(url, sizeof url, "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port,
                 port, port);
        dlock_options_init(&o);
        o.url = url;
        ROW(20, "dlock_client_new", "RedLock, every node unreachable", client_with(&o),
            DLOCK_ENOQUORUM, last_msg());
        dlock_options_init(&o);
        o.url = th_server_url(auth);
        o.password = "wrong-pw";
        ROW(21, "dlock_client_new", "wrong password", client_with(&o), DLOCK_EAUTH, last_msg());
        ASSERT_MSG(!strstr(last_msg(), "wrong-pw"), "password in message: %s", last_msg());
        dlock_options_init(&o);
        o.url = th_server_url(auth);
        ROW(22, "dlock_client_new", "no password for a server that needs one", client_with(&o),
            DLOCK_EAUTH, last_msg());
        ROW(23, "dlock_client_new", "`out = NULL`", dlock_client_new(&o, NULL), DLOCK_EINVAL,
            NULL);
        dlock_client_free(g_last);
        g_last = NULL;
    }

    /* ---- durations ---- */
    int64_t ms = 0;
    ROW(24, "dlock_parse_duration", "`\"-1s\"` (negative)", dlock_parse_duration("-1s", &ms),
        DLOCK_EINVAL, NULL);
    ROW(25, "dlock_parse_duration", "`\"10x\"` (unknown unit)", dlock_parse_duration("10x", &ms),
        DLOCK_EINVAL, NULL);
    ROW(26, "dlock_parse_duration", "`\"\"` (empty)", dlock_parse_duration("", &ms), DLOCK_EINVAL,
        NULL);
    ROW(27, "dlock_parse_duration", "`\"200000000d\"` (over 2^53 ms)",
        dlock_parse_duration("200000000d", &ms), DLOCK_EINVAL, NULL);
    ROW(28, "dlock_parse_duration", "`NULL` text", dlock_parse_duration(NULL, &ms), DLOCK_EINVAL,
        NULL);

    /* ---- names ---- */
    char *longname = malloc(DLOCK_NAME_MAX + 2);
    ASSERT_NOT_NULL(longname);
    memset(longname, 'n', DLOCK_NAME_MAX + 1);
    longname[DLOCK_NAME_MAX + 1] = '\0';
    dlock_lock *l = NULL;
    ROW(29, "dlock_lock_new", "empty name `\"\"`",
        dlock_lock_new(c, "", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL, dlock_errmsg(c));
    ROW(30, "dlock_lock_new", "`NULL` name", dlock_lock_new(c, NULL, 3, DLOCK_KIND_PLAIN, &l),
        DLOCK_EINVAL, dlock_errmsg(c));
    ROW(31, "dlock_lock_new", "name of `DLOCK_NAME_MAX + 1` bytes",
        dlock_lock_new(c, longname, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_ENAMETOOLONG,
        dlock_errmsg(c));
    ROW(32, "dlock_lock_new", "kind `99` (unknown)",
        dlock_lock_new(c, "bt", DLOCK_CSTR, (dlock_kind)99, &l), DLOCK_EINVAL, dlock_errmsg(c));
    dlock_semaphore *s = NULL;
    dlock_permits *p = NULL;
    dlock_latch *lt = NULL;
    dlock_idworker *w = NULL;
    ROW(33, "dlock_semaphore_new", "name of `DLOCK_NAME_MAX + 1` bytes",
        dlock_semaphore_new(c, longname, DLOCK_CSTR, &s), DLOCK_ENAMETOOLONG, dlock_errmsg(c));
    ROW(34, "dlock_permits_new", "empty name (length 0)", dlock_permits_new(c, "x", 0, &p),
        DLOCK_EINVAL, dlock_errmsg(c));
    ROW(35, "dlock_latch_new", "`NULL` name", dlock_latch_new(c, NULL, DLOCK_CSTR, &lt),
        DLOCK_EINVAL, dlock_errmsg(c));
    char tok[DLOCK_TOKEN_LEN + 1];
    ROW(36, "dlock_acquire_token", "name of `DLOCK_NAME_MAX + 1` bytes",
        dlock_acquire_token(c, longname, DLOCK_CSTR, DLOCK_NOWAIT, 1000, tok, NULL),
        DLOCK_ENAMETOOLONG, dlock_errmsg(c));
    ROW(37, "dlock_idworker_new", "empty prefix `\"\"`", dlock_idworker_new(c, "", NULL, &w),
        DLOCK_EINVAL, dlock_errmsg(c));

    /* ---- NULL handles, one per handle type ---- */
    int64_t v64 = 0;
    uint64_t u64 = 0;
    char pid[DLOCK_PERMIT_ID_LEN + 1];
    ROW(38, "dlock_ping", "`NULL` client", dlock_ping(NULL, &v64), DLOCK_EINVAL, NULL);
    ROW(39, "dlock_acquire", "`NULL` lock", dlock_acquire(NULL, DLOCK_NOWAIT, 1000, NULL),
        DLOCK_EINVAL, NULL);
    ROW(40, "dlock_semaphore_acquire", "`NULL` semaphore",
        dlock_semaphore_acquire(NULL, 1, DLOCK_NOWAIT), DLOCK_EINVAL, NULL);
    ROW(41, "dlock_permits_acquire", "`NULL` permits",
        dlock_permits_acquire(NULL, DLOCK_NOWAIT, 1000, pid), DLOCK_EINVAL, NULL);
    ROW(42, "dlock_latch_count_down", "`NULL` latch", dlock_latch_count_down(NULL, 1),
        DLOCK_EINVAL, NULL);
    ROW(43, "dlock_idworker_next", "`NULL` ID worker", dlock_idworker_next(NULL, &u64),
        DLOCK_EINVAL, NULL);

    /* ---- negative waits, leases, permits, counts ---- */
    l = th_lock(c, "bt:lock", DLOCK_KIND_PLAIN);
    ROW(44, "dlock_acquire", "`wait_ms = -5` (only -1 = forever is negative)",
        dlock_acquire(l, -5, 1000, NULL), DLOCK_EINVAL, dlock_lock_errmsg(l));
    ROW(45, "dlock_acquire", "`lease_ms = -1`", dlock_acquire(l, DLOCK_NOWAIT, -1, NULL),
        DLOCK_EINVAL, dlock_lock_errmsg(l));
    ROW(46, "dlock_release", "a handle that holds nothing", dlock_release(l), DLOCK_ENOTHELD,
        dlock_lock_errmsg(l));
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));
    ROW(47, "dlock_extend", "`lease_ms = 0` on a held lock", dlock_extend(l, 0), DLOCK_EINVAL,
        dlock_lock_errmsg(l));
    ROW(48, "dlock_acquire", "a plain handle that already holds",
        dlock_acquire(l, DLOCK_NOWAIT, 1000, NULL), DLOCK_EINVAL, dlock_lock_errmsg(l));
    {
        dlock_lock *two[2] = {l, l};
        ROW(49, "dlock_multi_acquire", "the same handle twice",
            dlock_multi_acquire(two, 2, DLOCK_NOWAIT, 1000, NULL), DLOCK_EINVAL, NULL);
    }
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_OK(dlock_semaphore_new(c, "bt:sem", DLOCK_CSTR, &s));
    ROW(50, "dlock_semaphore_acquire", "`permits = 0`", dlock_semaphore_acquire(s, 0, DLOCK_NOWAIT),
        DLOCK_EINVAL, dlock_semaphore_errmsg(s));
    ROW(51, "dlock_semaphore_release", "`permits = -2`", dlock_semaphore_release(s, -2),
        DLOCK_EINVAL, dlock_semaphore_errmsg(s));
    int set = 0;
    ROW(52, "dlock_semaphore_try_set", "`permits = -1`", dlock_semaphore_try_set(s, -1, &set),
        DLOCK_EINVAL, dlock_semaphore_errmsg(s));
    ASSERT_OK(dlock_permits_new(c, "bt:permits", DLOCK_CSTR, &p));
    ROW(53, "dlock_permits_acquire", "`lease_ms = -5`",
        dlock_permits_acquire(p, DLOCK_NOWAIT, -5, pid), DLOCK_EINVAL, dlock_permits_errmsg(p));
    ROW(54, "dlock_permits_try_set", "`permits = -1`", dlock_permits_try_set(p, -1, &set),
        DLOCK_EINVAL, dlock_permits_errmsg(p));
    ASSERT_OK(dlock_latch_new(c, "bt:latch", DLOCK_CSTR, &lt));
    ROW(55, "dlock_latch_set", "`count = -1`", dlock_latch_set(lt, -1), DLOCK_EINVAL,
        dlock_latch_errmsg(lt));
    ROW(56, "dlock_latch_count_down", "`k = 0`", dlock_latch_count_down(lt, 0), DLOCK_EINVAL,
        dlock_latch_errmsg(lt));
    ROW(57, "dlock_latch_try_set", "`count = 0`", dlock_latch_try_set(lt, 0, &set), DLOCK_EINVAL,
        dlock_latch_errmsg(lt));
    {
        dlock_idworker_options io = {0, -3};
        ROW(58, "dlock_idworker_new", "`batch = -3`", dlock_idworker_new(c, "bt", &io, &w),
            DLOCK_EINVAL, dlock_errmsg(c));
    }

    /* ---- tokens and permit ids ---- */
    ROW(59, "dlock_acquire_token", "`lease_ms = DLOCK_WATCHDOG` (token locks need a lease)",
        dlock_acquire_token(c, "bt:tok", DLOCK_CSTR, DLOCK_NOWAIT, DLOCK_WATCHDOG, tok, NULL),
        DLOCK_EINVAL, dlock_errmsg(c));
    ASSERT_COK(c, dlock_acquire_token(c, "bt:tok", DLOCK_CSTR, DLOCK_NOWAIT, 10000, tok, NULL));
    ROW(60, "dlock_release_token", "a well-formed token that is not the owner's",
        dlock_release_token(c, "bt:tok", DLOCK_CSTR, "0123456789abcdef0123456789abcdef"),
        DLOCK_ENOTOWNER, dlock_errmsg(c));
    ROW(61, "dlock_release_token", "empty token `\"\"`",
        dlock_release_token(c, "bt:tok", DLOCK_CSTR, ""), DLOCK_EINVAL, dlock_errmsg(c));
    memset(buf, 'a', 100);
    buf[100] = '\0';
    ROW(62, "dlock_extend_token", "a 100-character token",
        dlock_extend_token(c, "bt:tok", DLOCK_CSTR, buf, 1000), DLOCK_EINVAL, dlock_errmsg(c));
    ROW(63, "dlock_extend_token", "`lease_ms = 0`",
        dlock_extend_token(c, "bt:tok", DLOCK_CSTR, tok, 0), DLOCK_EINVAL, dlock_errmsg(c));
    ASSERT_COK(c, dlock_release_token(c, "bt:tok", DLOCK_CSTR, tok));
    ROW(64, "dlock_release_token", "the right token after its release (a replay)",
        dlock_release_token(c, "bt:tok", DLOCK_CSTR, tok), DLOCK_ENOTOWNER, dlock_errmsg(c));
    ROW(65, "dlock_permits_release", "a permit id never issued",
        dlock_permits_release(p, "0123456789abcdef0123456789abcdef"), DLOCK_ENOTOWNER,
        dlock_permits_errmsg(p));
    ROW(66, "dlock_permits_release", "a permit id of 3 characters",
        dlock_permits_release(p, "abc"), DLOCK_EINVAL, dlock_permits_errmsg(p));
    ROW(67, "dlock_permits_renew", "`NULL` permit id", dlock_permits_renew(p, NULL, 1000),
        DLOCK_EINVAL, dlock_permits_errmsg(p));

    /* nothing was left behind by the rows */
    redisContext *rc = th_redis(srv);
    long long keys = th_cmd_int(rc, "EXISTS bt:lock bt:tok bt:sem bt:permits bt:latch");
    ASSERT_EQ(keys, 0);
    redisFree(rc);

    dlock_latch_free(lt);
    dlock_permits_free(p);
    dlock_semaphore_free(s);
    dlock_lock_free(l);
    dlock_client_free(c);
    free(longname);
    close(g_dead_fd);
    th_server_stop(auth);
    th_server_stop(srv);
    th_log("%d rows ok", g_row);
    return 0;
}
