#!/usr/bin/env bash
# Runs the dlock benchmark against a private redis-server.
#
#   bench/run.sh [--quick] [--json FILE] [--only ping,pairs,handoff] [-v]
#                [--bin PATH/TO/dlock_bench]
#
# Without --bin it builds dlock_bench first (RelWithDebInfo, into
# build/bench). It starts redis-server on a free 127.0.0.1 port in a fresh
# temporary directory (no persistence), waits for PING, runs dlock_bench, and
# always stops the server and removes the directory. Exits 77 (skipped) when
# redis-server is not installed.
#   --quick  well under a minute, for CI: timings are printed, never asserted
#   (full mode: about two minutes)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --json|--only) ARGS+=("$1" "$2"); shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

REDIS_SERVER=${REDIS_SERVER:-$(command -v redis-server || true)}
if [ -z "$REDIS_SERVER" ]; then
  echo "bench: SKIP: redis-server not found (apt-get install redis-server)" >&2
  exit 77
fi

if [ -z "$BIN" ]; then
  B="$ROOT/build/bench"
  cmake -S "$ROOT" -B "$B" -DDLOCK_BUILD_TESTS=OFF -DDLOCK_BUILD_EXAMPLES=OFF \
        -DDLOCK_BUILD_CLI=OFF -DDLOCK_BUILD_BENCH=ON >/dev/null
  cmake --build "$B" --target dlock_bench -j"$(nproc)" >/dev/null
  BIN="$B/bench/dlock_bench"
fi

DIR=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench.XXXXXX")
PID=""
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1 if something answers on 127.0.0.1:$1
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# PONG from 127.0.0.1:$1
ping_ok() {
  local reply=""
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'PING\r\n' >&3
  read -r -t 1 reply <&3 || true
  exec 3>&-
  [[ $reply == +PONG* ]]
}

PORT=""
for _ in $(seq 20); do
  p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
  port_busy "$p" && continue
  "$REDIS_SERVER" --port "$p" --bind 127.0.0.1 --dir "$DIR" --save '' --appendonly no \
      --logfile "$DIR/log" --daemonize no >/dev/null 2>&1 &
  PID=$!
  for _ in $(seq 100); do
    kill -0 "$PID" 2>/dev/null || break          # died: port taken meanwhile
    if grep -q "Ready to accept" "$DIR/log" 2>/dev/null && ping_ok "$p" 2>/dev/null; then
      PORT=$p
      break
    fi
    sleep 0.05
  done
  [ -n "$PORT" ] && break
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
  : > "$DIR/log"
done
if [ -z "$PORT" ]; then
  echo "bench: could not start redis-server; its log:" >&2
  cat "$DIR/log" >&2 || true
  exit 1
fi

set +e
"$BIN" --host 127.0.0.1 --port "$PORT" ${ARGS[@]+"${ARGS[@]}"}
rc=$?
set -e
exit $rc
