#!/usr/bin/env bash
# Runs docs/auto-sharding.md's --write-problem commands exactly as written (the lines starting
# `build/bin/tessel-explain tests/golden/megatron_mlp_open.tsl` and `build/bin/tessel-iopddl
# mlp.json`), from a scratch folder where build/bin and tests/golden point at this build and the
# source: the problem is written and tessel-iopddl proves its optimum.
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build" "$work/tests"
ln -s "$bin_dir" "$work/build/bin"
ln -s "$src/tests/golden" "$work/tests/golden"
cd "$work"
mapfile -t cmds < <(grep -E '^build/bin/(tessel-explain tests/golden/megatron_mlp_open\.tsl .*--write-problem|tessel-iopddl mlp\.json)' \
                    "$src/docs/auto-sharding.md")
[ ${#cmds[@]} -eq 2 ] || { echo "found ${#cmds[@]} --write-problem commands in docs/auto-sharding.md, expected 2"; exit 1; }
out=""
for c in "${cmds[@]}"; do
  echo "\$ $c"
  out+=$(bash -c "$c" 2>&1)$'\n' || { echo "$out"; echo "FAILED: $c"; exit 1; }
done
echo "$out" | tail -4
grep -q "wrote the automatic-sharding problem of tests/golden/megatron_mlp_open.tsl" <<<"$out" || { echo "FAILED: no problem written"; exit 1; }
grep -Eq "tessel-iopddl: .*: optimal, cost [0-9]+" <<<"$out" || { echo "FAILED: tessel-iopddl did not prove the optimum"; exit 1; }
echo "ran the 2 --write-problem commands of docs/auto-sharding.md"
