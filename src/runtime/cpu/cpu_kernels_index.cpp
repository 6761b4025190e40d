// src/runtime/cpu/cpu_kernels_index.cpp — the CPU kernels of the index ops: one_hot, gather,
// scatter_add, mask_padding, write_at and sample_tokens. Indices and extents are global: a block of a sharded dim
// handles the positions that fall in it (zeros, or nothing, for the others); gather and
// scatter_add reject an index outside the dim, never clamp it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tessel/runtime/tensor.hpp"

#include "cpu_kernel_families.hpp"
#include "../sample_tokens_params.hpp"
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

// ---- sample_tokens ---------------------------------------------------------------------------

namespace {

// One row's token (docs/ir.md, sample_tokens): `buf` and `q` are scratch of V elements.
int32_t sample_row(const float* l, int64_t V, int32_t key, float temperature, int32_t top_k, float top_p,
                   std::vector<float>& buf, std::vector<double>& q) {
  float lmax = -std::numeric_limits<float>::infinity();
  int64_t finite = 0;
  for (int64_t v = 0; v < V; ++v)
    if (std::isfinite(l[v])) {
      ++finite;
      lmax = std::max(lmax, l[v]);
    }
  if (finite == 0) return static_cast<int32_t>(V);
  if (!(temperature > 0)) {  // greedy: the first maximum
    for (int64_t v = 0; v < V; ++v)
      if (l[v] == lmax) return static_cast<int32_t>(v);
  }
  // The top_k cut: at or above the k-th largest finite logit.
  float cut = -std::numeric_limits<float>::max();
  if (top_k > 0 && top_k < finite) {
    buf.clear();
    for (int64_t v = 0; v < V; ++v)
      if (std::isfinite(l[v])) buf.push_back(l[v]);
    std::nth_element(buf.begin(), buf.begin() + (top_k - 1), buf.end(), std::greater<float>());
    cut = buf[static_cast<std::size_t>(top_k - 1)];
  }
  const double T = temperature, top = lmax;
  double Z = 0;
  for (int64_t v = 0; v < V; ++v) {
    const bool in = std::isfinite(l[v]) && l[v] >= cut;
    Z += q[static_cast<std::size_t>(v)] = in ? std::exp((static_cast<double>(l[v]) - top) / T) : 0.0;
  }
  // The top_p cut: the largest logit whose tokens at or above it hold top_p of the mass.
  if (top_p <= 0) {
    cut = lmax;
  } else if (top_p < 1) {
    std::vector<int64_t> order;
    for (int64_t v = 0; v < V; ++v)
      if (std::isfinite(l[v]) && l[v] >= cut) order.push_back(v);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    double mass = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      mass += q[static_cast<std::size_t>(order[i])];
      const bool group_ends = i + 1 == order.size() || l[order[i + 1]] != l[order[i]];
      if (group_ends && mass >= static_cast<double>(top_p) * Z) {
        cut = l[order[i]];
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t v = 0; v < V; ++v)
    if (l[v] < cut) q[static_cast<std::size_t>(v)] = 0;
    else kept += q[static_cast<std::size_t>(v)];
  // The draw: the first id whose running mass (in id order) passes u of the kept mass.
  const double target = sample_uniform(key) * kept;
  double run = 0;
  int64_t last = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (q[static_cast<std::size_t>(v)] <= 0) continue;
    last = v;
    run += q[static_cast<std::size_t>(v)];
    if (run > target) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(last);  // rounding left the target at the end: the last kept token
}

}  // namespace

// Each row on its own (rows in parallel): a row's token depends on that row alone, so not on
// how the rows are split among devices.
void k_sample_tokens(const KernelArgs& a) {
  const SampleTokensParams p = sample_tokens_params(a, "cpu");
  FVec lbuf;
  const float* l = in_f32(a, 0, lbuf);
  const int32_t* key = static_cast<const int32_t*>(a.in[1]);
  const float* temp = static_cast<const float*>(a.in[2]);
  const int32_t* k = static_cast<const int32_t*>(a.in[3]);
  const float* top_p = static_cast<const float*>(a.in[4]);
  int32_t* out = static_cast<int32_t*>(a.out);
  parallel_units(p.rows, a.num_threads, [&](int64_t r) {
    std::vector<float> buf;
    std::vector<double> q(static_cast<std::size_t>(p.V));
    out[r] = sample_row(l + r * p.V, p.V, key[r], temp[r], k[r], top_p[r], buf, q);
  });
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
