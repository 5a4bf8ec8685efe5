#!/bin/bash
# dlock run supervises what it holds by its validity: a holder cut off from
# the server stops its command before the server can expire the hold, so a
# waiter's command never starts while the holder's still runs (locks and
# --limit permits alike).
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

finish
