// The one factor-choice policy (compiler/factor_choice.hpp) that propagation, the partitioner and
// automatic sharding share, and the documented differences between its three users.
#include <catch2/catch.hpp>

#include <algorithm>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/compiler/factor_choice.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/ops/builders.hpp"

using namespace tessel;

namespace {

// One factor of size 16 shared by two operands and the result (an elementwise add's rule).
OpRule one_factor_rule() {
  OpRule r;
  r.factors = {Factor{"d0", 16, FactorKind::Pass}};
  r.operands = {{{0}}, {{0}}};
  r.result = {{0}};
  return r;
}

FactorWish wish(int value, int priority, double bytes, std::vector<std::vector<std::string>> axes,
                FactorWish::Reach reach = FactorWish::Reach::Extend) {
  FactorWish w;
  w.value = value;
  w.priority = priority;
  w.bytes = bytes;
  w.axes = std::move(axes);
  w.reach = reach;
  return w;
}

}  // namespace

TEST_CASE("factor choice: the order of the wishes does not change the choice", "[factor_choice]") {
  const OpRule rule = one_factor_rule();
  // The strongest wants {x}; a weaker one {y} conflicts with it; the weakest {x, z} extends it.
  // Taken in the order C, B, A the old propagation kept {y} from B after C's extension (B beat
  // C, then A beat B): the choice depended on the order of the op's operands.
  std::vector<FactorWish> ws = {wish(0, 0, 64, {{"x"}}), wish(1, 1, 64, {{"y"}}), wish(2, 2, 64, {{"x", "z"}})};
  std::sort(ws.begin(), ws.end(), [](const FactorWish& a, const FactorWish& b) { return a.value < b.value; });
  int orders = 0;
  do {
    std::vector<FactorConflict> conflicts;
    const FactorChoice c = choose_factor_axes(rule, ws, [&](const FactorConflict& k) { conflicts.push_back(k); });
    CHECK(c.axes[0] == std::vector<std::string>{"x", "z"});
    REQUIRE(c.source[0] >= 0);
    CHECK(ws[static_cast<std::size_t>(c.source[0])].value == 2);  // the last to extend it
    CHECK(ws[static_cast<std::size_t>(c.rank[0])].value == 0);    // the strongest behind it
    REQUIRE(conflicts.size() == 1);
    CHECK(ws[static_cast<std::size_t>(conflicts[0].loser)].value == 1);
    ++orders;
  } while (std::next_permutation(ws.begin(), ws.end(),
                                 [](const FactorWish& a, const FactorWish& b) { return a.value < b.value; }));
  CHECK(orders == 6);
}

TEST_CASE("factor choice: priority then bytes then value id rank the wishes", "[factor_choice]") {
  const OpRule rule = one_factor_rule();
  CHECK(choose_factor_axes(rule, {wish(0, 1, 1024, {{"x"}}), wish(1, 0, 8, {{"y"}})}).axes[0] ==
        std::vector<std::string>{"y"});  // stronger priority, whatever the size
  CHECK(choose_factor_axes(rule, {wish(0, 0, 8, {{"x"}}), wish(1, 0, 1024, {{"y"}})}).axes[0] ==
        std::vector<std::string>{"y"});  // equal priority: the larger tensor stays put
  CHECK(choose_factor_axes(rule, {wish(5, 0, 8, {{"x"}}), wish(3, 0, 8, {{"y"}})}).axes[0] ==
        std::vector<std::string>{"y"});  // all equal: the lower value id
}

TEST_CASE("factor choice: the partitioner's candidates take Exact and FillEmpty wishes", "[factor_choice]") {
  const OpRule rule = one_factor_rule();
  // Result first: the result's {x} is exact, the operand may not extend it to {x, y}.
  const FactorWish result_exact = wish(9, 3, 8, {{"x"}}, FactorWish::Reach::Exact);
  CHECK(choose_factor_axes(rule, {wish(0, 0, 1024, {{"x", "y"}}), result_exact}).axes[0] ==
        std::vector<std::string>{"x"});
  // Operands first: the result only fills a factor the operands left free.
  const FactorWish result_fill = wish(9, 0, 1 << 20, {{"y"}}, FactorWish::Reach::FillEmpty);
  CHECK(choose_factor_axes(rule, {wish(0, 3, 8, {{"x"}}), result_fill}).axes[0] == std::vector<std::string>{"x"});
  CHECK(choose_factor_axes(rule, {wish(0, 3, 8, {{}}), result_fill}).axes[0] == std::vector<std::string>{"y"});
}

TEST_CASE("factor choice: an axis wanted by two factors goes to the stronger wish's factor", "[factor_choice]") {
  Graph g;
  auto a = input(g, "a", DType::f32, {8, 16});
  auto b = input(g, "b", DType::f32, {16, 32});
  auto c = einsum("ij,jk->ik", a, b);
  g.mark_output(c);
  const Op& op = g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(c.id)].producer)];
  const OpRule rule = op_rule(g, op);
  REQUIRE(rule.factors.size() == 3);  // i, k, j (the einsum's letters)
  auto factor = [&](const std::string& n) {
    for (std::size_t f = 0; f < rule.factors.size(); ++f)
      if (rule.factors[f].name == n) return f;
    FAIL("no factor " << n);
    return std::size_t{0};
  };
  // a wants i over x (priority 0), b wants k over x (priority 1): i keeps x.
  FactorAxes wa(3), wb(3);
  wa[factor("i")] = {"x"};
  wb[factor("k")] = {"x"};
  std::vector<FactorConflict> conflicts;
  const FactorChoice ch = choose_factor_axes(rule, {wish(a.id, 0, 512, wa), wish(b.id, 1, 2048, wb)},
                                             [&](const FactorConflict& k) { conflicts.push_back(k); }, &op);
  CHECK(ch.axes[factor("i")] == std::vector<std::string>{"x"});
  CHECK(ch.axes[factor("k")].empty());
  REQUIRE(conflicts.size() == 1);
  CHECK(conflicts[0].axis == "x");
  CHECK(conflicts[0].holder == static_cast<int>(factor("i")));
  CHECK(conflicts[0].factor == static_cast<int>(factor("k")));
}

TEST_CASE("factor choice: each axis counts with the wish that added it", "[factor_choice]") {
  OpRule rule;  // two independent factors
  rule.factors = {Factor{"i", 8, FactorKind::Pass}, Factor{"k", 8, FactorKind::Pass}};
  rule.operands = {{{0}, {1}}};
  rule.result = {{0}, {1}};
  // i: {x} from the strongest wish A, extended to {x, y} by the weakest C; k: {y} from B.
  // y was added to i by C, weaker than B: k keeps y and i keeps x.
  const FactorWish a = wish(0, 0, 64, {{"x"}, {}}), b = wish(1, 1, 64, {{}, {"y"}}), c = wish(2, 2, 64, {{"x", "y"}, {}});
  FactorChoice ch = choose_factor_axes(rule, {c, b, a});
  CHECK(ch.axes == FactorAxes{{"x"}, {"y"}});
  // k wanting x from B: x was added to i by A, stronger than B: i keeps {x, y}, k gets nothing.
  const FactorWish b2 = wish(1, 1, 64, {{}, {"x"}});
  std::vector<FactorConflict> conflicts;
  ch = choose_factor_axes(rule, {c, b2, a}, [&](const FactorConflict& k) { conflicts.push_back(k); });
  CHECK(ch.axes == FactorAxes{{"x", "y"}, {}});
  REQUIRE(conflicts.size() == 1);
  CHECK(conflicts[0].axis == "x");
  CHECK(conflicts[0].holder == 0);
  CHECK(conflicts[0].winner == 2);  // a, the third wish given
  CHECK(conflicts[0].loser == 1);
}

TEST_CASE("factor choice: factor_axes_problem names what an op cannot compute", "[factor_choice]") {
  const Mesh mesh = Mesh::parse("x=2,y=4");
  Graph g;
  auto a = input(g, "a", DType::f32, {6, 16});
  auto s = softmax(a, 1);
  auto d = layer_norm_grad(a, input(g, "gamma", DType::f32, {16}), a, 1e-5);
  g.mark_output(s);
  g.mark_output(d.dx);
  const Op& sm = g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(s.id)].producer)];
  const Op& lg = g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(d.dx.id)].producer)];
  const OpRule rs = op_rule(g, sm), rl = op_rule(g, lg);
  // softmax: rows (6) and the class axis (16, Combined: it has a distributed form).
  CHECK(factor_axes_problem(mesh, sm, rs, {{"x"}, {"y"}}).empty());
  CHECK(factor_axes_valid(mesh, sm, rs, {{}, {"x", "y"}}));
  CHECK(factor_axes_problem(mesh, sm, rs, {{"y"}, {}}).find("does not divide") != std::string::npos);
  CHECK(factor_axes_problem(mesh, sm, rs, {{"x"}, {"x"}}).find("used twice") != std::string::npos);
  CHECK(factor_axes_problem(mesh, sm, rs, {{"z"}, {}}).find("no axis 'z'") != std::string::npos);
  CHECK(factor_axes_problem(mesh, sm, rs, {{}}).find("entries") != std::string::npos);
  // layer_norm_grad: its feature factor is Replicated (dx needs the row's statistics).
  CHECK(!factor_may_split(lg, rl, 1));
  CHECK(factor_axes_problem(mesh, lg, rl, {{}, {"x"}}).find("may not be split") != std::string::npos);
}

TEST_CASE("factor choice: make_realizable clears a minor factor under a partly split major one", "[factor_choice]") {
  const Mesh mesh = Mesh::parse("x=2,y=2");
  OpRule r;  // one dim of 8 made of a major factor (2) and a minor one (4), as a reshape makes
  r.factors = {Factor{"m", 2, FactorKind::Pass}, Factor{"n", 4, FactorKind::Pass}};
  r.operands = {{{0, 1}}};
  r.result = {{0, 1}};
  FactorAxes whole = {{"x"}, {"y"}};  // the major factor split whole: both kept
  make_realizable(mesh, r, whole);
  CHECK(whole == FactorAxes{{"x"}, {"y"}});
  FactorAxes part = {{}, {"y"}};  // the major factor not split: the minor one may not be
  make_realizable(mesh, r, part);
  CHECK(part == FactorAxes{{}, {}});
}

TEST_CASE("factor choice: every strategy automatic sharding picks is one the policy accepts", "[factor_choice]") {
  Graph g;
  auto x = input(g, "x", DType::f32, {8, 16, 32});
  auto w1 = input(g, "w1", DType::f32, {32, 64});
  auto w2 = input(g, "w2", DType::f32, {64, 32});
  auto y = einsum("bsf,fd->bsd", softmax(gelu(einsum("bsd,df->bsf", x, w1)), 2), w2);
  g.mark_output(y);
  g.annotate(x, Sharding::of({{"data"}, {}, {}}));
  const Mesh mesh = Mesh::parse("data=2,model=2");
  const AutoShardResult res = auto_shard(g, mesh);
  int checked = 0;
  for (std::size_t k = 0; k < g.ops.size() && k < res.op_factors.size(); ++k) {
    if (res.op_factors[k].empty()) continue;
    const Op& op = g.ops[k];
    INFO("op #" << k << " " << op_name(op.kind));
    CHECK(factor_axes_problem(mesh, op, op_rule(g, op), res.op_factors[k]) == "");
    ++checked;
  }
  CHECK(checked >= 4);
}
