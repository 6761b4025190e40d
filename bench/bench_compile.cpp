// BM_CompileGPT/<layers>: build + propagate + partition a GPT-3-shaped forward graph
// (d_model 12288, 96 heads, seq 2048, vocab 50304) on a data=8,model=8 mesh.
#include <benchmark/benchmark.h>

#include "tessel/models/gpt.hpp"
#include "tessel/partition.hpp"
#include "tessel/propagate.hpp"

namespace {

void BM_CompileGPT(benchmark::State& state) {
  tessel::GptConfig cfg;
  cfg.batch = 64;
  cfg.seq = 2048;
  cfg.d_model = 12288;
  cfg.heads = 96;
  cfg.vocab = 50304;
  cfg.layers = state.range(0);
  tessel::Mesh mesh = tessel::Mesh::parse("data=8,model=8");
  std::size_t instrs = 0, ops = 0;
  for (auto _ : state) {
    tessel::GptGraph m = tessel::build_gpt(cfg);
    tessel::PropagationResult prop = tessel::propagate(m.graph, mesh);
    tessel::Program prog = tessel::partition(m.graph, mesh, prop);
    instrs = prog.instrs.size();
    ops = m.graph.ops.size();
    benchmark::DoNotOptimize(prog);
  }
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["instrs"] = static_cast<double>(instrs);
}
BENCHMARK(BM_CompileGPT)->Arg(1)->Arg(12)->Arg(96)->Unit(benchmark::kMillisecond);

}  // namespace
