// Graph handles cannot dangle: a Tensor follows its graph when the graph (or a struct holding
// it) moves, and fails with a clear Error — never a use-after-free — once the graph is gone or
// assigned over. Copies are explicit (clone) and independent. Run under ASan by CI
// (scripts/test-sanitizers address).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tessel/ops/builders.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

static_assert(!std::is_copy_constructible_v<Graph>, "Graph copies are explicit: clone()");
static_assert(!std::is_copy_assignable_v<Graph>, "Graph copies are explicit: clone()");
static_assert(std::is_nothrow_move_constructible_v<Graph>, "Graph moves");

namespace {
struct Model {  // a struct holding a graph and handles into it, like GptGraph
  Graph g;
  Tensor x, y;
};
Model make_model() {
  Model m;
  m.x = input(m.g, "x", DType::f32, {4, 8});
  m.y = gelu(m.x);
  return m;  // moved (or elided)
}
}  // namespace

TEST_CASE("graph handles: a moved graph takes its handles along", "[graph][handles]") {
  Graph a;
  Tensor x = input(a, "x", DType::f32, {2, 3});
  Tensor y = exp(x);
  Graph b = std::move(a);
  CHECK(x.graph() == &b);
  CHECK(y.shape() == Shape{2, 3});
  Tensor z = add(x, y);  // lands in b
  CHECK(b.ops.size() == 3);
  CHECK(z.graph() == &b);
  CHECK(a.values.empty());  // the moved-from graph is empty and usable
  Tensor w = input(a, "w", DType::f32, {1});
  CHECK(w.graph() == &a);
  CHECK_THROWS_AS(add(w, x), Error);  // different graphs

  std::vector<Model> models;
  for (int i = 0; i < 4; ++i) models.push_back(make_model());  // vector growth moves them
  for (Model& m : models) {
    CHECK(m.y.graph() == &m.g);
    m.g.mark_output(tanh(m.y));
    CHECK(m.g.outputs.size() == 1);
  }

  GptConfig cfg;
  cfg.layers = 1;
  GptGraph gpt = build_gpt(cfg);
  auto holder = std::make_unique<GptGraph>(std::move(gpt));
  CHECK(holder->loss.graph() == &holder->graph);
  CHECK(holder->tokens.shape() == holder->graph.values[holder->tokens.id].shape);
}

TEST_CASE("graph handles: a destroyed or overwritten graph is an error and not a crash", "[graph][handles]") {
  Tensor x;
  CHECK_THROWS_AS(x.shape(), Error);  // default handle
  {
    Graph g;
    x = input(g, "x", DType::f32, {2});
  }
  try {
    x.shape();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("graph was destroyed") != std::string::npos);
  }
  CHECK_THROWS_AS(neg(x), Error);
  CHECK(x.graph() == nullptr);

  Graph g1, g2;
  Tensor a = input(g1, "a", DType::f32, {2});
  Tensor b = input(g2, "b", DType::f32, {3});
  g1 = std::move(g2);  // a's graph is assigned over; b follows into g1
  CHECK_THROWS_AS(a.shape(), Error);
  CHECK(b.graph() == &g1);
  CHECK(b.shape() == Shape{3});
  CHECK_THROWS_AS(g1.tensor(7), Error);
}

TEST_CASE("graph handles: clone is a deep and independent copy", "[graph][handles]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4});
  Tensor y = relu(x);
  g.mark_output(y);
  g.annotate(x, Sharding::parse("[{m}]"));
  Graph c = g.clone();
  CHECK(print_graph(c) == print_graph(g));
  Tensor cy = c.tensor(y.id);
  CHECK(cy.graph() == &c);
  c.mark_output(neg(cy));  // lands in the clone only
  CHECK(g.ops.size() == 2);
  CHECK(c.ops.size() == 3);
  add(x, y);  // handles of the original still build in the original
  CHECK(g.ops.size() == 3);
  CHECK(c.find("x") == x.id);
}
