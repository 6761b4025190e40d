// Uneven shardings by padding (uneven.hpp): a dim that its shard count does not divide is
// padded, reductions mask the padding, outputs are sliced back, and the run matches the
// unpartitioned reference — for a GPT-2-sized vocabulary split 8 ways, and for every op kind
// with random uneven input shardings (property test, TESSEL_SEED / TESSEL_CASES).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <map>
#include <random>

#include "../unit/test_util.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

using tessel_test::check_matches;

// A sharding of `shape` on `mesh` that splits dims with no regard for divisibility (an axis
// larger than the dim is skipped: a block would be all padding).
Sharding random_uneven_sharding(std::mt19937_64& rng, const Mesh& mesh, const Shape& shape) {
  Sharding s = Sharding::replicated(static_cast<int>(shape.size()));
  for (const auto& a : mesh.axes()) {
    const int choice = static_cast<int>(rng() % (shape.size() + 1));
    if (choice < static_cast<int>(shape.size()) &&
        shape[static_cast<std::size_t>(choice)] >= mesh.axes_size(s.dims[static_cast<std::size_t>(choice)].axes) * a.size)
      s.dims[static_cast<std::size_t>(choice)].axes.push_back(a.name);
  }
  return s;
}

}  // namespace

TEST_CASE("uneven: a 50257-row vocabulary split over 8 devices matches the reference", "[integration][uneven]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("uneven: a 50257-row vocabulary split over 8 devices matches the reference", seed, 1);
  Graph g;
  Tensor table = input(g, "wte", DType::f32, {50257, 16});
  Tensor ids = input(g, "ids", DType::i32, {2, 8});
  Tensor labels = input(g, "labels", DType::i32, {2, 8});
  Tensor h = embedding(table, ids);                      // [2, 8, 16]
  Tensor logits = einsum("bsd,vd->bsv", h, table);      // tied LM head, [2, 8, 50257]
  Tensor loss = reduce_mean(cross_entropy(logits, labels), {0, 1});
  g.mark_output(h);
  g.mark_output(loss);
  g.annotate(table, Sharding::parse("[{model}, {}]"));  // 50257 rows over 8: padded to 50264
  Mesh mesh = Mesh::parse("model=8");
  Executable exe = compile(g, mesh);
  bool noted = false;
  for (const std::string& w : exe.program().warnings) noted = noted || w.find("padded to 50264") != std::string::npos;
  CHECK(noted);
  CHECK(exe.program().values[static_cast<std::size_t>(exe.program().inputs[0])].shape == Shape{6283, 16});
  check_matches(g, mesh, seed);
  // The strict option keeps the divisibility error.
  CompileOptions strict;
  strict.strict_even_shardings = true;
  CHECK_THROWS_AS(compile(g, mesh, strict), ShardingError);
}

TEST_CASE("uneven: padded reductions mask the padding", "[integration][uneven]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("uneven: padded reductions mask the padding", seed, 1);
  Graph g;
  Tensor x = input(g, "x", DType::f32, {5, 13});
  Tensor gamma = input(g, "gamma", DType::f32, {13});
  Tensor beta = input(g, "beta", DType::f32, {13});
  g.mark_output(softmax(x, 1));
  g.mark_output(layer_norm(x, gamma, beta));
  g.mark_output(reduce_max(x, {1}));
  g.mark_output(reduce_mean(x, {1}));
  g.mark_output(reduce_sum(x, {0}));
  g.annotate(x, Sharding::parse("[{a}, {b}]"));  // 5 over 2 and 13 over 4: both padded
  check_matches(g, Mesh::parse("a=2,b=4"), seed);
}

TEST_CASE("property: every op kind with uneven input shardings == reference", "[integration][property][uneven]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(600);
  tessel_test::announce("property: every op kind with uneven input shardings == reference", seed, cases);
  std::mt19937_64 rng(seed);
  std::vector<OpKind> kinds;
  for (OpKind k : all_op_kinds())
    if (op_def(k).sample && k != OpKind::Input) kinds.push_back(k);
  for (int c = 0; c < cases; ++c) {
    const OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    const uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    Mesh mesh = tessel_test::random_mesh(crng);
    SampleGen cr{crng, [&](const Shape& s) { return tessel_test::random_sharding_for(crng, mesh, s, false); }};
    Graph g;
    Tensor out = op_def(k).sample(g, cr);
    g.mark_output(out);
    for (int v : g.inputs)
      if (cr.coin(0.8)) g.annotate(v, random_uneven_sharding(crng, mesh, g.values[static_cast<std::size_t>(v)].shape));
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << " mesh "
                 << mesh.to_string() << "\n" << print_graph(g));
    check_matches(g, mesh, case_seed);
  }
}
