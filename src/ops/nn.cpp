// src/ops/nn.cpp — registry entries of the neural-network ops: softmax, layer_norm and its
// backward layer_norm_grad (an op with three results),
// embedding (Megatron's vocab-parallel lookup when the table is row-sharded), cross_entropy
// and causal_mask. Their kernels read global positions where a block's place matters.
#include <limits>

#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

double flops_in5(const OpAttrs&, const Shapes& in, const Shape&) { return 5 * elems(in[0]); }
double flops_in8(const OpAttrs&, const Shapes& in, const Shape&) { return 8 * elems(in[0]); }

// ---- softmax ----
void normalize_axis0(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "softmax");
}
void infer_softmax(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(in[0]->shape.size()))
    shape_fail("softmax", in, fmt::format("axis {} is out of range", a.axis));
  if (!is_float(in[0]->dtype)) shape_fail("softmax", in, "needs a floating-point operand");
  out = in[0]->shape;
  dt = in[0]->dtype;
}
OpRule rule_softmax(const OpAttrs& a, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  r.factors[a.axis].kind = FactorKind::Combined;
  return r;
}
// The axis split: y = exp(x - max) / sum, with the max and the sum all-reduced (two per-row
// statistics; nothing of the axis' size moves). Computed in f32 like the kernel.
int distribute_softmax(const DistributeArgs& x) {
  LocalEmitter& e = x.emit;
  const DType dt = e.dtype(x.ins[0]);
  const int v = local_cast(e, x.ins[0], DType::f32);
  const std::vector<int64_t> ax = {x.attrs.axis};
  const int m = e.all_reduce(local_reduce(e, OpKind::ReduceMax, v, ax, true), ReduceOp::Max);
  const int ex = local_op(e, OpKind::Exp, {local_op(e, OpKind::Sub, {v, m})});
  const int s = e.all_reduce(local_reduce(e, OpKind::ReduceSum, ex, ax, true), ReduceOp::Sum);
  return local_cast(e, local_op(e, OpKind::Div, {ex, s}), dt);
}
Tensor sample_softmax(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  return softmax(r.input(g, s), r.below(static_cast<int64_t>(s.size())));
}

// ---- layer_norm ----
void infer_layer_norm(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const Shape& x = in[0]->shape;
  if (x.empty()) shape_fail("layer_norm", in, "operand must have rank >= 1");
  for (int i = 1; i <= 2; ++i)
    if (in[i]->shape != Shape{x.back()})
      shape_fail("layer_norm", in, fmt::format("gamma and beta must have shape [{}] (the last dim "
                                               "of x)", x.back()));
  if (!is_float(in[0]->dtype)) shape_fail("layer_norm", in, "needs floating-point x");
  if (!(a.eps >= 0) || a.eps == std::numeric_limits<double>::infinity())
    shape_fail("layer_norm", in, fmt::format("eps={} must be a finite number >= 0", a.eps));
  out = x;
  dt = in[0]->dtype;
}
OpRule rule_layer_norm(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  int last = static_cast<int>(out.size()) - 1;
  r.factors[last].kind = FactorKind::Combined;
  r.operands.push_back({{last}});
  r.operands.push_back({{last}});
  return r;
}
// The feature dim split: two passes, as the kernel, each with one all-reduce of a per-row
// statistic: the row sums give the mean; then the sums of (x - mean)^2 give the variance
// (exact, no E[x^2] - E[x]^2 cancellation). gamma and beta are split like x.
int distribute_layer_norm(const DistributeArgs& x) {
  LocalEmitter& e = x.emit;
  const DType dt = e.dtype(x.ins[0]);
  const int v = local_cast(e, x.ins[0], DType::f32);
  const int64_t last = static_cast<int64_t>(x.global_in[0].size()) - 1;
  const int inv_n = e.scalar(1.0 / static_cast<double>(x.global_in[0].back()), DType::f32);
  const int s1 = e.all_reduce(local_reduce(e, OpKind::ReduceSum, v, {last}, true), ReduceOp::Sum);
  const int mean = local_op(e, OpKind::Mul, {s1, inv_n});
  const int d = local_op(e, OpKind::Sub, {v, mean});
  const int s2 = e.all_reduce(local_reduce(e, OpKind::ReduceSum, local_op(e, OpKind::Mul, {d, d}), {last}, true),
                              ReduceOp::Sum);
  const int var = local_op(e, OpKind::Mul, {s2, inv_n});
  const int rstd = local_op(e, OpKind::Rsqrt, {local_op(e, OpKind::Add, {var, e.scalar(x.attrs.eps, DType::f32)})});
  const int gamma = local_cast(e, x.ins[1], DType::f32), beta = local_cast(e, x.ins[2], DType::f32);
  const int y = local_op(e, OpKind::Add, {local_op(e, OpKind::Mul, {local_op(e, OpKind::Mul, {d, rstd}), gamma}), beta});
  return local_cast(e, y, dt);
}
Tensor sample_layer_norm(Graph& g, SampleGen& r) {
  Shape s = r.shape(1 + r.rank());
  return layer_norm(r.input(g, s), r.input(g, {s.back()}), r.input(g, {s.back()}));
}

// ---- softmax_grad: (y, dy) -> y (dy - sum(dy y, axis)) ----
void infer_softmax_grad(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->shape != in[1]->shape || in[0]->dtype != in[1]->dtype)
    shape_fail("softmax_grad", in, "y and dy (softmax's result and its gradient) must have the same type");
  if (!is_float(in[0]->dtype)) shape_fail("softmax_grad", in, "needs floating-point operands");
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(in[0]->shape.size()))
    shape_fail("softmax_grad", in, fmt::format("axis {} is out of range", a.axis));
  out = in[0]->shape;
  dt = in[0]->dtype;
}
void normalize_axis_sg(OpAttrs& a, const Ins& in) {
  a.axis = normalize_axis(a.axis, in.empty() ? 0 : in[0]->shape.size(), "softmax_grad");
}
// As softmax: the axis is combined (whole in the kernel; split, one all-reduced statistic).
OpRule rule_softmax_grad(const OpAttrs& a, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 2);
  r.factors[static_cast<std::size_t>(a.axis)].kind = FactorKind::Combined;
  return r;
}
// The axis split: the row sums of dy * y all-reduced (one per-row statistic), in f32.
int distribute_softmax_grad(const DistributeArgs& x) {
  LocalEmitter& e = x.emit;
  const DType dt = e.dtype(x.ins[0]);
  const int y = local_cast(e, x.ins[0], DType::f32), dy = local_cast(e, x.ins[1], DType::f32);
  const int s = e.all_reduce(local_reduce(e, OpKind::ReduceSum, local_op(e, OpKind::Mul, {dy, y}), {x.attrs.axis}, true),
                             ReduceOp::Sum);
  return local_cast(e, local_op(e, OpKind::Mul, {y, local_op(e, OpKind::Sub, {dy, s})}), dt);
}
Tensor sample_softmax_grad(Graph& g, SampleGen& r) {
  Shape s = r.shape(r.rank());
  const int64_t axis = r.below(static_cast<int64_t>(s.size()));
  return softmax_grad(softmax(r.input(g, s), axis), r.input(g, s), axis);
}

// ---- cross_entropy and its grad, distributed (the classes split) ----
// The logits in f32, the row max m (all-reduced), exp(x - m) and its row sum s (all-reduced;
// kept as [..., 1] when keep_sum), and this device's block of one_hot(labels) as `hot_dtype`.
struct VocabRows {
  int v, m, ex, s, hot;
};
VocabRows vocab_rows(const DistributeArgs& x, bool keep_sum, DType hot_dtype) {
  LocalEmitter& e = x.emit;
  VocabRows r{};
  r.v = local_cast(e, x.ins[0], DType::f32);
  const int64_t last = static_cast<int64_t>(x.global_in[0].size()) - 1;
  r.m = e.all_reduce(local_reduce(e, OpKind::ReduceMax, r.v, {last}, true), ReduceOp::Max);
  r.ex = local_op(e, OpKind::Exp, {local_op(e, OpKind::Sub, {r.v, r.m})});
  r.s = e.all_reduce(local_reduce(e, OpKind::ReduceSum, r.ex, {last}, keep_sum), ReduceOp::Sum);
  OpAttrs oh;
  oh.depth = x.global_in[0].back();
  oh.dtype = hot_dtype;
  r.hot = e.kernel_block(OpKind::OneHot, oh, {x.ins[1]}, x.global_in[0], x.in_layouts[0].without_partial());
  return r;
}

// ---- cross_entropy_grad: (logits, labels, g) -> (softmax(logits) - one_hot(labels)) g ----
void infer_cross_entropy_grad(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  const Shape& l = in[0]->shape;
  if (l.empty()) shape_fail("cross_entropy_grad", in, "logits must have rank >= 1 ([..., classes])");
  if (!is_float(in[0]->dtype)) shape_fail("cross_entropy_grad", in, "logits must be floating-point");
  if (in[1]->dtype != DType::i32) shape_fail("cross_entropy_grad", in, "labels must be i32");
  const Shape want(l.begin(), l.end() - 1);
  if (in[1]->shape != want || in[2]->shape != want)
    shape_fail("cross_entropy_grad", in, fmt::format("labels and g must have shape {} (logits without the class dim)",
                                                     shape_str(want)));
  if (in[2]->dtype != DType::f32) shape_fail("cross_entropy_grad", in, "g (the losses' gradient) must be f32");
  out = l;
  dt = in[0]->dtype;
}
// Rows pass through; the classes are combined, as in cross_entropy.
OpRule rule_cross_entropy_grad(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  const int C = static_cast<int>(out.size()) - 1;
  r.factors[static_cast<std::size_t>(C)].kind = FactorKind::Combined;
  std::vector<DimFactors> rows;
  for (int d = 0; d < C; ++d) rows.push_back({d});
  r.operands.push_back(rows);
  r.operands.push_back(rows);
  return r;
}
// The classes split (Megatron's vocab-parallel backward): the row max and the sum of
// exponentials all-reduced, the one-hot of this device's class block.
int distribute_cross_entropy_grad(const DistributeArgs& x) {
  LocalEmitter& e = x.emit;
  const DType dt = e.dtype(x.ins[0]);
  const VocabRows r = vocab_rows(x, /*keep_sum=*/true, DType::f32);
  Shape gs = e.shape(x.ins[2]);
  gs.push_back(1);
  const int gr = local_reshape(e, x.ins[2], gs);
  const int d = local_op(e, OpKind::Mul, {local_op(e, OpKind::Sub, {local_op(e, OpKind::Div, {r.ex, r.s}), r.hot}), gr});
  return local_cast(e, d, dt);
}
Tensor sample_cross_entropy_grad(Graph& g, SampleGen& r) {
  Shape lead = r.shape(1 + static_cast<int>(r.below(2)));
  Shape logits = lead;
  logits.push_back(r.dim());
  return cross_entropy_grad(r.input(g, logits), r.input(g, lead, DType::i32), r.input(g, lead));
}

// ---- vector-Jacobian products ----
using Grads = std::vector<Tensor>;
// dx = z (g - sum(g z, axis)): one fused op (softmax_grad).
Grads vjp_softmax(const VjpArgs& a) { return {softmax_grad(a.output, a.grad_output, a.op.attrs.axis)}; }
// One fused op (layer_norm_grad) gives all three.
Grads vjp_layer_norm(const VjpArgs& a) {
  LayerNormGrads d = layer_norm_grad(a.inputs[0], a.inputs[1], a.grad_output, a.op.attrs.eps);
  const DType gd = a.inputs[1].dtype(), bd = a.inputs[2].dtype();
  return {d.dx, d.dgamma, gd == bd ? d.dbeta : cast(d.dbeta, bd)};
}
// The table's gradient is the scatter-add of the rows' gradients at their ids; ids get none.
Grads vjp_embedding(const VjpArgs& a) {
  return {scatter_add(a.grad_output, a.inputs[1], a.inputs[0].shape()[0], 0), Tensor{}};
}
// dlogits = (softmax(logits) - one_hot(labels)) * g, in f32, in the logits' type: one fused
// op (cross_entropy_grad).
Grads vjp_cross_entropy(const VjpArgs& a) { return {cross_entropy_grad(a.inputs[0], a.inputs[1], a.grad_output), Tensor{}}; }
// Masked positions are a constant (-inf): they pass no gradient. The mask is read off
// causal_mask of zeros (0 where kept, -inf where masked).
Grads vjp_causal_mask(const VjpArgs& a) {
  const Tensor& gz = a.grad_output;
  Tensor zero = scalar_like(gz, 0.0);
  Tensor kept = eq(causal_mask(broadcast_to(zero, gz.shape())), zero);
  return {where(kept, gz, zero)};
}

// ---- layer_norm_grad: (x, gamma, dy) -> (dx, dgamma, dbeta) ----
std::vector<ResultType> infer_layer_norm_grad(const OpAttrs& a, const Ins& in) {
  const Shape& x = in[0]->shape;
  if (x.empty()) shape_fail("layer_norm_grad", in, "x must have rank >= 1");
  if (in[1]->shape != Shape{x.back()})
    shape_fail("layer_norm_grad", in, fmt::format("gamma must have shape [{}] (the last dim of x)", x.back()));
  if (in[2]->shape != x || in[2]->dtype != in[0]->dtype)
    shape_fail("layer_norm_grad", in, "dy (the gradient of layer_norm's result) must have x's type");
  if (!is_float(in[0]->dtype) || !is_float(in[1]->dtype))
    shape_fail("layer_norm_grad", in, "needs floating-point x and gamma");
  if (!(a.eps >= 0) || a.eps == std::numeric_limits<double>::infinity())
    shape_fail("layer_norm_grad", in, fmt::format("eps={} must be a finite number >= 0", a.eps));
  return {{x, in[0]->dtype}, {in[1]->shape, in[1]->dtype}, {in[1]->shape, in[1]->dtype}};
}
// Row factors pass into dx and are summed over for dgamma and dbeta (those come out partial
// when rows are split, as data-parallel weight gradients do); the features stay whole (dx
// needs the row's statistics).
OpRule rule_layer_norm_grad(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 1);
  const int last = static_cast<int>(out.size()) - 1;
  r.factors[static_cast<std::size_t>(last)].kind = FactorKind::Replicated;
  r.operands.push_back({{last}});
  r.operands.push_back(r.result);
  r.extra_results = {{{last}}, {{last}}};
  return r;
}
double flops_in12(const OpAttrs&, const Shapes& in, const Shape&) { return 12 * elems(in[0]); }
double bytes_layer_norm_grad(const OpAttrs&, const Shapes& in, const std::vector<DType>& dts,
                             const Shape&, DType) {
  const double x = elems(in[0]) * static_cast<double>(dtype_size(dts[0]));
  const double gm = elems(in[1]) * static_cast<double>(dtype_size(dts[1]));
  return 3 * x + 3 * gm;  // read x, dy, gamma; write dx, dgamma, dbeta
}
Tensor sample_layer_norm_grad(Graph& g, SampleGen& r) {
  Shape s = r.shape(1 + r.rank());
  LayerNormGrads d = layer_norm_grad(r.input(g, s), r.input(g, {s.back()}), r.input(g, s));
  g.mark_output(d.dgamma);
  g.mark_output(d.dbeta);
  return d.dx;
}

// ---- embedding ----
void infer_embedding(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->shape.size() != 2) shape_fail("embedding", in, "the table must be [rows, features]");
  if (in[1]->dtype != DType::i32) shape_fail("embedding", in, "ids must be i32");
  out = in[1]->shape;
  out.push_back(in[0]->shape[1]);
  dt = in[0]->dtype;
}
// Factors: ids dims..., D (features), V (rows; a reduction: a row-sharded table yields a
// partial sum where each device contributes the rows it owns — Megatron's vocab-parallel
// embedding).
OpRule rule_embedding(const OpAttrs&, const Shapes& in, const Shape& out) {
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
// Reads the ids and one table row per id, writes the result.
double bytes_gather_rows(const OpAttrs&, const Shapes& in, const std::vector<DType>& dts,
                         const Shape& out, DType out_dt) {
  double ids = elems(in[1]) * static_cast<double>(dtype_size(dts.size() > 1 ? dts[1] : DType::i32));
  return ids + 2 * elems(out) * static_cast<double>(dtype_size(out_dt));
}
int64_t bound_embedding(const OpAttrs&, const Shapes& in, int operand) {
  return operand == 1 ? in[0][0] : 0;
}
int64_t bound_cross_entropy(const OpAttrs&, const Shapes& in, int operand) {
  return operand == 1 && !in[0].empty() ? in[0].back() : 0;
}

Tensor sample_embedding(Graph& g, SampleGen& r) {
  int64_t v = r.dim() * 2, d = r.dim();
  Shape ids = r.shape(1 + static_cast<int>(r.below(2)));
  return embedding(r.input(g, {v, d}), r.input(g, ids, DType::i32));
}

// ---- cross_entropy ----
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
OpRule rule_cross_entropy(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 0);
  r.factors.push_back({"classes", in[0].back(), FactorKind::Combined});
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
// Megatron's vocab-parallel cross-entropy: with the class dim split, the row max, the sum
// of exponentials and the label's logit (from the one device whose block holds it) are
// all-reduced — three per-row statistics; nothing of the vocabulary's size moves.
// loss = max + log(sum exp(x - max)) - x[label].
int distribute_cross_entropy(const DistributeArgs& x) {
  LocalEmitter& e = x.emit;
  const int64_t last = static_cast<int64_t>(x.global_in[0].size()) - 1;
  // The label's logit: a one-hot of this device's class block picks it, or gives 0.
  // (A select, not a product: padded or masked logits may be -inf, and -inf * 0 is NaN.)
  const VocabRows r = vocab_rows(x, /*keep_sum=*/false, DType::i32);
  const int v = r.v, m = r.m, s = r.s, hot = r.hot;
  const int picked = local_op(e, OpKind::Where, {hot, v, e.scalar(0.0, DType::f32)});
  const int t = e.all_reduce(local_reduce(e, OpKind::ReduceSum, picked, {last}, false), ReduceOp::Sum);
  const int mr = local_reshape(e, m, e.shape(s));
  return local_op(e, OpKind::Sub, {local_op(e, OpKind::Add, {local_op(e, OpKind::Log, {s}), mr}), t});
}
Tensor sample_cross_entropy(Graph& g, SampleGen& r) {
  Shape lead = r.shape(1 + static_cast<int>(r.below(2)));
  Shape logits = lead;
  logits.push_back(r.dim());
  return cross_entropy(r.input(g, logits), r.input(g, lead, DType::i32));
}

// ---- causal_mask ----
void infer_causal_mask(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->shape.size() < 2) shape_fail("causal_mask", in, "operand must be [..., queries, keys]");
  if (!is_float(in[0]->dtype)) shape_fail("causal_mask", in, "needs a floating-point operand");
  out = in[0]->shape;
  dt = in[0]->dtype;
}
Tensor sample_causal_mask(Graph& g, SampleGen& r) {
  Shape s = r.shape(2 + static_cast<int>(r.below(2)));
  s[s.size() - 2] = s.back();
  return causal_mask(r.input(g, s));
}

}  // namespace

void register_nn_ops(std::vector<OpDef>& t) {
  OpDef sm = entry(OpKind::Softmax, "softmax", 1, 1, infer_softmax, rule_softmax, flops_in5,
                   sample_softmax);
  sm.attrs = {{"axis", AttrField::Axis, false}};
  sm.normalize = normalize_axis0;
  sm.distribute = distribute_softmax;
  sm.distribute_stats = 2;
  sm.vjp = vjp_softmax;
  put(t, std::move(sm));

  OpDef sg = entry(OpKind::SoftmaxGrad, "softmax_grad", 2, 2, infer_softmax_grad, rule_softmax_grad, flops_in5,
                   sample_softmax_grad);
  sg.attrs = {{"axis", AttrField::Axis, false}};
  sg.normalize = normalize_axis_sg;
  sg.distribute = distribute_softmax_grad;
  sg.distribute_stats = 1;
  put(t, std::move(sg));

  OpDef ceg = entry(OpKind::CrossEntropyGrad, "cross_entropy_grad", 3, 3, infer_cross_entropy_grad,
                    rule_cross_entropy_grad, flops_in5, sample_cross_entropy_grad);
  ceg.needs_offsets = true;
  ceg.distribute = distribute_cross_entropy_grad;
  ceg.distribute_stats = 2;
  ceg.index_bound = bound_cross_entropy;
  put(t, std::move(ceg));

  OpDef ln = entry(OpKind::LayerNorm, "layer_norm", 3, 3, infer_layer_norm, rule_layer_norm,
                   flops_in8, sample_layer_norm);
  ln.attrs = {{"eps", AttrField::Eps, false}};
  ln.distribute = distribute_layer_norm;
  ln.distribute_stats = 2;
  ln.vjp = vjp_layer_norm;
  put(t, std::move(ln));

  OpDef lg = entry(OpKind::LayerNormGrad, "layer_norm_grad", 3, 3, nullptr, rule_layer_norm_grad,
                   flops_in12, sample_layer_norm_grad);
  lg.attrs = {{"eps", AttrField::Eps, false}};
  lg.num_results = 3;
  lg.infer_results = infer_layer_norm_grad;
  lg.bytes = bytes_layer_norm_grad;
  put(t, std::move(lg));

  OpDef em = entry(OpKind::Embedding, "embedding", 2, 2, infer_embedding, rule_embedding,
                   flops_zero, sample_embedding);
  em.bytes = bytes_gather_rows;
  em.needs_offsets = true;
  em.index_bound = bound_embedding;
  em.vjp = vjp_embedding;
  put(t, std::move(em));

  OpDef ce = entry(OpKind::CrossEntropy, "cross_entropy", 2, 2, infer_cross_entropy,
                   rule_cross_entropy, flops_in5, sample_cross_entropy);
  ce.needs_offsets = true;
  ce.distribute = distribute_cross_entropy;
  ce.distribute_stats = 3;
  ce.index_bound = bound_cross_entropy;
  ce.vjp = vjp_cross_entropy;
  put(t, std::move(ce));

  OpDef cm = entry(OpKind::CausalMask, "causal_mask", 1, 1, infer_causal_mask, rule_unary,
                   flops_out, sample_causal_mask);
  cm.needs_offsets = true;
  cm.vjp = vjp_causal_mask;
  put(t, std::move(cm));
}

}  // namespace ops_detail

using ops_detail::build;
Tensor softmax(Tensor x, int64_t axis) {
  OpAttrs a;
  a.axis = axis;
  return build(OpKind::Softmax, {x}, std::move(a));
}
Tensor softmax_grad(Tensor y, Tensor dy, int64_t axis) {
  OpAttrs a;
  a.axis = axis;
  return build(OpKind::SoftmaxGrad, {y, dy}, std::move(a));
}
Tensor cross_entropy_grad(Tensor logits, Tensor labels, Tensor g) {
  return build(OpKind::CrossEntropyGrad, {logits, labels, g});
}
Tensor layer_norm(Tensor x, Tensor gamma, Tensor beta, double eps) {
  OpAttrs a;
  a.eps = eps;
  return build(OpKind::LayerNorm, {x, gamma, beta}, std::move(a));
}
LayerNormGrads layer_norm_grad(Tensor x, Tensor gamma, Tensor dy, double eps) {
  OpAttrs a;
  a.eps = eps;
  Graph& g = ops_detail::graph_of({x, gamma, dy});
  std::vector<Tensor> r = g.add_op_results(OpKind::LayerNormGrad, {x.id, gamma.id, dy.id}, std::move(a));
  return {r[0], r[1], r[2]};
}
Tensor embedding(Tensor table, Tensor ids) { return build(OpKind::Embedding, {table, ids}); }
Tensor cross_entropy(Tensor logits, Tensor labels) { return build(OpKind::CrossEntropy, {logits, labels}); }
Tensor causal_mask(Tensor x) { return build(OpKind::CausalMask, {x}); }

}  // namespace tessel
