// src/runtime/cuda/kernels/attention_plan.hpp — the geometry of the CUDA attention kernels (src/runtime/cuda/kernels/attention.cu,
// src/runtime/cuda/kernels/attention_kernels.cuh), shared by the device code, the host launchers and the host
// tests (tests/unit/test_cuda_attention_plan.cpp): the problem (AttentionDims), the tile sizes
// of both paths, which keys a block of queries sees and which query blocks see a block of keys
// under the causal mask (so that tiles with no visible pair are never computed), which tiles
// need the mask at all, and the launch plan of each kernel (path, grid, threads, shared memory).
//
// Two paths:
//  * tensor cores (bf16/f16, head_dim 64 or 128, 16-byte aligned operands, an sm_80+ device):
//    FlashAttention-2's tiles on mma.sync m16n8k16 with ldmatrix and cp.async double buffering;
//  * generic (f32, any dtype with another head_dim up to 256, or whenever the tensor-core path
//    does not apply): f32 tiles in shared memory, one thread per score, f32 math throughout.
// No CUDA type here: the host compiler reads this header too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "elementwise_ops.hpp"  // TESSEL_HD
#include "tessel/core/common.hpp"  // DType, RuntimeError
#include "../../attention_geometry.hpp"

namespace tessel::cuda_kernels {

// One attention launch: sizes, element strides, the mask and the scale (the geometry the host-side
// checks of every backend fill, src/runtime/attention_geometry.hpp).
using AttentionDims = ::tessel::AttentionGeometry;

// The geometry of an AttentionParams (src/runtime/attention_params.hpp, which derives from it).
template <class Params>
AttentionDims attention_dims(const Params& a) {
  return static_cast<const AttentionDims&>(a);
}

namespace attn {

// ---- tile sizes --------------------------------------------------------------------------------
// Tensor-core forward: 128 queries per block, 4 warps of 32 query rows (two m16 tiles each, so
// every K/V fragment read from shared memory feeds two MMAs), key tiles of 64 (head_dim 64) or 32
// (head_dim 128: the O accumulators take 128 registers a thread, the scores then 32).
constexpr int kFwdBlockM = 128;
TESSEL_HD constexpr int fwd_block_n(int D) { return D <= 64 ? 64 : 32; }
constexpr int kFwdThreads = 128;
// Tensor-core backward, dK/dV kernel: 64 keys per block (4 warps of 16 key rows), query steps of
// 64 (head_dim 64) or 32 (head_dim 128: dK and dV take 128 registers a thread, Sᵀ and dPᵀ then 32).
constexpr int kDkvBlockN = 64;
TESSEL_HD constexpr int dkdv_block_m(int D) { return D <= 64 ? 64 : 32; }
// Tensor-core backward, dQ kernel: 64 queries per block (4 warps of 16 query rows), key steps of 64.
constexpr int kDqBlockM = 64;
constexpr int kDqBlockN = 64;
constexpr int kBwdThreads = 128;
// D_i = rowsum(dO_i * O_i): a warp per row, 8 rows per block.
constexpr int kDsumRowsPerBlock = 8;
constexpr int kDsumThreads = 32 * kDsumRowsPerBlock;
// Generic path: square tiles of 32 (head_dim <= 64) or 16 (up to kGenericMaxD) queries/keys,
// 256 threads, at most kGenericAcc accumulators per thread (tile * head_dim / 256).
constexpr int kGenericThreads = 256;
constexpr int kGenericMaxD = 256;
constexpr int kGenericAcc = 16;

TESSEL_HD int generic_tile(int64_t D) { return D <= 64 ? 32 : 16; }
// Row pitch (floats) of a [tile, head_dim] f32 tile in shared memory: odd, so a warp reading one
// column of 32 rows touches 32 banks.
TESSEL_HD int generic_pitch(int64_t D) { return D % 2 == 0 ? static_cast<int>(D) + 1 : static_cast<int>(D); }
// Floats of the generic kernels' shared memory: four [tile, pitch] tiles (q, dout, k, v), two
// [tile, tile + 1] score tiles and three per-row vectors.
TESSEL_HD int64_t generic_smem_floats(int64_t D) {
  const int64_t t = generic_tile(D);
  return 4 * t * generic_pitch(D) + 2 * t * (t + 1) + 3 * t;
}

// Shared memory of the tensor-core kernels (16-bit elements): forward q [128, D] and k, v
// double-buffered [2, fwd_block_n(D), D]; dK/dV k, v [64, D] and q, dO double-buffered
// [2, dkdv_block_m(D), D] with two double-buffered f32 vectors (lse and D_i of a query step); dQ
// q, dO [64, D] and k, v double-buffered [2, 64, D].
TESSEL_HD int64_t tc_forward_smem_bytes(int D) { return (int64_t{kFwdBlockM} * D + 4 * int64_t{fwd_block_n(D)} * D) * 2; }
TESSEL_HD int64_t tc_dkdv_smem_bytes(int D) {
  const int64_t m = dkdv_block_m(D);
  return (2 * int64_t{kDkvBlockN} * D + 4 * m * D) * 2 + 4 * m * 4;
}
TESSEL_HD int64_t tc_dq_smem_bytes(int D) { return (2 * int64_t{kDqBlockM} * D + 4 * int64_t{kDqBlockN} * D) * 2; }

// ---- causal geometry ---------------------------------------------------------------------------
TESSEL_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
TESSEL_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
TESSEL_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The keys a block of queries [i0, i0 + rows) (clipped to Sq; i0 < Sq) sees: [0, kv_end).
TESSEL_HD int64_t kv_end(const AttentionDims& p, int64_t i0, int64_t rows) {
  const int64_t last = min64(i0 + rows, p.Sq) - 1;
  return p.causal ? min64(p.Sk, last + p.offset + 1) : p.Sk;
}
// The first query that sees key j (0 when not causal): query i sees j iff i >= j - offset.
TESSEL_HD int64_t q_begin(const AttentionDims& p, int64_t j) { return p.causal ? max64(0, j - p.offset) : 0; }
// Whether the causal mask hides some pair of queries [i0, i0 + bm) x keys [j0, j0 + bn): the
// last key is beyond the first query's limit.
TESSEL_HD bool causal_partial(const AttentionDims& p, int64_t i0, int64_t j0, int64_t bn) {
  return p.causal && j0 + bn - 1 > i0 + p.offset;
}
// Whether tile (queries from i0, keys [j0, j0 + bn)) needs a per-element mask in a kernel that
// must drop keys >= Sk itself (the forward and dQ kernels; the dK/dV kernel's keys beyond Sk
// only touch rows it never stores).
TESSEL_HD bool tile_needs_mask(const AttentionDims& p, int64_t i0, int64_t j0, int64_t bn) {
  return j0 + bn > p.Sk || causal_partial(p, i0, j0, bn);
}
// Whether query i sees key j (both in range).
TESSEL_HD bool visible(const AttentionDims& p, int64_t i, int64_t j) { return !p.causal || j <= i + p.offset; }

// Block b of a grid of tiles * bh blocks (the big dimension in gridDim.x): its (batch*head,
// tile). Blocks run in index order, so with `heavy_last` the last tile (the most keys under the
// causal mask) comes first.
struct BlockCoord {
  int64_t bh, tile;
};
TESSEL_HD BlockCoord block_coord(int64_t block, int64_t bh_count, int64_t tiles, bool heavy_last) {
  const int64_t t = block / bh_count;
  return {block % bh_count, heavy_last ? tiles - 1 - t : t};
}

// ---- launch plans ------------------------------------------------------------------------------
enum class Path : int { TensorCore, Generic };

struct Launch {
  int64_t blocks = 0;  // gridDim.x (0: nothing to launch)
  int threads = 0;
  int64_t smem = 0;    // dynamic shared memory, bytes
  int64_t tile = 0;    // queries (forward, dQ) or keys (dK/dV) per block
  int64_t tiles = 0;   // blocks per (batch, head)
};

struct Plan {
  Path path = Path::Generic;
  Launch forward;         // the forward
  Launch dsum, dkdv, dq;  // the backward's three kernels
};

// Whether the tensor-core kernels apply: bf16/f16, head_dim 64 or 128, every pointer 16-byte
// aligned and every stride a multiple of 8 elements (`aligned`), and a device and binary with
// sm_80 features (`tc_device`).
inline bool use_tensor_cores(const AttentionDims& p, DType t, bool aligned, bool tc_device) {
  return (t == DType::bf16 || t == DType::f16) && (p.D == 64 || p.D == 128) && aligned && tc_device;
}

// Whether every stride of p is a multiple of `elems` elements.
inline bool strides_multiple_of(const AttentionDims& p, int64_t elems) {
  for (int64_t s : {p.q_sb, p.q_sh, p.q_ss, p.k_sb, p.k_sh, p.k_ss})
    if (s % elems != 0) return false;
  return true;
}

// The launches of both directions. Throws RuntimeError naming `what` for sizes the kernels do not
// take (head_dim above kGenericMaxD, a grid above 2^31 - 1 blocks, negative sizes).
inline Plan plan_attention(const AttentionDims& p, DType t, bool aligned, bool tc_device, const char* what) {
  auto fail = [&](const std::string& why) { throw RuntimeError(std::string("cuda kernel ") + what + ": " + why); };
  if (p.B < 0 || p.H < 0 || p.Sq < 0 || p.Sk < 0 || p.D < 0) fail("negative size");
  if (p.causal && p.offset != p.Sk - p.Sq) fail("causal offset must be Sk - Sq");
  if (p.D > kGenericMaxD)
    fail("head_dim " + std::to_string(p.D) + " is above the CUDA kernels' limit of " + std::to_string(kGenericMaxD));
  const int64_t kMaxBlocks = (int64_t{1} << 31) - 1;
  const int64_t bh = p.B * p.H;
  Plan plan;
  plan.path = use_tensor_cores(p, t, aligned, tc_device) ? Path::TensorCore : Path::Generic;
  auto grid = [&](Launch& l, int64_t tile, int64_t extent, int threads, int64_t smem) {
    l.tile = tile;
    l.tiles = ceil_div(extent, tile);
    l.threads = threads;
    l.smem = smem;
    l.blocks = bh * l.tiles;
    if (l.blocks > kMaxBlocks)
      fail(std::to_string(bh) + " batch*heads x " + std::to_string(l.tiles) + " tiles of " + std::to_string(tile) +
           " is above the grid limit of 2^31 - 1 blocks");
  };
  if (plan.path == Path::TensorCore) {
    const int D = static_cast<int>(p.D);
    grid(plan.forward, kFwdBlockM, p.Sq, kFwdThreads, tc_forward_smem_bytes(D));
    grid(plan.dkdv, kDkvBlockN, p.Sk, kBwdThreads, tc_dkdv_smem_bytes(D));
    grid(plan.dq, kDqBlockM, p.Sq, kBwdThreads, tc_dq_smem_bytes(D));
  } else {
    const int64_t tile = generic_tile(p.D), smem = generic_smem_floats(p.D) * 4;
    grid(plan.forward, tile, p.Sq, kGenericThreads, smem);
    grid(plan.dkdv, tile, p.Sk, kGenericThreads, smem);
    grid(plan.dq, tile, p.Sq, kGenericThreads, smem);
  }
  // D_i: one warp per query row of every (batch, head).
  plan.dsum.tile = kDsumRowsPerBlock;
  plan.dsum.tiles = 1;
  plan.dsum.threads = kDsumThreads;
  plan.dsum.blocks = ceil_div(bh * p.Sq, kDsumRowsPerBlock);
  if (plan.dsum.blocks > kMaxBlocks) fail("too many query rows for the grid");
  return plan;
}

}  // namespace attn
}  // namespace tessel::cuda_kernels
