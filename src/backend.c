/* The table of backends, chosen by URL scheme. Each is in its own file;
 * those other than Redis are compiled only when their client library was
 * found (DLOCK_HAVE_<NAME>, set by CMake). */
#include <string.h>

#include "kinds.h"

#ifdef DLOCK_HAVE_POSTGRES
extern const dl_backend dl_backend_postgres;
#endif
#ifdef DLOCK_HAVE_MYSQL
extern const dl_backend dl_backend_mysql;
#endif
#ifdef DLOCK_HAVE_ZOOKEEPER
extern const dl_backend dl_backend_zookeeper;
#endif
#ifdef DLOCK_HAVE_ETCD
extern const dl_backend dl_backend_etcd;
#endif

static const dl_backend *const backends[] = {
    &dl_backend_redis,
#ifdef DLOCK_HAVE_POSTGRES
    &dl_backend_postgres,
#endif
#ifdef DLOCK_HAVE_MYSQL
    &dl_backend_mysql,
#endif
#ifdef DLOCK_HAVE_ZOOKEEPER
    &dl_backend_zookeeper,
#endif
#ifdef DLOCK_HAVE_ETCD
    &dl_backend_etcd,
#endif
    NULL,
};

const dl_backend *dl_backend_for(const char *url) {
    if (!url) return &dl_backend_redis;
    for (size_t i = 0; backends[i]; i++)
        for (const char *const *s = backends[i]->schemes; *s; s++)
            if (!strncmp(url, *s, strlen(*s))) return backends[i];
    return &dl_backend_redis;
}
