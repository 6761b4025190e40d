// Tessel's side of the JAX comparison (bench/jax/run_side_by_side.sh, docs/cpu-backend.md):
//
// BM_GptLoaded/config:<c>/mesh:<m>: the GPT forward (models/gpt.hpp) loaded once on a
//   ThreadRuntime with one kernel thread per device, inputs already on the devices, timed per
//   LoadedExecutable::run — what JAX's jitted call on device-resident arrays does.
//   config 0: the gpt example's defaults (batch 8, seq 64, d_model 128, 4 heads, 2 layers,
//   vocab 512); 1: a GPT-2-small-sized block (batch 4, seq 256, d_model 768, 12 heads, 2
//   layers, vocab 8192). mesh 0: one device; 1: data=2; 2: model=2 (Megatron annotations).
//   attn 1: the fused attention op (the model's default, docs/attention.md); 0: the long form
//   (einsum -> scale -> causal_mask -> softmax -> einsum, compiled without the fuse-attention
//   pass), the same model before the op existed, measured in the same run.
// Counter proc_cpu_s: process CPU seconds per run (wall time on a shared machine includes
//   waiting for a core).
// BM_Matmul/shape:<s>/lib:<l>: one f32 matrix product C[M,N] = A[M,K]·B (B stored [K,N], or
//   [N,K] for the tied LM head) at the models' shapes on the calling thread: lib 0 tessel's
//   CPU einsum kernel (what the executor runs), 1 oneDNN's dnnl_sgemm, 2 OpenBLAS's
//   cblas_sgemm. The libraries are found with dlopen (libdnnl.so.3 or .2, libopenblas.so.0), so the
//   build needs neither; a missing one is reported as skipped. Run with OMP_NUM_THREADS=1 /
//   OPENBLAS_NUM_THREADS=1 (the script does) for one thread.
// BM_FmaPeak: the core's f32 peak, measured: independent vector FMA chains (AVX2+FMA, 8
//   floats per instruction; 12 accumulators cover the FMA latency x throughput).
#include <benchmark/benchmark.h>

#include <dlfcn.h>

#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "side_by_side.hpp"

namespace {

using tessel_bench::process_cpu_s;
using tessel_bench::side_config;

void BM_GptLoaded(benchmark::State& state) {
  tessel::GptConfig cfg = side_config(state.range(0));
  const int64_t m = state.range(1);
  cfg.fused_attention = state.range(2) != 0;
  const char* mesh_spec = m == 0 ? "data=1,model=1" : m == 1 ? "data=2,model=1" : "data=1,model=2";
  tessel::GptGraph g = tessel::build_gpt(cfg);
  tessel::CompileOptions co;
  co.fuse_attention = cfg.fused_attention;
  tessel::Executable exe = tessel::compile(g.graph, tessel::Mesh::parse(mesh_spec), co);
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  tessel::ThreadRuntime rt(m == 0 ? 1 : 2, ro);
  tessel::LoadedExecutable le = tessel::load(exe, rt);
  auto inputs = tessel::random_inputs(g.graph, 1234);
  tessel::gpt_init(g.graph, inputs);
  std::vector<tessel::ShardedArray> in;
  for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
  const double cpu0 = process_cpu_s();
  for (auto _ : state) {
    tessel::RunResult r = le.run(in);
    benchmark::DoNotOptimize(r);
  }
  // Process CPU seconds per run (counters are averaged over the iterations).
  state.counters["proc_cpu_s"] = benchmark::Counter(process_cpu_s() - cpu0, benchmark::Counter::kAvgIterations);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(mesh_spec);
}
BENCHMARK(BM_GptLoaded)
    ->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 0}})
    ->ArgNames({"config", "mesh", "attn"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

struct MatmulShape {
  const char* what;
  int64_t M, N, K;
  bool b_transposed;  // B stored [N, K] (the LM head: logits = x · wteᵀ)
};

// The forward's products: M = batch*seq rows; example (D 128, F 512, V 512) and GPT-2-small
// block (D 768, F 3072, V 8192).
const std::vector<MatmulShape>& matmul_shapes() {
  static const std::vector<MatmulShape> s = {
      {"example qkv/wo [512,128]x[128,128]", 512, 128, 128, false},
      {"example w1 [512,128]x[128,512]", 512, 512, 128, false},
      {"example w2 [512,512]x[512,128]", 512, 128, 512, false},
      {"example head [512,128]x[512,128]^T", 512, 512, 128, true},
      {"gpt2 qkv/wo [1024,768]x[768,768]", 1024, 768, 768, false},
      {"gpt2 w1 [1024,768]x[768,3072]", 1024, 3072, 768, false},
      {"gpt2 w2 [1024,3072]x[3072,768]", 1024, 768, 3072, false},
      {"gpt2 head [1024,768]x[8192,768]^T", 1024, 8192, 768, true},
  };
  return s;
}

using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);

// The symbol from the process (tessel links libdnnl when built with oneDNN) or from the first
// of `libs` that loads.
void* find_symbol(std::initializer_list<const char*> libs, const char* sym) {
  if (void* f = dlsym(RTLD_DEFAULT, sym)) return f;
  for (const char* lib : libs)
    if (void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL))
      if (void* f = dlsym(h, sym)) return f;
  return nullptr;
}

void BM_Matmul(benchmark::State& state) {
  const MatmulShape& s = matmul_shapes()[static_cast<std::size_t>(state.range(0))];
  const int64_t lib = state.range(1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(s.M * s.K)), b(static_cast<std::size_t>(s.K * s.N)),
      c(static_cast<std::size_t>(s.M * s.N));
  for (float& x : a) x = d(rng);
  for (float& x : b) x = d(rng);
  const char* libname[] = {"tessel einsum", "dnnl_sgemm", "openblas cblas_sgemm"};
  std::function<void()> call;
  tessel::OpAttrs at;
  at.equation = s.b_transposed ? "mk,nk->mn" : "mk,kn->mn";
  tessel::KernelArgs k;
  if (lib == 0) {
    k.kind = tessel::OpKind::Einsum;
    k.attrs = &at;
    k.in = {a.data(), b.data()};
    k.in_shapes = {{s.M, s.K}, s.b_transposed ? tessel::Shape{s.N, s.K} : tessel::Shape{s.K, s.N}};
    k.in_dtypes = {tessel::DType::f32, tessel::DType::f32};
    k.out = c.data();
    k.out_shape = {s.M, s.N};
    k.num_threads = 1;
    call = [&] { tessel::run_cpu_kernel(k); };
  } else if (lib == 1) {
    auto f = reinterpret_cast<DnnlSgemm>(find_symbol({"libdnnl.so.3", "libdnnl.so.2"}, "dnnl_sgemm"));
    if (!f) {
      state.SkipWithError("libdnnl (dnnl_sgemm) not found");
      return;
    }
    // Row-major, as tessel's tensors: C = A · op(B).
    call = [&, f] {
      f('N', s.b_transposed ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.b_transposed ? s.K : s.N,
        0.0f, c.data(), s.N);
    };
  } else {
    auto f = reinterpret_cast<CblasSgemm>(find_symbol({"libopenblas.so.0"}, "cblas_sgemm"));
    if (!f) {
      state.SkipWithError("libopenblas.so.0 not found (apt-get install libopenblas0-pthread)");
      return;
    }
    constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
    call = [&, f] {
      f(kRowMajor, kNoTrans, s.b_transposed ? kTrans : kNoTrans, int(s.M), int(s.N), int(s.K), 1.0f, a.data(),
        int(s.K), b.data(), int(s.b_transposed ? s.K : s.N), 0.0f, c.data(), int(s.N));
    };
  }
  call();  // warm-up: primitive creation, library initialisation
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * double(s.M) * double(s.N) * double(s.K), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(s.what) + " " + libname[lib]);
}
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2}})
    ->ArgNames({"shape", "lib"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

#if defined(__x86_64__)
// 12 independent FMA chains of 8 floats: 2 FMA units with a 4-5 cycle latency need >= 10 in
// flight. Each iteration is 12 FMAs = 12*8*2 flops.
__attribute__((target("avx2,fma"))) float fma_loop(int64_t iters, float seed) {
  typedef float v8 __attribute__((vector_size(32)));
  const v8 m = v8{} + 0.999999f, add = v8{} + 1e-7f;
  // Twelve named accumulators (an array of them is kept in memory by GCC, putting a store
  // and a load into every chain).
  v8 a0 = v8{} + seed, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6, a7 = a0 + 7,
     a8 = a0 + 8, a9 = a0 + 9, a10 = a0 + 10, a11 = a0 + 11;
  for (int64_t it = 0; it < iters; ++it) {
#define TESSEL_FMA(x) x = __builtin_ia32_vfmaddps256(x, m, add);
    TESSEL_FMA(a0) TESSEL_FMA(a1) TESSEL_FMA(a2) TESSEL_FMA(a3) TESSEL_FMA(a4) TESSEL_FMA(a5)
    TESSEL_FMA(a6) TESSEL_FMA(a7) TESSEL_FMA(a8) TESSEL_FMA(a9) TESSEL_FMA(a10) TESSEL_FMA(a11)
#undef TESSEL_FMA
    // Opaque to the optimiser, so that the chains really run; costs no instruction.
    asm volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8),
                 "+x"(a9), "+x"(a10), "+x"(a11));
  }
  const v8 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  float r = 0;
  for (int i = 0; i < 8; ++i) r += s[i];
  return r;
}

void BM_FmaPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    state.SkipWithError("no AVX2+FMA");
    return;
  }
  const int64_t iters = 1 << 20;
  for (auto _ : state) benchmark::DoNotOptimize(fma_loop(iters, 1.0f));
  state.counters["FLOP/s"] = benchmark::Counter(double(iters) * 12 * 8 * 2, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("AVX2 FMA, 12 chains x 8 floats");
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMicrosecond)->UseRealTime();
#endif

}  // namespace
