// BM_DecodeSide/config:<c>/batch:<b>: tessel's side of the decode comparison with JAX
// (bench/jax/run_decode_side_by_side.sh; gpt_jax.py decode): one decode step of
// build_gpt_infer's decode program (infer/generate.hpp) on one device with one kernel thread,
// the weights on the device, the KV cache donated to each step and fed back; each step's
// tokens and positions come from the host and its logits go back to it, as the JAX step's do
// (GptGenerator itself brings back only the next tokens, drawn on the device: the step here
// draws them too, greedily, and brings both back, so it does a little more than JAX's). config 0: the gpt example's model, 1: the GPT-2-small-sized block
// (side_by_side.hpp); every sequence at position T/2 (the program attends over all T
// positions, masked). Counters: tokens/s (B per step), weight_bytes (the weights a step reads,
// f32), read_GBps (this core's streaming read bandwidth, measured once: the best of 5 XOR
// reductions of a 1 GiB buffer), bound_tokens_per_s (B x read_GBps / the bytes a step must read: the
// weights and the cache); the summary divides tokens/s by it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <numeric>
#include <vector>

#include "side_by_side.hpp"
#include "tessel/executable.hpp"
#include "tessel/infer/generate.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"

namespace {

double read_bandwidth() {
  static const double bw = [] {
    // Read as 64-bit words XOR-ed together: an integer reduction the compiler vectorises, so
    // the loop runs at the memory's pace (a float sum is bound by its add latency).
    std::vector<uint64_t> buf(std::size_t{128} << 20);  // 1 GiB: beyond the last-level cache
    std::iota(buf.begin(), buf.end(), uint64_t{1});
    double best = 0;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t x = 0;
      for (uint64_t w : buf) x ^= w;
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      benchmark::DoNotOptimize(x);
      best = std::max(best, static_cast<double>(buf.size() * sizeof(uint64_t)) / t);
    }
    return best;
  }();
  return bw;
}

void BM_DecodeSide(benchmark::State& state) {
  tessel::GptConfig cfg = tessel_bench::side_config(state.range(0));
  cfg.batch = state.range(1);
  const int64_t T = cfg.seq, H = cfg.heads, K = cfg.d_model / cfg.heads;
  tessel::GptInferGraphs g = tessel::build_gpt_infer(cfg, 1);
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1,model=1"), cfg);
  g.decode.mesh = mesh;
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  tessel::ThreadRuntime rt(1, ro);
  const tessel::Executable exe = tessel::compile(g.decode, mesh);
  tessel::LoadOptions lo;
  lo.donate = g.donations;
  tessel::LoadedExecutable prog = tessel::load(exe, rt, lo);
  // The weights: GPT-2 initialisation of build_gpt's inputs, by name.
  tessel::GptConfig one = cfg;
  one.batch = 1;
  const tessel::GptGraph m = tessel::build_gpt(one);
  std::vector<tessel::HostTensor> init = tessel::random_inputs(m.graph, 1234);
  tessel::gpt_init(m.graph, init);
  std::map<std::string, tessel::ShardedArray> in;
  double weight_bytes = 0;
  for (std::size_t i = 0; i < m.graph.inputs.size(); ++i) {
    const std::string& n = m.graph.values[static_cast<std::size_t>(m.graph.inputs[i])].name;
    if (n == "tokens" || n == "labels") continue;
    in.emplace(n, prog.to_device(n, init[i]));
    weight_bytes += static_cast<double>(init[i].bytes());
  }
  const tessel::HostTensor zero(tessel::DType::f32, {cfg.batch, T, H, K});
  for (const std::string& c : g.caches) in.emplace(c, prog.to_device(c, zero));
  tessel::HostTensor positions(tessel::DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) positions.set(t, static_cast<double>(t));
  in.emplace("positions", prog.to_device("positions", positions));
  // The draw on the devices (gpt_infer.hpp): greedy rows, as the JAX step's argmax of the
  // logits; put once (they do not change from step to step here).
  const tessel::HostTensor keys(tessel::DType::i32, {cfg.batch}), temperature(tessel::DType::f32, {cfg.batch}),
      top_k(tessel::DType::i32, {cfg.batch});
  tessel::HostTensor top_p(tessel::DType::f32, {cfg.batch});
  for (int64_t b = 0; b < cfg.batch; ++b) top_p.set(b, 1.0);
  in.emplace("sample_keys", prog.to_device("sample_keys", keys));
  in.emplace("temperature", prog.to_device("temperature", temperature));
  in.emplace("top_k", prog.to_device("top_k", top_k));
  in.emplace("top_p", prog.to_device("top_p", top_p));
  tessel::HostTensor token(tessel::DType::i32, {cfg.batch}), pos(tessel::DType::i32, {cfg.batch});
  for (int64_t b = 0; b < cfg.batch; ++b) {
    token.set(b, static_cast<double>((b * 7919) % cfg.vocab));
    pos.set(b, static_cast<double>(T / 2));
  }
  auto step = [&] {
    in.insert_or_assign("token", prog.to_device("token", token));
    in.insert_or_assign("pos", prog.to_device("pos", pos));
    tessel::RunResult r = prog.run_named(in);
    for (const std::string& c : g.caches) in.insert_or_assign(c, prog.output(r, c + ".next"));
    tessel::HostTensor logits = prog.to_host(prog.output(r, "logits"));
    tessel::HostTensor next = prog.to_host(prog.output(r, "next_token"));
    benchmark::DoNotOptimize(logits);
    benchmark::DoNotOptimize(next);
  };
  step();  // warm-up
  for (auto _ : state) step();
  const double cache_bytes = static_cast<double>(g.caches.size()) * static_cast<double>(zero.bytes());
  const double bw = read_bandwidth();
  const double bound = static_cast<double>(cfg.batch) * bw / (weight_bytes + cache_bytes);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(cfg.batch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_bytes"] = weight_bytes;
  state.counters["read_GBps"] = bw / 1e9;
  state.counters["bound_tokens_per_s"] = bound;
}
// BM_PrefillVsForward/config:<c>/mode:<m>: issue 38's "prefill at the forward's rate": mode 0
// runs the model's forward over a batch of whole sequences (build_gpt's graph, its loss the
// output, as a training step's forward), mode 1 the prefill program of the same model over the
// same tokens as prompts of the whole length (its caches written, the last position's logits and
// its greedy token out). One device, one kernel thread; tokens/s counts B x T tokens a run.
void BM_PrefillVsForward(benchmark::State& state) {
  tessel::GptConfig cfg = tessel_bench::side_config(state.range(0));
  cfg.batch = 4;
  const int64_t B = cfg.batch, T = cfg.seq;
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse("data=1,model=1"), cfg);
  tessel::ThreadRuntimeOptions ro;
  ro.kernel_threads = 1;
  tessel::ThreadRuntime rt(1, ro);
  tessel::GptGraph m = tessel::build_gpt(cfg);
  std::vector<tessel::HostTensor> init = tessel::random_inputs(m.graph, 1234);
  tessel::gpt_init(m.graph, init);
  tessel::Graph g;
  if (state.range(1) == 0) {
    g = m.graph.clone();
  } else {
    g = tessel::build_gpt_infer(cfg, T).prefill;
  }
  g.mesh = mesh;
  const tessel::Executable exe = tessel::compile(g, mesh);
  tessel::LoadedExecutable prog = tessel::load(exe, rt);
  std::map<std::string, tessel::ShardedArray> in;
  for (std::size_t i = 0; i < m.graph.inputs.size(); ++i) {
    const std::string& n = m.graph.values[static_cast<std::size_t>(m.graph.inputs[i])].name;
    if (g.find(n) >= 0 && n != "tokens") in.emplace(n, prog.to_device(n, init[i]));
  }
  tessel::HostTensor tokens(tessel::DType::i32, {B, T}), last(tessel::DType::i32, {B});
  for (int64_t i = 0; i < B * T; ++i) tokens.set(i, static_cast<double>((i * 7919) % cfg.vocab));
  for (int64_t b = 0; b < B; ++b) last.set(b, static_cast<double>(T - 1));
  in.emplace("tokens", prog.to_device("tokens", tokens));
  if (state.range(1) == 1) {
    in.emplace("last", prog.to_device("last", last));
    tessel::HostTensor top_p(tessel::DType::f32, {B});
    for (int64_t b = 0; b < B; ++b) top_p.set(b, 1.0);
    in.emplace("sample_keys", prog.to_device("sample_keys", tessel::HostTensor(tessel::DType::i32, {B})));
    in.emplace("temperature", prog.to_device("temperature", tessel::HostTensor(tessel::DType::f32, {B})));
    in.emplace("top_k", prog.to_device("top_k", tessel::HostTensor(tessel::DType::i32, {B})));
    in.emplace("top_p", prog.to_device("top_p", top_p));
  }
  auto run = [&] {
    tessel::RunResult r = prog.run_named(in);
    benchmark::DoNotOptimize(prog.to_host(r.outputs[0]));
  };
  run();  // warm-up
  for (auto _ : state) run();
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(B * T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PrefillVsForward)
    ->ArgNames({"config", "mode"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_DecodeSide)
    ->ArgNames({"config", "batch"})
    ->ArgsProduct({{0, 1}, {1, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
