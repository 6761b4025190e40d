// Continuous batching (tessel/infer/server.hpp): more requests than slots, each admitted into
// a free slot between decode steps and leaving when done; every token's logits equal a full
// forward of the request's tokens on one device (the oracle), on several meshes and layouts
// and admit batches; a request's tokens do not depend on the other requests, its slot or the
// mesh, and equal what static batches (GptGenerator) give; traces read and served; bad
// requests and trace files are errors naming them.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <unistd.h>

#include "../unit/test_util.hpp"
#include "infer_test_util.hpp"
#include "tessel/infer/server.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

using namespace tessel;
using namespace infer_test;

namespace {

// 9 requests of mixed prompt lengths (1..6) and max_new (1..9) for a server of 3 slots.
std::vector<ServeRequest> mixed_requests(const GptConfig& cfg, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ServeRequest> out;
  const int lens[] = {3, 6, 1, 5, 2, 6, 4, 1, 3};
  const int news[] = {7, 2, 9, 1, 5, 3, 8, 4, 6};
  for (int i = 0; i < 9; ++i) {
    ServeRequest r;
    for (int j = 0; j < lens[i]; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab)));
    r.max_new = news[i];
    out.push_back(r);
  }
  return out;
}

std::map<int64_t, ServeResult> by_id(std::vector<ServeResult> v) {
  std::map<int64_t, ServeResult> m;
  for (ServeResult& r : v) m.emplace(r.id, std::move(r));
  return m;
}

std::string write_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tessel-serve-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("continuous batching: every token's logits equal a full forward on every mesh and layout and admit batch",
          "[infer][serve][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("continuous batching against a full forward", seed, 3);
  GptConfig cfg = small_model();
  cfg.batch = 3;  // slots
  const auto w = random_weights(cfg, seed);
  const std::vector<ServeRequest> reqs = mixed_requests(cfg, seed);
  const InferLayout one = InferLayout::OneD, two = InferLayout::TwoD, gathered = InferLayout::Gathered;
  struct Run {
    const char* mesh;
    InferLayouts layouts;
    int64_t admit;
  };
  const std::vector<Run> runs = {{"data=1,model=1", {one, one}, 1},      {"data=2,model=2", {one, one}, 1},
                                 {"data=2,model=2", {one, one}, 2},      {"data=2,model=2", {gathered, two}, 3},
                                 {"model=4", {two, one}, 2},             {"data=3", {one, one}, 1}};
  std::map<int64_t, ServeResult> first;
  for (const Run& run : runs) {
    INFO("mesh " << run.mesh << ", admit " << infer_layout_name(run.layouts.prefill) << ", decode "
                 << infer_layout_name(run.layouts.decode) << ", admit batch " << run.admit);
    const Mesh mesh = gpt_mesh(Mesh::parse(run.mesh), cfg);
    ThreadRuntime rt(mesh.num_devices());
    ServerOptions so;
    so.layouts = run.layouts;
    so.admit_batch = run.admit;
    so.keep_logits = true;
    GptServer server(cfg, mesh, rt, w, /*prompt_len=*/6, so);
    for (const ServeRequest& r : reqs) server.submit(r);
    CHECK(server.waiting() == 9);
    std::vector<ServeResult> all;
    std::set<int64_t> slots_used;
    while (server.waiting() + server.running() > 0) {
      for (ServeResult& r : server.step()) all.push_back(std::move(r));
      CHECK(server.running() <= 3);
    }
    REQUIRE(all.size() == reqs.size());
    const auto got = by_id(all);
    for (const auto& [id, r] : got) {
      const ServeRequest& q = reqs[static_cast<std::size_t>(id)];
      INFO("request " << id << " (slot " << r.slot << ")");
      slots_used.insert(r.slot);
      REQUIRE(r.tokens.size() == static_cast<std::size_t>(q.max_new));
      CHECK(r.stop == "max_new");
      CHECK(r.first_token_s >= r.submitted_s);
      CHECK(r.done_s >= r.first_token_s);
      std::vector<int32_t> seq = q.prompt;
      seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
      const HostTensor full = full_forward_logits(cfg, w, seq);
      REQUIRE(r.logits.size() == r.tokens.size());
      for (std::size_t s = 0; s < r.logits.size(); ++s) {
        const int64_t at = static_cast<int64_t>(q.prompt.size() + s) - 1;  // the position this token is predicted from
        const CompareResult c = compare(r.logits[s], row(full, at, cfg.vocab));
        INFO("token " << s << ": " << c.to_string());
        CHECK(c.max_rel_err <= 1e-5);
      }
    }
    CHECK(slots_used.size() == 3);  // every slot used, and reused (9 requests)
    CHECK(server.stats().finished == 9);
    CHECK(server.stats().tokens == 45);  // 7+2+9+1+5+3+8+4+6
    // The decode steps ran only while requests ran: no step with every slot free.
    CHECK(server.stats().busy_slot_steps >= server.stats().decode_steps);
    if (first.empty()) first = got;
    for (const auto& [id, r] : got) {
      INFO("request " << id);
      CHECK(r.tokens == first.at(id).tokens);
    }
  }
}

TEST_CASE("continuous batching: a request's tokens do not depend on the others and equal static batches'",
          "[infer][serve][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("continuous batching against static batches", seed, 3);
  GptConfig cfg = small_model();
  cfg.batch = 3;
  const auto w = random_weights(cfg, seed);
  std::vector<ServeRequest> reqs = mixed_requests(cfg, seed);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=2"), cfg);
  ThreadRuntime rt(mesh.num_devices());
  GptServer server(cfg, mesh, rt, w, 6);
  // Greedy: all together against static batches of 3 (GptGenerator).
  std::vector<TraceRequest> trace;
  for (const ServeRequest& r : reqs) trace.push_back({0.0, r});
  const TraceReport cont = serve_trace(server, trace);
  GptGenerator gen(cfg, mesh, rt, w, 6);
  const TraceReport stat = serve_trace_static(gen, 3, trace);
  REQUIRE(cont.results.size() == 9);
  REQUIRE(stat.results.size() == 9);
  CHECK(cont.tokens == 45);
  CHECK(stat.tokens == 45);
  for (std::size_t i = 0; i < 9; ++i) {
    INFO("request " << i);
    CHECK(cont.results[i].tokens == stat.results[i].tokens);
    CHECK(cont.latency_s(1.0) >= cont.results[i].done_s - cont.arrival_s[i]);
  }
  CHECK(cont.summary().find("continuous batching: 9 requests, 45 tokens in") == 0);
  CHECK(stat.summary().find("static batches: 9 requests, 45 tokens in") == 0);
  // Sampled, each request with its own seed: alone on the server or among the others, the same tokens.
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.9;
    reqs[i].sampling.top_k = 16;
    reqs[i].sampling.seed = seed + i;
  }
  GptServer crowd(cfg, mesh, rt, w, 6);
  for (const ServeRequest& r : reqs) crowd.submit(r);
  const auto together = by_id(crowd.drain());
  // Request 6 alone, but as the server's seventh request (ids seed the sampler).
  GptServer alone(cfg, mesh, rt, w, 6);
  ServeRequest filler;
  filler.prompt = {1};
  filler.max_new = 1;
  for (int i = 0; i < 6; ++i) alone.submit(filler);
  alone.drain();
  CHECK(alone.submit(reqs[6]) == 6);
  const auto solo = alone.drain();
  REQUIRE(solo.size() == 1);
  CHECK(solo[0].tokens == together.at(6).tokens);
  CHECK(solo[0].tokens.size() == 8);
  // Each token drawn on the devices is the host reference's draw from its kept logits row (the
  // request's seed, its id, the token's position).
  ServerOptions keep;
  keep.keep_logits = true;
  GptServer kept(cfg, mesh, rt, w, 6, keep);
  for (const ServeRequest& r : reqs) kept.submit(r);
  int64_t checked = 0;
  for (const ServeResult& r : kept.drain()) {
    const ServeRequest& q = reqs.at(static_cast<std::size_t>(r.id));
    CHECK(r.tokens == together.at(r.id).tokens);
    REQUIRE(r.logits.size() == r.tokens.size());
    for (std::size_t i = 0; i < r.tokens.size(); ++i) {
      std::vector<float> row(static_cast<std::size_t>(cfg.vocab));
      for (int64_t v = 0; v < cfg.vocab; ++v) row[static_cast<std::size_t>(v)] = static_cast<float>(r.logits[i].get(v));
      const int64_t at = static_cast<int64_t>(q.prompt.size() + i);
      CHECK(sample_token(row.data(), cfg.vocab, q.sampling, r.id, at) == r.tokens[i]);
      ++checked;
    }
  }
  int64_t drawn = 0;
  for (const auto& [id, r] : together) drawn += static_cast<int64_t>(r.tokens.size());
  CHECK(checked == drawn);
}

TEST_CASE("continuous batching stops a request at its end token or at max_new 1 on admission or at the last position",
          "[infer][serve][integration]") {
  GptConfig cfg = small_model();
  cfg.batch = 2;
  const auto w = random_weights(cfg, 11);
  const Mesh mesh = gpt_mesh(Mesh::parse("model=2"), cfg);
  ThreadRuntime rt(mesh.num_devices());
  GptServer server(cfg, mesh, rt, w, cfg.seq);
  ServeRequest a;
  a.prompt = std::vector<int32_t>(10, 3);  // positions 10 to 15 left: six tokens
  a.max_new = 100;
  ServeRequest b;
  b.prompt = {5, 6};
  b.max_new = 1;
  server.submit(a);
  server.submit(b);
  const auto first = server.step();  // b ends at its admit; a has its first two tokens
  REQUIRE(first.size() == 1);
  CHECK(first[0].id == 1);
  CHECK(first[0].stop == "max_new");
  CHECK(first[0].tokens.size() == 1);
  CHECK(server.running() == 1);
  CHECK(server.stats().decode_steps == 1);
  const auto r = by_id(server.drain());
  REQUIRE(r.at(0).tokens.size() == 6);
  CHECK(r.at(0).stop == "positions");
  ServeRequest c = a;
  c.eos = r.at(0).tokens[0];
  server.submit(c);
  const auto e = server.drain();
  REQUIRE(e.size() == 1);
  CHECK(e[0].tokens.size() == 1);
  CHECK(e[0].stop == "eos");
}

TEST_CASE("continuous batching refuses bad requests and options naming them and extra requests wait",
          "[infer][serve][integration]") {
  GptConfig cfg = small_model();
  cfg.batch = 2;
  const auto w = random_weights(cfg, 5);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), cfg);
  ThreadRuntime rt(mesh.num_devices());
  GptServer server(cfg, mesh, rt, w, 4);
  ServeRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  CHECK_THROWS_WITH(server.submit(r), Catch::Contains("GptServer: prompt 0 has 5 tokens") && Catch::Contains("1 to 4"));
  r.prompt = {1, 64};
  CHECK_THROWS_WITH(server.submit(r), Catch::Contains("prompt 0 token 1 is 64, outside the vocabulary [0, 64)"));
  r.prompt = {1};
  r.max_new = 0;
  CHECK_THROWS_WITH(server.submit(r), Catch::Contains("request 0: max_new is 0"));
  r.max_new = 2;
  r.sampling.temperature = -1;
  CHECK_THROWS_WITH(server.submit(r), Catch::Contains("request 0: sampling temperature -1"));
  r.sampling.temperature = 0;
  CHECK(server.stats().submitted == 0);
  for (int i = 0; i < 5; ++i) CHECK(server.submit(r) == i);  // 5 requests, 2 slots: they wait
  CHECK(server.waiting() == 5);
  CHECK(server.drain().size() == 5);
  ServerOptions bad;
  bad.admit_batch = 3;
  CHECK_THROWS_WITH(GptServer(cfg, mesh, rt, w, 4, bad), Catch::Contains("admit batch 3 is outside [1, 2]"));
  bad.admit_batch = 0;
  CHECK_THROWS_WITH(GptServer(cfg, mesh, rt, w, 4, bad), Catch::Contains("admit batch 0 is outside [1, 2]"));
}

TEST_CASE("serve traces are read with every field checked and errors name the file and request and field",
          "[infer][serve][integration]") {
  const std::string good = write_file(
      "good.json",
      R"({"requests": [{"arrival_s": 0, "prompt": "The ", "max_new": 3},
                       {"arrival_s": 0.01, "tokens": [1, 2], "max_new": 2, "eos": 7, "temperature": 0.5,
                        "top_k": 4, "top_p": 0.9, "seed": 12}]})");
  const auto t = read_serve_trace(good);
  REQUIRE(t.size() == 2);
  CHECK(t[0].request.prompt == std::vector<int32_t>{'T', 'h', 'e', ' '});
  CHECK(t[1].arrival_s == 0.01);
  CHECK(t[1].request.eos == 7);
  CHECK(t[1].request.sampling.seed == 12);
  CHECK(t[1].request.sampling.top_k == 4);
  auto refused = [](const std::string& name, const std::string& text) {
    try {
      read_serve_trace(write_file(name, text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refused("a.json", R"({"requests": [{"prompt": "x", "max_nwe": 3}]})"),
             Catch::Contains("a.json: request 0 has an unknown field 'max_nwe' (known: arrival_s, prompt, tokens, max_new"));
  CHECK_THAT(refused("b.json", R"({"requests": [{"prompt": "x"}, {"prompt": "y", "max_new": "3"}]})"),
             Catch::Contains("b.json: request 1 field 'max_new': expected an integer, got \"3\""));
  CHECK_THAT(refused("c.json", R"({"requests": [{"prompt": "x", "tokens": [1]}]})"),
             Catch::Contains("c.json: request 0 has both 'prompt' and 'tokens'"));
  CHECK_THAT(refused("d.json", R"({"requests": [{"max_new": 2}]})"), Catch::Contains("d.json: request 0 has no prompt"));
  CHECK_THAT(refused("e.json", R"({"request": []})"), Catch::Contains("e.json: expected an object {\"requests\": [...]}"));
  CHECK_THAT(refused("f.json", R"({"requests": [{"prompt": "x", "top_p": 2}]})"),
             Catch::Contains("f.json request 0: sampling temperature 0") && Catch::Contains("top_p 2"));
  CHECK_THAT(refused("g.json", R"({"requests": [{"prompt": "x", "arrival_s": -1}]})"),
             Catch::Contains("g.json: request 0 field 'arrival_s': -1 is not a finite time >= 0"));
  CHECK_THAT(refused("h.json", "{"), Catch::Contains("h.json: not JSON"));
  CHECK_THAT(refused("i.json", R"({"requests": []})"), Catch::Contains("i.json: no requests"));
  CHECK_THAT(refused("j.json", R"({"requests": [{"prompt": "x"}], "slots": 4})"),
             Catch::Contains("j.json: unknown field 'slots'"));
  CHECK_THROWS_WITH(read_serve_trace("/nonexistent/trace.json"), Catch::Contains("/nonexistent/trace.json: cannot be opened"));
  // A trace out of arrival order is refused by the runner.
  GptConfig cfg = small_model();
  cfg.batch = 2;
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), cfg);
  ThreadRuntime rt(1);
  GptServer server(cfg, mesh, rt, random_weights(cfg, 2), 4);
  std::vector<TraceRequest> tr = {{0.5, {{1}, 1, -1, {}}}, {0.1, {{2}, 1, -1, {}}}};
  CHECK_THROWS_WITH(serve_trace(server, tr), Catch::Contains("request 1 arrives at 0.1 s, before request 0 (0.5 s)"));
}

TEST_CASE("serve_trace submits each request at its arrival", "[infer][serve][integration]") {
  GptConfig cfg = small_model();
  cfg.batch = 2;
  const Mesh mesh = gpt_mesh(Mesh::parse("data=2"), cfg);
  ThreadRuntime rt(2);
  GptServer server(cfg, mesh, rt, random_weights(cfg, 4), 4);
  std::vector<TraceRequest> tr = {{0.0, {{1, 2}, 3, -1, {}}}, {0.3, {{3}, 2, -1, {}}}, {0.3, {{4, 5, 6}, 4, -1, {}}}};
  const TraceReport rep = serve_trace(server, tr);
  REQUIRE(rep.results.size() == 3);
  CHECK(rep.tokens == 9);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("request " << i);
    CHECK(rep.results[i].id == static_cast<int64_t>(i));
    CHECK(rep.results[i].submitted_s >= tr[i].arrival_s);  // never before it arrived
    CHECK(rep.results[i].done_s >= rep.results[i].first_token_s);
  }
  CHECK(rep.seconds >= 0.3);
  CHECK(rep.latency_s(0.5) > 0);
}
