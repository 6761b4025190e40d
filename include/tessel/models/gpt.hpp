// tessel/models/gpt.hpp — a GPT-2-style decoder as a tessel graph, with the Megatron
// data × model layout given only by annotations on inputs and weights:
//   tokens/labels [B, S]         {data}, {}
//   wq/wk/wv [D, H, Dh]          heads over model (column split); with fewer key/value heads
//                                (GptConfig::kv_heads) wk/wv [D, Hkv, Dh], replicated
//   wo [H, Dh, D]                heads over model (row split: the output is a partial sum)
//   w1 [D, F], b1 [F]            F over model;  w2 [F, D] F over model (row split)
//   wte [V, D], wpe [S, D], layer-norm parameters: replicated
// Forward: token + position embedding, L blocks of pre-norm causal self-attention (one fused
// attention op, GptConfig::fused_attention) and GELU
// MLP with residuals, final layer norm, tied LM head (logits = x · wteᵀ), mean
// cross-entropy loss over all positions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

class HostTensor;

struct GptConfig {
  int64_t batch = 8;
  int64_t seq = 64;
  int64_t d_model = 128;
  int64_t heads = 4;
  // Key/value heads: 0 (the default) or heads: multi-head attention; 1: multi-query; else
  // grouped-query (a divisor of heads: each key/value head serves heads / kv_heads query
  // heads). Below heads, wk and wv are [D, kv_heads, Dh], replicated over model (they are
  // small), and the attention is written as einsums over the groups (not the fused op).
  int64_t kv_heads = 0;
  int64_t layers = 2;
  int64_t vocab = 512;
  int64_t ffn_mult = 4;
  DType dtype = DType::f32;          // the weights' dtype (the graph's weight inputs)
  // Activations' dtype: each weight is cast to it where it is used, so with dtype f32 and
  // compute bf16 the weights are f32 master copies and the forward and backward run in bf16
  // (mixed precision; gradients come back to the master weights in f32). The loss is f32.
  DType compute = DType::f32;
  bool annotate = true;  // Megatron layout annotations (data × model)
  // The attention as one fused op (attention(q, k, v), layout "bshd": the projections' own,
  // so no head split or merge copies; its backward is the flash backward). false: the long
  // form einsum -> scale -> causal_mask -> softmax -> einsum (compile() still fuses a forward
  // graph's chains unless CompileOptions::fuse_attention is off).
  bool fused_attention = true;
  std::string data_axis = "data";
  std::string model_axis = "model";
};

// Throws ShapeError naming `who` unless cfg.kv_heads is 0 or a divisor of cfg.heads.
void check_gpt_kv_heads(const GptConfig& cfg, const char* who);
// Causal attention of queries q [b, s, H, K] over keys and values k, v [b, s, kv_heads, K],
// each key/value head serving H / kv_heads consecutive query heads: [b, s, H, K]. Einsums over
// the groups (softmax(causal_mask(q·kᵀ · scale)) · v), no fused op.
Tensor grouped_attention(Tensor q, Tensor k, Tensor v, int64_t kv_heads, double scale);
// cfg.kv_heads, or cfg.heads when 0.
inline int64_t gpt_kv_heads(const GptConfig& cfg) { return cfg.kv_heads > 0 ? cfg.kv_heads : cfg.heads; }

struct GptGraph {
  Graph graph;
  Tensor tokens, labels;
  Tensor loss;            // scalar mean cross-entropy
  std::vector<Tensor> weights;  // the weight inputs (in cfg.dtype: the master copies)
  // The residual stream at each block's input and the last block's output (x0, l0_x_out, ...):
  // the segment boundaries for rematerialisation (TrainOptions::checkpoints).
  std::vector<Tensor> checkpoints;
  int64_t params = 0;     // number of parameters
};

// Throws ShapeError when the config is inconsistent (d_model not divisible by heads, ...).
GptGraph build_gpt(const GptConfig& cfg);

// One weight input of the GPT: its name, shape, Megatron layout (cfg.model_axis on the heads
// and the MLP's hidden dim; every other dim whole) and the dim holding d_model, which a
// layout that also splits d_model splits (infer/generate.hpp's 2D): for a projection matrix
// (wq, wk, wv, wo, w1, w2) and a d_model vector (the layer norms' gains and shifts, b2); -1
// for the embedding tables and b1.
struct GptWeightSpec {
  std::string name;
  Shape shape;
  std::vector<std::vector<std::string>> layout;
  int d_model_dim = -1;
};
// Every weight of cfg in build_gpt's input order: wte, wpe, then per layer l its twelve
// (l<l>_ln1_g, _ln1_b, _wq, _wk, _wv, _wo, _ln2_g, _ln2_b, _w1, _b1, _w2, _b2), then lnf_g, lnf_b.
// The one list of the model's weights: build_gpt and the inference graphs both take theirs here.
std::vector<GptWeightSpec> gpt_weight_specs(const GptConfig& cfg);
inline constexpr int kGptWeightsPerLayer = 12;

// The examples' size flags: --batch, --seq, --d-model, --heads, --kv-heads, --layers, --vocab. When `flag`
// is one of them, reads its value with `value()` (a positive integer; layers may be 0) into
// cfg and returns true. Throws UsageError naming the flag on a bad number.
bool parse_gpt_flag(const std::string& flag, const std::function<std::string()>& value, GptConfig& cfg);

// GPT-2 initialisation of a graph's random inputs (random_inputs draws U(-1, 1)): weights
// scaled to U(-1, 1) * 0.02 * sqrt(3), layer-norm gains (`*_g`) 1, biases (`*_b`, `*b1`,
// `*b2`) and optimizer moments (`adam.*`) 0; integer inputs are left alone.
void gpt_init(const Graph& g, std::vector<HostTensor>& inputs);

// `mesh` with the axes the model annotates (cfg.data_axis, cfg.model_axis) that it lacks
// added with size 1: "data=4" is data=4,model=1 for the GPT examples' --mesh.
Mesh gpt_mesh(const Mesh& mesh, const GptConfig& cfg);

}  // namespace tessel
