// src/runtime/cuda/kernels/sample.cu — sample_tokens (the CPU's k_sample_tokens in
// cpu_kernels_index.cpp): one block per row. The row's cuts are found by bisection over the
// order keys of its logits (32 passes each, a count for top_k and a mass for top_p, exact: the
// largest key that keeps enough), its probabilities in double, and the draw by a block scan of
// the kept mass in id order. The CPU sums in another order, so a row whose draw or cut falls
// within rounding of a boundary may differ between the backends; within a backend a row's
// token depends on that row alone.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <climits>

#include "device_common.cuh"
#include "../../sample_tokens_params.hpp"

namespace tessel::cuda_kernels {
namespace {

constexpr int kSampleThreads = 256;

using ReduceD = cub::BlockReduce<double, kSampleThreads>;
using ReduceF = cub::BlockReduce<float, kSampleThreads>;
using ReduceL = cub::BlockReduce<long long, kSampleThreads>;
using ScanD = cub::BlockScan<double, kSampleThreads>;

union SampleStorage {
  typename ReduceD::TempStorage d;
  typename ReduceF::TempStorage f;
  typename ReduceL::TempStorage l;
  typename ScanD::TempStorage s;
};

struct AddOp {
  template <class V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct MinL {
  __device__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};
struct MaxL {
  __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Block-wide reductions every thread gets (the storage free again on return).
template <class V>
__device__ V share(V agg, V* slot) {
  if (threadIdx.x == 0) *slot = agg;
  __syncthreads();
  const V r = *slot;
  __syncthreads();
  return r;
}
template <class Op>
__device__ double all_reduce(SampleStorage& st, double v, Op op, double* slot) {
  return share(ReduceD(st.d).Reduce(v, op), slot);
}
template <class Op>
__device__ float all_reduce(SampleStorage& st, float v, Op op, float* slot) {
  return share(ReduceF(st.f).Reduce(v, op), slot);
}
template <class Op>
__device__ long long all_reduce(SampleStorage& st, long long v, Op op, long long* slot) {
  return share(ReduceL(st.l).Reduce(v, op), slot);
}

template <class T>
__device__ __forceinline__ uint32_t okey(T x) {
  return sample_order_key(__float_as_uint(to_f<T>(x)));
}

template <class T>
__global__ void k_sample_tokens(const T* logits, const int32_t* keys, const float* temperature, const int32_t* top_k,
                                const float* top_p, int32_t* out, int64_t V) {
  __shared__ SampleStorage st;
  __shared__ float sf;
  __shared__ long long sl;
  __shared__ double sd;
  const int64_t r = blockIdx.x;
  const T* l = logits + r * V;
  const int tid = threadIdx.x;

  float m = -INFINITY;
  long long n = 0;
  for (int64_t v = tid; v < V; v += kSampleThreads) {
    const float x = to_f<T>(l[v]);
    if (isfinite(x)) {
      m = fmaxf(m, x);
      ++n;
    }
  }
  const float lmax = all_reduce(st, m, MaxF{}, &sf);
  const long long finite = all_reduce(st, n, AddOp{}, &sl);
  if (finite == 0) {
    if (tid == 0) out[r] = static_cast<int32_t>(V);
    return;
  }
  const float T_ = temperature[r];
  if (!(T_ > 0)) {  // greedy: the first maximum
    long long best = LLONG_MAX;
    for (int64_t v = tid; v < V; v += kSampleThreads)
      if (to_f<T>(l[v]) == lmax) best = min(best, static_cast<long long>(v));
    best = all_reduce(st, best, MinL{}, &sl);
    if (tid == 0) out[r] = static_cast<int32_t>(best);
    return;
  }
  // The top_k cut: the largest order key with at least k finite logits at or above it.
  uint32_t kcut = 0;
  const int32_t k = top_k[r];
  if (k > 0 && k < finite) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = kcut | (1u << bit);
      long long c = 0;
      for (int64_t v = tid; v < V; v += kSampleThreads) {
        const float x = to_f<T>(l[v]);
        if (isfinite(x) && okey(l[v]) >= cand) ++c;
      }
      if (all_reduce(st, c, AddOp{}, &sl) >= k) kcut = cand;
    }
  }
  const double invT = 1.0 / static_cast<double>(T_), top = lmax;
  auto weight = [&](int64_t v, uint32_t cut) -> double {
    const float x = to_f<T>(l[v]);
    if (!isfinite(x) || okey(l[v]) < kcut || okey(l[v]) < cut) return 0.0;
    return exp((static_cast<double>(x) - top) * invT);
  };
  double z = 0;
  for (int64_t v = tid; v < V; v += kSampleThreads) z += weight(v, 0);
  const double Z = all_reduce(st, z, AddOp{}, &sd);
  // The top_p cut: the largest order key whose tokens at or above it hold top_p of the mass.
  uint32_t pcut = 0;
  const float p = top_p[r];
  if (p <= 0) {
    pcut = sample_order_key(__float_as_uint(lmax));
  } else if (p < 1) {
    const double need = static_cast<double>(p) * Z;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = pcut | (1u << bit);
      double s = 0;
      for (int64_t v = tid; v < V; v += kSampleThreads) s += weight(v, cand);
      if (all_reduce(st, s, AddOp{}, &sd) >= need) pcut = cand;
    }
  }
  double kept = 0;
  for (int64_t v = tid; v < V; v += kSampleThreads) kept += weight(v, pcut);
  const double target = sample_uniform(keys[r]) * all_reduce(st, kept, AddOp{}, &sd);
  // The draw: the first id (in id order) whose running kept mass passes the target.
  double carry = 0;
  long long last = -1;
  for (int64_t base = 0; base < V; base += kSampleThreads) {
    const int64_t v = base + tid;
    const double w = v < V ? weight(v, pcut) : 0.0;
    double inc = 0, total = 0;
    ScanD(st.s).InclusiveSum(w, inc, total);
    __syncthreads();
    const long long hit = (w > 0 && carry + inc > target) ? v : LLONG_MAX;
    const long long first = all_reduce(st, hit, MinL{}, &sl);
    if (first != LLONG_MAX) {
      if (tid == 0) out[r] = static_cast<int32_t>(first);
      return;
    }
    last = max(last, all_reduce(st, w > 0 ? static_cast<long long>(v) : -1LL, MaxL{}, &sl));
    carry += total;
  }
  if (tid == 0) out[r] = static_cast<int32_t>(last);  // rounding left the target at the end
}

}  // namespace

void sample_tokens(const void* logits, DType t, const int32_t* keys, const float* temperature, const int32_t* top_k,
                   const float* top_p, int32_t* out, int64_t rows, int64_t V, StreamHandle s) {
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw RuntimeError("cuda kernel sample_tokens: more than 2^31 - 1 rows");
  dispatch_float(t, "sample_tokens", [&](auto tag) {
    using T = decltype(tag);
    k_sample_tokens<T><<<static_cast<unsigned>(rows), kSampleThreads, 0, as_stream(s)>>>(
        static_cast<const T*>(logits), keys, temperature, top_k, top_p, out, V);
  });
  TESSEL_CUDA_LAUNCH_CHECK("sample_tokens");
}

}  // namespace tessel::cuda_kernels
