// NaN hunting (RunOptions::check_finite, TESSEL_CHECK_FINITE=1): a run names the first
// instruction that wrote NaN or infinity — the value, the element, the device and the run's
// number — or the input that already held one; without the option a run is unchanged.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"

using namespace tessel;

namespace {

// z = log(x) * 2 on data=2, x [8, 4] split by rows: device 1 holds rows 4..7.
struct LogGraph {
  Graph g;
  LogGraph() {
    Tensor x = input(g, "x", DType::f32, {8, 4});
    g.annotate(x, Sharding::of({{"data"}, {}}));
    Tensor y = log(x).named("y");
    g.mark_output(mul(y, constant(g, 2.0)).named("z"));
  }
};

HostTensor positive_x() {
  HostTensor x(DType::f32, {8, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.5 + 0.1 * static_cast<double>(i));
  return x;
}

}  // namespace

TEST_CASE("runtime: check_finite names the first instruction that wrote NaN", "[runtime][check_finite]") {
  LogGraph m;
  const Mesh mesh = Mesh::parse("data=2");
  Executable exe = compile(m.g, mesh);
  for (StreamMode mode : {StreamMode::Async, StreamMode::Eager}) {
    ThreadRuntimeOptions tro;
    tro.stream_mode = mode;
    ThreadRuntime rt(2, tro);
    LoadOptions lo;
    lo.lowering.fuse_elementwise = false;  // log and mul stay two instructions
    LoadedExecutable le = load(exe, rt, lo);
    HostTensor x = positive_x();
    RunOptions check;
    check.check_finite = true;
    // Finite everywhere: the run is as without the check.
    const HostTensor ok = le.to_host(le.run({le.to_device("x", x)}, check).outputs[0]);
    for (int64_t i = 0; i < ok.numel(); ++i) CHECK(ok.get(i) == Approx(2 * std::log(x.get(i))));
    // Row 5, column 2 (element 6 of device 1's block [4, 4]) negative: log makes NaN there.
    x.set(5 * 4 + 2, -1.0);
    CHECK_THROWS_WITH(le.run({le.to_device("x", x)}, check),
                      Catch::Contains("run 2, device 1: NaN at element 6 of %y f32[4,4]") &&
                          Catch::Contains("(%y = log)") && Catch::Contains("of the graph"));
    // Without the option the NaN just flows to the output.
    const HostTensor z = le.to_host(le.run({le.to_device("x", x)}).outputs[0]);
    CHECK(std::isnan(z.get(5 * 4 + 2)));
    // An input that holds infinity is named as such.
    x = positive_x();
    x.set(1, std::numeric_limits<double>::infinity());
    CHECK_THROWS_WITH(le.run({le.to_device("x", x)}, check),
                      Catch::Contains("device 0: infinity at element 1 of %x") &&
                          Catch::Contains("input #0 held it when the run started"));
  }
}

TEST_CASE("runtime: TESSEL_CHECK_FINITE=1 checks every run and fused kernels are named", "[runtime][check_finite]") {
  LogGraph m;
  Executable exe = compile(m.g, Mesh::parse("data=2"));
  ThreadRuntime rt(2);
  LoadedExecutable le = load(exe, rt);  // fused: one fused_elementwise kernel writes %z
  HostTensor x = positive_x();
  x.set(0, -2.0);
  ::setenv("TESSEL_CHECK_FINITE", "1", 1);
  CHECK_THROWS_WITH(le.run({le.to_device("x", x)}), Catch::Contains("device 0: NaN at element 0") &&
                                                        Catch::Contains("fused_elementwise"));
  ::unsetenv("TESSEL_CHECK_FINITE");
  CHECK_NOTHROW(le.run({le.to_device("x", x)}));
}
