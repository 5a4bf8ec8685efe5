/* `dlock doctor`: is this server safe for locks? One PASS / WARN / FAIL line
 * per finding, each with its reason. */
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"

const char help_doctor[] =
    "Usage: dlock doctor [--ttl DUR] [--json]\n"
    "\n"
    "Checks that the server is safe for locks and explains each finding with\n"
    "PASS, WARN or FAIL:\n"
    "  version      the server's version; EVAL (scripts) are needed\n"
    "  scripts      acquires and releases the test lock 'dlock:doctor'\n"
    "  eviction     maxmemory-policy: noeviction PASS; volatile-* WARN (leases\n"
    "               carry a TTL, so they can be evicted); allkeys-* FAIL, but\n"
    "               WARN with maxmemory 0 (no limit: nothing is evicted yet)\n"
    "  persistence  AOF with appendfsync always PASS; anything else WARN (a\n"
    "               restart forgets locks held or written in the last second)\n"
    "  replication  a master without replicas PASS; replicas WARN (asynchronous\n"
    "               failover can lose a held lock); a replica FAIL\n"
    "  latency      round trip (worst of 5 PINGs) against the lease: below 1/100\n"
    "               PASS, below 1/3 (the renewal period) WARN, else FAIL\n"
    "Against another backend (zk://, etcd://, postgres://, mysql://) it checks:\n"
    "  version      the server's version\n"
    "  session      what keeps a lock held there (a connection, a session, a lease)\n"
    "  lock         acquires and releases the test lock 'dlock:doctor'\n"
    "  timeouts     server settings that end idle sessions, and their locks\n"
    "  latency      as above\n"
    "Exits 0 when nothing FAILs, 78 otherwise.\n"
    "\n"
    "Options:\n"
    "  --ttl DUR            the lease to compare the latency with (default 30s)\n";

enum { OPT_TTL = OPT_FIRST_LOCAL_ };
enum { PASS, WARN, FAIL };

typedef struct doctor {
    const cli_global *g;
    int counts[3];
    int n;
} doctor;

__attribute__((format(printf, 4, 5))) static void finding(doctor *d, int result,
                                                          const char *check,
                                                          const char *fmt, ...)
{
    static const char *const names[] = {"PASS", "WARN", "FAIL"};
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    d->counts[result]++;
    if (d->g->json) {
        fputs(d->n ? ",\n  {\"check\":" : "\n  {\"check\":", stdout);
        cli_json_str(stdout, check, strlen(check));
        printf(",\"result\":\"%s\",\"detail\":", names[result]);
        cli_json_str(stdout, msg, strlen(msg));
        fputc('}', stdout);
    } else {
        printf("%s  %-12s %s\n", names[result], check, msg);
    }
    d->n++;
}

/* Reads one fact; on failure records a WARN and returns -1. */
static int fact(doctor *d, dlock_client *c, const char *check, const char *what, char *buf,
                size_t len)
{
    int rc = dlock_server_fact(c, what, buf, len);
    if (rc == DLOCK_OK)
        return 0;
    finding(d, WARN, check, "cannot read %s (%s): %s", what, dlock_strerror(rc),
            dlock_errmsg(c)[0] ? dlock_errmsg(c) : "the server refused");
    return -1;
}

static void check_version(doctor *d, dlock_client *c)
{
    char v[64];
    int major = 0, minor = 0;
    if (fact(d, c, "version", "info:server:redis_version", v, sizeof v))
        return;
    if (sscanf(v, "%d.%d", &major, &minor) != 2)
        finding(d, WARN, "version", "cannot parse redis_version '%s'", v);
    else if (major < 2 || (major == 2 && minor < 6))
        finding(d, FAIL, "version", "Redis %s has no scripts (EVAL needs 2.6 or later)", v);
    else if (major < 6)
        finding(d, WARN, "version", "Redis %s is old; dlock is tested with 6.0 and later", v);
    else
        finding(d, PASS, "version", "Redis %s", v);
}

static void check_scripts(doctor *d, dlock_client *c)
{
    static const char name[] = "dlock:doctor";
    char token[DLOCK_TOKEN_LEN + 1];
    uint64_t fence = 0;
    int rc = dlock_acquire_token(c, name, DLOCK_CSTR, 2000, 10000, token, &fence);
    if (rc == DLOCK_EBUSY || rc == DLOCK_ETIMEDOUT) {
        finding(d, WARN, "scripts", "the test lock '%s' stayed busy (another doctor?)", name);
        return;
    }
    if (rc != DLOCK_OK) {
        finding(d, FAIL, "scripts", "cannot acquire the test lock '%s': %s", name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
        return;
    }
    rc = dlock_release_token(c, name, DLOCK_CSTR, token);
    if (rc != DLOCK_OK)
        finding(d, FAIL, "scripts", "cannot release the test lock '%s': %s", name,
                dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
    else
        finding(d, PASS, "scripts", "acquired and released the test lock '%s' (fence %" PRIu64
                ")", name, fence);
}

static void check_eviction(doctor *d, dlock_client *c)
{
    char policy[64], maxmem[64];
    if (fact(d, c, "eviction", "maxmemory-policy", policy, sizeof policy))
        return;
    if (dlock_server_fact(c, "maxmemory", maxmem, sizeof maxmem) != DLOCK_OK)
        snprintf(maxmem, sizeof maxmem, "?");
    if (strcmp(policy, "noeviction") == 0)
        finding(d, PASS, "eviction", "maxmemory-policy noeviction: held locks are never evicted");
    else if (strcmp(maxmem, "0") == 0 &&
             (strncmp(policy, "volatile-", 9) == 0 || strncmp(policy, "allkeys-", 8) == 0))
        /* no memory limit: the policy evicts nothing until one is set */
        finding(d, WARN, "eviction", "maxmemory-policy %s with maxmemory 0: nothing is "
                "evicted now, but held locks will be once a maxmemory is set; use noeviction",
                policy);
    else if (strncmp(policy, "volatile-", 9) == 0)
        finding(d, WARN, "eviction", "maxmemory-policy %s (maxmemory %s): locks have a TTL, "
                "so they can be evicted while held; use noeviction", policy, maxmem);
    else if (strncmp(policy, "allkeys-", 8) == 0)
        finding(d, FAIL, "eviction", "maxmemory-policy %s (maxmemory %s): a held lock can be "
                "evicted silently; use noeviction", policy, maxmem);
    else
        finding(d, WARN, "eviction", "unknown maxmemory-policy '%s'", policy);
}

static void check_persistence(doctor *d, dlock_client *c)
{
    char aof[32], fsync[32];
    if (fact(d, c, "persistence", "appendonly", aof, sizeof aof))
        return;
    if (strcmp(aof, "yes") != 0) {
        finding(d, WARN, "persistence", "appendonly %s: a restart forgets every held lock "
                "(fencing tokens still grow: a lost counter starts again at the server's "
                "clock); set appendonly yes, appendfsync always", aof);
        return;
    }
    if (fact(d, c, "persistence", "appendfsync", fsync, sizeof fsync))
        return;
    if (strcmp(fsync, "always") == 0)
        finding(d, PASS, "persistence", "appendonly yes, appendfsync always");
    else
        finding(d, WARN, "persistence", "appendfsync %s: a crash can forget locks taken in "
                "the last second; set appendfsync always", fsync);
}

static void check_replication(doctor *d, dlock_client *c)
{
    char role[32], replicas[32];
    if (fact(d, c, "replication", "info:replication:role", role, sizeof role))
        return;
    if (strcmp(role, "master") != 0) {
        finding(d, FAIL, "replication", "role %s: this server is a replica; point dlock at "
                "the master", role);
        return;
    }
    if (fact(d, c, "replication", "info:replication:connected_slaves", replicas,
             sizeof replicas))
        return;
    if (strtol(replicas, NULL, 10) > 0)
        finding(d, WARN, "replication", "master with %s replica(s): replication is "
                "asynchronous, so a failover can lose a held lock", replicas);
    else
        finding(d, PASS, "replication", "master without replicas");
}

static void check_latency(doctor *d, dlock_client *c, int64_t lease_ms)
{
    int64_t worst = 0, rtt = 0;
    int i, rc;
    for (i = 0; i < 5; i++) {
        rc = dlock_ping(c, &rtt);
        if (rc != DLOCK_OK) {
            finding(d, FAIL, "latency", "PING failed: %s",
                    dlock_errmsg(c)[0] ? dlock_errmsg(c) : dlock_strerror(rc));
            return;
        }
        if (rtt > worst)
            worst = rtt;
    }
    if (worst * 3 >= lease_ms * 1000)
        finding(d, FAIL, "latency", "round trip %.3f ms is over a third of the %lld ms lease: "
                "renewals cannot keep up", worst / 1000.0, (long long)lease_ms);
    else if (worst * 100 >= lease_ms * 1000)
        finding(d, WARN, "latency", "round trip %.3f ms is over 1/100 of the %lld ms lease",
                worst / 1000.0, (long long)lease_ms);
    else
        finding(d, PASS, "latency", "round trip %.3f ms (worst of 5) against a %lld ms lease",
                worst / 1000.0, (long long)lease_ms);
}

/* ---- other backends than Redis ---- */

static void check_backend_version(doctor *d, dlock_client *c, const char *backend)
{
    char v[128];
    if (fact(d, c, "version", "version", v, sizeof v))
        return;
    finding(d, PASS, "version", "%s %s", backend, v);
}

static void check_session(doctor *d, dlock_client *c)
{
    char v[256];
    if (fact(d, c, "session", "session", v, sizeof v))
        return;
    finding(d, PASS, "session", "a lock is held by %s", v);
}

static void check_lock(doctor *d, dlock_client *c)
{
    static const char name[] = "dlock:doctor";
    dlock_lock *l = NULL;
    uint64_t fence = 0;
    int rc = dlock_lock_new(c, name, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l);
    if (rc == DLOCK_OK)
        rc = dlock_acquire(l, 2000, DLOCK_WATCHDOG, &fence);
    if (rc == DLOCK_EBUSY || rc == DLOCK_ETIMEDOUT) {
        finding(d, WARN, "lock", "the test lock '%s' stayed busy (another doctor?)", name);
    } else if (rc != DLOCK_OK) {
        finding(d, FAIL, "lock", "cannot acquire the test lock '%s': %s", name,
                l && dlock_lock_errmsg(l)[0] ? dlock_lock_errmsg(l) : dlock_strerror(rc));
    } else if ((rc = dlock_release(l)) != DLOCK_OK) {
        finding(d, FAIL, "lock", "cannot release the test lock '%s': %s", name,
                dlock_lock_errmsg(l)[0] ? dlock_lock_errmsg(l) : dlock_strerror(rc));
    } else {
        finding(d, PASS, "lock", "acquired and released the test lock '%s' (fence %" PRIu64 ")",
                name, fence);
    }
    dlock_lock_free(l);
}

/* Settings after which the server ends an idle session: a session-held lock
 * goes with it. Each is asked only of the backend that has it. */
static void check_idle_timeouts(doctor *d, dlock_client *c, const char *backend)
{
    char v[64];
    const char *what = !strcmp(backend, "postgres") ? "idle_session_timeout"
                       : !strcmp(backend, "mysql")  ? "wait_timeout"
                                                    : NULL;
    if (!what)
        return;
    char mode[32];
    if (!strcmp(backend, "mysql") &&
        dlock_server_fact(c, "mode", mode, sizeof mode) == DLOCK_OK && !strcmp(mode, "table")) {
        finding(d, PASS, "timeouts", "table mode: a lock is a lease in a row, not tied to an "
                "idle connection");
        return;
    }
    if (fact(d, c, "timeouts", what, v, sizeof v))
        return;
    long long n = strtoll(v, NULL, 10);
    if (n == 0 && strcmp(backend, "postgres") == 0)
        finding(d, PASS, "timeouts", "%s %s: idle sessions are kept", what, v);
    else
        finding(d, WARN, "timeouts", "%s %s: the server ends a session idle that long, and "
                "the locks it holds with it; keep held locks busy or raise it", what, v);
}

int cmd_doctor(int argc, char **argv, cli_global *g)
{
    static const char *const cmd = "doctor";
    static const struct option longopts[] = {
        CLI_GLOBAL_LONGOPTS, {"ttl", required_argument, NULL, OPT_TTL}, {NULL, 0, NULL, 0}};
    int64_t lease_ms = DLOCK_DEFAULT_WATCHDOG_MS;
    dlock_client *c = NULL;
    doctor d;
    int opt, rc, code = 0;

    optind = 0;
    while ((opt = getopt_long(argc, argv, ":" CLI_GLOBAL_SHORTOPTS, longopts, NULL)) != -1) {
        if (opt == OPT_TTL) {
            if ((rc = cli_duration(cmd, "--ttl", optarg, 1, &lease_ms)))
                return rc;
            continue;
        }
        if (!cli_default_opt(g, cmd, opt, argv, &code))
            return code;
    }
    if (optind < argc)
        return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    if ((code = cli_connect(g, cmd, 0, &c)))
        return code;
    /* the test locks are taken as `run` and `acquire` take theirs */
    if ((code = cli_set_identity(g, cmd, c, NULL))) {
        dlock_client_free(c);
        return code;
    }

    memset(&d, 0, sizeof d);
    d.g = g;
    if (g->json)
        fputs("{\"checks\":[", stdout);
    char backend[32] = "redis";
    dlock_server_fact(c, "backend", backend, sizeof backend);
    if (strcmp(backend, "redis") != 0) {
        check_backend_version(&d, c, backend);
        check_session(&d, c);
        check_lock(&d, c);
        check_idle_timeouts(&d, c, backend);
    } else {
        check_version(&d, c);
        check_scripts(&d, c);
        check_eviction(&d, c);
        check_persistence(&d, c);
        check_replication(&d, c);
    }
    check_latency(&d, c, lease_ms);
    if (g->json)
        printf("\n],\"pass\":%d,\"warn\":%d,\"fail\":%d}\n", d.counts[PASS], d.counts[WARN],
               d.counts[FAIL]);
    else if (!g->quiet)
        printf("%d PASS, %d WARN, %d FAIL\n", d.counts[PASS], d.counts[WARN], d.counts[FAIL]);
    dlock_client_free(c);
    return d.counts[FAIL] ? EXIT_CONFIG : 0;
}
