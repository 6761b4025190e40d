// GPT-2-style decoder graph with Megatron annotations (see models/gpt.hpp).
#include "tessel/ops/builders.hpp"
#include "tessel/models/gpt.hpp"

#include <fmt/format.h>

#include <cmath>

#include "tessel/cli.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

std::vector<GptWeightSpec> gpt_weight_specs(const GptConfig& c) {
  const int64_t S = c.seq, D = c.d_model, H = c.heads, K = D / std::max<int64_t>(1, c.heads), V = c.vocab;
  const std::string& mp = c.model_axis;
  const int64_t Hkv = gpt_kv_heads(c);
  // Key/value projections: heads over model as the queries', or, with fewer key/value heads
  // (grouped- or multi-query), replicated.
  const std::vector<std::vector<std::string>> kv_layout =
      Hkv == H ? std::vector<std::vector<std::string>>{{}, {mp}, {}} : std::vector<std::vector<std::string>>{{}, {}, {}};
  const int64_t F = c.ffn_mult * D;
  std::vector<GptWeightSpec> w = {{"wte", {V, D}, {{}, {}}, -1}, {"wpe", {S, D}, {{}, {}}, -1}};
  for (int64_t l = 0; l < c.layers; ++l) {
    auto nm = [&](const char* s) { return fmt::format("l{}_{}", l, s); };
    w.push_back({nm("ln1_g"), {D}, {{}}, 0});
    w.push_back({nm("ln1_b"), {D}, {{}}, 0});
    w.push_back({nm("wq"), {D, H, K}, {{}, {mp}, {}}, 0});
    w.push_back({nm("wk"), {D, Hkv, K}, kv_layout, 0});
    w.push_back({nm("wv"), {D, Hkv, K}, kv_layout, 0});
    w.push_back({nm("wo"), {H, K, D}, {{mp}, {}, {}}, 2});
    w.push_back({nm("ln2_g"), {D}, {{}}, 0});
    w.push_back({nm("ln2_b"), {D}, {{}}, 0});
    w.push_back({nm("w1"), {D, F}, {{}, {mp}}, 0});
    w.push_back({nm("b1"), {F}, {{mp}}, -1});
    w.push_back({nm("w2"), {F, D}, {{mp}, {}}, 1});
    w.push_back({nm("b2"), {D}, {{}}, 0});
  }
  w.push_back({"lnf_g", {D}, {{}}, 0});
  w.push_back({"lnf_b", {D}, {{}}, 0});
  return w;
}

void check_gpt_kv_heads(const GptConfig& c, const char* who) {
  if (c.kv_heads < 0 || c.kv_heads > c.heads || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    throw ShapeError(fmt::format("{}: kv_heads {} must divide heads {} (1: multi-query; heads or 0: multi-head)", who,
                                 c.kv_heads, c.heads));
}

Tensor grouped_attention(Tensor q, Tensor k, Tensor v, int64_t kv_heads, double scale) {
  const Shape qs = q.shape();  // [b, q, H, K] (a copy: adding ops may move the graph's values)
  if (qs.size() != 4 || kv_heads < 1 || qs[2] % kv_heads != 0)
    throw ShapeError(fmt::format("grouped_attention: queries {} with {} key/value heads (4 dims [b, s, heads, dim], "
                                 "heads a multiple of kv_heads)",
                                 shape_str(qs), kv_heads));
  const int64_t G = qs[2] / kv_heads;
  Tensor q5 = reshape(q, {qs[0], qs[1], kv_heads, G, qs[3]});
  Tensor s = mul(einsum("bqgjk,bsgk->bgjqs", q5, k), scale);
  Tensor p = softmax(causal_mask(s), -1);
  return reshape(einsum("bgjqs,bsgk->bqgjk", p, v), qs);
}

GptGraph build_gpt(const GptConfig& c) {
  if (c.d_model % c.heads != 0)
    throw ShapeError(fmt::format("gpt: d_model {} is not divisible by heads {}", c.d_model, c.heads));
  check_gpt_kv_heads(c, "gpt");
  if (c.batch < 1 || c.seq < 1 || c.layers < 0 || c.vocab < 1)
    throw ShapeError("gpt: batch, seq and vocab must be >= 1, layers >= 0");
  GptGraph m;
  Graph& g = m.graph;
  const int64_t B = c.batch, S = c.seq, K = c.d_model / c.heads;
  const std::string& dp = c.data_axis;
  const std::vector<GptWeightSpec> specs = gpt_weight_specs(c);
  std::size_t next_spec = 0;
  // The next weight of gpt_weight_specs (named there: `name` only checks the order).
  auto weight = [&](const std::string& name) {
    const GptWeightSpec& w = specs.at(next_spec++);
    if (w.name != name) throw Error(fmt::format("gpt: internal: weight '{}' where gpt_weight_specs has '{}'", name, w.name));
    Tensor t = input(g, w.name, c.dtype, w.shape);
    if (c.annotate) g.annotate(t, Sharding::of(w.layout));
    m.weights.push_back(t);
    m.params += num_elements(w.shape);
    return c.compute == c.dtype ? t : cast(t, c.compute);
  };
  if (c.compute == DType::i32 || c.dtype == DType::i32)
    throw ShapeError("gpt: the weights and activations must be float (f32, bf16 or f16)");
  m.tokens = input(g, "tokens", DType::i32, {B, S});
  m.labels = input(g, "labels", DType::i32, {B, S});
  if (c.annotate) {
    g.annotate(m.tokens, Sharding::of({{dp}, {}}));
    g.annotate(m.labels, Sharding::of({{dp}, {}}));
  }
  Tensor wte = weight("wte");
  Tensor wpe = weight("wpe");
  Tensor x = add(embedding(wte, m.tokens), wpe).named("x0");
  m.checkpoints.push_back(x);
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  for (int64_t l = 0; l < c.layers; ++l) {
    auto nm = [&](const char* s) { return fmt::format("l{}_{}", l, s); };
    Tensor ln1g = weight(nm("ln1_g"));
    Tensor ln1b = weight(nm("ln1_b"));
    Tensor wq = weight(nm("wq"));
    Tensor wk = weight(nm("wk"));
    Tensor wv = weight(nm("wv"));
    Tensor wo = weight(nm("wo"));
    Tensor ln2g = weight(nm("ln2_g"));
    Tensor ln2b = weight(nm("ln2_b"));
    Tensor w1 = weight(nm("w1"));
    Tensor b1 = weight(nm("b1"));
    Tensor w2 = weight(nm("w2"));
    Tensor b2 = weight(nm("b2"));

    Tensor h = layer_norm(x, ln1g, ln1b).named(nm("h"));
    Tensor q = einsum("bsd,dhk->bshk", h, wq).named(nm("q"));
    Tensor k = einsum("bsd,dhk->bshk", h, wk).named(nm("k"));
    Tensor v = einsum("bsd,dhk->bshk", h, wv).named(nm("v"));
    Tensor o;
    if (gpt_kv_heads(c) != c.heads) {
      o = grouped_attention(q, k, v, gpt_kv_heads(c), scale).named(nm("ctx"));
    } else if (c.fused_attention) {
      o = attention(q, k, v, /*causal=*/true, scale, "bshd").out.named(nm("ctx"));
    } else {
      Tensor s = mul(einsum("bqhk,bshk->bhqs", q, k), scale).named(nm("scores"));
      Tensor p = softmax(causal_mask(s), -1).named(nm("probs"));
      o = einsum("bhqs,bshk->bqhk", p, v).named(nm("ctx"));
    }
    Tensor attn = einsum("bqhk,hkd->bqd", o, wo).named(nm("attn"));
    x = add(x, attn).named(nm("x_attn"));
    Tensor h2 = layer_norm(x, ln2g, ln2b).named(nm("h2"));
    Tensor u = gelu(add(einsum("bsd,df->bsf", h2, w1), b1)).named(nm("mlp_h"));
    Tensor d = add(einsum("bsf,fd->bsd", u, w2), b2).named(nm("mlp_out"));
    x = add(x, d).named(nm("x_out"));
    m.checkpoints.push_back(x);
  }
  Tensor lnfg = weight("lnf_g");
  Tensor lnfb = weight("lnf_b");
  Tensor xf = layer_norm(x, lnfg, lnfb).named("xf");
  Tensor logits = einsum("bsd,vd->bsv", xf, wte).named("logits");
  Tensor per_token = cross_entropy(logits, m.labels).named("token_loss");  // f32 whatever the logits
  m.loss = reduce_mean(per_token, {0, 1}).named("loss");
  g.mark_output(m.loss);
  return m;
}

bool parse_gpt_flag(const std::string& flag, const std::function<std::string()>& value, GptConfig& cfg) {
  // Sizes are bounded so that products of sizes cannot overflow.
  auto size = [&](int64_t lo) { return cli::parse_i64(flag, value(), lo, int64_t{1} << 24); };
  if (flag == "--batch") cfg.batch = size(1);
  else if (flag == "--seq") cfg.seq = size(1);
  else if (flag == "--d-model") cfg.d_model = size(1);
  else if (flag == "--heads") cfg.heads = size(1);
  else if (flag == "--kv-heads") cfg.kv_heads = size(1);
  else if (flag == "--layers") cfg.layers = size(0);
  else if (flag == "--vocab") cfg.vocab = size(1);
  else return false;
  return true;
}

void gpt_init(const Graph& g, std::vector<HostTensor>& inputs) {
  for (std::size_t i = 0; i < g.inputs.size() && i < inputs.size(); ++i) {
    const std::string& name = g.values[static_cast<std::size_t>(g.inputs[i])].name;
    HostTensor& t = inputs[i];
    if (t.dtype() == DType::i32) continue;
    auto ends = [&](const char* suffix) {
      const std::string s(suffix);
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const bool zero = name.rfind("adam.", 0) == 0 || ends("_b") || ends("b1") || ends("b2");
    const bool one = ends("_g");
    for (int64_t j = 0; j < t.numel(); ++j) t.set(j, zero ? 0.0 : one ? 1.0 : t.get(j) * 0.0346);
  }
}

Mesh gpt_mesh(const Mesh& mesh, const GptConfig& cfg) {
  std::vector<MeshAxis> axes = mesh.axes();
  for (const std::string& a : {cfg.data_axis, cfg.model_axis})
    if (!mesh.has_axis(a)) axes.push_back({a, 1});
  return axes.size() == mesh.axes().size() ? mesh : Mesh(std::move(axes));
}

}  // namespace tessel
