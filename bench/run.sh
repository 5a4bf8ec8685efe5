#!/usr/bin/env bash
# Runs the dlock benchmark against a private redis-server.
#
#   bench/run.sh [--quick] [--json FILE] [--only ping,pairs,handoff,...] [-v]
#                [--bin PATH/TO/dlock_bench]
#
# Without --bin it builds dlock_bench first (RelWithDebInfo, into
# build/bench). It starts redis-server on a free 127.0.0.1 port in a fresh
# temporary directory (no persistence), and 5 more for the redlock scenario
# (independent masters; not when --only leaves redlock out), waits for PING,
# runs dlock_bench, and always stops the servers and removes the directory.
# Exits 77 (skipped) when redis-server is not installed.
#   --quick  well under a minute, for CI: timings are printed, never asserted
#   (full mode: about 7 minutes with issue 7's peer scenarios; bench/suite runs
#   bench/setup first and writes the docs' tables and charts afterwards)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=""
ARGS=()
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --only) ONLY=$2; ARGS+=("$1" "$2"); shift 2 ;;
    --json|--series) ARGS+=("$1" "$2"); shift 2 ;;
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
PIDS=()   # every redis-server this script started
stop_pid() {
  local pid=$1
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
cleanup() {
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do stop_pid "$pid"; done
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

# start_server NAME: a redis-server on a free port with its own directory
# $DIR/NAME; sets PORT (empty on failure, its log then on stderr).
start_server() {
  local d="$DIR/$1" p pid
  shift
  mkdir -p "$d"
  PORT=""
  for _ in $(seq 20); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    port_busy "$p" && continue
    "$REDIS_SERVER" --port "$p" --bind 127.0.0.1 --dir "$d" --save '' --appendonly no \
        --logfile "$d/log" --daemonize no "$@" >/dev/null 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break          # died: port taken meanwhile
      if grep -q "Ready to accept" "$d/log" 2>/dev/null && ping_ok "$p" 2>/dev/null; then
        PORT=$p
        return 0
      fi
      sleep 0.05
    done
    stop_pid "$pid"
    : > "$d/log"
  done
  echo "bench: could not start redis-server; its log:" >&2
  cat "$d/log" >&2 || true
  return 1
}

start_server main || exit 1
MAIN_PORT=$PORT

# the redlock scenario's 5 independent masters
if [ -z "$ONLY" ] || [[ ",$ONLY," == *,redlock,* ]]; then
  RL=()
  for i in 1 2 3 4 5; do
    start_server "redlock$i" || exit 1
    RL+=("$PORT")
  done
  ARGS+=(--redlock-ports "$(IFS=,; echo "${RL[*]}")")
fi

# the cluster scenario's 3 masters (the bus port is given: the default,
# port + 10000, may not exist)
if [ -z "$ONLY" ] || [[ ",$ONLY," == *,cluster,* ]]; then
  CL=()
  for i in 1 2 3; do
    start_server "cluster$i" --cluster-enabled yes \
        --cluster-port $(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 )) || exit 1
    CL+=("$PORT")
  done
  if redis-cli --cluster create "${CL[@]/#/127.0.0.1:}" --cluster-yes >"$DIR/cluster.log" 2>&1; then
    for p in "${CL[@]}"; do
      for _ in $(seq 100); do
        redis-cli -p "$p" cluster info 2>/dev/null | grep -q cluster_state:ok && break
        sleep 0.05
      done
    done
    ARGS+=(--cluster-ports "$(IFS=,; echo "${CL[*]}")")
  else
    echo "bench: could not create the cluster (cluster scenario skipped):" >&2
    cat "$DIR/cluster.log" >&2
  fi
fi

set +e
"$BIN" --host 127.0.0.1 --port "$MAIN_PORT" ${ARGS[@]+"${ARGS[@]}"}
rc=$?
set -e
exit $rc
