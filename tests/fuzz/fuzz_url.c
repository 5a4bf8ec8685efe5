/* libFuzzer target: the URL parser (issue 8).
 *
 * Uses the library's internal entry point dl_target_parse() (src/base/url.c), the
 * function dlock_client_new() calls first, so that nothing connects: the
 * target links the static library, where the hidden symbol is reachable. On
 * success every endpoint is described (the string used in messages) and the
 * description must not contain the password. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    dl_target t;
    dl_err err;
    memset(&err, 0, sizeof err);
    int rc = dl_target_parse(s, &t, &err);
    if (rc == DLOCK_OK) {
        if (t.neps == 0 || !t.eps) abort();
        for (size_t i = 0; i < t.neps; i++) {
            const dl_endpoint *ep = &t.eps[i];
            if (!ep->host == !ep->path) abort(); /* exactly one of TCP host / socket path */
            if (ep->host && (ep->port <= 0 || ep->port > 65535)) abort();
            char buf[512];
            dl_endpoint_describe(ep, buf, sizeof buf);
            if (strlen(buf) >= sizeof buf) abort();
            /* the description is made of the address alone (never the
             * user or password): it must be exactly host:port, [host]:port or
             * unix:path */
            char want[512];
            if (ep->path) snprintf(want, sizeof want, "unix:%s", ep->path);
            else if (strchr(ep->host, ':')) snprintf(want, sizeof want, "[%s]:%d", ep->host, ep->port);
            else snprintf(want, sizeof want, "%s:%d", ep->host, ep->port);
            if (strcmp(buf, want) != 0) abort();
        }
        dl_target_clear(&t);
    } else {
        if (rc != err.code || err.msg[0] == '\0') abort(); /* every failure says why */
        if (memchr(err.msg, '\n', strlen(err.msg))) abort(); /* one line */
    }
    free(s);
    return 0;
}
