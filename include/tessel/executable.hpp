// tessel/executable.hpp — the public entry point: compile a graph for a mesh, run it.
//
//   tessel::Executable exe = tessel::compile(graph, tessel::Mesh::parse("data=2,model=4"));
//   std::vector<tessel::HostTensor> out = exe.run({x, w1, w2});   // global tensors in/out
//
// compile() = propagate + partition; run() scatters global host tensors to the devices'
// shards, executes the SPMD program on every device of the mesh (CPU backend: one thread
// per device, in-process communicator), and gathers the outputs back. run_sharded() takes
// and returns per-device shards instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/graph.hpp"
#include "tessel/mesh.hpp"
#include "tessel/partition.hpp"
#include "tessel/program.hpp"
#include "tessel/propagate.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct CompileOptions {
  PropagationOptions propagation;
  PartitionOptions partition;
};

struct RunOptions {
  // Fill every buffer with NaN before it is written, and the gathered outputs before the
  // gather: an element nobody writes then fails every comparison (tests turn this on).
  bool poison = false;
  // When gathering outputs, check that all replicas of every block agree bit for bit.
  bool check_replicas = false;
  int kernel_threads = 1;  // threads each device's kernels may use
  // Chrome-trace JSON of every device's kernels and collectives; empty: the TESSEL_TRACE
  // environment variable, when set, names the file.
  std::string trace_path;
  // > 0: a collective waiting longer than this aborts the run with an error naming it.
  double collective_timeout_s = 0;
};

struct RunStats {
  std::vector<int64_t> peak_bytes;  // per device: inputs, live intermediates and scratch
  double seconds = 0;               // wall time of the device phase
};

class Executable {
 public:
  Executable(Graph graph, Mesh mesh, PropagationResult prop, Program program);

  const Graph& graph() const { return graph_; }
  const Mesh& mesh() const { return mesh_; }
  const PropagationResult& shardings() const { return prop_; }
  const Program& program() const { return program_; }

  // Global tensors in (graph.inputs order), global tensors out (graph.outputs order).
  // Throws RuntimeError naming the input, its expected and given type on a mismatch, and
  // naming the device and instruction when one fails (all devices are stopped first).
  std::vector<HostTensor> run(const std::vector<HostTensor>& inputs, const RunOptions& opts = {});
  // shards[input][device] in, [output][device] out.
  std::vector<std::vector<HostTensor>> run_sharded(const std::vector<std::vector<HostTensor>>& shards,
                                                   const RunOptions& opts = {});
  // The shard of every device for graph input `input`.
  std::vector<HostTensor> scatter(std::size_t input, const HostTensor& global) const;
  // The global tensor of graph output `output` from every device's shard.
  HostTensor gather(std::size_t output, const std::vector<HostTensor>& shards,
                    bool check_replicas = false) const;

  const RunStats& last_stats() const { return stats_; }

 private:
  std::vector<std::vector<HostTensor>> run_devices(const std::vector<std::vector<const HostTensor*>>& in,
                                                   const RunOptions& opts);
  Graph graph_;
  Mesh mesh_;
  PropagationResult prop_;
  Program program_;
  std::vector<int> last_use_;
  RunStats stats_;
};

Executable compile(const Graph& graph, const Mesh& mesh, const CompileOptions& opts = {});

}  // namespace tessel
