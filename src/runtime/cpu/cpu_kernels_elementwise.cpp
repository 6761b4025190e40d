// src/runtime/cpu/cpu_kernels_elementwise.cpp — the CPU kernels of the elementwise ops: unary
// and binary math (the per-element code is cpu_elementwise.hpp's, shared with the fused
// kernels), cast, the comparisons and where. Binary ops, comparisons and where broadcast
// their operands (numpy rules) through the strided loop nest.
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessel/runtime/tensor.hpp"

#include "cpu_elementwise.hpp"
#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {

// ---- elementwise -------------------------------------------------------------------------------

void k_unary(const KernelArgs& a) {
  check_arity(a, 1, 1);
  const int64_t n = num_elements(a.out_shape);
  if (num_elements(a.in_shapes[0]) != n) fail(a, "operand and result sizes differ");
  if (a.in_dtypes[0] == DType::i32 || a.out_dtype == DType::i32) {
    if (a.in_dtypes[0] != DType::i32 || a.out_dtype != DType::i32)
      fail(a, "operand and result dtypes must both be i32 or both float");
    const int32_t* x = static_cast<const int32_t*>(a.in[0]);
    int32_t* y = static_cast<int32_t*>(a.out);
    if (a.kind == OpKind::Neg) {
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>(0u - static_cast<uint32_t>(x[i]));
    } else if (a.kind == OpKind::Relu) {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0;
    } else {
      fail(a, "i32 operands are only supported by neg and relu among unary ops");
    }
    return;
  }
  FVec ib, ob;
  const float* px = in_f32(a, 0, ib);
  float* py = out_f32(a, ob);
  if (!unary_f32(a.kind, px, py, n)) fail(a, "not a unary op");
  finish_out(a, ob);
}

namespace {

template <class T, class Op>
void binary_loop(const KernelArgs& a, const T* x, const T* y, T* out, Op op) {
  const Shape& os = a.out_shape;
  const auto sx = broadcast_strides(a, a.in_shapes[0], os, "lhs");
  const auto sy = broadcast_strides(a, a.in_shapes[1], os, "rhs");
  const int64_t n = num_elements(os);
  const int64_t nx = num_elements(a.in_shapes[0]), ny = num_elements(a.in_shapes[1]);
  // Fast paths: same size (contiguous), and scalar on either side.
  if (nx == n && ny == n) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
    return;
  }
  if (nx == n && ny == 1) {
    const T v = y[0];
    for (int64_t i = 0; i < n; ++i) out[i] = op(x[i], v);
    return;
  }
  if (nx == 1 && ny == n) {
    const T v = x[0];
    for (int64_t i = 0; i < n; ++i) out[i] = op(v, y[i]);
    return;
  }
  strided_loop<3>(os, {contiguous_strides(os), sx, sy},
                  [&](const std::array<int64_t, 3>& off, int64_t m,
                      const std::array<int64_t, 3>& s) {
                    T* o = out + off[0];
                    const T* px = x + off[1];
                    const T* py = y + off[2];
                    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
                      for (int64_t j = 0; j < m; ++j) o[j] = op(px[j], py[j]);
                    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
                      const T v = *py;
                      for (int64_t j = 0; j < m; ++j) o[j] = op(px[j], v);
                    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
                      const T v = *px;
                      for (int64_t j = 0; j < m; ++j) o[j] = op(v, py[j]);
                    } else {
                      for (int64_t j = 0; j < m; ++j)
                        o[j * s[0]] = op(px[j * s[1]], py[j * s[2]]);
                    }
                  });
}

template <class T, class F>
void with_binary_op(const KernelArgs& a, F&& f) {
  switch (a.kind) {
    case OpKind::Add: f(AddF{}); break;
    case OpKind::Sub: f(SubF{}); break;
    case OpKind::Mul: f(MulF{}); break;
    case OpKind::Div: f(DivF{}); break;
    case OpKind::Max: f(MaxF{}); break;
    default: fail(a, "not a binary op");
  }
}

}  // namespace

void k_binary(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const bool i0 = a.in_dtypes[0] == DType::i32, i1 = a.in_dtypes[1] == DType::i32;
  const bool io = a.out_dtype == DType::i32;
  if (i0 || i1 || io) {
    if (!(i0 && i1 && io)) fail(a, "i32 and float operands cannot be mixed");
    if (a.kind == OpKind::GeluGrad) fail(a, "gelu_grad needs float operands");
    const int32_t* x = static_cast<const int32_t*>(a.in[0]);
    const int32_t* y = static_cast<const int32_t*>(a.in[1]);
    int32_t* o = static_cast<int32_t*>(a.out);
    with_binary_op<int32_t>(a, [&](auto op) { binary_loop<int32_t>(a, x, y, o, op); });
    return;
  }
  FVec b0, b1, ob;
  const float* x = in_f32(a, 0, b0);
  const float* y = in_f32(a, 1, b1);
  float* o = out_f32(a, ob);
  if (a.kind == OpKind::GeluGrad) {
    // Vectorised over whole buffers (gelu_grad_f32): a broadcast operand is expanded first.
    const Shape& os = a.out_shape;
    const int64_t n = num_elements(os);
    FVec e0, e1;
    auto whole = [&](const float* p, std::size_t i, FVec& buf) {
      if (num_elements(a.in_shapes[i]) == n) return p;
      buf.resize(static_cast<std::size_t>(n));
      copy_strided<float>(p, broadcast_strides(a, a.in_shapes[i], os, i == 0 ? "lhs" : "rhs"), buf.data(),
                          contiguous_strides(os), os);
      return static_cast<const float*>(buf.data());
    };
    gelu_grad_f32(whole(x, 0, e0), whole(y, 1, e1), o, n);
  } else {
    with_binary_op<float>(a, [&](auto op) { binary_loop<float>(a, x, y, o, op); });
  }
  finish_out(a, ob);
}

// ---- cast, comparisons, where -------------------------------------------------------------

void k_cast(const KernelArgs& a) {
  check_arity(a, 1, 1);
  const int64_t n = num_elements(a.out_shape);
  if (num_elements(a.in_shapes[0]) != n) fail(a, "operand and result sizes differ");
  const DType from = a.in_dtypes[0], to = a.out_dtype;
  if (from == to) {
    if (n > 0) std::memcpy(a.out, a.in[0], static_cast<std::size_t>(n) * dtype_size(to));
    return;
  }
  if (from == DType::i32) {  // i32 -> float: through double, one rounding to f32
    const int32_t* x = static_cast<const int32_t*>(a.in[0]);
    FVec ob;
    float* y = out_f32(a, ob);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
    finish_out(a, ob);
    return;
  }
  FVec ib;
  const float* x = in_f32(a, 0, ib);
  if (to == DType::i32) {
    int32_t* y = static_cast<int32_t*>(a.out);
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_i32_sat(x[i]);
    return;
  }
  FVec ob;
  float* y = out_f32(a, ob);
  if (y != x) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
  finish_out(a, ob);
}

namespace {

template <class T>
void compare_loop(const KernelArgs& a, const T* x, const T* y, int32_t* out) {
  const Shape& os = a.out_shape;
  const auto sx = broadcast_strides(a, a.in_shapes[0], os, "lhs");
  const auto sy = broadcast_strides(a, a.in_shapes[1], os, "rhs");
  auto run = [&](auto cmp) {
    strided_loop<3>(os, {contiguous_strides(os), sx, sy},
                    [&](const std::array<int64_t, 3>& off, int64_t m, const std::array<int64_t, 3>& s) {
                      for (int64_t j = 0; j < m; ++j)
                        out[off[0] + j * s[0]] = cmp(x[off[1] + j * s[1]], y[off[2] + j * s[2]]) ? 1 : 0;
                    });
  };
  switch (a.kind) {
    case OpKind::Eq: run([](T p, T q) { return p == q; }); break;
    case OpKind::Ne: run([](T p, T q) { return p != q; }); break;
    case OpKind::Lt: run([](T p, T q) { return p < q; }); break;
    case OpKind::Le: run([](T p, T q) { return p <= q; }); break;
    case OpKind::Gt: run([](T p, T q) { return p > q; }); break;
    case OpKind::Ge: run([](T p, T q) { return p >= q; }); break;
    default: fail(a, "not a comparison");
  }
}

}  // namespace

void k_compare(const KernelArgs& a) {
  check_arity(a, 2, 2);
  if (a.out_dtype != DType::i32) fail(a, "a comparison produces i32");
  int32_t* o = static_cast<int32_t*>(a.out);
  const bool i0 = a.in_dtypes[0] == DType::i32, i1 = a.in_dtypes[1] == DType::i32;
  if (i0 != i1) fail(a, "i32 and float operands cannot be mixed");
  if (i0) {
    compare_loop<int32_t>(a, static_cast<const int32_t*>(a.in[0]), static_cast<const int32_t*>(a.in[1]), o);
    return;
  }
  FVec b0, b1;
  compare_loop<float>(a, in_f32(a, 0, b0), in_f32(a, 1, b1), o);
}

void k_where(const KernelArgs& a) {
  check_arity(a, 3, 3);
  if (a.in_dtypes[0] != DType::i32) fail(a, "the condition must be i32");
  if (a.in_dtypes[1] != a.out_dtype || a.in_dtypes[2] != a.out_dtype)
    fail(a, "both branches must have the result's dtype");
  const Shape& os = a.out_shape;
  const auto sc = broadcast_strides(a, a.in_shapes[0], os, "condition");
  const auto sx = broadcast_strides(a, a.in_shapes[1], os, "true branch");
  const auto sy = broadcast_strides(a, a.in_shapes[2], os, "false branch");
  const int32_t* c = static_cast<const int32_t*>(a.in[0]);
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.in[1]);
    const T* y = static_cast<const T*>(a.in[2]);
    T* o = static_cast<T*>(a.out);
    strided_loop<4>(os, {contiguous_strides(os), sc, sx, sy},
                    [&](const std::array<int64_t, 4>& off, int64_t m, const std::array<int64_t, 4>& s) {
                      for (int64_t j = 0; j < m; ++j)
                        o[off[0] + j * s[0]] = c[off[1] + j * s[1]] != 0 ? x[off[2] + j * s[2]]
                                                                          : y[off[3] + j * s[3]];
                    });
  });
}

}  // namespace tessel::cpu_detail
