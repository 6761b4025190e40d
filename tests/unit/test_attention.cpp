// Fused attention (src/ops/attention.cpp, docs/attention.md): the tiled CPU kernels against the
// unfused chain (einsum -> scale -> causal_mask -> softmax -> einsum) on random shapes, both
// layouts, with and without the mask, f32 and bf16; the flash backward against the gradient of
// the unfused chain; partitioned runs against one device; the fuse-attention pass (what it
// rewrites and what it leaves); the errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "tessel/ops/builders.hpp"
#include "tessel/compiler/checks.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/passes/fuse_attention.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/autodiff.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

struct Case {
  int64_t B, H, Sq, Sk, D;
  bool bshd, causal;
  double scale;
  std::string str() const {
    return fmt::format("B={} H={} Sq={} Sk={} D={} layout={} causal={} scale={}", B, H, Sq, Sk, D,
                       bshd ? "bshd" : "bhsd", causal, scale);
  }
};

Case draw(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + static_cast<long>(rng() % xs.size())); };
  Case c;
  c.B = pick({1, 2, 3});
  c.H = pick({1, 2, 3});
  // Sizes around the kernel's tiles (64 queries, 128 keys) so partial tiles are covered.
  c.Sq = pick({1, 5, 17, 64, 65, 130});
  c.Sk = c.Sq + (rng() % 3 == 0 ? pick({1, 7, 128}) : 0);
  c.D = pick({4, 16, 64});
  c.bshd = rng() % 2 == 0;
  c.causal = rng() % 2 == 0;
  c.scale = rng() % 2 == 0 ? 1.0 / std::sqrt(static_cast<double>(c.D)) : 0.7;
  return c;
}

Shape shape_of(const Case& c, int64_t S) { return c.bshd ? Shape{c.B, S, c.H, c.D} : Shape{c.B, c.H, S, c.D}; }

// The long form in the layout of the case: scores [b,h,q,s], causal_mask aligned to the end
// (a [Sq, Sk] mask of a query block after Sk - Sq earlier keys is the last Sq rows of the
// [Sk, Sk] mask), softmax, then the product with v back in q's layout.
Tensor unfused(const Case& c, Tensor q, Tensor k, Tensor v, DType dt) {
  const std::string ql = c.bshd ? "bqhd" : "bhqd", kl = c.bshd ? "bshd" : "bhsd";
  Tensor s = mul(einsum(ql + "," + kl + "->bhqs", q, k), constant(*q.graph(), c.scale, dt));
  if (c.causal) {
    if (c.Sk == c.Sq) {
      s = causal_mask(s);
    } else {  // mask [b,h,Sk,Sk] scores padded in front, keep the last Sq rows
      Tensor pad = broadcast_to(constant(*q.graph(), 0.0, dt), {c.B, c.H, c.Sk - c.Sq, c.Sk});
      Tensor full = causal_mask(concat({pad, s}, 2));
      s = slice(full, {0, 0, c.Sk - c.Sq, 0}, {c.B, c.H, c.Sk, c.Sk});
    }
  }
  Tensor p = softmax(s, -1);
  return einsum("bhqs," + kl + "->" + ql, p, v);
}

// A graph with inputs q, k, v of the case's shapes in dtype dt.
struct Qkv {
  Graph g;
  Tensor q, k, v;
  Qkv(const Case& c, DType dt)
      : q(input(g, "q", dt, shape_of(c, c.Sq))), k(input(g, "k", dt, shape_of(c, c.Sk))),
        v(input(g, "v", dt, shape_of(c, c.Sk))) {}
  AttentionResults fused(const Case& c) { return attention(q, k, v, c.causal, c.scale, c.bshd ? "bshd" : "bhsd"); }
};

// Runs f(case, rng) on `dflt` random cases (TESSEL_CASES overrides), the seed announced and
// every failure naming the seed, the case number and its shapes.
template <class F>
void each_case(const char* name, int dflt, F&& f) {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(dflt);
  tessel_test::announce(name, seed, cases);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const Case c = draw(rng);
    INFO("seed " << seed << " case " << i << ": " << c.str());
    f(c, rng);
  }
}

}  // namespace

TEST_CASE("attention: the tiled kernel equals the unfused chain in f32 on random shapes and both layouts", "[attention]") {
  each_case("attention: the tiled kernel equals the unfused chain", 24, [](const Case& c, std::mt19937_64& rng) {
    Qkv x(c, DType::f32);
    Graph& g = x.g;
    Tensor &q = x.q, &k = x.k, &v = x.v;
    AttentionResults a = x.fused(c);
    g.mark_output(a.out);
    g.mark_output(a.lse);
    g.mark_output(unfused(c, q, k, v, DType::f32));
    auto in = random_inputs(g, rng());
    auto got = run_reference(g, in);
    CompareResult cmp = compare(got[0], got[2]);
    INFO(cmp.to_string());
    CHECK(cmp.max_rel_err <= 1e-5);
    // lse is the log-sum-exp of the masked, scaled scores: check a few rows in double.
    const int64_t rows = c.B * c.H * c.Sq;
    for (int64_t r = 0; r < rows; r += std::max<int64_t>(1, rows / 7)) {
      const int64_t b = r / (c.H * c.Sq), h = (r / c.Sq) % c.H, qi = r % c.Sq;
      auto at = [&](const HostTensor& t, int64_t bb, int64_t hh, int64_t s, int64_t d, int64_t S) {
        return c.bshd ? t.get(((bb * S + s) * c.H + hh) * c.D + d) : t.get(((bb * c.H + hh) * S + s) * c.D + d);
      };
      double m = -INFINITY;
      std::vector<double> sc;
      for (int64_t j = 0; j < c.Sk; ++j) {
        if (c.causal && j > qi + c.Sk - c.Sq) break;
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d) dot += at(in[0], b, h, qi, d, c.Sq) * at(in[1], b, h, j, d, c.Sk);
        sc.push_back(dot * c.scale);
        m = std::max(m, sc.back());
      }
      double sum = 0;
      for (double sv : sc) sum += std::exp(sv - m);
      CHECK(got[1].get(r) == Approx(m + std::log(sum)).epsilon(1e-5).margin(1e-5));
    }
  });
}

TEST_CASE("attention: bf16 and f16 operands compute in f32 and round once", "[attention]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("attention: bf16 and f16", seed, 4);
  std::mt19937_64 rng(seed);
  for (DType dt : {DType::bf16, DType::f16}) {
    for (int i = 0; i < 2; ++i) {
      const Case c = draw(rng);
      INFO("seed " << seed << " " << dtype_name(dt) << ": " << c.str());
      Qkv x(c, dt);
      Graph& g = x.g;
      Tensor &q = x.q, &k = x.k, &v = x.v;
      AttentionResults a = x.fused(c);
      g.mark_output(a.out);
      // The oracle: the same attention on the f32 values of the inputs.
      AttentionResults r = attention(cast(q, DType::f32), cast(k, DType::f32), cast(v, DType::f32), c.causal, c.scale,
                                     c.bshd ? "bshd" : "bhsd");
      g.mark_output(cast(r.out, dt));
      auto got = run_reference(g, random_inputs(g, rng()));
      CHECK(got[0].dtype() == dt);
      CompareResult cmp = compare(got[0], got[1]);
      INFO(cmp.to_string());
      CHECK(cmp.max_rel_err == 0);  // one rounding of the same f32 result
    }
  }
}

TEST_CASE("attention: the flash backward equals the unfused chain's gradient", "[attention]") {
  each_case("attention: the flash backward equals the unfused chain's gradient", 16, [](const Case& c, std::mt19937_64& rng) {
    Qkv x(c, DType::f32);
    Graph& g = x.g;
    Tensor &q = x.q, &k = x.k, &v = x.v;
    Tensor w = input(g, "w", DType::f32, shape_of(c, c.Sq));
    Tensor fused = x.fused(c).out;
    Tensor loss_f = reduce_sum(mul(fused, w), {0, 1, 2, 3});
    Tensor loss_u = reduce_sum(mul(unfused(c, q, k, v, DType::f32), w), {0, 1, 2, 3});
    std::vector<Tensor> gf = grad(loss_f, {q, k, v});
    std::vector<Tensor> gu = grad(loss_u, {q, k, v});
    for (const Tensor& t : gf) g.mark_output(t);
    for (const Tensor& t : gu) g.mark_output(t);
    bool flash = false;
    for (const Op& op : g.ops) flash = flash || op.kind == OpKind::AttentionGrad;
    CHECK(flash);
    auto got = run_reference(g, random_inputs(g, rng()));
    for (int r = 0; r < 3; ++r) {
      CompareResult cmp = compare(got[static_cast<std::size_t>(r)], got[static_cast<std::size_t>(r + 3)]);
      INFO("d" << "qkv"[r] << ": " << cmp.to_string());
      CHECK(cmp.max_rel_err <= 1e-5);
    }
  });
}

TEST_CASE("attention: partitioned over batch and heads equals one device forward and backward", "[attention]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(8);
  tessel_test::announce("attention: partitioned equals one device", seed, cases);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    Case c = draw(rng);
    c.B = 2;
    c.H = 4;
    const Mesh mesh = i % 2 ? Mesh({{"data", 2}, {"model", 2}}) : Mesh({{"model", 4}});
    INFO("seed " << seed << " case " << i << ": " << c.str() << " mesh " << mesh.to_string());
    Qkv x(c, DType::f32);
    Graph& g = x.g;
    Tensor &q = x.q, &k = x.k, &v = x.v;
    Tensor w = input(g, "w", DType::f32, shape_of(c, c.Sq));
    std::vector<std::vector<std::string>> lay(4);
    if (mesh.has_axis("data")) lay[0] = {"data"};
    lay[c.bshd ? 2 : 1] = {"model"};
    for (const Tensor& t : {q, k, v, w}) g.annotate(t, Sharding::of(lay));
    Tensor o = attention(q, k, v, c.causal, c.scale, c.bshd ? "bshd" : "bhsd").out;
    Tensor loss = reduce_sum(mul(o, w), {0, 1, 2, 3});
    g.mark_output(o);
    for (const Tensor& t : grad(loss, {q, k, v})) g.mark_output(t);
    Executable exe = compile(g, mesh);
    // Split over batch and heads: attention runs on local blocks with no collective of its own.
    for (const Instr& in : exe.program().instrs)
      if (in.op == OpKind::Attention || in.op == OpKind::AttentionGrad) CHECK(in.kind == InstrKind::Kernel);
    tessel_test::check_matches(g, mesh, rng());
  }
}

TEST_CASE("attention: a split sequence is gathered with a warning naming the op and the value", "[attention]") {
  Graph g;
  Tensor q = input(g, "q", DType::f32, {2, 8, 4, 16});
  g.annotate(q, Sharding::of({{}, {"model"}, {}, {}}));
  Tensor o = attention(q, q, q, true, 0, "bshd").out;
  g.mark_output(o);
  const Mesh mesh({{"model", 2}});
  Executable exe = compile(g, mesh);
  bool warned = false;
  for (const std::string& w : exe.program().warnings)
    warned = warned || (tessel_test::contains(w, "attention") && tessel_test::contains(w, "%q") &&
                        tessel_test::contains(w, "sequence") && tessel_test::contains(w, "model"));
  CHECK(warned);
  tessel_test::check_matches(g, mesh, tessel_test::seed());
}

TEST_CASE("attention: bad operands get errors naming the op and the shapes and the rule", "[attention]") {
  Graph g;
  Tensor q = input(g, "q", DType::f32, {2, 4, 8, 16});
  Tensor k = input(g, "k", DType::f32, {2, 4, 6, 16});
  Tensor k3 = input(g, "k3", DType::f32, {2, 4, 16});
  Tensor kb = input(g, "kb", DType::bf16, {2, 4, 8, 16});
  Tensor kh = input(g, "kh", DType::f32, {2, 3, 8, 16});
  auto err = [](const std::function<void()>& f) { return tessel_test::error_of(f); };
  CHECK_THAT(err([&] { attention(q, k, k, true); }), Catch::Contains("attention(%q: f32[2,4,8,16]") &&
                                                          Catch::Contains("at least as many keys as queries"));
  CHECK_THAT(err([&] { attention(q, k3, k3); }), Catch::Contains("rank 4"));
  CHECK_THAT(err([&] { attention(q, kb, kb); }), Catch::Contains("one dtype"));
  CHECK_THAT(err([&] { attention(q, kh, kh); }), Catch::Contains("batch, heads and head_dim"));
  CHECK_THAT(err([&] { attention(q, q, k); }), Catch::Contains("k and v must have one shape"));
  CHECK_THAT(err([&] { attention(q, q, q, false, 0, "bsdh"); }), Catch::Contains("layout \"bsdh\""));
  CHECK_THAT(err([&] { attention(q, q, q, false, std::nan("")); }), Catch::Contains("scale=nan"));
  // Non-causal attention with more queries than keys is fine.
  CHECK(attention(q, k, k).out.shape() == q.shape());
  // The text form round-trips every attribute.
  Graph t = parse_graph(R"(%q = input f32[2,8,4,16]
%o, %l = attention(%q, %q, %q) layout="bshd" causal=true scale=0.25
output %o
)");
  const Op& op = t.ops.back();
  CHECK(op.attrs.causal);
  CHECK(op.attrs.scalar == 0.25);
  CHECK(op.attrs.equation == "bshd");
  CHECK(t.values[static_cast<std::size_t>(op.extra_outputs[0])].shape == Shape{2, 4, 8});
  CHECK(print_graph(parse_graph(print_graph(t))) == print_graph(t));
  // scale 0 means 1/sqrt(head_dim), stored explicitly.
  Tensor d = attention(q, q, q).out;
  CHECK(g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(d.id)].producer)].attrs.scalar == 0.25);
}

TEST_CASE("fuse-attention: the GPT long form becomes one attention op per layer and computes the same", "[attention]") {
  GptConfig cfg;
  cfg.batch = 2;
  cfg.seq = 16;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.vocab = 64;
  cfg.fused_attention = false;
  GptGraph m = build_gpt(cfg);
  FusedAttentionGraph f = fuse_attention(m.graph);
  CHECK(f.fused == 2);
  REQUIRE(f.report.size() == 2);
  CHECK_THAT(f.report[0], Catch::Contains("%l0_ctx = attention(%l0_q, %l0_k, %l0_v) layout=bshd causal=true") &&
                              Catch::Contains("mul 0.35355339059327373 %l0_scores -> causal_mask") &&
                              Catch::Contains("softmax %l0_probs -> einsum %l0_ctx"));
  int attn = 0, softmaxes = 0;
  for (const Op& op : f.graph.ops) {
    attn += op.kind == OpKind::Attention;
    softmaxes += op.kind == OpKind::Softmax;
  }
  CHECK(attn == 2);
  CHECK(softmaxes == 0);
  // The rewritten graph keeps the names, inputs and outputs, and computes the same loss.
  CHECK(f.graph.inputs.size() == m.graph.inputs.size());
  CHECK(f.graph.values[static_cast<std::size_t>(f.graph.outputs[0])].name == "loss");
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("fuse-attention: GPT long form", seed, 1);
  auto in = random_inputs(m.graph, seed);
  gpt_init(m.graph, in);
  const double want = run_reference(m.graph, in)[0].get(0);
  CHECK(run_reference(f.graph, in)[0].get(0) == Approx(want).epsilon(1e-6));
  // compile() fuses by default; the partitioned long form equals one device.
  const Mesh mesh({{"data", 2}, {"model", 2}});
  Executable exe = compile(m.graph, mesh);
  int in_program = 0;
  for (const Instr& ins : exe.program().instrs) in_program += ins.op == OpKind::Attention;
  CHECK(in_program == 2);
  CHECK(exe.run(in)[0].get(0) == Approx(want).epsilon(1e-5));
  CompileOptions off;
  off.fuse_attention = false;
  Executable plain = compile(m.graph, mesh, off);
  for (const Instr& ins : plain.program().instrs) CHECK(ins.op != OpKind::Attention);
}

TEST_CASE("fuse-attention: chains it must leave alone", "[attention]") {
  auto build = [](int variant) {
    Graph g;
    Tensor q = input(g, "q", DType::f32, {2, 4, 8, 16});  // bhsd
    Tensor s = einsum("bhqd,bhsd->bhqs", q, q);
    if (variant == 3) g.annotate(s, Sharding::of({{}, {}, {}, {}}));
    Tensor p = softmax(causal_mask(mul(s, 0.25)), variant == 1 ? 2 : -1);
    Tensor o = einsum("bhqs,bhsd->bhqd", p, q);
    g.mark_output(o);
    if (variant == 2) g.mark_output(p);  // the probabilities are read elsewhere
    return g;
  };
  CHECK(fuse_attention(build(0)).fused == 1);
  CHECK(fuse_attention(build(1)).fused == 0);  // softmax not over the keys
  CHECK(fuse_attention(build(2)).fused == 0);  // an intermediate is an output
  CHECK(fuse_attention(build(3)).fused == 0);  // an intermediate carries an annotation
  // Keys not last in the scores (a transposed product) are not attention's form.
  Graph g;
  Tensor q = input(g, "q", DType::f32, {2, 4, 8, 16});
  Tensor p = softmax(einsum("bhqd,bhsd->bhsq", q, q), -1);
  g.mark_output(einsum("bhsq,bhsd->bhqd", p, q));
  CHECK(fuse_attention(g).fused == 0);
  // A sequence split annotated on q stays with the long form (which splits the softmax).
  Graph h = build(0);
  h.annotate(h.inputs[0], Sharding::of({{}, {}, {"model"}, {}}));
  CHECK(fuse_attention(h).fused == 0);
}
