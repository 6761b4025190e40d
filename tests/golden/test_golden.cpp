// Golden tests: each tests/golden/NAME.tsl is parsed, propagated and partitioned; the
// rendering (shardings, per-device program, collectives line) must equal NAME.expected.
// Regenerate with TESSEL_UPDATE_GOLDEN=1 after an intended change, and review the diff.
// Each file also has hard assertions on its collectives, so a regenerated file cannot
// silently accept a regression.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tessel/compiler/partition.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

struct Result {
  Graph g;
  PropagationResult prop;
  Program prog;
  std::string text;
};

Result render(const std::string& name) {
  Result r;
  std::string path = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/" + name + ".tsl";
  r.g = parse_graph_file(path);
  REQUIRE(r.g.mesh.has_value());
  r.prop = propagate(r.g, *r.g.mesh);
  r.prog = partition(r.g, *r.g.mesh, r.prop);
  PrintOptions po;
  po.comment = [&](int v) { return r.prop.shardings[v].to_string(); };
  r.text = "== shardings\n" + print_graph(r.g, po) + "== program\n" + r.prog.to_string(0) +
           r.prog.summary().line() + "\n";
  std::string expected_path = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/" + name + ".expected";
  if (std::getenv("TESSEL_UPDATE_GOLDEN")) {
    std::ofstream(expected_path) << r.text;
  }
  std::ifstream in(expected_path);
  INFO("golden file " << expected_path << " (set TESSEL_UPDATE_GOLDEN=1 to regenerate)");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(r.text == ss.str());
  return r;
}

const Sharding& sharding_of(const Result& r, const char* value) {
  int v = r.g.find(value);
  REQUIRE(v >= 0);
  return r.prop.shardings[v];
}

}  // namespace

TEST_CASE("golden: data-parallel MLP has no collective in the forward pass", "[golden]") {
  Result r = render("dp_mlp");
  CHECK(r.prog.summary().line() ==
        "collectives: all-gather=0 all-reduce=0 reduce-scatter=0 all-to-all=0 collective-permute=0 bytes=0");
  CHECK(sharding_of(r, "a").same_layout(Sharding::parse("[{data}, {}, {}]")));
}

TEST_CASE("golden: Megatron MLP has exactly one all-reduce and no all-gather", "[golden]") {
  Result r = render("megatron_mlp");
  auto s = r.prog.summary();
  CHECK(s.all_reduce == 1);
  CHECK(s.all_gather == 0);
  CHECK(s.all_to_all + s.collective_permute + s.reduce_scatter == 0);
  CHECK(sharding_of(r, "a").same_layout(Sharding::parse("[{data}, {}, {model}]")));
  CHECK(s.bytes == 4 * 128 * 512 * 4);
}

TEST_CASE("golden: an open output is reduce-scattered where a closed one is all-reduced", "[golden]") {
  Result open = render("megatron_mlp_open");
  Result closed = render("megatron_mlp");
  auto so = open.prog.summary(), sc = closed.prog.summary();
  CHECK(so.reduce_scatter == 1);
  CHECK(so.all_reduce + so.all_gather + so.all_to_all + so.collective_permute == 0);
  CHECK(sc.all_reduce == 1);
  CHECK(sc.reduce_scatter == 0);
  // Same buffer, half the ring traffic: the cost model's (n-1)/n vs 2(n-1)/n.
  CHECK(open.prog.comm_seconds() < closed.prog.comm_seconds());
  const Sharding& out = open.prog.values[static_cast<std::size_t>(open.prog.outputs[0])].sharding;
  CHECK(out.partial.empty());
  CHECK(out.uses_axis("model"));
  CHECK(out.uses_axis("data"));
}

TEST_CASE("golden: reductions over a split dim move per-row statistics and not the tensor", "[golden]") {
  Result r = render("distributed_reductions");
  auto s = r.prog.summary();
  CHECK(s.all_gather == 0);
  CHECK(s.all_to_all + s.collective_permute + s.reduce_scatter == 0);
  // softmax 2 (max, sum), layer_norm 2 (mean, variance), reduce_max 1, cross_entropy 3
  // (max, sum of exponentials, label logit): one f32 per row each.
  CHECK(s.all_reduce == 8);
  const int64_t rows = 4 * 64;
  for (const Instr& in : r.prog.instrs)
    if (in.kind == InstrKind::Collective) CHECK(in.bytes == rows * 4);
  CHECK(s.bytes == 8 * rows * 4);
  CHECK(s.bytes * 100 < 4 * 64 * 4096 * 4);  // < 1% of the tensor a gather would move
}

TEST_CASE("golden: attention with heads over model", "[golden]") {
  Result r = render("attention_heads");
  auto s = r.prog.summary();
  CHECK(s.all_reduce == 1);
  CHECK(s.all_gather + s.all_to_all + s.collective_permute + s.reduce_scatter == 0);
  CHECK(sharding_of(r, "p").same_layout(Sharding::parse("[{}, {model}, {}, {}]")));
}

TEST_CASE("golden: 2-D mesh transformer block", "[golden]") {
  Result r = render("transformer_block_2d");
  auto s = r.prog.summary();
  CHECK(s.all_reduce == 2);
  CHECK(s.all_gather + s.all_to_all + s.collective_permute + s.reduce_scatter == 0);
  for (const Instr& in : r.prog.instrs)
    if (in.kind == InstrKind::Collective) CHECK(in.axes == std::vector<std::string>{"model"});
  CHECK(sharding_of(r, "a").same_layout(Sharding::parse("[{data}, {}, {model}]")));
  CHECK(sharding_of(r, "y").same_layout(Sharding::parse("[{data}, {}, {}]")));
}

TEST_CASE("golden: conflicting annotations are resolved by priority", "[golden]") {
  Result r = render("priority_conflict");
  CHECK(sharding_of(r, "y").same_layout(Sharding::parse("[{}, {a}]")));
  auto s = r.prog.summary();
  CHECK(s.all_to_all == 1);
  CHECK(s.all_gather + s.all_reduce + s.collective_permute + s.reduce_scatter == 0);
}

TEST_CASE("golden: swapping two conflicting priorities swaps the plan", "[golden]") {
  Result w = render("priority_swap_w");  // %w (priority 0) stays, %x is resharded
  Result x = render("priority_swap_x");  // %x (priority 0) stays, %w is gathered
  CHECK(w.prog.summary().all_to_all == 1);
  CHECK(w.prog.summary().all_reduce + w.prog.summary().reduce_scatter == 1);
  CHECK(w.prog.summary().all_gather == 0);
  CHECK(x.prog.summary().all_gather == 1);
  CHECK(x.prog.summary().all_to_all == 0);
  CHECK(x.prog.summary().all_reduce == 0);
  CHECK(sharding_of(w, "y").dims[0].axes.empty());
  CHECK(sharding_of(x, "y").dims[0].axes == std::vector<std::string>{"a"});
  // The decision names both values, their annotations and priorities, the op and the reason.
  bool named = false;
  for (const std::string& d : w.prop.decisions)
    named = named || (d.find("op #2 einsum") != std::string::npos &&
                      d.find("%w (annotated, priority 0)") != std::string::npos &&
                      d.find("%x (annotated, priority 1)") != std::string::npos &&
                      d.find("stronger priority (0 < 1)") != std::string::npos);
  CHECK(named);
}

TEST_CASE("golden: reshape splitting a sharded dim needs no communication", "[golden]") {
  Result r = render("reshape_split");
  CHECK(sharding_of(r, "r").same_layout(Sharding::parse("[{data}, {}, {model}, {}]")));
  CHECK(r.prog.summary().bytes == 0);
  CHECK(r.prog.summary().all_to_all == 0);
}

TEST_CASE("golden: a layer norm's backward under data parallelism reduces only its weight gradients", "[golden]") {
  Result r = render("layer_norm_grad");
  auto s = r.prog.summary();
  // dgamma and dbeta: one all-reduce each of 64 f32; dx stays split over data.
  CHECK(s.all_reduce == 2);
  CHECK(s.all_gather + s.all_to_all + s.collective_permute + s.reduce_scatter == 0);
  CHECK(s.bytes == 2 * 64 * 4);
  CHECK(sharding_of(r, "dx").same_layout(Sharding::parse("[{data}, {}]")));
  int kernels = 0;
  for (const Instr& in : r.prog.instrs)
    if (in.kind == InstrKind::Kernel && in.op == OpKind::LayerNormGrad) {
      ++kernels;
      REQUIRE(in.extra_out.size() == 2);
      for (int v : in.extra_out) CHECK(r.prog.values[static_cast<std::size_t>(v)].sharding.partial == std::vector<std::string>{"data"});
    }
  CHECK(kernels == 1);
  // Lowered, the two gradient all-reduces are combined into one (XLA's all-reduce combiner).
  CHECK(lower_program(r.prog, true).summary().all_reduce == 1);
}
