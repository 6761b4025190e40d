// src/ops/optim.cpp — registry entries of the optimizer ops: adamw, one fused AdamW step with
// three results (the parameter, and both moments), elementwise over the parameter's dims. One
// op per parameter instead of about twenty keeps the training step's graph small (compile
// time) and its update one pass over memory (run time).
#include <limits>

#include "tessel/ops/builders.hpp"
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
  for (std::size_t i = 4; i < in.size(); ++i)
    if (!in[i]->shape.empty() || in[i]->dtype != DType::f32)
      shape_fail("adamw", in, "lr, bc1, bc2, gscale (and apply) must be f32 scalars");
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
OpRule rule_adamw(const OpAttrs&, const Shapes& in, const Shape& out) {
  OpRule r = identity_rule(out, 4);
  for (std::size_t i = 4; i < in.size(); ++i) r.operands.push_back({});
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
  // Half the samples with `apply` (1 or 0: update or keep).
  Tensor apply = r.coin() ? constant(g, r.coin() ? 1.0 : 0.0) : Tensor{};
  AdamWResults o = adamw(r.input(g, s), r.input(g, s), r.input(g, s), mul(v, v), r.input(g, {}), positive_scalar(),
                         positive_scalar(), positive_scalar(), 0.9, 0.999, 1e-8, r.coin() ? 0.01 : 0.0, apply);
  g.mark_output(o.m);
  g.mark_output(o.v);
  return o.param;
}

}  // namespace

void register_optim_ops(std::vector<OpDef>& t) {
  OpDef a = entry(OpKind::AdamW, "adamw", 8, 9, nullptr, rule_adamw, flops_adamw, sample_adamw);
  a.attrs = {{"beta1", AttrField::Beta1}, {"beta2", AttrField::Beta2}, {"eps", AttrField::Eps},
             {"weight_decay", AttrField::WeightDecay, /*required=*/false, /*always_print=*/true}};
  a.num_results = 3;
  a.infer_results = infer_adamw;
  a.bytes = bytes_adamw;
  put(t, std::move(a));
}

}  // namespace ops_detail

AdamWResults adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor lr, Tensor bc1, Tensor bc2, Tensor gscale,
                   double beta1, double beta2, double eps, double weight_decay, Tensor apply) {
  OpAttrs a;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  std::vector<Tensor> operands = {p, g, m, v, lr, bc1, bc2, gscale};
  if (apply.anchor) operands.push_back(apply);
  Graph& graph = ops_detail::graph_of(operands);
  std::vector<int> ids;
  for (const Tensor& t : operands) ids.push_back(t.id);
  std::vector<Tensor> r = graph.add_op_results(OpKind::AdamW, std::move(ids), std::move(a));
  return {r[0], r[1], r[2]};
}

}  // namespace tessel
