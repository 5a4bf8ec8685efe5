#!/usr/bin/python3
"""redis-py Lock worker for dlock_bench (bench/peers.c drives it).

Run with Debian's /usr/bin/python3 (python3-redis). Speaks a line protocol on
stdin/stdout, one reply line per command; times are CLOCK_MONOTONIC in ns
(time.clock_gettime_ns), the clock the C driver reads.

  (at start)            -> "hello redis-py <version>" or "skip <reason>"
  clock                 -> "clock <now_ns>"
  pairs <name> <ms>     -> uncontended acquire(blocking=False)+release pairs
                           for ms: "ok <n> <elapsed_ns> <pair_us> ..."
  hold <name> <cfg>     -> acquire without waiting (must succeed): "ok"
  release               -> "ok <t0_ns>", t0 read just before release()
  wait <name> <cfg>     -> "waiting" just before the blocking acquire(), then
                           "got <t1_ns> <cpu_ns>" (t1 just after it returned;
                           cpu_ns: this process's CPU time while it waited),
                           then releases
  contend <name> <counter> <cfg> <start_ns> <end_ns>
                        -> from start until end: blocking acquire, GET+SET
                           counter (+1), release; "ok <ops> <finish_ns> <wait_us> ..."
  quit

cfg: "default" (Lock's defaults: sleep=0.1) or a poll interval in seconds
("0.001"). Every lock has a lease (timeout=): 10 s for pairs, 30 s otherwise;
redis-py's default is no expiry at all, which no user of a distributed lock
should want.
"""
import os
import sys
import time

MONO = time.CLOCK_MONOTONIC


def now():
    return time.clock_gettime_ns(MONO)


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    host = sys.argv[sys.argv.index("--host") + 1] if "--host" in sys.argv else "127.0.0.1"
    try:
        import redis
    except Exception as e:  # noqa: BLE001 - any import problem is a skip
        out("skip redis-py not importable by %s: %s (apt-get install python3-redis)"
            % (sys.executable, e))
        return
    r = redis.Redis(host=host, port=port)
    try:
        r.ping()
    except Exception as e:  # noqa: BLE001
        out("skip cannot reach redis at %s:%d: %s" % (host, port, e))
        return
    out("hello redis-py %s" % redis.__version__)

    def make(name, cfg, lease):
        if cfg == "default":
            return r.lock(name, timeout=lease)
        return r.lock(name, timeout=lease, sleep=float(cfg))

    held = None
    for line in sys.stdin:
        a = line.split()
        if not a:
            continue
        cmd = a[0]
        if cmd == "quit":
            break
        elif cmd == "clock":
            out("clock %d" % now())
        elif cmd == "pairs":
            lk = make(a[1], "default", 10)
            end = now() + int(a[2]) * 1000000
            lats = []
            start = t = now()
            while t < end:
                if not lk.acquire(blocking=False):
                    out("err pairs: not acquired")
                    break
                lk.release()
                t2 = now()
                lats.append((t2 - t) // 1000)
                t = t2
            out("ok %d %d %s" % (len(lats), t - start, " ".join(map(str, lats))))
        elif cmd == "hold":
            held = make(a[1], a[2], 30)
            out("ok" if held.acquire(blocking=False) else "err hold: not acquired")
        elif cmd == "release":
            t0 = now()
            held.release()
            held = None
            out("ok %d" % t0)
        elif cmd == "wait":
            lk = make(a[1], a[2], 30)
            c0 = time.process_time_ns()
            out("waiting")
            lk.acquire()
            t1 = now()
            c1 = time.process_time_ns()
            lk.release()
            out("got %d %d" % (t1, c1 - c0))
        elif cmd == "contend":
            name, counter, cfg = a[1], a[2], a[3]
            start, end = int(a[4]), int(a[5])
            lk = make(name, cfg, 30)
            d = start - now()
            if d > 0:
                time.sleep(d / 1e9)
            ops, waits = 0, []
            t = now()
            while t < end:
                lk.acquire()
                t1 = now()
                waits.append((t1 - t) // 1000)
                v = r.get(counter)
                r.set(counter, int(v or 0) + 1)
                lk.release()
                ops += 1
                t = now()
            out("ok %d %d %s" % (ops, t, " ".join(map(str, waits))))
        else:
            out("err unknown command %s" % cmd)


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    except Exception as e:  # noqa: BLE001 - reported to the driver
        try:
            out("err %s: %s" % (type(e).__name__, e))
        except Exception:  # noqa: BLE001
            pass
        sys.exit(1)
    sys.stdout.close() if not sys.stdout.closed else None
    os._exit(0)
