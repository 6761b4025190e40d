// tests/unit/test_kernels.cpp — every CPU kernel against a naive loop implementation on
// seeded random data (the seed is printed on failure), the error paths, the bf16/f16
// conversions, and the reference executor on small graphs computed by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessel/ops/builders.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/tensor.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

HostTensor rand_tensor(std::mt19937_64& rng, DType t, const Shape& s, double lo = -1.0,
                       double hi = 1.0) {
  HostTensor x(t, s);
  std::uniform_real_distribution<double> d(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, t == DType::i32 ? std::floor(d(rng)) : d(rng));
  return x;
}

HostTensor from_values(DType t, const Shape& s, const std::vector<double>& v) {
  HostTensor x(t, s);
  REQUIRE(static_cast<int64_t>(v.size()) == x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, v[i]);
  return x;
}

// Runs one kernel on the given operands (tessel_test::run_cpu_op: the result poisoned first).
HostTensor run(OpKind kind, const OpAttrs& attrs, const std::vector<const HostTensor*>& in,
               DType out_dtype, const Shape& out_shape,
               std::vector<std::vector<int64_t>> offsets = {}, int threads = 1) {
  return tessel_test::run_cpu_op(kind, attrs, in, out_dtype, out_shape, std::move(offsets), threads);
}

void require_close(const HostTensor& got, const HostTensor& want, double rtol = 1e-5,
                   double atol = 1e-5) {
  REQUIRE(got.shape() == want.shape());
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    bool ok;
    if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w)) ok = g == w;
    else ok = std::isfinite(g) && std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok && bad++ < 5) {
      INFO("element " << i << ": got " << g << ", want " << w);
      CHECK(ok);
    }
  }
  REQUIRE(bad == 0);
}

// Calls f(index) for every multi-index of `s` in row-major order.
void for_each_index(const Shape& s, const std::function<void(const std::vector<int64_t>&)>& f) {
  for (int64_t d : s)
    if (d == 0) return;
  std::vector<int64_t> idx(s.size(), 0);
  for (;;) {
    f(idx);
    std::size_t d = s.size();
    for (; d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
    if (d == std::size_t(-1)) return;
  }
}

int64_t flat(const std::vector<int64_t>& idx, const Shape& s) {
  const auto st = contiguous_strides(s);
  int64_t o = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) o += idx[i] * st[i];
  return o;
}

// Naive einsum over every assignment of every letter ("a,b->c" with explicit arrow).
HostTensor naive_einsum(const std::string& eq, const std::vector<const HostTensor*>& in) {
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow), res = eq.substr(arrow + 2);
  std::vector<std::string> subs;
  std::size_t st = 0;
  for (;;) {
    auto c = lhs.find(',', st);
    subs.push_back(lhs.substr(st, c == std::string::npos ? std::string::npos : c - st));
    if (c == std::string::npos) break;
    st = c + 1;
  }
  std::map<char, int64_t> size;
  for (std::size_t i = 0; i < subs.size(); ++i)
    for (std::size_t d = 0; d < subs[i].size(); ++d) size[subs[i][d]] = in[i]->shape()[d];
  std::string letters;
  Shape space;
  for (auto& kv : size) {
    letters += kv.first;
    space.push_back(kv.second);
  }
  Shape out_shape;
  for (char c : res) out_shape.push_back(size[c]);
  std::vector<double> acc(static_cast<std::size_t>(num_elements(out_shape)), 0.0);
  auto pick = [&](const std::string& sub, const std::vector<int64_t>& idx) {
    std::vector<int64_t> r;
    for (char c : sub) r.push_back(idx[letters.find(c)]);
    return r;
  };
  for_each_index(space, [&](const std::vector<int64_t>& idx) {
    double p = 1.0;
    for (std::size_t i = 0; i < subs.size(); ++i) p *= in[i]->get(flat(pick(subs[i], idx), in[i]->shape()));
    acc[flat(pick(res, idx), out_shape)] += p;
  });
  HostTensor out(DType::f32, out_shape);
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, acc[i]);
  return out;
}

}  // namespace

TEST_CASE("einsum matches a naive loop for every letter classification", "[kernels][einsum]") {
  const uint64_t seed = GENERATE(1u, 2u);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{5, 7}, {7, 3}}},                      // matmul
      {"bsd,df->bsf", {{2, 3, 4}, {4, 6}}},                 // activations x weight
      {"bij,bjk->bik", {{3, 4, 5}, {3, 5, 2}}},             // batched
      {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},    // attention scores (B transposed)
      {"bhqk,bhkd->bhqd", {{2, 3, 4, 6}, {2, 3, 6, 5}}},    // attention values
      {"bsd,bsf->df", {{2, 3, 4}, {2, 3, 5}}},              // weight gradient (A transposed)
      {"bsf,df->bsd", {{2, 3, 5}, {4, 5}}},                 // data gradient
      {"ij,kj->ki", {{4, 5}, {3, 5}}},                      // transposed result
      {"abc,cbd->dab", {{2, 3, 4}, {4, 3, 5}}},             // needs permutations
      {"sbd,bdf->bfs", {{3, 2, 4}, {2, 4, 5}}},             // batch not leading
      {"ijk,jl->il", {{3, 4, 5}, {4, 2}}},                  // k summed in A only
      {"ij,jkl->i", {{3, 4}, {4, 2, 5}}},                   // k, l summed in B only
      {"i,j->ij", {{4}, {5}}},                              // outer product, K = 1
      {"ij,j->i", {{4, 5}, {5}}},                           // matvec
      {"i,i->", {{7}, {7}}},                                // dot
      {"bij,bij->b", {{3, 4, 5}, {3, 4, 5}}},               // only batch + contract
      {"ij->j", {{4, 5}}},                                  // single operand sum
      {"ij->ji", {{4, 5}}},                                 // single operand transpose
      {"ijk->", {{2, 3, 4}}},                               // full sum
      {"ijk->ki", {{2, 3, 4}}},                             // sum + permute
      {"ij->ij", {{3, 4}}},                                 // identity
  };
  for (const auto& c : cases) {
    INFO("equation " << c.eq);
    std::vector<HostTensor> ins;
    for (const auto& s : c.shapes) ins.push_back(rand_tensor(rng, DType::f32, s));
    std::vector<const HostTensor*> ptrs;
    for (auto& t : ins) ptrs.push_back(&t);
    const HostTensor want = naive_einsum(c.eq, ptrs);
    OpAttrs at;
    at.equation = c.eq;
    require_close(run(OpKind::Einsum, at, ptrs, DType::f32, want.shape()), want);
  }
}

TEST_CASE("einsum: implicit form / spaces / large threaded GEMM / bf16", "[kernels][einsum]") {
  const uint64_t seed = 7;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  {
    HostTensor a = rand_tensor(rng, DType::f32, {3, 4}), b = rand_tensor(rng, DType::f32, {4, 5});
    OpAttrs at;
    at.equation = " ij , jk ";  // implicit: result "ik"
    require_close(run(OpKind::Einsum, at, {&a, &b}, DType::f32, {3, 5}),
                  naive_einsum("ij,jk->ik", {&a, &b}));
  }
  {
    // 2*2*96*160*128 flops > the threading threshold; also exercises row blocking (batch < threads).
    HostTensor a = rand_tensor(rng, DType::f32, {2, 96, 128}), b = rand_tensor(rng, DType::f32, {2, 128, 160});
    OpAttrs at;
    at.equation = "bij,bjk->bik";
    HostTensor one = run(OpKind::Einsum, at, {&a, &b}, DType::f32, {2, 96, 160}, {}, 1);
    HostTensor four = run(OpKind::Einsum, at, {&a, &b}, DType::f32, {2, 96, 160}, {}, 4);
    require_close(one, naive_einsum("bij,bjk->bik", {&a, &b}), 1e-4, 1e-4);
    require_close(four, one, 1e-5, 1e-5);
    at.equation = "bji,bjk->bki";  // transposed A and C with threads
    HostTensor at_ = rand_tensor(rng, DType::f32, {2, 128, 96});
    require_close(run(OpKind::Einsum, at, {&at_, &b}, DType::f32, {2, 160, 96}, {}, 3),
                  naive_einsum("bji,bjk->bki", {&at_, &b}), 1e-4, 1e-4);
  }
  {
    HostTensor a = rand_tensor(rng, DType::bf16, {3, 8}), b = rand_tensor(rng, DType::bf16, {8, 4});
    OpAttrs at;
    at.equation = "ij,jk->ik";
    HostTensor got = run(OpKind::Einsum, at, {&a, &b}, DType::bf16, {3, 4});
    require_close(got, naive_einsum("ij,jk->ik", {&a, &b}), 1e-2, 1e-2);
  }
  {
    // Zero-size contraction gives zeros.
    HostTensor a(DType::f32, {3, 0}), b(DType::f32, {0, 2});
    OpAttrs at;
    at.equation = "ij,jk->ik";
    require_close(run(OpKind::Einsum, at, {&a, &b}, DType::f32, {3, 2}),
                  from_values(DType::f32, {3, 2}, {0, 0, 0, 0, 0, 0}));
  }
}

TEST_CASE("unary kernels match std functions", "[kernels][elementwise]") {
  const uint64_t seed = 11;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostTensor x = rand_tensor(rng, DType::f32, {4, 33}, -3.0, 3.0);
  HostTensor pos = rand_tensor(rng, DType::f32, {4, 33}, 0.1, 5.0);
  struct U {
    OpKind k;
    std::function<double(double)> f;
    bool positive;
  };
  const std::vector<U> us = {
      {OpKind::Neg, [](double v) { return -v; }, false},
      {OpKind::Exp, [](double v) { return std::exp(v); }, false},
      {OpKind::Log, [](double v) { return std::log(v); }, true},
      {OpKind::Tanh, [](double v) { return std::tanh(v); }, false},
      {OpKind::Gelu,
       [](double v) {
         return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
       },
       false},
      {OpKind::Relu, [](double v) { return v > 0 ? v : 0.0; }, false},
      {OpKind::Sqrt, [](double v) { return std::sqrt(v); }, true},
      {OpKind::Rsqrt, [](double v) { return 1.0 / std::sqrt(v); }, true},
  };
  OpAttrs at;
  for (const auto& u : us) {
    INFO("kind " << static_cast<int>(u.k));
    const HostTensor& in = u.positive ? pos : x;
    HostTensor want(DType::f32, in.shape());
    for (int64_t i = 0; i < in.numel(); ++i) want.set(i, u.f(in.get(i)));
    require_close(run(u.k, at, {&in}, DType::f32, in.shape()), want, 2e-5, 2e-6);
  }
  // f16 path and i32 neg / relu.
  HostTensor h = rand_tensor(rng, DType::f16, {17}, -2.0, 2.0);
  HostTensor hw(DType::f16, {17});
  for (int64_t i = 0; i < 17; ++i) hw.set(i, std::exp(h.get(i)));
  require_close(run(OpKind::Exp, at, {&h}, DType::f16, {17}), hw, 1e-3, 1e-3);
  HostTensor iv = from_values(DType::i32, {4}, {-3, 0, 5, -1});
  require_close(run(OpKind::Neg, at, {&iv}, DType::i32, {4}), from_values(DType::i32, {4}, {3, 0, -5, 1}));
  require_close(run(OpKind::Relu, at, {&iv}, DType::i32, {4}), from_values(DType::i32, {4}, {0, 0, 5, 0}));
}

TEST_CASE("binary kernels broadcast like numpy", "[kernels][elementwise]") {
  const uint64_t seed = 13;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 4}, {3, 4}}, {{3, 4}, {}},     {{}, {3, 4}},        {{2, 3, 4}, {4}},
      {{4}, {2, 3, 4}}, {{3, 1, 5}, {4, 5}}, {{2, 1}, {1, 3}}, {{2, 3, 1}, {2, 1, 4}},
      {{1}, {5}},       {{2, 3, 4}, {3, 1}},
  };
  const std::vector<OpKind> kinds = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Max};
  auto apply = [](OpKind k, double x, double y) {
    switch (k) {
      case OpKind::Add: return x + y;
      case OpKind::Sub: return x - y;
      case OpKind::Mul: return x * y;
      case OpKind::Div: return x / y;
      default: return std::max(x, y);
    }
  };
  OpAttrs at;
  for (const auto& p : pairs) {
    const Shape& sa = p.first;
    const Shape& sb = p.second;
    Shape so(std::max(sa.size(), sb.size()), 1);
    for (std::size_t d = 0; d < so.size(); ++d) {
      const std::size_t da = d + sa.size(), db = d + sb.size();
      const int64_t ea = da >= so.size() ? sa[da - so.size()] : 1;
      const int64_t eb = db >= so.size() ? sb[db - so.size()] : 1;
      so[d] = std::max(ea, eb);
    }
    HostTensor a = rand_tensor(rng, DType::f32, sa, 0.5, 2.0), b = rand_tensor(rng, DType::f32, sb, 0.5, 2.0);
    for (OpKind k : kinds) {
      INFO("shapes " << shape_str(sa) << " " << shape_str(sb) << " kind " << static_cast<int>(k));
      HostTensor want(DType::f32, so);
      for_each_index(so, [&](const std::vector<int64_t>& idx) {
        auto proj = [&](const Shape& s) {
          std::vector<int64_t> r;
          for (std::size_t d = 0; d < s.size(); ++d) {
            const int64_t i = idx[so.size() - s.size() + d];
            r.push_back(s[d] == 1 ? 0 : i);
          }
          return flat(r, s);
        };
        want.set(flat(idx, so), apply(k, a.get(proj(sa)), b.get(proj(sb))));
      });
      require_close(run(k, at, {&a, &b}, DType::f32, so), want);
    }
  }
  HostTensor ia = from_values(DType::i32, {2, 2}, {1, 2, 3, 4}), ib = from_values(DType::i32, {2}, {10, -20});
  require_close(run(OpKind::Add, at, {&ia, &ib}, DType::i32, {2, 2}), from_values(DType::i32, {2, 2}, {11, -18, 13, -16}));
  require_close(run(OpKind::Max, at, {&ia, &ib}, DType::i32, {2, 2}), from_values(DType::i32, {2, 2}, {10, 2, 10, 4}));
}

TEST_CASE("reductions over any dims with and without keepdims", "[kernels][reduce]") {
  const uint64_t seed = 17;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Shape s = {3, 4, 5, 2};
  HostTensor x = rand_tensor(rng, DType::f32, s);
  const std::vector<std::vector<int64_t>> dim_sets = {{3}, {0}, {1, 2}, {0, 3}, {0, 1, 2, 3}, {-1, 1}, {}};
  for (const auto& dims : dim_sets) {
    for (bool keep : {false, true}) {
      for (OpKind k : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMean}) {
        INFO("dims " << shape_str(dims) << " keepdims " << keep << " kind " << static_cast<int>(k));
        std::vector<bool> red(s.size(), false);
        for (int64_t d : dims) red[d < 0 ? d + 4 : d] = true;
        Shape os, kept;
        int64_t count = 1;
        for (std::size_t d = 0; d < s.size(); ++d) {
          if (red[d]) {
            count *= s[d];
            if (keep) os.push_back(1);
          } else {
            os.push_back(s[d]);
            kept.push_back(s[d]);
          }
        }
        std::vector<double> acc(static_cast<std::size_t>(num_elements(kept)),
                                k == OpKind::ReduceMax ? -1e300 : 0.0);
        for_each_index(s, [&](const std::vector<int64_t>& idx) {
          std::vector<int64_t> ki;
          for (std::size_t d = 0; d < s.size(); ++d)
            if (!red[d]) ki.push_back(idx[d]);
          double& r = acc[flat(ki, kept)];
          const double v = x.get(flat(idx, s));
          r = k == OpKind::ReduceMax ? std::max(r, v) : r + v;
        });
        HostTensor want(DType::f32, os);
        for (int64_t i = 0; i < want.numel(); ++i)
          want.set(i, k == OpKind::ReduceMean ? acc[i] / double(count) : acc[i]);
        OpAttrs at;
        at.dims = dims;
        at.keepdims = keep;
        require_close(run(k, at, {&x}, DType::f32, os), want);
      }
    }
  }
  HostTensor iv = from_values(DType::i32, {2, 3}, {1, 2, 3, 4, 5, 6});
  OpAttrs at;
  at.dims = {1};
  require_close(run(OpKind::ReduceSum, at, {&iv}, DType::i32, {2}), from_values(DType::i32, {2}, {6, 15}));
  require_close(run(OpKind::ReduceMax, at, {&iv}, DType::i32, {2}), from_values(DType::i32, {2}, {3, 6}));
}

TEST_CASE("data movement: constant reshape transpose broadcast slice concat", "[kernels][copy]") {
  const uint64_t seed = 19;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (DType t : {DType::f32, DType::bf16, DType::i32}) {
    INFO("dtype " << dtype_name(t));
    HostTensor x = rand_tensor(rng, t, {2, 3, 4}, -50, 50);
    OpAttrs at;
    // constant
    at.scalar = 3.0;
    require_close(run(OpKind::Constant, at, {}, t, {2, 2}), from_values(t, {2, 2}, {3, 3, 3, 3}));
    // reshape and sharding constraint are plain copies
    require_close(run(OpKind::Reshape, at, {&x}, t, {6, 4}), from_values(t, {6, 4}, [&] {
                    std::vector<double> v;
                    for (int64_t i = 0; i < x.numel(); ++i) v.push_back(x.get(i));
                    return v;
                  }()));
    require_close(run(OpKind::ShardingConstraint, at, {&x}, t, {2, 3, 4}), x);
    // transpose: result dim i = operand dim perm[i]
    at.dims = {2, 0, 1};
    HostTensor tw(t, {4, 2, 3});
    for_each_index({4, 2, 3}, [&](const std::vector<int64_t>& i) {
      tw.set(flat(i, {4, 2, 3}), x.get(flat({i[1], i[2], i[0]}, {2, 3, 4})));
    });
    require_close(run(OpKind::Transpose, at, {&x}, t, {4, 2, 3}), tw);
    // broadcast [3,1] -> [2,3,4]
    HostTensor b = rand_tensor(rng, t, {3, 1}, -50, 50);
    HostTensor bw(t, {2, 3, 4});
    for_each_index({2, 3, 4}, [&](const std::vector<int64_t>& i) { bw.set(flat(i, {2, 3, 4}), b.get(i[1])); });
    require_close(run(OpKind::Broadcast, at, {&b}, t, {2, 3, 4}), bw);
    // slice
    at.starts = {1, 0, 1};
    at.limits = {2, 2, 4};
    HostTensor sw(t, {1, 2, 3});
    for_each_index({1, 2, 3}, [&](const std::vector<int64_t>& i) {
      sw.set(flat(i, {1, 2, 3}), x.get(flat({i[0] + 1, i[1], i[2] + 1}, {2, 3, 4})));
    });
    require_close(run(OpKind::Slice, at, {&x}, t, {1, 2, 3}), sw);
    // concat of three along axis 1
    HostTensor c1 = rand_tensor(rng, t, {2, 1, 4}, -50, 50), c2 = rand_tensor(rng, t, {2, 2, 4}, -50, 50);
    at.axis = 1;
    HostTensor cw(t, {2, 6, 4});
    for_each_index({2, 6, 4}, [&](const std::vector<int64_t>& i) {
      double v;
      if (i[1] < 3) v = x.get(flat(i, {2, 3, 4}));
      else if (i[1] < 4) v = c1.get(flat({i[0], 0, i[2]}, {2, 1, 4}));
      else v = c2.get(flat({i[0], i[1] - 4, i[2]}, {2, 2, 4}));
      cw.set(flat(i, {2, 6, 4}), v);
    });
    require_close(run(OpKind::Concat, at, {&x, &c1, &c2}, t, {2, 6, 4}), cw);
  }
}

TEST_CASE("softmax along any axis and masked rows give zeros", "[kernels][softmax]") {
  const uint64_t seed = 23;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Shape s = {3, 5, 4};
  HostTensor x = rand_tensor(rng, DType::f32, s, -4, 4);
  for (int64_t axis : {2, 1, 0, -1}) {
    INFO("axis " << axis);
    const int64_t ax = axis < 0 ? axis + 3 : axis;
    HostTensor want(DType::f32, s);
    for_each_index(s, [&](const std::vector<int64_t>& idx) {
      double m = -1e300, sum = 0;
      auto j = idx;
      for (j[ax] = 0; j[ax] < s[ax]; ++j[ax]) m = std::max(m, x.get(flat(j, s)));
      for (j[ax] = 0; j[ax] < s[ax]; ++j[ax]) sum += std::exp(x.get(flat(j, s)) - m);
      want.set(flat(idx, s), std::exp(x.get(flat(idx, s)) - m) / sum);
    });
    OpAttrs at;
    at.axis = axis;
    require_close(run(OpKind::Softmax, at, {&x}, DType::f32, s), want);
  }
  HostTensor m = from_values(DType::f32, {2, 3}, {-kInf, -kInf, -kInf, 0, -kInf, 0});
  OpAttrs at;
  at.axis = 1;
  require_close(run(OpKind::Softmax, at, {&m}, DType::f32, {2, 3}),
                from_values(DType::f32, {2, 3}, {0, 0, 0, 0.5, 0, 0.5}));
  at.axis = 0;
  HostTensor mt = from_values(DType::f32, {3, 2}, {-kInf, 0, -kInf, -kInf, -kInf, 0});
  require_close(run(OpKind::Softmax, at, {&mt}, DType::f32, {3, 2}),
                from_values(DType::f32, {3, 2}, {0, 0.5, 0, 0, 0, 0.5}));
}

TEST_CASE("layer_norm over the last dim with biased variance", "[kernels][layer_norm]") {
  const uint64_t seed = 29;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Shape s = {2, 3, 16};
  HostTensor x = rand_tensor(rng, DType::f32, s, -2, 3);
  HostTensor g = rand_tensor(rng, DType::f32, {16}), b = rand_tensor(rng, DType::f32, {16});
  OpAttrs at;
  at.eps = 1e-5;
  HostTensor want(DType::f32, s);
  for (int64_t r = 0; r < 6; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < 16; ++j) mean += x.get(r * 16 + j);
    mean /= 16;
    for (int64_t j = 0; j < 16; ++j) var += std::pow(x.get(r * 16 + j) - mean, 2);
    var /= 16;
    for (int64_t j = 0; j < 16; ++j)
      want.set(r * 16 + j, (x.get(r * 16 + j) - mean) / std::sqrt(var + 1e-5) * g.get(j) + b.get(j));
  }
  require_close(run(OpKind::LayerNorm, at, {&x, &g, &b}, DType::f32, s), want, 1e-5, 1e-5);
}

TEST_CASE("embedding gathers rows of a (possibly sharded) table", "[kernels][embedding]") {
  const uint64_t seed = 31;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t V = 10, D = 6, off = 4, Vl = 3;  // local rows [4, 7) of a 10-row table
  HostTensor table = rand_tensor(rng, DType::f32, {V, D});
  HostTensor shard(DType::f32, {Vl, D});
  std::memcpy(shard.data(), table.as<float>() + off * D, shard.bytes());
  HostTensor ids = from_values(DType::i32, {2, 4}, {0, 4, 5, 9, 6, 7, 3, 4});
  OpAttrs at;
  HostTensor full_want(DType::f32, {2, 4, D}), shard_want(DType::f32, {2, 4, D});
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t id = static_cast<int64_t>(ids.get(i));
    for (int64_t d = 0; d < D; ++d) {
      full_want.set(i * D + d, table.get(id * D + d));
      shard_want.set(i * D + d, (id >= off && id < off + Vl) ? table.get(id * D + d) : 0.0);
    }
  }
  require_close(run(OpKind::Embedding, at, {&table, &ids}, DType::f32, {2, 4, D}), full_want);
  require_close(run(OpKind::Embedding, at, {&shard, &ids}, DType::f32, {2, 4, D}, {{off, 0}, {0, 0}}),
                shard_want);
}

TEST_CASE("cross_entropy is logsumexp minus the label logit", "[kernels][cross_entropy]") {
  const uint64_t seed = 37;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t V = 11;
  HostTensor logits = rand_tensor(rng, DType::f32, {2, 3, V}, -20, 20);
  HostTensor labels(DType::i32, {2, 3});
  std::uniform_int_distribution<int> d(0, V - 1);
  for (int64_t i = 0; i < 6; ++i) labels.set(i, d(rng));
  HostTensor want(DType::f32, {2, 3});
  for (int64_t r = 0; r < 6; ++r) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, logits.get(r * V + j));
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits.get(r * V + j) - m);
    want.set(r, m + std::log(s) - logits.get(r * V + static_cast<int64_t>(labels.get(r))));
  }
  OpAttrs at;
  require_close(run(OpKind::CrossEntropy, at, {&logits, &labels}, DType::f32, {2, 3}), want, 1e-5, 1e-5);
  HostTensor bad = from_values(DType::i32, {2, 3}, {0, 1, 2, 3, 4, 11});
  REQUIRE_THROWS_AS(run(OpKind::CrossEntropy, at, {&logits, &bad}, DType::f32, {2, 3}), RuntimeError);
}

TEST_CASE("row maxima of reduce_max and softmax and cross_entropy at every length and NaN place", "[kernels][reduce]") {
  // The float row max is vectorised (16 floats at a time with a scalar tail): lengths around
  // the vector widths, the maximum and a NaN at the first, a middle and the last place, and
  // rows of -inf. reduce_max must return the largest element exactly and NaN where the row has
  // one; softmax and cross_entropy then agree with a double loop.
  const uint64_t seed = 59;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int64_t len : {1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 100}) {
    for (int64_t place : {int64_t(0), len / 2, len - 1}) {
      for (int what = 0; what < 3; ++what) {  // 0: max at `place`, 1: NaN there, 2: all -inf but +inf there
        INFO("length " << len << ", place " << place << ", case " << what);
        HostTensor x = rand_tensor(rng, DType::f32, {2, len}, -5, 5);
        if (what == 0) x.set(len + place, 9.5);
        if (what == 1) x.set(len + place, std::nan(""));
        if (what == 2)
          for (int64_t j = 0; j < len; ++j) x.set(len + j, j == place ? kInf : -kInf);
        OpAttrs at;
        at.dims = {1};
        HostTensor mx = run(OpKind::ReduceMax, at, {&x}, DType::f32, {2});
        for (int64_t r = 0; r < 2; ++r) {
          double want = -kInf;
          bool nan = false;
          for (int64_t j = 0; j < len; ++j) {
            nan = nan || std::isnan(x.get(r * len + j));
            want = std::max(want, x.get(r * len + j));
          }
          if (nan) CHECK(std::isnan(mx.get(r)));
          else CHECK(mx.get(r) == want);
        }
        if (what == 2) continue;  // inf - inf: softmax of such a row is NaN by definition
        OpAttrs sm;
        sm.axis = 1;
        HostTensor y = run(OpKind::Softmax, sm, {&x}, DType::f32, {2, len});
        HostTensor labels = from_values(DType::i32, {2}, {0, static_cast<double>(len - 1)});
        HostTensor ce = run(OpKind::CrossEntropy, OpAttrs{}, {&x, &labels}, DType::f32, {2});
        for (int64_t r = 0; r < 2; ++r) {
          double m = -1e300, sum = 0;
          bool nan = false;
          for (int64_t j = 0; j < len; ++j) {
            nan = nan || std::isnan(x.get(r * len + j));
            m = std::max(m, x.get(r * len + j));
          }
          for (int64_t j = 0; j < len; ++j) sum += std::exp(x.get(r * len + j) - m);
          const double lab = x.get(r * len + static_cast<int64_t>(labels.get(r)));
          if (nan) {
            // NaN where the NaN was; oneDNN's softmax (the last axis) leaves the others as
            // they come, the loops make the whole row NaN.
            CHECK(std::isnan(ce.get(r)));
            CHECK(std::isnan(y.get(r * len + place)));
            continue;
          }
          CHECK(std::fabs(ce.get(r) - (m + std::log(sum) - lab)) <= 1e-5 * (1 + std::fabs(m + std::log(sum) - lab)));
          for (int64_t j = 0; j < len; ++j) {
            const double want = std::exp(x.get(r * len + j) - m) / sum;
            CHECK(std::fabs(y.get(r * len + j) - want) <= 1e-6 + 1e-5 * want);
          }
        }
      }
    }
  }
}

TEST_CASE("causal_mask uses the global offsets of the local block", "[kernels][causal_mask]") {
  const uint64_t seed = 41;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Shape s = {2, 4, 5};
  HostTensor x = rand_tensor(rng, DType::f32, s);
  for (auto offs : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {4, 0}, {0, 5}, {8, 5}, {2, 3}}) {
    INFO("qoff " << offs.first << " koff " << offs.second);
    HostTensor want(DType::f32, s);
    for_each_index(s, [&](const std::vector<int64_t>& i) {
      const bool masked = i[2] + offs.second > i[1] + offs.first;
      want.set(flat(i, s), masked ? -INFINITY : x.get(flat(i, s)));
    });
    OpAttrs at;
    require_close(run(OpKind::CausalMask, at, {&x}, DType::f32, s, {{0, offs.first, offs.second}}), want);
  }
  HostTensor h = rand_tensor(rng, DType::bf16, {3, 3});
  OpAttrs at;
  HostTensor got = run(OpKind::CausalMask, at, {&h}, DType::bf16, {3, 3});
  REQUIRE(got.get(1) == -INFINITY);
  REQUIRE(got.get(3) == h.get(3));
}

TEST_CASE("bf16 / f16 conversions round to nearest even and survive round trips", "[kernels][tensor]") {
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  REQUIRE(f32_to_bf16(1.0f + 1.0f / 256.0f) == f32_to_bf16(1.0f));  // tie -> even
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256.0f)) == 1.0f + 4.0f / 256.0f);
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  REQUIRE(bf16_to_f32(f32_to_bf16(-INFINITY)) == -INFINITY);
  REQUIRE(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
  REQUIRE(f16_to_f32(f32_to_f16(65520.0f)) == INFINITY);
  REQUIRE(f16_to_f32(f32_to_f16(5.9604644775390625e-08f)) == 5.9604644775390625e-08f);  // min subnormal
  REQUIRE(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048.0f)) == 1.0f);                      // tie -> even
  REQUIRE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  // Every 16-bit pattern round-trips (NaNs stay NaN).
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const float fb = bf16_to_f32(h), fh = f16_to_f32(h);
    if (std::isnan(fb)) REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(fb))));
    else if (f32_to_bf16(fb) != h) FAIL("bf16 pattern " << v);
    if (std::isnan(fh)) REQUIRE(std::isnan(f16_to_f32(f32_to_f16(fh))));
    else if (f32_to_f16(fh) != h) FAIL("f16 pattern " << v);
  }
  const uint64_t seed = 43;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) {
    const float f = d(rng);
    REQUIRE(std::fabs(bf16_to_f32(f32_to_bf16(f)) - f) <= std::fabs(f) / 256.0f);
    REQUIRE(std::fabs(f16_to_f32(f32_to_f16(f)) - f) <= std::fabs(f) / 2048.0f);
  }
  HostTensor t(DType::bf16, {3});
  t.poison();
  REQUIRE(std::isnan(t.get(0)));
  t.set(1, 2.5);
  REQUIRE(t.get(1) == 2.5);
  HostTensor it(DType::i32, {2});
  it.poison();
  REQUIRE(it.get(0) == double(std::numeric_limits<int32_t>::min()));
  REQUIRE_THROWS_AS(it.get(2), RuntimeError);
}

TEST_CASE("kernel errors are RuntimeErrors naming the op", "[kernels][errors]") {
  OpAttrs at;
  HostTensor a(DType::f32, {2, 3}), b(DType::f32, {4, 5}), ia(DType::i32, {2, 3});
  KernelArgs in;
  in.kind = OpKind::Input;
  REQUIRE_FALSE(has_cpu_kernel(OpKind::Input));
  REQUIRE(has_cpu_kernel(OpKind::Einsum));
  REQUIRE(has_cpu_kernel(OpKind::ShardingConstraint));
  REQUIRE_THROWS_AS(run_cpu_kernel(in), RuntimeError);
  at.equation = "ij,jk->ik";
  REQUIRE_THROWS_WITH(run(OpKind::Einsum, at, {&a, &b}, DType::f32, {2, 5}),
                      Catch::Contains("einsum") && Catch::Contains("'j'"));
  at.equation = "ii->i";
  HostTensor sq(DType::f32, {3, 3});
  REQUIRE_THROWS_AS(run(OpKind::Einsum, at, {&sq}, DType::f32, {3}), RuntimeError);
  REQUIRE_THROWS_WITH(run(OpKind::Add, at, {&a, &b}, DType::f32, {2, 3}), Catch::Contains("broadcast"));
  REQUIRE_THROWS_AS(run(OpKind::Exp, at, {&ia}, DType::i32, {2, 3}), RuntimeError);
  REQUIRE_THROWS_AS(run(OpKind::Add, at, {&a, &ia}, DType::f32, {2, 3}), RuntimeError);
  REQUIRE_THROWS_AS(run(OpKind::Neg, at, {&a, &a}, DType::f32, {2, 3}), RuntimeError);
  at.dims = {5};
  REQUIRE_THROWS_AS(run(OpKind::ReduceSum, at, {&a}, DType::f32, {2}), RuntimeError);
  KernelArgs noattrs;
  noattrs.kind = OpKind::Softmax;
  noattrs.in = {a.data()};
  noattrs.in_shapes = {a.shape()};
  noattrs.in_dtypes = {a.dtype()};
  noattrs.out = a.data();
  noattrs.out_shape = a.shape();
  REQUIRE_THROWS_AS(run_cpu_kernel(noattrs), RuntimeError);
}

TEST_CASE("kernels are safe to call from many threads at once", "[kernels][threads]") {
  const uint64_t seed = 53;
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostTensor a = rand_tensor(rng, DType::f32, {4, 16, 32}), b = rand_tensor(rng, DType::f32, {4, 24, 32});
  OpAttrs ein;
  ein.equation = "bqd,bkd->bqk";
  OpAttrs sm;
  sm.axis = 2;
  const HostTensor s0 = run(OpKind::Einsum, ein, {&a, &b}, DType::f32, {4, 16, 24});
  const HostTensor p0 = run(OpKind::Softmax, sm, {&s0}, DType::f32, {4, 16, 24});
  std::vector<HostTensor> res(8);
  std::vector<std::thread> th;
  for (int t = 0; t < 8; ++t)
    th.emplace_back([&, t] {
      for (int it = 0; it < 20; ++it) {
        const HostTensor s = run(OpKind::Einsum, ein, {&a, &b}, DType::f32, {4, 16, 24}, {}, 2);
        res[t] = run(OpKind::Softmax, sm, {&s}, DType::f32, {4, 16, 24});
      }
    });
  for (auto& x : th) x.join();
  for (const auto& r : res) REQUIRE(std::memcmp(r.data(), p0.data(), p0.bytes()) == 0);
}

TEST_CASE("run_reference computes a 2-layer MLP like hand-written loops", "[reference]") {
  const uint64_t seed = 47;
  INFO("seed " << seed);
  Graph g;
  const int64_t B = 3, D = 4, F = 5;
  auto x = input(g, "x", DType::f32, {B, D});
  auto w1 = input(g, "w1", DType::f32, {D, F});
  auto b1 = input(g, "b1", DType::f32, {F});
  auto w2 = input(g, "w2", DType::f32, {F, D});
  auto h = relu(einsum("bd,df->bf", x, w1) + b1);
  auto y = einsum("bf,fd->bd", h, w2);
  auto loss = reduce_mean(y * y, {0, 1});
  g.mark_output(y);
  g.mark_output(loss);
  const auto in = random_inputs(g, seed);
  REQUIRE(in.size() == 4);
  const auto out = run_reference(g, in);
  REQUIRE(out.size() == 2);
  HostTensor want(DType::f32, {B, D});
  double l = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> hh(F);
    for (int64_t f = 0; f < F; ++f) {
      double s = in[2].get(f);
      for (int64_t d = 0; d < D; ++d) s += in[0].get(b * D + d) * in[1].get(d * F + f);
      hh[f] = s > 0 ? s : 0;
    }
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int64_t f = 0; f < F; ++f) s += hh[f] * in[3].get(f * D + d);
      want.set(b * D + d, s);
      l += s * s;
    }
  }
  require_close(out[0], want);
  REQUIRE(out[1].shape() == Shape{});
  REQUIRE(out[1].get(0) == Approx(l / double(B * D)).epsilon(1e-5));
  // Same seed, same inputs; different seed, different inputs.
  const auto again = random_inputs(g, seed);
  REQUIRE(std::memcmp(again[0].data(), in[0].data(), in[0].bytes()) == 0);
  REQUIRE(std::memcmp(random_inputs(g, seed + 1)[0].data(), in[0].data(), in[0].bytes()) != 0);
  // Input validation names the input.
  auto wrong = in;
  wrong[1] = HostTensor(DType::f32, {F, D});
  REQUIRE_THROWS_WITH(run_reference(g, wrong), Catch::Contains("w1") && Catch::Contains("f32[4,5]"));
  REQUIRE_THROWS_AS(run_reference(g, {in[0]}), RuntimeError);
}

TEST_CASE("random_inputs bounds ids and labels by their use", "[reference]") {
  Graph g;
  auto table = input(g, "table", DType::f32, {7, 4});
  auto ids = input(g, "ids", DType::i32, {64});
  auto labels = input(g, "labels", DType::i32, {2, 32});
  auto other = input(g, "other", DType::i32, {64});
  auto e = embedding(table, reshape(ids, {2, 32}));
  auto lg = einsum("bsd,vd->bsv", e, table);
  auto ce = cross_entropy(lg, labels);
  g.mark_output(ce);
  g.mark_output(other);
  const auto in = random_inputs(g, 5);
  for (int64_t i = 0; i < 64; ++i) {
    REQUIRE(in[1].get(i) >= 0);
    REQUIRE(in[1].get(i) < 7);
    REQUIRE(in[2].get(i) < 7);
    REQUIRE(in[3].get(i) < 8);
  }
  const auto out = run_reference(g, in);
  REQUIRE(out[0].shape() == Shape{2, 32});
  for (int64_t i = 0; i < 64; ++i) REQUIRE(std::isfinite(out[0].get(i)));
  REQUIRE(std::memcmp(out[1].data(), in[3].data(), in[3].bytes()) == 0);
}
