#!/usr/bin/env bash
# Runs the GPT-2 `gpt --write-graph` and `tessel-explain` lines of docs/auto-sharding.md
# exactly as written, from a scratch folder where build/bin points at this build's binaries,
# and checks that the automatic plan's cost per device (compute + collectives, the last
# "compute_s=... comm_s=..." line of each explanation) is at most the hand plan's.
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$bin_dir" "$work/build/bin"
cd "$work"
mapfile -t cmds < <(grep -E '^build/bin/(gpt|tessel-explain) .*gpt2_(hand|batch)' "$src/docs/auto-sharding.md")
[ ${#cmds[@]} -eq 4 ] || { echo "found ${#cmds[@]} GPT-2 commands in docs/auto-sharding.md, expected 4"; exit 1; }
declare -A cost
for c in "${cmds[@]}"; do
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  if [[ $c == *tessel-explain* ]]; then
    echo "$out" | grep -E "^(== auto-sharding|predicted per device|flops=|collectives:)" || true
    line=$(grep -E '^flops=.* compute_s=.* comm_s=' <<<"$out" | tail -1)
    [ -n "$line" ] || { echo "no cost line in the explanation"; exit 1; }
    total=$(sed -E 's/.*compute_s=([^ ]+) comm_s=([^ ]+).*/\1 \2/' <<<"$line" | awk '{printf "%.9g", $1 + $2}')
    if [[ $c == *--auto* ]]; then
      grep -q "^== chosen layouts" <<<"$out" || { echo "no chosen layouts"; exit 1; }
      grep -q "^== why" <<<"$out" || { echo "no why section"; exit 1; }
      cost[auto]=$total
    else
      cost[hand]=$total
    fi
  else
    echo "$out"
  fi
done
echo "cost per device: hand ${cost[hand]} s, auto ${cost[auto]} s"
awk -v a="${cost[auto]}" -v h="${cost[hand]}" 'BEGIN { if (a > h) { print "FAILED: the automatic plan costs more than the hand plan"; exit 1 } printf "auto / hand = %.3f\n", a / h }'
