// BM_RowOp/op:<o>/shape:<s>/impl:<i>: softmax (o=0), layer_norm (1) and GELU (2) on one
// thread, the hand-written CPU kernel (impl 0, cpu_kernels_nn.cpp; GELU in
// cpu_kernels_elementwise.cpp) against oneDNN's primitive (impl 1,
// src/runtime/cpu/onednn_ops.cpp), at the shapes the GPT forward runs them:
//   shape 0, the gpt example (B8 S64 D128 H4): softmax [8,4,64,64], layer_norm [8,64,128],
//            gelu [8,64,512];
//   shape 1, the GPT-2-small block (B4 S256 D768 H12): softmax [4,12,256,256],
//            layer_norm [4,256,768], gelu [4,256,3072].
// Counter bytes/s: the operand read plus the result written, per second. The decision which
// ones the kernel table runs on oneDNN is docs/cpu-backend.md's, from these figures.
#include <benchmark/benchmark.h>

#include <random>
#include <string>

#include "../src/runtime/cpu/onednn_ops.hpp"
#include "tessel/runtime/tensor.hpp"

namespace {

// Times `k` on the hand-written kernel or on `onednn_fn` (which may decline: skipped), with
// the bytes read and written per second and `label` + the implementation as the label.
void time_row_op(benchmark::State& state, const tessel::KernelArgs& k, bool onednn,
                 bool (*onednn_fn)(const tessel::KernelArgs&, bool), const std::string& label) {
  auto run = [&] {
    if (onednn) return onednn_fn(k, false);
    tessel::run_handwritten_kernel(k);
    return true;
  };
  if (!run()) {
    state.SkipWithError("oneDNN declined (built without oneDNN, or no optimised implementation)");
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] = benchmark::Counter(2.0 * 4.0 * double(tessel::num_elements(k.out_shape)),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(label + (onednn ? " onednn" : " hand-written"));
}

void BM_RowOp(benchmark::State& state) {
  const int64_t op = state.range(0), shape = state.range(1);
  const bool onednn = state.range(2) != 0;
  const bool big = shape == 1;
  const int64_t B = big ? 4 : 8, S = big ? 256 : 64, D = big ? 768 : 128, H = big ? 12 : 4;
  tessel::Shape s = op == 0 ? tessel::Shape{B, H, S, S} : op == 1 ? tessel::Shape{B, S, D} : tessel::Shape{B, S, 4 * D};
  tessel::HostTensor x(tessel::DType::f32, s), y(tessel::DType::f32, s), g(tessel::DType::f32, {D}),
      b(tessel::DType::f32, {D});
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> d(-3.0, 3.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, d(rng));
  for (int64_t i = 0; i < D; ++i) {
    g.set(i, 1.0 + 0.1 * d(rng));
    b.set(i, 0.1 * d(rng));
  }
  tessel::OpAttrs at;
  at.axis = static_cast<int64_t>(s.size()) - 1;
  tessel::KernelArgs k;
  k.kind = op == 0 ? tessel::OpKind::Softmax : op == 1 ? tessel::OpKind::LayerNorm : tessel::OpKind::Gelu;
  k.attrs = &at;
  k.in = {x.data()};
  k.in_shapes = {s};
  k.in_dtypes = {tessel::DType::f32};
  if (op == 1) {
    k.in.insert(k.in.end(), {g.data(), b.data()});
    k.in_shapes.insert(k.in_shapes.end(), {{D}, {D}});
    k.in_dtypes.insert(k.in_dtypes.end(), {tessel::DType::f32, tessel::DType::f32});
  }
  k.out = y.data();
  k.out_shape = s;
  const char* names[] = {"softmax", "layer_norm", "gelu"};
  time_row_op(state, k, onednn,
              op == 0   ? tessel::onednn_softmax
              : op == 1 ? tessel::onednn_layer_norm
                        : tessel::onednn_gelu,
              std::string(names[op]) + " " + tessel::shape_str(s));
}
BENCHMARK(BM_RowOp)
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {0, 1}})
    ->ArgNames({"op", "shape", "impl"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// BM_SoftmaxRows/len:<L>/log2n:<e>/impl:<i>: softmax over the last axis of [2^e / L, L] f32
// on one thread, hand-written (impl 0) against oneDNN (impl 1): where the kernel table's
// choice between them crosses over with the row length, in cache (2^17 floats, 512 KiB) and
// out of it (2^20, 4 MiB) (docs/cpu-backend.md).
void BM_SoftmaxRows(benchmark::State& state) {
  const int64_t len = state.range(0);
  const bool onednn = state.range(2) != 0;
  const tessel::Shape s = {(int64_t{1} << state.range(1)) / len, len};
  tessel::HostTensor x(tessel::DType::f32, s), y(tessel::DType::f32, s);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> d(-3.0, 3.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, d(rng));
  tessel::OpAttrs at;
  at.axis = 1;
  tessel::KernelArgs k;
  k.kind = tessel::OpKind::Softmax;
  k.attrs = &at;
  k.in = {x.data()};
  k.in_shapes = {s};
  k.in_dtypes = {tessel::DType::f32};
  k.out = y.data();
  k.out_shape = s;
  time_row_op(state, k, onednn, tessel::onednn_softmax, tessel::shape_str(s));
}
BENCHMARK(BM_SoftmaxRows)
    ->ArgsProduct({{16, 32, 64, 128, 256, 512, 1024, 4096}, {17, 20}, {0, 1}})
    ->ArgNames({"len", "log2n", "impl"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
