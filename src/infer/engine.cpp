// InferEngine (engine.hpp): the generation programs loaded once, the weights on the devices
// once per distinct layout, the cache kept on the devices between runs (donated to each).
#include "engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "tessel/executable.hpp"
#include "tessel/runtime/loaded_executable.hpp"

namespace tessel::detail {

struct InferEngine::Programs {
  Executable prefill_exe, decode_exe;
  LoadedExecutable prefill, decode;
  std::optional<Executable> admit_exe;
  std::optional<LoadedExecutable> admit;
  std::map<std::string, ShardedArray> prefill_weights, decode_weights, admit_weights;
  ShardedArray positions;
  // Per cache: the decode input's layout (a prefill output in another one goes through the host).
  std::map<std::string, Sharding> cache_layout;
};

namespace {

HostTensor i32_tensor(Shape shape, const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

}  // namespace

void check_sampling(const char* who, const std::string& what, const SamplingOptions& s) {
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature) || s.top_k < 0 || !(s.top_p > 0 && s.top_p <= 1))
    throw Error(fmt::format("{}: {}sampling temperature {} (finite, >= 0), top_k {} (>= 0), top_p {} (in (0, 1]) out of "
                            "range",
                            who, what.empty() ? "" : what + ": ", s.temperature, s.top_k, s.top_p));
}

InferEngine::InferEngine(const GptConfig& cfg, const Mesh& mesh, Runtime& runtime,
                         const std::map<std::string, HostTensor>& weights, int64_t prompt_len, InferLayouts layouts,
                         int64_t admit_batch, const char* who)
    : cfg_(cfg),
      graphs_(build_gpt_infer(cfg_, prompt_len, layouts, admit_batch)),
      prompt_len_(prompt_len),
      admit_batch_(admit_batch),
      who_(who) {
  graphs_.prefill.mesh = mesh;
  graphs_.decode.mesh = mesh;
  graphs_.admit.mesh = mesh;
  // Every weight present, of the model's type, before anything is compiled.
  for (const std::string& n : graphs_.weights) {
    const Value& v = graphs_.prefill.values[static_cast<std::size_t>(graphs_.prefill.find(n))];
    auto it = weights.find(n);
    if (it == weights.end())
      throw Error(fmt::format("{}: no weight '{}' given (a GPT of d_model {}, {} heads, {} layers, vocab "
                              "{}, {} positions needs {} weights: wte, wpe, l0_wq, ...)",
                              who_, n, cfg_.d_model, cfg_.heads, cfg_.layers, cfg_.vocab, cfg_.seq,
                              graphs_.weights.size()));
    if (it->second.dtype() != v.dtype || it->second.shape() != v.shape)
      throw Error(fmt::format("{}: weight '{}' is {}{}, the model (d_model {}, {} heads, {} layers, vocab "
                              "{}, {} positions) needs {}{}",
                              who_, n, dtype_name(it->second.dtype()), shape_str(it->second.shape()), cfg_.d_model,
                              cfg_.heads, cfg_.layers, cfg_.vocab, cfg_.seq, dtype_name(v.dtype), shape_str(v.shape)));
  }
  LoadOptions donate;
  donate.donate = graphs_.donations;
  Executable pe = compile(graphs_.prefill, mesh);
  Executable de = compile(graphs_.decode, mesh);
  LoadedExecutable pl = load(pe, runtime);
  LoadedExecutable dl = load(de, runtime, donate);
  p_ = std::make_unique<Programs>(
      Programs{std::move(pe), std::move(de), std::move(pl), std::move(dl), std::nullopt, std::nullopt, {}, {}, {}, {}, {}});
  if (admit_batch > 0) {
    p_->admit_exe.emplace(compile(graphs_.admit, mesh));
    p_->admit.emplace(load(*p_->admit_exe, runtime, donate));
  }
  // Each weight on the devices once per distinct layout among the programs.
  for (const std::string& n : graphs_.weights) {
    const ShardedArray& a = p_->prefill_weights.emplace(n, p_->prefill.to_device(n, weights.at(n))).first->second;
    p_->decode_weights.emplace(
        n, a.sharding() == p_->decode.input_sharding(n) ? a : p_->decode.to_device(n, weights.at(n)));
    if (admit_batch > 0)
      p_->admit_weights.emplace(
          n, a.sharding() == p_->admit->input_sharding(n) ? a : p_->admit->to_device(n, weights.at(n)));
  }
  std::vector<int32_t> pos(static_cast<std::size_t>(cfg_.seq));
  std::iota(pos.begin(), pos.end(), 0);
  p_->positions = p_->decode.to_device("positions", i32_tensor({cfg_.seq}, pos));
  for (const std::string& c : graphs_.caches) p_->cache_layout.emplace(c, p_->decode.input_sharding(c));
}

InferEngine::~InferEngine() = default;

void InferEngine::check_prompt(std::size_t index, const std::vector<int32_t>& p) const {
  if (p.empty() || static_cast<int64_t>(p.size()) > prompt_len_)
    throw Error(fmt::format("{}: prompt {} has {} tokens; the prefill takes 1 to {} (its prompt length)", who_, index,
                            p.size(), prompt_len_));
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] < 0 || p[i] >= cfg_.vocab)
      throw Error(fmt::format("{}: prompt {} token {} is {}, outside the vocabulary [0, {})", who_, index, i, p[i],
                              cfg_.vocab));
}

void Draws::set(std::size_t row, const SamplingOptions& s, int64_t sequence, int64_t position) {
  keys.at(row) = sample_key(s.seed, sequence, position);
  temperature.at(row) = static_cast<float>(s.temperature);
  top_k.at(row) = static_cast<int32_t>(std::min<int64_t>(s.top_k, std::numeric_limits<int32_t>::max()));
  top_p.at(row) = static_cast<float>(s.top_p);
}

namespace {

// The draw inputs of a run, on the devices as `prog` lays them out.
void put_draws(LoadedExecutable& prog, const Draws& d, std::map<std::string, ShardedArray>& in) {
  const int64_t R = static_cast<int64_t>(d.keys.size());
  HostTensor temperature(DType::f32, {R}), top_p(DType::f32, {R});
  for (int64_t i = 0; i < R; ++i) {
    temperature.set(i, d.temperature[static_cast<std::size_t>(i)]);
    top_p.set(i, d.top_p[static_cast<std::size_t>(i)]);
  }
  in.emplace("sample_keys", prog.to_device("sample_keys", i32_tensor({R}, d.keys)));
  in.emplace("temperature", prog.to_device("temperature", temperature));
  in.emplace("top_k", prog.to_device("top_k", i32_tensor({R}, d.top_k)));
  in.emplace("top_p", prog.to_device("top_p", top_p));
}

// The tokens (and, when asked, the logits) of a run, checked: a row without a finite logit
// gives an id outside the vocabulary.
InferEngine::Step fetch(LoadedExecutable& prog, const RunResult& r, bool logits, int64_t vocab, const char* who) {
  InferEngine::Step out;
  const HostTensor t = prog.to_host(prog.output(r, "next_token"));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t id = static_cast<int64_t>(t.get(i));
    if (id < 0 || id >= vocab)
      throw Error(fmt::format("{}: sequence {} has no token to draw (none of its logits is a finite number)", who, i));
    out.tokens.push_back(static_cast<int32_t>(id));
  }
  if (logits) out.logits = prog.to_host(prog.output(r, "logits"));
  return out;
}

}  // namespace

InferEngine::Step InferEngine::prefill(const std::vector<int32_t>& tokens, const std::vector<int32_t>& last,
                                       const Draws& draws, Caches& caches, bool logits) {
  const int64_t B = cfg_.batch, P = prompt_len_;
  std::map<std::string, ShardedArray> in = p_->prefill_weights;
  in.emplace("tokens", p_->prefill.to_device("tokens", i32_tensor({B, P}, tokens)));
  in.emplace("last", p_->prefill.to_device("last", i32_tensor({B}, last)));
  put_draws(p_->prefill, draws, in);
  RunResult r = p_->prefill.run_named(in);
  Step out = fetch(p_->prefill, r, logits, cfg_.vocab, who_);
  caches.clear();
  for (const std::string& c : graphs_.caches) {
    const ShardedArray& a = p_->prefill.output(r, c);
    caches.emplace(c, a.sharding() == p_->cache_layout.at(c) ? a : p_->decode.to_device(c, p_->prefill.to_host(a)));
  }
  return out;
}

InferEngine::Step InferEngine::decode(const std::vector<int32_t>& token, const std::vector<int32_t>& pos,
                                      const Draws& draws, Caches& caches, bool logits) {
  const int64_t B = cfg_.batch;
  std::map<std::string, ShardedArray> in = p_->decode_weights;
  in.emplace("token", p_->decode.to_device("token", i32_tensor({B}, token)));
  in.emplace("pos", p_->decode.to_device("pos", i32_tensor({B}, pos)));
  in.emplace("positions", p_->positions);
  put_draws(p_->decode, draws, in);
  for (auto& [name, a] : caches) in.emplace(name, a);
  RunResult r = p_->decode.run_named(in);
  for (auto& [name, a] : caches) a = p_->decode.output(r, name + ".next");
  return fetch(p_->decode, r, logits, cfg_.vocab, who_);
}

InferEngine::Step InferEngine::admit(const std::vector<int32_t>& tokens, const std::vector<int32_t>& last,
                                     const std::vector<int32_t>& slots, const Draws& draws, Caches& caches,
                                     bool logits) {
  if (admit_batch_ < 1) throw Error(fmt::format("{}: built without an admit program (admit batch 0)", who_));
  const int64_t A = admit_batch_, P = prompt_len_;
  std::map<std::string, ShardedArray> in = p_->admit_weights;
  LoadedExecutable& admit = *p_->admit;
  in.emplace("tokens", admit.to_device("tokens", i32_tensor({A, P}, tokens)));
  in.emplace("last", admit.to_device("last", i32_tensor({A}, last)));
  in.emplace("slots", admit.to_device("slots", i32_tensor({A}, slots)));
  put_draws(admit, draws, in);
  for (auto& [name, a] : caches) in.emplace(name, a);
  RunResult r = admit.run_named(in);
  for (auto& [name, a] : caches) a = admit.output(r, name + ".next");
  return fetch(admit, r, logits, cfg_.vocab, who_);
}

InferEngine::Caches InferEngine::empty_caches() const {
  const int64_t H = gpt_kv_heads(cfg_), K = cfg_.d_model / cfg_.heads;
  Caches out;
  const HostTensor zero(cfg_.compute, {cfg_.batch, cfg_.seq, H, K});
  for (const std::string& c : graphs_.caches) out.emplace(c, p_->decode.to_device(c, zero));
  return out;
}

}  // namespace tessel::detail
