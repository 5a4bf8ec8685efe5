#!/usr/bin/python3
"""kazoo's Lock (ZooKeeper) or python-etcd3's Lock (etcd) as a worker of
dlock_bench's backends scenario (bench/backends.c drives it).

    coord_worker.py kazoo|etcd3 --server HOST:PORT --redis-host H --redis-port P

Run with Debian's /usr/bin/python3 (python3-kazoo, python3-etcd3; the
contention counter through python3-redis). Speaks the line protocol of
redispy_worker.py, one reply line per command; times are CLOCK_MONOTONIC in
ns (time.clock_gettime_ns), the clock the C driver reads.

  (at start)            -> "hello <peer> <version>" or "skip <reason>"
  clock                 -> "clock <now_ns>"
  pairs <name> <ms>     -> uncontended acquire (not waiting) + release pairs
                           for ms, one Lock object: "ok <n> <elapsed_ns> <pair_us> ..."
  hold <name>           -> acquire without waiting (must succeed): "ok"
  release               -> "ok <t0_ns>", t0 read just before release()
  wait <name>           -> "waiting" just before the blocking acquire(), then
                           "got <t1_ns> <cpu_ns>" (t1 just after it returned),
                           then releases
  contend <name> <counter> <start_ns> <end_ns>
                        -> from start until end: blocking acquire, GET+SET of
                           the Redis key counter (+1), release;
                           "ok <ops> <finish_ns> <wait_us> ..."
  quit

Each peer at its defaults but for the lease: python-etcd3's Lock takes a
lease per acquire (ttl 10 s for pairs, 30 s otherwise, as redispy_worker.py);
kazoo's Lock is held by the client's session (kazoo's default 10 s timeout).
python-etcd3's blocking acquire is its own loop run here (Etcd3.acquire:
the library's fails with Debian's tenacity).
Lock paths: kazoo /dlock-bench-kazoo/<name>, python-etcd3 its own
/locks/<name>.
"""
import os
import sys
import time

MONO = time.CLOCK_MONOTONIC
WATCH_S = 5


def now():
    return time.clock_gettime_ns(MONO)


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


class Kazoo:
    def __init__(self, server):
        import kazoo
        from kazoo.client import KazooClient
        self.version = "kazoo %s" % getattr(kazoo, "__version__", "?")
        try:
            from kazoo import version as kv
            self.version = "kazoo %s" % kv.__version__
        except Exception:  # noqa: BLE001 - the version is only printed
            pass
        self.zk = KazooClient(hosts=server)
        self.zk.start(timeout=15)

    def lock(self, name, lease):
        return self.zk.Lock("/dlock-bench-kazoo/" + name.replace("/", "_"))

    @staticmethod
    def try_acquire(lk):
        return lk.acquire(blocking=False)

    @staticmethod
    def acquire(lk):
        return lk.acquire()

    def close(self):
        self.zk.stop()
        self.zk.close()


class Etcd3:
    def __init__(self, server):
        import etcd3
        host, port = server.rsplit(":", 1)
        self.version = "python-etcd3 %s" % getattr(etcd3, "__version__", "?")
        self.client = etcd3.client(host=host, port=int(port))
        self.client.status()  # reachable?

    def lock(self, name, lease):
        return self.client.lock(name, ttl=lease)

    @staticmethod
    def try_acquire(lk):
        return lk.acquire(timeout=0)

    def acquire(self, lk):
        # Lock.acquire(timeout=None) of python-etcd3 0.12 fails with Debian's
        # tenacity (its wait callback has the old two-argument signature:
        # TypeError on the first retry). This is the library's own loop
        # without tenacity: an attempt (a new lease, the create-if-absent
        # txn), then watch_once on the key, as its wait does, and again. A
        # watch started after the holder's delete misses it and waits for the
        # key's next event; the library would wait forever there, this bounds
        # each watch at WATCH_S.
        import etcd3.exceptions
        while True:
            if lk.acquire(timeout=0):
                return True
            try:
                self.client.watch_once(lk.key, WATCH_S)
            except etcd3.exceptions.WatchTimedOut:
                pass

    def close(self):
        # not client.close(): its watch threads would print tracebacks about
        # the closed channel; the process ends at once (os._exit) anyway
        pass


def main():
    which = sys.argv[1]
    server = arg("--server")
    try:
        peer = Kazoo(server) if which == "kazoo" else Etcd3(server)
    except ImportError as e:
        pkg = "python3-kazoo" if which == "kazoo" else "python3-etcd3"
        out("skip %s not importable by %s: %s (apt-get install %s)"
            % (which, sys.executable, e, pkg))
        return
    except Exception as e:  # noqa: BLE001 - any connection problem is a skip
        out("skip %s cannot reach %s: %s: %s" % (which, server, type(e).__name__, e))
        return
    r = None
    out("hello %s" % peer.version)

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
            lk = peer.lock(a[1], 10)
            end = now() + int(a[2]) * 1000000
            lats = []
            start = t = now()
            while t < end:
                if not peer.try_acquire(lk):
                    out("err pairs: not acquired")
                    break
                lk.release()
                t2 = now()
                lats.append((t2 - t) // 1000)
                t = t2
            else:
                out("ok %d %d %s" % (len(lats), t - start, " ".join(map(str, lats))))
        elif cmd == "hold":
            held = peer.lock(a[1], 30)
            out("ok" if peer.try_acquire(held) else "err hold: not acquired")
        elif cmd == "release":
            t0 = now()
            held.release()
            held = None
            out("ok %d" % t0)
        elif cmd == "wait":
            lk = peer.lock(a[1], 30)
            c0 = time.process_time_ns()
            out("waiting")
            if not peer.acquire(lk):
                out("err wait: not acquired")
                continue
            t1 = now()
            c1 = time.process_time_ns()
            lk.release()
            out("got %d %d" % (t1, c1 - c0))
        elif cmd == "contend":
            if r is None:
                import redis
                r = redis.Redis(host=arg("--redis-host", "127.0.0.1"),
                                port=int(arg("--redis-port")))
            name, counter = a[1], a[2]
            start, end = int(a[3]), int(a[4])
            lk = peer.lock(name, 30)
            d = start - now()
            if d > 0:
                time.sleep(d / 1e9)
            ops, waits = 0, []
            t = now()
            while t < end:
                if not peer.acquire(lk):
                    out("err contend: not acquired")
                    break
                t1 = now()
                waits.append((t1 - t) // 1000)
                v = r.get(counter)
                r.set(counter, int(v or 0) + 1)
                lk.release()
                ops += 1
                t = now()
            else:
                out("ok %d %d %s" % (ops, t, " ".join(map(str, waits))))
        else:
            out("err unknown command %s" % cmd)
    peer.close()


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
