/* Waiting in a ZooKeeper queue, for locks and semaphores alike: the
 * session's watch events, a watch on the node ahead, a node given up, and
 * whether the session ended. (The design: zk.h.) */
#include <limits.h>
#include <poll.h>
#include <pthread.h>

#include "zk.h"

int dl_zk_sess_dead(zk_sess *s) {
    pthread_mutex_lock(&s->mu);
    int dead = s->dead;
    pthread_mutex_unlock(&s->mu);
    return dead;
}

/* Deletes a node we gave up on (waiting for the answer, bounded); one that
 * did not get through is left to the background (dl_zk_orphan_add). */
void dl_zk_give_up_node(zk_client *zc, zk_sess *s, const char *path) {
    int zrc = dl_zk_req(zc, s, OP_DELETE, path, 0, NULL);
    if (zrc != ZOK && zrc != ZNONODE && zrc != ZSESSIONEXPIRED) dl_zk_orphan_add(s, path, NULL);
}

/* Waits until the session's next watch event (after ev0), its end,
 * deadline, or a cancel of cx (zk_waker). 1 cancelled. */
int dl_zk_wait_event(zk_sess *s, uint64_t ev0, int64_t deadline, dl_cancel *cx) {
    int fd = dl_cancel_begin(cx);
    zk_waker me = {fd, NULL};
    pthread_mutex_lock(&s->mu);
    if (fd >= 0) {
        me.next = s->wakers;
        s->wakers = &me;
    }
    while (s->events == ev0 && !s->dead && !dl_canceled(cx)) {
        int64_t now = dl_now_ms();
        if (now >= deadline) break;
        int64_t until = deadline;
        if (fd < 0) {
            until = now + ZK_CANCEL_SLICE_MS;
            if (deadline != DL_INF_DEADLINE && deadline < until) until = deadline;
            dl_cond_wait_until(&s->cv, &s->mu, until);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        struct pollfd p[1]; /* the eventfd only: dl_cancel_poll adds it */
        int64_t left = until - now;
        dl_cancel_poll(cx, p, 0, until == DL_INF_DEADLINE ? -1 : left > INT_MAX ? INT_MAX : (int)left);
        pthread_mutex_lock(&s->mu);
    }
    if (fd >= 0) {
        zk_waker **pp = &s->wakers;
        while (*pp != &me) pp = &(*pp)->next;
        *pp = me.next;
    }
    pthread_mutex_unlock(&s->mu);
    dl_cancel_end(cx);
    return dl_canceled(cx);
}

int dl_zk_watch_ahead(zk_client *zc, zk_sess *s, const char *path, int64_t deadline,
                      const char *what, zk_op **op, dl_err *err) {
    int zrc = dl_zk_req(zc, s, OP_WATCH, path, 0, op);
    if (zrc == ZOK) return DLOCK_OK;
    if (zrc == ZNONODE) return ZK_LOOK_AGAIN;
    if (dl_zk_unknown(zrc) && dl_now_ms() < deadline) {
        dl_sleep_ms(50);
        return ZK_LOOK_AGAIN;
    }
    return dl_zk_fail(zrc, what, err);
}
