#!/usr/bin/env python3
"""sigcount.py OUT: counts the SIGINTs it receives, each delivery: the C
handler writes one byte per signal to the wakeup fd (two signals are two
even when the Python handler runs once). Two signals merge in the kernel
when the second comes while the first is still pending: run it with a
real-time priority (chrt) so that it takes each one as it comes. Creates
OUT.ready when set up; after the first SIGINT it goes on counting for one
more second, writes the count to OUT and exits 0 (after 15 s without any:
2)."""
import os
import select
import signal
import sys

out = sys.argv[1]
r, w = os.pipe()
os.set_blocking(w, False)
signal.signal(signal.SIGINT, lambda *a: None)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)
open(out + ".ready", "w").close()
n = 0
timeout = 15.0
while True:
    ready, _, _ = select.select([r], [], [], timeout)
    if not ready:
        break
    n += sum(1 for b in os.read(r, 64) if b == signal.SIGINT)
    timeout = 1.0
with open(out, "w") as f:
    f.write("%d\n" % n)
sys.exit(0 if n else 2)
