// BM_Serve/mode:<m>/slots:<s>/devices:<d>: a request trace of mixed lengths served by
// continuous batching (mode 1: GptServer, infer/server.hpp) or by static batches (mode 0:
// GptGenerator on groups of `slots` requests, each group generated until its longest is done),
// side by side in one run. The model: d_model 256, 8 heads, 4 layers, vocab 512, 128 positions
// (random weights); the trace: 64 requests, all arriving at once, prompts of 4 to 32 tokens,
// max_new drawn from {8, 16, 32, 64, 96} (seeded: the same trace every run). Meshes: 1 device,
// data=2 (2 devices). Each iteration serves the whole trace; a first pass outside the timing
// warms the kernels. Counters: tokens/s (generated tokens over the trace's wall time, the
// benchmark's rate), latency_p50_s / latency_p99_s (arrival to last token, the last
// iteration's), and for mode 1 decode_steps and admit_runs per trace.
#include <benchmark/benchmark.h>

#include <random>

#include "tessel/infer/server.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/reference.hpp"

namespace {

tessel::GptConfig serve_model(int64_t slots) {
  tessel::GptConfig c;
  c.batch = slots;
  c.seq = 128;
  c.d_model = 256;
  c.heads = 8;
  c.layers = 4;
  c.vocab = 512;
  return c;
}

std::map<std::string, tessel::HostTensor> serve_weights(const tessel::GptConfig& cfg) {
  tessel::GptConfig one = cfg;
  one.batch = 1;
  const tessel::GptGraph m = tessel::build_gpt(one);
  const std::vector<tessel::HostTensor> in = tessel::random_inputs(m.graph, 99);
  std::map<std::string, tessel::HostTensor> w;
  for (std::size_t i = 0; i < m.graph.inputs.size(); ++i) {
    const std::string& n = m.graph.values[static_cast<std::size_t>(m.graph.inputs[i])].name;
    if (n != "tokens" && n != "labels") w.emplace(n, in[i]);
  }
  return w;
}

std::vector<tessel::TraceRequest> mixed_trace(int64_t vocab) {
  std::mt19937_64 rng(2026);
  const int64_t news[] = {8, 16, 32, 64, 96};
  std::vector<tessel::TraceRequest> t;
  for (int i = 0; i < 64; ++i) {
    tessel::TraceRequest r;
    const int64_t len = 4 + static_cast<int64_t>(rng() % 29);
    for (int64_t j = 0; j < len; ++j) r.request.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    r.request.max_new = news[rng() % 5];
    t.push_back(r);
  }
  return t;
}

void BM_Serve(benchmark::State& state) {
  const bool continuous = state.range(0) == 1;
  const int64_t slots = state.range(1), devices = state.range(2);
  const tessel::GptConfig cfg = serve_model(slots);
  const auto w = serve_weights(cfg);
  const auto trace = mixed_trace(cfg.vocab);
  const tessel::Mesh mesh = tessel::gpt_mesh(tessel::Mesh::parse(devices == 1 ? "data=1" : "data=2"), cfg);
  tessel::ThreadRuntime rt(mesh.num_devices());
  const int64_t prompt_len = 32;
  std::unique_ptr<tessel::GptServer> server;
  std::unique_ptr<tessel::GptGenerator> gen;
  if (continuous) {
    tessel::ServerOptions so;
    so.admit_batch = 1;  // the default: one prompt per admit, written in place
    server = std::make_unique<tessel::GptServer>(cfg, mesh, rt, w, prompt_len, so);
  } else {
    gen = std::make_unique<tessel::GptGenerator>(cfg, mesh, rt, w, prompt_len);
  }
  auto serve = [&]() {
    return continuous ? tessel::serve_trace(*server, trace) : tessel::serve_trace_static(*gen, slots, trace);
  };
  serve();  // warm-up
  const tessel::ServerStats before = server ? server->stats() : tessel::ServerStats{};
  tessel::TraceReport rep;
  int64_t tokens = 0, traces = 0;
  for (auto _ : state) {
    rep = serve();
    tokens += rep.tokens;
    ++traces;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["latency_p50_s"] = rep.latency_s(0.5);
  state.counters["latency_p99_s"] = rep.latency_s(0.99);
  if (continuous) {
    // Per trace (the server's counts grow over the warm-up and the iterations).
    const tessel::ServerStats& after = server->stats();
    state.counters["admit_runs"] = static_cast<double>(after.admit_runs - before.admit_runs) / static_cast<double>(traces);
    state.counters["decode_steps"] =
        static_cast<double>(after.decode_steps - before.decode_steps) / static_cast<double>(traces);
  }
}
BENCHMARK(BM_Serve)
    ->ArgNames({"mode", "slots", "devices"})
    ->ArgsProduct({{0, 1}, {8, 16}, {1, 2}})
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
