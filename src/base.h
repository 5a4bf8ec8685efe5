/* The base layer (src/base/): what every other layer uses and which uses
 * nothing of theirs: errors, the clock, randomness, numbers, endpoints and
 * URLs, lock names and the keys and hash slots derived from them. Its files
 * include this header alone (scripts/check-layers). */
#ifndef DLOCK_BASE_H
#define DLOCK_BASE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dlock.h"

#define DL_ERRMSG_MAX 256
#define DL_INF_DEADLINE INT64_MAX

#define DL_XSTR_(x) #x
#define DL_STR(x) DL_XSTR_(x)

/* ---- errors (error.c) ---- */
typedef struct dl_err {
    int code;
    char msg[DL_ERRMSG_MAX];
} dl_err;

/* Records code and a formatted one-line message in err; returns code. */
int dl_seterr(dl_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Stores err as the calling thread's last error on client c; returns err->code. */
int dl_client_fail(const dlock_client *c, const dl_err *err);
/* Clears the calling thread's message on c. */
void dl_client_ok(const dlock_client *c);

/* ---- clock, randomness, numbers (clock.c, random.c, fmt.c) ---- */
int64_t dl_now_ms(void);      /* CLOCK_BOOTTIME (clock.c), milliseconds */
int64_t dl_now_us(void);      /* CLOCK_BOOTTIME (clock.c), microseconds */
void dl_sleep_ms(int64_t ms);
/* deadline from now + ms, saturating; ms < 0 gives DL_INF_DEADLINE */
int64_t dl_deadline(int64_t ms);
/* A condition variable on CLOCK_MONOTONIC, for dl_cond_wait_until. */
void dl_cond_init(pthread_cond_t *cv);
/* Waits on cv (made by dl_cond_init, mu held) until woken or until deadline
 * (dl_now_ms; DL_INF_DEADLINE: until woken); at once when it has passed. */
void dl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline);
/* Fills buf with len bytes from getrandom(2). DLOCK_OK or DLOCK_ESYS. */
int dl_random_bytes(void *buf, size_t len, dl_err *err);
/* 2*len hex characters of random bytes plus NUL into out. */
int dl_random_hex(char *out, size_t nbytes, dl_err *err);
/* Uniform random in [0, n) (n > 0) from getrandom; 0 on failure. */
uint64_t dl_random_below(uint64_t n);
/* Decimal of v into buf (>= 24 bytes); returns its length. */
size_t dl_fmt_ll(char *buf, long long v);
/* The calling thread's id (gettid): part of a reentrant hold's owner. */
long dl_thread_id(void);

/* ---- endpoints and URLs (url.c) ---- */

/* How to take and drop a counted reference of an object an endpoint holds
 * but does not know (its TLS context: the transport layer's), so that
 * endpoints are copied and cleared here. */
typedef struct dl_ref_ops {
    void (*up)(void *obj);
    void (*down)(void *obj);
} dl_ref_ops;

typedef struct dl_endpoint {
    char *host;      /* TCP host, or NULL for a unix socket */
    int port;
    char *path;      /* unix socket path, or NULL */
    int db;
    char *user;      /* NULL: no ACL user */
    char *password;  /* NULL: no AUTH */
    int tls;         /* rediss:// */
    void *tls_ctx;   /* a reference to the TLS context, set by the client for TLS */
    const dl_ref_ops *tls_ctx_ops; /* how to copy and drop tls_ctx */
    char *sni;       /* TLS server name to send and verify; NULL: the host */
} dl_endpoint;

/* A client's URL when neither its options nor $DLOCK_URL give one. */
#define DL_DEFAULT_URL "redis://127.0.0.1:6379"

int dl_url_parse(const char *url, dl_endpoint *ep, dl_err *err);
/* [s, s+n) percent-decoded into out (outlen bytes with the NUL): 0, or -1
 * for a bad escape, a NUL (escaped or not) or a result that does not fit. */
int dl_pct_decode_into(const char *s, size_t n, char *out, size_t outlen);

/* What a client talks to. */
enum { DL_MODE_SINGLE = 0, DL_MODE_REDLOCK = 1, DL_MODE_SENTINEL = 2, DL_MODE_CLUSTER = 3 };
typedef struct dl_target {
    int mode;
    dl_endpoint *eps;     /* single: 1; redlock: masters; sentinel: sentinels; cluster: seeds */
    size_t neps;
    char *master_name;    /* sentinel */
    int db;               /* sentinel */
    char *password;       /* sentinel: the master's password */
} dl_target;
int dl_target_parse(const char *url, dl_target *t, dl_err *err);
void dl_target_clear(dl_target *t);
/* Frees ep's strings (the password wiped first) and drops its TLS context
 * reference. */
void dl_endpoint_clear(dl_endpoint *ep);
/* Copies src into dst (strings duplicated, a TLS context reference taken).
 * DLOCK_OK or DLOCK_ENOMEM (dst then cleared). */
int dl_endpoint_copy(dl_endpoint *dst, const dl_endpoint *src);
/* "host:port" or the socket path, for messages (never the password). */
void dl_endpoint_describe(const dl_endpoint *ep, char *buf, size_t len);

/* ---- counts (error.c) ---- */
/* DLOCK_OK if min <= v <= DLOCK_COUNT_MAX (a delta: |v| <= DLOCK_COUNT_MAX
 * with min = -DLOCK_COUNT_MAX); else DLOCK_EINVAL with "what: arg must be
 * ..." in err. */
int dl_check_count(int64_t v, int64_t min, const char *what, const char *arg, dl_err *err);

/* ---- names (names.c) ---- */
/* Validates a user name/length pair; resolves DLOCK_CSTR. */
int dl_check_name(const char *name, size_t *len, dl_err *err);
/* Printable, truncated copy of a name for messages ("\xNN" escapes). */
const char *dl_name_msg(const char *name, size_t len, char *buf, size_t buflen);
/* prefix + "{" name "}" + suffix, braces left out when name has '{'
 * (Redisson's prefixName/suffixName). Returns malloc'd buffer
 * (NUL-terminated, binary-safe length in *outlen). */
char *dl_derive_key(const char *prefix, const char *name, size_t name_len, const char *suffix,
                    size_t *outlen);
/* The latch channel: DL_LATCH_CHANNEL_PREFIX "{" name "}" for every name,
 * one with '{' too (Redisson's RCountDownLatch does not apply its brace
 * rule there). malloc'd, as dl_derive_key. */
#define DL_LATCH_CHANNEL_PREFIX "redisson_countdownlatch__channel__"
char *dl_latch_channel(const char *name, size_t name_len, size_t *outlen);
/* The Redis Cluster hash slot of a key (CRC16 of the key or of its {hash
 * tag}, mod 16384). */
#define DL_SLOTS 16384
unsigned dl_key_slot(const char *key, size_t len);
/* Whether every key dl_derive_key makes from name hashes to name's slot:
 * 1 yes, 0 no, -1 out of memory. */
int dl_name_keys_one_slot(const char *name, size_t len);

#endif
