#!/usr/bin/env python3
"""Writes the benchmark suite's Markdown tables and PNG charts (issue 7).

  bench/report.py RESULTS.json OUTPUT.txt --md FILE [--png-dir DIR] [--command CMD]

RESULTS.json is dlock_bench --json, OUTPUT.txt its printed output (for the
target lines). The tables replace the part of --md between the lines
"<!-- suite-results:begin -->" and "<!-- suite-results:end -->" (appended
when the markers are missing); the charts (gnuplot, PNG) go to --png-dir as
bench-handoff.png and bench-contention.png. Standard library only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BEGIN = "<!-- suite-results:begin -->"
END = "<!-- suite-results:end -->"


def load(path):
    with open(path) as f:
        doc = json.load(f)
    m = {}
    for x in doc["metrics"]:
        m[(x["scenario"], x["series"], x["name"])] = x["value"]
    return doc, m


def num(v, unit=""):
    if v is None:
        return "-"
    if unit == "x":
        return "%.2fx" % v
    if abs(v) >= 1000:
        return "{:,.0f}".format(v)
    if abs(v) >= 100:
        return "%.0f" % v
    return "%.1f" % v


def us(v):
    """microseconds, shown in us below 10 ms, else ms"""
    if v is None:
        return "-"
    if v >= 10000:
        return "%s ms" % num(v / 1000)
    return "%s us" % num(v)


def table(head, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(head) - 1)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def series_of(m, scenario):
    seen = []
    for (sc, se, _n) in m:
        if sc == scenario and se not in seen:
            seen.append(se)
    return seen


HANDOFF_ORDER = [
    ("handoff", "raw", "raw notify-then-SET (hiredis)"),
    ("handoff", "dlock", "dlock (plain)"),
    ("handoff", "dlock-reentrant", "dlock (reentrant)"),
    ("fair_handoff", "dlock-fair", "dlock (fair)"),
    ("peer_handoff", "redis-py-1ms", "redis-py, sleep=0.001"),
    ("peer_handoff", "redis-py", "redis-py, defaults"),
    ("peer_handoff", "node-redlock-5ms", "node-redlock, retryDelay 5"),
    ("peer_handoff", "node-redlock", "node-redlock, defaults"),
]
CONT_SERIES = [
    ("raw-ring", "raw token ring (hiredis; not a lock)"),
    ("dlock", "dlock (plain)"),
    ("dlock-fair", "dlock (fair)"),
    ("redis-py", "redis-py"),
    ("redis-py-1ms", "redis-py 1 ms"),
    ("node-redlock", "node-redlock"),
    ("node-redlock-5ms", "node-redlock 5 ms"),
]


def targets_from_output(path):
    rows = []
    if not path or not os.path.exists(path):
        return rows
    on = False
    with open(path) as f:
        for line in f:
            if line.startswith("== targets"):
                on = True
                continue
            if not on:
                continue
            mm = re.match(r"^(PASS|WARN|FAIL|SKIP)\s+(.*?)(?::\s+(.*))?$", line.rstrip())
            if mm:
                st = {"PASS": "met", "WARN": "**missed**", "FAIL": "**FAILED**",
                      "SKIP": "not measured"}[mm.group(1)]
                text = mm.group(2).replace(" (not measured)", "")
                rows.append((text, mm.group(3) or "", st))
    return rows


def markdown(doc, m, out_txt, command, charts):
    g = lambda *k: m.get(k)  # noqa: E731
    md = []
    md.append("Machine: %s. Mode: %s. Command: `%s`." % (doc.get("machine", "?"),
                                                        doc.get("mode", "?"), command))
    md.append("")
    # baseline
    md.append("**Baseline**")
    md.append("")
    rows = [
        ["PING round trip, hiredis", us(g("ping", "raw", "p50_us")), us(g("ping", "raw", "p99_us")), ""],
        ["PING round trip, dlock_ping", us(g("ping", "dlock", "p50_us")), us(g("ping", "dlock", "p99_us")), ""],
    ]
    for c in ("c1", "c50"):
        if g("redis_benchmark", c, "set_per_s") is not None:
            rows.append(["redis-benchmark SET, %s client%s" % (c[1:], "s" if c != "c1" else ""),
                         us(g("redis_benchmark", c, "p50_us")), us(g("redis_benchmark", c, "p99_us")),
                         num(g("redis_benchmark", c, "set_per_s")) + " SET/s"])
    md.append(table(["figure", "p50", "p99", "throughput"], rows))
    md.append("")
    # pairs
    if series_of(m, "peer_pairs"):
        md.append("**Uncontended acquire+release pairs, one connection** (`peer_pairs`: "
                  "rounds rotating over the series; ratios are medians of per-round ratios)")
        md.append("")
        rows = []
        for s in series_of(m, "peer_pairs"):
            rows.append([s, num(g("peer_pairs", s, "pairs_per_s")),
                         us(g("peer_pairs", s, "pair_p50_us")), us(g("peer_pairs", s, "pair_p99_us")),
                         num(g("peer_pairs", s, "ratio_to_raw"), "x"),
                         num(g("peer_pairs", s, "ratio_to_best_peer"), "x")])
        md.append(table(["series", "pairs/s", "pair p50", "pair p99", "/ raw", "/ faster peer"], rows))
        md.append("")
        if g("pairs", "dlock", "ratio_to_raw") is not None:
            md.append("The `pairs` scenario of the same run (20 rounds, also dlock's own "
                      "protocol by hiredis): dlock %s pairs/s = %s of raw, raw-fenced %s, "
                      "dlock-reentrant %s." % (
                          num(g("pairs", "dlock", "pairs_per_s")),
                          num(g("pairs", "dlock", "ratio_to_raw"), "x"),
                          num(g("pairs", "raw-fenced", "ratio_to_raw"), "x"),
                          num(g("pairs", "dlock-reentrant", "ratio_to_raw"), "x")))
            md.append("")
    # handoff
    md.append("**Handoff latency** (A releases, B already blocked in another process holds; "
              "idle wait: B blocked for 1 s while A holds)")
    md.append("")
    rows = []
    for sc, s, label in HANDOFF_ORDER:
        if g(sc, s, "p50_us") is None:
            continue
        cmds = g("peer_handoff", s, "wait_cmds_per_s") if sc != "fair_handoff" else None
        cpu = g("peer_handoff", s, "wait_cpu_pct") if sc != "fair_handoff" else None
        if s in ("raw", "dlock-reentrant"):
            cmds = cpu = None
        rows.append([label, int(g(sc, s, "samples") or 0), us(g(sc, s, "p50_us")),
                     us(g(sc, s, "p99_us")), us(g(sc, s, "max_us")),
                     "-" if cmds is None else "%.1f" % cmds,
                     "-" if cpu is None else "%.2f %%" % cpu])
    md.append(table(["client", "handoffs", "p50", "p99", "max", "server cmd/s while blocked",
                     "waiter CPU while blocked"], rows))
    md.append("")
    if "handoff" in charts:
        md.append("![handoff latency per client](%s)" % charts["handoff"])
        md.append("")
    # contention
    ks = sorted({int(re.search(r"-k(\d+)$", se).group(1)) for (sc, se, _n) in m
                 if sc == "peer_contention" and re.search(r"-k(\d+)$", se)})
    if ks:
        md.append("**Contention**: K processes on one lock, each: acquire (no time limit), GET + "
                  "SET of a counter, release (`peer_contention`; acq/s is the median of the "
                  "rounds; min/max: acquisitions per process over all rounds; the raw ring "
                  "passes a token from process to process with BLPOP and RPUSH: the floor of "
                  "a handoff per acquisition on this machine, not a lock)")
        md.append("")
        rows = []
        for k in ks:
            for s, label in CONT_SERIES:
                sn = "%s-k%d" % (s, k)
                if g("peer_contention", sn, "acq_per_s") is None:
                    continue
                ok = g("peer_contention", sn, "counter_ok")
                rows.append([label, k, num(g("peer_contention", sn, "acq_per_s")),
                             num(g("peer_contention", sn, "ratio_to_best_peer"), "x"),
                             num(g("peer_contention", sn, "ratio_to_raw_ring"), "x"),
                             us(g("peer_contention", sn, "wait_p50_us")),
                             us(g("peer_contention", sn, "wait_p99_us")),
                             us(g("peer_contention", sn, "wait_max_us")),
                             "%d / %d" % (g("peer_contention", sn, "proc_min"),
                                          g("peer_contention", sn, "proc_max")),
                             num(g("peer_contention", sn, "spread"), "x"),
                             "exact" if ok == 1 else "**FAIL**"])
        md.append(table(["client", "K", "acq/s", "/ best peer", "/ raw ring", "wait p50",
                         "wait p99", "wait max", "per-process min / max", "spread", "counter"],
                        rows, ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:",
                               "---:", "---:", "---"]))
        md.append("")
        if "contention" in charts:
            md.append("![contention throughput per K per client](%s)" % charts["contention"])
            md.append("")
    if series_of(m, "contention"):
        rows = []
        for s in series_of(m, "contention"):
            rows.append([s, num(g("contention", s, "acq_per_s")), us(g("contention", s, "wait_p50_us")),
                         us(g("contention", s, "wait_p99_us")), num(g("contention", s, "spread"), "x"),
                         "exact" if g("contention", s, "counter_ok") == 1 else "**FAIL**"])
        md.append("The `contention` scenario of the same run (dlock only, 1 s rounds):")
        md.append("")
        md.append(table(["series", "acq/s", "wait p50", "wait p99", "spread", "counter"], rows,
                        ["---", "---:", "---:", "---:", "---:", "---"]))
        md.append("")
    # backends (issue 9)
    if series_of(m, "backends"):
        md.append("**Backends** (issue 9, `backends`: one handle per backend, DLOCK_WATCHDOG "
                  "leases; `-lease`: the pairs with a 10 s explicit lease where the backend "
                  "takes one; ratios against Redis in the same run)")
        md.append("")
        rows = []
        for s in series_of(m, "backends"):
            n = g("backends", s, "handoff_samples")
            rows.append([s, num(g("backends", s, "pairs_per_s")),
                         us(g("backends", s, "pair_p50_us")), us(g("backends", s, "pair_p99_us")),
                         num(g("backends", s, "pairs_ratio_to_redis"), "x"),
                         "-" if n is None else int(n), us(g("backends", s, "handoff_p50_us")),
                         us(g("backends", s, "handoff_p99_us")),
                         us(g("backends", s, "handoff_max_us")),
                         num(g("backends", s, "handoff_p50_ratio_to_redis"), "x")])
        md.append(table(["backend", "pairs/s", "pair p50", "pair p99", "pairs / redis",
                         "handoffs", "handoff p50", "handoff p99", "handoff max",
                         "handoff p50 / redis"], rows))
        md.append("")
    # watchdog
    if g("watchdog", "dlock", "cpu_pct") is not None:
        md.append("**Watchdog**: one client process holding %d locks in watchdog mode" %
                  g("watchdog", "dlock", "locks"))
        md.append("")
        md.append(table(["hold", "lease / renewal period", "client CPU", "of one core",
                         "commands per period (script calls)", "kept", "acquiring them took"], [[
            "%.1f s" % g("watchdog", "dlock", "hold_s"),
            "%d / %d ms" % (g("watchdog", "dlock", "lease_ms"), g("watchdog", "dlock", "lease_ms") / 3),
            "%.0f ms" % g("watchdog", "dlock", "cpu_ms"),
            "%.3f %%" % g("watchdog", "dlock", "cpu_pct"),
            "%s (%s)" % (num(g("watchdog", "dlock", "cmds_per_period")),
                         num(g("watchdog", "dlock", "scripts_per_period"))),
            "%d of %d" % (g("watchdog", "dlock", "kept"), g("watchdog", "dlock", "locks")),
            "%.2f s" % g("watchdog", "dlock", "acquire_all_s")]]))
        md.append("")
    # memory
    if series_of(m, "memory"):
        md.append("**Redis memory per held lock** (`used_memory` delta / locks held; MEMORY "
                  "USAGE of one lock's keys)")
        md.append("")
        rows = []
        for s in series_of(m, "memory"):
            rows.append([s, "%.0f B" % g("memory", s, "bytes_per_lock"),
                         "%.0f" % g("memory", s, "keys_per_lock"),
                         "%.0f B" % g("memory", s, "memory_usage")])
        md.append(table(["lock", "bytes per lock", "keys per lock", "MEMORY USAGE"], rows))
        md.append("")
    # server time per call after an idle pause
    if series_of(m, "server_time"):
        md.append("**Server time per call, 2 ms after the previous request** (`server_time`: "
                  "the slow log's execution time, the idle a handoff meets)")
        md.append("")
        rows = []
        for s in series_of(m, "server_time"):
            rows.append([s, us(g("server_time", s, "p50_us")), us(g("server_time", s, "p90_us")),
                         num(g("server_time", s, "ratio_to_raw_release"), "x")])
        md.append(table(["call", "p50", "p90", "p50 / raw release"], rows))
        md.append("")
    # other scenarios: a compact dump
    other = [sc for sc in ("rwlock", "semaphore", "redlock", "idworker") if series_of(m, sc)]
    if other:
        md.append("**Other scenarios of the same run** (issues 4 to 6)")
        md.append("")
        rows = []
        for sc in other:
            for s in series_of(m, sc):
                rate = None
                for (sc2, se, n), v in m.items():
                    if sc2 == sc and se == s and n.endswith("_per_s") and "_min" not in n:
                        rate = (n, v)
                ratio = [(n, v) for (sc2, se, n), v in m.items()
                         if sc2 == sc and se == s and n.startswith("ratio_to_")]
                rows.append([sc, s, "%s %s" % (num(rate[1]), rate[0].replace("_per_s", "/s"))
                             if rate else "-", us(g(sc, s, "p50_us")), us(g(sc, s, "p99_us")),
                             ("%s %s" % (num(ratio[0][1], "x"), ratio[0][0].replace("ratio_to_", "/ ")))
                             if ratio else "-"])
        md.append(table(["scenario", "series", "rate", "p50", "p99", "ratio"], rows,
                        ["---", "---", "---:", "---:", "---:", "---:"]))
        md.append("")
    # targets
    t = targets_from_output(out_txt)
    if t:
        md.append("**Targets**, as printed by the run:")
        md.append("")
        md.append(table(["target", "measured", ""], t, ["---", "---:", "---"]))
        md.append("")
    return "\n".join(md)


def charts(m, png_dir, rel_dir):
    out = {}
    gp = shutil.which("gnuplot")
    if not gp:
        print("report: gnuplot not found (apt-get install gnuplot-nox): no charts", file=sys.stderr)
        return out
    tmp = tempfile.mkdtemp(prefix="dlock-report.")
    try:
        rows = [(label, m.get((sc, s, "p50_us")), m.get((sc, s, "p99_us")))
                for sc, s, label in HANDOFF_ORDER if m.get((sc, s, "p50_us")) is not None]
        if rows:
            dat = os.path.join(tmp, "handoff.dat")
            with open(dat, "w") as f:
                for label, p50, p99 in rows:
                    f.write('"%s" %f %f\n' % (label, p50 / 1000.0, p99 / 1000.0))
            png = os.path.join(png_dir, "bench-handoff.png")
            script = """
set terminal pngcairo size 1000,520 noenhanced font ',10'
set output '%s'
set title 'Handoff latency: A releases, B (blocked, another process) holds'
set ylabel 'ms (log scale)'
set logscale y
set yrange [0.01:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set xtics rotate by -25 scale 0
set grid ytics
set key top left
plot '%s' using 2:xtic(1) title 'p50', '' using 3 title 'p99'
""" % (png, dat)
            if run_gp(gp, script, png, tmp, "handoff") == 0:
                out["handoff"] = rel_dir + "/bench-handoff.png"
        ks = sorted({int(re.search(r"-k(\d+)$", se).group(1)) for (sc, se, _n) in m
                     if sc == "peer_contention" and re.search(r"-k(\d+)$", se)})
        present = [(s, label) for s, label in CONT_SERIES
                   if any(m.get(("peer_contention", "%s-k%d" % (s, k), "acq_per_s")) is not None
                          for k in ks)]
        if ks and present:
            dat = os.path.join(tmp, "contention.dat")
            with open(dat, "w") as f:
                for k in ks:
                    vals = [m.get(("peer_contention", "%s-k%d" % (s, k), "acq_per_s")) for s, _ in present]
                    f.write('"K=%d" %s\n' % (k, " ".join("%f" % (v if v else 0) for v in vals)))
            png = os.path.join(png_dir, "bench-contention.png")
            plots = ", ".join("'%s' using %d%s title '%s'" % (dat if i == 0 else "", i + 2,
                                                              ":xtic(1)" if i == 0 else "", label)
                              for i, (_s, label) in enumerate(present))
            script = """
set terminal pngcairo size 1000,520 noenhanced font ',10'
set output '%s'
set title 'Contention: acquisitions per second, K processes on one lock'
set ylabel 'acquisitions/s'
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics
set key top right
plot %s
""" % (png, plots)
            if run_gp(gp, script, png, tmp, "contention") == 0:
                out["contention"] = rel_dir + "/bench-contention.png"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def run_gp(gp, script, png, tmp, name):
    path = os.path.join(tmp, name + ".gp")
    with open(path, "w") as f:
        f.write(script)
    r = subprocess.run([gp, path], capture_output=True, text=True)
    if r.returncode != 0:
        # no cairo in this gnuplot build: the plain png terminal
        with open(path, "w") as f:
            f.write(script.replace("pngcairo", "png"))
        r = subprocess.run([gp, path], capture_output=True, text=True)
    if r.returncode != 0:
        print("report: gnuplot failed for %s: %s" % (name, r.stderr.strip()), file=sys.stderr)
    else:
        print("report: wrote %s" % png)
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("output")
    ap.add_argument("--md", required=True)
    ap.add_argument("--png-dir")
    ap.add_argument("--command", default="bench/suite")
    a = ap.parse_args()
    doc, m = load(a.json)
    png_dir = a.png_dir or os.path.dirname(os.path.abspath(a.md))
    os.makedirs(png_dir, exist_ok=True)
    rel = os.path.relpath(png_dir, os.path.dirname(os.path.abspath(a.md)))
    ch = charts(m, png_dir, "." if rel == "." else rel)
    ch = {k: v[2:] if v.startswith("./") else v for k, v in ch.items()}
    body = markdown(doc, m, a.output, a.command, ch)
    old = open(a.md).read() if os.path.exists(a.md) else ""
    block = BEGIN + "\n\n" + body + "\n" + END
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old + ("\n" if old and not old.endswith("\n") else "") + block + "\n"
    with open(a.md, "w") as f:
        f.write(new)
    print("report: wrote %s" % a.md)


if __name__ == "__main__":
    main()
