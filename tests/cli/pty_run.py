#!/usr/bin/env python3
"""Runs a command on a new pseudo-terminal, as a session leader in its
foreground (as a terminal's shell runs a job), for the CLI tests:

    pty_run.py READYFILE INPUT TIMEOUT COMMAND [ARGS...]

waits for READYFILE to exist, writes INPUT to the terminal (Python escapes:
"\\x03" is ^C, "\\n" a newline), then waits for the command to exit, copying
what it writes on the terminal to stdout. Exits with the command's status
(128+N if killed by signal N), or 124 after TIMEOUT seconds (the command is
killed then)."""
import os
import pty
import select
import signal
import sys
import time


def main():
    ready, data, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    data = data.encode().decode("unicode_escape").encode("latin-1")
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(sys.argv[4], sys.argv[4:])
    deadline = time.monotonic() + timeout
    sent = False
    status = None
    while status is None:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            sys.exit(124)
        if not sent and os.path.exists(ready):
            os.write(fd, data)
            sent = True
        r, _, _ = select.select([fd], [], [], 0.02)
        if r:
            try:
                out = os.read(fd, 4096)
                sys.stdout.buffer.write(out)
                sys.stdout.flush()
            except OSError:
                pass
        p, st = os.waitpid(pid, os.WNOHANG)
        if p == pid:
            status = st
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


main()
