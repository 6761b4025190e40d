// src/runtime/cuda/kernels/nn.cu — the nn family (the CPU's cpu_kernels_nn.cpp): the fused row
// kernels softmax, layer_norm, layer_norm_grad, cross_entropy and their backward kernels, each
// one block per row, numerically stable (max subtracted before exp; two-pass mean and variance),
// accumulating in f32 with the fixed-order reductions of reduce_common.cuh.
#include "reduce_common.cuh"

namespace tessel::cuda_kernels {
namespace {


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


}  // namespace

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
