// GptGenerator (infer/generate.hpp): a batch of prompts through the engine's prefill, then
// decode steps until every sequence is done, the cache kept on the devices and donated to each
// step (engine.hpp); sampling on the host. And the layout choice by the cost model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "engine.hpp"
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
  const int64_t B = cfg_.batch, T = cfg_.seq, V = cfg_.vocab;
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
  // Greedy without keep_logits: the tokens are chosen on the devices and only they come back.
  const bool greedy = o.sampling.temperature == 0;
  const bool want_logits = o.keep_logits || !greedy;
  detail::InferEngine::Caches cache;
  detail::InferEngine::Step step = engine_->prefill(tokens, last, cache, want_logits);

  const std::size_t n = prompts.size();
  std::vector<std::vector<int32_t>> out(n);
  std::vector<int64_t> next_pos(n);  // the position of each sequence's newest token
  std::vector<bool> done(n, false);
  for (std::size_t b = 0; b < n; ++b) next_pos[b] = static_cast<int64_t>(prompts[b].size());
  auto sample_all = [&](const detail::InferEngine::Step& st) {
    std::vector<float> row(static_cast<std::size_t>(V));
    for (std::size_t b = 0; b < n; ++b) {
      if (done[b]) continue;
      int32_t t = st.greedy[b];
      if (!greedy) {
        for (int64_t v = 0; v < V; ++v)
          row[static_cast<std::size_t>(v)] = static_cast<float>(st.logits.get(static_cast<int64_t>(b) * V + v));
        t = sample_token(row.data(), V, o.sampling, static_cast<int64_t>(b), next_pos[b]);
      }
      out[b].push_back(t);
      // Done: enough tokens, the end token, or the sequence (prompt and generated) fills the
      // model's positions (the token just sampled sits at next_pos[b]).
      if (static_cast<int64_t>(out[b].size()) >= o.max_new || t == o.eos || next_pos[b] + 1 >= T) done[b] = true;
    }
  };
  if (o.keep_logits) logits_.push_back(step.logits);
  sample_all(step);
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    std::vector<int32_t> tok(static_cast<std::size_t>(B), 0), pos(static_cast<std::size_t>(B), 0);
    for (std::size_t b = 0; b < n; ++b) {
      tok[b] = out[b].back();
      // A finished sequence rewrites its last position with its last token (its output unused).
      pos[b] = static_cast<int32_t>(std::min(next_pos[b], T - 1));
    }
    step = engine_->decode(tok, pos, cache, want_logits);
    if (o.keep_logits) logits_.push_back(step.logits);
    for (std::size_t b = 0; b < n; ++b)
      if (!done[b]) ++next_pos[b];
    sample_all(step);
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

int32_t sample_token(const float* logits, int64_t n, const SamplingOptions& o, int64_t sequence, int64_t position) {
  if (o.temperature == 0) {
    int64_t best = 0;
    for (int64_t v = 1; v < n; ++v)
      if (logits[v] > logits[best]) best = v;
    return static_cast<int32_t>(best);
  }
  // Candidates, most likely first (ties: the lower id), cut to top_k and to the top_p mass.
  std::vector<int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  std::size_t keep = ids.size();
  if (o.top_k > 0) keep = std::min<std::size_t>(keep, static_cast<std::size_t>(o.top_k));
  std::vector<double> p(keep);
  const double top = static_cast<double>(logits[ids[0]]) / o.temperature;
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(static_cast<double>(logits[ids[i]]) / o.temperature - top);
  if (o.top_p < 1) {
    double mass = 0;
    std::size_t cut = 0;
    while (cut < keep && mass < o.top_p * sum) mass += p[cut++];
    keep = std::max<std::size_t>(1, cut);
    p.resize(keep);
  }
  std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32), static_cast<uint32_t>(sequence),
                    static_cast<uint32_t>(position)};
  std::mt19937_64 rng(seq);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double u = std::uniform_real_distribution<double>(0, total)(rng);
  for (std::size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return static_cast<int32_t>(ids[i]);
    u -= p[i];
  }
  return static_cast<int32_t>(ids[keep - 1]);
}

}  // namespace tessel
