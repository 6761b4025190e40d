// kernels/reductions.cu — kernels that reduce: reduce_sum/max/mean over any dims (a warp per
// output), the virtual-device all-reduce of N sources, and the fused row kernels — softmax,
// layer_norm, layer_norm_grad, cross_entropy — each one block per row, numerically stable
// (max subtracted before exp; two-pass mean and variance), accumulating in f32.
//
// Every reduction is a fixed tree (lane-strided partial sums, then shuffles in a fixed order),
// so the same input gives the same bits on every device that computes it: replicas agree.
#include "device_common.cuh"

namespace tessel::cuda_kernels {
namespace {

constexpr unsigned kFull = 0xffffffffu;

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <class Op>
__device__ float block_reduce(float v, Op op, float identity) {
  __shared__ float shm[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    float w = lane < nw ? shm[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) result = w;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // shm and result may be reused by the next call
  return r;
}

// ---- reduce over dims --------------------------------------------------------------------------

template <class T>
__global__ void k_reduce(Reduce op, const T* in, T* out, Loop kept, Loop reduced, int64_t nout, int64_t count) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  for (int64_t o = blockIdx.x * warps_per_block + (threadIdx.x >> 5); o < nout;
       o += int64_t(gridDim.x) * warps_per_block) {
    int64_t base[1];
    loop_offsets<1>(kept, o, base);
    float acc = op == Reduce::Max ? -INFINITY : 0.0f;
    for (int64_t r = lane; r < count; r += 32) {
      int64_t off[1];
      loop_offsets<1>(reduced, r, off);
      const float x = to_f<T>(in[base[0] + off[0]]);
      acc = op == Reduce::Max ? max_nan(acc, x) : acc + x;
    }
    acc = op == Reduce::Max ? warp_reduce(acc, MaxOp{}) : warp_reduce(acc, SumOp{});
    if (op == Reduce::Mean) acc *= 1.0f / static_cast<float>(count);
    if (lane == 0) out[o] = from_f<T>(acc);
  }
}

// A long reduction split in chunks (reduce_scratch_bytes): block b reduces chunk b % chunks of
// output b / chunks (threads strided over the chunk, then a block tree) into partial[b].
constexpr int64_t kReduceChunk = 16384;
constexpr int64_t kReduceSplitMinCount = int64_t{1} << 16;
constexpr int64_t kReduceSplitMaxOutputs = 4096;

template <class T>
__global__ void k_reduce_chunks(Reduce op, const T* in, float* partial, Loop kept, Loop reduced, int64_t count,
                                int64_t chunks) {
  const int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks;
  int64_t base[1];
  loop_offsets<1>(kept, o, base);
  const int64_t end = count < (c + 1) * kReduceChunk ? count : (c + 1) * kReduceChunk;
  float acc = op == Reduce::Max ? -INFINITY : 0.0f;
  for (int64_t r = c * kReduceChunk + threadIdx.x; r < end; r += blockDim.x) {
    int64_t off[1];
    loop_offsets<1>(reduced, r, off);
    const float x = to_f<T>(in[base[0] + off[0]]);
    acc = op == Reduce::Max ? max_nan(acc, x) : acc + x;
  }
  acc = op == Reduce::Max ? block_reduce(acc, MaxOp{}, -INFINITY) : block_reduce(acc, SumOp{}, 0.0f);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// A warp per output: its chunks' partials, lane-strided, then the warp tree.
template <class T>
__global__ void k_reduce_chunks_sum(Reduce op, const float* partial, T* out, int64_t nout, int64_t chunks,
                                    int64_t count) {
  const int lane = threadIdx.x & 31;
  const int64_t o = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (o >= nout) return;
  float acc = op == Reduce::Max ? -INFINITY : 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) {
    const float x = partial[o * chunks + c];
    acc = op == Reduce::Max ? max_nan(acc, x) : acc + x;
  }
  acc = op == Reduce::Max ? warp_reduce(acc, MaxOp{}) : warp_reduce(acc, SumOp{});
  if (op == Reduce::Mean) acc *= 1.0f / static_cast<float>(count);
  if (lane == 0) out[o] = from_f<T>(acc);
}

int64_t reduce_chunks(DType t, int64_t nout, int64_t count) {
  if (t == DType::i32 || count < kReduceSplitMinCount || nout > kReduceSplitMaxOutputs) return 0;
  return (count + kReduceChunk - 1) / kReduceChunk;
}

// i32: sums wrap modulo 2^32 (order-independent), max.
__global__ void k_reduce_i32(Reduce op, const int32_t* in, int32_t* out, Loop kept, Loop reduced, int64_t nout,
                             int64_t count) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  for (int64_t o = blockIdx.x * warps_per_block + (threadIdx.x >> 5); o < nout;
       o += int64_t(gridDim.x) * warps_per_block) {
    int64_t base[1];
    loop_offsets<1>(kept, o, base);
    uint32_t sum = 0;
    int32_t mx = INT32_MIN;
    for (int64_t r = lane; r < count; r += 32) {
      int64_t off[1];
      loop_offsets<1>(reduced, r, off);
      const int32_t x = in[base[0] + off[0]];
      sum += static_cast<uint32_t>(x);
      mx = x > mx ? x : mx;
    }
    for (int s = 16; s > 0; s >>= 1) {
      sum += __shfl_xor_sync(kFull, sum, s);
      const int32_t other = __shfl_xor_sync(kFull, mx, s);
      mx = other > mx ? other : mx;
    }
    if (lane == 0) out[o] = op == Reduce::Max ? mx : static_cast<int32_t>(sum);
  }
}

struct Sources {
  const void* p[kMaxReduceSources];
};

template <class T>
__global__ void k_reduce_sources(Sources src, int nsrc, T* dst, Reduce op, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    float acc = to_f<T>(static_cast<const T*>(src.p[0])[i]);
    for (int k = 1; k < nsrc; ++k) {
      const float x = to_f<T>(static_cast<const T*>(src.p[k])[i]);
      acc = op == Reduce::Max ? max_nan(acc, x) : acc + x;
    }
    dst[i] = from_f<T>(acc);
  }
}

__global__ void k_reduce_sources_i32(Sources src, int nsrc, int32_t* dst, Reduce op, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int32_t x0 = static_cast<const int32_t*>(src.p[0])[i];
    uint32_t sum = static_cast<uint32_t>(x0);
    int32_t mx = x0;
    for (int k = 1; k < nsrc; ++k) {
      const int32_t x = static_cast<const int32_t*>(src.p[k])[i];
      sum += static_cast<uint32_t>(x);
      mx = x > mx ? x : mx;
    }
    dst[i] = op == Reduce::Max ? mx : static_cast<int32_t>(sum);
  }
}

// ---- softmax -------------------------------------------------------------------------------------

// One block per row (o, i) of [outer, len, inner]; elements at o*len*inner + l*inner + i.
template <class T>
__global__ void k_softmax(const T* in, T* out, int64_t len, int64_t inner) {
  const int64_t row = blockIdx.x;
  const int64_t o = row / inner, i = row % inner;
  const T* x = in + o * len * inner + i;
  T* y = out + o * len * inner + i;
  float m = -INFINITY;
  for (int64_t l = threadIdx.x; l < len; l += blockDim.x) m = max_nan(m, to_f<T>(x[l * inner]));
  m = block_reduce(m, MaxOp{}, -INFINITY);
  if (m == -INFINITY) {  // fully masked row: zeros rather than NaN (the CPU kernel's choice)
    for (int64_t l = threadIdx.x; l < len; l += blockDim.x) y[l * inner] = from_f<T>(0.0f);
    return;
  }
  float s = 0.0f;
  for (int64_t l = threadIdx.x; l < len; l += blockDim.x) s += expf(to_f<T>(x[l * inner]) - m);
  s = block_reduce(s, SumOp{}, 0.0f);
  const float inv = 1.0f / s;
  for (int64_t l = threadIdx.x; l < len; l += blockDim.x) y[l * inner] = from_f<T>(expf(to_f<T>(x[l * inner]) - m) * inv);
}

// Contiguous rows (inner 1) of len <= 32 * kPerLane: one warp per row, the row in registers,
// read once and written once; max and sum by shuffles in a fixed order.
template <class T, int kPerLane>
__global__ void k_softmax_rows(const T* in, T* out, int64_t rows, int64_t len) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* x = in + row * len;
  T* y = out + row * len;
  float v[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t l = lane + 32 * j;
    v[j] = l < len ? to_f<T>(x[l]) : -INFINITY;
    m = max_nan(m, v[j]);
  }
  m = warp_reduce(m, MaxOp{});
  if (m == -INFINITY) {  // fully masked row: zeros (the CPU kernel's choice)
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < len) y[lane + 32 * j] = from_f<T>(0.0f);
    return;
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < len) {
      v[j] = expf(v[j] - m);
      s += v[j];
    }
  s = warp_reduce(s, SumOp{});
  const float inv = 1.0f / s;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < len) y[lane + 32 * j] = from_f<T>(v[j] * inv);
}

// ---- layer_norm ------------------------------------------------------------------------------------

// Rows of D <= 32 * kPerLane: one warp per row, the row in registers; mean, then the variance
// of the deviations (two passes over registers, one read of memory).
template <class T, int kPerLane>
__global__ void k_layer_norm_rows(const T* x, const T* g, const T* b, T* y, int64_t rows, int64_t D, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * D;
  T* yr = y + row * D;
  float v[kPerLane];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = c < D ? to_f<T>(xr[c]) : 0.0f;
    s += v[j];
  }
  const float mean = warp_reduce(s, SumOp{}) / static_cast<float>(D);
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < D) {
      const float d = v[j] - mean;
      q += d * d;
    }
  const float var = warp_reduce(q, SumOp{}) / static_cast<float>(D);  // biased, like PyTorch
  const float rstd = 1.0f / sqrtf(var + eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < D) yr[c] = from_f<T>((v[j] - mean) * rstd * to_f<T>(g[c]) + to_f<T>(b[c]));
  }
}

// Launches kernel<kPerLane> (a warp per row, kThreads / 32 rows per block) for rows of `len`
// <= 1024 and returns true; false when len is longer.
template <template <int> class K, class... Args>
bool launch_rows(int64_t rows, int64_t len, cudaStream_t st, Args... args) {
  if (len > 32 * 32) return false;
  constexpr int kWarps = kThreads / 32;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return false;
  const unsigned g = static_cast<unsigned>(blocks);
  if (len <= 32) K<1>::launch(g, st, args...);
  else if (len <= 64) K<2>::launch(g, st, args...);
  else if (len <= 128) K<4>::launch(g, st, args...);
  else if (len <= 256) K<8>::launch(g, st, args...);
  else if (len <= 512) K<16>::launch(g, st, args...);
  else if (len <= 768) K<24>::launch(g, st, args...);
  else K<32>::launch(g, st, args...);
  return true;
}

template <class T>
__device__ void row_stats(const T* x, int64_t D, float eps, float& mean, float& rstd) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += to_f<T>(x[j]);
  mean = block_reduce(s, SumOp{}, 0.0f) / static_cast<float>(D);
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float d = to_f<T>(x[j]) - mean;
    v += d * d;
  }
  const float var = block_reduce(v, SumOp{}, 0.0f) / static_cast<float>(D);  // biased, like PyTorch
  rstd = 1.0f / sqrtf(var + eps);
}

template <class T>
__global__ void k_layer_norm(const T* x, const T* g, const T* b, T* y, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  T* yr = y + r * D;
  float mean, rstd;
  row_stats(xr, D, eps, mean, rstd);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    yr[j] = from_f<T>((to_f<T>(xr[j]) - mean) * rstd * to_f<T>(g[j]) + to_f<T>(b[j]));
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma; stats saved for dgamma/dbeta.
template <class T>
__global__ void k_layer_norm_grad_rows(const T* x, const T* gamma, const T* dy, T* dx, float* stats, int64_t D,
                                       float eps) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* dyr = dy + r * D;
  float mean, rstd;
  row_stats(xr, D, eps, mean, rstd);
  float mg = 0.0f, mgx = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float g = to_f<T>(dyr[j]) * to_f<T>(gamma[j]);
    mg += g;
    mgx += g * (to_f<T>(xr[j]) - mean) * rstd;
  }
  mg = block_reduce(mg, SumOp{}, 0.0f) / static_cast<float>(D);
  mgx = block_reduce(mgx, SumOp{}, 0.0f) / static_cast<float>(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = (to_f<T>(xr[j]) - mean) * rstd;
    dx[r * D + j] = from_f<T>(rstd * (to_f<T>(dyr[j]) * to_f<T>(gamma[j]) - mg - xhat * mgx));
  }
  if (threadIdx.x == 0) {
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

// dgamma[j] = sum_r dy * xhat, dbeta[j] = sum_r dy, in double (as the CPU kernel: the sums run
// over every row of the batch): a thread per (column, chunk of kLngChunk rows) sums its rows in
// order into partial[(c * D + j) * 2 + {0, 1}]; then a thread per column sums the chunks in order.
constexpr int64_t kLngChunk = 256;

template <class T>
__global__ void k_layer_norm_grad_cols(const T* x, const T* dy, const float* stats, double* partial, int64_t rows,
                                       int64_t D) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (j >= D) return;
  double sg = 0.0, sb = 0.0;
  const int64_t end = rows < (c + 1) * kLngChunk ? rows : (c + 1) * kLngChunk;
  for (int64_t r = c * kLngChunk; r < end; ++r) {
    const double d = to_f<T>(dy[r * D + j]);
    const double xhat = (double(to_f<T>(x[r * D + j])) - stats[2 * r]) * stats[2 * r + 1];
    if (d != 0.0) sg += d * xhat;  // as the CPU kernel: a zero gradient adds nothing, even to a NaN row
    sb += d;
  }
  partial[(c * D + j) * 2] = sg;
  partial[(c * D + j) * 2 + 1] = sb;
}

template <class T>
__global__ void k_layer_norm_grad_cols_sum(const double* partial, T* dgamma, T* dbeta, int64_t chunks, int64_t D) {
  TESSEL_GRID_STRIDE(j, D) {
    double sg = 0.0, sb = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      sg += partial[(c * D + j) * 2];
      sb += partial[(c * D + j) * 2 + 1];
    }
    dgamma[j] = from_f<T>(static_cast<float>(sg));
    dbeta[j] = from_f<T>(static_cast<float>(sb));
  }
}

// ---- cross_entropy -----------------------------------------------------------------------------------

// A running (max m, sum of exp(x - m)) pair, merged in one pass (online softmax): a larger x
// rescales the sum. -inf adds nothing; NaN makes the sum NaN, as in the two-pass form.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) {
  if (x > a.m) return {x, a.s * expf(a.m - x) + 1.0f};
  return {a.m, a.s + (x == -INFINITY ? 0.0f : expf(x - a.m))};
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = max_nan(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
  for (int o = 16; o > 0; o >>= 1) v = merge(v, {__shfl_xor_sync(kFull, v.m, o), __shfl_xor_sync(kFull, v.s, o)});
  return v;
}

// A row's max m and sum of exp(x - m), over the block's threads, reading the row once: each
// thread's strided elements in order, then a fixed tree (warps, then warp 0).
template <class T>
__device__ void row_max_sumexp(const T* x, int64_t V, float& m, float& s) {
  __shared__ MaxSum shm[32];
  __shared__ MaxSum result;
  MaxSum a{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) a = add_value(a, to_f<T>(x[j]));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_merge(a);
  if (lane == 0) shm[warp] = a;
  __syncthreads();
  if (warp == 0) {
    MaxSum w = lane < int(blockDim.x >> 5) ? shm[lane] : MaxSum{-INFINITY, 0.0f};
    w = warp_merge(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  m = result.m;
  s = result.s;
}

template <class T, class O>
__global__ void k_cross_entropy(const T* logits, const int32_t* labels, O* out, int64_t V, int64_t off,
                                DeviceError* err, unsigned seq) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * V;
  const int64_t lab = int64_t(labels[r]) - off;
  if (lab < 0 || lab >= V) {
    if (threadIdx.x == 0) {
      report(err, seq, kErrLabel, labels[r], r, off + V);
      out[r] = from_f<O>(0.0f);
    }
    return;
  }
  float m, s;
  row_max_sumexp(x, V, m, s);
  if (threadIdx.x == 0) out[r] = from_f<O>(m + logf(s) - to_f<T>(x[lab]));
}

// ---- fused backward kernels ---------------------------------------------------------------------


// One block per row (o, i) of [outer, len, inner], as k_softmax.
template <class T>
__global__ void k_softmax_grad(const T* y, const T* dy, T* dx, int64_t len, int64_t inner) {
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * len * inner + row % inner;
  float s = 0.0f;
  for (int64_t l = threadIdx.x; l < len; l += blockDim.x)
    s += to_f<T>(dy[base + l * inner]) * to_f<T>(y[base + l * inner]);
  s = block_reduce(s, SumOp{}, 0.0f);
  for (int64_t l = threadIdx.x; l < len; l += blockDim.x) {
    const int64_t j = base + l * inner;
    dx[j] = from_f<T>(to_f<T>(y[j]) * (to_f<T>(dy[j]) - s));
  }
}

template <class T>
__global__ void k_cross_entropy_grad(const T* logits, const int32_t* labels, const float* g, T* dx, int64_t V,
                                     int64_t off, DeviceError* err, unsigned seq) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * V;
  T* d = dx + r * V;
  const int64_t lab = int64_t(labels[r]) - off;
  if (lab < 0 || lab >= V) {
    if (threadIdx.x == 0) report(err, seq, kErrLabel, labels[r], r, off + V);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) d[j] = from_f<T>(0.0f);
    return;
  }
  float m, s;
  row_max_sumexp(x, V, m, s);
  const float scale = g[r] / s;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    d[j] = from_f<T>(expf(to_f<T>(x[j]) - m) * scale - (j == lab ? g[r] : 0.0f));
}

// The warp-per-row kernels as launch_rows' K<kPerLane>.
template <class T>
struct SoftmaxRows {
  template <int P>
  struct K {
    static void launch(unsigned g, cudaStream_t st, const T* in, T* out, int64_t rows, int64_t len) {
      k_softmax_rows<T, P><<<g, kThreads, 0, st>>>(in, out, rows, len);
    }
  };
};
template <class T>
struct LayerNormRows {
  template <int P>
  struct K {
    static void launch(unsigned g, cudaStream_t st, const T* x, const T* ga, const T* b, T* y, int64_t rows, int64_t D,
                       float eps) {
      k_layer_norm_rows<T, P><<<g, kThreads, 0, st>>>(x, ga, b, y, rows, D, eps);
    }
  };
};

// Threads per row block: enough for the row, a multiple of 32, at most 1024.
unsigned row_threads(int64_t len) {
  if (len >= 1024) return 1024;
  int64_t t = ((len + 31) / 32) * 32;
  return static_cast<unsigned>(t < 32 ? 32 : t);
}

void check_rows(int64_t rows, const char* what) {
  if (rows > 0x7fffffff)
    throw RuntimeError(std::string("cuda kernel ") + what + ": " + std::to_string(rows) +
                       " rows exceed one grid dimension (2^31 - 1)");
}

}  // namespace

std::size_t reduce_scratch_bytes(DType t, int64_t nout, int64_t count) {
  return static_cast<std::size_t>(nout * reduce_chunks(t, nout, count)) * sizeof(float);
}

void reduce(Reduce op, const void* in, void* out, DType t, const Loop& kept_in, const Loop& reduced_in, void* scratch,
            StreamHandle s) {
  const Loop kept = with_divisors(kept_in), reduced = with_divisors(reduced_in);
  const int64_t nout = kept.size(), count = reduced.size();
  if (nout <= 0) return;
  const int warps = kThreads / 32;
  int64_t blocks = (nout + warps - 1) / warps;
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;
  auto st = as_stream(s);
  if (const int64_t chunks = reduce_chunks(t, nout, count); chunks > 0) {
    if (!scratch) throw RuntimeError("cuda kernel reduce: a split reduction needs reduce_scratch_bytes of scratch");
    float* partial = static_cast<float*>(scratch);
    dispatch_float(t, "reduce", [&](auto tag) {
      using T = decltype(tag);
      k_reduce_chunks<T><<<unsigned(nout * chunks), kThreads, 0, st>>>(op, static_cast<const T*>(in), partial, kept,
                                                                       reduced, count, chunks);
      k_reduce_chunks_sum<T><<<unsigned(blocks), kThreads, 0, st>>>(op, partial, static_cast<T*>(out), nout, chunks,
                                                                    count);
    });
    TESSEL_CUDA_LAUNCH_CHECK("reduce (split)");
    return;
  }
  if (t == DType::i32) {
    if (op == Reduce::Mean) throw RuntimeError("cuda kernel reduce_mean: needs a float type");
    k_reduce_i32<<<unsigned(blocks), kThreads, 0, st>>>(op, static_cast<const int32_t*>(in),
                                                         static_cast<int32_t*>(out), kept, reduced, nout, count);
  } else {
    dispatch_float(t, "reduce", [&](auto tag) {
      using T = decltype(tag);
      k_reduce<T><<<unsigned(blocks), kThreads, 0, st>>>(op, static_cast<const T*>(in), static_cast<T*>(out), kept,
                                                          reduced, nout, count);
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("reduce");
}

void reduce_sources(const void* const* srcs, int nsrc, void* dst, DType t, Reduce op, int64_t count, StreamHandle s) {
  if (count <= 0) return;
  if (nsrc < 1 || nsrc > kMaxReduceSources)
    throw RuntimeError("cuda kernel reduce_sources: " + std::to_string(nsrc) + " sources (1.." +
                       std::to_string(kMaxReduceSources) + " supported)");
  Sources src{};
  for (int k = 0; k < nsrc; ++k) src.p[k] = srcs[k];
  auto st = as_stream(s);
  if (t == DType::i32) {
    k_reduce_sources_i32<<<grid_for(count), kThreads, 0, st>>>(src, nsrc, static_cast<int32_t*>(dst), op, count);
  } else {
    dispatch_float(t, "reduce_sources", [&](auto tag) {
      using T = decltype(tag);
      k_reduce_sources<T><<<grid_for(count), kThreads, 0, st>>>(src, nsrc, static_cast<T*>(dst), op, count);
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("reduce_sources");
}

void softmax(const void* in, void* out, DType t, int64_t outer, int64_t len, int64_t inner, StreamHandle s) {
  const int64_t rows = outer * inner;
  if (rows <= 0 || len <= 0) return;
  check_rows(rows, "softmax");
  dispatch_float(t, "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1 && launch_rows<SoftmaxRows<T>::template K>(rows, len, as_stream(s), static_cast<const T*>(in),
                                                                 static_cast<T*>(out), rows, len))
      return;
    k_softmax<T><<<unsigned(rows), row_threads(len), 0, as_stream(s)>>>(static_cast<const T*>(in),
                                                                       static_cast<T*>(out), len, inner);
  });
  TESSEL_CUDA_LAUNCH_CHECK("softmax");
}

void layer_norm(const void* x, const void* gamma, const void* beta, void* y, DType t, int64_t rows, int64_t D,
                float eps, StreamHandle s) {
  if (rows <= 0 || D <= 0) return;
  check_rows(rows, "layer_norm");
  dispatch_float(t, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    if (launch_rows<LayerNormRows<T>::template K>(rows, D, as_stream(s), static_cast<const T*>(x),
                                                   static_cast<const T*>(gamma), static_cast<const T*>(beta),
                                                   static_cast<T*>(y), rows, D, eps))
      return;
    k_layer_norm<T><<<unsigned(rows), row_threads(D), 0, as_stream(s)>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(y), D, eps);
  });
  TESSEL_CUDA_LAUNCH_CHECK("layer_norm");
}

std::size_t layer_norm_grad_scratch_bytes(int64_t rows, int64_t D) {
  const int64_t r = rows > 0 ? rows : 1;
  const int64_t chunks = (r + kLngChunk - 1) / kLngChunk;
  const std::size_t stats = (static_cast<std::size_t>(2 * r) * sizeof(float) + 255) / 256 * 256;
  return stats + static_cast<std::size_t>(chunks * (D > 0 ? D : 1) * 2) * sizeof(double);
}

void layer_norm_grad(const void* x, const void* gamma, const void* dy, void* dx, void* dgamma, void* dbeta, DType t,
                     int64_t rows, int64_t D, float eps, void* scratch, StreamHandle s) {
  if (D <= 0) return;
  check_rows(rows, "layer_norm_grad");
  auto st = as_stream(s);
  const int64_t r = rows > 0 ? rows : 1;
  const int64_t chunks = (r + kLngChunk - 1) / kLngChunk;
  if (chunks > 65535) throw RuntimeError("cuda kernel layer_norm_grad: " + std::to_string(rows) + " rows (at most " +
                                         std::to_string(65535 * kLngChunk) + ")");
  float* stats = static_cast<float*>(scratch);
  double* partial = reinterpret_cast<double*>(static_cast<char*>(scratch) +
                                              (static_cast<std::size_t>(2 * r) * sizeof(float) + 255) / 256 * 256);
  dispatch_float(t, "layer_norm_grad", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0)
      k_layer_norm_grad_rows<T><<<unsigned(rows), row_threads(D), 0, st>>>(
          static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(dy), static_cast<T*>(dx),
          stats, D, eps);
    const dim3 grid(static_cast<unsigned>((D + kThreads - 1) / kThreads), static_cast<unsigned>(rows > 0 ? chunks : 1));
    k_layer_norm_grad_cols<T><<<grid, kThreads, 0, st>>>(static_cast<const T*>(x), static_cast<const T*>(dy), stats,
                                                         partial, rows, D);
    k_layer_norm_grad_cols_sum<T><<<grid_for(D), kThreads, 0, st>>>(partial, static_cast<T*>(dgamma),
                                                                     static_cast<T*>(dbeta), rows > 0 ? chunks : 1, D);
  });
  TESSEL_CUDA_LAUNCH_CHECK("layer_norm_grad");
}

void cross_entropy(const void* logits, DType t, const int32_t* labels, void* out, DType out_t, int64_t rows, int64_t V,
                   int64_t off, DeviceError* err, unsigned seq, StreamHandle s) {
  if (rows <= 0) return;
  check_rows(rows, "cross_entropy");
  dispatch_float(t, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float(out_t, "cross_entropy", [&](auto otag) {
      using O = decltype(otag);
      k_cross_entropy<T, O><<<unsigned(rows), row_threads(V), 0, as_stream(s)>>>(
          static_cast<const T*>(logits), labels, static_cast<O*>(out), V, off, err, seq);
    });
  });
  TESSEL_CUDA_LAUNCH_CHECK("cross_entropy");
}

void softmax_grad(const void* y, const void* dy, void* dx, DType t, int64_t outer, int64_t len, int64_t inner,
                  StreamHandle s) {
  const int64_t rows = outer * inner;
  if (rows <= 0 || len <= 0) return;
  check_rows(rows, "softmax_grad");
  dispatch_float(t, "softmax_grad", [&](auto tag) {
    using T = decltype(tag);
    k_softmax_grad<T><<<unsigned(rows), row_threads(len), 0, as_stream(s)>>>(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), len, inner);
  });
  TESSEL_CUDA_LAUNCH_CHECK("softmax_grad");
}

void cross_entropy_grad(const void* logits, DType t, const int32_t* labels, const float* g, void* dx, int64_t rows,
                        int64_t V, int64_t off, DeviceError* err, unsigned seq, StreamHandle s) {
  if (rows <= 0 || V <= 0) return;
  check_rows(rows, "cross_entropy_grad");
  dispatch_float(t, "cross_entropy_grad", [&](auto tag) {
    using T = decltype(tag);
    k_cross_entropy_grad<T><<<unsigned(rows), row_threads(V), 0, as_stream(s)>>>(
        static_cast<const T*>(logits), labels, g, static_cast<T*>(dx), V, off, err, seq);
  });
  TESSEL_CUDA_LAUNCH_CHECK("cross_entropy_grad");
}

}  // namespace tessel::cuda_kernels
