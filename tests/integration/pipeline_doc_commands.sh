#!/usr/bin/env bash
# Runs the commands of docs/pipeline.md (every indented `build/bin/...` and `mpirun ...` line;
# the mpirun lines skipped when TESSEL_DOC_SKIP_MPIRUN is set) exactly as written,
# in order, from a scratch folder where build/bin points at this build's binaries. Each
# gpt_train run must pass its one-device check, print a falling loss and the schedule's table,
# and report the micro-batches in flight (an --auto run the cost model's cut too); a
# tessel-explain --stages run must print its stages and the predicted step.
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$bin_dir" "$work/build/bin"
cd "$work"
mapfile -t cmds < <(grep -E '^    (build/bin/|mpirun )' "$src/docs/pipeline.md" | sed 's/^    //')
[ ${#cmds[@]} -ge 12 ] || { echo "found ${#cmds[@]} commands in docs/pipeline.md, expected 12"; exit 1; }
for c in "${cmds[@]}"; do
  if [[ $c == mpirun* && -n ${TESSEL_DOC_SKIP_MPIRUN:-} ]]; then
    echo "(skipped: $c)"
    continue
  fi
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  echo "$out" | tail -4
  wants=()
  if [[ $c == *gpt_train* ]]; then
    wants=('^largest relative difference from one device: .* \(ok, <= ' '\(falling\)$' '^schedule '
           '^bubble: .* micro-batches in flight at the peak per stage: ')
    [[ $c == *--auto* ]] && wants+=('^stages by the pieces.* times .*chosen .*equal cut')
  elif [[ $c == *tessel-explain*--stages* ]]; then
    wants=('^== pipeline stages: ' '^stage 0: pieces 0\.\.[0-9]+ on \{.*\}, sends %[a-z0-9_]+ as \[' '^predicted step: '
           '^predicted bubble: ')
  fi
  for want in "${wants[@]}"; do
    grep -Eq "$want" <<<"$out" || { echo "FAILED: no line matching '$want' from: $c"; exit 1; }
  done
done
echo "ran ${#cmds[@]} commands of docs/pipeline.md"
