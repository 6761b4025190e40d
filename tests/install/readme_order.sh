#!/bin/sh
# The README's install route after its demo command, on a fresh clone of this commit (issue 36
# item 3): ./scripts/demo builds only the demo; a plain `cmake --install build` must then stop
# naming what is not built and how to build it; ./scripts/install PREFIX must build the rest and
# install the library, its package config and every tool; a find_package(tessel) consumer
# must build and run against PREFIX, and every tool must run from PREFIX/bin.
#   sh readme_order.sh SOURCE_DIR WORK_DIR "TOOL TOOL ..."
set -eu
src=$1 work=$2 tools=$3
rm -rf "$work"
mkdir -p "$work"
git clone --quiet "$src" "$work/clone"
cd "$work/clone"
echo "== ./scripts/demo (fresh clone of $(git rev-parse --short HEAD))"
./scripts/demo > "$work/demo.txt" 2>&1 || { cat "$work/demo.txt"; echo "FAIL: ./scripts/demo"; exit 1; }
tail -3 "$work/demo.txt"
echo "== cmake --install build before the rest is built: refused with the command to run"
if cmake --install build --prefix "$work/early" > "$work/early.txt" 2>&1; then
  cat "$work/early.txt"; echo "FAIL: cmake --install after the demo alone succeeded"; exit 1
fi
# (CMake wraps the message over lines: read it as one.)
tr -s ' \n' ' ' < "$work/early.txt" | grep -q "tessel: not built yet: .*scripts/install PREFIX" ||
  { cat "$work/early.txt"; echo "FAIL: the install error does not name what is missing and scripts/install"; exit 1; }
! grep -q "Installing:" "$work/early.txt" ||
  { cat "$work/early.txt"; echo "FAIL: the refused install installed files before it stopped"; exit 1; }
echo "== ./scripts/install $work/prefix"
./scripts/install "$work/prefix" > "$work/install.txt" 2>&1 || { cat "$work/install.txt"; echo "FAIL: scripts/install"; exit 1; }
tail -1 "$work/install.txt"
for t in $tools; do
  [ -x "$work/prefix/bin/$t" ] || { echo "FAIL: $t is not in $work/prefix/bin"; ls "$work/prefix/bin"; exit 1; }
  "$work/prefix/bin/$t" --help > /dev/null || { echo "FAIL: $work/prefix/bin/$t --help"; exit 1; }
done
echo "tools installed: $tools"
echo "== a find_package(tessel) consumer against $work/prefix"
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF > "$work/consumer.txt" 2>&1 &&
  cmake --build "$work/consumer" >> "$work/consumer.txt" 2>&1 || { cat "$work/consumer.txt"; echo "FAIL: the consumer did not build"; exit 1; }
"$work/consumer/consumer" > "$work/consumer-run.txt" 2>&1 || { cat "$work/consumer-run.txt"; echo "FAIL: the consumer did not run"; exit 1; }
grep -q "collectives: all-gather=[0-9]* all-reduce=[0-9]*" "$work/consumer-run.txt" ||
  { cat "$work/consumer-run.txt"; echo "FAIL: the consumer printed no collectives line"; exit 1; }
echo "PASS: demo, then scripts/install, then a consumer and every tool"
rm -rf "$work/clone" "$work/consumer"
