// src/runtime/cuda/kernels/attention_kernels.cuh — the device code of fused attention (FlashAttention-2), the
// kernels behind src/runtime/cuda/kernels/attention.cu's launchers. The semantics are the CPU kernels'
// (src/runtime/cpu/cpu_kernels_attention.cpp, the oracle): out = softmax(scale q kᵀ, causal
// mask aligned to the end) v, lse = the natural-log row log-sum-exp, f32 accumulation; the
// backward recomputes the probabilities from q, k and lse. The geometry (tiles, causal ranges,
// launch plans) is src/runtime/cuda/kernels/attention_plan.hpp.
//
// Tensor-core path (bf16/f16, head_dim D = 64 or 128), on PTX mma.sync.m16n8k16 (f32
// accumulators) with operands from shared memory through ldmatrix (.trans for the operands that
// are stored [k, n] row-major: V in P·V, dO and Q in dV = Pᵀ dO and dK = dSᵀ Q, K in dQ = dS K),
// tiles loaded with cp.async (16-byte chunks, zero-filled beyond the sequence) into shared
// memory whose 16-byte chunks are XOR-swizzled by row (chunk c of row r at c ^ (r & 7): the 8 rows
// of an ldmatrix 8x8 read hit 8 different bank groups), the next K/V (or Q/dO) tile loading while
// the current one is computed (double buffering):
//  * forward: a block of 128 queries x 4 warps (32 rows each: two m16 tiles share every K and V
//    fragment), key tiles of 64 (32 for D = 128) up to the causal limit (tiles with no visible key are never
//    loaded), online softmax in the log2 domain (scores scaled by scale·log2 e, exp2), P rounded
//    to the 16-bit type in registers as the A operand of P·V (FlashAttention-2's register
//    reuse: the S accumulator fragment is the A fragment), the per-element mask only on tiles
//    that cross the diagonal or the end of the keys; D = 64 keeps Q's fragments in registers;
//  * backward: D_i = rowsum(dO_i O_i) first (a warp per row), then a dK/dV kernel (a block of 64
//    keys, 4 warps of 16 key rows, looping over the query blocks (64, or 32 for D = 128) that see them: Sᵀ = K Qᵀ,
//    Pᵀ = exp2(Sᵀ·scale·log2 e − lse_i·log2 e), dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D_i),
//    dV += Pᵀ dO, dK += dSᵀ Q) and a dQ kernel (a block of 64 queries, looping over the key
//    blocks they see: S, P, dP = dO Vᵀ, dS, dQ += dS K). No atomics anywhere: every dQ, dK and dV
//    element is summed by one thread in a fixed order, so repeated runs are bit-identical.
// Generic path (f32, any dtype with another D <= 256): the same algorithm on f32 tiles in shared
// memory (square tiles of 32 or 16), one thread per score, warp-shuffle row statistics.
//
// Portability: the kernels are written against a few primitives (ta_* below: thread and block
// index, shared memory, barrier, shuffle, ldmatrix, mma, cp.async). Under nvcc they are the CUDA
// intrinsics and PTX; with TESSEL_ATTENTION_EMULATE the includer defines them (the host tests run
// these very kernels on an emulated warp: tests/unit/test_cuda_attention_plan.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "attention_plan.hpp"

#if !defined(TESSEL_ATTENTION_EMULATE)
#include "device_common.cuh"  // to_f, from_f

// The tensor-core kernels need sm_80 (cp.async, bf16 mma.sync); compiled for an older
// architecture their body is a trap and the launchers never pick them there.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TA_HAS_SM80 1
#else
#define TA_HAS_SM80 0
#endif

#define TA_DEV __device__ __forceinline__
#define TA_KERNEL(threads) __global__ void __launch_bounds__(threads)
#define TA_UNROLL _Pragma("unroll")

namespace tessel::cuda_kernels::attn {

using ta_bf16 = __nv_bfloat16;
using ta_f16 = __half;

extern __shared__ __align__(16) char ta_smem_buf[];

TA_DEV int ta_thread() { return static_cast<int>(threadIdx.x); }
TA_DEV int64_t ta_block() { return static_cast<int64_t>(blockIdx.x); }
TA_DEV char* ta_smem() { return ta_smem_buf; }
TA_DEV void ta_sync() { __syncthreads(); }
TA_DEV float ta_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
TA_DEV float ta_exp2(float x) { return exp2f(x); }
TA_DEV float ta_exp(float x) { return expf(x); }
TA_DEV float ta_log(float x) { return logf(x); }

TA_DEV uint32_t ta_smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 (16 bytes) and gets
// in r[m] row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (.trans: column l / 4, rows
// 2 (l % 4) and 2 (l % 4) + 1), the lower column (row) in the low half.
TA_DEV void ta_ldsm_x4(uint32_t (&r)[4], const void* p) {
#if TA_HAS_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ta_smem_addr(p)));
#endif
}
TA_DEV void ta_ldsm_x4_t(uint32_t (&r)[4], const void* p) {
#if TA_HAS_SM80
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ta_smem_addr(p)));
#endif
}

// c += a b on a 16x8x16 tile: a row-major 16x16 (4 registers of two 16-bit values), b
// column-major 16x8 (b0: k 2t, 2t+1; b1: k 2t+8, 2t+9; column g), c 16x8 f32.
template <class T>
TA_DEV void ta_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
TA_DEV void ta_mma<ta_bf16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if TA_HAS_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
TA_DEV void ta_mma<ta_f16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if TA_HAS_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 16 bytes global -> shared, asynchronously; !valid: 16 zero bytes (nothing is read).
TA_DEV void ta_cp_async16(void* dst, const void* src, bool valid) {
#if TA_HAS_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ta_smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}
TA_DEV void ta_cp_async_commit() {
#if TA_HAS_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this thread are pending.
template <int N>
TA_DEV void ta_cp_async_wait() {
#if TA_HAS_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Two floats as the two 16-bit halves of an MMA operand register (lo in the low half).
template <class T>
TA_DEV uint32_t ta_pack2(float lo, float hi);
template <>
TA_DEV uint32_t ta_pack2<ta_bf16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
TA_DEV uint32_t ta_pack2<ta_f16>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Stores two adjacent elements (p 4-byte aligned).
template <class T>
TA_DEV void ta_store2(T* p, float a, float b) {
  const uint32_t v = ta_pack2<T>(a, b);
  *reinterpret_cast<uint32_t*>(p) = v;
}

}  // namespace tessel::cuda_kernels::attn
#endif  // !TESSEL_ATTENTION_EMULATE

namespace tessel::cuda_kernels::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Arguments of every kernel (by value). Pointers of the forward: q, k, v, out (o), lse; of the
// backward: q, k, v, out (o), dout, lse, dsum (scratch: D_i), dq, dk, dv.
struct Args {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o_in = nullptr;   // backward: the forward's result
  const void* dout = nullptr;   // backward
  void* out = nullptr;          // forward: the result; backward: dq
  void* dk = nullptr;
  void* dv = nullptr;
  float* lse = nullptr;         // forward: written; backward: read
  float* dsum = nullptr;        // backward: D_i, [B*H*Sq]
  AttentionDims p;
  int64_t bh = 0;               // B * H
  int64_t tiles = 0;            // tiles per (batch, head) of this kernel's grid
  float scale_log2 = 0;         // scale * log2(e)
};

// Element offset of chunk c (8 elements) of row r in a swizzled [rows, D] 16-bit tile.
template <int D>
TA_DEV int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

// Where a thread works: its index, warp and lane (g = lane / 4 and t4 = lane % 4 in the MMA
// fragments), its block's (batch*head, tile) and the element offsets of that batch and head in q
// (out, dout, dq) and in k (v, dk, dv).
struct Place {
  int tid, warp, lane, g, t4;
  int64_t bh, tile, qoff, koff;
};
TA_DEV Place place_of(const Args& a, bool heavy_last) {
  Place w;
  w.tid = ta_thread();
  w.warp = w.tid >> 5;
  w.lane = w.tid & 31;
  w.g = w.lane >> 2;
  w.t4 = w.lane & 3;
  const BlockCoord bc = block_coord(ta_block(), a.bh, a.tiles, heavy_last);
  w.bh = bc.bh;
  w.tile = bc.tile;
  const int64_t b = bc.bh / a.p.H, h = bc.bh % a.p.H;
  w.qoff = b * a.p.q_sb + h * a.p.q_sh;
  w.koff = b * a.p.k_sb + h * a.p.k_sh;
  return w;
}

// Rows [0, R) of a [R, D] tile from g (row stride ss elements) into the swizzled tile s; rows
// >= valid are zero-filled (their source is never read).
template <class T, int D, int R, int NT>
TA_DEV void load_tile(T* s, const T* g, int64_t ss, int64_t valid, int tid) {
  constexpr int C = D / 8;
  static_assert((R * C) % NT == 0, "tile chunks must divide among the threads");
  TA_UNROLL
  for (int i = 0; i < R * C / NT; ++i) {
    const int idx = tid + i * NT;
    const int r = idx / C, c = idx % C;
    const bool ok = r < valid;
    ta_cp_async16(s + swz<D>(r, c), ok ? g + r * ss + c * 8 : g, ok);
  }
}

// The A fragment (16 x 16, rows r0.., head_dim columns 16 kk..) of a swizzled tile.
template <int D, class T>
TA_DEV void load_a(uint32_t (&a)[4], const T* s, int r0, int kk, int lane) {
  ta_ldsm_x4(a, s + swz<D>(r0 + (lane & 15), 2 * kk + (lane >> 4)));
}
// B fragments of two n8 tiles (rows n0.. n0+15 of the tile as the n index, head_dim 16 kk.. as
// k): b[0], b[1] for rows n0..n0+7, b[2], b[3] for n0+8..n0+15.
template <int D, class T>
TA_DEV void load_b(uint32_t (&b)[4], const T* s, int n0, int kk, int lane) {
  ta_ldsm_x4(b, s + swz<D>(n0 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
}
// B fragments of two n8 tiles of a tile stored [k, n] (rows k0..k0+15 as k, head_dim columns
// 16 dp.. as n): b[0], b[1] for columns 16 dp..+7, b[2], b[3] for 16 dp + 8..+15.
template <int D, class T>
TA_DEV void load_b_trans(uint32_t (&b)[4], const T* s, int k0, int dp, int lane) {
  ta_ldsm_x4_t(b, s + swz<D>(k0 + (lane & 15), 2 * dp + (lane >> 4)));
}
// The A fragment of k-step kk from accumulator fragments x[n8 tile][4] (FlashAttention-2's
// register reuse: C fragments of n-tiles 2kk and 2kk+1 are the A fragment of k 16kk..16kk+15).
template <class T, int N>
TA_DEV void acc_to_a(uint32_t (&a)[4], const float (&x)[N][4], int kk) {
  a[0] = ta_pack2<T>(x[2 * kk][0], x[2 * kk][1]);
  a[1] = ta_pack2<T>(x[2 * kk][2], x[2 * kk][3]);
  a[2] = ta_pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
  a[3] = ta_pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

// Two [R, D] tiles (K and V, or Q and dO) of consecutive row blocks `first`, `first` + 1, ...
// of x and y (row stride ss, `rows` rows), double-buffered in the swizzled sx and sy ([2][R][D]
// each): step i + 1's blocks load (cp.async) while step i's are computed.
template <class T, int D, int R, int NT>
struct TilePair {
  T* sx;
  T* sy;
  const T* x;
  const T* y;
  int64_t ss, rows, first;
  int tid;
  TA_DEV void load(int i) const {
    const int64_t r0 = (first + i) * R;
    load_tile<T, D, R, NT>(sx + (i & 1) * R * D, x + r0 * ss, ss, rows - r0, tid);
    load_tile<T, D, R, NT>(sy + (i & 1) * R * D, y + r0 * ss, ss, rows - r0, tid);
  }
  TA_DEV const T* bx(int i) const { return sx + (i & 1) * R * D; }
  TA_DEV const T* by(int i) const { return sy + (i & 1) * R * D; }
  // The top of step i of `steps`: step i + 1's tiles start loading (and extra(i + 1) runs: more of
  // that step's loads), step i's are waited for, then a block barrier. Each step ends with a
  // barrier too (every warp done with its buffer before step i + 2 overwrites it).
  template <class F>
  TA_DEV void advance(int i, int steps, F&& extra) const {
    if (i + 1 < steps) {
      load(i + 1);
      extra(i + 1);
    }
    ta_cp_async_commit();
    ta_cp_async_wait<1>();
    ta_sync();
  }
};
struct NoExtra {
  TA_DEV void operator()(int) const {}
};

TA_DEV float quad_max(float v) {
  v = fmaxf(v, ta_shfl_xor(v, 1));
  return fmaxf(v, ta_shfl_xor(v, 2));
}
TA_DEV float quad_sum(float v) {
  v += ta_shfl_xor(v, 1);
  return v + ta_shfl_xor(v, 2);
}
TA_DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, ta_shfl_xor(v, o));
  return v;
}
TA_DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += ta_shfl_xor(v, o);
  return v;
}

// ============================== tensor-core forward ==============================================
template <class T, int D, bool kCausal>
TA_KERNEL(kFwdThreads) fwd_tc(const Args a) {
#if TA_HAS_SM80
  constexpr int BM = kFwdBlockM, BN = fwd_block_n(D), NT = kFwdThreads;
  constexpr int KD = D / 16;  // k-steps over head_dim
  constexpr int NN = BN / 8;  // n8 tiles of S
  constexpr int ND = D / 8;   // n8 tiles of O
  constexpr bool kQRegs = D <= 64;
  const AttentionDims& p = a.p;
  const Place w = place_of(a, kCausal);
  const int tid = w.tid, lane = w.lane, g = w.g, t4 = w.t4;
  const int64_t m0 = w.tile * BM;
  const T* q = static_cast<const T*>(a.q) + w.qoff;
  const T* k = static_cast<const T*>(a.k) + w.koff;
  const T* v = static_cast<const T*>(a.v) + w.koff;
  const int n_tiles = static_cast<int>(ceil_div(kv_end(p, m0, BM), BN));
  T* sQ = reinterpret_cast<T*>(ta_smem());
  T* sK = sQ + BM * D;  // [2][BN][D], then V [2][BN][D]
  const TilePair<T, D, BN, NT> kv{sK, sK + 2 * BN * D, k, v, p.k_ss, p.Sk, 0, tid};

  load_tile<T, D, BM, NT>(sQ, q + m0 * p.q_ss, p.q_ss, p.Sq - m0, tid);
  if (n_tiles > 0) kv.load(0);
  ta_cp_async_commit();

  float o[2][ND][4];
  float m_run[2][2], l_run[2][2];
  TA_UNROLL
  for (int mt = 0; mt < 2; ++mt) {
    TA_UNROLL
    for (int dt = 0; dt < ND; ++dt)
      TA_UNROLL
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    TA_UNROLL
    for (int hf = 0; hf < 2; ++hf) m_run[mt][hf] = -INFINITY, l_run[mt][hf] = 0.0f;
  }
  uint32_t qf[kQRegs ? 2 : 1][kQRegs ? KD : 1][4];
  const int wr = w.warp * 32;  // the warp's first row in the block

  for (int n = 0; n < n_tiles; ++n) {
    kv.advance(n, n_tiles, NoExtra{});
    const T* sKb = kv.bx(n);
    const T* sVb = kv.by(n);
    if constexpr (kQRegs) {
      if (n == 0) {
        TA_UNROLL
        for (int mt = 0; mt < 2; ++mt)
          TA_UNROLL
          for (int kk = 0; kk < KD; ++kk) load_a<D>(qf[mt][kk], sQ, wr + mt * 16, kk, lane);
      }
    }
    // S = Q Kᵀ
    float s[2][NN][4];
    TA_UNROLL
    for (int mt = 0; mt < 2; ++mt)
      TA_UNROLL
      for (int nt = 0; nt < NN; ++nt)
        TA_UNROLL
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
    TA_UNROLL
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t qa[2][4];
      TA_UNROLL
      for (int mt = 0; mt < 2; ++mt) {
        if constexpr (kQRegs) {
          TA_UNROLL
          for (int e = 0; e < 4; ++e) qa[mt][e] = qf[mt][kk][e];
        } else {
          load_a<D>(qa[mt], sQ, wr + mt * 16, kk, lane);
        }
      }
      TA_UNROLL
      for (int np = 0; np < NN / 2; ++np) {
        uint32_t kb[4];
        load_b<D>(kb, sKb, np * 16, kk, lane);
        TA_UNROLL
        for (int mt = 0; mt < 2; ++mt) {
          ta_mma<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          ta_mma<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
    // Scale into the log2 domain; mask the tiles that cross the diagonal or the end of the keys.
    const int64_t j0 = int64_t(n) * BN;
    const bool need_mask = tile_needs_mask(p, m0, j0, BN);
    TA_UNROLL
    for (int mt = 0; mt < 2; ++mt)
      TA_UNROLL
      for (int nt = 0; nt < NN; ++nt)
        TA_UNROLL
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][nt][e] * a.scale_log2;
          if (need_mask) {
            const int64_t row = m0 + wr + mt * 16 + g + ((e >> 1) << 3);
            const int64_t col = j0 + nt * 8 + 2 * t4 + (e & 1);
            if (col >= p.Sk || (kCausal && col > row + p.offset)) x = -INFINITY;
          }
          s[mt][nt][e] = x;
        }
    // Online softmax: rows g (hf 0) and g + 8 (hf 1) of each m16 tile, shared by a lane quad.
    TA_UNROLL
    for (int mt = 0; mt < 2; ++mt)
      TA_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
        TA_UNROLL
        for (int nt = 0; nt < NN; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        mx = quad_max(mx);
        const float m_new = fmaxf(m_run[mt][hf], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: p = 0
        const float alpha = ta_exp2(m_run[mt][hf] - m_use);
        m_run[mt][hf] = m_new;
        float sum = 0.0f;
        TA_UNROLL
        for (int nt = 0; nt < NN; ++nt)
          TA_UNROLL
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            const float pv = ta_exp2(s[mt][nt][e] - m_use);
            s[mt][nt][e] = pv;
            sum += pv;
          }
        l_run[mt][hf] = l_run[mt][hf] * alpha + sum;  // this lane's columns; the quad sums at the end
        TA_UNROLL
        for (int dt = 0; dt < ND; ++dt) {
          o[mt][dt][2 * hf] *= alpha;
          o[mt][dt][2 * hf + 1] *= alpha;
        }
      }
    // O += P V
    TA_UNROLL
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[2][4];
      TA_UNROLL
      for (int mt = 0; mt < 2; ++mt) acc_to_a<T>(pa[mt], s[mt], kk);
      TA_UNROLL
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        load_b_trans<D>(vb, sVb, kk * 16, dp, lane);
        TA_UNROLL
        for (int mt = 0; mt < 2; ++mt) {
          ta_mma<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          ta_mma<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    ta_sync();  // every warp is done with buffer `buf` before the next tile's loads overwrite it
  }
  ta_cp_async_wait<0>();

  T* out = static_cast<T*>(a.out) + w.qoff;
  TA_UNROLL
  for (int mt = 0; mt < 2; ++mt)
    TA_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const float l = quad_sum(l_run[mt][hf]);
      const int64_t row = m0 + wr + mt * 16 + g + 8 * hf;
      if (row < p.Sq) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        TA_UNROLL
        for (int dt = 0; dt < ND; ++dt)
          ta_store2<T>(out + row * p.q_ss + dt * 8 + 2 * t4, o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
        if (t4 == 0) a.lse[w.bh * p.Sq + row] = l > 0.0f ? m_run[mt][hf] * kLn2 + ta_log(l) : -INFINITY;
      }
    }
#else
  __trap();  // never launched there: attention.cu checks the binary's architecture first
#endif
}

// ============================== backward: D_i ====================================================
// dsum[bh * Sq + i] = sum_d dO[i, d] O[i, d] in f32, a warp per row (lane-strided, then a fixed
// shuffle tree).
template <class T>
TA_KERNEL(kDsumThreads) bwd_dsum(const Args a) {
  const AttentionDims& p = a.p;
  const int tid = ta_thread(), lane = tid & 31;
  const int64_t row = ta_block() * kDsumRowsPerBlock + (tid >> 5);
  if (row >= a.bh * p.Sq) return;  // whole warps
  const int64_t bh = row / p.Sq, i = row % p.Sq, b = bh / p.H, h = bh % p.H;
  const int64_t off = b * p.q_sb + h * p.q_sh + i * p.q_ss;
  const T* o = static_cast<const T*>(a.o_in) + off;
  const T* d = static_cast<const T*>(a.dout) + off;
  float acc = 0.0f;
  for (int64_t c = lane; c < p.D; c += 32) acc += to_f<T>(o[c]) * to_f<T>(d[c]);
  acc = warp_sum(acc);
  if (lane == 0) a.dsum[row] = acc;
}

// ============================== tensor-core backward ==============================================
// The warp-level pieces both backward kernels share. Each warp owns 16 rows (keys in dK/dV, queries
// in dQ) whose two A operands (K and V, or Q and dO) stay in registers for D = 64 (`f1`, `f2`) or
// are read from their swizzled tiles `a1`, `a2` at every k-step.
template <int D, bool kRegs>
struct RowOperands {
  static constexpr int KD = D / 16;
  uint32_t f1[kRegs ? KD : 1][4], f2[kRegs ? KD : 1][4];
  template <class T>
  TA_DEV void load(const T* a1, const T* a2, int r0, int lane) {
    if constexpr (kRegs) {
      TA_UNROLL
      for (int kk = 0; kk < KD; ++kk) {
        load_a<D>(f1[kk], a1, r0, kk, lane);
        load_a<D>(f2[kk], a2, r0, kk, lane);
      }
    }
  }
  // The A fragments of k-step kk.
  template <class T>
  TA_DEV void get(uint32_t (&x1)[4], uint32_t (&x2)[4], const T* a1, const T* a2, int r0, int kk, int lane) const {
    if constexpr (kRegs) {
      TA_UNROLL
      for (int e = 0; e < 4; ++e) x1[e] = f1[kk][e], x2[e] = f2[kk][e];
    } else {
      load_a<D>(x1, a1, r0, kk, lane);
      load_a<D>(x2, a2, r0, kk, lane);
    }
  }
};

// x = A1 B1ᵀ and y = A2 B2ᵀ for the warp's 16 rows, B1 and B2 the N rows of the swizzled tiles b1,
// b2 (the k index: head_dim).
template <class T, int D, int N, bool kRegs>
TA_DEV void two_products(float (&x)[N / 8][4], float (&y)[N / 8][4], const RowOperands<D, kRegs>& ops, const T* a1,
                         const T* a2, int r0, const T* b1, const T* b2, int lane) {
  TA_UNROLL
  for (int nt = 0; nt < N / 8; ++nt)
    TA_UNROLL
    for (int e = 0; e < 4; ++e) x[nt][e] = 0.0f, y[nt][e] = 0.0f;
  TA_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t x1[4], x2[4];
    ops.get(x1, x2, a1, a2, r0, kk, lane);
    TA_UNROLL
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bb[4];
      load_b<D>(bb, b1, np * 16, kk, lane);
      ta_mma<T>(x[2 * np], x1, bb[0], bb[1]);
      ta_mma<T>(x[2 * np + 1], x1, bb[2], bb[3]);
      load_b<D>(bb, b2, np * 16, kk, lane);
      ta_mma<T>(y[2 * np], x2, bb[0], bb[1]);
      ta_mma<T>(y[2 * np + 1], x2, bb[2], bb[3]);
    }
  }
}

// acc += X B for the warp's 16 rows: X [16, K] in accumulator fragments (the A operand through
// acc_to_a), B [K, D] the first K rows of the swizzled tile b, read transposed.
template <class T, int D, int K>
TA_DEV void accumulate_product(float (&acc)[D / 8][4], const float (&x)[K / 8][4], const T* b, int lane) {
  TA_UNROLL
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t xa[4];
    acc_to_a<T>(xa, x, kk);
    TA_UNROLL
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bb[4];
      load_b_trans<D>(bb, b, kk * 16, dp, lane);
      ta_mma<T>(acc[2 * dp], xa, bb[0], bb[1]);
      ta_mma<T>(acc[2 * dp + 1], xa, bb[2], bb[3]);
    }
  }
}

template <int ND>
TA_DEV void zero_acc(float (&x)[ND][4]) {
  TA_UNROLL
  for (int dt = 0; dt < ND; ++dt)
    TA_UNROLL
    for (int e = 0; e < 4; ++e) x[dt][e] = 0.0f;
}

// Rows row0 + g and row0 + g + 8 of out (row stride ss), those below `rows`: acc * scale.
template <class T, int D>
TA_DEV void store_rows(T* out, int64_t row0, int64_t rows, int64_t ss, const float (&acc)[D / 8][4], float scale,
                       int lane) {
  const int g = lane >> 2, t4 = lane & 3;
  TA_UNROLL
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t row = row0 + g + 8 * hf;
    if (row < rows) {
      TA_UNROLL
      for (int dt = 0; dt < D / 8; ++dt)
        ta_store2<T>(out + row * ss + dt * 8 + 2 * t4, acc[dt][2 * hf] * scale, acc[dt][2 * hf + 1] * scale);
    }
  }
}

// dK, dV: a block of 64 keys (4 warps of 16 key rows) loops over the query tiles (64 or 32) that see
// them.
template <class T, int D, bool kCausal>
TA_KERNEL(kBwdThreads) bwd_dkdv_tc(const Args a) {
#if TA_HAS_SM80
  constexpr int BN = kDkvBlockN, BM = dkdv_block_m(D), NT = kBwdThreads, NQ = BM / 8;
  const AttentionDims& p = a.p;
  const Place w = place_of(a, false);
  const int tid = w.tid, lane = w.lane, g = w.g, t4 = w.t4;
  const int64_t n0 = w.tile * BN, koff = w.koff;
  const T* q = static_cast<const T*>(a.q) + w.qoff;
  const T* dout = static_cast<const T*>(a.dout) + w.qoff;
  const float* lse = a.lse + w.bh * p.Sq;
  const float* dsum = a.dsum + w.bh * p.Sq;
  T* sK = reinterpret_cast<T*>(ta_smem());
  T* sV = sK + BN * D;
  T* sQ = sV + BN * D;  // [2][BM][D], then dO [2][BM][D]
  float* sL = reinterpret_cast<float*>(sQ + 4 * BM * D);  // lse·log2 e, [2][BM]
  float* sDs = sL + 2 * BM;                               // D_i, [2][BM]
  const int64_t t_begin = q_begin(p, n0) / BM;
  const int steps = static_cast<int>(ceil_div(p.Sq, BM) - t_begin);
  const TilePair<T, D, BM, NT> qo{sQ, sQ + 2 * BM * D, q, dout, p.q_ss, p.Sq, t_begin, tid};
  // The row statistics of step i's query tile, by plain stores (rows beyond Sq: lse +inf, so
  // P = 0 there, and D_i 0).
  auto load_stats = [&](int i) {
    const int64_t row = (t_begin + i) * BM + tid;
    if (tid < BM) {
      const bool ok = row < p.Sq;
      sL[(i & 1) * BM + tid] = ok ? lse[row] * kLog2e : INFINITY;
      sDs[(i & 1) * BM + tid] = ok ? dsum[row] : 0.0f;
    }
  };
  load_tile<T, D, BN, NT>(sK, static_cast<const T*>(a.k) + koff + n0 * p.k_ss, p.k_ss, p.Sk - n0, tid);
  load_tile<T, D, BN, NT>(sV, static_cast<const T*>(a.v) + koff + n0 * p.k_ss, p.k_ss, p.Sk - n0, tid);
  if (steps > 0) {
    qo.load(0);
    load_stats(0);
  }
  ta_cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
  zero_acc(dk);
  zero_acc(dv);
  RowOperands<D, (D <= 64)> ops;  // K and V rows of this warp
  const int wr = w.warp * 16;    // the warp's first key row in the block

  for (int i = 0; i < steps; ++i) {
    qo.advance(i, steps, load_stats);
    const T* sQb = qo.bx(i);
    const T* sOb = qo.by(i);
    const float* sLb = sL + (i & 1) * BM;
    const float* sDb = sDs + (i & 1) * BM;
    if (i == 0) ops.load(sK, sV, wr, lane);
    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: 16 key rows x 64 query columns per warp.
    float st[NQ][4], dpt[NQ][4];
    two_products<T, D, BM>(st, dpt, ops, sK, sV, wr, sQb, sOb, lane);
    // Pᵀ = exp2(Sᵀ scale log2 e − lse log2 e) (masked: 0) and dSᵀ = Pᵀ ∘ (dPᵀ − D_i), into st, dpt.
    const int64_t q0 = (t_begin + i) * BM;
    const bool need_mask = causal_partial(p, q0, n0, BN);
    TA_UNROLL
    for (int nt = 0; nt < NQ; ++nt)
      TA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + 2 * t4 + (e & 1);
        float pv = ta_exp2(st[nt][e] * a.scale_log2 - sLb[qc]);
        if (kCausal && need_mask && n0 + wr + g + ((e >> 1) << 3) > q0 + qc + p.offset) pv = 0.0f;
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - sDb[qc]);
      }
    // dV += Pᵀ dO, dK += dSᵀ Q (k = the query index).
    accumulate_product<T, D, BM>(dv, st, sOb, lane);
    accumulate_product<T, D, BM>(dk, dpt, sQb, lane);
    ta_sync();
  }
  ta_cp_async_wait<0>();
  store_rows<T, D>(static_cast<T*>(a.dk) + koff, n0 + wr, p.Sk, p.k_ss, dk, p.scale, lane);
  store_rows<T, D>(static_cast<T*>(a.dv) + koff, n0 + wr, p.Sk, p.k_ss, dv, 1.0f, lane);
#else
  __trap();  // never launched there: attention.cu checks the binary's architecture first
#endif
}

// dQ: a block of 64 queries (4 warps of 16 query rows) loops over the key tiles they see.
template <class T, int D, bool kCausal>
TA_KERNEL(kBwdThreads) bwd_dq_tc(const Args a) {
#if TA_HAS_SM80
  constexpr int BM = kDqBlockM, BN = kDqBlockN, NT = kBwdThreads, NN = BN / 8;
  const AttentionDims& p = a.p;
  const Place w = place_of(a, kCausal);
  const int tid = w.tid, lane = w.lane, g = w.g, t4 = w.t4;
  const int64_t m0 = w.tile * BM, qoff = w.qoff;
  const T* k = static_cast<const T*>(a.k) + w.koff;
  const T* v = static_cast<const T*>(a.v) + w.koff;
  const int n_tiles = static_cast<int>(ceil_div(kv_end(p, m0, BM), BN));
  T* sQ = reinterpret_cast<T*>(ta_smem());
  T* sO = sQ + BM * D;
  T* sK = sO + BM * D;  // [2][BN][D], then V [2][BN][D]
  const TilePair<T, D, BN, NT> kv{sK, sK + 2 * BN * D, k, v, p.k_ss, p.Sk, 0, tid};
  const int wr = w.warp * 16;  // the warp's first query row in the block

  load_tile<T, D, BM, NT>(sQ, static_cast<const T*>(a.q) + qoff + m0 * p.q_ss, p.q_ss, p.Sq - m0, tid);
  load_tile<T, D, BM, NT>(sO, static_cast<const T*>(a.dout) + qoff + m0 * p.q_ss, p.q_ss, p.Sq - m0, tid);
  if (n_tiles > 0) kv.load(0);
  ta_cp_async_commit();
  // This lane's two rows (g and g + 8 of the warp's 16): lse·log2 e and D_i.
  float lrow[2], drow[2];
  TA_UNROLL
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t row = m0 + wr + g + 8 * hf;
    const bool ok = row < p.Sq;
    lrow[hf] = ok ? a.lse[w.bh * p.Sq + row] * kLog2e : INFINITY;
    drow[hf] = ok ? a.dsum[w.bh * p.Sq + row] : 0.0f;
  }
  float dq[D / 8][4];
  zero_acc(dq);
  RowOperands<D, (D <= 64)> ops;  // Q and dO rows of this warp

  for (int n = 0; n < n_tiles; ++n) {
    kv.advance(n, n_tiles, NoExtra{});
    const T* sKb = kv.bx(n);
    if (n == 0) ops.load(sQ, sO, wr, lane);
    // S = Q Kᵀ and dP = dO Vᵀ: 16 query rows x 64 key columns per warp.
    float s[NN][4], dp[NN][4];
    two_products<T, D, BN>(s, dp, ops, sQ, sO, wr, sKb, kv.by(n), lane);
    // dS = P ∘ (dP − D_i) into s.
    const int64_t j0 = int64_t(n) * BN;
    const bool need_mask = tile_needs_mask(p, m0, j0, BN);
    TA_UNROLL
    for (int nt = 0; nt < NN; ++nt)
      TA_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1;
        float pv = ta_exp2(s[nt][e] * a.scale_log2 - lrow[hf]);
        if (need_mask) {
          const int64_t row = m0 + wr + g + 8 * hf;
          const int64_t col = j0 + nt * 8 + 2 * t4 + (e & 1);
          if (col >= p.Sk || (kCausal && col > row + p.offset)) pv = 0.0f;
        }
        s[nt][e] = pv * (dp[nt][e] - drow[hf]);
      }
    // dQ += dS K (k = the key index: K read [k, n]).
    accumulate_product<T, D, BN>(dq, s, sKb, lane);
    ta_sync();
  }
  ta_cp_async_wait<0>();
  store_rows<T, D>(static_cast<T*>(a.out) + qoff, m0 + wr, p.Sq, p.q_ss, dq, p.scale, lane);
#else
  __trap();  // never launched there: attention.cu checks the binary's architecture first
#endif
}

// ============================== generic path (f32 tiles) =========================================
struct GenericTiles {
  int tile, pitch;
  float *q, *o, *k, *v;  // [tile][pitch] each (o: dO)
  float *p, *ds;         // [tile][tile + 1]
  float *r0, *r1, *r2;   // [tile] each
};
TA_DEV GenericTiles generic_tiles(int64_t D) {
  GenericTiles t;
  t.tile = generic_tile(D);
  t.pitch = generic_pitch(D);
  float* f = reinterpret_cast<float*>(ta_smem());
  const int sq = t.tile * t.pitch, ss = t.tile * (t.tile + 1);
  t.q = f;
  t.o = f + sq;
  t.k = f + 2 * sq;
  t.v = f + 3 * sq;
  t.p = f + 4 * sq;
  t.ds = t.p + ss;
  t.r0 = t.ds + ss;
  t.r1 = t.r0 + t.tile;
  t.r2 = t.r1 + t.tile;
  return t;
}

// Rows [0, tile) of a [tile, D] block of g (row stride ss) as f32; rows >= valid are 0.
template <class T>
TA_DEV void generic_load(float* s, int pitch, const T* g, int64_t ss, int64_t valid, int tile, int D, int tid) {
  for (int e = tid; e < tile * D; e += kGenericThreads) {
    const int r = e / D, c = e % D;
    s[r * pitch + c] = r < valid ? to_f<T>(g[r * ss + c]) : 0.0f;
  }
}

TA_DEV float generic_dot(const float* x, const float* y, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; ++d) acc += x[d] * y[d];
  return acc;
}

// The accumulators of a generic kernel (element e = tid + i * threads of a [tile, D] block:
// row e / D, column e % D) stored to rows row0.. of out (row stride ss), those below `rows`,
// times scale(row in the tile).
template <class T, class Scale>
TA_DEV void generic_store(T* out, int64_t row0, int64_t rows, int64_t ss, const float (&acc)[kGenericAcc], int tile,
                          int D, int tid, Scale&& scale) {
  TA_UNROLL
  for (int i = 0; i < kGenericAcc; ++i) {
    const int e = tid + i * kGenericThreads;
    if (e < tile * D) {
      const int r = e / D, d = e % D;
      if (row0 + r < rows) out[(row0 + r) * ss + d] = from_f<T>(acc[i] * scale(r));
    }
  }
}
TA_DEV void generic_zero(float (&acc)[kGenericAcc]) {
  TA_UNROLL
  for (int i = 0; i < kGenericAcc; ++i) acc[i] = 0.0f;
}

template <class T>
TA_KERNEL(kGenericThreads) fwd_generic(const Args a) {
  const AttentionDims& p = a.p;
  const int D = static_cast<int>(p.D);
  const Place w = place_of(a, p.causal);
  const int tid = w.tid, warp = w.warp, lane = w.lane;
  GenericTiles s = generic_tiles(D);
  const int TT = s.tile, P = s.pitch;
  const int64_t m0 = w.tile * TT;
  const T* q = static_cast<const T*>(a.q) + w.qoff;
  const T* k = static_cast<const T*>(a.k) + w.koff;
  const T* v = static_cast<const T*>(a.v) + w.koff;
  float* sM = s.r0;  // running max
  float* sL = s.r1;  // running sum
  float* sA = s.r2;  // this tile's rescale factor
  generic_load<T>(s.q, P, q + m0 * p.q_ss, p.q_ss, p.Sq - m0, TT, D, tid);
  if (tid < TT) sM[tid] = -INFINITY, sL[tid] = 0.0f;
  float acc[kGenericAcc];
  generic_zero(acc);
  const int64_t n_tiles = ceil_div(kv_end(p, m0, TT), TT);
  for (int64_t n = 0; n < n_tiles; ++n) {
    const int64_t j0 = n * TT;
    ta_sync();  // the previous tile's readers are done
    generic_load<T>(s.k, P, k + j0 * p.k_ss, p.k_ss, p.Sk - j0, TT, D, tid);
    generic_load<T>(s.v, P, v + j0 * p.k_ss, p.k_ss, p.Sk - j0, TT, D, tid);
    ta_sync();
    for (int e = tid; e < TT * TT; e += kGenericThreads) {
      const int r = e / TT, c = e % TT;
      float x = generic_dot(s.q + r * P, s.k + c * P, D) * p.scale;
      if (j0 + c >= p.Sk || !visible(p, m0 + r, j0 + c)) x = -INFINITY;
      s.p[r * (TT + 1) + c] = x;
    }
    ta_sync();
    for (int r = warp; r < TT; r += kGenericThreads / 32) {
      const float x = lane < TT ? s.p[r * (TT + 1) + lane] : -INFINITY;
      const float m_old = sM[r];
      const float m_new = fmaxf(m_old, warp_max(x));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float pv = ta_exp(x - m_use);
      if (lane < TT) s.p[r * (TT + 1) + lane] = pv;
      const float sum = warp_sum(pv);
      if (lane == 0) {
        const float alpha = ta_exp(m_old - m_use);
        sL[r] = sL[r] * alpha + sum;
        sM[r] = m_new;
        sA[r] = alpha;
      }
    }
    ta_sync();
    TA_UNROLL
    for (int i = 0; i < kGenericAcc; ++i) {
      const int e = tid + i * kGenericThreads;
      if (e < TT * D) {
        const int r = e / D, d = e % D;
        float x = acc[i] * sA[r];
        for (int c = 0; c < TT; ++c) x += s.p[r * (TT + 1) + c] * s.v[c * P + d];
        acc[i] = x;
      }
    }
  }
  ta_sync();
  generic_store(static_cast<T*>(a.out) + w.qoff, m0, p.Sq, p.q_ss, acc, TT, D, tid,
                [&](int r) { return sL[r] > 0.0f ? 1.0f / sL[r] : 0.0f; });
  if (tid < TT && m0 + tid < p.Sq) {
    const float l = sL[tid];
    a.lse[w.bh * p.Sq + m0 + tid] = l > 0.0f ? sM[tid] + ta_log(l) : -INFINITY;
  }
}

// P and dS of the query tile in s.q / s.o (rows from i0; lse in s.r0, D_i in s.r1, +inf and 0
// beyond Sq) and the key tile in s.k / s.v (keys from j0) into s.p and s.ds.
TA_DEV void generic_p_ds(const GenericTiles& s, const AttentionDims& p, int64_t i0, int64_t j0, int D, int tid) {
  const int TT = s.tile, P = s.pitch;
  for (int e = tid; e < TT * TT; e += kGenericThreads) {
    const int r = e / TT, c = e % TT;
    const float x = generic_dot(s.q + r * P, s.k + c * P, D) * p.scale;
    const float dpv = generic_dot(s.o + r * P, s.v + c * P, D);
    float pv = ta_exp(x - s.r0[r]);
    if (j0 + c >= p.Sk || !visible(p, i0 + r, j0 + c)) pv = 0.0f;
    s.p[r * (TT + 1) + c] = pv;
    s.ds[r * (TT + 1) + c] = pv * (dpv - s.r1[r]);
  }
}

// The row statistics of query tile [i0, i0 + tile) into s.r0 (lse) and s.r1 (D_i).
TA_DEV void generic_stats(const GenericTiles& s, const Args& a, int64_t i0, int tid) {
  if (tid < s.tile) {
    const int64_t i = i0 + tid;
    const bool ok = i < a.p.Sq;
    s.r0[tid] = ok ? a.lse[i] : INFINITY;
    s.r1[tid] = ok ? a.dsum[i] : 0.0f;
  }
}

template <class T>
TA_KERNEL(kGenericThreads) bwd_dkdv_generic(Args a) {
  const AttentionDims& p = a.p;
  const int D = static_cast<int>(p.D);
  const Place w = place_of(a, false);
  const int tid = w.tid;
  GenericTiles s = generic_tiles(D);
  const int TT = s.tile, P = s.pitch;
  const int64_t n0 = w.tile * TT, koff = w.koff;
  const T* q = static_cast<const T*>(a.q) + w.qoff;
  const T* dout = static_cast<const T*>(a.dout) + w.qoff;
  a.lse += w.bh * p.Sq;
  a.dsum += w.bh * p.Sq;
  generic_load<T>(s.k, P, static_cast<const T*>(a.k) + koff + n0 * p.k_ss, p.k_ss, p.Sk - n0, TT, D, tid);
  generic_load<T>(s.v, P, static_cast<const T*>(a.v) + koff + n0 * p.k_ss, p.k_ss, p.Sk - n0, TT, D, tid);
  float dk[kGenericAcc], dv[kGenericAcc];
  generic_zero(dk);
  generic_zero(dv);
  for (int64_t i0 = q_begin(p, n0) / TT * TT; i0 < p.Sq; i0 += TT) {
    ta_sync();
    generic_load<T>(s.q, P, q + i0 * p.q_ss, p.q_ss, p.Sq - i0, TT, D, tid);
    generic_load<T>(s.o, P, dout + i0 * p.q_ss, p.q_ss, p.Sq - i0, TT, D, tid);
    generic_stats(s, a, i0, tid);
    ta_sync();
    generic_p_ds(s, p, i0, n0, D, tid);
    ta_sync();
    TA_UNROLL
    for (int i = 0; i < kGenericAcc; ++i) {
      const int e = tid + i * kGenericThreads;
      if (e < TT * D) {
        const int c = e / D, d = e % D;  // key row, head_dim column
        float xv = dv[i], xk = dk[i];
        for (int r = 0; r < TT; ++r) {
          xv += s.p[r * (TT + 1) + c] * s.o[r * P + d];
          xk += s.ds[r * (TT + 1) + c] * s.q[r * P + d];
        }
        dv[i] = xv, dk[i] = xk;
      }
    }
  }
  generic_store(static_cast<T*>(a.dk) + koff, n0, p.Sk, p.k_ss, dk, TT, D, tid, [&](int) { return p.scale; });
  generic_store(static_cast<T*>(a.dv) + koff, n0, p.Sk, p.k_ss, dv, TT, D, tid, [](int) { return 1.0f; });
}

template <class T>
TA_KERNEL(kGenericThreads) bwd_dq_generic(Args a) {
  const AttentionDims& p = a.p;
  const int D = static_cast<int>(p.D);
  const Place w = place_of(a, p.causal);
  const int tid = w.tid;
  GenericTiles s = generic_tiles(D);
  const int TT = s.tile, P = s.pitch;
  const int64_t m0 = w.tile * TT, qoff = w.qoff;
  const T* k = static_cast<const T*>(a.k) + w.koff;
  const T* v = static_cast<const T*>(a.v) + w.koff;
  a.lse += w.bh * p.Sq;
  a.dsum += w.bh * p.Sq;
  generic_load<T>(s.q, P, static_cast<const T*>(a.q) + qoff + m0 * p.q_ss, p.q_ss, p.Sq - m0, TT, D, tid);
  generic_load<T>(s.o, P, static_cast<const T*>(a.dout) + qoff + m0 * p.q_ss, p.q_ss, p.Sq - m0, TT, D, tid);
  generic_stats(s, a, m0, tid);
  float dq[kGenericAcc];
  generic_zero(dq);
  const int64_t end = kv_end(p, m0, TT);
  for (int64_t j0 = 0; j0 < end; j0 += TT) {
    ta_sync();
    generic_load<T>(s.k, P, k + j0 * p.k_ss, p.k_ss, p.Sk - j0, TT, D, tid);
    generic_load<T>(s.v, P, v + j0 * p.k_ss, p.k_ss, p.Sk - j0, TT, D, tid);
    ta_sync();
    generic_p_ds(s, p, m0, j0, D, tid);
    ta_sync();
    TA_UNROLL
    for (int i = 0; i < kGenericAcc; ++i) {
      const int e = tid + i * kGenericThreads;
      if (e < TT * D) {
        const int r = e / D, d = e % D;
        float x = dq[i];
        for (int c = 0; c < TT; ++c) x += s.ds[r * (TT + 1) + c] * s.k[c * P + d];
        dq[i] = x;
      }
    }
  }
  generic_store(static_cast<T*>(a.out) + qoff, m0, p.Sq, p.q_ss, dq, TT, D, tid, [&](int) { return p.scale; });
}

// ============================== dispatch ==========================================================
// The kernels of each direction for a plan (attention_plan.hpp), in launch order: the host calls
// launch(kernel, the plan's Launch for it, args, what) for each, kernel a pointer to the
// instantiation for the dtype (and, on the tensor-core path, head_dim and mask). attention.cu's
// launch puts it on a stream; the host tests' runs it on the emulated device.
template <class F>
void dispatch_dtype(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(ta_bf16{}); return;
    case DType::f16: f(ta_f16{}); return;
    default: break;
  }
  throw RuntimeError(std::string("cuda kernel ") + what + ": needs f32, bf16 or f16 operands, got " + dtype_name(t));
}

template <int V>
struct IntTag {
  static constexpr int value = V;
};
template <bool V>
struct BoolTag {
  static constexpr bool value = V;
};

// f(T{}, IntTag<D>{}, BoolTag<causal>{}) for the tensor-core instantiations (bf16/f16, D 64/128).
template <class F>
void dispatch_tc(DType t, int64_t D, bool causal, const char* what, F&& f) {
  auto with_d = [&](auto tag) {
    auto with_c = [&](auto d) {
      if (causal) f(tag, d, BoolTag<true>{});
      else f(tag, d, BoolTag<false>{});
    };
    if (D == 64) with_c(IntTag<64>{});
    else if (D == 128) with_c(IntTag<128>{});
    else throw RuntimeError(std::string("cuda kernel ") + what + ": no tensor-core kernel for head_dim " + std::to_string(D));
  };
  if (t == DType::bf16) with_d(ta_bf16{});
  else if (t == DType::f16) with_d(ta_f16{});
  else throw RuntimeError(std::string("cuda kernel ") + what + ": no tensor-core kernel for " + dtype_name(t));
}

// The arguments every kernel shares (tiles is set per launch from its plan).
inline Args make_args(const AttentionDims& p) {
  Args a;
  a.p = p;
  a.bh = p.B * p.H;
  a.scale_log2 = p.scale * kLog2e;
  return a;
}

template <class L>
void run_forward(const Plan& plan, DType t, const Args& a, L&& launch) {
  constexpr const char* what = "attention";
  if (plan.forward.blocks == 0) return;
  if (plan.path == Path::TensorCore) {
    dispatch_tc(t, a.p.D, a.p.causal, what, [&](auto tag, auto d, auto c) {
      launch(fwd_tc<decltype(tag), decltype(d)::value, decltype(c)::value>, plan.forward, a, what);
    });
    return;
  }
  dispatch_dtype(t, what, [&](auto tag) { launch(fwd_generic<decltype(tag)>, plan.forward, a, what); });
}

// D_i into a.dsum, then dK/dV and dQ (Sq > 0).
template <class L>
void run_backward(const Plan& plan, DType t, const Args& a, L&& launch) {
  constexpr const char* what = "attention_grad";
  dispatch_dtype(t, what, [&](auto tag) { launch(bwd_dsum<decltype(tag)>, plan.dsum, a, "attention_grad (D_i)"); });
  if (plan.path == Path::TensorCore) {
    dispatch_tc(t, a.p.D, a.p.causal, what, [&](auto tag, auto d, auto c) {
      using T = decltype(tag);
      constexpr int D = decltype(d)::value;
      constexpr bool C = decltype(c)::value;
      launch(bwd_dkdv_tc<T, D, C>, plan.dkdv, a, "attention_grad (dk, dv)");
      launch(bwd_dq_tc<T, D, C>, plan.dq, a, "attention_grad (dq)");
    });
    return;
  }
  dispatch_dtype(t, what, [&](auto tag) {
    using T = decltype(tag);
    launch(bwd_dkdv_generic<T>, plan.dkdv, a, "attention_grad (dk, dv)");
    launch(bwd_dq_generic<T>, plan.dq, a, "attention_grad (dq)");
  });
}

}  // namespace tessel::cuda_kernels::attn
