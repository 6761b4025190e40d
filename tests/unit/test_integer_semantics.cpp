// tests/unit/test_integer_semantics.cpp — the i32 semantics of docs/ir.md ("Integer
// semantics") at every level: the CPU kernels, the reference executor on graphs written in
// the text form, and a partitioned run against the reference. Add/sub/mul and sums wrap
// around modulo 2^32; x / 0 = -1 and INT_MIN / -1 = INT_MIN (XLA's results). Before these
// semantics, INT_MIN / -1 killed the process with SIGFPE and the wrapping cases were
// signed-overflow UB (run these under scripts/test-sanitizers address to see UBSan agree).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "tessel/executable.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/ir/graph_text.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

HostTensor i32s(const Shape& s, const std::vector<int32_t>& v) {
  HostTensor t(DType::i32, s);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  for (std::size_t i = 0; i < v.size(); ++i) t.as<int32_t>()[i] = v[i];
  return t;
}

std::vector<int32_t> values(const HostTensor& t) {
  REQUIRE(t.dtype() == DType::i32);
  return std::vector<int32_t>(t.as<int32_t>(), t.as<int32_t>() + t.numel());
}

HostTensor run1(OpKind kind, const std::vector<const HostTensor*>& in, const Shape& out_shape,
                const OpAttrs& attrs = {}) {
  return tessel_test::run_cpu_op(kind, attrs, in, DType::i32, out_shape);
}

}  // namespace

TEST_CASE("i32 add sub and mul wrap around modulo 2^32", "[kernels][integers]") {
  HostTensor x = i32s({4}, {kMax, kMin, 65536, kMin});
  HostTensor y = i32s({4}, {1, 1, 65536, -1});
  CHECK(values(run1(OpKind::Add, {&x, &y}, {4})) == std::vector<int32_t>{kMin, kMin + 1, 131072, kMax});
  CHECK(values(run1(OpKind::Sub, {&x, &y}, {4})) == std::vector<int32_t>{kMax - 1, kMax, 0, kMin + 1});
  CHECK(values(run1(OpKind::Mul, {&x, &y}, {4})) == std::vector<int32_t>{kMax, kMin, 0, kMin});
  // The broadcast paths (scalar operand, strided loop) use the same functors.
  HostTensor one = i32s({}, {1});
  CHECK(values(run1(OpKind::Add, {&x, &one}, {4})) == std::vector<int32_t>{kMin, kMin + 1, 65537, kMin + 1});
  HostTensor m = i32s({2, 2}, {kMax, kMax, kMin, kMin});
  HostTensor row = i32s({2}, {1, -1});
  CHECK(values(run1(OpKind::Add, {&m, &row}, {2, 2})) == std::vector<int32_t>{kMin, kMax - 1, kMin + 1, kMax});
  HostTensor col = i32s({2, 1}, {kMax, 2});
  CHECK(values(run1(OpKind::Mul, {&col, &row}, {2, 2})) == std::vector<int32_t>{kMax, -kMax, 2, -2});
}

TEST_CASE("i32 div truncates toward zero with x / 0 = -1 and INT_MIN / -1 = INT_MIN", "[kernels][integers]") {
  HostTensor x = i32s({7}, {7, -7, 7, 0, kMin, kMin, kMax});
  HostTensor y = i32s({7}, {-2, 2, 0, 0, -1, 0, -1});
  CHECK(values(run1(OpKind::Div, {&x, &y}, {7})) == std::vector<int32_t>{-3, -3, -1, -1, kMin, -1, -kMax});
  // Scalar divisors on either side, and a broadcast row.
  HostTensor minus1 = i32s({}, {-1}), zero = i32s({}, {0});
  CHECK(values(run1(OpKind::Div, {&x, &minus1}, {7})) ==
        std::vector<int32_t>{-7, 7, -7, 0, kMin, kMin, -kMax});
  CHECK(values(run1(OpKind::Div, {&x, &zero}, {7})) == std::vector<int32_t>(7, -1));
  HostTensor m = i32s({2, 2}, {kMin, 5, kMin, 5});
  HostTensor row = i32s({2}, {-1, 0});
  CHECK(values(run1(OpKind::Div, {&m, &row}, {2, 2})) == std::vector<int32_t>{kMin, -1, kMin, -1});
}

TEST_CASE("i32 neg of INT_MIN and relu", "[kernels][integers]") {
  HostTensor x = i32s({3}, {kMin, kMax, -1});
  CHECK(values(run1(OpKind::Neg, {&x}, {3})) == std::vector<int32_t>{kMin, -kMax, 1});
  CHECK(values(run1(OpKind::Relu, {&x}, {3})) == std::vector<int32_t>{0, kMax, 0});
}

TEST_CASE("i32 reduce_sum wraps around whatever the reduced dims", "[kernels][integers][reduce]") {
  // [2, 3]: rows {MAX, 1, 1} and {MIN, -1, 5}.
  HostTensor x = i32s({2, 3}, {kMax, 1, 1, kMin, -1, 5});
  OpAttrs last;
  last.dims = {1};
  CHECK(values(run1(OpKind::ReduceSum, {&x}, {2}, last)) == std::vector<int32_t>{kMin + 1, kMin + 4});
  OpAttrs first;
  first.dims = {0};
  CHECK(values(run1(OpKind::ReduceSum, {&x}, {3}, first)) == std::vector<int32_t>{-1, 0, 6});
  OpAttrs both;
  both.dims = {0, 1};
  CHECK(values(run1(OpKind::ReduceSum, {&x}, {}, both)) == std::vector<int32_t>{5});
  CHECK(values(run1(OpKind::ReduceMax, {&x}, {}, both)) == std::vector<int32_t>{kMax});
}

TEST_CASE("reference: INT_MIN / -1 in the text form is INT_MIN and x / 0 is -1", "[reference][integers]") {
  const Graph g = parse_graph(R"(
mesh x=2
%a = constant i32[4] value=-2147483648
%b = constant i32[4] value=-1
%z = constant i32[4] value=0
%q = div(%a, %b)
%r = div(%b, %z)
%s = add(%q, %b)
%p = mul(%a, %b)
output %q, %r, %s, %p
)");
  const std::vector<HostTensor> out = run_reference(g, {});
  REQUIRE(out.size() == 4);
  CHECK(values(out[0]) == std::vector<int32_t>(4, kMin));
  CHECK(values(out[1]) == std::vector<int32_t>(4, -1));
  CHECK(values(out[2]) == std::vector<int32_t>(4, kMax));
  CHECK(values(out[3]) == std::vector<int32_t>(4, kMin));
}

TEST_CASE("partitioned i32 programs equal the reference element for element", "[integration][integers]") {
  // Random i32 inputs lie in [0, 8): the divisors hit 0, and a sharded reduced dim makes the
  // sum partial (an all-reduce of wrapped sums must equal the wrapped total).
  const Graph g = parse_graph(R"(
mesh x=2, y=2
%a = input i32[8,6] sharding=[{x}, {}]
%b = input i32[8,6] sharding=[{}, {y}]
%big = constant i32[] value=2147483647
%m = mul(%a, %big)
%d = div(%m, %b)
%s = reduce_sum(%m) dims=[0]
%n = neg(%d)
output %d, %s, %n
)");
  Executable exe = compile(g, *g.mesh);
  for (uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    const std::vector<HostTensor> in = random_inputs(g, seed);
    const std::vector<HostTensor> got = exe.run(in);
    const std::vector<HostTensor> want = run_reference(g, in);
    REQUIRE(got.size() == want.size());
    for (std::size_t o = 0; o < got.size(); ++o) CHECK(values(got[o]) == values(want[o]));
  }
}
