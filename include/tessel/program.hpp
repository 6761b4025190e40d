// tessel/program.hpp — the partitioned SPMD program: one instruction list, the same for
// every device, parameterised by the device's mesh coordinates (local slices pick the
// device's block, collectives run over the device's axis group).
//
// Local values have *local* shapes; each records the global value it is a layout of and
// its sharding (which may be partial), so the runtime can compute global offsets.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessel/common.hpp"
#include "tessel/cost.hpp"
#include "tessel/graph.hpp"
#include "tessel/mesh.hpp"
#include "tessel/sharding.hpp"

namespace tessel {

enum class InstrKind {
  Kernel,      // a local op on local shapes (op, attrs)
  Collective,  // a collective over the device's axis group for `axes`
  ShardSlice,  // free local slice: keep the device's block along `dim` for `axes`
};

struct LocalValue {
  std::string name;
  Shape shape;  // local
  DType dtype = DType::f32;
  Shape global_shape;
  Sharding sharding;     // layout of the global value (may be partial)
  int graph_value = -1;  // value of the graph it holds (or a reshard of)
  int64_t bytes() const { return num_elements(shape) * static_cast<int64_t>(dtype_size(dtype)); }
};

struct Instr {
  InstrKind kind = InstrKind::Kernel;
  std::vector<int> in;  // local value ids
  int out = -1;
  // Kernel
  OpKind op = OpKind::Input;
  OpAttrs attrs;
  // Collective / ShardSlice
  CollectiveKind collective = CollectiveKind::AllReduce;
  ReduceOp reduce = ReduceOp::Sum;  // all-reduce / reduce-scatter: how contributions combine
  std::vector<std::string> axes;  // the axis group, major→minor
  int dim = -1;   // all-gather / reduce-scatter / slice dim; all-to-all: split dim
  int dim2 = -1;  // all-to-all: concat dim
  std::vector<std::pair<int64_t, int64_t>> pairs;  // collective-permute: (source, target) positions
  int64_t bytes = 0;  // nccl-tests buffer size (see cost.hpp), per device
  double seconds = 0;  // cost-model estimate
  double flops = 0;    // kernels: local flops
  int graph_op = -1;   // graph op this implements or reshards for
  std::string note;    // why it is here (reshard from -> to, for which op)
};

struct CollectiveSummary {
  int all_gather = 0, all_reduce = 0, reduce_scatter = 0, all_to_all = 0, collective_permute = 0;
  int64_t bytes = 0;
  // "collectives: all-gather=A all-reduce=B reduce-scatter=C all-to-all=D collective-permute=E bytes=F"
  std::string line() const;
};

struct Program {
  Mesh mesh;
  std::vector<LocalValue> values;
  std::vector<Instr> instrs;
  std::vector<int> inputs;   // local value per graph input (graph.inputs order)
  std::vector<int> outputs;  // local value per graph output (graph.outputs order)
  // Communication the user may not expect, said out loud: every all-gather (tessel never
  // rematerializes a value silently) and every value replicated because an op needs a
  // factor whole. Printed by tessel-explain.
  std::vector<std::string> warnings;

  CollectiveSummary summary() const;
  double total_flops() const;
  double comm_seconds() const;
  double compute_seconds(const CostModel& cost) const;
  // Index of the last instruction reading each value (-1: never read); outputs count as
  // read at the end. The runtime frees a buffer after its last use.
  std::vector<int> last_use() const;
  // Text form of the per-device program; device >= 0 adds that device's coordinates and
  // groups as comments.
  std::string to_string(int64_t device = -1) const;
};

}  // namespace tessel
