// BM_AttentionCpu/seq:<S>/fused:<f>/backward:<b>: causal self-attention of one GPT-2-small-sized
// layer, [batch 4, seq S, 12 heads, head_dim 64] in the model's "bshd" layout, f32, on one CPU
// device with one kernel thread, loaded once (LoadedExecutable::run on device-resident inputs).
// fused 1: the attention op (the tiled CPU kernel, docs/attention.md); 0: the long form
// (einsum -> scale -> causal_mask -> softmax -> einsum, compiled without the fuse-attention
// pass: the program-level fused softmax and oneDNN products). backward 1: forward and the
// gradients of q, k, v (the flash backward against softmax_grad and four products).
// Counters: GFLOP/s causal-counted (4 flops per kept pair and head-dim element forward, 10
// backward: FlashAttention's convention) and the planned peak bytes per device.
#include <benchmark/benchmark.h>

#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/autodiff.hpp"

namespace {

void BM_AttentionCpu(benchmark::State& state) {
  const int64_t B = 4, H = 12, D = 64, S = state.range(0);
  const bool fused = state.range(1) != 0, backward = state.range(2) != 0;
  tessel::Graph g;
  const tessel::Shape shape{B, S, H, D};
  tessel::Tensor q = tessel::input(g, "q", tessel::DType::f32, shape);
  tessel::Tensor k = tessel::input(g, "k", tessel::DType::f32, shape);
  tessel::Tensor v = tessel::input(g, "v", tessel::DType::f32, shape);
  tessel::Tensor o;
  if (fused) {
    o = tessel::attention(q, k, v, true, 0.125, "bshd").out;
  } else {
    tessel::Tensor s = tessel::mul(tessel::einsum("bqhd,bshd->bhqs", q, k), 0.125);
    o = tessel::einsum("bhqs,bshd->bqhd", tessel::softmax(tessel::causal_mask(s), -1), v);
  }
  if (backward) {
    tessel::Tensor w = tessel::input(g, "w", tessel::DType::f32, shape);
    for (const tessel::Tensor& t : tessel::grad(tessel::reduce_sum(tessel::mul(o, w), {0, 1, 2, 3}), {q, k, v}))
      g.mark_output(t);
  } else {
    g.mark_output(o);
  }
  tessel::CompileOptions co;
  co.fuse_attention = false;  // the long form stays long; the fused form is already one op
  tessel::Executable exe = tessel::compile(g, tessel::Mesh::parse("data=1"), co);
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  tessel::ThreadRuntime rt(1, ro);
  tessel::LoadedExecutable le = tessel::load(exe, rt);
  auto inputs = tessel::random_inputs(g, 1234);
  std::vector<tessel::ShardedArray> in;
  for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
  for (auto _ : state) {
    tessel::RunResult r = le.run(in);
    benchmark::DoNotOptimize(r);
  }
  const double pairs = static_cast<double>(S) * static_cast<double>(S + 1) / 2;
  const double flops = (backward ? 14.0 : 4.0) * static_cast<double>(B * H * D) * pairs;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["planned_peak_bytes"] = static_cast<double>(le.program().memory_plan().peak_bytes());
}
BENCHMARK(BM_AttentionCpu)
    ->ArgsProduct({{256, 1024}, {1, 0}, {0, 1}})
    ->ArgNames({"seq", "fused", "backward"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
