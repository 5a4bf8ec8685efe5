"""python-etcd3's Lock, uncontended acquire + release pairs, with etcd's own
counters per pair: bench/etcd_breakdown's peer line.

    etcd3_pairs.py http://host:port pairs
"""
import re
import sys
import time
import urllib.request

METHODS = ["Range", "Put", "DeleteRange", "Txn", "LeaseGrant", "LeaseRevoke",
           "LeaseKeepAlive", "Watch"]


def counters(base):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    c = {"fsyncs": 0.0, "proposals": 0.0}
    for m in METHODS:
        c[m] = 0.0
    for line in text.splitlines():
        if line.startswith("etcd_disk_wal_fsync_duration_seconds_count "):
            c["fsyncs"] = float(line.split()[1])
        elif line.startswith("etcd_server_proposals_committed_total "):
            c["proposals"] = float(line.split()[1])
        elif line.startswith("grpc_server_started_total{"):
            m = re.search(r'grpc_method="([^"]+)"', line)
            if m and m.group(1) in c:
                c[m.group(1)] += float(line.split()[-1])
    return c


def main():
    base, n = sys.argv[1], int(sys.argv[2])
    try:
        import etcd3
    except ImportError as e:
        print("  python-etcd3 Lock: not measured (%s; apt-get install python3-etcd3)" % e)
        return
    host, port = base[len("http://"):].rsplit(":", 1)
    client = etcd3.client(host=host, port=int(port))
    lock = client.lock("bench-etcd-pairs", ttl=10)
    for _ in range(20):
        assert lock.acquire(timeout=0)
        lock.release()
    a = counters(base)
    us = []
    t0 = time.monotonic()
    for _ in range(n):
        s = time.monotonic()
        assert lock.acquire(timeout=0)
        lock.release()
        us.append((time.monotonic() - s) * 1e6)
    total = time.monotonic() - t0
    b = counters(base)
    us.sort()
    print("  %-34s %8.0f pairs/s  p50 %6.2f ms  p90 %6.2f ms" % (
        "python-etcd3 Lock (ttl 10 s)", n / total, us[n // 2] / 1000, us[n * 9 // 10] / 1000))
    calls = " ".join("%s %.2f" % (m, (b[m] - a[m]) / n) for m in METHODS
                     if (b[m] - a[m]) / n >= 0.005)
    print("    per pair: fsyncs %.2f, proposals %.2f, gRPC: %s" % (
        (b["fsyncs"] - a["fsyncs"]) / n, (b["proposals"] - a["proposals"]) / n, calls))


main()
