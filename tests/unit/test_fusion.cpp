// fuse-elementwise and fused_elementwise: the expression text round-trips and rejects bad
// input with errors naming the op and the problem; the pass fuses what it may and nothing
// else; the fused kernel gives the bits of the unfused chain (f32, bf16, i32, broadcasting).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>

#include "tessel/ops/builders.hpp"
#include "test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;
using tessel_test::contains;
using tessel_test::count;
using tessel_test::error_of;

namespace {

// The graph's outputs computed on `mesh`, lowered with fusion on or off.
// This file tests the elementwise groups, bit for bit; an einsum's epilogue (fused_einsum,
// whose oneDNN post-ops round differently) has tests/unit/test_fused_einsum.cpp.
std::vector<HostTensor> run_with(const Graph& g, const Mesh& mesh, bool fuse, uint64_t seed) {
  return tessel_test::run_fused(g, mesh, fuse, /*epilogues=*/false, seed);
}

void require_same_bits(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].dtype() == b[i].dtype());
    REQUIRE(a[i].shape() == b[i].shape());
    int64_t first = -1, differ = 0;
    const std::size_t es = dtype_size(a[i].dtype());
    for (int64_t k = 0; k < a[i].numel(); ++k)
      if (std::memcmp(static_cast<const char*>(a[i].data()) + k * es, static_cast<const char*>(b[i].data()) + k * es, es) != 0) {
        if (first < 0) first = k;
        ++differ;
      }
    INFO("output " << i << ": " << differ << " elements differ, the first at " << first << ": "
                   << (first >= 0 ? a[i].get(first) : 0.0) << " vs " << (first >= 0 ? b[i].get(first) : 0.0));
    CHECK(differ == 0);
  }
}

// fused_softmax against an unfused softmax that may run on oneDNN (docs/cpu-backend.md: f32
// softmax over the last axis, where built with TESSEL_WITH_ONEDNN): the row code differs, so
// the results agree to rounding, not bit for bit (the hand-written softmax is bit-identical).
void require_close(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CompareResult c = compare(a[i], b[i]);
    INFO("output " << i << ": " << c.to_string());
    CHECK(c.max_rel_err <= 1e-6);
  }
}

std::string lowered_text(const Graph& g, const Mesh& mesh, bool fuse) {
  ProgramPassOptions o;
  o.fuse_elementwise = fuse;
  o.fuse_einsum_epilogue = false;  // as in run_with
  return print_program(lower_program(compile(g, mesh).program(), /*verify=*/true, o));
}

}  // namespace

TEST_CASE("fusion: the expression text round-trips in its canonical form", "[fusion]") {
  for (const char* text : {"gelu(add($0,$1))", "add(mul($0,0.125:f32[]),$1)", "exp(neg($0));mul(#0,add(#0,$1))",
                           "where(gt($0,$1),tanh($0),sub($1,-1.5:f32[1]))", "cast<f32>(cast<bf16>(max(sigmoid($0),silu($1))))",
                           "max($0,-inf:f32[]);add(#0,#0)", "add($0,nan:f32[1,1])", "neg(cast<i32>($0))"}) {
    INFO(text);
    CHECK(print_fused_expr(parse_fused_expr(text)) == text);
  }
  // Spaces, a trailing reference and single-use statements are made canonical.
  CHECK(print_fused_expr(parse_fused_expr(" exp( $0 ) ; add( #0 , 2:f32[] )")) == "add(exp($0),2:f32[])");
  CHECK(print_fused_expr(parse_fused_expr("exp($0);mul(#0,#0);#1")) == "exp($0);mul(#0,#0)");
  const FusedExpr e = parse_fused_expr("exp($0);mul(#0,add(#0,$1))");
  CHECK(e.num_ops() == 3);
  CHECK(e.nodes.back().op == OpKind::Mul);
}

TEST_CASE("fusion: malformed expressions are errors naming fused_elementwise and the problem", "[fusion]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"frobnicate($0)", "unknown op 'frobnicate'"},
      {"softmax($0)", "'softmax' is not an elementwise op"},
      {"add($0)", "'add' takes 2 argument(s), given 1"},
      {"exp($0", "expected ')'"},
      {"exp(#1)", "#1 names no earlier statement"},
      {"add($0,2:f32[4])", "a literal's dims must all be 1"},
      {"add($0,2)", "expected ':'"},
      {"cast<f64>($0)", "unknown dtype 'f64'"},
      {"add($0,1x:f32[])", "'1x' is not a number"},
      {"$0", "the expression has no op"},
      {"exp($0) junk", "expected ';'"},
  };
  for (const auto& [text_, why] : bad) {
    const std::string text = text_;  // a structured binding cannot be captured in C++17
    INFO(text);
    const std::string m = error_of([&] { parse_fused_expr(text); });
    CHECK(contains(m, "fused_elementwise"));
    CHECK(contains(m, why));
    CHECK(contains(m, "at column"));
  }
  // Through a graph's text form: the line of the op is named too.
  const std::string m = error_of([] {
    parse_graph("%x = input f32[4]\n%y = fused_elementwise(%x) expr=\"exp($0\"\noutput %y\n", "bad.tsl");
  });
  CHECK(contains(m, "bad.tsl"));
  CHECK(contains(m, "expected ')'"));
  // Typing: the ops' own shape functions, with the node named.
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  Tensor i = input(g, "i", DType::i32, {8});
  Tensor y = input(g, "y", DType::f32, {3});
  CHECK(contains(error_of([&] { fused_elementwise({x}, "add($0,$1)"); }), "$1 names no operand (the op has 1)"));
  CHECK(contains(error_of([&] { fused_elementwise({i}, "exp($0)"); }), "needs a floating-point operand"));
  CHECK(contains(error_of([&] { fused_elementwise({x, y}, "add($0,$1)"); }), "do not broadcast"));
  CHECK(contains(error_of([&] { fused_elementwise({x, y}, "exp($0)"); }), "operand $1 is not read"));
  CHECK(contains(error_of([&] { fused_elementwise({i}, "add($0,1.5:i32[])"); }), "is not an i32 value"));
}

TEST_CASE("fusion: the verifier checks a fused kernel's type against its expression", "[fusion]") {
  const std::string ok =
      "mesh {}\n"
      "%x = input f32[4,8] global=f32[4,8] sharding=[{}, {}]\n"
      "%b = input f32[8] global=f32[8] sharding=[{}]\n"
      "%y = fused_elementwise(%x, %b) expr=\"gelu(add($0,$1))\" : f32[4,8] global=f32[4,8] sharding=[{}, {}] @compute\n"
      "output %y\n";
  CHECK(print_program(parse_program(ok)) == ok);
  std::string wrong = ok;
  wrong.replace(wrong.find("gelu(add($0,$1))"), 16, "cast<bf16>(add($0,$1))");
  const std::string m = error_of([&] { parse_program(wrong, "wrong.pir"); });
  CHECK(contains(m, "fused_elementwise"));
  CHECK(contains(m, "bf16"));
}

TEST_CASE("fusion: the pass fuses chains whose intermediates nothing else reads", "[fusion]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {16, 32});
  Tensor w = input(g, "w", DType::f32, {32, 32});
  Tensor b = input(g, "b", DType::f32, {32});
  // bias + GELU + scale after a matmul: one fused kernel.
  Tensor h = einsum("ij,jk->ik", x, w);
  Tensor u = mul(gelu(add(h, b)), 0.5).named("u");
  // A layer-norm-like statistic: [16,1] stays a kernel of its own (no recompute per element).
  Tensor m = reduce_mean(u, {1}, true);
  Tensor r = rsqrt(add(m, 1e-5)).named("r");
  Tensor c = mul(sub(u, m), r).named("c");
  // %t has two readers: it ends its own group.
  Tensor t = exp(c).named("t");
  Tensor o1 = add(t, x).named("o1");
  Tensor o2 = tanh(neg(t)).named("o2");
  g.mark_output(o1);
  g.mark_output(o2);
  g.mark_output(u);  // an output: never fused away
  const Mesh mesh({{"d", 1}});
  const std::string on = lowered_text(g, mesh, true);
  const std::string off = lowered_text(g, mesh, false);
  INFO(on);
  CHECK(count(off, "fused_elementwise") == 0);
  CHECK(contains(on, "%u = fused_elementwise(%"));
  CHECK(contains(on, "expr=\"mul(gelu(add($0,$1)),0.5:f32[])\""));
  CHECK(contains(on, "%r = fused_elementwise(%"));  // add + rsqrt on [16,1], the constant inlined
  CHECK(contains(on, "= rsqrt(") == false);
  // sub + mul + exp over [16,32] reading the statistics; %t has two readers, so it ends here.
  CHECK(contains(on, "%t = fused_elementwise(%u, %v5, %r) expr=\"exp(mul(sub($0,$1),$2))\""));
  CHECK(contains(on, "%o2 = fused_elementwise(%t) expr=\"tanh(neg($0))\""));
  CHECK(contains(on, "%o1 = add(%t, %x)"));
  // Fewer instructions, a smaller arena, the same results bit for bit.
  CHECK(count(on, "\n") < count(off, "\n"));
  require_same_bits(run_with(g, mesh, true, 3), run_with(g, mesh, false, 3));

  // Pure and idempotent; the text round-trips.
  Program p = parse_program(on);
  CHECK(print_program(fuse_elementwise_pass(p, /*einsum_epilogues=*/false)) == on);
  CHECK(print_program(parse_program(print_program(p))) == on);
}

TEST_CASE("fusion: a fused op inside a chain is inlined and other streams are left alone", "[fusion]") {
  const std::string text =
      "mesh {}\n"
      "%x = input f32[8] global=f32[8] sharding=[{}]\n"
      "%a = fused_elementwise(%x) expr=\"exp($0);mul(#0,#0)\" : f32[8] global=f32[8] sharding=[{}] @compute\n"
      "%b = neg(%a) : f32[8] global=f32[8] sharding=[{}] @compute\n"
      "%c = relu(%b) : f32[8] global=f32[8] sharding=[{}] @side\n"
      "%d = sqrt(%c) : f32[8] global=f32[8] sharding=[{}] @side\n"
      "output %d\n";
  // Unverified (a second compute stream needs waits the test does not care about).
  ProgramParseOptions no_verify;
  no_verify.verify = false;
  Program p = parse_program(text, "streams.pir", no_verify);
  const std::string out = print_program(fuse_elementwise_pass(p));
  INFO(out);
  CHECK(contains(out, "%b = fused_elementwise(%x) expr=\"exp($0);neg(mul(#0,#0))\""));
  CHECK(contains(out, "%d = fused_elementwise(%b) expr=\"sqrt(relu($0))\""));
}

TEST_CASE("fusion: the fused kernel gives the unfused chain's bits", "[fusion]") {
  const Mesh one({{"d", 1}});
  SECTION("f32 with broadcasting, a shared node, where and comparisons, odd sizes") {
    for (int64_t n : {1, 7, 512, 1000, 4099}) {
      Graph g;
      Tensor x = input(g, "x", DType::f32, {3, n});
      Tensor b = input(g, "b", DType::f32, {n});
      Tensor s = input(g, "s", DType::f32, {3, 1});
      Tensor e = exp(add(x, b));
      Tensor y = where(gt(e, s), mul(e, s), sub(silu(x), tanh(e)));
      Tensor z = add(div(sigmoid(y), add(sqrt(exp(y)), 1.0)), log(add(exp(x), 2.0)));
      Tensor q = maximum(gelu(z), relu(neg(b)));
      g.mark_output(q);
      const std::string on = lowered_text(g, one, true);
      INFO(on);
      // Two kernels: relu(neg(b)) is [n], read by every row of the [3,n] chain.
      CHECK(count(on, "fused_elementwise") == 2);
      require_same_bits(run_with(g, one, true, 11), run_with(g, one, false, 11));
    }
  }
  SECTION("gelu_grad (vectorised in chunks) at odd sizes, with a broadcast gradient") {
    for (int64_t n : {1, 7, 300, 1000, 4099}) {
      Graph g;
      Tensor x = input(g, "x", DType::f32, {3, n});
      Tensor d = input(g, "d", DType::f32, {n});
      g.mark_output(add(gelu_grad(mul(x, 3.0), d), x));
      CHECK(count(lowered_text(g, one, true), "fused_elementwise") == 1);
      require_same_bits(run_with(g, one, true, 13), run_with(g, one, false, 13));
    }
  }
  SECTION("bf16 and f16 intermediates are rounded as stored") {
    for (DType t : {DType::bf16, DType::f16}) {
      Graph g;
      Tensor x = input(g, "x", DType::f32, {5, 33});
      Tensor h = cast(mul(x, 3.0), t);
      Tensor y = cast(add(exp(h), gelu(h)), DType::f32);
      g.mark_output(add(y, x));
      CHECK(count(lowered_text(g, one, true), "fused_elementwise") == 1);
      require_same_bits(run_with(g, one, true, 5), run_with(g, one, false, 5));
    }
  }
  SECTION("i32 arithmetic wraps; casts saturate") {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {64});
    Tensor i = cast(mul(x, 1e9), DType::i32);
    Tensor j = add(mul(i, i), neg(i));
    Tensor k = where(lt(j, i), div(j, add(i, constant(g, 0.0, DType::i32))), relu(j));
    g.mark_output(cast(k, DType::f32));
    CHECK(count(lowered_text(g, one, true), "fused_elementwise") == 1);
    require_same_bits(run_with(g, one, true, 9), run_with(g, one, false, 9));
  }
  SECTION("partitioned: the fused kernel runs on every device's block") {
    const Mesh mesh({{"a", 2}, {"b", 2}});
    Graph g;
    Tensor x = input(g, "x", DType::f32, {8, 12});
    Tensor b = input(g, "b", DType::f32, {12});
    g.annotate(x, Sharding::parse("[{a}, {b}]"));
    Tensor y = mul(gelu(add(x, b)), 2.0);
    g.mark_output(add(y, exp(x)));
    CHECK(count(lowered_text(g, mesh, true), "fused_elementwise") == 1);
    require_same_bits(run_with(g, mesh, true, 4), run_with(g, mesh, false, 4));
  }
}

TEST_CASE("fusion: scale and causal mask and softmax become one fused_softmax kernel", "[fusion]") {
  SECTION("the gpt attention's scores, one device and the query dim split over devices") {
    for (const char* mesh_text : {"d=1", "a=2,b=2"}) {
      const Mesh mesh = Mesh::parse(mesh_text);
      Graph g;
      Tensor q = input(g, "q", DType::f32, {2, 12, 4, 8});  // [b, s, h, k]
      Tensor k = input(g, "k", DType::f32, {2, 12, 4, 8});
      if (mesh.num_devices() > 1) {
        g.annotate(q, Sharding::parse("[{}, {a}, {b}, {}]"));
        g.annotate(k, Sharding::parse("[{}, {}, {b}, {}]"));
      }
      Tensor s = mul(einsum("bqhk,bshk->bhqs", q, k), 0.35);
      g.mark_output(softmax(causal_mask(s), -1));
      const std::string on = lowered_text(g, mesh, true);
      INFO(on);
      CHECK(contains(on, "fused_softmax(%"));
      CHECK(contains(on, "expr=\"causal_mask(mul($0,0.35:f32[]))\" axis=3"));
      CHECK_FALSE(contains(on, "= causal_mask("));
      CHECK_FALSE(contains(on, "= softmax("));
      require_close(run_with(g, mesh, true, 21), run_with(g, mesh, false, 21));
    }
  }
  SECTION("bf16, a broadcast bias, and an axis that is not the last") {
    for (int64_t axis : {2, 1}) {
      Graph g;
      Tensor x = input(g, "x", DType::f32, {3, 40, 33});
      Tensor b = input(g, "b", DType::f32, {40, 33});
      Tensor h = cast(add(x, b), DType::bf16);
      g.mark_output(cast(softmax(mul(h, constant(g, 0.5, DType::bf16)), axis), DType::f32));
      const Mesh one({{"d", 1}});
      const std::string on = lowered_text(g, one, true);
      INFO(on);
      CHECK(contains(on, "fused_softmax("));
      require_same_bits(run_with(g, one, true, 8), run_with(g, one, false, 8));
    }
  }
  SECTION("a causal mask outside a fused_softmax is refused") {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {4, 4});
    CHECK(contains(error_of([&] { fused_elementwise({x}, "causal_mask(exp($0))"); }),
                   "only a fused_softmax's expression may hold it"));
    Tensor v = input(g, "v", DType::f32, {1, 4});
    CHECK(contains(error_of([&] { fused_softmax({x, v}, "add($0,causal_mask($1))", -1); }),
                   "must have the result's shape"));
  }
}

TEST_CASE("fusion: the fused kernel's per-thread workspace carries nothing from one call to the next", "[fusion]") {
  // The walkers, scratch blocks and bookkeeping are kept per thread and expression (made once);
  // calls with other buffers of the same types (a broadcast bias, so the walk is not trivial)
  // must give the unfused chain's bits every time, also after an error and after another
  // expression used the cache.
  const uint64_t seed = 77;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  OpAttrs fused, none, other;
  fused.equation = "gelu(add($0,$1))";
  other.equation = "exp(neg($0))";
  for (int call = 0; call < 8; ++call) {
    // One block (a stale "block already read" mark would skip reading the new operands) and three.
    const Shape s = call % 2 ? Shape{3, 100} : Shape{7, 300}, sb{s[1]};
    HostTensor x(DType::f32, s), b(DType::f32, sb), y(DType::f32, s), t(DType::f32, s), want(DType::f32, s);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, nd(rng));
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, nd(rng));
    KernelArgs a;
    a.kind = OpKind::FusedElementwise;
    a.attrs = &fused;
    a.in = {x.data(), b.data()};
    a.in_shapes = {s, sb};
    a.in_dtypes = {DType::f32, DType::f32};
    a.out = y.data();
    a.out_shape = s;
    a.out_dtype = DType::f32;
    run_cpu_kernel(a);
    KernelArgs add_args = a, gelu_args;
    add_args.kind = OpKind::Add;
    add_args.attrs = &none;
    add_args.out = t.data();
    run_cpu_kernel(add_args);
    gelu_args = add_args;
    gelu_args.kind = OpKind::Gelu;
    gelu_args.in = {t.data()};
    gelu_args.in_shapes = {s};
    gelu_args.in_dtypes = {DType::f32};
    gelu_args.out = want.data();
    run_cpu_kernel(gelu_args);
    INFO("call " << call);
    CHECK(std::memcmp(y.data(), want.data(), static_cast<std::size_t>(y.numel()) * sizeof(float)) == 0);
    // Between calls: a failing call (the result buffer's type is wrong) and another expression.
    KernelArgs bad = a;
    bad.out_shape = {s[0], s[1] - 1};
    CHECK(contains(error_of([&] { run_cpu_kernel(bad); }), "the result buffer is f32["));
    KernelArgs o = a;
    o.attrs = &other;
    o.in = {x.data()};
    o.in_shapes = {s};
    o.in_dtypes = {DType::f32};
    o.out = t.data();
    run_cpu_kernel(o);
  }
}
