// bench/collective_matmul_graphs.hpp — the two tensor-parallel graphs the collective-matmul
// benchmarks run, on CPU device threads (bench_collective_matmul.cpp, the defaults' sizes) and
// on CUDA devices (bench/cuda/bench_cuda.cpp, GPT-3-sized layers in bf16), and their timing
// helpers.
//   mlp_text: the Megatron MLP with sequence parallelism — x [T, D] sharded over `model` on T;
//             all-gather → x·W1 (columns over model) → gelu → ·W2 (rows over model) →
//             reduce-scatter back to T-sharded: one site of each kind.
//   block_text: a sequence-parallel transformer block (layer norm, fused QKV projection,
//             attention over the local heads, output projection, MLP): four sites.
#pragma once

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/passes/collective_matmul.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/loaded_executable.hpp"

namespace tessel_bench {

inline std::string mlp_text(int64_t n, const char* dtype = "f32", int64_t T = 512, int64_t D = 512, int64_t F = 2048) {
  return fmt::format(R"(
mesh model={n}
%x = input {t}[{T},{D}] sharding=[{{model}}, {{}}]
%w1 = input {t}[{D},{F}] sharding=[{{}}, {{model}}]
%w2 = input {t}[{F},{D}] sharding=[{{model}}, {{}}]
%u = einsum(%x, %w1) eq="td,df->tf" sharding=[{{}}, {{model}}]
%a = gelu(%u)
%y = einsum(%a, %w2) eq="tf,fd->td" sharding=[{{model}}, {{}}]
output %y
)", fmt::arg("n", n), fmt::arg("t", dtype), fmt::arg("T", T), fmt::arg("D", D), fmt::arg("F", F));
}

inline std::string block_text(int64_t n, const char* dtype = "f32", int64_t T = 256, int64_t D = 512, int64_t H = 8,
                              int64_t K = 64, int64_t F = 2048) {
  return fmt::format(R"(
mesh model={n}
%x = input {t}[{T},{D}] sharding=[{{model}}, {{}}]
%g1 = input {t}[{D}]
%b1 = input {t}[{D}]
%wqkv = input {t}[{D},3,{H},{K}] sharding=[{{}}, {{}}, {{model}}, {{}}]
%wo = input {t}[{H},{K},{D}] sharding=[{{model}}, {{}}, {{}}]
%g2 = input {t}[{D}]
%b2 = input {t}[{D}]
%w1 = input {t}[{D},{F}] sharding=[{{}}, {{model}}]
%w2 = input {t}[{F},{D}] sharding=[{{model}}, {{}}]
%h = layer_norm(%x, %g1, %b1) eps=1e-05
%qkv = einsum(%h, %wqkv) eq="td,dchk->tchk" sharding=[{{}}, {{}}, {{model}}, {{}}]
%q3 = slice(%qkv) starts=[0,0,0,0] limits=[{T},1,{H},{K}]
%k3 = slice(%qkv) starts=[0,1,0,0] limits=[{T},2,{H},{K}]
%v3 = slice(%qkv) starts=[0,2,0,0] limits=[{T},3,{H},{K}]
%q = reshape(%q3) shape=[{T},{H},{K}]
%k = reshape(%k3) shape=[{T},{H},{K}]
%v = reshape(%v3) shape=[{T},{H},{K}]
%s = einsum(%q, %k) eq="qhk,shk->hqs"
%p = softmax(%s) axis=2
%o = einsum(%p, %v) eq="hqs,shk->qhk"
%attn = einsum(%o, %wo) eq="qhk,hkd->qd" sharding=[{{model}}, {{}}]
%x1 = add(%x, %attn)
%h2 = layer_norm(%x1, %g2, %b2) eps=1e-05
%u = einsum(%h2, %w1) eq="td,df->tf" sharding=[{{}}, {{model}}]
%a = gelu(%u)
%d = einsum(%a, %w2) eq="tf,fd->td" sharding=[{{model}}, {{}}]
%y = add(%x1, %d)
output %y
)", fmt::arg("n", n), fmt::arg("t", dtype), fmt::arg("T", T), fmt::arg("D", D), fmt::arg("H", H), fmt::arg("K", K),
                     fmt::arg("F", F));
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds of one run (outputs ready on the devices when run returns).
inline double time_run(tessel::LoadedExecutable& le, const std::vector<tessel::ShardedArray>& in) {
  const auto t0 = std::chrono::steady_clock::now();
  tessel::RunResult r = le.run(in);
  benchmark::DoNotOptimize(r);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The variants the benchmarks compare, in this order: the pass off, unidirectional rings,
// bidirectional rings, the gate's choice per site.
struct CmVariant {
  tessel::OverlapMode mode;
  tessel::RingDirection dir;
  const char* name;
};
inline constexpr CmVariant kCmVariants[] = {{tessel::OverlapMode::Off, tessel::RingDirection::Uni, "off"},
                                            {tessel::OverlapMode::On, tessel::RingDirection::Uni, "uni"},
                                            {tessel::OverlapMode::On, tessel::RingDirection::Bi, "bi"},
                                            {tessel::OverlapMode::Auto, tessel::RingDirection::Auto, "auto"}};
constexpr std::size_t kCmVariantCount = sizeof(kCmVariants) / sizeof(kCmVariants[0]);

// `exe` loaded on `rt` once per variant (with `gate`'s cost model), `inputs` on its devices,
// each run once to warm up.
struct CmLoaded {
  std::vector<tessel::LoadedExecutable> les;
  std::vector<std::vector<tessel::ShardedArray>> ins;
};
inline CmLoaded load_cm_variants(const tessel::Executable& exe, tessel::Runtime& rt,
                                 const tessel::CollectiveMatmulOptions& gate,
                                 const std::vector<tessel::HostTensor>& inputs) {
  CmLoaded out;
  for (const CmVariant& v : kCmVariants) {
    tessel::LoadOptions lo;
    lo.lowering.collective_matmul = gate;
    lo.lowering.collective_matmul.mode = v.mode;
    lo.lowering.collective_matmul.direction = v.dir;
    out.les.push_back(tessel::load(exe, rt, lo));
    std::vector<tessel::ShardedArray> in;
    for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(out.les.back().to_device(i, inputs[i]));
    out.ins.push_back(std::move(in));
    time_run(out.les.back(), out.ins.back());
  }
  return out;
}

// The counters both benchmarks report from the variants' median step times (seconds, in
// kCmVariants order): <variant>_ms and speedup_<variant> (off / that).
inline void set_cm_counters(benchmark::State& state, const double (&seconds)[kCmVariantCount]) {
  for (std::size_t v = 0; v < kCmVariantCount; ++v) {
    state.counters[std::string(kCmVariants[v].name) + "_ms"] = seconds[v] * 1e3;
    if (v > 0) state.counters[std::string("speedup_") + kCmVariants[v].name] = seconds[0] / seconds[v];
  }
}

}  // namespace tessel_bench
