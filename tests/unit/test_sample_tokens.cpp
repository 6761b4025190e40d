// sample_tokens (docs/ir.md): the CPU kernel, through the reference executor, against the
// rule's edge cases, against the host's reference draw (infer's sample_token, which sorts where
// the kernel selects) on fresh random rows with ties, against the softmax's probabilities over
// many keys, and partitioned (rows split, the vocabulary gathered) against one device.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/infer/generate.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;

namespace {

struct Rows {
  int64_t R = 0, V = 0;
  std::vector<float> logits, temperature, top_p;
  std::vector<int32_t> keys, top_k;
};

// The kernel's tokens for `r` (one run of the reference executor).
std::vector<int32_t> draw(const Rows& r, DType dt = DType::f32) {
  Graph g;
  Tensor l = input(g, "logits", dt, {r.R, r.V});
  Tensor k = input(g, "keys", DType::i32, {r.R});
  Tensor t = input(g, "temperature", DType::f32, {r.R});
  Tensor tk = input(g, "top_k", DType::i32, {r.R});
  Tensor tp = input(g, "top_p", DType::f32, {r.R});
  g.mark_output(sample_tokens(l, k, t, tk, tp));
  HostTensor hl(dt, {r.R, r.V}), hk(DType::i32, {r.R}), ht(DType::f32, {r.R}), htk(DType::i32, {r.R}),
      htp(DType::f32, {r.R});
  for (int64_t i = 0; i < r.R * r.V; ++i) hl.set(i, r.logits[static_cast<std::size_t>(i)]);
  for (int64_t i = 0; i < r.R; ++i) {
    const auto u = static_cast<std::size_t>(i);
    hk.set(i, r.keys[u]);
    ht.set(i, r.temperature[u]);
    htk.set(i, r.top_k[u]);
    htp.set(i, r.top_p[u]);
  }
  const HostTensor out = run_reference(g, {hl, hk, ht, htk, htp}).at(0);
  std::vector<int32_t> v;
  for (int64_t i = 0; i < r.R; ++i) v.push_back(static_cast<int32_t>(out.get(i)));
  return v;
}

Rows one_row(std::vector<float> logits, float temperature, int32_t top_k, float top_p, int32_t key) {
  Rows r;
  r.R = 1;
  r.V = static_cast<int64_t>(logits.size());
  r.logits = std::move(logits);
  r.temperature = {temperature};
  r.top_k = {top_k};
  r.top_p = {top_p};
  r.keys = {key};
  return r;
}

}  // namespace

TEST_CASE("sample_tokens: greedy takes the first maximum and a row without a finite logit gives V",
          "[ops][kernels][sample]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float t : {0.0f, -1.0f, nan}) {  // temperature <= 0 or NaN: greedy
    CHECK(draw(one_row({0.5f, 2.0f, -1.0f, 2.0f}, t, 0, 1, 7)) == std::vector<int32_t>{1});
    CHECK(draw(one_row({nan, -inf, 3.0f, inf}, t, 0, 1, 7)) == std::vector<int32_t>{2});  // non-finite never drawn
  }
  CHECK(draw(one_row({nan, -inf, inf}, 1.0f, 0, 1, 7)) == std::vector<int32_t>{3});
  CHECK(draw(one_row({nan, nan}, 0.0f, 0, 1, 7)) == std::vector<int32_t>{2});
}

TEST_CASE("sample_tokens: top_k 1 and top_p 0 keep only the maxima whatever the key", "[ops][kernels][sample]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("sample_tokens cuts", seed, 200);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200; ++i) {
    const auto key = static_cast<int32_t>(rng());
    CHECK(draw(one_row({0.1f, 3.0f, 2.9f, -4.0f, 1.0f}, 5.0f, 1, 1, key)) == std::vector<int32_t>{1});
    CHECK(draw(one_row({0.1f, 3.0f, 2.9f, -4.0f, 1.0f}, 5.0f, 0, 0, key)) == std::vector<int32_t>{1});
    // top_k 2 keeps the two largest (and a tie with the second: three tokens here).
    const int32_t t = draw(one_row({0.1f, 3.0f, 2.0f, -4.0f, 2.0f}, 50.0f, 2, 1, key))[0];
    CHECK((t == 1 || t == 2 || t == 4));
    // top_p 0.5 of softmax([2, 1, 0]): the largest alone holds 0.665 of the mass.
    CHECK(draw(one_row({2.0f, 1.0f, 0.0f}, 1.0f, 0, 0.5f, key)) == std::vector<int32_t>{0});
    const int32_t u = draw(one_row({2.0f, 1.0f, 0.0f}, 1.0f, 0, 0.7f, key))[0];  // 0.665 < 0.7: two kept
    CHECK((u == 0 || u == 1));
  }
}

TEST_CASE("sample_tokens: the kernel draws the host reference's token on random rows with ties",
          "[ops][kernels][sample]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("sample_tokens against the host reference", seed, 400);
  std::mt19937_64 rng(seed);
  Rows r;
  r.R = 400;
  r.V = 37;
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<SamplingOptions> opts;
  for (int64_t i = 0; i < r.R; ++i) {
    for (int64_t v = 0; v < r.V; ++v)  // a quarter of the rows on a coarse grid: many ties
      r.logits.push_back(i % 4 == 0 ? std::round(u(rng)) : u(rng));
    SamplingOptions o;
    o.temperature = i % 5 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.1, 3)(rng);
    o.top_k = static_cast<int64_t>(rng() % 12);
    o.top_p = i % 3 == 0 ? 1.0 : std::uniform_real_distribution<double>(0.05, 1)(rng);
    o.seed = seed;
    opts.push_back(o);
    r.keys.push_back(sample_key(o.seed, i, 5));
    r.temperature.push_back(static_cast<float>(o.temperature));
    r.top_k.push_back(static_cast<int32_t>(o.top_k));
    r.top_p.push_back(static_cast<float>(o.top_p));
  }
  const std::vector<int32_t> got = draw(r);
  int64_t not_greedy = 0;
  for (int64_t i = 0; i < r.R; ++i) {
    const float* row = r.logits.data() + i * r.V;
    const int32_t want = sample_token(row, r.V, opts[static_cast<std::size_t>(i)], i, 5);
    INFO("row " << i);
    CHECK(got[static_cast<std::size_t>(i)] == want);
    not_greedy += want != sample_token(row, r.V, SamplingOptions{}, i, 5);
  }
  CHECK(not_greedy > 50);  // the draws are not all the greedy tokens
}

TEST_CASE("sample_tokens: the draws follow the softmax at the temperature", "[ops][kernels][sample]") {
  // 20,000 rows of the same logits, each with its own key: each token's frequency within 5
  // standard deviations of its probability softmax(logits / 2). bf16 logits too.
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("sample_tokens frequencies", seed, 20000);
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  const float T = 2.0f;
  for (DType dt : {DType::f32, DType::bf16}) {
    Rows r;
    r.R = 20000;
    r.V = static_cast<int64_t>(logits.size());
    for (int64_t i = 0; i < r.R; ++i) {
      r.logits.insert(r.logits.end(), logits.begin(), logits.end());
      r.keys.push_back(sample_key(seed, i, 0));
      r.temperature.push_back(T);
      r.top_k.push_back(0);
      r.top_p.push_back(1);
    }
    std::vector<double> count(logits.size(), 0.0);
    for (int32_t t : draw(r, dt)) count.at(static_cast<std::size_t>(t)) += 1;
    double Z = 0;
    for (float l : logits) Z += std::exp(l / T);
    for (std::size_t v = 0; v < logits.size(); ++v) {
      const double p = std::exp(logits[v] / T) / Z, n = static_cast<double>(r.R);
      INFO(dtype_name(dt) << " token " << v << ": " << count[v] << " of " << n << ", p " << p);
      CHECK(std::abs(count[v] - n * p) <= 5 * std::sqrt(n * p * (1 - p)));
    }
  }
}

TEST_CASE("sample_tokens: rows split and the vocabulary gathered match one device in both stream modes", "[ops][partition][sample]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("sample_tokens partitioned", seed, 1);
  Graph g;
  Tensor l = input(g, "logits", DType::f32, {8, 24});
  g.annotate(l, Sharding::of({{"data"}, {"model"}}));
  Tensor k = input(g, "keys", DType::i32, {8});
  Tensor t = input(g, "temperature", DType::f32, {8});
  Tensor tk = input(g, "top_k", DType::i32, {8});
  Tensor tp = input(g, "top_p", DType::f32, {8});
  g.mark_output(sample_tokens(l, k, t, tk, tp));
  const Mesh mesh = Mesh::parse("data=2,model=2");
  g.mesh = mesh;
  const std::string text = compile(g, mesh).program().to_string(0);
  INFO(text);
  CHECK(tessel_test::contains(text, "all-gather"));  // the vocabulary, whole before the draw
  tessel_test::check_matches(g, mesh, seed, 0);
  // And on each stream mode's runtime (outputs poisoned first).
  Executable exe = compile(g, mesh);
  const std::vector<HostTensor> in = random_inputs(g, seed);
  const HostTensor want = run_reference(g, in).at(0);
  for (StreamMode mode : {StreamMode::Async, StreamMode::Eager}) {
    INFO(stream_mode_name(mode));
    RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
    ro.poison = true;
    const HostTensor got = exe.run(in, ro).at(0);
    for (int64_t i = 0; i < want.numel(); ++i) CHECK(got.get(i) == want.get(i));
  }
}

TEST_CASE("sample_tokens refuses operands of the wrong shape or dtype naming them", "[ops][sample]") {
  Graph g;
  Tensor l = input(g, "logits", DType::f32, {4, 10});
  Tensor k = input(g, "keys", DType::i32, {4});
  Tensor t = input(g, "temperature", DType::f32, {4});
  Tensor tk = input(g, "top_k", DType::i32, {4});
  Tensor tp = input(g, "top_p", DType::f32, {4});
  Tensor bad_k = input(g, "keys3", DType::i32, {3});
  Tensor f_k = input(g, "fkeys", DType::f32, {4});
  Tensor il = input(g, "ilogits", DType::i32, {4, 10});
  const std::string e1 = tessel_test::error_of([&] { sample_tokens(l, bad_k, t, tk, tp); });
  CHECK(tessel_test::contains(e1, "sample_tokens"));
  CHECK(tessel_test::contains(e1, "%keys3"));
  CHECK(tessel_test::contains(e1, "keys must have the logits' dims without the last: [4]"));
  const std::string e2 = tessel_test::error_of([&] { sample_tokens(l, f_k, t, tk, tp); });
  CHECK(tessel_test::contains(e2, "keys must be i32"));
  const std::string e3 = tessel_test::error_of([&] { sample_tokens(il, k, t, tk, tp); });
  CHECK(tessel_test::contains(e3, "logits must be a float dtype"));
}
