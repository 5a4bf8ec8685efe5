#!/bin/bash
# dlock run: signals are forwarded to the child, the lock is released only
# after the child exits, and a lost lock or --limit permit stops the child
# (exit 80).
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# A child that reports readiness, records the signals it gets, and exits
# with 10+N when it gets signal N (after waiting for $TMP/go-N if asked).
cat >"$TMP/child.sh" <<'EOF'
#!/bin/sh
dir=$1; hold=${2:-no}
on() {
    echo "$1" >>"$dir/got"
    if [ "$hold" = hold ]; then
        while [ ! -e "$dir/go" ]; do sleep 0.02; done
    fi
    exit $((10 + $1))
}
trap 'on 1' HUP
trap 'on 2' INT
trap 'on 15' TERM
echo $$ >"$dir/ready"
while :; do sleep 0.02; done
EOF
chmod +x "$TMP/child.sh"

reset_files() { rm -f "$TMP/ready" "$TMP/got" "$TMP/go" "$TMP/dlock.err"; }

# start_run ARGS...: dlock run ARGS in the background; sets DPID.
start_run() {
    reset_files
    "$DLOCK" run "$@" 2>"$TMP/dlock.err" &
    DPID=$!
    BG_PIDS+=("$DPID")
    if ! wait_until "[ -s '$TMP/ready' ]"; then
        fail "child did not start: $(cat "$TMP/dlock.err")"
    fi
}

# Forwarding: the child gets each signal and its status comes back.
for sig in TERM HUP INT; do
    # SIGINT is ignored in background jobs of a non-interactive shell: run
    # that one with job control on, as a terminal's Ctrl-C would reach it.
    [ $sig = INT ] && set -m
    start_run sig "$TMP/child.sh" "$TMP"
    [ $sig = INT ] && set +m
    num=$(kill -l $sig)
    kill -$sig "$DPID"
    wait "$DPID"
    rc=$?
    check "SIG$sig forwarded to the child (exit $rc)" \
        "[ \"\$(cat '$TMP/got' 2>/dev/null)\" = $num ] && [ $rc = $((10 + num)) ]"
    check "lock free after the child exited (SIG$sig)" "[ \"\$(rcli exists sig)\" = 0 ]"
done

# The lock stays held until the child has exited.
start_run sig "$TMP/child.sh" "$TMP" hold
kill -TERM "$DPID"
check "child got SIGTERM" "wait_until '[ -s \"$TMP/got\" ]'"
check "lock still held while the child finishes" "[ \"\$(rcli exists sig)\" = 1 ]"
check "dlock still running" "kill -0 $DPID"
touch "$TMP/go"
wait "$DPID"
rc=$?
check "exit status 25 after the delayed exit ($rc)" "[ $rc = 25 ]"
check "lock released after the child exited" "[ \"\$(rcli exists sig)\" = 0 ]"

# A child without a handler dies by the forwarded signal: 128+15.
reset_files
"$DLOCK" run sig sh -c "echo \$\$ > '$TMP/ready'; exec sleep 30" &
DPID=$!
BG_PIDS+=("$DPID")
wait_until "[ -s '$TMP/ready' ]"
kill -TERM "$DPID"
wait "$DPID"
rc=$?
check "child killed by the forwarded SIGTERM gives 143 ($rc)" "[ $rc = 143 ]"

# run_stopped LABEL WHAT FAULT...: start_run has begun; FAULT (a command)
# loses what it holds: dlock exits 80 within 5 s, the child got SIGTERM, and
# the message names WHAT.
run_stopped() {
    local label=$1 what=$2 start rc ms
    shift 2
    start=$(date +%s%N)
    "$@" >/dev/null
    wait "$DPID"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    check "$label: exit 80 ($rc, after $ms ms)" "[ $rc = 80 ] && [ $ms -lt 5000 ]"
    check "$label: child got SIGTERM" "[ \"\$(cat '$TMP/got' 2>/dev/null)\" = 15 ]"
    check "$label: clear message" "grep -q \"$what lost while the command ran\" '$TMP/dlock.err'"
}

# Lock lost (key deleted by another client): the child gets SIGTERM, dlock
# exits 80 with a message.
start_run --ttl 1s lost "$TMP/child.sh" "$TMP"
run_stopped "lock deleted" "lock 'lost'" rcli del lost

# Lock taken over by someone else: same, and the new owner's key survives.
start_run --ttl 1s lost "$TMP/child.sh" "$TMP"
rcli set lost intruder >/dev/null
wait "$DPID"
rc=$?
check "lock taken over: exit 80 ($rc)" "[ $rc = 80 ]"
check "lock taken over: the new owner's key is untouched" "[ \"\$(rcli get lost)\" = intruder ]"
rcli del lost >/dev/null

# A --limit permit lost (its lease entry gone, as after the server was
# unreachable for a lease): the same, through the lost-permit callback.
start_run --limit 2 --ttl 1s lostsem "$TMP/child.sh" "$TMP"
run_stopped "permit lost" "permit of 'lostsem'" rcli del '{lostsem}:timeout'

# A frozen server (SIGSTOP): the lease runs out unconfirmed; the child is
# stopped within about the lease, not after the server comes back.
start_run --ttl 1s --kill-after 300ms frozen "$TMP/child.sh" "$TMP"
kill -STOP "$REDIS_PID"
start=$(date +%s%N)
wait_until "! kill -0 $DPID 2>/dev/null" 80
ms=$((($(date +%s%N) - start) / 1000000))
kill -CONT "$REDIS_PID"
wait "$DPID"
rc=$?
check "frozen server: exit 80 within the lease ($rc, $ms ms)" "[ $rc = 80 ] && [ $ms -lt 4000 ]"
check "frozen server: child got SIGTERM" "[ \"\$(cat '$TMP/got' 2>/dev/null)\" = 15 ]"
rcli del frozen >/dev/null

# A child that ignores SIGTERM gets SIGKILL after --kill-after.
reset_files
"$DLOCK" run --ttl 1s --kill-after 300ms lost sh -c "trap '' TERM; echo \$\$ > '$TMP/ready'; while :; do sleep 0.02; done" 2>"$TMP/dlock.err" &
DPID=$!
BG_PIDS+=("$DPID")
wait_until "[ -s '$TMP/ready' ]"
child=$(cat "$TMP/ready")
rcli del lost >/dev/null
wait "$DPID"
rc=$?
check "stubborn child: exit 80 ($rc)" "[ $rc = 80 ]"
check "stubborn child was killed" "! kill -0 $child 2>/dev/null"

# If dlock itself is killed, nobody renews the lease: the child gets SIGTERM.
start_run pdeath "$TMP/child.sh" "$TMP"
kill -KILL "$DPID"
wait "$DPID" 2>/dev/null
check "child gets SIGTERM when dlock dies" "wait_until '[ \"\$(cat $TMP/got 2>/dev/null)\" = 15 ]'"

# A signal while waiting for the lock ends dlock; no child starts.
token=$("$DLOCK" acquire --ttl 30s waited)
rm -f "$TMP/marker"
"$DLOCK" run waited touch "$TMP/marker" &
DPID=$!
BG_PIDS+=("$DPID")
wait_until '[ "$(waiters waited)" -ge 1 ]'
kill -TERM "$DPID"
wait "$DPID"
rc=$?
check "SIGTERM while waiting: exit 143, no child ($rc)" "[ $rc = 143 ] && [ ! -e '$TMP/marker' ]"
check "the holder's lock is untouched" "[ \"\$(rcli get waited)\" = '$token' ]"
check "the waiter left the registry at once" "[ \"\$(rcli zcard 'dlock_waiters:{waited}')\" = 0 ]"

# The same with the fair lock: the wait is cancelled, so the waiter leaves
# the queue at once and the next waiter is not held up behind a dead entry.
"$DLOCK" run --kind fair -w 30s fairwait -- sleep 30 &
HOLDER=$!
BG_PIDS+=("$HOLDER")
wait_until '[ "$(rcli exists fairwait)" = 1 ]'
"$DLOCK" run --kind fair fairwait touch "$TMP/marker" &
DPID=$!
BG_PIDS+=("$DPID")
wait_until '[ "$(waiters fairwait)" -ge 1 ]'
kill -TERM "$DPID"
wait "$DPID"
rc=$?
check "SIGTERM while waiting (fair): exit 143, no child ($rc)" "[ $rc = 143 ] && [ ! -e '$TMP/marker' ]"
check "the fair waiter left the queue at once" "[ \"\$(rcli llen 'redisson_lock_queue:{fairwait}')\" = 0 ]"
kill -TERM "$HOLDER"
wait "$HOLDER" 2>/dev/null

finish
