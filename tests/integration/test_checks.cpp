// The checks users trip over (tessel/compiler/checks.hpp and the runtime's allocation errors):
// compile() of a graph with no output is an error; an unused mesh axis and a program with
// no annotation get a warning in Program::warnings; a tensor too large to allocate names
// the value or arena, the bytes per device and the device; the memory estimate returned
// before a run equals the peak bytes the run reports.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "tessel/ops/builders.hpp"
#include "tessel/compiler/checks.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

bool has_warning(const Program& p, const std::string& needle) {
  return std::any_of(p.warnings.begin(), p.warnings.end(),
                     [&](const std::string& w) { return w.find(needle) != std::string::npos; });
}

// Megatron MLP on data=2,model=2 (the README's program, small).
Graph megatron_mlp(bool annotate_all = true) {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8, 16});
  Tensor w1 = input(g, "w1", DType::f32, {16, 32});
  Tensor w2 = input(g, "w2", DType::f32, {32, 16});
  Tensor y = einsum("bsf,fd->bsd", gelu(einsum("bsd,df->bsf", x, w1)), w2);
  g.mark_output(y);
  if (annotate_all) {
    g.annotate(x, Sharding::parse("[{data}, {}, {}]"));
    g.annotate(w1, Sharding::parse("[{}, {model}]"));
    g.annotate(w2, Sharding::parse("[{model}, {}]"));
  }
  return g;
}

}  // namespace

TEST_CASE("checks: compile of a graph with no output is a clear error", "[checks]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  Tensor y = relu(x);
  (void)y;
  g.annotate(x, Sharding::parse("[{data}, {}]"));
  REQUIRE_THROWS_AS(compile(g, Mesh::parse("data=2")), Error);
  REQUIRE_THROWS_WITH(compile(g, Mesh::parse("data=2")),
                      Catch::Contains("no output") && Catch::Contains("mark_output") && Catch::Contains("data=2"));
}

TEST_CASE("checks: a mesh axis that no value uses gets a warning", "[checks]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  g.mark_output(relu(x));
  g.annotate(x, Sharding::parse("[{data}, {}]"));
  Executable exe = compile(g, Mesh::parse("data=2,model=4"));
  INFO(join(exe.program().warnings, "\n"));
  CHECK(has_warning(exe.program(), "mesh axis 'model' (size 4) is used by no value"));
  CHECK_FALSE(has_warning(exe.program(), "mesh axis 'data'"));
  // A size-1 axis repeats nothing: no warning.
  Executable one = compile(g, Mesh::parse("data=2,model=1"));
  CHECK_FALSE(has_warning(one.program(), "mesh axis 'model'"));
  // Every axis used: no such warning.
  Executable mlp = compile(megatron_mlp(), Mesh::parse("data=2,model=2"));
  CHECK_FALSE(has_warning(mlp.program(), "is used by no value"));
  CHECK_FALSE(has_warning(mlp.program(), "no value is annotated"));
  // The same list from the checks themselves (what tessel-explain prints).
  const auto w = program_warnings(g, Mesh::parse("data=2,model=4"), exe.program());
  CHECK(std::count_if(w.begin(), w.end(), [](const std::string& s) { return s.find("'model'") != std::string::npos; }) == 1);
}

TEST_CASE("checks: a program with no annotation at all gets a warning", "[checks]") {
  Graph g = megatron_mlp(/*annotate_all=*/false);
  Executable exe = compile(g, Mesh::parse("data=2,model=2"));
  INFO(join(exe.program().warnings, "\n"));
  CHECK(has_warning(exe.program(), "no value is annotated"));
  CHECK(has_warning(exe.program(), "each of the 4 devices"));
  // One warning explains it all: not also one per unused axis.
  CHECK_FALSE(has_warning(exe.program(), "is used by no value"));
  // A one-device mesh repeats nothing.
  Executable single = compile(g, Mesh::parse("x=1"));
  CHECK_FALSE(has_warning(single.program(), "no value is annotated"));
  // A sharding_constraint is an annotation too.
  Graph c = parse_graph(
      "mesh data=2\n%x = input f32[4,8]\n%y = relu(%x)\n%z = sharding_constraint(%y) sharding=[{data}, {}]\noutput %z\n");
  CHECK_FALSE(has_warning(compile(c, *c.mesh).program(), "no value is annotated"));
}

TEST_CASE("checks: a tensor too large to allocate names the arena or value and its bytes per device",
          "[checks][runtime]") {
  // 2^48 f32 elements = 2^50 bytes per device: beyond any address space, refused by the
  // backend before the allocator is asked (so this is safe under the sanitizers too).
  const std::string huge = std::to_string(int64_t{1} << 48);
  SECTION("the arena of the intermediates, at load") {
    Graph g = parse_graph("mesh x=2\n%c = constant f32[" + huge + "] value=1\n%y = add(%c, %c)\noutput %y\n");
    Executable exe = compile(g, *g.mesh);
    const int64_t arena = exe.memory_estimate().arena_bytes;
    CHECK(arena >= (int64_t{1} << 50));
    try {
      exe.run({});
      FAIL("the run should not allocate 1 PiB");
    } catch (const OutOfMemoryError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK_THAT(m, Catch::Contains("device 0") && Catch::Contains("arena") &&
                        Catch::Contains(std::to_string(arena) + " bytes") && Catch::Contains("peak_bytes_per_device="));
      CHECK(e.bytes() >= (std::size_t{1} << 50));
    }
  }
  SECTION("an output, at run") {
    Graph g = parse_graph("mesh x=2\n%y = constant f32[" + huge + "] value=1\noutput %y\n");
    Executable exe = compile(g, *g.mesh);
    try {
      exe.run({});
      FAIL("the run should not allocate 1 PiB");
    } catch (const RuntimeError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK_THAT(m, Catch::Contains("output %y") && Catch::Contains(std::to_string(int64_t{1} << 50) + " bytes") &&
                        Catch::Contains("device"));
    }
  }
}

TEST_CASE("memory estimate: known before a run and equal to the peak bytes the run reports", "[checks][memory]") {
  for (const char* spec : {"data=2,model=2", "data=1,model=4", "data=4,model=1"}) {
    INFO("mesh " << spec);
    Graph g = megatron_mlp();
    Executable exe = compile(g, Mesh::parse(spec));
    const MemoryPlan est = exe.memory_estimate();
    REQUIRE(est.planned);
    CHECK(est.peak_bytes() == est.arena_bytes + est.input_bytes + est.output_bytes);
    // Inputs per device: the local shards of x, w1, w2.
    int64_t inputs = 0;
    for (int v : exe.program().inputs) inputs += exe.program().values[static_cast<std::size_t>(v)].bytes();
    CHECK(est.input_bytes == inputs);
    CHECK(est.arena_bytes > 0);
    exe.run(random_inputs(g, 7));
    const RunStats st = exe.last_stats();
    CHECK(st.planned_peak_bytes == est.peak_bytes());
    // What the CPU allocators measured: the same bytes (no kernel scratch in this program).
    REQUIRE(static_cast<int64_t>(st.measured_peak_bytes.size()) == exe.mesh().num_devices());
    for (int64_t b : st.measured_peak_bytes) CHECK(b == est.peak_bytes());
  }
}
