/* Bad input without a server: bad URLs (DLOCK_EINVAL, never a password in the
 * message), dlock_parse_duration (bad and good cases, exact ms), NULL handles
 * to every public function (no crash; DLOCK_EINVAL where an int is returned),
 * dlock_strerror for every code and out of range, and the version. */
#include "harness.h"

#include <limits.h>
#include <stdlib.h>

static void bad_urls(void)
{
    static const char *const bad[] = {
        "http://127.0.0.1:6379",          /* wrong scheme */
        "127.0.0.1:6379",                 /* no scheme */
        "redis:/127.0.0.1:6379",          /* malformed scheme separator */
        "redis://127.0.0.1:abc",          /* port not a number */
        "redis://127.0.0.1:0",            /* port 0 */
        "redis://127.0.0.1:70000",        /* port out of range */
        "redis://127.0.0.1:-1",           /* negative port */
        "redis://127.0.0.1:99999999999999999999", /* port overflow */
        "redis://127.0.0.1:63 79",        /* junk in port */
        "redis://:6379",                  /* empty host */
        "redis://",                       /* nothing */
        "redis://127.0.0.1:6379/abc",     /* junk db */
        "redis://127.0.0.1:6379/-1",      /* negative db */
        "redis://127.0.0.1:6379/1x",      /* trailing junk after db */
        "unix://",                        /* unix without a path */
        "unix:///tmp/x.sock?db=abc",      /* junk db */
        "unix:///tmp/x.sock?db=-2",       /* negative db */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dlock_options o;
        dlock_options_init(&o);
        o.url = bad[i];
        o.connect_timeout_ms = 300;
        dlock_client *c = NULL;
        int rc = dlock_client_new(&o, &c);
        ASSERT_MSG(rc == DLOCK_EINVAL, "URL \"%s\": got %d (%s), want DLOCK_EINVAL; message: %s",
                   bad[i], rc, dlock_strerror(rc), c ? dlock_errmsg(c) : "(no client)");
        ASSERT_MSG(c != NULL, "URL \"%s\": *out not set on failure", bad[i]);
        ASSERT_MSG(dlock_errmsg(c)[0] != '\0', "URL \"%s\": empty message", bad[i]);
        dlock_client_free(c);
    }
    th_log("%zu bad URLs refused", sizeof bad / sizeof bad[0]);

    /* the password never shows in a message */
    static const char *const with_pw[] = {
        "redis://user:Sup3rSecretPw@127.0.0.1:abc",
        "redis://:Sup3rSecretPw@127.0.0.1:6379/zz",
        "redis://user:Sup3rSecretPw@:6379",
    };
    for (size_t i = 0; i < sizeof with_pw / sizeof with_pw[0]; i++) {
        dlock_options o;
        dlock_options_init(&o);
        o.url = with_pw[i];
        dlock_client *c = NULL;
        ASSERT_CODE(dlock_client_new(&o, &c), DLOCK_EINVAL);
        ASSERT_NOT_NULL(c);
        ASSERT_MSG(strstr(dlock_errmsg(c), "Sup3rSecretPw") == NULL,
                   "password in the message: %s", dlock_errmsg(c));
        dlock_client_free(c);
    }
}

static void durations(void)
{
    static const char *const bad[] = {
        "", "abc", "10x", "-1s", "-5", "1.5.5s", "s", "ms", " ", "1ss", "5 s", "1h30",
        "nan", "inf", "0x10", "1e3", "200000000d", "99999999999999999999999", "9007199254741992ms",
        "1s ", " 1s", "+-1s", ".", "1..5s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms = 777;
        int rc = dlock_parse_duration(bad[i], &ms);
        ASSERT_MSG(rc == DLOCK_EINVAL, "duration \"%s\": got %d (%s) ms=%lld, want DLOCK_EINVAL",
                   bad[i], rc, dlock_strerror(rc), (long long)ms);
    }
    static const struct {
        const char *s;
        int64_t ms;
    } good[] = {
        {"250ms", 250},    {"1.5s", 1500},          {"30s", 30000},     {"5m", 300000},
        {"1h", 3600000},   {"2d", 172800000},       {"10", 10000},      {"0", 0},
        {"0ms", 0},        {"1.25", 1250},          {"0.0014s", 1},     {"0.6ms", 1},
        {"0.4ms", 0},      {"1.5m", 90000},        {"0.001s", 1},      {"100ms", 100},
        {"36h", 129600000}, {"104249d", 9007113600000LL}, {"9007199254740ms", 9007199254740LL},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t ms = -1;
        int rc = dlock_parse_duration(good[i].s, &ms);
        ASSERT_MSG(rc == DLOCK_OK, "duration \"%s\": got %d (%s), want DLOCK_OK", good[i].s, rc,
                   dlock_strerror(rc));
        ASSERT_MSG(ms == good[i].ms, "duration \"%s\": got %lld ms, want %lld", good[i].s,
                   (long long)ms, (long long)good[i].ms);
    }
    int64_t ms;
    ASSERT_CODE(dlock_parse_duration(NULL, &ms), DLOCK_EINVAL);
    ASSERT_CODE(dlock_parse_duration("1s", NULL), DLOCK_EINVAL);
    th_log("%zu bad and %zu good durations", sizeof bad / sizeof bad[0],
           sizeof good / sizeof good[0]);
}

static void strerrors(void)
{
    const char *seen[DLOCK_CODE_LAST_];
    for (int code = 0; code < DLOCK_CODE_LAST_; code++) {
        const char *s = dlock_strerror(code);
        ASSERT_NOT_NULL(s);
        ASSERT_MSG(s[0] != '\0', "dlock_strerror(%d) is empty", code);
        for (int j = 0; j < code; j++)
            ASSERT_MSG(strcmp(seen[j], s) != 0, "codes %d and %d share the name \"%s\"", j,
                       code, s);
        seen[code] = s;
    }
    const int out[] = {-1, DLOCK_CODE_LAST_, DLOCK_CODE_LAST_ + 1, 1000, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) {
        const char *s = dlock_strerror(out[i]);
        ASSERT_MSG(s != NULL && s[0] != '\0', "dlock_strerror(%d) is NULL or empty", out[i]);
        for (int j = 1; j < DLOCK_CODE_LAST_; j++)
            ASSERT_MSG(strcmp(seen[j], s) != 0,
                       "out-of-range code %d named like code %d (\"%s\")", out[i], j, s);
    }
    /* the codes never move (append-only) */
    ASSERT_EQ(DLOCK_OK, 0);
    ASSERT_EQ(DLOCK_EBUSY, 1);
    ASSERT_EQ(DLOCK_ETIMEDOUT, 2);
    ASSERT_EQ(DLOCK_EINVAL, 3);
    ASSERT_EQ(DLOCK_EIO, 5);
    ASSERT_EQ(DLOCK_ENOTOWNER, 9);
    ASSERT_EQ(DLOCK_ELOST, 10);
    ASSERT_EQ(DLOCK_EOVERFLOW, 15);
}

static void version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", DLOCK_VERSION_MAJOR, DLOCK_VERSION_MINOR,
             DLOCK_VERSION_PATCH);
    ASSERT_STR_EQ(dlock_version(), want);
    ASSERT_EQ(dlock_version_num(), DLOCK_VERSION_NUM);
    ASSERT(DLOCK_AT_LEAST_VERSION(0, 1, 0));
    ASSERT(!DLOCK_AT_LEAST_VERSION(DLOCK_VERSION_MAJOR + 1, 0, 0));
}

/* Every public function given NULL handles: no crash, DLOCK_EINVAL. */
static void null_handles(void)
{
    const char *n = "x";
    int i = 0;
    int64_t v64 = 0;
    uint64_t u64 = 0;
    char tok[DLOCK_TOKEN_LEN + 1];
    char buf[64];
    dlock_info info;
    size_t len = 0;

    dlock_client_free(NULL);
    dlock_lock_free(NULL);
    dlock_idworker_free(NULL);
    ASSERT_NOT_NULL(dlock_errmsg(NULL));
    ASSERT_NOT_NULL(dlock_lock_errmsg(NULL));
    ASSERT_NOT_NULL(dlock_idworker_errmsg(NULL));
    (void)dlock_client_id(NULL);
    ASSERT_CODE(dlock_client_new(NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_ping(NULL, &v64), DLOCK_EINVAL);
    ASSERT_CODE(dlock_ping(NULL, NULL), DLOCK_EINVAL);

    dlock_lock *l = (dlock_lock *)&i; /* must never be written through */
    ASSERT_CODE(dlock_lock_new(NULL, n, DLOCK_CSTR, DLOCK_KIND_PLAIN, &l), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire(NULL, DLOCK_NOWAIT, 1000, &u64), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire(NULL, DLOCK_NOWAIT, 1000, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_release(NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_extend(NULL, 1000), DLOCK_EINVAL);
    ASSERT_EQ(dlock_lock_holding(NULL), 0);
    ASSERT_EQ(dlock_lock_is_lost(NULL), 0);
    dlock_lock_on_lost(NULL, NULL, NULL);
    (void)dlock_lock_token(NULL);
    ASSERT_U64_EQ(dlock_lock_fence(NULL), 0);
    (void)dlock_lock_name(NULL, &len);
    (void)dlock_lock_name(NULL, NULL);
    (void)dlock_lock_kind(NULL);
    ASSERT_CODE(dlock_lock_check(NULL, &i, &v64), DLOCK_EINVAL);

    ASSERT_CODE(dlock_is_locked(NULL, n, DLOCK_CSTR, &i), DLOCK_EINVAL);
    ASSERT_CODE(dlock_remaining_ttl(NULL, n, DLOCK_CSTR, &v64), DLOCK_EINVAL);
    ASSERT_CODE(dlock_fence_current(NULL, n, DLOCK_CSTR, &u64), DLOCK_EINVAL);
    ASSERT_CODE(dlock_inspect(NULL, n, DLOCK_CSTR, &info), DLOCK_EINVAL);
    ASSERT_CODE(dlock_force_unlock(NULL, n, DLOCK_CSTR, &i), DLOCK_EINVAL);
    ASSERT_CODE(dlock_acquire_token(NULL, n, DLOCK_CSTR, DLOCK_NOWAIT, 1000, tok, &u64),
                DLOCK_EINVAL);
    ASSERT_CODE(dlock_release_token(NULL, n, DLOCK_CSTR, "t"), DLOCK_EINVAL);
    ASSERT_CODE(dlock_extend_token(NULL, n, DLOCK_CSTR, "t", 1000), DLOCK_EINVAL);
    ASSERT_CODE(dlock_list(NULL, NULL, NULL, NULL), DLOCK_EINVAL);
    ASSERT_CODE(dlock_server_fact(NULL, "maxmemory-policy", buf, sizeof buf), DLOCK_EINVAL);

    dlock_idworker *w = (dlock_idworker *)&i;
    ASSERT_CODE(dlock_idworker_new(NULL, "p", NULL, &w), DLOCK_EINVAL);
    ASSERT_CODE(dlock_idworker_next(NULL, &u64), DLOCK_EINVAL);
}

int main(void)
{
    th_init("badinput");
    version();
    strerrors();
    durations();
    null_handles();
    bad_urls();
    th_log("ok");
    return 0;
}
