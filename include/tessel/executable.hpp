// tessel/executable.hpp — the public entry point: compile a graph for a mesh, run it.
//
//   tessel::Executable exe = tessel::compile(graph, tessel::Mesh::parse("data=2,model=4"));
//   std::vector<tessel::HostTensor> out = exe.run({x, w1, w2});   // global tensors in/out
//
// compile() = propagate + partition, and is pure. run() is a convenience over compile →
// load → run (runtime/loaded_executable.hpp): on first use (and whenever the runtime or load
// options in RunOptions change) it makes a ThreadRuntime and loads the program on it, then
// keeps both; each call copies the global host tensors to the devices' shards, runs, and
// gathers the outputs back. run_sharded() takes and returns per-device shards instead.
// Steps that should keep values on the devices use load() and ShardedArrays directly.
//
// Thread safety: every member may be called from several threads at once; runs execute
// one at a time, and last_stats() is the statistics of the last run that finished.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/compiler/compiled_program.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct CompileOptions {
  PropagationOptions propagation;
  PartitionOptions partition;
  // An annotation that does not divide its dim is padded as GSPMD does (uneven.hpp); with
  // strict_even_shardings it is a ShardingError naming the value, dim and shard count.
  bool strict_even_shardings = false;
  // Automatic sharding (autoshard/auto_shard.hpp): every value the graph does not annotate is
  // laid out as auto_shard chooses before propagation.
  std::optional<AutoShardOptions> auto_shard;
  // Attention written the long way (einsum -> scale -> causal_mask -> softmax -> einsum) becomes
  // one attention op first (passes/fuse_attention.hpp), when nothing else reads the chain's
  // intermediates. Off: the chain is partitioned op by op.
  bool fuse_attention = true;
};

class Executable {
 public:
  Executable(Graph graph, Mesh mesh, PropagationResult prop, Program program);
  explicit Executable(Compilation c);

  // The runtime-neutral artifact load() takes (compiler/compiled_program.hpp); an Executable
  // converts to it, so load(exe, runtime) and run_on_cuda(exe, ...) take an Executable as well.
  const CompiledProgram& compiled() const { return compiled_; }
  operator const CompiledProgram&() const { return compiled_; }  // NOLINT: the artifact it wraps

  // The graph the program was partitioned from: the user's, or its padded rewrite when an
  // annotation splits a dim unevenly (uneven.hpp); inputs and outputs keep their names.
  const Graph& graph() const { return graph_; }
  // The user's shape of each input (graph().inputs order); an input whose padded shape in
  // graph() is larger is padded with zeros by run(), scatter() and to_device().
  const std::vector<Shape>& user_input_shapes() const { return compiled_.user_input_shapes; }
  // For an Executable made from a padded graph by hand (tessel-explain): the user's shapes of
  // its inputs and outputs (PaddedGraph::input_shapes, output_shapes).
  void set_user_shapes(std::vector<Shape> inputs, std::vector<Shape> outputs) {
    compiled_.user_input_shapes = std::move(inputs);
    compiled_.user_output_shapes = std::move(outputs);
  }
  // The user's shape of each output (graph().outputs order): an output padded in graph() stays
  // padded on the devices; run(), gather() and to_host() return it in this shape.
  const std::vector<Shape>& user_output_shapes() const { return compiled_.user_output_shapes; }
  const Mesh& mesh() const { return compiled_.mesh; }
  const PropagationResult& shardings() const { return prop_; }
  const Program& program() const { return compiled_.program; }

  // Global tensors in (graph.inputs order), global tensors out (graph.outputs order).
  // Throws RuntimeError naming the input, its expected and given type on a mismatch, and
  // naming the device and instruction when one fails (all devices are stopped first).
  std::vector<HostTensor> run(const std::vector<HostTensor>& inputs, const RunOptions& opts = {});
  // shards[input][device] in, [output][device] out.
  std::vector<std::vector<HostTensor>> run_sharded(const std::vector<std::vector<HostTensor>>& shards,
                                                   const RunOptions& opts = {});
  // The shard of every device for graph input `input`.
  std::vector<HostTensor> scatter(std::size_t input, const HostTensor& global) const;
  // The global tensor of graph output `output` (in its user's shape) from every device's shard.
  HostTensor gather(std::size_t output, const std::vector<HostTensor>& shards,
                    bool check_replicas = false) const;

  // Statistics of the last run that finished (a copy: runs may happen concurrently).
  RunStats last_stats() const;

  // Memory per device, known before anything runs: the memory plan of the lowered program
  // (lower_program(program()), what load() runs), i.e. the arena of the intermediates placed
  // by liveness, the inputs and the outputs. Without donation (known at load, which then
  // subtracts the outputs written into donated buffers: plan_donations) peak_bytes() equals
  // the RunStats::planned_peak_bytes a run reports; RunStats::measured_peak_bytes is what the
  // allocators saw. Pure; lowers the program on each call (about as costly as
  // one compile's partition step), so keep the result rather than calling it in a loop.
  MemoryPlan memory_estimate() const;

  struct RunCache;  // the runtime and loaded program of the conveniences (internal)

 private:
  // The loaded program for opts (loading it on first use or when the options changed), with
  // the cache's lock held by the caller.
  LoadedExecutable& loaded_for(const RunOptions& opts);
  // What run() and run_sharded() share, with the cache's lock held throughout: the loaded
  // program for opts runs on the arrays to_device(le, i) makes of inputs 0..num_inputs-1,
  // the stats are kept for last_stats(), and take_output(le, o, array) reads each output.
  // Every input's array, in graph input order.
  using ToDevice = std::function<std::vector<ShardedArray>(LoadedExecutable&)>;
  using TakeOutput = std::function<void(LoadedExecutable&, std::size_t, const ShardedArray&)>;
  void run_locked(const RunOptions& opts, const ToDevice& to_device, const TakeOutput& take_output);
  Graph graph_;
  PropagationResult prop_;
  CompiledProgram compiled_;
  std::shared_ptr<RunCache> cache_;
};

// Throws Error for a graph with no output (checks.hpp); the program's warnings include
// those of program_warnings() (an unused mesh axis, no annotation at all).
Executable compile(const Graph& graph, const Mesh& mesh, const CompileOptions& opts = {});

}  // namespace tessel
