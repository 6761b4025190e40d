// BM_TrainStep/<devices>/<zero>: one training step (forward, backward, clipping, AdamW;
// train.hpp) of the gpt example's default model (batch 8, seq 64, d_model 128, 4 heads,
// 2 layers, vocab 512), loaded once, parameters and moments resident and donated, over 1, 2,
// 4 and 8 virtual CPU devices (the meshes of BM_GptForward), at ZeRO stages 0 and 2; beside
// BM_TrainStepReference, the unpartitioned step on one device. Counters: tokens/s and the
// peak bytes per device of the memory plan.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>

#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"

namespace {

tessel::Mesh train_mesh(int64_t devices) {
  switch (devices) {
    case 1: return tessel::Mesh::parse("data=1,model=1");
    case 2: return tessel::Mesh::parse("data=2,model=1");
    case 4: return tessel::Mesh::parse("data=2,model=2");
    default: return tessel::Mesh::parse("data=2,model=4");
  }
}

// The step's initial inputs: GPT-2 initialisation, zero moments, lr 1e-3, t = 1.
std::vector<tessel::HostTensor> step_inputs(const tessel::Graph& g) {
  std::vector<tessel::HostTensor> in = tessel::random_inputs(g, 1234);
  tessel::gpt_init(g, in);
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const std::string& name = g.values[static_cast<std::size_t>(g.inputs[i])].name;
    if (name == "adam.lr") in[i].set(0, 1e-3);
    if (name == "adam.bc1") in[i].set(0, 1 / (1 - 0.9));
    if (name == "adam.bc2") in[i].set(0, 1 / (1 - 0.999));
  }
  return in;
}

void BM_TrainStep(benchmark::State& state) {
  const tessel::Mesh mesh = train_mesh(state.range(0));
  tessel::GptConfig cfg;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  tessel::TrainOptions to;
  to.zero = static_cast<int>(state.range(1));
  tessel::TrainStep step = tessel::add_train_step(m.graph, m.loss, m.weights, mesh, to);
  tessel::Executable exe = tessel::compile(m.graph, mesh);
  tessel::ThreadRuntime rt(mesh.num_devices());
  tessel::LoadOptions lo;
  lo.donate = step.donations();
  tessel::LoadedExecutable prog = tessel::load(exe, rt, lo);
  const auto host = step_inputs(m.graph);
  std::vector<tessel::ShardedArray> args;
  for (std::size_t i = 0; i < host.size(); ++i) args.push_back(prog.to_device(i, host[i]));
  std::vector<int> feeds(m.graph.outputs.size(), -1);
  for (std::size_t o = 0; o < feeds.size(); ++o) {
    const std::string& name = m.graph.values[static_cast<std::size_t>(m.graph.outputs[o])].name;
    if (name.rfind("next.", 0) == 0) feeds[o] = static_cast<int>(prog.input_index(name.substr(5)));
  }
  for (auto _ : state) {
    tessel::RunResult r = prog.run(args);
    for (std::size_t o = 0; o < feeds.size(); ++o)
      if (feeds[o] >= 0) args[static_cast<std::size_t>(feeds[o])] = r.outputs[o];
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_bytes"] = static_cast<double>(prog.program().memory_plan().peak_bytes());
}
BENCHMARK(BM_TrainStep)
    ->ArgsProduct({{1, 2, 4, 8}, {0, 2}})
    ->ArgNames({"devices", "zero"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_TrainStepReference(benchmark::State& state) {
  tessel::GptConfig cfg;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  tessel::add_train_step(m.graph, m.loss, m.weights, train_mesh(1), {});
  const auto host = step_inputs(m.graph);
  for (auto _ : state) {
    auto out = tessel::run_reference(m.graph, host);
    benchmark::DoNotOptimize(out);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(cfg.batch * cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStepReference)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
