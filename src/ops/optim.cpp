// src/ops/optim.cpp — registry entries of the optimizer ops: adamw, one fused AdamW step with
// three results (the parameter, and both moments), elementwise over the parameter's dims. One
// op per parameter instead of about twenty keeps the training step's graph small (compile
// time) and its update one pass over memory (run time).
#include <limits>

#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

std::vector<ResultType> infer_adamw(const OpAttrs& a, const Ins& in) {
  const Shape& p = in[0]->shape;
  for (int i = 1; i <= 3; ++i)
    if (in[static_cast<std::size_t>(i)]->shape != p)
      shape_fail("adamw", in, "g, m and v must have the parameter's shape");
  if (!is_float(in[0]->dtype) || !is_float(in[1]->dtype)) shape_fail("adamw", in, "needs a float parameter and gradient");
  if (in[2]->dtype != DType::f32 || in[3]->dtype != DType::f32) shape_fail("adamw", in, "the moments m and v must be f32");
  for (int i = 4; i <= 7; ++i)
    if (!in[static_cast<std::size_t>(i)]->shape.empty() || in[static_cast<std::size_t>(i)]->dtype != DType::f32)
      shape_fail("adamw", in, "lr, bc1, bc2 and gscale must be f32 scalars");
  auto unit = [](double x) { return x >= 0 && x < 1; };
  if (!unit(a.beta1) || !unit(a.beta2) || !(a.eps > 0) || !(a.weight_decay >= 0) ||
      a.eps == std::numeric_limits<double>::infinity() || a.weight_decay == std::numeric_limits<double>::infinity())
    shape_fail("adamw", in, fmt::format("needs 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0 (finite); got "
                                        "beta1={} beta2={} eps={} weight_decay={}", a.beta1, a.beta2, a.eps,
                                        a.weight_decay));
  return {{p, in[0]->dtype}, {p, DType::f32}, {p, DType::f32}};
}
// Elementwise over the parameter's dims for p, g, m, v and the three results; the scalars
// have none.
OpRule rule_adamw(const OpAttrs&, const Shapes&, const Shape& out) {
  OpRule r = identity_rule(out, 4);
  for (int i = 0; i < 4; ++i) r.operands.push_back({});
  r.extra_results = {r.result, r.result};
  return r;
}
double flops_adamw(const OpAttrs&, const Shapes& in, const Shape&) { return 16 * elems(in[0]); }
double bytes_adamw(const OpAttrs&, const Shapes& in, const std::vector<DType>& dts, const Shape&, DType) {
  const double n = elems(in[0]);
  return n * (2 * static_cast<double>(dtype_size(dts[0])) + static_cast<double>(dtype_size(dts[1])) + 4 * 4);
}
Tensor sample_adamw(Graph& g, SampleGen& r) {
  const Shape s = r.shape(r.rank());
  Tensor v = r.input(g, s);
  auto positive_scalar = [&]() { return positive(r.input(g, {})); };
  AdamWResults o = adamw(r.input(g, s), r.input(g, s), r.input(g, s), mul(v, v), r.input(g, {}), positive_scalar(),
                         positive_scalar(), positive_scalar(), 0.9, 0.999, 1e-8, r.coin() ? 0.01 : 0.0);
  g.mark_output(o.m);
  g.mark_output(o.v);
  return o.param;
}

}  // namespace

void register_optim_ops(std::vector<OpDef>& t) {
  OpDef a = entry(OpKind::AdamW, "adamw", 8, 8, nullptr, rule_adamw, flops_adamw, sample_adamw);
  a.attrs = {{"beta1", AttrField::Beta1}, {"beta2", AttrField::Beta2}, {"eps", AttrField::Eps},
             {"weight_decay", AttrField::WeightDecay, /*required=*/false, /*always_print=*/true}};
  a.num_results = 3;
  a.infer_results = infer_adamw;
  a.bytes = bytes_adamw;
  put(t, std::move(a));
}

}  // namespace ops_detail

AdamWResults adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lr, Tensor bc1, Tensor bc2, Tensor gscale,
                   double beta1, double beta2, double eps, double weight_decay) {
  OpAttrs a;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  Graph& graph = ops_detail::graph_of({p, g, m, v, lr, bc1, bc2, gscale});
  std::vector<Tensor> r = graph.add_op_results(OpKind::AdamW, {p.id, g.id, m.id, v.id, lr.id, bc1.id, bc2.id, gscale.id},
                                               std::move(a));
  return {r[0], r[1], r[2]};
}

}  // namespace tessel
