#!/usr/bin/env bash
# gpt_train's default model on data=2,model=2 (4 CPU devices), the hand layouts (Megatron,
# --zero 0) and --auto alternating, 5 rounds of 30 steps each; then --auto --links default
# (the H100 figures the plan used before issue 36) once. The cost model's cache is this folder's
# cache/ (the first --auto run measures and writes it, the others read it).
#   bash bench/results/2026-12-03T0745-2core-xeon-gpt-train-auto/run.sh SET   (from the repository root)
# SET names the files of one run of the script: set<SET>-hand-<round>.txt, set<SET>-auto-<round>.txt.
set -euo pipefail
d=$(dirname "$0")
set_=$1
export TESSEL_CACHE_DIR="$d/cache-set$set_"
rm -rf "$TESSEL_CACHE_DIR"
{ date -u; uname -a; lscpu | grep -E 'Model name|^CPU\(s\)'; uptime; git rev-parse HEAD; git status --short | head -3; } > "$d/set$set_-machine.txt"
for r in 1 2 3 4 5; do
  if [ $((r % 2)) -eq 1 ]; then order="hand auto"; else order="auto hand"; fi
  for k in $order; do
    flags=""; [ "$k" = auto ] && flags="--auto"
    build/bin/gpt_train --steps 30 --out "" --seed $r $flags > "$d/set$set_-$k-$r.txt" 2>&1
  done
done
build/bin/gpt_train --steps 30 --out "" --seed 1 --auto --links default > "$d/set$set_-auto-h100-figures-1.txt" 2>&1
uptime >> "$d/set$set_-machine.txt"
grep -H "step time" "$d"/set$set_-*.txt > "$d/set$set_-step-times.txt"
