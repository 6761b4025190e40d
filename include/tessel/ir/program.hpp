// tessel/ir/program.hpp — the partitioned SPMD program: one instruction list, the same for
// every device, parameterised by the device's mesh coordinates (local slices pick the
// device's block, collectives run over the device's axis group).
//
// Local values have *local* shapes; each records the global value it is a layout of and
// its sharding (which may be partial), so the runtime can compute global offsets.
//
// Program IR v2 (docs/program-ir.md): every instruction names the stream it runs on; the
// partitioner emits kernels, synchronous collectives and shard slices on `compute`, and the
// lowering passes (program_passes.hpp) turn that into the closed set the executor runs:
// kernels, block copies (explicit packing and shard slices), views, collectives split into
// start/done on `comm`, and waits (event edges between streams), plus a memory plan placing
// every intermediate value in one arena per device. The text form (program_text.hpp) parses
// and round-trips; the verifier (program_verify.hpp) states the invariants.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

enum class InstrKind {
  Kernel,      // a local op on local shapes (op, attrs)
  Collective,  // a collective over the device's axis group for `axes` (synchronous form)
  ShardSlice,  // free local slice: keep the device's block along `dim` for `axes` (the
               // partitioner's form; the pack pass lowers it to Copy or View)
  // Program IR v2 (lowered) kinds:
  CollectiveStart,  // starts a collective on `stream`; `out` is pending until its done
  CollectiveDone,   // in = {the started value}, out = -1: the value is ready on `stream`
  Copy,             // out = block copies from in[0] (`block`, `copies`), decided at compile time
  View,             // out = the bytes of in[0] from `view_offset` on, reinterpreted (no copy)
  Wait,             // `stream` waits for everything enqueued on `wait_for` so far (an event
                    // recorded there and waited on here); in = {}, out = -1
};

// One coordinate of a block copy's offset: `base + stride * i` where i is this device's index
// in its group for `axes` — or, with a modulus m > 0, that index rotated around a ring of m:
// i = (index + shift) mod m (the collective-matmul pass's ring steps: at step s a device holds
// the chunk of its neighbour s places away). Axes empty: the constant `base`.
// Text: 16, 64*{model}, 8+64*{data,model}, 64*({model}+3 mod 4).
struct IndexExpr {
  int64_t base = 0;
  int64_t stride = 0;
  std::vector<std::string> axes;
  int64_t shift = 0;    // with modulus: added to the index before the mod (any sign)
  int64_t modulus = 0;  // 0: the plain index; else the index is taken mod this
  int64_t eval(const Mesh& mesh, int64_t position) const;
  int64_t max_value(const Mesh& mesh) const;  // over every device
  bool operator==(const IndexExpr& o) const {
    return base == o.base && stride == o.stride && axes == o.axes && shift == o.shift && modulus == o.modulus;
  }
};

// A block of shape Instr::block copied from `src` (element offsets in in[input]) to `dst`
// (element offsets in out). A copy with several inputs gathers blocks of each into one
// result (text: `1:[0,0]->[16,0]` takes the block from the second input).
struct CopyBlock {
  std::vector<IndexExpr> src, dst;
  int input = 0;  // which of the copy's inputs the block comes from
};

// Where values live on a device (the memory-plan pass): every value an instruction defines,
// other than outputs and views, gets a byte offset in one arena per device, allocated once
// at load. Inputs (the caller's arrays) and outputs (handed to the caller) are buffers of
// their own; a view lives in its source's storage.
struct MemoryPlan {
  bool planned = false;
  int64_t arena_bytes = 0;
  std::vector<int64_t> offset;  // per value: byte offset in the arena, or -1 (not in it)
  int64_t input_bytes = 0;      // per device, the program's inputs
  int64_t output_bytes = 0;     // per device, outputs that are not inputs
  // Host pool per device (activation offload): values with LocalValue::host have their
  // `offset` in it, not in the arena. Host memory (pinned on CUDA): not in peak_bytes().
  int64_t host_bytes = 0;
  // Per device, the outputs written into a donated input's buffer (LoadOptions::donate):
  // counted in output_bytes, but they take no memory of their own. Known when donation is,
  // at load (plan_donations in passes/program_passes.hpp); 0 before.
  int64_t donated_bytes = 0;
  // Peak bytes per device: arena + inputs + outputs - donated, known before anything runs.
  int64_t peak_bytes() const { return arena_bytes + input_bytes + output_bytes - donated_bytes; }
};

struct LocalValue {
  std::string name;
  Shape shape;  // local
  DType dtype = DType::f32;
  Shape global_shape;
  Sharding sharding;     // layout of the global value (may be partial)
  int graph_value = -1;  // value of the graph it holds (or a reshard of)
  // Lives in host memory (an offloaded activation, text `memory=host`): only copies read or
  // write it, and the memory plan places it in the host pool (MemoryPlan::host_bytes).
  bool host = false;
  int64_t bytes() const { return num_bytes(shape, dtype); }
};

struct Instr {
  InstrKind kind = InstrKind::Kernel;
  std::vector<int> in;  // local value ids
  int out = -1;
  std::vector<int> extra_out;  // Kernel of an op with several results: results 1.. (text:
                               // `%dx, %dg, %db = layer_norm_grad(...)`)
  // Every value this instruction defines (out, then extra_out; none for -1).
  std::vector<int> defs() const {
    std::vector<int> d;
    d.reserve(extra_out.size() + 1);
    if (out >= 0) d.push_back(out);
    for (int v : extra_out) d.push_back(v);  // (not insert(): GCC 12 -Warray-bounds false positive)
    return d;
  }
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
  // Program IR v2:
  std::string stream = "compute";  // the stream it is enqueued on
  Shape block;                     // Copy: the block shape
  std::vector<CopyBlock> copies;   // Copy: one entry per block
  int64_t view_offset = 0;         // View: byte offset into in[0]
  std::string wait_for;            // Wait: the stream waited for
};

// Text name of a collective start ("all_gather_start") and back.
std::string collective_start_name(CollectiveKind k);

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
  MemoryPlan memory;  // empty until the memory-plan pass ran

  const MemoryPlan& memory_plan() const { return memory; }

  // The collective instructions of this program (synchronous or started). Lowering may
  // combine all-reduces (combine-collectives): a lowered program can count fewer than the
  // partitioned one it came from, moving the same bytes.
  CollectiveSummary summary() const;
  double total_flops() const;
  double comm_seconds() const;  // the collectives at the figures they were priced with at compile time
  // Every collective priced again by `cost` (e.g. a machine's measured links) on this mesh.
  double comm_seconds(const CostModel& cost) const;
  double compute_seconds(const CostModel& cost) const;
  // What running many small instructions pays beyond their roofline (a launch, a hand-off to a
  // stream): cost.dispatch_seconds() per kernel, copy and collective. Meaningful on a lowered
  // program (fused kernels, combined collectives: what load() runs).
  double dispatch_seconds(const CostModel& cost) const;
  // Index of the last instruction reading each value (-1: never read); outputs count as
  // read at the end. The runtime frees a buffer after its last use.
  std::vector<int> last_use() const;
  // Text form of the per-device program; device >= 0 adds that device's coordinates and
  // groups as comments.
  std::string to_string(int64_t device = -1) const;
};

}  // namespace tessel
