// src/runtime/cuda/kernels/reduction.cu — the reduction family (the CPU's
// cpu_kernels_reduction.cpp): reduce_sum/max/mean over any dims (a warp per output, or chunks
// summed in a second pass), and the virtual-device all-reduce of N sources. Every reduction is a
// fixed tree (reduce_common.cuh): replicas agree bit for bit.
#include "reduce_common.cuh"

namespace tessel::cuda_kernels {
namespace {


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
}  // namespace tessel::cuda_kernels
