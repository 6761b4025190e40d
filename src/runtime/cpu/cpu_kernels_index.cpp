// src/runtime/cpu/cpu_kernels_index.cpp — the CPU kernels of the index ops: one_hot, gather,
// scatter_add and mask_padding. Indices and extents are global: a block of a sharded dim
// handles the positions that fall in it (zeros, or nothing, for the others); gather and
// scatter_add reject an index outside the dim, never clamp it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tessel/runtime/tensor.hpp"

#include "cpu_kernel_families.hpp"
#include "../write_at_params.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {

// ---- one_hot, gather, scatter_add -----------------------------------------------------------

namespace {

// Offset of the result block along `dim` (0 when not given).
int64_t out_offset_at(const KernelArgs& a, std::size_t dim) {
  return dim < a.out_offset.size() ? a.out_offset[dim] : 0;
}

}  // namespace

void k_one_hot(const KernelArgs& a) {
  check_arity(a, 1, 1);
  if (a.in_dtypes[0] != DType::i32) fail(a, "ids must be i32");
  const OpAttrs& at = attrs_of(a);
  Shape expect = a.in_shapes[0];
  if (a.out_shape.empty()) fail(a, "the result must be [..., depth]");
  expect.push_back(a.out_shape.back());
  if (a.out_shape != expect) fail(a, "the result shape must be the ids shape + [classes]");
  const int64_t C = a.out_shape.back();
  const int64_t coff = out_offset_at(a, a.out_shape.size() - 1);
  if (coff < 0 || coff + C > at.depth) fail(a, "the result block lies outside [0, depth)");
  const int32_t* ids = static_cast<const int32_t*>(a.in[0]);
  const int64_t n = num_elements(a.in_shapes[0]);
  auto fill = [&](auto zero, auto one) {
    using T = decltype(zero);
    T* y = static_cast<T*>(a.out);
    std::fill(y, y + n * C, zero);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = int64_t(ids[i]) - coff;  // outside [0, C): another block's, or none
      if (c >= 0 && c < C) y[i * C + c] = one;
    }
  };
  switch (a.out_dtype) {
    case DType::f32: fill(0.0f, 1.0f); break;
    case DType::bf16: fill(uint16_t{0}, uint16_t{0x3f80}); break;
    case DType::f16: fill(uint16_t{0}, uint16_t{0x3c00}); break;
    case DType::i32: fill(int32_t{0}, int32_t{1}); break;
  }
}

namespace {

[[noreturn]] void index_fail(const KernelArgs& a, int32_t id, int64_t pos, int64_t bound) {
  fail(a, "index " + std::to_string(id) + " at position " + std::to_string(pos) +
              " is outside [0, " + std::to_string(bound) + "); check the indices (tessel does "
              "not clamp them)");
}

}  // namespace

void k_gather(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const OpAttrs& at = attrs_of(a);
  const Shape& t = a.in_shapes[0];
  const Shape& ix = a.in_shapes[1];
  if (a.in_dtypes[1] != DType::i32) fail(a, "indices must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the table's");
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, at.axis, t.size(), "axis"));
  Shape expect(t.begin(), t.begin() + static_cast<long>(ax));
  expect.insert(expect.end(), ix.begin(), ix.end());
  expect.insert(expect.end(), t.begin() + static_cast<long>(ax) + 1, t.end());
  if (a.out_shape != expect) fail(a, "the result shape must be " + shape_str(expect));
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= t[d];
  for (std::size_t d = ax + 1; d < t.size(); ++d) S *= t[d];
  const int64_t n = t[ax], J = num_elements(ix);
  const int64_t off = !a.in_offsets.empty() && a.in_offsets[0].size() == t.size() ? a.in_offsets[0][ax] : 0;
  const int64_t N = !a.in_global_shapes.empty() ? a.in_global_shapes[0].at(ax)
                    : off == 0                  ? n
                                                : std::numeric_limits<int64_t>::max();
  const int32_t* idx = static_cast<const int32_t*>(a.in[1]);
  for (int64_t j = 0; j < J; ++j)
    if (idx[j] < 0 || idx[j] >= N) index_fail(a, idx[j], j, N);
  const std::size_t es = dtype_size(a.out_dtype);
  const std::size_t row = static_cast<std::size_t>(S) * es;
  const char* src = static_cast<const char*>(a.in[0]);
  char* dst = static_cast<char*>(a.out);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < J; ++j) {
      char* o = dst + (p * J + j) * static_cast<int64_t>(row);
      const int64_t r = int64_t(idx[j]) - off;  // a row of another block contributes zeros
      if (r >= 0 && r < n) std::memcpy(o, src + (p * n + r) * static_cast<int64_t>(row), row);
      else std::memset(o, 0, row);
    }
}

// dst copied to out unless the two are one buffer (dst donated to the result), then each
// leading index's row written at its position along the axis when that position is in this
// block of it (indices are global positions).
void k_write_at(const KernelArgs& a) {
  const WriteAtParams w = write_at_params(a, "cpu");
  const int32_t* idx = static_cast<const int32_t*>(a.in[1]);
  for (int64_t p = 0; p < w.P; ++p)
    if (idx[p] < 0 || idx[p] >= w.N) index_fail(a, idx[p], p, w.N);
  const int64_t row = w.S * static_cast<int64_t>(w.elem);
  char* out = static_cast<char*>(a.out);
  if (a.out != a.in[0]) std::memcpy(out, a.in[0], static_cast<std::size_t>(w.P * w.n * row));
  const char* v = static_cast<const char*>(a.in[2]);
  for (int64_t p = 0; p < w.P; ++p) {
    const int64_t r = int64_t(idx[p]) - w.off;  // another block's position: not ours to write
    if (r >= 0 && r < w.n) std::memcpy(out + (p * w.n + r) * row, v + p * row, static_cast<std::size_t>(row));
  }
}

void k_scatter_add(const KernelArgs& a) {
  check_arity(a, 2, 2);
  const OpAttrs& at = attrs_of(a);
  const Shape& u = a.in_shapes[0];
  const Shape& ix = a.in_shapes[1];
  const Shape& os = a.out_shape;
  if (a.in_dtypes[1] != DType::i32) fail(a, "indices must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the updates'");
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, at.axis, os.size(), "axis"));
  Shape expect(u.begin(), u.begin() + static_cast<long>(std::min(ax, u.size())));
  if (u.size() < ax + ix.size()) fail(a, "updates have too few dims for the indices");
  expect.push_back(os[ax]);
  expect.insert(expect.end(), u.begin() + static_cast<long>(ax + ix.size()), u.end());
  if (os != expect) fail(a, "the result shape must be " + shape_str(expect));
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= os[d];
  for (std::size_t d = ax + 1; d < os.size(); ++d) S *= os[d];
  const int64_t n = os[ax], J = num_elements(ix);
  const int64_t off = out_offset_at(a, ax);
  const int32_t* idx = static_cast<const int32_t*>(a.in[1]);
  for (int64_t j = 0; j < J; ++j)
    if (idx[j] < 0 || idx[j] >= at.depth) index_fail(a, idx[j], j, at.depth);
  auto scatter = [&](const auto* x, auto* y, auto addf) {
    std::fill(y, y + P * n * S, static_cast<std::remove_reference_t<decltype(*y)>>(0));
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < J; ++j) {
        const int64_t r = int64_t(idx[j]) - off;  // another block's row: not ours to add
        if (r < 0 || r >= n) continue;
        const auto* xs = x + (p * J + j) * S;
        auto* ys = y + (p * n + r) * S;
        for (int64_t k = 0; k < S; ++k) ys[k] = addf(ys[k], xs[k]);
      }
  };
  if (a.out_dtype == DType::i32) {  // wrap-around, as i32 add
    scatter(static_cast<const int32_t*>(a.in[0]), static_cast<int32_t*>(a.out), [](int32_t p, int32_t q) {
      return static_cast<int32_t>(static_cast<uint32_t>(p) + static_cast<uint32_t>(q));
    });
    return;
  }
  FVec ib, ob;
  const float* x = in_f32(a, 0, ib);
  float* y = out_f32(a, ob);
  scatter(x, y, [](float p, float q) { return p + q; });
  finish_out(a, ob);
}

// Sets positions at or past the valid extent along the axis (global index, so any block of
// a split dim works) to the attribute's value, in the operand's dtype.
void k_mask_padding(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (s != a.out_shape) fail(a, "operand and result shapes differ");
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, at.axis, s.size(), "axis"));
  const int64_t off = !a.in_offsets.empty() && a.in_offsets[0].size() == s.size() ? a.in_offsets[0][ax] : 0;
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= s[d];
  for (std::size_t d = ax + 1; d < s.size(); ++d) S *= s[d];
  const int64_t n = s.empty() ? 1 : s[ax];
  const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(n, at.depth - off));  // valid rows here
  auto run = [&](auto fill) {
    using T = decltype(fill);
    const T* x = static_cast<const T*>(a.in[0]);
    T* y = static_cast<T*>(a.out);
    if (y != x) std::memmove(y, x, static_cast<std::size_t>(num_elements(s)) * sizeof(T));
    for (int64_t p = 0; p < P; ++p) std::fill(y + (p * n + keep) * S, y + (p + 1) * n * S, fill);
  };
  const double v = at.scalar;
  switch (a.out_dtype) {
    case DType::f32: run(static_cast<float>(v)); break;
    case DType::bf16: run(f32_to_bf16(static_cast<float>(v))); break;
    case DType::f16: run(f32_to_f16(static_cast<float>(v))); break;
    case DType::i32: run(v != v ? 0 : v <= -2147483648.0 ? std::numeric_limits<int32_t>::min()
                         : v >= 2147483647.0 ? std::numeric_limits<int32_t>::max()
                                             : static_cast<int32_t>(v)); break;
  }
}

}  // namespace tessel::cpu_detail
