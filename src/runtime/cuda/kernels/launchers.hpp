// src/runtime/cuda/kernels/launchers.hpp — the plain host launchers of tessel's CUDA kernels (src/runtime/cuda/kernels/*.cu).
//
// No CUDA type appears here: a stream is passed as an opaque StreamHandle (a cudaStream_t),
// dtypes as tessel::DType, so the backend (src/runtime/cuda/) includes this header from plain
// C++ and only the .cu files see device code. Every launcher enqueues its kernel(s) on the
// stream and returns at once; a launch failure throws tessel::RuntimeError with file:line.
//
// Semantics follow the CPU reference kernels (src/runtime/cpu/cpu_kernels_*.cpp) exactly: float math
// in f32 (bf16/f16 are loaded to f32 and rounded once on store, round to nearest even), i32
// add/sub/mul/sums wrap modulo 2^32, i32 division truncates with x/0 = -1 and INT_MIN/-1 =
// INT_MIN, max propagates NaN, a fully masked softmax row is zeros. Reductions use a fixed
// order per output (warp/block trees), so a value computed twice is bit-identical.
//
// Indices that the CPU kernels reject (embedding ids, gather/scatter indices, labels) are
// reported through the stream's DeviceError record in device memory: the first failing thread
// (a device atomicCAS) writes the code, the value, its position and the bound, and the stream
// that launched it copies the record back and turns it into an exception at synchronize (the
// element itself gets 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention_plan.hpp"  // AttentionDims
#include "elementwise_ops.hpp"
#include "tessel/core/common.hpp"

namespace tessel::cuda_kernels {

using StreamHandle = void*;  // cudaStream_t

constexpr int kMaxRank = 8;
constexpr int kMaxOperands = 4;
constexpr int kMaxReduceSources = 64;  // members of one virtual-device all-reduce

// n / d and n % d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift
// (Granlund and Montgomery's division by invariant integers): the index decomposition of the
// strided kernels, where a 64-bit division costs tens of instructions per element and dominated
// every elementwise kernel's time on an H200. Exhaustively checked on the host over the corner
// cases by tests/unit/test_cuda_index_math.cpp.
struct FastDivmod {
  uint32_t d = 1, magic = 1, shift = 0;
  // Throws RuntimeError for d outside [1, 2^31).
  static FastDivmod make(int64_t d) {
    if (d < 1 || d >= (int64_t{1} << 31))
      throw RuntimeError("FastDivmod: divisor " + std::to_string(d) + " is outside [1, 2^31)");
    FastDivmod f;
    f.d = static_cast<uint32_t>(d);
    while ((uint64_t{1} << f.shift) < f.d) ++f.shift;
    f.magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.shift) - f.d)) / f.d + 1);
    return f;
  }
  TESSEL_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

// A row-major index space (shape[0..rank)) and, once with_divisors has set them (the
// launchers call it), a FastDivmod per dim: below 2^31 elements (small) linear indices are
// decomposed in 32-bit arithmetic.
struct IndexSpace {
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  bool small = false;
  FastDivmod div[kMaxRank] = {};
  int64_t size() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }
};

// A row-major index space with per-operand element strides (operand 0 is the result unless a
// launcher says otherwise). Build it with make_loop (src/runtime/cuda/cuda_loop.hpp), which
// drops size-1 dims and merges dims contiguous for every operand.
struct Loop : IndexSpace {
  int64_t stride[kMaxOperands][kMaxRank] = {};
};


enum ErrorCode : int { kErrNone = 0, kErrEmbeddingId = 1, kErrGatherIndex = 2, kErrScatterIndex = 3, kErrLabel = 4 };

// Written by the first failing thread of any kernel of a stream (flag 0 -> 1).
struct DeviceError {
  int flag;
  int code;
  unsigned seq;  // the launch's sequence number on its stream (names the instruction)
  int pad;
  long long value, position, bound;
};

// ---- copies and fills (dtype-generic by element size: 1, 2, 4 or 8 bytes) --------------------
void fill_bits(void* out, int64_t n, std::size_t elem, uint64_t bits, StreamHandle s);
// One thread busy for `ns` nanoseconds of the GPU's global timer: a delay in stream order
// (CudaBackendOptions::debug_delay_us).
void spin(int64_t ns, StreamHandle s);
// out[off0] = in[off1] over loop (stride 0: result, 1: operand).
void strided_copy(const void* in, void* out, std::size_t elem, const Loop& loop, StreamHandle s);

// ---- elementwise ------------------------------------------------------------------------------
// Unary (elementwise_ops.hpp)
// Operand and result of dtype t (neg and relu also take i32).
void unary(Unary op, const void* in, void* out, DType t, int64_t n, StreamHandle s);

// Binary (elementwise_ops.hpp): comparisons last
// Operands of dtype t (strides 1, 2), result (stride 0) of dtype t, or i32 for comparisons.
void binary(Binary op, const void* a, const void* b, void* out, DType t, const Loop& loop, StreamHandle s);
// out = cond != 0 ? a : b; strides: 0 result, 1 cond (i32), 2 a, 3 b.
void where(const int32_t* cond, const void* a, const void* b, void* out, std::size_t elem, const Loop& loop,
           StreamHandle s);
// Any dtype to any dtype: float -> i32 truncates, saturates, NaN -> 0; i32 -> float rounds once.
void cast(const void* in, DType from, void* out, DType to, int64_t n, StreamHandle s);

// ---- fused expressions (fused_elementwise, fused_softmax's prologue) ----------------------------
// The expression of tessel/ir/fused_expr.hpp as straight-line steps, evaluated per result element
// by one thread (fused.cu): operands read through broadcast strides and converted to f32 (i32
// stays i32), each float step computed with the unfused op's per-element code and rounded to
// its dtype (as the unfused chain's intermediate buffer would be), the last step stored in the
// result's dtype. The limits are the fuse-elementwise pass's (src/passes/fuse_elementwise.cpp).
constexpr int kMaxFusedSteps = 64;
constexpr int kMaxFusedOperands = 16;

enum class FusedKind : int8_t { Operand, Literal, Unary, Binary, Compare, Where, Cast, CausalMask };

struct FusedStep {
  int8_t kind = 0;     // FusedKind
  int8_t op = 0;       // Unary or Binary (comparisons included)
  int8_t dtype = 0;    // the step's dtype (a DType)
  int8_t arg_dtype = 0;  // the dtype of argument 0 (Binary/Compare: i32 math; Cast: the source)
  int16_t arg[3] = {-1, -1, -1};  // earlier steps
  int16_t operand = -1;           // Operand: which
  float lit_f = 0;                // Literal (float dtypes, already rounded to dtype)
  int32_t lit_i = 0;              // Literal (i32)
};

struct FusedProgram : IndexSpace {  // the result's rank and shape
  int nsteps = 0;
  int noperands = 0;
  int64_t stride[kMaxFusedOperands][kMaxRank] = {};  // per operand, broadcast to the result
  const void* in[kMaxFusedOperands] = {};
  int8_t in_dtype[kMaxFusedOperands] = {};
  FusedStep steps[kMaxFusedSteps];
  // causal_mask steps: -inf where key + koff > query + qoff (the result's last two dims are
  // [query, key]; the offsets are the result block's global position).
  int64_t qoff = 0, koff = 0;
};

// `space` (a Loop or a FusedProgram) with its divisors set when it has fewer than 2^31
// elements (small), else as it is.
template <class Space>
Space with_divisors(Space space) {
  space.small = false;
  const int64_t n = space.size();
  if (n <= 0 || n >= (int64_t{1} << 31)) return space;
  for (int d = 0; d < space.rank; ++d) space.div[d] = FastDivmod::make(space.shape[d]);
  space.small = true;
  return space;
}

// Offsets of linear index i of `loop` for operands 0..N-1 (the strided kernels' index
// decomposition, host and device: tests/unit/test_cuda_device_math.cpp checks it against the
// CPU kernels' strided loops). A small loop (with_divisors) splits i with its FastDivmods in 32
// bits; else with 64-bit divisions.
template <int N>
TESSEL_HD void loop_offsets(const Loop& loop, int64_t i, int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  if (loop.small) {
    uint32_t rest = static_cast<uint32_t>(i);
    for (int d = loop.rank - 1; d >= 0; --d) {
      const uint32_t q = loop.div[d].div(rest);
      const int64_t idx = rest - q * loop.div[d].d;
      rest = q;
      for (int k = 0; k < N; ++k) off[k] += idx * loop.stride[k][d];
    }
    return;
  }
  for (int d = loop.rank - 1; d >= 0; --d) {
    const int64_t n = loop.shape[d];
    const int64_t idx = i % n;
    i /= n;
    for (int k = 0; k < N; ++k) off[k] += idx * loop.stride[k][d];
  }
}

// out (dtype out_t, the result's shape, contiguous) = the program's last step. out may be the
// buffer of an operand of the result's shape (each element reads its operands first).
void fused_elementwise(const FusedProgram& p, void* out, DType out_t, StreamHandle s);
// softmax over the result's last axis of the program's values, in one pass (a warp per row,
// the row in registers): out = softmax(program). Returns false, launching nothing, when the
// kernel does not apply (an i32 result, rows longer than 1024); then evaluate the program and
// run softmax in place.
bool fused_softmax_last_axis(const FusedProgram& p, void* out, DType out_t, StreamHandle s);

// ---- reductions -------------------------------------------------------------------------------
enum class Reduce : int { Sum, Max, Mean };
// out[o] (contiguous, dtype t) = reduce over r in `reduced` of in[kept.off(o) + reduced.off(r)]
// (stride 0 of both loops indexes `in`). count = reduced.size() (the mean divides by it).
// A float reduction of at least 2^16 elements into at most 4096 outputs (the gradient norm over
// every parameter) is split: blocks reduce chunks of 16384 into scratch, then each output sums
// its chunks in order; otherwise a warp per output. Both are fixed trees (deterministic).
// scratch: reduce_scratch_bytes(...) bytes (0: none needed, may be null).
std::size_t reduce_scratch_bytes(DType t, int64_t nout, int64_t count);
void reduce(Reduce op, const void* in, void* out, DType t, const Loop& kept, const Loop& reduced, void* scratch,
            StreamHandle s);
// dst[i] = srcs[0][i] (+|max) srcs[1][i] ... in source order (the virtual-device all-reduce).
void reduce_sources(const void* const* srcs, int nsrc, void* dst, DType t, Reduce op, int64_t count,
                    StreamHandle s);

// ---- normalisations and the NN ops --------------------------------------------------------------
// [outer, len, inner], softmax along len.
void softmax(const void* in, void* out, DType t, int64_t outer, int64_t len, int64_t inner, StreamHandle s);
void layer_norm(const void* x, const void* gamma, const void* beta, void* y, DType t, int64_t rows, int64_t D,
                float eps, StreamHandle s);
// One fused AdamW step over n elements (builders.hpp adamw): p and g of dtype t, m and v f32,
// lr, bc1, bc2 and gscale device pointers to one f32 each; writes p_out (t), m_out, v_out.
// apply: null, or one f32 on the device: 0 copies p, m and v to the results unchanged.
void adamw(const void* p, const void* g, const float* m, const float* v, const float* lr, const float* bc1,
           const float* bc2, const float* gscale, const float* apply, void* p_out, float* m_out, float* v_out, DType t,
           int64_t n,
           float beta1, float beta2, float eps, float weight_decay, StreamHandle s);
// dgamma and dbeta sum over the rows in double: in chunks of 256 rows (a thread per column and
// chunk), then the chunks in order. scratch: layer_norm_grad_scratch_bytes(rows, D) bytes (the
// per-row mean and rstd, and the chunks' partial sums).
std::size_t layer_norm_grad_scratch_bytes(int64_t rows, int64_t D);
void layer_norm_grad(const void* x, const void* gamma, const void* dy, void* dx, void* dgamma, void* dbeta, DType t,
                     int64_t rows, int64_t D, float eps, void* scratch, StreamHandle s);
// logits [rows, V] (dtype t, the block starting at column `off` of the vocabulary), labels
// i32 [rows] (global ids), out [rows] of dtype out_t.
void cross_entropy(const void* logits, DType t, const int32_t* labels, void* out, DType out_t, int64_t rows,
                   int64_t V, int64_t off, DeviceError* err, unsigned seq, StreamHandle s);
// softmax's backward over [outer, len, inner] along len: dx = y (dy - sum(dy y)); y, dy, dx of t.
void softmax_grad(const void* y, const void* dy, void* dx, DType t, int64_t outer, int64_t len, int64_t inner,
                  StreamHandle s);
// cross_entropy's backward: dx [rows, V] (dtype t, like the logits) = (softmax - one_hot) g,
// g f32 [rows]; labels and `off` as cross_entropy's.
void cross_entropy_grad(const void* logits, DType t, const int32_t* labels, const float* g, void* dx, int64_t rows,
                        int64_t V, int64_t off, DeviceError* err, unsigned seq, StreamHandle s);
// table [V, D] rows [off, off+V) of a table of V_global rows; ids [n]; out [n, D].
void embedding(const void* table, std::size_t elem, const int32_t* ids, void* out, int64_t n, int64_t V, int64_t D,
               int64_t off, int64_t V_global, DeviceError* err, unsigned seq, StreamHandle s);
// table [P, n, S] (block at `off` along n of N), idx [J] -> out [P, J, S].
void gather(const void* table, std::size_t elem, const int32_t* idx, void* out, int64_t P, int64_t J, int64_t n,
            int64_t S, int64_t off, int64_t N, DeviceError* err, unsigned seq, StreamHandle s);
// updates [P, J, S], idx [J] in [0, depth) -> out [P, n, S] (rows [off, off+n) of depth);
// each output element sums its updates in index order (deterministic, as the CPU kernel). The
// indices are sorted by row first (a stable radix sort, so index order is kept within a row):
// each update is read once, not once per output row. An index outside [0, depth) is reported
// (the first in index order) and adds nothing. scratch: scatter_add_scratch_bytes(J, n) bytes.
std::size_t scatter_add_scratch_bytes(int64_t J, int64_t n);
void scatter_add(const void* updates, const int32_t* idx, void* out, DType t, int64_t P, int64_t J, int64_t n,
                 int64_t S, int64_t off, int64_t depth, DeviceError* err, unsigned seq, void* scratch, StreamHandle s);
// write_at: out [P, n, S] (already dst's values; rows [off, off+n) of N) gets values [P, S]
// row p at idx[p] - off when that is in [0, n); an index outside [0, N) is reported and
// writes nothing.
void write_at(const void* values, std::size_t elem, const int32_t* idx, void* out, int64_t P, int64_t n, int64_t S,
              int64_t off, int64_t N, DeviceError* err, unsigned seq, StreamHandle s);
// sample_tokens: logits [rows, V] of dtype t -> out [rows] i32, one block per row (sample.cu;
// the rule is docs/ir.md's).
void sample_tokens(const void* logits, DType t, const int32_t* keys, const float* temperature, const int32_t* top_k,
                   const float* top_p, int32_t* out, int64_t rows, int64_t V, StreamHandle s);
// ids [n] -> out [n, C] with one_bits at column ids - coff.
void one_hot(const int32_t* ids, void* out, std::size_t elem, uint64_t one_bits, int64_t n, int64_t C, int64_t coff,
             StreamHandle s);
// x [mats, Q, K]: -inf (neg_inf_bits) where k + koff > q + qoff.
void causal_mask(const void* in, void* out, std::size_t elem, uint64_t neg_inf_bits, int64_t mats, int64_t Q,
                 int64_t K, int64_t qoff, int64_t koff, StreamHandle s);
// x [P, n, S]: rows >= keep along n := fill_bits.
void mask_padding(const void* in, void* out, std::size_t elem, uint64_t fill_bits, int64_t P, int64_t n, int64_t S,
                  int64_t keep, StreamHandle s);

// ---- fused attention (src/runtime/cuda/kernels/attention.cu; geometry in attention_plan.hpp) ---------------------
// out = softmax(scale q kᵀ, causal mask aligned to the end) v and lse (f32 [B, H, Sq], the natural
// log-sum-exp of the masked scaled scores), q/k/v/out read and written in place through the
// strides of p; all of q, k, v, out of dtype t. FlashAttention-2 on tensor cores for bf16/f16 with
// head_dim 64 or 128 (16-byte aligned pointers, strides a multiple of 8), else the generic f32-tile
// kernel (head_dim up to 256; above: RuntimeError).
void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, DType t,
                       const AttentionDims& p, StreamHandle s);
// The backward: dq (q's strides), dk and dv (k's) from q, k, v, the forward's out and lse, and
// dout; deterministic (no atomics: each element summed by one thread in a fixed order). scratch:
// attention_backward_scratch_bytes(p) bytes (D_i = rowsum(dout * out), f32).
std::size_t attention_backward_scratch_bytes(const AttentionDims& p);
void attention_backward(const void* q, const void* k, const void* v, const void* out, const float* lse,
                        const void* dout, void* dq, void* dk, void* dv, DType t, const AttentionDims& p, void* scratch,
                        StreamHandle s);

}  // namespace tessel::cuda_kernels
