#!/usr/bin/env bash
# tessel vs JAX: a decode step with a KV cache on one CPU core, in one run (docs/inference.md,
# "Decode beside JAX"). Records bench/results/<UTC date>-<cores>core-cpu-decode-jax/:
# SUMMARY.md (the table), machine.txt, load.txt, tessel-*.json / .txt (Google Benchmark) and
# jax-*.jsonl (bench/jax/gpt_jax.py decode).
#
#   bench/jax/run_decode_side_by_side.sh     # builds tessel-bench, makes the JAX venv, runs all
#   TESSEL_JAX_VENV=dir  ...                 # the venv (default ~/.cache/tessel-jax-venv)
#   TESSEL_SIDE_QUICK=1  ...                 # one round, short timings (a smoke test)
#
# Rows: {gpt example, GPT-2-small-sized block} x {batch 1, batch 16}, one device pinned to core
# 0 (tessel one kernel thread; XLA --xla_cpu_multi_thread_eigen=false). tessel: BM_DecodeSide
# (bench/bench_decode.cpp, the decode program of build_gpt_infer, the cache donated); JAX:
# gpt_jax.py decode (the same step jitted, the cache donated, its update a scatter). Both take
# the tokens from the host and wait for the logits each step. f32.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=decode-jax
quick=${TESSEL_SIDE_QUICK:-0}
# shellcheck source=bench/jax/common.sh
source bench/jax/common.sh

echo "run_decode_side_by_side: recording into $out"
for r in $(seq 1 $rounds); do
  tessel decode-r$r 0 'BM_DecodeSide/'
  for c in example gpt2; do for b in 1 16; do jax decode 0 1 decode --config "$c" --batch "$b"; done; done
done
echo "uptime after the run: $(uptime)" >> "$out/machine.txt"

"$py" bench/jax/summarise_decode.py "$out" > "$out/SUMMARY.md"
cat "$out/SUMMARY.md"
echo "recorded in $out"
