// Pipeline-parallel training (pipeline/stages.hpp, pipeline/runner.hpp): a GPT cut into stages
// at its residual stream, each stage on its own runtime and sub-mesh, run by GPipe, 1F1B and
// interleaved 1F1B over micro-batches, against one device's step over the whole batch (the
// reference executor): every step's loss and gradient norm within 1e-5 and the parameters after
// each step within the Adam tolerance of test_train.cpp; the bubble and the activations in
// flight as each schedule says; bad cuts refused naming the value.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "../unit/test_util.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/auto_stages.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/pipeline/trainer.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"
#include "tessel/train/trainer.hpp"

using namespace tessel;

namespace {

GptConfig small_gpt(int64_t batch) {
  GptConfig c;
  c.batch = batch;
  c.seq = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 4;
  c.vocab = 32;
  return c;
}

HostTensor scalar(double v) {
  HostTensor h(DType::f32, {});
  h.set(0, v);
  return h;
}

// Rows [r0, r0 + n) of a [B, S] tensor.
HostTensor rows(const HostTensor& t, int64_t r0, int64_t n) {
  const int64_t S = t.shape()[1];
  HostTensor out(t.dtype(), {n, S});
  for (int64_t i = 0; i < n * S; ++i) out.set(i, t.get(r0 * S + i));
  return out;
}

// One device's steps over the whole batch (the reference executor), from `init` (weights by
// name): per step the loss, the gradient norm and the parameters after it.
struct RefStep {
  double loss = 0, grad_norm = 0;
  std::map<std::string, HostTensor> params;
};
std::vector<RefStep> reference_steps(const GptConfig& cfg, const std::map<std::string, HostTensor>& init,
                                     const HostTensor& tokens, const HostTensor& labels, const AdamWConfig& a,
                                     double lr, int steps) {
  GptGraph m = build_gpt(cfg);
  TrainOptions o;
  o.adamw = a;
  add_train_step(m.graph, m.loss, m.weights, Mesh::parse("data=1"), o);
  Graph& g = m.graph;
  std::vector<HostTensor> host(g.inputs.size());
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& v = g.values[static_cast<std::size_t>(g.inputs[i])];
    at[v.name] = i;
    host[i] = init.count(v.name) ? init.at(v.name) : HostTensor(v.dtype, v.shape);  // moments: zeros
  }
  host[at.at("tokens")] = tokens;
  host[at.at("labels")] = labels;
  std::vector<RefStep> out;
  for (int t = 1; t <= steps; ++t) {
    host[at.at("adam.lr")] = scalar(lr);
    host[at.at("adam.bc1")] = scalar(1 / (1 - std::pow(a.beta1, t)));
    host[at.at("adam.bc2")] = scalar(1 / (1 - std::pow(a.beta2, t)));
    const std::vector<HostTensor> r = run_reference(g, host);
    RefStep s;
    for (std::size_t i = 0; i < g.outputs.size(); ++i) {
      const std::string& n = g.values[static_cast<std::size_t>(g.outputs[i])].name;
      if (static_cast<int>(g.outputs[i]) == m.loss.id) s.loss = r[i].get(0);
      if (n == "grad_norm") s.grad_norm = r[i].get(0);
      if (n.rfind("next.", 0) == 0) {
        host[at.at(n.substr(5))] = r[i];
        if (n.rfind("next.adam.", 0) != 0) s.params[n.substr(5)] = r[i];
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::map<std::string, HostTensor> gpt_weights(const GptConfig& cfg, uint64_t seed) {
  GptGraph m = build_gpt(cfg);
  std::vector<HostTensor> in = random_inputs(m.graph, seed);
  gpt_init(m.graph, in);
  std::map<std::string, HostTensor> w;
  for (const Tensor& t : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == t.id) w[t.name()] = in[i];
  return w;
}

// The whole batch's two steps on one device (the oracle), from seeded weights and tokens.
struct OneDeviceRun {
  std::map<std::string, HostTensor> init;
  HostTensor tokens, labels;
  AdamWConfig adamw;
  double lr = 1e-2;
  std::vector<RefStep> ref;
};
OneDeviceRun one_device_run(int64_t B, uint64_t seed) {
  OneDeviceRun r;
  const GptConfig full = small_gpt(B);
  r.init = gpt_weights(full, seed);
  std::mt19937_64 rng(seed);
  r.tokens = HostTensor(DType::i32, {B, full.seq});
  r.labels = HostTensor(DType::i32, {B, full.seq});
  for (int64_t i = 0; i < B * full.seq; ++i) {
    r.tokens.set(i, static_cast<double>(rng() % static_cast<uint64_t>(full.vocab)));
    r.labels.set(i, static_cast<double>(rng() % static_cast<uint64_t>(full.vocab)));
  }
  r.adamw.eps = 1e-6;  // as test_train.cpp: an Adam step amplifies summation-order noise by lr / eps
  r.ref = reference_steps(full, r.init, r.tokens, r.labels, r.adamw, r.lr, 2);
  return r;
}

// Step t of `tr` over M micro-batches of the oracle's batch: loss, norm and every parameter as
// the oracle's step t.
PipelineStepReport check_step(PipelineTrainer& tr, const OneDeviceRun& one, int64_t M, int t) {
  const int64_t b = one.tokens.shape()[0] / M;
  std::vector<std::map<std::string, HostTensor>> micro;
  for (int64_t k = 0; k < M; ++k)
    micro.push_back({{"tokens", rows(one.tokens, k * b, b)}, {"labels", rows(one.labels, k * b, b)}});
  const PipelineStepReport r = tr.step(micro, one.lr, t);
  const RefStep& want = one.ref[static_cast<std::size_t>(t - 1)];
  CHECK(r.loss == Approx(want.loss).epsilon(1e-5));
  CHECK(r.grad_norm == Approx(want.grad_norm).epsilon(1e-5));
  const auto got = tr.params();
  REQUIRE(got.size() == want.params.size());
  for (const auto& [name, p] : want.params) {
    const CompareResult cmp = compare(got.at(name), p, 1.0);
    INFO(name << ": " << cmp.to_string());
    CHECK(cmp.max_rel_err <= 2e-4);
  }
  return r;
}

// `g` run by the reference executor on the values of its inputs' names; its outputs by name.
std::map<std::string, HostTensor> run_by_name(const Graph& g, const std::map<std::string, HostTensor>& by) {
  std::vector<HostTensor> args;
  for (int v : g.inputs) args.push_back(by.at(g.values[static_cast<std::size_t>(v)].name));
  const std::vector<HostTensor> out = run_reference(g, args);
  std::map<std::string, HostTensor> named;
  for (std::size_t o = 0; o < g.outputs.size(); ++o) named[g.values[static_cast<std::size_t>(g.outputs[o])].name] = out[o];
  return named;
}

// Seeded random values of `g`'s inputs, by name.
std::map<std::string, HostTensor> random_inputs_by_name(const Graph& g, uint64_t seed) {
  const std::vector<HostTensor> in = random_inputs(g, seed);
  std::map<std::string, HostTensor> by;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) by[g.values[static_cast<std::size_t>(g.inputs[i])].name] = in[i];
  return by;
}

}  // namespace

TEST_CASE("pipeline training equals one device for every schedule on pipe=2 and pipe=4 and pipe=2 x data=2 or model=2 and interleaved and zero bubble in both stream modes and ZeRO 1 and 2 within stages and stages of different shapes",
          "[pipeline][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("pipeline training against one device", seed, 1);
  const int64_t B = 8;
  const OneDeviceRun one = one_device_run(B, seed);
  const auto& [init, tokens, labels, a, lr, ref] = one;

  struct Run {
    const char* stage_mesh;
    int64_t stages, micro, chunks;
    ScheduleKind kind;
    int streams = 0;  // 0: the runtime's defaults; 1: async stream workers; 2: eager (StreamMode)
    int zero = 0;     // ZeRO within each stage
    const char* last_mesh = nullptr;  // the last stage's own shape (PipelineTrainer's mesh per stage)
    bool keep = false;                // activations kept (PipelineOptions::remat none), not recomputed
  };
  const std::vector<Run> runs = {
      {"data=1", 2, 4, 1, ScheduleKind::GPipe},       {"data=1", 2, 4, 1, ScheduleKind::OneFOneB},
      {"data=1", 4, 4, 1, ScheduleKind::OneFOneB},    {"data=2", 2, 4, 1, ScheduleKind::OneFOneB},
      {"model=2", 2, 2, 1, ScheduleKind::GPipe},      {"data=1", 2, 4, 2, ScheduleKind::Interleaved},
      {"data=2", 2, 4, 1, ScheduleKind::OneFOneB, 1}, {"data=2", 2, 4, 1, ScheduleKind::OneFOneB, 2},
      {"data=2", 2, 4, 1, ScheduleKind::OneFOneB, 0, 1}, {"data=2,model=2", 2, 2, 1, ScheduleKind::GPipe, 0, 2},
      {"data=2", 2, 4, 1, ScheduleKind::OneFOneB, 0, 0, "model=2"},
      {"data=1", 2, 4, 1, ScheduleKind::ZeroBubbleH1},  {"data=1", 4, 4, 1, ScheduleKind::ZeroBubbleH1},
      {"data=2", 2, 4, 1, ScheduleKind::ZeroBubbleH1, 0, 1}, {"model=2", 2, 2, 1, ScheduleKind::ZeroBubbleH1, 0, 2},
      {"data=1", 2, 4, 1, ScheduleKind::OneFOneB, 0, 0, nullptr, true}, {"data=1", 4, 4, 1, ScheduleKind::GPipe, 0, 0, nullptr, true},
      {"data=2", 2, 4, 2, ScheduleKind::Interleaved, 0, 1, nullptr, true},
      {"model=2", 2, 4, 1, ScheduleKind::ZeroBubbleH1, 0, 2, nullptr, true},
      {"data=2", 2, 4, 1, ScheduleKind::OneFOneB, 0, 3}, {"data=2,model=2", 2, 4, 1, ScheduleKind::ZeroBubbleH1, 0, 3},
      {"data=2", 2, 4, 2, ScheduleKind::Interleaved, 0, 3, nullptr, true}};
  for (const Run& run : runs) {
    INFO("pipe=" << run.stages << " x " << run.stage_mesh << (run.last_mesh ? " (the last stage " : "")
                 << (run.last_mesh ? run.last_mesh : "") << (run.last_mesh ? ")" : "") << ", "
                 << schedule_kind_name(run.kind) << ", micro "
                 << run.micro << ", chunks " << run.chunks << ", streams " << run.streams << ", zero " << run.zero
                 << (run.keep ? ", activations kept" : ""));
    GptConfig c = small_gpt(B / run.micro);
    const Mesh mesh = gpt_mesh(Mesh::parse(run.stage_mesh), c);
    GptGraph m = build_gpt(c);
    // Cut the residual stream evenly: checkpoints are x0, then each block's output.
    const int64_t pieces = run.stages * run.chunks;
    std::vector<Tensor> cuts;
    for (int64_t k = 1; k < pieces; ++k) cuts.push_back(m.checkpoints.at(static_cast<std::size_t>(k * c.layers / pieces)));
    std::vector<PipelineStage> st = split_stages(m.graph, m.loss, m.weights, cuts);
    REQUIRE(static_cast<int64_t>(st.size()) == pieces);
    CHECK(st.front().recv.empty());
    CHECK(st.back().send.empty());
    CHECK(st.back().loss == m.loss.name());
    std::vector<std::unique_ptr<ThreadRuntime>> rts;
    std::vector<Runtime*> rp;
    for (int64_t s = 0; s < run.stages; ++s) {
      rts.push_back(run.streams == 0 ? std::make_unique<ThreadRuntime>(mesh.num_devices())
                                     : std::make_unique<ThreadRuntime>(
                                           mesh.num_devices(), tessel_test::stream_options<ThreadRuntimeOptions>(
                                                                   run.streams == 1 ? StreamMode::Async : StreamMode::Eager)));
      rp.push_back(rts.back().get());
    }
    PipelineOptions o;
    o.schedule = run.kind;
    o.micro = run.micro;
    o.chunks = run.chunks;
    o.adamw = a;
    o.zero = run.zero;
    if (run.keep) o.remat = RematPolicy::none;
    std::vector<Mesh> meshes(static_cast<std::size_t>(run.stages), mesh);
    if (run.last_mesh) meshes.back() = gpt_mesh(Mesh::parse(run.last_mesh), c);
    PipelineTrainer tr(std::move(st), meshes, rp, init, o);
    if (run.last_mesh) CHECK(tr.state_shardings().at("lnf_g").to_string() != "");
    // ZeRO splits the moments over data within each stage (and the parameters stay as they are).
    const auto lay = tr.state_shardings();
    CHECK(lay.at("adam.m.l0_w1").uses_axis("data") == (run.zero >= 1 && mesh.axis_size("data") > 1));
    CHECK(lay.at("adam.v.l3_w2").uses_axis("data") == (run.zero >= 1 && mesh.axis_size("data") > 1));
    CHECK(lay.at("l0_w1").uses_axis("data") == (run.zero >= 3 && mesh.axis_size("data") > 1));  // ZeRO-3: split
    for (int t = 1; t <= 2; ++t) {
      INFO("step " << t);
      const PipelineStepReport r = check_step(tr, one, run.micro, t);
      // 1F1B keeps at most P - s micro-batches in flight on stage s; GPipe all M.
      for (int64_t s = 0; s < run.stages; ++s) {
        const int64_t want_peak = run.kind == ScheduleKind::GPipe ? run.micro
                                  : run.kind == ScheduleKind::OneFOneB || run.kind == ScheduleKind::ZeroBubbleH1
                                      ? std::min(run.micro, run.stages - s)
                                      : -1;
        if (want_peak > 0) CHECK(r.peak_in_flight[static_cast<std::size_t>(s)] == want_peak);
        // The kept bytes are the in-flight micro-batches' inputs: equal micro-batches, so a multiple.
        const int64_t kept = r.peak_kept_bytes[static_cast<std::size_t>(s)];
        CHECK(kept > 0);
        // (zero bubble: B's values kept for W come on top)
        if (run.chunks == 1 && run.kind != ScheduleKind::ZeroBubbleH1)
          CHECK(kept % r.peak_in_flight[static_cast<std::size_t>(s)] == 0);
      }
      CHECK(r.bubble >= 0);
      CHECK(r.bubble < 1);
    }
  }
}

TEST_CASE("split_stages refuses a cut out of order or at an input and a value that skips a stage and a loss before the last cut",
          "[pipeline]") {
  GptConfig c = small_gpt(2);
  GptGraph m = build_gpt(c);
  // Equal layers: cut k at checkpoint k * layers / stages; more stages than layers refused.
  const std::vector<Tensor> eq = equal_layer_cuts(m.checkpoints, c.layers, 2);
  REQUIRE(eq.size() == 1);
  CHECK(eq[0].id == m.checkpoints.at(static_cast<std::size_t>(c.layers / 2)).id);
  CHECK(equal_layer_cuts(m.checkpoints, c.layers, 1).empty());
  CHECK(tessel_test::contains(tessel_test::error_of([&] { equal_layer_cuts(m.checkpoints, c.layers, c.layers + 1); }),
                              "each stage needs a layer"));
  const std::string out_of_order = tessel_test::error_of(
      [&] { split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(3), m.checkpoints.at(1)}); });
  CHECK(tessel_test::contains(out_of_order, "give the cuts in the order the graph makes them"));
  const std::string input_cut =
      tessel_test::error_of([&] { split_stages(m.graph, m.loss, m.weights, {m.tokens}); });
  CHECK(tessel_test::contains(input_cut, "is a graph input"));
  const std::string after_loss =
      tessel_test::error_of([&] { split_stages(m.graph, m.checkpoints.at(2), m.weights, {m.checkpoints.at(3)}); });
  CHECK(tessel_test::contains(after_loss, "not the last"));
  // x0 (the embedding) used again two stages later: a value that skips a stage.
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4});
  Tensor a = exp(x).named("a");
  Tensor b2 = exp(a).named("b");
  Tensor d = add(exp(b2), a).named("d");  // a, made by stage 0, used by stage 2
  Tensor l = reduce_sum(d, {0}).named("l");
  const std::string skip = tessel_test::error_of([&] { split_stages(g, l, {x}, {a, b2}); });
  CHECK(tessel_test::contains(skip, "%a"));
  CHECK(tessel_test::contains(skip, "neighbours only"));
}

TEST_CASE("keep_activations: the forward outputs what the backward reads and the backward no longer recomputes it with the same gradients",
          "[pipeline]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("keep_activations against the recomputing backward", seed, 1);
  GptConfig c = small_gpt(2);
  GptGraph m = build_gpt(c);
  std::vector<PipelineStage> st = split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(2)});
  for (std::size_t k = 0; k < st.size(); ++k) {
    INFO("stage " << k);
    const Graph& full = st[k].backward;
    const std::size_t fwd_ops = st[k].forward.ops.size() - st[k].forward.inputs.size();
    std::map<std::string, HostTensor> by = random_inputs_by_name(full, seed + k);
    auto run = [&](const Graph& g) { return run_by_name(g, by); };
    const auto want = run(full);
    const std::size_t full_ops = full.ops.size() - full.inputs.size();
    std::vector<PipelineStage> fresh = split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(2)});
    PipelineStage kept = keep_activations(std::move(fresh[k]));
    CHECK_FALSE(kept.saved.empty());
    // The backward lost the forward's ops; the forward outputs its sends (and loss) then the saved values.
    CHECK(kept.activations_kept);
    // (the first stage's seed of its share of the loss, sum(sent · grad.sent), goes too: nothing reads it)
    CHECK(kept.backward.ops.size() - kept.backward.inputs.size() <= full_ops - fwd_ops);
    CHECK(kept.backward.ops.size() - kept.backward.inputs.size() > 0);
    for (const std::string& n : kept.saved) {
      CHECK(kept.backward.find(n) >= 0);
      bool out = false;
      for (int v : kept.forward.outputs) out = out || kept.forward.values[static_cast<std::size_t>(v)].name == n;
      CHECK(out);
    }
    for (auto& [n, h] : run(kept.forward)) by[n] = h;
    const auto got = run(kept.backward);
    for (const auto& [n, h] : want) {
      INFO(n);
      REQUIRE(got.count(n));
      CHECK(compare(got.at(n), h, 1.0).max_rel_err <= 1e-6);
    }
    // Kept twice: the same stage.
    const std::size_t kept_forward_ops = kept.forward.ops.size();
    const PipelineStage again = keep_activations(std::move(kept));
    CHECK(again.activations_kept);
    CHECK(again.forward.ops.size() == kept_forward_ops);
  }
}

TEST_CASE("split_backward: B makes the received values' gradients and W the weights' from B's kept values and together they equal the backward",
          "[pipeline]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("split_backward against the whole backward", seed, 1);
  GptConfig c = small_gpt(2);
  GptGraph m = build_gpt(c);
  const std::vector<PipelineStage> st = split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(2)});
  for (std::size_t k = 0; k < st.size(); ++k) {
    INFO("stage " << k);
    const SplitBackward sb = split_backward(st[k]);
    const Graph& full = st[k].backward;
    // B: the gradients of what the stage received (none for the first: its tokens are integers).
    std::vector<std::string> b_out, w_out;
    for (int v : sb.input_grad.outputs) b_out.push_back(sb.input_grad.values[static_cast<std::size_t>(v)].name);
    for (int v : sb.weight_grad.outputs) w_out.push_back(sb.weight_grad.values[static_cast<std::size_t>(v)].name);
    CHECK(b_out.size() == (k == 0 ? 0 : 1 + sb.stash.size()));
    CHECK(w_out.size() == st[k].params.size());
    for (const std::string& n : w_out) CHECK(n.rfind("next.grad.acc.", 0) == 0);
    if (k == 0) CHECK(sb.stash.empty());
    // Each op once: B and W share none; W reads the stash.
    CHECK(sb.input_grad.ops.size() - sb.input_grad.inputs.size() + sb.weight_grad.ops.size() -
              sb.weight_grad.inputs.size() <= full.ops.size() - full.inputs.size());
    for (const std::string& n : sb.stash) CHECK(sb.weight_grad.find(n) >= 0);
    // Run on the same random inputs: B then W give the whole backward's outputs.
    std::map<std::string, HostTensor> by = random_inputs_by_name(full, seed + k);
    auto run = [&](const Graph& g) { return run_by_name(g, by); };
    const auto want = run(full);
    if (!sb.input_grad.outputs.empty())
      for (auto& [n, h] : run(sb.input_grad)) by[n] = h;  // the stash, for W
    auto got = run(sb.weight_grad);
    if (!sb.input_grad.outputs.empty())
      for (auto& [n, h] : run(sb.input_grad)) got[n] = h;
    for (const auto& [n, h] : want) {
      INFO(n);
      REQUIRE(got.count(n));
      CHECK(compare(got.at(n), h, 1.0).max_rel_err <= 1e-6);
    }
  }
}

TEST_CASE("the pipeline trainer's state round-trips and a bad state is refused naming the value", "[pipeline]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("pipeline state", seed, 1);
  GptConfig c = small_gpt(2);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), c);
  GptGraph m = build_gpt(c);
  ThreadRuntime r0(1), r1(1);
  PipelineOptions o;
  o.micro = 2;
  PipelineTrainer tr(split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(2)}), mesh, {&r0, &r1},
                     gpt_weights(small_gpt(4), seed), o);
  std::map<std::string, HostTensor> st = tr.state();
  CHECK(st.size() == 3 * m.weights.size());  // each parameter and its two moments
  CHECK(st.count("adam.m.wte") == 1);
  st.at("adam.v.wte").set(0, 0.25);
  tr.set_state(st);
  CHECK(tr.state().at("adam.v.wte").get(0) == 0.25);
  auto missing = st;
  missing.erase("adam.m.l0_wq");
  CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.set_state(missing); }), "the state has no 'adam.m.l0_wq'"));
  auto wrong = st;
  wrong["wte"] = HostTensor(DType::f32, {3});
  CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.set_state(wrong); }), "'wte' is f32[3]"));
  auto extra = st;
  extra["stray"] = HostTensor(DType::f32, {1});
  CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.set_state(extra); }), "'stray' is not part of the training state"));
}

namespace {
// A GPT whose vocabulary dwarfs its blocks (8 layers of d_model 32, vocab 4096).
GptConfig head_heavy_gpt() {
  GptConfig c;
  c.batch = 2;
  c.seq = 16;
  c.d_model = 32;
  c.heads = 2;
  c.layers = 8;
  c.vocab = 4096;
  return c;
}
}  // namespace

TEST_CASE("automatic stage cuts give the stage with the LM head fewer layers and predict no more than the equal cut",
          "[pipeline]") {
  // A GPT whose vocabulary dwarfs its blocks: the last stage's LM head and loss cost more than
  // a layer, so the cost model's cut moves layers off the last stage.
  const GptConfig c = head_heavy_gpt();
  GptGraph m = build_gpt(c);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), c);
  const std::vector<Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);  // x0, l0_x_out .. l6_x_out
  REQUIRE(candidates.size() == 8);
  // A CPU core's figures (rather than the default H100's, where this model is all dispatch).
  CostModel cpu;
  cpu.flops_per_s = 1e11;
  cpu.memory_bandwidth = 2e10;
  cpu.dispatch_s = 5e-6;
  const StageCut cut = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, mesh, cpu);
  INFO(cut.why);
  REQUIRE(cut.cuts.size() == 1);
  REQUIRE(cut.pieces.size() == 2);
  CHECK(cut.pieces[0] + cut.pieces[1] == 9);
  CHECK(cut.equal_pieces == std::vector<int64_t>{5, 4});  // the embedding and 4 layers, then 4 layers and the head
  CHECK(cut.pieces[1] < cut.equal_pieces[1]);
  CHECK(cut.step_s <= cut.equal_step_s);
  // Its step time is the closed form of its stage times, and no other cut predicts less.
  CHECK(cut.step_s == Approx(cut.stage_s[0] + cut.stage_s[1] + 7 * std::max(cut.stage_s[0], cut.stage_s[1])));
  for (int64_t b = 1; b < 9; ++b) {
    double t0 = 0, t1 = 0;
    for (int64_t i = 0; i < 9; ++i) (i < b ? t0 : t1) += cut.piece_s[static_cast<std::size_t>(i)];
    CHECK(cut.step_s <= t0 + t1 + 7 * std::max(t0, t1) + 1e-15);
  }
  // The chosen cut is a valid split.
  CHECK(split_stages(m.graph, m.loss, m.weights, cut.cuts).size() == 2);
  CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                choose_stage_cuts(m.graph, m.loss, m.weights, {candidates[0]}, 3, 8, mesh, cpu);
                              }),
                              "fewer than the 3 stages"));
}

TEST_CASE("automatic stage cuts timed on the devices (StageCutOptions::runtime) move layers off the LM head's stage",
          "[pipeline]") {
  // The same GPT as above, its pieces run on a CPU device instead of priced: the times are the
  // machine's, and the head still outweighs a layer there. With a vocabulary of 4096 the head's
  // piece timed only ~1.5x a layer's on the loaded 2-core machine, and the equal cut came out
  // best once in a full ctest -j2 run; at 16384 its margin is four times wider.
  GptConfig c = head_heavy_gpt();
  c.vocab = 16384;
  GptGraph m = build_gpt(c);
  const Mesh mesh = gpt_mesh(Mesh::parse("data=1"), c);
  const std::vector<Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
  ThreadRuntime rt(1);
  StageCutOptions o;
  o.meshes = {mesh};
  o.runtime = &rt;
  o.measure_runs = 3;
  const StageCut cut = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, CostModel{});
  INFO(cut.why);
  REQUIRE(cut.piece_s.size() == 9);
  for (double t : cut.piece_s) CHECK(t > 0);
  // The default (H100) figures would price every piece in microseconds of dispatch; the times
  // are the CPU's: the head's piece is the dearest.
  CHECK(cut.piece_s.back() == *std::max_element(cut.piece_s.begin(), cut.piece_s.end()));
  CHECK(cut.pieces[1] < cut.equal_pieces[1]);
  CHECK(cut.step_s <= cut.equal_step_s);
  CHECK(split_stages(m.graph, m.loss, m.weights, cut.cuts).size() == 2);
  o.measure_runs = 0;
  CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, CostModel{});
                              }),
                              "measure_runs 0"));
}

TEST_CASE("automatic sharding within each stage: each stage's layouts planned for its shape and trained equal to one device",
          "[pipeline][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("pipeline stages planned by automatic sharding against one device", seed, 1);
  const int64_t B = 8, M = 2;
  const OneDeviceRun one = one_device_run(B, seed);
  const auto& [init, tokens, labels, a, lr, ref] = one;
  // The model without its layouts but the batch's (on data): automatic sharding lays out the rest.
  GptConfig c = small_gpt(B / M);
  c.annotate = false;
  GptGraph m = build_gpt(c);
  m.graph.annotate(m.tokens, Sharding::parse("[{data}, {}]"));
  m.graph.annotate(m.labels, Sharding::parse("[{data}, {}]"));
  const std::vector<Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
  // Slow compute beside the links: splitting the work over model pays (the propagated layouts
  // with only the batch placed repeat it on both devices of model=2).
  CostModel cpu;
  cpu.flops_per_s = 1e8;
  cpu.memory_bandwidth = 1e8;
  cpu.dispatch_s = 1e-7;
  StageCut cut;
  // Two searches: each stage's shape among model=2 and data=2; and model=2 alone, where the plan
  // must split the work over model (the batch's axis has one device).
  for (const char* shapes : {"both", "model=2"}) {
  INFO("stage shapes: " << shapes);
  StageCutOptions so;
  so.meshes = std::string(shapes) == "both" ? mesh_shapes(Mesh::parse("data=1,model=2"), {"data", "model"})
                                            : std::vector<Mesh>{Mesh::parse("data=1,model=2")};
  so.auto_shard = AutoShardOptions{};
  so.auto_shard->cost = cpu;
  so.auto_shard->cost_figures = AutoShardOptions::CostFigures::Given;
  cut = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, M, so, cpu);
  INFO(cut.why);
  REQUIRE(cut.stage_layouts.size() == 2);
  CHECK(tessel_test::contains(cut.why, "each stage's layouts by automatic sharding"));
  // Each stage's plan covers its parameters, for its own shape (an axis its mesh has).
  std::vector<PipelineStage> st = stages_with_layouts(m.graph, m.loss, m.weights, cut);
  REQUIRE(st.size() == 2);
  bool over_model = false;
  int64_t planned_stages = 0;
  for (std::size_t s = 0; s < 2; ++s) {
    if (cut.stage_layouts[s].empty()) continue;  // the graph's own layouts priced lower there
    ++planned_stages;
    for (const std::string& p : st[s].params) {
      REQUIRE(cut.stage_layouts[s].count(p));
      const Sharding& sh = cut.stage_layouts[s].at(p);
      for (const std::string axis : {"data", "model"})
        if (sh.uses_axis(axis)) CHECK(cut.stage_meshes[s].axis_size(axis) > 1);
    }
    for (const auto& [n, sh] : cut.stage_layouts[s]) over_model = over_model || sh.uses_axis("model");
  }
  if (std::string(shapes) == "model=2") {
    CHECK(planned_stages >= 1);
    CHECK(over_model);
  }
  std::vector<std::unique_ptr<ThreadRuntime>> rts;
  std::vector<Runtime*> rp;
  for (std::size_t s = 0; s < 2; ++s) {
    rts.push_back(std::make_unique<ThreadRuntime>(cut.stage_meshes[s].num_devices()));
    rp.push_back(rts.back().get());
  }
  PipelineOptions o;
  o.schedule = ScheduleKind::OneFOneB;
  o.micro = M;
  o.adamw = a;
  PipelineTrainer tr(std::move(st), cut.stage_meshes, rp, init, o);
  for (int t = 1; t <= 2; ++t) {
    INFO("step " << t);
    check_step(tr, one, M, t);
  }
  }
  // Layouts for other cuts are refused.
  StageCut wrong = cut;
  wrong.stage_layouts.pop_back();
  CHECK(tessel_test::contains(tessel_test::error_of([&] { stages_with_layouts(m.graph, m.loss, m.weights, wrong); }),
                              "stages' layouts for"));
}

TEST_CASE("single_value_cuts finds the GPT's residual stream and what only the head crosses", "[pipeline]") {
  GptConfig c = small_gpt(2);
  c.layers = 2;
  GptGraph m = build_gpt(c);
  std::vector<std::string> names;
  for (const Tensor& t : single_value_cuts(m.graph, m.weights)) names.push_back(t.name());
  INFO(fmt::format("{}", fmt::join(names, ", ")));
  // The embedding's outputs (before and after the position table: it is a parameter), each
  // block's residual after attention and after the MLP, then the head's values up to the loss;
  // none inside a block (the residual crosses its ops there).
  REQUIRE(names.size() >= 5);
  CHECK(std::find(names.begin(), names.end(), m.checkpoints[0].name()) != names.end());
  CHECK(std::find(names.begin(), names.end(), m.checkpoints[1].name()) != names.end());
  CHECK(std::find(names.begin(), names.end(), m.checkpoints[2].name()) != names.end());
  CHECK(std::find(names.begin(), names.end(), "l0_h") == names.end());
  // Every candidate is a valid cut.
  for (const Tensor& t : single_value_cuts(m.graph, m.weights))
    if (t.id != m.loss.id) CHECK(split_stages(m.graph, m.loss, m.weights, {t}).size() == 2);
}

TEST_CASE("automatic stages choose each stage's shape and keep every stage within the memory budget", "[pipeline]") {
  // mesh_shapes: every shape of the devices over the named axes, the mesh itself first.
  const std::vector<Mesh> shapes = mesh_shapes(Mesh::parse("data=2,model=2"), {"data", "model"});
  REQUIRE(shapes.size() == 3);
  CHECK(shapes[0].to_string() == Mesh::parse("data=2,model=2").to_string());
  CHECK(shapes[1].to_string() == Mesh::parse("data=1,model=4").to_string());
  CHECK(shapes[2].to_string() == Mesh::parse("data=4,model=1").to_string());
  CHECK(mesh_shapes(Mesh::parse("pipe=2,data=3"), {"data"}).size() == 1);
  CHECK(tessel_test::contains(tessel_test::error_of([] { mesh_shapes(Mesh::parse("data=2"), {"model"}); }),
                              "has no axis 'model'"));

  GptConfig c;
  c.batch = 4;
  c.seq = 16;
  c.d_model = 32;
  c.heads = 4;
  c.layers = 6;
  c.vocab = 2048;
  GptGraph m = build_gpt(c);
  const std::vector<Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
  CostModel cpu;
  cpu.flops_per_s = 1e11;
  cpu.memory_bandwidth = 2e10;
  cpu.dispatch_s = 5e-6;
  StageCutOptions o;
  o.meshes = mesh_shapes(gpt_mesh(Mesh::parse("data=2,model=2"), c), {"data", "model"});
  const StageCut free = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu);
  INFO(free.why);
  REQUIRE(free.stage_meshes.size() == 2);
  REQUIRE(free.stage_bytes.size() == 2);
  // Each stage's shape is the fastest for its pieces: no single shape for the same cut is faster.
  for (const Mesh& one : o.meshes) {
    StageCutOptions single;
    single.meshes = {one};
    const StageCut s = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, single, cpu);
    CHECK(free.step_s <= s.step_s * (1 + 1e-12));
  }
  // A budget below what the chosen cut needs moves to a cut (or shapes) that fit, predicted no
  // faster; one below every stage's need is an error naming the budget.
  const int64_t need = std::max(free.stage_bytes[0], free.stage_bytes[1]);
  o.memory_budget_bytes = need;
  CHECK(choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu).step_s == Approx(free.step_s));
  o.memory_budget_bytes = need - 1;
  try {
    const StageCut tight = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu);
    INFO(tight.why);
    for (int64_t b : tight.stage_bytes) CHECK(b <= need - 1);
    CHECK(tight.step_s >= free.step_s * (1 - 1e-12));
  } catch (const Error& e) {
    CHECK(tessel_test::contains(e.what(), "memory budget"));
  }
  o.memory_budget_bytes = 1000;
  const std::string refused =
      tessel_test::error_of([&] { choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu); });
  CHECK(tessel_test::contains(refused, "no cut into 2 stages fits the memory budget of 1000 bytes per device"));
  // The budget the error names is the least that fits: it does, a byte less does not.
  const std::size_t at = refused.find("the least hungry cut needs ");
  REQUIRE(at != std::string::npos);
  const int64_t named = std::stoll(refused.substr(at + std::string("the least hungry cut needs ").size()));
  o.memory_budget_bytes = named;
  const StageCut just = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu);
  CHECK(*std::max_element(just.stage_bytes.begin(), just.stage_bytes.end()) == named);
  o.memory_budget_bytes = named - 1;
  CHECK(tessel_test::contains(
      tessel_test::error_of([&] { choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu); }),
      "fits the memory budget"));
  // GPipe holds all M micro-batches' inputs on the first stage, 1F1B P of them: more bytes.
  o.memory_budget_bytes = 0;
  o.meshes = {gpt_mesh(Mesh::parse("data=2,model=2"), c)};
  const StageCut one_f = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, cpu);
  o.schedule = ScheduleKind::GPipe;
  const StageCut gpipe = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, cpu);
  REQUIRE(one_f.pieces == gpipe.pieces);
  CHECK(gpipe.stage_bytes[0] > one_f.stage_bytes[0]);
  // Stages that keep their activations (remat none, as gpt_train runs them by default): every
  // stage holds more than its recomputing cut's (the activations of its micro-batches in
  // flight) and its pieces are priced faster (a backward recomputes nothing); einsums refused.
  o.schedule = ScheduleKind::OneFOneB;
  o.remat = RematPolicy::none;
  const StageCut kept = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, cpu);
  REQUIRE(kept.piece_s.size() == one_f.piece_s.size());
  double kept_s = 0, recomputed_s = 0;
  for (std::size_t i = 0; i < kept.piece_s.size(); ++i) {
    CHECK(kept.piece_s[i] <= one_f.piece_s[i]);
    kept_s += kept.piece_s[i];
    recomputed_s += one_f.piece_s[i];
  }
  CHECK(kept_s < recomputed_s);
  if (kept.pieces == one_f.pieces)
    for (std::size_t st = 0; st < 2; ++st) CHECK(kept.stage_bytes[st] > one_f.stage_bytes[st]);
  CHECK(*std::max_element(kept.stage_bytes.begin(), kept.stage_bytes.end()) >
        *std::max_element(one_f.stage_bytes.begin(), one_f.stage_bytes.end()));
  o.remat = RematPolicy::einsums;
  CHECK(tessel_test::contains(
      tessel_test::error_of([&] { choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, o, cpu); }),
      "remat einsums is not supported within pipeline stages"));
  o.remat = RematPolicy::all;
  // Shapes of different device counts are refused.
  o.meshes = {Mesh::parse("data=2,model=2"), Mesh::parse("data=2,model=1")};
  CHECK(tessel_test::contains(
      tessel_test::error_of([&] { choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 4, o, cpu); }),
      "different device counts"));
}

TEST_CASE("a Trainer over a pipeline (pipeline_trainer) steps and evaluates and checkpoints as one device's Trainer accumulating the same micro-batches",
          "[pipeline][integration]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("pipeline_trainer against one device's Trainer", seed, 1);
  const int64_t B = 8, M = 4, b = B / M;
  const OneDeviceRun one = one_device_run(B, seed);
  std::vector<std::vector<HostTensor>> micro;  // batch_inputs() order: tokens, labels
  for (int64_t k = 0; k < M; ++k) micro.push_back({rows(one.tokens, k * b, b), rows(one.labels, k * b, b)});
  const GptConfig c = small_gpt(b);  // the model of one micro-batch
  TrainerOptions to;
  to.train.adamw = one.adamw;
  to.lr = LrSchedule::constant(one.lr);

  // One device, the same micro-batches accumulated (the oracle Trainer).
  GptGraph m1 = build_gpt(c);
  ThreadRuntime r1(1);
  Trainer plain(m1.graph, m1.loss, m1.weights, gpt_mesh(Mesh::parse("data=1"), c), r1, to);
  plain.init(one.init);

  for (const char* kind : {"1f1b", "gpipe", "interleaved"}) {
    INFO(kind);
    GptGraph m = build_gpt(c);
    ThreadRuntime s0(2), s1(2);
    PipelineOptions po;
    po.schedule = parse_schedule_kind(kind);
    po.micro = M;
    po.chunks = po.schedule == ScheduleKind::Interleaved ? 2 : 1;
    TrainerOptions zo = to;
    zo.train.zero = 1;  // ZeRO-1 within each stage, from TrainerOptions
    Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights, equal_layer_cuts(m.checkpoints, c.layers, 2 * po.chunks),
                                  Mesh::parse("pipe=2,data=2,model=1"), {&s0, &s1}, zo, po);
    REQUIRE(tr.engine() != nullptr);
    CHECK(tessel_test::contains(tr.strategy_in_words(), "a pipeline of 2 stages"));
    CHECK(tr.batch_inputs() == plain.batch_inputs());
    tr.init(one.init);
    CHECK(tr.state_shardings().at("adam.m.l0_w1").uses_axis("data"));  // ZeRO-1 reached the stages
    // The reference step (one device, the host) and the plain Trainer's step are its oracles.
    Trainer ref_trainer(m1.graph, m1.loss, m1.weights, gpt_mesh(Mesh::parse("data=1"), c), r1, to);
    ref_trainer.init(one.init);
    for (int t = 1; t <= 2; ++t) {
      INFO("step " << t);
      const StepRecord want = ref_trainer.step(micro);
      const StepRecord ref = tr.reference_step(micro);
      const StepRecord got = tr.step(micro);
      CHECK(got.step == t);
      CHECK(got.micro_batches == M);
      CHECK(got.loss == Approx(want.loss).epsilon(1e-5));
      CHECK(got.grad_norm == Approx(want.grad_norm).epsilon(1e-5));
      CHECK(ref.loss == Approx(got.loss).epsilon(1e-5));
      CHECK(got.loss == Approx(one.ref[static_cast<std::size_t>(t - 1)].loss).epsilon(1e-5));  // the whole batch's
      CHECK(got.bubble >= 0);
      CHECK(got.bubble < 1);
      for (const std::string& n : tr.param_names()) {
        const CompareResult cmp = compare(tr.param(n), ref_trainer.param(n), 1.0);
        INFO(n << ": " << cmp.to_string());
        CHECK(cmp.max_rel_err <= 2e-4);
      }
    }
    CHECK(tr.steps_done() == 2);
    CHECK(tr.history().size() == 2);
    CHECK(tr.evaluate(micro[1]) == Approx(ref_trainer.evaluate(micro[1])).epsilon(1e-5));
  }

  SECTION("its checkpoint resumes on a Trainer without a pipe axis, and back") {
    const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("tessel-pipe-trainer-{}", seed)).string();
    std::filesystem::remove_all(dir);
    GptGraph m = build_gpt(c);
    ThreadRuntime s0(1), s1(1);
    PipelineOptions po;
    po.micro = M;
    Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights, equal_layer_cuts(m.checkpoints, c.layers, 2),
                                  Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1}, to, po);
    tr.init(one.init);
    tr.step(micro);
    {
      CheckpointDir ck(dir);
      tr.save_checkpoint(ck);
    }
    const StepRecord second = tr.step(micro);
    CheckpointDir ck(dir);
    GptGraph m2 = build_gpt(c);
    ThreadRuntime r2(2);
    Trainer flat(m2.graph, m2.loss, m2.weights, gpt_mesh(Mesh::parse("data=2"), c), r2, to);
    flat.restore_checkpoint(ck, 1);
    CHECK(flat.steps_done() == 1);
    const StepRecord resumed = flat.step(micro);
    CHECK(resumed.step == 2);
    CHECK(resumed.loss == Approx(second.loss).epsilon(1e-5));
    CHECK(resumed.grad_norm == Approx(second.grad_norm).epsilon(1e-5));
    // ... and the flat run's step 2 saved, restored onto the pipeline.
    flat.save_checkpoint(ck);
    const StepRecord third = flat.step(micro);
    tr.restore_checkpoint(ck, 2);
    CHECK(tr.steps_done() == 2);
    CHECK(tr.step(micro).loss == Approx(third.loss).epsilon(1e-5));
    std::filesystem::remove_all(dir);
  }

  SECTION("a non-finite step updates nothing and stops or is skipped as TrainerOptions::non_finite says") {
    GptGraph m = build_gpt(c);
    ThreadRuntime s0(1), s1(1);
    PipelineOptions po;
    po.micro = M;
    TrainerOptions so = to;
    so.non_finite = NonFinite::Skip;
    Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights, equal_layer_cuts(m.checkpoints, c.layers, 2),
                                  Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1}, so, po);
    std::map<std::string, HostTensor> bad = one.init;
    bad.at("l1_w1").set(3, std::nan(""));  // a weight of stage 0: every loss NaN
    tr.init(bad);
    const TrainState before = tr.state();
    const StepRecord r = tr.step(micro);
    CHECK(r.skipped);
    CHECK(tr.steps_done() == 0);
    const TrainState after = tr.state();
    for (const auto& [n, h] : before.values) {
      INFO(n);
      CHECK(std::memcmp(h.data(), after.values.at(n).data(), h.bytes()) == 0);  // bit for bit (NaN included)
    }
    tr.set_schedule(LrSchedule::constant(one.lr));
    Trainer stop = pipeline_trainer(m.graph, m.loss, m.weights, equal_layer_cuts(m.checkpoints, c.layers, 2),
                                    Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1}, to, po);
    stop.init(bad);
    CHECK(tessel_test::contains(tessel_test::error_of([&] { stop.step(micro); }), "step 1 is not finite"));
    CHECK(stop.steps_done() == 0);
  }

  SECTION("what does not fit is refused naming it") {
    GptGraph m = build_gpt(c);
    ThreadRuntime s0(1), s1(1);
    PipelineOptions po;
    po.micro = M;
    const std::vector<Tensor> cuts = equal_layer_cuts(m.checkpoints, c.layers, 2);
    Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights, cuts, Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1}, to, po);
    tr.init(one.init);
    const std::string three = tessel_test::error_of([&] {
      tr.step(std::vector<std::vector<HostTensor>>(micro.begin(), micro.begin() + 3));
    });
    CHECK(tessel_test::contains(three, "3 micro-batches given"));
    CHECK(tessel_test::contains(three, "runs 4 a step"));
    CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.program(); }), "not one program of its own"));
    CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.device_state(); }), "a pipeline of 2 stages"));
    CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                  pipeline_trainer(m.graph, m.loss, m.weights, cuts, Mesh::parse("data=2"), {&s0, &s1},
                                                   to, po);
                                }),
                                "has no 'pipe' axis"));
    CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                  pipeline_trainer(m.graph, m.loss, m.weights, {}, Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1},
                                                   to, po);
                                }),
                                "0 cuts for 2 stages: give 1"));
    CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                  pipeline_trainer(m.graph, m.loss, m.weights, cuts, Mesh::parse("pipe=4,data=1,model=1"), {&s0, &s1},
                                                   to, po);
                                }),
                                "2 runtimes for pipe=4"));
    TrainerOptions ao = to;
    ao.auto_shard = AutoShardOptions{};
    CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                  pipeline_trainer(m.graph, m.loss, m.weights, cuts, Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1},
                                                   ao, po);
                                }),
                                "StageCutOptions::auto_shard"));
    TrainerOptions z3 = to;
    z3.train.zero = 4;
    CHECK(tessel_test::contains(tessel_test::error_of([&] {
                                  pipeline_trainer(m.graph, m.loss, m.weights, cuts, Mesh::parse("pipe=2,data=1,model=1"), {&s0, &s1},
                                                   z3, po);
                                }),
                                "TrainOptions::zero = 4: ZeRO 0 to 3 within each stage"));
    std::map<std::string, HostTensor> wrong = one.init;
    wrong.at("l0_w1") = HostTensor(DType::f32, {3});
    CHECK(tessel_test::contains(tessel_test::error_of([&] { tr.init(wrong); }), "parameter 'l0_w1' is f32[3]"));
  }
}
