// src/runtime/cpu/cpu_kernels_attention.cpp — the CPU kernels of fused attention (the op
// family of src/ops/attention.cpp): FlashAttention's tiled online softmax, forward and
// backward, with Eigen GEMMs on the tiles. The CUDA kernels (src/runtime/cuda/kernels/attention.cu) run the same
// algorithm, so these are their oracle as well as the CPU's fast path.
//
// Forward, per (batch, head, block of kBq queries): the running row max m, row sum l and the
// unnormalised output O in f32; for each block of kBk keys up to the causal limit,
//   S = scale Q Kᵀ (masked),  m' = max(m, rowmax S),  P = exp(S - m'),
//   l = l e^(m - m') + rowsum P,  O = O e^(m - m') + P V,
// then out = O / l and lse = m + log l. The [Sq, Sk] scores never exist whole: a tile of
// kBq x kBk floats lives in cache.
// Backward, per (batch, head) (dq sums over key blocks and dk, dv over query blocks, so one
// task owns them all and no two threads write one element), with Dᵢ = rowsum(dOᵢ ∘ Oᵢ):
// for each key block j and each query block i that sees it,
//   P = exp(scale Qᵢ Kⱼᵀ - lseᵢ) (masked: 0),  dVⱼ += Pᵀ dOᵢ,  dP = dOᵢ Vⱼᵀ,
//   dS = P ∘ (dP - Dᵢ),  dQᵢ += scale dS Kⱼ,  dKⱼ += scale dSᵀ Qᵢ.
// Every task runs in a fixed order, so results are bit-identical whatever the thread count.
// q, k, v are read in place through their layout's strides (attention_params.hpp); bf16/f16
// operands are converted to f32 once and the results converted back.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Dense>

#include "../attention_params.hpp"
#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {
namespace {

constexpr int64_t kBq = 64;   // queries per tile
constexpr int64_t kBk = 128;  // keys per tile

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using CMap = Eigen::Map<const RowMat, Eigen::Unaligned, Stride>;
using MMap = Eigen::Map<RowMat, Eigen::Unaligned, Stride>;

// Threads pay for themselves on big products only (spawning costs tens of microseconds).
int threads_for(int threads, double flops) { return flops < double(1 << 24) ? 1 : threads; }

// Masks S (rows: queries i0.., cols: keys j0..) where key > query + offset.
void causal_tile(RowMat& S, int64_t i0, int64_t j0, int64_t offset) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < S.rows(); ++r) {
    const int64_t first_masked = i0 + r + offset + 1 - j0;  // columns >= this are masked
    for (int64_t c = std::max<int64_t>(first_masked, 0); c < S.cols(); ++c) S(r, c) = ninf;
  }
}

}  // namespace

void k_attention(const KernelArgs& a) {
  const AttentionParams p = attention_params(a, "cpu");
  FVec qb, kb, vb, ob, lb;
  const float* q = in_f32(a, 0, qb);
  const float* k = in_f32(a, 1, kb);
  const float* v = in_f32(a, 2, vb);
  float* out = out_f32(a, ob);
  float* lse = result_f32(a, a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], lb);
  const int64_t nqb = (p.Sq + kBq - 1) / kBq;
  const float ninf = -std::numeric_limits<float>::infinity();
  parallel_units(p.B * p.H * nqb, threads_for(a.num_threads, p.forward_flops()), [&](int64_t u) {
    const int64_t bh = u / nqb, b = bh / p.H, h = bh % p.H;
    const int64_t i0 = (u % nqb) * kBq, i1 = std::min(p.Sq, i0 + kBq), rows = i1 - i0;
    const float* qp = q + b * p.q_sb + h * p.q_sh + i0 * p.q_ss;
    const float* kp = k + b * p.k_sb + h * p.k_sh;
    const float* vp = v + b * p.k_sb + h * p.k_sh;
    CMap Q(qp, rows, p.D, Stride(p.q_ss));
    RowMat O = RowMat::Zero(rows, p.D), S, P;
    std::vector<float> m(static_cast<std::size_t>(rows), ninf), l(static_cast<std::size_t>(rows), 0.0f);
    const int64_t kv_end = p.kv_end(i1 - 1);
    for (int64_t j0 = 0; j0 < kv_end; j0 += kBk) {
      const int64_t j1 = std::min(kv_end, j0 + kBk), cols = j1 - j0;
      CMap K(kp + j0 * p.k_ss, cols, p.D, Stride(p.k_ss));
      CMap V(vp + j0 * p.k_ss, cols, p.D, Stride(p.k_ss));
      S.noalias() = Q * K.transpose();
      S *= p.scale;
      if (p.causal && j1 - 1 > i0 + p.offset) causal_tile(S, i0, j0, p.offset);
      P.resize(rows, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const std::size_t ri = static_cast<std::size_t>(r);
        const float mnew = std::max(m[ri], S.row(r).maxCoeff());
        if (mnew == ninf) {  // every key of the row so far is masked: nothing to add
          P.row(r).setZero();
          continue;
        }
        const float alpha = std::exp(m[ri] - mnew);  // 0 on the first tile (m = -inf)
        P.row(r) = (S.row(r).array() - mnew).exp().matrix();
        l[ri] = l[ri] * alpha + P.row(r).sum();
        O.row(r) *= alpha;
        m[ri] = mnew;
      }
      O.noalias() += P * V;
    }
    MMap Out(out + b * p.q_sb + h * p.q_sh + i0 * p.q_ss, rows, p.D, Stride(p.q_ss));
    float* lrow = lse + (b * p.H + h) * p.Sq + i0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::size_t ri = static_cast<std::size_t>(r);
      // A row with no visible key (not possible with Sq <= Sk) would be 0 with lse -inf.
      const float inv = l[ri] > 0 ? 1.0f / l[ri] : 0.0f;
      Out.row(r) = O.row(r) * inv;
      lrow[r] = l[ri] > 0 ? m[ri] + std::log(l[ri]) : ninf;
    }
  });
  finish_out(a, ob);
  finish_result(a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], lb);
}

void k_attention_grad(const KernelArgs& a) {
  const AttentionParams p = attention_params(a, "cpu");
  FVec qb, kb, vb, ob, db, dqb, dkb, dvb;
  const float* q = in_f32(a, 0, qb);
  const float* k = in_f32(a, 1, kb);
  const float* v = in_f32(a, 2, vb);
  const float* o = in_f32(a, 3, ob);
  const float* lse = static_cast<const float*>(a.in[4]);
  const float* dout = in_f32(a, 5, db);
  float* dq = out_f32(a, dqb);
  float* dk = result_f32(a, a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], dkb);
  float* dv = result_f32(a, a.extra_out[1], a.extra_out_shapes[1], a.extra_out_dtypes[1], dvb);
  parallel_units(p.B * p.H, threads_for(a.num_threads, 2.5 * p.forward_flops()), [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    const int64_t qoff = b * p.q_sb + h * p.q_sh, koff = b * p.k_sb + h * p.k_sh;
    const float* lrow = lse + bh * p.Sq;
    // D_i = rowsum(dO_i * O_i), and dQ accumulated for every query row.
    CMap Oall(o + qoff, p.Sq, p.D, Stride(p.q_ss));
    CMap dOall(dout + qoff, p.Sq, p.D, Stride(p.q_ss));
    Eigen::VectorXf Dv = (Oall.array() * dOall.array()).rowwise().sum().matrix();
    RowMat dQ = RowMat::Zero(p.Sq, p.D), dK, dV, S, dP;
    for (int64_t j0 = 0; j0 < p.Sk; j0 += kBk) {
      const int64_t j1 = std::min(p.Sk, j0 + kBk), cols = j1 - j0;
      CMap K(k + koff + j0 * p.k_ss, cols, p.D, Stride(p.k_ss));
      CMap V(v + koff + j0 * p.k_ss, cols, p.D, Stride(p.k_ss));
      dK = RowMat::Zero(cols, p.D);
      dV = RowMat::Zero(cols, p.D);
      // The first query that sees key j0: i + offset >= j0.
      const int64_t i_first = p.causal ? std::max<int64_t>(0, j0 - p.offset) : 0;
      for (int64_t i0 = (i_first / kBq) * kBq; i0 < p.Sq; i0 += kBq) {
        const int64_t i1 = std::min(p.Sq, i0 + kBq), rows = i1 - i0;
        CMap Q(q + qoff + i0 * p.q_ss, rows, p.D, Stride(p.q_ss));
        CMap dO(dout + qoff + i0 * p.q_ss, rows, p.D, Stride(p.q_ss));
        S.noalias() = Q * K.transpose();
        S *= p.scale;
        if (p.causal && j1 - 1 > i0 + p.offset) causal_tile(S, i0, j0, p.offset);
        for (int64_t r = 0; r < rows; ++r) S.row(r) = (S.row(r).array() - lrow[i0 + r]).exp().matrix();  // P
        dV.noalias() += S.transpose() * dO;
        dP.noalias() = dO * V.transpose();
        for (int64_t r = 0; r < rows; ++r) dP.row(r) = (S.row(r).array() * (dP.row(r).array() - Dv(i0 + r))).matrix();  // dS
        dQ.middleRows(i0, rows).noalias() += p.scale * (dP * K);
        dK.noalias() += p.scale * (dP.transpose() * Q);
      }
      MMap(dk + koff + j0 * p.k_ss, cols, p.D, Stride(p.k_ss)) = dK;
      MMap(dv + koff + j0 * p.k_ss, cols, p.D, Stride(p.k_ss)) = dV;
    }
    MMap(dq + qoff, p.Sq, p.D, Stride(p.q_ss)) = dQ;
  });
  finish_out(a, dqb);
  finish_result(a.extra_out[0], a.extra_out_shapes[0], a.extra_out_dtypes[0], dkb);
  finish_result(a.extra_out[1], a.extra_out_shapes[1], a.extra_out_dtypes[1], dvb);
}

}  // namespace tessel::cpu_detail
