// src/ops/attention.cpp — registry entries of fused attention: `attention` (q, k, v) ->
// (out, lse), softmax(scale q kᵀ [+ causal mask]) v in one op whose kernels never write the
// [seq, seq] scores (FlashAttention's tiled online softmax), and its backward `attention_grad`
// (q, k, v, out, lse, dout) -> (dq, dk, dv), which recomputes the scores tile by tile from q, k
// and the saved row statistics lse (FlashAttention-2's backward). docs/attention.md.
//
// Layouts: attrs.equation holds "bhsd" ([batch, heads, seq, head_dim], the default) or "bshd"
// ([batch, seq, heads, head_dim], what the GPT model's projections produce, so no head split or
// merge copy is needed). q is [.., Sq, ..], k and v [.., Sk, ..]; the same batch, heads and
// head_dim. Causal masking is aligned to the end (FlashAttention >= 2.1): query i sees keys
// j <= i + (Sk - Sq), so Sq == Sk is the usual mask and Sq < Sk a query block after a cache.
//
// Sharding: batch and heads are free (Pass factors: attention is independent per batch row and
// head); the sequences and the head dim are Replicated (a split sequence would need the ring
// form, which does not exist yet; a split head dim would need partial scores inside the
// softmax). The partitioner gathers a value split along them (a sequence-parallel layout
// gathered for attention, as Megatron's), and Program::warnings says so for an annotation
// (compiler/checks.cpp).
#include <cmath>
#include <limits>

#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

// Dim positions of one layout.
struct AttnDims {
  int b, h, s, d;
};
AttnDims attn_dims(const std::string& layout) {
  if (layout == "bshd") return {0, 2, 1, 3};
  return {0, 1, 2, 3};  // "bhsd"
}

void normalize_attention(OpAttrs& a, const Ins& in) {
  if (a.equation.empty()) a.equation = "bhsd";
  if (a.equation != "bhsd" && a.equation != "bshd")
    shape_fail("attention", in, fmt::format("layout \"{}\" is not one of \"bhsd\" ([batch, heads, seq, "
                                            "head_dim]) or \"bshd\" ([batch, seq, heads, head_dim])", a.equation));
  if (a.scalar == 0 && !in.empty() && in[0]->shape.size() == 4) {
    const int64_t d = in[0]->shape[static_cast<std::size_t>(attn_dims(a.equation).d)];
    if (d > 0) a.scalar = 1.0 / std::sqrt(static_cast<double>(d));
  }
}

// Checks q, k, v (and for the backward o, lse, do) and returns (B, H, Sq, Sk, D).
struct AttnSizes {
  int64_t B, H, Sq, Sk, D;
};
AttnSizes check_qkv(const char* op, const OpAttrs& a, const Ins& in) {
  for (int i = 0; i < 3; ++i)
    if (in[static_cast<std::size_t>(i)]->shape.size() != 4)
      shape_fail(op, in, fmt::format("q, k and v must have rank 4 ({} layout: {}); operand {} has rank {}",
                                     a.equation, a.equation == "bshd" ? "[batch, seq, heads, head_dim]"
                                                                      : "[batch, heads, seq, head_dim]",
                                     i, in[static_cast<std::size_t>(i)]->shape.size()));
  const DType t = in[0]->dtype;
  if (!is_float(t)) shape_fail(op, in, "needs floating-point q, k and v");
  if (in[1]->dtype != t || in[2]->dtype != t) shape_fail(op, in, "q, k and v must have one dtype; insert a cast");
  const AttnDims x = attn_dims(a.equation);
  const Shape &q = in[0]->shape, &k = in[1]->shape, &v = in[2]->shape;
  auto at = [](const Shape& s, int d) { return s[static_cast<std::size_t>(d)]; };
  if (k != v) shape_fail(op, in, "k and v must have one shape");
  if (at(q, x.b) != at(k, x.b) || at(q, x.h) != at(k, x.h) || at(q, x.d) != at(k, x.d))
    shape_fail(op, in, fmt::format("q and k must agree on batch, heads and head_dim (layout \"{}\")", a.equation));
  AttnSizes s{at(q, x.b), at(q, x.h), at(q, x.s), at(k, x.s), at(q, x.d)};
  if (a.causal && s.Sq > s.Sk)
    shape_fail(op, in, fmt::format("causal attention needs at least as many keys as queries ({} queries, {} keys): "
                                   "query i sees keys j <= i + Sk - Sq", s.Sq, s.Sk));
  if (!std::isfinite(a.scalar) || a.scalar == 0)
    shape_fail(op, in, fmt::format("scale={} must be a finite non-zero number", a.scalar));
  return s;
}

std::vector<ResultType> infer_attention(const OpAttrs& a, const Ins& in) {
  const AttnSizes s = check_qkv("attention", a, in);
  return {{in[0]->shape, in[0]->dtype}, {{s.B, s.H, s.Sq}, DType::f32}};
}

std::vector<ResultType> infer_attention_grad(const OpAttrs& a, const Ins& in) {
  const AttnSizes s = check_qkv("attention_grad", a, in);
  if (in[3]->shape != in[0]->shape || in[3]->dtype != in[0]->dtype)
    shape_fail("attention_grad", in, "out (attention's result) must have q's type");
  if (in[4]->shape != Shape{s.B, s.H, s.Sq} || in[4]->dtype != DType::f32)
    shape_fail("attention_grad", in, fmt::format("lse (attention's row statistics) must be f32[{},{},{}]", s.B, s.H, s.Sq));
  if (in[5]->shape != in[0]->shape || in[5]->dtype != in[0]->dtype)
    shape_fail("attention_grad", in, "dout (the gradient of attention's result) must have q's type");
  return {{in[0]->shape, in[0]->dtype}, {in[1]->shape, in[1]->dtype}, {in[2]->shape, in[2]->dtype}};
}

// Factors b, h (Pass), q, s, d (Replicated); a value's dims placed by the layout.
OpRule attention_rule(const OpAttrs& a, const Shapes& in, bool backward) {
  const AttnDims x = attn_dims(a.equation);
  auto at = [](const Shape& s, int d) { return s[static_cast<std::size_t>(d)]; };
  const Shape& q = in[0];
  const Shape& k = in[1];
  OpRule r;
  r.factors = {{"b", at(q, x.b), FactorKind::Pass},
               {"h", at(q, x.h), FactorKind::Pass},
               {"q", at(q, x.s), FactorKind::Replicated},
               {"s", at(k, x.s), FactorKind::Replicated},
               {"d", at(q, x.d), FactorKind::Replicated}};
  auto dims = [&](int seq_factor) {
    std::vector<DimFactors> v(4);
    v[static_cast<std::size_t>(x.b)] = {0};
    v[static_cast<std::size_t>(x.h)] = {1};
    v[static_cast<std::size_t>(x.s)] = {seq_factor};
    v[static_cast<std::size_t>(x.d)] = {4};
    return v;
  };
  const std::vector<DimFactors> qd = dims(2), kd = dims(3), stats = {{0}, {1}, {2}};
  r.operands = {qd, kd, kd};
  if (!backward) {
    r.result = qd;
    r.extra_results = {stats};
  } else {
    r.operands.push_back(qd);     // out
    r.operands.push_back(stats);  // lse
    r.operands.push_back(qd);     // dout
    r.result = qd;
    r.extra_results = {kd, kd};
  }
  return r;
}
OpRule rule_attention(const OpAttrs& a, const Shapes& in, const Shape&) { return attention_rule(a, in, false); }
OpRule rule_attention_grad(const OpAttrs& a, const Shapes& in, const Shape&) { return attention_rule(a, in, true); }

// (query, key) pairs the mask keeps, per batch row and head.
double kept_pairs(const OpAttrs& a, int64_t Sq, int64_t Sk) {
  if (!a.causal) return static_cast<double>(Sq) * static_cast<double>(Sk);
  // query i sees min(Sk, i + 1 + Sk - Sq) keys; Sq <= Sk, so all Sq rows see i + 1 + Sk - Sq.
  const double off = static_cast<double>(Sk - Sq);
  return static_cast<double>(Sq) * (static_cast<double>(Sq) + 1) / 2 + static_cast<double>(Sq) * off;
}
double pairs_of(const OpAttrs& a, const Shapes& in) {
  const AttnDims x = attn_dims(a.equation);
  const Shape &q = in[0], &k = in[1];
  auto at = [](const Shape& s, int d) { return static_cast<double>(s[static_cast<std::size_t>(d)]); };
  return at(q, x.b) * at(q, x.h) * at(q, x.d) *
         kept_pairs(a, q[static_cast<std::size_t>(x.s)], k[static_cast<std::size_t>(x.s)]);
}
// Two products (q kᵀ and p v) over the kept pairs: 4 flops per pair and head-dim element,
// the causal-counted figure FlashAttention reports.
double flops_attention(const OpAttrs& a, const Shapes& in, const Shape&) { return 4 * pairs_of(a, in); }
// Five products (the scores again, dv, dp, dq, dk): 2.5x the forward.
double flops_attention_grad(const OpAttrs& a, const Shapes& in, const Shape&) { return 10 * pairs_of(a, in); }

double bytes_of(const Shapes& in, const std::vector<DType>& dts, std::size_t i) {
  return elems(in[i]) * static_cast<double>(dtype_size(dts[i]));
}
// Reads q, k, v once; writes out and the f32 row statistics.
double bytes_attention(const OpAttrs&, const Shapes& in, const std::vector<DType>& dts, const Shape& out, DType dt) {
  const double stats = elems(in[0]) / static_cast<double>(in[0].back()) * 4;
  return bytes_of(in, dts, 0) + bytes_of(in, dts, 1) + bytes_of(in, dts, 2) +
         elems(out) * static_cast<double>(dtype_size(dt)) + stats;
}
// Reads every operand once; writes dq, dk, dv.
double bytes_attention_grad(const OpAttrs&, const Shapes& in, const std::vector<DType>& dts, const Shape&, DType) {
  double b = 0;
  for (std::size_t i = 0; i < in.size(); ++i) b += bytes_of(in, dts, i);
  return b + bytes_of(in, dts, 0) + 2 * bytes_of(in, dts, 1);
}

// Random layout, sizes, mask and (sometimes) more keys than queries.
struct AttnSample {
  Tensor q, k, v;
  OpAttrs attrs;
};
AttnSample draw_attention(Graph& g, SampleGen& r) {
  const bool bshd = r.coin();
  const int64_t B = r.pick({1, 2, 4}), H = r.pick({1, 2, 4}), Sq = r.pick({1, 4, 6, 8, 12}), D = r.pick({2, 4, 8});
  const int64_t Sk = Sq + (r.coin(0.3) ? r.pick({1, 3, 8}) : 0);
  auto shape = [&](int64_t s) { return bshd ? Shape{B, s, H, D} : Shape{B, H, s, D}; };
  AttnSample x;
  x.q = r.input(g, shape(Sq));
  x.k = r.input(g, shape(Sk));
  x.v = r.input(g, shape(Sk));
  x.attrs.equation = bshd ? "bshd" : "bhsd";
  x.attrs.causal = r.coin();
  x.attrs.scalar = r.coin() ? 0.0 : 0.3;
  return x;
}
Tensor sample_attention(Graph& g, SampleGen& r) {
  AttnSample x = draw_attention(g, r);
  AttentionResults o = attention(x.q, x.k, x.v, x.attrs.causal, x.attrs.scalar, x.attrs.equation);
  g.mark_output(o.lse);
  return o.out;
}
Tensor sample_attention_grad(Graph& g, SampleGen& r) {
  AttnSample x = draw_attention(g, r);
  AttentionResults o = attention(x.q, x.k, x.v, x.attrs.causal, x.attrs.scalar, x.attrs.equation);
  Tensor dout = r.input(g, x.q.shape());
  AttentionGrads d = attention_grad(x.q, x.k, x.v, o.out, o.lse, dout, x.attrs.causal, x.attrs.scalar,
                                    x.attrs.equation);
  g.mark_output(d.dk);
  g.mark_output(d.dv);
  return d.dq;
}

// The flash backward: one op recomputes the scores from q, k and lse. The gradient of lse is
// not supported (nothing in tessel reads lse but attention_grad).
std::vector<Tensor> vjp_attention(const VjpArgs& a) {
  if (a.grad_outputs.size() > 1 && a.grad_outputs[1].anchor)
    throw Error(fmt::format("grad: the gradient reaches attention's row statistics %{} (its second result); "
                            "attention's vector-Jacobian product covers its first result only",
                            a.outputs.at(1).name()));
  Tensor dout = a.grad_output;
  if (!dout.anchor) {
    dout = scalar_like(a.output, 0.0);
    dout = broadcast_to(dout, a.output.shape());
  }
  const OpAttrs& at = a.op.attrs;
  AttentionGrads d = attention_grad(a.inputs[0], a.inputs[1], a.inputs[2], a.output, a.outputs.at(1), dout,
                                    at.causal, at.scalar, at.equation);
  return {d.dq, d.dk, d.dv};
}

}  // namespace

void register_attention_ops(std::vector<OpDef>& t) {
  const std::vector<AttrSpec> attrs = {{"layout", AttrField::Equation},
                                       {"causal", AttrField::Causal},
                                       {"scale", AttrField::Scalar}};
  OpDef at = entry(OpKind::Attention, "attention", 3, 3, nullptr, rule_attention, flops_attention, sample_attention);
  at.attrs = attrs;
  at.normalize = normalize_attention;
  at.num_results = 2;
  at.infer_results = infer_attention;
  at.bytes = bytes_attention;
  at.vjp = vjp_attention;
  put(t, std::move(at));

  OpDef ag = entry(OpKind::AttentionGrad, "attention_grad", 6, 6, nullptr, rule_attention_grad, flops_attention_grad,
                   sample_attention_grad);
  ag.attrs = attrs;
  ag.normalize = normalize_attention;
  ag.num_results = 3;
  ag.infer_results = infer_attention_grad;
  ag.bytes = bytes_attention_grad;
  put(t, std::move(ag));
}

}  // namespace ops_detail

namespace {
OpAttrs attention_attrs(bool causal, double scale, const std::string& layout) {
  OpAttrs a;
  a.causal = causal;
  a.scalar = scale;
  a.equation = layout;
  return a;
}
}  // namespace

AttentionResults attention(Tensor q, Tensor k, Tensor v, bool causal, double scale, const std::string& layout) {
  Graph& g = ops_detail::graph_of({q, k, v});
  std::vector<Tensor> r = g.add_op_results(OpKind::Attention, {q.id, k.id, v.id}, attention_attrs(causal, scale, layout));
  return {r[0], r[1]};
}

AttentionGrads attention_grad(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, bool causal,
                              double scale, const std::string& layout) {
  Graph& g = ops_detail::graph_of({q, k, v, out, lse, dout});
  std::vector<Tensor> r = g.add_op_results(OpKind::AttentionGrad, {q.id, k.id, v.id, out.id, lse.id, dout.id},
                                           attention_attrs(causal, scale, layout));
  return {r[0], r[1], r[2]};
}

}  // namespace tessel
