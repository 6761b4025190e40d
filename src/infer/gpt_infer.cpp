// The prefill and decode graphs of a GPT with a KV cache (infer/generate.hpp). The layers are
// build_gpt's (models/gpt.cpp), the same weights by name; only the attention differs: prefill
// attends causally within the prompt and returns its keys and values, padded to the cache's
// capacity; decode writes one position per sequence into the cache (where(position == pos))
// and attends to the positions up to it.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "tessel/infer/generate.hpp"
#include "tessel/ops/builders.hpp"

namespace tessel {

namespace {

struct Layer {
  Tensor ln1g, ln1b, wq, wk, wv, wo, ln2g, ln2b, w1, b1, w2, b2;
};

// The weight inputs of build_gpt, in its order, with its annotations; returned in the compute
// dtype (cast where it differs from the stored one).
struct Weights {
  Tensor wte, wpe, lnfg, lnfb;
  std::vector<Layer> layers;
};

// The weight inputs of gpt_weight_specs (models/gpt.hpp: build_gpt's names, order and
// Megatron layouts), laid out as `how` stores them; returned in the compute dtype (cast where
// it differs from the stored one).
Weights add_weights(Graph& g, const GptConfig& c, InferLayout how, std::vector<std::string>* names) {
  std::vector<Tensor> t;
  for (const GptWeightSpec& w : gpt_weight_specs(c)) {
    if (names) names->push_back(w.name);
    Tensor in = input(g, w.name, c.dtype, w.shape);
    if (c.annotate) {
      std::vector<std::vector<std::string>> stored = w.layout;
      if (how != InferLayout::OneD && w.d_model_dim >= 0)
        stored[static_cast<std::size_t>(w.d_model_dim)].push_back(c.data_axis);
      g.annotate(in, Sharding::of(stored));
      if (how == InferLayout::Gathered) {  // gathered whole for use: the sequences are split instead
        g.expect_gathers(in);
        in = shard(in, Sharding::of(std::vector<std::vector<std::string>>(stored.size())));
      }
    }
    t.push_back(c.compute == c.dtype ? in : cast(in, c.compute));
  }
  Weights w;
  w.wte = t[0];
  w.wpe = t[1];
  std::size_t i = 2;
  for (int64_t l = 0; l < c.layers; ++l, i += kGptWeightsPerLayer)
    w.layers.push_back(Layer{t[i], t[i + 1], t[i + 2], t[i + 3], t[i + 4], t[i + 5], t[i + 6], t[i + 7], t[i + 8],
                             t[i + 9], t[i + 10], t[i + 11]});
  w.lnfg = t[i];
  w.lnfb = t[i + 1];
  return w;
}

// The MLP half of a layer, on x of any leading dims ("...d": `eq_in` names them).
Tensor mlp(const Layer& L, Tensor x, const std::string& lead) {
  Tensor h2 = layer_norm(x, L.ln2g, L.ln2b);
  Tensor u = gelu(add(einsum(lead + "d,df->" + lead + "f", h2, L.w1), L.b1));
  return add(x, add(einsum(lead + "f,fd->" + lead + "d", u, L.w2), L.b2));
}

}  // namespace

const char* infer_layout_name(InferLayout l) {
  switch (l) {
    case InferLayout::OneD: return "1d";
    case InferLayout::TwoD: return "2d";
    case InferLayout::Gathered: return "gathered";
  }
  return "?";
}

InferLayout parse_infer_layout(const std::string& text) {
  for (InferLayout l : {InferLayout::OneD, InferLayout::TwoD, InferLayout::Gathered})
    if (text == infer_layout_name(l)) return l;
  throw Error(fmt::format("unknown inference layout '{}' (1d, 2d or gathered)", text));
}

GptInferGraphs build_gpt_infer(const GptConfig& c, int64_t prompt_len, InferLayouts layouts) {
  if (c.d_model % c.heads != 0)
    throw ShapeError(fmt::format("gpt_infer: d_model {} is not divisible by heads {}", c.d_model, c.heads));
  if (c.batch < 1 || c.seq < 1 || c.layers < 0 || c.vocab < 1)
    throw ShapeError("gpt_infer: batch, seq and vocab must be >= 1, layers >= 0");
  if (c.compute == DType::i32 || c.dtype == DType::i32)
    throw ShapeError("gpt_infer: the weights and activations must be float (f32, bf16 or f16)");
  if (prompt_len < 1 || prompt_len > c.seq)
    throw ShapeError(fmt::format("gpt_infer: prompt length {} is outside [1, {}] (the model's positions)", prompt_len,
                                 c.seq));
  const int64_t B = c.batch, T = c.seq, P = prompt_len, D = c.d_model, H = c.heads, K = D / H;
  const std::string& dp = c.data_axis;
  const std::string& mp = c.model_axis;
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  // The sequences: over data (OneD), over every device (Gathered), whole (TwoD); the cache's
  // heads over model but under Gathered (each device holds its sequences' every head).
  auto seq_axes = [&](InferLayout l) {
    if (l == InferLayout::TwoD) return std::vector<std::string>{};
    if (l == InferLayout::Gathered) return std::vector<std::string>{dp, mp};
    return std::vector<std::string>{dp};
  };
  auto cache_layout_of = [&](InferLayout l) {
    return Sharding::of({seq_axes(l), {}, l == InferLayout::Gathered ? std::vector<std::string>{} : std::vector<std::string>{mp}, {}});
  };
  GptInferGraphs out;
  for (int64_t l = 0; l < c.layers; ++l) {
    out.caches.push_back(fmt::format("l{}_k_cache", l));
    out.caches.push_back(fmt::format("l{}_v_cache", l));
  }

  {  // prefill
    Graph& g = out.prefill;
    const InferLayout how = layouts.prefill;
    const Sharding cache_layout = cache_layout_of(how);
    const Weights w = add_weights(g, c, how, &out.weights);
    Tensor tokens = input(g, "tokens", DType::i32, {B, P});
    Tensor last = input(g, "last", DType::i32, {B});
    if (c.annotate) {
      g.annotate(tokens, Sharding::of({seq_axes(how), {}}));
      g.annotate(last, Sharding::of({seq_axes(how)}));
    }
    Tensor x = add(embedding(w.wte, tokens), slice(w.wpe, {0, 0}, {P, D}));
    std::vector<Tensor> caches;
    for (int64_t l = 0; l < c.layers; ++l) {
      const Layer& L = w.layers[static_cast<std::size_t>(l)];
      Tensor h = layer_norm(x, L.ln1g, L.ln1b);
      Tensor q = einsum("bsd,dhk->bshk", h, L.wq);
      Tensor k = einsum("bsd,dhk->bshk", h, L.wk);
      Tensor v = einsum("bsd,dhk->bshk", h, L.wv);
      Tensor o = c.fused_attention
                     ? attention(q, k, v, /*causal=*/true, scale, "bshd").out
                     : einsum("bhqs,bshk->bqhk", softmax(causal_mask(mul(einsum("bqhk,bshk->bhqs", q, k), scale)), -1), v);
      x = add(x, einsum("bqhk,hkd->bqd", o, L.wo));
      x = mlp(L, x, "bs");
      for (Tensor kv : {k, v}) {
        Tensor full = P == T ? kv : concat({kv, constant(g, 0, c.compute, {B, T - P, H, K})}, 1);
        if (c.annotate) full = shard(full, cache_layout);
        caches.push_back(full.named(out.caches[caches.size()]));
      }
    }
    Tensor xf = layer_norm(x, w.lnfg, w.lnfb);
    // Each prompt's last position, picked before the vocabulary projection.
    Tensor at = one_hot(last, P, c.compute);
    Tensor xl = einsum("bs,bsd->bd", at, xf);
    g.mark_output(einsum("bd,vd->bv", xl, w.wte).named("logits"));
    for (const Tensor& t : caches) g.mark_output(t);
  }

  {  // decode
    Graph& g = out.decode;
    const InferLayout how = layouts.decode;
    const Sharding cache_layout = cache_layout_of(how);
    const Weights w = add_weights(g, c, how, nullptr);
    Tensor token = input(g, "token", DType::i32, {B});
    Tensor pos = input(g, "pos", DType::i32, {B});
    Tensor positions = input(g, "positions", DType::i32, {T});
    std::vector<Tensor> cache_in;
    for (const std::string& n : out.caches) {
      Tensor t = input(g, n, c.compute, {B, T, H, K});
      if (c.annotate) g.annotate(t, cache_layout);
      cache_in.push_back(t);
    }
    if (c.annotate) {
      g.annotate(token, Sharding::of({seq_axes(how)}));
      g.annotate(pos, Sharding::of({seq_axes(how)}));
    }
    Tensor x = add(embedding(w.wte, token), gather(w.wpe, pos, 0));  // [B, D]
    // [B, T]: the position each sequence writes (== pos), and those it attends to (<= pos).
    Tensor row = reshape(positions, {1, T}), col = reshape(pos, {B, 1});
    Tensor here = reshape(eq(row, col), {B, T, 1, 1});
    Tensor seen = reshape(le(row, col), {B, 1, T});
    Tensor masked = constant(g, -std::numeric_limits<double>::infinity(), c.compute);
    std::vector<Tensor> cache_out;
    for (int64_t l = 0; l < c.layers; ++l) {
      const Layer& L = w.layers[static_cast<std::size_t>(l)];
      Tensor h = layer_norm(x, L.ln1g, L.ln1b);
      Tensor q = einsum("bd,dhk->bhk", h, L.wq);
      Tensor k = reshape(einsum("bd,dhk->bhk", h, L.wk), {B, 1, H, K});
      Tensor v = reshape(einsum("bd,dhk->bhk", h, L.wv), {B, 1, H, K});
      Tensor kc = where(here, k, cache_in[static_cast<std::size_t>(2 * l)]);
      Tensor vc = where(here, v, cache_in[static_cast<std::size_t>(2 * l + 1)]);
      if (c.annotate) {
        kc = shard(kc, cache_layout);
        vc = shard(vc, cache_layout);
      }
      Tensor s = where(seen, mul(einsum("bhk,bthk->bht", q, kc), scale), masked);
      Tensor o = einsum("bht,bthk->bhk", softmax(s, -1), vc);
      x = add(x, einsum("bhk,hkd->bd", o, L.wo));
      x = mlp(L, x, "b");
      cache_out.push_back(kc.named(out.caches[static_cast<std::size_t>(2 * l)] + ".next"));
      cache_out.push_back(vc.named(out.caches[static_cast<std::size_t>(2 * l + 1)] + ".next"));
    }
    Tensor xf = layer_norm(x, w.lnfg, w.lnfb);
    g.mark_output(einsum("bd,vd->bv", xf, w.wte).named("logits"));
    for (std::size_t i = 0; i < cache_out.size(); ++i) {
      g.mark_output(cache_out[i]);
      out.donations.emplace_back(out.caches[i], out.caches[i] + ".next");
    }
  }
  return out;
}

}  // namespace tessel
