// GptGenerator (infer/generate.hpp): the prefill and decode programs loaded once, the weights
// put on the devices once (once per phase when the phases lay them out differently), the cache passed from prefill to the decode steps and
// donated to each; sampling on the host.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tessel/executable.hpp"
#include "tessel/infer/generate.hpp"
#include "tessel/runtime/loaded_executable.hpp"

namespace tessel {

struct GptGenerator::Programs {
  Executable prefill_exe, decode_exe;
  LoadedExecutable prefill, decode;
  std::map<std::string, ShardedArray> prefill_weights, decode_weights;
  ShardedArray positions;
  // Per cache: the decode input's layout (a prefill output in another one goes through the host).
  std::map<std::string, Sharding> cache_layout;
};

namespace {

LoadOptions decode_load_options(const GptInferGraphs& g) {
  LoadOptions o;
  o.donate = g.donations;
  return o;
}

Sharding input_layout(const Executable& exe, const std::string& name) {
  const Graph& g = exe.graph();
  for (std::size_t i = 0; i < g.inputs.size(); ++i)
    if (g.values[static_cast<std::size_t>(g.inputs[i])].name == name) {
      const Program& p = exe.program();
      return p.values[static_cast<std::size_t>(p.inputs[i])].sharding;
    }
  throw Error(fmt::format("GptGenerator: the decode program has no input '{}'", name));
}

HostTensor i32_tensor(Shape shape, const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

}  // namespace

GptGenerator::GptGenerator(GptConfig cfg, const Mesh& mesh, Runtime& runtime,
                           const std::map<std::string, HostTensor>& weights, int64_t prompt_len, InferLayouts layouts)
    : cfg_(std::move(cfg)), graphs_(build_gpt_infer(cfg_, prompt_len, layouts)) {
  graphs_.prefill.mesh = mesh;
  graphs_.decode.mesh = mesh;
  // Every weight present, of the model's type, before anything is compiled.
  for (const std::string& n : graphs_.weights) {
    const Value& v = graphs_.prefill.values[static_cast<std::size_t>(graphs_.prefill.find(n))];
    auto it = weights.find(n);
    if (it == weights.end())
      throw Error(fmt::format("GptGenerator: no weight '{}' given (a GPT of d_model {}, {} heads, {} layers, vocab "
                              "{}, {} positions needs {} weights: wte, wpe, l0_wq, ...)",
                              n, cfg_.d_model, cfg_.heads, cfg_.layers, cfg_.vocab, cfg_.seq, graphs_.weights.size()));
    if (it->second.dtype() != v.dtype || it->second.shape() != v.shape)
      throw Error(fmt::format("GptGenerator: weight '{}' is {}{}, the model (d_model {}, {} heads, {} layers, vocab "
                              "{}, {} positions) needs {}{}",
                              n, dtype_name(it->second.dtype()), shape_str(it->second.shape()), cfg_.d_model,
                              cfg_.heads, cfg_.layers, cfg_.vocab, cfg_.seq, dtype_name(v.dtype), shape_str(v.shape)));
  }
  Executable pe = compile(graphs_.prefill, mesh);
  Executable de = compile(graphs_.decode, mesh);
  LoadedExecutable pl = load(pe, runtime);
  LoadedExecutable dl = load(de, runtime, decode_load_options(graphs_));
  p_ = std::make_unique<Programs>(Programs{std::move(pe), std::move(de), std::move(pl), std::move(dl), {}, {}, {}, {}});
  // Each weight on the devices once when both phases lay it out alike (twice otherwise).
  for (const std::string& n : graphs_.weights) {
    const ShardedArray& a = p_->prefill_weights.emplace(n, p_->prefill.to_device(n, weights.at(n))).first->second;
    p_->decode_weights.emplace(n, a.sharding() == input_layout(p_->decode_exe, n) ? a : p_->decode.to_device(n, weights.at(n)));
  }
  std::vector<int32_t> pos(static_cast<std::size_t>(cfg_.seq));
  std::iota(pos.begin(), pos.end(), 0);
  p_->positions = p_->decode.to_device("positions", i32_tensor({cfg_.seq}, pos));
  for (const std::string& c : graphs_.caches) p_->cache_layout.emplace(c, input_layout(p_->decode_exe, c));
}

GptGenerator::~GptGenerator() = default;

std::vector<std::vector<int32_t>> GptGenerator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                         const GenerateOptions& o) {
  const int64_t B = cfg_.batch, T = cfg_.seq, V = cfg_.vocab;
  const int64_t P = graphs_.prefill.values[static_cast<std::size_t>(graphs_.prefill.find("tokens"))].shape[1];
  if (prompts.empty() || static_cast<int64_t>(prompts.size()) > B)
    throw Error(fmt::format("GptGenerator: {} prompts for a cache of {} sequences (give 1 to {})", prompts.size(), B,
                            B));
  if (o.max_new < 1) throw Error(fmt::format("GptGenerator: max_new is {}; give at least 1", o.max_new));
  if (!(o.sampling.temperature >= 0) || !std::isfinite(o.sampling.temperature) || o.sampling.top_k < 0 ||
      !(o.sampling.top_p > 0 && o.sampling.top_p <= 1))
    throw Error(fmt::format("GptGenerator: sampling temperature {} (finite, >= 0), top_k {} (>= 0), top_p {} (in (0, "
                            "1]) out of range",
                            o.sampling.temperature, o.sampling.top_k, o.sampling.top_p));
  std::vector<int32_t> tokens(static_cast<std::size_t>(B * P), 0), last(static_cast<std::size_t>(B), 0);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    if (p.empty() || static_cast<int64_t>(p.size()) > P)
      throw Error(fmt::format("GptGenerator: prompt {} has {} tokens; the prefill takes 1 to {} (its prompt length)", b,
                              p.size(), P));
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (p[i] < 0 || p[i] >= V)
        throw Error(fmt::format("GptGenerator: prompt {} token {} is {}, outside the vocabulary [0, {})", b, i, p[i], V));
      tokens[b * static_cast<std::size_t>(P) + i] = p[i];
    }
    last[b] = static_cast<int32_t>(p.size()) - 1;
  }
  logits_.clear();
  std::map<std::string, ShardedArray> in = p_->prefill_weights;
  in.emplace("tokens", p_->prefill.to_device("tokens", i32_tensor({B, P}, tokens)));
  in.emplace("last", p_->prefill.to_device("last", i32_tensor({B}, last)));
  RunResult r = p_->prefill.run_named(in);
  HostTensor logits = p_->prefill.to_host(p_->prefill.output(r, "logits"));
  std::map<std::string, ShardedArray> cache;
  for (const std::string& c : graphs_.caches) {
    const ShardedArray& a = p_->prefill.output(r, c);
    cache.emplace(c, a.sharding() == p_->cache_layout.at(c) ? a : p_->decode.to_device(c, p_->prefill.to_host(a)));
  }

  const std::size_t n = prompts.size();
  std::vector<std::vector<int32_t>> out(n);
  std::vector<int64_t> next_pos(n);  // the position of each sequence's newest token
  std::vector<bool> done(n, false);
  for (std::size_t b = 0; b < n; ++b) next_pos[b] = static_cast<int64_t>(prompts[b].size());
  auto sample_all = [&](const HostTensor& lg) {
    std::vector<float> row(static_cast<std::size_t>(V));
    for (std::size_t b = 0; b < n; ++b) {
      if (done[b]) continue;
      for (int64_t v = 0; v < V; ++v) row[static_cast<std::size_t>(v)] = static_cast<float>(lg.get(static_cast<int64_t>(b) * V + v));
      const int32_t t = sample_token(row.data(), V, o.sampling, static_cast<int64_t>(b), next_pos[b]);
      out[b].push_back(t);
      // Done: enough tokens, the end token, or the sequence (prompt and generated) fills the
      // model's positions (the token just sampled sits at next_pos[b]).
      if (static_cast<int64_t>(out[b].size()) >= o.max_new || t == o.eos || next_pos[b] + 1 >= T) done[b] = true;
    }
  };
  logits_.push_back(logits);
  sample_all(logits);
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    std::vector<int32_t> tok(static_cast<std::size_t>(B), 0), pos(static_cast<std::size_t>(B), 0);
    for (std::size_t b = 0; b < n; ++b) {
      tok[b] = out[b].back();
      // A finished sequence rewrites its last position with its last token (its output unused).
      pos[b] = static_cast<int32_t>(std::min(next_pos[b], T - 1));
    }
    std::map<std::string, ShardedArray> din = p_->decode_weights;
    din.emplace("token", p_->decode.to_device("token", i32_tensor({B}, tok)));
    din.emplace("pos", p_->decode.to_device("pos", i32_tensor({B}, pos)));
    din.emplace("positions", p_->positions);
    for (auto& [name, a] : cache) din.emplace(name, a);
    RunResult dr = p_->decode.run_named(din);
    for (auto& [name, a] : cache) a = p_->decode.output(dr, name + ".next");
    logits = p_->decode.to_host(p_->decode.output(dr, "logits"));
    logits_.push_back(logits);
    for (std::size_t b = 0; b < n; ++b)
      if (!done[b]) ++next_pos[b];
    sample_all(logits);
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
