#!/usr/bin/env python3
"""pty_stop.py READYFILE TIMEOUT COMMAND [ARGS...]: as pty_run.py, for ^Z.
Runs COMMAND on a new pseudo-terminal as a session leader in its
foreground; once READYFILE exists it types ^Z and waits for COMMAND to stop
(printing "stopped"), then continues it as a shell's fg does (SIGCONT; the
terminal's foreground is whatever COMMAND left it) and types "hello" and a
newline. Exits with COMMAND's status, 124 on timeout, 125 if it did not
stop."""
import os
import pty
import select
import signal
import sys
import time


def main():
    ready, timeout = sys.argv[1], float(sys.argv[2])
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(sys.argv[3], sys.argv[3:])
    deadline = time.monotonic() + timeout
    state = "wait-ready"
    while True:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            sys.exit(124 if state != "wait-stop" else 125)
        if state == "wait-ready" and os.path.exists(ready):
            os.write(fd, b"\x1a")
            state = "wait-stop"
        r, _, _ = select.select([fd], [], [], 0.02)
        if r:
            try:
                sys.stdout.buffer.write(os.read(fd, 4096))
                sys.stdout.flush()
            except OSError:
                pass
        p, st = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if p != pid:
            continue
        if os.WIFSTOPPED(st):
            if state == "wait-stop":
                print("stopped")
                sys.stdout.flush()
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.2)
                os.write(fd, b"hello\n")
                state = "continued"
            continue
        if os.WIFSIGNALED(st):
            sys.exit(128 + os.WTERMSIG(st))
        sys.exit(os.WEXITSTATUS(st) if state == "continued" else 125)


main()
