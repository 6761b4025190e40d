// src/ops/fused.cpp — registry entries of fused_elementwise and fused_softmax: a DAG of elementwise ops over its
// operands (tessel/ir/fused_expr.hpp), written by the fuse-elementwise Program pass and
// evaluated by one kernel in one pass over memory. Its shape function types every node with
// the op's own shape function; its rule is the elementwise one (operands broadcast against
// the result), so a fused op partitions like the chain it stands for. fused_softmax is a
// softmax of such an expression (which may end in causal_mask): the attention's scale + mask +
// softmax in one kernel. fused_einsum is an einsum whose product goes through such an expression
// (its epilogue: bias, GELU, residual, scale) before it is stored: the matmul's post-ops.
#include "op_helpers.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/ir/fused_expr.hpp"

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

// ---- fused_einsum: epilogue(einsum(a[, b]), extra operands...) ----
std::size_t einsum_arity(const OpAttrs& a, const Ins& in) {
  const int n = fused_einsum_operands(a.equation);
  if (n < 1 || n > 2 || static_cast<std::size_t>(n) > in.size())
    shape_fail("fused_einsum", in, fmt::format("equation '{}' names {} einsum operands; the op has {} operands "
                                               "(the einsum's one or two, then the epilogue's)",
                                               a.equation, n, in.size()));
  return static_cast<std::size_t>(n);
}
// The product's type (einsum's shape function on the einsum's operands) and the epilogue's
// typed over {product, the other operands}: it must keep the product's shape and dtype (the
// kernel applies it in place to the product it has just written).
void infer_fused_einsum(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const std::size_t n = einsum_arity(a, in);
  Value product;
  product.name = "product";
  op_def(OpKind::Einsum).infer(a, Ins(in.begin(), in.begin() + static_cast<long>(n)), product.shape, product.dtype);
  Ins ep{&product};
  ep.insert(ep.end(), in.begin() + static_cast<long>(n), in.end());
  FusedExpr e = parse_fused_expr(a.epilogue);
  ResultType r;
  try {
    r = type_fused_expr(e, ep);
  } catch (const ShapeError& err) {
    shape_fail("fused_einsum", in, fmt::format("epilogue {} ($0 is the product {}): {}", quote_text(a.epilogue),
                                               type_str(product.dtype, product.shape), err.what()));
  }
  if (!(r.shape == product.shape && r.dtype == product.dtype))
    shape_fail("fused_einsum", in, fmt::format("epilogue {} computes {} from the product {}; it must keep the "
                                               "product's shape and dtype",
                                               quote_text(a.epilogue), type_str(r.dtype, r.shape),
                                               type_str(product.dtype, product.shape)));
  out = r.shape;
  dt = r.dtype;
}
void normalize_fused_einsum(OpAttrs& a, const Ins&) { a.epilogue = print_fused_expr(parse_fused_expr(a.epilogue)); }
// The einsum's factors, with its summed letters replicated (the epilogue is not linear: it
// needs the whole sum, never a partial one); the epilogue's operands broadcast against the
// result, on the result's factors.
OpRule rule_fused_einsum(const OpAttrs& a, const Shapes& in, const Shape& out) {
  const std::size_t n = std::min<std::size_t>(in.size(), static_cast<std::size_t>(std::max(1, fused_einsum_operands(a.equation))));
  OpRule r = op_def(OpKind::Einsum).rule(a, Shapes(in.begin(), in.begin() + static_cast<long>(n)), out);
  for (Factor& f : r.factors)
    if (f.kind == FactorKind::Reduction) f.kind = FactorKind::Replicated;
  for (std::size_t i = n; i < in.size(); ++i) {
    std::vector<DimFactors> dims = broadcast_dims(in[i], out);
    for (DimFactors& d : dims)
      if (!d.empty()) d = r.result[static_cast<std::size_t>(d[0])];
    r.operands.push_back(std::move(dims));
  }
  return r;
}
double flops_fused_einsum(const OpAttrs& a, const Shapes& in, const Shape& out) {
  const std::size_t n = std::min<std::size_t>(in.size(), static_cast<std::size_t>(std::max(1, fused_einsum_operands(a.equation))));
  OpAttrs ep;
  ep.equation = a.epilogue;
  return op_def(OpKind::Einsum).flops(a, Shapes(in.begin(), in.begin() + static_cast<long>(n)), out) +
         flops_fused(ep, in, out);
}
// A matmul (with batch letters or without, an operand sometimes transposed) and one of the
// MLP's epilogues: bias, bias + GELU, residual, scale, and a chain of all four.
Tensor sample_fused_einsum(Graph& g, SampleGen& r) {
  const bool batch = r.coin(), trans = r.coin(0.3);
  const int64_t B = r.dim(), M = r.dim(), K = r.dim(), N = r.dim();
  const std::string eq = batch ? (trans ? "bmk,bnk->bmn" : "bmk,bkn->bmn") : (trans ? "mk,nk->mn" : "mk,kn->mn");
  Shape sa = batch ? Shape{B, M, K} : Shape{M, K};
  Shape sb = batch ? (trans ? Shape{B, N, K} : Shape{B, K, N}) : (trans ? Shape{N, K} : Shape{K, N});
  Shape so = batch ? Shape{B, M, N} : Shape{M, N};
  Tensor x = r.input(g, sa), w = r.input(g, sb);
  Tensor bias = r.input(g, {N}), res = r.input(g, so);
  switch (r.below(5)) {
    case 0: return fused_einsum(eq, {x, w, bias}, "add($0,$1)");
    case 1: return fused_einsum(eq, {x, w, bias}, "gelu(add($0,$1))");
    case 2: return fused_einsum(eq, {x, w, res}, "add($1,$0)");
    case 3: return fused_einsum(eq, {x, w}, "mul($0,0.125:f32[])");
    default: return fused_einsum(eq, {x, w, bias, res}, "add(mul(gelu(add($0,$1)),0.5:f32[]),$2)");
  }
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
  OpDef fe = entry(OpKind::FusedEinsum, "fused_einsum", 1, -1, infer_fused_einsum, rule_fused_einsum,
                   flops_fused_einsum, sample_fused_einsum);
  fe.attrs = {{"eq", AttrField::Equation}, {"epilogue", AttrField::Epilogue}};
  fe.normalize = normalize_fused_einsum;
  put(t, std::move(fe));
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

Tensor fused_einsum(const std::string& equation, const std::vector<Tensor>& operands, const std::string& epilogue) {
  OpAttrs a;
  a.equation = equation;
  a.epilogue = epilogue;
  if (operands.empty()) throw Error("fused_einsum: give the einsum's operands (and the epilogue's)");
  return ops_detail::build(OpKind::FusedEinsum, operands, std::move(a));
}

}  // namespace tessel
