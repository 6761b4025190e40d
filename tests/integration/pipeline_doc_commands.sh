#!/usr/bin/env bash
# Runs the commands of docs/pipeline.md ("Run it": the indented `build/bin/...` lines) exactly as
# written, in order, from a scratch folder where build/bin points at this build's binaries. Each
# gpt_train run must pass its one-device check, print a falling loss and the schedule's table,
# and report the micro-batches in flight.
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$bin_dir" "$work/build/bin"
cd "$work"
mapfile -t cmds < <(sed -n '/^## Run it/,/^## /p' "$src/docs/pipeline.md" | grep -E '^    build/bin/' | sed 's/^    //')
[ ${#cmds[@]} -ge 3 ] || { echo "found ${#cmds[@]} commands in docs/pipeline.md, expected 3"; exit 1; }
for c in "${cmds[@]}"; do
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  echo "$out" | tail -4
  for want in '^largest relative difference from one device: .* \(ok, <= ' '\(falling\)$' '^schedule ' \
              '^bubble: .* micro-batches in flight at the peak per stage: '; do
    grep -Eq "$want" <<<"$out" || { echo "FAILED: no line matching '$want' from: $c"; exit 1; }
  done
done
echo "ran ${#cmds[@]} commands of docs/pipeline.md"
