#!/usr/bin/env bash
# etcd: where an uncontended acquire + release spends its time (issue 22).
#
#   bench/etcd_breakdown.sh [pairs] [--bin PATH]
#
# Starts a private single-node etcd with its data on disk (a temp dir under
# $TMPDIR, else /tmp: fsyncs cost what they cost there, unlike on tmpfs), runs
# etcd_breakdown (build/test/bench/etcd_breakdown by default) against it, and
# stops it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
N=300
BIN="$here/../build/test/bench/etcd_breakdown"
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    *) N=$1; shift ;;
  esac
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
DIR=$(mktemp -d "${TMPDIR:-/tmp}/dlock-etcd-bd.XXXXXX")
PID=
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT
for _ in 1 2 3; do
  E=$(free_port); P=$(free_port)
  etcd --name bd --data-dir "$DIR/data" --listen-client-urls "http://127.0.0.1:$E" \
    --advertise-client-urls "http://127.0.0.1:$E" --listen-peer-urls "http://127.0.0.1:$P" \
    --initial-advertise-peer-urls "http://127.0.0.1:$P" --initial-cluster "bd=http://127.0.0.1:$P" \
    >"$DIR/log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$E/health" | grep -q true && break; sleep 0.1; done
  if curl -sf "http://127.0.0.1:$E/health" | grep -q true; then break; fi
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; rm -rf "$DIR/data"
done
[ -n "$PID" ] || { echo "etcd did not start: $(tail -1 "$DIR/log")" >&2; exit 1; }
echo "etcd $(etcd --version | head -1 | awk '{print $3}'), data on $(df -T "$DIR" | awk 'NR==2{print $2}'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" "http://127.0.0.1:$E" "$N"
