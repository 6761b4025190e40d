// The op table: name, shape function, sharding rule and flops for every OpKind.
// Adding an op = one OpKind + one entry here + one CPU kernel (src/runtime/cpu_kernels.cpp).
#include "tessel/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <numeric>
#include <set>

namespace tessel {
namespace {

using Ins = std::vector<const Value*>;
using Shapes = std::vector<Shape>;

std::string operands_str(const char* op, const Ins& in) {
  std::vector<std::string> parts;
  for (const Value* v : in) parts.push_back(fmt::format("%{}: {}", v->name, type_str(v->dtype, v->shape)));
  return fmt::format("{}({})", op, join(parts, ", "));
}

[[noreturn]] void shape_fail(const char* op, const Ins& in, const std::string& why) {
  throw ShapeError(fmt::format("{}: {}", operands_str(op, in), why));
}

bool is_float(DType t) { return t != DType::i32; }

// ---- rule helpers ----
OpRule identity_rule(const Shape& s, int num_operands) {
  OpRule r;
  for (std::size_t d = 0; d < s.size(); ++d) {
    r.factors.push_back({fmt::format("d{}", d), s[d], FactorKind::Pass});
    r.result.push_back({static_cast<int>(d)});
  }
  r.operands.assign(static_cast<std::size_t>(num_operands), r.result);
  return r;
}

// Operand dims right-aligned against the result; broadcast size-1 dims get no factor.
std::vector<DimFactors> broadcast_dims(const Shape& operand, const Shape& out) {
  std::vector<DimFactors> dims(operand.size());
  std::size_t off = out.size() - operand.size();
  for (std::size_t d = 0; d < operand.size(); ++d) {
    if (operand[d] == out[d + off]) dims[d] = {static_cast<int>(d + off)};
  }
  return dims;
}

double elems(const Shape& s) { return static_cast<double>(num_elements(s)); }

// ---- shape functions ----
void infer_none(const OpAttrs&, const Ins& in, Shape&, DType&) {
  shape_fail("input", in, "inputs are created with Graph::add_input, not add_op");
}

void infer_constant(const OpAttrs& a, const Ins&, Shape& out, DType& dt) {
  for (int64_t d : a.shape)
    if (d < 1) throw ShapeError(fmt::format("constant: shape {} has a dim < 1", shape_str(a.shape)));
  out = a.shape;
  dt = a.dtype;
}

void infer_einsum(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  EinsumSpec spec;
  try {
    spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  } catch (const ShapeError& e) {
    shape_fail("einsum", in, e.what());
  }
  std::map<char, int64_t> size;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::string& sub = spec.operands[i];
    if (sub.size() != in[i]->shape.size())
      shape_fail("einsum", in, fmt::format("equation '{}' gives operand {} the {} letters '{}' "
                                           "but %{} has rank {}", a.equation, i, sub.size(),
                                           sub, in[i]->name, in[i]->shape.size()));
    for (std::size_t d = 0; d < sub.size(); ++d) {
      auto it = size.find(sub[d]);
      if (it == size.end())
        size[sub[d]] = in[i]->shape[d];
      else if (it->second != in[i]->shape[d])
        shape_fail("einsum", in, fmt::format("letter '{}' of equation '{}' has size {} in one "
                                             "operand and {} in %{} (dim {})", sub[d],
                                             a.equation, it->second, in[i]->shape[d],
                                             in[i]->name, d));
    }
    if (!is_float(in[i]->dtype))
      shape_fail("einsum", in, "einsum needs floating-point operands");
  }
  if (in.size() == 2 && in[0]->dtype != in[1]->dtype)
    shape_fail("einsum", in, "operands must have the same dtype");
  out.clear();
  for (char c : spec.result) out.push_back(size[c]);
  dt = in[0]->dtype;
}

void infer_unary(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  out = in[0]->shape;
  dt = in[0]->dtype;
}

void infer_unary_float(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (!is_float(in[0]->dtype))
    shape_fail("unary op", in, "needs a floating-point operand; got i32");
  infer_unary(a, in, out, dt);
}

void infer_binary(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  const Shape& a = in[0]->shape;
  const Shape& b = in[1]->shape;
  std::size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      shape_fail("binary op", in, fmt::format("shapes {} and {} do not broadcast (dim {} of the "
                                              "result: {} vs {})", shape_str(a), shape_str(b),
                                              i, da, db));
    out[i] = std::max(da, db);
  }
  if (in[0]->dtype != in[1]->dtype) {
    // A rank-0 operand (a scalar constant) adopts the other operand's dtype.
    if (in[1]->shape.empty()) dt = in[0]->dtype;
    else if (in[0]->shape.empty()) dt = in[1]->dtype;
    else shape_fail("binary op", in, "operands must have the same dtype");
  } else {
    dt = in[0]->dtype;
  }
}

void check_dims(const char* op, const Ins& in, const std::vector<int64_t>& dims, std::size_t rank) {
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    if (d < 0 || d >= static_cast<int64_t>(rank))
      shape_fail(op, in, fmt::format("dim {} is out of range for rank {}", d, rank));
    if (!seen.insert(d).second) shape_fail(op, in, fmt::format("dim {} listed twice", d));
  }
}

void infer_reduce(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  check_dims("reduce", in, a.dims, in[0]->shape.size());
  out.clear();
  for (std::size_t d = 0; d < in[0]->shape.size(); ++d) {
    bool red = std::find(a.dims.begin(), a.dims.end(), static_cast<int64_t>(d)) != a.dims.end();
    if (!red) out.push_back(in[0]->shape[d]);
    else if (a.keepdims) out.push_back(1);
  }
  dt = in[0]->dtype;
}

void infer_reshape(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  for (int64_t d : a.shape)
    if (d < 1) shape_fail("reshape", in, fmt::format("target shape {} has a dim < 1", shape_str(a.shape)));
  if (num_elements(a.shape) != num_elements(in[0]->shape))
    shape_fail("reshape", in, fmt::format("cannot reshape {} ({} elements) to {} ({} elements)",
                                          shape_str(in[0]->shape), num_elements(in[0]->shape),
                                          shape_str(a.shape), num_elements(a.shape)));
  out = a.shape;
  dt = in[0]->dtype;
}

void infer_transpose(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (a.dims.size() != in[0]->shape.size())
    shape_fail("transpose", in, fmt::format("permutation [{}] has {} entries for rank {}",
                                            fmt::join(a.dims, ","), a.dims.size(),
                                            in[0]->shape.size()));
  check_dims("transpose", in, a.dims, in[0]->shape.size());
  out.clear();
  for (int64_t p : a.dims) out.push_back(in[0]->shape[static_cast<std::size_t>(p)]);
  dt = in[0]->dtype;
}

void infer_broadcast(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& s = in[0]->shape;
  if (s.size() > a.shape.size())
    shape_fail("broadcast", in, fmt::format("cannot broadcast rank {} to shape {}", s.size(), shape_str(a.shape)));
  for (int64_t d : a.shape)
    if (d < 1) shape_fail("broadcast", in, fmt::format("target shape {} has a dim < 1", shape_str(a.shape)));
  std::size_t off = a.shape.size() - s.size();
  for (std::size_t d = 0; d < s.size(); ++d)
    if (s[d] != 1 && s[d] != a.shape[d + off])
      shape_fail("broadcast", in, fmt::format("dim {} of size {} cannot broadcast to {} in {}", d,
                                              s[d], a.shape[d + off], shape_str(a.shape)));
  out = a.shape;
  dt = in[0]->dtype;
}

void infer_slice(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& s = in[0]->shape;
  if (a.starts.size() != s.size() || a.limits.size() != s.size())
    shape_fail("slice", in, fmt::format("starts/limits need {} entries (one per dim)", s.size()));
  out.clear();
  for (std::size_t d = 0; d < s.size(); ++d) {
    if (a.starts[d] < 0 || a.limits[d] > s[d] || a.starts[d] >= a.limits[d])
      shape_fail("slice", in, fmt::format("dim {}: [{}, {}) is not a non-empty range inside [0, {})",
                                          d, a.starts[d], a.limits[d], s[d]));
    out.push_back(a.limits[d] - a.starts[d]);
  }
  dt = in[0]->dtype;
}

void infer_concat(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& s0 = in[0]->shape;
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(s0.size()))
    shape_fail("concat", in, fmt::format("axis {} is out of range for rank {}", a.axis, s0.size()));
  out = s0;
  out[a.axis] = 0;
  for (const Value* v : in) {
    if (v->shape.size() != s0.size() || v->dtype != in[0]->dtype)
      shape_fail("concat", in, "operands must have the same rank and dtype");
    for (std::size_t d = 0; d < s0.size(); ++d)
      if (static_cast<int64_t>(d) != a.axis && v->shape[d] != s0[d])
        shape_fail("concat", in, fmt::format("dim {} differs ({} vs {}); only axis {} may differ",
                                             d, v->shape[d], s0[d], a.axis));
    out[a.axis] += v->shape[a.axis];
  }
  dt = in[0]->dtype;
}

void infer_softmax(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(in[0]->shape.size()))
    shape_fail("softmax", in, fmt::format("axis {} is out of range", a.axis));
  infer_unary_float(a, in, out, dt);
}

void infer_layer_norm(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  const Shape& x = in[0]->shape;
  if (x.empty()) shape_fail("layer_norm", in, "operand must have rank >= 1");
  for (int i = 1; i <= 2; ++i)
    if (in[i]->shape != Shape{x.back()})
      shape_fail("layer_norm", in, fmt::format("gamma and beta must have shape [{}] (the last dim "
                                               "of x)", x.back()));
  if (!is_float(in[0]->dtype)) shape_fail("layer_norm", in, "needs floating-point x");
  out = x;
  dt = in[0]->dtype;
}

void infer_embedding(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->shape.size() != 2)
    shape_fail("embedding", in, "the table must be [rows, features]");
  if (in[1]->dtype != DType::i32) shape_fail("embedding", in, "ids must be i32");
  out = in[1]->shape;
  out.push_back(in[0]->shape[1]);
  dt = in[0]->dtype;
}

void infer_cross_entropy(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  const Shape& l = in[0]->shape;
  if (l.empty()) shape_fail("cross_entropy", in, "logits must have rank >= 1 ([..., classes])");
  if (in[1]->dtype != DType::i32) shape_fail("cross_entropy", in, "labels must be i32");
  Shape want(l.begin(), l.end() - 1);
  if (in[1]->shape != want)
    shape_fail("cross_entropy", in, fmt::format("labels must have shape {} (logits without the "
                                                "class dim)", shape_str(want)));
  if (!is_float(in[0]->dtype)) shape_fail("cross_entropy", in, "logits must be floating-point");
  out = want;
  dt = DType::f32;
}

void infer_causal_mask(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->shape.size() < 2) shape_fail("causal_mask", in, "operand must be [..., queries, keys]");
  infer_unary_float(a, in, out, dt);
}

void infer_constraint(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (!a.sharding) shape_fail("sharding_constraint", in, "needs a sharding");
  if (a.sharding->rank() != static_cast<int>(in[0]->shape.size()))
    shape_fail("sharding_constraint", in, fmt::format("sharding {} has {} dims for rank {}",
                                                      a.sharding->to_string(), a.sharding->rank(),
                                                      in[0]->shape.size()));
  infer_unary(a, in, out, dt);
}

// ---- rules ----
OpRule rule_none(const OpAttrs&, const Shapes&, const Shape& out) { return identity_rule(out, 0); }

OpRule rule_einsum(const OpAttrs& a, const Shapes& in, const Shape&) {
  EinsumSpec spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  OpRule r;
  std::map<char, int> factor;
  for (std::size_t i = 0; i < in.size(); ++i) {
    std::vector<DimFactors> dims;
    for (std::size_t d = 0; d < spec.operands[i].size(); ++d) {
      char c = spec.operands[i][d];
      auto it = factor.find(c);
      if (it == factor.end()) {
        bool in_result = spec.result.find(c) != std::string::npos;
        factor[c] = static_cast<int>(r.factors.size());
        r.factors.push_back({std::string(1, c), in[i][d],
                             in_result ? FactorKind::Pass : FactorKind::Reduction});
      }
      dims.push_back({factor[c]});
    }
    r.operands.push_back(std::move(dims));
  }
  for (char c : spec.result) r.result.push_back({factor[c]});
  return r;
}

OpRule rule_elementwise(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  for (const Shape& s : in) r.operands.push_back(broadcast_dims(s, out));
  return r;
}

OpRule rule_reduce_impl(const OpAttrs& a, const Shapes& in, FactorKind reduced_kind) {
  OpRule r;
  const Shape& s = in[0];
  std::vector<DimFactors> od;
  for (std::size_t d = 0; d < s.size(); ++d) {
    bool red = std::find(a.dims.begin(), a.dims.end(), static_cast<int64_t>(d)) != a.dims.end();
    r.factors.push_back({fmt::format("d{}", d), s[d], red ? reduced_kind : FactorKind::Pass});
    od.push_back({static_cast<int>(d)});
    if (!red) r.result.push_back({static_cast<int>(d)});
    else if (a.keepdims) r.result.push_back({});
  }
  r.operands.push_back(std::move(od));
  return r;
}
OpRule rule_reduce_sum(const OpAttrs& a, const Shapes& in, const Shape&) {
  return rule_reduce_impl(a, in, FactorKind::Reduction);
}
OpRule rule_reduce_max(const OpAttrs& a, const Shapes& in, const Shape&) {
  return rule_reduce_impl(a, in, FactorKind::Replicated);
}

// Reshape: walk both shapes, pairing dims into groups of equal products, and split each
// group into factors that both sides can express major→minor. A group that cannot be
// expressed (e.g. [6,4] -> [4,6]) becomes one replicated factor.
OpRule rule_reshape(const OpAttrs&, const Shapes& in, const Shape& out) {
  const Shape& s = in[0];
  OpRule r;
  std::vector<DimFactors> id(s.size()), od(out.size());
  std::size_t i = 0, o = 0;
  auto add_factor = [&](int64_t size, FactorKind k) {
    r.factors.push_back({fmt::format("f{}", r.factors.size()), size, k});
    return static_cast<int>(r.factors.size()) - 1;
  };
  while (i < s.size() || o < out.size()) {
    // Size-1 dims carry no data: no factor.
    if (i < s.size() && s[i] == 1) { ++i; continue; }
    if (o < out.size() && out[o] == 1) { ++o; continue; }
    if (i >= s.size() || o >= out.size()) break;
    // Find the minimal group [i, i2) x [o, o2) with equal products.
    std::size_t i2 = i + 1, o2 = o + 1;
    int64_t pi = s[i], po = out[o];
    while (pi != po) {
      if (pi < po) pi *= s[i2++];
      else po *= out[o2++];
    }
    // Try a clean decomposition.
    std::vector<std::pair<int64_t, std::pair<std::size_t, std::size_t>>> fs;  // size, (in dim, out dim)
    bool ok = true;
    {
      std::size_t a = i, b = o;
      int64_t ra = s[a], rb = out[b];
      while (a < i2 && b < o2) {
        if (ra == 1) { ++a; if (a < i2) ra = s[a]; continue; }
        if (rb == 1) { ++b; if (b < o2) rb = out[b]; continue; }
        int64_t f;
        if (ra % rb == 0) f = rb;
        else if (rb % ra == 0) f = ra;
        else { ok = false; break; }
        fs.push_back({f, {a, b}});
        ra /= f;
        rb /= f;
      }
    }
    if (ok) {
      for (auto& f : fs) {
        int k = add_factor(f.first, FactorKind::Pass);
        id[f.second.first].push_back(k);
        od[f.second.second].push_back(k);
      }
    } else {
      int k = add_factor(pi, FactorKind::Replicated);
      for (std::size_t a = i; a < i2; ++a) id[a].push_back(k);
      for (std::size_t b = o; b < o2; ++b) od[b].push_back(k);
    }
    i = i2;
    o = o2;
  }
  r.operands.push_back(std::move(id));
  r.result = std::move(od);
  return r;
}

OpRule rule_transpose(const OpAttrs& a, const Shapes& in, const Shape&) {
  OpRule r = identity_rule(in[0], 1);
  r.result.clear();
  for (int64_t p : a.dims) r.result.push_back({static_cast<int>(p)});
  return r;
}

OpRule rule_broadcast(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  r.operands.push_back(broadcast_dims(in[0], out));
  return r;
}

OpRule rule_slice(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  for (std::size_t d = 0; d < out.size(); ++d)
    if (a.starts[d] != 0 || a.limits[d] != in[0][d]) r.factors[d].kind = FactorKind::Replicated;
  return r;
}

OpRule rule_concat(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, static_cast<int>(in.size()));
  r.factors[a.axis].kind = FactorKind::Replicated;
  return r;
}

OpRule rule_softmax(const OpAttrs& a, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  r.factors[a.axis].kind = FactorKind::Replicated;
  return r;
}

OpRule rule_layer_norm(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  int last = static_cast<int>(out.size()) - 1;
  r.factors[last].kind = FactorKind::Replicated;
  r.operands.push_back({{last}});
  r.operands.push_back({{last}});
  return r;
}

OpRule rule_embedding(const OpAttrs&, const Shapes& in, const Shape& out) {
  // Factors: ids dims..., D (features), V (rows; a reduction: a row-sharded table yields a
  // partial sum where each device contributes the rows it owns — Megatron's vocab-parallel
  // embedding).
  OpRule r = identity_rule(out, 0);
  int D = static_cast<int>(out.size()) - 1;
  r.factors.push_back({"vocab", in[0][0], FactorKind::Reduction});
  int V = static_cast<int>(r.factors.size()) - 1;
  r.operands.push_back({{V}, {D}});
  std::vector<DimFactors> ids;
  for (int d = 0; d < D; ++d) ids.push_back({d});
  r.operands.push_back(std::move(ids));
  return r;
}

OpRule rule_cross_entropy(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  r.factors.push_back({"classes", in[0].back(), FactorKind::Replicated});
  int C = static_cast<int>(r.factors.size()) - 1;
  std::vector<DimFactors> logits, labels;
  for (std::size_t d = 0; d < out.size(); ++d) {
    logits.push_back({static_cast<int>(d)});
    labels.push_back({static_cast<int>(d)});
  }
  logits.push_back({C});
  r.operands.push_back(std::move(logits));
  r.operands.push_back(std::move(labels));
  return r;
}

OpRule rule_unary(const OpAttrs&, const Shapes&, const Shape& out) { return identity_rule(out, 1); }

// ---- flops ----
double flops_zero(const OpAttrs&, const Shapes&, const Shape&) { return 0; }
double flops_out(const OpAttrs&, const Shapes&, const Shape& out) { return elems(out); }
double flops_out4(const OpAttrs&, const Shapes&, const Shape& out) { return 4 * elems(out); }
double flops_in(const OpAttrs&, const Shapes& in, const Shape&) { return elems(in[0]); }
double flops_in5(const OpAttrs&, const Shapes& in, const Shape&) { return 5 * elems(in[0]); }
double flops_in8(const OpAttrs&, const Shapes& in, const Shape&) { return 8 * elems(in[0]); }
double flops_einsum(const OpAttrs& a, const Shapes& in, const Shape&) {
  EinsumSpec spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  std::map<char, int64_t> size;
  for (std::size_t i = 0; i < in.size(); ++i)
    for (std::size_t d = 0; d < spec.operands[i].size(); ++d) size[spec.operands[i][d]] = in[i][d];
  double n = 1;
  for (auto& kv : size) n *= static_cast<double>(kv.second);
  return in.size() == 2 ? 2 * n : n;
}

using PF = PartialFlow;
const std::array<OpDef, static_cast<std::size_t>(OpKind::kCount)>& table() {
  static const std::array<OpDef, static_cast<std::size_t>(OpKind::kCount)> t = {{
      {OpKind::Input, "input", 0, 0, infer_none, rule_none, flops_zero, PF::None},
      {OpKind::Constant, "constant", 0, 0, infer_constant, rule_none, flops_zero, PF::None},
      {OpKind::Einsum, "einsum", 1, 2, infer_einsum, rule_einsum, flops_einsum, PF::Multilinear},
      {OpKind::Neg, "neg", 1, 1, infer_unary, rule_unary, flops_out, PF::Multilinear},
      {OpKind::Exp, "exp", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Log, "log", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Tanh, "tanh", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Gelu, "gelu", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Relu, "relu", 1, 1, infer_unary, rule_unary, flops_out, PF::None},
      {OpKind::Sqrt, "sqrt", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Rsqrt, "rsqrt", 1, 1, infer_unary_float, rule_unary, flops_out4, PF::None},
      {OpKind::Add, "add", 2, 2, infer_binary, rule_elementwise, flops_out, PF::Additive},
      {OpKind::Sub, "sub", 2, 2, infer_binary, rule_elementwise, flops_out, PF::Additive},
      {OpKind::Mul, "mul", 2, 2, infer_binary, rule_elementwise, flops_out, PF::Multilinear},
      {OpKind::Div, "div", 2, 2, infer_binary, rule_elementwise, flops_out, PF::None},
      {OpKind::Max, "max", 2, 2, infer_binary, rule_elementwise, flops_out, PF::None},
      {OpKind::ReduceSum, "reduce_sum", 1, 1, infer_reduce, rule_reduce_sum, flops_in, PF::Multilinear},
      {OpKind::ReduceMax, "reduce_max", 1, 1, infer_reduce, rule_reduce_max, flops_in, PF::None},
      {OpKind::ReduceMean, "reduce_mean", 1, 1, infer_reduce, rule_reduce_sum, flops_in, PF::Multilinear},
      {OpKind::Reshape, "reshape", 1, 1, infer_reshape, rule_reshape, flops_zero, PF::Multilinear},
      {OpKind::Transpose, "transpose", 1, 1, infer_transpose, rule_transpose, flops_zero, PF::Multilinear},
      {OpKind::Broadcast, "broadcast", 1, 1, infer_broadcast, rule_broadcast, flops_zero, PF::Multilinear},
      {OpKind::Slice, "slice", 1, 1, infer_slice, rule_slice, flops_zero, PF::Multilinear},
      {OpKind::Concat, "concat", 1, -1, infer_concat, rule_concat, flops_zero, PF::Additive},
      {OpKind::Softmax, "softmax", 1, 1, infer_softmax, rule_softmax, flops_in5, PF::None},
      {OpKind::LayerNorm, "layer_norm", 3, 3, infer_layer_norm, rule_layer_norm, flops_in8, PF::None},
      {OpKind::Embedding, "embedding", 2, 2, infer_embedding, rule_embedding, flops_zero, PF::None},
      {OpKind::CrossEntropy, "cross_entropy", 2, 2, infer_cross_entropy, rule_cross_entropy, flops_in5, PF::None},
      {OpKind::CausalMask, "causal_mask", 1, 1, infer_causal_mask, rule_unary, flops_out, PF::None},
      {OpKind::ShardingConstraint, "sharding_constraint", 1, 1, infer_constraint, rule_unary, flops_zero, PF::None},
  }};
  return t;
}

}  // namespace

const OpDef& op_def(OpKind kind) {
  const auto& t = table();
  const OpDef& d = t.at(static_cast<std::size_t>(kind));
  return d;
}

const char* op_name(OpKind kind) { return op_def(kind).name; }

std::optional<OpKind> op_kind_from_name(std::string_view name) {
  for (const OpDef& d : table())
    if (name == d.name) return d.kind;
  return std::nullopt;
}

bool is_unary_elementwise(OpKind k) { return k >= OpKind::Neg && k <= OpKind::Rsqrt; }
bool is_binary_elementwise(OpKind k) { return k >= OpKind::Add && k <= OpKind::Max; }

OpRule op_rule(const Graph& g, const Op& op) {
  Shapes in;
  for (int v : op.inputs) in.push_back(g.values[v].shape);
  return op_def(op.kind).rule(op.attrs, in, g.values[op.output].shape);
}

EinsumSpec parse_einsum(std::string_view eq, int num_operands) {
  EinsumSpec spec;
  auto arrow = eq.find("->");
  if (arrow == std::string_view::npos)
    throw ShapeError(fmt::format("einsum equation '{}' needs '->' and a result, e.g. "
                                 "'bsd,df->bsf'", eq));
  std::string lhs(eq.substr(0, arrow)), rhs(eq.substr(arrow + 2));
  auto clean = [&](std::string s) {
    std::string o;
    for (char c : s) {
      if (std::isspace(static_cast<unsigned char>(c))) continue;
      if (!std::isalpha(static_cast<unsigned char>(c)))
        throw ShapeError(fmt::format("einsum equation '{}': '{}' is not a letter", eq, c));
      o += c;
    }
    std::set<char> seen;
    for (char c : o)
      if (!seen.insert(c).second)
        throw ShapeError(fmt::format("einsum equation '{}': letter '{}' repeats within one "
                                     "term (diagonals are not supported)", eq, c));
    return o;
  };
  std::size_t b = 0;
  while (true) {
    auto comma = lhs.find(',', b);
    spec.operands.push_back(clean(lhs.substr(b, comma == std::string::npos ? std::string::npos : comma - b)));
    if (comma == std::string::npos) break;
    b = comma + 1;
  }
  spec.result = clean(rhs);
  if (static_cast<int>(spec.operands.size()) != num_operands)
    throw ShapeError(fmt::format("einsum equation '{}' has {} operand terms but {} operands "
                                 "were given", eq, spec.operands.size(), num_operands));
  for (char c : spec.result) {
    bool found = false;
    for (const auto& o : spec.operands) found = found || o.find(c) != std::string::npos;
    if (!found)
      throw ShapeError(fmt::format("einsum equation '{}': result letter '{}' appears in no "
                                   "operand", eq, c));
  }
  return spec;
}

std::string OpRule::to_string() const {
  auto dims_str = [&](const std::vector<DimFactors>& dims) {
    std::vector<std::string> parts;
    for (const auto& d : dims) {
      std::vector<std::string> fs;
      for (int f : d) fs.push_back(factors[f].name);
      parts.push_back(fs.empty() ? "1" : join(fs, "*"));
    }
    return "(" + join(parts, ",") + ")";
  };
  std::vector<std::string> ops;
  for (const auto& o : operands) ops.push_back(dims_str(o));
  std::string s = join(ops, ",") + " -> " + dims_str(result);
  std::vector<std::string> red, rep;
  for (const auto& f : factors) {
    if (f.kind == FactorKind::Reduction) red.push_back(f.name);
    if (f.kind == FactorKind::Replicated) rep.push_back(f.name);
  }
  if (!red.empty()) s += " reduction{" + join(red, ",") + "}";
  if (!rep.empty()) s += " replicated{" + join(rep, ",") + "}";
  return s;
}

}  // namespace tessel
