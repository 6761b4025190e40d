// tessel/ir/graph.hpp — the program over logical (global) tensors, and its builder.
//
// SSA: every op defines its result values (most ops one; a few, like layer_norm_grad,
// several); values carry a global shape and a dtype. Ops are built by free functions that
// check shapes at build time and record inputs (ggml style):
//
//   tessel::Graph g;
//   auto x  = tessel::input(g, "x", tessel::DType::f32, {8, 128, 512});
//   auto w1 = tessel::input(g, "w1", tessel::DType::f32, {512, 2048});
//   auto h  = tessel::gelu(tessel::einsum("bsd,df->bsf", x, w1));
//   g.annotate(w1, tessel::Sharding::of({{}, {"model"}}));
//   g.mark_output(h);
//
// Shape errors throw ShapeError naming the op, its operands and their shapes.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ops/op_attrs.hpp"
#include "tessel/ops/op_list.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

// Every op kind of the graph, generated from the registry's list (op_list.hpp); what each
// op is and does lives in its registry entry (ops.hpp, src/ops/).
enum class OpKind {
#define TESSEL_OP_KIND_ENUM(k) k,
  TESSEL_OP_KINDS(TESSEL_OP_KIND_ENUM)
#undef TESSEL_OP_KIND_ENUM
  kCount
};

// The elementwise families (op_list.hpp) as arrays, and membership.
#define TESSEL_OP_KIND_ITEM(k) OpKind::k,
inline constexpr OpKind kUnaryOps[] = {TESSEL_UNARY_OPS(TESSEL_OP_KIND_ITEM)};
inline constexpr OpKind kBinaryOps[] = {TESSEL_BINARY_OPS(TESSEL_OP_KIND_ITEM)};
inline constexpr OpKind kCompareOps[] = {TESSEL_COMPARE_OPS(TESSEL_OP_KIND_ITEM)};
#undef TESSEL_OP_KIND_ITEM
template <std::size_t N>
constexpr bool op_in(const OpKind (&family)[N], OpKind k) {
  for (OpKind f : family)
    if (f == k) return true;
  return false;
}

struct Value {
  std::string name;  // unique within the graph, printed as %name
  Shape shape;
  DType dtype = DType::f32;
  int producer = -1;  // op index
  int result = 0;     // which result of its producer (0 for single-result ops)
};

struct Op {
  OpKind kind = OpKind::Input;
  std::vector<int> inputs;  // value ids
  int output = -1;          // value id of result 0 (the only result of most ops)
  std::vector<int> extra_outputs;  // results 1.. of an op with several (OpDef::num_results)
  OpAttrs attrs;
  // The region of a training step the op belongs to (an index into Graph::regions), or -1:
  // none recorded. grad() records them when it rematerialises (GradOptions::remat), and the
  // partitioner re-gathers a ZeRO-3/FSDP weight once per region (PartitionOptions). Not part of
  // the text form: a graph read back from text has none.
  int region = -1;
  // The op's strategy chosen by automatic sharding (AutoShardResult::annotated): per factor of
  // its rule (ops/registry.hpp), the mesh axes the factor is split over. The partitioner then
  // computes the op exactly so, where its heuristic would pick among a few candidates; empty:
  // none chosen. A strategy that no longer fits the op (another mesh, padded shapes) is
  // ignored. Not part of the text form.
  std::vector<std::vector<std::string>> factor_axes;
  int num_results() const { return 1 + static_cast<int>(extra_outputs.size()); }
  // Value id of result r (0 <= r < num_results()).
  int result(int r) const { return r == 0 ? output : extra_outputs.at(static_cast<std::size_t>(r - 1)); }
  // Every result's value id, in order.
  std::vector<int> results() const {
    std::vector<int> r{output};
    r.insert(r.end(), extra_outputs.begin(), extra_outputs.end());
    return r;
  }
};

// A user layout for a value. Lower priority number = stronger (0 is strongest), as in Shardy.
struct Annotation {
  Sharding sharding;
  int priority = 0;
  // Set by Graph::expect_gathers: the partitioner's all-gathers of this value are by design (a
  // ZeRO/FSDP layout gathered for use), not reported in Program::warnings. Not part of the
  // text form: a graph read back from text reports them.
  bool gather_expected = false;
};

class Graph;

// Where a graph lives now. A Graph owns one anchor; moving the graph re-points the anchor at
// the new object, destroying it nulls it, so handles follow the graph they were built on
// and never dangle.
struct GraphAnchor {
  Graph* graph = nullptr;
};

// A handle to a value of a graph; cheap to copy. It stays valid when its graph is moved (it
// follows the graph) and fails with a clear Error, never a use-after-free, once the graph is
// destroyed or assigned over.
struct Tensor {
  std::shared_ptr<GraphAnchor> anchor;
  int id = -1;
  // The graph this handle belongs to (nullptr: a default handle, or its graph is gone).
  Graph* graph() const { return anchor ? anchor->graph : nullptr; }
  // References into the graph's value table: adding ops may move it, so copy what you keep
  // across builder calls (`Shape s = t.shape();`).
  const Value& value() const;
  const Shape& shape() const { return value().shape; }
  DType dtype() const { return value().dtype; }
  int rank() const { return static_cast<int>(shape().size()); }
  const std::string& name() const { return value().name; }
  // Renames the value (names must be unique); returns *this.
  Tensor named(std::string name) const;
};

// Thread safety: a Graph is a plain value; building or reading one from several threads at
// once needs the caller's own lock. Copying is explicit (clone()): an implicit copy would leave
// every existing handle on the original, so new ops would silently land there.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // A deep copy with its own identity: handles of this graph do not refer to the clone (get
  // the clone's with clone.tensor(id) or clone.find(name)).
  Graph clone() const;

  std::vector<Value> values;
  std::vector<Op> ops;  // topological order by construction
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<int, Annotation> annotations;  // value id -> user layout
  std::optional<Mesh> mesh;               // optional: the text form may declare one
  // The names of the regions ops belong to (Op::region is an index), e.g. "forward 2",
  // "backward 2", "update": the forward of a rematerialisation segment, its backward (the
  // recomputation included) and the optimizer update. Empty when no pass divided the graph
  // (no rematerialisation, a hand-built or parsed graph).
  std::vector<std::string> regions;

  // Adds an op after checking and inferring its result with the op table (ops.hpp). For an op
  // with several results this is an Error: use add_op_results.
  Tensor add_op(OpKind kind, std::vector<int> inputs, OpAttrs attrs, std::string name = {});
  // Adds an op of any kind and returns a handle per result. `names` is empty (fresh names) or
  // one name per result.
  std::vector<Tensor> add_op_results(OpKind kind, std::vector<int> inputs, OpAttrs attrs,
                                     std::vector<std::string> names = {});
  Tensor add_input(std::string name, DType dtype, Shape shape);

  // Attach a user layout to a value (input, weight or any intermediate). Closed dims are
  // never changed by propagation.
  void annotate(Tensor t, Sharding s, int priority = 0);
  void annotate(int value, Sharding s, int priority = 0);
  // Marks the annotated value `t` as gathered by design (Annotation::gather_expected): the
  // training step does so for ZeRO's sharded parameters and updates. Error when t has no
  // annotation.
  void expect_gathers(Tensor t);
  void mark_output(Tensor t);
  // The index of the region called `name` in `regions`, added at the end when new.
  int region_id(const std::string& name);
  // Puts ops[first_op..] (the ops added since ops.size() was first_op) in region `region`.
  void set_region(std::size_t first_op, int region);

  // The handle of value `id` (Error when out of range).
  Tensor tensor(int id);
  // Value id by name, -1 when absent. Rename values through Tensor::named.
  int find(std::string_view name) const;
  // "%h (f32[8,128,2048], result of op #3 einsum)" — used in error messages; a later result
  // of an op with several reads "result 2 of op #3 layer_norm_grad".
  std::string describe(int value) const;
  // Op names used in messages: "op #3 einsum".
  std::string describe_op(int op) const;
  // Values consumed by each value (op indices), computed on demand.
  std::vector<std::vector<int>> users() const;

 private:
  friend struct Tensor;
  std::string fresh_name();
  void clear_after_move() noexcept;
  int next_name_ = 0;
  mutable std::unordered_map<std::string, int> names_;  // name index for find()
  std::shared_ptr<GraphAnchor> anchor_;
};

}  // namespace tessel

