// Automatic sharding of whole GPT training steps (forward, backward, clipping, AdamW;
// train_step.hpp) with only the batch placed on the data axis, against hand-written plans.
//
// BM_AutoShardTrain/<model>/<mesh>: the predicted time per device of both plans, from the
// compiled programs (cost model compute + collectives, default H100 figures), and the search
// time. Models: 0 the GPT-2 124M shapes (12 layers, d_model 768, seq 1024, vocab 50304, batch
// 8), 1 the 96-layer GPT-3 (d_model 12288, 96 heads, seq 2048, batch 64). Meshes: 0
// data=2,model=4, 1 data=8,model=1, 2 data=8,model=8, 3 fsdp=8. The hand plan: build_gpt's
// Megatron annotations at ZeRO 0 on the data x model meshes; on fsdp=8, the batch on fsdp and
// ZeRO 3 over it (FSDP). The step's own layouts (parameters, moments, gradients) are left to
// auto_shard, each update tied to its parameter (TrainStep::donations). Counters: the search
// (formulation + solve, AutoShardOptions defaults: the automatic solver limit; wall clock and
// this process's CPU time, the machine being shared), both plans' predicted time and their
// ratio, the solver's own estimate of its plan (solver_s: the formulation's compute and
// collectives) beside the compiled program's (auto_comp, auto_comm), and both plans' peak bytes
// per device (the memory plans of the lowered programs, donations counted once).
//
// BM_AutoShardBudget/<model>/<percent>: on data=8,model=1, a memory budget of that percentage
// of the hand ZeRO-0 plan's peak: whether auto_shard's plan fits it (the peak of its compiled
// and lowered program, as a Trainer loads it), and its predicted time beside the hand ZeRO-3
// plan's (which shards all it can).
//
// BM_AutoShardMeasured: measured, not predicted. GPT-2 124M's shapes at seq 128, batch 8 on 4
// CPU virtual devices (mesh data=2,model=2, one ThreadRuntime): a Trainer with the hand plan
// (Megatron, ZeRO 0) and one with TrainerOptions::auto_shard planning with this machine's
// measured figures (measured_cost_model: calibrate_links and calibrate_compute),
// the same initial weights and batches; after a warm-up step each, steps alternate between the
// two (the order swapped every round) so that load on the shared machine falls on both alike;
// each round's times are printed. Counters: the median and least step time of each and the
// ratio of the medians; the two losses must agree (else the benchmark fails).
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <optional>
#include <string>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/train/trainer.hpp"
#include <fmt/format.h>

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

// The same with every collective priced by `cost` too (comm_seconds() holds the compile-time
// figures, the default H100 ones).
double predicted_all_by(const tessel::Executable& exe, const tessel::CostModel& cost) {
  return exe.program().compute_seconds(cost) + exe.program().comm_seconds(cost);
}

const char* kMeshes[] = {"data=2,model=4", "data=8,model=1", "data=8,model=8", "fsdp=8"};

using Donations = std::vector<std::pair<std::string, std::string>>;

// The peak bytes per device of the program load() runs, each donated output written into its
// input (the parameters and moments updated in place) counted once, as a Trainer loads it.
int64_t loaded_peak(const tessel::Executable& exe, const Donations& donations) {
  tessel::Program low = tessel::lower_program(exe.program(), false, {});
  tessel::plan_donations(low, exe.graph(), donations);
  return low.memory_plan().peak_bytes();
}

struct Plan {
  tessel::Executable exe;
  Donations donations;
  int64_t peak() const { return loaded_peak(exe, donations); }
};

// The hand plan of `cfg` on `mesh`: Megatron at ZeRO 0 on data x model; FSDP (ZeRO 3 over the
// one axis, the batch on it) on a mesh of one axis.
Plan hand_plan(tessel::GptConfig cfg, const tessel::Mesh& mesh, int zero) {
  tessel::TrainOptions to;
  to.zero = zero;
  if (mesh.axes().size() == 1) {
    cfg.annotate = false;
    to.zero = 3;
    to.data_axis = mesh.axes()[0].name;
  }
  tessel::GptGraph hand = tessel::build_gpt(cfg);
  if (!cfg.annotate) {
    hand.graph.annotate(hand.tokens, tessel::Sharding::of({{to.data_axis}, {}}));
    hand.graph.annotate(hand.labels, tessel::Sharding::of({{to.data_axis}, {}}));
  }
  const tessel::TrainStep ts = tessel::add_train_step(hand.graph, hand.loss, hand.weights, mesh, to);
  return Plan{tessel::compile(hand.graph, mesh), ts.donations()};
}

// auto_shard of the training step of `cfg` with only the batch placed (on the first axis).
struct AutoPlan {
  tessel::AutoShardResult r;
  Plan plan;
  double search_s = 0, search_cpu_s = 0;
};
AutoPlan auto_plan(tessel::GptConfig cfg, const tessel::Mesh& mesh, tessel::AutoShardOptions o) {
  cfg.annotate = false;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  const std::string& data = mesh.axes()[0].name;
  m.graph.annotate(m.tokens, tessel::Sharding::of({{data}, {}}));
  m.graph.annotate(m.labels, tessel::Sharding::of({{data}, {}}));
  const tessel::TrainStep ts = tessel::add_train_step(m.graph, m.loss, m.weights, mesh, {});
  for (auto it = m.graph.annotations.begin(); it != m.graph.annotations.end();)
    it = (it->first == m.tokens.id || it->first == m.labels.id) ? std::next(it) : m.graph.annotations.erase(it);
  o.tied = ts.donations();
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = process_cpu_s();
  tessel::AutoShardResult r = tessel::auto_shard(m.graph, mesh, o);
  const double cpu = process_cpu_s() - c0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tessel::Executable exe = tessel::compile(r.annotated(m.graph), mesh);
  return AutoPlan{std::move(r), Plan{std::move(exe), o.tied}, wall, cpu};
}

void BM_AutoShardTrain(benchmark::State& state) {
  const tessel::Mesh mesh = tessel::Mesh::parse(kMeshes[state.range(1)]);
  const tessel::GptConfig cfg = model_config(state.range(0));
  tessel::AutoShardOptions o;
  const Plan hand = hand_plan(cfg, mesh, 0);
  const double hand_s = predicted(hand.exe, o.cost);
  std::optional<AutoPlan> a;
  for (auto _ : state) a = auto_plan(cfg, mesh, o);
  const double auto_s = predicted(a->plan.exe, o.cost);
  state.counters["search_s"] = a->search_s;
  state.counters["search_cpu_s"] = a->search_cpu_s;
  state.counters["solve_s"] = a->r.solve_s;
  state.counters["formulate_s"] = a->r.formulate_s;
  state.counters["nodes"] = static_cast<double>(a->r.nodes);
  state.counters["strategies"] = static_cast<double>(a->r.strategies);
  state.counters["hand_s"] = hand_s;
  state.counters["auto_s"] = auto_s;
  state.counters["auto_over_hand"] = auto_s / hand_s;
  state.counters["solver_s"] = a->r.compute_s + a->r.comm_s;
  state.counters["solver_comp"] = a->r.compute_s;
  state.counters["solver_comm"] = a->r.comm_s;
  state.counters["auto_comp"] = a->plan.exe.program().compute_seconds(o.cost);
  state.counters["auto_comm"] = a->plan.exe.program().comm_seconds();
  state.counters["hand_comp"] = hand.exe.program().compute_seconds(o.cost);
  state.counters["hand_comm"] = hand.exe.program().comm_seconds();
  state.counters["hand_peak_GB"] = static_cast<double>(hand.peak()) * 1e-9;
  state.counters["auto_peak_GB"] = static_cast<double>(a->plan.peak()) * 1e-9;
  state.SetLabel(std::string(state.range(0) == 0 ? "GPT-2 124M" : "GPT-3 96 layers") + " train step on " +
                 mesh.to_string() + (mesh.axes().size() == 1 ? " (hand: FSDP)" : " (hand: Megatron)") + ", solver " +
                 a->r.solver);
}
BENCHMARK(BM_AutoShardTrain)
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3}})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

void BM_AutoShardBudget(benchmark::State& state) {
  const tessel::Mesh mesh = tessel::Mesh::parse("data=8,model=1");
  const tessel::GptConfig cfg = model_config(state.range(0));
  tessel::AutoShardOptions o;
  const Plan zero0 = hand_plan(cfg, mesh, 0), zero3 = hand_plan(cfg, mesh, 3);
  const int64_t zero0_peak = zero0.peak();
  o.memory_budget_bytes = zero0_peak * state.range(1) / 100;
  std::optional<AutoPlan> a;
  for (auto _ : state) a = auto_plan(cfg, mesh, o);
  const int64_t auto_peak = a->plan.peak();
  const bool fits = a->r.fits && auto_peak <= o.memory_budget_bytes;
  state.counters["budget_GB"] = static_cast<double>(o.memory_budget_bytes) * 1e-9;
  state.counters["zero0_peak_GB"] = static_cast<double>(zero0_peak) * 1e-9;
  state.counters["zero3_peak_GB"] = static_cast<double>(zero3.peak()) * 1e-9;
  state.counters["auto_peak_GB"] = static_cast<double>(auto_peak) * 1e-9;
  state.counters["auto_solver_peak_GB"] = static_cast<double>(a->r.peak_bytes) * 1e-9;
  state.counters["fits"] = fits ? 1 : 0;
  state.counters["zero0_s"] = predicted(zero0.exe, o.cost);
  state.counters["zero3_s"] = predicted(zero3.exe, o.cost);
  state.counters["auto_s"] = predicted(a->plan.exe, o.cost);
  state.counters["auto_over_zero3"] = predicted(a->plan.exe, o.cost) / predicted(zero3.exe, o.cost);
  state.counters["search_s"] = a->search_s;
  state.SetLabel(std::string(state.range(0) == 0 ? "GPT-2 124M" : "GPT-3 96 layers") + " on data=8,model=1, budget " +
                 std::to_string(state.range(1)) + "% of ZeRO-0's peak: " + (fits ? "fits" : "DOES NOT FIT") +
                 ", solver " + a->r.solver);
}
BENCHMARK(BM_AutoShardBudget)->Args({0, 80})->Args({0, 70})->Args({1, 80})->Args({1, 70})->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

std::map<std::string, tessel::HostTensor> initial_weights(const tessel::GptGraph& m, uint64_t seed) {
  std::vector<tessel::HostTensor> host = tessel::random_inputs(m.graph, seed);
  tessel::gpt_init(m.graph, host);
  std::map<std::string, tessel::HostTensor> w;
  for (std::size_t i = 0; i < m.graph.inputs.size(); ++i) {
    const std::string& name = m.graph.values[static_cast<std::size_t>(m.graph.inputs[i])].name;
    if (name != "tokens" && name != "labels") w[name] = host[i];
  }
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void BM_AutoShardMeasured(benchmark::State& state) {
  tessel::GptConfig cfg = model_config(0);
  cfg.seq = 128;
  const tessel::Mesh mesh = tessel::Mesh::parse("data=2,model=2");
  const uint64_t seed = std::random_device{}();
  std::printf("BM_AutoShardMeasured seed %llu\n", static_cast<unsigned long long>(seed));
  const int rounds = static_cast<int>(state.range(0));
  tessel::ThreadRuntime rt(mesh.num_devices());
  const tessel::GptGraph hand_model = tessel::build_gpt(cfg);
  cfg.annotate = false;
  tessel::GptGraph auto_model = tessel::build_gpt(cfg);
  auto_model.graph.annotate(auto_model.tokens, tessel::Sharding::of({{"data"}, {}}));
  auto_model.graph.annotate(auto_model.labels, tessel::Sharding::of({{"data"}, {}}));
  tessel::Trainer hand(hand_model.graph, hand_model.loss, hand_model.weights, mesh, rt);
  tessel::TrainerOptions ao;
  ao.auto_shard = tessel::AutoShardOptions{};
  // The plan is made for the machine it runs on: the Trainer's default (cost_figures Backend)
  // takes this machine's links, compute and memory rates, measured once and cached
  // (runtime/backend_cost.hpp; the default figures are an H100's, whose ratios differ).
  tessel::Trainer autos(auto_model.graph, auto_model.loss, auto_model.weights, mesh, rt, ao);
  std::printf("BM_AutoShardMeasured: auto priced with %s\nBM_AutoShardMeasured: auto strategy: %s\n",
              autos.auto_shard_result()->cost_source.c_str(), autos.strategy_in_words().c_str());
  const auto w = initial_weights(hand_model, seed);
  hand.init(w);
  autos.init(w);
  std::mt19937_64 rng(seed);
  auto batch = [&] {
    tessel::HostTensor tokens(tessel::DType::i32, {cfg.batch, cfg.seq}), labels(tessel::DType::i32, {cfg.batch, cfg.seq});
    for (int64_t i = 0; i < cfg.batch * cfg.seq; ++i) {
      tokens.set(i, static_cast<double>(rng() % static_cast<uint64_t>(cfg.vocab)));
      labels.set(i, static_cast<double>(rng() % static_cast<uint64_t>(cfg.vocab)));
    }
    return std::vector<tessel::HostTensor>{tokens, labels};
  };
  std::vector<double> th, ta;
  double worst = 0;
  for (auto _ : state) {
    for (int k = 0; k <= rounds; ++k) {  // round 0: warm-up
      const std::vector<tessel::HostTensor> b = batch();
      tessel::StepRecord rh, ra;
      if (k % 2 == 0) {
        rh = hand.step(b);
        ra = autos.step(b);
      } else {
        ra = autos.step(b);
        rh = hand.step(b);
      }
      worst = std::max(worst, std::fabs(rh.loss - ra.loss) / std::fabs(rh.loss));
      std::printf("BM_AutoShardMeasured round %d (%s first): hand %.3f s, auto %.3f s, losses %.6f %.6f\n", k,
                  k % 2 == 0 ? "hand" : "auto", rh.seconds, ra.seconds, rh.loss, ra.loss);
      std::fflush(stdout);
      if (k > 0) {
        th.push_back(rh.seconds);
        ta.push_back(ra.seconds);
      }
    }
  }
  const double h = median(th), a = median(ta);
  state.counters["hand_step_s"] = h;
  state.counters["hand_min_s"] = *std::min_element(th.begin(), th.end());
  state.counters["auto_min_s"] = *std::min_element(ta.begin(), ta.end());
  state.counters["auto_step_s"] = a;
  state.counters["auto_over_hand"] = a / h;
  state.counters["loss_rel_diff"] = worst;
  // Both plans priced with the measured figures the auto plan was made with.
  const tessel::CostModel& here = autos.auto_shard_result()->cost;
  state.counters["hand_predicted_s"] = predicted_all_by(hand.executable(), here);
  state.counters["auto_predicted_s"] = predicted_all_by(autos.executable(), here);
  state.counters["measured_gflops"] = here.flops_per_s * 1e-9;
  state.counters["measured_GBps"] = here.memory_bandwidth * 1e-9;
  state.counters["hand_peak_GB"] = static_cast<double>(hand.planned_peak_bytes()) * 1e-9;
  state.counters["auto_peak_GB"] = static_cast<double>(autos.planned_peak_bytes()) * 1e-9;
  state.SetLabel(fmt::format("GPT-2 124M seq {} batch {} on 4 CPU devices {}: auto {} ({:.2f} s search)", cfg.seq,
                             cfg.batch, mesh.to_string(), autos.auto_shard_result()->solver,
                             autos.auto_shard_result()->formulate_s + autos.auto_shard_result()->solve_s));
  if (worst > 1e-3) state.SkipWithError("the hand and auto plans' losses differ by more than 1e-3");
}
BENCHMARK(BM_AutoShardMeasured)->Arg(10)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
