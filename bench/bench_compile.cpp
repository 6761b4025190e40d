// BM_CompileGPT/<layers>: build + propagate + partition a GPT-3-shaped forward graph
// (d_model 12288, 96 heads, seq 2048, vocab 50304) on a data=8,model=8 mesh.
// BM_CompileTrainGPT/<layers>/<zero>: the same model's whole training step (forward,
// backward, clipping, AdamW; train.hpp) built, differentiated, propagated and partitioned.
// BM_LoadTrainGPT/<layers>/<zero>: that training step compiled, then lowered and verified as
// load() does it on the CPU runtime (the default pipeline with the CPU backend's options, then
// verify_program) without allocating the 64 devices' arenas; each pass's time is a counter
// (milliseconds of this thread's processor time per iteration), so is the compile and the verifier. BM_LoadTrainGPTScaling/<layers>
// runs the ZeRO-3 step at 12, 24, 48 and 96 layers and adds each pass's nanoseconds per
// lowered instruction: flat across the rows for a linear pass.
#include <benchmark/benchmark.h>

#include <time.h>

#include <map>
#include <string>
#include <thread>

#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/passes/program_passes.hpp"
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
// partitions it; `ops` is the graph's size.
tessel::Program compile_program(int64_t layers, int zero, std::size_t* ops = nullptr) {
  const tessel::GptConfig cfg = gpt3(layers);
  tessel::Mesh mesh = tessel::Mesh::parse("data=8,model=8");
  tessel::TrainOptions to;
  to.zero = zero;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  if (zero >= 0) tessel::add_train_step(m.graph, m.loss, m.weights, mesh, to);
  tessel::PropagationResult prop = tessel::propagate(m.graph, mesh);
  if (ops) *ops = m.graph.ops.size();
  return tessel::partition(m.graph, mesh, prop);
}

// Compiles every iteration.
void compile_gpt3(benchmark::State& state, int zero) {
  std::size_t instrs = 0, ops = 0;
  for (auto _ : state) {
    tessel::Program prog = compile_program(state.range(0), zero, &ops);
    instrs = prog.instrs.size();
    benchmark::DoNotOptimize(prog);
  }
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["instrs"] = static_cast<double>(instrs);
}

void BM_CompileGPT(benchmark::State& state) { compile_gpt3(state, -1); }
BENCHMARK(BM_CompileGPT)->Arg(1)->Arg(12)->Arg(96)->Unit(benchmark::kMillisecond);

void BM_CompileTrainGPT(benchmark::State& state) { compile_gpt3(state, static_cast<int>(state.range(1))); }
BENCHMARK(BM_CompileTrainGPT)->Args({1, 0})->Args({96, 0})->Args({96, 2})->Args({96, 3})->Unit(benchmark::kMillisecond);

// This thread's processor time, as the pass manager counts it: on a machine shared with other
// work the wall clock counts the other processes' turns too.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
double seconds_since(double t0) { return thread_seconds() - t0; }

// Compile, then lower and verify as load() does on the CPU runtime (lowering_for in
// src/runtime/loaded_executable.cpp: fusion on, the collective-matmul gate's compute shared by
// 64 device threads on this machine's cores). Counters: milliseconds per iteration of each
// stage; with `per_instr`, also nanoseconds per lowered instruction of each pass.
void load_gpt3(benchmark::State& state, int64_t layers, int zero, bool per_instr) {
  tessel::ProgramPassOptions lowering;
  lowering.collective_matmul.cost.compute_sharing =
      tessel::compute_sharing(64, static_cast<int64_t>(std::thread::hardware_concurrency()));
  std::map<std::string, double> seconds;  // stage -> total over the iterations
  std::size_t partitioned = 0, lowered = 0;
  int64_t peak = 0;
  for (auto _ : state) {
    double t0 = thread_seconds();
    tessel::Program prog = compile_program(layers, zero);
    seconds["compile"] += seconds_since(t0);
    partitioned = prog.instrs.size();
    tessel::ProgramPassManager pm = tessel::default_program_pipeline(lowering);
    t0 = thread_seconds();
    tessel::Program low = pm.run(std::move(prog));
    seconds["lower"] += seconds_since(t0);
    for (const auto& [pass, s] : pm.seconds()) seconds[pass] += s;
    t0 = thread_seconds();
    tessel::verify_program(low);
    seconds["verify"] += seconds_since(t0);
    lowered = low.instrs.size();
    peak = low.memory_plan().peak_bytes();
    benchmark::DoNotOptimize(low);
  }
  const double iters = static_cast<double>(state.iterations());
  for (const auto& [stage, s] : seconds) {
    state.counters[stage + "_ms"] = 1e3 * s / iters;
    if (per_instr && stage != "compile")
      state.counters[stage + "_ns/instr"] = 1e9 * s / iters / static_cast<double>(lowered);
  }
  state.counters["load_ms"] = 1e3 * (seconds["lower"] + seconds["verify"]) / iters;
  state.counters["total_ms"] = 1e3 * (seconds["compile"] + seconds["lower"] + seconds["verify"]) / iters;
  state.counters["instrs"] = static_cast<double>(partitioned);
  state.counters["lowered_instrs"] = static_cast<double>(lowered);
  state.counters["peak_bytes"] = static_cast<double>(peak);
}

void BM_LoadTrainGPT(benchmark::State& state) {
  load_gpt3(state, state.range(0), static_cast<int>(state.range(1)), false);
}
BENCHMARK(BM_LoadTrainGPT)
    ->Args({96, 0})->Args({96, 2})->Args({96, 3})
    ->Args({12, 0})->Args({12, 2})->Args({12, 3})
    ->Unit(benchmark::kMillisecond);

void BM_LoadTrainGPTScaling(benchmark::State& state) { load_gpt3(state, state.range(0), 3, true); }
BENCHMARK(BM_LoadTrainGPTScaling)->Arg(12)->Arg(24)->Arg(48)->Arg(96)->Unit(benchmark::kMillisecond);

}  // namespace
