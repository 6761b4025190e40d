// src/runtime/cpu/cpu_kernels.cpp — the CPU kernels: one per OpKind, on dense row-major buffers
// of the shapes given in KernelArgs (local shapes in a partitioned run, global ones in the
// reference executor).
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
//  * Einsum = permute operands into [batch, free, contract] layouts (skipped when they are
//    already in such an order, either [.., free, contract] or [.., contract, free]: a
//    row-major buffer read as column-major is the transpose for free) + a batched GEMM with
//    Eigen (mapped matrices, .noalias(), so no temporaries) + a permutation of the result
//    when its letter order is not [batch, freeA, freeB] or [batch, freeB, freeA].
//  * With oneDNN (TESSEL_WITH_ONEDNN), a two-operand einsum that maps onto a batched matmul
//    runs as one, transposes folded into strides (onednn_einsum.cpp); the Eigen path is the
//    fallback for the rest and the test oracle.
//  * No global mutable state: many device threads call these kernels concurrently (the
//    oneDNN primitive cache is the one shared structure; it is behind a mutex).
#include "tessel/runtime/kernels.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <Eigen/Dense>

#include "tessel/ops/registry.hpp"
#include "tessel/runtime/tensor.hpp"

#include "cpu_elementwise.hpp"
#include "onednn_einsum.hpp"
#include "onednn_ops.hpp"

namespace tessel {
namespace {

using namespace cpu_detail;

// Kernel temporaries are 64-byte aligned like every buffer (see tensor.hpp): vectorised
// loops then split work the same way whatever the call, so results are bit-reproducible.
using FVec = std::vector<float, AlignedAllocator<float>>;

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- errors and argument checks ------------------------------------------------------------

std::string describe_args(const KernelArgs& a) {
  std::string s = op_name(a.kind);
  s += "(";
  for (std::size_t i = 0; i < a.in_shapes.size(); ++i) {
    if (i) s += ", ";
    s += i < a.in_dtypes.size() ? type_str(a.in_dtypes[i], a.in_shapes[i])
                                : "?" + shape_str(a.in_shapes[i]);
  }
  s += ") -> " + type_str(a.out_dtype, a.out_shape);
  return s;
}

[[noreturn]] void fail(const KernelArgs& a, const std::string& why) {
  throw RuntimeError("cpu kernel " + describe_args(a) + ": " + why);
}

void check_arity(const KernelArgs& a, std::size_t lo, std::size_t hi) {
  if (a.in_shapes.size() != a.in.size() || a.in_dtypes.size() != a.in.size())
    fail(a, "KernelArgs has " + std::to_string(a.in.size()) + " operand pointers but " +
                std::to_string(a.in_shapes.size()) + " shapes and " +
                std::to_string(a.in_dtypes.size()) + " dtypes");
  if (a.in.size() < lo || a.in.size() > hi)
    fail(a, "expected " +
                (lo == hi ? std::to_string(lo)
                          : std::to_string(lo) + ".." +
                                (hi == std::size_t(-1) ? std::string("n") : std::to_string(hi))) +
                " operands, got " + std::to_string(a.in.size()));
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    for (int64_t d : a.in_shapes[i])
      if (d < 0) fail(a, "operand " + std::to_string(i) + " has a negative dim");
    if (!a.in[i] && num_elements(a.in_shapes[i]) > 0)
      fail(a, "operand " + std::to_string(i) + " has a null data pointer");
  }
  for (int64_t d : a.out_shape)
    if (d < 0) fail(a, "result has a negative dim");
  if (!a.out && num_elements(a.out_shape) > 0) fail(a, "result has a null data pointer");
}

const OpAttrs& attrs_of(const KernelArgs& a) {
  if (!a.attrs) fail(a, "KernelArgs.attrs is null but this op needs its attributes");
  return *a.attrs;
}

int64_t normalize_dim(const KernelArgs& a, int64_t d, std::size_t rank, const char* what) {
  const int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= r)
    fail(a, std::string(what) + " " + std::to_string(d) + " is out of range for rank " +
                std::to_string(r));
  return d;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// ---- f32 views of float operands -----------------------------------------------------------

// Pointer to operand i as f32: the buffer itself for f32, a converted copy in `buf` for
// bf16/f16. i32 operands are an error for float ops.
const float* in_f32(const KernelArgs& a, std::size_t i, FVec& buf) {
  const DType t = a.in_dtypes[i];
  const int64_t n = num_elements(a.in_shapes[i]);
  switch (t) {
    case DType::f32: return static_cast<const float*>(a.in[i]);
    case DType::bf16: {
      buf.resize(static_cast<std::size_t>(n));
      const uint16_t* p = static_cast<const uint16_t*>(a.in[i]);
      for (int64_t j = 0; j < n; ++j) buf[j] = bf16_to_f32(p[j]);
      return buf.data();
    }
    case DType::f16: {
      buf.resize(static_cast<std::size_t>(n));
      const uint16_t* p = static_cast<const uint16_t*>(a.in[i]);
      for (int64_t j = 0; j < n; ++j) buf[j] = f16_to_f32(p[j]);
      return buf.data();
    }
    case DType::i32: break;
  }
  fail(a, "operand " + std::to_string(i) + " is i32 but this op needs a float type");
}

// Where to write an f32 result: the output buffer itself, or `buf` for bf16/f16 (then
// finish_out converts it).
// A float result (`out`, shape, dtype) as f32: the buffer itself, or `buf` to be converted by
// finish_result.
float* result_f32(const KernelArgs& a, void* out, const Shape& shape, DType dt, FVec& buf) {
  switch (dt) {
    case DType::f32: return static_cast<float*>(out);
    case DType::bf16:
    case DType::f16: buf.resize(static_cast<std::size_t>(num_elements(shape))); return buf.data();
    case DType::i32: break;
  }
  fail(a, "result is i32 but this op produces a float type");
}

void finish_result(void* out, const Shape& shape, DType dt, const FVec& buf) {
  const int64_t n = num_elements(shape);
  if (dt == DType::bf16) {
    uint16_t* p = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < n; ++j) p[j] = f32_to_bf16(buf[j]);
  } else if (dt == DType::f16) {
    uint16_t* p = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < n; ++j) p[j] = f32_to_f16(buf[j]);
  }
}

float* out_f32(const KernelArgs& a, FVec& buf) { return result_f32(a, a.out, a.out_shape, a.out_dtype, buf); }
void finish_out(const KernelArgs& a, const FVec& buf) { finish_result(a.out, a.out_shape, a.out_dtype, buf); }

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

// ---- GEMM ------------------------------------------------------------------------------------

// C[b] (M x N) = A[b] (M x K) * B[b] (K x N) for every batch b. A "transposed" operand is
// stored as its transpose, row-major ([K, M] for A, [N, K] for B, [N, M] for C), which is
// exactly the column-major storage of the matrix itself: Eigen reads it through a
// column-major map, no copy. Rows of A/C may be split into blocks that run on threads.
template <int OA, int OB, int OC>
void gemm_block(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
                int64_t b, int64_t i0, int64_t i1) {
  using Stride = Eigen::OuterStride<>;
  using MatA = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, OA>;
  using MatB = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, OB>;
  using MatC = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, OC>;
  constexpr bool ta = OA == Eigen::ColMajor;
  constexpr bool tb = OB == Eigen::ColMajor;
  constexpr bool tc = OC == Eigen::ColMajor;
  const float* a = A + b * M * K + (ta ? i0 : i0 * K);
  const float* bb = B + b * K * N;
  float* c = C + b * M * N + (tc ? i0 : i0 * N);
  const int64_t rows = i1 - i0;
  Eigen::Map<const MatA, Eigen::Unaligned, Stride> ma(a, rows, K, Stride(ta ? M : K));
  Eigen::Map<const MatB, Eigen::Unaligned, Stride> mb(bb, K, N, Stride(tb ? K : N));
  Eigen::Map<MatC, Eigen::Unaligned, Stride> mc(c, rows, N, Stride(tc ? M : N));
  mc.noalias() = ma * mb;
}

template <int OA, int OB, int OC>
void gemm_batched_t(const float* A, const float* B, float* C, int64_t batch, int64_t M,
                    int64_t N, int64_t K, int num_threads) {
  const double flops = 2.0 * double(batch) * double(M) * double(N) * double(K);
  // Threads only pay for themselves on big products: spawning costs tens of microseconds.
  int nt = num_threads;
  if (flops < double(1 << 25)) nt = 1;
  if (nt <= 1) {
    for (int64_t b = 0; b < batch; ++b) gemm_block<OA, OB, OC>(A, B, C, M, N, K, b, 0, M);
    return;
  }
  // Work units: whole batches when there are enough, else row blocks of each batch.
  const int64_t chunks = batch >= nt ? 1 : std::min<int64_t>(M, (nt + batch - 1) / batch);
  const int64_t rows_per = (M + chunks - 1) / chunks;
  const int64_t units = batch * chunks;
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t u; (u = next.fetch_add(1)) < units;) {
      const int64_t b = u / chunks, c = u % chunks;
      const int64_t i0 = c * rows_per, i1 = std::min(M, i0 + rows_per);
      if (i0 < i1) gemm_block<OA, OB, OC>(A, B, C, M, N, K, b, i0, i1);
    }
  };
  std::vector<std::thread> pool;
  const int64_t extra = std::min<int64_t>(nt, units) - 1;
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

void gemm_batched(bool ta, bool tb, bool tc, const float* A, const float* B, float* C,
                  int64_t batch, int64_t M, int64_t N, int64_t K, int num_threads) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  const int code = (ta ? 4 : 0) | (tb ? 2 : 0) | (tc ? 1 : 0);
  switch (code) {
    case 0: gemm_batched_t<R, R, R>(A, B, C, batch, M, N, K, num_threads); break;
    case 1: gemm_batched_t<R, R, Cm>(A, B, C, batch, M, N, K, num_threads); break;
    case 2: gemm_batched_t<R, Cm, R>(A, B, C, batch, M, N, K, num_threads); break;
    case 3: gemm_batched_t<R, Cm, Cm>(A, B, C, batch, M, N, K, num_threads); break;
    case 4: gemm_batched_t<Cm, R, R>(A, B, C, batch, M, N, K, num_threads); break;
    case 5: gemm_batched_t<Cm, R, Cm>(A, B, C, batch, M, N, K, num_threads); break;
    case 6: gemm_batched_t<Cm, Cm, R>(A, B, C, batch, M, N, K, num_threads); break;
    default: gemm_batched_t<Cm, Cm, Cm>(A, B, C, batch, M, N, K, num_threads); break;
  }
}

// ---- einsum ----------------------------------------------------------------------------------

struct EinsumEq {
  std::vector<std::string> operands;
  std::string result;
};

EinsumEq parse_equation(const KernelArgs& a, const std::string& equation, std::size_t nin) {
  std::string s;
  for (char c : equation)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  if (s.find('.') != std::string::npos)
    fail(a, "einsum '" + equation + "': ellipsis ('...') is not supported");
  EinsumEq eq;
  const auto arrow = s.find("->");
  const std::string lhs = arrow == std::string::npos ? s : s.substr(0, arrow);
  std::size_t start = 0;
  for (;;) {
    const auto comma = lhs.find(',', start);
    eq.operands.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos
                                                                       : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (eq.operands.size() != nin)
    fail(a, "einsum '" + equation + "' names " + std::to_string(eq.operands.size()) +
                " operands but the op has " + std::to_string(nin));
  auto check_letters = [&](const std::string& sub) {
    bool seen[128] = {};
    for (char c : sub) {
      if (!std::isalpha(static_cast<unsigned char>(c)))
        fail(a, "einsum '" + equation + "': bad subscript character '" + std::string(1, c) + "'");
      if (seen[int(c)])
        fail(a, "einsum '" + equation + "': letter '" + std::string(1, c) + "' repeats in '" +
                    sub + "' (diagonals are not supported)");
      seen[int(c)] = true;
    }
  };
  for (const auto& o : eq.operands) check_letters(o);
  if (arrow != std::string::npos) {
    eq.result = s.substr(arrow + 2);
    check_letters(eq.result);
  } else {
    // Implicit form (numpy): letters appearing exactly once, in alphabetical order.
    int count[128] = {};
    for (const auto& o : eq.operands)
      for (char c : o) ++count[int(c)];
    for (int c = 0; c < 128; ++c)
      if (count[c] == 1) eq.result += static_cast<char>(c);
  }
  return eq;
}

std::vector<int> positions_in(const std::string& sub, const std::string& letters) {
  std::vector<int> p;
  for (char c : letters) p.push_back(static_cast<int>(sub.find(c)));
  return p;
}

// The einsum kernel: validates, then (two operands, impl not Eigen) tries oneDNN
// (onednn_einsum.cpp) and otherwise runs the Eigen path below. Returns true when oneDNN ran.
// prepare_only: validate and create the oneDNN primitives, run nothing (prepare_cpu_kernel).
// epilogue: only try oneDNN with these post-ops (false: nothing ran; the caller falls back).
bool einsum_kernel(const KernelArgs& a, EinsumImpl impl, bool prepare_only = false,
                   const EinsumEpilogue* epilogue = nullptr) {
  check_arity(a, 1, 2);
  const OpAttrs& at = attrs_of(a);
  const std::size_t nin = a.in.size();
  const EinsumEq eq = parse_equation(a, at.equation, nin);
  int64_t size[128];
  std::fill(std::begin(size), std::end(size), int64_t{-1});
  for (std::size_t i = 0; i < nin; ++i) {
    const std::string& sub = eq.operands[i];
    if (sub.size() != a.in_shapes[i].size())
      fail(a, "einsum '" + at.equation + "': operand " + std::to_string(i) + " subscript '" +
                  sub + "' does not match its rank " + std::to_string(a.in_shapes[i].size()));
    for (std::size_t d = 0; d < sub.size(); ++d) {
      int64_t& sz = size[int(sub[d])];
      if (sz < 0) {
        sz = a.in_shapes[i][d];
      } else if (sz != a.in_shapes[i][d]) {
        fail(a, "einsum '" + at.equation + "': letter '" + std::string(1, sub[d]) +
                    "' has sizes " + std::to_string(sz) + " and " +
                    std::to_string(a.in_shapes[i][d]));
      }
    }
  }
  if (eq.result.size() != a.out_shape.size())
    fail(a, "einsum '" + at.equation + "': result subscript '" + eq.result +
                "' does not match the result rank");
  for (std::size_t d = 0; d < eq.result.size(); ++d) {
    const int64_t sz = size[int(eq.result[d])];
    if (sz < 0)
      fail(a, "einsum '" + at.equation + "': result letter '" + std::string(1, eq.result[d]) +
                  "' appears in no operand");
    if (sz != a.out_shape[d])
      fail(a, "einsum '" + at.equation + "': result dim " + std::to_string(d) + " ('" +
                  std::string(1, eq.result[d]) + "') is " + std::to_string(a.out_shape[d]) +
                  " but the operands give " + std::to_string(sz));
  }
  auto prod = [&](const std::string& letters) {
    int64_t p = 1;
    for (char c : letters) p *= size[int(c)];
    return p;
  };
  auto strides_for = [&](const std::string& sub, const std::string& target) {
    // For each dim of `sub`: its stride in the contiguous layout of `target` (0 if absent).
    std::vector<int64_t> st(sub.size(), 0);
    int64_t acc = 1;
    for (std::size_t k = target.size(); k-- > 0;) {
      st[sub.find(target[k])] = acc;
      acc *= size[int(target[k])];
    }
    return st;
  };

  if (epilogue)
    return nin == 2 && impl != EinsumImpl::Eigen &&
           onednn_einsum(a, eq.operands[0], eq.operands[1], eq.result, prepare_only, epilogue);
  if (nin == 2 && impl != EinsumImpl::Eigen &&
      onednn_einsum(a, eq.operands[0], eq.operands[1], eq.result, prepare_only))
    return true;
  if (prepare_only) return false;

  FVec buf0, buf1, obuf;
  float* out = out_f32(a, obuf);
  const int64_t out_n = num_elements(a.out_shape);

  if (nin == 1) {
    const float* x = in_f32(a, 0, buf0);
    const std::string& sub = eq.operands[0];
    if (sub.size() == eq.result.size()) {
      permute_copy<float>(x, a.in_shapes[0], positions_in(sub, eq.result), out);
    } else {
      reduce_into<float>(x, a.in_shapes[0], strides_for(sub, eq.result), out, out_n, SumR{});
    }
    finish_out(a, obuf);
    return false;
  }

  const std::string& sa = eq.operands[0];
  const std::string& sb = eq.operands[1];
  const std::string& sr = eq.result;
  auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  std::string batch, free_a, free_b, contract, sum_a, sum_b;
  for (char c : sr) {
    const bool ia = has(sa, c), ib = has(sb, c);
    if (ia && ib) batch += c;
    else if (ia) free_a += c;
    else free_b += c;
  }
  for (char c : sa) {
    if (has(sr, c)) continue;
    if (has(sb, c)) contract += c;
    else sum_a += c;
  }
  for (char c : sb)
    if (!has(sr, c) && !has(sa, c)) sum_b += c;

  const int64_t B = prod(batch), M = prod(free_a), N = prod(free_b), K = prod(contract);
  const float* xa = in_f32(a, 0, buf0);
  const float* xb = in_f32(a, 1, buf1);

  // Brings an operand into [batch, free, contract] (or [batch, contract, free]: then
  // `trans`), summing out letters only it has. No copy when it already is in either order.
  FVec ta_buf, tb_buf;
  auto prepare = [&](const float* x, const std::string& sub, const Shape& shp,
                     const std::string& sum, const std::string& seq_n, const std::string& seq_t,
                     FVec& tmp, bool& trans) -> const float* {
    trans = false;
    if (sum.empty()) {
      if (sub == seq_n) return x;
      if (sub == seq_t) {
        trans = true;
        return x;
      }
    }
    tmp.resize(static_cast<std::size_t>(prod(seq_n)));
    if (sum.empty()) {
      permute_copy<float>(x, shp, positions_in(sub, seq_n), tmp.data());
    } else {
      reduce_into<float>(x, shp, strides_for(sub, seq_n), tmp.data(),
                         static_cast<int64_t>(tmp.size()), SumR{});
    }
    return tmp.data();
  };
  bool trans_a = false, trans_b = false;
  // A as M x K: [batch, free_a, contract] row-major, or its transpose [batch, contract, free_a].
  const float* pa = prepare(xa, sa, a.in_shapes[0], sum_a, batch + free_a + contract,
                            batch + contract + free_a, ta_buf, trans_a);
  // B as K x N: [batch, contract, free_b] row-major, or its transpose [batch, free_b, contract].
  const float* pb = prepare(xb, sb, a.in_shapes[1], sum_b, batch + contract + free_b,
                            batch + free_b + contract, tb_buf, trans_b);

  const std::string seq_c = batch + free_a + free_b;
  bool trans_c = false;
  float* pc = out;
  FVec c_buf;
  if (sr != seq_c && sr == batch + free_b + free_a) {
    trans_c = true;
  } else if (sr != seq_c) {
    c_buf.resize(static_cast<std::size_t>(out_n));
    pc = c_buf.data();
  }
  if (out_n > 0) {
    if (K == 0) {
      std::fill(pc, pc + out_n, 0.0f);
    } else {
      gemm_batched(trans_a, trans_b, trans_c, pa, pb, pc, B, M, N, K, a.num_threads);
    }
  }
  if (pc != out) {
    Shape cs;
    for (char c : seq_c) cs.push_back(size[int(c)]);
    permute_copy<float>(pc, cs, positions_in(seq_c, sr), out);
  }
  finish_out(a, obuf);
  return false;
}

void k_einsum(const KernelArgs& a) { einsum_kernel(a, EinsumImpl::Auto); }

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

// Strides of an operand broadcast (numpy rules, right-aligned) to `out`; 0 where broadcast.
std::vector<int64_t> broadcast_strides(const KernelArgs& a, const Shape& in, const Shape& out,
                                       const char* what) {
  if (in.size() > out.size())
    fail(a, std::string(what) + " " + shape_str(in) + " has a higher rank than the result " +
                shape_str(out));
  const auto cs = contiguous_strides(in);
  const std::size_t lead = out.size() - in.size();
  std::vector<int64_t> st(out.size(), 0);
  for (std::size_t d = lead; d < out.size(); ++d) {
    const int64_t n = in[d - lead];
    if (n == out[d]) st[d] = n == 1 ? 0 : cs[d - lead];
    else if (n == 1) st[d] = 0;
    else
      fail(a, std::string(what) + " " + shape_str(in) + " does not broadcast to " +
                  shape_str(out));
  }
  return st;
}

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
    case OpKind::GeluGrad: f(GeluGradF{}); break;
    default: fail(a, "not a binary op");
  }
}

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
  with_binary_op<float>(a, [&](auto op) { binary_loop<float>(a, x, y, o, op); });
  finish_out(a, ob);
}

// ---- reductions ------------------------------------------------------------------------------

void k_reduce(const KernelArgs& a) {
  check_arity(a, 1, 1);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  std::vector<bool> reduced(is.size(), false);
  for (int64_t d : at.dims) {
    const int64_t nd = normalize_dim(a, d, is.size(), "reduced dim");
    if (reduced[nd]) fail(a, "reduced dim " + std::to_string(d) + " is listed twice");
    reduced[nd] = true;
  }
  std::vector<int64_t> ostr(is.size(), 0);
  int64_t acc = 1, count = 1;
  for (std::size_t d = is.size(); d-- > 0;) {
    if (reduced[d]) {
      count *= is[d];
    } else {
      ostr[d] = acc;
      acc *= is[d];
    }
  }
  const int64_t n = num_elements(a.out_shape);
  if (acc != n)
    fail(a, "the result has " + std::to_string(n) + " elements but reducing " +
                shape_str(is) + " over the given dims leaves " + std::to_string(acc));
  if (a.in_dtypes[0] == DType::i32 || a.out_dtype == DType::i32) {
    if (a.in_dtypes[0] != a.out_dtype) fail(a, "operand and result dtypes differ");
    const int32_t* x = static_cast<const int32_t*>(a.in[0]);
    int32_t* y = static_cast<int32_t*>(a.out);
    if (a.kind == OpKind::ReduceSum) reduce_into<int32_t>(x, is, ostr, y, n, SumR{});
    else if (a.kind == OpKind::ReduceMax) reduce_into<int32_t>(x, is, ostr, y, n, MaxR{});
    else fail(a, "reduce_mean needs a float type");
    return;
  }
  FVec ib, ob;
  const float* x = in_f32(a, 0, ib);
  float* y = out_f32(a, ob);
  if (a.kind == OpKind::ReduceMax) {
    reduce_into<float>(x, is, ostr, y, n, MaxR{});
  } else {
    reduce_into<float>(x, is, ostr, y, n, SumR{});
    if (a.kind == OpKind::ReduceMean) {
      // Mean over the extent of the given (possibly local) operand; the partitioner
      // rewrites a mean over a sharded dim itself.
      const float inv = 1.0f / static_cast<float>(count);
      for (int64_t i = 0; i < n; ++i) y[i] *= inv;
    }
  }
  finish_out(a, ob);
}

// ---- data movement -----------------------------------------------------------------------------

void check_same_dtype(const KernelArgs& a) {
  for (std::size_t i = 0; i < a.in_dtypes.size(); ++i)
    if (a.in_dtypes[i] != a.out_dtype)
      fail(a, "operand " + std::to_string(i) + " dtype " + dtype_name(a.in_dtypes[i]) +
                  " differs from the result dtype " + dtype_name(a.out_dtype));
}

void k_constant(const KernelArgs& a) {
  check_arity(a, 0, 0);
  const OpAttrs& at = attrs_of(a);
  const int64_t n = num_elements(a.out_shape);
  switch (a.out_dtype) {
    case DType::f32: std::fill_n(static_cast<float*>(a.out), n, static_cast<float>(at.scalar)); break;
    case DType::bf16:
      std::fill_n(static_cast<uint16_t*>(a.out), n, f32_to_bf16(static_cast<float>(at.scalar)));
      break;
    case DType::f16:
      std::fill_n(static_cast<uint16_t*>(a.out), n, f32_to_f16(static_cast<float>(at.scalar)));
      break;
    case DType::i32: {
      if (!(at.scalar >= -2147483648.0 && at.scalar <= 2147483647.0))
        fail(a, "constant " + std::to_string(at.scalar) + " does not fit in i32");
      std::fill_n(static_cast<int32_t*>(a.out), n, static_cast<int32_t>(at.scalar));
      break;
    }
  }
}

void k_copy(const KernelArgs& a) {  // Reshape, ShardingConstraint
  check_arity(a, 1, 1);
  check_same_dtype(a);
  if (num_elements(a.in_shapes[0]) != num_elements(a.out_shape))
    fail(a, "operand and result element counts differ");
  const std::size_t bytes = static_cast<std::size_t>(num_elements(a.out_shape)) * dtype_size(a.out_dtype);
  if (bytes && a.out != a.in[0]) std::memmove(a.out, a.in[0], bytes);
}

void k_transpose(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.dims.size() != is.size()) fail(a, "permutation length differs from the rank");
  std::vector<int> perm(is.size());
  std::vector<bool> used(is.size(), false);
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const int64_t d = normalize_dim(a, at.dims[i], is.size(), "permutation entry");
    if (used[d]) fail(a, "permutation repeats dim " + std::to_string(d));
    used[d] = true;
    perm[i] = static_cast<int>(d);
    if (a.out_shape.size() != is.size() || a.out_shape[i] != is[d])
      fail(a, "result shape does not match the permuted operand shape");
  }
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    permute_copy<T>(static_cast<const T*>(a.in[0]), is, perm, static_cast<T*>(a.out));
  });
}

void k_broadcast(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const auto st = broadcast_strides(a, a.in_shapes[0], a.out_shape, "operand");
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    copy_strided<T>(static_cast<const T*>(a.in[0]), st, static_cast<T*>(a.out),
                    contiguous_strides(a.out_shape), a.out_shape);
  });
}

void k_slice(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.starts.size() != is.size() || at.limits.size() != is.size())
    fail(a, "slice starts/limits must have one entry per dim");
  if (a.out_shape.size() != is.size()) fail(a, "result rank differs from the operand rank");
  const auto cs = contiguous_strides(is);
  int64_t base = 0;
  for (std::size_t d = 0; d < is.size(); ++d) {
    const int64_t s = at.starts[d], l = at.limits[d];
    if (s < 0 || l < s || l > is[d])
      fail(a, "slice [" + std::to_string(s) + ", " + std::to_string(l) + ") of dim " +
                  std::to_string(d) + " is out of range for size " + std::to_string(is[d]));
    if (a.out_shape[d] != l - s) fail(a, "result shape does not match starts/limits");
    base += s * cs[d];
  }
  if (num_elements(a.out_shape) == 0) return;
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    copy_strided<T>(static_cast<const T*>(a.in[0]) + base, cs, static_cast<T*>(a.out),
                    contiguous_strides(a.out_shape), a.out_shape);
  });
}

void k_concat(const KernelArgs& a) {
  check_arity(a, 1, std::size_t(-1));
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& os = a.out_shape;
  const int64_t axis = normalize_dim(a, at.axis, os.size(), "concat axis");
  int64_t total = 0;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    const Shape& s = a.in_shapes[i];
    if (s.size() != os.size()) fail(a, "operand " + std::to_string(i) + " rank differs");
    for (std::size_t d = 0; d < s.size(); ++d)
      if (int64_t(d) != axis && s[d] != os[d])
        fail(a, "operand " + std::to_string(i) + " differs from the result off the axis");
    total += s[axis];
  }
  if (total != os[axis]) fail(a, "operand extents along the axis do not add up");
  const auto ostr = contiguous_strides(os);
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    int64_t at_axis = 0;
    for (std::size_t i = 0; i < a.in.size(); ++i) {
      const Shape& s = a.in_shapes[i];
      if (num_elements(s) > 0)
        copy_strided<T>(static_cast<const T*>(a.in[i]), contiguous_strides(s),
                        static_cast<T*>(a.out) + at_axis * ostr[axis], ostr, s);
      at_axis += s[axis];
    }
  });
}

// ---- normalisations and the NN ops -------------------------------------------------------------

// Softmax rows shorter than this run on oneDNN, longer ones on the hand-written loops:
// BM_SoftmaxRows and BM_RowOp measured oneDNN faster up to 64 floats a row, the loops faster
// from 512 on, and 128-256 either way from run to run; the GPT-2 block's rows of 256 went to
// the loops in all three BM_RowOp runs (docs/cpu-backend.md).
constexpr int64_t kSoftmaxOnednnBelowLen = 256;

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
  std::vector<double> sum_g(static_cast<std::size_t>(D), 0.0), sum_b(static_cast<std::size_t>(D), 0.0);
  std::vector<double> xhat(static_cast<std::size_t>(D));
  const int64_t rows = D > 0 ? num_elements(s) / D : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    const float* dyr = dy + r * D;
    double mean = 0.0;
    for (int64_t j = 0; j < D; ++j) mean += xr[j];
    mean /= double(D);
    double var = 0.0;
    for (int64_t j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= double(D);
    const double rstd = 1.0 / std::sqrt(var + at.eps);
    double mg = 0.0, mgx = 0.0;
    for (int64_t j = 0; j < D; ++j) {
      const std::size_t u = static_cast<std::size_t>(j);
      xhat[u] = (xr[j] - mean) * rstd;
      const double g = double(dyr[j]) * gamma[j];
      mg += g;
      mgx += g * xhat[u];
      // A zero gradient contributes nothing, even where the row is degenerate (constant with
      // eps = 0, as the zero rows padding an uneven split are): 0 * NaN would poison the sum.
      if (dyr[j] != 0.0f) sum_g[u] += double(dyr[j]) * xhat[u];
      sum_b[u] += dyr[j];
    }
    mg /= double(D);
    mgx /= double(D);
    for (int64_t j = 0; j < D; ++j) {
      const std::size_t u = static_cast<std::size_t>(j);
      dx[r * D + j] = static_cast<float>(rstd * (double(dyr[j]) * gamma[j] - mg - xhat[u] * mgx));
    }
  }
  for (int64_t j = 0; j < D; ++j) {
    dgamma[j] = static_cast<float>(sum_g[static_cast<std::size_t>(j)]);
    dbeta[j] = static_cast<float>(sum_b[static_cast<std::size_t>(j)]);
  }
  finish_out(a, ob);
  finish_result(a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], gb);
  finish_result(a.extra_out[1], a.extra_out_shapes[1], a.extra_out_dtypes[1], bb);
}

// One fused AdamW step (builders.hpp adamw): three results, elementwise, in f32.
void k_adamw(const KernelArgs& a) {
  check_arity(a, 8, 8);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (a.extra_out.size() != 2 || a.extra_out_shapes.size() != 2 || a.extra_out_dtypes.size() != 2)
    fail(a, "adamw writes three results (the parameter, m and v)");
  for (int i = 1; i <= 3; ++i)
    if (a.in_shapes[static_cast<std::size_t>(i)] != s) fail(a, "g, m and v must have the parameter's shape");
  if (a.out_shape != s || a.extra_out_shapes[0] != s || a.extra_out_shapes[1] != s) fail(a, "results must have the parameter's shape");
  if (a.in_dtypes[2] != DType::f32 || a.in_dtypes[3] != DType::f32 || a.extra_out_dtypes[0] != DType::f32 ||
      a.extra_out_dtypes[1] != DType::f32)
    fail(a, "the moments must be f32");
  for (std::size_t i = 4; i < 8; ++i)
    if (num_elements(a.in_shapes[i]) != 1 || a.in_dtypes[i] != DType::f32) fail(a, "lr, bc1, bc2 and gscale must be f32 scalars");
  FVec b0, b1, ob;
  const float* p = in_f32(a, 0, b0);
  const float* g = in_f32(a, 1, b1);
  const float* m = static_cast<const float*>(a.in[2]);
  const float* v = static_cast<const float*>(a.in[3]);
  auto scalar = [&](std::size_t i) { return *static_cast<const float*>(a.in[i]); };
  const float lr = scalar(4), bc1 = scalar(5), bc2 = scalar(6), gscale = scalar(7);
  const float b1c = static_cast<float>(at.beta1), b2c = static_cast<float>(at.beta2), eps = static_cast<float>(at.eps),
              wd = static_cast<float>(at.weight_decay);
  float* po = out_f32(a, ob);
  float* mo = static_cast<float*>(a.extra_out[0]);
  float* vo = static_cast<float*>(a.extra_out[1]);
  const int64_t n = num_elements(s);
  for (int64_t i = 0; i < n; ++i) {
    const float gs = g[i] * gscale;
    const float m2 = b1c * m[i] + (1.0f - b1c) * gs;
    const float v2 = b2c * v[i] + (1.0f - b2c) * (gs * gs);
    mo[i] = m2;
    vo[i] = v2;
    po[i] = p[i] - lr * ((m2 * bc1) / (std::sqrt(v2 * bc2) + eps) + wd * p[i]);
  }
  finish_out(a, ob);
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

// ---- one_hot, gather, scatter_add -----------------------------------------------------------

// Offset of the result block along `dim` (0 when not given).
int64_t out_offset_at(const KernelArgs& a, std::size_t dim) {
  return dim < a.out_offset.size() ? a.out_offset[dim] : 0;
}

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

[[noreturn]] void index_fail(const KernelArgs& a, int32_t id, int64_t pos, int64_t bound) {
  fail(a, "index " + std::to_string(id) + " at position " + std::to_string(pos) +
              " is outside [0, " + std::to_string(bound) + "); check the indices (tessel does "
              "not clamp them)");
}

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

}  // namespace

const KernelTable<CpuKernelFn>& cpu_kernel_table() {
  static const KernelTable<CpuKernelFn> t = [] {
    KernelTable<CpuKernelFn> k("cpu");
    k.add(OpKind::Constant, k_constant);
    k.add(OpKind::Einsum, k_einsum);
    for (OpKind u : {OpKind::Neg, OpKind::Exp, OpKind::Log, OpKind::Tanh, OpKind::Gelu,
                     OpKind::Relu, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Sigmoid, OpKind::Silu})
      k.add(u, k_unary);
    for (OpKind b : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Max, OpKind::GeluGrad})
      k.add(b, k_binary);
    for (OpKind r : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMean}) k.add(r, k_reduce);
    k.add(OpKind::Reshape, k_copy);
    k.add(OpKind::ShardingConstraint, k_copy);
    k.add(OpKind::Transpose, k_transpose);
    k.add(OpKind::Broadcast, k_broadcast);
    k.add(OpKind::Slice, k_slice);
    k.add(OpKind::Concat, k_concat);
    k.add(OpKind::Softmax, k_softmax);
    k.add(OpKind::LayerNorm, k_layer_norm);
    k.add(OpKind::LayerNormGrad, k_layer_norm_grad);
    k.add(OpKind::AdamW, k_adamw);
    k.add(OpKind::Embedding, k_embedding);
    k.add(OpKind::CrossEntropy, k_cross_entropy);
    k.add(OpKind::SoftmaxGrad, k_softmax_grad);
    k.add(OpKind::CrossEntropyGrad, k_cross_entropy_grad);
    k.add(OpKind::CausalMask, k_causal_mask);
    k.add(OpKind::Cast, k_cast);
    for (OpKind c : {OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge})
      k.add(c, k_compare);
    k.add(OpKind::Where, k_where);
    k.add(OpKind::OneHot, k_one_hot);
    k.add(OpKind::Gather, k_gather);
    k.add(OpKind::ScatterAdd, k_scatter_add);
    k.add(OpKind::MaskPadding, k_mask_padding);
    k.add(OpKind::FusedElementwise, fused_elementwise_kernel);
    k.add(OpKind::FusedSoftmax, fused_softmax_kernel);
    k.add(OpKind::FusedEinsum, fused_einsum_kernel);
    return k;
  }();
  return t;
}

bool cpu_einsum(const KernelArgs& args, EinsumImpl impl, const EinsumEpilogue* epilogue) {
  return einsum_kernel(args, impl, false, epilogue);
}

void prepare_cpu_kernel(const KernelArgs& args) {
  if (args.kind == OpKind::Softmax && softmax_on_onednn(args)) onednn_softmax(args, /*prepare_only=*/true);
  if (args.kind == OpKind::LayerNorm) onednn_layer_norm(args, /*prepare_only=*/true);
  if (args.kind != OpKind::Einsum && args.kind != OpKind::FusedEinsum) return;
  // The kernel's validation rejects null data pointers; preparing reads and writes no data,
  // so null pointers are replaced by one that is never dereferenced.
  static const float placeholder = 0.0f;
  KernelArgs a = args.kind == OpKind::FusedEinsum ? fused_einsum_product_args(args) : args;
  for (const void*& p : a.in)
    if (!p) p = &placeholder;
  if (!a.out) a.out = const_cast<float*>(&placeholder);
  // fused_einsum: the primitive with the epilogue's post-ops, or (declined) the plain product's.
  if (args.kind == OpKind::FusedEinsum) {
    EinsumEpilogue ep;
    if (fused_einsum_post_ops(args, ep) && einsum_kernel(a, EinsumImpl::Auto, /*prepare_only=*/true, &ep)) return;
  }
  einsum_kernel(a, EinsumImpl::Auto, /*prepare_only=*/true);
}

void run_handwritten_kernel(const KernelArgs& args) {
  switch (args.kind) {
    case OpKind::Softmax: softmax_kernel(args, false); break;
    case OpKind::LayerNorm: layer_norm_kernel(args, false); break;
    case OpKind::Gelu: k_unary(args); break;
    case OpKind::Einsum: einsum_kernel(args, EinsumImpl::Eigen); break;
    default: run_cpu_kernel(args);
  }
}

bool has_cpu_kernel(OpKind kind) { return cpu_kernel_table().has(kind); }

void run_cpu_kernel(const KernelArgs& args) { cpu_kernel_table().get(args.kind)(args); }

}  // namespace tessel
