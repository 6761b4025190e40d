// The op registry: every kind has one complete entry, lookups by name round-trip, bad kinds
// are errors (not crashes), a missing kernel names the op and the backend, and every
// sample generator builds a graph whose op is the one it samples.
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <string>

#include "tessel/ir/fused_expr.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

TEST_CASE("registry: every kind has one complete entry", "[registry]") {
  std::set<std::string> names;
  for (OpKind k : all_op_kinds()) {
    const OpDef& d = op_def(k);
    INFO("kind #" << static_cast<int>(k));
    REQUIRE(d.kind == k);
    REQUIRE(d.name != nullptr);
    CHECK(names.insert(d.name).second);
    CHECK(op_kind_from_name(d.name) == k);
    // One shape function: `infer` for one result, `infer_results` for several.
    CHECK(d.num_results >= 1);
    CHECK((d.num_results == 1 ? d.infer != nullptr : d.infer_results != nullptr));
    CHECK(d.rule != nullptr);
    CHECK(d.flops != nullptr);
    if (k != OpKind::Input) CHECK(d.sample != nullptr);
    for (const AttrSpec& a : d.attrs) CHECK(std::string(a.key) != "sharding");
  }
  CHECK(names.size() == static_cast<std::size_t>(OpKind::kCount));
  CHECK_FALSE(op_kind_from_name("no_such_op").has_value());
}

TEST_CASE("registry: the elementwise families are one list each and every consumer takes them", "[registry]") {
  // Each family's ops: registered with its arity, fusible, and in the CPU kernel table; no op in
  // two families.
  std::set<OpKind> seen;
  auto check_family = [&](const char* family, const auto& ops, int arity) {
    for (OpKind k : ops) {
      INFO(family << ": " << op_name(k));
      CHECK(seen.insert(k).second);
      CHECK(op_def(k).min_inputs == arity);
      CHECK(op_def(k).max_inputs == arity);
      CHECK(op_def(k).num_results == 1);
      CHECK(is_fusible_elementwise(k));
      CHECK(cpu_kernel_table().has(k));
    }
  };
  check_family("unary", kUnaryOps, 1);
  check_family("binary", kBinaryOps, 2);
  check_family("compare", kCompareOps, 2);
  CHECK(seen.size() == 22);
  // What fuses besides them: cast and where, nothing else.
  for (OpKind k : all_op_kinds())
    if (!seen.count(k)) {
      INFO(op_name(k));
      CHECK(is_fusible_elementwise(k) == (k == OpKind::Cast || k == OpKind::Where));
    }
}

TEST_CASE("registry: an out-of-range kind is an error naming it", "[registry]") {
  for (int k : {-1, static_cast<int>(OpKind::kCount), 1000}) {
    try {
      op_def(static_cast<OpKind>(k));
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("op kind #" + std::to_string(k)) != std::string::npos);
    }
  }
  Graph g;
  CHECK_THROWS_AS(g.add_op(static_cast<OpKind>(999), {}, {}), Error);
}

TEST_CASE("registry: a backend with no kernel for an op names the op and the backend", "[registry]") {
  using Fn = void (*)(const KernelArgs&);
  KernelTable<Fn> t("test-backend");
  t.add(OpKind::Add, [](const KernelArgs&) {});
  CHECK(t.has(OpKind::Add));
  CHECK_FALSE(t.has(OpKind::Softmax));
  CHECK_FALSE(t.has(static_cast<OpKind>(-3)));
  try {
    t.get(OpKind::Softmax);
    FAIL("no error");
  } catch (const RuntimeError& e) {
    const std::string m = e.what();
    CHECK(m.find("'softmax'") != std::string::npos);
    CHECK(m.find("'test-backend'") != std::string::npos);
  }
  CHECK_THROWS_AS(t.get(static_cast<OpKind>(12345)), RuntimeError);
  // The CPU backend has a kernel for every kind but Input.
  for (OpKind k : all_op_kinds()) CHECK(has_cpu_kernel(k) == (k != OpKind::Input));
  KernelArgs a;
  a.kind = OpKind::Input;
  CHECK_THROWS_AS(run_cpu_kernel(a), RuntimeError);
}

TEST_CASE("registry: sample generators build their op and round-trip as text", "[registry]") {
  std::mt19937_64 rng(7);
  for (int rep = 0; rep < 5; ++rep)
    for (OpKind k : all_op_kinds()) {
      const OpDef& d = op_def(k);
      if (!d.sample) continue;
      Graph g;
      SampleGen r{rng, nullptr};
      Tensor out = d.sample(g, r);
      INFO(d.name << "\n" << print_graph(g));
      bool has = false;
      for (const Op& op : g.ops) has = has || op.kind == k;
      REQUIRE(has);
      g.mark_output(out);
      const std::string text = print_graph(g);
      CHECK(print_graph(parse_graph(text)) == text);
    }
}

TEST_CASE("registry: attribute text follows the schema", "[registry]") {
  OpAttrs a;
  a.dims = {0, 2};
  CHECK(attrs_text(OpKind::ReduceSum, a) == " dims=[0,2]");
  a.keepdims = true;
  CHECK(attrs_text(OpKind::ReduceSum, a) == " dims=[0,2] keepdims=true");
  OpAttrs e;
  e.equation = "ab,bc->ac";
  CHECK(attrs_text(OpKind::Einsum, e) == " eq=\"ab,bc->ac\"");
  CHECK(attrs_text(OpKind::Add, e).empty());
}

TEST_CASE("registry: annotate and mark_output refuse a tensor of another graph", "[registry][graph]") {
  Graph g1, g2;
  Tensor a = input(g1, "a", DType::f32, {4});
  input(g2, "b", DType::f32, {4});
  CHECK_THROWS_AS(g2.annotate(a, Sharding::replicated(1)), Error);
  CHECK(g2.annotations.empty());
  CHECK_THROWS_AS(g2.mark_output(a), Error);
  Tensor b2 = g2.tensor(0);
  CHECK_THROWS_AS(add(a, b2), Error);
}
