// BM_AutoShardTrain/<model>/<mesh>: automatic sharding of a whole GPT training step (forward,
// backward, clipping, AdamW; train_step.hpp) with only the batch placed on `data`, against the
// hand-written Megatron plan (build_gpt's annotations, ZeRO 0) on the same mesh. Models: 0 the
// GPT-2 124M shapes (12 layers, d_model 768, seq 1024, vocab 50304, batch 8), 1 the 96-layer
// GPT-3 (d_model 12288, 96 heads, seq 2048, batch 64). Meshes: 0 data=2,model=4, 1 data=8,model=1,
// 2 data=8,model=8. The step's own layouts (parameters, moments, gradients) are left to
// auto_shard, each update tied to its parameter (TrainStep::donations). Counters: the search
// (formulation + solve, AutoShardOptions defaults: the automatic solver limit; wall clock and
// this process's CPU time, the machine being shared), and both plans' predicted time per device
// from the compiled programs (cost model compute + collectives) and their ratio.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <string>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/train/train_step.hpp"

namespace {

tessel::GptConfig model_config(int64_t model) {
  tessel::GptConfig c;
  if (model == 0) {
    c.batch = 8;
    c.seq = 1024;
    c.d_model = 768;
    c.heads = 12;
    c.layers = 12;
  } else {
    c.batch = 64;
    c.seq = 2048;
    c.d_model = 12288;
    c.heads = 96;
    c.layers = 96;
  }
  c.vocab = 50304;
  return c;
}

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double predicted(const tessel::Executable& exe, const tessel::CostModel& cost) {
  return exe.program().compute_seconds(cost) + exe.program().comm_seconds();
}

void BM_AutoShardTrain(benchmark::State& state) {
  static const char* kMeshes[] = {"data=2,model=4", "data=8,model=1", "data=8,model=8"};
  const tessel::Mesh mesh = tessel::Mesh::parse(kMeshes[state.range(1)]);
  tessel::GptConfig cfg = model_config(state.range(0));
  tessel::AutoShardOptions o;
  // The hand plan: Megatron annotations, ZeRO 0.
  tessel::GptGraph hand = tessel::build_gpt(cfg);
  tessel::add_train_step(hand.graph, hand.loss, hand.weights, mesh, {});
  const double hand_s = predicted(tessel::compile(hand.graph, mesh), o.cost);
  double search = 0, search_cpu = 0, auto_s = 0;
  tessel::AutoShardResult r;
  for (auto _ : state) {
    cfg.annotate = false;
    tessel::GptGraph m = tessel::build_gpt(cfg);
    m.graph.annotate(m.tokens, tessel::Sharding::of({{"data"}, {}}));
    m.graph.annotate(m.labels, tessel::Sharding::of({{"data"}, {}}));
    const tessel::TrainStep ts = tessel::add_train_step(m.graph, m.loss, m.weights, mesh, {});
    for (auto it = m.graph.annotations.begin(); it != m.graph.annotations.end();)
      it = (it->first == m.tokens.id || it->first == m.labels.id) ? std::next(it) : m.graph.annotations.erase(it);
    o.tied = ts.donations();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_s();
    r = tessel::auto_shard(m.graph, mesh, o);
    search_cpu = process_cpu_s() - c0;
    search = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto_s = predicted(tessel::compile(r.annotated(m.graph), mesh), o.cost);
  }
  state.counters["search_s"] = search;
  state.counters["search_cpu_s"] = search_cpu;
  state.counters["solve_s"] = r.solve_s;
  state.counters["formulate_s"] = r.formulate_s;
  state.counters["nodes"] = static_cast<double>(r.nodes);
  state.counters["strategies"] = static_cast<double>(r.strategies);
  state.counters["hand_s"] = hand_s;
  state.counters["auto_s"] = auto_s;
  state.counters["auto_over_hand"] = auto_s / hand_s;
  state.SetLabel(std::string(state.range(0) == 0 ? "GPT-2 124M" : "GPT-3 96 layers") + " train step on " +
                 mesh.to_string() + ", solver " + r.solver);
}
BENCHMARK(BM_AutoShardTrain)
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 2})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace
