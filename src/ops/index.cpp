// src/ops/index.cpp — registry entries of the ops that index with i32 values: one_hot,
// gather (numpy take along an axis) and scatter_add (its adjoint: what an embedding's
// backward needs). Their kernels read global positions, so each works on any block:
//   gather with the table sharded along `axis`: each device contributes the rows it owns
//   and the result is a partial sum (Megatron's vocab-parallel lookup, like embedding);
//   scatter_add with its index dims sharded: each device scatters its updates, the result is
//   a partial sum (the data-parallel gradient reduction); with the `depth` dim sharded, each
//   device keeps the rows of its block.
// write_at writes one position per leading index along an axis, split or not (a device
// writes the positions of its block).
// sample_tokens draws one token per row of logits (its vocabulary dim whole on each device).
// Index semantics: one_hot gives an all-zero row for an id outside [0, depth) (as JAX);
// gather and scatter_add report such an id as an error.
#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

// ---- one_hot ----
void infer_one_hot(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->dtype != DType::i32) shape_fail("one_hot", in, "ids must be i32");
  if (a.depth < 1) shape_fail("one_hot", in, fmt::format("depth={} must be >= 1", a.depth));
  out = in[0]->shape;
  out.push_back(a.depth);
  dt = a.dtype;
}
OpRule rule_one_hot(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 0);  // ids dims..., classes (a result-only factor)
  std::vector<DimFactors> ids;
  for (std::size_t d = 0; d + 1 < out.size(); ++d) ids.push_back({static_cast<int>(d)});
  r.operands.push_back(std::move(ids));
  return r;
}
Tensor sample_one_hot(Graph& g, SampleGen& r) {
  // Ids are drawn in [0, 8): depths below 8 also exercise the all-zero rows.
  Tensor ids = r.input(g, r.shape(r.rank()), DType::i32);
  return one_hot(ids, r.dim(), r.coin() ? DType::f32 : DType::i32);
}

// ---- gather ----
void normalize_gather(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "gather");
}
void infer_gather(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& t = in[0]->shape;
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(t.size()))
    shape_fail("gather", in, fmt::format("axis {} is out of range for rank {}", a.axis, t.size()));
  if (in[1]->dtype != DType::i32) shape_fail("gather", in, "indices must be i32");
  out.assign(t.begin(), t.begin() + a.axis);
  out.insert(out.end(), in[1]->shape.begin(), in[1]->shape.end());
  out.insert(out.end(), t.begin() + a.axis + 1, t.end());
  dt = in[0]->dtype;
}
// Factors: table dims (the gathered one a reduction), then the index dims.
OpRule rule_gather(const OpAttrs& a, const Shapes& in, const Shape&) {
  OpRule r;
  const Shape& t = in[0];
  const Shape& ix = in[1];
  std::vector<DimFactors> tdims, idims;
  for (std::size_t d = 0; d < t.size(); ++d) {
    const bool gathered = static_cast<int64_t>(d) == a.axis;
    r.factors.push_back({gathered ? "rows" : fmt::format("t{}", d), t[d],
                         gathered ? FactorKind::Reduction : FactorKind::Pass});
    tdims.push_back({static_cast<int>(d)});
  }
  for (std::size_t d = 0; d < ix.size(); ++d) {
    r.factors.push_back({fmt::format("i{}", d), ix[d], FactorKind::Pass});
    idims.push_back({static_cast<int>(t.size() + d)});
  }
  for (int64_t d = 0; d < a.axis; ++d) r.result.push_back({static_cast<int>(d)});
  for (const auto& f : idims) r.result.push_back(f);
  for (std::size_t d = static_cast<std::size_t>(a.axis) + 1; d < t.size(); ++d) r.result.push_back({static_cast<int>(d)});
  r.operands.push_back(std::move(tdims));
  r.operands.push_back(std::move(idims));
  return r;
}
int64_t bound_gather(const OpAttrs& a, const Shapes& in, int operand) {
  return operand == 1 && a.axis >= 0 && a.axis < static_cast<int64_t>(in[0].size()) ? in[0][a.axis] : 0;
}
Tensor sample_gather(Graph& g, SampleGen& r) {
  Shape t = r.shape(r.rank());
  int64_t axis = r.below(static_cast<int64_t>(t.size()));
  Tensor idx = r.input(g, r.shape(1 + static_cast<int>(r.below(2))), DType::i32);
  return gather(r.input(g, t), idx, axis);
}

// ---- scatter_add ----
void normalize_scatter(OpAttrs& a, const Ins& in) {
  // axis counts dims of the result = updates rank - idx rank + 1.
  const int64_t rank = in.size() < 2 ? 0
                       : static_cast<int64_t>(in[0]->shape.size()) - static_cast<int64_t>(in[1]->shape.size()) + 1;
  a.axis = normalize_axis(a.axis, static_cast<std::size_t>(std::max<int64_t>(rank, 0)), "scatter_add");
}
void infer_scatter(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& u = in[0]->shape;
  const Shape& ix = in[1]->shape;
  if (in[1]->dtype != DType::i32) shape_fail("scatter_add", in, "indices must be i32");
  if (a.depth < 1) shape_fail("scatter_add", in, fmt::format("depth={} must be >= 1", a.depth));
  const std::size_t k = ix.size();
  if (u.size() < k || a.axis < 0 || static_cast<std::size_t>(a.axis) + k > u.size())
    shape_fail("scatter_add", in, fmt::format("updates must be [dims before axis {}] + indices "
                                              "shape {} + [dims after]", a.axis, shape_str(ix)));
  for (std::size_t d = 0; d < k; ++d)
    if (u[static_cast<std::size_t>(a.axis) + d] != ix[d])
      shape_fail("scatter_add", in, fmt::format("updates dims {}..{} must equal the indices "
                                                "shape {}", a.axis, a.axis + static_cast<int64_t>(k) - 1,
                                                shape_str(ix)));
  if (!is_float(in[0]->dtype) && in[0]->dtype != DType::i32)
    shape_fail("scatter_add", in, "updates must be a number type");
  out.assign(u.begin(), u.begin() + a.axis);
  out.push_back(a.depth);
  out.insert(out.end(), u.begin() + a.axis + static_cast<int64_t>(k), u.end());
  dt = in[0]->dtype;
}
// Factors: result dims (the `depth` one only in the result), then the index dims, which are
// summed over (reductions).
OpRule rule_scatter(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  r.factors[static_cast<std::size_t>(a.axis)].name = "rows";
  const Shape& ix = in[1];
  std::vector<DimFactors> udims, idims;
  for (int64_t d = 0; d < a.axis; ++d) udims.push_back({static_cast<int>(d)});
  for (std::size_t d = 0; d < ix.size(); ++d) {
    r.factors.push_back({fmt::format("i{}", d), ix[d], FactorKind::Reduction});
    udims.push_back({static_cast<int>(r.factors.size()) - 1});
    idims.push_back({static_cast<int>(r.factors.size()) - 1});
  }
  for (std::size_t d = static_cast<std::size_t>(a.axis) + 1; d < out.size(); ++d) udims.push_back({static_cast<int>(d)});
  r.operands.push_back(std::move(udims));
  r.operands.push_back(std::move(idims));
  return r;
}
double flops_scatter(const OpAttrs&, const Shapes& in, const Shape&) { return elems(in[0]); }
int64_t bound_scatter(const OpAttrs& a, const Shapes&, int operand) { return operand == 1 ? a.depth : 0; }
Tensor sample_scatter(Graph& g, SampleGen& r) {
  Shape pre = r.shape(static_cast<int>(r.below(2)));
  Shape ix = r.shape(1 + static_cast<int>(r.below(2)));
  Shape post = r.shape(static_cast<int>(r.below(2)));
  Shape u = pre;
  u.insert(u.end(), ix.begin(), ix.end());
  u.insert(u.end(), post.begin(), post.end());
  // Depth at least the ids' draw range [0, 8) when bounded by it, often smaller tables.
  return scatter_add(r.input(g, u), r.input(g, ix, DType::i32), r.dim(),
                     static_cast<int64_t>(pre.size()));
}

// ---- mask_padding ----
void normalize_mask(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "mask_padding");
}
void infer_mask(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& s = in[0]->shape;
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(s.size()))
    shape_fail("mask_padding", in, fmt::format("axis {} is out of range for rank {}", a.axis, s.size()));
  if (a.depth < 0 || a.depth > s[static_cast<std::size_t>(a.axis)])
    shape_fail("mask_padding", in, fmt::format("depth={} (the valid extent) must be in [0, {}]", a.depth,
                                               s[static_cast<std::size_t>(a.axis)]));
  out = s;
  dt = in[0]->dtype;
}
Tensor sample_mask(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  const int64_t axis = r.below(static_cast<int64_t>(s.size()));
  const int64_t valid = r.below(s[static_cast<std::size_t>(axis)] + 1);
  return mask_padding(r.input(g, s), axis, valid, r.coin() ? 0.0 : -1e30);
}

// ---- write_at ----
void normalize_write(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "write_at");
}
void infer_write(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& d = in[0]->shape;
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(d.size()))
    shape_fail("write_at", in, fmt::format("axis {} is out of range for rank {}", a.axis, d.size()));
  if (in[1]->dtype != DType::i32) shape_fail("write_at", in, "indices must be i32");
  const Shape ix(d.begin(), d.begin() + a.axis);
  Shape v = ix;
  v.insert(v.end(), d.begin() + a.axis + 1, d.end());
  if (in[1]->shape != ix)
    shape_fail("write_at", in, fmt::format("indices must have dst's dims before axis {}: {}", a.axis, shape_str(ix)));
  if (in[2]->shape != v)
    shape_fail("write_at", in, fmt::format("values must have dst's dims without axis {}: {}", a.axis, shape_str(v)));
  if (in[2]->dtype != in[0]->dtype) shape_fail("write_at", in, "values must have dst's dtype");
  out = d;
  dt = in[0]->dtype;
}
// Factors: dst's dims. The written one may be split too: an index is a global position, and
// each device writes the rows that fall in its block.
OpRule rule_write(const OpAttrs& a, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  std::vector<DimFactors> ddims, idims, vdims;
  for (std::size_t d = 0; d < out.size(); ++d) {
    ddims.push_back({static_cast<int>(d)});
    if (static_cast<int64_t>(d) < a.axis) idims.push_back({static_cast<int>(d)});
    if (static_cast<int64_t>(d) != a.axis) vdims.push_back({static_cast<int>(d)});
  }
  r.operands.push_back(std::move(ddims));
  r.operands.push_back(std::move(idims));
  r.operands.push_back(std::move(vdims));
  return r;
}
double flops_write(const OpAttrs&, const Shapes& in, const Shape&) { return elems(in[2]); }
int64_t bound_write(const OpAttrs& a, const Shapes& in, int operand) {
  return operand == 1 ? in[0].at(static_cast<std::size_t>(a.axis)) : 0;
}
Tensor sample_write(Graph& g, SampleGen& r) {
  Shape pre = r.shape(1 + static_cast<int>(r.below(2)));
  Shape post = r.shape(static_cast<int>(r.below(2)));
  Shape d = pre;
  d.push_back(r.dim());
  d.insert(d.end(), post.begin(), post.end());
  Shape v = pre;
  v.insert(v.end(), post.begin(), post.end());
  return write_at(r.input(g, d), r.input(g, pre, DType::i32), r.input(g, v), static_cast<int64_t>(pre.size()));
}

// ---- sample_tokens ----
void infer_sample(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  const Shape& l = in[0]->shape;
  if (l.empty()) shape_fail("sample_tokens", in, "logits must have a vocabulary dim [..., V]");
  if (!is_float(in[0]->dtype)) shape_fail("sample_tokens", in, "logits must be a float dtype");
  const Shape rows(l.begin(), l.end() - 1);
  const char* names[] = {"", "keys", "temperature", "top_k", "top_p"};
  const DType want[] = {DType::f32, DType::i32, DType::f32, DType::i32, DType::f32};
  for (std::size_t i = 1; i < 5; ++i) {
    if (in[i]->shape != rows)
      shape_fail("sample_tokens", in,
                 fmt::format("{} must have the logits' dims without the last: {}", names[i], shape_str(rows)));
    if (in[i]->dtype != want[i])
      shape_fail("sample_tokens", in, fmt::format("{} must be {}", names[i], dtype_name(want[i])));
  }
  out = rows;
  dt = DType::i32;
}
// Factors: the rows (shared by every operand and the result), then the vocabulary, which
// each device needs whole (a row's cut and draw read all of it).
OpRule rule_sample(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 4);
  r.factors.push_back({"vocab", in[0].back(), FactorKind::Replicated});
  std::vector<DimFactors> l = r.result;
  l.push_back({static_cast<int>(out.size())});
  r.operands.insert(r.operands.begin(), std::move(l));
  return r;
}
// A few passes over the logits: the max, the cuts, the exponentials, the draw.
double flops_sample(const OpAttrs&, const Shapes& in, const Shape&) { return 8 * elems(in[0]); }
Tensor sample_sample(Graph& g, SampleGen& r) {
  Shape rows = r.shape(1 + static_cast<int>(r.below(2)));
  Shape l = rows;
  l.push_back(r.dim());
  return sample_tokens(r.input(g, l), r.input(g, rows, DType::i32), r.input(g, rows), r.input(g, rows, DType::i32),
                       r.input(g, rows));
}

}  // namespace

namespace {
using Grads = std::vector<Tensor>;
// The written rows came from values: dst's gradient is zero there, values' is those rows.
Grads vjp_write(const VjpArgs& a) {
  const int64_t axis = a.op.attrs.axis;
  const Shape d = a.inputs[0].shape();  // copies: adding ops may move the graph's values
  const Shape vs = a.inputs[2].shape();
  int64_t P = 1, Q = 1;
  for (int64_t i = 0; i < axis; ++i) P *= d[static_cast<std::size_t>(i)];
  for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < d.size(); ++i) Q *= d[i];
  const int64_t n = d[static_cast<std::size_t>(axis)];
  Graph& g = *a.grad_output.graph();
  Tensor zeros = constant(g, 0, a.grad_output.dtype(), vs);
  Tensor hot = reshape(one_hot(a.inputs[1], n, a.grad_output.dtype()), {P, n});
  Tensor rows = einsum("pn,pnq->pq", hot, reshape(a.grad_output, {P, n, Q}));
  return {write_at(a.grad_output, a.inputs[1], zeros, axis), Tensor{}, reshape(rows, vs)};
}
// The masked positions were set to a constant: their gradient is zero.
Grads vjp_mask(const VjpArgs& a) {
  return {mask_padding(a.grad_output, a.op.attrs.axis, a.op.attrs.depth, 0.0)};
}
Grads vjp_gather(const VjpArgs& a) {
  const int64_t axis = a.op.attrs.axis;
  return {scatter_add(a.grad_output, a.inputs[1], a.inputs[0].shape()[static_cast<std::size_t>(axis)], axis),
          Tensor{}};
}
Grads vjp_scatter(const VjpArgs& a) { return {gather(a.grad_output, a.inputs[1], a.op.attrs.axis), Tensor{}}; }
}  // namespace

void register_index_ops(std::vector<OpDef>& t) {
  OpDef mk = entry(OpKind::MaskPadding, "mask_padding", 1, 1, infer_mask, rule_unary, flops_out,
                   sample_mask);
  mk.attrs = {{"axis", AttrField::Axis}, {"depth", AttrField::Depth}, {"value", AttrField::Scalar}};
  mk.normalize = normalize_mask;
  mk.needs_offsets = true;
  mk.vjp = vjp_mask;
  put(t, std::move(mk));

  OpDef oh = entry(OpKind::OneHot, "one_hot", 1, 1, infer_one_hot, rule_one_hot, flops_out,
                   sample_one_hot);
  oh.attrs = {{"depth", AttrField::Depth}, {"dtype", AttrField::DType, false, true}};
  oh.needs_offsets = true;
  put(t, std::move(oh));

  OpDef ga = entry(OpKind::Gather, "gather", 2, 2, infer_gather, rule_gather, flops_zero,
                   sample_gather);
  ga.attrs = {{"axis", AttrField::Axis}};
  ga.normalize = normalize_gather;
  ga.needs_offsets = true;
  ga.index_bound = bound_gather;
  ga.vjp = vjp_gather;
  put(t, std::move(ga));

  OpDef wa = entry(OpKind::WriteAt, "write_at", 3, 3, infer_write, rule_write, flops_write, sample_write);
  wa.attrs = {{"axis", AttrField::Axis}};
  wa.normalize = normalize_write;
  wa.needs_offsets = true;
  wa.index_bound = bound_write;
  wa.vjp = vjp_write;
  put(t, std::move(wa));

  put(t, entry(OpKind::SampleTokens, "sample_tokens", 5, 5, infer_sample, rule_sample, flops_sample, sample_sample));

  OpDef sa = entry(OpKind::ScatterAdd, "scatter_add", 2, 2, infer_scatter, rule_scatter,
                   flops_scatter, sample_scatter);
  sa.attrs = {{"depth", AttrField::Depth}, {"axis", AttrField::Axis}};
  sa.normalize = normalize_scatter;
  sa.needs_offsets = true;
  sa.index_bound = bound_scatter;
  sa.vjp = vjp_scatter;
  put(t, std::move(sa));
}

}  // namespace ops_detail

using ops_detail::build;
Tensor one_hot(Tensor ids, int64_t depth, DType dtype) {
  OpAttrs a;
  a.depth = depth;
  a.dtype = dtype;
  return build(OpKind::OneHot, {ids}, std::move(a));
}
Tensor gather(Tensor table, Tensor indices, int64_t axis) {
  OpAttrs a;
  a.axis = axis;
  return build(OpKind::Gather, {table, indices}, std::move(a));
}
Tensor mask_padding(Tensor x, int64_t axis, int64_t valid, double value) {
  OpAttrs a;
  a.axis = axis;
  a.depth = valid;
  a.scalar = value;
  return build(OpKind::MaskPadding, {x}, std::move(a));
}
Tensor write_at(Tensor dst, Tensor indices, Tensor values, int64_t axis) {
  OpAttrs a;
  a.axis = axis;
  return build(OpKind::WriteAt, {dst, indices, values}, std::move(a));
}
Tensor sample_tokens(Tensor logits, Tensor keys, Tensor temperature, Tensor top_k, Tensor top_p) {
  return build(OpKind::SampleTokens, {logits, keys, temperature, top_k, top_p}, OpAttrs{});
}
Tensor scatter_add(Tensor updates, Tensor indices, int64_t depth, int64_t axis) {
  OpAttrs a;
  a.depth = depth;
  a.axis = axis;
  return build(OpKind::ScatterAdd, {updates, indices}, std::move(a));
}

}  // namespace tessel
