// tests/unit/test_onednn_ops.cpp — softmax, layer_norm and GELU on oneDNN
// (src/runtime/cpu/onednn_ops.cpp) against the hand-written CPU kernels, their oracle, over random
// shapes and inputs; the cases oneDNN must decline (bf16/f16, empty tensors, softmax over a
// non-last axis) and the fully masked softmax row. Built without oneDNN every call declines.
//
// Tolerance: |oneDNN - hand-written| <= 2e-6 + 1e-5 |hand-written| per element. Both compute
// in f32 from the same inputs; they differ by summation order (softmax's sum, layer_norm's
// statistics: the hand-written kernel sums in double), by the exp/tanh approximations of the
// vectorised code, and (GELU) by the formula: oneDNN's 0.5x(1 + tanh z) against the kernel's
// x / (1 + exp(-2z)), which differ by cancellation for x << 0 where the value is below 1e-6.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "../../src/runtime/cpu/onednn_einsum.hpp"
#include "../../src/runtime/cpu/onednn_ops.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"

using namespace tessel;

namespace {

struct OpCall {
  OpAttrs at;
  KernelArgs k;
  HostTensor x, g, b;
};

// Args for `kind` on x (and gamma, beta for layer_norm), result into `out`.
void make_args(OpCall& c, OpKind kind, const HostTensor& x, HostTensor& out) {
  c.at.axis = static_cast<int64_t>(x.shape().size()) - 1;
  c.at.eps = 1e-5;
  c.k = KernelArgs{};
  c.k.kind = kind;
  c.k.attrs = &c.at;
  c.k.in = {x.data()};
  c.k.in_shapes = {x.shape()};
  c.k.in_dtypes = {x.dtype()};
  if (kind == OpKind::LayerNorm) {
    c.k.in.insert(c.k.in.end(), {c.g.data(), c.b.data()});
    c.k.in_shapes.insert(c.k.in_shapes.end(), {c.g.shape(), c.b.shape()});
    c.k.in_dtypes.insert(c.k.in_dtypes.end(), {c.g.dtype(), c.b.dtype()});
  }
  c.k.out = out.data();
  c.k.out_shape = x.shape();
  c.k.out_dtype = out.dtype();
}

bool run_onednn(const KernelArgs& k) {
  switch (k.kind) {
    case OpKind::Softmax: return onednn_softmax(k);
    case OpKind::LayerNorm: return onednn_layer_norm(k);
    default: return onednn_gelu(k);
  }
}

const char* name_of(OpKind k) {
  return k == OpKind::Softmax ? "softmax" : k == OpKind::LayerNorm ? "layer_norm" : "gelu";
}

}  // namespace

TEST_CASE("onednn ops: softmax layer_norm and gelu match the hand-written kernels on random shapes", "[kernels][onednn][property]") {
  const uint64_t seed = 20261123;
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (int iter = 0; iter < 120; ++iter) {
    const OpKind kind = iter % 3 == 0 ? OpKind::Softmax : iter % 3 == 1 ? OpKind::LayerNorm : OpKind::Gelu;
    const int rank = 1 + static_cast<int>(rng() % 4);
    Shape s;
    for (int d = 0; d < rank; ++d) s.push_back(1 + static_cast<int64_t>(rng() % (d == rank - 1 ? 300 : 9)));
    const double scale = iter % 4 == 0 ? 30.0 : 3.0;  // large inputs: softmax saturates, gelu tails
    std::uniform_real_distribution<double> dist(-scale, scale);
    OpCall c;
    HostTensor x(DType::f32, s), want(DType::f32, s), got(DType::f32, s);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, dist(rng));
    c.g = HostTensor(DType::f32, {s.back()});
    c.b = HostTensor(DType::f32, {s.back()});
    for (int64_t i = 0; i < s.back(); ++i) {
      c.g.set(i, 1.0 + 0.2 * dist(rng) / scale);
      c.b.set(i, 0.2 * dist(rng) / scale);
    }
    if (kind == OpKind::LayerNorm && iter % 5 == 0)  // a constant row: variance 0, only eps
      for (int64_t j = 0; j < s.back(); ++j) x.set(j, 1.5);
    make_args(c, kind, x, want);
    run_handwritten_kernel(c.k);
    make_args(c, kind, x, got);
    const bool ran = run_onednn(c.k);
    INFO(name_of(kind) << " " << shape_str(s));
    REQUIRE(ran == onednn_einsum_compiled());
    if (!ran) continue;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double w = want.get(i), g = got.get(i);
      INFO("element " << i << ": oneDNN " << g << ", hand-written " << w);
      REQUIRE(std::abs(g - w) <= 2e-6 + 1e-5 * std::abs(w));
    }
  }
}

TEST_CASE("onednn ops: a fully masked softmax row gives zeros as the hand-written kernel", "[kernels][onednn]") {
  HostTensor x(DType::f32, {3, 5}), want(DType::f32, {3, 5}), got(DType::f32, {3, 5});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, i / 5 == 1 ? -std::numeric_limits<double>::infinity() : 0.1 * double(i));
  x.set(12, -std::numeric_limits<double>::infinity());  // a partly masked row
  OpCall c;
  make_args(c, OpKind::Softmax, x, want);
  run_handwritten_kernel(c.k);
  make_args(c, OpKind::Softmax, x, got);
  if (!onednn_softmax(c.k)) {
    CHECK_FALSE(onednn_einsum_compiled());
    return;
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got.get(i) - want.get(i)) <= 2e-6 + 1e-5 * std::abs(want.get(i)));
    if (i / 5 == 1) CHECK(got.get(i) == 0.0);
  }
}

TEST_CASE("onednn ops: other dtypes and empty tensors and a non-last softmax axis are declined", "[kernels][onednn]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (OpKind kind : {OpKind::Softmax, OpKind::LayerNorm, OpKind::Gelu}) {
      OpCall c;
      HostTensor x(dt, {4, 8}), out(dt, {4, 8});
      c.g = HostTensor(dt, {8});
      c.b = HostTensor(dt, {8});
      make_args(c, kind, x, out);
      INFO(name_of(kind) << " " << dtype_name(dt));
      CHECK_FALSE(run_onednn(c.k));
    }
  }
  OpCall c;
  HostTensor x(DType::f32, {4, 0}), out(DType::f32, {4, 0});
  c.g = HostTensor(DType::f32, {0});
  c.b = HostTensor(DType::f32, {0});
  for (OpKind kind : {OpKind::Softmax, OpKind::LayerNorm, OpKind::Gelu}) {
    make_args(c, kind, x, out);
    CHECK_FALSE(run_onednn(c.k));
  }
  HostTensor y(DType::f32, {4, 8}), yo(DType::f32, {4, 8});
  make_args(c, OpKind::Softmax, y, yo);
  c.at.axis = 0;
  CHECK_FALSE(onednn_softmax(c.k));
}

TEST_CASE("onednn ops: the kernel table runs short softmax rows and layer_norm on oneDNN and the rest hand-written", "[kernels][onednn]") {
  // The measured decision (docs/cpu-backend.md): oneDNN where it won — softmax rows shorter
  // than 256 floats, layer_norm — and the hand-written kernels elsewhere (longer softmax rows,
  // GELU). Same bits as the chosen implementation called directly.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  for (int64_t len : {40, 256}) {
    for (OpKind kind : {OpKind::Softmax, OpKind::LayerNorm, OpKind::Gelu}) {
      OpCall c;
      HostTensor x(DType::f32, {6, len}), table(DType::f32, {6, len}), direct(DType::f32, {6, len});
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, dist(rng));
      c.g = HostTensor(DType::f32, {len});
      c.b = HostTensor(DType::f32, {len});
      for (int64_t i = 0; i < len; ++i) {
        c.g.set(i, 1.0 + 0.1 * dist(rng));
        c.b.set(i, 0.1 * dist(rng));
      }
      make_args(c, kind, x, table);
      run_cpu_kernel(c.k);
      make_args(c, kind, x, direct);
      const bool onednn = kind == OpKind::LayerNorm || (kind == OpKind::Softmax && len < 256);
      if (!onednn || !run_onednn(c.k)) run_handwritten_kernel(c.k);
      INFO(name_of(kind) << " rows of " << len);
      for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(table.get(i) == direct.get(i));
    }
  }
}
