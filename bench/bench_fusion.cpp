// fuse-elementwise, measured (docs/cpu-backend.md, "Fusion"):
//
// BM_FusionGptForward/fusion:<0|1|2>: the gpt example's forward pass (default config) on one
//   device, lowered without (0) and with the fuse-elementwise pass: elementwise groups only
//   (1), and also einsum epilogues (2: fused_einsum, oneDNN post-ops); counters tokens/s and
//   fused kernels (fused_elementwise + fused_softmax + fused_einsum) per run; process_cpu_us is
//   the CPU time of every thread of the process per run (the device threads', robust to a
//   loaded machine).
// BM_FusionMlp/rows:<m>/d:<k>/f:<n>/mode:<0|1|2>: the MLP's first product with its bias and
//   GELU, gelu(x w1 + b1), x [m,k], w1 [k,n], as bare kernel calls on the benchmark's thread:
//   mode 0 unfused as the pass leaves it without epilogues (einsum, then a fused_elementwise
//   bias + GELU), 1 one fused_einsum as the kernel table runs it (these plain products: sgemm,
//   then the epilogue loop), 2 fused_einsum's fallback (the same, by the fallback entry), 3 the
//   einsum as the matmul primitive with binary-add and gelu_tanh post-ops (forced: what the
//   kernel declines for a product sgemm can run). Shapes: the gpt example's (512x128x512) and
//   the GPT-2-small block's (1024x768x3072). Counter GFLOP/s of the product over the thread's
//   CPU time; post_ops 1 where the epilogue ran as post-ops.
// BM_FusionKernel/elems:<n>/fusion:<0|1>/chain:<0|1>: the same chain as bare CPU kernel calls
//   on the benchmark's own thread (no runtime): four kernels and three intermediates, or one
//   fused_elementwise; chain:1 drops the GELU (bias + scale + residual: three cheap ops, memory
//   bound). Its CPU time is the kernels' own, whatever else the machine runs.
// BM_FusionChain/elems:<n>/fusion:<0|1>: one elementwise chain of a transformer MLP's tail,
//   y = x + gelu(h + b) * 0.5 (bias + GELU + scale + residual: four kernels unfused, one
//   fused) over [n/256, 256] f32 on one device; counter bytes/s = the fused kernel's bytes
//   (read h, b, x, write y) over real time, so the unfused row shows how much of that rate
//   the extra round trips through memory cost.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/reference.hpp"
#include "../src/runtime/cpu/onednn_einsum.hpp"

namespace {

// CPU seconds of the whole process (every device thread), user + system.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int fused_kernels(const tessel::Program& p) {
  int n = 0;
  for (const tessel::Instr& in : p.instrs)
    n += in.kind == tessel::InstrKind::Kernel &&
         (in.op == tessel::OpKind::FusedElementwise || in.op == tessel::OpKind::FusedSoftmax ||
          in.op == tessel::OpKind::FusedEinsum);
  return n;
}

// Loads `g` once on one device with fusion on or off and times run() on device-resident inputs.
// fuse: 0 off, 1 elementwise groups, 2 also einsum epilogues.
void run_loaded(benchmark::State& state, const tessel::Graph& g, int fuse, double bytes_per_run) {
  const tessel::Mesh mesh = tessel::Mesh::parse("data=1,model=1");
  tessel::Executable exe = tessel::compile(g, mesh);
  tessel::ThreadRuntime rt(1);
  tessel::LoadOptions lo;
  lo.lowering.fuse_elementwise = fuse != 0;
  lo.lowering.fuse_einsum_epilogue = fuse == 2;
  tessel::LoadedExecutable le = tessel::load(exe, rt, lo);
  const auto host = tessel::random_inputs(g, 1234);
  std::vector<tessel::ShardedArray> inputs;
  for (std::size_t i = 0; i < host.size(); ++i) inputs.push_back(le.to_device(i, host[i]));
  const double cpu0 = process_cpu_s();
  for (auto _ : state) {
    auto r = le.run(inputs);
    benchmark::DoNotOptimize(r);
  }
  // The runtime's device threads do the work: their CPU time per run, which another process
  // taking the cores inflates far less than the real time.
  state.counters["process_cpu_us"] =
      1e6 * (process_cpu_s() - cpu0) / static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["fused_kernels"] = fused_kernels(le.program());
  state.counters["instructions"] = static_cast<double>(le.program().instrs.size());
  if (bytes_per_run > 0)
    state.counters["bytes/s"] = benchmark::Counter(bytes_per_run, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_FusionGptForward(benchmark::State& state) {
  tessel::GptConfig cfg;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  run_loaded(state, m.graph, static_cast<int>(state.range(0)), 0);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FusionGptForward)->ArgName("fusion")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FusionChain(benchmark::State& state) {
  const int64_t n = state.range(0), cols = 256, rows = n / cols;
  tessel::Graph g;
  tessel::Tensor h = tessel::input(g, "h", tessel::DType::f32, {rows, cols});
  tessel::Tensor b = tessel::input(g, "b", tessel::DType::f32, {cols});
  tessel::Tensor x = tessel::input(g, "x", tessel::DType::f32, {rows, cols});
  g.mark_output(tessel::add(x, tessel::mul(tessel::gelu(tessel::add(h, b)), 0.5)));
  run_loaded(state, g, state.range(1) != 0 ? 2 : 0, 4.0 * static_cast<double>(3 * n + cols));
}
BENCHMARK(BM_FusionChain)
    ->ArgNames({"elems", "fusion"})
    ->ArgsProduct({{int64_t{1} << 14, int64_t{1} << 18, int64_t{1} << 22}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

tessel::KernelArgs kernel(tessel::OpKind k, const std::vector<const tessel::HostTensor*>& in, tessel::HostTensor& out,
                          const tessel::OpAttrs* attrs) {
  tessel::KernelArgs a;
  a.kind = k;
  a.attrs = attrs;
  for (const tessel::HostTensor* t : in) {
    a.in.push_back(t->data());
    a.in_shapes.push_back(t->shape());
    a.in_dtypes.push_back(t->dtype());
  }
  a.out = out.data();
  a.out_shape = out.shape();
  a.out_dtype = out.dtype();
  return a;
}

void BM_FusionKernel(benchmark::State& state) {
  using tessel::HostTensor;
  using tessel::OpKind;
  const int64_t n = state.range(0), cols = 256, rows = n / cols;
  const tessel::DType f32 = tessel::DType::f32;
  HostTensor h(f32, {rows, cols}), b(f32, {cols}), x(f32, {rows, cols}), c(f32, {}), y(f32, {rows, cols});
  HostTensor t1(f32, {rows, cols}), t2(f32, {rows, cols}), t3(f32, {rows, cols});
  for (int64_t i = 0; i < n; ++i) h.set(i, 0.001 * static_cast<double>(i % 2000) - 1.0), x.set(i, 0.5);
  for (int64_t i = 0; i < cols; ++i) b.set(i, 0.01 * static_cast<double>(i));
  c.set(0, 0.5);
  tessel::OpAttrs none, fused;
  const bool with_gelu = state.range(2) == 0;
  fused.equation = with_gelu ? "add($2,mul(gelu(add($0,$1)),0.5:f32[]))" : "add($2,mul(add($0,$1),0.5:f32[]))";
  std::vector<tessel::KernelArgs> calls;
  if (state.range(1) != 0) {
    calls.push_back(kernel(OpKind::FusedElementwise, {&h, &b, &x}, y, &fused));
  } else {
    calls.push_back(kernel(OpKind::Add, {&h, &b}, t1, &none));
    if (with_gelu) calls.push_back(kernel(OpKind::Gelu, {&t1}, t2, &none));
    calls.push_back(kernel(OpKind::Mul, {with_gelu ? &t2 : &t1, &c}, t3, &none));
    calls.push_back(kernel(OpKind::Add, {&x, &t3}, y, &none));
  }
  for (auto _ : state)
    for (const tessel::KernelArgs& a : calls) tessel::run_cpu_kernel(a);
  state.counters["bytes/s"] = benchmark::Counter(4.0 * static_cast<double>(3 * n + cols), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FusionKernel)
    ->ArgNames({"elems", "fusion", "chain"})
    ->ArgsProduct({{int64_t{1} << 14, int64_t{1} << 18, int64_t{1} << 22}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_FusionMlp(benchmark::State& state) {
  using tessel::HostTensor;
  using tessel::OpKind;
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const int mode = static_cast<int>(state.range(3));
  const tessel::DType f32 = tessel::DType::f32;
  HostTensor x(f32, {m, k}), w(f32, {k, n}), b(f32, {n}), u(f32, {m, n}), y(f32, {m, n});
  for (int64_t i = 0; i < m * k; ++i) x.set(i, 0.001 * static_cast<double>(i % 1999) - 1.0);
  for (int64_t i = 0; i < k * n; ++i) w.set(i, 0.0005 * static_cast<double>(i % 997) - 0.25);
  for (int64_t i = 0; i < n; ++i) b.set(i, 0.01 * static_cast<double>(i % 100));
  tessel::OpAttrs ein, ep, fe;
  ein.equation = "mk,kn->mn";
  ep.equation = "gelu(add($0,$1))";
  fe.equation = "mk,kn->mn";
  fe.epilogue = "gelu(add($0,$1))";
  std::vector<tessel::KernelArgs> calls;
  if (mode == 0) {
    calls.push_back(kernel(OpKind::Einsum, {&x, &w}, u, &ein));
    calls.push_back(kernel(OpKind::FusedElementwise, {&u, &b}, y, &ep));
  } else {
    calls.push_back(kernel(OpKind::FusedEinsum, {&x, &w, &b}, y, &fe));
  }
  bool post_ops = false;
  tessel::EinsumEpilogue forced;
  forced.steps = {{tessel::EinsumEpilogue::Step::Kind::Add, 1, 1.0f}, {tessel::EinsumEpilogue::Step::Kind::Gelu, -1, 1.0f}};
  forced.in = {nullptr, b.data()};
  forced.in_shapes = {{m, n}, {n}};
  forced.force_primitive = true;
  tessel::KernelArgs product = kernel(OpKind::Einsum, {&x, &w}, y, &ein);
  for (auto _ : state) {
    if (mode == 3) {
      post_ops = tessel::cpu_einsum(product, tessel::EinsumImpl::Auto, &forced);
      continue;
    }
    if (mode == 2) {
      tessel::run_fused_einsum_fallback(calls[0]);
      continue;
    }
    if (mode == 1) {
      post_ops = tessel::run_fused_einsum(calls[0]);
      continue;
    }
    for (const tessel::KernelArgs& a : calls) tessel::run_cpu_kernel(a);
  }
  state.counters["post_ops"] = post_ops;
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * static_cast<double>(m * k * n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FusionMlp)
    ->ArgNames({"rows", "d", "f", "mode"})
    ->ArgsProduct({{512}, {128}, {512}, {0, 1, 2, 3}})
    ->ArgsProduct({{1024}, {768}, {3072}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
