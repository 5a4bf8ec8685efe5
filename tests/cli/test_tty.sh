#!/bin/bash
# dlock run on a terminal (a pseudo-terminal, as CI has no tty): the command
# gets the terminal's foreground, so one ^C reaches it exactly once, and it
# can read the terminal.
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
. "$here/lib.sh" "$@" || exit 1
start_redis

# The counter runs with a real-time priority, so that it takes each SIGINT
# as it comes (a second one sent while the first is pending would merge).
RT=()
if chrt -f 10 true 2>/dev/null; then
    RT=(chrt -f 10)
else
    skip_part "no real-time priority (chrt -f): a double SIGINT may merge into one"
fi

# One ^C: exactly one SIGINT (the terminal's; dlock forwards nothing then).
"$PY" "$here/pty_run.py" "$TMP/count.ready" '\x03' 20 \
    "$DLOCK" run ttylock "${RT[@]}" "$PY" "$here/sigcount.py" "$TMP/count" >"$TMP/pty.out" 2>&1
rc=$?
check "one ^C: the command exits normally (exit $rc)" "[ $rc = 0 ]"
check "one ^C: the command got exactly one SIGINT ($(cat "$TMP/count" 2>/dev/null))" \
    "[ \"\$(cat '$TMP/count' 2>/dev/null)\" = 1 ]"
check "one ^C: the lock is released" "[ \"\$(rcli exists ttylock)\" = 0 ]"

# An interactive command reads a line from the terminal (no SIGTTIN): it
# runs in its own process group, to which dlock gave the foreground.
"$PY" "$here/pty_run.py" "$TMP/read.ready" 'hello\n' 20 \
    "$DLOCK" run ttylock -c "touch '$TMP/read.ready'; read line; echo \"got:\$line\" >'$TMP/read'" \
    >"$TMP/pty.out" 2>&1
rc=$?
check "interactive read: exit $rc" "[ $rc = 0 ]"
check "interactive read: the command read the line ($(cat "$TMP/read" 2>/dev/null))" \
    "[ \"\$(cat '$TMP/read' 2>/dev/null)\" = got:hello ]"

# The same through a pipeline of the shell string: the ^C reaches each
# process of the group once.
"$PY" "$here/pty_run.py" "$TMP/pipe.ready" '\x03' 20 \
    "$DLOCK" run ttylock -c "${RT[*]} $PY '$here/sigcount.py' '$TMP/pipe' | cat" >"$TMP/pty.out" 2>&1
rc=$?
check "one ^C, pipeline: exit 130, cat killed by the ^C ($rc)" "[ $rc = 130 ]"
check "one ^C, pipeline: the counter got exactly one SIGINT ($(cat "$TMP/pipe" 2>/dev/null))" \
    "[ \"\$(cat '$TMP/pipe' 2>/dev/null)\" = 1 ]"

# ^Z: the command stops, then dlock too (its shell would get the terminal
# back); continued (fg), dlock gives the terminal to the command again and
# continues it, and the command reads the line typed then.
"$PY" "$here/pty_stop.py" "$TMP/stop.ready" 20 \
    "$DLOCK" run ttylock -c "touch '$TMP/stop.ready'; read line; echo \"got:\$line\" >'$TMP/stop'" \
    >"$TMP/pty.out" 2>&1
rc=$?
check "^Z: dlock stopped with the command, and went on after fg (exit $rc)" \
    "[ $rc = 0 ] && grep -q 'stopped' '$TMP/pty.out'"
check "^Z: after fg the command read the line ($(cat "$TMP/stop" 2>/dev/null))" \
    "[ \"\$(cat '$TMP/stop' 2>/dev/null)\" = got:hello ]"

finish
