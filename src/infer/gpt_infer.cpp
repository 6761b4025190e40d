// The prefill and decode graphs of a GPT with a KV cache (infer/generate.hpp). The layers are
// build_gpt's (models/gpt.cpp), the same weights by name; only the attention differs: prefill
// attends causally within the prompt and returns its keys and values, padded to the cache's
// capacity; decode writes one position per sequence into the cache (write_at(cache, pos, k))
// and attends to the positions up to it.
#include <fmt/format.h>

#include <algorithm>
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
      // d_model split over dp: 2D splits every weight holding it; weight-gathered (which
      // gathers them whole for use) only the matrices, the vectors being small.
      if (w.d_model_dim >= 0 && (how == InferLayout::TwoD || (how == InferLayout::Gathered && w.shape.size() > 1)))
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

// `t` with its leading dims whole and its last dim over `last` (when `on`: else `t`).
Tensor last_dim_over(Tensor t, const std::vector<std::string>& last, bool on) {
  if (!on) return t;
  std::vector<std::vector<std::string>> dims(t.shape().size());
  dims.back() = last;
  return shard(t, Sharding::of(dims));
}

// `t` with dim `heads` over mp and every other dim whole, summed (when `on`: else `t`). Under
// 2D the projections' partial sums over dp are all-reduced here, on the queries, keys and
// values (B·L·E/mp elements each), not later on the attention scores (B·L·H·T/mp).
Tensor heads_over(Tensor t, std::size_t heads, const std::string& mp, bool on) {
  if (!on) return t;
  std::vector<std::vector<std::string>> dims(t.shape().size());
  dims[heads] = {mp};
  return shard(t, Sharding::of(dims));
}

// Each row's next token chosen on the devices (sample_tokens): the rows' draw inputs
// "sample_keys" i32, "temperature" f32, "top_k" i32, "top_p" f32, each [rows]; temperature 0
// gives the greedy token. i32 [rows] "next_token"; a row without a finite logit gives V.
Tensor next_tokens(Graph& g, Tensor logits) {
  const int64_t R = logits.shape()[0];
  Tensor keys = input(g, "sample_keys", DType::i32, {R});
  Tensor temperature = input(g, "temperature", DType::f32, {R});
  Tensor top_k = input(g, "top_k", DType::i32, {R});
  Tensor top_p = input(g, "top_p", DType::f32, {R});
  return sample_tokens(logits, keys, temperature, top_k, top_p).named("next_token");
}

// The MLP half of a layer, on x of any leading dims (`lead` names them). With `two_d` (2D
// weight-stationary, Pope et al. 3.2.2) the hidden activation is pinned over (mp, dp): the
// first projection's partial sums over dp are reduce-scattered onto it and all-gathered over
// dp for the second, whose partial sums over mp are reduce-scattered onto the residual.
Tensor mlp(const Layer& L, Tensor x, const std::string& lead, bool two_d, const std::string& dp, const std::string& mp) {
  Tensor h2 = last_dim_over(layer_norm(last_dim_over(x, {dp}, two_d), L.ln2g, L.ln2b), {dp}, two_d);  // normalised over dp
  Tensor u = gelu(add(einsum(lead + "d,df->" + lead + "f", h2, L.w1), L.b1));
  u = last_dim_over(u, {mp, dp}, two_d);
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

GptInferGraphs build_gpt_infer(const GptConfig& c, int64_t prompt_len, InferLayouts layouts, int64_t admit_batch) {
  if (c.d_model % c.heads != 0)
    throw ShapeError(fmt::format("gpt_infer: d_model {} is not divisible by heads {}", c.d_model, c.heads));
  if (c.batch < 1 || c.seq < 1 || c.layers < 0 || c.vocab < 1)
    throw ShapeError("gpt_infer: batch, seq and vocab must be >= 1, layers >= 0");
  if (c.compute == DType::i32 || c.dtype == DType::i32)
    throw ShapeError("gpt_infer: the weights and activations must be float (f32, bf16 or f16)");
  if (prompt_len < 1 || prompt_len > c.seq)
    throw ShapeError(fmt::format("gpt_infer: prompt length {} is outside [1, {}] (the model's positions)", prompt_len,
                                 c.seq));
  if (admit_batch < 0 || admit_batch > c.batch)
    throw ShapeError(fmt::format("gpt_infer: admit batch {} is outside [0, {}] (the cache's sequences)", admit_batch,
                                 c.batch));
  check_gpt_kv_heads(c, "gpt_infer");
  const int64_t B = c.batch, T = c.seq, P = prompt_len, D = c.d_model, H = c.heads, K = D / H;
  // 2D weight-stationary: the residual stream over (dp, mp) on d_model between the blocks.
  auto two_d = [&](InferLayout l) { return c.annotate && l == InferLayout::TwoD; };
  // Key/value heads: H (multi-head), else grouped- or multi-query, G query heads per group.
  const int64_t Hkv = gpt_kv_heads(c), G = H / Hkv;
  const bool grouped = Hkv != H;
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
  // The cache [B, T, Hkv, K]: its sequences as the phase's, its heads over mp (multi-head);
  // with grouped- or multi-query attention (too few heads to split) its sequences also over mp
  // (Pope et al. 3.3: the queries come to the cache by an all-to-all over mp, and the context
  // goes back by another).
  auto cache_batch_axes = [&](InferLayout l) {
    std::vector<std::string> a = seq_axes(l);
    if (grouped && std::find(a.begin(), a.end(), mp) == a.end()) a.push_back(mp);
    return a;
  };
  auto cache_layout_of = [&](InferLayout l) {
    const bool heads_split = !grouped && l != InferLayout::Gathered;
    return Sharding::of({cache_batch_axes(l), {}, heads_split ? std::vector<std::string>{mp} : std::vector<std::string>{}, {}});
  };
  // A key or value projection [.., Hkv, K] summed over dp (2D): its heads over mp as the
  // queries' when multi-head, else whole.
  auto kv_over = [&](Tensor t, std::size_t heads, InferLayout how) {
    if (!grouped) return heads_over(t, heads, mp, two_d(how));
    if (!two_d(how)) return t;
    return shard(t, Sharding::of(std::vector<std::vector<std::string>>(t.shape().size())));
  };
  GptInferGraphs out;
  for (int64_t l = 0; l < c.layers; ++l) {
    out.caches.push_back(fmt::format("l{}_k_cache", l));
    out.caches.push_back(fmt::format("l{}_v_cache", l));
  }

  // The prompt's forward on `how`'s layout: Bp prompts of P tokens -> the logits [Bp, V] at
  // each prompt's last position and, per layer, its keys and values [Bp, P, Hkv, K].
  auto prefill_body = [&](Graph& g, const Weights& w, InferLayout how, int64_t Bp, std::vector<Tensor>& kv) {
    Tensor tokens = input(g, "tokens", DType::i32, {Bp, P});
    Tensor last = input(g, "last", DType::i32, {Bp});
    if (c.annotate) {
      g.annotate(tokens, Sharding::of({seq_axes(how), {}}));
      g.annotate(last, Sharding::of({seq_axes(how)}));
    }
    Tensor x = add(embedding(w.wte, tokens), slice(w.wpe, {0, 0}, {P, D}));
    for (int64_t l = 0; l < c.layers; ++l) {
      const Layer& L = w.layers[static_cast<std::size_t>(l)];
      Tensor h = last_dim_over(layer_norm(last_dim_over(x, {dp}, two_d(how)), L.ln1g, L.ln1b), {dp}, two_d(how));
      Tensor q = heads_over(einsum("bsd,dhk->bshk", h, L.wq), 2, mp, two_d(how));
      Tensor k = kv_over(einsum("bsd,dhk->bshk", h, L.wk), 2, how);
      Tensor v = kv_over(einsum("bsd,dhk->bshk", h, L.wv), 2, how);
      Tensor o = grouped ? grouped_attention(q, k, v, Hkv, scale)
                 : c.fused_attention
                     ? attention(q, k, v, /*causal=*/true, scale, "bshd").out
                     : einsum("bhqs,bshk->bqhk", softmax(causal_mask(mul(einsum("bqhk,bshk->bhqs", q, k), scale)), -1), v);
      x = last_dim_over(add(x, einsum("bqhk,hkd->bqd", o, L.wo)), {dp, mp}, two_d(how));
      x = last_dim_over(mlp(L, x, "bs", two_d(how), dp, mp), {dp, mp}, two_d(how));
      kv.push_back(k);
      kv.push_back(v);
    }
    Tensor xf = layer_norm(x, w.lnfg, w.lnfb);
    // Each prompt's last position, picked before the vocabulary projection.
    Tensor at = one_hot(last, P, c.compute);
    Tensor xl = einsum("bs,bsd->bd", at, xf);
    return einsum("bd,vd->bv", xl, w.wte).named("logits");
  };
  // [Bp, P, Hkv, K] -> [Bp, T, Hkv, K], zeros after the prompt's positions.
  auto pad_to_capacity = [&](Graph& g, Tensor kv, int64_t Bp) {
    return P == T ? kv : concat({kv, constant(g, 0, c.compute, {Bp, T - P, Hkv, K})}, 1);
  };

  {  // prefill
    Graph& g = out.prefill;
    const InferLayout how = layouts.prefill;
    const Sharding cache_layout = cache_layout_of(how);
    const Weights w = add_weights(g, c, how, &out.weights);
    std::vector<Tensor> kv;
    const Tensor logits = prefill_body(g, w, how, B, kv);
    g.mark_output(logits);
    g.mark_output(next_tokens(g, logits));
    for (std::size_t i = 0; i < kv.size(); ++i) {
      Tensor full = pad_to_capacity(g, kv[i], B);
      if (c.annotate) full = shard(full, cache_layout);
      g.mark_output(full.named(out.caches[i]));
    }
  }

  if (admit_batch > 0) {  // admit: the prefill of admit_batch prompts written into their cache slots
    Graph& g = out.admit;
    const InferLayout how = layouts.prefill;
    const Sharding cache_layout = cache_layout_of(layouts.decode);
    const Weights w = add_weights(g, c, how, nullptr);
    std::vector<Tensor> kv;
    const Tensor logits = prefill_body(g, w, how, admit_batch, kv);
    Tensor slots = input(g, "slots", DType::i32, {admit_batch});
    g.mark_output(logits);
    g.mark_output(next_tokens(g, logits));
    for (std::size_t i = 0; i < kv.size(); ++i) {
      Tensor cache = input(g, out.caches[i], c.compute, {B, T, Hkv, K});
      if (c.annotate) g.annotate(cache, cache_layout);
      // Each prompt's keys or values (padded to the capacity) written whole into its slot:
      // write_at along the slots with a scalar index, in place in the donated cache for the
      // first prompt (the device holding the slot writes it).
      Tensor full = pad_to_capacity(g, kv[i], admit_batch);
      Tensor next = cache;
      for (int64_t j = 0; j < admit_batch; ++j) {
        Tensor row = reshape(slice(full, {j, 0, 0, 0}, {j + 1, T, Hkv, K}), {T, Hkv, K});
        next = write_at(next, reshape(slice(slots, {j}, {j + 1}), {}), row, 0);
      }
      if (c.annotate) next = shard(next, cache_layout);
      g.mark_output(next.named(out.caches[i] + ".next"));
    }
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
      Tensor t = input(g, n, c.compute, {B, T, Hkv, K});
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
    Tensor seen = reshape(le(row, col), {B, 1, T});
    Tensor seen_grouped = reshape(le(row, col), {B, 1, 1, T});
    Tensor masked = constant(g, -std::numeric_limits<double>::infinity(), c.compute);
    std::vector<Tensor> cache_out;
    for (int64_t l = 0; l < c.layers; ++l) {
      const Layer& L = w.layers[static_cast<std::size_t>(l)];
      Tensor h = last_dim_over(layer_norm(last_dim_over(x, {dp}, two_d(how)), L.ln1g, L.ln1b), {dp}, two_d(how));
      Tensor q = heads_over(einsum("bd,dhk->bhk", h, L.wq), 1, mp, two_d(how));
      Tensor k = kv_over(einsum("bd,dhk->bhk", h, L.wk), 1, how);  // [B, Hkv, K]
      Tensor v = kv_over(einsum("bd,dhk->bhk", h, L.wv), 1, how);
      // Each sequence's key and value written at its position (the cache is donated: only
      // those rows are stored).
      Tensor kc = write_at(cache_in[static_cast<std::size_t>(2 * l)], pos, k, 1);
      Tensor vc = write_at(cache_in[static_cast<std::size_t>(2 * l + 1)], pos, v, 1);
      if (c.annotate) {
        kc = shard(kc, cache_layout);
        vc = shard(vc, cache_layout);
      }
      Tensor o;
      if (grouped) {
        // The queries to the cache's layout (sequences over mp too: an all-to-all), the
        // attention there, the context back to the heads over mp (another).
        Tensor q4 = reshape(q, {B, Hkv, G, K});
        if (c.annotate) q4 = shard(q4, Sharding::of({cache_batch_axes(how), {}, {}, {}}));
        Tensor sg = where(seen_grouped, mul(einsum("bgjk,btgk->bgjt", q4, kc), scale), masked);
        o = reshape(einsum("bgjt,btgk->bgjk", softmax(sg, -1), vc), {B, H, K});
        if (c.annotate) o = shard(o, Sharding::of({seq_axes(how), how == InferLayout::Gathered ? std::vector<std::string>{} : std::vector<std::string>{mp}, {}}));
      } else {
        Tensor s = where(seen, mul(einsum("bhk,bthk->bht", q, kc), scale), masked);
        o = einsum("bht,bthk->bhk", softmax(s, -1), vc);
      }
      x = last_dim_over(add(x, einsum("bhk,hkd->bd", o, L.wo)), {dp, mp}, two_d(how));
      x = last_dim_over(mlp(L, x, "b", two_d(how), dp, mp), {dp, mp}, two_d(how));
      cache_out.push_back(kc.named(out.caches[static_cast<std::size_t>(2 * l)] + ".next"));
      cache_out.push_back(vc.named(out.caches[static_cast<std::size_t>(2 * l + 1)] + ".next"));
    }
    Tensor xf = layer_norm(x, w.lnfg, w.lnfb);
    const Tensor logits = einsum("bd,vd->bv", xf, w.wte).named("logits");
    g.mark_output(logits);
    g.mark_output(next_tokens(g, logits));
    for (std::size_t i = 0; i < cache_out.size(); ++i) {
      g.mark_output(cache_out[i]);
      out.donations.emplace_back(out.caches[i], out.caches[i] + ".next");
    }
  }
  return out;
}

}  // namespace tessel
