// BM_GptForward/<devices>: the gpt example's forward pass (default config: batch 8, seq 64,
// d_model 128, 4 heads, 2 layers, vocab 512) partitioned over 1, 2, 4 and 8 virtual CPU
// devices (meshes data=1,model=1 / data=2,model=1 / data=2,model=2 / data=2,model=4), against
// BM_GptForwardReference: the unpartitioned graph on one device with the same kernels.
// On one device tessel's run should cost no more than 1.1x the reference.
#include <benchmark/benchmark.h>

#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/reference.hpp"

namespace {

tessel::Mesh mesh_for(int64_t devices) {
  switch (devices) {
    case 1: return tessel::Mesh::parse("data=1,model=1");
    case 2: return tessel::Mesh::parse("data=2,model=1");
    case 4: return tessel::Mesh::parse("data=2,model=2");
    default: return tessel::Mesh::parse("data=2,model=4");
  }
}

void BM_GptForward(benchmark::State& state) {
  tessel::GptConfig cfg;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  tessel::Executable exe = tessel::compile(m.graph, mesh_for(state.range(0)));
  auto inputs = tessel::random_inputs(m.graph, 1234);
  for (auto _ : state) {
    auto out = exe.run(inputs);
    benchmark::DoNotOptimize(out);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  int64_t peak = 0;
  for (int64_t b : exe.last_stats().measured_peak_bytes) peak = std::max(peak, b);
  state.counters["measured_peak_bytes"] = static_cast<double>(peak);
  state.counters["planned_peak_bytes"] = static_cast<double>(exe.last_stats().planned_peak_bytes);
}
BENCHMARK(BM_GptForward)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GptForwardReference(benchmark::State& state) {
  tessel::GptConfig cfg;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  auto inputs = tessel::random_inputs(m.graph, 1234);
  for (auto _ : state) {
    auto out = tessel::run_reference(m.graph, inputs);
    benchmark::DoNotOptimize(out);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GptForwardReference)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
