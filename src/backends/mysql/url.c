/* The MySQL backend's URL: mysql://[user[:password]@]host[:port]/database[?lock=table]. (The design: mysql_backend.h.) */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mysql.h>
#include <mysqld_error.h>
#include <errmsg.h>
#include <openssl/sha.h>

#include "mysql_backend.h"

/* ---- the URL ---- */
int dl_my_parse_url(const char *url, my_url *u, dl_err *err) {
    memset(u, 0, sizeof *u);
    u->port = 3306;
    const char *p = strstr(url, "://");
    if (!p) return dl_seterr(err, DLOCK_EINVAL, "bad MySQL URL");
    int scheme_len = (int)(p - url);
    p += 3;
    const char *slash = strchr(p, '/');
    const char *at = NULL;
    for (const char *q = p; *q && (!slash || q < slash); q++)
        if (*q == '@') at = q; /* the last '@' before the path */
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
        if (dl_pct_decode_into(p, ulen, u->user, sizeof u->user) ||
            (colon && dl_pct_decode_into(colon + 1, (size_t)(at - colon - 1), u->password,
                             sizeof u->password)))
            return dl_seterr(err, DLOCK_EINVAL, "bad user or password in the %.*s:// URL",
                             scheme_len, url);
        p = at + 1;
    }
    const char *hend = slash ? slash : p + strlen(p);
    const char *portp = NULL;
    if (*p == '[') { /* [IPv6] */
        const char *close = memchr(p, ']', (size_t)(hend - p));
        if (!close || (size_t)(close - p - 1) >= sizeof u->host) goto bad;
        memcpy(u->host, p + 1, (size_t)(close - p - 1));
        if (close + 1 < hend) {
            if (close[1] != ':') goto bad;
            portp = close + 2;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(hend - p));
        size_t hlen = colon ? (size_t)(colon - p) : (size_t)(hend - p);
        if (hlen >= sizeof u->host) goto bad;
        memcpy(u->host, p, hlen);
        if (colon) portp = colon + 1;
    }
    if (!u->host[0]) goto bad;
    if (portp) {
        char *end;
        long v = strtol(portp, &end, 10);
        if (end == portp || end != hend || v < 1 || v > 65535) goto bad;
        u->port = (unsigned)v;
    }
    if (!slash || !slash[1]) goto bad;
    const char *q = strchr(slash + 1, '?');
    size_t dblen = q ? (size_t)(q - slash - 1) : strlen(slash + 1);
    if (!dblen || memchr(slash + 1, '/', dblen) || memchr(slash + 1, '#', dblen) ||
        dl_pct_decode_into(slash + 1, dblen, u->database, sizeof u->database))
        goto bad;
    /* parameters: lock=get_lock|table */
    for (const char *par = q ? q + 1 : NULL; par && *par;) {
        const char *amp = strchr(par, '&');
        size_t plen = amp ? (size_t)(amp - par) : strlen(par);
        if (plen == 13 && !strncmp(par, "lock=get_lock", 13)) {
            u->mode = MY_MODE_GET_LOCK;
        } else if (plen == 10 && !strncmp(par, "lock=table", 10)) {
            u->mode = MY_MODE_TABLE;
        } else {
            memset(u->password, 0, sizeof u->password);
            return dl_seterr(err, DLOCK_EINVAL,
                             "unknown parameter '%.*s' in the %.*s:// URL (known: "
                             "lock=get_lock, lock=table)",
                             (int)(plen > 40 ? 40 : plen), par, scheme_len, url);
        }
        par = amp ? amp + 1 : NULL;
    }
    return 0;
bad:
    memset(u->password, 0, sizeof u->password);
    return dl_seterr(err, DLOCK_EINVAL,
                     "bad MySQL/MariaDB URL (want %.*s://user:password@host:port/database)",
                     scheme_len, url);
}

void dl_my_make_label(my_url *u, const char *scheme, int scheme_len) {
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(u->label, sizeof u->label, "%.*s://%s%s%s%s%s%s:%u/%s%s", scheme_len, scheme,
             u->user, u->password[0] ? ":***" : "", u->user[0] ? "@" : "", v6 ? "[" : "",
             u->host, v6 ? "]" : "", u->port, u->database,
             u->mode == MY_MODE_TABLE ? "?lock=table" : "");
}
