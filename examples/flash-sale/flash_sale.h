/* Flash-sale demo (issue 6): shared declarations. */
#ifndef FLASH_SALE_H
#define FLASH_SALE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dlock.h"

enum mode { M_NONE, M_LOCAL, M_DLOCK, M_OPTIMISTIC, M_FENCED, M_COUNT };

enum outcome {
    OUT_ORDERED = 1, /* an order was placed */
    OUT_SOLDOUT,     /* no stock left */
    OUT_DUPLICATE,   /* the user already has an order for this voucher */
    OUT_STALE,       /* fenced: the stock write carried an old fencing token */
    OUT_ERROR        /* lock wait timed out, database busy too long, ... */
};

/* Settings (read-only after parsing; inherited by the worker processes). */
typedef struct config {
    const char *redis_url;   /* the server to use (ours or --url) */
    const char *db;          /* SQLite file, or mysql://... (store_is_mysql) */
    const char *db_label;    /* db for messages: the password hidden */
    int workers, threads, attempts, users, vouchers, stock;
    int window_us;           /* sleep between check and act */
    int pause_holder;        /* pause one lock holder past its lease */
    int64_t voucher_lease_ms, user_lease_ms, pause_ms, lock_wait_ms;
    int verbose;
} config;

/* State shared by the parent and the worker processes of one mode
 * (MAP_SHARED anonymous memory). The arrays follow the struct. */
typedef struct shared {
    atomic_long next;          /* next attempt index to take */
    atomic_long done;          /* attempts finished */
    atomic_int ready;          /* threads set up */
    atomic_int go;             /* start signal */
    atomic_int pause_claimed;  /* the --pause-holder pause happened */
    atomic_long stale;         /* fenced writes rejected */
    atomic_long errors;        /* OUT_ERROR attempts */
    atomic_long lost;          /* releases that found the lease lost */
    atomic_long retries;       /* optimistic transactions run again (deadlock victims) */
    atomic_int fatal;          /* a worker could not run at all */
    atomic_llong end_us;       /* when the last thread ran out of attempts */
    atomic_int errmsg_set;
    char errmsg[512];          /* first error (fatal or not) */
    int32_t *user;             /* [attempts] */
    int32_t *voucher;          /* [attempts] */
    float *latency_us;         /* [attempts] */
    int8_t *outcome;           /* [attempts] */
} shared;

extern const char *const mode_names[M_COUNT];

/* ---- store.c: the database ----
 * db is a SQLite file path or a mysql://user:pass@host:port/db URL (MariaDB or
 * MySQL over TCP, store_mysql.c); each function works on either. One store
 * (connection) per worker thread. */
typedef struct store store;

/* 1 if db names a MySQL/MariaDB database (mysql:// or mariadb://). */
int store_is_mysql(const char *db);
/* 1 if this build has the MySQL/MariaDB backend. */
int store_have_mysql(void);

/* Opens db for a worker thread (busy timeout, prepared statements). */
int store_open(const char *db, store **out, char *err, size_t errlen);
void store_close(store *s);
/* Drops and creates the tables; vouchers 1..n with stock each. unique_pair:
 * the UNIQUE (user_id, voucher_id) constraint of the optimistic mode. The
 * first call must come before any thread or worker process is started. */
int store_reset(const char *db, int vouchers, int stock, int unique_pair, char *err,
                size_t errlen);

typedef struct store_stats {
    long long orders, stock_left, oversold, duplicates, dup_ids;
} store_stats;
int store_stats_read(const char *db, int stock, store_stats *st, char *err, size_t errlen);

/* Steps of a buy attempt. Each returns 0 on success, -1 on a database error
 * (message in store_errmsg). */
int store_has_order(store *s, int user, int voucher, int *has);
int store_stock(store *s, int voucher, long long *stock);
int store_decrement(store *s, int voucher);                   /* stock = stock - 1 */
int store_decrement_if_stock(store *s, int voucher, int *ok);  /* ... AND stock > 0 */
int store_decrement_fenced(store *s, int voucher, uint64_t fence, int *ok);
/* 0, -1 error, 1 unique violation */
int store_insert_order(store *s, uint64_t id, int user, int voucher);
/* A write transaction (SQLite: BEGIN IMMEDIATE, one writer at a time;
 * InnoDB: row locks, so it may be chosen as a deadlock victim). */
int store_begin(store *s);
int store_commit(store *s);
int store_rollback(store *s);
/* After a failed step: 1 if the database rolled the transaction back as a
 * deadlock victim or after a lock wait timeout, so that running the
 * transaction again is the cure (InnoDB only). */
int store_retryable(store *s);
const char *store_errmsg(store *s);

/* ---- tempredis.c: a throwaway redis-server ---- */
typedef struct tempredis {
    pid_t pid;
    int port;
    char url[64];
    char log[600];
} tempredis;

/* Starts bin (NULL: redis-server from PATH) in dir on a free port and waits
 * until it answers PING. On failure err holds one line and nothing runs. */
int tempredis_start(const char *bin, const char *dir, tempredis *t, char *err, size_t errlen);
void tempredis_stop(tempredis *t);

/* ---- worker.c ---- */
/* Body of a worker process for mode m; returns the exit status. */
int worker_main(const config *cfg, shared *sh, enum mode m, int index);

int64_t now_us(void);

#endif
