/* Shared helpers of the benchmarks: clock, pipes, samples, metrics, JSON, hiredis. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

int64_t bench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void bench_sleep_us(int64_t us) {
    if (us <= 0) return;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ---- pipes between the benchmark's processes ---- */

int bench_read_full(int fd, void *buf, size_t len, int timeout_ms) {
    char *p = buf;
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int n = poll(&pfd, 1, timeout_ms);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int bench_write_full(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int bench_in_list(const char *list, const char *name) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && !strncmp(p, name, n)) return 1;
        p += l;
        if (*p == ',') p++;
    }
    return 0;
}

int bench_series_on(const bench_ctx *ctx, const char *name) {
    return bench_in_list(ctx->series, name);
}

/* ---- samples ---- */

int bench_samples_add(bench_samples *s, int64_t v) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        int64_t *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv) return -1;
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return 0;
}

int bench_samples_append(bench_samples *dst, const bench_samples *src) {
    for (size_t i = 0; i < src->n; i++)
        if (bench_samples_add(dst, src->v[i])) return -1;
    return 0;
}

void bench_samples_free(bench_samples *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int64_t bench_samples_quantile(bench_samples *s, double q) {
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_i64);
    /* nearest rank: the smallest value with at least q of the samples <= it */
    size_t rank = (size_t)(q * (double)s->n + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > s->n) rank = s->n;
    return s->v[rank - 1];
}

int64_t bench_samples_max(const bench_samples *s) {
    int64_t m = 0;
    for (size_t i = 0; i < s->n; i++)
        if (i == 0 || s->v[i] > m) m = s->v[i];
    return m;
}

int bench_order(int round, int k, int n) {
    if (n <= 1) return 0;
    if (n % 2 && (round / n) % 2) k = n - 1 - k; /* odd n: every other square reversed */
    int first = k % 2 ? (k + 1) / 2 : (n - k / 2) % n; /* 0, 1, n-1, 2, n-2, ... */
    return (first + round) % n;
}

double bench_median_d(const double *v, size_t n) {
    if (!n) return 0;
    double *c = malloc(n * sizeof *c);
    if (!c) return v[0];
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_d);
    double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

/* ---- metrics ---- */

typedef struct metric {
    char scenario[32], series[32], name[32], unit[16];
    double value;
} metric;

static metric *metrics;
static size_t nmetrics, capmetrics;

void bench_metric(const char *scenario, const char *series, const char *name, double value,
                  const char *unit) {
    for (size_t i = 0; i < nmetrics; i++) {
        metric *m = &metrics[i];
        if (!strcmp(m->scenario, scenario) && !strcmp(m->series, series) &&
            !strcmp(m->name, name)) {
            m->value = value;
            return;
        }
    }
    if (nmetrics == capmetrics) {
        size_t cap = capmetrics ? capmetrics * 2 : 64;
        metric *nm = realloc(metrics, cap * sizeof *nm);
        if (!nm) return; /* a lost figure, not a crash */
        metrics = nm;
        capmetrics = cap;
    }
    metric *m = &metrics[nmetrics++];
    snprintf(m->scenario, sizeof m->scenario, "%s", scenario);
    snprintf(m->series, sizeof m->series, "%s", series);
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->unit, sizeof m->unit, "%s", unit);
    m->value = value;
}

int bench_metric_get(const char *scenario, const char *series, const char *name, double *value) {
    for (size_t i = 0; i < nmetrics; i++) {
        const metric *m = &metrics[i];
        if (!strcmp(m->scenario, scenario) && !strcmp(m->series, series) &&
            !strcmp(m->name, name)) {
            *value = m->value;
            return 0;
        }
    }
    return -1;
}

void bench_metrics_free(void) {
    free(metrics);
    metrics = NULL;
    nmetrics = capmetrics = 0;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

int bench_write_json(const char *path, const bench_ctx *ctx, const char *machine) {
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "dlock_bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"mode\": \"%s\",\n  \"machine\": ", ctx->quick ? "quick" : "full");
    json_str(f, machine);
    fprintf(f, ",\n  \"metrics\": [");
    for (size_t i = 0; i < nmetrics; i++) {
        const metric *m = &metrics[i];
        fprintf(f, "%s\n    {\"scenario\": ", i ? "," : "");
        json_str(f, m->scenario);
        fprintf(f, ", \"series\": ");
        json_str(f, m->series);
        fprintf(f, ", \"name\": ");
        json_str(f, m->name);
        fprintf(f, ", \"value\": %.6g, \"unit\": ", m->value);
        json_str(f, m->unit);
        fputc('}', f);
    }
    fprintf(f, "\n  ]\n}\n");
    if (f != stdout) return fclose(f) ? -1 : 0;
    fflush(f);
    return 0;
}

/* ---- hiredis ---- */

redisContext *bench_redis_connect(const bench_ctx *ctx) {
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout(ctx->host, ctx->port, tv);
    if (!rc || rc->err) {
        fprintf(stderr, "dlock_bench: connect %s:%d: %s\n", ctx->host, ctx->port,
                rc ? rc->errstr : "out of memory");
        if (rc) redisFree(rc);
        return NULL;
    }
    struct timeval cmd_tv = {10, 0}; /* a hung server fails the run, not hangs it */
    redisSetTimeout(rc, cmd_tv);
    return rc;
}

redisReply *bench_redis_cmd(redisContext *rc, int argc, const char **argv) {
    redisReply *r = redisCommandArgv(rc, argc, argv, NULL);
    if (!r) {
        fprintf(stderr, "dlock_bench: %s: %s\n", argv[0], rc->errstr);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "dlock_bench: %s: server error: %s\n", argv[0], r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

void bench_fast_hex(char *out, size_t nbytes) {
    static uint64_t state;
    if (!state) state = (uint64_t)bench_now_ns() | 1;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < nbytes; i++) {
        /* xorshift64* */
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        unsigned b = (unsigned)((state * 0x2545F4914F6CDD1DULL) >> 56);
        out[2 * i] = hex[b >> 4];
        out[2 * i + 1] = hex[b & 15];
    }
    out[2 * nbytes] = '\0';
}

void bench_fmt_num(char *buf, size_t len, double v) {
    if (v >= 1000) {
        long long n = (long long)(v + 0.5);
        char tmp[32];
        int l = snprintf(tmp, sizeof tmp, "%lld", n);
        char out[48];
        int o = 0;
        for (int i = 0; i < l; i++) {
            if (i && (l - i) % 3 == 0) out[o++] = ',';
            out[o++] = tmp[i];
        }
        out[o] = '\0';
        snprintf(buf, len, "%s", out);
    } else if (v >= 100) {
        snprintf(buf, len, "%.0f", v);
    } else {
        snprintf(buf, len, "%.1f", v);
    }
}

static long long bench_numsub(redisContext *rc, const char *channel) {
    redisReply *r = redisCommand(rc, "PUBSUB NUMSUB %s", channel);
    if (!r) return -1;
    long long n = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        n = r->element[1]->integer;
    freeReplyObject(r);
    return n;
}

long long bench_lock_waiters(redisContext *rc, const char *name) {
    char ch[512];
    snprintf(ch, sizeof ch, "redisson_lock__channel:{%s}", name);
    long long n = bench_numsub(rc, ch);
    for (int k = 0; n >= 0 && k < 2; k++) {
        redisReply *r = k ? redisCommand(rc, "LRANGE redisson_lock_queue:{%s} 0 -1", name)
                          : redisCommand(rc, "ZRANGE dlock_waiters:{%s} 0 -1", name);
        if (!r) return -1;
        for (size_t i = 0; n >= 0 && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            if (r->element[i]->type != REDIS_REPLY_STRING) continue;
            snprintf(ch, sizeof ch, "redisson_lock__channel:{%s}:%s", name, r->element[i]->str);
            long long m = bench_numsub(rc, ch);
            n = m < 0 ? -1 : n + (m > 0);
        }
        freeReplyObject(r);
    }
    return n;
}

int bench_counter_step(redisContext *rc, const char *counter) {
    long long v = 0;
    redisReply *r = redisCommand(rc, "GET %s", counter);
    int ok = r && (r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING);
    if (ok && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    if (r) freeReplyObject(r);
    if (ok) {
        r = redisCommand(rc, "SET %s %lld", counter, v + 1);
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
    }
    return ok ? 0 : -1;
}

long long bench_get_int(redisContext *rc, const char *key) {
    redisReply *r = redisCommand(rc, "GET %s", key);
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) v = atoll(r->str);
    else if (r && r->type == REDIS_REPLY_NIL) v = 0;
    if (r) freeReplyObject(r);
    return v;
}

int bench_fork_piped(pid_t *pid, int fds[2]) {
    int a2b[2], b2a[2];
    if (pipe(a2b)) return -1;
    if (pipe(b2a)) {
        close(a2b[0]), close(a2b[1]);
        return -1;
    }
    fflush(NULL);
    *pid = fork();
    if (*pid < 0) {
        perror("dlock_bench: fork");
        close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
        return -1;
    }
    if (*pid == 0) {
        close(a2b[1]);
        close(b2a[0]);
        fds[0] = a2b[0], fds[1] = b2a[1];
    } else {
        close(a2b[0]);
        close(b2a[1]);
        fds[0] = a2b[1], fds[1] = b2a[0];
    }
    return 0;
}
