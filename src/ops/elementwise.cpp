// src/ops/elementwise.cpp — registry entries of the elementwise ops: unary math and binary
// arithmetic with numpy broadcasting. One factor per result dim; a broadcast size-1 operand
// dim has no factor (it stays whole on every device).
#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

void infer_unary_any(const char* op, const Ins& in, Shape& out, DType& dt, bool float_only) {
  if (float_only && !is_float(in[0]->dtype))
    shape_fail(op, in, "needs a floating-point operand; got i32 (cast it first)");
  out = in[0]->shape;
  dt = in[0]->dtype;
}

// One shape function per op, so the error names the op.
#define TESSEL_UNARY_INFER(fn, opname, float_only)                                  \
  void fn(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {                    \
    infer_unary_any(opname, in, out, dt, float_only);                                \
  }
TESSEL_UNARY_INFER(infer_neg, "neg", false)
TESSEL_UNARY_INFER(infer_exp, "exp", true)
TESSEL_UNARY_INFER(infer_log, "log", true)
TESSEL_UNARY_INFER(infer_tanh, "tanh", true)
TESSEL_UNARY_INFER(infer_gelu, "gelu", true)
TESSEL_UNARY_INFER(infer_relu, "relu", false)
TESSEL_UNARY_INFER(infer_sqrt, "sqrt", true)
TESSEL_UNARY_INFER(infer_rsqrt, "rsqrt", true)
TESSEL_UNARY_INFER(infer_sigmoid, "sigmoid", true)
TESSEL_UNARY_INFER(infer_silu, "silu", true)
#undef TESSEL_UNARY_INFER

void infer_binary_any(const char* op, const Ins& in, Shape& out, DType& dt) {
  out = broadcast_shapes(op, in, in[0]->shape, in[1]->shape);
  dt = common_dtype(op, in);
}
#define TESSEL_BINARY_INFER(fn, opname) \
  void fn(const OpAttrs&, const Ins& in, Shape& out, DType& dt) { infer_binary_any(opname, in, out, dt); }
TESSEL_BINARY_INFER(infer_add, "add")
void infer_gelu_grad(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  infer_binary_any("gelu_grad", in, out, dt);
  if (!is_float(dt)) shape_fail("gelu_grad", in, "needs float operands");
}
TESSEL_BINARY_INFER(infer_sub, "sub")
TESSEL_BINARY_INFER(infer_mul, "mul")
TESSEL_BINARY_INFER(infer_div, "div")
TESSEL_BINARY_INFER(infer_max, "max")
#undef TESSEL_BINARY_INFER

// ---- cast ----
void infer_cast(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  const int d = static_cast<int>(a.dtype);
  if (d < 0 || d > static_cast<int>(DType::i32))
    shape_fail("cast", in, fmt::format("target dtype #{} is not a dtype of tessel", d));
  out = in[0]->shape;
  dt = a.dtype;
}

// ---- comparisons and where ----
void infer_compare_any(const char* op, const Ins& in, Shape& out, DType& dt) {
  out = broadcast_shapes(op, in, in[0]->shape, in[1]->shape);
  common_dtype(op, in);
  dt = DType::i32;
}
#define TESSEL_COMPARE_INFER(fn, opname) \
  void fn(const OpAttrs&, const Ins& in, Shape& out, DType& dt) { infer_compare_any(opname, in, out, dt); }
TESSEL_COMPARE_INFER(infer_eq, "eq")
TESSEL_COMPARE_INFER(infer_ne, "ne")
TESSEL_COMPARE_INFER(infer_lt, "lt")
TESSEL_COMPARE_INFER(infer_le, "le")
TESSEL_COMPARE_INFER(infer_gt, "gt")
TESSEL_COMPARE_INFER(infer_ge, "ge")
#undef TESSEL_COMPARE_INFER

void infer_where(const OpAttrs&, const Ins& in, Shape& out, DType& dt) {
  if (in[0]->dtype != DType::i32)
    shape_fail("where", in, "the condition must be i32 (a comparison's result, or 0/1 values)");
  const Shape ab = broadcast_shapes("where", in, in[1]->shape, in[2]->shape);
  out = broadcast_shapes("where", in, in[0]->shape, ab);
  if (in[1]->dtype != in[2]->dtype)
    shape_fail("where", in, fmt::format("the two branches must have the same dtype ({} vs {}); "
                                        "insert a cast", dtype_name(in[1]->dtype),
                                        dtype_name(in[2]->dtype)));
  dt = in[1]->dtype;
}

// x of a random shape; positive for ops defined on positives only.
Tensor sample_unary_of(Graph& g, SampleGen& r, OpKind k, bool positive_only) {
  Tensor x = r.input(g, r.shape(r.rank()));
  if (positive_only) x = positive(x);
  return build(k, {x});
}
Tensor sample_neg(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Neg, false); }
Tensor sample_exp(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Exp, false); }
Tensor sample_log(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Log, true); }
Tensor sample_tanh(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Tanh, false); }
Tensor sample_gelu(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Gelu, false); }
Tensor sample_relu(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Relu, false); }
Tensor sample_sqrt(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Sqrt, true); }
Tensor sample_rsqrt(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Rsqrt, true); }
Tensor sample_sigmoid(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Sigmoid, false); }
Tensor sample_silu(Graph& g, SampleGen& r) { return sample_unary_of(g, r, OpKind::Silu, false); }

// Two operands of broadcast-compatible random shapes (some leading dims dropped, some set to
// 1), in a random order; the second positive for div.
std::pair<Tensor, Tensor> sample_binary_operands(Graph& g, SampleGen& r, bool positive_rhs) {
  Shape a = r.shape(r.rank());
  Shape b = a;
  if (r.coin()) {
    std::size_t drop = static_cast<std::size_t>(r.below(static_cast<int64_t>(a.size()) + 1));
    b.erase(b.begin(), b.begin() + static_cast<long>(drop));
    for (auto& d : b)
      if (r.coin(0.3)) d = 1;
  }
  Tensor ta = r.input(g, a), tb = r.input(g, b);
  if (r.coin(0.3)) std::swap(ta, tb);
  if (positive_rhs) tb = positive(tb);
  return {ta, tb};
}
Tensor sample_binary_of(Graph& g, SampleGen& r, OpKind k) {
  auto [a, b] = sample_binary_operands(g, r, k == OpKind::Div);
  return build(k, {a, b});
}
Tensor sample_add(Graph& g, SampleGen& r) { return sample_binary_of(g, r, OpKind::Add); }
Tensor sample_sub(Graph& g, SampleGen& r) { return sample_binary_of(g, r, OpKind::Sub); }
Tensor sample_mul(Graph& g, SampleGen& r) { return sample_binary_of(g, r, OpKind::Mul); }
Tensor sample_div(Graph& g, SampleGen& r) { return sample_binary_of(g, r, OpKind::Div); }
Tensor sample_max(Graph& g, SampleGen& r) { return sample_binary_of(g, r, OpKind::Max); }

Tensor sample_cast(Graph& g, SampleGen& r) {
  // f32 -> {bf16, f16, i32} and back; scaled so the i32 cast sees values beyond +-1.
  Tensor x = mul(r.input(g, r.shape(r.rank())), 40.0);
  const DType to = static_cast<DType>(1 + r.below(3));
  Tensor y = cast(x, to);
  return r.coin() ? cast(y, DType::f32) : y;
}

Tensor sample_compare(Graph& g, SampleGen& r, OpKind k) {
  auto [a, b] = sample_binary_operands(g, r, false);
  return build(k, {a, b});
}
Tensor sample_eq(Graph& g, SampleGen& r) {
  // Equality of floats drawn at random is almost never true: compare a value with itself too.
  auto [a, b] = sample_binary_operands(g, r, false);
  return r.coin() ? eq(a, a) : eq(a, b);
}
Tensor sample_ne(Graph& g, SampleGen& r) { return sample_compare(g, r, OpKind::Ne); }
Tensor sample_lt(Graph& g, SampleGen& r) { return sample_compare(g, r, OpKind::Lt); }
Tensor sample_le(Graph& g, SampleGen& r) { return sample_compare(g, r, OpKind::Le); }
Tensor sample_gt(Graph& g, SampleGen& r) { return sample_compare(g, r, OpKind::Gt); }
Tensor sample_ge(Graph& g, SampleGen& r) { return sample_compare(g, r, OpKind::Ge); }

Tensor sample_where(Graph& g, SampleGen& r) {
  auto [a, b] = sample_binary_operands(g, r, false);
  Tensor c = r.coin() ? gt(a, b) : lt(r.input(g, a.shape()), constant(g, 0.0));
  return where(c, a, b);
}

// ---- vector-Jacobian products: x the operand(s), z the result, gz its gradient ----
using Grads = std::vector<Tensor>;
Grads vjp_neg(const VjpArgs& a) { return {neg(a.grad_output)}; }
Grads vjp_exp(const VjpArgs& a) { return {mul(a.grad_output, a.output)}; }
Grads vjp_log(const VjpArgs& a) { return {div(a.grad_output, a.inputs[0])}; }
Grads vjp_tanh(const VjpArgs& a) {
  const Tensor& z = a.output;
  return {mul(a.grad_output, sub(scalar_like(z, 1.0), mul(z, z)))};
}
// One fused op (gelu_grad): g * gelu'(x) in one pass over memory.
Grads vjp_gelu(const VjpArgs& a) { return {gelu_grad(a.inputs[0], a.grad_output)}; }
Tensor sample_gelu_grad(Graph& g, SampleGen& r) {
  auto [x, gr] = sample_binary_operands(g, r, false);
  return gelu_grad(x, gr);
}
Grads vjp_relu(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  return {where(gt(x, scalar_like(x, 0.0)), a.grad_output, scalar_like(a.grad_output, 0.0))};
}
Grads vjp_sqrt(const VjpArgs& a) { return {div(a.grad_output, mul(a.output, scalar_like(a.output, 2.0)))}; }
Grads vjp_rsqrt(const VjpArgs& a) {
  const Tensor& z = a.output;
  return {mul(a.grad_output, mul(mul(mul(z, z), z), scalar_like(z, -0.5)))};
}
Grads vjp_sigmoid(const VjpArgs& a) {
  const Tensor& z = a.output;
  return {mul(a.grad_output, mul(z, sub(scalar_like(z, 1.0), z)))};
}
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
Grads vjp_silu(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  Tensor s = sigmoid(x);
  return {mul(a.grad_output, mul(s, add(scalar_like(x, 1.0), mul(x, sub(scalar_like(x, 1.0), s)))))};
}
Grads vjp_cast(const VjpArgs& a) { return {cast(a.grad_output, a.inputs[0].dtype())}; }
Grads vjp_where(const VjpArgs& a) {
  const Tensor& gz = a.grad_output;
  Tensor zero = scalar_like(gz, 0.0);
  return {Tensor{}, unbroadcast(where(a.inputs[0], gz, zero), a.inputs[1].shape()),
          unbroadcast(where(a.inputs[0], zero, gz), a.inputs[2].shape())};
}
Grads vjp_add(const VjpArgs& a) {
  return {unbroadcast(a.grad_output, a.inputs[0].shape()), unbroadcast(a.grad_output, a.inputs[1].shape())};
}
Grads vjp_sub(const VjpArgs& a) {
  return {unbroadcast(a.grad_output, a.inputs[0].shape()), unbroadcast(neg(a.grad_output), a.inputs[1].shape())};
}
Grads vjp_mul(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  return {unbroadcast(mul(a.grad_output, y), x.shape()), unbroadcast(mul(a.grad_output, x), y.shape())};
}
Grads vjp_div(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  return {unbroadcast(div(a.grad_output, y), x.shape()),
          unbroadcast(neg(div(mul(a.grad_output, a.output), y)), y.shape())};
}
// The larger operand gets the gradient; a tie splits it equally (as JAX).
Grads vjp_max(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1], &gz = a.grad_output;
  Tensor w = where(gt(x, y), scalar_like(gz, 1.0), where(eq(x, y), scalar_like(gz, 0.5), scalar_like(gz, 0.0)));
  return {unbroadcast(mul(gz, w), x.shape()), unbroadcast(mul(gz, sub(scalar_like(gz, 1.0), w)), y.shape())};
}

OpDef unary(OpKind k, const char* name, InferFn infer, FlopsFn flops, PartialFlow pf, SampleFn s) {
  OpDef d = entry(k, name, 1, 1, infer, rule_unary, flops, s);
  d.partial_flow = pf;
  return d;
}

OpDef binary(OpKind k, const char* name, InferFn infer, PartialFlow pf, SampleFn s) {
  OpDef d = entry(k, name, 2, 2, infer, rule_elementwise, flops_out, s);
  d.partial_flow = pf;
  return d;
}

}  // namespace

void register_elementwise_ops(std::vector<OpDef>& t) {
  using PF = PartialFlow;
  put(t, with_vjp(unary(OpKind::Neg, "neg", infer_neg, flops_out, PF::Multilinear, sample_neg), vjp_neg));
  put(t, with_vjp(unary(OpKind::Exp, "exp", infer_exp, flops_out4, PF::None, sample_exp), vjp_exp));
  put(t, with_vjp(unary(OpKind::Log, "log", infer_log, flops_out4, PF::None, sample_log), vjp_log));
  put(t, with_vjp(unary(OpKind::Tanh, "tanh", infer_tanh, flops_out4, PF::None, sample_tanh), vjp_tanh));
  put(t, with_vjp(unary(OpKind::Gelu, "gelu", infer_gelu, flops_out4, PF::None, sample_gelu), vjp_gelu));
  put(t, with_vjp(unary(OpKind::Relu, "relu", infer_relu, flops_out, PF::None, sample_relu), vjp_relu));
  put(t, with_vjp(unary(OpKind::Sqrt, "sqrt", infer_sqrt, flops_out4, PF::None, sample_sqrt), vjp_sqrt));
  put(t, with_vjp(unary(OpKind::Rsqrt, "rsqrt", infer_rsqrt, flops_out4, PF::None, sample_rsqrt), vjp_rsqrt));
  put(t, with_vjp(unary(OpKind::Sigmoid, "sigmoid", infer_sigmoid, flops_out4, PF::None, sample_sigmoid), vjp_sigmoid));
  put(t, with_vjp(unary(OpKind::Silu, "silu", infer_silu, flops_out4, PF::None, sample_silu), vjp_silu));
  OpDef c = entry(OpKind::Cast, "cast", 1, 1, infer_cast, rule_unary, flops_out, sample_cast);
  c.attrs = {{"dtype", AttrField::DType}};
  c.vjp = vjp_cast;
  put(t, std::move(c));
  put(t, binary(OpKind::Eq, "eq", infer_eq, PF::None, sample_eq));
  put(t, binary(OpKind::Ne, "ne", infer_ne, PF::None, sample_ne));
  put(t, binary(OpKind::Lt, "lt", infer_lt, PF::None, sample_lt));
  put(t, binary(OpKind::Le, "le", infer_le, PF::None, sample_le));
  put(t, binary(OpKind::Gt, "gt", infer_gt, PF::None, sample_gt));
  put(t, binary(OpKind::Ge, "ge", infer_ge, PF::None, sample_ge));
  put(t, with_vjp(entry(OpKind::Where, "where", 3, 3, infer_where, rule_elementwise, flops_out, sample_where), vjp_where));
  put(t, with_vjp(binary(OpKind::Add, "add", infer_add, PF::Additive, sample_add), vjp_add));
  put(t, with_vjp(binary(OpKind::Sub, "sub", infer_sub, PF::Additive, sample_sub), vjp_sub));
  put(t, with_vjp(binary(OpKind::Mul, "mul", infer_mul, PF::Multilinear, sample_mul), vjp_mul));
  put(t, with_vjp(binary(OpKind::Div, "div", infer_div, PF::None, sample_div), vjp_div));
  put(t, with_vjp(binary(OpKind::Max, "max", infer_max, PF::None, sample_max), vjp_max));
  OpDef gg = binary(OpKind::GeluGrad, "gelu_grad", infer_gelu_grad, PF::None, sample_gelu_grad);
  gg.flops = flops_out4;
  put(t, std::move(gg));
}

}  // namespace ops_detail

using ops_detail::build;
Tensor neg(Tensor x) { return build(OpKind::Neg, {x}); }
Tensor exp(Tensor x) { return build(OpKind::Exp, {x}); }
Tensor log(Tensor x) { return build(OpKind::Log, {x}); }
Tensor tanh(Tensor x) { return build(OpKind::Tanh, {x}); }
Tensor gelu(Tensor x) { return build(OpKind::Gelu, {x}); }
Tensor relu(Tensor x) { return build(OpKind::Relu, {x}); }
Tensor sqrt(Tensor x) { return build(OpKind::Sqrt, {x}); }
Tensor rsqrt(Tensor x) { return build(OpKind::Rsqrt, {x}); }
Tensor sigmoid(Tensor x) { return build(OpKind::Sigmoid, {x}); }
Tensor silu(Tensor x) { return build(OpKind::Silu, {x}); }
Tensor cast(Tensor x, DType dtype) {
  OpAttrs a;
  a.dtype = dtype;
  return build(OpKind::Cast, {x}, std::move(a));
}
Tensor eq(Tensor a, Tensor b) { return build(OpKind::Eq, {a, b}); }
Tensor ne(Tensor a, Tensor b) { return build(OpKind::Ne, {a, b}); }
Tensor lt(Tensor a, Tensor b) { return build(OpKind::Lt, {a, b}); }
Tensor le(Tensor a, Tensor b) { return build(OpKind::Le, {a, b}); }
Tensor gt(Tensor a, Tensor b) { return build(OpKind::Gt, {a, b}); }
Tensor ge(Tensor a, Tensor b) { return build(OpKind::Ge, {a, b}); }
Tensor where(Tensor cond, Tensor a, Tensor b) { return build(OpKind::Where, {cond, a, b}); }
Tensor add(Tensor a, Tensor b) { return build(OpKind::Add, {a, b}); }
Tensor sub(Tensor a, Tensor b) { return build(OpKind::Sub, {a, b}); }
Tensor mul(Tensor a, Tensor b) { return build(OpKind::Mul, {a, b}); }
Tensor gelu_grad(Tensor x, Tensor g) { return build(OpKind::GeluGrad, {x, g}); }
Tensor div(Tensor a, Tensor b) { return build(OpKind::Div, {a, b}); }
Tensor maximum(Tensor a, Tensor b) { return build(OpKind::Max, {a, b}); }
Tensor add(Tensor a, double b) { return add(a, constant(ops_detail::graph_of(a), b, a.dtype())); }
Tensor mul(Tensor a, double b) { return mul(a, constant(ops_detail::graph_of(a), b, a.dtype())); }
Tensor operator+(Tensor a, Tensor b) { return add(a, b); }
Tensor operator-(Tensor a, Tensor b) { return sub(a, b); }
Tensor operator*(Tensor a, Tensor b) { return mul(a, b); }
Tensor operator/(Tensor a, Tensor b) { return div(a, b); }
Tensor operator*(Tensor a, double b) { return mul(a, b); }
Tensor operator+(Tensor a, double b) { return add(a, b); }

}  // namespace tessel
