// The ops added through the registry alone (docs/adding-an-op.md): each kernel against a
// hand-computed expectation through the reference executor (the CPU kernels on global
// shapes), including the edge cases each op documents. Partitioned == reference for these
// ops is covered by the registry-driven property test.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "tessel/ops/builders.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/executable.hpp"
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

TEST_CASE("ops: cast between f32 bf16 f16 and i32", "[ops][kernels]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {9});
    HostTensor in = tensor_of(DType::f32, {9}, {1.9, -1.9, 0.5, -0.0, 3e9, -3e9, inf, -inf, nan});
    // Truncation toward zero, saturation at the i32 range, NaN -> 0.
    check_values(run1(g, cast(x, DType::i32), {in}),
                 {1, -1, 0, 0, 2147483647, -2147483648.0, 2147483647, -2147483648.0, 0}, 0);
  }
  {
    Graph g;
    Tensor x = input(g, "x", DType::i32, {4});
    HostTensor in = tensor_of(DType::i32, {4}, {0, -7, 16777217, -2147483648.0});
    check_values(run1(g, cast(x, DType::f32), {in}), {0, -7, 16777216, -2147483648.0}, 0);
  }
  for (DType to : {DType::bf16, DType::f16}) {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {4});
    Tensor back = cast(cast(x, to), DType::f32);
    HostTensor in = tensor_of(DType::f32, {4}, {1.0, -2.5, 0.1, 1000.0});
    check_values(run1(g, back, {in}), {1.0, -2.5, 0.1, 1000.0}, to == DType::bf16 ? 4e-3 : 1e-3);
  }
  Graph g;
  Tensor x = input(g, "x", DType::f32, {2});
  CHECK(cast(x, DType::f16).dtype() == DType::f16);
  CHECK_THROWS_AS(cast(x, static_cast<DType>(17)), ShapeError);
}

TEST_CASE("ops: comparisons broadcast and return i32 0 or 1 and NaN is unordered", "[ops][kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Graph g;
  Tensor a = input(g, "a", DType::f32, {2, 3});
  Tensor b = input(g, "b", DType::f32, {3});
  std::vector<Tensor> outs = {eq(a, b), ne(a, b), lt(a, b), le(a, b), gt(a, b), ge(a, b)};
  for (Tensor t : outs) {
    CHECK(t.dtype() == DType::i32);
    CHECK(t.shape() == Shape{2, 3});
    g.mark_output(t);
  }
  HostTensor ha = tensor_of(DType::f32, {2, 3}, {1, 2, 3, nan, 5, -1});
  HostTensor hb = tensor_of(DType::f32, {3}, {1, 5, 0});
  auto out = run_reference(g, {ha, hb});
  check_values(out[0], {1, 0, 0, 0, 1, 0}, 0);
  check_values(out[1], {0, 1, 1, 1, 0, 1}, 0);
  check_values(out[2], {0, 1, 0, 0, 0, 1}, 0);
  check_values(out[3], {1, 1, 0, 0, 1, 1}, 0);
  check_values(out[4], {0, 0, 1, 0, 0, 0}, 0);
  check_values(out[5], {1, 0, 1, 0, 1, 0}, 0);
  Graph h;
  Tensor i = input(h, "i", DType::i32, {3});
  Tensor f = input(h, "f", DType::f32, {3});
  try {
    lt(i, f);
    FAIL("mixed dtypes accepted");
  } catch (const ShapeError& e) {
    CHECK(std::string(e.what()).rfind("lt(", 0) == 0);  // names the op
  }
}

TEST_CASE("ops: where selects with broadcasting", "[ops][kernels]") {
  Graph g;
  Tensor c = input(g, "c", DType::i32, {2, 1});
  Tensor a = input(g, "a", DType::f32, {2, 3});
  Tensor b = input(g, "b", DType::f32, {});
  Tensor w = where(c, a, b);
  CHECK(w.shape() == Shape{2, 3});
  HostTensor hc = tensor_of(DType::i32, {2, 1}, {0, -5});
  HostTensor ha = tensor_of(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor hb = tensor_of(DType::f32, {}, {9});
  check_values(run1(g, w, {hc, ha, hb}), {9, 9, 9, 4, 5, 6}, 0);
  Graph h;
  Tensor fc = input(h, "fc", DType::f32, {2});
  Tensor x = input(h, "x", DType::f32, {2});
  CHECK_THROWS_AS(where(fc, x, x), ShapeError);
  CHECK_THROWS_AS(where(cast(fc, DType::i32), x, cast(x, DType::bf16)), ShapeError);
}

TEST_CASE("ops: an out-of-range embedding id is an error in the reference and partitioned", "[ops][embedding]") {
  Graph g;
  Tensor table = input(g, "table", DType::f32, {16, 4});
  Tensor ids = input(g, "ids", DType::i32, {2, 3});
  g.mark_output(embedding(table, ids));
  g.annotate(table, Sharding::parse("[{x}, {}]"));
  HostTensor t(DType::f32, {16, 4});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  for (double bad : {16.0, -1.0, 1000.0}) {
    INFO("id " << bad);
    HostTensor id = tensor_of(DType::i32, {2, 3}, {0, 3, 15, 7, bad, 2});
    try {
      run_reference(g, {t, id});
      FAIL("reference accepted");
    } catch (const RuntimeError& e) {
      CHECK(std::string(e.what()).find("outside the table's rows [0, 16)") != std::string::npos);
    }
    Executable exe = compile(g, Mesh::parse("x=4"));
    try {
      exe.run({t, id});
      FAIL("partitioned run accepted");
    } catch (const RuntimeError& e) {
      CHECK(std::string(e.what()).find("outside the table's rows [0, 16)") != std::string::npos);
    }
  }
  HostTensor ok = tensor_of(DType::i32, {2, 3}, {0, 3, 15, 7, 8, 2});
  Executable exe = compile(g, Mesh::parse("x=4"));
  auto got = exe.run({t, ok});
  auto want = run_reference(g, {t, ok});
  for (int64_t i = 0; i < want[0].numel(); ++i) CHECK(got[0].get(i) == want[0].get(i));
}

TEST_CASE("ops: one_hot with out-of-range ids gives zero rows", "[ops][kernels]") {
  Graph g;
  Tensor ids = input(g, "ids", DType::i32, {4});
  Tensor oh = one_hot(ids, 3, DType::bf16);
  CHECK(oh.shape() == Shape{4, 3});
  CHECK(oh.dtype() == DType::bf16);
  HostTensor hi = tensor_of(DType::i32, {4}, {2, 0, 3, -1});
  check_values(run1(g, oh, {hi}), {0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, 0);
  CHECK_THROWS_AS(one_hot(ids, 0), ShapeError);
  CHECK_THROWS_AS(one_hot(input(g, "f", DType::f32, {2}), 4), ShapeError);
}

TEST_CASE("ops: gather along an axis (numpy take)", "[ops][kernels]") {
  Graph g;
  Tensor t = input(g, "t", DType::f32, {2, 3, 2});
  Tensor ix = input(g, "ix", DType::i32, {2, 2});
  Tensor out = gather(t, ix, -2);
  CHECK(out.shape() == Shape{2, 2, 2, 2});
  std::vector<double> tv;
  for (int i = 0; i < 12; ++i) tv.push_back(i);
  HostTensor ht = tensor_of(DType::f32, {2, 3, 2}, tv);
  HostTensor hix = tensor_of(DType::i32, {2, 2}, {2, 0, 1, 1});
  // out[p, j0, j1, s] = t[p, ix[j0, j1], s]
  check_values(run1(g, out, {ht, hix}),
               {4, 5, 0, 1, 2, 3, 2, 3, 10, 11, 6, 7, 8, 9, 8, 9}, 0);
  HostTensor bad = tensor_of(DType::i32, {2, 2}, {2, 0, 3, 1});
  try {
    run_reference(g, {ht, bad});
    FAIL("accepted");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()).find("index 3 at position 2 is outside [0, 3)") != std::string::npos);
  }
}

TEST_CASE("ops: scatter_add is the adjoint of gather", "[ops][kernels]") {
  Graph g;
  Tensor u = input(g, "u", DType::f32, {3, 2});
  Tensor ix = input(g, "ix", DType::i32, {3});
  Tensor out = scatter_add(u, ix, 4, 0);
  CHECK(out.shape() == Shape{4, 2});
  HostTensor hu = tensor_of(DType::f32, {3, 2}, {1, 2, 3, 4, 5, 6});
  HostTensor hix = tensor_of(DType::i32, {3}, {2, 0, 2});
  check_values(run1(g, out, {hu, hix}), {3, 4, 0, 0, 6, 8, 0, 0}, 0);
  HostTensor bad = tensor_of(DType::i32, {3}, {2, 4, 0});
  CHECK_THROWS_AS(run_reference(g, {hu, bad}), RuntimeError);
  Graph h;
  Tensor uu = input(h, "uu", DType::f32, {3, 2});
  CHECK_THROWS_AS(scatter_add(uu, input(h, "i2", DType::i32, {2}), 4, 0), ShapeError);
}

TEST_CASE("ops: gather and scatter_add with sharded rows and indices match the reference", "[ops][partition]") {
  // The table's rows sharded (gather: partial sums) and scatter_add with the indices
  // sharded over data and the result rows over model: the embedding forward and backward.
  std::mt19937_64 rng(99);
  Graph g;
  Tensor table = input(g, "table", DType::f32, {16, 4});
  Tensor ids = input(g, "ids", DType::i32, {8});
  Tensor upd = input(g, "upd", DType::f32, {8, 4});
  g.mark_output(gather(table, ids, 0));
  g.mark_output(scatter_add(upd, ids, 16, 0));
  g.annotate(table, Sharding::parse("[{model}, {}]"));
  g.annotate(ids, Sharding::parse("[{data}]"));
  g.annotate(upd, Sharding::parse("[{data}, {}]"));
  Executable exe = compile(g, Mesh::parse("data=2,model=2"));
  auto in = random_inputs(g, 5);
  RunOptions ro;
  ro.poison = true;
  auto got = exe.run(in, ro);
  auto want = run_reference(g, in);
  for (std::size_t o = 0; o < 2; ++o)
    for (int64_t i = 0; i < want[o].numel(); ++i)
      CHECK(std::abs(got[o].get(i) - want[o].get(i)) <= 1e-6 * std::max(1.0, std::abs(want[o].get(i))));
}

// Regression (was fuzz/known/concat_shape_overflow.tsl): the concat shape rule added the
// extents before its "too large" check (signed overflow under UBSan, a negative shape). Inputs
// that large are now refused where they are declared (at most 2^50 bytes a value), and a
// concat whose result would exceed that is refused naming the op.
TEST_CASE("ops: concat of huge extents is refused before the sum overflows", "[ops][regression]") {
  Graph g;
  CHECK_THROWS_WITH(input(g, "big", DType::f32, {int64_t{1} << 62}),
                    Catch::Contains("input %big") && Catch::Contains("more bytes than an int64 counts"));
  Tensor a = input(g, "a", DType::f32, {int64_t{1} << 47});
  Tensor b = input(g, "b", DType::f32, {int64_t{1} << 47});
  Tensor c = input(g, "c", DType::f32, {int64_t{1} << 47});
  try {
    concat({a, b, c}, 0);
    FAIL("accepted");
  } catch (const ShapeError& e) {
    CHECK(std::string(e.what()).find("concat: its result: f32[422212465065984] is 1688849860263936 bytes, more than a "
                                     "value may hold (2^50 bytes = 1 PiB)") != std::string::npos);
  }
}

TEST_CASE("ops: write_at writes one row per leading index and refuses an index outside", "[ops][kernels]") {
  Graph g;
  Tensor dst = input(g, "dst", DType::f32, {2, 3, 2});  // [sequences, positions, features]
  Tensor pos = input(g, "pos", DType::i32, {2});
  Tensor val = input(g, "val", DType::f32, {2, 2});
  Tensor out = write_at(dst, pos, val, 1);
  CHECK(out.shape() == Shape{2, 3, 2});
  const HostTensor d = tensor_of(DType::f32, {2, 3, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const HostTensor v = tensor_of(DType::f32, {2, 2}, {-1, -2, -3, -4});
  check_values(run1(g, out, {d, tensor_of(DType::i32, {2}, {2, 0}), v}), {0, 1, 2, 3, -1, -2, -3, -4, 8, 9, 10, 11});
  CHECK_THROWS_WITH(run_reference(g, {d, tensor_of(DType::i32, {2}, {1, 3}), v}),
                    Catch::Contains("index 3 at position 1 is outside [0, 3)"));
  Graph bad;
  Tensor bd = input(bad, "dst", DType::f32, {2, 3, 2});
  CHECK_THROWS_WITH(write_at(bd, input(bad, "p", DType::i32, {3}), input(bad, "v", DType::f32, {2, 2}), 1),
                    Catch::Contains("indices must have dst's dims before axis 1: [2]"));
  CHECK_THROWS_WITH(write_at(bd, input(bad, "q", DType::i32, {2}), input(bad, "w", DType::f32, {2, 3}), 1),
                    Catch::Contains("values must have dst's dims without axis 1: [2,2]"));
}

TEST_CASE("ops: write_at along a split axis writes the row in the block that holds it", "[ops][kernels]") {
  // A whole slot of a cache [slots, positions] split over data: axis 0, a scalar index.
  Graph g;
  Tensor dst = input(g, "dst", DType::f32, {4, 3});
  Tensor slot = input(g, "slot", DType::i32, {});
  Tensor row = input(g, "row", DType::f32, {3});
  g.annotate(dst, Sharding::of({{"data"}, {}}));
  Tensor out = write_at(dst, slot, row, 0);
  g.mark_output(out);
  const std::vector<HostTensor> in = {tensor_of(DType::f32, {4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}),
                                      tensor_of(DType::i32, {}, {2}), tensor_of(DType::f32, {3}, {-1, -2, -3})};
  Executable exe = compile(g, Mesh::parse("data=2"));
  CHECK(exe.program().values[static_cast<std::size_t>(exe.program().inputs[0])].sharding.to_string() == "[{data}, {}]");
  check_values(exe.run(in).at(0), {0, 1, 2, 3, 4, 5, -1, -2, -3, 9, 10, 11});
  check_values(run_reference(g, in).at(0), {0, 1, 2, 3, 4, 5, -1, -2, -3, 9, 10, 11});
}
