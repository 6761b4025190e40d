// src/runtime/cpu/cpu_kernels_nn.cpp — the CPU kernels of the neural-network ops: softmax
// and layer_norm (short softmax rows and f32 layer_norm on oneDNN, else hand-written loops),
// layer_norm_grad, embedding, cross_entropy, softmax_grad, cross_entropy_grad and
// causal_mask. Kernels whose result depends on a block's place (embedding, cross_entropy and
// its grad, causal_mask) read the global offsets from KernelArgs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Dense>

#include "tessel/runtime/tensor.hpp"

#include "cpu_elementwise.hpp"
#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"
#include "onednn_ops.hpp"

namespace tessel::cpu_detail {

// ---- normalisations and the NN ops -------------------------------------------------------------

namespace {

// Softmax rows shorter than this run on oneDNN, longer ones on the hand-written loops:
// BM_SoftmaxRows and BM_RowOp measured oneDNN faster up to 64 floats a row, the loops faster
// from 512 on, and 128-256 either way from run to run; the GPT-2 block's rows of 256 went to
// the loops in all three BM_RowOp runs (docs/cpu-backend.md).
constexpr int64_t kSoftmaxOnednnBelowLen = 256;

}  // namespace

// The last axis of a softmax operand, when that softmax runs on oneDNN (see above).
bool softmax_on_onednn(const KernelArgs& a) {
  if (!a.attrs || a.in_shapes.size() != 1 || a.in_shapes[0].empty()) return false;
  const Shape& s = a.in_shapes[0];
  const int64_t axis = a.attrs->axis < 0 ? a.attrs->axis + static_cast<int64_t>(s.size()) : a.attrs->axis;
  return axis == static_cast<int64_t>(s.size()) - 1 && s.back() < kSoftmaxOnednnBelowLen;
}

// onednn: try oneDNN first (the kernel table); false: the hand-written loops only (the oracle).
void softmax_kernel(const KernelArgs& a, bool onednn) {
  check_arity(a, 1, 1);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (s != a.out_shape) fail(a, "operand and result shapes differ");
  const int64_t axis = normalize_dim(a, at.axis, s.size(), "softmax axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (std::size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[axis];
  if (onednn && inner == 1 && softmax_on_onednn(a) && onednn_softmax(a)) return;  // f32, short rows
  FVec ib, ob;
  const float* x = in_f32(a, 0, ib);
  float* y = out_f32(a, ob);
  softmax_f32(x, y, outer, len, inner);
  finish_out(a, ob);
}

void layer_norm_kernel(const KernelArgs& a, bool onednn) {
  check_arity(a, 3, 3);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (s.empty()) fail(a, "layer_norm needs rank >= 1");
  if (s != a.out_shape) fail(a, "operand and result shapes differ");
  const int64_t D = s.back();
  if (num_elements(a.in_shapes[1]) != D || num_elements(a.in_shapes[2]) != D)
    fail(a, "gamma and beta must have " + std::to_string(D) + " elements (the last dim)");
  if (onednn && onednn_layer_norm(a)) return;  // f32: 6-8x faster (docs/cpu-backend.md)
  FVec b0, b1, b2, ob;
  const float* x = in_f32(a, 0, b0);
  const float* g = in_f32(a, 1, b1);
  const float* be = in_f32(a, 2, b2);
  float* y = out_f32(a, ob);
  const int64_t rows = D > 0 ? num_elements(s) / D : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    // Two-pass statistics in double: exact enough that the result does not depend on how
    // rows are laid out, and cheap next to the matrix products around it.
    double mean = 0.0;
    for (int64_t j = 0; j < D; ++j) mean += xr[j];
    mean /= double(D);
    double var = 0.0;
    for (int64_t j = 0; j < D; ++j) {
      const double d = xr[j] - mean;
      var += d * d;
    }
    var /= double(D);  // biased, like PyTorch
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + at.eps));
    const float m = static_cast<float>(mean);
    for (int64_t j = 0; j < D; ++j) yr[j] = (xr[j] - m) * rstd * g[j] + be[j];
  }
  finish_out(a, ob);
}

void k_softmax(const KernelArgs& a) { softmax_kernel(a, true); }
void k_layer_norm(const KernelArgs& a) { layer_norm_kernel(a, true); }

// layer_norm's backward, per row with k_layer_norm's statistics: xhat = (x - mean) * rstd,
// g = dy * gamma, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dgamma = sum over rows of
// dy * xhat (terms with dy = 0 skipped) and dbeta = sum over rows of dy (in double).
void k_layer_norm_grad(const KernelArgs& a) {
  check_arity(a, 3, 3);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (s.empty()) fail(a, "layer_norm_grad needs rank >= 1");
  if (a.extra_out.size() != 2 || a.extra_out_shapes.size() != 2 || a.extra_out_dtypes.size() != 2)
    fail(a, "layer_norm_grad writes three results (dx, dgamma, dbeta)");
  const int64_t D = s.back();
  if (a.in_shapes[2] != s || a.out_shape != s) fail(a, "x, dy and dx must have one shape");
  if (num_elements(a.in_shapes[1]) != D || num_elements(a.extra_out_shapes[0]) != D ||
      num_elements(a.extra_out_shapes[1]) != D)
    fail(a, "gamma, dgamma and dbeta must have " + std::to_string(D) + " elements (the last dim)");
  FVec b0, b1, b2, ob, gb, bb;
  const float* x = in_f32(a, 0, b0);
  const float* gamma = in_f32(a, 1, b1);
  const float* dy = in_f32(a, 2, b2);
  float* dx = out_f32(a, ob);
  float* dgamma = result_f32(a, a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], gb);
  float* dbeta = result_f32(a, a.extra_out[1], a.extra_out_shapes[1], a.extra_out_dtypes[1], bb);
  // Per row in double, with Eigen's vectorised reductions (the scalar double loops were 6% of the
  // gpt example's step); the row sums are added in packets, so in another order than one by one.
  Eigen::ArrayXd sum_g = Eigen::ArrayXd::Zero(D), sum_b = Eigen::ArrayXd::Zero(D);
  Eigen::ArrayXd xd(D), xhat(D), gd(D);
  const Eigen::ArrayXd gam = Eigen::Map<const Eigen::ArrayXf>(gamma, D).cast<double>();
  const int64_t rows = D > 0 ? num_elements(s) / D : 0;
  for (int64_t r = 0; r < rows; ++r) {
    Eigen::Map<const Eigen::ArrayXf> xr(x + r * D, D), dyr(dy + r * D, D);
    xd = xr.cast<double>();
    const double mean = xd.sum() / double(D);
    const double var = (xd - mean).square().sum() / double(D);
    const double rstd = 1.0 / std::sqrt(var + at.eps);
    xhat = (xd - mean) * rstd;
    gd = dyr.cast<double>() * gam;
    const double mg = gd.sum() / double(D), mgx = (gd * xhat).sum() / double(D);
    // A zero gradient contributes nothing, even where the row is degenerate (constant with
    // eps = 0, as the zero rows padding an uneven split are): 0 * NaN would poison the sum.
    sum_g += (dyr != 0.0f).select(dyr.cast<double>() * xhat, 0.0);
    sum_b += dyr.cast<double>();
    Eigen::Map<Eigen::ArrayXf>(dx + r * D, D) = (rstd * (gd - mg - xhat * mgx)).cast<float>();
  }
  for (int64_t j = 0; j < D; ++j) {
    dgamma[j] = static_cast<float>(sum_g[j]);
    dbeta[j] = static_cast<float>(sum_b[j]);
  }
  finish_out(a, ob);
  finish_result(a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], gb);
  finish_result(a.extra_out[1], a.extra_out_shapes[1], a.extra_out_dtypes[1], bb);
}


void k_embedding(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const Shape& ts = a.in_shapes[0];
  const Shape& ids_shape = a.in_shapes[1];
  if (ts.size() != 2) fail(a, "the table must be rank 2 [V, D]");
  if (a.in_dtypes[1] != DType::i32) fail(a, "ids must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the table dtype");
  Shape expect = ids_shape;
  expect.push_back(ts[1]);
  if (a.out_shape != expect) fail(a, "the result shape must be ids shape + [D] = " + shape_str(expect));
  const int64_t V = ts[0], D = ts[1];
  const int64_t off = a.in_offsets.size() > 0 && !a.in_offsets[0].empty() ? a.in_offsets[0][0] : 0;
  const std::size_t row_bytes = static_cast<std::size_t>(D) * dtype_size(a.out_dtype);
  const int32_t* ids = static_cast<const int32_t*>(a.in[1]);
  const char* table = static_cast<const char*>(a.in[0]);
  char* out = static_cast<char*>(a.out);
  const int64_t n = num_elements(ids_shape);
  // The global row count: given with the offsets by the executor; the local one for an
  // unsharded call; unknown (no upper check) for a sharded call that did not give it.
  const int64_t V_global = !a.in_global_shapes.empty() ? a.in_global_shapes[0].at(0)
                           : off == 0                   ? V
                                                        : std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V_global)
      fail(a, "id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                  " is outside the table's rows [0, " + std::to_string(V_global) +
                  "); check the ids (tessel does not clamp them)");
    const int64_t r = int64_t(ids[i]) - off;
    // A row outside this table shard contributes zeros: the partitioner sums the shards
    // (Megatron's vocab-parallel embedding).
    if (r >= 0 && r < V) std::memcpy(out + i * row_bytes, table + r * row_bytes, row_bytes);
    else std::memset(out + i * row_bytes, 0, row_bytes);
  }
}

void k_cross_entropy(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const Shape& ls = a.in_shapes[0];
  if (ls.empty()) fail(a, "logits must have rank >= 1");
  if (a.in_dtypes[1] != DType::i32) fail(a, "labels must be i32");
  const Shape prefix(ls.begin(), ls.end() - 1);
  if (a.in_shapes[1] != prefix) fail(a, "labels shape must be the logits shape without its last dim");
  if (a.out_shape != prefix) fail(a, "the result shape must be the labels shape");
  const int64_t V = ls.back();
  const int64_t off = a.in_offsets.size() > 0 && !a.in_offsets[0].empty() ? a.in_offsets[0].back() : 0;
  FVec b0, ob;
  const float* x = in_f32(a, 0, b0);
  const int32_t* labels = static_cast<const int32_t*>(a.in[1]);
  float* y = out_f32(a, ob);
  const int64_t rows = num_elements(prefix);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t lab = int64_t(labels[r]) - off;
    if (lab < 0 || lab >= V)
      fail(a, "label " + std::to_string(labels[r]) + " at position " + std::to_string(r) +
                  " is outside the vocabulary [" + std::to_string(off) + ", " +
                  std::to_string(off + V) + ")");
    const float* xr = x + r * V;
    const float m = MaxR::row(xr, V);
    const float lse = m + std::log((Eigen::Map<const Eigen::ArrayXf>(xr, V) - m).exp().sum());
    y[r] = lse - xr[lab];
  }
  finish_out(a, ob);
}

// softmax's backward, fused: dx = y (dy - sum(dy y, axis)), one sweep for the row sums and one
// for the result (the composed form made three temporaries of the operand's size).
void k_softmax_grad(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const Shape& s = a.in_shapes[0];
  if (a.in_shapes[1] != s || s != a.out_shape) fail(a, "y, dy and the result must have the same shape");
  const int64_t axis = normalize_dim(a, attrs_of(a).axis, s.size(), "softmax_grad axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[static_cast<std::size_t>(axis)];
  FVec b0, b1, ob;
  const float* y = in_f32(a, 0, b0);
  const float* dy = in_f32(a, 1, b1);
  float* dx = out_f32(a, ob);
  if (inner == 1) {
    // The usual case (the last axis): per row a vectorised dot product and one vectorised pass
    // (the strided loop below ran one scalar sum per element: 6% of the gpt example's step).
    for (int64_t o = 0; o < outer && len > 0; ++o) {
      Eigen::Map<const Eigen::ArrayXf> yr(y + o * len, len), dyr(dy + o * len, len);
      const float sum = (dyr * yr).sum();
      Eigen::Map<Eigen::ArrayXf>(dx + o * len, len) = yr * (dyr - sum);
    }
    finish_out(a, ob);
    return;
  }
  FVec sum(static_cast<std::size_t>(inner));
  for (int64_t o = 0; o < outer && len > 0; ++o) {
    const int64_t base = o * len * inner;
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t l = 0; l < len; ++l)
      for (int64_t i = 0; i < inner; ++i) sum[static_cast<std::size_t>(i)] += dy[base + l * inner + i] * y[base + l * inner + i];
    for (int64_t l = 0; l < len; ++l)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t j = base + l * inner + i;
        dx[j] = y[j] * (dy[j] - sum[static_cast<std::size_t>(i)]);
      }
  }
  finish_out(a, ob);
}

// cross_entropy's backward, fused: dlogits = (softmax(logits) - one_hot(label)) g per row, in
// f32; labels are global class ids (offset by the block's place, as the forward kernel).
void k_cross_entropy_grad(const KernelArgs& a) {
  check_arity(a, 3, 3);
  const Shape& ls = a.in_shapes[0];
  if (ls.empty()) fail(a, "logits must have rank >= 1");
  if (a.in_dtypes[1] != DType::i32) fail(a, "labels must be i32");
  if (a.in_dtypes[2] != DType::f32) fail(a, "g must be f32");
  const Shape prefix(ls.begin(), ls.end() - 1);
  if (a.in_shapes[1] != prefix || a.in_shapes[2] != prefix) fail(a, "labels and g must have the logits shape without its last dim");
  if (a.out_shape != ls) fail(a, "the result must have the logits' shape");
  const int64_t V = ls.back();
  const int64_t off = a.in_offsets.size() > 0 && !a.in_offsets[0].empty() ? a.in_offsets[0].back() : 0;
  FVec b0, ob;
  const float* x = in_f32(a, 0, b0);
  const int32_t* labels = static_cast<const int32_t*>(a.in[1]);
  const float* g = static_cast<const float*>(a.in[2]);
  float* dx = out_f32(a, ob);
  const int64_t rows = num_elements(prefix);
  for (int64_t r = 0; r < rows && V > 0; ++r) {
    const int64_t lab = int64_t(labels[r]) - off;
    if (lab < 0 || lab >= V)
      fail(a, "label " + std::to_string(labels[r]) + " at position " + std::to_string(r) +
                  " is outside the vocabulary [" + std::to_string(off) + ", " + std::to_string(off + V) + ")");
    const float* xr = x + r * V;
    float* dr = dx + r * V;
    const float m = MaxR::row(xr, V);
    Eigen::Map<Eigen::ArrayXf> d(dr, V);
    d = (Eigen::Map<const Eigen::ArrayXf>(xr, V) - m).exp();
    d *= g[r] / d.sum();
    dr[lab] -= g[r];
  }
  finish_out(a, ob);
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

void k_causal_mask(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const Shape& s = a.in_shapes[0];
  if (s.size() < 2) fail(a, "causal_mask needs rank >= 2 [..., Q, K]");
  if (s != a.out_shape) fail(a, "operand and result shapes differ");
  const std::size_t r = s.size();
  int64_t qoff = 0, koff = 0;
  if (!a.in_offsets.empty() && !a.in_offsets[0].empty()) {
    if (a.in_offsets[0].size() != r) fail(a, "in_offsets[0] must have one entry per dim");
    qoff = a.in_offsets[0][r - 2];
    koff = a.in_offsets[0][r - 1];
  }
  const int64_t Q = s[r - 2], K = s[r - 1];
  const int64_t mats = (Q > 0 && K > 0) ? num_elements(s) / (Q * K) : 0;
  auto run = [&](auto tag, auto neg_inf) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.in[0]);
    T* y = static_cast<T*>(a.out);
    if (y != x) std::memmove(y, x, static_cast<std::size_t>(num_elements(s)) * sizeof(T));
    for (int64_t m = 0; m < mats; ++m)
      for (int64_t q = 0; q < Q; ++q) {
        // Masked where k + koff > q + qoff.
        const int64_t k0 = std::max<int64_t>(0, std::min<int64_t>(K, q + qoff - koff + 1));
        T* row = y + (m * Q + q) * K;
        std::fill(row + k0, row + K, static_cast<T>(neg_inf));
      }
  };
  switch (a.out_dtype) {
    case DType::f32: run(float{}, -kInf); break;
    case DType::bf16: run(uint16_t{}, uint16_t{0xff80}); break;
    case DType::f16: run(uint16_t{}, uint16_t{0xfc00}); break;
    case DType::i32: fail(a, "causal_mask needs a float type");
  }
}

}  // namespace tessel::cpu_detail
