#!/usr/bin/python3
"""Driver and verdict of the async-server example (issue 24).

usage: driver.py ASYNC_SERVER_BINARY [--small] [--unsafe [--expect-oversell]] [--restart]
                 [--servers N] [--items N] [--stock N] [--clients N]
                 [--requests N] [--pause-ms N] [--redis-server PATH]

Starts a throwaway redis-server on a free port in a temporary directory,
puts --stock units of each of --items items in it, starts --servers
async-server processes (each on a free port), and connects --clients
clients spread over them, which all at once send --requests "BUY" lines
each, one after the other, over the items. Then it stops the servers and
judges what Redis and the replies say:

  - no item sold beyond its stock (OK replies <= stock);
  - the OK replies of an item equal the stock it lost (no lost update);
  - every order unique: the units (1..stock) of the OK replies are distinct
    and are exactly the units in the order log;
  - the stock never went negative, and SOLDOUT only when nothing was left;
  - no ERR reply, every request answered, every server exited cleanly.

--restart: first a round during which redis-server is killed (SIGKILL)
after 100 ms: every request must still be answered (ERR for what the loss
broke) and every server stay up; then redis-server is started again on its
port, the stock set again, and the round above is judged.

It prints a table and a verdict, PASS or FAIL with the numbers; exit status
0 on PASS, 1 on FAIL (with --expect-oversell: 0 when the verdict caught an
oversell, which is what --unsafe, the servers without their lock, should
show), 77 when redis-server or python3-redis is missing. The servers and
redis-server are always stopped and the directory removed, also on failure,
^C or SIGTERM (and they get SIGKILL if this script is killed).
"""
import argparse
import asyncio
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import redis
except ImportError:
    redis = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """The child gets SIGKILL when this script dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def tail(path, n=8):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return ""


class Run:
    """The processes of one run, in one temporary directory."""

    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="async-server.")
        self.redis = None      # Popen
        self.redis_port = None
        self.servers = []      # (name, Popen, port)

    def start_redis(self, port=None):
        """Starts redis-server (on port, else a free one): a client of it."""
        exe = self.args.redis_server
        for _ in range(3):  # the free port may be taken in between: try another
            self.redis_port = port or free_port()
            self.redis = subprocess.Popen(
                [exe, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir,
                 "--logfile", os.path.join(self.dir, "redis.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
            db = redis.Redis(host="127.0.0.1", port=self.redis_port, socket_timeout=5)
            deadline = time.time() + 10
            while time.time() < deadline and self.redis.poll() is None:
                try:
                    db.ping()
                    return db
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            self.stop_one(self.redis)
        raise RuntimeError("redis-server did not start: " +
                           tail(os.path.join(self.dir, "redis.log"), 3))

    def start_servers(self):
        a = self.args
        for i in range(a.servers):
            name = "s%d" % (i + 1)
            out = open(os.path.join(self.dir, name + ".out"), "w")
            err = open(os.path.join(self.dir, name + ".err"), "w")
            cmd = [a.binary, "--redis", "127.0.0.1:%d" % self.redis_port, "--port", "0",
                   "--name", name, "--pause-ms", str(a.pause_ms)]
            if a.unsafe:
                cmd.append("--unsafe")
            if a.restart:
                # the killed round's waiters wait on through the outage until
                # their wait ends (as blocking waits do): 3 s, not the default
                # 10, keeps the run short; the second round's waits take under 1 s
                cmd += ["--wait-ms", "3000"]
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 preexec_fn=die_with_parent)
            out.close()
            err.close()
            self.servers.append([name, p, None])
        # each prints "listening on 127.0.0.1:PORT" once its store is connected
        deadline = time.time() + 15
        for s in self.servers:
            while s[2] is None:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.output(s[0]))
                if m:
                    s[2] = int(m.group(1))
                elif s[1].poll() is not None or time.time() > deadline:
                    raise RuntimeError("server %s did not start (exit %s): %s" % (
                        s[0], s[1].poll(), tail(os.path.join(self.dir, s[0] + ".err"), 3)))
                else:
                    time.sleep(0.02)

    def output(self, name, ext=".out"):
        try:
            with open(os.path.join(self.dir, name + ext)) as f:
                return f.read()
        except OSError:
            return ""

    @staticmethod
    def stop_one(p, timeout=10, signalled=False):
        """SIGTERM (once: a server takes a second one as "stop now"), then
        SIGKILL after timeout; returns the exit status."""
        if p.poll() is None:
            if not signalled:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def stop_servers(self):
        """Stops every server (SIGTERM lets each drain and exit 0); returns
        [(name, exit status, stdout, stderr)]."""
        for s in self.servers:
            if s[1].poll() is None:
                s[1].send_signal(signal.SIGTERM)
        return [(s[0], self.stop_one(s[1], signalled=True), self.output(s[0]),
                 self.output(s[0], ".err")) for s in self.servers]

    def cleanup(self):
        for s in self.servers:
            self.stop_one(s[1], timeout=5)
        if self.redis is not None:
            self.stop_one(self.redis)
        shutil.rmtree(self.dir, ignore_errors=True)


async def fire(ports, items, clients, requests, timeout, then=None):
    """Connects every client first, then all send at once; each sends its
    requests one after the other. Returns [(server index, item, reply)].
    then: a function run in a thread meanwhile (the restart's kill)."""
    conns = await asyncio.gather(*[
        asyncio.open_connection("127.0.0.1", ports[i % len(ports)]) for i in range(clients)])
    go = asyncio.Event()

    async def client(i, reader, writer):
        await go.wait()
        got = []
        for r in range(requests):
            item = items[(i + r) % len(items)]
            writer.write(("BUY %s user%d\n" % (item, i)).encode())
            await writer.drain()
            line = await reader.readline()
            got.append((i % len(ports), item, line.decode().strip() or "(no reply)"))
        writer.close()
        return got

    tasks = [asyncio.ensure_future(client(i, r, w)) for i, (r, w) in enumerate(conns)]
    go.set()
    if then:
        await asyncio.get_running_loop().run_in_executor(None, then)
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        raise TimeoutError("%d clients still waiting for a reply after %d s"
                           % (len(pending), timeout))
    return [x for t in tasks for x in t.result()]  # a client's exception is raised


def judge(db, items, stock, replies):
    """Per item: the numbers, and what is wrong with them."""
    rows, problems = [], []
    for item in items:
        left = int(db.get("shop:stock:" + item))
        log = [int(e.split(b":")[0]) for e in db.lrange("shop:orders:" + item, 0, -1)]
        mine = [rep for _, it, rep in replies if it == item]
        oks = [int(rep.split()[1]) for rep in mine if rep.startswith("OK ")]
        soldout = sum(1 for rep in mine if rep == "SOLDOUT")
        errs = [rep for rep in mine if not rep.startswith("OK ") and rep != "SOLDOUT"]
        row = dict(item=item, stock=stock, left=left, sold=stock - left, ok=len(oks),
                   logged=len(log), dup=len(oks) - len(set(oks)),
                   oversold=max(0, len(oks) - stock), soldout=soldout, err=len(errs))
        rows.append(row)
        say = lambda msg: problems.append("%s: %s" % (item, msg))
        if row["oversold"]:
            say("oversold %d (%d OK replies for %d units)" % (row["oversold"], len(oks), stock))
        if len(oks) != row["sold"]:
            say("%d OK replies but the stock went down by %d" % (len(oks), row["sold"]))
        if row["dup"]:
            say("%d units sold twice or more" % row["dup"])
        if sorted(oks) != sorted(log):
            say("the OK replies and the order log (%d) differ" % len(log))
        if any(u < 1 or u > stock for u in oks):
            say("a unit outside 1..%d" % stock)
        if left < 0 or left > stock:
            say("stock %d out of 0..%d" % (left, stock))
        if soldout and left > 0:
            say("SOLDOUT answered with %d left" % left)
        if errs:
            say("%d ERR replies, first: %s" % (len(errs), errs[0]))
    return rows, problems


def killed_round(run, a, items):
    """A sale during which redis-server is killed (SIGKILL) after 100 ms: the
    servers must answer every request (ERR for what the loss broke) rather
    than hang, and stay up. Returns the problems seen."""
    def kill():
        time.sleep(0.1)
        run.redis.kill()
        run.redis.wait()
    replies = asyncio.run(fire([s[2] for s in run.servers], items, a.clients, a.requests,
                               timeout=30, then=kill))
    kinds = {}  # OK, SOLDOUT, ERR, (no reply): the replies
    for _, _, rep in replies:
        kinds.setdefault(rep if rep.startswith("(") else rep.split(" ")[0], []).append(rep)
    print("round 1, redis-server killed after 100 ms: %d requests answered: %s; first ERR: %s"
          % (len(replies), ", ".join("%d %s" % (len(v), k) for k, v in sorted(kinds.items())),
             (kinds.get("ERR") or ["none"])[0]))
    problems = []
    if "(no reply)" in kinds or len(replies) != a.clients * a.requests:
        problems.append("round 1: %d requests of %d not answered" % (
            a.clients * a.requests - len(replies) + len(kinds.get("(no reply)", [])),
            a.clients * a.requests))
    if "ERR" not in kinds:
        problems.append("round 1: no ERR: the kill came too late to test anything")
    for s in run.servers:
        if s[1].poll() is not None:
            problems.append("round 1: server %s exited (%d)" % (s[0], s[1].returncode))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--small", action="store_true",
                    help="the ctest size: 3 servers, 2 items x 10, 40 clients x 2 requests")
    ap.add_argument("--unsafe", action="store_true", help="servers without their lock")
    ap.add_argument("--expect-oversell", action="store_true",
                    help="exit 0 when the verdict catches an oversell")
    ap.add_argument("--restart", action="store_true",
                    help="first a round with redis-server killed under load (every request "
                         "must be answered), then restart it and judge a second round")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--items", type=int, default=3)
    ap.add_argument("--stock", type=int, default=20)
    ap.add_argument("--clients", type=int, default=90)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--pause-ms", type=int, default=20)
    ap.add_argument("--redis-server", default=shutil.which("redis-server"))
    a = ap.parse_args()
    if a.small:
        a.servers, a.items, a.stock, a.clients, a.requests = 3, 2, 10, 40, 2
    if min(a.servers, a.items, a.stock, a.clients, a.requests) < 1:
        ap.error("the sizes must be at least 1")
    if not a.redis_server:
        print("SKIP: redis-server not found")
        return 77
    if redis is None:
        print("SKIP: the Python redis module is missing (Debian: python3-redis)")
        return 77

    def on_signal(sig, _frame):
        raise KeyboardInterrupt("signal %d" % sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    items = ["item%d" % (i + 1) for i in range(a.items)]
    run = Run(a)
    problems = []
    try:
        db = run.start_redis()
        for item in items:
            db.set("shop:stock:" + item, a.stock)
        run.start_servers()
        print("%d servers (%s) on redis-server :%d, %d items x stock %d, %d clients x %d "
              "requests, pause %d ms" % (a.servers, "UNSAFE: no lock" if a.unsafe else
                                          "a lock per item", run.redis_port, a.items, a.stock,
                                          a.clients, a.requests, a.pause_ms))
        if a.restart:
            problems += killed_round(run, a, items)
            db = run.start_redis(run.redis_port)  # empty: no persistence
            for item in items:
                db.set("shop:stock:" + item, a.stock)
            print("redis-server restarted, the stock set again; round 2 (the summaries of "
                  "the servers count both rounds):")
        t0 = time.time()
        replies = asyncio.run(fire([s[2] for s in run.servers], items, a.clients, a.requests,
                                   timeout=90))
        secs = time.time() - t0
        stopped = run.stop_servers()
        rows, found = judge(db, items, a.stock, replies)
        problems += found
    except KeyboardInterrupt as e:
        print("interrupted (%s): servers stopped, files removed" % (e or "SIGINT"))
        return 1
    except Exception as e:  # a run that could not be made is a failure, not a verdict
        print("FAIL: %s: %s" % (type(e).__name__, e))
        return 1
    finally:
        run.cleanup()

    print("%d requests answered in %.2f s\n" % (len(replies), secs))
    cols = ("item", "stock", "sold", "OK", "logged", "dup", "oversold", "left", "SOLDOUT", "ERR")
    keys = ("item", "stock", "sold", "ok", "logged", "dup", "oversold", "left", "soldout", "err")
    print("".join("%-9s" % c for c in cols))
    for r in rows:
        print("".join("%-9s" % r[k] for k in keys))
    print()
    peak = 0
    for name, code, out, err in stopped:
        stats = [ln for ln in out.splitlines() if " requests: " in ln]
        print(stats[0] if stats else "async-server %s: no summary" % name)
        m = re.search(r"at most (\d+) in flight", stats[0] if stats else "")
        peak = max(peak, int(m.group(1)) if m else 0)
        if code != 0:
            problems.append("server %s exited with status %d: %s" % (name, code, err[-2000:]))
    if len(replies) != a.clients * a.requests:
        problems.append("%d replies for %d requests" % (len(replies), a.clients * a.requests))
    if peak < 2 and a.clients > a.servers:
        problems.append("no server had two requests in flight at once")

    total = sum(r["ok"] for r in rows)
    sold = sum(r["sold"] for r in rows)
    if not problems:
        print("\nPASS: %d units of %d item%s sold, %d OK replies, every order unique, "
              "no stock below 0; up to %d requests in flight on one server's loop"
              % (sold, a.items, "" if a.items == 1 else "s", total, peak))
        verdict = 0
    else:
        print("\nFAIL: %d OK replies for %d units in stock (%d oversold, %d units sold twice "
              "or more)" % (total, a.items * a.stock, sum(r["oversold"] for r in rows),
                            sum(r["dup"] for r in rows)))
        for p in problems:
            print("  " + p)
        verdict = 1
    if a.expect_oversell:
        caught = verdict == 1 and any(r["oversold"] for r in rows) and \
            all(code == 0 for _, code, _, _ in stopped)
        print("expected an oversell (--unsafe: no lock): %s" %
              ("caught" if caught else "NOT caught"))
        return 0 if caught else 1
    return verdict


if __name__ == "__main__":
    sys.exit(main())
