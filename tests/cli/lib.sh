# Test harness for the dlock command-line tool. Source it from a test script:
#
#   . "$(dirname "$0")/lib.sh" "$@"     # $1 (or $DLOCK): the dlock binary
#
# It starts a private redis-server on a free 127.0.0.1 port in a fresh temp
# dir, exports DLOCK_URL for it, and stops the server and removes the dir on
# exit. Without redis-server/redis-cli it prints why and exits 77 (skipped).
# Tests poll for conditions (wait_until); they never sleep a fixed time for
# correctness.

set -u

DLOCK=${1:-${DLOCK:-}}
if [ -z "$DLOCK" ] || [ ! -x "$DLOCK" ]; then
    echo "lib.sh: the dlock binary is not given or not executable: '$DLOCK'" >&2
    exit 1
fi
for tool in redis-server redis-cli; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool is not installed (Debian: apt-get install redis-server redis-tools)"
        exit 77
    fi
done
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
if [ -z "$PY" ]; then
    echo "SKIP: python3 is not installed"
    exit 77
fi

# skip_part WHY: one part of a test cannot run here. Prints "SKIP PART: WHY";
# with $DLOCK_NO_SKIP set (CI) it counts as a failure: every check must run.
skip_part() {
    if [ -n "${DLOCK_NO_SKIP:-}" ] && [ "${DLOCK_NO_SKIP}" != 0 ]; then
        echo "not ok - a part would be skipped, and DLOCK_NO_SKIP forbids it: $*"
        FAILS=$((FAILS + 1))
    else
        echo "SKIP PART: $*"
    fi
}

unset DLOCK_URL DLOCK_PASSWORD
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-test.XXXXXX")
REDIS_PID=
PORT=
FAILS=0
BG_PIDS=()
EXTRA_PIDS=()

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_until 'shell condition' [tenths of a second, default 100]
wait_until() {
    local i
    for ((i = 0; i < ${2:-100}; i++)); do
        if eval "$1" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    return 1
}

stop_pid() {
    kill -"${2:-TERM}" "$1" 2>/dev/null || return 0
    timeout 10 tail -s 0.1 --pid="$1" -f /dev/null 2>/dev/null || kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}

cleanup() {
    local p
    for p in "${BG_PIDS[@]}"; do
        kill -9 "$p" 2>/dev/null
    done
    if [ -n "$REDIS_PID" ]; then
        kill -CONT "$REDIS_PID" 2>/dev/null
        stop_pid "$REDIS_PID"
    fi
    for p in "${EXTRA_PIDS[@]}"; do
        stop_pid "$p"
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

start_redis() {
    local try
    for try in 1 2 3 4 5; do
        PORT=$(free_port)
        redis-server --port "$PORT" --bind 127.0.0.1 --dir "$TMP" --save '' \
            --unixsocket "$TMP/redis.sock" --logfile "$TMP/redis.log" "$@" &
        REDIS_PID=$!
        if wait_until "redis-cli -p $PORT ping | grep -q PONG" 50; then
            export DLOCK_URL="redis://127.0.0.1:$PORT"
            return 0
        fi
        stop_pid "$REDIS_PID" KILL
        REDIS_PID=
    done
    echo "lib.sh: cannot start redis-server; log:" >&2
    cat "$TMP/redis.log" >&2
    exit 1
}

# start_extra_redis [redis-server options...]: one more private server (for
# RedLock or TLS tests); sets EXTRA_PORT (with --port 0 --tls-port, pass the
# port yourself as EXTRA_PORT=... and it is not checked). Stopped on exit.
start_extra_redis() {
    local try pid
    for try in 1 2 3 4 5; do
        EXTRA_PORT=$(free_port)
        mkdir -p "$TMP/extra-$EXTRA_PORT"
        redis-server --port "$EXTRA_PORT" --bind 127.0.0.1 --dir "$TMP/extra-$EXTRA_PORT" \
            --save '' --logfile "$TMP/extra-$EXTRA_PORT/redis.log" "$@" &
        pid=$!
        if wait_until "redis-cli -p $EXTRA_PORT ping | grep -q PONG" 50; then
            EXTRA_PIDS+=("$pid")
            return 0
        fi
        stop_pid "$pid" KILL
    done
    echo "lib.sh: cannot start another redis-server" >&2
    exit 1
}

rcli() { redis-cli -p "$PORT" "$@"; }

# Blocked waiters of lock $1: subscribers of its unlock channel, plus the
# plain lock's registered and the fair lock's queued waiters subscribed to
# their own channel (a waiter that got the lock keeps its channel for a
# while: a lingering subscription, not a waiter).
waiters() {
    local n m sub
    n=$(rcli pubsub numsub "redisson_lock__channel:{$1}" | tail -1)
    for m in $(rcli zrange "dlock_waiters:{$1}" 0 -1) $(rcli lrange "redisson_lock_queue:{$1}" 0 -1); do
        sub=$(rcli pubsub numsub "redisson_lock__channel:{$1}:$m" | tail -1)
        [ "${sub:-0}" -gt 0 ] && n=$((n + 1))
    done
    echo "$n"
}

ok() { echo "ok   - $*"; }
fail() {
    echo "FAIL - $*"
    FAILS=$((FAILS + 1))
}

# run_dlock ARGS...: runs dlock with stdin from /dev/null; sets RC, OUT
# (stdout file $TMP/out) and ERR (stderr file $TMP/err).
run_dlock() {
    "$DLOCK" "$@" </dev/null >"$TMP/out" 2>"$TMP/err"
    RC=$?
    OUT=$(cat "$TMP/out")
    ERR=$(cat "$TMP/err")
}

# expect EXPECTED_CODE 'description' ARGS...: runs dlock and checks the code.
expect() {
    local want=$1 desc=$2
    shift 2
    run_dlock "$@"
    if [ "$RC" = "$want" ]; then
        ok "$desc (exit $RC)"
    else
        fail "$desc: exit $RC, expected $want; stderr: $ERR"
    fi
}

# expect_usage EXPECTED_CODE 'description' ARGS...: as expect, and stderr must
# be exactly one line starting with "dlock".
expect_one_line() {
    local want=$1 desc=$2 lines
    expect "$@"
    lines=$(wc -l <"$TMP/err")
    if [ "$lines" != 1 ] || [ "${ERR#dlock}" = "$ERR" ]; then
        fail "$desc: stderr should be one 'dlock...' line, got $lines: $ERR"
    fi
}

# check 'description' 'shell condition'
check() {
    if eval "$2"; then ok "$1"; else fail "$1 [$2]"; fi
}

# json_check 'description' 'python expression over d (the parsed JSON)' < file
json_check() {
    if "$PY" -c 'import json,sys
d = json.load(open(sys.argv[2]))
ok = eval(sys.argv[1])
sys.exit(0 if ok else 1)' "$2" "$3" 2>"$TMP/pyerr"; then
        ok "$1"
    else
        fail "$1: $2 is false for $(cat "$3") $(cat "$TMP/pyerr")"
    fi
}

finish() {
    if [ "$FAILS" -gt 0 ]; then
        echo "$FAILS check(s) failed"
        exit 1
    fi
    echo "all checks passed"
    exit 0
}
