// GptServer (infer/server.hpp): continuous batching over the engine's admit and decode
// programs (engine.hpp), the cache's sequences as slots; and the request traces it serves.
#include "tessel/infer/server.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine.hpp"

namespace tessel {

namespace {

double clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct GptServer::Active {
  int64_t id;
  ServeRequest request;
  ServeResult result;
  int64_t next_pos = 0;  // the position of the newest token (the one the next decode step feeds)
};

GptServer::GptServer(GptConfig cfg, const Mesh& mesh, Runtime& runtime, const std::map<std::string, HostTensor>& weights,
                     int64_t prompt_len, ServerOptions options)
    : cfg_(std::move(cfg)), options_(options) {
  if (options_.admit_batch < 1 || options_.admit_batch > cfg_.batch)
    throw Error(fmt::format("GptServer: admit batch {} is outside [1, {}] (the slots, cfg.batch)", options_.admit_batch,
                            cfg_.batch));
  engine_ = std::make_unique<detail::InferEngine>(cfg_, mesh, runtime, weights, prompt_len, options_.layouts,
                                                  options_.admit_batch, "GptServer");
  cache_ = engine_->empty_caches();
  slots_.resize(static_cast<std::size_t>(cfg_.batch));
  t0_ = clock_s();
}

GptServer::~GptServer() = default;

const GptInferGraphs& GptServer::graphs() const { return engine_->graphs(); }

double GptServer::now() const { return clock_s() - t0_; }

int64_t GptServer::waiting() const {
  std::lock_guard<std::mutex> lock(queue_mutex_);
  return static_cast<int64_t>(queue_.size());
}

int64_t GptServer::running() const {
  return static_cast<int64_t>(std::count_if(slots_.begin(), slots_.end(), [](const auto& a) { return a != nullptr; }));
}

int64_t GptServer::submit(ServeRequest r) {
  std::lock_guard<std::mutex> lock(queue_mutex_);
  const int64_t id = next_id_;
  engine_->check_prompt(static_cast<std::size_t>(id), r.prompt);
  if (r.max_new < 1) throw Error(fmt::format("GptServer: request {}: max_new is {}; give at least 1", id, r.max_new));
  detail::check_sampling("GptServer", fmt::format("request {}", id), r.sampling);
  ++next_id_;
  ++stats_.submitted;
  queue_.push_back(Waiting{id, std::move(r), now()});
  return id;
}

bool GptServer::take(std::size_t slot, int32_t t, const HostTensor& logits, int64_t row, const char** why) {
  Active& a = *slots_[slot];
  const int64_t V = cfg_.vocab;
  a.result.tokens.push_back(t);
  if (options_.keep_logits) {
    HostTensor r(DType::f32, {V});
    for (int64_t v = 0; v < V; ++v) r.set(v, logits.get(row * V + v));
    a.result.logits.push_back(std::move(r));
  }
  ++stats_.tokens;
  // Done: enough tokens, the end token, or the sequence fills the model's positions (the token
  // just sampled sits at next_pos).
  if (static_cast<int64_t>(a.result.tokens.size()) >= a.request.max_new) *why = "max_new";
  else if (t == a.request.eos) *why = "eos";
  else if (a.next_pos + 1 >= cfg_.seq) *why = "positions";
  else return false;
  return true;
}

void GptServer::finish(std::size_t slot, const char* why, std::vector<ServeResult>& out) {
  Active& a = *slots_[slot];
  a.result.stop = why;
  a.result.done_s = now();
  ++stats_.finished;
  out.push_back(std::move(a.result));
  slots_[slot].reset();
}

std::vector<ServeResult> GptServer::step() {
  std::vector<ServeResult> done;
  const int64_t P = engine_->prompt_len(), A = options_.admit_batch;
  // Admit into every free slot, admit_batch prompts per run.
  for (;;) {
    std::vector<std::size_t> free;
    for (std::size_t s = 0; s < slots_.size(); ++s)
      if (!slots_[s]) free.push_back(s);
    std::vector<Waiting> batch;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      const std::size_t n = std::min({free.size(), queue_.size(), static_cast<std::size_t>(A)});
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (batch.empty()) break;
    const double t = clock_s();
    std::vector<int32_t> tokens(static_cast<std::size_t>(A * P), 0), last(static_cast<std::size_t>(A), 0),
        slot_of(static_cast<std::size_t>(A), -1);
    detail::Draws draws(static_cast<std::size_t>(A));
    // Rows past the admitted prompts repeat the last one, prompt and slot: the same values
    // written to the same slot again.
    for (std::size_t j = 0; j < static_cast<std::size_t>(A); ++j) {
      const std::size_t from = std::min(j, batch.size() - 1);
      const std::vector<int32_t>& p = batch[from].request.prompt;
      std::copy(p.begin(), p.end(), tokens.begin() + static_cast<std::ptrdiff_t>(j * static_cast<std::size_t>(P)));
      last[j] = static_cast<int32_t>(p.size()) - 1;
      slot_of[j] = static_cast<int32_t>(free[from]);
      draws.set(j, batch[from].request.sampling, batch[from].id, static_cast<int64_t>(p.size()));
    }
    const detail::InferEngine::Step st = engine_->admit(tokens, last, slot_of, draws, cache_, options_.keep_logits);
    ++stats_.admit_runs;
    for (std::size_t j = 0; j < batch.size(); ++j) {
      const std::size_t s = free[j];
      auto a = std::make_unique<Active>();
      a->id = batch[j].id;
      a->next_pos = static_cast<int64_t>(batch[j].request.prompt.size());
      a->result.id = a->id;
      a->result.slot = static_cast<int64_t>(s);
      a->result.submitted_s = batch[j].submitted_s;
      a->request = std::move(batch[j].request);
      slots_[s] = std::move(a);
      const char* why = nullptr;
      const bool end = take(s, st.tokens[j], st.logits, static_cast<int64_t>(j), &why);
      slots_[s]->result.first_token_s = now();
      if (end) finish(s, why, done);
    }
    stats_.admit_s += clock_s() - t;
  }
  // One decode step over the running requests (a free slot feeds token 0 at position 0: its
  // row is rewritten whole by the admit that next fills it).
  if (running() > 0) {
    const double t = clock_s();
    const std::size_t B = slots_.size();
    std::vector<int32_t> tok(B, 0), pos(B, 0);
    detail::Draws draws(B);
    for (std::size_t s = 0; s < B; ++s)
      if (slots_[s]) {
        const Active& a = *slots_[s];
        tok[s] = a.result.tokens.back();
        pos[s] = static_cast<int32_t>(a.next_pos);
        draws.set(s, a.request.sampling, a.id, a.next_pos + 1);  // the drawn token's position
      }
    const detail::InferEngine::Step st = engine_->decode(tok, pos, draws, cache_, options_.keep_logits);
    ++stats_.decode_steps;
    for (std::size_t s = 0; s < B; ++s) {
      if (!slots_[s]) continue;
      ++stats_.busy_slot_steps;
      ++slots_[s]->next_pos;
      const char* why = nullptr;
      if (take(s, st.tokens[s], st.logits, static_cast<int64_t>(s), &why)) finish(s, why, done);
    }
    stats_.decode_s += clock_s() - t;
  }
  return done;
}

std::vector<ServeResult> GptServer::drain() {
  std::vector<ServeResult> all;
  while (waiting() + running() > 0)
    for (ServeResult& r : step()) all.push_back(std::move(r));
  return all;
}

// ---- traces ----

std::vector<TraceRequest> read_serve_trace(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("serve trace {}: cannot be opened", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(fmt::format("serve trace {}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("requests") || !j["requests"].is_array())
    throw Error(fmt::format("serve trace {}: expected an object {{\"requests\": [...]}}", path));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "requests")
      throw Error(fmt::format("serve trace {}: unknown field '{}' (the file holds one field, \"requests\")", path, it.key()));
  static const char* known = "arrival_s, prompt, tokens, max_new, eos, temperature, top_k, top_p, seed";
  std::vector<TraceRequest> out;
  std::size_t i = 0;
  for (const nlohmann::json& r : j["requests"]) {
    auto where = [&](const std::string& field) { return fmt::format("serve trace {}: request {} field '{}'", path, i, field); };
    if (!r.is_object()) throw Error(fmt::format("serve trace {}: request {} is not an object", path, i));
    TraceRequest t;
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string& k = it.key();
      const nlohmann::json& v = it.value();
      auto number = [&]() {
        if (!v.is_number()) throw Error(fmt::format("{}: expected a number, got {}", where(k), v.dump()));
        return v.get<double>();
      };
      auto integer = [&]() {
        if (!v.is_number_integer()) throw Error(fmt::format("{}: expected an integer, got {}", where(k), v.dump()));
        return v.get<int64_t>();
      };
      if (k == "arrival_s") {
        t.arrival_s = number();
        if (!(t.arrival_s >= 0) || !std::isfinite(t.arrival_s))
          throw Error(fmt::format("{}: {} is not a finite time >= 0", where(k), t.arrival_s));
      } else if (k == "prompt") {
        if (!v.is_string()) throw Error(fmt::format("{}: expected text, got {}", where(k), v.dump()));
        for (unsigned char c : v.get<std::string>()) t.request.prompt.push_back(c);
      } else if (k == "tokens") {
        if (!v.is_array()) throw Error(fmt::format("{}: expected a list of token ids, got {}", where(k), v.dump()));
        for (const nlohmann::json& x : v) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
            throw Error(fmt::format("{}: {} is not a token id (an integer >= 0)", where(k), x.dump()));
          t.request.prompt.push_back(static_cast<int32_t>(x.get<int64_t>()));
        }
      } else if (k == "max_new") {
        t.request.max_new = integer();
        if (t.request.max_new < 1) throw Error(fmt::format("{}: {} (give at least 1)", where(k), t.request.max_new));
      } else if (k == "eos") {
        const int64_t e = integer();
        if (e < -1 || e > INT32_MAX) throw Error(fmt::format("{}: {} is not a token id or -1", where(k), e));
        t.request.eos = static_cast<int32_t>(e);
      } else if (k == "temperature") {
        t.request.sampling.temperature = number();
      } else if (k == "top_k") {
        t.request.sampling.top_k = integer();
      } else if (k == "top_p") {
        t.request.sampling.top_p = number();
      } else if (k == "seed") {
        if (!v.is_number_unsigned()) throw Error(fmt::format("{}: expected an integer >= 0, got {}", where(k), v.dump()));
        t.request.sampling.seed = v.get<uint64_t>();
      } else {
        throw Error(fmt::format("serve trace {}: request {} has an unknown field '{}' (known: {})", path, i, k, known));
      }
    }
    if (r.contains("prompt") && r.contains("tokens"))
      throw Error(fmt::format("serve trace {}: request {} has both 'prompt' and 'tokens' (give one)", path, i));
    if (t.request.prompt.empty())
      throw Error(fmt::format("serve trace {}: request {} has no prompt (give \"prompt\": text or \"tokens\": ids)", path, i));
    detail::check_sampling("serve trace", fmt::format("{} request {}", path, i), t.request.sampling);
    out.push_back(std::move(t));
    ++i;
  }
  if (out.empty()) throw Error(fmt::format("serve trace {}: no requests", path));
  return out;
}

namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * static_cast<double>(v.size()));
  const std::size_t i = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size()))) - 1;
  return v[i];
}

// The clock every process decides by: rank 0's seconds since `t0` (its own where alone).
double agreed_now(Runtime* agree, double t0) {
  const double mine = clock_s() - t0;
  if (!agree) return mine;
  const std::vector<std::string> all = agree->allgather_host(fmt::format("{:.17g}", mine));
  return std::stod(all.at(0));
}

void check_arrivals(const std::vector<TraceRequest>& trace) {
  if (trace.empty()) throw Error("serve_trace: an empty trace");
  for (std::size_t i = 1; i < trace.size(); ++i)
    if (trace[i].arrival_s < trace[i - 1].arrival_s)
      throw Error(fmt::format("serve_trace: request {} arrives at {} s, before request {} ({} s): a trace is in "
                              "arrival order",
                              i, trace[i].arrival_s, i - 1, trace[i - 1].arrival_s));
}

void sleep_until(double t0, double t) {
  const double wait = t - (clock_s() - t0);
  if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

}  // namespace

double TraceReport::latency_s(double q) const {
  std::vector<double> v;
  for (std::size_t i = 0; i < results.size(); ++i) v.push_back(results[i].done_s - arrival_s[i]);
  return quantile(v, q);
}

double TraceReport::first_token_s(double q) const {
  std::vector<double> v;
  for (std::size_t i = 0; i < results.size(); ++i) v.push_back(results[i].first_token_s - arrival_s[i]);
  return quantile(v, q);
}

std::string TraceReport::summary() const {
  return fmt::format("{}: {} requests, {} tokens in {:.3f} s = {:.1f} tokens/s; latency p50 {:.3f} s, p90 {:.3f} s, "
                     "p99 {:.3f} s; first token p50 {:.3f} s, p90 {:.3f} s, p99 {:.3f} s",
                     mode, results.size(), tokens, seconds, tokens_per_s(), latency_s(0.5), latency_s(0.9),
                     latency_s(0.99), first_token_s(0.5), first_token_s(0.9), first_token_s(0.99));
}

TraceReport serve_trace(GptServer& server, const std::vector<TraceRequest>& trace, Runtime* agree) {
  check_arrivals(trace);
  TraceReport rep;
  rep.mode = "continuous batching";
  rep.results.resize(trace.size());
  for (const TraceRequest& t : trace) rep.arrival_s.push_back(t.arrival_s);
  const double t0 = clock_s();
  const double server_t0 = server.now();  // the server's clock at the trace's start
  std::size_t next = 0, finished = 0;
  std::map<int64_t, std::size_t> index_of;  // server id -> trace index
  while (finished < trace.size()) {
    const double now = agreed_now(agree, t0);
    while (next < trace.size() && trace[next].arrival_s <= now) {
      index_of[server.submit(trace[next].request)] = next;
      ++next;
    }
    if (server.waiting() + server.running() == 0) {  // idle until the next arrival
      sleep_until(t0, trace[next].arrival_s);
      continue;
    }
    for (ServeResult& r : server.step()) {
      const std::size_t i = index_of.at(r.id);
      r.submitted_s -= server_t0;
      r.first_token_s -= server_t0;
      r.done_s -= server_t0;
      rep.tokens += static_cast<int64_t>(r.tokens.size());
      rep.seconds = std::max(rep.seconds, r.done_s);
      rep.results[i] = std::move(r);
      ++finished;
    }
  }
  return rep;
}

TraceReport serve_trace_static(GptGenerator& generator, int64_t batch, const std::vector<TraceRequest>& trace,
                               Runtime* agree) {
  check_arrivals(trace);
  if (batch < 1) throw Error(fmt::format("serve_trace_static: batch {} (give at least 1)", batch));
  const SamplingOptions& s0 = trace[0].request.sampling;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const SamplingOptions& s = trace[i].request.sampling;
    if (s.temperature != s0.temperature || s.top_k != s0.top_k || s.top_p != s0.top_p || s.seed != s0.seed ||
        trace[i].request.eos != trace[0].request.eos)
      throw Error(fmt::format("serve_trace_static: request {} samples or ends unlike request 0 (static batches run "
                              "one GptGenerator::generate per group, with one set of options)",
                              i));
  }
  TraceReport rep;
  rep.mode = "static batches";
  rep.results.resize(trace.size());
  for (const TraceRequest& t : trace) rep.arrival_s.push_back(t.arrival_s);
  const double t0 = clock_s();
  for (std::size_t g = 0; g < trace.size(); g += static_cast<std::size_t>(batch)) {
    const std::size_t end = std::min(trace.size(), g + static_cast<std::size_t>(batch));
    // The group starts once its last request has arrived (on rank 0's clock).
    while (agreed_now(agree, t0) < trace[end - 1].arrival_s) sleep_until(t0, trace[end - 1].arrival_s);
    std::vector<std::vector<int32_t>> prompts;
    GenerateOptions o;
    o.max_new = 1;
    o.eos = trace[g].request.eos;
    o.sampling = s0;
    for (std::size_t i = g; i < end; ++i) {
      prompts.push_back(trace[i].request.prompt);
      o.max_new = std::max(o.max_new, trace[i].request.max_new);
    }
    const double start = clock_s() - t0;
    const std::vector<std::vector<int32_t>> out = generator.generate(prompts, o);
    const double stop = clock_s() - t0;
    for (std::size_t i = g; i < end; ++i) {
      ServeResult& r = rep.results[i];
      r.id = static_cast<int64_t>(i);
      r.slot = static_cast<int64_t>(i - g);
      const std::vector<int32_t>& all = out[i - g];
      const std::size_t keep = std::min(all.size(), static_cast<std::size_t>(trace[i].request.max_new));
      r.tokens.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep));
      r.stop = keep < all.size() || static_cast<int64_t>(keep) == trace[i].request.max_new ? "max_new"
               : (!r.tokens.empty() && r.tokens.back() == o.eos) ? "eos"
                                                                  : "positions";
      r.submitted_s = start;
      r.first_token_s = stop;
      r.done_s = stop;
      rep.tokens += static_cast<int64_t>(r.tokens.size());
      rep.seconds = std::max(rep.seconds, stop);
    }
  }
  return rep;
}

}  // namespace tessel
