// tessel/graph.hpp — the program over logical (global) tensors, and its builder.
//
// SSA: every op has one result value; values carry a global shape and a dtype. Ops are
// built by free functions that check shapes at build time and record inputs (ggml style):
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

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessel/common.hpp"
#include "tessel/mesh.hpp"
#include "tessel/sharding.hpp"

namespace tessel {

// Every op kind of the graph. Adding one means: an entry here, one OpDef in src/ops.cpp
// (name, shape function, sharding rule, flops) and one reference kernel in the runtime.
enum class OpKind {
  Input,
  Constant,  // scalar value broadcast to attrs.shape (usually [])
  Einsum,
  // unary elementwise
  Neg, Exp, Log, Tanh, Gelu, Relu, Sqrt, Rsqrt,
  // binary elementwise with numpy broadcasting
  Add, Sub, Mul, Div, Max,
  // reductions over attrs.dims (attrs.keepdims)
  ReduceSum, ReduceMax, ReduceMean,
  Reshape,     // to attrs.shape
  Transpose,   // result dim i = operand dim attrs.dims[i]
  Broadcast,   // numpy broadcast_to(attrs.shape)
  Slice,       // [attrs.starts, attrs.limits) per dim
  Concat,      // along attrs.axis
  Softmax,     // along attrs.axis
  LayerNorm,   // (x, gamma, beta) over the last dim, attrs.eps
  Embedding,   // (table [V, D], ids i32 [...]) -> [..., D]
  CrossEntropy,  // (logits [..., V], labels i32 [...]) -> f32 [...] per-position loss
  CausalMask,  // x [..., Q, K] with x[q, k] = -inf where k > q (global positions)
  ShardingConstraint,  // identity whose result has attrs.sharding (JAX with_sharding_constraint)
  kCount
};

struct OpAttrs {
  std::string equation;          // Einsum
  std::vector<int64_t> dims;     // Reduce*: reduced dims; Transpose: permutation
  Shape shape;                   // Reshape / Broadcast / Constant target shape
  std::vector<int64_t> starts;   // Slice
  std::vector<int64_t> limits;   // Slice
  int64_t axis = -1;             // Concat / Softmax (normalized to >= 0)
  double scalar = 0.0;           // Constant
  double eps = 1e-5;             // LayerNorm
  bool keepdims = false;         // Reduce*
  std::optional<Sharding> sharding;  // ShardingConstraint
  int priority = 0;                  // ShardingConstraint
  DType dtype = DType::f32;          // Constant / Input
};

struct Value {
  std::string name;  // unique within the graph, printed as %name
  Shape shape;
  DType dtype = DType::f32;
  int producer = -1;  // op index
};

struct Op {
  OpKind kind = OpKind::Input;
  std::vector<int> inputs;  // value ids
  int output = -1;          // value id
  OpAttrs attrs;
};

// A user layout for a value. Lower priority number = stronger (0 is strongest), as in Shardy.
struct Annotation {
  Sharding sharding;
  int priority = 0;
};

class Graph;

// A handle to a value of a graph; cheap to copy.
struct Tensor {
  Graph* graph = nullptr;
  int id = -1;
  const Value& value() const;
  const Shape& shape() const { return value().shape; }
  DType dtype() const { return value().dtype; }
  int rank() const { return static_cast<int>(shape().size()); }
  const std::string& name() const { return value().name; }
  // Renames the value (names must be unique); returns *this.
  Tensor named(std::string name) const;
};

class Graph {
 public:
  std::vector<Value> values;
  std::vector<Op> ops;  // topological order by construction
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<int, Annotation> annotations;  // value id -> user layout
  std::optional<Mesh> mesh;               // optional: the text form may declare one

  // Adds an op after checking and inferring its result with the op table (ops.hpp).
  Tensor add_op(OpKind kind, std::vector<int> inputs, OpAttrs attrs, std::string name = {});
  Tensor add_input(std::string name, DType dtype, Shape shape);

  // Attach a user layout to a value (input, weight or any intermediate). Closed dims are
  // never changed by propagation.
  void annotate(Tensor t, Sharding s, int priority = 0);
  void annotate(int value, Sharding s, int priority = 0);
  void mark_output(Tensor t);

  Tensor tensor(int id) { return Tensor{this, id}; }
  // Value id by name, -1 when absent. Rename values through Tensor::named.
  int find(std::string_view name) const;
  // "%h (f32[8,128,2048], result of op #3 einsum)" — used in error messages.
  std::string describe(int value) const;
  // Op names used in messages: "op #3 einsum".
  std::string describe_op(int op) const;
  // Values consumed by each value (op indices), computed on demand.
  std::vector<std::vector<int>> users() const;

 private:
  friend struct Tensor;
  std::string fresh_name();
  int next_name_ = 0;
  mutable std::unordered_map<std::string, int> names_;  // name index for find()
};

// ---- builder: free functions, ggml style ---------------------------------------------
Tensor input(Graph& g, std::string name, DType dtype, Shape shape);
// Scalar (or filled) constant; broadcasts against any shape in binary ops.
Tensor constant(Graph& g, double value, DType dtype = DType::f32, Shape shape = {});
Tensor einsum(std::string_view equation, Tensor a, Tensor b);
Tensor einsum(std::string_view equation, Tensor a);
Tensor matmul(Tensor a, Tensor b);  // [..., m, k] x [k, n]

Tensor neg(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor tanh(Tensor x);
Tensor gelu(Tensor x);  // tanh approximation (GPT-2)
Tensor relu(Tensor x);
Tensor sqrt(Tensor x);
Tensor rsqrt(Tensor x);

Tensor add(Tensor a, Tensor b);
Tensor sub(Tensor a, Tensor b);
Tensor mul(Tensor a, Tensor b);
Tensor div(Tensor a, Tensor b);
Tensor maximum(Tensor a, Tensor b);
Tensor add(Tensor a, double b);
Tensor mul(Tensor a, double b);
Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator*(Tensor a, double b);
Tensor operator+(Tensor a, double b);

Tensor reduce_sum(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reduce_max(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reduce_mean(Tensor x, std::vector<int64_t> dims, bool keepdims = false);
Tensor reshape(Tensor x, Shape shape);
Tensor transpose(Tensor x, std::vector<int64_t> perm);
Tensor broadcast_to(Tensor x, Shape shape);
Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> limits);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor softmax(Tensor x, int64_t axis = -1);
Tensor layer_norm(Tensor x, Tensor gamma, Tensor beta, double eps = 1e-5);
Tensor embedding(Tensor table, Tensor ids);
Tensor cross_entropy(Tensor logits, Tensor labels);
Tensor causal_mask(Tensor x);
// JAX's with_sharding_constraint: identity whose result must have `s`.
Tensor shard(Tensor x, Sharding s, int priority = 0);

}  // namespace tessel
