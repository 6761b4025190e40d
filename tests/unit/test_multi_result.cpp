// Ops with several results (layer_norm_grad: dx, dgamma, dbeta): the kernel against finite
// differences of layer_norm, the graph API, both text forms and their errors, and a
// partitioned run whose results differ in layout (dx split, dgamma partial) against the
// reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

// sum(dy * layer_norm(x, gamma, beta)) in double, x [rows, D].
double ln_loss(const std::vector<double>& x, const std::vector<double>& gamma, const std::vector<double>& beta,
               const std::vector<double>& dy, int64_t rows, int64_t D, double eps) {
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < D; ++j) mean += x[static_cast<std::size_t>(r * D + j)];
    mean /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) var += std::pow(x[static_cast<std::size_t>(r * D + j)] - mean, 2);
    var /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) {
      const std::size_t i = static_cast<std::size_t>(r * D + j), u = static_cast<std::size_t>(j);
      loss += dy[i] * ((x[i] - mean) / std::sqrt(var + eps) * gamma[u] + beta[u]);
    }
  }
  return loss;
}

}  // namespace

TEST_CASE("multi-result: layer_norm_grad equals finite differences of layer_norm", "[multi-result]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(8);
  tessel_test::announce("multi-result: layer_norm_grad equals finite differences of layer_norm", seed, cases);
  std::mt19937_64 rng(seed);
  for (int c = 0; c < cases; ++c) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 6), D = 2 + static_cast<int64_t>(rng() % 9);
    const double eps = 1e-5;
    Graph g;
    Tensor x = input(g, "x", DType::f32, {rows, D});
    Tensor gamma = input(g, "gamma", DType::f32, {D});
    Tensor dy = input(g, "dy", DType::f32, {rows, D});
    LayerNormGrads d = layer_norm_grad(x, gamma, dy, eps);
    g.mark_output(d.dx);
    g.mark_output(d.dgamma);
    g.mark_output(d.dbeta);
    const uint64_t case_seed = rng();
    auto in = random_inputs(g, case_seed);
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") rows " << rows << " D " << D);
    auto got = run_reference(g, in);
    std::vector<double> xs, gs, bs(static_cast<std::size_t>(D), 0.0), dys;
    for (int64_t i = 0; i < rows * D; ++i) xs.push_back(in[0].get(i));
    for (int64_t i = 0; i < D; ++i) gs.push_back(in[1].get(i));
    for (int64_t i = 0; i < rows * D; ++i) dys.push_back(in[2].get(i));
    auto central = [&](std::vector<double>& v, std::size_t i) {
      const double h = 1e-5, keep = v[i];
      v[i] = keep + h;
      const double up = ln_loss(xs, gs, bs, dys, rows, D, eps);
      v[i] = keep - h;
      const double down = ln_loss(xs, gs, bs, dys, rows, D, eps);
      v[i] = keep;
      return (up - down) / (2 * h);
    };
    // Tolerance: f32 results of O(1) sums; a finite difference in double is good to ~1e-8.
    for (std::size_t i = 0; i < xs.size(); ++i) CHECK(got[0].get(static_cast<int64_t>(i)) == Approx(central(xs, i)).margin(2e-4));
    for (std::size_t j = 0; j < gs.size(); ++j) CHECK(got[1].get(static_cast<int64_t>(j)) == Approx(central(gs, j)).margin(2e-4));
    for (std::size_t j = 0; j < bs.size(); ++j) CHECK(got[2].get(static_cast<int64_t>(j)) == Approx(central(bs, j)).margin(2e-4));
  }
}

TEST_CASE("multi-result: the graph API hands out one handle per result", "[multi-result]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  Tensor gamma = input(g, "gamma", DType::f32, {8});
  Tensor dy = input(g, "dy", DType::f32, {4, 8});
  LayerNormGrads d = layer_norm_grad(x, gamma, dy);
  CHECK(d.dx.shape() == Shape{4, 8});
  CHECK(d.dgamma.shape() == Shape{8});
  CHECK(d.dbeta.shape() == Shape{8});
  const Op op = g.ops.back();  // a copy: more ops are added below
  CHECK(op.num_results() == 3);
  CHECK(op.results() == std::vector<int>{d.dx.id, d.dgamma.id, d.dbeta.id});
  CHECK(g.values[static_cast<std::size_t>(d.dbeta.id)].result == 2);
  CHECK_THAT(g.describe(d.dgamma.id), Catch::Contains("result 1 of op #3 layer_norm_grad"));
  // add_op is for single-result kinds: the error names the op and what to call instead.
  try {
    g.add_op(OpKind::LayerNormGrad, {x.id, gamma.id, dy.id}, {});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("layer_norm_grad has 3 results") && Catch::Contains("add_op_results"));
  }
  CHECK_THROWS_WITH(g.add_op_results(OpKind::LayerNormGrad, {x.id, gamma.id, dy.id}, {}, {"a", "b"}),
                    Catch::Contains("2 names given for its 3 results"));
  CHECK_THROWS_WITH(g.add_op_results(OpKind::LayerNormGrad, {x.id, gamma.id, dy.id}, {}, {"a", "b", "a"}),
                    Catch::Contains("'%a' is given to two of its results"));
  CHECK_THROWS_WITH(g.add_op_results(OpKind::LayerNormGrad, {x.id, gamma.id, dy.id}, {}, {"a", "b", "x"}),
                    Catch::Contains("'%x' is already used"));
  // Shape errors name the op and operands.
  Tensor bad = input(g, "bad", DType::f32, {4, 7});
  CHECK_THROWS_WITH(layer_norm_grad(x, gamma, bad), Catch::Contains("layer_norm_grad(") && Catch::Contains("dy"));
  CHECK_THROWS_WITH(layer_norm_grad(x, bad, dy), Catch::Contains("gamma must have shape [8]"));
  // A clone keeps every result.
  Graph c = g.clone();
  CHECK(c.ops[3].extra_outputs == op.extra_outputs);
  // add_op_results works for single-result kinds too.
  auto one = g.add_op_results(OpKind::Relu, {x.id}, {}, {"r"});
  REQUIRE(one.size() == 1);
  CHECK(one[0].name() == "r");
}

TEST_CASE("multi-result: graph text form round-trips and names the results' errors", "[multi-result][text]") {
  const std::string text =
      "mesh data=2\n"
      "%x = input f32[4,8] sharding=[{data}, {}]\n"
      "%gamma = input f32[8]\n"
      "%dy = input f32[4,8]\n"
      "%dx, %dg, %db = layer_norm_grad(%x, %gamma, %dy) eps=0.001 sharding=(_, [{}], [{}]) priority=(0, 1, 2) : f32[4,8], f32[8], f32[8]\n"
      "output %dx, %dg, %db\n";
  Graph g = parse_graph(text);
  CHECK(print_graph(g) == text);
  CHECK(g.annotations.at(g.find("dg")).priority == 1);
  CHECK(g.annotations.count(g.find("dx")) == 0);
  const std::string base = "%x = input f32[4,8]\n%gamma = input f32[8]\n%dy = input f32[4,8]\n";
  auto fails = [&](const std::string& line, const std::string& what) {
    INFO(line);
    CHECK_THROWS_WITH(parse_graph(base + line), Catch::Contains(what));
  };
  fails("%a, %b = layer_norm_grad(%x, %gamma, %dy)\n", "layer_norm_grad has 3 results; name each");
  fails("%a, %b = add(%x, %dy)\n", "add has one result");
  fails("%a, %a, %b = layer_norm_grad(%x, %gamma, %dy)\n", "%a is named twice");
  fails("%a, %x, %b = layer_norm_grad(%x, %gamma, %dy)\n", "duplicate definition of %x");
  fails("%a, %b, %c = layer_norm_grad(%x, %gamma, %dy) : f32[4,8], f32[8], f32[9]\n",
        "type mismatch for %c: the text says f32[9]");
  fails("%a, %b, %c = layer_norm_grad(%x, %gamma, %dy) : f32[4,8], f32[8]\n", "between the types of the 3 results");
  fails("%a, %b, %c = layer_norm_grad(%x, %gamma, %dy) sharding=([{}, {}], [{}])\n", "expected ','");
  fails("%a, %b, %c = layer_norm_grad(%x, %gamma, %dy) sharding=([{}], _, _)\n", "sharding [{}] has 1 dims but %a has rank 2");
}

TEST_CASE("multi-result: partitioned layer_norm_grad == reference with results in different layouts", "[multi-result]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(12);
  tessel_test::announce("multi-result: partitioned layer_norm_grad == reference with results in different layouts", seed, cases);
  std::mt19937_64 rng(seed);
  const char* layouts[] = {"[{data}, {}]", "[{data, model}, {}]", "[{model}, {}]", "[{}, {}]", "[{}, {model}]"};
  for (int c = 0; c < cases; ++c) {
    const Mesh mesh = Mesh::parse("data=2,model=2");
    Graph g;
    Tensor x = input(g, "x", DType::f32, {8, 12});
    Tensor gamma = input(g, "gamma", DType::f32, {12});
    Tensor dy = input(g, "dy", DType::f32, {8, 12});
    LayerNormGrads d = layer_norm_grad(x, gamma, dy);
    // Only some results are outputs: an unread result is computed and dropped.
    const int mask = 1 + static_cast<int>(rng() % 7);
    if (mask & 1) g.mark_output(d.dx);
    if (mask & 2) g.mark_output(d.dgamma);
    if (mask & 4) g.mark_output(d.dbeta);
    const char* lx = layouts[rng() % 5];
    const char* ldy = layouts[rng() % 5];
    g.annotate(x, Sharding::parse(lx));
    g.annotate(dy, Sharding::parse(ldy));
    const uint64_t case_seed = rng();
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") x " << lx << " dy " << ldy << " outputs mask " << mask);
    // The lowered program prints and parses back (Program text with a 3-result kernel).
    const Program low = lower_program(compile(g, mesh).program(), true);
    CHECK(print_program(parse_program(print_program(low))) == print_program(low));
    tessel_test::check_matches(g, mesh, case_seed);
  }
}

TEST_CASE("multi-result: the Program text form names each result and checks them", "[multi-result][program-ir]") {
  const std::string head =
      "mesh data=2\n"
      "%x = input f32[2,8] global=f32[4,8] sharding=[{data}, {}]\n"
      "%g = input f32[8] global=f32[8] sharding=[{}]\n"
      "%dy = input f32[2,8] global=f32[4,8] sharding=[{data}, {}]\n";
  const std::string ok =
      "%dx, %dg, %db = layer_norm_grad(%x, %g, %dy) eps=1e-05 : f32[2,8] global=f32[4,8] sharding=[{data}, {}] "
      "@compute, : f32[8] global=f32[8] sharding=[{}] partial{data}, : f32[8] global=f32[8] sharding=[{}] partial{data}\n";
  const std::string tail =
      "%dgr = all_reduce(%dg) axes={data} bytes=32 : f32[8] global=f32[8] sharding=[{}] @compute\n"
      "output %dx, %dgr\n";
  Program p = parse_program(head + ok + tail);
  CHECK(print_program(p) == head + ok + tail);
  REQUIRE(p.instrs[0].extra_out.size() == 2);
  auto fails = [&](const std::string& line, const std::string& what) {
    INFO(line);
    CHECK_THROWS_WITH(parse_program(head + line + tail), Catch::Contains(what));
  };
  fails("%dx, %dg = layer_norm_grad(%x, %g, %dy) : f32[2,8] global=f32[4,8] sharding=[{data}, {}] @compute\n",
        "layer_norm_grad has 3 results");
  fails("%dx, %dg, %db = layer_norm_grad(%x, %g, %dy) : f32[2,8] global=f32[4,8] sharding=[{data}, {}] @compute\n",
        "needs the attributes of each of its 3 results");
  fails("%dx, %dg, %db = layer_norm_grad(%x, %g, %dy) : f32[2,8] global=f32[4,8] sharding=[{data}, {}] @compute, "
        ": f32[8] global=f32[8] sharding=[{}] partial{data}, : f32[8] global=f32[8] sharding=[{}] @comm\n",
        "only global=, sharding= and at= follow the type of %db");
  // The verifier checks every result against the registry (dgamma given the wrong type).
  fails("%dx, %dg, %db = layer_norm_grad(%x, %g, %dy) : f32[2,8] global=f32[4,8] sharding=[{data}, {}] @compute, "
        ": f32[4] global=f32[4] sharding=[{}], : f32[8] global=f32[8] sharding=[{}]\n",
        "the registry infers f32[8] from the local operands, but %dg is f32[4]");
  fails("%dx, %dg = add(%x, %dy) : f32[2,8] global=f32[4,8] sharding=[{data}, {}] @compute\n",
        "add defines one value, not 2");
}

TEST_CASE("multi-result: layer_norm_grad with eps=0 over rows padded for an uneven split", "[multi-result][uneven]") {
  // Found by fuzz_graph_text: 32 rows over data=3 are padded to 33 with a zero row, whose
  // statistics with eps = 0 are 0/0; its zero gradient must not turn dgamma into NaN.
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("multi-result: layer_norm_grad with eps=0 over rows padded for an uneven split", seed, 1);
  Graph g = parse_graph(
      "mesh data=3\n"
      "%x = input f32[32,64] sharding=[{data}, {}]\n"
      "%gamma = input f32[64]\n"
      "%dy = input f32[32,64] sharding=[{data}, {}]\n"
      "%dx, %dgamma, %dbeta = layer_norm_grad(%x, %gamma, %dy) eps=0 sharding=(_, [{}], [{}])\n"
      "output %dx, %dgamma, %dbeta\n");
  tessel_test::check_matches(g, *g.mesh, seed);
}
