#!/bin/bash
# Several --url values (RedLock over 3 private servers), --fence-url,
# --wait-replicas, the TLS options against a rediss:// server, and bad input
# for each of these options.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis
M=$TMP/marker

# ---- RedLock: --url A --url B --url C ---------------------------------------
NODES=()
URLS=()
for i in 1 2 3; do
    start_extra_redis
    NODES+=("$EXTRA_PORT")
    URLS+=(--url "redis://127.0.0.1:$EXTRA_PORT")
done
n1=${NODES[0]} n2=${NODES[1]} n3=${NODES[2]}

expect 0 "run with three --url" "${URLS[@]}" run rl \
    sh -c "for p in $n1 $n2 $n3; do redis-cli -p \$p exists rl; done | tr -d '\n'; echo \" \$DLOCK_FENCE\""
check "the key is on all three nodes while the command runs ($OUT)" "[[ '$OUT' =~ ^111\ [0-9]+$ ]]"
check "released on all three" "[ \"\$(redis-cli -p $n1 exists rl)\$(redis-cli -p $n2 exists rl)\$(redis-cli -p $n3 exists rl)\" = 000 ]"
check "nothing on the default server" "[ \"\$(rcli exists rl)\" = 0 ]"
expect 0 "run --kind reentrant with three --url" "${URLS[@]}" run --kind reentrant rl \
    sh -c "redis-cli -p $n2 type rl"
check "reentrant RedLock key is a hash" "[ '$OUT' = hash ]"
"$DLOCK" "${URLS[@]}" run rlbusy sh -c "touch '$TMP/rl-ready'; while [ ! -e '$TMP/rl-go' ]; do sleep 0.02; done" &
hp=$!
BG_PIDS+=("$hp")
wait_until "[ -e '$TMP/rl-ready' ]"
expect 1 "a second RedLock run is excluded" "${URLS[@]}" run -n rlbusy true
touch "$TMP/rl-go"
wait "$hp"
check "the first RedLock run exited 0" "[ $? = 0 ]"
expect 0 "status over RedLock" "${URLS[@]}" status rl

# --fence-url: the tokens come from one server's counter (the default one here).
expect 0 "--fence-url" "${URLS[@]}" --fence-url "redis://127.0.0.1:$PORT" run fenced \
    sh -c 'echo "$DLOCK_FENCE"'
f1=$OUT
expect 0 "--fence-url again" "${URLS[@]}" --fence-url "redis://127.0.0.1:$PORT" run fenced \
    sh -c 'echo "$DLOCK_FENCE"'
check "fence tokens from the fence server grow ($f1, $OUT)" "[ '$OUT' -gt '$f1' ] && [ \"\$(rcli get 'redisson_lock_token:{fenced}')\" = '$OUT' ]"

# A node down is fine; two of three down is "no quorum" (69, the library's message).
stop_pid "${EXTRA_PIDS[2]}"
expect 0 "one node of three down: still works" "${URLS[@]}" run rl true
stop_pid "${EXTRA_PIDS[1]}"
expect_one_line 69 "two nodes of three down: no quorum" "${URLS[@]}" run rl touch "$M"
check "the message says no quorum" "grep -q 'no quorum: 1 of 3 nodes answered' '$TMP/err'"

# ---- --wait-replicas ---------------------------------------------------------
t0=$(date +%s%N)
expect_one_line 75 "--wait-replicas 1 without a replica: 75" --wait-replicas 1 \
    --wait-replicas-timeout 200ms run wr touch "$M"
ms=$((($(date +%s%N) - t0) / 1000000))
check "the wait was bounded by --wait-replicas-timeout (${ms} ms)" "[ $ms -lt 2000 ]"
check "the message says replicas" "grep -q 'replicas' '$TMP/err'"
check "the lock was released" "[ \"\$(rcli exists wr)\" = 0 ]"
start_extra_redis --replicaof 127.0.0.1 "$PORT"
wait_until "rcli info replication | grep -q 'slave0:.*state=online'"
expect 0 "--wait-replicas 1 with a replica" --wait-replicas 1 run wr \
    sh -c "redis-cli -p $EXTRA_PORT exists wr"
check "the replica had the lock while the command ran" "[ '$OUT' = 1 ]"

# ---- TLS ---------------------------------------------------------------------
if command -v openssl >/dev/null 2>&1; then
    T=$TMP/tls
    mkdir -p "$T"
    (
        cd "$T" || exit 1
        for ca in ca other; do
            openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -noenc -days 2 \
                -subj "/CN=$ca" -keyout $ca.key -out $ca.crt || exit 1
        done
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext
        for n in server client; do
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -noenc \
                -subj /CN=localhost -keyout $n.key -out $n.csr &&
                openssl x509 -req -days 2 -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                    -extfile san.ext -out $n.crt || exit 1
        done
    ) >"$TMP/openssl.log" 2>&1
    TPORT=$(free_port)
    redis-server --port 0 --tls-port "$TPORT" --bind 127.0.0.1 --dir "$T" --save '' \
        --tls-cert-file "$T/server.crt" --tls-key-file "$T/server.key" \
        --tls-ca-cert-file "$T/ca.crt" --logfile "$T/redis.log" &
    EXTRA_PIDS+=($!)
    TLSOPTS=(--url "rediss://127.0.0.1:$TPORT" --tls-cert "$T/client.crt" --tls-key "$T/client.key")
    wait_until "'$DLOCK' ${TLSOPTS[*]} --tls-ca-file '$T/ca.crt' status x" 50
    expect 0 "run over rediss:// with --tls-ca-file and a client certificate" \
        "${TLSOPTS[@]}" --tls-ca-file "$T/ca.crt" run tl sh -c 'echo "$DLOCK_FENCE"'
    # a fresh counter's first token is the server's clock in microseconds
    check "the child ran under the lock ($OUT)" "[ '$OUT' -ge 1000000000000000 ]"
    expect 0 "--tls-ca-dir" "${TLSOPTS[@]}" --tls-ca-dir "$T" --tls-ca-file "$T/ca.crt" status tl
    expect 0 "--tls-server-name localhost" "${TLSOPTS[@]}" --tls-ca-file "$T/ca.crt" \
        --tls-server-name localhost status tl
    expect_one_line 76 "--tls-server-name the certificate does not carry: 76" "${TLSOPTS[@]}" \
        --tls-ca-file "$T/ca.crt" --tls-server-name db.example.net run tl touch "$M"
    expect_one_line 76 "a CA that did not sign the server: 76" "${TLSOPTS[@]}" \
        --tls-ca-file "$T/other.crt" run tl touch "$M"
    check "the message says why" "grep -q 'certificate verify failed' '$TMP/err'"
    expect 0 "--tls-insecure skips the verification" "${TLSOPTS[@]}" \
        --tls-ca-file "$T/other.crt" --tls-insecure run tl true
    expect_one_line 66 "--tls-ca-file that cannot be read: 66" "${TLSOPTS[@]}" \
        --tls-ca-file "$T/nope.crt" run tl touch "$M"
    expect_one_line 66 "--tls-key that cannot be read: 66" --url "rediss://127.0.0.1:$TPORT" \
        --tls-cert "$T/client.crt" --tls-key "$T/nope.key" run tl touch "$M"
else
    skip_part "TLS (no openssl)"
fi

# ---- bad input -----------------------------------------------------------------
A=redis://127.0.0.1:$PORT
expect_one_line 64 "--url: a unix:// URL among several"  --url "$A" --url unix:///tmp/x.sock run n touch "$M"
expect_one_line 64 "--url: rediss:// among several"      --url "$A" --url rediss://127.0.0.1:1 run n touch "$M"
expect_one_line 64 "--url: a ',' in a node"               --url "$A" --url redis://a,b:1 run n touch "$M"
expect_one_line 64 "--url: a node without a host"         --url "$A" --url redis:// run n touch "$M"
expect_one_line 64 "--url: a node with a query"           --url "$A" --url "redis://h:1?db=2" run n touch "$M"
expect_one_line 64 "--url: a bad port in a node"          --url "$A" --url redis://127.0.0.1:99999 run n touch "$M"
expect_one_line 64 "--url: empty"                         --url "" run n touch "$M"
expect_one_line 64 "--fence-url: empty"                   --fence-url "" run n touch "$M"
expect_one_line 64 "--fence-url: not a redis URL"         --url "$A" --url "$A/1" --fence-url http://x run n touch "$M"
expect_one_line 64 "--fence-url without RedLock"          --fence-url "$A" run n touch "$M"
expect_one_line 64 "--fence-url: bad port"                --url "$A" --url "$A/1" --fence-url redis://127.0.0.1:99999 run n touch "$M"
expect_one_line 64 "--wait-replicas: negative"            --wait-replicas -1 run n touch "$M"
expect_one_line 64 "--wait-replicas: not a number"        --wait-replicas some run n touch "$M"
expect_one_line 64 "--wait-replicas with RedLock"         --url "$A" --url "$A/1" --wait-replicas 1 run n touch "$M"
expect_one_line 64 "--wait-replicas-timeout: zero"        --wait-replicas 1 --wait-replicas-timeout 0 run n touch "$M"
expect_one_line 64 "--wait-replicas-timeout: bad"         --wait-replicas 1 --wait-replicas-timeout x run n touch "$M"
expect_one_line 64 "--wait-replicas-timeout alone"        --wait-replicas-timeout 1s run n touch "$M"
expect_one_line 64 "--tls-ca-file: empty"                 --url rediss://127.0.0.1:1 --tls-ca-file "" run n touch "$M"
expect_one_line 64 "--tls-ca-dir: empty"                  --url rediss://127.0.0.1:1 --tls-ca-dir "" run n touch "$M"
expect_one_line 64 "--tls-cert without --tls-key"         --url rediss://127.0.0.1:1 --tls-cert /etc/hostname run n touch "$M"
expect_one_line 64 "--tls-key without --tls-cert"         --url rediss://127.0.0.1:1 --tls-key /etc/hostname run n touch "$M"
expect_one_line 64 "--tls-server-name: empty"             --url rediss://127.0.0.1:1 --tls-server-name "" run n touch "$M"
expect_one_line 64 "--tls-insecure takes no argument"     --url rediss://127.0.0.1:1 --tls-insecure=yes run n touch "$M"
expect_one_line 64 "--tls-* with a redis:// URL"          --url "$A" --tls-insecure run n touch "$M"
expect_one_line 64 "--tls-* with RedLock"                 --url "$A" --url "$A/1" --tls-insecure run n touch "$M"
expect_one_line 64 "--tls-* with the default URL"         --tls-server-name x run n touch "$M"
check "no child was started" "[ ! -e '$M' ]"
check "nothing left locked" "[ \"\$(rcli exists n)\" = 0 ]"

finish
