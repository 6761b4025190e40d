#!/usr/bin/env bash
# Before/after of the kernel changes, in one run: tessel-bench built at three states
# (0: commit 0fb1ffe, the baseline; A: + gelu_grad vectorised, f7eee9b's library; B: + softmax_grad,
# layer_norm_grad and adamw vectorised, commit a85b279), run alternately, 3 rounds, BM_TrainSide
# pinned as in the side by side.
# usage: before-after.sh OUTDIR BIN0 BINA BINB
# This run: before-after.sh bench/results/2026-11-26T0857-2core-cpu-train-jax /tmp/tb-0 /tmp/tb-A /tmp/tb-B,
# right after bench/jax/run_train_side_by_side.sh had recorded the rest of the folder.
set -euo pipefail
out=$1; shift
names=(0 A B); bins=("$@")
for r in 1 2 3; do
  for k in 0 1 2; do
    n=${names[$k]}; b=${bins[$k]}
    echo "r$r $n 1dev: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/before-after-load.txt"
    OMP_NUM_THREADS=1 taskset -c 0 "$b" --benchmark_filter='BM_TrainSide/config:[01]/mesh:0/' --benchmark_min_time=2 \
      --benchmark_out="$out/before-after-$n-1dev-r$r.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "r$r $n 2dev: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/before-after-load.txt"
    OMP_NUM_THREADS=1 taskset -c 0,1 "$b" --benchmark_filter='BM_TrainSide/config:0/mesh:[123]/' --benchmark_min_time=2 \
      --benchmark_out="$out/before-after-$n-2dev-r$r.json" --benchmark_out_format=json > /dev/null 2>&1
  done
done
