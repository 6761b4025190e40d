// GPT-2-style decoder graph with Megatron annotations (see models/gpt.hpp).
#include "tessel/models/gpt.hpp"

#include <fmt/format.h>

#include <cmath>

namespace tessel {

GptGraph build_gpt(const GptConfig& c) {
  if (c.d_model % c.heads != 0)
    throw ShapeError(fmt::format("gpt: d_model {} is not divisible by heads {}", c.d_model, c.heads));
  if (c.batch < 1 || c.seq < 1 || c.layers < 0 || c.vocab < 1)
    throw ShapeError("gpt: batch, seq and vocab must be >= 1, layers >= 0");
  GptGraph m;
  Graph& g = m.graph;
  const int64_t B = c.batch, S = c.seq, D = c.d_model, H = c.heads, K = D / H, V = c.vocab;
  const int64_t F = c.ffn_mult * D;
  const std::string& dp = c.data_axis;
  const std::string& mp = c.model_axis;
  auto weight = [&](std::string name, Shape shape, std::vector<std::vector<std::string>> layout) {
    Tensor t = input(g, std::move(name), c.dtype, shape);
    if (c.annotate) g.annotate(t, Sharding::of(layout));
    m.weights.push_back(t);
    m.params += num_elements(shape);
    return t;
  };
  m.tokens = input(g, "tokens", DType::i32, {B, S});
  m.labels = input(g, "labels", DType::i32, {B, S});
  if (c.annotate) {
    g.annotate(m.tokens, Sharding::of({{dp}, {}}));
    g.annotate(m.labels, Sharding::of({{dp}, {}}));
  }
  Tensor wte = weight("wte", {V, D}, {{}, {}});
  Tensor wpe = weight("wpe", {S, D}, {{}, {}});
  Tensor x = add(embedding(wte, m.tokens), wpe).named("x0");
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  for (int64_t l = 0; l < c.layers; ++l) {
    auto nm = [&](const char* s) { return fmt::format("l{}_{}", l, s); };
    Tensor ln1g = weight(nm("ln1_g"), {D}, {{}});
    Tensor ln1b = weight(nm("ln1_b"), {D}, {{}});
    Tensor wq = weight(nm("wq"), {D, H, K}, {{}, {mp}, {}});
    Tensor wk = weight(nm("wk"), {D, H, K}, {{}, {mp}, {}});
    Tensor wv = weight(nm("wv"), {D, H, K}, {{}, {mp}, {}});
    Tensor wo = weight(nm("wo"), {H, K, D}, {{mp}, {}, {}});
    Tensor ln2g = weight(nm("ln2_g"), {D}, {{}});
    Tensor ln2b = weight(nm("ln2_b"), {D}, {{}});
    Tensor w1 = weight(nm("w1"), {D, F}, {{}, {mp}});
    Tensor b1 = weight(nm("b1"), {F}, {{mp}});
    Tensor w2 = weight(nm("w2"), {F, D}, {{mp}, {}});
    Tensor b2 = weight(nm("b2"), {D}, {{}});

    Tensor h = layer_norm(x, ln1g, ln1b).named(nm("h"));
    Tensor q = einsum("bsd,dhk->bshk", h, wq).named(nm("q"));
    Tensor k = einsum("bsd,dhk->bshk", h, wk).named(nm("k"));
    Tensor v = einsum("bsd,dhk->bshk", h, wv).named(nm("v"));
    Tensor s = mul(einsum("bqhk,bshk->bhqs", q, k), scale).named(nm("scores"));
    Tensor p = softmax(causal_mask(s), -1).named(nm("probs"));
    Tensor o = einsum("bhqs,bshk->bqhk", p, v).named(nm("ctx"));
    Tensor attn = einsum("bqhk,hkd->bqd", o, wo).named(nm("attn"));
    x = add(x, attn).named(nm("x_attn"));
    Tensor h2 = layer_norm(x, ln2g, ln2b).named(nm("h2"));
    Tensor u = gelu(add(einsum("bsd,df->bsf", h2, w1), b1)).named(nm("mlp_h"));
    Tensor d = add(einsum("bsf,fd->bsd", u, w2), b2).named(nm("mlp_out"));
    x = add(x, d).named(nm("x_out"));
  }
  Tensor lnfg = weight("lnf_g", {D}, {{}});
  Tensor lnfb = weight("lnf_b", {D}, {{}});
  Tensor xf = layer_norm(x, lnfg, lnfb).named("xf");
  Tensor logits = einsum("bsd,vd->bsv", xf, wte).named("logits");
  Tensor per_token = cross_entropy(logits, m.labels).named("token_loss");
  m.loss = reduce_mean(per_token, {0, 1}).named("loss");
  g.mark_output(m.loss);
  return m;
}

}  // namespace tessel
