#!/usr/bin/python3
"""ctest driver for the flash-sale demo (issue 6).

usage: check.py FLASH_SALE_BINARY small|pause|badinput|mariadb

Every run gets a private TMPDIR; afterwards it must be empty (no temporary
server directory or database left) and no process may still run from it.
Exits 77 (skip) when redis-server is not installed.

mariadb: the same checks on MariaDB (--db mysql://...). Starts a private
mariadbd in a temporary directory on a free port (127.0.0.1 only), creates the
database testdb and the user test, and always stops the server and removes the
directory. Exits 77 when mariadbd is not installed or flash-sale was built
without libmariadb.
"""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MUST = ("dlock", "optimistic", "fenced")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def procs_using(path):
    """pids running in (redis-server chdirs to its --dir) or naming path."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/cwd" % pid).startswith(path):
                found.append(int(pid))
                continue
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if path.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def run(binary, args, timeout=150):
    tmp = tempfile.mkdtemp(prefix="fs-check.")
    env = dict(os.environ, TMPDIR=tmp)
    env.pop("DLOCK_URL", None)
    t0 = time.time()
    child = subprocess.Popen([binary] + args, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except BaseException:
        # interrupted (timeout, SIGTERM): SIGTERM lets the demo remove its
        # throwaway server and files
        child.send_signal(signal.SIGTERM)
        try:
            child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    p = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    print("$ flash-sale %s  -> exit %d in %.1f s" % (" ".join(args), p.returncode, time.time() - t0))
    if p.stderr.strip():
        print("  stderr: " + p.stderr.strip().replace("\n", "\n  stderr: "))
    left = os.listdir(tmp)
    if left:
        fail("temporary files left behind by %s: %s" % (args, left))
    if procs_using(tmp):
        fail("processes left running by %s" % args)
    shutil.rmtree(tmp, ignore_errors=True)
    return p


def check_modes(doc, stock_total, must=MUST):
    modes = {m["mode"]: m for m in doc["modes"]}
    for name in must:
        m = modes.get(name)
        if m is None:
            fail("mode %s missing" % name)
            continue
        for key in ("orders", "stock_left", "oversold", "duplicates", "throughput", "p99_ms", "ok"):
            if key not in m:
                fail("%s: key %s missing" % (name, key))
        if m["ok"] is not True:
            fail("%s not ok: %s" % (name, m))
        if m["oversold"] != 0 or m["duplicates"] != 0:
            fail("%s: oversold %d duplicates %d" % (name, m["oversold"], m["duplicates"]))
        if m["orders"] + m["stock_left"] != stock_total:
            fail("%s: orders %d + stock_left %d != %d"
                 % (name, m["orders"], m["stock_left"], stock_total))
        if m["stock_left"] < 0:
            fail("%s: negative stock" % name)
    return modes


def mysql_built(binary):
    """--help says when mysql:// is not built in."""
    p = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
    return "not built in this version" not in p.stdout


def small(binary, db=()):
    args = ["--workers", "4", "--threads", "2", "--attempts", "400", "--users", "80",
            "--vouchers", "2", "--stock", "15", "--json"] + list(db)
    p = run(binary, args)
    if p.returncode != 0:
        fail("exit status %d" % p.returncode)
    doc = json.loads(p.stdout)
    modes = check_modes(doc, 2 * 15)
    if [m["mode"] for m in doc["modes"]] != ["none", "local", "dlock", "optimistic", "fenced"]:
        fail("modes not all run in order: %s" % [m["mode"] for m in doc["modes"]])
    for name in ("none", "local"):
        m = modes[name]
        print("  %s: oversold %d, duplicates %d (races; not asserted)"
              % (name, m["oversold"], m["duplicates"]))
    # single mode, default single voucher
    p = run(binary, ["--workers", "3", "--attempts", "150", "--users", "40", "--stock", "10",
                     "--mode", "optimistic", "--json"] + list(db))
    if p.returncode != 0:
        fail("--mode optimistic: exit %d" % p.returncode)
    doc = json.loads(p.stdout)
    if [m["mode"] for m in doc["modes"]] != ["optimistic"]:
        fail("--mode optimistic ran %s" % doc["modes"])
    check_modes(doc, 10, must=("optimistic",))


def pause(binary, db=()):
    base = ["--workers", "4", "--threads", "2", "--attempts", "300", "--users", "100",
            "--stock", "10", "--pause-holder", "--json"] + list(db)
    p = run(binary, base + ["--mode", "fenced"])
    if p.returncode != 0:
        fail("fenced --pause-holder: exit %d" % p.returncode)
    doc = json.loads(p.stdout)
    modes = check_modes(doc, 10, must=("fenced",))
    if modes["fenced"]["stale_rejected"] < 1:
        fail("fenced --pause-holder: no stale write was rejected: %s" % modes["fenced"])
    # without fencing the paused holder's write goes through: oversold, but
    # that is the expected outcome (exit status 0)
    p = run(binary, base + ["--mode", "dlock"])
    if p.returncode != 0:
        fail("dlock --pause-holder: exit %d (it is not required to be correct)" % p.returncode)
    m = json.loads(p.stdout)["modes"][0]
    if m["must_be_ok"] is not False:
        fail("dlock --pause-holder must not be required to be correct")
    if m["oversold"] < 1:
        fail("dlock --pause-holder: the paused holder did not oversell: %s" % m)


def badinput(binary):
    cases = [
        (["--workers", "0"], "--workers"),
        (["--attempts", "lots"], "--attempts"),
        (["--stock", "-3"], "--stock"),
        (["--users"], "needs a value"),
        (["--mode", "pessimistic"], "unknown mode"),
        (["--bogus"], "unknown argument"),
        (["--redis-server", "/nonexistent/redis-server"], "cannot run redis-server"),
        (["--db", "/nonexistent-dir/flash.db"], "cannot open SQLite database"),
        (["--url", "redis://127.0.0.1:1"], "cannot use Redis"),
        (["--url", "redis://user:hunter2@127.0.0.1:1"], "cannot use Redis"),
    ]
    if mysql_built(binary):
        cases += [
            # unreachable: one line naming the database, the password hidden
            (["--db", "mysql://u:secret@127.0.0.1:1/shop"],
             "cannot use MySQL/MariaDB at mysql://u:***@127.0.0.1:1/shop"),
            (["--db", "mysql://u:secret@127.0.0.1"], "bad MySQL/MariaDB URL"),
        ]
    else:
        cases.append((["--db", "mysql://u:secret@127.0.0.1:1/shop"], "not built in this version"))
    for args, want in cases:
        p = run(binary, args, timeout=60)
        if p.returncode != 2:
            fail("%s: exit %d, want 2" % (args, p.returncode))
        first = p.stderr.strip().splitlines()[0] if p.stderr.strip() else ""
        if want not in p.stderr:
            fail("%s: stderr lacks %r: %r" % (args, want, p.stderr))
        if not first.startswith("flash-sale: "):
            fail("%s: message not one clear line: %r" % (args, first))
        if "secret" in p.stderr or "hunter2" in p.stderr:
            fail("%s: password in the message" % args)

    # ^C in the middle of a run: the throwaway server and files are removed
    tmp = tempfile.mkdtemp(prefix="fs-check.")
    env = dict(os.environ, TMPDIR=tmp)
    p = subprocess.Popen([binary, "--attempts", "200000", "--users", "100000", "--stock",
                          "1000000", "--workers", "2", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 20
    while time.time() < deadline and not procs_using(tmp + "/"):
        time.sleep(0.05)
    if not procs_using(tmp + "/"):
        fail("SIGINT: the throwaway redis-server was never seen running")
    time.sleep(0.5)  # into the first mode
    p.send_signal(signal.SIGINT)
    try:
        p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("SIGINT: the demo did not stop")
    print("$ flash-sale (interrupted) -> exit %d" % p.returncode)
    if p.returncode == 0:
        fail("SIGINT: exit status 0")
    time.sleep(0.2)
    if os.listdir(tmp):
        fail("SIGINT: files left: %s" % os.listdir(tmp))
    if procs_using(tmp):
        fail("SIGINT: processes left: %s" % procs_using(tmp))
    shutil.rmtree(tmp, ignore_errors=True)


class Skip(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """mariadbd gets SIGKILL if this script dies, even by SIGKILL (ctest's
    timeout): no server outlives the test."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class TempMariaDB:
    """A private mariadbd in a temporary directory (docs: SERVERS.md, 4)."""
    TOOLS = ("mariadbd", "mariadb-install-db", "mariadb-admin", "mariadb")

    def __init__(self):
        self.dir = None
        self.proc = None
        self.port = None

    def tool(self, name):
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
        if not path:
            raise Skip("%s not found (Debian: mariadb-server, mariadb-client)" % name)
        return path

    def start(self):
        tools = {t: self.tool(t) for t in self.TOOLS}
        self.dir = tempfile.mkdtemp(prefix="fs-mariadb.")
        data, sock = os.path.join(self.dir, "data"), os.path.join(self.dir, "sock")
        small_log = "--innodb-log-file-size=16M"  # 34 MB on disk instead of 114
        with open(os.path.join(self.dir, "install.log"), "w") as log:
            r = subprocess.run([tools["mariadb-install-db"], "--no-defaults", "--user=root",
                                "--datadir=" + data, "--skip-test-db", small_log],
                               stdout=log, stderr=subprocess.STDOUT, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("mariadb-install-db failed: " + self.log("install.log"))
        for _ in range(3):  # the free port may be taken in between: try another
            self.port = free_port()
            self.proc = subprocess.Popen(
                [tools["mariadbd"], "--no-defaults", "--user=root", "--datadir=" + data,
                 "--socket=" + sock, "--port=%d" % self.port, "--bind-address=127.0.0.1",
                 "--pid-file=" + os.path.join(self.dir, "pid"),
                 "--log-error=" + os.path.join(self.dir, "err.log"), "--skip-name-resolve",
                 small_log],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent)
            deadline = time.time() + 30
            while time.time() < deadline and self.proc.poll() is None:
                if subprocess.run([tools["mariadb-admin"], "--no-defaults", "-S", sock, "-u",
                                   "root", "ping"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            if self.proc.poll() is None:
                break
            self.proc = None
        if self.proc is None or time.time() >= deadline:
            raise RuntimeError("mariadbd did not start: " + self.log("err.log"))
        r = subprocess.run([tools["mariadb"], "--no-defaults", "-S", sock, "-u", "root", "-e",
                            "CREATE DATABASE testdb; "
                            "CREATE USER 'test'@'127.0.0.1' IDENTIFIED BY 'secret'; "
                            "GRANT ALL ON testdb.* TO 'test'@'127.0.0.1'"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("cannot create the test database: " + r.stderr.strip())
        print("mariadbd on 127.0.0.1:%d in %s" % (self.port, self.dir))

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return "".join(f.readlines()[-5:]).strip()
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()  # mariadbd shuts down cleanly on SIGTERM
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def mariadb(binary):
    if not mysql_built(binary):
        raise Skip("flash-sale was built without libmariadb (Debian: libmariadb-dev)")
    server = TempMariaDB()

    def on_signal(sig, _frame):
        raise KeyboardInterrupt("signal %d" % sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        server.start()
        url = "mysql://test:secret@127.0.0.1:%d/testdb" % server.port
        db = ["--db", url]
        small(binary, db)   # all five modes, then --mode optimistic alone
        pause(binary, db)   # the fencing token checked by InnoDB
        # the server is up but refuses: a clear line, exit 2, no password
        for args, want in (
                (["--db", url.replace("secret", "wrong-secret")], "Access denied"),
                (["--db", url.replace("/testdb", "/nosuchdb")], "Access denied"),
                (["--db", url, "--workers", "2", "--threads", "2", "--attempts", "20"], None)):
            p = run(binary, args, timeout=60)
            if want is None:
                if p.returncode != 0:
                    fail("%s: exit %d" % (args, p.returncode))
                if "secret" in p.stderr or "secret" in p.stdout:
                    fail("%s: password printed" % args)
                continue
            lines = p.stderr.strip().splitlines()
            if p.returncode != 2:
                fail("%s: exit %d, want 2" % (args, p.returncode))
            if len(lines) != 1 or not lines[0].startswith("flash-sale: ") or want not in lines[0]:
                fail("%s: want one line with %r: %r" % (args, want, p.stderr))
            if "secret" in p.stderr:
                fail("%s: password in the message" % args)
    finally:
        server.stop()


def main():
    binary, what = sys.argv[1], sys.argv[2]
    if not shutil.which("redis-server"):
        print("SKIP: redis-server not found")
        return 77
    try:
        {"small": small, "pause": pause, "badinput": badinput, "mariadb": mariadb}[what](binary)
    except Skip as e:
        print("SKIP:", e)
        return 77
    except KeyboardInterrupt as e:
        print("interrupted (%s); temporary servers and files removed" % (e or "SIGINT"))
        return 1
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
