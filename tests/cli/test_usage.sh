#!/bin/bash
# Bad input: one clear line on stderr, the right exit code, nothing locked, no
# child started. Also help, version and authentication.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

M=$TMP/marker            # a child that runs would create it
LONG=$(head -c 1025 /dev/zero | tr '\0' n)
MAX=$(head -c 1024 /dev/zero | tr '\0' n)
printf '' >"$TMP/empty-password"

expect_one_line 64 "no command"                        
expect_one_line 64 "unknown command"                   bogus
expect_one_line 64 "unknown global option"             --bogus run n touch "$M"
expect_one_line 64 "run: missing NAME"                 run
expect_one_line 64 "run: missing COMMAND"              run n
expect_one_line 64 "run: unknown option"               run --bogus n touch "$M"
expect_one_line 64 "run: unknown short option"         run -Z n touch "$M"
expect_one_line 64 "run: --wait needs an argument"     run --wait
expect_one_line 64 "run: bad --wait duration"          run -w abc n touch "$M"
expect_one_line 64 "run: zero --ttl"                   run --ttl 0 n touch "$M"
expect_one_line 64 "run: negative --ttl"               run --ttl -5s n touch "$M"
expect_one_line 64 "run: bad --ttl unit"               run --ttl 5x n touch "$M"
expect_one_line 64 "run: bad --kill-after"             run --kill-after soon n touch "$M"
expect_one_line 64 "run: -E out of range"              run -E 300 n touch "$M"
expect_one_line 64 "run: -E not a number"              run -E x n touch "$M"
expect_one_line 64 "run: unknown --kind"               run --kind fair2 n touch "$M"
expect_one_line 64 "run: name over DLOCK_NAME_MAX"     run "$LONG" touch "$M"
expect_one_line 64 "run: empty name"                   run "" touch "$M"
expect_one_line 64 "run: -c without its string"        run n -c
expect_one_line 64 "run: -c with extra arguments"      run n -c "touch $M" extra
expect_one_line 64 "run: -c option and a COMMAND"      run -c "touch $M" n touch "$M"
expect_one_line 64 "run: bad --timeout"                --timeout 0 run n touch "$M"
expect_one_line 64 "run: bad URL scheme"               --url foo://127.0.0.1 run n touch "$M"
expect_one_line 64 "run: bad URL port"                 --url redis://127.0.0.1:99999 run n touch "$M"
expect_one_line 69 "run: unreachable server"           --url redis://127.0.0.1:1 run n touch "$M"
expect_one_line 66 "run: missing password file"        --password-file "$TMP/nope" run n touch "$M"
expect_one_line 66 "run: empty password file"          --password-file "$TMP/empty-password" run n touch "$M"
expect_one_line 64 "acquire: missing NAME"             acquire
expect_one_line 64 "acquire: --kind reentrant"         acquire --kind reentrant n
expect_one_line 64 "acquire: zero --ttl"               acquire --ttl 0ms n
expect_one_line 64 "acquire: extra argument"           acquire n m
expect_one_line 64 "acquire: name over DLOCK_NAME_MAX" acquire "$LONG"
expect_one_line 64 "release: missing TOKEN"            release n
expect_one_line 64 "release: --ttl is not an option"   release n t --ttl 1s
expect_one_line 64 "extend: missing --ttl"             extend n t
expect_one_line 64 "extend: negative --ttl"            extend n t --ttl -1
expect_one_line 64 "status: missing NAME"              status
expect_one_line 64 "status: name over DLOCK_NAME_MAX"  status "$LONG"
expect_one_line 64 "list: two patterns"                list a b
expect_one_line 64 "force-unlock: missing NAME"        force-unlock
expect_one_line 64 "doctor: extra argument"            doctor now
expect_one_line 64 "doctor: zero --ttl"                doctor --ttl 0
expect_one_line 64 "id: missing subcommand"            id
expect_one_line 64 "id: unknown subcommand"            id last
expect_one_line 64 "id: -n 0"                          id next -n 0
expect_one_line 64 "help: unknown command"             help nosuch
expect_one_line 64 "version: extra argument"           version now

# ---- bad-input table (docs/safety.md, issue 8): CLI rows not covered above ----
expect_one_line 64 "table: --url unix:// without a path"          --url unix:// status n
expect_one_line 64 "table: --url rediss:// with an empty host"    --url rediss://:6380 status n
expect_one_line 64 "table: --url redlock:// with an empty node"   --url redlock://a:1,,b:2 status n
expect_one_line 64 "table: --url redis-sentinel:// without master" --url redis-sentinel://127.0.0.1:1 status n
expect_one_line 64 "table: --url redis-cluster:// without a seed" --url redis-cluster:// status n
expect_one_line 64 "table: several --url, one not redis://"       --url redis://127.0.0.1:1 --url unix:///x status n
expect_one_line 64 "table: --fence-url without RedLock"           --fence-url "$DLOCK_URL" status n
expect_one_line 64 "table: --wait-replicas with RedLock"          --url redis://127.0.0.1:1 --url redis://127.0.0.1:2 --url redis://127.0.0.1:3 --wait-replicas 1 status n
expect_one_line 64 "table: --wait-replicas not a number"          --wait-replicas x status n
expect_one_line 64 "table: --wait-replicas-timeout alone"         --wait-replicas-timeout 1s status n
expect_one_line 64 "table: --tls-cert without --tls-key"          --url rediss://127.0.0.1:1 --tls-cert "$TMP/empty-password" status n
expect_one_line 66 "table: --tls-ca-file that does not exist"     --url rediss://127.0.0.1:1 --tls-ca-file "$TMP/nope.pem" status n
expect_one_line 64 "table: --tls-* with a redis:// URL"           --tls-insecure status n
expect_one_line 64 "table: option given an argument it takes none" --json=yes status n
expect_one_line 64 "table: release with an empty token"           release n ""
expect_one_line 81 "table: release with a token never issued"     release n 0123456789abcdef0123456789abcdef
expect_one_line 64 "table: run --limit 0"                         run --limit 0 n touch "$M"
expect_one_line 64 "table: id next -n over the limit"             id next -n 99999999999
expect_one_line 64 "table: latch set not a number"                latch n set x
expect_one_line 64 "table: latch await bad --wait"                latch n await -w soon
expect_one_line 64 "table: latch set with -w"                     latch n set 3 -w 1s
# ---- end bad-input table ----

check "no child was started" "[ ! -e '$M' ]"
check "nothing was locked" "[ \"\$(rcli dbsize)\" = 0 ]"

# The longest name is fine.
expect 0 "run: name of exactly DLOCK_NAME_MAX bytes" run "$MAX" true

# Help and version.
expect 0 "dlock --help" --help
check "overview lists the commands" "grep -q 'force-unlock' '$TMP/out'"
expect 0 "dlock help" help
expect 0 "dlock help run" help run
check "help run shows its usage" "grep -q '^Usage: dlock run' '$TMP/out'"
expect 0 "dlock help status" help status
check "help status points to the global options in one line, not the list" "[ \$(grep -c -- '--url' '$TMP/out') = 1 ] && ! grep -q -- '--tls-ca-file' '$TMP/out' && grep -q \"dlock help'\" '$TMP/out'"
expect 0 "dlock help (the overview) lists the global options" help
check "the overview has the global options" "grep -q -- '--tls-ca-file' '$TMP/out'"
for c in run acquire release extend status list force-unlock doctor id version help; do
    expect 0 "dlock $c --help" "$c" --help
    check "dlock $c --help prints Usage" "grep -q '^Usage: dlock $c' '$TMP/out'"
done
expect 0 "dlock version" version
check "version names the tool and library" "grep -Eq '^dlock [0-9]+\.[0-9]+\.[0-9]+ \(library ' '$TMP/out'"
expect 0 "dlock --version" --version
expect 0 "dlock version --json" version --json
json_check "version --json parses" 'd["version"].count(".") == 2 and "library" in d' "$TMP/out"

# Authentication: the server now wants a password.
rcli config set requirepass s3cret >/dev/null
printf 's3cret\n' >"$TMP/password"
printf 'wrong\n' >"$TMP/wrong-password"
expect_one_line 77 "no password: refused"              status n
expect_one_line 77 "wrong password file: refused"      --password-file "$TMP/wrong-password" status n
expect 0 "right password file"                         --password-file "$TMP/password" status n
DLOCK_PASSWORD=s3cret expect 0 "DLOCK_PASSWORD"        status n
expect_one_line 77 "run: wrong password, no child"     --password-file "$TMP/wrong-password" run n touch "$M"
check "no child was started (auth)" "[ ! -e '$M' ]"
check "the password is not in any message" "! grep -rq s3cret '$TMP/err'"
redis-cli -p "$PORT" -a s3cret --no-auth-warning config set requirepass "" >/dev/null

finish
