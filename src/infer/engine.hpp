// The loaded programs of generation, shared by GptGenerator (infer/generate.hpp) and GptServer
// (infer/server.hpp): the prefill, decode and (for a server) admit programs of
// build_gpt_infer compiled and loaded once, the weights put on the devices once per distinct
// layout, and the runs that take host tokens and keep the cache on the devices. Internal.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/infer/generate.hpp"
#include "tessel/runtime/sharded_array.hpp"

namespace tessel::detail {

// Throws Error naming `who` (and `what`, e.g. "request 3") when a sampling option is out of
// range: temperature finite and >= 0, top_k >= 0, top_p in (0, 1].
void check_sampling(const char* who, const std::string& what, const SamplingOptions& s);

// Each row's draw, the sample_tokens inputs of a run: a row not set is greedy.
struct Draws {
  std::vector<int32_t> keys, top_k;
  std::vector<float> temperature, top_p;
  explicit Draws(std::size_t rows) : keys(rows, 0), top_k(rows, 0), temperature(rows, 0.0f), top_p(rows, 1.0f) {}
  // Row `row` draws by `s` as sequence `sequence` at position `position` (sample_key).
  void set(std::size_t row, const SamplingOptions& s, int64_t sequence, int64_t position);
};

class InferEngine {
 public:
  using Caches = std::map<std::string, ShardedArray>;
  // A run's result on the host: each row's token (drawn on the devices by the run's Draws), and
  // the logits [rows, V] when asked for (else empty: only the tokens come back).
  struct Step {
    std::vector<int32_t> tokens;
    HostTensor logits;
  };
  // `who` names the caller in errors ("GptGenerator", "GptServer"). Throws Error naming a
  // weight missing from `weights` or of another dtype or shape than the model's.
  InferEngine(const GptConfig& cfg, const Mesh& mesh, Runtime& runtime, const std::map<std::string, HostTensor>& weights,
              int64_t prompt_len, InferLayouts layouts, int64_t admit_batch, const char* who);
  ~InferEngine();
  InferEngine(const InferEngine&) = delete;
  InferEngine& operator=(const InferEngine&) = delete;

  const GptInferGraphs& graphs() const { return graphs_; }
  int64_t prompt_len() const { return prompt_len_; }
  int64_t admit_batch() const { return admit_batch_; }

  // Throws Error naming `who`, prompt `index` and what is wrong: empty, longer than the
  // prompt length, a token outside the vocabulary.
  void check_prompt(std::size_t index, const std::vector<int32_t>& prompt) const;

  // The prefill of B prompts (`tokens` B x P row-major, `last` B, `draws` B); `caches` becomes
  // the filled caches in the decode's layout. `logits`: bring the logits to the host too.
  Step prefill(const std::vector<int32_t>& tokens, const std::vector<int32_t>& last, const Draws& draws,
               Caches& caches, bool logits);
  // One decode step (`token`, `pos`, `draws` B each); `caches` donated and replaced.
  Step decode(const std::vector<int32_t>& token, const std::vector<int32_t>& pos, const Draws& draws, Caches& caches,
              bool logits);
  // The admit program (`tokens` A x P, `last`, `slots` and `draws` A); the slots of `caches`
  // rewritten (donated and replaced).
  Step admit(const std::vector<int32_t>& tokens, const std::vector<int32_t>& last, const std::vector<int32_t>& slots,
             const Draws& draws, Caches& caches, bool logits);
  // Zero caches in the decode's layout (a server's empty slots).
  Caches empty_caches() const;

 private:
  struct Programs;
  GptConfig cfg_;
  GptInferGraphs graphs_;
  int64_t prompt_len_ = 0, admit_batch_ = 0;
  const char* who_;
  std::unique_ptr<Programs> p_;
};

}  // namespace tessel::detail
