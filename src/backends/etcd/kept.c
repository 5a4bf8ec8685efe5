/* The client's kept holds (the keep-alive list): a hold taken off it, or
 * marked lost with its callback run. Used by the keep-alive thread and the
 * client's watch alike. (The design: etcd_backend.h.) */
#include <pthread.h>
#include <stdatomic.h>

#include "etcd_backend.h"

void dl_etcd_ka_remove_locked(etcd_client *ec, etcd_lock *el) {
    if (!el->kept) return;
    for (etcd_lock **p = &ec->ka_list; *p; p = &(*p)->next) {
        if (*p == el) {
            *p = el->next;
            break;
        }
    }
    el->next = NULL;
    el->kept = 0;
}

/* Marks el lost and runs its callback, on the keep-alive thread (ka_mu held). */
void dl_etcd_ka_lost_locked(etcd_client *ec, etcd_lock *el) {
    atomic_store(&el->lost, 1);
    if (el->l) {
        atomic_store(&el->l->lease.lost, 1);
        /* the lost-lease callback, as the Redis watchdog runs it (on this
         * thread; registered before the acquire) */
        if (el->l->lease.on_lost) el->l->lease.on_lost(&el->l->lease, DLOCK_LOST_TAKEN);
    } else {
        dl_semaphore_lost(el->sem, DLOCK_LOST_TAKEN);
    }
    dl_etcd_ka_remove_locked(ec, el);
}

/* Returns whether it was kept. */
int dl_etcd_ka_del(etcd_client *ec, etcd_lock *el) {
    pthread_mutex_lock(&ec->ka_mu);
    int was = el->kept;
    dl_etcd_ka_remove_locked(ec, el);
    pthread_mutex_unlock(&ec->ka_mu);
    return was;
}
