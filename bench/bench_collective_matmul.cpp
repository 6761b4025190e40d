// BM_CollectiveMatmul/<graph>/<devices>/<link>: the collective-matmul pass on CPU device threads,
// side by side in one run: the same program lowered with the pass off, with unidirectional
// rings and with bidirectional rings, run in turn (round robin, so that noise on this shared
// machine hits all three alike); the counters are medians.
//   graph 0: the Megatron MLP with sequence parallelism — x [T, D] sharded over `model` on T;
//            all-gather → x·W1 (columns over model) → gelu → ·W2 (rows over model) →
//            reduce-scatter back to T-sharded: one all-gather → einsum and one einsum →
//            reduce-scatter site.
//   graph 1: a sequence-parallel transformer block (layer norm, fused QKV projection, attention
//            over the local heads, output projection, MLP): four sites.
//   link 0:  no link model — a transfer is an in-process memcpy, which occupies a core as the
//            einsums do (no real interconnect does): what the pass costs on bare threads.
//   link 1:  the thread communicator's LinkModel (a simulated interconnect: each transfer takes
//            alpha + bytes/bandwidth of wall time asleep), with the bandwidth chosen so that the
//            modelled communication of the program equals its measured compute: the regime
//            where overlap matters most (compute ≈ comm).
// Counters: compute_ms (the program without the pass and without link model: kernels and
// memcpys), comm_ms (the link model's time of every collective of the program without the
// pass, one after the other), off_ms / uni_ms / bi_ms (step times), speedup_uni/_bi (off / on),
// ratio_bi (bi / max(compute, comm): 1.0 is perfect overlap), auto_sites (sites the gate takes
// with a cost model of this machine: its measured flop rate and the link model).
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "tessel/collective_matmul.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/text.hpp"

namespace {

std::string mlp_text(int64_t n) {
  const int64_t T = 512, D = 512, F = 2048;
  return fmt::format(R"(
mesh model={n}
%x = input f32[{T},{D}] sharding=[{{model}}, {{}}]
%w1 = input f32[{D},{F}] sharding=[{{}}, {{model}}]
%w2 = input f32[{F},{D}] sharding=[{{model}}, {{}}]
%u = einsum(%x, %w1) eq="td,df->tf" sharding=[{{}}, {{model}}]
%a = gelu(%u)
%y = einsum(%a, %w2) eq="tf,fd->td" sharding=[{{model}}, {{}}]
output %y
)", fmt::arg("n", n), fmt::arg("T", T), fmt::arg("D", D), fmt::arg("F", F));
}

std::string block_text(int64_t n) {
  const int64_t T = 256, D = 512, H = 8, K = 64, F = 2048;
  return fmt::format(R"(
mesh model={n}
%x = input f32[{T},{D}] sharding=[{{model}}, {{}}]
%g1 = input f32[{D}]
%b1 = input f32[{D}]
%wqkv = input f32[{D},3,{H},{K}] sharding=[{{}}, {{}}, {{model}}, {{}}]
%wo = input f32[{H},{K},{D}] sharding=[{{model}}, {{}}, {{}}]
%g2 = input f32[{D}]
%b2 = input f32[{D}]
%w1 = input f32[{D},{F}] sharding=[{{}}, {{model}}]
%w2 = input f32[{F},{D}] sharding=[{{model}}, {{}}]
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
)", fmt::arg("n", n), fmt::arg("T", T), fmt::arg("D", D), fmt::arg("H", H), fmt::arg("K", K), fmt::arg("F", F));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Wire bytes per device of every collective of a partitioned program (the link model's
// accounting: all-gather / reduce-scatter (n-1)·block, all-reduce 2(n-1)/n·buffer).
double wire_bytes(const tessel::Program& p, int* count) {
  double w = 0;
  *count = 0;
  for (const auto& in : p.instrs) {
    if (in.kind != tessel::InstrKind::Collective) continue;
    const double n = static_cast<double>(p.mesh.axes_size(in.axes));
    const double out = static_cast<double>(p.values[static_cast<std::size_t>(in.out)].bytes());
    const double x = static_cast<double>(p.values[static_cast<std::size_t>(in.in[0])].bytes());
    switch (in.collective) {
      case tessel::CollectiveKind::AllGather: w += (n - 1) * x; break;
      case tessel::CollectiveKind::ReduceScatter: w += (n - 1) * out; break;
      case tessel::CollectiveKind::AllReduce: w += 2 * (n - 1) / n * x; break;
      default: w += x; break;
    }
    ++*count;
  }
  return w;
}

struct Variant {
  tessel::OverlapMode mode;
  tessel::RingDirection dir;
};

double time_runs(tessel::LoadedExecutable& le, const std::vector<tessel::ShardedArray>& in) {
  const auto t0 = std::chrono::steady_clock::now();
  tessel::RunResult r = le.run(in);
  benchmark::DoNotOptimize(r);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_CollectiveMatmul(benchmark::State& state) {
  const int64_t graph = state.range(0), n = state.range(1);
  const bool link = state.range(2) != 0;
  tessel::Graph g = tessel::parse_graph(graph == 0 ? mlp_text(n) : block_text(n), "cm.tsl");
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  auto inputs = tessel::random_inputs(g, 7);

  // Compute: the program without the pass, no link model.
  double compute_s = 0;
  {
    tessel::ThreadRuntime rt(n);
    tessel::LoadOptions lo;
    lo.lowering.collective_matmul.mode = tessel::OverlapMode::Off;
    tessel::LoadedExecutable le = tessel::load(exe, rt, lo);
    std::vector<tessel::ShardedArray> in;
    for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
    time_runs(le, in);
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) t.push_back(time_runs(le, in));
    compute_s = median(t);
  }
  int count = 0;
  const double wire = wire_bytes(exe.program(), &count);
  tessel::ThreadRuntimeOptions ro;
  if (link) {
    ro.link_model.alpha_s = 10e-6;
    ro.link_model.bandwidth = wire / std::max(compute_s - count * ro.link_model.alpha_s, 1e-6);
  }
  const double comm_s = link ? count * ro.link_model.alpha_s + wire / ro.link_model.bandwidth : 0.0;

  // The gate with this machine's figures: its measured flop rate, the link model's link.
  tessel::CollectiveMatmulOptions gate;
  gate.cost.flops_per_s = exe.program().total_flops() / compute_s;
  gate.cost.memory_bandwidth = 5e9;
  if (link) gate.cost.default_link = tessel::LinkSpec{ro.link_model.alpha_s, ro.link_model.bandwidth};
  int auto_sites = 0, sites = 0;
  for (const auto& s : tessel::collective_matmul_sites(exe.program(), gate)) {
    if (s.before_s <= 0) continue;
    ++sites;
    if (s.variant != tessel::RingVariant::None) ++auto_sites;
  }

  tessel::ThreadRuntime rt(n, ro);
  const Variant variants[] = {{tessel::OverlapMode::Off, tessel::RingDirection::Uni},
                              {tessel::OverlapMode::On, tessel::RingDirection::Uni},
                              {tessel::OverlapMode::On, tessel::RingDirection::Bi}};
  std::vector<tessel::LoadedExecutable> les;
  std::vector<std::vector<tessel::ShardedArray>> ins;
  for (const Variant& v : variants) {
    tessel::LoadOptions lo;
    lo.lowering.collective_matmul.mode = v.mode;
    lo.lowering.collective_matmul.direction = v.dir;
    les.push_back(tessel::load(exe, rt, lo));
    std::vector<tessel::ShardedArray> in;
    for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(les.back().to_device(i, inputs[i]));
    ins.push_back(std::move(in));
    time_runs(les.back(), ins.back());  // warm-up
  }
  std::vector<double> t[3];
  for (auto _ : state)
    for (int v = 0; v < 3; ++v) t[v].push_back(time_runs(les[static_cast<std::size_t>(v)], ins[static_cast<std::size_t>(v)]));
  const double off = median(t[0]), uni = median(t[1]), bi = median(t[2]);
  state.counters["compute_ms"] = compute_s * 1e3;
  state.counters["comm_ms"] = comm_s * 1e3;
  state.counters["off_ms"] = off * 1e3;
  state.counters["uni_ms"] = uni * 1e3;
  state.counters["bi_ms"] = bi * 1e3;
  state.counters["speedup_uni"] = off / uni;
  state.counters["speedup_bi"] = off / bi;
  state.counters["ratio_bi"] = bi / std::max(compute_s, comm_s);
  state.counters["ratio_uni"] = uni / std::max(compute_s, comm_s);
  state.counters["sites"] = sites;
  state.counters["auto_sites"] = auto_sites;
  state.SetLabel(fmt::format("{} {} devices, {}", graph == 0 ? "megatron-mlp" : "transformer-block", n,
                             link ? fmt::format("link model alpha 10 us, {:.3g} GB/s", ro.link_model.bandwidth / 1e9)
                                  : std::string("no link model")));
}
BENCHMARK(BM_CollectiveMatmul)
    ->ArgsProduct({{0, 1}, {2, 4, 8}, {0, 1}})
    ->ArgNames({"graph", "devices", "link"})
    ->Iterations(7)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
