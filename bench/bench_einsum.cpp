// BM_Einsum/<case>/<impl>/<threads>: the CPU einsum kernel on the gpt example's shapes
// (examples/gpt.cpp defaults: batch 8, seq 64, d_model 128, 4 heads of 32, d_ff 512), run
// with oneDNN (impl 1: EinsumImpl::Auto, a strided batched matmul where the equation maps
// onto one) and with Eigen (impl 0: the fallback kernel, which permutes operands into copies
// where their layout needs it), on `threads` kernel threads (KernelArgs::num_threads; below
// 2^25 flops both kernels use one). Counter FLOP/s = 2·(product of all letter sizes) per
// call over real time. The label says which kernel actually ran ("onednn" or "eigen"): an einsum oneDNN
// declines runs on Eigen under impl 1 too. Operands are allocated once; each iteration is one
// kernel call writing the same result buffer, so the buffers stay in cache as in a forward.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "../src/runtime/cpu/onednn_einsum.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/tensor.hpp"

namespace {

struct EinsumCase {
  const char* eq;
  tessel::Shape a, b, out;
  double flops;
};

const std::vector<EinsumCase>& cases() {
  static const std::vector<EinsumCase> c = {
      {"bsd,df->bsf", {8, 64, 128}, {128, 512}, {8, 64, 512}, 2.0 * 8 * 64 * 128 * 512},
      {"bsf,fd->bsd", {8, 64, 512}, {512, 128}, {8, 64, 128}, 2.0 * 8 * 64 * 512 * 128},
      {"bsd,dhk->bshk", {8, 64, 128}, {128, 4, 32}, {8, 64, 4, 32}, 2.0 * 8 * 64 * 128 * 128},
      {"bqhk,bshk->bhqs", {8, 64, 4, 32}, {8, 64, 4, 32}, {8, 4, 64, 64}, 2.0 * 8 * 4 * 64 * 64 * 32},
      {"bhqs,bshk->bqhk", {8, 4, 64, 64}, {8, 64, 4, 32}, {8, 64, 4, 32}, 2.0 * 8 * 4 * 64 * 64 * 32},
      {"bsd,bsf->df", {8, 64, 128}, {8, 64, 512}, {128, 512}, 2.0 * 8 * 64 * 128 * 512},
      {"bsf,df->bsd", {8, 64, 512}, {128, 512}, {8, 64, 128}, 2.0 * 8 * 64 * 512 * 128},
  };
  return c;
}

void BM_Einsum(benchmark::State& state) {
  const EinsumCase& c = cases()[static_cast<std::size_t>(state.range(0))];
  const tessel::EinsumImpl impl = state.range(1) ? tessel::EinsumImpl::Auto : tessel::EinsumImpl::Eigen;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  tessel::HostTensor a(tessel::DType::f32, c.a), b(tessel::DType::f32, c.b), out(tessel::DType::f32, c.out);
  for (int64_t i = 0; i < a.numel(); ++i) a.set(i, d(rng));
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, d(rng));
  tessel::OpAttrs at;
  at.equation = c.eq;
  tessel::KernelArgs k;
  k.kind = tessel::OpKind::Einsum;
  k.attrs = &at;
  k.in = {a.data(), b.data()};
  k.in_shapes = {c.a, c.b};
  k.in_dtypes = {tessel::DType::f32, tessel::DType::f32};
  k.out = out.data();
  k.out_shape = c.out;
  k.num_threads = static_cast<int>(state.range(2));
  bool ran_onednn = tessel::cpu_einsum(k, impl);  // warm-up: creates and caches the primitive
  for (auto _ : state) {
    ran_onednn = tessel::cpu_einsum(k, impl);
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(c.flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(c.eq) + " " + (ran_onednn ? "onednn" : "eigen"));
}
BENCHMARK(BM_Einsum)
    ->ArgNames({"case", "onednn", "threads"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {0, 1}, {1, 2}})
    ->UseRealTime()  // the rate per wall-clock time: with 2 threads the caller's CPU time is half the work
    ->Unit(benchmark::kMicrosecond);

}  // namespace
