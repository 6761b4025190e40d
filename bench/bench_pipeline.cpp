// BM_Pipeline/schedule:<k>/micro:<M>/keep:<a>/layers:<L>: one training step of a GPT cut into two
// pipeline stages of one CPU device each (pipeline/runner.hpp), by GPipe (0), 1F1B (1), interleaved
// 1F1B with 2 chunks per stage (2) or zero bubble ZB-H1 (3: the backward split into B and W), over
// M micro-batches of 2 rows, 20 timed steps; keep 0: each stage's backward recomputes its forward
// (PipelineOptions::remat all, the default), keep 1: the stages keep their activations (none).
// The model: d_model 128, 4 heads, L layers (4 or 8: equal stages of L/2 layers each, L/4 per
// chunk; at 4 layers an interleaved chunk is one layer, and a transfer's and a program's fixed
// costs weigh more beside it), vocab 64 (the head and the embedding small beside a layer, so the
// stages are equal), 64 positions; random weights and tokens (seeded). One untimed step first,
// then the timed ones. Counters:
//   bubble          the measured idle share of the stages over the schedule's span,
//                   1 - sum(busy) / (stages x span), the mean over the timed steps;
//   bubble_ideal    the schedule's own with equal stages, free transfers and a backward
//                   twice the forward (pipeline/schedule.hpp simulate; ZB-H1: B and W each
//                   as long as the forward);
//   in_flight_s0/1  each stage's most micro-batches forwarded and not yet backwarded;
//   kept_bytes_s0/1 each stage's most bytes per device kept for the backwards at once (the
//                   forward's inputs, and with keep 1 its saved activations, with ZB-H1 B's
//                   values W reads).
// BM_PipelineCut/auto:<a>: one 1F1B step over 8 micro-batches of a GPT whose LM head outweighs a
// block (d_model 64, 4 heads, 8 layers, vocab 8192, 32 positions, 2 rows a micro-batch) on two
// stages of one device, cut into equal layers (auto 0) or by choose_stage_cuts
// (pipeline/auto_stages.hpp) at the blocks' boundaries with the pieces priced by the cost model
// at this machine's figures (auto 1) or timed on the device (auto 2), or at every value the
// graph can be cut at (single_value_cuts), timed (auto 3). Counters: the cut's predicted step
// (predicted_us: from the pieces' prices or times) and its last stage's pieces
// (last_stage_pieces).
// BM_AutoStagesSearch/layers:<L>/timed:<t>: the time choose_stage_cuts takes for a GPT of L layers
// (d_model 64, 4 heads, vocab 512, 32 positions) into 4 stages: every piece compiled and priced
// (timed 0) or run on a CPU device (timed 1: StageCutOptions::runtime), then the dynamic program.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/auto_stages.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/reference.hpp"

namespace {

std::map<std::string, tessel::HostTensor> weights_of(const tessel::GptGraph& m) {
  std::vector<tessel::HostTensor> in = tessel::random_inputs(m.graph, 2026);
  tessel::gpt_init(m.graph, in);
  std::map<std::string, tessel::HostTensor> init;
  for (const tessel::Tensor& w : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == w.id) init[w.name()] = in[i];
  return init;
}

std::vector<std::map<std::string, tessel::HostTensor>> batches_of(const tessel::GptConfig& c, int64_t M) {
  std::mt19937_64 rng(7);
  std::vector<std::map<std::string, tessel::HostTensor>> micro;
  for (int64_t k = 0; k < M; ++k) {
    tessel::HostTensor tokens(tessel::DType::i32, {c.batch, c.seq}), labels(tessel::DType::i32, {c.batch, c.seq});
    for (int64_t i = 0; i < c.batch * c.seq; ++i) {
      tokens.set(i, static_cast<double>(rng() % static_cast<uint64_t>(c.vocab)));
      labels.set(i, static_cast<double>(rng() % static_cast<uint64_t>(c.vocab)));
    }
    micro.push_back({{"tokens", tokens}, {"labels", labels}});
  }
  return micro;
}

void BM_Pipeline(benchmark::State& state) {
  const auto kind = static_cast<tessel::ScheduleKind>(state.range(0));
  const int64_t M = state.range(1), chunks = kind == tessel::ScheduleKind::Interleaved ? 2 : 1, P = 2;
  tessel::GptConfig c;
  c.batch = 2;  // one micro-batch
  c.seq = 64;
  c.d_model = 128;
  c.heads = 4;
  c.layers = state.range(3);
  c.vocab = 64;
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1"), c);
  tessel::GptGraph m = tessel::build_gpt(c);
  const auto init = weights_of(m);
  std::vector<tessel::Tensor> cuts;
  for (int64_t k = 1; k < P * chunks; ++k) cuts.push_back(m.checkpoints.at(static_cast<std::size_t>(k * c.layers / (P * chunks))));
  tessel::ThreadRuntime r0(1), r1(1);
  tessel::PipelineOptions o;
  o.schedule = kind;
  o.micro = M;
  o.chunks = chunks;
  o.remat = state.range(2) ? tessel::RematPolicy::none : tessel::RematPolicy::all;
  tessel::PipelineTrainer trainer(tessel::split_stages(m.graph, m.loss, m.weights, cuts), mesh, {&r0, &r1}, init, o);
  const auto micro = batches_of(c, M);
  int64_t t = 1;
  trainer.step(micro, 1e-4, t++);  // warm-up
  double bubble = 0;
  int64_t steps = 0;
  tessel::PipelineStepReport r;
  for (auto _ : state) {
    r = trainer.step(micro, 1e-4, t++);
    bubble += r.bubble;
    ++steps;
  }
  state.counters["bubble"] = bubble / static_cast<double>(steps);
  state.counters["bubble_ideal"] = tessel::simulate(trainer.schedule(), 1, 2).bubble;
  for (int64_t s = 0; s < P; ++s) {
    state.counters["in_flight_s" + std::to_string(s)] = static_cast<double>(r.peak_in_flight[static_cast<std::size_t>(s)]);
    state.counters["kept_bytes_s" + std::to_string(s)] = static_cast<double>(r.peak_kept_bytes[static_cast<std::size_t>(s)]);
  }
}
BENCHMARK(BM_Pipeline)
    ->ArgNames({"schedule", "micro", "keep", "layers"})
    ->ArgsProduct({{0, 1, 2, 3}, {4, 8, 16}, {0, 1}, {4, 8}})
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_PipelineCut(benchmark::State& state) {
  const int64_t how = state.range(0);
  const int64_t M = 8, P = 2;
  tessel::GptConfig c;
  c.batch = 2;
  c.seq = 32;
  c.d_model = 64;
  c.heads = 4;
  c.layers = 8;
  c.vocab = 8192;
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1"), c);
  tessel::GptGraph m = tessel::build_gpt(c);
  const auto init = weights_of(m);
  tessel::ThreadRuntime r0(1), r1(1);
  // Candidates: the blocks' boundaries (auto 1, 2), or every value the graph can be cut at
  // (auto 3: also within blocks, the final layer norm's output and the logits).
  const std::vector<tessel::Tensor> candidates =
      how == 3 ? tessel::single_value_cuts(m.graph, m.weights)
               : std::vector<tessel::Tensor>(m.checkpoints.begin(), m.checkpoints.end() - 1);
  tessel::StageCutOptions so;
  so.meshes = {mesh};
  if (how >= 2) so.runtime = &r0;  // timed on the device, not priced
  const tessel::StageCut sc =
      tessel::choose_stage_cuts(m.graph, m.loss, m.weights, candidates, P, M, so, tessel::measured_cost_model(r0, mesh));
  const std::vector<tessel::Tensor> cuts =
      how >= 1 ? sc.cuts : std::vector<tessel::Tensor>{m.checkpoints.at(static_cast<std::size_t>(c.layers / 2))};
  tessel::PipelineOptions o;
  o.schedule = tessel::ScheduleKind::OneFOneB;
  o.micro = M;
  tessel::PipelineTrainer trainer(tessel::split_stages(m.graph, m.loss, m.weights, cuts), mesh, {&r0, &r1}, init, o);
  const auto micro = batches_of(c, M);
  int64_t t = 1;
  trainer.step(micro, 1e-4, t++);  // warm-up
  double span = 0, update = 0;
  std::vector<double> busy(P, 0.0);
  for (auto _ : state) {
    const tessel::PipelineStepReport r = trainer.step(micro, 1e-4, t++);
    span += r.span_s;
    update += r.update_s;
    for (int64_t s = 0; s < P; ++s) busy[static_cast<std::size_t>(s)] += r.busy_s[static_cast<std::size_t>(s)];
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["span_us"] = span / n * 1e6;
  state.counters["update_us"] = update / n * 1e6;
  for (int64_t s = 0; s < P; ++s) state.counters["busy_us_s" + std::to_string(s)] = busy[static_cast<std::size_t>(s)] / n * 1e6;
  if (how != 3) {  // the equal cut is over the blocks' boundaries
    state.counters["predicted_us"] = (how >= 1 ? sc.step_s : sc.equal_step_s) * 1e6;
    state.counters["last_stage_pieces"] = static_cast<double>(how >= 1 ? sc.pieces.back() : sc.equal_pieces.back());
  } else {
    state.counters["predicted_us"] = sc.step_s * 1e6;
    state.counters["last_stage_pieces"] = static_cast<double>(sc.pieces.back());
  }
}
BENCHMARK(BM_PipelineCut)->ArgNames({"auto"})->DenseRange(0, 3)->Iterations(10)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AutoStagesSearch(benchmark::State& state) {
  tessel::GptConfig c;
  c.batch = 2;
  c.seq = 32;
  c.d_model = 64;
  c.heads = 4;
  c.layers = state.range(0);
  c.vocab = 512;
  const bool timed = state.range(1) == 1;
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1"), c);
  tessel::GptGraph m = tessel::build_gpt(c);
  const std::vector<tessel::Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
  tessel::ThreadRuntime rt(1);
  tessel::StageCutOptions so;
  so.meshes = {mesh};
  if (timed) so.runtime = &rt;  // every piece run on the device (5 timed runs each)
  for (auto _ : state)
    benchmark::DoNotOptimize(
        tessel::choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 4, 16, so, tessel::CostModel{}).step_s);
}
BENCHMARK(BM_AutoStagesSearch)
    ->ArgNames({"layers", "timed"})
    ->ArgsProduct({{24, 96}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace
