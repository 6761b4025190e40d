// Automatic layouts (tessel/autoshard/auto_shard.hpp): auto-sharded graphs compile, run and equal
// the unpartitioned reference; the plan for the GPT example with only the batch placed is
// predicted no slower than the hand-written Megatron plan; a memory budget below what the
// replicated plan needs gives a plan that fits; axis_only_on keeps an axis on the batch; the
// same input gives the same plan; bad options are errors naming them.
#include <catch2/catch.hpp>

#include "tessel/passes/program_passes.hpp"

#include <chrono>
#include <random>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

// The compiled program's predicted time per device (the cost model's compute + collectives).
double predicted(const Executable& exe, const CostModel& cost) {
  return exe.program().compute_seconds(cost) + exe.program().comm_seconds();
}

GptConfig small_gpt(bool annotate) {
  GptConfig c;
  c.batch = 8;
  c.seq = 32;
  c.d_model = 64;
  c.heads = 4;
  c.layers = 2;
  c.vocab = 256;
  c.annotate = annotate;
  return c;
}

// The GPT of `cfg` with only its batch on `data` (tokens and labels), nothing else annotated.
GptGraph batch_only_gpt(const GptConfig& cfg = small_gpt(false)) {
  GptGraph m = build_gpt(cfg);
  m.graph.annotate(m.tokens, Sharding::of({{"data"}, {}}));
  m.graph.annotate(m.labels, Sharding::of({{"data"}, {}}));
  return m;
}

// The GPT training step with only the batch placed: the step's own layouts (parameters,
// moments, gradients) are auto_shard's to choose, each update tied to its parameter.
struct BatchOnlyStep {
  GptGraph m;
  std::vector<std::pair<std::string, std::string>> tied;  // TrainStep::donations()
};
BatchOnlyStep batch_only_step(const Mesh& mesh, const GptConfig& cfg = small_gpt(false)) {
  BatchOnlyStep s{batch_only_gpt(cfg), {}};
  GptGraph& m = s.m;
  s.tied = add_train_step(m.graph, m.loss, m.weights, mesh, {}).donations();
  for (auto it = m.graph.annotations.begin(); it != m.graph.annotations.end();)
    it = (it->first == m.tokens.id || it->first == m.labels.id) ? std::next(it) : m.graph.annotations.erase(it);
  return s;
}

}  // namespace

TEST_CASE("auto-sharded graphs compile run and equal the reference", "[autoshard][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("auto-sharded graphs against the reference", seed, 2);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  SECTION("an MLP with only its batch placed") {
    Graph g = parse_graph(R"(
%x = input f32[16,32] sharding=[{data}, {}]
%w1 = input f32[32,64]
%w2 = input f32[64,32]
%h = einsum(%x, %w1) eq="bd,df->bf"
%a = gelu(%h)
%y = einsum(%a, %w2) eq="bf,fd->bd"
%s = reduce_sum(%y) dims=[0,1]
output %s
output %y
)", "mlp.tsl");
    AutoShardOptions o;
    const AutoShardResult r = auto_shard(g, mesh, o);
    CHECK(r.fits);
    CHECK(r.shardings[static_cast<std::size_t>(g.find("x"))] == Sharding::of({{"data"}, {}}));
    CHECK(r.from_user[static_cast<std::size_t>(g.find("x"))]);
    Executable exe = compile(r.annotated(g), mesh);
    const auto inputs = random_inputs(g, seed);
    const auto got = exe.run(inputs);
    const auto want = run_reference(g, inputs);
    // %s sums 512 products in another order on every plan that splits them (1.9e-5 seen).
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(compare(got[i], want[i], max_abs(inputs)).max_rel_err <= 1e-4);
    // The same through CompileOptions::auto_shard.
    CompileOptions co;
    co.auto_shard = o;
    Executable exe2 = compile(g, mesh, co);
    CHECK(exe2.program().to_string() == exe.program().to_string());
  }
  SECTION("the GPT example with only its batch placed") {
    GptGraph m = batch_only_gpt();
    const AutoShardResult r = auto_shard(m.graph, mesh, {});
    Executable exe = compile(r.annotated(m.graph), mesh);
    auto inputs = random_inputs(m.graph, seed);
    gpt_init(m.graph, inputs);
    const auto got = exe.run(inputs);
    const auto want = run_reference(m.graph, inputs);
    CHECK(compare(got[0], want[0], max_abs(inputs)).max_rel_err <= 1e-4);
  }
}

TEST_CASE("auto_shard on the GPT example is predicted no slower than the hand Megatron plan", "[autoshard][unit]") {
  for (const char* mesh_text : {"data=2,model=2", "data=2,model=4"}) {
    const Mesh mesh = Mesh::parse(mesh_text);
    AutoShardOptions o;
    o.time_limit_s = 0.5;
    GptGraph hand = build_gpt(small_gpt(true));
    const double hand_s = predicted(compile(hand.graph, mesh), o.cost);
    GptGraph m = batch_only_gpt();
    const AutoShardResult r = auto_shard(m.graph, mesh, o);
    const double auto_s = predicted(compile(r.annotated(m.graph), mesh), o.cost);
    INFO(mesh_text << ": hand " << hand_s << " s, auto " << auto_s << " s (solver " << r.solver << ", its own estimate "
                   << r.compute_s + r.comm_s << " s)");
    WARN(mesh_text << ": predicted hand " << hand_s << " s, auto " << auto_s << " s; solver " << r.solver << " in " << r.solve_s << " s, formulated in " << r.formulate_s << " s");
    CHECK(auto_s <= hand_s * 1.0001);
    // Deterministic: the same input gives the same plan.
    const AutoShardResult again = auto_shard(m.graph, mesh, o);
    CHECK(again.shardings == r.shardings);
  }
}

TEST_CASE("auto_shard under a memory budget finds a plan that fits", "[autoshard][unit]") {
  const Mesh mesh = Mesh::parse("data=4");
  Graph g = parse_graph(R"(
%x = input f32[8,64] sharding=[{data}, {}]
%w = input f32[64,256]
%v = input f32[256,64]
%h = einsum(%x, %w) eq="bd,df->bf"
%y = einsum(%h, %v) eq="bf,fd->bd"
output %y
)", "budget.tsl");
  AutoShardOptions free;
  const AutoShardResult r0 = auto_shard(g, mesh, free);
  // Below what the plan without a budget uses: the weights must be split.
  AutoShardOptions tight = free;
  tight.memory_budget_bytes = r0.peak_bytes * 6 / 10;
  const AutoShardResult r1 = auto_shard(g, mesh, tight);
  INFO("no budget: peak " << r0.peak_bytes << "; budget " << tight.memory_budget_bytes << ": peak " << r1.peak_bytes);
  CHECK(r1.fits);
  CHECK(r1.peak_bytes <= tight.memory_budget_bytes);
  CHECK_FALSE(r1.shardings[static_cast<std::size_t>(g.find("w"))].is_replicated());
  // A budget nothing fits is said, not hidden.
  AutoShardOptions impossible = free;
  impossible.memory_budget_bytes = 64;
  CHECK_FALSE(auto_shard(g, mesh, impossible).fits);
  // compile() with that budget refuses the plan instead of returning one above it (issue 37
  // D5: the budget was dropped silently); check_fits says who, the budget, the mesh and the least.
  CompileOptions co;
  co.auto_shard = impossible;
  CHECK_THROWS_WITH(compile(g, mesh, co),
                    Catch::Contains("compile (CompileOptions::auto_shard): no plan within the memory budget of 64 bytes "
                                    "per device on mesh {data=4}: the least found needs"));
  co.auto_shard = tight;
  CHECK_NOTHROW(compile(g, mesh, co));
}

TEST_CASE("auto_shard keeps an axis on the dims axis_only_on allows", "[autoshard][unit]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  GptGraph m = build_gpt(small_gpt(false));
  AutoShardOptions o;
  o.axis_only_on["data"] = {"tokens:0", "labels:0"};
  const AutoShardResult r = auto_shard(m.graph, mesh, o);
  // Weights never take `data` (no weight dim is connected to the batch).
  for (const Tensor& w : m.weights) {
    INFO(m.graph.values[static_cast<std::size_t>(w.id)].name << " " << r.shardings[static_cast<std::size_t>(w.id)].to_string());
    CHECK_FALSE(r.shardings[static_cast<std::size_t>(w.id)].uses_axis("data"));
  }
  AutoShardOptions bad;
  bad.axis_only_on["pipe"] = {"tokens:0"};
  CHECK_THROWS_WITH(auto_shard(m.graph, mesh, bad), Catch::Contains("axis 'pipe', which mesh"));
  bad.axis_only_on.clear();
  bad.axis_only_on["data"] = {"tokens:7"};
  CHECK_THROWS_WITH(auto_shard(m.graph, mesh, bad), Catch::Contains("'tokens:7' is not VALUE:DIM"));
}

TEST_CASE("an auto-sharded GPT training step runs equal to the reference and beats the hand plan's estimate",
          "[autoshard][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("auto-sharded training step", seed, 1);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  AutoShardOptions o;
  GptGraph hand = build_gpt(small_gpt(true));
  add_train_step(hand.graph, hand.loss, hand.weights, mesh, {});
  const double hand_s = predicted(compile(hand.graph, mesh), o.cost);
  BatchOnlyStep step = batch_only_step(mesh);
  GptGraph& m = step.m;
  o.tied = step.tied;
  const AutoShardResult r = auto_shard(m.graph, mesh, o);
  // Every update is laid out as its parameter (what the donation needs).
  for (const auto& [in, out] : step.tied) {
    INFO(in << " -> " << out);
    CHECK(r.shardings[static_cast<std::size_t>(m.graph.find(in))].same_layout(
        r.shardings[static_cast<std::size_t>(m.graph.find(out))]));
  }
  Executable exe = compile(r.annotated(m.graph), mesh);
  const double auto_s = predicted(exe, o.cost);
  WARN("training step on data=2,model=2: predicted hand " << hand_s << " s, auto " << auto_s << " s");
  CHECK(auto_s <= hand_s * 1.0001);
  auto inputs = random_inputs(m.graph, seed);
  gpt_init(m.graph, inputs);
  make_train_inputs_valid(m.graph, inputs);
  const auto got = exe.run(inputs);
  const auto want = run_reference(m.graph, inputs);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("output " << m.graph.values[static_cast<std::size_t>(m.graph.outputs[i])].name);
    CHECK(compare(got[i], want[i], max_abs(inputs)).max_rel_err <= 1e-4);
  }
}

TEST_CASE("the partitioner emits the collectives auto_shard priced", "[autoshard][unit]") {
  // Every op carries its chosen strategy (Op::factor_axes) and every value its layout, so the
  // program's collectives are the plan's: the compiled program's communication equals the
  // solver's own estimate (it was 0.75 s above it on the 96-layer GPT-3 step on data=8,model=8
  // when the partitioner chose each op's factors itself).
  for (const char* mesh_text : {"data=2,model=2", "data=2,model=4"}) {
    const Mesh mesh = Mesh::parse(mesh_text);
    BatchOnlyStep step = batch_only_step(mesh);
    GptGraph& m = step.m;
    AutoShardOptions o;
    o.tied = step.tied;
    o.combined_tail_reductions = false;  // each reduction priced alone, as the unlowered program has it
    const AutoShardResult r = auto_shard(m.graph, mesh, o);
    const Graph annotated = r.annotated(m.graph);
    for (std::size_t k = 0; k < m.graph.ops.size(); ++k)
      if (m.graph.ops[k].kind != OpKind::Input) {
        INFO("op #" << k);
        CHECK(annotated.ops[k].factor_axes.size() == op_rule(m.graph, m.graph.ops[k]).factors.size());
      }
    const Executable exe = compile(annotated, mesh);
    INFO(mesh_text << ": program " << exe.program().comm_seconds() << " s of collectives, solver " << r.comm_s << " s");
    CHECK(std::abs(exe.program().comm_seconds() - r.comm_s) <= 1e-3 * r.comm_s);
    // Priced as the lowering combines the weight gradients' reductions (the default), the
    // solver's figure is nearer the lowered program's than pricing each alone is.
    o.combined_tail_reductions = true;
    const AutoShardResult c = auto_shard(m.graph, mesh, o);
    const Program low = lower_program(compile(c.annotated(m.graph), mesh).program());
    INFO("combined: lowered program " << low.comm_seconds(o.cost) << " s, solver " << c.comm_s << " s");
    CHECK(c.comm_s < r.comm_s);
    CHECK(std::abs(low.comm_seconds(o.cost) - c.comm_s) < std::abs(low.comm_seconds(o.cost) - r.comm_s));
  }
}

TEST_CASE("the partitioner follows an op's factor_axes and ignores one that does not fit", "[autoshard][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("factor_axes followed", seed, 1);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  // Everything replicated: on its own the partitioner computes the product whole on every
  // device, with no collective.
  Graph g = parse_graph(R"(
%x = input f32[8,16] sharding=[{}, {}]
%w = input f32[16,4] sharding=[{}, {}]
%y = einsum(%x, %w) eq="bd,df->bf" sharding=[{}, {}]
output %y
)", "product.tsl");
  const int op = g.values[static_cast<std::size_t>(g.find("y"))].producer;
  const std::string plain = compile(g, mesh).program().to_string();
  CHECK(compile(g, mesh).program().summary().all_reduce == 0);
  // A strategy that splits the summed letter d over `model` (factors b, d, f in the rule's
  // order): local products of 8 of the 16 terms, then one all-reduce to the closed layout.
  const OpRule rule = op_rule(g, g.ops[static_cast<std::size_t>(op)]);
  REQUIRE(rule.factors.size() == 3);
  int d = -1;
  for (std::size_t f = 0; f < rule.factors.size(); ++f)
    if (rule.factors[f].kind == FactorKind::Reduction) d = static_cast<int>(f);
  REQUIRE(d >= 0);
  std::vector<std::vector<std::string>> fs(3);
  fs[static_cast<std::size_t>(d)] = {"model"};
  g.ops[static_cast<std::size_t>(op)].factor_axes = fs;
  Executable exe = compile(g, mesh);
  CHECK(exe.program().summary().all_reduce == 1);
  const auto inputs = random_inputs(g, seed);
  const auto got = exe.run(inputs);
  const auto want = run_reference(g, inputs);
  CHECK(compare(got[0], want[0], max_abs(inputs)).max_rel_err <= 1e-5);
  // Strategies that do not fit the op or the mesh are ignored: the program is the one the
  // partitioner makes on its own.
  for (const auto& bad : std::vector<std::vector<std::vector<std::string>>>{
           {{"model"}},                        // one entry for three factors
           {{}, {"nope"}, {}},                 // an axis the mesh lacks
           {{"data"}, {"data"}, {}},           // one axis on two factors
           {{}, {}, {"data", "model", "x"}}}) {  // an unknown axis again, and more than the size
    g.ops[static_cast<std::size_t>(op)].factor_axes = bad;
    CHECK(compile(g, mesh).program().to_string() == plain);
  }
}

TEST_CASE("an auto_shard plan survives JSON and a plan for another graph is refused", "[autoshard][unit]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  BatchOnlyStep step = batch_only_step(mesh);
  GptGraph& m = step.m;
  AutoShardOptions o;
  o.tied = step.tied;
  const AutoShardResult r = auto_shard(m.graph, mesh, o);
  const AutoShardResult back = AutoShardResult::from_json(r.to_json(), m.graph);
  CHECK(back.shardings == r.shardings);
  CHECK(back.from_user == r.from_user);
  CHECK(back.op_factors == r.op_factors);
  CHECK(back.tied_layouts.size() == r.tied_layouts.size());
  CHECK(back.comm_s == r.comm_s);
  CHECK(back.compute_s == r.compute_s);
  CHECK(back.solver == r.solver);
  CHECK(back.alternatives.size() == r.alternatives.size());
  CHECK(compile(back.annotated(m.graph), mesh).program().to_string() ==
        compile(r.annotated(m.graph), mesh).program().to_string());
  // Another graph (one layer fewer), text that is not a plan, a layout of the wrong rank.
  GptConfig c = small_gpt(false);
  c.layers = 1;
  const GptGraph other = build_gpt(c);
  CHECK_THROWS_WITH(AutoShardResult::from_json(r.to_json(), other.graph), Catch::Contains("made for another graph"));
  CHECK_THROWS_WITH(AutoShardResult::from_json("{\"shardings\": []}", m.graph), Catch::Contains("not a plan written by"));
  CHECK_THROWS_WITH(AutoShardResult::from_json("[1, 2", m.graph), Catch::Contains("not JSON"));
  // The tokens' layout (the shardings list: one quoted layout per value, in value order) made rank 1.
  std::string text = r.to_json();
  std::size_t at = text.find("\"shardings\"");
  REQUIRE(at != std::string::npos);
  std::size_t close = text.find('"', at + 1), open = close;  // the key's closing quote
  for (int v = 0; v <= m.tokens.id; ++v) {
    open = text.find('"', close + 1);  // value v's layout, quoted
    close = text.find('"', open + 1);
  }
  REQUIRE(text.substr(open + 1, close - open - 1) == r.shardings[static_cast<std::size_t>(m.tokens.id)].to_string());
  text.replace(open + 1, close - open - 1, "[{data}]");
  CHECK_THROWS_WITH(AutoShardResult::from_json(text, m.graph), Catch::Contains("has rank 1"));
}

TEST_CASE("auto_shard refuses an annotation that splits a dim unevenly", "[autoshard][unit]") {
  // Issue 37 D10: batch 8 over 3 devices was priced as unreachable, the plan printed "1e+06 s"
  // and left every other value replicated.
  Graph g = parse_graph(R"(
%x = input f32[8,64] sharding=[{data}, {}]
%w = input f32[64,32]
%y = einsum(%x, %w) eq="bd,df->bf"
output %y
)", "uneven.tsl");
  CHECK_THROWS_WITH(auto_shard(g, Mesh::parse("data=3"), {}),
                    Catch::Contains("the annotation of %x ([{data}, {}]) splits dim 0 (8) over {data} (3 devices) "
                                    "unevenly"));
  CHECK_NOTHROW(auto_shard(g, Mesh::parse("data=4"), {}));
}

// Issue 37: a time limit holds on the largest graph tessel plans, the 96-layer GPT-3 training
// step (d_model 12288, seq 2048, batch 64; about 12,000 nodes) on data=8,model=8: the whole
// call within 1.5x the limit plus 1 s, with and without a memory budget (whose checks compile
// the program). Timed: hidden from test discovery ([.]), registered alone and serially in
// tests/CMakeLists.txt, and left out of the sanitizer runs.
TEST_CASE("auto_shard answers within 1.5x its time limit plus 1 s on the 96-layer GPT-3 step", "[.][autoshard][timed]") {
  const Mesh mesh = Mesh::parse("data=8,model=8");
  GptConfig cfg = small_gpt(false);
  cfg.batch = 64;
  cfg.seq = 2048;
  cfg.d_model = 12288;
  cfg.heads = 96;
  cfg.layers = 96;
  cfg.vocab = 50304;
  const BatchOnlyStep step = batch_only_step(mesh, cfg);
  for (const int64_t budget : {int64_t{0}, int64_t{40} << 30}) {
    AutoShardOptions o;
    o.tied = step.tied;
    o.time_limit_s = 4;
    o.memory_budget_bytes = budget;
    const auto t0 = std::chrono::steady_clock::now();
    const AutoShardResult r = auto_shard(step.m.graph, mesh, o);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("budget " << budget << ": " << took << " s (formulation " << r.formulate_s << " s, solves " << r.solve_s
                   << " s), solver " << r.solver);
    CHECK(took <= 1.5 * o.time_limit_s + 1);
    CHECK(r.solver.find("over the") == std::string::npos);
    CHECK(r.nodes > 10000);
    // A check of the program's peak (a compile of the whole step) takes longer than this limit:
    // the result says it was not made, rather than passing the estimate off as checked.
    if (budget > 0) CHECK(r.solver.find("the program's peak was not checked against the budget") != std::string::npos);
  }
}

// A budget is met however the search ends: fit_budget lowers the solver's limit while the
// program is over it and never steps back up to a plan already over (a CI run under load: the
// gpt_train model's fourth solve at a lower limit came back 2.5% over, and the least was 0.05%
// over 2 MB). max_iterations stands in for a search cut short by load (before the fix: 70% of
// the unbudgeted peak at 20 iterations ended over); each budget is met by the full search.
TEST_CASE("auto_shard meets a memory budget however short its search", "[autoshard][unit]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  BatchOnlyStep step = batch_only_step(mesh);
  AutoShardOptions free;
  free.tied = step.tied;
  free.max_iterations = 2000;
  const AutoShardResult r0 = auto_shard(step.m.graph, mesh, free);
  for (const double frac : {0.8, 0.7}) {
    AutoShardOptions o = free;
    o.memory_budget_bytes = static_cast<int64_t>(frac * static_cast<double>(r0.peak_bytes));
    REQUIRE(auto_shard(step.m.graph, mesh, o).fits);
    for (const int64_t it : {int64_t{5}, int64_t{20}, int64_t{100}}) {
      o.max_iterations = it;
      const AutoShardResult r = auto_shard(step.m.graph, mesh, o);
      INFO("budget " << o.memory_budget_bytes << " (" << frac << " of " << r0.peak_bytes << "), " << it
                     << " iterations: program peak " << r.program_peak_bytes << "; " << r.solver);
      CHECK(r.fits);
      CHECK(r.program_peak_bytes <= o.memory_budget_bytes);
    }
  }
}
