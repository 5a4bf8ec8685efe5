/* The "backends" scenario (backends.c): the floors, raw clients that make
 * the fewest requests of an uncontended pair (etcd's gateway, ZooKeeper's
 * C API), beside dlock's. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends.h"
#ifdef DLOCK_BENCH_HAVE_CURL
#include <curl/curl.h>
#endif
#ifdef DLOCK_BENCH_HAVE_ZK
#include <zookeeper/zookeeper.h>
#endif

/* ---- the etcd floor: the minimum requests of a pair, raw ---- */

#ifdef DLOCK_BENCH_HAVE_CURL
typedef struct floor_client {
    CURL *h;
    char base[320];        /* http://host:port */
    char *ans;
    size_t n;
    long long lease;
} floor_client;

static floor_client fl;
static const char floor_key[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Ivdy9r"; /* bench/backends/floor/w/k */
static const char floor_pfx[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Iv";     /* bench/backends/floor/ */
static const char floor_end[] = "YmVuY2gvYmFja2VuZHMvZmxvb3Iw";     /* bench/backends/floor0 */

static size_t floor_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    (void)ud;
    size_t len = size * nmemb;
    char *p = realloc(fl.ans, fl.n + len + 1);
    if (!p) return 0;
    memcpy(p + fl.n, ptr, len);
    fl.ans = p;
    fl.n += len;
    fl.ans[fl.n] = '\0';
    return len;
}

/* POSTs body to path; the answer in fl.ans, NULL on failure. */
static const char *floor_call(const char *path, const char *body) {
    char url[400];
    snprintf(url, sizeof url, "%s%s", fl.base, path);
    fl.n = 0;
    curl_easy_reset(fl.h);
    curl_easy_setopt(fl.h, CURLOPT_URL, url);
    curl_easy_setopt(fl.h, CURLOPT_WRITEFUNCTION, floor_data);
    curl_easy_setopt(fl.h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(fl.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(fl.h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(fl.h, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(fl.h);
    if (rc != CURLE_OK || !fl.ans) {
        fprintf(stderr, "dlock_bench: backends: etcd-floor: %s: %s\n", path,
                rc != CURLE_OK ? curl_easy_strerror(rc) : "no answer");
        return NULL;
    }
    return fl.ans;
}

/* A gateway int64 field ("name":"123") of an answer, 0 when missing. */
static long long floor_field(const char *s, const char *name) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = s ? strstr(s, pat) : NULL;
    if (!p) return 0;
    p += strlen(pat);
    if (*p == '"') p++;
    return strtoll(p, NULL, 10);
}

/* etcd://host:port[/] of url: the floor's client and its session lease. */
int bk_etcd_floor_open(const char *url) {
    const char *p = strstr(url, "://");
    if (!p || strchr(url, ',') || !strncmp(url, "etcds", 5)) return -1;
    snprintf(fl.base, sizeof fl.base, "http://%.*s", (int)strcspn(p + 3, "/?"), p + 3);
    if (!strchr(fl.base + 7, ':')) strncat(fl.base, ":2379", sizeof fl.base - strlen(fl.base) - 1);
    if (!(fl.h = curl_easy_init())) return -1;
    fl.lease = floor_field(floor_call("/v3/lease/grant", "{\"TTL\":\"60\"}"), "ID");
    return fl.lease ? 0 : -1;
}

void bk_etcd_floor_close(void) {
    if (!fl.h) return;
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", fl.lease);
    floor_call("/v3/lease/revoke", body);
    curl_easy_cleanup(fl.h);
    free(fl.ans);
    memset(&fl, 0, sizeof fl);
}

/* One pair: the create-if-absent txn reading the oldest key, the guarded delete. */
int bk_etcd_floor_pair(void) {
    char body[768];
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
             "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"eA==\",\"lease\":\"%lld\"}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\","
             "\"sort_target\":\"CREATE\",\"limit\":\"1\"}}]}",
             floor_key, floor_key, fl.lease, floor_pfx, floor_end);
    const char *r = floor_call("/v3/kv/txn", body);
    if (!r || !strstr(r, "\"succeeded\":true")) {
        if (r) fprintf(stderr, "dlock_bench: backends: etcd-floor: txn: %.200s\n", r);
        return -1;
    }
    long long rev = floor_field(r, "revision");
    snprintf(body, sizeof body,
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"%lld\"}],"
             "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
             floor_key, rev, floor_key);
    r = floor_call("/v3/kv/txn", body);
    if (!r || !strstr(r, "\"succeeded\":true")) {
        if (r) fprintf(stderr, "dlock_bench: backends: etcd-floor: delete: %.200s\n", r);
        return -1;
    }
    return 0;
}
#else
int bk_etcd_floor_pair(void) { return -1; }
#endif

/* ---- the ZooKeeper floor: the recipe's minimum requests of a pair, raw ---- */

#ifdef DLOCK_BENCH_HAVE_ZK
/* The floor's lock name: as long as BK_PAIR_LOCK, so that its parent's name
 * (the name in hex, as dlock's) is as long as dlock's. */
static const char zk_floor_name[] = "bench:backends:floor";
_Static_assert(sizeof zk_floor_name == sizeof BK_PAIR_LOCK, "the floor's name is dlock's length");

typedef struct zk_floor {
    zhandle_t *zh;
    char parent[600];      /* {chroot}/dlock/floor/{hex(zk_floor_name)} */
    char prefix[680];      /* parent/write-{32 hex digits}- */
} zk_floor;

static zk_floor zf;

static void zk_floor_nolog(const char *msg) { (void)msg; }

/* The session's watcher: the floor sets no watch; state changes are polled. */
static void zk_floor_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static int zk_floor_fail(const char *what, int rc) {
    fprintf(stderr, "dlock_bench: backends: zk-floor: %s: %s\n", what, zerror(rc));
    return -1;
}

/* zk://hosts[/chroot] of url: one session (requested with dlock's default
 * session timeout, DLOCK_DEFAULT_WATCHDOG_MS, as dlock's client asks), then
 * the parent and its ancestors, made once here as persistent nodes: the
 * pairs never pay for them. The layout mirrors dlock's
 * {chroot}/dlock/locks/{hex(name)}/write-{guid}-{seq} ("floor" is as long
 * as "locks"; a fixed guid of dlock's 32 hex digits), so every request
 * carries paths of dlock's lengths and the server's tree has its depth.
 * 0, or -1 with the reason printed. */
int bk_zk_floor_open(const char *url) {
    const char *p = strstr(url, "://");
    size_t hl = p ? strcspn(p + 3, "/?") : 0, cl = p ? strcspn(p + 3 + hl, "?") : 0;
    char hosts[512], chroot[256];
    if (!hl || hl >= sizeof hosts || cl >= sizeof chroot) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: not a zk://hosts[/chroot] URL: %s\n",
                url);
        return -1;
    }
    p += 3;
    snprintf(hosts, sizeof hosts, "%.*s", (int)hl, p);
    snprintf(chroot, sizeof chroot, "%.*s", (int)cl, p + hl);
    while (cl > 0 && chroot[cl - 1] == '/') chroot[--cl] = '\0';
    char hex[2 * sizeof zk_floor_name];
    for (size_t i = 0; i + 1 < sizeof zk_floor_name; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)zk_floor_name[i]);
    snprintf(zf.parent, sizeof zf.parent, "%s/dlock/floor/%s", chroot, hex);
    snprintf(zf.prefix, sizeof zf.prefix, "%s/write-%s-", zf.parent,
             "0123456789abcdef0123456789abcdef");
    zf.zh = zookeeper_init2(hosts, zk_floor_watcher, DLOCK_DEFAULT_WATCHDOG_MS, NULL, NULL, 0,
                            zk_floor_nolog);
    if (!zf.zh) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: zookeeper_init: %s\n", strerror(errno));
        return -1;
    }
#ifdef DLOCK_HAVE_ZOO_RESOLUTION_DELAY
    /* as dlock's sessions (ZK_RESOLVE_DELAY_MS): the host list is not
     * resolved again before every poll of the socket, the C client's default */
    zoo_set_servers_resolution_delay(zf.zh, 1000);
#endif
    int64_t give_up = bench_now_ns() + 10000000000LL;
    while (zoo_state(zf.zh) != ZOO_CONNECTED_STATE && bench_now_ns() < give_up)
        bench_sleep_us(1000);
    if (zoo_state(zf.zh) != ZOO_CONNECTED_STATE) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: no session within 10 s\n");
        return -1;
    }
    /* every ancestor from the top, then the parent */
    char path[sizeof zf.parent];
    for (char *q = zf.parent + 1;; q++) {
        if (*q && *q != '/') continue;
        snprintf(path, sizeof path, "%.*s", (int)(q - zf.parent), zf.parent);
        int rc = zoo_create(zf.zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
        if (rc != ZOK && rc != ZNODEEXISTS) return zk_floor_fail(path, rc);
        if (!*q) break;
    }
    return 0;
}

void bk_zk_floor_close(void) {
    if (!zf.zh) return;
    zoo_delete(zf.zh, zf.parent, -1);
    zookeeper_close(zf.zh);
    memset(&zf, 0, sizeof zf);
}

/* One pair, the recipe's minimum: create our ephemeral sequential node, list
 * the parent's children to see it is the lowest (the lock is ours), delete it. */
int bk_zk_floor_pair(void) {
    char node[sizeof zf.prefix + 16];
    int rc = zoo_create(zf.zh, zf.prefix, NULL, -1, &ZOO_OPEN_ACL_UNSAFE,
                        ZOO_EPHEMERAL | ZOO_SEQUENCE, node, (int)sizeof node);
    if (rc != ZOK) return zk_floor_fail("create", rc);
    struct String_vector kids = {0, NULL};
    rc = zoo_get_children(zf.zh, zf.parent, 0, &kids);
    if (rc != ZOK) return zk_floor_fail("get-children", rc);
    const char *ours = strrchr(node, '/') + 1;
    size_t pl = strlen(ours) - 10; /* the sequence: 10 digits */
    int first = 0;
    for (int i = 0; i < kids.count; i++) {
        const char *k = kids.data[i];
        size_t kl = strlen(k);
        if (kl >= 10 && strcmp(k + kl - 10, ours + pl) < 0) first = -1;
        else if (!first && !strcmp(k, ours)) first = 1;
    }
    deallocate_String_vector(&kids);
    if (first != 1) {
        fprintf(stderr, "dlock_bench: backends: zk-floor: %s is not the first child\n", ours);
        zoo_delete(zf.zh, node, -1);
        return -1;
    }
    rc = zoo_delete(zf.zh, node, -1);
    return rc == ZOK ? 0 : zk_floor_fail("delete", rc);
}
#else
int bk_zk_floor_pair(void) { return -1; }
#endif
