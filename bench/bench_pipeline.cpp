// BM_Pipeline/schedule:<k>/micro:<M>: one training step of a GPT cut into two pipeline stages
// of one CPU device each (pipeline/runner.hpp), by GPipe (0), 1F1B (1) or interleaved 1F1B with
// 2 chunks per stage (2), over M micro-batches of 2 rows. The model: d_model 128, 4 heads,
// 4 layers (equal stages: 2 layers each, or 1 per chunk), vocab 256, 64 positions; random
// weights and tokens (seeded). One untimed step first, then the timed ones. Counters:
//   bubble          the measured idle share of the stages over the schedule's span,
//                   1 - sum(busy) / (stages x span), the mean over the timed steps;
//   bubble_ideal    the schedule's own with equal stages, free transfers and a backward
//                   twice the forward (pipeline/schedule.hpp simulate);
//   in_flight_s0/1  each stage's most micro-batches forwarded and not yet backwarded;
//   kept_bytes_s0/1 each stage's most bytes per device of forward inputs kept for the
//                   backwards at once (the activations a stage holds).
#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/reference.hpp"

namespace {

void BM_Pipeline(benchmark::State& state) {
  const auto kind = static_cast<tessel::ScheduleKind>(state.range(0));
  const int64_t M = state.range(1), chunks = kind == tessel::ScheduleKind::Interleaved ? 2 : 1, P = 2;
  tessel::GptConfig c;
  c.batch = 2;  // one micro-batch
  c.seq = 64;
  c.d_model = 128;
  c.heads = 4;
  c.layers = 4;
  c.vocab = 256;
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1"), c);
  tessel::GptGraph m = tessel::build_gpt(c);
  std::vector<tessel::HostTensor> in = tessel::random_inputs(m.graph, 2026);
  tessel::gpt_init(m.graph, in);
  std::map<std::string, tessel::HostTensor> init;
  for (const tessel::Tensor& w : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == w.id) init[w.name()] = in[i];
  std::vector<tessel::Tensor> cuts;
  for (int64_t k = 1; k < P * chunks; ++k) cuts.push_back(m.checkpoints.at(static_cast<std::size_t>(k * c.layers / (P * chunks))));
  tessel::ThreadRuntime r0(1), r1(1);
  tessel::PipelineOptions o;
  o.schedule = kind;
  o.micro = M;
  o.chunks = chunks;
  tessel::PipelineTrainer trainer(tessel::split_stages(m.graph, m.loss, m.weights, cuts), mesh, {&r0, &r1}, init, o);
  std::mt19937_64 rng(7);
  std::vector<std::map<std::string, tessel::HostTensor>> micro;
  for (int64_t k = 0; k < M; ++k) {
    tessel::HostTensor tokens(tessel::DType::i32, {c.batch, c.seq}), labels(tessel::DType::i32, {c.batch, c.seq});
    for (int64_t i = 0; i < c.batch * c.seq; ++i) {
      tokens.set(i, static_cast<double>(rng() % 256));
      labels.set(i, static_cast<double>(rng() % 256));
    }
    micro.push_back({{"tokens", tokens}, {"labels", labels}});
  }
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
    ->ArgNames({"schedule", "micro"})
    ->ArgsProduct({{0, 1, 2}, {4, 8, 16}})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
