#!/usr/bin/python3
"""Server-side time per command, from a redis-server's SLOWLOG.

    bench/slowlog_summary.py --port PORT [--reset] [--min-count N]

Run a redis-server with `--slowlog-log-slower-than 0 --slowlog-max-len 1000000`
(every command is logged with its execution time in microseconds), point
dlock_bench at it (`build/bench-run/bench/dlock_bench --port PORT --only
fair_handoff`), then run this: it prints, per command, the number of calls and
the median and 90th percentile of their server time. Scripts (EVALSHA) are
told apart by their SHA1 prefix and first key; the commands a script runs are
logged on their own too, so a script's line includes theirs. `--reset` empties
the log (before a run). Needs redis-py (Debian's python3-redis).
"""
import argparse
import statistics
import sys

try:
    import redis
except ImportError:
    sys.exit("slowlog_summary: needs redis-py (apt-get install python3-redis)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--reset", action="store_true", help="empty the slow log and exit")
    ap.add_argument("--min-count", type=int, default=20, help="hide rarer commands")
    a = ap.parse_args()
    r = redis.Redis(host=a.host, port=a.port)
    if a.reset:
        r.slowlog_reset()
        return
    groups = {}
    for e in r.slowlog_get(10**7):
        words = e["command"].decode(errors="replace").split()
        if not words:
            continue
        key = words[0].upper()
        if key in ("EVALSHA", "EVAL") and len(words) > 3:
            key = "%s %s %s" % (key, words[1][:8], words[3])
        groups.setdefault(key, []).append(e["duration"])
    print("%-52s %8s %8s %8s" % ("command", "calls", "p50 us", "p90 us"))
    for key, v in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        if len(v) < a.min_count:
            continue
        v.sort()
        print("%-52s %8d %8.1f %8.1f" % (key[:52], len(v), statistics.median(v),
                                         v[int(0.9 * (len(v) - 1))]))


if __name__ == "__main__":
    main()
