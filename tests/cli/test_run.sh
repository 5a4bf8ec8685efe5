#!/bin/bash
# dlock run: exit statuses, the child's environment, conflicts (-n, -w, -E),
# waiting for a release, kinds, and the lock held exactly while the child runs.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

M=$TMP/marker

# Exit statuses.
expect 0 "child exits 0" run n true
expect 3 "child's status passed through" run n sh -c 'exit 3'
expect 137 "child killed by SIGKILL gives 128+9" run n sh -c 'kill -KILL $$'
expect 42 "-c runs a shell string" run n -c 'exit 42'
expect 5 "-c given before NAME" run -c 'exit 5' n
expect 0 "-- before COMMAND" run n -- true
expect 127 "command not found" run n "$TMP/no-such-command"
check "command not found: one line on stderr" "[ \$(wc -l <'$TMP/err') = 1 ]"
printf 'echo hi\n' >"$TMP/not-executable"
expect 126 "command not executable" run n "$TMP/not-executable"
check "released after exec failures" "[ \"\$(rcli exists n)\" = 0 ]"

# A command that cannot run is reported before the lock is taken: with the
# lock held elsewhere, at once, with 127/126, not after the wait.
busy=$("$DLOCK" acquire --ttl 30s busyexec)
expect_one_line 127 "not found, lock busy: 127 before waiting" run -w 3s busyexec "$TMP/no-such-command"
expect_one_line 127 "not found in PATH, lock busy: 127" run -w 3s busyexec no-such-command-dlock-test
expect_one_line 126 "not executable, lock busy: 126 before waiting" run -w 3s busyexec "$TMP/not-executable"
expect_one_line 126 "a directory, lock busy: 126" run -w 3s busyexec "$TMP"
check "the holder's lock is untouched" "[ \"\$(rcli get busyexec)\" = '$busy' ]"
rcli del busyexec >/dev/null

# Options go before NAME; after it, they are a usage error (not a command
# named '--ttl'); -c after NAME stays valid, and -- introduces a command.
expect_one_line 64 "an option after NAME is a usage error" run job --ttl 5m -- true
check "the usage error names the option" "grep -q \"option '--ttl' after NAME\" '$TMP/err'"
expect_one_line 64 "-n after NAME too" run job -n true
expect 0 "-c after NAME stays valid" run job -c true
expect 0 "-- then COMMAND after NAME" run job -- true

# The command's own options are left alone.
expect 0 "options after COMMAND go to the command" run n sh -c 'test "$1" = -n' sh -n

# Environment: DLOCK_NAME and a growing DLOCK_FENCE.
expect 0 "child sees DLOCK_NAME and DLOCK_FENCE" \
    run envlock sh -c 'echo "$DLOCK_NAME $DLOCK_FENCE"'
read -r name fence1 <<<"$OUT"
check "DLOCK_NAME is the lock name" "[ '$name' = envlock ]"
check "DLOCK_FENCE is a number" "[[ '$fence1' =~ ^[0-9]+$ ]]"
DLOCK_FENCE=999999 expect 0 "again, with a stale DLOCK_FENCE in our env" \
    run envlock sh -c 'echo "$DLOCK_FENCE"'
check "DLOCK_FENCE grows and replaces the inherited one" "[ '$OUT' -gt '$fence1' ] && [ '$OUT' != 999999 ]"
check "DLOCK_FENCE matches the server's fence counter" \
    "[ \"\$(rcli get 'redisson_lock_token:{envlock}')\" = '$OUT' ]"

# The lock is held while the child runs, with the --ttl lease, and freed after.
expect 0 "lock held during the child" \
    run --ttl 20s held sh -c "redis-cli -p $PORT exists held; redis-cli -p $PORT pttl held; redis-cli -p $PORT type held"
{ read -r exists; read -r pttl; read -r type; } <<<"$OUT"
check "key exists while the child runs" "[ '$exists' = 1 ]"
check "lease is --ttl (pttl $pttl)" "[ '$pttl' -gt 15000 ] && [ '$pttl' -le 20000 ]"
check "default kind is plain (a string key)" "[ '$type' = string ]"
check "released after the child exits" "[ \"\$(rcli exists held)\" = 0 ]"
expect 0 "--kind reentrant" run --kind reentrant held sh -c "redis-cli -p $PORT type held"
check "reentrant kind is a hash key" "[ '$OUT' = hash ]"
check "reentrant released" "[ \"\$(rcli exists held)\" = 0 ]"

# Read and write locks: readers share, a writer excludes them.
"$DLOCK" run --kind read rw sh -c "touch '$TMP/r-ready'; while [ ! -e '$TMP/r-go' ]; do sleep 0.02; done" &
reader=$!
BG_PIDS+=("$reader")
wait_until "[ -e '$TMP/r-ready' ]"
expect 0 "a second reader gets a read lock" run -n --kind read rw true
expect 1 "a writer cannot while a reader holds" run -n --kind write rw true
touch "$TMP/r-go"
wait "$reader"
expect 0 "a writer gets it after the reader" run -n --kind write rw true
expect 0 "--kind fair" run -n --kind fair fairlock true
check "fair lock released" "[ \"\$(rcli exists fairlock)\" = 0 ]"

# Other ways to reach the server: a unix socket, a database number.
expect 0 "--url unix:// socket" --url "unix://$TMP/redis.sock" run sock sh -c "redis-cli -s '$TMP/redis.sock' exists sock"
check "locked through the socket" "[ '$OUT' = 1 ]"
expect 0 "--url with a database number" --url "redis://127.0.0.1:$PORT/3" run dbn sh -c "redis-cli -p $PORT -n 3 exists dbn; redis-cli -p $PORT -n 0 exists dbn"
check "the lock is in db 3, not db 0" "[ \"\$(echo \$OUT)\" = '1 0' ]"
DLOCK_URL="redis://127.0.0.1:$PORT/4" expect 0 "DLOCK_URL is used" run envurl sh -c "redis-cli -p $PORT -n 4 exists envurl"
check "DLOCK_URL chose db 4" "[ '$OUT' = 1 ]"

# stdin and stdout pass through.
out=$(echo through | "$DLOCK" run n cat)
check "stdin reaches the child" "[ '$out' = through ]"

# --verbose says how long getting the lock took.
expect 0 "--verbose" -v run n true
check "--verbose prints the time to get the lock" "grep -q 'getting lock .n. took [0-9.]* seconds' '$TMP/err'"

# Conflicts: the lock is held by a token from `dlock acquire`.
token=$("$DLOCK" acquire --ttl 30s busy)
expect 1 "-n on a held lock gives 1" run -n busy touch "$M"
check "busy message on stderr" "grep -q 'held by another owner' '$TMP/err'"
expect 1 "-q -n: quiet conflict" -q run -n busy touch "$M"
check "-q: nothing on stderr" "[ ! -s '$TMP/err' ]"
expect 42 "-E 42 sets the conflict code" run -n -E 42 busy touch "$M"
expect 7 "--conflict-exit-code=7" run --nonblock --conflict-exit-code=7 busy touch "$M"
expect 1 "-w 0 means -n" run -w 0 busy touch "$M"
start=$(date +%s%N)
expect 1 "-w 300ms times out" run -w 300ms busy touch "$M"
ms=$((($(date +%s%N) - start) / 1000000))
check "-w 300ms waited about 300 ms ($ms ms)" "[ $ms -ge 290 ] && [ $ms -lt 5000 ]"
expect 9 "-w 0.2 (fraction of a second) with -E 9" run -w 0.2 -E 9 busy touch "$M"
check "no child started on conflict" "[ ! -e '$M' ]"
check "the holder's lock is untouched" "[ \"\$(rcli get busy)\" = '$token' ]"

# A waiter gets the lock as soon as the holder releases it.
"$DLOCK" run -w 20s busy sh -c "echo \$DLOCK_FENCE > '$TMP/waited'" &
waiter=$!
BG_PIDS+=("$waiter")
check "waiter subscribed" "wait_until '[ \"\$(waiters busy)\" -ge 1 ]'"
check "waiter did not run yet" "[ ! -e '$TMP/waited' ]"
start=$(date +%s%N)
"$DLOCK" release busy "$token"
wait "$waiter"
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
# woken: well before the holder's 30 s lease (the time is bench's handoff figure)
check "waiter ran after the release (exit $rc, $ms ms)" "[ $rc = 0 ] && [ -s '$TMP/waited' ] && [ $ms -lt 10000 ]"

# Sequential runs never overlap (the second waits for the first).
"$DLOCK" run seq sh -c "touch '$TMP/first-in'; while [ ! -e '$TMP/go' ]; do sleep 0.02; done; rm '$TMP/first-in'" &
first=$!
BG_PIDS+=("$first")
wait_until "[ -e '$TMP/first-in' ]"
"$DLOCK" run -w 20s seq sh -c "[ ! -e '$TMP/first-in' ]" &
second=$!
BG_PIDS+=("$second")
wait_until '[ "$(waiters seq)" -ge 1 ]'
touch "$TMP/go"
wait "$first"; rc1=$?
wait "$second"; rc2=$?
check "second run started only after the first ended ($rc1, $rc2)" "[ $rc1 = 0 ] && [ $rc2 = 0 ]"

# --fair-wait: Redisson's queue arithmetic with the given wait time W. A new
# waiter's deadline is the tail's + W, so a waiter with --fair-wait 5m queued
# behind one with the default (5 s) stands exactly 300,000 ms after it; with
# the default it would stand 5,000 after (what a shared Redisson queue, whose
# W is 5 min by default, takes for a stale entry).
"$DLOCK" run --kind fair fw sh -c "touch '$TMP/fw-held'; while [ ! -e '$TMP/fw-go' ]; do sleep 0.02; done" &
fwh=$!
BG_PIDS+=("$fwh")
wait_until "[ -e '$TMP/fw-held' ]"
"$DLOCK" run --kind fair -w 5m fw true &
fw1=$!
BG_PIDS+=("$fw1")
wait_until '[ "$(rcli zcard "redisson_lock_timeout:{fw}")" = 1 ]'
"$DLOCK" --fair-wait 5m run --kind fair -w 5m fw true &
fw2=$!
BG_PIDS+=("$fw2")
wait_until '[ "$(rcli zcard "redisson_lock_timeout:{fw}")" = 2 ]'
scores=($(rcli zrange "redisson_lock_timeout:{fw}" 0 -1 withscores | sed -n '2p;4p'))
check "--fair-wait 5m: queued 300000 ms after the default waiter (${scores[*]})" \
    "[ \$(( ${scores[1]:-0} - ${scores[0]:-0} )) = 300000 ]"
touch "$TMP/fw-go"
wait "$fwh"; rc1=$?
wait "$fw1"; rc2=$?
wait "$fw2"; rc3=$?
check "the fair holder and both waiters ran ($rc1, $rc2, $rc3)" "[ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ]"
expect 64 "--fair-wait 0 is a usage error" --fair-wait 0 run fw true
expect 64 "--fair-wait beyond the library's range is a usage error" --fair-wait 100000000d run fw true

finish
