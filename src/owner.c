/* Who holds a reentrant, fair, read or write lock on the server: the owner
 * string of a handle, and the client's records of each owner's holds over
 * its handles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kinds.h"

int dl_owner_thread(dlock_lock *l, dl_err *err) {
    (void)err;
    int n = snprintf(l->token, sizeof l->token, "%s:%ld", l->h.c->id, dl_thread_id());
    l->token_len = (size_t)n;
    return DLOCK_OK;
}

/* ---- holds per owner ----
 * The server counts a reentrant, fair, read or write lock's holds per owner
 * ("<client id>:<thread id>", ":write" for the writer), whatever handle of
 * that owner took them; each handle counts its own. The client keeps one
 * record per handle that holds such a lock (its name and owner copied, its
 * count), so that it can add up an owner's holds over its handles: a release
 * that leaves the owner's count above that sum can tell that the surplus is
 * no handle's (an attempt whose reply was lost and that was tried again, a
 * handle that started afresh after a release failed) and give it back. A
 * handle whose hold has surely ended (marked lost, or its validity run out)
 * counts for nothing in the sum: the server may have dropped its holds, and
 * a release expecting them would change nothing. Every change of such a
 * handle's count goes through dl_set_holds. An owner's handles all belong to one
 * thread (the owner names it), the thread that adds them up; the records'
 * keys are copies, so other threads' handles are never read. */

typedef struct dl_owned {
    char *key; /* name, NUL, owner */
    size_t len;
    dlock_lock *l;
    int64_t count;
} dl_owned;

/* Kinds whose server count is shared by an owner's handles. */
static int tracked(const dlock_lock *l) {
    return (l->h.c->backend->caps & DL_CAP_OWNER_HOLDS) && l->ops->reentrant &&
           !l->ops->unique_owner;
}

static int same_owner(const dl_owned *o, const dlock_lock *l) {
    return o->len == l->h.name_len + 1 + l->token_len &&
           !memcmp(o->key, l->h.name, l->h.name_len) &&
           !memcmp(o->key + l->h.name_len + 1, l->token, l->token_len);
}

/* The sum of the counts of l's name and owner over the handles whose holds
 * may still be on the server; -1 when not known (a hold that could not be
 * recorded for want of memory: from then on the client never counts on a
 * sum). Under owned_mu. */
static int64_t owner_sum_locked(dlock_lock *l) {
    dlock_client *c = l->h.c;
    if (c->owned_broken) return -1;
    int64_t sum = 0;
    for (size_t i = 0; i < c->nowned; i++) {
        const dl_owned *o = &c->owned[i];
        if (!same_owner(o, l)) continue;
        /* the same owner: a handle of this thread (see above) */
        if (o->l != l && (atomic_load(&o->l->lease.lost) || dl_hold_valid_ms(o->l) == 0))
            continue;
        sum += o->count;
    }
    return sum;
}

/* l's record gets count v (none when v is 0); returns the owner's sum
 * afterwards (owner_sum_locked). */
static int64_t owned_set(dlock_lock *l, int64_t v) {
    dlock_client *c = l->h.c;
    pthread_mutex_lock(&c->owned_mu);
    size_t i = 0;
    while (i < c->nowned && c->owned[i].l != l) i++;
    if (i == c->nowned && v > 0) {
        size_t len = l->h.name_len + 1 + l->token_len;
        char *k = NULL;
        if (c->nowned == c->owned_cap) {
            size_t cap = c->owned_cap ? 2 * c->owned_cap : 8;
            dl_owned *o = realloc(c->owned, cap * sizeof *o);
            if (!o) {
                c->owned_broken = 1;
                goto out;
            }
            c->owned = o;
            c->owned_cap = cap;
        }
        if (!(k = malloc(len))) {
            c->owned_broken = 1;
            goto out;
        }
        memcpy(k, l->h.name, l->h.name_len);
        k[l->h.name_len] = '\0';
        memcpy(k + l->h.name_len + 1, l->token, l->token_len);
        c->owned[c->nowned++] = (dl_owned){k, len, l, 0};
    }
    if (i < c->nowned) {
        if (v > 0) {
            c->owned[i].count = v;
        } else { /* the handle's last hold: forget it */
            free(c->owned[i].key);
            c->owned[i] = c->owned[--c->nowned];
        }
    }
out:;
    int64_t sum = owner_sum_locked(l);
    pthread_mutex_unlock(&c->owned_mu);
    return sum;
}

size_t dl_owner_expect(dlock_lock *l, char *buf) {
    buf[0] = '\0';
    if (!tracked(l) || l->token_len == 0) return 0;
    dlock_client *c = l->h.c;
    pthread_mutex_lock(&c->owned_mu);
    int64_t sum = owner_sum_locked(l);
    pthread_mutex_unlock(&c->owned_mu);
    return sum > 0 ? dl_fmt_ll(buf, sum) : 0;
}

void dl_owned_free(dlock_client *c) {
    for (size_t i = 0; i < c->nowned; i++) free(c->owned[i].key);
    free(c->owned);
    c->owned = NULL;
    c->nowned = c->owned_cap = 0;
    pthread_mutex_destroy(&c->owned_mu);
}

int64_t dl_set_holds(dlock_lock *l, int64_t v) {
    int64_t delta = v - l->holds;
    l->holds = v;
    if (!tracked(l) || l->token_len == 0) return -1;
    return delta ? owned_set(l, v) : -1;
}
