// src/ops/layout.cpp — registry entries of the ops that move data without arithmetic:
// reshape, transpose, broadcast, slice, concat. Their kernels are dtype-generic copies.
#include <set>

#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

// ---- reshape ----
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

// Walk both shapes, pairing dims into groups of equal products, and split each group into
// factors that both sides can express major→minor. A group that cannot be expressed (e.g.
// [6,4] -> [4,6]) becomes one replicated factor.
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
    if (i < s.size() && s[i] == 1) { ++i; continue; }  // size-1 dims carry no data
    if (o < out.size() && out[o] == 1) { ++o; continue; }
    if (i >= s.size() || o >= out.size()) break;
    std::size_t i2 = i + 1, o2 = o + 1;  // minimal group [i, i2) x [o, o2) of equal products
    int64_t pi = s[i], po = out[o];
    while (pi != po) {
      if (pi < po) pi *= s[i2++];
      else po *= out[o2++];
    }
    std::vector<std::pair<int64_t, std::pair<std::size_t, std::size_t>>> fs;  // size, (in, out dim)
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

void localize_to_result(OpAttrs& a, const LocalizeArgs& x) { a.shape = x.local_out; }

// [.., a*b, ..] <-> [.., a, b, ..] splits and merges, or a full flatten.
Tensor sample_reshape(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  Shape t;
  int64_t mode = r.below(3);
  if (mode == 0) {
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (d == 0 && s[d] % 2 == 0) { t.push_back(2); t.push_back(s[d] / 2); }
      else t.push_back(s[d]);
    }
  } else if (mode == 1 && s.size() >= 2) {
    t.assign(s.begin(), s.end() - 2);
    t.push_back(s[s.size() - 2] * s.back());
  } else {
    t = {num_elements(s)};
  }
  return reshape(r.input(g, s), t);
}

// ---- transpose ----
void normalize_transpose(OpAttrs& a, const Ins& in) {
  const std::size_t rank = in.empty() ? 0 : in[0]->shape.size();
  for (auto& d : a.dims) d = normalize_axis(d, rank, "transpose");
}

void infer_transpose(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (a.dims.size() != in[0]->shape.size())
    shape_fail("transpose", in, fmt::format("permutation [{}] has {} entries for rank {}",
                                            fmt::join(a.dims, ","), a.dims.size(),
                                            in[0]->shape.size()));
  std::set<int64_t> seen;
  for (int64_t d : a.dims) {
    if (d < 0 || d >= static_cast<int64_t>(in[0]->shape.size()))
      shape_fail("transpose", in, fmt::format("dim {} is out of range", d));
    if (!seen.insert(d).second) shape_fail("transpose", in, fmt::format("dim {} listed twice", d));
  }
  out.clear();
  for (int64_t p : a.dims) out.push_back(in[0]->shape[static_cast<std::size_t>(p)]);
  dt = in[0]->dtype;
}

OpRule rule_transpose(const OpAttrs& a, const Shapes& in, const Shape&) {
  OpRule r = identity_rule(in[0], 1);
  r.result.clear();
  for (int64_t p : a.dims) r.result.push_back({static_cast<int>(p)});
  return r;
}

Tensor sample_transpose(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  std::vector<int64_t> perm;
  for (std::size_t d = 0; d < s.size(); ++d) perm.push_back(static_cast<int64_t>(d));
  std::shuffle(perm.begin(), perm.end(), r.rng);
  return transpose(r.input(g, s), perm);
}

// ---- broadcast ----
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

OpRule rule_broadcast(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  r.operands.push_back(broadcast_dims(in[0], out));
  return r;
}

Tensor sample_broadcast(Graph& g, SampleGen& r) {
  Shape t = r.shape(r.rank());
  Shape s(t.begin() + r.below(static_cast<int64_t>(t.size())), t.end());
  for (auto& d : s)
    if (r.coin(0.4)) d = 1;
  return broadcast_to(r.input(g, s), t);
}

// ---- slice ----
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

OpRule rule_slice(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  for (std::size_t d = 0; d < out.size(); ++d)
    if (a.starts[d] != 0 || a.limits[d] != in[0][d]) r.factors[d].kind = FactorKind::Replicated;
  return r;
}

// A sharded dim is sliced whole (its factor is replicated otherwise): the local slice is
// the whole local block.
void localize_slice(OpAttrs& a, const LocalizeArgs& x) {
  for (std::size_t d = 0; d < x.local_out.size(); ++d)
    if (!x.out_sharding.dims[d].axes.empty()) {
      a.starts[d] = 0;
      a.limits[d] = x.local_out[d];
    }
}

Tensor sample_slice(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  std::vector<int64_t> starts, limits;
  for (auto d : s) {
    int64_t st = r.coin() ? 0 : r.below(d);
    int64_t lim = r.coin() ? d : st + 1 + r.below(d - st);
    starts.push_back(st);
    limits.push_back(lim);
  }
  return slice(r.input(g, s), starts, limits);
}

// ---- concat ----
void normalize_concat(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "concat");
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
    // Checked before adding: the sum of extents must not overflow.
    if (v->shape[a.axis] > (int64_t{1} << 62) - out[a.axis])
      shape_fail("concat", in, fmt::format("the concatenated extent of axis {} exceeds 2^62", a.axis));
    out[a.axis] += v->shape[a.axis];
  }
  dt = in[0]->dtype;
}

OpRule rule_concat(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, static_cast<int>(in.size()));
  r.factors[a.axis].kind = FactorKind::Replicated;
  return r;
}

Tensor sample_concat(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  int64_t axis = r.below(static_cast<int64_t>(s.size()));
  std::vector<Tensor> xs;
  int64_t n = 2 + r.below(2);
  for (int64_t i = 0; i < n; ++i) {
    Shape si = s;
    si[axis] = r.dim();
    xs.push_back(r.input(g, si));
  }
  return concat(xs, axis);
}

OpDef layout(OpKind k, const char* name, std::vector<AttrSpec> attrs, InferFn infer, RuleFn rule,
             SampleFn s) {
  OpDef d = entry(k, name, 1, 1, infer, rule, flops_zero, s);
  d.attrs = std::move(attrs);
  d.partial_flow = PartialFlow::Multilinear;
  return d;
}

}  // namespace

namespace {
using Grads = std::vector<Tensor>;
Grads vjp_reshape(const VjpArgs& a) { return {reshape(a.grad_output, a.inputs[0].shape())}; }
Grads vjp_transpose(const VjpArgs& a) {
  const std::vector<int64_t>& perm = a.op.attrs.dims;
  std::vector<int64_t> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[static_cast<std::size_t>(perm[i])] = static_cast<int64_t>(i);
  return {transpose(a.grad_output, inv)};
}
Grads vjp_broadcast(const VjpArgs& a) { return {unbroadcast(a.grad_output, a.inputs[0].shape())}; }
// The gradient placed at [starts, limits) of zeros of the operand's shape: zero blocks
// concatenated before and after it, dim by dim.
Grads vjp_slice(const VjpArgs& a) {
  const Shape x = a.inputs[0].shape();  // a copy: the builders below grow the graph
  Tensor g = a.grad_output;
  for (std::size_t d = 0; d < x.size(); ++d) {
    const int64_t lo = a.op.attrs.starts[d], hi = a.op.attrs.limits[d];
    if (lo == 0 && hi == x[d]) continue;
    std::vector<Tensor> parts;
    auto zeros = [&](int64_t n) {
      Shape s = g.shape();
      s[d] = n;
      return broadcast_to(scalar_like(g, 0.0), s);
    };
    if (lo > 0) parts.push_back(zeros(lo));
    parts.push_back(g);
    if (hi < x[d]) parts.push_back(zeros(x[d] - hi));
    g = concat(parts, static_cast<int64_t>(d));
  }
  return {g};
}
Grads vjp_concat(const VjpArgs& a) {
  const std::size_t axis = static_cast<std::size_t>(a.op.attrs.axis);
  Grads out;
  int64_t at = 0;
  for (const Tensor& x : a.inputs) {
    std::vector<int64_t> starts(x.shape().size(), 0), limits(a.grad_output.shape());
    starts[axis] = at;
    limits[axis] = at + x.shape()[axis];
    at = limits[axis];
    out.push_back(slice(a.grad_output, starts, limits));
  }
  return out;
}
}  // namespace

void register_layout_ops(std::vector<OpDef>& t) {
  OpDef rs = layout(OpKind::Reshape, "reshape", {{"shape", AttrField::Shape}}, infer_reshape,
                    rule_reshape, sample_reshape);
  rs.localize = localize_to_result;
  rs.vjp = vjp_reshape;
  put(t, std::move(rs));

  OpDef tr = layout(OpKind::Transpose, "transpose", {{"perm", AttrField::Dims}}, infer_transpose,
                    rule_transpose, sample_transpose);
  tr.normalize = normalize_transpose;
  tr.vjp = vjp_transpose;
  put(t, std::move(tr));

  OpDef bc = layout(OpKind::Broadcast, "broadcast", {{"shape", AttrField::Shape}}, infer_broadcast,
                    rule_broadcast, sample_broadcast);
  bc.localize = localize_to_result;
  bc.vjp = vjp_broadcast;
  put(t, std::move(bc));

  OpDef sl = layout(OpKind::Slice, "slice", {{"starts", AttrField::Starts}, {"limits", AttrField::Limits}},
                    infer_slice, rule_slice, sample_slice);
  sl.localize = localize_slice;
  sl.vjp = vjp_slice;
  put(t, std::move(sl));

  OpDef cc = layout(OpKind::Concat, "concat", {{"axis", AttrField::Axis}}, infer_concat, rule_concat,
                    sample_concat);
  cc.max_inputs = -1;
  cc.normalize = normalize_concat;
  cc.partial_flow = PartialFlow::Additive;
  cc.vjp = vjp_concat;
  put(t, std::move(cc));
}

}  // namespace ops_detail

using ops_detail::build;
Tensor reshape(Tensor x, Shape shape) {
  OpAttrs a;
  a.shape = std::move(shape);
  return build(OpKind::Reshape, {x}, std::move(a));
}
Tensor transpose(Tensor x, std::vector<int64_t> perm) {
  OpAttrs a;
  a.dims = std::move(perm);
  return build(OpKind::Transpose, {x}, std::move(a));
}
Tensor broadcast_to(Tensor x, Shape shape) {
  OpAttrs a;
  a.shape = std::move(shape);
  return build(OpKind::Broadcast, {x}, std::move(a));
}
Tensor slice(Tensor x, std::vector<int64_t> starts, std::vector<int64_t> limits) {
  OpAttrs a;
  a.starts = std::move(starts);
  a.limits = std::move(limits);
  return build(OpKind::Slice, {x}, std::move(a));
}
Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) throw ShapeError("concat: needs at least one operand");
  OpAttrs a;
  a.axis = axis;
  return build(OpKind::Concat, xs, std::move(a));
}

}  // namespace tessel
