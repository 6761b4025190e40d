// src/ops/op_helpers.hpp — helpers shared by the registry entries (src/ops/*.cpp): error
// messages, common rules, flops formulas, and the builder plumbing. Internal to the library.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessel/ops/builders.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel::ops_detail {

using Ins = std::vector<const Value*>;
using Shapes = std::vector<Shape>;

inline std::string operands_str(const char* op, const Ins& in) {
  std::vector<std::string> parts;
  for (const Value* v : in) parts.push_back(fmt::format("%{}: {}", v->name, type_str(v->dtype, v->shape)));
  return fmt::format("{}({})", op, join(parts, ", "));
}

[[noreturn]] inline void shape_fail(const char* op, const Ins& in, const std::string& why) {
  throw ShapeError(fmt::format("{}: {}", operands_str(op, in), why));
}

inline bool is_float(DType t) { return t != DType::i32; }

// Axis in [-rank, rank) made >= 0; ShapeError otherwise.
inline int64_t normalize_axis(int64_t axis, std::size_t rank, const char* op) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    throw ShapeError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  return axis < 0 ? axis + r : axis;
}

// Identity factors d0..d(n-1) for shape s, shared by `num_operands` operands and the result.
inline OpRule identity_rule(const Shape& s, int num_operands) {
  OpRule r;
  for (std::size_t d = 0; d < s.size(); ++d) {
    r.factors.push_back({fmt::format("d{}", d), s[d], FactorKind::Pass});
    r.result.push_back({static_cast<int>(d)});
  }
  r.operands.assign(static_cast<std::size_t>(num_operands), r.result);
  return r;
}

// Operand dims right-aligned against the result; broadcast size-1 dims get no factor.
inline std::vector<DimFactors> broadcast_dims(const Shape& operand, const Shape& out) {
  std::vector<DimFactors> dims(operand.size());
  std::size_t off = out.size() - operand.size();
  for (std::size_t d = 0; d < operand.size(); ++d)
    if (operand[d] == out[d + off]) dims[d] = {static_cast<int>(d + off)};
  return dims;
}

inline double elems(const Shape& s) { return static_cast<double>(num_elements(s)); }

inline OpRule rule_unary(const OpAttrs&, const Shapes&, const Shape& out) { return identity_rule(out, 1); }
inline OpRule rule_elementwise(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  for (const Shape& s : in) r.operands.push_back(broadcast_dims(s, out));
  return r;
}
inline OpRule rule_none(const OpAttrs&, const Shapes&, const Shape& out) { return identity_rule(out, 0); }

inline double flops_zero(const OpAttrs&, const Shapes&, const Shape&) { return 0; }
inline double flops_out(const OpAttrs&, const Shapes&, const Shape& out) { return elems(out); }
inline double flops_out4(const OpAttrs&, const Shapes&, const Shape& out) { return 4 * elems(out); }
inline double flops_in(const OpAttrs&, const Shapes& in, const Shape&) { return elems(in[0]); }

// Numpy broadcasting of two operand shapes; ShapeError naming `op` otherwise.
inline Shape broadcast_shapes(const char* op, const Ins& in, const Shape& a, const Shape& b) {
  std::size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      shape_fail(op, in, fmt::format("shapes {} and {} do not broadcast (dim {} of the result: "
                                     "{} vs {})", shape_str(a), shape_str(b), i, da, db));
    out[i] = std::max(da, db);
  }
  return out;
}

// The dtype two operands of a binary op agree on: a rank-0 operand (a scalar constant)
// adopts the other's dtype; otherwise they must match.
inline DType common_dtype(const char* op, const Ins& in) {
  if (in[0]->dtype == in[1]->dtype) return in[0]->dtype;
  if (in[1]->shape.empty()) return in[0]->dtype;
  if (in[0]->shape.empty()) return in[1]->dtype;
  shape_fail(op, in, fmt::format("operands must have the same dtype ({} vs {}); insert a cast",
                                 dtype_name(in[0]->dtype), dtype_name(in[1]->dtype)));
}

// ---- distributed forms (OpDef::distribute) ----
// One local op through the emitter.
inline int local_op(LocalEmitter& e, OpKind k, std::vector<int> ins, OpAttrs a = {}) {
  return e.kernel(k, a, ins);
}
inline int local_reduce(LocalEmitter& e, OpKind k, int x, std::vector<int64_t> dims, bool keepdims) {
  OpAttrs a;
  a.dims = std::move(dims);
  a.keepdims = keepdims;
  return e.kernel(k, a, {x});
}
inline int local_cast(LocalEmitter& e, int x, DType to) {
  if (e.dtype(x) == to) return x;
  OpAttrs a;
  a.dtype = to;
  return e.kernel(OpKind::Cast, a, {x});
}
inline int local_reshape(LocalEmitter& e, int x, Shape to) {
  OpAttrs a;
  a.shape = std::move(to);
  return e.kernel(OpKind::Reshape, a, {x});
}

// ---- builder plumbing ----
Graph& graph_of(const Tensor& t);
Graph& graph_of(const std::vector<Tensor>& ts);
inline Tensor build(OpKind k, const std::vector<Tensor>& ins, OpAttrs a = {}) {
  Graph& g = graph_of(ins);
  std::vector<int> ids;
  for (const Tensor& t : ins) ids.push_back(t.id);
  return g.add_op(k, std::move(ids), std::move(a));
}

// ---- vector-Jacobian products (autodiff.hpp) ----
inline OpDef with_vjp(OpDef d, VjpFn vjp) {
  d.vjp = vjp;
  return d;
}
// A scalar constant of t's dtype in t's graph (broadcasts in binary ops).
inline Tensor scalar_like(const Tensor& t, double v) { return constant(graph_of(t), v, t.dtype()); }
// The keepdims form of `shape` reduced over sorted `dims` (those dims set to 1).
inline Shape keep_shape(Shape shape, const std::vector<int64_t>& dims) {
  for (int64_t d : dims) shape[static_cast<std::size_t>(d)] = 1;
  return shape;
}
// g, of a numpy-broadcast result's shape, summed back to `shape` (an operand's): the dims the
// operand was broadcast along are reduced. `shape` is taken by value: callers pass a Tensor's
// shape(), a reference into the graph that the builders below may move.
inline Tensor unbroadcast(Tensor g, Shape shape) {
  const Shape gs = g.shape();
  if (gs == shape) return g;
  const std::size_t off = gs.size() - shape.size();
  std::vector<int64_t> dims;
  for (std::size_t d = 0; d < gs.size(); ++d)
    if (d < off || (shape[d - off] == 1 && gs[d] != 1)) dims.push_back(static_cast<int64_t>(d));
  if (!dims.empty()) g = reduce_sum(g, dims, /*keepdims=*/true);
  return g.shape() == shape ? g : reshape(g, shape);
}

// A positive tensor for log/sqrt/rsqrt/div denominators in samples.
inline Tensor positive(Tensor x) { return exp(x); }

// One registration function per family file; registry.cpp calls them all.
void register_leaf_ops(std::vector<OpDef>& t);
void register_einsum_ops(std::vector<OpDef>& t);
void register_elementwise_ops(std::vector<OpDef>& t);
void register_reduction_ops(std::vector<OpDef>& t);
void register_layout_ops(std::vector<OpDef>& t);
void register_nn_ops(std::vector<OpDef>& t);
void register_index_ops(std::vector<OpDef>& t);
void register_optim_ops(std::vector<OpDef>& t);
void register_fused_ops(std::vector<OpDef>& t);
void register_attention_ops(std::vector<OpDef>& t);

// An entry with the fields every op has; callers set the rest.
inline OpDef entry(OpKind kind, const char* name, int min_inputs, int max_inputs, InferFn infer,
                   RuleFn rule, FlopsFn flops, SampleFn sample) {
  OpDef d;
  d.kind = kind;
  d.name = name;
  d.min_inputs = min_inputs;
  d.max_inputs = max_inputs;
  d.infer = infer;
  d.rule = rule;
  d.flops = flops;
  d.sample = sample;
  return d;
}

// Sets the entry of def.kind.
inline void put(std::vector<OpDef>& t, OpDef def) {
  t[static_cast<std::size_t>(def.kind)] = std::move(def);
}

}  // namespace tessel::ops_detail
