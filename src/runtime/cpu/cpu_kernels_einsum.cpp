// src/runtime/cpu/cpu_kernels_einsum.cpp — the CPU einsum kernel (one or two operands, any
// letters but no diagonals or ellipsis) and the batched GEMM under it.
//
//  * Einsum = permute operands into [batch, free, contract] layouts (skipped when they are
//    already in such an order, either [.., free, contract] or [.., contract, free]: a
//    row-major buffer read as column-major is the transpose for free) + a batched GEMM with
//    Eigen (mapped matrices, .noalias(), so no temporaries) + a permutation of the result
//    when its letter order is not [batch, freeA, freeB] or [batch, freeB, freeA].
//  * With oneDNN (TESSEL_WITH_ONEDNN), a two-operand einsum that maps onto a batched matmul
//    runs as one, transposes folded into strides (onednn_einsum.cpp); the Eigen path is the
//    fallback for the rest and the test oracle.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <string>
#include <thread>
#include <vector>

#include <Eigen/Dense>

#include "tessel/runtime/tensor.hpp"

#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"
#include "onednn_einsum.hpp"

namespace tessel::cpu_detail {
namespace {

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
  parallel_units(batch * chunks, nt, [&](int64_t u) {
    const int64_t b = u / chunks, c = u % chunks;
    const int64_t i0 = c * rows_per, i1 = std::min(M, i0 + rows_per);
    if (i0 < i1) gemm_block<OA, OB, OC>(A, B, C, M, N, K, b, i0, i1);
  });
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

}  // namespace

// The einsum kernel: validates, then (two operands, impl not Eigen) tries oneDNN
// (onednn_einsum.cpp) and otherwise runs the Eigen path below. Returns true when oneDNN ran.
// prepare_only: validate and create the oneDNN primitives, run nothing (prepare_cpu_kernel).
// epilogue: only try oneDNN with these post-ops (false: nothing ran; the caller falls back).
bool einsum_kernel(const KernelArgs& a, EinsumImpl impl, bool prepare_only,
                   const EinsumEpilogue* epilogue) {
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

}  // namespace tessel::cpu_detail
