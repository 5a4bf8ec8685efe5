#!/usr/bin/env bash
# Installs the built tree into a temporary prefix (with DESTDIR), then builds a
# program against it with pkg-config, statically and dynamically, and the
# README's C quick start (examples/quickstart.c, which must match the README's
# copy), and runs them against a private redis-server.
# usage: test_install.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 src=$2 version=$3
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not installed"; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
DESTDIR=$tmp/stage cmake --install "$build" --prefix /opt/dlock >/dev/null
root=$tmp/stage/opt/dlock
libdir=$(dirname "$(find "$root" -name dlock.pc | head -1)")/..
test -f "$root/include/dlock.h"
for h in dlock_async.h dlock_async_libuv.h dlock_async_libevent.h; do test -f "$root/include/$h"; done
test -f "$libdir/libdlock.a"
ls "$libdir"/libdlock.so.* >/dev/null
# dlock.pc is relocatable: found wherever the tree was put
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion dlock)" = "$version" ]
cc -Wall -Werror "$src/tests/install/hello.c" -o "$tmp/hello-shared" $(pkg-config --cflags --libs dlock)
cc -Wall -Werror "$src/tests/install/hello.c" -o "$tmp/hello-static" $(pkg-config --cflags dlock) \
   "$libdir/libdlock.a" $(pkg-config --libs-only-l --static dlock | sed 's/-ldlock//')
cc -Wall -Werror "$src/tests/install/hello_async.c" -o "$tmp/hello-async" \
   $(pkg-config --cflags --libs dlock) -Wl,-rpath,"$(pkg-config --variable=libdir dlock)"
# the adapters compile against the installed header and their loop's (when found)
for a in libuv:dlock_async_libuv.h libevent:dlock_async_libevent.h; do
  if pkg-config --exists "${a%%:*}"; then
    printf '#include <%s>\nint main(void) { return 0; }\n' "${a#*:}" |
      cc -Wall -Wextra -Werror -Wno-unused-function -x c - -o "$tmp/adapter" \
         $(pkg-config --cflags --libs dlock "${a%%:*}")
  fi
done
# the README's C quick start is examples/quickstart.c, built as the README says,
# with the rpath it gives for a prefix the system does not search
cc -Wall -Wextra -Werror "$src/examples/quickstart.c" -o "$tmp/quickstart" \
   $(pkg-config --cflags --libs dlock) -Wl,-rpath,"$(pkg-config --variable=libdir dlock)"
python3 - "$src/README.md" "$src/examples/quickstart.c" <<'PYEOF'
import sys
readme, prog = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sec = readme[readme.index("## Quick start: C"):]
block = sec[sec.index("```c\n") + 5:]
block = block[:block.index("```")]
if block != prog:
    sys.exit("FAIL: the README's C quick start differs from examples/quickstart.c")
PYEOF
# only the public API is exported from the shared library
bad=$(nm -D --defined-only "$libdir"/libdlock.so.* | awk '$2 ~ /[TDB]/ {print $3}' | grep -v '^dlock_' || true)
[ -z "$bad" ] || { echo "FAIL: non-API symbols exported: $bad"; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save '' --logfile "$tmp/log" & pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
LD_LIBRARY_PATH=$libdir "$tmp/hello-shared" "$version" "redis://127.0.0.1:$port"
"$tmp/hello-static" "$version" "redis://127.0.0.1:$port"
"$tmp/hello-async" "redis://127.0.0.1:$port" | grep -q '^hello_async: acquired, fence [0-9]'
# docs/async.md's libuv and libevent examples, built and run as they stand
for a in libuv libevent; do
  pkg-config --exists "$a" || continue
  python3 - "$src/docs/async.md" "$a" > "$tmp/example-$a.c" <<'PYEOF'
import sys
doc, lib = open(sys.argv[1]).read(), sys.argv[2]
sec = doc[doc.index("## " + lib + "\n"):]
block = sec[sec.index("```c\n") + 5:]
sys.stdout.write(block[:block.index("```")])
PYEOF
  cc -Wall -Wextra -Werror "$tmp/example-$a.c" -o "$tmp/example-$a" \
     $(pkg-config --cflags --libs dlock "$a") -Wl,-rpath,"$(pkg-config --variable=libdir dlock)"
  DLOCK_URL="redis://127.0.0.1:$port" timeout 20 "$tmp/example-$a" > "$tmp/example-$a.out"
  grep -q '^holding, fencing token [0-9]' "$tmp/example-$a.out"
  grep -q '^released: ' "$tmp/example-$a.out"
done
[ "$(redis-cli -p "$port" exists hello-async)" = 0 ]   # released
DLOCK_URL="redis://127.0.0.1:$port" "$tmp/quickstart" | grep -q '^holding the lock, fencing token [0-9]'
[ "$(redis-cli -p "$port" exists order:voucher:42)" = 0 ]   # released
# the CLI and its man page are installed too
if [ -x "$root/bin/dlock" ]; then
  test -f "$root/share/man/man1/dlock.1"
fi
echo "install test: ok"
