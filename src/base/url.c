/* Connection URLs:
 *   redis://[user[:password]@]host[:port][/db]
 *   unix:///path/to/redis.sock[?db=N]
 *   redlock://NODE,NODE,...        NODE = [user[:password]@]host[:port][/db]
 *   redis-sentinel://[password@]host:port,host:port/MASTER_NAME[/db]
 *   redis-cluster://host:port,host:port
 * Messages never repeat the password. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

void dl_endpoint_clear(dl_endpoint *ep) {
    free(ep->host);
    free(ep->path);
    free(ep->user);
    free(ep->sni);
    if (ep->tls_ctx) ep->tls_ctx_ops->down(ep->tls_ctx);
    if (ep->password) {
        /* do not leave the secret in freed memory */
        volatile char *v = ep->password;
        while (*v) *v++ = 0;
        free(ep->password);
    }
    memset(ep, 0, sizeof *ep);
}

int dl_endpoint_copy(dl_endpoint *dst, const dl_endpoint *src) {
    memset(dst, 0, sizeof *dst);
    dst->port = src->port;
    dst->db = src->db;
    dst->tls = src->tls;
    if (src->tls_ctx) {
        src->tls_ctx_ops->up(src->tls_ctx);
        dst->tls_ctx = src->tls_ctx;
        dst->tls_ctx_ops = src->tls_ctx_ops;
    }
    if (src->sni && !(dst->sni = strdup(src->sni))) {
        dl_endpoint_clear(dst);
        return DLOCK_ENOMEM;
    }
    if ((src->host && !(dst->host = strdup(src->host))) ||
        (src->path && !(dst->path = strdup(src->path))) ||
        (src->user && !(dst->user = strdup(src->user))) ||
        (src->password && !(dst->password = strdup(src->password)))) {
        dl_endpoint_clear(dst);
        return DLOCK_ENOMEM;
    }
    return DLOCK_OK;
}

void dl_endpoint_describe(const dl_endpoint *ep, char *buf, size_t len) {
    if (ep->path) snprintf(buf, len, "unix:%s", ep->path);
    else if (ep->host && strchr(ep->host, ':')) snprintf(buf, len, "[%s]:%d", ep->host, ep->port);
    else snprintf(buf, len, "%s:%d", ep->host ? ep->host : "?", ep->port);
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    ch = tolower(ch);
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

int dl_pct_decode_into(const char *s, size_t n, char *out, size_t outlen) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            int h = i + 1 < n ? hexval((unsigned char)s[i + 1]) : -1;
            int l = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
            if (h < 0 || l < 0) return -1;
            ch = h * 16 + l;
            i += 2;
        }
        if (ch == 0 || o + 1 >= outlen) return -1;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return 0;
}

/* Percent-decodes [s, s+n) into a new string; NULL on bad escape or NUL. */
static char *pct_decode(const char *s, size_t n, int *oom) {
    char *out = malloc(n + 1);
    if (!out) {
        *oom = 1;
        return NULL;
    }
    if (dl_pct_decode_into(s, n, out, n + 1)) {
        free(out);
        return NULL;
    }
    return out;
}

static int parse_uint(const char *s, size_t n, long max, long *out) {
    if (n == 0 || n > 10) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return -1;
    *out = v;
    return 0;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static int parse_unix(const char *rest, dl_endpoint *ep, dl_err *err) {
    /* rest is what follows "unix://": "/path[?db=N]" */
    if (rest[0] != '/')
        return dl_seterr(err, DLOCK_EINVAL, "bad URL: unix:// needs an absolute socket path");
    const char *q = strchr(rest, '?');
    size_t plen = q ? (size_t)(q - rest) : strlen(rest);
    if (plen < 2) return dl_seterr(err, DLOCK_EINVAL, "bad URL: empty unix socket path");
    if (plen >= 108)
        return dl_seterr(err, DLOCK_EINVAL, "bad URL: unix socket path longer than 107 bytes");
    if (q) {
        long db;
        if (strncmp(q, "?db=", 4) != 0 || parse_uint(q + 4, strlen(q + 4), 1000000, &db) != 0)
            return dl_seterr(err, DLOCK_EINVAL, "bad URL: unix query must be ?db=N");
        ep->db = (int)db;
    }
    ep->path = dupn(rest, plen);
    if (!ep->path) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

static int parse_tcp(const char *rest, dl_endpoint *ep, dl_err *err) {
    /* [user[:password]@]host[:port][/db] */
    size_t n = strlen(rest);
    const char *end = rest + n;
    const char *slash = memchr(rest, '/', n);
    const char *auth_end = NULL;
    /* the userinfo ends at the last '@' before the path */
    for (const char *p = rest; p < (slash ? slash : end); p++)
        if (*p == '@') auth_end = p;
    const char *hp = rest;
    int oom = 0;
    if (auth_end) {
        const char *colon = memchr(rest, ':', (size_t)(auth_end - rest));
        size_t ulen = colon ? (size_t)(colon - rest) : (size_t)(auth_end - rest);
        if (ulen > 0) {
            ep->user = pct_decode(rest, ulen, &oom);
            if (!ep->user) goto bad_auth;
        }
        if (colon) {
            ep->password = pct_decode(colon + 1, (size_t)(auth_end - colon - 1), &oom);
            if (!ep->password) goto bad_auth;
        }
        hp = auth_end + 1;
    }
    const char *hp_end = slash ? slash : end;
    const char *host = hp, *host_end, *port_s = NULL;
    if (*hp == '[') {
        const char *rb = memchr(hp, ']', (size_t)(hp_end - hp));
        if (!rb) return dl_seterr(err, DLOCK_EINVAL, "bad URL: unterminated [IPv6] host");
        host = hp + 1;
        host_end = rb;
        if (rb + 1 < hp_end) {
            if (rb[1] != ':') return dl_seterr(err, DLOCK_EINVAL, "bad URL: junk after [IPv6] host");
            port_s = rb + 2;
        }
    } else {
        const char *colon = memchr(hp, ':', (size_t)(hp_end - hp));
        host_end = colon ? colon : hp_end;
        if (colon) port_s = colon + 1;
    }
    if (host_end == host) return dl_seterr(err, DLOCK_EINVAL, "bad URL: empty host");
    for (const char *p = host; p < host_end; p++)
        if (!(isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '_' || *p == ':'))
            return dl_seterr(err, DLOCK_EINVAL, "bad URL: bad character in host");
    ep->port = 6379;
    if (port_s) {
        long port;
        if (parse_uint(port_s, (size_t)(hp_end - port_s), 65535, &port) != 0 || port == 0)
            return dl_seterr(err, DLOCK_EINVAL, "bad URL: port must be 1 to 65535");
        ep->port = (int)port;
    }
    if (slash && slash + 1 < end) {
        long db;
        if (parse_uint(slash + 1, strlen(slash + 1), 1000000, &db) != 0)
            return dl_seterr(err, DLOCK_EINVAL, "bad URL: database must be a number after '/'");
        ep->db = (int)db;
    }
    ep->host = dupn(host, (size_t)(host_end - host));
    if (!ep->host) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
bad_auth:
    if (oom) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    return dl_seterr(err, DLOCK_EINVAL, "bad URL: bad %%-escape in user or password");
}

int dl_url_parse(const char *url, dl_endpoint *ep, dl_err *err) {
    memset(ep, 0, sizeof *ep);
    if (!url || !*url) return dl_seterr(err, DLOCK_EINVAL, "bad URL: empty");
    int rc;
    if (strncmp(url, "redis://", 8) == 0) rc = parse_tcp(url + 8, ep, err);
    else if (strncmp(url, "unix://", 7) == 0) rc = parse_unix(url + 7, ep, err);
    else if (strncmp(url, "rediss://", 9) == 0) {
        rc = parse_tcp(url + 9, ep, err);
        ep->tls = 1;
    }
    else {
        const char *sep = strstr(url, "://");
        int n = sep ? (int)(sep - url) : 0;
        if (n > 20) n = 20;
        rc = sep ? dl_seterr(err, DLOCK_EINVAL,
                             "bad URL: unknown scheme '%.*s' (expected redis://, unix://, "
                             "redlock://, redis-sentinel:// or redis-cluster://)",
                             n, url)
                 : dl_seterr(err, DLOCK_EINVAL,
                             "bad URL: no scheme (expected redis://host:port or unix:///path)");
    }
    if (rc) dl_endpoint_clear(ep);
    return rc;
}

void dl_target_clear(dl_target *t) {
    for (size_t i = 0; i < t->neps; i++) dl_endpoint_clear(&t->eps[i]);
    free(t->eps);
    free(t->master_name);
    dl_endpoint tmp = {0};
    tmp.password = t->password;
    dl_endpoint_clear(&tmp);
    memset(t, 0, sizeof *t);
}

/* Parses "NODE,NODE,..." (each a redis:// authority) into t->eps. */
static int parse_node_list(const char *list, size_t len, dl_target *t, dl_err *err) {
    size_t n = 1;
    for (size_t i = 0; i < len; i++) n += list[i] == ',';
    if (n > 64) /* DL_MAX_NODES of the topology layer */
        return dl_seterr(err, DLOCK_EINVAL, "bad URL: more than 64 nodes");
    t->eps = calloc(n, sizeof *t->eps);
    if (!t->eps) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    const char *p = list, *end = list + len;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;
        if (e == p) return dl_seterr(err, DLOCK_EINVAL, "bad URL: empty node in the list");
        char *part = dupn(p, (size_t)(e - p));
        if (!part) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        int rc = parse_tcp(part, &t->eps[t->neps], err);
        free(part);
        if (rc) {
            dl_endpoint_clear(&t->eps[t->neps]);
            return rc;
        }
        t->neps++;
        if (!comma) break;
        p = comma + 1;
    }
    return DLOCK_OK;
}

int dl_target_parse(const char *url, dl_target *t, dl_err *err) {
    memset(t, 0, sizeof *t);
    int rc;
    if (url && !strncmp(url, "redlock://", 10)) {
        t->mode = DL_MODE_REDLOCK;
        rc = parse_node_list(url + 10, strlen(url + 10), t, err);
        if (!rc && t->neps < 1) rc = dl_seterr(err, DLOCK_EINVAL, "bad URL: redlock:// needs nodes");
    } else if (url && !strncmp(url, "redis-cluster://", 16)) {
        t->mode = DL_MODE_CLUSTER;
        rc = parse_node_list(url + 16, strlen(url + 16), t, err);
    } else if (url && !strncmp(url, "redis-sentinel://", 17)) {
        t->mode = DL_MODE_SENTINEL;
        const char *rest = url + 17, *slash = strchr(rest, '/');
        if (!slash || !slash[1])
            return dl_seterr(err, DLOCK_EINVAL, "bad URL: redis-sentinel:// needs /MASTER_NAME");
        const char *at = memchr(rest, '@', (size_t)(slash - rest));
        const char *nodes = at ? at + 1 : rest;
        rc = parse_node_list(nodes, (size_t)(slash - nodes), t, err);
        const char *mn = slash + 1, *mend = strchr(mn, '/');
        size_t ml = mend ? (size_t)(mend - mn) : strlen(mn);
        if (!rc && ml == 0) rc = dl_seterr(err, DLOCK_EINVAL, "bad URL: empty master name");
        if (!rc && !(t->master_name = dupn(mn, ml)))
            rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        if (!rc && mend && mend[1]) {
            long db;
            if (parse_uint(mend + 1, strlen(mend + 1), 1000000, &db) != 0)
                rc = dl_seterr(err, DLOCK_EINVAL, "bad URL: database must be a number");
            else
                t->db = (int)db;
        }
        if (!rc && at) {
            int oom = 0;
            t->password = pct_decode(rest, (size_t)(at - rest), &oom);
            if (!t->password)
                rc = dl_seterr(err, oom ? DLOCK_ENOMEM : DLOCK_EINVAL,
                               "bad URL: bad %%-escape in the password");
        }
    } else {
        t->mode = DL_MODE_SINGLE;
        t->eps = calloc(1, sizeof *t->eps);
        if (!t->eps) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        rc = dl_url_parse(url, &t->eps[0], err);
        if (!rc) t->neps = 1;
    }
    if (rc) dl_target_clear(t);
    return rc;
}
