// BM_CompileGPT/<layers>: build + propagate + partition a GPT-3-shaped forward graph
// (d_model 12288, 96 heads, seq 2048, vocab 50304) on a data=8,model=8 mesh.
// BM_CompileTrainGPT/<layers>/<zero>: the same model's whole training step (forward,
// backward, clipping, AdamW; train.hpp) built, differentiated, propagated and partitioned.
#include <benchmark/benchmark.h>

#include "tessel/models/gpt.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/train/train_step.hpp"

namespace {

tessel::GptConfig gpt3(int64_t layers) {
  tessel::GptConfig cfg;
  cfg.batch = 64;
  cfg.seq = 2048;
  cfg.d_model = 12288;
  cfg.heads = 96;
  cfg.vocab = 50304;
  cfg.layers = layers;
  return cfg;
}

// Builds the graph (and, with `zero` >= 0, the training step at that stage), propagates and
// partitions it every iteration.
void compile_gpt3(benchmark::State& state, int zero) {
  const tessel::GptConfig cfg = gpt3(state.range(0));
  tessel::Mesh mesh = tessel::Mesh::parse("data=8,model=8");
  tessel::TrainOptions to;
  to.zero = zero;
  std::size_t instrs = 0, ops = 0;
  for (auto _ : state) {
    tessel::GptGraph m = tessel::build_gpt(cfg);
    if (zero >= 0) tessel::add_train_step(m.graph, m.loss, m.weights, mesh, to);
    tessel::PropagationResult prop = tessel::propagate(m.graph, mesh);
    tessel::Program prog = tessel::partition(m.graph, mesh, prop);
    instrs = prog.instrs.size();
    ops = m.graph.ops.size();
    benchmark::DoNotOptimize(prog);
  }
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["instrs"] = static_cast<double>(instrs);
}

void BM_CompileGPT(benchmark::State& state) { compile_gpt3(state, -1); }
BENCHMARK(BM_CompileGPT)->Arg(1)->Arg(12)->Arg(96)->Unit(benchmark::kMillisecond);

void BM_CompileTrainGPT(benchmark::State& state) { compile_gpt3(state, static_cast<int>(state.range(1))); }
BENCHMARK(BM_CompileTrainGPT)->Args({1, 0})->Args({96, 0})->Args({96, 2})->Args({96, 3})->Unit(benchmark::kMillisecond);

}  // namespace
