// src/ops/fused.cpp — registry entries of fused_elementwise and fused_softmax: a DAG of elementwise ops over its
// operands (tessel/fused_expr.hpp), written by the fuse-elementwise Program pass and
// evaluated by one kernel in one pass over memory. Its shape function types every node with
// the op's own shape function; its rule is the elementwise one (operands broadcast against
// the result), so a fused op partitions like the chain it stands for. fused_softmax is a
// softmax of such an expression (which may end in causal_mask): the attention's scale + mask +
// softmax in one kernel.
#include "op_helpers.hpp"
#include "tessel/fused_expr.hpp"

namespace tessel {
namespace ops_detail {
namespace {

// The expression text made canonical (print of parse): the graph and program text forms then
// print one spelling of an expression.
void normalize_fused(OpAttrs& a, const Ins&) { a.equation = print_fused_expr(parse_fused_expr(a.equation)); }

void infer_fused(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  FusedExpr e = parse_fused_expr(a.equation);
  const ResultType r = type_fused_expr(e, in);
  out = r.shape;
  dt = r.dtype;
}

// Transcendental ops count 4 flops per element as their unfused entries do; the rest 1.
double flops_fused(const OpAttrs& a, const Shapes&, const Shape& out) {
  double per = 0;
  for (const FusedNode& n : parse_fused_expr(a.equation).nodes)
    if (n.kind == FusedNode::Kind::Op)
      per += op_def(n.op).flops(OpAttrs{}, {Shape{}}, Shape{1});
  return per * elems(out);
}

// A random chain over two broadcast-compatible operands (the second sometimes of lower rank
// or with size-1 dims), from a handful of shapes of expression: bias + GELU, scale + residual,
// a shared node read twice, comparisons and where, a round trip through bf16.
Tensor sample_fused(Graph& g, SampleGen& r) {
  Shape a = r.shape(r.rank());
  Shape b = a;
  if (r.coin()) {
    b.erase(b.begin(), b.begin() + static_cast<long>(r.below(static_cast<int64_t>(a.size()))));
    for (auto& d : b)
      if (r.coin(0.3)) d = 1;
  }
  Tensor x = r.input(g, a), y = r.input(g, b);
  static const char* const kExprs[] = {
      "gelu(add($0,$1))",
      "add(mul($0,0.125:f32[]),$1)",
      "exp(neg($0));mul(#0,add(#0,$1))",
      "where(gt($0,$1),tanh($0),sub($1,-1.5:f32[1]))",
      "cast<f32>(cast<bf16>(max(sigmoid($0),silu($1))))",
      "div($0,add(exp($1),1:f32[]))",
  };
  const std::size_t k = static_cast<std::size_t>(r.below(std::size(kExprs)));
  return fused_elementwise({x, y}, kExprs[k]);
}

// ---- fused_softmax: softmax(expr(operands), axis) ----
// The expression's type, its causal_mask nodes allowed.
ResultType type_prologue(const OpAttrs& a, const Ins& in) {
  FusedExpr e = parse_fused_expr(a.equation);
  return type_fused_expr(e, in, /*positional=*/true);
}
void normalize_fused_softmax(OpAttrs& a, const Ins& in) {
  normalize_fused(a, in);
  a.axis = normalize_axis(a.axis, type_prologue(a, in).shape.size(), "fused_softmax");
}
void infer_fused_softmax(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const ResultType r = type_prologue(a, in);
  if (a.axis < 0 || a.axis >= static_cast<int64_t>(r.shape.size()))
    shape_fail("fused_softmax", in, fmt::format("axis {} is out of range for the expression's {}", a.axis,
                                                type_str(r.dtype, r.shape)));
  if (!is_float(r.dtype)) shape_fail("fused_softmax", in, "the expression must be of a floating-point type");
  out = r.shape;
  dt = r.dtype;
}
// Elementwise over the operands, but the softmax axis is needed whole: it is replicated (the
// pass only makes this op from a softmax whose axis is whole on the device).
OpRule rule_fused_softmax(const OpAttrs& a, const Shapes& in, const Shape& out) {
  OpRule r = rule_elementwise(a, in, out);
  r.factors[static_cast<std::size_t>(a.axis)].kind = FactorKind::Replicated;
  return r;
}
double flops_fused_softmax(const OpAttrs& a, const Shapes& in, const Shape& out) {
  return flops_fused(a, in, out) + 5 * elems(out);
}
// Scores [.., Q, K] scaled and causally masked, or a sum with a broadcast bias, along a
// random axis (the last for the masked form, as attention has it).
Tensor sample_fused_softmax(Graph& g, SampleGen& r) {
  Shape s = r.shape(1 + r.rank());
  Tensor x = r.input(g, s);
  if (r.coin()) return fused_softmax({x}, "causal_mask(mul($0,0.35:f32[]))", -1);
  const int64_t axis = r.below(static_cast<int64_t>(s.size()));
  Tensor b = r.input(g, Shape(s.begin() + 1, s.end()));
  return fused_softmax({x, b}, "add($0,$1)", axis);
}

}  // namespace

void register_fused_ops(std::vector<OpDef>& t) {
  OpDef d = entry(OpKind::FusedElementwise, "fused_elementwise", 0, -1, infer_fused, rule_elementwise,
                  flops_fused, sample_fused);
  d.attrs = {{"expr", AttrField::Equation}};
  d.normalize = normalize_fused;
  put(t, std::move(d));
  OpDef sm = entry(OpKind::FusedSoftmax, "fused_softmax", 0, -1, infer_fused_softmax, rule_fused_softmax,
                   flops_fused_softmax, sample_fused_softmax);
  sm.attrs = {{"expr", AttrField::Equation}, {"axis", AttrField::Axis}};
  sm.normalize = normalize_fused_softmax;
  sm.needs_offsets = true;  // causal_mask nodes read the result block's global position
  put(t, std::move(sm));
}

}  // namespace ops_detail

Tensor fused_elementwise(const std::vector<Tensor>& operands, const std::string& expr) {
  OpAttrs a;
  a.equation = expr;
  if (operands.empty()) throw Error("fused_elementwise: give at least one operand (a graph to add the op to)");
  return ops_detail::build(OpKind::FusedElementwise, operands, std::move(a));
}

Tensor fused_softmax(const std::vector<Tensor>& operands, const std::string& expr, int64_t axis) {
  OpAttrs a;
  a.equation = expr;
  a.axis = axis;
  if (operands.empty()) throw Error("fused_softmax: give at least one operand (a graph to add the op to)");
  return ops_detail::build(OpKind::FusedSoftmax, operands, std::move(a));
}

}  // namespace tessel
