#!/bin/sh
# Builds the libFuzzer targets with clang (-DDLOCK_FUZZ=ON) and runs each for a
# bounded time, starting from the seed corpus (copied: the repository's corpus
# is not modified). Prints one line per target:
#   "<target>: executions N, crashes C, corpus K, seconds S"
# Usage: tests/fuzz/run.sh [SECONDS per target, default 20] [BUILD_DIR]
#        (TARGETS="cli url" tests/fuzz/run.sh ... runs only those)
# Exit status 1 if any target crashed (reproducer in BUILD_DIR/fuzz-out/).
set -eu
secs=${1:-20}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${2:-/tmp/dlock-fuzz-build}
out="$build/fuzz-out"
command -v clang >/dev/null 2>&1 || { echo "SKIP: clang not found"; exit 77; }

cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DDLOCK_FUZZ=ON -DDLOCK_WERROR=ON \
      -DDLOCK_BUILD_EXAMPLES=OFF -DDLOCK_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target fuzz_duration fuzz_url fuzz_reply fuzz_cli >/dev/null

mkdir -p "$out"
status=0
for t in ${TARGETS:-duration url reply cli}; do
    work="$out/$t"
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/crashes"
    cp "$here/corpus/$t/"* "$work/corpus/"
    exe=$(find "$build" -type f -name "fuzz_$t" -perm -u+x | head -n 1)
    log="$work/log.txt"
    # -timeout: one input may take at most 10 s (the reply target waits on
    # short command timeouts); -rss_limit_mb: a generous bound. The cli
    # target prints the tool's help and messages: -close_fd_mask=3 drops them
    # (libFuzzer's own report still goes to the log).
    mask=0
    [ "$t" = cli ] && mask=3
    dict=
    [ -f "$here/$t.dict" ] && dict="-dict=$here/$t.dict"
    set +e
    "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
           -close_fd_mask=$mask $dict -artifact_prefix="$work/crashes/" "$work/corpus" \
           </dev/null >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    crashes=$(find "$work/crashes" -type f | wc -l)
    corpus=$(find "$work/corpus" -type f | wc -l)
    echo "$t: executions ${execs:-?}, crashes $crashes, corpus $corpus, seconds $secs (exit $rc)"
    if [ "$crashes" -gt 0 ] || [ "$rc" -ne 0 ]; then
        status=1
        grep -m 3 -E "ERROR|SUMMARY|deadly signal" "$log" || true
        echo "  reproducer(s): $work/crashes/ ; log: $log"
    fi
done
exit $status
