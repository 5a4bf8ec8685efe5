#!/bin/bash
# dlock run -s / -x (read-write lock), --limit N (expirable semaphore), --also
# (multi-lock); dlock latch; status and list of every kind; bad input for the
# new options. Children record their own intervals with timestamps
# ("NANOSECONDS start|end TAG" lines); overlaps are computed from those.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# sh -c "$SPAN" TAG LOG SECONDS: log the start, sleep, log the end.
SPAN='echo "$(date +%s%N) start $0" >>"$1"; sleep "$2"; echo "$(date +%s%N) end $0" >>"$1"'

# intervals LOG 'python expression': iv is {tag: (start, end)}; helpers
# overlap(a, b), maxconc() (most intervals at once) are defined.
intervals() {
    "$PY" - "$1" "$2" <<'EOF'
import sys
iv = {}
for line in open(sys.argv[1]):
    t, what, tag = line.split()
    s, e = iv.get(tag, (None, None))
    iv[tag] = (int(t), e) if what == "start" else (s, int(t))
def overlap(a, b):
    return iv[a][0] < iv[b][1] and iv[b][0] < iv[a][1]
def maxconc():
    ev = sorted([(s, 1) for s, e in iv.values()] + [(e, -1) for s, e in iv.values()])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best
ok = all(s is not None and e is not None for s, e in iv.values()) and eval(sys.argv[2])
if not ok:
    print(sorted(iv.items(), key=lambda x: x[1]), file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

# ---- -s / -x -------------------------------------------------------------
"$DLOCK" run -s rw sh -c "$SPAN" r1 "$TMP/rw1.log" 0.6 &
p1=$!
"$DLOCK" run --shared rw sh -c "$SPAN" r2 "$TMP/rw1.log" 0.6 &
p2=$!
BG_PIDS+=("$p1" "$p2")
wait "$p1"; rc1=$?
wait "$p2"; rc2=$?
check "two -s runs succeed ($rc1, $rc2)" "[ $rc1 = 0 ] && [ $rc2 = 0 ]"
check "two -s runs overlap in time" "intervals '$TMP/rw1.log' 'overlap(\"r1\", \"r2\")'"

# 3 reader loops and 2 writer loops at once: no -x interval meets any other.
rwloop() { # SIDE TAG
    local i
    for ((i = 0; i < 4; i++)); do
        "$DLOCK" run -w 30s "$1" rw sh -c "$SPAN" "$2-$i" "$TMP/rw2.log" 0.08 ||
            echo "$2-$i failed" >>"$TMP/rw2.err"
    done
}
pids=()
for t in ra rb rc; do rwloop -s $t & pids+=($!); done
for t in wa wb; do rwloop -x $t & pids+=($!); done
BG_PIDS+=("${pids[@]}")
for p in "${pids[@]}"; do wait "$p"; done
check "every -s / -x run succeeded" "[ ! -e '$TMP/rw2.err' ] || { cat '$TMP/rw2.err'; false; }"
check "a -x run never overlaps another run" \
    "intervals '$TMP/rw2.log' 'len(iv) == 20 and not any(overlap(a, b) for a in iv for b in iv if a != b and (a[0] == \"w\" or b[0] == \"w\"))'"
check "the read-write lock is free at the end" "[ \"\$(rcli exists rw)\" = 0 ]"
expect 0 "-x holds the write side" run -x rwk sh -c "redis-cli -p $PORT hget rwk mode"
check "-x is the write mode of a Redisson read-write lock" "[ '$OUT' = write ]"
expect 0 "-s holds the read side" run -s rwk sh -c "redis-cli -p $PORT hget rwk mode"
check "-s is the read mode" "[ '$OUT' = read ]"

# ---- --limit ---------------------------------------------------------------
pids=()
for i in 1 2 3 4 5; do
    "$DLOCK" run --limit 2 -w 30s sem2 sh -c "$SPAN" "h$i" "$TMP/sem.log" 0.4 &
    pids+=($!)
done
BG_PIDS+=("${pids[@]}")
fails=0
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
check "5 runs with --limit 2 all succeed ($fails failed)" "[ $fails = 0 ]"
check "at most and at least 2 holders at once" "intervals '$TMP/sem.log' 'len(iv) == 5 and maxconc() == 2'"
check "both permits are back" "[ \"\$(rcli get sem2)\" = 2 ] && [ \"\$(rcli zcard '{sem2}:timeout')\" = 0 ]"
expect 0 "--limit: the child gets DLOCK_PERMIT, not DLOCK_FENCE" \
    run --limit 2 sem2 sh -c 'echo "${DLOCK_PERMIT:-none} ${DLOCK_FENCE:-none}"'
check "DLOCK_PERMIT is a permit id" "[[ '$OUT' =~ ^[0-9a-f]{32}\ none$ ]]"

# A SIGKILLed dlock run's permit comes back after its --ttl.
"$DLOCK" run --limit 1 --ttl 2s killsem sh -c "touch '$TMP/k-ready'; exec sleep 30" &
kp=$!
BG_PIDS+=("$kp")
wait_until "[ -e '$TMP/k-ready' ]"
kill -KILL "$kp"
wait "$kp" 2>/dev/null
expect 1 "the killed run's permit is still out" run --limit 1 -n killsem true
t0=$(date +%s%N)
expect 0 "the permit comes back after the lease" run --limit 1 -w 20s killsem true
ms=$((($(date +%s%N) - t0) / 1000000))
check "it came back after the 2s lease, well within the 20 s wait (${ms} ms)" "[ $ms -lt 10000 ]"

# ---- --also ----------------------------------------------------------------
expect 0 "--also holds both locks" run --also ly lx sh -c "redis-cli -p $PORT exists lx ly"
check "both keys exist while the command runs" "[ '$OUT' = 2 ]"
check "both released" "[ \"\$(rcli exists lx ly)\" = 0 ]"
alsoloop() { # TAG NAME ALSO
    local i
    for ((i = 0; i < 8; i++)); do
        "$DLOCK" run -w 20s --also "$3" "$2" sh -c "$SPAN" "$1-$i" "$TMP/also.log" 0.02 ||
            echo "$1-$i failed" >>"$TMP/also.err"
    done
}
alsoloop a ma mb &
pa=$!
alsoloop b mb ma &
pb=$!
BG_PIDS+=("$pa" "$pb")
wait "$pa"
wait "$pb"
check "--also in opposite orders: no deadlock, every run got both" \
    "[ ! -e '$TMP/also.err' ] || { cat '$TMP/also.err'; false; }"
check "--also in opposite orders never overlap" \
    "intervals '$TMP/also.log' 'len(iv) == 16 and maxconc() == 1'"
# a lost --also lock stops the command
"$DLOCK" run --ttl 1s --also lostb losta sh -c "touch '$TMP/l-ready'; exec sleep 30" \
    >/dev/null 2>"$TMP/lost.err" &
lp=$!
BG_PIDS+=("$lp")
wait_until "[ -e '$TMP/l-ready' ]"
rcli del lostb >/dev/null
wait "$lp"
rc=$?
check "deleting an --also lock stops the command: exit 80 ($rc)" "[ $rc = 80 ]"
check "the message names the lost lock" "grep -q \"lock 'lostb' lost\" '$TMP/lost.err'"
check "the other lock is released" "[ \"\$(rcli exists losta)\" = 0 ]"

# ---- latch -----------------------------------------------------------------
expect 0 "latch set 3" latch L set 3
expect 0 "latch count" latch L count
check "count is 3" "[ '$OUT' = 3 ]"
sh -c '"$1" latch L await -w 20s; echo "$? $(date +%s%N)" >"$2.tmp"; mv "$2.tmp" "$2"' \
    sh "$DLOCK" "$TMP/await.done" &
ap=$!
BG_PIDS+=("$ap")
wait_until '[ "$(rcli pubsub numsub "redisson_countdownlatch__channel__{L}" | tail -1)" -ge 1 ]'
expect 0 "latch down" latch L down
expect 0 "latch down 1" latch L down 1
sleep 0.2
check "await still waits at count 1" "[ ! -e '$TMP/await.done' ] && [ \"\$($DLOCK latch L count)\" = 1 ]"
before=$(date +%s%N)
expect 0 "the last latch down" latch L down
wait "$ap"
read -r arc ats <"$TMP/await.done"
check "await returned 0 after the last down ($arc)" "[ '$arc' = 0 ] && [ '$ats' -gt '$before' ]"
expect 0 "count of an open latch" latch L count
check "count is 0" "[ '$OUT' = 0 ]"
expect 0 "await of an open latch" latch L await -w 0
expect 0 "latch set 2" latch L set 2
expect 1 "await -w 300ms times out with 1" latch L await -w 300ms
expect 7 "await -w with -E 7" latch -E 7 L await -w 100ms
expect 0 "latch down 5 (not below zero)" latch L down 5
expect 0 "latch count --json" latch --json L count
json_check "latch count --json" 'd == {"name": "L", "count": 0}' "$TMP/out"

# ---- status and list of every kind -----------------------------------------
GO=$TMP/go
HOLD="touch \"\$0\"; while [ ! -e '$GO' ]; do sleep 0.02; done"
hp=()
"$DLOCK" run --kind fair fl sh -c "$HOLD" "$TMP/h-fair" & hp+=($!)
"$DLOCK" run -s rdl sh -c "$HOLD" "$TMP/h-r1" & hp+=($!)
"$DLOCK" run -s rdl sh -c "$HOLD" "$TMP/h-r2" & hp+=($!)
"$DLOCK" run -x wrl sh -c "$HOLD" "$TMP/h-w" & hp+=($!)
"$DLOCK" run --limit 3 psem sh -c "$HOLD" "$TMP/h-p" & hp+=($!)
BG_PIDS+=("${hp[@]}")
wait_until "[ -e '$TMP/h-fair' ] && [ -e '$TMP/h-r1' ] && [ -e '$TMP/h-r2' ] && [ -e '$TMP/h-w' ] && [ -e '$TMP/h-p' ]"
"$DLOCK" run --kind fair -w 30s fl true & hp+=($!)
BG_PIDS+=("${hp[-1]}")
wait_until '[ "$(rcli llen "redisson_lock_queue:{fl}")" = 1 ]'
"$DLOCK" latch lt set 4

expect 0 "status --json fair" status --json fl
json_check "fair: kind and queued" 'd["kind"] == "fair" and d["held"] and d["queued"] == 1 and d["holders"] == 1' "$TMP/out"
expect 0 "status fair (text)" status fl
check "text shows queued 1" "grep -Eq '^queued: +1$' '$TMP/out'"
expect 0 "status --json read" status --json rdl
json_check "read: 2 readers, no writer" 'd["kind"] == "read" and d["readers"] == 2 and d["writer"] is False and d["holders"] == 2' "$TMP/out"
expect 0 "status read (text)" status rdl
check "text shows readers 2, writer no" "grep -Eq '^readers: +2$' '$TMP/out' && grep -Eq '^writer: +no$' '$TMP/out'"
expect 0 "status --json write" status --json wrl
json_check "write: a writer" 'd["kind"] == "write" and d["writer"] is True and d["readers"] == 0 and d["holders"] == 1 and d["holder"].endswith(":write")' "$TMP/out"
expect 0 "status --json permit semaphore" status --json psem
json_check "permit-semaphore: 2 left, 1 leased" 'd["kind"] == "permit-semaphore" and d["permits"] == 2 and d["leased"] == 1' "$TMP/out"
expect 0 "status permit semaphore (text)" status psem
check "text shows permits 2, leased 1" "grep -Eq '^permits: +2$' '$TMP/out' && grep -Eq '^leased: +1$' '$TMP/out'"
expect 0 "status --json latch" status --json lt
json_check "latch: semaphore or latch, count 4" 'd["kind"] == "semaphore or latch" and d["count"] == 4 and d["permits"] == 4 and d["ttl_ms"] == -1' "$TMP/out"
expect 0 "status latch (text)" status lt
check "text says semaphore or latch" "grep -Eq '^kind: +semaphore or latch$' '$TMP/out' && grep -Eq '^permits: +4 ' '$TMP/out'"
expect 0 "list --json" list --json
json_check "list --json has every kind" '{x["name"]: x["kind"] for x in d if x["name"] in ("fl","rdl","wrl","psem","lt")} == {"fl": "fair", "rdl": "read", "wrl": "write", "psem": "permit-semaphore", "lt": "semaphore or latch"} and [x for x in d if x["name"] == "psem"][0]["leased"] == 1' "$TMP/out"
expect 0 "list (text)" list
# a held lock's line ends with who holds it (" by HOST:PID ..."): the CLI
# records its holders
check "list text shows the details" \
    "grep -Eq '^fl +fair .*queued=1  by [^ ]+:[0-9]+ ' '$TMP/out' && grep -Eq '^rdl +read .*readers=2 writer=no  by [^ ]+:[0-9]+ ' '$TMP/out' && grep -Eq '^wrl +write .*readers=0 writer=yes  by [^ ]+:[0-9]+ ' '$TMP/out' && grep -Eq '^psem +permit-semaphore .*permits=2 leased=1$' '$TMP/out' && grep -Eq '^lt +semaphore or latch .*permits=4 leased=0$' '$TMP/out'"
touch "$GO"
fails=0
for p in "${hp[@]}"; do wait "$p" || fails=$((fails + 1)); done
check "every holder and the fair waiter finished ($fails failed)" "[ $fails = 0 ]"

# ---- bad input -------------------------------------------------------------
M=$TMP/marker
rcli flushall >/dev/null
expect_one_line 64 "run: -s and -x"                  run -s -x n touch "$M"
expect_one_line 64 "run: --kind write and -s"        run --kind write -s n touch "$M"
expect_one_line 64 "run: --limit 0"                  run --limit 0 n touch "$M"
expect_one_line 64 "run: --limit not a number"       run --limit two n touch "$M"
expect_one_line 64 "run: --limit without its N"      run --limit
expect_one_line 64 "run: --limit with -x"            run --limit 2 -x n touch "$M"
expect_one_line 64 "run: --limit with --also"        run --limit 2 --also m n touch "$M"
expect_one_line 64 "run: --also empty name"          run --also "" n touch "$M"
expect_one_line 64 "run: --also NAME itself"         run --also n n touch "$M"
expect_one_line 64 "run: --also twice the same"      run --also m --also m n touch "$M"
expect_one_line 64 "run: --also name too long"       run --also "$(head -c 1025 /dev/zero | tr '\0' a)" n touch "$M"
expect_one_line 64 "run: -s takes no argument"       run --shared=yes n touch "$M"
expect_one_line 64 "latch: missing NAME"             latch
expect_one_line 64 "latch: missing subcommand"       latch L
expect_one_line 64 "latch: unknown subcommand"       latch L open
expect_one_line 64 "latch: set without N"            latch L set
expect_one_line 64 "latch: set not a number"         latch L set many
expect_one_line 64 "latch: set negative"             latch L set -1
expect_one_line 64 "latch: down 0"                   latch L down 0
expect_one_line 64 "latch: await bad -w"             latch L await -w soon
expect_one_line 64 "latch: -w with count"            latch L count -w 1s
expect_one_line 64 "latch: extra argument"           latch L count now
expect_one_line 64 "latch: name too long"            latch "$(head -c 1025 /dev/zero | tr '\0' a)" count
expect_one_line 64 "latch: RedLock"                  --url "redis://127.0.0.1:$PORT" --url "redis://127.0.0.1:$PORT/1" latch L count
expect_one_line 64 "run --limit: RedLock"            --url "redis://127.0.0.1:$PORT" --url "redis://127.0.0.1:$PORT/1" run --limit 2 n touch "$M"
check "no child was started" "[ ! -e '$M' ]"
check "nothing was written" "[ \"\$(rcli dbsize)\" = 0 ]"
for c in latch; do
    expect 0 "dlock $c --help" "$c" --help
    check "dlock $c --help prints Usage" "grep -q '^Usage: dlock $c' '$TMP/out'"
done

finish
