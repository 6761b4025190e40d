// tessel/infer/server.hpp — continuous batching: a GPT serving requests as they come. The KV
// cache's B sequences are slots; a request waits in a queue until a slot is free, its prompt's
// prefill (the admit program: the prompt's keys and values written into its slot of the
// device-resident cache) runs between decode steps, it joins the running decode batch, and it
// leaves when done (max_new tokens, its end token, or the model's last position), freeing the
// slot for the next request (Orca, Yu et al. OSDI'22; vLLM's scheduler).
//
//   tessel::GptServer server(cfg, mesh, *rt, weights, /*prompt_len=*/32);  // cfg.batch slots
//   server.submit({{1, 2, 3}, /*max_new=*/20});         // thread-safe; returns the request's id
//   server.submit({{7, 8}, 5});                         // more requests than slots: they wait
//   while (server.waiting() + server.running() > 0)
//     for (const tessel::ServeResult& r : server.step()) use(r.id, r.tokens);
//
// A request's tokens do not depend on the other requests or on the slot it got: each row of the
// decode program is its own sequence (positions after a sequence's newest masked), and
// sampling draws from (the request's seed, its id, the position) as GptGenerator draws from
// (seed, sequence, position). Under mpirun every process runs the same server: submit the same
// requests in the same order on each (serve_trace agrees on the clock for you).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/infer/generate.hpp"
#include "tessel/runtime/sharded_array.hpp"

namespace tessel {

struct ServeRequest {
  std::vector<int32_t> prompt;  // 1 to prompt_len tokens in [0, vocab)
  int64_t max_new = 16;         // >= 1
  int32_t eos = -1;             // the request ends after generating this token (-1: none)
  SamplingOptions sampling;     // greedy by default
};

struct ServeResult {
  int64_t id = -1;  // submit()'s answer: 0, 1, 2, ... in submission order
  std::vector<int32_t> tokens;
  int64_t slot = -1;  // the cache slot it ran in
  std::string stop;   // why it ended: "max_new", "eos" or "positions" (the model's last position)
  // On the server's clock (now()): when submitted, when its first token was sampled (after
  // its admit), when its last was.
  double submitted_s = 0, first_token_s = 0, done_s = 0;
  // With ServerOptions::keep_logits: the logits row [V] each token was sampled from, in order.
  std::vector<HostTensor> logits;
};

struct ServerOptions {
  InferLayouts layouts;     // the admit program uses the prefill's layout, the cache the decode's
  int64_t admit_batch = 1;  // prompts per admit run, 1 to the slots (unused rows are not written)
  bool keep_logits = false;
};

struct ServerStats {
  int64_t submitted = 0, finished = 0, tokens = 0;
  int64_t admit_runs = 0, decode_steps = 0;
  int64_t busy_slot_steps = 0;  // the running requests summed over the decode steps
  double admit_s = 0, decode_s = 0;  // wall seconds in the admit and decode runs (the draws included)
};

class GptServer {
 public:
  // cfg.batch is the number of slots. Compiles and loads the admit and decode programs on
  // `runtime` (InferEngine: the weights on the devices once per distinct layout) and puts an
  // empty cache on the devices. Throws Error naming a missing or mistyped weight, or an
  // admit_batch outside [1, cfg.batch].
  GptServer(GptConfig cfg, const Mesh& mesh, Runtime& runtime, const std::map<std::string, HostTensor>& weights,
            int64_t prompt_len, ServerOptions options = {});
  ~GptServer();
  GptServer(const GptServer&) = delete;
  GptServer& operator=(const GptServer&) = delete;

  // Queues a request (any number may wait); returns its id. Thread-safe against step() and
  // other submits. Throws Error naming the request (its would-be id) and what is wrong: an
  // empty or too long prompt, a token outside the vocabulary, max_new < 1, a sampling option
  // out of range.
  int64_t submit(ServeRequest request);
  // One iteration: waiting requests are admitted into every free slot (admit runs of up to
  // admit_batch prompts, each sampling its prompts' first token), then one decode step over the
  // running requests. Returns the requests that finished in it (possibly at their admit).
  std::vector<ServeResult> step();
  // step() until nothing waits or runs; every result, in the order they finished.
  std::vector<ServeResult> drain();

  int64_t waiting() const;
  int64_t running() const;
  int64_t slots() const { return cfg_.batch; }
  double now() const;  // seconds since construction
  const ServerStats& stats() const { return stats_; }
  const GptInferGraphs& graphs() const;

 private:
  struct Active;
  void finish(std::size_t slot, const char* why, std::vector<ServeResult>& out);
  // Takes slot's next token `t` (drawn on the devices; `logits` row `row` kept with
  // keep_logits); true when the request is done (sets `why`).
  bool take(std::size_t slot, int32_t t, const HostTensor& logits, int64_t row, const char** why);

  GptConfig cfg_;
  ServerOptions options_;
  std::unique_ptr<detail::InferEngine> engine_;
  std::map<std::string, ShardedArray> cache_;
  std::vector<std::unique_ptr<Active>> slots_;  // nullptr: free
  struct Waiting {
    int64_t id;
    ServeRequest request;
    double submitted_s;
  };
  mutable std::mutex queue_mutex_;
  std::vector<Waiting> queue_;  // FIFO
  int64_t next_id_ = 0;
  double t0_ = 0;
  ServerStats stats_;
};

// A request trace: each request with its arrival time (seconds from the trace's start).
struct TraceRequest {
  double arrival_s = 0;
  ServeRequest request;
};

// Reads a trace from a JSON file:
//   {"requests": [{"arrival_s": 0.0, "prompt": "The ", "max_new": 20}, ...]}
// per request: "prompt" (text, one token per byte) or "tokens" (a list of ids); optional
// "arrival_s" (default 0), "max_new" (16), "eos" (-1), "temperature" (0), "top_k" (0), "top_p"
// (1), "seed" (0). Throws Error naming the file, the request's index and field when a field is
// unknown (listing the known ones), mistyped or out of range; the tokens are checked against
// the model by submit().
std::vector<TraceRequest> read_serve_trace(const std::string& path);

struct TraceReport {
  std::string mode;                  // "continuous batching" or "static batches"
  std::vector<ServeResult> results;  // in trace order
  std::vector<double> arrival_s;     // in trace order, on the report's clock (0: the trace's start)
  double seconds = 0;                // from the trace's start to the last request's end
  int64_t tokens = 0;                // generated, summed over the requests
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
  // The q-quantile (0..1, nearest rank) over the requests of done - arrival (latency) and of
  // first token - arrival (time to first token).
  double latency_s(double q) const;
  double first_token_s(double q) const;
  // "continuous batching: 64 requests, 1480 tokens in 3.21 s = 461 tokens/s; latency p50 1.2 s,
  // p90 2.4 s, p99 2.9 s; first token p50 ..."
  std::string summary() const;
};

// Runs `trace` on `server` in real time: each request submitted once the clock passes its
// arrival, step() while any waits or runs (sleeping until the next arrival when idle). With a
// multi-process `agree` runtime, every decision uses rank 0's clock (Runtime::allgather_host
// each iteration), so the processes submit alike. The result times are on the trace's clock.
TraceReport serve_trace(GptServer& server, const std::vector<TraceRequest>& trace, Runtime* agree = nullptr);

// The baseline continuous batching is measured against: the requests in arrival order in
// groups of the generator's batch, each group generated whole (GptGenerator::generate with the
// group's largest max_new, every request's tokens then cut at its own max_new or end token)
// once its last request has arrived and the previous group is done; a request's first token
// and end are its group's end. Every request must use the same sampling options (Error
// otherwise: generate() takes one set).
TraceReport serve_trace_static(GptGenerator& generator, int64_t batch, const std::vector<TraceRequest>& trace,
                               Runtime* agree = nullptr);

}  // namespace tessel
