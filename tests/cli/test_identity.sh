#!/bin/bash
# Holder identity: `run` and `acquire` record who holds the lock (host, pid,
# command, since, --label) in dlock_holder:{NAME}:<owner>; `status`, `list`
# and their --json show it; release, the end of a run and extend keep the
# record in step with the hold; a malformed record is shown, never fatal; a
# RedLock client records none and still works.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

HOST=$("$PY" -c 'import socket; print(socket.gethostname())')
now_ms() { "$PY" -c 'import time; print(int(time.time() * 1000))'; }
holder_keys() { rcli --scan --pattern "dlock_holder:{$1}:*" | wc -l; }

# ---- run --label: the record of a running command ----------------------------
before=$(now_ms)
"$DLOCK" run --label "nightly backup" idlock sleep 300 &
dpid=$!
BG_PIDS+=("$dpid")
wait_until "[ \"\$(rcli exists idlock)\" = 1 ]"
after=$(now_ms)

expect 0 "status of a lock held by dlock run" status idlock
check "status shows the host" "grep -qx 'host: *$HOST' '$TMP/out'"
check "status shows dlock's pid (the process that holds the lock)" "grep -qx 'pid: *$dpid' '$TMP/out'"
check "status shows the command run, not dlock's command line" "grep -qx 'command: *sleep 300' '$TMP/out'"
check "status shows the label" "grep -qx 'label: *nightly backup' '$TMP/out'"
check "status shows since as UTC time and age" \
    "grep -Eqx 'since: +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z \([0-9]+ s ago\)' '$TMP/out'"
expect 0 "status --json of a lock held by dlock run" status --json idlock
json_check "status --json: identity" "d['identity'] == {'host': '$HOST', 'pid': $dpid, 'command': 'sleep 300', 'since_ms': d['identity']['since_ms'], 'label': 'nightly backup'} and $before - 1000 <= d['identity']['since_ms'] <= $after + 1000" "$TMP/out"
expect 0 "list with a lock held by dlock run" list 'id*'
check "list: one line with host:pid, label and command" \
    "grep -Eqx 'idlock +plain .* by $HOST:$dpid \[nightly backup\] sleep 300' '$TMP/out' && [ \$(grep -c . '$TMP/out') = 2 ]"
expect 0 "list --json with a lock held by dlock run" list --json 'id*'
json_check "list --json: identity" "[x['identity']['pid'] for x in d] == [$dpid] and d[0]['identity']['command'] == 'sleep 300' and d[0]['identity']['host'] == '$HOST'" "$TMP/out"
check "one record in dlock_holder:{idlock}:<token>" \
    "[ \"\$(rcli --scan --pattern 'dlock_holder:{idlock}:*')\" = \"dlock_holder:{idlock}:\$(rcli get idlock)\" ]"
check "the record expires with the hold" "[ \"\$(rcli pttl \"dlock_holder:{idlock}:\$(rcli get idlock)\")\" -gt 0 ]"

stop_pid "$dpid"
expect 0 "status after the run ended" status --json idlock
json_check "no identity once the run ended" "d['held'] is False and d['identity'] is None" "$TMP/out"
check "the record is deleted with the release" "[ \"\$(holder_keys idlock)\" = 0 ]"
expect 0 "status text after the run ended" status idlock
check "status text shows no host once free" "! grep -q '^host:' '$TMP/out'"

# -c: the shell string is the command recorded; no --label: none shown.
"$DLOCK" run idshell -c 'sleep 300; true' &
spid=$!
BG_PIDS+=("$spid")
wait_until "[ \"\$(rcli exists idshell)\" = 1 ]"
expect 0 "status --json of a run -c" status --json idshell
json_check "run -c records the shell string, no label" "d['identity']['command'] == 'sleep 300; true' and d['identity']['label'] is None and d['identity']['pid'] == $spid" "$TMP/out"
expect 0 "status text of a run without --label" status idshell
check "no label line without --label" "! grep -q '^label:' '$TMP/out'"
stop_pid "$spid"

# reentrant (a HASH field <uuid>:<thread> names the holder)
"$DLOCK" run --kind reentrant --label re idre sleep 300 &
rpid=$!
BG_PIDS+=("$rpid")
wait_until "[ \"\$(rcli exists idre)\" = 1 ]"
expect 0 "status --json of a reentrant lock" status --json idre
json_check "reentrant lock: identity" "d['kind'] == 'reentrant' and d['identity']['pid'] == $rpid and d['identity']['label'] == 're'" "$TMP/out"
stop_pid "$rpid"

# ---- acquire / extend / release ---------------------------------------------
tok=$("$DLOCK" acquire --ttl 3s --label "by token" idtok)
check "acquire printed a token" "[ -n '$tok' ]"
expect 0 "status --json of a token lock" status --json idtok
json_check "acquire records the dlock command line and the label" "d['identity']['host'] == '$HOST' and 'acquire' in d['identity']['command'] and d['identity']['label'] == 'by token' and d['identity']['pid'] > 0" "$TMP/out"
expect 0 "extend the token lock" extend idtok "$tok" --ttl 10m
check "extend renews the record with the lease" "[ \"\$(rcli pttl \"dlock_holder:{idtok}:$tok\")\" -gt 60000 ]"
expect 0 "release the token lock" release idtok "$tok"
check "release deletes the record" "[ \"\$(holder_keys idtok)\" = 0 ]"
expect 0 "status after release" status --json idtok
json_check "no identity after release" "d['identity'] is None" "$TMP/out"

# ---- --label checks -----------------------------------------------------------
expect_one_line 64 "a label with a tab is refused" acquire --label "$(printf 'a\tb')" idbad
expect_one_line 64 "a label with a newline is refused" run --label "$(printf 'a\nb')" idbad true
expect_one_line 64 "a label over 255 bytes is refused" run --label "$(printf '%0256d' 0)" idbad true
check "nothing was taken" "[ \"\$(rcli exists idbad)\" = 0 ]"
long=$(printf 'x%.0s' $(seq 255))
tok=$("$DLOCK" acquire --label "$long" idlong)
expect 0 "status --json with a 255-byte label" status --json idlong
json_check "the 255-byte label is kept whole" "d['identity']['label'] == '$long'" "$TMP/out"
"$DLOCK" release idlong "$tok"

# ---- records this version does not write: shown, never fatal ------------------
tok=$("$DLOCK" acquire --ttl 1m idodd)
key="dlock_holder:{idodd}:$tok"
rcli set "$key" "$(printf 'h1\t42\t1700000000000\tlab\tcmd a\tLATER\tFIELDS')" >/dev/null
expect 0 "status --json of a record with more fields" status --json idodd
json_check "fields after the command are ignored" "d['identity'] == {'host': 'h1', 'pid': 42, 'command': 'cmd a', 'since_ms': 1700000000000, 'label': 'lab'}" "$TMP/out"
expect 0 "status of a record with more fields" status idodd
check "since of an old record" "grep -Eqx 'since: +2023-11-14T22:13:20Z \([0-9]+ d [0-9]+ h ago\)' '$TMP/out'"
rcli set "$key" "$(printf 'h2\tnot-a-pid')" >/dev/null
expect 0 "status --json of a short record with a bad pid" status --json idodd
json_check "short record: what parses, nulls, and the raw record" "d['identity']['host'] == 'h2' and d['identity']['pid'] is None and d['identity']['since_ms'] is None and d['identity']['command'] is None and d['identity']['raw'] == 'h2\tnot-a-pid'" "$TMP/out"
expect 0 "status of a short record with a bad pid" status idodd
check "status shows it raw, and no pid" "grep -Fqx 'record:     h2\\x09not-a-pid  (not the host, pid, since, label, command this version reads)' '$TMP/out' && ! grep -q '^pid:' '$TMP/out'"
expect 0 "list of a short record with a bad pid" list 'idodd'
check "list shows host:? for it" "grep -Eq '^idodd +plain .* by h2:\?$' '$TMP/out'"
rcli set "$key" "$(printf '\x01\t99999999999999999999\t-5\t\t')" >/dev/null
expect 0 "status --json of a garbage record" status --json idodd
json_check "garbage record: numbers null, JSON valid" "d['identity']['pid'] is None and d['identity']['since_ms'] is None and d['identity']['label'] is None and d['identity']['host'] == '\x01'" "$TMP/out"
expect 0 "list --json of a garbage record" list --json idodd
json_check "list --json of a garbage record" "d[0]['identity']['raw'].startswith('\x01')" "$TMP/out"
rcli del "$key" >/dev/null
expect 0 "status of a lock without a record" status --json idodd
json_check "a holder that recorded none: identity null" "d['held'] is True and d['identity'] is None" "$TMP/out"
"$DLOCK" release idodd "$tok"

# a lock taken by another client (redis-py's layout): no record, no identity
rcli set idpeer 0123456789abcdef0123456789abcdef >/dev/null
expect 0 "list with a peer's lock" list idpeer
check "a peer's lock is listed without 'by'" "grep -Eq '^idpeer +plain ' '$TMP/out' && ! grep -q ' by ' '$TMP/out'"

# a record the user may not read (ACL): a warning, and the lock without it
tok=$("$DLOCK" acquire --ttl 1m idacl)
if rcli acl setuser viewer on '>pw' resetkeys '~idacl' '~redisson_*' '~dlock_waiters*' \
        allchannels +@all 2>/dev/null | grep -q OK; then
    expect 0 "status --json of a record the ACL denies" \
        --url "redis://viewer:pw@127.0.0.1:$PORT" status --json idacl
    json_check "denied record: the lock, identity null" "d['held'] is True and d['holder'] == '$tok' and d['identity'] is None" "$TMP/out"
    check "denied record: one warning on stderr" \
        "[ \$(wc -l <'$TMP/err') = 1 ] && grep -q 'warning: cannot read the holder.s identity.*NOPERM' '$TMP/err'"
else
    skip_part "this redis-server has no ACL SETUSER key patterns"
fi
"$DLOCK" release idacl "$tok"

# ---- RedLock: no identity, no error -------------------------------------------
RL=(--url "redis://127.0.0.1:$PORT")
start_extra_redis
RL+=(--url "redis://127.0.0.1:$EXTRA_PORT")
start_extra_redis
RL+=(--url "redis://127.0.0.1:$EXTRA_PORT")
expect 0 "run --label over RedLock" "${RL[@]}" run --label rl idrl sh -c 'redis-cli -p '"$PORT"' --scan --pattern "dlock_holder:{idrl}:*" | wc -l'
check "RedLock: no record, no message ($OUT, $ERR)" "[ '$OUT' = 0 ] && [ -z '$ERR' ]"
tok=$("$DLOCK" "${RL[@]}" acquire idrl2 2>"$TMP/rlerr")
check "acquire over RedLock works, silently" "[ -n '$tok' ] && [ ! -s '$TMP/rlerr' ]"
expect 0 "status --json over RedLock" "${RL[@]}" status --json idrl2
json_check "RedLock: identity null" "d['held'] is True and d['identity'] is None" "$TMP/out"
check "status over RedLock says nothing on stderr" "[ -z '$ERR' ]"
expect 0 "release over RedLock" "${RL[@]}" release idrl2 "$tok"

finish
