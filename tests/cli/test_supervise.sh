#!/bin/bash
# dlock run supervises what it holds by its validity: a holder cut off from
# the server stops its command before the server can expire the hold, so a
# waiter's command never starts while the holder's still runs (locks and
# --limit permits alike). A lost lock, or dlock killed, stops the command's
# whole process group (pipelines, forked children).
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# start_proxy: a TCP proxy to the server (proxy.py); sets PROXY_PID and
# PROXY_URL. SIGKILL it to cut off the clients behind it.
start_proxy() {
    rm -f "$TMP/proxy.port"
    "$PY" "$here/proxy.py" "$TMP/proxy.port" "$PORT" &
    PROXY_PID=$!
    BG_PIDS+=("$PROXY_PID")
    wait_until "[ -s '$TMP/proxy.port' ]" || { fail "the proxy did not start"; finish; }
    PROXY_URL="redis://127.0.0.1:$(cat "$TMP/proxy.port")"
}

# A command that notes when it starts and when SIGTERM stops it (ns).
cat >"$TMP/noted.sh" <<'EOF2'
#!/bin/sh
out=$1
trap 'date +%s%N >"$out.stop"; exit 0' TERM
date +%s%N >"$out.start"
while :; do sleep 0.02; done
EOF2
chmod +x "$TMP/noted.sh"

# cut_off LABEL ARGS...: a holder runs `dlock run ARGS` through a proxy and a
# waiter the same directly; the proxy is killed. The holder exits 80, and
# its command stopped before the waiter's started.
cut_off() {
    local label=$1 holder waiter rc hstop wstart
    shift
    rm -f "$TMP"/h.* "$TMP"/w.*
    start_proxy
    DLOCK_URL=$PROXY_URL "$DLOCK" run "$@" "$TMP/noted.sh" "$TMP/h" 2>"$TMP/h.err" &
    holder=$!
    BG_PIDS+=("$holder")
    wait_until "[ -s '$TMP/h.start' ]" || fail "$label: the holder's command did not start"
    "$DLOCK" run "$@" "$TMP/noted.sh" "$TMP/w" 2>"$TMP/w.err" &
    waiter=$!
    BG_PIDS+=("$waiter")
    sleep 0.3 # the waiter is waiting (it cannot start: the holder holds)
    kill -KILL "$PROXY_PID"
    wait "$holder"
    rc=$?
    check "$label: the cut-off holder exits 80 ($rc)" "[ $rc = 80 ]"
    wait_until "[ -s '$TMP/w.start' ]" 100 || fail "$label: the waiter's command did not start"
    kill -TERM "$waiter"
    wait "$waiter"
    hstop=$(cat "$TMP/h.stop" 2>/dev/null || echo 0)
    wstart=$(cat "$TMP/w.start" 2>/dev/null || echo 0)
    check "$label: the holder's command stopped $(((wstart - hstop) / 1000000)) ms before the waiter's started" \
        "[ $hstop -gt 0 ] && [ $wstart -gt $hstop ]"
}

cut_off "lock" --ttl 2s cutlock
cut_off "--limit 1" --limit 1 --ttl 2s cutsem

# The process tree: the command runs in a process group of its own, and a
# lost lock, or dlock's own death, stops the whole group, not only the
# command's first process.

# gone PID: no such process, or a zombie (its parent has not reaped it yet).
gone() { [ -n "$1" ] && { [ ! -e "/proc/$1" ] || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }; }

# start_tree ARGS...: dlock run ARGS -c SCRIPT in the background, where
# SCRIPT (in $TREE) writes the group id to $TMP/pg first; sets DPID and PG.
start_tree() {
    rm -f "$TMP/pg" "$TMP/tree.err"
    "$DLOCK" run "$@" -c "echo \$\$ >'$TMP/pg'; $TREE" 2>"$TMP/tree.err" &
    DPID=$!
    BG_PIDS+=("$DPID")
    wait_until "[ -s '$TMP/pg' ]" || fail "the command did not start: $(cat "$TMP/tree.err")"
    PG=$(cat "$TMP/pg")
}

# child PROG: sets CHILD to the pid of the command's child PROG (killed at
# the end if it survives a failed check).
child() {
    CHILD=
    wait_until "pgrep -P $PG -x $1" && CHILD=$(pgrep -P "$PG" -x "$1" | head -1)
    if [ -n "$CHILD" ]; then BG_PIDS+=("$CHILD"); else fail "the command has no child $1"; fi
}

# A pipeline: the lock deleted; the sleep on the pipeline's left is gone.
TREE='sleep 41 | cat'
start_tree --ttl 1s --kill-after 1s tree
child sleep
sleeper=$CHILD
rcli del tree >/dev/null
wait "$DPID"
rc=$?
check "pipeline, lock lost: exit 80 ($rc)" "[ $rc = 80 ]"
check "pipeline, lock lost: the sleep of 'sleep | cat' is gone" "wait_until 'gone $sleeper' 20"
check "pipeline, lock lost: the message names the process group" \
    "grep -q 'SIGTERM to its process group $PG' '$TMP/tree.err'"

# A command that forks a child ignoring SIGTERM and exits on SIGTERM itself:
# the child gets SIGKILL after --kill-after, though the command has exited.
TREE="sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' & wait"
start_tree --ttl 1s --kill-after 500ms tree
child sh
stubborn=$CHILD
start=$(date +%s%N)
rcli del tree >/dev/null
wait "$DPID"
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
check "forking command, lock lost: exit 80 after the --kill-after ($rc, $ms ms)" \
    "[ $rc = 80 ] && [ $ms -ge 500 ]"
check "forking command, lock lost: its child that ignored SIGTERM got SIGKILL" \
    "wait_until 'gone $stubborn' 20"

# A grandchild that left the group (setsid): a lost lock stops it too
# (before: it kept running, outside any lock, after dlock exited 80).
TREE="setsid sh -c 'echo \$\$ >\"$TMP/escaped\"; exec sleep 45' & sleep 46"
rm -f "$TMP/escaped"
start_tree --ttl 1s --kill-after 1s tree
wait_until "[ -s '$TMP/escaped' ]" || fail "the grandchild did not start"
escaped=$(cat "$TMP/escaped")
BG_PIDS+=("$escaped")
check "setsid grandchild: in a session of its own" \
    "[ \"\$(ps -o sid= -p $escaped | tr -d ' ')\" = $escaped ]"
rcli del tree >/dev/null
wait "$DPID"
rc=$?
check "setsid grandchild, lock lost: exit 80 ($rc)" "[ $rc = 80 ]"
check "setsid grandchild, lock lost: it is gone too" "wait_until 'gone $escaped' 20"

# dlock SIGKILLed: the reaper stops the whole group.
TREE='sleep 43 | cat'
start_tree --ttl 5s tree
child sleep
sleeper=$CHILD
kill -KILL "$DPID"
wait "$DPID" 2>/dev/null
check "dlock SIGKILLed: the sleep of 'sleep | cat' is gone" "wait_until 'gone $sleeper' 50"
check "dlock SIGKILLed: the whole group is gone" "wait_until '! pgrep -g $PG' 50"
rcli del tree >/dev/null

# A command that leaves a child behind and exits normally: dlock does not
# wait for it or stop it (the lock is released when the command exits).
TREE='sleep 44 & echo $! >'"'$TMP/left'"
start_tree tree
wait "$DPID"
rc=$?
left=$(cat "$TMP/left")
check "a child left running after a normal exit is left alone (exit $rc)" \
    "[ $rc = 0 ] && ! gone $left"
kill "$left" 2>/dev/null

finish
