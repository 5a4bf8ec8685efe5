#!/usr/bin/env bash
# Runs the dlock benchmark against a private redis-server.
#
#   bench/run.sh [--quick] [--json FILE] [--only ping,pairs,handoff,...] [-v]
#                [--bin PATH/TO/dlock_bench]
#
# Without --bin it builds dlock_bench first (RelWithDebInfo, into
# build/bench-run). It starts redis-server on a free 127.0.0.1 port in a fresh
# temporary directory (no persistence), and 5 more for the redlock scenario
# (independent masters; not when --only leaves redlock out), waits for PING,
# runs dlock_bench, and always stops the servers and removes the directory.
# For the backends scenario (issue 9: --only backends, or full mode without
# --only) it also starts private PostgreSQL, MariaDB, ZooKeeper and etcd
# servers, whichever are installed ("SKIP <backend>: <reason>" for the others),
# and passes their URLs as --backend-urls (the scenario also runs kazoo's and
# python-etcd3's Lock on the ZooKeeper and etcd servers, full mode only).
# Exits 77 (skipped) when redis-server is not installed.
#   --disk   the backends' data on disk (under TMPDIR, /tmp by default)
#            instead of tmpfs, so that their writes pay for their fsyncs as
#            in a real deployment (etcd and ZooKeeper: one per write)
#   --quick  well under a minute, for CI: timings are printed, never asserted
#   (full mode: about 8 minutes with issue 7's peer scenarios and issue 9's
#   backends; bench/suite runs
#   bench/setup first and writes the docs' tables and charts afterwards)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=""
ARGS=()
ONLY=""
QUICK=0
DISK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --only) ONLY=$2; ARGS+=("$1" "$2"); shift 2 ;;
    --json|--series) ARGS+=("$1" "$2"); shift 2 ;;
    --quick) QUICK=1; ARGS+=("$1"); shift ;;
    --disk) DISK=1; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

REDIS_SERVER=${REDIS_SERVER:-$(command -v redis-server || true)}
if [ -z "$REDIS_SERVER" ]; then
  echo "bench: SKIP: redis-server not found (apt-get install redis-server)" >&2
  exit 77
fi

if [ -z "$BIN" ]; then
  # not build/bench: a `cmake -B build` tree puts its bench/ subdirectory there
  B="$ROOT/build/bench-run"
  cmake -S "$ROOT" -B "$B" -DDLOCK_BUILD_TESTS=OFF -DDLOCK_BUILD_EXAMPLES=OFF \
        -DDLOCK_BUILD_CLI=OFF -DDLOCK_BUILD_BENCH=ON >/dev/null
  cmake --build "$B" --target dlock_bench -j"$(nproc)" >/dev/null
  BIN="$B/bench/dlock_bench"
fi

DIR=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench.XXXXXX")
PIDS=()   # every redis-server this script started
stop_pid() {
  local pid=$1 sig=${2:-TERM}
  if kill -0 "$pid" 2>/dev/null; then
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
BKDIR=""
PG_PIDS=() # postgres: SIGINT (fast shutdown), never SIGKILL first
cleanup() {
  for pid in ${PG_PIDS[@]+"${PG_PIDS[@]}"}; do stop_pid "$pid" INT; done
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do stop_pid "$pid"; done
  rm -rf "$DIR"
  [ -z "$BKDIR" ] || rm -rf "$BKDIR"
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

# start_server NAME [ARGS...]: a redis-server on a free port with its own
# directory $DIR/NAME; sets PORT (empty on failure, the last attempt's log and
# output then on stderr). An argument @BUS@ becomes a free port chosen afresh
# at each attempt (a cluster bus port: a busy one fails every retry alike).
start_server() {
  local d="$DIR/$1" p b pid a
  shift
  mkdir -p "$d"
  PORT=""
  for _ in $(seq 20); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    port_busy "$p" && continue
    local args=()
    for a in "$@"; do
      if [ "$a" = @BUS@ ]; then
        b=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
        { [ "$b" != "$p" ] && ! port_busy "$b"; } || continue 2
        a=$b
      fi
      args+=("$a")
    done
    rm -f "$d/log" "$d/nodes.conf"
    "$REDIS_SERVER" --port "$p" --bind 127.0.0.1 --dir "$d" --save '' --appendonly no \
        --logfile "$d/log" --daemonize no ${args[@]+"${args[@]}"} >"$d/out" 2>&1 &
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
  done
  echo "bench: could not start redis-server in $d; the last attempt's output and log:" >&2
  cat "$d/out" "$d/log" >&2 2>/dev/null || true
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
    start_server "cluster$i" --cluster-enabled yes --cluster-port @BUS@ || exit 1
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

# ---- the backends scenario (issue 9): private servers of the other backends ----
# Each on a free port with its data in $BKDIR (tmpfs when /dev/shm is
# writable, so that no backend pays for disk flushes: Redis runs without
# persistence; on disk with --disk). Not installed or not starting: "SKIP <backend>: <reason>".
# Not in --quick unless asked with --only backends (java and mariadbd take
# a few seconds to start).
free_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    port_busy "$p" || { echo "$p"; return 0; }
  done
  return 1
}
# wait_for CMD PID: until CMD succeeds (30 s at most) while PID lives
wait_for() {
  for _ in $(seq 300); do
    kill -0 "$2" 2>/dev/null || return 1
    eval "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
skip() { echo "SKIP $1: $2"; }
BK_URLS=()

start_postgres() {
  local bin d p pid
  bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ] || [ ! -x "$bin/postgres" ]; then
    skip postgres "initdb/postgres not found (apt-get install postgresql)"; return 0
  fi
  d="$BKDIR/pg"
  mkdir -p "$d"
  local as=()
  if [ "$(id -u)" = 0 ]; then   # initdb refuses root: run the server as postgres
    if ! id postgres >/dev/null 2>&1 || ! command -v setpriv >/dev/null; then
      skip postgres "running as root needs the postgres user and setpriv"; return 0
    fi
    chown postgres: "$d"
    as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
  fi
  if ! (cd "$d" && ${as[@]+"${as[@]}"} "$bin/initdb" -D "$d/data" -U postgres --auth=trust \
          --no-sync --locale=C.UTF-8 >"$d/initdb.log" 2>&1); then
    skip postgres "initdb failed: $(tail -1 "$d/initdb.log")"; return 0
  fi
  for _ in 1 2 3; do
    p=$(free_port) || break
    (cd "$d" && exec ${as[@]+"${as[@]}"} "$bin/postgres" -D "$d/data" -p "$p" -k "$d" \
        -c listen_addresses=127.0.0.1 -c fsync=off >>"$d/log" 2>&1) &
    pid=$!
    PG_PIDS+=("$pid")
    if wait_for "'$bin/pg_isready' -q -h '$d' -p $p" "$pid"; then
      BK_URLS+=("postgres=postgres://postgres@127.0.0.1:$p/postgres")
      return 0
    fi
    stop_pid "$pid" INT
  done
  skip postgres "the server did not start: $(tail -1 "$d/log" 2>/dev/null)"
}

start_mysql() {
  local d="$BKDIR/my" p pid t
  for t in mariadbd mariadb-install-db mariadb-admin mariadb; do
    if ! command -v "$t" >/dev/null && [ ! -x "/usr/sbin/$t" ]; then
      skip mysql "$t not found (apt-get install mariadb-server mariadb-client)"; return 0
    fi
  done
  local mysqld
  mysqld=$(command -v mariadbd || echo /usr/sbin/mariadbd)
  mkdir -p "$d"
  if ! mariadb-install-db --no-defaults --user="$(id -un)" --datadir="$d/data" --skip-test-db \
        --auth-root-authentication-method=normal --innodb-log-file-size=16M \
        >"$d/install.log" 2>&1; then
    skip mysql "mariadb-install-db failed: $(tail -1 "$d/install.log")"; return 0
  fi
  for _ in 1 2 3; do
    p=$(free_port) || break
    "$mysqld" --no-defaults --user="$(id -un)" --datadir="$d/data" --socket="$d/sock" \
        --port="$p" --bind-address=127.0.0.1 --pid-file="$d/pid" --log-error="$d/err.log" \
        --skip-name-resolve --innodb-log-file-size=16M >/dev/null 2>&1 &
    pid=$!
    PIDS+=("$pid")
    if wait_for "mariadb-admin --no-defaults -S '$d/sock' -u root ping" "$pid"; then
      if mariadb --no-defaults -S "$d/sock" -u root -e "CREATE DATABASE bench;
            CREATE USER 'bench'@'127.0.0.1' IDENTIFIED BY 'bench';
            GRANT ALL ON bench.* TO 'bench'@'127.0.0.1'" >>"$d/install.log" 2>&1; then
        BK_URLS+=("mysql=mysql://bench:bench@127.0.0.1:$p/bench"
                  "mysql-table=mysql://bench:bench@127.0.0.1:$p/bench?lock=table")
      else
        skip mysql "could not create the bench user: $(tail -1 "$d/install.log")"
      fi
      return 0
    fi
    stop_pid "$pid"
  done
  skip mysql "mariadbd did not start: $(tail -1 "$d/err.log" 2>/dev/null)"
}

zk_ok() {
  local reply=""
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'srvr' >&3
  read -r -t 2 reply <&3 || true
  exec 3>&-
  [[ $reply == Zookeeper* ]]
}

start_zk() {
  local d="$BKDIR/zk" p pid
  local jars=${ZK_CLASSPATH:-/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar}
  if ! command -v java >/dev/null; then
    skip zk "java not found (apt-get install default-jre-headless zookeeper)"; return 0
  fi
  if [ ! -r "${jars%%:*}" ]; then skip zk "${jars%%:*} not found (apt-get install zookeeper)"; return 0; fi
  mkdir -p "$d/data"
  for _ in 1 2 3; do
    p=$(free_port) || break
    printf '%s\n' tickTime=2000 "dataDir=$d/data" "clientPort=$p" clientPortAddress=127.0.0.1 \
        admin.enableServer=false 4lw.commands.whitelist=srvr maxClientCnxns=0 >"$d/zoo.cfg"
    java -Xmx256m -cp "$jars" -Dzookeeper.jmx.log4j.disable=true \
        org.apache.zookeeper.server.ZooKeeperServerMain "$d/zoo.cfg" >>"$d/log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    if wait_for "zk_ok $p" "$pid"; then
      BK_URLS+=("zk=zk://127.0.0.1:$p/dlock-bench")
      return 0
    fi
    stop_pid "$pid"
  done
  skip zk "ZooKeeper did not start: $(tail -1 "$d/log" 2>/dev/null)"
}

start_etcd() {
  local d="$BKDIR/etcd" p peer pid
  local etcd=${ETCD:-$(command -v etcd || true)}
  if [ -z "$etcd" ]; then skip etcd "etcd not found (apt-get install etcd-server)"; return 0; fi
  if ! command -v curl >/dev/null; then skip etcd "curl not found (the readiness check)"; return 0; fi
  mkdir -p "$d"
  for _ in 1 2 3; do
    p=$(free_port) || break
    peer=$(free_port) || break
    [ "$p" = "$peer" ] && continue
    "$etcd" --name bench --data-dir "$d/data" --listen-client-urls "http://127.0.0.1:$p" \
        --advertise-client-urls "http://127.0.0.1:$p" --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "bench=http://127.0.0.1:$peer" >>"$d/log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    if wait_for "curl -sf http://127.0.0.1:$p/health | grep -q true" "$pid"; then
      BK_URLS+=("etcd=etcd://127.0.0.1:$p")
      return 0
    fi
    stop_pid "$pid"
    rm -rf "$d/data"
  done
  skip etcd "etcd did not start: $(tail -1 "$d/log" 2>/dev/null)"
}

if [[ ",$ONLY," == *,backends,* ]] || { [ -z "$ONLY" ] && [ $QUICK = 0 ]; }; then
  if [ $DISK = 0 ] && [ -w /dev/shm ]; then BKDIR=$(mktemp -d /dev/shm/dlock-bench.XXXXXX); else BKDIR="$DIR/bk"; fi
  echo "bench: backend data in $BKDIR"
  mkdir -p "$BKDIR"
  chmod 711 "$BKDIR"       # the postgres user enters its own directory in it
  [ "$BKDIR" = "$DIR/bk" ] && chmod 711 "$DIR"   # and the one above it
  t0=$(date +%s%N)
  start_postgres
  start_mysql
  start_zk
  start_etcd
  t=$(( ($(date +%s%N) - t0) / 100000000 ))
  echo "bench: backend servers started in $(( t / 10 )).$(( t % 10 )) s"
  ARGS+=(--backend-urls "$(IFS=,; echo "${BK_URLS[*]}")")
fi

set +e
"$BIN" --host 127.0.0.1 --port "$MAIN_PORT" ${ARGS[@]+"${ARGS[@]}"}
rc=$?
set -e
exit $rc
