/* ZooKeeper: the client's CPU per uncontended acquire + release, dlock
 * beside the recipe's raw floor (issue 22).
 *
 *   zk_cpu zk://HOST:PORT[/chroot] SERIES [pairs]
 *
 * SERIES is one of
 *   dlock          dlock_acquire(DLOCK_NOWAIT) + dlock_release on one handle
 *   floor          the C client's synchronous API: create (ephemeral
 *                  sequential), get-children, delete, as bench/backends_floor.c's
 *                  zk-floor (its parent made once, persistent), with the
 *                  client's default host resolution (before every poll)
 *   floor-resolve  the same, the host list resolved at most once a second
 *                  (as dlock's sessions and the zk-floor series)
 * after 50 pairs of warm-up, `pairs` pairs (default 3000); prints the
 * process's CPU (user + system, every thread) and the wall time per pair.
 * One series per process, so that a counter of the whole process (system
 * calls, context switches) is the series' own: e.g.
 *   perf stat -e syscalls:sys_enter_futex,context-switches zk_cpu URL dlock
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <zookeeper/zookeeper.h>

#include "dlock.h"

#define WARMUP 50

static int64_t cpu_us(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (int64_t)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000 + r.ru_utime.tv_usec +
           r.ru_stime.tv_usec;
}

static int64_t wall_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void nolog(const char *msg) { (void)msg; }

static void watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx) {
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static int dlock_series(const char *url, int pairs, int64_t *cpu, int64_t *wall) {
    dlock_options o;
    dlock_options_init(&o);
    o.url = url;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int rc = dlock_client_new(&o, &c);
    if (!rc) rc = dlock_lock_new(c, "bench:backends:pairs", DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    for (int i = -WARMUP; !rc && i < pairs; i++) {
        if (i == 0) {
            *cpu = cpu_us();
            *wall = wall_us();
        }
        rc = dlock_acquire(l, DLOCK_NOWAIT, DLOCK_WATCHDOG, NULL);
        if (!rc) rc = dlock_release(l);
    }
    *cpu = cpu_us() - *cpu;
    *wall = wall_us() - *wall;
    if (rc)
        fprintf(stderr, "zk_cpu: dlock: %s: %s\n", dlock_strerror(rc),
                l ? dlock_lock_errmsg(l) : c ? dlock_errmsg(c) : "out of memory");
    dlock_lock_free(l);
    dlock_client_free(c);
    return rc ? -1 : 0;
}

static int floor_series(const char *url, int resolve_ms, int pairs, int64_t *cpu,
                        int64_t *wall) {
    const char *p = strstr(url, "://");
    size_t hl = p ? strcspn(p + 3, "/") : 0;
    char hosts[256], parent[512], prefix[600], path[512];
    if (!hl || hl >= sizeof hosts) {
        fprintf(stderr, "zk_cpu: not a zk://hosts[/chroot] URL: %s\n", url);
        return -1;
    }
    snprintf(hosts, sizeof hosts, "%.*s", (int)hl, p + 3);
    /* bench/backends_floor.c's layout: hex("bench:backends:floor") */
    snprintf(parent, sizeof parent, "%s/dlock/floor/62656e63683a6261636b656e64733a666c6f6f72",
             p + 3 + hl);
    snprintf(prefix, sizeof prefix, "%s/write-0123456789abcdef0123456789abcdef-", parent);
    zhandle_t *zh = zookeeper_init2(hosts, watcher, DLOCK_DEFAULT_WATCHDOG_MS, NULL, NULL, 0, nolog);
    if (!zh) {
        fprintf(stderr, "zk_cpu: zookeeper_init: %s\n", strerror(errno));
        return -1;
    }
    if (resolve_ms) zoo_set_servers_resolution_delay(zh, resolve_ms);
    int64_t give_up = wall_us() + 10000000;
    while (zoo_state(zh) != ZOO_CONNECTED_STATE && wall_us() < give_up) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    int rc = zoo_state(zh) == ZOO_CONNECTED_STATE ? ZOK : ZCONNECTIONLOSS;
    for (char *q = parent + 1; rc == ZOK; q++) {
        if (*q && *q != '/') continue;
        snprintf(path, sizeof path, "%.*s", (int)(q - parent), parent);
        rc = zoo_create(zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
        if (rc == ZNODEEXISTS) rc = ZOK;
        if (!*q) break;
    }
    for (int i = -WARMUP; rc == ZOK && i < pairs; i++) {
        if (i == 0) {
            *cpu = cpu_us();
            *wall = wall_us();
        }
        char node[sizeof prefix + 16];
        rc = zoo_create(zh, prefix, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL | ZOO_SEQUENCE,
                        node, (int)sizeof node);
        struct String_vector kids = {0, NULL};
        if (rc == ZOK) rc = zoo_get_children(zh, parent, 0, &kids);
        deallocate_String_vector(&kids);
        if (rc == ZOK) rc = zoo_delete(zh, node, -1);
    }
    *cpu = cpu_us() - *cpu;
    *wall = wall_us() - *wall;
    if (rc != ZOK) fprintf(stderr, "zk_cpu: floor: %s\n", zerror(rc));
    zookeeper_close(zh);
    return rc == ZOK ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: zk_cpu zk://HOST:PORT[/chroot] dlock|floor|floor-resolve "
                        "[pairs]\n");
        return 2;
    }
    int pairs = argc > 3 ? atoi(argv[3]) : 3000;
    if (pairs <= 0) pairs = 3000;
    int64_t cpu = 0, wall = 0;
    int rc;
    if (!strcmp(argv[2], "dlock")) rc = dlock_series(argv[1], pairs, &cpu, &wall);
    else if (!strcmp(argv[2], "floor")) rc = floor_series(argv[1], 0, pairs, &cpu, &wall);
    else if (!strcmp(argv[2], "floor-resolve")) rc = floor_series(argv[1], 1000, pairs, &cpu, &wall);
    else {
        fprintf(stderr, "zk_cpu: unknown series %s\n", argv[2]);
        return 2;
    }
    if (rc) return 1;
    printf("%-13s %d pairs: CPU %.1f us per pair, wall %.1f us per pair\n", argv[2], pairs,
           (double)cpu / pairs, (double)wall / pairs);
    return 0;
}
