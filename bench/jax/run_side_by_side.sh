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
root=$(pwd)
venv=${TESSEL_JAX_VENV:-$HOME/.cache/tessel-jax-venv}
quick=${TESSEL_SIDE_QUICK:-0}

# ---- the JAX venv and the libraries ----------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install -q -r bench/jax/requirements.txt
if ! ldconfig -p | grep -q libopenblas.so.0; then
  echo "run_side_by_side: installing libopenblas0-pthread for the OpenBLAS sgemm row (optional)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 ||
    echo "run_side_by_side: libopenblas not installable; the OpenBLAS rows are skipped"
fi

# ---- tessel-bench ----------------------------------------------------------------------------
if [ ! -f build/build.ninja ]; then nice -n 10 ./scripts/build >/dev/null; fi
nice -n 10 cmake --build build --target tessel_bench >/dev/null
bench=build/bin/tessel-bench

stamp=$(date -u +%Y-%m-%dT%H%M)
out=bench/results/${stamp}-$(nproc)core-cpu-jax
mkdir -p "$out"
py="$venv/bin/python"
{
  echo "date (UTC): $(date -u)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "kernel: $(uname -sr)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cpu flags (vector): $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|fma|avx512f|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
  echo "cores (nproc): $(nproc)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  echo "compiler: $(c++ --version | head -1)"
  echo "build: $(grep -m1 CMAKE_BUILD_TYPE: build/CMakeCache.txt | cut -d= -f2), TESSEL_NATIVE=$(grep -m1 TESSEL_NATIVE: build/CMakeCache.txt | cut -d= -f2)," \
       "TESSEL_WITH_ONEDNN=$(grep -m1 TESSEL_WITH_ONEDNN: build/CMakeCache.txt | cut -d= -f2)" \
       "(oneDNN $(dpkg-query -W -f='${Version}' libdnnl-dev 2>/dev/null || echo '?'))"
  echo "openblas: $(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo 'not installed')"
  echo "python: $("$py" --version 2>&1)"
  echo "jax: $("$py" -c 'import jax, jaxlib; print(jax.__version__, "jaxlib", jaxlib.__version__)')"
  echo "gpu: none (CPU only)"
  echo "uptime before the run: $(uptime)"
} > "$out/machine.txt"

# The machine is shared: tessel and JAX alternate, one repetition each per round, and the
# summary takes the median over the rounds (so that a burst of load hits both sides alike).
rounds=3; min_time=2; jax_min=2
if [ "$quick" = 1 ]; then rounds=1; min_time=0.2; jax_min=0.3; fi
# XLA: one thread per device. The non-flag token intra_op_parallelism_threads=1 ends XLA's
# flag parsing, so it goes last.
xla_single="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
load() { echo "$1: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"; }
tessel() {  # tessel NAME CPUS FILTER [more Google Benchmark flags]
  local name=$1 cpus=$2 filter=$3; shift 3
  load "tessel $name"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 taskset -c "$cpus" "$bench" --benchmark_filter="$filter" \
    --benchmark_min_time=$min_time "$@" --benchmark_out="$out/tessel-$name.json" --benchmark_out_format=json \
    > "$out/tessel-$name.txt"
}
jax() {  # jax NAME CPUS DEVICES ARGS...
  local name=$1 cpus=$2 n=$3; shift 3
  load "jax $name"
  XLA_FLAGS="--xla_force_host_platform_device_count=$n $xla_single" OMP_NUM_THREADS=1 \
    taskset -c "$cpus" "$py" bench/jax/gpt_jax.py "$@" --repeats 1 --min-time "$jax_min" >> "$out/jax-$name.jsonl"
}

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
