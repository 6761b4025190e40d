// BM_TrainStep/<devices>/<zero>: one training step (forward, backward, clipping, AdamW;
// train.hpp) of the gpt example's default model (batch 8, seq 64, d_model 128, 4 heads,
// 2 layers, vocab 512), loaded once, parameters and moments resident and donated, over 1, 2,
// 4 and 8 virtual CPU devices (the meshes of BM_GptForward), at ZeRO stages 0 and 2; beside
// BM_TrainStepReference, the unpartitioned step on one device. Counters: tokens/s and the
// peak bytes per device of the memory plan.
//
// BM_TrainSide/config:<c>/mesh:<m>/attn:<a>: tessel's side of the training-step comparison with JAX
// (bench/jax/run_train_side_by_side.sh; gpt_jax.py train): the same step with one kernel thread
// per device, as BM_GptLoaded runs the forward. config 0: the gpt example, 1: a GPT-2-small-sized
// block (side_by_side.hpp); mesh 0: one device, 1: data=2, 2: model=2 (Megatron annotations),
// 3: data=2 with ZeRO-2; attn 1: the fused attention op (the model's default), 0: the long form
// (einsum -> scale -> causal_mask -> softmax -> einsum, unfused backward) in the same run. Counters: tokens/s, proc_cpu_s (process CPU seconds per step), loss (of
// the last step), instrs (the program's instructions per device), inline (1: the program runs
// on the device threads, LoadedExecutable::runs_inline).
//
// BM_TrainZero2Combine/span:<s>: BM_TrainSide's ZeRO-2 step with combine-collectives' reduce-scatter
// span s (0: each parameter's reduce-scatter and all-gather on its own; 64: the default).
//
// dump_train_step (tessel-bench --dump-train-step DIR [--config 0|1]): one step of that model on
// one device, its inputs and outputs written as .npy files by name (in.<input>, out.<output>)
// and config.json, for gpt_jax.py train-check, which runs JAX's step on the same inputs and
// compares.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tessel/cli.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/train/train_step.hpp"
#include "side_by_side.hpp"

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

// A training step loaded once with its inputs on the devices; step() runs it and feeds each
// `next.<x>` output back to input <x> (donated: updated in place).
struct LoadedStep {
  tessel::GptConfig cfg;
  tessel::GptGraph m;
  tessel::TrainStep train;
  tessel::ThreadRuntime rt;
  tessel::LoadedExecutable prog;
  std::vector<tessel::HostTensor> host;
  std::vector<tessel::ShardedArray> args;
  std::vector<int> feeds;
  std::size_t loss_out = 0;

  LoadedStep(const tessel::GptConfig& c, const tessel::Mesh& mesh, int zero, const tessel::ThreadRuntimeOptions& ro,
             int combine_span = tessel::ProgramPassOptions{}.combine_span_instrs)
      : cfg(c),
        m(tessel::build_gpt(c)),
        train(tessel::add_train_step(m.graph, m.loss, m.weights, mesh, options(zero))),
        rt(mesh.num_devices(), ro),
        prog(tessel::load(tessel::compile(m.graph, mesh), rt, donating(train, combine_span))),
        host(step_inputs(m.graph)) {
    for (std::size_t i = 0; i < host.size(); ++i) args.push_back(prog.to_device(i, host[i]));
    feeds.assign(m.graph.outputs.size(), -1);
    for (std::size_t o = 0; o < feeds.size(); ++o) {
      const std::string& name = m.graph.values[static_cast<std::size_t>(m.graph.outputs[o])].name;
      if (name.rfind("next.", 0) == 0) feeds[o] = static_cast<int>(prog.input_index(name.substr(5)));
    }
    loss_out = prog.output_index("loss");
  }
  static tessel::TrainOptions options(int zero) {
    tessel::TrainOptions to;
    to.zero = zero;
    return to;
  }
  static tessel::LoadOptions donating(const tessel::TrainStep& t, int combine_span) {
    tessel::LoadOptions lo;
    lo.donate = t.donations();
    lo.lowering.combine_span_instrs = combine_span;
    return lo;
  }
  tessel::RunResult step() {
    tessel::RunResult r = prog.run(args);
    for (std::size_t o = 0; o < feeds.size(); ++o)
      if (feeds[o] >= 0) args[static_cast<std::size_t>(feeds[o])] = r.outputs[o];
    return r;
  }
};

void BM_TrainStep(benchmark::State& state) {
  LoadedStep s(tessel::GptConfig{}, train_mesh(state.range(0)), static_cast<int>(state.range(1)), {});
  for (auto _ : state) s.step();
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(s.cfg.batch * s.cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_bytes"] = static_cast<double>(s.prog.program().memory_plan().peak_bytes());
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

void BM_TrainSide(benchmark::State& state) {
  const int64_t mk = state.range(1);
  const char* mesh_spec = mk == 0 ? "data=1,model=1" : mk == 2 ? "data=1,model=2" : "data=2,model=1";
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  tessel::GptConfig cfg = tessel_bench::side_config(state.range(0));
  cfg.fused_attention = state.range(2) != 0;
  LoadedStep s(cfg, tessel::Mesh::parse(mesh_spec), mk == 3 ? 2 : 0, ro);
  tessel::RunResult last;
  const double cpu0 = tessel_bench::process_cpu_s();
  for (auto _ : state) last = s.step();
  state.counters["proc_cpu_s"] =
      benchmark::Counter(tessel_bench::process_cpu_s() - cpu0, benchmark::Counter::kAvgIterations);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(s.cfg.batch * s.cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["inline"] = s.prog.runs_inline() ? 1 : 0;
  state.counters["instrs"] = static_cast<double>(s.prog.program().instrs.size());
  if (!last.outputs.empty()) state.counters["loss"] = s.prog.to_host(last.outputs[s.loss_out]).get(0);
  state.SetLabel(std::string(mesh_spec) + (mk == 3 ? " zero=2" : ""));
}
BENCHMARK(BM_TrainSide)
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3}, {1, 0}})
    ->ArgNames({"config", "mesh", "attn"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// BM_TrainZero2Combine/span:<s>: the gpt example's ZeRO-2 step on data=2 (BM_TrainSide's mesh 3)
// with combine-collectives' reduce-scatter span set to s: 0 combines only the all-reduces (each
// parameter's gradient reduce-scattered and its update all-gathered on its own, as before the
// pass combined them), 64 is the default. Counters: tokens/s, the planned peak, the
// reduce-scatters and all-gathers per device, and whether the program runs inline.
void BM_TrainZero2Combine(benchmark::State& state) {
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  LoadedStep s(tessel_bench::side_config(0), tessel::Mesh::parse("data=2,model=1"), 2, ro,
               static_cast<int>(state.range(0)));
  for (auto _ : state) s.step();
  const tessel::CollectiveSummary c = s.prog.program().summary();
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(s.cfg.batch * s.cfg.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_bytes"] = static_cast<double>(s.prog.program().memory_plan().peak_bytes());
  state.counters["reduce_scatters"] = c.reduce_scatter;
  state.counters["all_gathers"] = c.all_gather;
  state.counters["inline"] = s.prog.runs_inline() ? 1 : 0;
}
BENCHMARK(BM_TrainZero2Combine)->Arg(0)->Arg(64)->ArgName("span")->Unit(benchmark::kMillisecond)->UseRealTime();

// `t` as a NumPy .npy file (format 1.0: magic, header length, a dict padded to 64 bytes).
void write_npy(const std::string& path, const tessel::HostTensor& t) {
  const char* descr = t.dtype() == tessel::DType::f32 ? "<f4" : t.dtype() == tessel::DType::i32 ? "<i4" : nullptr;
  if (!descr) throw tessel::Error(fmt::format("{}: only f32 and i32 tensors are written", path));
  std::string shape;
  for (int64_t d : t.shape()) shape += fmt::format("{},", d);
  if (t.shape().size() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  if (!f) throw tessel::Error(fmt::format("{}: cannot write the file", path));
}

}  // namespace

int dump_train_step(const std::vector<std::string>& args) {
  std::string dir;
  int64_t config = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--dump-train-step" && i + 1 < args.size()) dir = args[++i];
    else if (args[i] == "--config" && i + 1 < args.size()) config = tessel::cli::parse_i64("--config", args[++i], 0, 1);
    else throw tessel::UsageError(fmt::format("unknown option '{}' with --dump-train-step", args[i]));
  }
  if (dir.empty()) throw tessel::UsageError("--dump-train-step needs a folder");
  LoadedStep s(tessel_bench::side_config(config), tessel::Mesh::parse("data=1,model=1"), 0, {});
  const tessel::Graph& g = s.m.graph;
  for (std::size_t i = 0; i < g.inputs.size(); ++i)
    write_npy(fmt::format("{}/in.{}.npy", dir, g.values[static_cast<std::size_t>(g.inputs[i])].name), s.host[i]);
  tessel::RunResult r = s.step();
  for (std::size_t o = 0; o < g.outputs.size(); ++o)
    write_npy(fmt::format("{}/out.{}.npy", dir, g.values[static_cast<std::size_t>(g.outputs[o])].name),
              s.prog.to_host(r.outputs[o]));
  const tessel::GptConfig& c = s.cfg;
  std::ofstream(dir + "/config.json") << fmt::format(
      "{{\"batch\": {}, \"seq\": {}, \"d_model\": {}, \"heads\": {}, \"layers\": {}, \"vocab\": {}}}\n", c.batch,
      c.seq, c.d_model, c.heads, c.layers, c.vocab);
  std::printf("wrote %zu inputs and %zu outputs of one training step to %s\n", g.inputs.size(), g.outputs.size(),
              dir.c_str());
  return 0;
}
