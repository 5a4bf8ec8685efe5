/* Flash-sale demo: the database backends behind store.c's functions
 * (flash_sale.h). store.c holds SQLite and the dispatch, store_mysql.c
 * MariaDB/MySQL; all SQL lives in these two files. */
#ifndef FLASH_SALE_STORE_IMPL_H
#define FLASH_SALE_STORE_IMPL_H

#include "flash_sale.h"

typedef struct store_ops {
    int (*open)(const char *db, store **out, char *err, size_t errlen);
    void (*close)(store *s);
    int (*reset)(const char *db, int vouchers, int stock, int unique_pair, char *err,
                 size_t errlen);
    int (*stats_read)(const char *db, int stock, store_stats *st, char *err, size_t errlen);
    int (*has_order)(store *s, int user, int voucher, int *has);
    int (*stock)(store *s, int voucher, long long *stock);
    int (*decrement)(store *s, int voucher);
    int (*decrement_if_stock)(store *s, int voucher, int *ok);
    int (*decrement_fenced)(store *s, int voucher, uint64_t fence, int *ok);
    int (*insert_order)(store *s, uint64_t id, int user, int voucher);
    int (*begin)(store *s);
    int (*commit)(store *s);
    int (*rollback)(store *s);
} store_ops;

/* The first member of each backend's handle. */
struct store {
    const store_ops *ops;
    int retryable;  /* the last error was a deadlock / lock wait timeout */
    char err[400];
};

#ifdef FLASH_SALE_MYSQL
extern const store_ops store_mysql_ops;
#endif

#endif
