// Propagation and partitioning on graphs built with the builder.
#include <catch2/catch.hpp>

#include "tessel/ops/builders.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/compiler/checks.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/compiler/uneven.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"

using namespace tessel;

namespace {
struct Mlp {
  Graph g;
  Tensor x, w1, w2, h, y;
  Mlp() {
    x = input(g, "x", DType::f32, {8, 16, 32});
    w1 = input(g, "w1", DType::f32, {32, 64});
    w2 = input(g, "w2", DType::f32, {64, 32});
    h = gelu(einsum("bsd,df->bsf", x, w1)).named("h");
    y = einsum("bsf,fd->bsd", h, w2).named("y");
    g.mark_output(y);
  }
};
}  // namespace

TEST_CASE("partition: Megatron MLP needs exactly one all-reduce", "[partition]") {
  Mlp m;
  m.g.annotate(m.x, Sharding::of({{"data"}, {}, {}}));
  m.g.annotate(m.w1, Sharding::of({{}, {"model"}}));
  m.g.annotate(m.w2, Sharding::of({{"model"}, {}}));
  m.g.annotate(m.y, Sharding::of({{"data"}, {}, {}}));  // closed: the next layer's layout
  Mesh mesh = Mesh::parse("data=2,model=4");
  auto prop = propagate(m.g, mesh);
  REQUIRE(prop.shardings[m.h.id].same_layout(Sharding::of({{"data"}, {}, {"model"}})));
  REQUIRE(prop.shardings[m.y.id].same_layout(Sharding::of({{"data"}, {}, {}})));
  Program p = partition(m.g, mesh, prop);
  auto s = p.summary();
  REQUIRE(s.all_reduce == 1);
  REQUIRE(s.all_gather == 0);
  REQUIRE(s.bytes == 4 * 16 * 32 * 4);
  REQUIRE(p.values[p.inputs[1]].shape == Shape{32, 16});
}

TEST_CASE("partition: data parallel MLP has no collective", "[partition]") {
  Mlp m;
  m.g.annotate(m.x, Sharding::of({{"data"}, {}, {}}));
  m.g.annotate(m.w1, Sharding::of({{}, {}}));
  m.g.annotate(m.w2, Sharding::of({{}, {}}));
  Mesh mesh = Mesh::parse("data=8");
  Program p = partition(m.g, mesh, propagate(m.g, mesh));
  REQUIRE(p.summary().line() ==
          "collectives: all-gather=0 all-reduce=0 reduce-scatter=0 all-to-all=0 collective-permute=0 bytes=0");
}

TEST_CASE("partition: a replicated output forces a gather and a sharded one a reduce-scatter", "[partition]") {
  Mlp m;
  m.g.annotate(m.w1, Sharding::of({{}, {"model"}}));
  m.g.annotate(m.w2, Sharding::of({{"model"}, {}}));
  m.g.annotate(m.y, Sharding::of({{}, {}, {"model"}}));
  Mesh mesh = Mesh::parse("model=4");
  Program p = partition(m.g, mesh, propagate(m.g, mesh));
  auto s = p.summary();
  REQUIRE(s.reduce_scatter == 1);
  REQUIRE(s.all_reduce == 0);
}

TEST_CASE("propagation: priorities decide conflicts", "[propagate]") {
  Graph g;
  auto x = input(g, "x", DType::f32, {8, 8});
  auto y = tanh(x).named("y");
  auto z = exp(y).named("z");
  g.mark_output(z);
  g.annotate(x, Sharding::of({{"a"}, {}}), 1);
  g.annotate(z, Sharding::of({{}, {"a"}}), 0);
  Mesh mesh = Mesh::parse("a=4");
  auto prop = propagate(g, mesh);
  // z (priority 0) claims y first.
  REQUIRE(prop.shardings[y.id].same_layout(Sharding::of({{}, {"a"}})));
  Program p = partition(g, mesh, prop);
  REQUIRE(p.summary().all_to_all == 1);
  REQUIRE(prop.explain(g, y.id).find("annotation on %z") != std::string::npos);
}

TEST_CASE("propagation: reshape splitting a sharded dim needs no communication", "[propagate]") {
  Graph g;
  auto x = input(g, "x", DType::f32, {2, 4, 64});
  auto r = reshape(x, {2, 4, 8, 8});
  g.mark_output(r);
  g.annotate(x, Sharding::of({{}, {}, {"model"}}));
  Mesh mesh = Mesh::parse("model=4");
  auto prop = propagate(g, mesh);
  REQUIRE(prop.shardings[r.id].same_layout(Sharding::of({{}, {}, {"model"}, {}})));
  REQUIRE(partition(g, mesh, prop).summary().bytes == 0);
}

TEST_CASE("rules: every op kind has a rule / a shape function / a name and a CPU kernel", "[ops]") {
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    const OpDef& d = op_def(static_cast<OpKind>(k));
    REQUIRE(static_cast<int>(d.kind) == k);
    REQUIRE(d.rule != nullptr);
    REQUIRE((d.num_results == 1 ? d.infer != nullptr : d.infer_results != nullptr));
    REQUIRE(op_kind_from_name(d.name) == static_cast<OpKind>(k));
    if (static_cast<OpKind>(k) != OpKind::Input) REQUIRE(has_cpu_kernel(static_cast<OpKind>(k)));
  }
}

TEST_CASE("rules: einsum factors and reshape decomposition", "[ops]") {
  Graph g;
  auto a = input(g, "a", DType::f32, {2, 3, 4});
  auto b = input(g, "b", DType::f32, {4, 5});
  auto c = einsum("bsd,df->bsf", a, b);
  REQUIRE(op_rule(g, g.ops[c.value().producer]).to_string() == "(b,s,d),(d,f) -> (b,s,f) reduction{d}");
  auto r = reshape(input(g, "r", DType::f32, {6, 4}), {4, 6});
  REQUIRE(op_rule(g, g.ops[r.value().producer]).to_string() == "(f0,f0) -> (f0,f0) replicated{f0}");
  auto r2 = reshape(input(g, "r2", DType::f32, {2, 12, 5}), {2, 3, 4, 5});
  REQUIRE(op_rule(g, g.ops[r2.value().producer]).to_string() == "(f0,f1*f2,f3) -> (f0,f1,f2,f3)");
}

TEST_CASE("errors: shape errors name op / operands and shapes", "[errors]") {
  Graph g;
  auto a = input(g, "a", DType::f32, {2, 3});
  auto b = input(g, "b", DType::f32, {4, 5});
  REQUIRE_THROWS_WITH(einsum("ij,jk->ik", a, b),
                      Catch::Contains("einsum(%a: f32[2,3], %b: f32[4,5])") && Catch::Contains("letter 'j'"));
  REQUIRE_THROWS_WITH(add(a, b), Catch::Contains("do not broadcast"));
  REQUIRE_THROWS_WITH(reshape(a, {7}), Catch::Contains("cannot reshape [2,3]"));
  REQUIRE_THROWS_AS(einsum("ij->iz", a), ShapeError);
  REQUIRE_THROWS_WITH(g.annotate(a, Sharding::of({{"x"}})), Catch::Contains("rank 2"));
  Mesh mesh = Mesh::parse("x=4");
  g.annotate(a, Sharding::of({{"x"}, {}}));
  REQUIRE_THROWS_WITH(propagate(g, mesh), Catch::Contains("%a") && Catch::Contains("not divisible"));
}

TEST_CASE("partition: every all-gather is reported as a warning", "[partition]") {
  Graph g;
  auto x = input(g, "x", DType::f32, {8, 16});
  g.annotate(x, Sharding::of({{"data"}, {"model"}}));
  auto y = softmax(x, 1);
  g.mark_output(y);
  Mesh mesh = Mesh::parse("data=2,model=4");
  Program p = partition(g, mesh, propagate(g, mesh));
  REQUIRE(p.summary().all_gather == 1);
  REQUIRE(p.warnings.size() == 1);
  REQUIRE(p.warnings[0].find("%x is all-gathered over {model}") != std::string::npos);
  REQUIRE(p.warnings[0].find("softmax") != std::string::npos);
}

TEST_CASE("partition: ops that reach no output are not emitted", "[partition]") {
  Graph g;
  auto x = input(g, "x", DType::f32, {8, 8});
  auto w = input(g, "w", DType::f32, {8, 8});
  g.annotate(x, Sharding::of({{"a"}, {}}));
  auto unused = einsum("ij,jk->ik", x, w).named("unused");
  auto y = tanh(x);
  g.mark_output(y);
  Mesh mesh = Mesh::parse("a=2");
  Program p = partition(g, mesh, propagate(g, mesh));
  REQUIRE(p.instrs.size() == 1);
  REQUIRE(p.inputs.size() == 2);
  for (const auto& v : p.values) REQUIRE(v.graph_value != unused.id);
}

TEST_CASE("partition: a gathered copy is reused within its region and gathered again in the next", "[partition][zero3]") {
  // w is stored split over data and gathered for each use: twice in region "a", 40 instructions
  // apart (more than regather_distance), then once in region "b" right after.
  const Mesh mesh = Mesh::parse("data=4");
  for (const int64_t rows : {8, 6}) {  // 6: uneven, padded to 8 before partitioning
    INFO("w has " << rows << " rows");
    Graph g;
    Tensor w = input(g, "w", DType::f32, {rows, 4});
    g.annotate(w, Sharding::of({{"data"}, {}}));
    g.expect_gathers(w);
    const Sharding whole = Sharding::of({{}, {}});
    const int a = g.region_id("a"), b = g.region_id("b");
    std::size_t first = g.ops.size();
    Tensor y = shard(w, whole);
    for (int i = 0; i < 40; ++i) y = neg(y);
    y = add(y, shard(w, whole));
    g.set_region(first, a);
    first = g.ops.size();
    y = add(y, shard(w, whole));
    g.set_region(first, b);
    g.annotate(y, whole);
    g.mark_output(y);
    CHECK(g.region_id("b") == b);  // an existing name keeps its index
    CHECK_THROWS_WITH(g.set_region(first, 2), Catch::Contains("region 2 is not one of the graph's 2 regions"));

    // The regions (and the ZeRO annotation) survive padding, cloning and moving.
    PaddedGraph pg = pad_uneven(g, mesh);
    CHECK(pg.padded == (rows == 6));
    Graph moved = std::move(pg.graph);
    const Graph p = moved.clone();
    REQUIRE(p.regions == std::vector<std::string>{"a", "b"});
    CHECK(p.annotations.at(p.find("w")).gather_expected);
    for (const Op& op : p.ops) CHECK((op.kind == OpKind::Input || op.region >= 0));

    // The regions of the all-gathers of w, by each rule.
    auto gathers = [&](const Graph& graph, const PartitionOptions& po) {
      const Program prog = partition(graph, mesh, propagate(graph, mesh), po);
      for (const std::string& warning : prog.warnings) CHECK(warning.find("%w is all-gathered") == std::string::npos);
      std::vector<std::string> where;
      for (const Instr& in : prog.instrs)
        if (in.kind == InstrKind::Collective && in.collective == CollectiveKind::AllGather) {
          const int r = graph.ops[static_cast<std::size_t>(in.graph_op)].region;
          where.push_back(r < 0 ? "none" : graph.regions[static_cast<std::size_t>(r)]);
        }
      return where;
    };
    // By region: once in each region, however far apart its uses are.
    CHECK(gathers(p, {}) == std::vector<std::string>{"a", "b"});
    // By distance (the fallback): again after 40 instructions, reused right after.
    PartitionOptions by_distance;
    by_distance.regather_by_region = false;
    CHECK(gathers(p, by_distance) == std::vector<std::string>{"a", "a"});
    by_distance.regather_distance = 0;  // always reuse
    CHECK(gathers(p, by_distance) == std::vector<std::string>{"a"});
    // A graph without regions (hand-built, parsed) uses the distance rule.
    Graph none = p.clone();
    none.regions.clear();
    for (Op& op : none.ops) op.region = -1;
    CHECK(gathers(none, {}) == std::vector<std::string>{"none", "none"});
  }
}

TEST_CASE("partition: summarize_warnings folds a kind of per-value warning into one line", "[partition]") {
  const std::vector<std::string> w = {
      "mesh axis 'model' (size 2) is not used: every device of it repeats the work",
      "%a is all-gathered over {data} (100 bytes per device) for operand 0 of op #1 einsum: [{data}] -> [{}]",
      "%b is all-gathered over {data} (300 bytes per device) for operand 0 of op #2 einsum: [{data}] -> [{}]",
      "%a is all-gathered over {data} (100 bytes per device) for operand 1 of op #3 einsum: [{data}] -> [{}]",
      "%c is all-gathered over {model} (50 bytes per device) for operand 0 of op #4 einsum: [{model}] -> [{}]",
      "mesh axis 'model' (size 2) is not used: every device of it repeats the work"};
  const std::vector<std::string> s = tessel::summarize_warnings(w, 2, "--all-warnings lists each");
  REQUIRE(s.size() == 3);
  CHECK(s[0] == w[0]);
  CHECK(s[1] == "3 warnings that a value is all-gathered over {data} (2 values, 500 bytes per device in all; "
                "the largest: %b, %a); --all-warnings lists each");
  CHECK(s[2] == w[4]);  // a kind with no more than 2 members is kept as it is
  // With a higher limit nothing is folded (the repeated warning is printed once).
  const std::vector<std::string> all = tessel::summarize_warnings(w, 3);
  CHECK(all.size() == 5);
}
