// tessel-bench-gpu: the GPU benchmarks of issue 8 (built only with tessel::cuda; every
// benchmark stops with an error without a GPU). scripts/bench-gpu runs them and records the
// results with the device name (docs/backend-cuda.md, "Benchmarks").
//
//  * BM_EinsumBf16/<case> vs BM_CublasLtBf16/<case>: the CUDA backend's einsum kernel
//    (cuBLASLt underneath, with tessel's layout mapping, descriptor cache and heuristic
//    choice) against a direct cuBLASLt matmul of the same shape (row-major [M,K]·[K,N] in
//    bf16, f32 accumulation, the heuristic's first algorithm, the same 32 MiB workspace) in the
//    same run. Cases: the GPT-2 124M linear layers at 8×1024 tokens and one GPT-3 175B layer's
//    at 2048 tokens. Counter FLOP/s = 2·M·N·K per call over wall time; each iteration enqueues
//    kReps calls then synchronises once, so the host sync is amortised alike on both sides.
//    The ratio einsum / cuBLASLt per case is the figure of merit (target >= 0.9).
//  * BM_Gpt2Forward: the GPT-2 124M forward to the loss (batch 8 × 1024 tokens, 12 layers,
//    d 768, 12 heads, vocab 50257, bf16 weights and activations) on one device of a
//    CudaRuntime (load once, device-resident inputs, one run per iteration). Counters:
//    tokens/s, model FLOP/s (the lowered program's kernel flops per step) and MFU against the
//    bf16 GEMM ceiling measured in the same run (cuBLASLt 8192³, BM_GemmCeiling).
//  * BM_AllReduce / BM_AllGather /<devices>/<bytes>: the virtual-device communicator on one
//    GPU; counter busbw as nccl-tests defines it (all-reduce 2(n-1)/n · bytes / t, all-gather
//    (n-1)/n · n·bytes / t).
//  * BM_Attention/forward and BM_Attention/backward: the fused attention kernels (src/runtime/cuda/kernels/attention.cu,
//    FlashAttention-2 on mma.sync) at GPT-2 124M's shape, [8, 12, 1024, 64] bf16, causal, layout
//    bshd, through the backend's kernel call (the backward's D_i scratch included). Counters FLOP/s
//    and TFLOP/s, causal-counted as FlashAttention reports: 4 (forward) or 10 (backward) flops per
//    kept (query, key) pair and head-dim element (targets on H100/H200: >= 200 and >= 150 TFLOP/s).
//  * BM_CollectiveMatmulCuda/<graph>/<devices>: issue 9's benchmark on the GPU — the Megatron
//    MLP (T 8192, D 4096, F 16384) and the transformer block (T 4096, D 4096, 32 heads of 128,
//    F 16384) in bf16 on 2, 4, 8 devices (one per GPU when there are enough, else virtual
//    devices): step time with the collective-matmul pass off, uni, bi and auto, round robin;
//    speedups over off.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <cstdio>
#include <string>
#include <vector>

#include "../collective_matmul_graphs.hpp"
#include "tessel/passes/collective_matmul.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

namespace {

constexpr int kReps = 10;
constexpr std::size_t kWorkspace = std::size_t{32} << 20;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(fmt::format("{}: cublas status {}", what, static_cast<int>(s)));
}

// Ends the benchmark with the reason when there is no GPU (the binary still lists them).
bool need_gpu(benchmark::State& state) {
  if (tessel::cuda_device_count() > 0) return true;
  state.SkipWithError("no CUDA GPU is visible to this process");
  return false;
}

struct GemmCase {
  const char* name;
  int64_t m, k, n;  // row-major [m,k]·[k,n]
};

const std::vector<GemmCase>& gemm_cases() {
  static const std::vector<GemmCase> c = {
      // GPT-2 124M, 8 × 1024 tokens: q/k/v (each d->d), MLP up and down, the tied LM head.
      {"gpt2_qkv_8x1024x768x768", 8192, 768, 768},
      {"gpt2_mlp_up_8x1024x768x3072", 8192, 768, 3072},
      {"gpt2_mlp_down_8x1024x3072x768", 8192, 3072, 768},
      {"gpt2_lm_head_8x1024x768x50257", 8192, 768, 50257},
      // GPT-3 175B, one layer at 2048 tokens: fused qkv, MLP up and down.
      {"gpt3_qkv_2048x12288x36864", 2048, 12288, 36864},
      {"gpt3_mlp_up_2048x12288x49152", 2048, 12288, 49152},
      {"gpt3_mlp_down_2048x49152x12288", 2048, 49152, 12288},
      // The ceiling of MFU: a large square GEMM.
      {"square_8192", 8192, 8192, 8192},
  };
  return c;
}

// Random bf16 in [-1, 1), made once per (size, seed): Google Benchmark calls a benchmark several
// times to size its iterations, and drawing the GPT-3 shapes' 450M values takes seconds each time.
const std::vector<uint16_t>& random_bf16(std::size_t n, uint64_t seed) {
  static std::map<std::pair<std::size_t, uint64_t>, std::vector<uint16_t>> made;
  auto it = made.find({n, seed});
  if (it != made.end()) return it->second;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) {  // round to nearest even, as HostTensor does
    uint32_t bits;
    const float f = u(rng);
    std::memcpy(&bits, &f, 4);
    v[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
  return made.emplace(std::make_pair(n, seed), std::move(v)).first->second;
}

// ---- cuBLASLt directly -------------------------------------------------------------------------

struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  cudaStream_t stream = nullptr;
  void *da = nullptr, *db = nullptr, *dc = nullptr;
  float alpha = 1, beta = 0;

  // Row-major C[m,n] = A[m,k]·B[k,n] is column-major C^T[n,m] = B^T[n,k]·A^T[k,m]: B's buffer
  // is cuBLAS's first operand (n×k, ld n), A's the second (k×m, ld k), no transposes.
  explicit LtGemm(const GemmCase& g) {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_lt(cublasLtCreate(&handle), "cublasLtCreate");
    check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check_lt(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.k), g.n),
             "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, static_cast<uint64_t>(g.k), static_cast<uint64_t>(g.m), g.k),
             "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.m), g.n),
             "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    std::size_t wsb = kWorkspace;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)),
             "workspace preference");
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, 1, &res, &found), "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1) throw std::runtime_error(fmt::format("cuBLASLt has no algorithm for {}", g.name));
    algo = res.algo;
    const auto ma = static_cast<std::size_t>(g.m * g.k), mb = static_cast<std::size_t>(g.k * g.n),
               mc = static_cast<std::size_t>(g.m * g.n);
    check_cuda(cudaMalloc(&ws, kWorkspace), "cudaMalloc workspace");
    check_cuda(cudaMalloc(&da, ma * 2), "cudaMalloc A");
    check_cuda(cudaMalloc(&db, mb * 2), "cudaMalloc B");
    check_cuda(cudaMalloc(&dc, mc * 2), "cudaMalloc C");
    const auto &ha = random_bf16(ma, 1), &hb = random_bf16(mb, 2);
    check_cuda(cudaMemcpy(da, ha.data(), ma * 2, cudaMemcpyHostToDevice), "copy A");
    check_cuda(cudaMemcpy(db, hb.data(), mb * 2, cudaMemcpyHostToDevice), "copy B");
  }
  ~LtGemm() {
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(ws);
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    cudaStreamDestroy(stream);
  }
  void run() {
    check_lt(cublasLtMatmul(handle, desc, &alpha, db, a, da, b, &beta, dc, c, dc, c, &algo, ws, kWorkspace, stream),
             "cublasLtMatmul");
  }
  void sync() { check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

double flops_of(const GemmCase& g) { return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k); }

void BM_CublasLtBf16(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const GemmCase& g = gemm_cases()[static_cast<std::size_t>(state.range(0))];
  state.SetLabel(g.name);
  LtGemm lt(g);
  lt.run();
  lt.sync();
  for (auto _ : state) {
    for (int r = 0; r < kReps; ++r) lt.run();
    lt.sync();
  }
  state.counters["FLOP/s"] = benchmark::Counter(flops_of(g) * kReps, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- tessel's einsum kernel --------------------------------------------------------------------

void BM_EinsumBf16(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const GemmCase& g = gemm_cases()[static_cast<std::size_t>(state.range(0))];
  state.SetLabel(g.name);
  tessel::CudaBackendOptions bo;  // TESSEL_GEMM_PAD_MIN_FLOPS: CudaBackendOptions::gemm_pad_min_flops
  if (const char* e = std::getenv("TESSEL_GEMM_PAD_MIN_FLOPS")) bo.gemm_pad_min_flops = std::atof(e);
  std::unique_ptr<tessel::Backend> be = tessel::make_cuda_backend(bo);
  std::unique_ptr<tessel::Stream> s = be->create_stream("bench");
  const auto ma = static_cast<std::size_t>(g.m * g.k), mb = static_cast<std::size_t>(g.k * g.n),
             mc = static_cast<std::size_t>(g.m * g.n);
  std::shared_ptr<tessel::Buffer> a = be->allocate(ma * 2), b = be->allocate(mb * 2), c = be->allocate(mc * 2);
  const auto &ha = random_bf16(ma, 1), &hb = random_bf16(mb, 2);
  be->copy_from_host(*a, ha.data(), ma * 2, *s);
  be->copy_from_host(*b, hb.data(), mb * 2, *s);
  tessel::OpAttrs attrs;
  attrs.equation = "mk,kn->mn";
  tessel::KernelArgs k;
  k.kind = tessel::OpKind::Einsum;
  k.attrs = &attrs;
  k.in = {a->data(), b->data()};
  k.in_shapes = {{g.m, g.k}, {g.k, g.n}};
  k.in_dtypes = {tessel::DType::bf16, tessel::DType::bf16};
  k.out = c->data();
  k.out_shape = {g.m, g.n};
  k.out_dtype = tessel::DType::bf16;
  be->run_kernel(k, *s);  // the descriptors and the heuristic's choice are made here, once
  s->synchronize();
  for (auto _ : state) {
    for (int r = 0; r < kReps; ++r) be->run_kernel(k, *s);
    s->synchronize();
  }
  state.counters["FLOP/s"] = benchmark::Counter(flops_of(g) * kReps, benchmark::Counter::kIsIterationInvariantRate);
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (std::size_t i = 0; i < gemm_cases().size(); ++i) b->Arg(static_cast<int64_t>(i));
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}
BENCHMARK(BM_CublasLtBf16)->Apply(gemm_args);
BENCHMARK(BM_EinsumBf16)->Apply(gemm_args);

// ---- the GPT-2 124M forward --------------------------------------------------------------------

// The bf16 GEMM ceiling of this GPU (FLOP/s of cuBLASLt's 8192³), measured once per run.
double gemm_ceiling() {
  static const double c = [] {
    const GemmCase& g = gemm_cases().back();
    LtGemm lt(g);
    for (int i = 0; i < 3; ++i) lt.run();
    lt.sync();
    double best = 0;
    for (int t = 0; t < 5; ++t) {
      cudaEvent_t e0, e1;
      check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
      check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
      check_cuda(cudaEventRecord(e0, lt.stream), "cudaEventRecord");
      for (int r = 0; r < kReps; ++r) lt.run();
      check_cuda(cudaEventRecord(e1, lt.stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      cudaEventDestroy(e0), cudaEventDestroy(e1);
      best = std::max(best, flops_of(g) * kReps / (ms * 1e-3));
    }
    return best;
  }();
  return c;
}

void BM_GemmCeiling(benchmark::State& state) {
  if (!need_gpu(state)) return;
  double c = 0;
  for (auto _ : state) c = gemm_ceiling();
  state.counters["FLOP/s"] = c;
}
BENCHMARK(BM_GemmCeiling)->Iterations(1);

void BM_Gpt2Forward(benchmark::State& state) {
  if (!need_gpu(state)) return;
  tessel::GptConfig cfg;
  cfg.batch = 8, cfg.seq = 1024, cfg.d_model = 768, cfg.heads = 12, cfg.layers = 12, cfg.vocab = 50257;
  cfg.dtype = tessel::DType::bf16;
  cfg.compute = tessel::DType::bf16;
  cfg.annotate = false;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  const tessel::Mesh mesh = tessel::Mesh::parse("data=1,model=1");
  tessel::Executable exe = tessel::compile(m.graph, mesh);
  // Arg 1: the backend's defaults; arg 0: products with odd rows not padded (gemm_pad_min_flops);
  // arg 2: fused expressions on the interpreter kernel instead of the JIT (fused_jit = false).
  tessel::CudaRuntimeOptions rto;
  if (state.range(0) == 0) rto.backend.gemm_pad_min_flops = std::numeric_limits<double>::infinity();
  if (state.range(0) == 2) rto.backend.fused_jit = false;
  tessel::CudaRuntime rt(1, rto);
  const tessel::LoadOptions lo;  // named: GCC 12 warns (falsely) about a temporary's map
  tessel::LoadedExecutable prog = tessel::load(exe, rt, lo);
  double flops = 0;
  for (const tessel::Instr& in : prog.program().instrs) flops += in.flops;
  std::vector<tessel::HostTensor> inputs = tessel::random_inputs(m.graph, 1);
  for (std::size_t i = 0; i < inputs.size(); ++i)  // token ids and labels in [0, vocab)
    if (inputs[i].dtype() == tessel::DType::i32)
      for (int64_t j = 0; j < inputs[i].numel(); ++j)
        inputs[i].set(j, static_cast<double>((j * 7919) % cfg.vocab));
  tessel::gpt_init(m.graph, inputs);
  std::vector<tessel::ShardedArray> args;
  for (std::size_t i = 0; i < inputs.size(); ++i) args.push_back(prog.to_device(i, inputs[i]));
  const tessel::RunOptions ro;
  prog.run(args, ro);  // warm-up (the einsums' cuBLASLt plans were made at load)
  double loss = 0;
  for (auto _ : state) {
    tessel::RunResult r = prog.run(args, ro);
    state.PauseTiming();
    loss = prog.to_host(r.outputs[0]).get(0);
    state.ResumeTiming();
  }
  const double tokens = static_cast<double>(cfg.batch * cfg.seq);
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_flops_per_step"] = flops;
  state.counters["gemm_ceiling_FLOP/s"] = gemm_ceiling();
  state.counters["loss"] = loss;
  state.SetLabel(fmt::format("{} params; MFU = FLOP/s / gemm_ceiling_FLOP/s{}", m.params,
                             state.range(0) == 0   ? "; odd rows not padded"
                             : state.range(0) == 2 ? "; fused expressions interpreted (no JIT)"
                                                   : ""));
}
BENCHMARK(BM_Gpt2Forward)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

// ---- fused attention ----------------------------------------------------------------------------

void BM_Attention(benchmark::State& state, bool backward) {
  if (!need_gpu(state)) return;
  constexpr int64_t B = 8, H = 12, S = 1024, D = 64;
  std::unique_ptr<tessel::Backend> be = tessel::make_cuda_backend();
  std::unique_ptr<tessel::Stream> s = be->create_stream("bench");
  const tessel::Shape x{B, S, H, D}, stats{B, H, S};  // bshd
  const auto n = static_cast<std::size_t>(B * S * H * D);
  auto bf16_buffer = [&](uint64_t seed) {
    std::shared_ptr<tessel::Buffer> b = be->allocate(n * 2);
    if (seed) be->copy_from_host(*b, random_bf16(n, seed).data(), n * 2, *s);
    return b;
  };
  std::shared_ptr<tessel::Buffer> q = bf16_buffer(11), k = bf16_buffer(12), v = bf16_buffer(13), dout = bf16_buffer(14),
                                  out = bf16_buffer(0), dq = bf16_buffer(0), dk = bf16_buffer(0), dv = bf16_buffer(0),
                                  lse = be->allocate(static_cast<std::size_t>(B * H * S) * 4);
  tessel::OpAttrs attrs;
  attrs.equation = "bshd";
  attrs.causal = true;
  attrs.scalar = 1.0 / std::sqrt(static_cast<double>(D));
  const tessel::DType bf = tessel::DType::bf16;
  tessel::KernelArgs fwd;
  fwd.kind = tessel::OpKind::Attention;
  fwd.attrs = &attrs;
  fwd.in = {q->data(), k->data(), v->data()};
  fwd.in_shapes = {x, x, x};
  fwd.in_dtypes = {bf, bf, bf};
  fwd.out = out->data();
  fwd.out_shape = x;
  fwd.out_dtype = bf;
  fwd.extra_out = {lse->data()};
  fwd.extra_out_shapes = {stats};
  fwd.extra_out_dtypes = {tessel::DType::f32};
  tessel::KernelArgs bwd;
  bwd.kind = tessel::OpKind::AttentionGrad;
  bwd.attrs = &attrs;
  bwd.in = {q->data(), k->data(), v->data(), out->data(), lse->data(), dout->data()};
  bwd.in_shapes = {x, x, x, x, stats, x};
  bwd.in_dtypes = {bf, bf, bf, bf, tessel::DType::f32, bf};
  bwd.out = dq->data();
  bwd.out_shape = x;
  bwd.out_dtype = bf;
  bwd.extra_out = {dk->data(), dv->data()};
  bwd.extra_out_shapes = {x, x};
  bwd.extra_out_dtypes = {bf, bf};
  be->run_kernel(fwd, *s);  // the backward's out and lse; the forward's warm-up
  const tessel::KernelArgs& call = backward ? bwd : fwd;
  be->run_kernel(call, *s);
  s->synchronize();
  for (auto _ : state) {
    for (int r = 0; r < kReps; ++r) be->run_kernel(call, *s);
    s->synchronize();
  }
  const double pairs = static_cast<double>(S) * static_cast<double>(S + 1) / 2;  // the causal mask keeps
  const double flops = (backward ? 10.0 : 4.0) * static_cast<double>(B * H * D) * pairs;
  state.counters["FLOP/s"] = benchmark::Counter(flops * kReps, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(flops * kReps / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("{} [8,12,1024,64] bf16 causal bshd, {:.4g} FLOP a call (causal-counted)",
                             backward ? "backward" : "forward", flops));
}
BENCHMARK_CAPTURE(BM_Attention, forward, false)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK_CAPTURE(BM_Attention, backward, true)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

// ---- collectives on virtual devices --------------------------------------------------------------

template <bool kAllReduce>
void BM_Collective(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const int64_t n = state.range(0);
  const auto bytes = static_cast<std::size_t>(state.range(1));  // per device (all-gather: its block)
  const tessel::Mesh mesh = tessel::Mesh::parse(fmt::format("x={}", n));
  tessel::CudaRuntime rt(n);
  std::unique_ptr<tessel::CollectiveWorld> world = rt.make_world(mesh, {{"x"}}, 0);
  std::vector<std::unique_ptr<tessel::Communicator>> comms;
  std::vector<std::shared_ptr<tessel::Buffer>> send, recv;
  tessel::DeviceThreads& lr = rt.local();
  for (int64_t d = 0; d < n; ++d) {
    comms.push_back(world->communicator(d, {"x"}));
    send.push_back(lr.backend(d).allocate(bytes));
    recv.push_back(lr.backend(d).allocate(kAllReduce ? bytes : bytes * static_cast<std::size_t>(n)));
    lr.backend(d).poison(*send.back(), tessel::DType::f32, lr.comm_stream(d));
  }
  auto step = [&](int reps) {
    const auto errors = lr.run_on_devices([&](int64_t d) {
      const auto u = static_cast<std::size_t>(d);
      tessel::Stream& s = lr.comm_stream(d);
      for (int r = 0; r < reps; ++r) {
        if (kAllReduce)
          comms[u]->all_reduce(send[u]->data(), recv[u]->data(), bytes / 4, tessel::DType::f32, tessel::ReduceOp::Sum, s);
        else
          comms[u]->all_gather(send[u]->data(), recv[u]->data(), bytes, s);
      }
      s.synchronize();
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  };
  step(1);
  for (auto _ : state) step(kReps);
  const double nn = static_cast<double>(n);
  const double bus = kAllReduce ? 2.0 * (nn - 1) / nn * static_cast<double>(bytes)
                                : (nn - 1) / nn * nn * static_cast<double>(bytes);
  state.counters["busbw"] = benchmark::Counter(bus * kReps, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1024);
  state.SetLabel(fmt::format("{} virtual devices on GPU 0, {} bytes per device", n, bytes));
}

void collective_args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {2, 4, 8})
    for (int64_t bytes : {int64_t{1} << 20, int64_t{64} << 20, int64_t{256} << 20}) b->Args({n, bytes});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK_TEMPLATE(BM_Collective, true)->Name("BM_AllReduce")->Apply(collective_args);
BENCHMARK_TEMPLATE(BM_Collective, false)->Name("BM_AllGather")->Apply(collective_args);

// ---- collective matmul -------------------------------------------------------------------------

// The Megatron MLP and the transformer block (../collective_matmul_graphs.hpp) at GPT-3-sized
// layers in bf16 on `devices` devices of a CudaRuntime (one per GPU when there are enough,
// else virtual devices on the visible GPUs): the pass off, unidirectional rings,
// bidirectional rings and the gate's choice, run in turn (round robin) and timed per step.
void BM_CollectiveMatmulCuda(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const int64_t graph = state.range(0), n = state.range(1);
  const std::string text = graph == 0 ? tessel_bench::mlp_text(n, "bf16", 8192, 4096, 16384)
                                      : tessel_bench::block_text(n, "bf16", 4096, 4096, 32, 128, 16384);
  tessel::Graph g = tessel::parse_graph(text, "cm.tsl");
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  const auto inputs = tessel::random_inputs(g, 7);
  std::unique_ptr<tessel::CudaRuntime> rt = tessel::make_cuda_runtime(exe.mesh());
  std::set<int> gpus;
  for (int64_t d = 0; d < rt->num_devices(); ++d) gpus.insert(rt->gpu(d));
  // The gate: this GPU's figures are the CostModel's defaults; devices on one GPU share it.
  tessel::CollectiveMatmulOptions gate;
  gate.cost.compute_sharing = tessel::compute_sharing(n, static_cast<int64_t>(gpus.size()));
  constexpr std::size_t kVariants = tessel_bench::kCmVariantCount;
  tessel_bench::CmLoaded loaded = tessel_bench::load_cm_variants(exe, *rt, gate, inputs);
  std::vector<tessel::LoadedExecutable>& les = loaded.les;
  std::vector<std::vector<tessel::ShardedArray>>& ins = loaded.ins;
  int auto_sites = 0;
  for (const auto& site : tessel::collective_matmul_sites(exe.program(), gate))
    if (site.variant != tessel::RingVariant::None) ++auto_sites;
  std::vector<double> t[kVariants];
  for (auto _ : state)
    for (std::size_t v = 0; v < kVariants; ++v) t[v].push_back(tessel_bench::time_run(les[v], ins[v]));
  double medians[kVariants];
  for (std::size_t v = 0; v < kVariants; ++v) medians[v] = tessel_bench::median(t[v]);
  tessel_bench::set_cm_counters(state, medians);
  state.counters["auto_sites"] = auto_sites;
  state.counters["flops_per_step"] = exe.program().total_flops();
  state.SetLabel(fmt::format("{} {} devices on {} GPU(s), bf16", graph == 0 ? "megatron-mlp" : "transformer-block", n,
                             gpus.size()));
}
BENCHMARK(BM_CollectiveMatmulCuda)
    ->ArgsProduct({{0, 1}, {2, 4, 8}})
    ->ArgNames({"graph", "devices"})
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h")
      std::fputs("usage: tessel-bench-gpu [Google Benchmark flags below]\n"
                 "The CUDA backend's benchmarks (scripts/bench-gpu runs them; docs/backend-cuda.md): einsums on\n"
                 "cuBLASLt, kernels, collectives, collective matmul. Needs a GPU.\n",
                 stdout);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
