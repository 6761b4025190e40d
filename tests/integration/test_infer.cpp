// Generation with a KV cache (tessel/infer/generate.hpp): every step's logits (the prefill's
// and each decode step's) equal a full forward of the same tokens on one device (the
// reference executor, no cache); greedy and seeded sampled tokens are the same on one device,
// data=2,model=2, model=4 and data=4, for every layout of each phase (1D and 2D
// weight-stationary, weight-gathered); bad prompts and weights are errors naming them.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <random>

#include "../unit/test_util.hpp"
#include "infer_test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/infer/generate.hpp"
#include "tessel/infer/server.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;
using namespace infer_test;

TEST_CASE("gpt generation: each step's logits equal a full forward and the tokens agree on every mesh and layout",
          "[infer][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpt generation against a full forward", seed, 3);
  const GptConfig cfg = small_model();
  const auto w = random_weights(cfg, seed);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {3, 5, 1, 6}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab)));
    prompts.push_back(p);
  }
  GenerateOptions greedy;
  greedy.max_new = 6;
  greedy.keep_logits = true;
  GenerateOptions sampled = greedy;
  sampled.sampling.temperature = 0.8;
  sampled.sampling.top_k = 20;
  sampled.sampling.top_p = 0.9;
  sampled.sampling.seed = seed;
  std::vector<std::vector<int32_t>> greedy_first, sampled_first;
  const InferLayout one = InferLayout::OneD, two = InferLayout::TwoD, gathered = InferLayout::Gathered;
  const std::vector<std::pair<const char*, InferLayouts>> runs = {
      {"data=1,model=1", {one, one}},           {"data=2,model=2", {one, one}},
      {"data=2,model=2", {two, two}},           {"data=2,model=2", {gathered, gathered}},
      {"data=2,model=2", {gathered, two}},      {"model=4", {one, one}},
      {"data=4", {gathered, one}}};
  for (const auto& [mesh_text, layouts] : runs) {
    INFO("mesh " << mesh_text << ", prefill " << infer_layout_name(layouts.prefill) << ", decode "
                 << infer_layout_name(layouts.decode));
    const Mesh mesh = gpt_mesh(Mesh::parse(mesh_text), cfg);
    ThreadRuntime rt(mesh.num_devices());
    GptGenerator gen(cfg, mesh, rt, w, /*prompt_len=*/6, layouts);
    const auto out = gen.generate(prompts, greedy);
    REQUIRE(out.size() == prompts.size());
    // Every step's logits against the full forward of the prompt and the tokens so far.
    const auto& steps = gen.step_logits();
    REQUIRE(steps.size() == static_cast<std::size_t>(greedy.max_new));
    for (std::size_t b = 0; b < prompts.size(); ++b) {
      REQUIRE(out[b].size() == static_cast<std::size_t>(greedy.max_new));
      std::vector<int32_t> seq = prompts[b];
      seq.insert(seq.end(), out[b].begin(), out[b].end());
      const HostTensor full = full_forward_logits(cfg, w, seq);
      for (std::size_t s = 0; s < steps.size(); ++s) {
        const int64_t at = static_cast<int64_t>(prompts[b].size() + s) - 1;  // the position the step predicts from
        const CompareResult c = compare(row(steps[s], static_cast<int64_t>(b), cfg.vocab), row(full, at, cfg.vocab));
        INFO("sequence " << b << " step " << s << ": " << c.to_string());
        CHECK(c.max_rel_err <= 1e-5);
      }
    }
    if (greedy_first.empty()) greedy_first = out;
    CHECK(out == greedy_first);
    // Greedy without keep_logits: the tokens chosen on the devices, no logits brought back.
    GenerateOptions lean = greedy;
    lean.keep_logits = false;
    CHECK(gen.generate(prompts, lean) == out);
    CHECK(gen.step_logits().empty());
    // And they are the host's greedy choice from each kept row (the lowest id on a tie).
    for (std::size_t b = 0; b < prompts.size(); ++b)
      for (std::size_t s = 0; s < steps.size(); ++s) {
        std::vector<float> r(static_cast<std::size_t>(cfg.vocab));
        for (int64_t v = 0; v < cfg.vocab; ++v)
          r[static_cast<std::size_t>(v)] = static_cast<float>(steps[s].get(static_cast<int64_t>(b) * cfg.vocab + v));
        CHECK(sample_token(r.data(), cfg.vocab, SamplingOptions{}, static_cast<int64_t>(b), 0) == out[b][s]);
      }
    const auto s = gen.generate(prompts, sampled);
    if (sampled_first.empty()) sampled_first = s;
    CHECK(s == sampled_first);
    // Each drawn on the devices is the host reference's draw from the step's kept row.
    const auto& sampled_steps = gen.step_logits();
    for (std::size_t b = 0; b < prompts.size(); ++b)
      for (std::size_t i = 0; i < s[b].size(); ++i) {
        std::vector<float> r(static_cast<std::size_t>(cfg.vocab));
        for (int64_t v = 0; v < cfg.vocab; ++v)
          r[static_cast<std::size_t>(v)] =
              static_cast<float>(sampled_steps.at(i).get(static_cast<int64_t>(b) * cfg.vocab + v));
        const int64_t at = static_cast<int64_t>(prompts[b].size() + i);  // the drawn token's position
        CHECK(sample_token(r.data(), cfg.vocab, sampled.sampling, static_cast<int64_t>(b), at) == s[b][i]);
      }
    // The sampler is not greedy: at temperature 8 over all 64 tokens (at 0.8 with top-k 20 and
    // top-p 0.9 the drawn tokens can all be the greedy ones: seed 1796312963487288152).
    GenerateOptions hot = sampled;
    hot.sampling.temperature = 8;
    hot.sampling.top_k = 0;
    hot.sampling.top_p = 1;
    CHECK(gen.generate(prompts, hot) != out);
  }
}

TEST_CASE("grouped- and multi-query generation: each step's logits equal a full forward on every mesh and layout",
          "[infer][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("grouped-query generation against a full forward", seed, 3);
  for (int64_t kv : {1, 2}) {
    GptConfig cfg = small_model();
    cfg.kv_heads = kv;  // 4 query heads: multi-query (1) and grouped-query (2 groups of 2)
    const auto w = random_weights(cfg, seed + static_cast<uint64_t>(kv));
    CHECK(w.at("l0_wk").shape() == Shape{32, kv, 8});
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> prompts;
    for (int len : {4, 2, 6, 1}) {
      std::vector<int32_t> p;
      for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab)));
      prompts.push_back(p);
    }
    GenerateOptions o;
    o.max_new = 5;
    o.keep_logits = true;
    const InferLayout one = InferLayout::OneD, two = InferLayout::TwoD, gathered = InferLayout::Gathered;
    std::vector<std::vector<int32_t>> first;
    for (const auto& [mesh_text, layouts] : std::vector<std::pair<const char*, InferLayouts>>{
             {"data=1,model=1", {one, one}}, {"data=2,model=2", {one, one}}, {"model=4", {one, one}},
             {"data=2,model=2", {two, two}}, {"data=2,model=2", {gathered, one}}, {"model=2", {one, two}}}) {
      INFO("kv_heads " << kv << ", mesh " << mesh_text << ", prefill " << infer_layout_name(layouts.prefill)
                       << ", decode " << infer_layout_name(layouts.decode));
      const Mesh mesh = gpt_mesh(Mesh::parse(mesh_text), cfg);
      ThreadRuntime rt(mesh.num_devices());
      GptGenerator gen(cfg, mesh, rt, w, 6, layouts);
      const auto out = gen.generate(prompts, o);
      const auto& steps = gen.step_logits();
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        std::vector<int32_t> seq = prompts[b];
        seq.insert(seq.end(), out[b].begin(), out[b].end());
        const HostTensor full = full_forward_logits(cfg, w, seq);
        for (std::size_t st = 0; st < steps.size(); ++st) {
          const int64_t at = static_cast<int64_t>(prompts[b].size() + st) - 1;
          const CompareResult c = compare(row(steps[st], static_cast<int64_t>(b), cfg.vocab), row(full, at, cfg.vocab));
          INFO("sequence " << b << " step " << st << ": " << c.to_string());
          CHECK(c.max_rel_err <= 1e-5);
        }
      }
      if (first.empty()) first = out;
      CHECK(out == first);
    }
    // Continuous batching over the same cache layout: the same tokens.
    const Mesh mesh = gpt_mesh(Mesh::parse("data=2,model=2"), cfg);
    ThreadRuntime rt(mesh.num_devices());
    GptServer server(cfg, mesh, rt, w, 6);
    for (const auto& p : prompts) server.submit({p, o.max_new, -1, {}});
    std::vector<std::vector<int32_t>> served(prompts.size());
    for (ServeResult& r : server.drain()) served[static_cast<std::size_t>(r.id)] = r.tokens;
    CHECK(served == first);
  }
}

TEST_CASE("multi-query decode keeps the cache over the sequences and moves the queries and context by all-to-all",
          "[infer][integration]") {
  // Pope et al. 3.3: with one key/value head the cache cannot split over heads; it is split
  // over the sequences on every device (data and model), and each decode layer moves the
  // queries there by an all-to-all over model and the context back by another, each of a
  // device's B·E/(dp·mp) elements, (mp-1)/mp of them leaving it; the cache never moves.
  GptConfig c;
  c.batch = 64;
  c.seq = 128;
  c.d_model = 1024;
  c.heads = 16;
  c.kv_heads = 1;
  c.layers = 1;
  c.vocab = 128;
  const int64_t E = c.d_model, B = c.batch;
  for (auto [dp, mp] : {std::pair<int64_t, int64_t>{2, 8}, {4, 16}}) {
    const Mesh mesh = Mesh::parse(fmt::format("data={},model={}", dp, mp));
    INFO(mesh.to_string());
    GptInferGraphs g = build_gpt_infer(c, 16);
    g.decode.mesh = mesh;
    const Executable exe = compile(g.decode, mesh);
    const Program& p = exe.program();
    // The cache inputs: split over the sequences on both axes, heads whole.
    for (const std::string& n : g.caches) {
      const Graph& gr = exe.graph();
      for (std::size_t i = 0; i < gr.inputs.size(); ++i)
        if (gr.values[static_cast<std::size_t>(gr.inputs[i])].name == n)
          CHECK(p.values[static_cast<std::size_t>(p.inputs[i])].sharding.to_string() == "[{data, model}, {}, {}, {}]");
    }
    int64_t all_to_all = 0;
    for (const Instr& in : p.instrs) {
      if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
      if (in.collective != CollectiveKind::AllToAll) continue;
      ++all_to_all;
      CHECK(in.axes == std::vector<std::string>{"model"});
      CHECK(in.bytes == B * E / (dp * mp) * 4);  // a device's queries (or context), f32
    }
    CHECK(all_to_all == 2 * c.layers);
    // Nothing of the cache's size moves: every collective's buffer is at most a device's
    // activations [B/dp, E] (the MLP's all-reduces), far below a cache block [B, T, 1, K].
    for (const Instr& in : p.instrs)
      if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) CHECK(in.bytes <= B / dp * E * 4);
  }
}

TEST_CASE("the decode program writes each layer's cache in place: one position per sequence and no second cache",
          "[infer][integration]") {
  // write_at over the donated cache: the memory plan places every cache output in its donated
  // input (donated_bytes = the caches' bytes), and the arena holds no cache-sized buffer.
  GptConfig cfg = small_model();
  cfg.seq = 64;
  for (const char* m : {"data=1,model=1", "data=2,model=2"}) {
    INFO(m);
    const Mesh mesh = gpt_mesh(Mesh::parse(m), cfg);
    GptInferGraphs g = build_gpt_infer(cfg, 4);
    g.decode.mesh = mesh;
    const Executable exe = compile(g.decode, mesh);
    ThreadRuntime rt(mesh.num_devices());
    LoadOptions lo;
    lo.donate = g.donations;
    const LoadedExecutable prog = load(exe, rt, lo);
    const MemoryPlan& plan = prog.program().memory;
    const int64_t cache_bytes = cfg.batch * cfg.seq * cfg.d_model * 4 / mesh.num_devices();  // per device
    CHECK(plan.donated_bytes == static_cast<int64_t>(g.caches.size()) * cache_bytes);
    CHECK(plan.arena_bytes < cache_bytes);
  }
}

TEST_CASE("gpt generation stops at the end token and at the model's last position", "[infer][integration]") {
  const GptConfig cfg = small_model();
  const auto w = random_weights(cfg, 7);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=2"), cfg);
  ThreadRuntime rt(mesh.num_devices());
  GptGenerator gen(cfg, mesh, rt, w, cfg.seq);
  GenerateOptions o;
  o.max_new = 100;
  // A prompt of 14 tokens leaves positions 14 and 15: the token after position 15 is the last.
  const std::vector<int32_t> p(14, 3);
  const auto out = gen.generate({p}, o);
  CHECK(out[0].size() == 2);
  // With the first token generated as the end token, generation stops after it.
  o.eos = out[0][0];
  CHECK(gen.generate({p}, o)[0].size() == 1);
}

TEST_CASE("gpt generation refuses bad prompts and options and weights naming them", "[infer][integration]") {
  const GptConfig cfg = small_model();
  auto w = random_weights(cfg, 3);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), cfg);
  ThreadRuntime rt(mesh.num_devices());
  GptGenerator gen(cfg, mesh, rt, w, 4);
  GenerateOptions o;
  CHECK_THROWS_WITH(gen.generate({{1, 2, 3, 4, 5}}, o), Catch::Contains("prompt 0 has 5 tokens") && Catch::Contains("1 to 4"));
  CHECK_THROWS_WITH(gen.generate({{1, 64}}, o), Catch::Contains("prompt 0 token 1 is 64, outside the vocabulary [0, 64)"));
  CHECK_THROWS_WITH(gen.generate({{1}, {1}, {1}, {1}, {1}}, o), Catch::Contains("5 prompts for a cache of 4 sequences"));
  CHECK_THROWS_WITH(gen.generate({{}}, o), Catch::Contains("prompt 0 has 0 tokens"));
  o.max_new = 0;
  CHECK_THROWS_WITH(gen.generate({{1}}, o), Catch::Contains("max_new is 0"));
  o.max_new = 2;
  o.sampling.top_p = 0;
  CHECK_THROWS_WITH(gen.generate({{1}}, o), Catch::Contains("top_p 0"));
  CHECK_THROWS_WITH(GptGenerator(cfg, mesh, rt, w, 17), Catch::Contains("prompt length 17 is outside [1, 16]"));
  CHECK_THROWS_WITH(parse_infer_layout("3d"), Catch::Contains("unknown inference layout '3d' (1d, 2d or gathered)"));
  w.erase("l1_wo");
  CHECK_THROWS_WITH(GptGenerator(cfg, mesh, rt, w, 4), Catch::Contains("no weight 'l1_wo'"));
  w = random_weights(cfg, 3);
  w["wte"] = HostTensor(DType::f32, {65, 32});
  CHECK_THROWS_WITH(GptGenerator(cfg, mesh, rt, w, 4),
                    Catch::Contains("weight 'wte' is f32[65,32]") && Catch::Contains("needs f32[64,32]"));
}

TEST_CASE("each inference layout moves what its name says", "[infer][integration]") {
  // Compiled for data=2,model=2, two layers: 1D weight-stationary moves no weight and
  // all-reduces the activations twice a layer over model; 2D weight-stationary moves no weight
  // either (its activations are reduced and gathered over data); weight-gathered all-gathers
  // each layer's six weight matrices whole before use and moves no activation. (Issue 38 item 3
  // checks the bytes against the paper's closed forms: not yet.)
  GptConfig c = small_model();
  c.batch = 8;
  const Mesh mesh = gpt_mesh(Mesh::parse("data=2,model=2"), c);
  auto count = [](const std::string& text, const std::string& what) {
    int64_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (InferLayout l : {InferLayout::OneD, InferLayout::TwoD, InferLayout::Gathered}) {
    GptInferGraphs g = build_gpt_infer(c, 8, {l, l});
    for (Graph* gr : {&g.prefill, &g.decode}) {
      INFO(infer_layout_name(l) << (gr == &g.decode ? " decode" : " prefill"));
      gr->mesh = mesh;
      const std::string text = compile(*gr, mesh).program().to_string(0);
      const int64_t weight_gathers = count(text, "= all-gather(%l0_w") + count(text, "= all-gather(%l1_w");
      const int64_t reduces = count(text, "= all-reduce(");
      if (l == InferLayout::OneD) {
        CHECK(weight_gathers == 0);
        CHECK(count(text, "= all-gather(") == 0);
        CHECK(reduces == 2 * c.layers);
      } else if (l == InferLayout::TwoD) {
        CHECK(weight_gathers == 0);
        CHECK(reduces > 2 * c.layers);
      } else {  // each of the six matrices gathered over both axes (one all-gather per axis)
        CHECK(weight_gathers == 12 * c.layers);
        CHECK(reduces == 0);
      }
    }
  }
}

TEST_CASE("the automatic layout choice is each phase's cheapest by the cost model", "[infer][integration]") {
  GptConfig c = small_model();
  c.batch = 8;
  const Mesh mesh = gpt_mesh(Mesh::parse("data=2,model=2"), c);
  for (double alpha : {3e-6, 1.0}) {  // the default links, and links where each collective costs a second
    CostModel cost;
    cost.default_link.alpha_s = alpha;
    const InferLayoutChoice ch = choose_infer_layouts(c, mesh, 8, cost);
    INFO("alpha " << alpha << ": " << ch.why);
    for (int phase = 0; phase < 2; ++phase) {
      const InferLayout got = phase == 0 ? ch.layouts.prefill : ch.layouts.decode;
      for (int l = 0; l < 3; ++l) CHECK(ch.predicted_s[phase][static_cast<int>(got)] <= ch.predicted_s[phase][l]);
    }
    CHECK(ch.why.find("prefill: 1d ") != std::string::npos);
    CHECK(ch.why.find("; decode: 1d ") != std::string::npos);
    CHECK(ch.why.find("gathered") != std::string::npos);
    // Latency-bound links: the layout with the fewest collectives a layer (1D's two all-reduces)
    // wins both phases.
    if (alpha == 1.0) {
      CHECK(ch.layouts.prefill == InferLayout::OneD);
      CHECK(ch.layouts.decode == InferLayout::OneD);
    }
  }
  // A large batch of long prompts and small weights on links without latency: moving the
  // weights (weight-gathered) costs less than moving the prefill's activations (1D), while a
  // decode step's activations (one token a sequence) stay cheaper to move than the weights.
  GptConfig big = c;
  big.batch = 64;
  big.seq = 64;
  CostModel fast;
  fast.default_link.alpha_s = 0;
  const InferLayoutChoice ch = choose_infer_layouts(big, mesh, 64, fast);
  INFO(ch.why);
  CHECK(ch.layouts.prefill == InferLayout::Gathered);
  CHECK(ch.layouts.decode != InferLayout::Gathered);
}

TEST_CASE("1D weight-stationary moves the paper's 2 B L E per block on 16 and 64 devices", "[infer][integration]") {
  // Pope et al. 2022 (section 3.2.1): 1D weight-stationary moves 2·B·L·E elements per chip per
  // feed-forward block whatever the chip count; tessel's 1D (Megatron) does it as one
  // all-reduce of the block's output [B, L, E] over model, after the attention block and after
  // the MLP. Compiled only: one layer, the heads and the hidden dim over model=16 and model=64.
  // Each all-reduce's buffer is B·L·E elements, and a ring moves 2(n-1)/n of it per device:
  // 2·B·L·E·(n-1)/n, the closed form's 2·B·L·E as n grows.
  GptConfig c;
  c.batch = 8;
  c.seq = 32;
  c.d_model = 1024;
  c.heads = 64;
  c.layers = 1;
  c.vocab = 128;
  const int64_t P = 16, E = c.d_model, B = c.batch;
  for (int64_t n : {16, 64}) {
    const Mesh mesh = gpt_mesh(Mesh::parse(fmt::format("model={}", n)), c);
    GptInferGraphs g = build_gpt_infer(c, P);
    for (Graph* gr : {&g.prefill, &g.decode}) {
      const bool decode = gr == &g.decode;
      const int64_t L = decode ? 1 : P;  // tokens per sequence in this phase
      INFO("model=" << n << (decode ? " decode" : " prefill"));
      gr->mesh = mesh;
      const Executable exe = compile(*gr, mesh);
      const Program& p = exe.program();
      int64_t reduces = 0, other = 0;
      double moved = 0;  // bytes per device over the ring
      for (const Instr& in : p.instrs) {
        if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
        if (in.collective != CollectiveKind::AllReduce) {
          ++other;
          continue;
        }
        ++reduces;
        CHECK(in.bytes == B * L * E * 4);  // the block's output, f32
        moved += CostModel::ring_factor(CollectiveKind::AllReduce, n) * static_cast<double>(in.bytes);
      }
      CHECK(other == 0);
      CHECK(reduces == 2 * c.layers);
      const double closed_form = 2.0 * static_cast<double>(B * L * E) * static_cast<double>(n - 1) / static_cast<double>(n);
      CHECK(moved == Approx(2 * c.layers * closed_form * 4).epsilon(1e-12));  // two blocks a layer, f32
    }
  }
}

TEST_CASE("weight-gathered moves each layer's weights once and no activation on 16 and 64 devices",
          "[infer][integration]") {
  // The fully gathered form (Pope et al.'s XYZ-weight-gathered): every weight gathered whole
  // before use, the sequences over all n devices, no activation collective. The weights are
  // stored split over data (on d_model) and model (on heads or the hidden dim) and gathered
  // one axis after the other; a ring all-gather moves (k-1)/k of its output per device, so
  // the two together move (n-1)/n of each weight matrix: per layer 12·E²·(n-1)/n elements
  // (wq, wk, wv, wo: E² each; w1, w2: 4·E² each), plus the MLP bias b1 [F], stored over model
  // only, (m-1)/m of F. Compiled only, one layer, on data=4,model=4 and data=8,model=8.
  GptConfig c;
  c.batch = 64;
  c.seq = 32;
  c.d_model = 512;
  c.heads = 64;
  c.layers = 1;
  c.vocab = 128;
  const int64_t P = 16, E = c.d_model, F = c.ffn_mult * c.d_model;
  for (int64_t k : {4, 8}) {
    const int64_t n = k * k;
    const Mesh mesh = Mesh::parse(fmt::format("data={},model={}", k, k));
    GptInferGraphs g = build_gpt_infer(c, P, {InferLayout::Gathered, InferLayout::Gathered});
    for (Graph* gr : {&g.prefill, &g.decode}) {
      INFO(mesh.to_string() << (gr == &g.decode ? " decode" : " prefill"));
      gr->mesh = mesh;
      const Executable exe = compile(*gr, mesh);
      const Program& p = exe.program();
      int64_t other = 0;
      double moved = 0;
      for (const Instr& in : p.instrs) {
        if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
        if (in.collective != CollectiveKind::AllGather) {
          ++other;
          continue;
        }
        moved += CostModel::ring_factor(CollectiveKind::AllGather, mesh.axes_size(in.axes)) * static_cast<double>(in.bytes);
      }
      CHECK(other == 0);
      const double closed_form = 12.0 * static_cast<double>(E * E) * static_cast<double>(n - 1) / static_cast<double>(n) +
                                 static_cast<double>(F) * static_cast<double>(k - 1) / static_cast<double>(k);
      CHECK(moved == Approx(closed_form * 4 * static_cast<double>(c.layers)).epsilon(1e-12));
    }
  }
}

TEST_CASE("2D weight-stationary moves its exact ring form per layer (about 8 B L E / sqrt n) on 16 and 64 devices",
          "[infer][integration]") {
  // Pope et al. 2022 (3.2.2): 2D weight-stationary splits each weight matrix's d_model dim over
  // X (data) and its heads or hidden dim over Y (model); the residual stream lives split over
  // both, [B, L, E/(XY)]. Per layer, on n = XY devices, tessel's program moves (ring, per
  // device, elements):
  //   around each of the two blocks, an all-gather over Y of the block's input onto E/X and a
  //   reduce-scatter over Y of its output back onto E/(XY): 4 · B·L·E/X · (Y-1)/Y;
  //   the attention's queries, keys and values summed over X: 3 all-reduces of
  //   B·L·E/Y: 6 · B·L·E/Y · (X-1)/X;
  //   the MLP's hidden activation reduce-scattered over X after the first projection and
  //   all-gathered over X before the second: 2 · B·L·F/Y · (X-1)/X;
  //   the two layer norms' per-row sums (mean, then variance) over X: 4 all-reduces of B·L:
  //   8 · B·L · (X-1)/X.
  // The MLP's share, 2·B·L·E/X·(Y-1)/Y + 2·B·L·F/Y·(X-1)/X, is the paper's feed-forward form:
  // with F = 4E and X = sqrt(n)/2 it tends to 8·B·L·E/sqrt(n). One layer's collectives are the
  // difference between the programs of two layers and of one (compiled only).
  GptConfig c;
  c.batch = 8;
  c.seq = 32;
  c.d_model = 1024;
  c.heads = 64;
  c.vocab = 128;
  const int64_t P = 16, E = c.d_model, F = c.ffn_mult * c.d_model, B = c.batch;
  auto ring_elements = [](const Program& p, const Mesh& mesh, bool* weights_moved) {
    double moved = 0;
    for (const Instr& in : p.instrs) {
      if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
      moved += CostModel::ring_factor(in.collective, mesh.axes_size(in.axes)) * static_cast<double>(in.bytes) / 4;
      for (int v : in.in)
        if (p.values[static_cast<std::size_t>(v)].name.find("_w") != std::string::npos) *weights_moved = true;
    }
    return moved;
  };
  for (auto [X, Y] : {std::pair<int64_t, int64_t>{2, 8}, {4, 16}}) {
    const int64_t n = X * Y;
    const Mesh mesh = Mesh::parse(fmt::format("data={},model={}", X, Y));
    for (bool decode : {false, true}) {
      const int64_t L = decode ? 1 : P;
      INFO(mesh.to_string() << (decode ? " decode" : " prefill"));
      double per_program[2];
      bool weights_moved = false;
      for (int64_t layers : {1, 2}) {
        c.layers = layers;
        GptInferGraphs g = build_gpt_infer(c, P, {InferLayout::TwoD, InferLayout::TwoD});
        Graph& gr = decode ? g.decode : g.prefill;
        gr.mesh = mesh;
        const Executable exe = compile(gr, mesh);
        per_program[layers - 1] = ring_elements(exe.program(), mesh, &weights_moved);
      }
      CHECK_FALSE(weights_moved);
      const double x = static_cast<double>(X), y = static_cast<double>(Y), bl = static_cast<double>(B * L);
      const double mlp = 2 * bl * E / x * (y - 1) / y + 2 * bl * F / y * (x - 1) / x;
      const double exact = 4 * bl * E / x * (y - 1) / y + 6 * bl * E / y * (x - 1) / x +
                           2 * bl * F / y * (x - 1) / x + 8 * bl * (x - 1) / x;
      const double layer = per_program[1] - per_program[0];
      CHECK(layer == Approx(exact).epsilon(1e-12));
      // The feed-forward share against the paper's 8·B·L·E/sqrt(n) (the ring's (k-1)/k factors
      // keep it below; at n = 64, within 25%).
      const double paper = 8 * bl * E / std::sqrt(static_cast<double>(n));
      CHECK(mlp < paper);
      if (n == 64) CHECK(mlp > 0.75 * paper);
      WARN(mesh.to_string() << (decode ? " decode" : " prefill") << ": one layer moves " << layer
                            << " elements per device (exact form " << exact << "); its MLP " << mlp
                            << ", the paper's 8 B L E / sqrt(n) " << paper);
    }
  }
}
