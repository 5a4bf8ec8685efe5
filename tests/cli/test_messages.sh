#!/bin/bash
# Messages and exit codes an operator meets: a lock held as another kind, a
# server that is not Redis, rediss:// against a plaintext server, and --json
# on failure.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# A lock held as another kind: the conflict code and words, not WRONGTYPE.
tok=$("$DLOCK" acquire --ttl 30s kindlock)
expect_one_line 1 "reentrant on a plain lock: the conflict code" run -n --kind reentrant kindlock true
check "it says the lock is held as another kind" "grep -q 'held as another kind' '$TMP/err' && ! grep -q WRONGTYPE '$TMP/err'"
expect 7 "with -E: the given conflict code, and at once" run -w 20s -E 7 -x kindlock true
expect 1 "fair on a plain lock" run -n --kind fair kindlock true
"$DLOCK" release kindlock "$tok"

# A server that is not Redis: "not a Redis server?" with 69.
"$PY" -u - >"$TMP/fake.port" <<'PYEOF' &
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        while c.recv(4096):
            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            break
    except OSError:
        pass
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PYEOF
BG_PIDS+=("$!")
disown "$!"
wait_until "[ -s '$TMP/fake.port' ]"
HTTP_URL="redis://127.0.0.1:$(cat "$TMP/fake.port")"
expect_one_line 69 "an HTTP listener: unavailable" --url "$HTTP_URL" status x
check "it says 'not a Redis server?'" "grep -q 'not a Redis server?' '$TMP/err'"
expect 69 "run against an HTTP listener" --url "$HTTP_URL" run -n x true

# rediss:// against a plaintext Redis: the TLS code, fast (not a timeout).
start=$(date +%s%N)
expect_one_line 76 "rediss:// against a plaintext server: TLS failed" --url "rediss://127.0.0.1:$PORT" --timeout 10s status x
ms=$(( ($(date +%s%N) - start) / 1000000 ))
check "it says the server speaks plaintext" "grep -q 'plaintext' '$TMP/err'"
check "it fails well before the 10 s timeout (${ms} ms)" "[ $ms -lt 5000 ]"

# await on a latch that was never set says so (it opens at once).
expect 0 "await on a latch never set" latch nosuchlatch await -w 1s
check "await says the latch does not exist" "grep -q 'does not exist' '$TMP/err'"
"$DLOCK" latch reallatch set 1
expect 1 "-n on await means do not wait (as everywhere)" latch reallatch await -n
"$DLOCK" latch reallatch await -w 20s 2>"$TMP/await.err" &
awaiter=$!
BG_PIDS+=("$awaiter")
wait_until "[ \"\$(rcli pubsub numsub 'redisson_countdownlatch__channel__{reallatch}' | tail -1)\" -ge 1 ]"
"$DLOCK" latch reallatch down
wait "$awaiter"; rc=$?
check "await on a set latch opens at zero, without the warning ($rc)" "[ $rc = 0 ] && ! grep -q 'does not exist' '$TMP/await.err'"

# run -v prints the token it holds (the holder `status` shows).
expect 0 "run -v" -v run vlock sh -c "redis-cli -p $PORT get vlock"
check "run -v prints the token it holds" "grep -q \"token $OUT\" '$TMP/err'"

# --json: one JSON object on stdout also on failure.
expect 64 "--json with a usage error" --json status
json_check "usage error as JSON" 'd["code"] == 64 and "NAME" in d["error"]' "$TMP/out"
expect 64 "--json after an unknown option" status --bogus --json x
json_check "unknown option as JSON" 'd["code"] == 64 and "--bogus" in d["error"]' "$TMP/out"
expect 69 "--json, server unreachable" --url redis://127.0.0.1:1 --json list
json_check "unreachable server as JSON (not a partial array)" 'd["code"] == 69 and d["error"]' "$TMP/out"
tok=$("$DLOCK" acquire --ttl 30s jsonlock)
expect 1 "--json -q, busy lock" -q acquire -n --json jsonlock
json_check "busy lock as JSON" 'd["code"] == 1 and "held by another owner" in d["error"]' "$TMP/out"
expect 81 "--json, wrong token" --json release jsonlock 0123456789abcdef0123456789abcdef
json_check "not the owner as JSON" 'd["code"] == 81' "$TMP/out"
expect 0 "--json success is the data" --json release jsonlock "$tok"
json_check "release --json" '"error" not in d' "$TMP/out"
expect 1 "run --json prints no data: nothing on stdout" --json run -n -q jsonlock2 sh -c 'exit 1'
check "run's stdout is the command's" "[ ! -s '$TMP/out' ]"

# A server that stops answering while a run waits (its lock held for 1 s):
# the wait rides the outage out and runs the command once the server is back
# (exit 0); with --fail-fast the first timeout ends it (69, unavailable).
for mode in retry fast; do
    name="frozen-$mode"
    "$DLOCK" acquire --ttl 1s "$name" >/dev/null
    flag=; [ "$mode" = fast ] && flag=--fail-fast
    ( sleep 0.3; kill -STOP "$REDIS_PID"; sleep 2; kill -CONT "$REDIS_PID" ) &
    freezer=$!
    if [ "$mode" = retry ]; then
        expect 0 "a wait rides a 2 s server freeze out (timeout 300ms)" --timeout 300ms $flag run -w 15s "$name" true
    else
        expect 69 "--fail-fast: the first timeout ends the wait" --timeout 300ms $flag run -w 15s "$name" true
        check "it says the server timed out" "grep -qi 'timed out\|unavailable' '$TMP/err'"
    fi
    wait "$freezer"
done

finish
