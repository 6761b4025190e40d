#!/usr/bin/env bash
# tessel vs JAX: the CPU training step (forward, backward, global-norm clipping, AdamW), in one
# run (docs/training.md, "Side by side with JAX"). Records
# bench/results/<UTC date>-<cores>core-cpu-train-jax/: SUMMARY.md (the table), machine.txt,
# load.txt, check-*.json (JAX's step on tessel's inputs), tessel-*.json / .txt (Google
# Benchmark) and jax-*.jsonl (bench/jax/gpt_jax.py train).
#
#   bench/jax/run_train_side_by_side.sh      # builds tessel-bench, makes the JAX venv, runs all
#   TESSEL_JAX_VENV=dir  ...                 # the venv (default ~/.cache/tessel-jax-venv)
#   TESSEL_SIDE_QUICK=1  ...                 # one round, short timings (a smoke test)
#
# Rows: {gpt example, GPT-2-small-sized block} x {1 device on core 0 (tessel one kernel thread,
# XLA --xla_cpu_multi_thread_eigen=false), data=2, model=2, data=2 with ZeRO-2 (cores 0,1; JAX
# --xla_force_host_platform_device_count=2 and the same NamedShardings, the moments sharded
# over data for ZeRO-2)}. tessel: BM_TrainSide (bench/bench_train.cpp); JAX: gpt_jax.py train.
# Both keep parameters and moments on the devices and donate them to the step.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=train-jax
quick=${TESSEL_SIDE_QUICK:-0}
# shellcheck source=bench/jax/common.sh
source bench/jax/common.sh

echo "run_train_side_by_side: recording into $out"
# The comparison's correctness: JAX's step on tessel's initial parameters and batch.
for c in 0 1; do
  mkdir -p "$out/check-$c"
  "$bench" --dump-train-step "$out/check-$c" --config "$c" > /dev/null
  "$py" bench/jax/gpt_jax.py train-check "$out/check-$c" > "$out/check-$c.json"
  rm -r "${out:?}/check-$c"
done
for r in $(seq 1 $rounds); do
  tessel train-1dev-r$r 0 'BM_TrainSide/config:[01]/mesh:0/'
  for c in example gpt2; do jax train-1dev 0 1 train --config "$c" --mesh 1; done
  tessel train-2dev-r$r 0,1 'BM_TrainSide/config:[01]/mesh:[123]/'
  for c in example gpt2; do for m in data2 model2 data2-zero2; do jax train-2dev 0,1 2 train --config "$c" --mesh "$m"; done; done
done
echo "uptime after the run: $(uptime)" >> "$out/machine.txt"

"$py" bench/jax/summarise_train.py "$out" > "$out/SUMMARY.md"
cat "$out/SUMMARY.md"
echo "recorded in $out"
