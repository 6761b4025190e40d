// BM_RunOverhead/<devices>/<async>: the per-step cost of LoadedExecutable::run on a tiny
// program, everything loaded once (ThreadRuntime threads and streams, communicators, events)
// and the inputs already on the devices: what a training step pays besides its kernels.
//   %x f32[8*devices, 16] sharded over `data`; %y = relu(%x); %s = reduce_sum(%y) over both
//   dims (an all-reduce over data when devices > 1). Four instructions per device.
// async=1: StreamMode::Async (a worker thread per stream, events between compute and comm);
// async=0: StreamMode::Eager (everything on the device threads). The run itself hands the
// step to every device's persistent thread and waits for both its streams.
// BM_RunConvenience/<devices>: Executable::run (host scatter + transfers + run + gather),
// for comparison with the device-resident loop.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

namespace {

tessel::Graph tiny_graph(int64_t devices) {
  return tessel::parse_graph(fmt::format(R"(
mesh data={}
%x = input f32[{},16] sharding=[{{data}}, {{}}]
%y = relu(%x)
%s = reduce_sum(%y) dims=[0,1]
output %s
)", devices, 8 * devices), "tiny.tsl");
}

void BM_RunOverhead(benchmark::State& state) {
  const int64_t devices = state.range(0);
  const bool async = state.range(1) != 0;
  tessel::Graph g = tiny_graph(devices);
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  tessel::ThreadRuntimeOptions ro;
  ro.stream_mode = async ? tessel::StreamMode::Async : tessel::StreamMode::Eager;
  tessel::ThreadRuntime rt(devices, ro);
  tessel::LoadedExecutable le = tessel::load(exe, rt);
  auto inputs = tessel::random_inputs(g, 1);
  std::vector<tessel::ShardedArray> in{le.to_device(0, inputs[0])};
  for (auto _ : state) {
    tessel::RunResult r = le.run(in);
    benchmark::DoNotOptimize(r);
  }
  state.counters["instrs"] = static_cast<double>(exe.program().instrs.size());
  state.SetLabel(async ? "async" : "eager");
}
BENCHMARK(BM_RunOverhead)
    ->ArgsProduct({{1, 2, 8}, {1, 0}})
    ->ArgNames({"devices", "async"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_RunConvenience(benchmark::State& state) {
  const int64_t devices = state.range(0);
  tessel::Graph g = tiny_graph(devices);
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  auto inputs = tessel::random_inputs(g, 1);
  exe.run(inputs);  // the first call makes the runtime and loads
  for (auto _ : state) benchmark::DoNotOptimize(exe.run(inputs));
}
BENCHMARK(BM_RunConvenience)->Arg(1)->Arg(2)->Arg(8)->ArgName("devices")->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
