// The ops added through the registry alone (docs/adding-an-op.md): each kernel against a
// hand-computed expectation through the reference executor (the CPU kernels on global
// shapes), including the edge cases each op documents. Partitioned == reference for these
// ops is covered by the registry-driven property test.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "tessel/ops.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;

namespace {

HostTensor tensor_of(DType t, const Shape& s, const std::vector<double>& v) {
  HostTensor h(t, s);
  for (std::size_t i = 0; i < v.size(); ++i) h.set(static_cast<int64_t>(i), v[i]);
  return h;
}

// Runs a one-output graph on the reference executor.
HostTensor run1(Graph& g, Tensor out, const std::vector<HostTensor>& inputs) {
  g.mark_output(out);
  return run_reference(g, inputs).at(0);
}

void check_values(const HostTensor& got, const std::vector<double>& want, double tol = 1e-6) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": got " << got.get(static_cast<int64_t>(i)) << ", want " << want[i]);
    if (std::isnan(want[i])) CHECK(std::isnan(got.get(static_cast<int64_t>(i))));
    else CHECK(std::abs(got.get(static_cast<int64_t>(i)) - want[i]) <= tol * std::max(1.0, std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE("ops: sigmoid and silu", "[ops][kernels]") {
  const std::vector<double> xs = {-100.0, -4.5, -1.0, 0.0, 0.5, 3.0, 100.0};
  for (DType dt : {DType::f32, DType::bf16}) {
    Graph g;
    Tensor x = input(g, "x", dt, {7});
    Tensor s = sigmoid(x), l = silu(x);
    g.mark_output(s);
    g.mark_output(l);
    HostTensor in = tensor_of(dt, {7}, xs);
    auto out = run_reference(g, {in});
    std::vector<double> ws, wl;
    for (int64_t i = 0; i < 7; ++i) {
      const double v = in.get(i);
      ws.push_back(1.0 / (1.0 + std::exp(-v)));
      wl.push_back(v / (1.0 + std::exp(-v)));
    }
    const double tol = dt == DType::f32 ? 1e-6 : 1e-2;
    check_values(out[0], ws, tol);
    check_values(out[1], wl, tol);
  }
  Graph g;
  CHECK_THROWS_AS(sigmoid(input(g, "i", DType::i32, {2})), ShapeError);
}
