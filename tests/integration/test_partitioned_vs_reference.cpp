// Property test: for every op kind, random meshes (1–8 devices), shapes and input
// shardings, the partitioned run equals the unpartitioned reference element by element
// (f32 relative error <= 1e-5 in the max norm, against the larger of the output's and the
// inputs' magnitude — see compare.hpp; NaN never passes). Outputs are poisoned before each run and
// replicas must agree bit for bit. Each op kind's cases alternate between fusion on and off
// (fuse-elementwise; samples of several ops, e.g. log(exp(x)), fuse). TESSEL_CASES sets the number of cases (default 2000),
// TESSEL_SEED the seed (printed on failure).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>

#include "../unit/test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

TEST_CASE("property: partitioned run == reference for every op kind", "[integration][property]") {
  uint64_t seed = tessel_test::seed();
  int cases = tessel_test::cases(2000);
  tessel_test::announce("property: partitioned run == reference for every op kind", seed, cases);
  // The whole property runs on async CPU streams (a missing event wait is a race TSan sees)
  // and on eager ones.
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  std::mt19937_64 rng(seed);
  std::map<OpKind, int> per_kind;
  // Every kind with a sample generator in the registry (all but Input), in turn.
  std::vector<OpKind> kinds;
  for (OpKind k : all_op_kinds())
    if (op_def(k).sample && k != OpKind::Input) kinds.push_back(k);
  for (int c = 0; c < cases; ++c) {
    OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    Mesh mesh = tessel_test::random_mesh(crng);
    SampleGen cr{crng, [&](const Shape& s) {
                   return tessel_test::random_sharding_for(crng, mesh, s, false);
                 }};
    Graph g;
    Tensor out = op_def(k).sample(g, cr);
    g.mark_output(out);
    for (int v : g.inputs)
      if (cr.coin(0.8))
        g.annotate(v, tessel_test::random_sharding_for(crng, mesh, g.values[v].shape, false));
    if (cr.coin(0.3) && k != OpKind::ShardingConstraint)
      g.annotate(out, tessel_test::random_sharding_for(crng, mesh, out.shape(), false));
    g.mesh = mesh;
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << "\n"
                 << print_graph(g));
    Executable exe = compile(g, mesh);
    INFO(exe.program().to_string(0));
    auto inputs = random_inputs(g, case_seed);
    RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
    ro.poison = true;
    ro.check_replicas = true;
    ro.collective_timeout_s = 60;
    // Each kind's cases alternate between lowering with fuse-elementwise and without it
    // (TESSEL_FUSION=0: always without).
    const bool fuse = (static_cast<std::size_t>(c) / kinds.size()) % 2 == 0;
    ro.lowering.fuse_elementwise = ro.lowering.fuse_elementwise && fuse;
    // On async streams, every third case keeps the default inline threshold: programs with
    // small collectives then run them on the device threads (the inline path).
    if (c % 3 == 2) ro.inline_max_comm_bytes = RunOptions{}.inline_max_comm_bytes;
    INFO("streams " << stream_mode_name(mode) << ", fusion " << (ro.lowering.fuse_elementwise ? "on" : "off")
                    << ", inline up to " << ro.inline_max_comm_bytes << " comm bytes");
    auto got = exe.run(inputs, ro);
    auto want = run_reference(g, inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      // Judged against the larger of the output's and the inputs' magnitude (compare.hpp):
      // a sum of signed inputs that cancels to ~0 keeps the inputs' absolute rounding.
      CompareResult cmp = compare(got[i], want[i], max_abs(inputs));
      INFO(cmp.to_string());
      REQUIRE(cmp.max_rel_err <= 1e-5);
    }
    ++per_kind[k];
  }
  if (cases >= static_cast<int>(kinds.size()))
    for (OpKind k : kinds) REQUIRE(per_kind[k] > 0);
}
