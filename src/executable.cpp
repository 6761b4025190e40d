// compile() and Executable: the conveniences over compile -> load -> run (a ThreadRuntime
// and a LoadedExecutable kept per options), host scatter and gather with type checks.
#include "tessel/executable.hpp"

#include <fmt/format.h>

#include <cmath>
#include <mutex>

#include "tessel/compiler/checks.hpp"
#include "tessel/passes/fuse_attention.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/compiler/uneven.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace tessel {

Executable compile(const Graph& graph, const Mesh& mesh, const CompileOptions& opts) {
  check_compilable(graph, mesh);
  std::optional<Graph> fused;
  if (opts.fuse_attention) {
    FusedAttentionGraph f = fuse_attention(graph);
    if (f.fused > 0) fused = std::move(f.graph);
  }
  const Graph& user = fused ? *fused : graph;
  std::optional<Graph> chosen;
  if (opts.auto_shard) {
    const AutoShardResult r = auto_shard(user, mesh, *opts.auto_shard);
    check_fits(r, *opts.auto_shard, mesh, "compile (CompileOptions::auto_shard)");  // never dropped silently
    chosen = r.annotated(user);
  }
  CompileProgramOptions co;
  co.propagation = opts.propagation;
  co.partition = opts.partition;
  co.strict_even_shardings = opts.strict_even_shardings;
  return Executable(compile_graph(chosen ? *chosen : user, mesh, co, &graph));
}

struct Executable::RunCache {
  std::mutex mu;  // held for a whole convenience run: runs are serialised
  std::unique_ptr<ThreadRuntime> runtime;
  std::unique_ptr<LoadedExecutable> loaded;
  // The options the runtime and loaded program were made with.
  StreamMode mode = StreamMode::Async;
  int kernel_threads = 0;
  int64_t inline_max_comm_bytes = 0;
  double timeout = 0;
  ProgramPassOptions lowering;  // what `loaded` was lowered with
  mutable std::mutex stats_mu;
  RunStats stats;
};

Executable::Executable(Graph graph, Mesh mesh, PropagationResult prop, Program program)
    : graph_(std::move(graph)), prop_(std::move(prop)),
      compiled_(compiled_program_of(graph_, mesh, std::move(program))), cache_(std::make_shared<RunCache>()) {}

Executable::Executable(Compilation c)
    : graph_(std::move(c.graph)), prop_(std::move(c.shardings)), compiled_(std::move(c.compiled)),
      cache_(std::make_shared<RunCache>()) {}

RunStats Executable::last_stats() const {
  std::lock_guard<std::mutex> lk(cache_->stats_mu);
  return cache_->stats;
}

MemoryPlan Executable::memory_estimate() const { return lower_program(compiled_.program).memory_plan(); }

LoadedExecutable& Executable::loaded_for(const RunOptions& opts) {
  RunCache& c = *cache_;
  const double t = opts.collective_timeout_s;
  if (std::isnan(t) || t < 0)
    throw RuntimeError(fmt::format("run: collective_timeout_s must be >= 0 seconds (0 or inf: no timeout), got {}", t));
  if (opts.kernel_threads < 1)
    throw RuntimeError(fmt::format("run: kernel_threads must be >= 1, got {}", opts.kernel_threads));
  if (c.runtime && (c.mode != opts.stream_mode || c.kernel_threads != opts.kernel_threads ||
                    c.inline_max_comm_bytes != opts.inline_max_comm_bytes)) {
    c.loaded.reset();
    c.runtime.reset();
  }
  if (!c.runtime) {
    ThreadRuntimeOptions ro;
    ro.stream_mode = opts.stream_mode;
    ro.kernel_threads = opts.kernel_threads;
    ro.inline_max_comm_bytes = opts.inline_max_comm_bytes;
    c.runtime = std::make_unique<ThreadRuntime>(compiled_.mesh.num_devices(), ro);
    c.mode = opts.stream_mode;
    c.kernel_threads = opts.kernel_threads;
    c.inline_max_comm_bytes = opts.inline_max_comm_bytes;
  }
  const ProgramPassOptions& lw = opts.lowering;
  if (!c.loaded || !(c.timeout == t) || c.lowering.fuse_elementwise != lw.fuse_elementwise ||
      c.lowering.fuse_einsum_epilogue != lw.fuse_einsum_epilogue ||
      c.lowering.combine_threshold_bytes != lw.combine_threshold_bytes) {
    c.loaded.reset();
    LoadOptions lo;
    lo.collective_timeout_s = t;
    lo.lowering = lw;
    c.loaded = std::make_unique<LoadedExecutable>(load(*this, *c.runtime, lo));
    c.timeout = t;
    c.lowering = lw;
  }
  return *c.loaded;
}

std::vector<HostTensor> Executable::scatter(std::size_t input, const HostTensor& global) const {
  if (input >= compiled_.program.inputs.size())
    throw RuntimeError(fmt::format("scatter: input #{} does not exist ({} inputs)", input, compiled_.program.inputs.size()));
  const LocalValue& lv = compiled_.program.values[compiled_.program.inputs[input]];
  const bool user_shape = input < compiled_.user_input_shapes.size() && global.shape() == compiled_.user_input_shapes[input];
  if (global.dtype() != lv.dtype || (global.shape() != lv.global_shape && !user_shape))
    throw RuntimeError(fmt::format("scatter: input #{} %{} expects {} but got {}", input, lv.name,
                                   type_str(lv.dtype, input < compiled_.user_input_shapes.size() ? compiled_.user_input_shapes[input]
                                                                                        : lv.global_shape),
                                   type_str(global.dtype(), global.shape())));
  return scatter_host(compiled_.mesh, lv.sharding, lv.shape, pad_host(global, lv.global_shape));
}

HostTensor Executable::gather(std::size_t output, const std::vector<HostTensor>& shards, bool check) const {
  if (output >= compiled_.program.outputs.size())
    throw RuntimeError(fmt::format("gather: output #{} does not exist ({} outputs)", output, compiled_.program.outputs.size()));
  const LocalValue& lv = compiled_.program.values[compiled_.program.outputs[output]];
  if (static_cast<int64_t>(shards.size()) != compiled_.mesh.num_devices())
    throw RuntimeError(fmt::format("gather: {} shards for {} devices", shards.size(), compiled_.mesh.num_devices()));
  for (int64_t d = 0; d < compiled_.mesh.num_devices(); ++d)
    if (shards[d].dtype() != lv.dtype || shards[d].shape() != lv.shape)
      throw RuntimeError(fmt::format("gather: output #{} %{} with sharding {} expects local shards {} "
                                     "but device {} gave {}", output, lv.name, lv.sharding.to_string(),
                                     type_str(lv.dtype, lv.shape), d, type_str(shards[d].dtype(), shards[d].shape())));
  HostTensor global = gather_host(compiled_.mesh, lv.sharding, lv.dtype, lv.global_shape, shards, check, lv.name);
  return output < compiled_.user_output_shapes.size() ? trim_host(global, compiled_.user_output_shapes[output]) : global;
}

std::vector<HostTensor> Executable::run(const std::vector<HostTensor>& inputs, const RunOptions& opts) {
  if (inputs.size() != graph_.inputs.size())
    throw RuntimeError(fmt::format("run: the graph has {} inputs but {} tensors were given",
                                   graph_.inputs.size(), inputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = graph_.values[graph_.inputs[i]];
    // The user's shape (an input padded for an uneven sharding is padded by to_device).
    const Shape& want = i < compiled_.user_input_shapes.size() ? compiled_.user_input_shapes[i] : v.shape;
    if (inputs[i].dtype() != v.dtype || inputs[i].shape() != want)
      throw RuntimeError(fmt::format("run: input #{} %{} expects {} but got {}", i, v.name,
                                     type_str(v.dtype, want), type_str(inputs[i].dtype(), inputs[i].shape())));
  }
  std::vector<HostTensor> result;
  run_locked(
      opts, [&](LoadedExecutable& le) { return le.to_device(inputs); },
      [&](LoadedExecutable& le, std::size_t o, const ShardedArray& a) {
        if (opts.poison || opts.check_replicas) result.push_back(gather(o, le.shards_to_host(a), opts.check_replicas));
        else result.push_back(le.to_host(a));
      });
  return result;
}

std::vector<std::vector<HostTensor>> Executable::run_sharded(const std::vector<std::vector<HostTensor>>& shards,
                                                             const RunOptions& opts) {
  if (shards.size() != graph_.inputs.size())
    throw RuntimeError(fmt::format("run_sharded: the graph has {} inputs but {} were given",
                                   graph_.inputs.size(), shards.size()));
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const LocalValue& lv = compiled_.program.values[compiled_.program.inputs[i]];
    if (static_cast<int64_t>(shards[i].size()) != compiled_.mesh.num_devices())
      throw RuntimeError(fmt::format("run_sharded: input #{} %{} has {} shards but the mesh {} has {} devices",
                                     i, lv.name, shards[i].size(), compiled_.mesh.to_string(), compiled_.mesh.num_devices()));
    for (const auto& t : shards[i])
      if (t.dtype() != lv.dtype || t.shape() != lv.shape)
        throw RuntimeError(fmt::format("run_sharded: input #{} %{} with sharding {} expects local shards {} "
                                       "but got {}", i, lv.name, lv.sharding.to_string(),
                                       type_str(lv.dtype, lv.shape), type_str(t.dtype(), t.shape())));
  }
  std::vector<std::vector<HostTensor>> outs;
  run_locked(
      opts,
      [&](LoadedExecutable& le) {
        std::vector<ShardedArray> arrays;
        for (std::size_t i = 0; i < shards.size(); ++i) arrays.push_back(le.shards_to_device(i, shards[i]));
        return arrays;
      },
      [&](LoadedExecutable& le, std::size_t, const ShardedArray& a) { outs.push_back(le.shards_to_host(a)); });
  return outs;
}

void Executable::run_locked(const RunOptions& opts, const ToDevice& to_device, const TakeOutput& take_output) {
  std::lock_guard<std::mutex> lk(cache_->mu);
  LoadedExecutable& le = loaded_for(opts);
  const std::vector<ShardedArray> arrays = to_device(le);
  RunResult r = le.run(arrays, opts);
  {
    std::lock_guard<std::mutex> s(cache_->stats_mu);
    cache_->stats = r.stats;
  }
  for (std::size_t o = 0; o < r.outputs.size(); ++o) take_output(le, o, r.outputs[o]);
}

}  // namespace tessel
