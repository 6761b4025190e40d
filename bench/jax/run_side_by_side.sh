#!/usr/bin/env bash
# tessel vs JAX on this machine's CPU, in one run (docs/cpu-backend.md, "Side by side with JAX").
# Records bench/results/<UTC date>-<cores>core-cpu-jax/: SUMMARY.md (the table), machine.txt,
# tessel-*.json / tessel-*.txt (Google Benchmark) and jax-*.jsonl (bench/jax/gpt_jax.py).
#
#   bench/jax/run_side_by_side.sh            # builds tessel-bench, makes the JAX venv, runs all
#   TESSEL_JAX_VENV=dir  ...                 # the venv (default ~/.cache/tessel-jax-venv)
#   TESSEL_SIDE_QUICK=1  ...                 # one repetition, short timings (a smoke test)
#
# What runs (tessel's side: bench/bench_side_by_side.cpp, bench/bench_runtime.cpp):
#  (a) GPT forward tokens/s, the gpt example's defaults and a GPT-2-small-sized block:
#      1 device pinned to core 0 (taskset -c 0; tessel one kernel thread, XLA with
#      --xla_cpu_multi_thread_eigen=false), and 2 devices on cores 0,1 (tessel mesh data=2 and
#      model=2; JAX --xla_force_host_platform_device_count=2 and jit with the same shardings).
#  (b) matmul GFLOP/s at the models' shapes on core 0, one thread: tessel's einsum kernel,
#      oneDNN's dnnl_sgemm, OpenBLAS's cblas_sgemm (if libopenblas0 is installed), and the
#      core's f32 peak measured by an FMA loop.
#  (d) tessel only: softmax, layer_norm and GELU, hand-written vs oneDNN (BM_RowOp).
#  (c) the per-run cost of a tiny program (relu + sum, sharded over N devices) on 1, 2, 8
#      devices (cores 0,1): tessel LoadedExecutable::run vs JAX's jitted call.
set -euo pipefail
cd "$(dirname "$0")/../.."
kind=jax
quick=${TESSEL_SIDE_QUICK:-0}
if ! ldconfig -p | grep -q libopenblas.so.0; then
  echo "run_side_by_side: installing libopenblas0-pthread for the OpenBLAS sgemm row (optional)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 ||
    echo "run_side_by_side: libopenblas not installable; the OpenBLAS rows are skipped"
fi
# shellcheck source=bench/jax/common.sh
source bench/jax/common.sh

echo "run_side_by_side: recording into $out"
for r in $(seq 1 $rounds); do
  # (a) GPT forward
  tessel gpt-1dev-r$r 0 'BM_GptLoaded/config:[01]/mesh:0/'
  for c in example gpt2; do jax gpt-1dev 0 1 gpt --config "$c" --mesh 1; done
  tessel gpt-2dev-r$r 0,1 'BM_GptLoaded/config:[01]/mesh:[12]/'
  for c in example gpt2; do for m in data2 model2; do jax gpt-2dev 0,1 2 gpt --config "$c" --mesh "$m"; done; done
  # (c) run overhead of a tiny program
  tessel overhead-r$r 0,1 'BM_RunOverhead/devices:[128]/async:1/'
  for n in 1 2 8; do jax overhead 0,1 "$n" overhead --devices "$n"; done
done
# (b) matmuls and the core's peak, one thread on core 0
tessel matmul 0 'BM_Matmul|BM_FmaPeak' --benchmark_repetitions=$rounds --benchmark_report_aggregates_only=true
# (d) tessel only: softmax / layer_norm / GELU, hand-written vs oneDNN (the kernel choice)
tessel rowops 0 'BM_RowOp' --benchmark_repetitions=$rounds --benchmark_report_aggregates_only=true
echo "uptime after the run: $(uptime)" >> "$out/machine.txt"

"$py" bench/jax/summarise.py "$out" > "$out/SUMMARY.md"
cat "$out/SUMMARY.md"
echo "recorded in $out"
