// Helpers of the generation tests (test_infer.cpp, test_serve.cpp): a small GPT, its weights
// drawn at random, and the oracle: the logits of a full forward of one sequence on one device
// (the reference executor, no cache).
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../unit/test_util.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/reference.hpp"

namespace infer_test {

using namespace tessel;

inline GptConfig small_model() {
  GptConfig c;
  c.batch = 4;  // the cache's sequences
  c.seq = 16;   // positions
  c.d_model = 32;
  c.heads = 4;
  c.layers = 2;
  c.vocab = 64;
  return c;
}

// The model's weights, drawn U(-1, 1) (larger than GPT-2's initialisation, so the logits of
// different tokens are far apart and greedy choices are not near-ties).
inline std::map<std::string, HostTensor> random_weights(const GptConfig& cfg, uint64_t seed) {
  GptConfig one = cfg;
  one.batch = 1;
  const GptGraph m = build_gpt(one);
  const std::vector<HostTensor> in = random_inputs(m.graph, seed);
  std::map<std::string, HostTensor> w;
  for (const Tensor& t : m.weights) {
    const std::size_t i = static_cast<std::size_t>(
        std::find(m.graph.inputs.begin(), m.graph.inputs.end(), t.id) - m.graph.inputs.begin());
    w.emplace(t.name(), in[i]);
  }
  return w;
}

// The logits [S, V] of one sequence `tokens` (padded to the model's positions) by a full
// forward on one device, no cache.
inline HostTensor full_forward_logits(const GptConfig& cfg, const std::map<std::string, HostTensor>& w,
                               const std::vector<int32_t>& tokens) {
  GptConfig one = cfg;
  one.batch = 1;
  one.annotate = false;
  GptGraph m = build_gpt(one);
  m.graph.mark_output(m.graph.tensor(m.graph.find("logits")));
  std::vector<HostTensor> in;
  for (int v : m.graph.inputs) {
    const Value& val = m.graph.values[static_cast<std::size_t>(v)];
    if (val.name == "tokens" || val.name == "labels") {
      HostTensor t(DType::i32, val.shape);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.set(i, val.name == "tokens" && i < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<std::size_t>(i)] : 0);
      in.push_back(t);
    } else {
      in.push_back(w.at(val.name));
    }
  }
  return run_reference(m.graph, in).back();
}

inline HostTensor row(const HostTensor& t, int64_t r, int64_t n) {
  HostTensor out(t.dtype(), {n});
  for (int64_t i = 0; i < n; ++i) out.set(i, t.get(r * n + i));
  return out;
}


}  // namespace infer_test
