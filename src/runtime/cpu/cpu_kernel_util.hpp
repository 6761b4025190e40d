// src/runtime/cpu/cpu_kernel_util.hpp — internal: what the CPU kernel families
// (cpu_kernels_<family>.cpp) share: the argument checks and their errors, the f32 views of
// float operands, and the strided loop nest with the copies and reductions built on it.
// Defined here (templates, one-liners) or in cpu_kernel_util.cpp.
//
// Design:
//  * Float math runs in f32. bf16/f16 operands are converted to f32 temporaries and the
//    result converted back, so every float dtype shares one implementation.
//  * Copying ops (reshape, transpose, broadcast, slice, concat, constraint, embedding rows,
//    causal mask) are dtype-generic by element size: no conversion, bit-exact.
//  * Everything strided (broadcasting binaries, reductions, permutations) goes through one
//    loop nest, `strided_loop`, that first drops size-1 dims and merges dims that are
//    contiguous for every operand, so the common cases (same shape, row broadcast, reduce
//    last dim) become one long contiguous inner loop.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <Eigen/Dense>

#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::cpu_detail {

// Kernel temporaries are 64-byte aligned like every buffer (see tensor.hpp): vectorised
// loops then split work the same way whatever the call, so results are bit-reproducible.
using FVec = std::vector<float, AlignedAllocator<float>>;

// ---- errors and argument checks ------------------------------------------------------------

[[noreturn]] void fail(const KernelArgs& a, const std::string& why);
void check_arity(const KernelArgs& a, std::size_t lo, std::size_t hi);
const OpAttrs& attrs_of(const KernelArgs& a);
int64_t normalize_dim(const KernelArgs& a, int64_t d, std::size_t rank, const char* what);
// Strides of an operand broadcast (numpy rules, right-aligned) to `out`; 0 where broadcast.
std::vector<int64_t> broadcast_strides(const KernelArgs& a, const Shape& in, const Shape& out,
                                       const char* what);
void check_same_dtype(const KernelArgs& a);

// ---- f32 views of float operands -----------------------------------------------------------

// Pointer to operand i as f32: the buffer itself for f32, a converted copy in `buf` for
// bf16/f16. i32 operands are an error for float ops.
const float* in_f32(const KernelArgs& a, std::size_t i, FVec& buf);

// Where to write an f32 result: the output buffer itself, or `buf` for bf16/f16 (then
// finish_out converts it).
// A float result (`out`, shape, dtype) as f32: the buffer itself, or `buf` to be converted by
// finish_result.
float* result_f32(const KernelArgs& a, void* out, const Shape& shape, DType dt, FVec& buf);
void finish_result(void* out, const Shape& shape, DType dt, const FVec& buf);

inline float* out_f32(const KernelArgs& a, FVec& buf) { return result_f32(a, a.out, a.out_shape, a.out_dtype, buf); }
inline void finish_out(const KernelArgs& a, const FVec& buf) { finish_result(a.out, a.out_shape, a.out_dtype, buf); }

// ---- the strided loop nest -----------------------------------------------------------------

// Visits the row-major index space `shape` for N operands with their own strides (in
// elements). Size-1 dims are dropped and adjacent dims that are contiguous for every operand
// are merged; then f(offsets, n, inner_strides) is called once per innermost run of n
// elements. An empty space (a zero dim) calls nothing; a scalar space calls once with n = 1.
template <std::size_t N, class F>
void strided_loop(const Shape& shape_in, const std::array<std::vector<int64_t>, N>& strides_in,
                  F&& f) {
  Shape shape;
  std::array<std::vector<int64_t>, N> st;
  for (std::size_t d = 0; d < shape_in.size(); ++d) {
    const int64_t n = shape_in[d];
    if (n == 0) return;
    if (n == 1) continue;
    if (!shape.empty()) {
      bool merge = true;
      for (std::size_t k = 0; k < N; ++k)
        if (st[k].back() != strides_in[k][d] * n) merge = false;
      if (merge) {
        shape.back() *= n;
        for (std::size_t k = 0; k < N; ++k) st[k].back() = strides_in[k][d];
        continue;
      }
    }
    shape.push_back(n);
    for (std::size_t k = 0; k < N; ++k) st[k].push_back(strides_in[k][d]);
  }
  std::array<int64_t, N> off{};
  std::array<int64_t, N> inner{};
  if (shape.empty()) {
    f(off, int64_t{1}, inner);
    return;
  }
  const std::size_t r = shape.size();
  for (std::size_t k = 0; k < N; ++k) inner[k] = st[k][r - 1];
  std::vector<int64_t> idx(r - 1, 0);
  for (;;) {
    f(off, shape[r - 1], inner);
    std::size_t d = r - 1;
    for (; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        for (std::size_t k = 0; k < N; ++k) off[k] += st[k][d];
        break;
      }
      for (std::size_t k = 0; k < N; ++k) off[k] -= st[k][d] * (shape[d] - 1);
      idx[d] = 0;
    }
    if (d == std::size_t(-1)) return;
  }
}

// out[shape] (with out_strides) = in[shape] (with in_strides).
template <class T>
void copy_strided(const T* in, const std::vector<int64_t>& in_strides, T* out,
                  const std::vector<int64_t>& out_strides, const Shape& shape) {
  strided_loop<2>(shape, {out_strides, in_strides},
                  [&](const std::array<int64_t, 2>& off, int64_t n,
                      const std::array<int64_t, 2>& s) {
                    T* o = out + off[0];
                    const T* i = in + off[1];
                    if (s[0] == 1 && s[1] == 1) {
                      std::memcpy(o, i, static_cast<std::size_t>(n) * sizeof(T));
                    } else {
                      for (int64_t j = 0; j < n; ++j) o[j * s[0]] = i[j * s[1]];
                    }
                  });
}

// Result dim i = operand dim perm[i].
template <class T>
void permute_copy(const T* in, const Shape& in_shape, const std::vector<int>& perm, T* out) {
  const auto cs = contiguous_strides(in_shape);
  Shape os(perm.size());
  std::vector<int64_t> is(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    os[i] = in_shape[perm[i]];
    is[i] = cs[perm[i]];
  }
  copy_strided<T>(in, is, out, contiguous_strides(os), os);
}

// Element-size dispatch for the dtype-generic copying ops.
template <class F>
void by_elem_size(const KernelArgs& a, DType t, F&& f) {
  switch (dtype_size(t)) {
    case 4: f(uint32_t{}); return;
    case 2: f(uint16_t{}); return;
    case 1: f(uint8_t{}); return;
    case 8: f(uint64_t{}); return;
    default: fail(a, std::string("unsupported element size of dtype ") + dtype_name(t));
  }
}

// ---- threads within one kernel ------------------------------------------------------------

// Runs fn(unit) for every unit in [0, units): on the calling thread alone when threads <= 1,
// else on up to `threads` threads (the caller and threads - 1 spawned ones) taking units in
// order from a shared counter. A thread that cannot be spawned leaves its share to the caller.
// Each unit must write only its own elements (then the result does not depend on the split).
template <class F>
void parallel_units(int64_t units, int threads, F&& fn) {
  if (threads <= 1 || units <= 1) {
    for (int64_t u = 0; u < units; ++u) fn(u);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t u; (u = next.fetch_add(1)) < units;) fn(u);
  };
  std::vector<std::thread> pool;
  const int64_t extra = std::min<int64_t>(threads, units) - 1;
  for (int64_t t = 0; t < extra; ++t) {
    try {
      pool.emplace_back(work);
    } catch (...) {
      break;  // cannot spawn more threads: the calling thread does the rest
    }
  }
  work();
  for (auto& th : pool) th.join();
}

// ---- reductions ----------------------------------------------------------------------------

// i32 sums wrap around modulo 2^32 like i32 add (docs/ir.md, "Integer semantics"): they
// accumulate in uint32, so the result does not depend on the order of the additions (and
// therefore not on the sharding) and there is no signed-overflow UB.
struct SumR {
  template <class T> static T identity() { return T(0); }
  template <class T> T operator()(T x, T y) const { return x + y; }
  int32_t operator()(int32_t x, int32_t y) const {
    return static_cast<int32_t>(uint32_t(x) + uint32_t(y));
  }
  template <class T> static T row(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, int32_t>) {
      uint32_t acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += static_cast<uint32_t>(p[j]);
      return static_cast<int32_t>(acc);
    } else {
      return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(p, n).sum();
    }
  }
};


// Reduces the contiguous input into `out` where input dim d lands at out stride
// out_strides[d] (0 for reduced dims, any permutation of the kept dims allowed).
template <class T, class R>
void reduce_into(const T* in, const Shape& in_shape, const std::vector<int64_t>& out_strides,
                 T* out, int64_t out_n, R r) {
  std::fill(out, out + out_n, R::template identity<T>());
  strided_loop<2>(in_shape, {contiguous_strides(in_shape), out_strides},
                  [&](const std::array<int64_t, 2>& off, int64_t n,
                      const std::array<int64_t, 2>& s) {
                    const T* i = in + off[0];
                    T* o = out + off[1];
                    if (s[1] == 0) {
                      T v;
                      if (s[0] == 1) {
                        v = R::row(i, n);
                      } else {
                        v = i[0];
                        for (int64_t j = 1; j < n; ++j) v = r(v, i[j * s[0]]);
                      }
                      *o = r(*o, v);
                    } else if (s[0] == 1 && s[1] == 1) {
                      for (int64_t j = 0; j < n; ++j) o[j] = r(o[j], i[j]);
                    } else {
                      for (int64_t j = 0; j < n; ++j) o[j * s[1]] = r(o[j * s[1]], i[j * s[0]]);
                    }
                  });
}

}  // namespace tessel::cpu_detail
