#!/bin/bash
# dlock status, list, force-unlock, doctor and id next (text and --json).
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# status of a free lock.
expect 0 "status of a free lock" status nolock
check "free lock shows state free" "grep -q '^state: *free' '$TMP/out'"
expect 0 "status --json of a free lock" status --json nolock
json_check "free lock json" 'd["name"] == "nolock" and d["held"] is False and d["kind"] is None and d["ttl_ms"] == -2 and d["holders"] == 0' "$TMP/out"

# status of a plain lock held by a token.
tok=$("$DLOCK" acquire --ttl 10m plainlock)  # held until force-unlock below, however slow the run
expect 0 "status of a plain lock" status plainlock
check "status shows held, kind and holder" "grep -q '^state: *held' '$TMP/out' && grep -q '^kind: *plain' '$TMP/out' && grep -q \"^holder: *$tok\" '$TMP/out'"
expect 0 "status --json of a plain lock" --json status plainlock
json_check "plain lock json" "d['held'] is True and d['kind'] == 'plain' and d['holder'] == '$tok' and d['holders'] == 1 and d['hold_count'] == 1 and 60000 < d['ttl_ms'] <= 600000 and d['fence'] >= 1 and d['waiters'] == 0" "$TMP/out"

# status of a reentrant lock held by a running `dlock run`, with a waiter.
"$DLOCK" run --kind reentrant --ttl 10s relock sh -c "touch '$TMP/re-ready'; while [ ! -e '$TMP/re-go' ]; do sleep 0.02; done" &
holder=$!
BG_PIDS+=("$holder")
wait_until "[ -e '$TMP/re-ready' ]"
"$DLOCK" run -w 5m --kind reentrant relock true &  # waits through every check below, however slow the run
waiter=$!
BG_PIDS+=("$waiter")
wait_until '[ "$(waiters relock)" -ge 1 ]'
expect 0 "status --json of a reentrant lock" status --json relock
json_check "reentrant lock json" 'd["held"] is True and d["kind"] == "reentrant" and ":" in d["holder"] and d["holders"] == 1 and d["hold_count"] == 1 and 0 < d["ttl_ms"] <= 10000 and d["waiters"] >= 1' "$TMP/out"

# list: text and json, with a pattern.
rcli rpush notalock x >/dev/null
expect 0 "list" list
check "list shows the plain lock" "grep -Eq '^plainlock +plain ' '$TMP/out'"
check "list shows the reentrant lock" "grep -Eq '^relock +reentrant ' '$TMP/out'"
check "list leaves out fence counters" "! grep -q redisson_lock_token '$TMP/out'"
check "list has a header" "head -1 '$TMP/out' | grep -q '^NAME'"
expect 0 "list --json" list --json
json_check "list --json has both locks" 'sorted(x["name"] for x in d if x["held"] and x["kind"] in ("plain","reentrant")) == ["plainlock", "relock"]' "$TMP/out"
expect 0 "list --json 'plain*'" list --json 'plain*'
json_check "pattern filters" '[x["name"] for x in d] == ["plainlock"]' "$TMP/out"
expect 0 "list --json with no match" list --json 'zzz*'
json_check "empty list is []" 'd == []' "$TMP/out"
expect 0 "list -q (no header)" -q list 'plain*'
check "list -q prints no header" "[ \$(wc -l <'$TMP/out') = 1 ]"

touch "$TMP/re-go"
wait "$holder"; rc1=$?
wait "$waiter"; rc2=$?
check "reentrant holder and waiter both ran ($rc1, $rc2)" "[ $rc1 = 0 ] && [ $rc2 = 0 ]"

# list and force-unlock touch only keys laid out as locks and objects: an
# application's STRING and HASH are neither listed nor deleted without --force.
rcli set user:1 hello >/dev/null
rcli hset user:2 name bob age 7 >/dev/null
rcli hset user:3 mode write x:1 1 >/dev/null
rcli set 'lock:order' "0a1b2c3d4e5f60718293a4b5c6d7e8f9-34" >/dev/null   # SimpleRedisLock
rcli set redsynclock 'q83vEjRWeJASNFZ4kBI0Vg==' >/dev/null                # redsync
expect 0 "list with application keys beside the locks" list
check "list leaves out an application's STRING" "! grep -q '^user:1 ' '$TMP/out'"
check "list leaves out an application's HASHes" "! grep -Eq '^user:(2|3) ' '$TMP/out'"
check "list shows a SimpleRedisLock and a redsync lock" "grep -Eq '^lock:order +plain ' '$TMP/out' && grep -Eq '^redsynclock +plain ' '$TMP/out'"
check "list says how it decided" "grep -q 'layout' '$TMP/err'"
expect 0 "list --json with application keys" list --json
json_check "list --json: locks only, each with its layout" 'not {"user:1","user:2","user:3"} & {x["name"] for x in d} and all(x["layout"] for x in d)' "$TMP/out"
expect 0 "status of an application's key" status --json user:1
json_check "status: an application's key is not a held lock" 'd["held"] is False and d["kind"] is None and d["layout"].startswith("not a lock")' "$TMP/out"
expect 65 "force-unlock refuses an application's STRING" force-unlock user:1
check "the STRING is still there" "[ \"\$(rcli get user:1)\" = hello ]"
check "force-unlock says why and names --force" "grep -q 'not a lock' '$TMP/err' && grep -q -- '--force' '$TMP/err'"
expect 65 "force-unlock refuses an application's HASH" force-unlock --yes user:3
rcli set counter 42 >/dev/null
expect 65 "force-unlock refuses an integer without --force" force-unlock counter
check "the integer is still there" "[ \"\$(rcli get counter)\" = 42 ]"
expect 0 "status of an idle semaphore (an integer)" status --json counter
json_check "an idle semaphore is not held" 'd["held"] is False and d["kind"] == "semaphore or latch" and d["permits"] == 42' "$TMP/out"
expect 0 "status of an idle semaphore, text" status counter
check "an idle semaphore's state is 'not held'" "grep -q '^state: *not held' '$TMP/out'"
expect 0 "force-unlock --force deletes it anyway" force-unlock --force user:1
check "--force deleted it" "[ \"\$(rcli exists user:1)\" = 0 ]"
expect 0 "force-unlock of a SimpleRedisLock" force-unlock lock:order
check "the SimpleRedisLock is gone" "[ \"\$(rcli exists lock:order)\" = 0 ]"
rcli del user:2 user:3 counter redsynclock >/dev/null

# waiters of a read-write lock are counted (they listen on its channel).
"$DLOCK" run -x --ttl 10s rwlock sh -c "touch '$TMP/rw-ready'; while [ ! -e '$TMP/rw-go' ]; do sleep 0.02; done" &
rwholder=$!
BG_PIDS+=("$rwholder")
wait_until "[ -e '$TMP/rw-ready' ]"
"$DLOCK" run -s -w 20s rwlock true &
rwwaiter=$!
BG_PIDS+=("$rwwaiter")
wait_until "[ \"\$(rcli pubsub numsub 'redisson_rwlock:{rwlock}' | tail -1)\" -ge 1 ]"
expect 0 "status of a write-held lock with a waiting reader" status --json rwlock
json_check "read-write lock waiter counted" 'd["kind"] == "write" and d["writer"] is True and d["waiters"] == 1' "$TMP/out"
touch "$TMP/rw-go"
wait "$rwholder"; rc1=$?
wait "$rwwaiter"; rc2=$?
check "read-write holder and waiter both ran ($rc1, $rc2)" "[ $rc1 = 0 ] && [ $rc2 = 0 ]"

# force-unlock wakes a waiter; the old token no longer owns anything.
"$DLOCK" run -w 20s plainlock touch "$TMP/woken" &
waiter=$!
BG_PIDS+=("$waiter")
wait_until '[ "$(waiters plainlock)" -ge 1 ]'
expect 0 "status of a plain lock with a blocked waiter" status --json plainlock
json_check "plain lock waiter counted" 'd["kind"] == "plain" and d["waiters"] == 1' "$TMP/out"
expect 0 "force-unlock (stdin not a terminal)" force-unlock plainlock
check "force-unlock says it deleted" "grep -q 'deleted' '$TMP/err'"
wait "$waiter"
rc=$?
check "force-unlock woke the waiter ($rc)" "[ $rc = 0 ] && [ -e '$TMP/woken' ]"
expect 81 "old token after force-unlock" release plainlock "$tok"
expect 0 "force-unlock --json of a free lock" force-unlock --yes --json plainlock
json_check "force-unlock --json existed false" 'd["name"] == "plainlock" and d["existed"] is False' "$TMP/out"
if command -v script >/dev/null 2>&1; then
    "$DLOCK" acquire --ttl 10m ttylock >/dev/null
    script -qec "$DLOCK force-unlock ttylock" /dev/null >"$TMP/tty.out" 2>&1
    rc=$?
    check "force-unlock on a terminal refuses without --yes ($rc)" "[ $rc = 64 ] && [ \"\$(rcli exists ttylock)\" = 1 ]"
    script -qec "$DLOCK force-unlock --yes ttylock" /dev/null >"$TMP/tty.out" 2>&1
    rc=$?
    check "force-unlock on a terminal with --yes ($rc)" "[ $rc = 0 ] && [ \"\$(rcli exists ttylock)\" = 0 ]"
else
    skip_part "force-unlock on a terminal (no script(1))"
fi

# doctor on the default test server: no AOF is a WARN, nothing FAILs.
expect 0 "doctor" doctor
check "doctor prints PASS/WARN lines" "grep -q '^PASS  version' '$TMP/out' && grep -q '^WARN  persistence' '$TMP/out' && grep -q '^PASS  eviction' '$TMP/out' && grep -q '^PASS  replication' '$TMP/out' && grep -q '^PASS  latency' '$TMP/out' && grep -q '^PASS  scripts' '$TMP/out'"
expect 0 "doctor --json" doctor --json
json_check "doctor --json" 'd["fail"] == 0 and {c["check"] for c in d["checks"]} >= {"version","scripts","eviction","persistence","replication","latency"} and all(c["result"] in ("PASS","WARN","FAIL") for c in d["checks"])' "$TMP/out"
rcli config set appendonly yes >/dev/null
rcli config set appendfsync always >/dev/null
rcli config set maxmemory-policy volatile-lru >/dev/null
expect 0 "doctor: volatile-lru is a WARN" doctor
check "doctor: eviction WARN, persistence PASS" "grep -q '^WARN  eviction' '$TMP/out' && grep -q '^PASS  persistence' '$TMP/out'"
rcli config set maxmemory-policy allkeys-lru >/dev/null
expect 0 "doctor: allkeys-lru with maxmemory 0 (nothing evicted) is not a FAIL" doctor
check "doctor: eviction WARN with maxmemory 0" "grep -q '^WARN  eviction.*maxmemory 0' '$TMP/out'"
rcli config set maxmemory 1gb >/dev/null
expect 78 "doctor: allkeys-lru with a maxmemory is a FAIL" doctor
check "doctor: eviction FAIL" "grep -q '^FAIL  eviction' '$TMP/out'"
rcli config set maxmemory 0 >/dev/null
rcli config set maxmemory-policy noeviction >/dev/null
run_dlock doctor --ttl 1ms
check "doctor --ttl: latency compared with the given lease" "grep -Eq '^(PASS|WARN|FAIL)  latency .* 1 ms lease' '$TMP/out'"
expect 69 "doctor: unreachable server" --url redis://127.0.0.1:1 doctor

# id next.
expect 0 "id next" id next
check "one id" "[[ '$OUT' =~ ^[0-9]+$ ]]"
first=$OUT
expect 0 "id next -c 5 orders" id next -c 5 orders
check "-c gives no warning" "[ ! -s '$TMP/err' ]"
check "five ids" "[ \$(wc -l <'$TMP/out') = 5 ]"
check "ids are unique" "[ \$(sort -u '$TMP/out' | wc -l) = 5 ]"
check "ids increase" "sort -n -c '$TMP/out'"
expect 0 "id next -n 2 (the old spelling)" id next -n 2 orders
check "-n COUNT still gives two ids" "[ \$(wc -l <'$TMP/out') = 2 ]"
check "-n COUNT warns that it is deprecated" "grep -q 'deprecated' '$TMP/err' && grep -q -- '-c COUNT' '$TMP/err'"
expect 0 "id next --json --count 3" id next --json --count 3
json_check "id --json: three distinct decimal strings" 'len(d) == 3 and len(set(d)) == 3 and all(x.isdigit() for x in d)' "$TMP/out"
ids=$("$PY" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))))' "$TMP/out")
check "json ids follow the earlier ones" "[ \$(echo $ids | tr ' ' '\n' | sort -n | head -1) -gt $first ]"
check "per-day counter key exists" "[ -n \"\$(rcli --scan --pattern 'icr:orders:*')\" ]"

finish
