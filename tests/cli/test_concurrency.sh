#!/bin/bash
# 8 concurrent `dlock run` loops do a non-atomic read-increment-write through
# redis-cli (GET, then SET) 25 times each on the key "counter" under the lock
# "inc": the final value must be exact. The fencing counter starts far ahead
# of the server's clock (8e15 us: the year 2223), where a token is the
# counter + 1, so that it can be checked exactly too.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

WORKERS=8
ROUNDS=25
rcli set counter 0 >/dev/null
FLOOR=8000000000000000
rcli set 'redisson_lock_token:{inc}' $FLOOR >/dev/null

worker() {
    local i rc
    for ((i = 0; i < ROUNDS; i++)); do
        "$DLOCK" run -w 30s inc sh -c \
            'v=$(redis-cli -p "$1" get counter); redis-cli -p "$1" set counter $((v + 1)) >/dev/null' \
            sh "$PORT"
        rc=$?
        if [ $rc != 0 ]; then
            echo "worker $1 round $i: exit $rc" >>"$TMP/errors"
        fi
    done
}

start=$(date +%s%N)
pids=()
for ((w = 0; w < WORKERS; w++)); do
    worker $w &
    pids+=($!)
    BG_PIDS+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
ms=$((($(date +%s%N) - start) / 1000000))

final=$(rcli get counter)
check "no run failed" "[ ! -e '$TMP/errors' ] || { cat '$TMP/errors'; false; }"
check "counter is exactly $((WORKERS * ROUNDS)) (got $final, $ms ms)" "[ '$final' = $((WORKERS * ROUNDS)) ]"
check "lock released at the end" "[ \"\$(rcli exists inc)\" = 0 ]"
check "fencing counter counted every run" "[ \"\$(rcli get 'redisson_lock_token:{inc}')\" = $((FLOOR + WORKERS * ROUNDS)) ]"

finish
