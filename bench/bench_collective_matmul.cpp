// BM_CollectiveMatmul/<graph>/<devices>/<link>: the collective-matmul pass on CPU device threads,
// side by side in one run: the same program lowered with the pass off, with unidirectional
// rings, with bidirectional rings, and with the gate deciding per site (auto), run in turn
// (round robin, so that noise on this shared machine hits all four alike); the counters are
// medians.
//   graph 0: the Megatron MLP with sequence parallelism (collective_matmul_graphs.hpp): one
//            all-gather → einsum and one einsum → reduce-scatter site.
//   graph 1: a sequence-parallel transformer block (collective_matmul_graphs.hpp): four sites.
//   link 0:  no link model — a transfer is an in-process memcpy, which occupies a core as the
//            einsums do (no real interconnect does): what the pass costs on bare threads.
//   link L > 0: the thread communicator's LinkModel (a simulated interconnect: each transfer
//            takes alpha + bytes/bandwidth of wall time asleep), with the bandwidth chosen so
//            that the modelled communication of the program is L/100 times its measured
//            compute: 50, 100 and 200 sweep comm/compute over 0.5, 1 and 2.
// Counters: compute_ms (the program without the pass and without link model: kernels and
// memcpys; timed in the same round robin), sizing_compute_ms (the same, timed just before, by
// which the link bandwidth and the gate's flop rate were chosen), comm_ms (the link model's time of every collective of the program without the
// pass, one after the other), comm_over_compute, off_ms / uni_ms / bi_ms / auto_ms (step
// times), speedup_uni/_bi/_auto (off / that), ratio_off/_uni/_bi (that / max(compute, comm):
// 1.0 is perfect overlap), sites, auto_sites (sites the gate takes with a cost model of this
// machine: its measured flop rate per core, compute_sharing(devices, cores), the dispatch cost
// per instruction — kCpuDispatchUs, or TESSEL_CM_DISPATCH_US — and the link model's link).
// TESSEL_CM_TRACE_DIR=DIR: one more run of each variant writes its trace there.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "collective_matmul_graphs.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/passes/collective_matmul.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

namespace {

// Seconds per instruction beyond its kernel that the gate charges on this machine (CPU device
// threads, async streams): measured, see docs/collective-matmul.md.
constexpr double kCpuDispatchUs = 20;

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

// The seconds each instruction a device stream runs costs on this machine beyond its
// kernel, for the gate's CostModel::dispatch_s: TESSEL_CM_DISPATCH_US when set, else the
// figure measured on the 2-core box (docs/collective-matmul.md, "The gate").
double dispatch_s() {
  const char* v = std::getenv("TESSEL_CM_DISPATCH_US");
  return (v ? std::atof(v) : kCpuDispatchUs) * 1e-6;
}

void BM_CollectiveMatmul(benchmark::State& state) {
  const int64_t graph = state.range(0), n = state.range(1);
  // 0: no link model; else the link model with comm / compute = link / 100.
  const int64_t link_pct = state.range(2);
  const bool link = link_pct != 0;
  tessel::Graph g = tessel::parse_graph(graph == 0 ? tessel_bench::mlp_text(n) : tessel_bench::block_text(n), "cm.tsl");
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  auto inputs = tessel::random_inputs(g, 7);

  // Compute: the program without the pass, no link model; measured first to size the link,
  // then again side by side with the variants (the counters use the side-by-side median).
  tessel::ThreadRuntime rt0(n);
  tessel::LoadOptions lo0;
  lo0.lowering.collective_matmul.mode = tessel::OverlapMode::Off;
  tessel::LoadedExecutable le0 = tessel::load(exe, rt0, lo0);
  std::vector<tessel::ShardedArray> in0;
  for (std::size_t i = 0; i < inputs.size(); ++i) in0.push_back(le0.to_device(i, inputs[i]));
  double compute_s = 0;
  {
    tessel_bench::time_run(le0, in0);
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) t.push_back(tessel_bench::time_run(le0, in0));
    compute_s = tessel_bench::median(t);
  }
  int count = 0;
  const double wire = wire_bytes(exe.program(), &count);
  tessel::ThreadRuntimeOptions ro;
  if (link) {
    ro.link_model.alpha_s = 10e-6;
    const double comm_target = compute_s * static_cast<double>(link_pct) / 100;
    ro.link_model.bandwidth = wire / std::max(comm_target - count * ro.link_model.alpha_s, 1e-6);
  }
  const double comm_s = link ? count * ro.link_model.alpha_s + wire / ro.link_model.bandwidth : 0.0;

  // The gate with this machine's figures: its measured flop rate per device thread with a
  // core to itself (the measured rate times the sharing), the device threads per core, the
  // dispatch cost per instruction, the link model's link.
  tessel::CollectiveMatmulOptions gate;
  const int64_t cores = std::thread::hardware_concurrency();
  gate.cost.compute_sharing = tessel::compute_sharing(n, cores);
  gate.cost.flops_per_s = exe.program().total_flops() / compute_s * gate.cost.compute_sharing;
  gate.cost.memory_bandwidth = 5e9;
  gate.cost.dispatch_s = dispatch_s();
  if (link) gate.cost.default_link = tessel::LinkSpec{ro.link_model.alpha_s, ro.link_model.bandwidth};
  int auto_sites = 0, sites = 0;
  for (const auto& s : tessel::collective_matmul_sites(exe.program(), gate)) {
    if (s.before_s <= 0) continue;
    ++sites;
    if (s.variant != tessel::RingVariant::None) ++auto_sites;
  }

  tessel::ThreadRuntime rt(n, ro);
  constexpr std::size_t kVariants = tessel_bench::kCmVariantCount;
  tessel_bench::CmLoaded loaded = tessel_bench::load_cm_variants(exe, rt, gate, inputs);
  std::vector<tessel::LoadedExecutable>& les = loaded.les;
  std::vector<std::vector<tessel::ShardedArray>>& ins = loaded.ins;
  std::vector<double> t[kVariants], t0;
  for (auto _ : state) {
    t0.push_back(tessel_bench::time_run(le0, in0));
    for (std::size_t v = 0; v < kVariants; ++v) t[v].push_back(tessel_bench::time_run(les[v], ins[v]));
  }
  const double off = tessel_bench::median(t[0]), uni = tessel_bench::median(t[1]), bi = tessel_bench::median(t[2]), gated = tessel_bench::median(t[3]);
  const double sizing_s = compute_s;  // what the link and the gate's flop rate were sized by
  compute_s = tessel_bench::median(t0);
  if (const char* dir = std::getenv("TESSEL_CM_TRACE_DIR")) {
    // One more (warm) run of each variant, traced: <dir>/g<graph>_n<devices>_l<link>_<variant>.json.
    for (std::size_t v = 0; v < kVariants; ++v) {
      tessel::RunOptions opts;
      opts.trace_path = fmt::format("{}/g{}_n{}_l{}_{}.json", dir, graph, n, link_pct, tessel_bench::kCmVariants[v].name);
      les[v].run(ins[v], opts);
    }
  }
  const double bound = std::max(compute_s, comm_s);
  state.counters["compute_ms"] = compute_s * 1e3;
  state.counters["comm_ms"] = comm_s * 1e3;
  state.counters["comm_over_compute"] = comm_s / compute_s;
  state.counters["sizing_compute_ms"] = sizing_s * 1e3;
  const double medians[] = {off, uni, bi, gated};
  tessel_bench::set_cm_counters(state, medians);
  state.counters["ratio_off"] = off / bound;
  state.counters["ratio_uni"] = uni / bound;
  state.counters["ratio_bi"] = bi / bound;
  state.counters["sites"] = sites;
  state.counters["auto_sites"] = auto_sites;
  state.SetLabel(fmt::format("{} {} devices, {}", graph == 0 ? "megatron-mlp" : "transformer-block", n,
                             link ? fmt::format("link model alpha 10 us, {:.3g} GB/s (comm/compute {:.2f})",
                                                ro.link_model.bandwidth / 1e9, comm_s / compute_s)
                                  : std::string("no link model")));
}
BENCHMARK(BM_CollectiveMatmul)
    ->ArgsProduct({{0, 1}, {2, 4, 8}, {0, 50, 100, 200}})
    ->ArgNames({"graph", "devices", "link"})
    ->Iterations(7)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
