#!/usr/bin/env bash
# Runs the commands of docs/pipeline.md (every indented `build/bin/...` line) exactly as written,
# in order, from a scratch folder where build/bin points at this build's binaries. Each
# gpt_train run must pass its one-device check, print a falling loss and the schedule's table,
# and report the micro-batches in flight; an --auto run must print the cost model's cut.
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$bin_dir" "$work/build/bin"
cd "$work"
mapfile -t cmds < <(grep -E '^    build/bin/' "$src/docs/pipeline.md" | sed 's/^    //')
[ ${#cmds[@]} -ge 5 ] || { echo "found ${#cmds[@]} commands in docs/pipeline.md, expected 5"; exit 1; }
for c in "${cmds[@]}"; do
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  echo "$out" | tail -4
  for want in '^largest relative difference from one device: .* \(ok, <= ' '\(falling\)$' '^schedule ' \
              '^bubble: .* micro-batches in flight at the peak per stage: '; do
    grep -Eq "$want" <<<"$out" || { echo "FAILED: no line matching '$want' from: $c"; exit 1; }
  done
  if [[ $c == *--auto* ]]; then
    grep -Eq '^stages by the cost model .*chosen .*equal cut' <<<"$out" || { echo "FAILED: no cut from: $c"; exit 1; }
  fi
done
echo "ran ${#cmds[@]} commands of docs/pipeline.md"
