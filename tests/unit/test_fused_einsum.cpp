// fused_einsum: an einsum with an elementwise epilogue (bias, GELU, residual, scale), made by
// the fuse-elementwise pass from an einsum and the chain that alone reads its product. The text
// round-trips and bad input is an error naming the op; the pass fuses each post-op kind, with
// batch letters too, and nothing whose product has another reader or is an output; fused and
// unfused programs agree on one device and partitioned; the CPU kernel's oneDNN post-ops agree
// with its fallback (the einsum, then the epilogue as a loop over the result).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "../../src/runtime/cpu/onednn_einsum.hpp"
#include "tessel/ops/builders.hpp"
#include "test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;
using tessel_test::contains;
using tessel_test::count;
using tessel_test::error_of;

namespace {

std::string lowered_text(const Graph& g, const Mesh& mesh, bool fuse, bool epilogues = true) {
  ProgramPassOptions o;
  o.fuse_elementwise = fuse;
  o.fuse_einsum_epilogue = epilogues;
  return print_program(lower_program(compile(g, mesh).program(), /*verify=*/true, o));
}

std::vector<HostTensor> run_with(const Graph& g, const Mesh& mesh, bool fuse, uint64_t seed) {
  return tessel_test::run_fused(g, mesh, fuse, /*epilogues=*/true, seed);
}

// Fused against unfused: the einsum may run with oneDNN post-ops (a different GELU and
// summation order), so they agree to rounding relative to the result's scale.
void require_close(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b, double tol = 2e-6) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const CompareResult c = compare(a[i], b[i]);
    INFO("output " << i << ": " << c.to_string());
    CHECK(c.max_rel_err <= tol);
  }
}

struct Mlp {
  Graph g;
  Tensor x, w, b, r;
};
// x [B?, M, K] · w [K, N] with a bias [N] and a residual of the result's shape.
Mlp mlp(bool batch, int64_t m = 24, int64_t k = 40, int64_t n = 56) {
  Mlp p;
  p.x = batch ? input(p.g, "x", DType::f32, {3, m, k}) : input(p.g, "x", DType::f32, {m, k});
  p.w = input(p.g, "w", DType::f32, {k, n});
  p.b = input(p.g, "b", DType::f32, {n});
  p.r = batch ? input(p.g, "r", DType::f32, {3, m, n}) : input(p.g, "r", DType::f32, {m, n});
  return p;
}

}  // namespace

TEST_CASE("fused_einsum: the text round-trips and the verifier checks the epilogue", "[fusion][fused_einsum]") {
  const std::string ok =
      "mesh {}\n"
      "%x = input f32[4,6] global=f32[4,6] sharding=[{}, {}]\n"
      "%w = input f32[6,8] global=f32[6,8] sharding=[{}, {}]\n"
      "%b = input f32[8] global=f32[8] sharding=[{}]\n"
      "%y = fused_einsum(%x, %w, %b) eq=\"ij,jk->ik\" epilogue=\"gelu(add($0,$1))\" : f32[4,8] global=f32[4,8] "
      "sharding=[{}, {}] @compute\n"
      "output %y\n";
  CHECK(print_program(parse_program(ok)) == ok);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = ok;
    t.replace(t.find(from), from.size(), to);
    return error_of([&] { parse_program(t, "bad.pir"); });
  };
  // An epilogue that changes the product's dtype or shape, reads a missing operand, or is not
  // an expression; an equation with three operands.
  std::string m = with("gelu(add($0,$1))", "cast<bf16>(add($0,$1))");
  CHECK(contains(m, "fused_einsum"));
  CHECK(contains(m, "must keep the product's shape and dtype"));
  m = with("gelu(add($0,$1))", "add($0,$2)");
  CHECK(contains(m, "fused_einsum"));
  CHECK(contains(m, "$2 names no operand"));
  m = with("gelu(add($0,$1))", "gelu(add($0,$1)");
  CHECK(contains(m, "fused_elementwise: expr"));
  m = with("eq=\"ij,jk->ik\"", "eq=\"ij,jk,kl->il\"");
  CHECK(contains(m, "fused_einsum"));
  CHECK(contains(m, "names 3 einsum operands"));
  // A bias that does not broadcast over the product.
  m = with("%b = input f32[8] global=f32[8]", "%b = input f32[5] global=f32[5]");
  CHECK(contains(m, "fused_einsum"));
  CHECK(contains(m, "do not broadcast"));
}

TEST_CASE("fused_einsum: the pass makes each post-op kind the einsum's epilogue", "[fusion][fused_einsum]") {
  const Mesh one({{"d", 1}});
  struct Case {
    const char* name;
    const char* epilogue;
    std::function<Tensor(Mlp&, Tensor)> chain;
  };
  const std::vector<Case> cases = {
      {"bias", "add($0,$1)", [](Mlp& p, Tensor h) { return add(h, p.b); }},
      {"gelu", "gelu($0)", [](Mlp&, Tensor h) { return gelu(h); }},
      {"bias+gelu", "gelu(add($0,$1))", [](Mlp& p, Tensor h) { return gelu(add(h, p.b)); }},
      {"residual", "add($1,$0)", [](Mlp& p, Tensor h) { return add(p.r, h); }},
      {"scale", "mul($0,0.125:f32[])", [](Mlp&, Tensor h) { return mul(h, 0.125); }},
      {"bias+gelu+scale+residual", "add(mul(gelu(add($0,$1)),0.5:f32[]),$2)",
       [](Mlp& p, Tensor h) { return add(mul(gelu(add(h, p.b)), 0.5), p.r); }},
  };
  for (bool batch : {false, true})
    for (const Case& c : cases) {
      Mlp p = mlp(batch);
      Tensor h = batch ? einsum("bmk,kn->bmn", p.x, p.w) : einsum("mk,kn->mn", p.x, p.w);
      p.g.mark_output(c.chain(p, h).named("y"));
      const std::string on = lowered_text(p.g, one, true), off = lowered_text(p.g, one, false);
      const std::string no_epilogues = lowered_text(p.g, one, true, /*epilogues=*/false);
      INFO(c.name << (batch ? " with a batch letter\n" : "\n") << on);
      CHECK(count(on, "fused_einsum(") == 1);
      CHECK(contains(on, std::string("%y = fused_einsum(%x, %w") + "") );
      CHECK(contains(on, std::string("epilogue=\"") + c.epilogue + "\""));
      CHECK(count(on, "= einsum(") == 0);
      CHECK(count(off, "fused_einsum") == 0);
      CHECK(count(no_epilogues, "fused_einsum") == 0);
      // Pure and idempotent; the text round-trips.
      const Program lowered = parse_program(on);
      CHECK(print_program(fuse_elementwise_pass(lowered)) == on);
      const uint64_t seed = 1000 + static_cast<uint64_t>(&c - cases.data());
      INFO("seed " << seed);
      require_close(run_with(p.g, one, true, seed), run_with(p.g, one, false, seed));
    }
}

TEST_CASE("fused_einsum: a product with another reader or an output product or a shape-changing chain is not fused",
          "[fusion][fused_einsum]") {
  const Mesh one({{"d", 1}});
  SECTION("the product has a second reader") {
    Mlp p = mlp(false);
    Tensor h = einsum("mk,kn->mn", p.x, p.w).named("h");
    p.g.mark_output(gelu(add(h, p.b)).named("y"));
    p.g.mark_output(exp(h).named("z"));
    const std::string on = lowered_text(p.g, one, true);
    INFO(on);
    CHECK(count(on, "fused_einsum") == 0);
    CHECK(contains(on, "%h = einsum(%x, %w)"));
    CHECK(contains(on, "%y = fused_elementwise(%h, %b) expr=\"gelu(add($0,$1))\""));
    require_close(run_with(p.g, one, true, 7), run_with(p.g, one, false, 7));
  }
  SECTION("an intermediate of the chain has another reader: the chain's head part alone is the epilogue") {
    Mlp p = mlp(false);
    Tensor h = einsum("mk,kn->mn", p.x, p.w);
    Tensor u = add(h, p.b).named("u");
    p.g.mark_output(gelu(u).named("y"));
    p.g.mark_output(mul(u, 2.0).named("z"));
    const std::string on = lowered_text(p.g, one, true);
    INFO(on);
    CHECK(contains(on, "%u = fused_einsum(%x, %w, %b) eq=\"mk,kn->mn\" epilogue=\"add($0,$1)\""));
    CHECK(contains(on, "%y = gelu(%u)"));
    require_close(run_with(p.g, one, true, 8), run_with(p.g, one, false, 8));
  }
  SECTION("the product is an output") {
    Mlp p = mlp(false);
    Tensor h = einsum("mk,kn->mn", p.x, p.w).named("h");
    p.g.mark_output(h);
    p.g.mark_output(gelu(add(h, p.b)).named("y"));
    CHECK(count(lowered_text(p.g, one, true), "fused_einsum") == 0);
  }
  SECTION("the chain's result is larger than the product (a broadcast) or of another dtype") {
    Mlp p = mlp(false);
    Tensor h = einsum("mk,kn->mn", p.x, p.w);
    Tensor big = input(p.g, "big", DType::f32, {2, 24, 56});
    p.g.mark_output(gelu(add(h, big)).named("y"));
    Tensor h2 = einsum("mk,kn->mn", p.x, p.w);
    p.g.mark_output(cast(gelu(h2), DType::bf16).named("c"));
    const std::string on = lowered_text(p.g, one, true);
    INFO(on);
    CHECK(count(on, "fused_einsum") == 0);
    require_close(run_with(p.g, one, true, 9), run_with(p.g, one, false, 9));
  }
}

TEST_CASE("fused_einsum: batch letters and transposed operands and partitioned programs", "[fusion][fused_einsum]") {
  SECTION("attention-shaped products with a batch of two letters") {
    const Mesh one({{"d", 1}});
    Graph g;
    Tensor p = input(g, "p", DType::f32, {2, 4, 16, 16});  // [b, h, q, s]
    Tensor v = input(g, "v", DType::f32, {2, 16, 4, 8});   // [b, s, h, k]
    Tensor r = input(g, "r", DType::f32, {2, 16, 4, 8});
    Tensor bias = input(g, "bias", DType::f32, {4, 8});
    Tensor o = einsum("bhqs,bshk->bqhk", p, v);
    g.mark_output(add(mul(add(o, bias), 0.25), r).named("y"));
    const std::string on = lowered_text(g, one, true);
    INFO(on);
    CHECK(contains(on, "%y = fused_einsum(%p, %v, %bias, %r) eq=\"bhqs,bshk->bqhk\" epilogue=\"add(mul(add($0,$1),0.25:f32[]),$2)\""));
    require_close(run_with(g, one, true, 31), run_with(g, one, false, 31));
  }
  SECTION("a transposed weight and a result computed transposed") {
    const Mesh one({{"d", 1}});
    Graph g;
    Tensor x = input(g, "x", DType::f32, {20, 12});
    Tensor w = input(g, "w", DType::f32, {36, 12});
    Tensor b = input(g, "b", DType::f32, {20, 1});
    g.mark_output(gelu(add(einsum("mk,nk->mn", x, w), input(g, "c", DType::f32, {36}))).named("y"));
    g.mark_output(add(einsum("mk,nk->nm", x, w), reshape(b, {20})).named("t"));
    const std::string on = lowered_text(g, one, true);
    INFO(on);
    CHECK(count(on, "fused_einsum(") == 2);
    require_close(run_with(g, one, true, 32), run_with(g, one, false, 32));
  }
  SECTION("partitioned: M and N split fuse; a split contraction is all-reduced first") {
    const Mesh mesh = Mesh::parse("a=2,b=2");
    for (int layout = 0; layout < 3; ++layout) {
      Mlp p = mlp(true, 8, 16, 12);
      if (layout == 0) p.g.annotate(p.x, Sharding::parse("[{a}, {b}, {}]"));
      if (layout == 1) p.g.annotate(p.w, Sharding::parse("[{}, {a,b}]"));
      if (layout == 2) {
        p.g.annotate(p.x, Sharding::parse("[{}, {}, {a}]"));
        p.g.annotate(p.w, Sharding::parse("[{a}, {}]"));
      }
      Tensor h = einsum("bmk,kn->bmn", p.x, p.w);
      p.g.mark_output(add(gelu(add(h, p.b)), p.r).named("y"));
      const std::string on = lowered_text(p.g, mesh, true);
      INFO("layout " << layout << "\n" << on);
      if (layout == 2) {
        CHECK(contains(on, "all_reduce"));
        CHECK(count(on, "fused_einsum") == 0);
      } else {
        CHECK(count(on, "fused_einsum(") == 1);
      }
      const uint64_t seed = 40 + static_cast<uint64_t>(layout);
      INFO("seed " << seed);
      require_close(run_with(p.g, mesh, true, seed), run_with(p.g, mesh, false, seed));
    }
  }
}

TEST_CASE("fused_einsum: the kernel's oneDNN post-ops agree with its fallback on random shapes",
          "[fusion][fused_einsum][onednn]") {
  const uint64_t seed = 20261123;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto dim = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  // The epilogue and its operands after the product: b (a bias [N]) and r (a residual).
  struct Ep {
    const char* text;
    const char* operands;
  };
  static const Ep kEpilogues[] = {{"add($0,$1)", "b"},          {"gelu($0)", ""},
                                  {"gelu(add($0,$1))", "b"},    {"add($1,$0)", "r"},
                                  {"mul($0,0.125:f32[])", ""},  {"add(mul(gelu(add($0,$1)),0.5:f32[]),$2)", "br"},
                                  {"add($0,$1)", "r"},          {"exp(neg($0))", ""}};
  int post_op_runs = 0, chains = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const bool batch = rng() % 2, trans_w = rng() % 3 == 0;
    const int64_t B = dim(1, 3), M = dim(1, 70), K = dim(1, 90), N = dim(1, 80);
    // Batched (b in both operands): a matmul primitive, post-ops. Plain: dnnl_sgemm, the loop.
    const std::string eq = std::string(batch ? "bmk,b" : "mk,") + (trans_w ? "nk" : "kn") + (batch ? "->bmn" : "->mn");
    const Shape sx = batch ? Shape{B, M, K} : Shape{M, K}, so = batch ? Shape{B, M, N} : Shape{M, N};
    Shape sw = trans_w ? Shape{N, K} : Shape{K, N};
    if (batch) sw.insert(sw.begin(), B);
    const Ep& ep = kEpilogues[rng() % std::size(kEpilogues)];
    INFO("trial " << trial << ": " << eq << " " << shape_str(sx) << " " << shape_str(sw) << " epilogue " << ep.text);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](const Shape& s) {
      std::vector<float> v(static_cast<std::size_t>(num_elements(s)));
      for (float& f : v) f = nd(rng);
      return v;
    };
    const std::vector<float> x = fill(sx), w = fill(sw), b = fill({N}), r = fill(so);
    OpAttrs at;
    at.equation = eq;
    at.epilogue = ep.text;
    KernelArgs a;
    a.kind = OpKind::FusedEinsum;
    a.attrs = &at;
    a.in = {x.data(), w.data()};
    a.in_shapes = {sx, sw};
    for (const char* o = ep.operands; *o; ++o) {
      a.in.push_back(*o == 'b' ? b.data() : r.data());
      a.in_shapes.push_back(*o == 'b' ? Shape{N} : so);
    }
    a.in_dtypes.assign(a.in.size(), DType::f32);
    a.out_shape = so;
    a.out_dtype = DType::f32;
    std::vector<float> fused(static_cast<std::size_t>(num_elements(so)), NAN), ref = fused;
    a.out = fused.data();
    const bool post_ops = run_fused_einsum(a);
    const bool chain = std::string(ep.text) != "exp(neg($0))";
    // Size-1 letters are dropped: M = 1 or N = 1 with B = 1 is a plain product too.
    const bool primitive = batch && B > 1;
    post_op_runs += post_ops;
    chains += chain && primitive;
    INFO("post-ops: " << post_ops);
    CHECK((!post_ops || (chain && primitive)));
    a.out = ref.data();
    run_fused_einsum_fallback(a);
    HostTensor tf(DType::f32, so), tr(DType::f32, so);
    std::memcpy(tf.data(), fused.data(), fused.size() * sizeof(float));
    std::memcpy(tr.data(), ref.data(), ref.size() * sizeof(float));
    const CompareResult c = compare(tf, tr, std::sqrt(double(K)));
    INFO(c.to_string());
    CHECK(c.max_rel_err <= 2e-6);
  }
  std::printf("fused_einsum kernel: %d of %d post-op chains on batched products ran as oneDNN post-ops\n",
              post_op_runs, chains);
  // With oneDNN, the batched products' plain layouts take their post-ops.
  if (onednn_einsum_compiled()) CHECK(post_op_runs == chains);
  else CHECK(post_op_runs == 0);
}
