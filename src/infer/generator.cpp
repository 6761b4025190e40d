// GptGenerator (infer/generate.hpp): a batch of prompts through the engine's prefill, then
// decode steps until every sequence is done, the cache kept on the devices and donated to each
// step (engine.hpp), the tokens drawn on the devices. And the layout choice by the cost model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <limits>

#include "engine.hpp"
#include "../runtime/sample_tokens_params.hpp"
#include "tessel/executable.hpp"
#include "tessel/infer/generate.hpp"

namespace tessel {

GptGenerator::GptGenerator(GptConfig cfg, const Mesh& mesh, Runtime& runtime,
                           const std::map<std::string, HostTensor>& weights, int64_t prompt_len, InferLayouts layouts)
    : cfg_(std::move(cfg)),
      engine_(std::make_unique<detail::InferEngine>(cfg_, mesh, runtime, weights, prompt_len, layouts, 0,
                                                    "GptGenerator")) {}

GptGenerator::~GptGenerator() = default;

const GptInferGraphs& GptGenerator::graphs() const { return engine_->graphs(); }

std::vector<std::vector<int32_t>> GptGenerator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                         const GenerateOptions& o) {
  const int64_t B = cfg_.batch, T = cfg_.seq;
  const int64_t P = engine_->prompt_len();
  if (prompts.empty() || static_cast<int64_t>(prompts.size()) > B)
    throw Error(fmt::format("GptGenerator: {} prompts for a cache of {} sequences (give 1 to {})", prompts.size(), B,
                            B));
  if (o.max_new < 1) throw Error(fmt::format("GptGenerator: max_new is {}; give at least 1", o.max_new));
  detail::check_sampling("GptGenerator", "", o.sampling);
  std::vector<int32_t> tokens(static_cast<std::size_t>(B * P), 0), last(static_cast<std::size_t>(B), 0);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    engine_->check_prompt(b, p);
    for (std::size_t i = 0; i < p.size(); ++i) tokens[b * static_cast<std::size_t>(P) + i] = p[i];
    last[b] = static_cast<int32_t>(p.size()) - 1;
  }
  logits_.clear();
  // The tokens are drawn on the devices and only they come back (and the logits with keep_logits).
  const std::size_t n = prompts.size();
  std::vector<std::vector<int32_t>> out(n);
  std::vector<int64_t> next_pos(n);  // the position of the token drawn next, per sequence
  std::vector<bool> done(n, false);
  for (std::size_t b = 0; b < n; ++b) next_pos[b] = static_cast<int64_t>(prompts[b].size());
  auto draws = [&]() {
    detail::Draws d(static_cast<std::size_t>(B));
    for (std::size_t b = 0; b < n; ++b) d.set(b, o.sampling, static_cast<int64_t>(b), next_pos[b]);
    return d;
  };
  auto take_all = [&](const detail::InferEngine::Step& st) {
    if (o.keep_logits) logits_.push_back(st.logits);
    for (std::size_t b = 0; b < n; ++b) {
      if (done[b]) continue;
      const int32_t t = st.tokens[b];
      out[b].push_back(t);
      // Done: enough tokens, the end token, or the sequence (prompt and generated) fills the
      // model's positions (the token just drawn sits at next_pos[b]).
      if (static_cast<int64_t>(out[b].size()) >= o.max_new || t == o.eos || next_pos[b] + 1 >= T) done[b] = true;
    }
  };
  detail::InferEngine::Caches cache;
  take_all(engine_->prefill(tokens, last, draws(), cache, o.keep_logits));
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    std::vector<int32_t> tok(static_cast<std::size_t>(B), 0), pos(static_cast<std::size_t>(B), 0);
    for (std::size_t b = 0; b < n; ++b) {
      tok[b] = out[b].back();
      // A finished sequence rewrites its last position with its last token (its output unused).
      pos[b] = static_cast<int32_t>(std::min(next_pos[b], T - 1));
      if (!done[b]) ++next_pos[b];
    }
    take_all(engine_->decode(tok, pos, draws(), cache, o.keep_logits));
  }
  return out;
}

InferLayoutChoice choose_infer_layouts(const GptConfig& cfg, const Mesh& mesh, int64_t prompt_len,
                                       const CostModel& cost) {
  const InferLayout all[] = {InferLayout::OneD, InferLayout::TwoD, InferLayout::Gathered};
  InferLayoutChoice c;
  for (int phase = 0; phase < 2; ++phase) {
    int best = 0;
    std::string line = phase == 0 ? "prefill:" : "decode:";
    for (int l = 0; l < 3; ++l) {
      GptInferGraphs g = build_gpt_infer(cfg, prompt_len, {all[l], all[l]});
      Graph& graph = phase == 0 ? g.prefill : g.decode;
      graph.mesh = mesh;
      const Executable exe = compile(graph, mesh);
      c.predicted_s[phase][l] = exe.program().compute_seconds(cost) + exe.program().comm_seconds(cost);
      if (c.predicted_s[phase][l] < c.predicted_s[phase][best]) best = l;
      line += fmt::format("{} {} {:.3g} us", l == 0 ? "" : ",", infer_layout_name(all[l]), c.predicted_s[phase][l] * 1e6);
    }
    (phase == 0 ? c.layouts.prefill : c.layouts.decode) = all[best];
    c.why += fmt::format("{}{} -> {}", phase == 0 ? "" : "; ", line, infer_layout_name(all[best]));
  }
  return c;
}

int32_t sample_key(uint64_t seed, int64_t sequence, int64_t position) {
  const uint64_t h = sample_mix64(sample_mix64(seed ^ sample_mix64(static_cast<uint64_t>(sequence))) +
                                  static_cast<uint64_t>(position));
  return static_cast<int32_t>(static_cast<uint32_t>(h >> 32));
}

// The host's reference of sample_tokens' rule (docs/ir.md), by sorting the row once: its
// kernels find the same cuts by selection (CPU) or bisection (CUDA).
int32_t sample_token(const float* logits, int64_t n, const SamplingOptions& o, int64_t sequence, int64_t position) {
  std::vector<int64_t> ids;  // the finite logits' ids, most likely first (ties: the lower id)
  for (int64_t v = 0; v < n; ++v)
    if (std::isfinite(logits[v])) ids.push_back(v);
  if (ids.empty()) return static_cast<int32_t>(n);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (!(o.temperature > 0)) return static_cast<int32_t>(ids[0]);
  const float temperature = static_cast<float>(o.temperature), top_p = static_cast<float>(o.top_p);
  // top_k: the ids at or above the k-th largest logit (ties kept).
  std::size_t keep = ids.size();
  const int64_t k = std::min<int64_t>(o.top_k, std::numeric_limits<int32_t>::max());
  if (k > 0 && static_cast<std::size_t>(k) < keep)
    while (keep > static_cast<std::size_t>(k) && logits[ids[keep - 1]] < logits[ids[static_cast<std::size_t>(k) - 1]])
      --keep;
  std::vector<double> w(static_cast<std::size_t>(n), 0.0);
  const double top = logits[ids[0]];
  double Z = 0;
  for (std::size_t i = 0; i < keep; ++i)
    Z += w[static_cast<std::size_t>(ids[i])] = std::exp((static_cast<double>(logits[ids[i]]) - top) / temperature);
  // top_p: the fewest leading groups of equal logits whose mass reaches top_p of the kept.
  if (top_p < 1) {
    double mass = 0;
    std::size_t cut = 0;
    while (cut < keep) {
      const float group = logits[ids[cut]];
      while (cut < keep && logits[ids[cut]] == group) mass += w[static_cast<std::size_t>(ids[cut++])];
      if (top_p <= 0 || mass >= static_cast<double>(top_p) * Z) break;
    }
    for (std::size_t i = cut; i < keep; ++i) w[static_cast<std::size_t>(ids[i])] = 0;
  }
  // The draw: in id order, the first whose running mass passes u of the kept mass.
  double kept = 0;
  for (double x : w) kept += x;
  const double target = sample_uniform(sample_key(o.seed, sequence, position)) * kept;
  double run = 0;
  int64_t last = -1;
  for (int64_t v = 0; v < n; ++v) {
    if (w[static_cast<std::size_t>(v)] <= 0) continue;
    last = v;
    run += w[static_cast<std::size_t>(v)];
    if (run > target) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(last);
}

}  // namespace tessel
