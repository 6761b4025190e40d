# Shared by bench/jax/run_side_by_side.sh (the forward) and run_train_side_by_side.sh (the
# training step), sourced from the repository root with `kind` set (the results folder's suffix)
# and `quick` (1: a smoke test): makes the JAX venv, builds tessel-bench, creates
# bench/results/<UTC date>-<cores>core-cpu-<kind>/ as $out with machine.txt, and defines
#   tessel NAME CPUS FILTER [flags]  Google Benchmark entries pinned to CPUS (tessel-NAME.json/.txt)
#   jax NAME CPUS DEVICES ARGS...    gpt_jax.py ARGS on DEVICES host devices (jax-NAME.jsonl)
#   load WHAT                        the load average, appended to load.txt
# and rounds / min_time / jax_min.
venv=${TESSEL_JAX_VENV:-$HOME/.cache/tessel-jax-venv}

# ---- the JAX venv --------------------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install -q -r bench/jax/requirements.txt

# ---- tessel-bench ----------------------------------------------------------------------------
if [ ! -f build/build.ninja ]; then nice -n 10 ./scripts/build >/dev/null; fi
nice -n 10 cmake --build build --target tessel_bench >/dev/null
bench=build/bin/tessel-bench

stamp=$(date -u +%Y-%m-%dT%H%M)
out=bench/results/${stamp}-$(nproc)core-cpu-${kind}
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

