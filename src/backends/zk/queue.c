/* ZooKeeper names and the lock queue's nodes: paths, parents, our own node. (The design: zk.h.) */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <zookeeper/zookeeper_version.h>

#include "zk.h"

/* ---- names and queue nodes ---- */

/* root + "/" + hex(name) */
char *dl_zk_name_under(const char *root, const char *name, size_t len) {
    static const char hx[] = "0123456789abcdef";
    size_t rl = strlen(root);
    char *s = malloc(rl + 1 + 2 * len + 1);
    if (!s) return NULL;
    memcpy(s, root, rl);
    s[rl] = '/';
    char *q = s + rl + 1;
    for (size_t i = 0; i < len; i++) {
        *q++ = hx[(unsigned char)name[i] >> 4];
        *q++ = hx[(unsigned char)name[i] & 15];
    }
    *q = '\0';
    return s;
}

char *dl_zk_name_parent(zk_client *zc, const char *name, size_t len) {
    return dl_zk_name_under(zc->root, name, len);
}


static int parse_child(const char *name, zk_child *ch) {
    const char *p;
    if (!strncmp(name, "write-", 6)) {
        ch->write = 1;
        p = name + 6;
    } else if (!strncmp(name, "read-", 5)) {
        ch->write = 0;
        p = name + 5;
    } else {
        return 0;
    }
    if (strlen(p) < 2 * ZK_GUID_BYTES + 2 || p[2 * ZK_GUID_BYTES] != '-') return 0;
    memcpy(ch->guid, p, 2 * ZK_GUID_BYTES);
    ch->guid[2 * ZK_GUID_BYTES] = '\0';
    const char *sq = p + 2 * ZK_GUID_BYTES + 1;
    char *end = NULL;
    errno = 0;
    ch->seq = strtoll(sq, &end, 10);
    if (!*sq || *end || errno || ch->seq < 0) return 0;
    ch->name = name;
    return 1;
}

/* The queue of a name, in order, from op, a finished get-children of its
 * parent: *out points into op's names, *opout gets op (both for the caller
 * to free) or, on failure, op is freed. */
int dl_zk_queue_of(zk_op *op, zk_op **opout, zk_child **out, int *n, dl_err *err) {
    *out = NULL;
    *n = 0;
    *opout = NULL;
    zk_child *v = calloc((size_t)(op->nkids ? op->nkids : 1), sizeof *v);
    if (!v) {
        dl_zk_op_unref(op);
        return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < op->nkids; i++)
        if (parse_child(op->kids[i], &v[k])) k++;
    /* insertion sort by sequence (queues are short) */
    for (int i = 1; i < k; i++) {
        zk_child x = v[i];
        int j = i - 1;
        while (j >= 0 && v[j].seq > x.seq) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
    *out = v;
    *n = k;
    *opout = op;
    return DLOCK_OK;
}

/* The queue of a name, in order. *n 0 when the parent is missing. */
int dl_zk_list_queue(zk_client *zc, zk_sess *s, const char *parent, zk_op **opout,
                     zk_child **out, int *n, dl_err *err) {
    *out = NULL;
    *n = 0;
    *opout = NULL;
    zk_op *op = NULL;
    int zrc = dl_zk_req(zc, s, OP_KIDS, parent, 0, &op);
    if (zrc == ZNONODE) return DLOCK_OK;
    if (zrc != ZOK) return dl_zk_fail(zrc, "list the queue", err);
    return dl_zk_queue_of(op, opout, out, n, err);
}

/* Creates parent (with last_flags: a container for a lock's queue) and,
 * when needed, its ancestors (persistent). Called after a create under
 * parent answered ZNONODE: the usual cause is the container of a name that
 * the server deleted after its last child went (or never made), with its
 * ancestors there, so parent alone is tried first (one request); when that
 * answers ZNONODE too, every ancestor is created from the top (ZNODEEXISTS
 * is fine), then parent. */
int dl_zk_ensure_parents(zk_client *zc, zk_sess *s, const char *parent, int last_flags,
                         dl_err *err) {
    int zrc = dl_zk_req(zc, s, OP_CREATE, parent, last_flags, NULL);
    if (zrc == ZOK || zrc == ZNODEEXISTS) return DLOCK_OK;
    if (zrc != ZNONODE) return dl_zk_fail(zrc, "create the parent nodes", err);
    char *buf = strdup(parent);
    if (!buf) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    int rc = DLOCK_OK;
    for (char *q = buf + 1;; q++) {
        if (*q != '/' && *q != '\0') continue;
        char saved = *q;
        *q = '\0';
        zrc = dl_zk_req(zc, s, OP_CREATE, buf, saved ? ZOO_PERSISTENT : last_flags, NULL);
        *q = saved;
        if (zrc != ZOK && zrc != ZNODEEXISTS) {
            rc = dl_zk_fail(zrc, "create the parent nodes", err);
            break;
        }
        if (!saved) break;
    }
    free(buf);
    return rc;
}

/* Finds the child with guid in parent: its full path and stat. *found 0 if
 * none. */
static int find_own(zk_client *zc, zk_sess *s, const char *parent, const char *guid,
                    char **path, struct Stat *st, int *found, dl_err *err) {
    *found = 0;
    zk_op *op = NULL;
    zk_child *v = NULL;
    int n = 0;
    int rc = dl_zk_list_queue(zc, s, parent, &op, &v, &n, err);
    if (rc) return rc;
    for (int i = 0; i < n && !*found; i++) {
        if (strcmp(v[i].guid, guid)) continue;
        *path = dl_zk_join3(parent, "/", v[i].name);
        if (!*path) rc = dl_seterr(err, DLOCK_ENOMEM, "out of memory");
        else *found = 1;
    }
    free(v);
    if (op) dl_zk_op_unref(op);
    if (rc || !*found) return rc;
    zk_op *eo = NULL;
    int zrc = dl_zk_req(zc, s, OP_EXISTS, *path, 0, &eo);
    if (zrc == ZOK) {
        *st = eo->st;
        dl_zk_op_unref(eo);
        return DLOCK_OK;
    }
    free(*path);
    *path = NULL;
    *found = 0;
    return zrc == ZNONODE ? DLOCK_OK : dl_zk_fail(zrc, "read our node", err);
}

/* Creates our queue node (once, even across a connection loss) before
 * deadline. With kids, each create is followed at once by a get-children of
 * parent, sent without waiting for the create's answer (a session's
 * requests are applied in order, so its listing has our node): *kids gets
 * that finished listing when both answered ZOK, else NULL (the caller lists
 * the queue itself). */
int dl_zk_create_node(zk_client *zc, zk_sess *s, const char *parent, int write,
                      const char *guid, int64_t deadline, char **path, uint64_t *czxid,
                      zk_op **kids, dl_err *err) {
    if (kids) *kids = NULL;
    char *prefix = malloc(strlen(parent) + 2 * ZK_GUID_BYTES + 16);
    if (!prefix) return dl_seterr(err, DLOCK_ENOMEM, "out of memory");
    sprintf(prefix, "%s/%s-%s-", parent, write ? "write" : "read", guid);
    int rc = DLOCK_OK, tries = 0, maybe = 0;
    for (;;) {
        if (maybe) {
            /* the last create may have been applied: look for our guid */
            int found = 0;
            struct Stat st;
            rc = find_own(zc, s, parent, guid, path, &st, &found, err);
            if (!rc && found) {
                *czxid = (uint64_t)st.czxid;
                break;
            }
            if (rc) {
                if (dl_now_ms() >= deadline) break;
                dl_sleep_ms(50);
                continue;
            }
            maybe = 0; /* not there: it was not applied */
        }
        zk_op *op = NULL, *kop = NULL;
        int zrc = dl_zk_req_send(s, OP_CREATE, prefix, ZOO_EPHEMERAL_SEQUENTIAL, NULL, &op);
        if (zrc == ZOK && kids && dl_zk_req_send(s, OP_KIDS, parent, 0, NULL, &kop) != ZOK)
            kop = NULL;
        if (zrc == ZOK) {
            /* the listing's answer comes after the create's: waiting for it
             * first wakes this thread once for both */
            int64_t until = dl_deadline(zc->cmd_timeout_ms);
            if (kop) dl_zk_req_wait(kop, until, &kop); /* kop: NULL unless ZOK */
            zrc = dl_zk_req_wait(op, until, &op);
            if (zrc != ZOK && kop) {
                dl_zk_op_unref(kop);
                kop = NULL;
            }
        }
        if (zrc == ZOK) {
            *path = op->path;
            op->path = NULL;
            *czxid = (uint64_t)op->st.czxid;
            dl_zk_op_unref(op);
            if (kids) *kids = kop;
            rc = DLOCK_OK;
            break;
        }
        if (zrc == ZNONODE && ++tries <= 3) {
            rc = dl_zk_ensure_parents(zc, s, parent, ZOO_CONTAINER, err);
            if (rc) break;
            continue;
        }
        if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT) {
            maybe = 1; /* the connection went: applied or not */
            if (dl_now_ms() < deadline) continue;
        }
        rc = dl_zk_fail(zrc, "create the queue node", err);
        break;
    }
    /* giving up while a create's outcome is unknown: if it made a node, the
     * node is found and deleted after the reconnection */
    if (rc && maybe) dl_zk_orphan_add(s, NULL, prefix);
    free(prefix);
    return rc;
}
