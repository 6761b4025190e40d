// combine-collectives end to end: programs with combinable all-reduces (Megatron's distributed
// softmax / layer norm / cross-entropy statistics; two layer outputs reduced over the same
// axis) run partitioned == reference with combining on and off, on async and eager streams,
// and the combined program has fewer collectives moving the same bytes.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "../unit/test_util.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

using tessel_test::guarded;

// Two layers whose outputs are both partial over `model` (reduced separately: combined into
// one), next to a cross-entropy whose small logits the partitioner gathers (one all-gather,
// which combining leaves alone).
const char* kTwoLayers = R"(
mesh data=2, model=2
%x = input f32[4,16] sharding=[{data}, {model}]
%w1 = input f32[16,8] sharding=[{model}, {}]
%w2 = input f32[16,8] sharding=[{model}, {}]
%logits = input f32[4,32] sharding=[{data}, {model}]
%labels = input i32[4]
%y1 = einsum(%x, %w1) eq="bd,df->bf" sharding=[{data}, {}]
%y2 = einsum(%x, %w2) eq="bd,df->bf" sharding=[{data}, {}]
%ce = cross_entropy(%logits, %labels)
output %y1, %y2, %ce
)";

void run_both_ways(const Graph& g, const std::string& what, int expect_fewer_by_at_least) {
  Executable exe = compile(g, *g.mesh);
  const auto inputs = random_inputs(g, 11);
  const auto want = run_reference(g, inputs);
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  INFO(what << " on " << stream_mode_name(mode) << " streams");
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  ThreadRuntime rt(exe.mesh().num_devices(), ro);
  LoadOptions off;
  off.lowering.combine_threshold_bytes = 0;
  LoadOptions on;  // the default threshold
  LoadedExecutable separate = load(exe, rt, off);
  LoadedExecutable combined = load(exe, rt, on);
  const CollectiveSummary s0 = separate.program().summary(), s1 = combined.program().summary();
  INFO("separate: " << s0.line() << "\ncombined: " << s1.line() << "\n" << print_program(combined.program()));
  // The partitioned program is untouched; only the lowered one is combined.
  CHECK(s0.line() == exe.program().summary().line());
  CHECK(s1.all_reduce + expect_fewer_by_at_least <= s0.all_reduce);
  CHECK(s1.bytes == s0.bytes);
  CHECK(s1.all_gather == s0.all_gather);
  CHECK(s1.reduce_scatter == s0.reduce_scatter);
  verify_program(combined.program());
  for (LoadedExecutable* le : {&separate, &combined}) {
    std::vector<ShardedArray> arrays;
    for (std::size_t i = 0; i < inputs.size(); ++i) arrays.push_back(le->to_device(i, inputs[i]));
    RunOptions opts;
    opts.poison = true;
    RunResult r = guarded(what, [&] { return le->run(arrays, opts); });
    REQUIRE(r.outputs.size() == want.size());
    for (std::size_t o = 0; o < want.size(); ++o) {
      CompareResult c = compare(le->to_host(r.outputs[o], /*check_replicas=*/true), want[o]);
      INFO((le == &combined ? "combined" : "separate") << " output " << o << ": " << c.to_string());
      CHECK(c.max_rel_err <= 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("combine-collectives: distributed reductions run == reference combined and not", "[integration][combine]") {
  Graph g = parse_graph_file(std::string(TESSEL_SOURCE_DIR) + "/tests/golden/distributed_reductions.tsl");
  run_both_ways(g, "distributed_reductions", 2);
}

TEST_CASE("combine-collectives: two layer outputs reduced over the same axis", "[integration][combine]") {
  Graph g = parse_graph(kTwoLayers, "two_layers.tsl");
  run_both_ways(g, "two layers", 1);
}

TEST_CASE("combine-collectives: a threshold below every buffer changes nothing", "[integration][combine]") {
  Graph g = parse_graph_file(std::string(TESSEL_SOURCE_DIR) + "/tests/golden/distributed_reductions.tsl");
  Executable exe = compile(g, *g.mesh);
  ProgramPassOptions tiny;
  tiny.combine_threshold_bytes = 1;
  ProgramPassOptions none;
  none.combine_threshold_bytes = 0;
  CHECK(print_program(lower_program(exe.program(), true, tiny)) == print_program(lower_program(exe.program(), true, none)));
  // dump_program_after knows the pass, and shows the combined all-reduce there.
  const std::string text = dump_program_after(exe.program(), "combine-collectives");
  CHECK(text.find("all_reduce(%combined.in)") != std::string::npos);
  CHECK(dump_program_after(exe.program(), "combine-collectives", none).find("%combined") == std::string::npos);
}
