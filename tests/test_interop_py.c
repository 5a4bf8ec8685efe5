/* Interoperation with redis-py: a redis-py Lock (Debian's python3-redis, run by
 * /usr/bin/python3) and a dlock plain lock on the same key exclude each other
 * in both directions. The python side is a coprocess driven line by line over
 * pipes. Skipped (77) with a reason when /usr/bin/python3 cannot import redis. */
#include "harness.h"

#include <stdlib.h>

#define PYTHON "/usr/bin/python3"
#define NAME "interop:py"

static const char *py_script =
    "import sys, time, redis\n"
    "port, name = int(sys.argv[1]), sys.argv[2]\n"
    "r = redis.Redis(host='127.0.0.1', port=port)\n"
    "lk = r.lock(name, timeout=30)\n"
    "def out(x):\n"
    "    sys.stdout.write(str(x) + '\\n'); sys.stdout.flush()\n"
    "out('ready')\n"
    "for line in sys.stdin:\n"
    "    cmd = line.split()\n"
    "    if not cmd: continue\n"
    "    c = cmd[0]\n"
    "    try:\n"
    "        if c == 'acquire': out(bool(lk.acquire(blocking=False)))\n"
    "        elif c == 'acquire_short':\n"
    "            lk = r.lock(name, timeout=float(cmd[1]))\n"
    "            out(bool(lk.acquire(blocking=False)))\n"
    "        elif c == 'wait': out(bool(lk.acquire(blocking=True, blocking_timeout=10)))\n"
    "        elif c == 'release': lk.release(); out('released')\n"
    "        elif c == 'release_after':\n"
    "            out('sleeping'); time.sleep(float(cmd[1])); lk.release()\n"
    "        elif c == 'locked': out(lk.locked())\n"
    "        elif c == 'owned': out(lk.owned())\n"
    "        elif c == 'token': out(lk.local.token.decode())\n"
    "        elif c == 'quit': break\n"
    "        else: out('unknown')\n"
    "    except Exception as e:\n"
    "        out('error ' + type(e).__name__)\n";

static th_coproc g_py;

static void py_start(int port)
{
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    char *argv[] = {PYTHON, "-c", (char *)py_script, portbuf, NAME, NULL};
    th_coproc_start(&g_py, "python", argv);
}

static const char *py_line(int64_t timeout_ms) { return th_coproc_line(&g_py, timeout_ms); }
static void py_send(const char *cmd) { th_coproc_send(&g_py, cmd); }
static const char *py(const char *cmd) { return th_coproc_ask(&g_py, cmd); }

int main(void)
{
    th_init("interop_py");
    if (!th_python_has_redis(PYTHON))
        th_skip(PYTHON " cannot import redis (install Debian's python3-redis)");
    th_server *s = th_server_start(NULL);
    redisContext *rc = th_redis(s);
    py_start(th_server_port(s));
    ASSERT_STR_EQ(py_line(20000), "ready");

    dlock_client *c = th_client(s, 0);
    dlock_lock *l = th_lock(c, NAME, DLOCK_KIND_PLAIN);

    /* 1. python holds: dlock is excluded */
    ASSERT_STR_EQ(py("acquire"), "True");
    char pytoken[128];
    snprintf(pytoken, sizeof pytoken, "%s", py("token"));
    char *v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, pytoken);
    free(v);
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_LCODE(l, dlock_acquire(l, 300, 5000, NULL), DLOCK_ETIMEDOUT);
    int locked = 0;
    ASSERT_COK(c, dlock_is_locked(c, NAME, DLOCK_CSTR, &locked));
    ASSERT_EQ(locked, 1);
    dlock_info info;
    ASSERT_COK(c, dlock_inspect(c, NAME, DLOCK_CSTR, &info));
    ASSERT_EQ(info.exists, 1);
    ASSERT_EQ(info.kind, DLOCK_KIND_PLAIN);
    ASSERT_STR_EQ(info.holder, pytoken);
    char tok[DLOCK_TOKEN_LEN + 1];
    ASSERT_CCODE(c, dlock_acquire_token(c, NAME, DLOCK_CSTR, DLOCK_NOWAIT, 5000, tok, NULL),
                 DLOCK_EBUSY);
    ASSERT_CCODE(c, dlock_release_token(c, NAME, DLOCK_CSTR, "0123456789abcdef0123456789abcdef"),
                 DLOCK_ENOTOWNER);
    ASSERT_STR_EQ(py("owned"), "True");

    /* 2. python releases its own lock; dlock then acquires */
    ASSERT_STR_EQ(py("release"), "released");
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));

    /* 3. dlock holds: python is excluded, and cannot release dlock's lock */
    ASSERT_STR_EQ(py("acquire"), "False");
    ASSERT_STR_EQ(py("locked"), "True");
    ASSERT_STR_EQ(py("owned"), "False");
    v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, dlock_lock_token(l));
    free(v);

    /* 4. dlock releases; python acquires (non-blocking) */
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_STR_EQ(py("acquire"), "True");
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_STR_EQ(py("release"), "released");

    /* 5. python blocked waiting (it polls) gets the lock after dlock releases */
    ASSERT_LOK(l, dlock_acquire(l, DLOCK_NOWAIT, 10000, NULL));
    py_send("wait");
    th_sleep_ms(300); /* python polls meanwhile and must not get in */
    ASSERT_EQ(th_cmd_int(rc, "EXISTS %s", NAME), 1);
    v = th_cmd_str(rc, "GET %s", NAME);
    ASSERT_STR_EQ(v, dlock_lock_token(l));
    free(v);
    ASSERT_LOK(l, dlock_release(l));
    ASSERT_STR_EQ(py_line(12000), "True");
    ASSERT_LCODE(l, dlock_acquire(l, DLOCK_NOWAIT, 5000, NULL), DLOCK_EBUSY);
    ASSERT_STR_EQ(py("release"), "released");

    /* 6. dlock blocked waiting on a python lock (1 s lease) that python
     * releases without publishing: dlock gets it at the lease's end */
    ASSERT_STR_EQ(py("acquire_short 1"), "True");
    py_send("release_after 0.2");
    ASSERT_STR_EQ(py_line(5000), "sleeping");
    int64_t t0 = th_now_ms();
    ASSERT_LOK(l, dlock_acquire(l, 5000, 5000, NULL));
    int64_t took = th_now_ms() - t0;
    th_log("dlock waiter had the redis-py lock's key %lld ms after python began its release", (long long)took);
    /* woken by the lease's end (1 s), before the plain lock's 2 s re-check */
    ASSERT_LT(took, 2000);
    ASSERT_STR_EQ(py("acquire"), "False");
    ASSERT_LOK(l, dlock_release(l));

    th_coproc_quit(&g_py);
    dlock_lock_free(l);
    dlock_client_free(c);
    redisFree(rc);
    th_server_stop(s);
    th_log("ok");
    return 0;
}
