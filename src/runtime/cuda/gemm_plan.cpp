// The einsum -> cuBLASLt mapping (gemm_plan.hpp); no CUDA here.
//
// An operand already laid out as [batch, free, contract] or [batch, contract, free] is used in
// place: a row-major buffer read as column-major is the transpose, so only the op flag and the
// leading dimension change; otherwise it is permuted (or, with summed letters, reduced) into
// scratch once. Likewise the result is written in place when its letters are [batch, free_a,
// free_b] or [batch, free_b, free_a], else through scratch and one permutation.
//
// Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T[N,M] = B^T A^T, so cuBLASLt's "A" is our
// B and its "B" our A (unless C itself is stored transposed: then C = A B column-major).
#include "gemm_plan.hpp"

#include <fmt/format.h>

#include <map>

#include "tessel/ops/registry.hpp"

namespace tessel::cuda {

namespace {

bool has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

}  // namespace

EinsumGemmPlan plan_einsum_gemm(const std::string& equation, const std::vector<Shape>& in_shapes,
                                const Shape& out_shape, std::size_t elem_size, double pad_min_flops) {
  auto fail = [&](const std::string& why) -> void {
    throw RuntimeError(fmt::format("cuda kernel einsum '{}': {}", equation, why));
  };
  const std::size_t nin = in_shapes.size();
  if (nin < 1 || nin > 2) fail("takes 1 or 2 operands");
  EinsumSpec eq;
  try {
    eq = parse_einsum(equation, static_cast<int>(nin));
  } catch (const Error& e) {
    fail(e.what());
  }
  int64_t size[128];
  std::fill(std::begin(size), std::end(size), int64_t{-1});
  for (std::size_t i = 0; i < nin; ++i) {
    const std::string& sub = eq.operands[i];
    if (sub.size() != in_shapes[i].size()) fail(fmt::format("operand {} subscript '{}' does not match its rank", i, sub));
    for (std::size_t d = 0; d < sub.size(); ++d) {
      int64_t& sz = size[int(sub[d])];
      if (sz >= 0 && sz != in_shapes[i][d]) fail(fmt::format("letter '{}' has sizes {} and {}", sub[d], sz, in_shapes[i][d]));
      sz = in_shapes[i][d];
    }
  }
  if (eq.result.size() != out_shape.size()) fail("the result subscript does not match the result rank");
  for (std::size_t d = 0; d < eq.result.size(); ++d)
    if (size[int(eq.result[d])] != out_shape[d]) fail(fmt::format("result dim {} does not match the operands", d));
  auto prod = [&](const std::string& letters) {
    int64_t p = 1;
    for (char c : letters) p *= size[int(c)];
    return p;
  };
  auto shape_of = [&](const std::string& letters) {
    Shape sh;
    for (char c : letters) sh.push_back(size[int(c)]);
    return sh;
  };
  // Operand i brought to the letter order `target`, summing `summed` out.
  auto arrangement = [&](std::size_t i, const std::string& target, const std::string& summed) {
    const auto st = contiguous_strides(in_shapes[i]);
    auto strides_in = [&](const std::string& letters) {
      std::vector<int64_t> v;
      for (char c : letters) v.push_back(st[eq.operands[i].find(c)]);
      return v;
    };
    GemmArrange r;
    r.shape = shape_of(target);
    r.src_strides = strides_in(target);
    if (!summed.empty()) {
      r.summed_shape = shape_of(summed);
      r.summed_strides = strides_in(summed);
    }
    return r;
  };

  EinsumGemmPlan p;
  const int64_t out_n = num_elements(out_shape);
  if (nin == 1) {
    for (char c : eq.operands[0])
      if (!has(eq.result, c)) p.letters.sum_a += c;
    p.kind = EinsumGemmPlan::Kind::Unary;
    p.unary = arrangement(0, eq.result, p.letters.sum_a);
    return p;
  }

  const std::string& sa = eq.operands[0];
  const std::string& sb = eq.operands[1];
  const std::string& sr = eq.result;
  for (char c : sr) {
    if (has(sa, c) && has(sb, c)) p.letters.batch += c;
    else if (has(sa, c)) p.letters.free_a += c;
    else p.letters.free_b += c;
  }
  for (char c : sa)
    if (!has(sr, c)) (has(sb, c) ? p.letters.contract : p.letters.sum_a) += c;
  for (char c : sb)
    if (!has(sr, c) && !has(sa, c)) p.letters.sum_b += c;
  const std::string &batch = p.letters.batch, &free_a = p.letters.free_a, &free_b = p.letters.free_b,
                    &contract = p.letters.contract;
  const int64_t B = prod(batch), M = prod(free_a), N = prod(free_b), K = prod(contract);
  p.B = B, p.M = M, p.N = N, p.K = K;
  p.flops = 2.0 * double(B) * double(M) * double(N) * double(K);
  if (out_n == 0) return p;  // Kind::Empty
  if (K == 0) {
    p.kind = EinsumGemmPlan::Kind::Zero;
    return p;
  }
  p.kind = EinsumGemmPlan::Kind::Gemm;

  // Einsum operand i as [batch, rows..., cols...] `seq_n` (trans: `seq_t`), in place or arranged.
  auto operand = [&](std::size_t i, const std::string& sum, const std::string& seq_n, const std::string& seq_t,
                     bool& trans) {
    GemmOperand g;
    g.source = static_cast<int>(i);
    trans = false;
    if (sum.empty() && eq.operands[i] == seq_n) return g;
    if (sum.empty() && eq.operands[i] == seq_t) {
      trans = true;
      return g;
    }
    g.arrange = true;
    g.arranged = arrangement(i, seq_n, sum);
    return g;
  };
  // Einsum A as [batch, M, K] (trans_a: [batch, K, M]); B as [batch, K, N] (trans_b: [batch, N, K]).
  bool trans_a = false, trans_b = false;
  GemmOperand ea = operand(0, p.letters.sum_a, batch + free_a + contract, batch + contract + free_a, trans_a);
  GemmOperand eb = operand(1, p.letters.sum_b, batch + contract + free_b, batch + free_b + contract, trans_b);
  const std::string seq_c = batch + free_a + free_b;
  p.trans_c = sr != seq_c && sr == batch + free_b + free_a;
  const bool c_scratch = sr != seq_c && !p.trans_c;
  p.batch = B;
  if (!p.trans_c) {
    // Column-major D (N x M, ld N) = op(Bbuf) (N x K) * op(Abuf) (K x M).
    p.m = N, p.n = M, p.k = K, p.ldc = N;
    p.a = eb;  // [K,N] row-major = N x K col-major (ld N): op N; [N,K] row-major = K x N (ld K): op T
    p.a.trans = trans_b;
    p.a.ld = trans_b ? K : N;
    p.b = ea;  // [M,K] row-major = K x M col-major (ld K): op N; [K,M] row-major = M x K (ld M): op T
    p.b.trans = trans_a;
    p.b.ld = trans_a ? M : K;
  } else {
    // Column-major D (M x N, ld M) = op(Abuf) (M x K) * op(Bbuf) (K x N).
    p.m = M, p.n = N, p.k = K, p.ldc = M;
    p.a = ea;  // [M,K] row-major = K x M col-major: op T (ld K); [K,M] row-major = M x K: op N (ld M)
    p.a.trans = !trans_a;
    p.a.ld = trans_a ? M : K;
    p.b = eb;  // [K,N] row-major = N x K col-major: op T (ld N); [N,K] row-major = K x N: op N (ld K)
    p.b.trans = !trans_b;
    p.b.ld = trans_b ? K : N;
  }
  p.a.stride = p.m * p.k;
  p.b.stride = p.k * p.n;
  p.stride_c = M * N;
  // 16-byte rows: cuBLASLt's fast kernels need every matrix's contiguous extent and leading
  // dimension to be a multiple of 16 bytes; with one odd (GPT-2's vocabulary of 50257) it falls
  // back to an align1 kernel (on an H200, 6.6 ms for the 8192x768x50257 LM head). A big enough
  // product then runs on zero-padded copies: m, n and k rounded up (zeros add nothing to the
  // sums; the padded rows and columns of the product are dropped by the copy out).
  const int64_t q = std::max<int64_t>(1, 16 / static_cast<int64_t>(elem_size));
  auto up = [&](int64_t d) { return (d + q - 1) / q * q; };
  p.padded = p.flops >= pad_min_flops && (p.m % q || p.n % q || p.k % q);
  if (p.padded) {
    const int64_t mp = up(p.m), np = up(p.n), kp = up(p.k);
    // An operand stored row-major as [batch, r, c] (dense) is copied into a zeroed [batch, rp, cp].
    auto widen = [&](GemmOperand& g, int64_t r, int64_t c, int64_t rp, int64_t cp) {
      if (r == rp && c == cp) return;
      g.pad = true;
      g.rows = r, g.cols = c, g.padded_rows = rp, g.padded_cols = cp;
    };
    // op(A) is m x k: stored col-major m x k ([k][m] row-major) for N, k x m ([m][k]) for T.
    if (!p.a.trans) widen(p.a, p.k, p.m, kp, mp);
    else widen(p.a, p.m, p.k, mp, kp);
    // op(B) is k x n: stored [n][k] for N, [k][n] for T.
    if (!p.b.trans) widen(p.b, p.n, p.k, np, kp);
    else widen(p.b, p.k, p.n, kp, np);
    p.a.ld = !p.a.trans ? mp : kp;
    p.b.ld = !p.b.trans ? kp : np;
    p.a.stride = mp * kp;
    p.b.stride = kp * np;
    p.m = mp, p.n = np, p.k = kp;
    p.ldc = mp;
    p.stride_c = mp * np;
  }
  p.c_in_result = !p.padded && !c_scratch;
  p.c_elements = p.c_in_result ? 0 : B * p.stride_c;
  if (!p.c_in_result) {
    // The product's layout: [batch, rows, ldc]; rows are C's n letters, columns its m.
    const std::string& seq_rows = p.trans_c ? free_b : free_a;
    const std::string& seq_cols = p.trans_c ? free_a : free_b;
    std::map<char, int64_t> c_strides;
    auto put = [&](const std::string& letters, int64_t scale) {
      const auto st = contiguous_strides(shape_of(letters));
      for (std::size_t i = 0; i < letters.size(); ++i) c_strides[letters[i]] = st[i] * scale;
    };
    put(batch, p.stride_c);
    put(seq_rows, p.ldc);
    put(seq_cols, 1);
    for (char c : sr) p.copy_out_strides.push_back(c_strides.at(c));
  }
  return p;
}

}  // namespace tessel::cuda
