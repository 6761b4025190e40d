// Graph: SSA values and ops over global shapes, and the ggml-style builder functions.
#include "tessel/graph.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/ops.hpp"

namespace tessel {

const Value& Tensor::value() const {
  if (!graph || id < 0 || id >= static_cast<int>(graph->values.size()))
    throw Error("tessel::Tensor: handle does not refer to a value of a graph");
  return graph->values[static_cast<std::size_t>(id)];
}

Tensor Tensor::named(std::string name) const {
  value();
  if (graph->find(name) >= 0 && graph->find(name) != id)
    throw Error(fmt::format("value name '%{}' is already used: names must be unique", name));
  graph->find(name);  // sync the index
  graph->names_.erase(graph->values[static_cast<std::size_t>(id)].name);
  graph->names_[name] = id;
  graph->values[static_cast<std::size_t>(id)].name = std::move(name);
  return *this;
}

std::string Graph::fresh_name() {
  while (true) {
    std::string n = fmt::format("v{}", next_name_++);
    if (find(n) < 0) return n;
  }
}

int Graph::find(std::string_view name) const {
  // The name index is kept by add_input/add_op/Tensor::named; it is rebuilt when values
  // were added another way.
  if (names_.size() != values.size()) {
    names_.clear();
    for (std::size_t i = 0; i < values.size(); ++i) names_[values[i].name] = static_cast<int>(i);
  }
  auto it = names_.find(std::string(name));
  return it == names_.end() ? -1 : it->second;
}

std::string Graph::describe(int v) const {
  const Value& val = values.at(static_cast<std::size_t>(v));
  if (val.producer < 0 || ops[val.producer].kind == OpKind::Input)
    return fmt::format("%{} ({}, input)", val.name, type_str(val.dtype, val.shape));
  return fmt::format("%{} ({}, result of {})", val.name, type_str(val.dtype, val.shape),
                     describe_op(val.producer));
}

std::string Graph::describe_op(int op) const {
  return fmt::format("op #{} {}", op, op_name(ops.at(static_cast<std::size_t>(op)).kind));
}

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> u(values.size());
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (int v : ops[i].inputs) u[v].push_back(static_cast<int>(i));
  return u;
}

Tensor Graph::add_input(std::string name, DType dtype, Shape shape) {
  for (int64_t d : shape)
    if (d < 1)
      throw ShapeError(fmt::format("input %{}: shape {} has a dim < 1", name, shape_str(shape)));
  if (name.empty()) name = fresh_name();
  if (find(name) >= 0)
    throw Error(fmt::format("input name '%{}' is already used: names must be unique", name));
  Op op;
  op.kind = OpKind::Input;
  op.attrs.dtype = dtype;
  op.output = static_cast<int>(values.size());
  find(name);  // sync the index before adding
  names_[name] = static_cast<int>(values.size());
  values.push_back(Value{std::move(name), std::move(shape), dtype, static_cast<int>(ops.size())});
  ops.push_back(std::move(op));
  inputs.push_back(static_cast<int>(values.size()) - 1);
  return Tensor{this, static_cast<int>(values.size()) - 1};
}

namespace {
int64_t normalize_axis(int64_t axis, std::size_t rank, const char* op) {
  int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    throw ShapeError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  return axis < 0 ? axis + r : axis;
}
}  // namespace

Tensor Graph::add_op(OpKind kind, std::vector<int> in, OpAttrs attrs, std::string name) {
  const OpDef& def = op_def(kind);
  if (kind == OpKind::Input) throw Error("use Graph::add_input to create inputs");
  int n = static_cast<int>(in.size());
  if (n < def.min_inputs || (def.max_inputs >= 0 && n > def.max_inputs))
    throw ShapeError(fmt::format("{}: takes {}{} operands, got {}", def.name, def.min_inputs,
                                 def.max_inputs == def.min_inputs ? std::string()
                                 : def.max_inputs < 0 ? std::string(" or more")
                                 : fmt::format(" to {}", def.max_inputs), n));
  std::vector<const Value*> ins;
  for (int v : in) {
    if (v < 0 || v >= static_cast<int>(values.size()))
      throw Error(fmt::format("{}: operand id {} is not a value of this graph", def.name, v));
    ins.push_back(&values[static_cast<std::size_t>(v)]);
  }
  // Normalize negative axes so the attrs are canonical.
  std::size_t rank0 = ins.empty() ? 0 : ins[0]->shape.size();
  if (kind == OpKind::Softmax || kind == OpKind::Concat)
    attrs.axis = normalize_axis(attrs.axis, rank0, def.name);
  if (kind == OpKind::ReduceSum || kind == OpKind::ReduceMax || kind == OpKind::ReduceMean ||
      kind == OpKind::Transpose) {
    for (auto& d : attrs.dims) d = normalize_axis(d, rank0, def.name);
    if (kind != OpKind::Transpose) std::sort(attrs.dims.begin(), attrs.dims.end());
  }
  Shape out;
  DType dt = DType::f32;
  def.infer(attrs, ins, out, dt);
  // Guard against element counts that overflow (e.g. an outer product of huge dims).
  {
    int64_t n = 1;
    for (int64_t d : out) {
      if (d < 0 || (d > 0 && n > (int64_t{1} << 62) / d))
        throw ShapeError(fmt::format("{}: result shape {} is too large", def.name, shape_str(out)));
      n *= d;
    }
  }
  if (name.empty()) name = fresh_name();
  if (find(name) >= 0)
    throw Error(fmt::format("{}: value name '%{}' is already used: names must be unique",
                            def.name, name));
  Op op;
  op.kind = kind;
  op.inputs = std::move(in);
  op.attrs = std::move(attrs);
  op.output = static_cast<int>(values.size());
  names_[name] = static_cast<int>(values.size());
  values.push_back(Value{std::move(name), out, dt, static_cast<int>(ops.size())});
  ops.push_back(std::move(op));
  return Tensor{this, static_cast<int>(values.size()) - 1};
}

void Graph::annotate(Tensor t, Sharding s, int priority) { annotate(t.id, std::move(s), priority); }

void Graph::annotate(int v, Sharding s, int priority) {
  if (v < 0 || v >= static_cast<int>(values.size()))
    throw Error(fmt::format("annotate: value id {} is not in the graph", v));
  if (s.rank() != static_cast<int>(values[v].shape.size()))
    throw ShardingError(fmt::format("annotate {}: sharding {} has {} dims for a value of rank {}",
                                    describe(v), s.to_string(), s.rank(), values[v].shape.size()));
  if (!s.partial.empty())
    throw ShardingError(fmt::format("annotate {}: sharding {} is partial; annotations give the "
                                    "layout of materialized values, drop partial{{...}}",
                                    describe(v), s.to_string()));
  if (priority < 0)
    throw ShardingError(fmt::format("annotate {}: priority {} must be >= 0", describe(v), priority));
  annotations[v] = Annotation{std::move(s), priority};
}

void Graph::mark_output(Tensor t) {
  t.value();
  if (t.graph != this) throw Error("mark_output: tensor belongs to another graph");
  outputs.push_back(t.id);
}

// ---- builder ----
namespace {
Graph& graph_of(Tensor t) {
  t.value();
  return *t.graph;
}
Graph& graph_of(Tensor a, Tensor b) {
  a.value();
  b.value();
  if (a.graph != b.graph) throw Error("operands belong to different graphs");
  return *a.graph;
}
Tensor unary(OpKind k, Tensor x) { return graph_of(x).add_op(k, {x.id}, {}); }
Tensor binary(OpKind k, Tensor a, Tensor b) { return graph_of(a, b).add_op(k, {a.id, b.id}, {}); }
Tensor reduce(OpKind k, Tensor x, std::vector<int64_t> dims, bool keepdims) {
  OpAttrs a;
  a.dims = std::move(dims);
  a.keepdims = keepdims;
  return graph_of(x).add_op(k, {x.id}, std::move(a));
}
}  // namespace

Tensor input(Graph& g, std::string name, DType dtype, Shape shape) {
  return g.add_input(std::move(name), dtype, std::move(shape));
}
Tensor constant(Graph& g, double value, DType dtype, Shape shape) {
  OpAttrs a;
  a.scalar = value;
  a.dtype = dtype;
  a.shape = std::move(shape);
  return g.add_op(OpKind::Constant, {}, std::move(a));
}
Tensor einsum(std::string_view eq, Tensor a, Tensor b) {
  OpAttrs at;
  at.equation = std::string(eq);
  return graph_of(a, b).add_op(OpKind::Einsum, {a.id, b.id}, std::move(at));
}
Tensor einsum(std::string_view eq, Tensor a) {
  OpAttrs at;
  at.equation = std::string(eq);
  return graph_of(a).add_op(OpKind::Einsum, {a.id}, std::move(at));
}
Tensor matmul(Tensor a, Tensor b) {
  if (a.rank() < 2 || a.rank() > 8 || b.rank() != 2)
    throw ShapeError(fmt::format("matmul(%{}: {}, %{}: {}): expects [..., m, k] x [k, n]",
                                 a.name(), shape_str(a.shape()), b.name(), shape_str(b.shape())));
  std::string lhs = std::string("abcdefgh").substr(0, static_cast<std::size_t>(a.rank() - 1));
  return einsum(lhs + "k,kn->" + lhs + "n", a, b);
}
Tensor neg(Tensor x) { return unary(OpKind::Neg, x); }
Tensor exp(Tensor x) { return unary(OpKind::Exp, x); }
Tensor log(Tensor x) { return unary(OpKind::Log, x); }
Tensor tanh(Tensor x) { return unary(OpKind::Tanh, x); }
Tensor gelu(Tensor x) { return unary(OpKind::Gelu, x); }
Tensor relu(Tensor x) { return unary(OpKind::Relu, x); }
Tensor sqrt(Tensor x) { return unary(OpKind::Sqrt, x); }
Tensor rsqrt(Tensor x) { return unary(OpKind::Rsqrt, x); }
Tensor add(Tensor a, Tensor b) { return binary(OpKind::Add, a, b); }
Tensor sub(Tensor a, Tensor b) { return binary(OpKind::Sub, a, b); }
Tensor mul(Tensor a, Tensor b) { return binary(OpKind::Mul, a, b); }
Tensor div(Tensor a, Tensor b) { return binary(OpKind::Div, a, b); }
Tensor maximum(Tensor a, Tensor b) { return binary(OpKind::Max, a, b); }
Tensor add(Tensor a, double b) { return add(a, constant(graph_of(a), b, a.dtype())); }
Tensor mul(Tensor a, double b) { return mul(a, constant(graph_of(a), b, a.dtype())); }
Tensor operator+(Tensor a, Tensor b) { return add(a, b); }
Tensor operator-(Tensor a, Tensor b) { return sub(a, b); }
Tensor operator*(Tensor a, Tensor b) { return mul(a, b); }
Tensor operator/(Tensor a, Tensor b) { return div(a, b); }
Tensor operator*(Tensor a, double b) { return mul(a, b); }
Tensor operator+(Tensor a, double b) { return add(a, b); }
Tensor reduce_sum(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceSum, x, std::move(d), k); }
Tensor reduce_max(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceMax, x, std::move(d), k); }
Tensor reduce_mean(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceMean, x, std::move(d), k); }
Tensor reshape(Tensor x, Shape shape) {
  OpAttrs a;
  a.shape = std::move(shape);
  return graph_of(x).add_op(OpKind::Reshape, {x.id}, std::move(a));
}
Tensor transpose(Tensor x, std::vector<int64_t> perm) {
  OpAttrs a;
  a.dims = std::move(perm);
  return graph_of(x).add_op(OpKind::Transpose, {x.id}, std::move(a));
}
Tensor broadcast_to(Tensor x, Shape shape) {
  OpAttrs a;
  a.shape = std::move(shape);
  return graph_of(x).add_op(OpKind::Broadcast, {x.id}, std::move(a));
}
Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> limits) {
  OpAttrs a;
  a.starts = std::move(starts);
  a.limits = std::move(limits);
  return graph_of(x).add_op(OpKind::Slice, {x.id}, std::move(a));
}
Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) throw ShapeError("concat: needs at least one operand");
  std::vector<int> ids;
  for (const Tensor& t : xs) {
    if (graph_of(t, xs[0]).values.empty()) break;
    ids.push_back(t.id);
  }
  OpAttrs a;
  a.axis = axis;
  return graph_of(xs[0]).add_op(OpKind::Concat, std::move(ids), std::move(a));
}
Tensor softmax(Tensor x, int64_t axis) {
  OpAttrs a;
  a.axis = axis;
  return graph_of(x).add_op(OpKind::Softmax, {x.id}, std::move(a));
}
Tensor layer_norm(Tensor x, Tensor gamma, Tensor beta, double eps) {
  OpAttrs a;
  a.eps = eps;
  graph_of(x, gamma);
  graph_of(x, beta);
  return graph_of(x).add_op(OpKind::LayerNorm, {x.id, gamma.id, beta.id}, std::move(a));
}
Tensor embedding(Tensor table, Tensor ids) { return binary(OpKind::Embedding, table, ids); }
Tensor cross_entropy(Tensor logits, Tensor labels) { return binary(OpKind::CrossEntropy, logits, labels); }
Tensor causal_mask(Tensor x) { return unary(OpKind::CausalMask, x); }
Tensor shard(Tensor x, Sharding s, int priority) {
  OpAttrs a;
  a.sharding = std::move(s);
  a.priority = priority;
  return graph_of(x).add_op(OpKind::ShardingConstraint, {x.id}, std::move(a));
}

}  // namespace tessel
