// The collective-matmul gate's decisions from cost figures alone (no timings): the dispatch
// cost per instruction and the compute sharing of device threads on fewer cores
// (CostModel::dispatch_s, compute_sharing), what tessel-explain prints of them, and the
// cost model's error paths.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tessel/passes/collective_matmul.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

// The benchmark's sequence-parallel Megatron MLP (bench_collective_matmul.cpp) on a ring of n:
// one all-gather -> einsum site and one einsum -> reduce-scatter site.
Program mlp(int64_t n) {
  Graph g = parse_graph(fmt::format(R"(
mesh model={}
%x = input f32[512,512] sharding=[{{model}}, {{}}]
%w1 = input f32[512,2048] sharding=[{{}}, {{model}}]
%w2 = input f32[2048,512] sharding=[{{model}}, {{}}]
%u = einsum(%x, %w1) eq="td,df->tf" sharding=[{{}}, {{model}}]
%a = gelu(%u)
%y = einsum(%a, %w2) eq="tf,fd->td" sharding=[{{model}}, {{}}]
output %y
)", n), "mlp.tsl");
  return compile(g, *g.mesh).program();
}

// A CPU-like machine: 30 GFLOP/s and 5 GB/s per core, a link as slow as the MLP's compute
// (each collective takes about as long as its einsum on a core of its own), no dispatch cost
// and a core per device unless the test says otherwise.
CollectiveMatmulOptions cpu_like() {
  CollectiveMatmulOptions o;
  o.cost.flops_per_s = 30e9;
  o.cost.memory_bandwidth = 5e9;
  o.cost.default_link = LinkSpec{10e-6, 0.2e9};
  o.cost.dispatch_s = 0;
  o.cost.compute_sharing = 1;
  return o;
}

std::vector<CollectiveMatmulSite> rewritable(const Program& p, const CollectiveMatmulOptions& o) {
  std::vector<CollectiveMatmulSite> out;
  for (auto& s : collective_matmul_sites(p, o))
    if (s.before_s > 0) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("cost: compute_sharing is device threads per core and 1 with a core each", "[unit][cost]") {
  CHECK(compute_sharing(2, 2) == 1);
  CHECK(compute_sharing(1, 16) == 1);
  CHECK(compute_sharing(4, 2) == 2);
  CHECK(compute_sharing(8, 2) == 4);
  CHECK(compute_sharing(3, 2) == 1.5);
  CHECK(compute_sharing(8, 0) == 1);  // cores unknown: as if each device had one
  CHECK_THROWS_WITH(compute_sharing(0, 2), Catch::Contains("devices must be >= 1"));
}

TEST_CASE("cost: op and dispatch seconds scale with compute_sharing", "[unit][cost]") {
  CostModel m;
  m.flops_per_s = 1e9;
  m.memory_bandwidth = 1e9;
  m.dispatch_s = 10e-6;
  CHECK(m.op_seconds(2e9, 1e9) == Approx(2.0));
  CHECK(m.dispatch_seconds() == Approx(10e-6));
  m.compute_sharing = 4;
  CHECK(m.op_seconds(2e9, 1e9) == Approx(8.0));
  CHECK(m.op_seconds(0, 3e9) == Approx(12.0));
  CHECK(m.dispatch_seconds() == Approx(40e-6));
  // Collectives are the link's, not the cores': unchanged.
  const Mesh mesh = Mesh::parse("model=4");
  CostModel one = m;
  one.compute_sharing = 1;
  CHECK(m.collective_seconds(CollectiveKind::AllGather, mesh, {"model"}, 1 << 20) ==
        one.collective_seconds(CollectiveKind::AllGather, mesh, {"model"}, 1 << 20));
  CHECK_NOTHROW(m.validate());
}

TEST_CASE("cost: validate names the bad figure", "[unit][cost]") {
  const auto bad = [](auto set, const char* what) {
    CostModel m;
    set(m);
    CHECK_THROWS_WITH(m.validate(), Catch::Contains(what));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  bad([](CostModel& m) { m.compute_sharing = 0.5; }, "compute_sharing must be a finite number >= 1");
  bad([&](CostModel& m) { m.compute_sharing = nan; }, "compute_sharing");
  bad([](CostModel& m) { m.dispatch_s = -1e-6; }, "dispatch_s must be a finite number >= 0");
  bad([](CostModel& m) { m.dispatch_s = std::numeric_limits<double>::infinity(); }, "dispatch_s");
  bad([](CostModel& m) { m.flops_per_s = 0; }, "flops_per_s");
  bad([&](CostModel& m) { m.memory_bandwidth = nan; }, "memory_bandwidth");
  bad([](CostModel& m) { m.default_link.bandwidth = -1; }, "default link bandwidth");
  bad([](CostModel& m) { m.links["model"] = LinkSpec{-1, 1e9}; }, "link 'model' alpha");
  CostModel ok;
  ok.dispatch_s = 0;
  CHECK_NOTHROW(ok.validate());
}

TEST_CASE("collective-matmul gate: an invalid cost model is refused by the sites and the pass", "[unit][collective_matmul]") {
  const Program p = mlp(4);
  CollectiveMatmulOptions o = cpu_like();
  o.cost.compute_sharing = 0;
  CHECK_THROWS_WITH(collective_matmul_sites(p, o), Catch::Contains("compute_sharing"));
  CHECK_THROWS_WITH(collective_matmul_pass(p, o), Catch::Contains("compute_sharing"));
  o.mode = OverlapMode::On;
  CHECK_THROWS_WITH(collective_matmul_pass(p, o), Catch::Contains("compute_sharing"));
  // Off touches nothing, so it checks nothing.
  o.mode = OverlapMode::Off;
  CHECK_NOTHROW(collective_matmul_pass(p, o));
}

TEST_CASE("collective-matmul gate: takes the MLP's rings when comm ~ compute and each device has a core", "[unit][collective_matmul]") {
  for (int64_t n : {2, 4, 8}) {
    const auto sites = rewritable(mlp(n), cpu_like());
    REQUIRE(sites.size() == 2);
    for (const auto& s : sites) {
      INFO(n << " devices: " << s.line());
      CHECK(s.variant != RingVariant::None);
      CHECK(std::min(s.uni_s, s.bi_s < 0 ? s.uni_s : s.bi_s) < 0.95 * s.before_s);
      CHECK(s.compute_sharing == 1);
      CHECK(s.dispatch_s == 0);
    }
  }
}

TEST_CASE("collective-matmul gate: declines where device threads share cores and each instruction costs", "[unit][collective_matmul]") {
  // 8 devices on 2 cores: every einsum and every dispatch takes 4x as long, the link does not.
  // With a CPU stream's dispatch cost the ring's 20-odd instructions per site outweigh what
  // it hides; without the dispatch cost, or with a core per device, it still wins.
  CollectiveMatmulOptions shared = cpu_like();
  shared.cost.compute_sharing = compute_sharing(8, 2);
  shared.cost.dispatch_s = 100e-6;
  const Program p8 = mlp(8);
  for (const auto& s : rewritable(p8, shared)) {
    INFO(s.line());
    CHECK(s.variant == RingVariant::None);
    CHECK(s.compute_sharing == 4);
    CHECK(s.dispatch_s == Approx(400e-6));
    CHECK(s.reason.find("instructions at 400.0 us each") != std::string::npos);
    CHECK(s.reason.find("x4 for device programs sharing a core") != std::string::npos);
  }
  CollectiveMatmulOptions no_dispatch = shared;
  no_dispatch.cost.dispatch_s = 0;
  for (const auto& s : rewritable(p8, no_dispatch)) {
    INFO(s.line());
    CHECK(s.variant != RingVariant::None);
  }
  // The same dispatch cost with a core per device (2 devices on 2 cores): few, large steps win.
  CollectiveMatmulOptions own = shared;
  own.cost.compute_sharing = compute_sharing(2, 2);
  for (const auto& s : rewritable(mlp(2), own)) {
    INFO(s.line());
    CHECK(s.variant != RingVariant::None);
  }
}

TEST_CASE("collective-matmul gate: counts each ring's instructions and prints the terms", "[unit][collective_matmul]") {
  CollectiveMatmulOptions o = cpu_like();
  o.cost.dispatch_s = 20e-6;
  o.cost.compute_sharing = 2;
  const auto sites = rewritable(mlp(4), o);
  REQUIRE(sites.size() == 2);
  const auto& ag = sites[0].gather ? sites[0] : sites[1];
  const auto& rs = sites[0].gather ? sites[1] : sites[0];
  // All-gather ring of 4, free ring letter: 4 einsums, 3 permutes, 1 assembling copy; the
  // bidirectional one: 2 half copies, 8 einsums, 6 permutes, 1 copy.
  CHECK(ag.uni_instrs == 8);
  CHECK(ag.bi_instrs == 17);
  // Reduce-scatter ring of 4, one operand sliced per step: 4 slices + 4 einsums, 3 permutes +
  // 3 adds; bidirectional: twice that, plus the copy of the two halves.
  CHECK(rs.uni_instrs == 14);
  CHECK(rs.bi_instrs == 29);
  const std::string line = ag.line();
  CHECK(line.find("terms: dispatch 40.000 us per instruction (as is 2, ring 8, bidirectional ring 17), "
                  "compute x2 (device programs per device's compute)") != std::string::npos);
  // A larger dispatch cost only makes the rings dearer, never "as is" by more than its 2.
  CollectiveMatmulOptions dear = o;
  dear.cost.dispatch_s = 200e-6;
  const auto dear_sites = rewritable(mlp(4), dear);
  for (std::size_t i = 0; i < sites.size(); ++i) {
    CHECK(dear_sites[i].before_s - sites[i].before_s == Approx(2 * 2 * 180e-6));
    CHECK(dear_sites[i].uni_s - sites[i].uni_s > 2 * 2 * 180e-6);
  }
}

TEST_CASE("collective-matmul gate: the dispatch cost tips uni against bi on compute-bound steps", "[unit][collective_matmul]") {
  // A fast link: the steps are compute-bound, the bidirectional ring hides nothing more and
  // runs about twice the instructions.
  CollectiveMatmulOptions o = cpu_like();
  o.cost.default_link = LinkSpec{10e-6, 5e9};
  o.cost.dispatch_s = 50e-6;
  for (const auto& s : rewritable(mlp(4), o)) {
    INFO(s.line());
    CHECK(s.bi_s > s.uni_s);
    if (s.variant != RingVariant::None) CHECK(s.variant == RingVariant::Uni);
  }
  // A slow link: comm-bound steps, the bidirectional ring's halved transfers win.
  o.cost.default_link = LinkSpec{10e-6, 0.05e9};
  for (const auto& s : rewritable(mlp(4), o)) {
    INFO(s.line());
    CHECK(s.bi_s < s.uni_s);
    CHECK(s.variant == RingVariant::Bi);
  }
}
