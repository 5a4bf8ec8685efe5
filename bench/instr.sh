#!/usr/bin/env bash
# Instructions per operation of two builds of the library, counted by
# callgrind in the client (bench/instr.c): deterministic where timings on a
# shared machine are not, so a change of a few percent shows.
#
#   bench/instr.sh REV_A [REV_B]     (REV_B: the work tree as it is)
#
# Each side is built (RelWithDebInfo, the static library) from a clean
# export of its revision into a temporary directory; one private
# redis-server serves both. For each mode (plain, watchdog, reentrant,
# handoff) bench/instr runs under callgrind twice, with N1 and N2 operations,
# and the difference of the two totals over N2 - N1 is the count per
# operation (start-up and connection costs cancel out). Prints one table.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: bench/instr.sh REV_A [REV_B]" >&2; exit 64; }
command -v valgrind >/dev/null || { echo "bench/instr.sh: valgrind not found" >&2; exit 77; }
command -v redis-server >/dev/null || { echo "bench/instr.sh: redis-server not found" >&2; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/dlock-instr.XXXXXX")
RPID=""
cleanup() {
  if [ -n "$RPID" ]; then kill "$RPID" 2>/dev/null || true; wait "$RPID" 2>/dev/null || true; fi
  rm -rf "$T"
}
trap cleanup EXIT

build_side() { # name rev|"" -> $T/name/instr
  local name=$1 rev=$2 src=$T/$1/src
  mkdir -p "$src"
  if [ -n "$rev" ]; then
    git -C "$ROOT" archive "$rev" | tar -x -C "$src"
  else
    (cd "$ROOT" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -x -C "$src"
  fi
  cmake -S "$src" -B "$T/$name/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_BUILD_TESTS=OFF \
        -DDLOCK_BUILD_EXAMPLES=OFF -DDLOCK_BUILD_CLI=OFF -DDLOCK_BUILD_BENCH=OFF >/dev/null
  cmake --build "$T/$name/build" --target dlock_static -j"$(nproc)" >/dev/null
  # the same driver for both sides: this tree's bench/instr.c
  cc -O2 -g -I"$src/include" "$ROOT/bench/instr.c" "$T/$name/build/libdlock.a" \
     $(pkg-config --libs hiredis openssl) -lcurl -lcjson -lzookeeper_mt -lmariadb -lpq -lpthread \
     -o "$T/$name/instr" 2>/dev/null ||
  cc -O2 -g -I"$src/include" "$ROOT/bench/instr.c" "$T/$name/build/libdlock.a" \
     $(pkg-config --libs hiredis openssl) -lpthread -o "$T/$name/instr"
}

build_side a "$1"
build_side b "${2:-}"

for _ in $(seq 20); do
  PORT=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
  redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" \
      --logfile "$T/redis.log" --daemonize no >/dev/null 2>&1 &
  RPID=$!
  for _ in $(seq 50); do
    redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break 2
    kill -0 "$RPID" 2>/dev/null || break
    sleep 0.1
  done
  kill "$RPID" 2>/dev/null || true
  wait "$RPID" 2>/dev/null || true
  RPID=""
done
[ -n "$RPID" ] || { echo "bench/instr.sh: could not start redis-server" >&2; exit 1; }
URL="redis://127.0.0.1:$PORT"

count() { # side mode n -> total instructions
  local out=$T/cg.$1.$2.$3
  valgrind --tool=callgrind --callgrind-out-file="$out" "$T/$1/instr" "$URL" "$2" "$3" \
      >/dev/null 2>"$out.log" || { cat "$out.log" >&2; exit 1; }
  awk '/^summary:/ {print $2}' "$out"
}

printf '| operation | %s | %s | b / a |\n|---|---:|---:|---:|\n' "a (${1})" "b (${2:-work tree})"
for mode in plain watchdog reentrant handoff; do
  if [ "$mode" = handoff ]; then n1=20 n2=120; else n1=200 n2=1200; fi
  per=()
  for side in a b; do
    i1=$(count "$side" "$mode" "$n1")
    i2=$(count "$side" "$mode" "$n2")
    per+=($(( (i2 - i1) / (n2 - n1) )))
  done
  awk -v m="$mode" -v a="${per[0]}" -v b="${per[1]}" \
    'BEGIN { printf "| %s | %d | %d | %.3f |\n", m, a, b, b / a }'
done
