// src/ops/reduction.cpp — registry entries of reduce_sum, reduce_max and reduce_mean over
// attrs.dims (sorted, >= 0 after normalisation), keepdims optional. A sharded reduced dim of
// a sum or mean makes the result partial (a sum over the axes); reduce_max needs the
// reduced dim whole.
#include <set>

#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

void normalize_reduce(OpAttrs& a, const Ins& in) {
  const std::size_t rank = in.empty() ? 0 : in[0]->shape.size();
  for (auto& d : a.dims) d = normalize_axis(d, rank, "reduce");
  std::sort(a.dims.begin(), a.dims.end());
}

void infer_reduce_any(const char* op, const OpAttrs& a, const Ins& in, Shape& out, DType& dt,
                      bool float_only) {
  std::set<int64_t> seen;
  for (int64_t d : a.dims) {
    if (d < 0 || d >= static_cast<int64_t>(in[0]->shape.size()))
      shape_fail(op, in, fmt::format("dim {} is out of range for rank {}", d, in[0]->shape.size()));
    if (!seen.insert(d).second) shape_fail(op, in, fmt::format("dim {} listed twice", d));
  }
  if (float_only && !is_float(in[0]->dtype))
    shape_fail(op, in, "needs a floating-point operand (the mean of integers is not an "
                       "integer); cast it to f32 first");
  out.clear();
  for (std::size_t d = 0; d < in[0]->shape.size(); ++d) {
    bool red = std::find(a.dims.begin(), a.dims.end(), static_cast<int64_t>(d)) != a.dims.end();
    if (!red) out.push_back(in[0]->shape[d]);
    else if (a.keepdims) out.push_back(1);
  }
  dt = in[0]->dtype;
}
void infer_sum(const OpAttrs& a, const Ins& in, Shape& o, DType& t) { infer_reduce_any("reduce_sum", a, in, o, t, false); }
void infer_max(const OpAttrs& a, const Ins& in, Shape& o, DType& t) { infer_reduce_any("reduce_max", a, in, o, t, false); }
void infer_mean(const OpAttrs& a, const Ins& in, Shape& o, DType& t) { infer_reduce_any("reduce_mean", a, in, o, t, true); }

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
OpRule rule_sum(const OpAttrs& a, const Shapes& in, const Shape&) {
  return rule_reduce_impl(a, in, FactorKind::Reduction);
}
OpRule rule_max(const OpAttrs& a, const Shapes& in, const Shape&) {
  return rule_reduce_impl(a, in, FactorKind::Combined);
}

// Split reduced dims: the local max of each block, then an all-reduce with max.
int distribute_max(const DistributeArgs& x) {
  const int m = local_reduce(x.emit, OpKind::ReduceMax, x.ins[0], x.attrs.dims, x.attrs.keepdims);
  return x.emit.all_reduce(m, ReduceOp::Max);
}

Tensor sample_reduce(Graph& g, SampleGen& r, OpKind k) {
  Shape s = r.shape(r.rank());
  OpAttrs a;
  for (std::size_t d = 0; d < s.size(); ++d)
    if (r.coin()) a.dims.push_back(static_cast<int64_t>(d));
  if (a.dims.empty()) a.dims.push_back(r.below(static_cast<int64_t>(s.size())));
  a.keepdims = r.coin();
  return build(k, {r.input(g, s)}, a);
}
Tensor sample_sum(Graph& g, SampleGen& r) { return sample_reduce(g, r, OpKind::ReduceSum); }
Tensor sample_max(Graph& g, SampleGen& r) { return sample_reduce(g, r, OpKind::ReduceMax); }
Tensor sample_mean(Graph& g, SampleGen& r) { return sample_reduce(g, r, OpKind::ReduceMean); }

OpDef reduction(OpKind k, const char* name, InferFn infer, RuleFn rule, PartialFlow pf, SampleFn s) {
  OpDef d = entry(k, name, 1, 1, infer, rule, flops_in, s);
  d.attrs = {{"dims", AttrField::Dims}, {"keepdims", AttrField::Keepdims, false, false}};
  d.normalize = normalize_reduce;
  d.partial_flow = pf;
  return d;
}

}  // namespace

namespace {
// The result's gradient in keepdims form, broadcast back over the reduced dims.
Tensor spread(const VjpArgs& a, const Tensor& t) {
  const Shape x = a.inputs[0].shape();  // a copy: the builders below grow the graph
  return broadcast_to(reshape(t, keep_shape(x, a.op.attrs.dims)), x);
}
std::vector<Tensor> vjp_sum(const VjpArgs& a) { return {spread(a, a.grad_output)}; }
// Divided by the global count of the reduced dims (the graph's shapes are global).
std::vector<Tensor> vjp_mean(const VjpArgs& a) {
  double n = 1;
  for (int64_t d : a.op.attrs.dims) n *= static_cast<double>(a.inputs[0].shape()[static_cast<std::size_t>(d)]);
  return {mul(spread(a, a.grad_output), scalar_like(a.grad_output, 1.0 / n))};
}
// Routed to the positions that attain the max, split equally among ties (as JAX).
std::vector<Tensor> vjp_max(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  Tensor hit = cast(eq(x, spread(a, a.output)), a.grad_output.dtype());
  Tensor count = reduce_sum(hit, a.op.attrs.dims, /*keepdims=*/true);
  return {mul(div(hit, count), spread(a, a.grad_output))};
}
}  // namespace

void register_reduction_ops(std::vector<OpDef>& t) {
  using PF = PartialFlow;
  put(t, with_vjp(reduction(OpKind::ReduceSum, "reduce_sum", infer_sum, rule_sum, PF::Multilinear, sample_sum), vjp_sum));
  OpDef mx = reduction(OpKind::ReduceMax, "reduce_max", infer_max, rule_max, PF::None, sample_max);
  mx.distribute = distribute_max;
  mx.distribute_stats = 1;
  mx.vjp = vjp_max;
  put(t, std::move(mx));
  put(t, with_vjp(reduction(OpKind::ReduceMean, "reduce_mean", infer_mean, rule_sum, PF::Multilinear, sample_mean), vjp_mean));
}

}  // namespace ops_detail

namespace {
Tensor reduce(OpKind k, Tensor x, std::vector<int64_t> dims, bool keepdims) {
  OpAttrs a;
  a.dims = std::move(dims);
  a.keepdims = keepdims;
  return ops_detail::build(k, {x}, std::move(a));
}
}  // namespace

Tensor reduce_sum(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceSum, x, std::move(d), k); }
Tensor reduce_max(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceMax, x, std::move(d), k); }
Tensor reduce_mean(Tensor x, std::vector<int64_t> d, bool k) { return reduce(OpKind::ReduceMean, x, std::move(d), k); }

}  // namespace tessel
