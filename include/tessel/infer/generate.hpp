// tessel/infer/generate.hpp — generation from a GPT (models/gpt.hpp) with a KV cache: a
// prefill program (a batch of prompts -> the next token's logits and the filled cache) and a
// decode program (one token per sequence -> logits, the cache updated at each sequence's
// position), each compiled for the same mesh, the cache a device-resident sharded array
// donated to every decode step.
//
//   tessel::GptConfig cfg;                      // the trained model's sizes (gpt_train's flags)
//   cfg.batch = 4;                              // the cache's sequences (slots)
//   auto rt = tessel::make_runtime({"cpu", mesh});
//   tessel::GptGenerator gen(cfg, mesh, *rt, weights, /*prompt_len=*/16);
//   tessel::GenerateOptions o;
//   o.max_new = 32;                             // o.sampling: greedy unless a temperature is set
//   std::vector<std::vector<int32_t>> out = gen.generate({{1, 2, 3}, {7, 8}}, o);
//
// The cache holds cfg.batch sequences of cfg.seq positions (the model's context: its position
// table wpe has cfg.seq rows); a prompt may have 1 to prompt_len tokens, and generation stops
// at cfg.seq positions. Positions beyond a sequence's length are masked out of its attention.
// The weights are the graph inputs of build_gpt by name (wte, wpe, l0_wq, ...: what gpt_train
// saves), laid out as build_gpt annotates them when cfg.annotate (Megatron over
// cfg.model_axis, the sequences over cfg.data_axis, the cache over both: sequences x heads).
//
// Each sequence's next token is chosen on the devices (the sample_tokens op, docs/ir.md): each
// program returns "next_token", so only the tokens come to the host. Temperature 0 is greedy
// (the most likely token, the lowest id on a tie); else softmax(logits / temperature)
// restricted to the tokens at or above the top_k-th largest logit (0: all) and to the most
// likely ones whose probability reaches top_p (1: all), drawn with the uniform number of the key
// sample_key(seed, sequence index, position), so a seed gives the same tokens whatever the mesh
// or batch (on one backend: the CUDA kernel sums in another order than the CPU's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

namespace detail {
class InferEngine;  // src/infer/engine.hpp: the loaded programs GptGenerator and GptServer share
}

// How a phase's program lays the model out on the mesh (Pope et al. 2022, "Efficiently Scaling
// Transformer Inference"), over cfg.data_axis (dp) and cfg.model_axis (mp); each with
// cfg.annotate (else propagation alone decides):
//  - OneD, 1D weight-stationary: the weights split over mp on the heads and the MLP's hidden
//    dim (Megatron, build_gpt's layouts), the sequences over dp; activations whole on mp and
//    all-reduced after the attention and MLP output projections.
//  - TwoD, 2D weight-stationary: the weights also split over dp on d_model (a weight matrix's
//    two dims over the two axes), every device holding all sequences, the residual stream
//    split over (dp, mp) on d_model: each block all-gathers its input over mp, reduce-scatters
//    its output over mp, and the MLP's hidden activation is reduce-scattered and all-gathered
//    over dp (Pope et al. 3.2.2; docs/inference.md gives the exact bytes). No weight moves.
//  - Gathered, weight-gathered: the weights stored as TwoD's and all-gathered whole before use
//    (as ZeRO-3 gathers parameters), the sequences over every device (dp and mp): no
//    activation moves. For large batches (a prefill), where moving the weights costs less than
//    moving the activations.
// The cache is [{dp}, {}, {mp}, {}] (sequences x heads), [{}, {}, {mp}, {}] under TwoD and
// [{dp, mp}, {}, {}, {}] under Gathered.
enum class InferLayout { OneD, TwoD, Gathered };
const char* infer_layout_name(InferLayout l);  // "1d", "2d", "gathered"
// Parses "1d", "2d", "gathered"; Error naming the text and the choices otherwise.
InferLayout parse_infer_layout(const std::string& text);
struct InferLayouts {
  InferLayout prefill = InferLayout::OneD;
  InferLayout decode = InferLayout::OneD;
};

// The cheapest layout of each phase for `mesh` by `cost`: each phase's program compiled in
// each layout and priced (the cost model's compute plus the collectives, per device), the
// least kept. `why` says each phase's predictions and choice, e.g. "prefill: 1d 41.2 us, 2d
// 63.0 us, gathered 58.1 us -> 1d; decode: ...". `gpt_generate --layout auto` plans with this
// machine's figures (runtime/backend_cost.hpp).
struct InferLayoutChoice {
  InferLayouts layouts;
  std::string why;
  // Per phase (prefill, decode), per layout (InferLayout order): the predicted seconds.
  double predicted_s[2][3] = {};
};
InferLayoutChoice choose_infer_layouts(const GptConfig& cfg, const Mesh& mesh, int64_t prompt_len,
                                       const CostModel& cost);

// The programs of generation, as graphs. B = cfg.batch sequences, T = cfg.seq positions,
// H key/value heads (gpt_kv_heads) of K = d_model / heads, V = cfg.vocab, P = prompt_len.
// Every program also takes each row's draw, "sample_keys" i32, "temperature" f32, "top_k" i32
// and "top_p" f32 [rows], and returns, after "logits", "next_token" i32 [rows]: each row's
// token chosen on the devices (sample_tokens).
struct GptInferGraphs {
  // Inputs: the weights; "tokens" i32 [B, P] (each prompt from position 0, padded after its
  // end with any valid token); "last" i32 [B] (each prompt's last position, its length - 1).
  // Outputs: "logits" [B, V] at each prompt's last position, then per layer l the caches
  // "l<l>_k_cache", "l<l>_v_cache" [B, T, H, K] (positions < P written; what lies at or beyond a
  // prompt's length is masked by the decode steps and overwritten as they go).
  Graph prefill;
  // Inputs: the weights; "token" i32 [B] (each sequence's newest token); "pos" i32 [B] (its
  // position, < T); "positions" i32 [T] (0, 1, ..., T-1); the caches. Outputs: "logits" [B, V]
  // for the next position, then the caches with each sequence's position written, named
  // "<cache>.next" and donated to the cache inputs (`donations`).
  Graph decode;
  // Built when admit_batch > 0 (GptServer): the prefill of admit_batch prompts (laid out as
  // the prefill) written into their slots of the decode's cache. Inputs: the weights, "tokens"
  // i32 [A, P] and "last" i32 [A] as the prefill's, "slots" i32 [A] (each prompt's cache slot,
  // in [0, B); a row not needed repeats a used one, prompt and slot: it writes the same
  // values), the caches in the decode's layout. Outputs:
  // "logits" [A, V], then the caches with each admitted slot's every position replaced (the
  // prompt's keys and values, zeros after them), named "<cache>.next" (`donations` again).
  Graph admit;
  std::vector<std::string> weights;  // the weight inputs, in graph order (the same in every graph)
  std::vector<std::string> caches;   // l0_k_cache, l0_v_cache, l1_k_cache, ...
  std::vector<std::pair<std::string, std::string>> donations;  // decode: (cache input, its .next output)
};

// Throws ShapeError when the sizes are inconsistent (as build_gpt), prompt_len is not in
// [1, cfg.seq] or admit_batch not in [0, cfg.batch].
GptInferGraphs build_gpt_infer(const GptConfig& cfg, int64_t prompt_len, InferLayouts layouts = {},
                               int64_t admit_batch = 0);

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (the most likely token, the lowest id on a tie)
  int64_t top_k = 0;       // > 0: only the k most likely tokens
  double top_p = 1;        // in (0, 1]: only the smallest most-likely set reaching this probability
  uint64_t seed = 0;
};

struct GenerateOptions {
  int64_t max_new = 16;  // tokens generated per sequence (>= 1); fewer when prompt and generated
                         // tokens fill the model's cfg.seq positions
  int32_t eos = -1;      // a sequence ends after generating this token (-1: none)
  SamplingOptions sampling;
  // Bring every step's logits to the host and keep them (step_logits()). Without it only the
  // tokens (drawn on the devices) come back.
  bool keep_logits = false;
};

class GptGenerator {
 public:
  // Compiles and loads both programs on `runtime` (its devices are the mesh's) and puts the
  // weights on the devices (one copy when both phases lay a weight out alike, else one per
  // phase). Throws Error naming a weight that is missing from `weights` or has
  // another dtype or shape than the model's.
  // The cache moves from the prefill's layout to the decode's on the devices when they are the
  // same, else through the host.
  GptGenerator(GptConfig cfg, const Mesh& mesh, Runtime& runtime, const std::map<std::string, HostTensor>& weights,
               int64_t prompt_len, InferLayouts layouts = {});
  ~GptGenerator();
  GptGenerator(const GptGenerator&) = delete;
  GptGenerator& operator=(const GptGenerator&) = delete;

  // Generates for up to cfg.batch prompts (each 1..prompt_len tokens in [0, vocab)); returns
  // each prompt's generated tokens. Throws Error naming the prompt and what is wrong with it.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerateOptions& options);
  // With GenerateOptions::keep_logits, the logits [B, V] every step of the last generate()
  // sampled from, in order (the prefill's first): what the tests compare against a full
  // forward. Empty otherwise.
  const std::vector<HostTensor>& step_logits() const { return logits_; }
  const GptInferGraphs& graphs() const;

 private:
  GptConfig cfg_;
  std::unique_ptr<detail::InferEngine> engine_;
  std::vector<HostTensor> logits_;
};

// The key a sequence draws its token at `position` with (the "sample_keys" inputs): a mix of
// the three numbers.
int32_t sample_key(uint64_t seed, int64_t sequence, int64_t position);

// The host's reference of the devices' draw: the token sample_tokens gives one row of logits
// (`logits` of `n` floats) by `o`, for sequence `sequence` at position `position` (its key
// sample_key(o.seed, sequence, position)); n when no logit is finite. Tests compare the
// devices' tokens against it.
int32_t sample_token(const float* logits, int64_t n, const SamplingOptions& o, int64_t sequence, int64_t position);

}  // namespace tessel
