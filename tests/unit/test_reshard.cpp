// Reshard planner: plans end in the target layout, bytes follow the nccl-tests formula, and
// the planner prefers the cheap collectives (slice, reduce-scatter, all-to-all).
#include <catch2/catch.hpp>

#include <random>

#include "tessel/compiler/reshard.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {
int64_t lbytes(const Mesh& m, const Shape& g, const Sharding& s) {
  return num_elements(s.local_shape(m, g)) * 4;
}
}  // namespace

TEST_CASE("reshard: simple plans", "[reshard]") {
  Mesh m = Mesh::parse("data=2,model=4");
  CostModel cost;
  Shape g{8, 16};
  auto plan = [&](const char* a, const char* b) {
    return plan_reshard(m, g, DType::f32, Sharding::parse(a), Sharding::parse(b), cost).to_string();
  };
  REQUIRE(plan("[{}, {}]", "[{}, {}]") == "no-op");
  REQUIRE(plan("[{}, {}]", "[{data}, {model}]") == "slice(dim 0 over {data}) -> slice(dim 1 over {model})");
  REQUIRE(plan("[{data}, {}]", "[{}, {}]") == "all-gather({data} dim 0)");
  REQUIRE(plan("[{}, {}] partial{model}", "[{}, {}]") == "all-reduce({model})");
  REQUIRE(plan("[{}, {}] partial{model}", "[{}, {model}]") == "reduce-scatter({model} dim 1)");
  REQUIRE(plan("[{model}, {}]", "[{}, {model}]") == "all-to-all({model} split 1 concat 0)");
  REQUIRE(plan("[{data, model}, {}]", "[{model, data}, {}]").find("collective-permute") != std::string::npos);
}

TEST_CASE("property: every reshard plan A->B ends in B and its bytes match the formula",
          "[reshard][property]") {
  uint64_t seed = tessel_test::seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  CostModel cost;
  int n = tessel_test::cases(2000);
  tessel_test::announce("property: every reshard plan A->B ends in B and its bytes match the formula", seed, n);
  for (int iter = 0; iter < n; ++iter) {
    Mesh mesh = tessel_test::random_mesh(rng);
    Shape shape;
    Sharding to = tessel_test::random_sharding(rng, mesh, shape, false);
    // make the shape divisible by any sharding: multiply every dim by the device count
    for (auto& d : shape) d *= mesh.num_devices();
    Sharding from = tessel_test::random_sharding_for(rng, mesh, shape, true);
    INFO("mesh " << mesh.to_string() << " shape " << shape_str(shape) << " " << from.to_string()
                 << " -> " << to.to_string());
    ReshardPlan p = plan_reshard(mesh, shape, DType::f32, from, to, cost);
    Sharding cur = from;
    double seconds = 0;
    for (const auto& st : p.steps) {
      INFO("plan " << p.to_string());
      st.after.validate(mesh, shape, "step");
      switch (st.kind == InstrKind::ShardSlice ? CollectiveKind::CollectivePermute : st.collective) {
        case CollectiveKind::AllGather: REQUIRE(st.bytes == lbytes(mesh, shape, st.after)); break;
        case CollectiveKind::ReduceScatter: REQUIRE(st.bytes == lbytes(mesh, shape, cur)); break;
        case CollectiveKind::AllReduce:
        case CollectiveKind::AllToAll:
          REQUIRE(st.bytes == lbytes(mesh, shape, cur));
          REQUIRE(st.bytes == lbytes(mesh, shape, st.after));
          break;
        case CollectiveKind::CollectivePermute:
          if (st.kind == InstrKind::ShardSlice) REQUIRE(st.bytes == 0);
          else REQUIRE(st.bytes == lbytes(mesh, shape, st.after));
          break;
      }
      if (st.kind == InstrKind::Collective && st.collective != CollectiveKind::CollectivePermute) {
        double expect = cost.collective_seconds(st.collective, mesh, st.axes, st.bytes);
        REQUIRE(st.seconds == Approx(expect));
      }
      seconds += st.seconds;
      cur = st.after;
    }
    REQUIRE(p.seconds == Approx(seconds));
    if (p.steps.empty()) {
      // Equivalent layouts only: every device holds the same block under both.
      REQUIRE(from.partial.empty());
      for (int64_t d = 0; d < mesh.num_devices(); ++d)
        REQUIRE(from.local_offset(mesh, shape, d) == to.local_offset(mesh, shape, d));
    } else {
      REQUIRE(cur.same_layout(to));
    }
  }
}
