// src/runtime/cuda/kernels/index.cu — the index family (the CPU's cpu_kernels_index.cpp):
// embedding, gather, scatter_add (a radix sort of the indices, then segment sums: the same
// order every run), one_hot, causal_mask and mask_padding, one thread per element.
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "device_common.cuh"
#include "elementwise_math.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace tessel::cuda_kernels {
namespace {

// ---- index ops -------------------------------------------------------------------------------------

template <class T>
__global__ void k_embedding(const T* table, const int32_t* ids, T* out, int64_t n, int64_t V, int64_t D, int64_t off,
                            int64_t V_global, DeviceError* err, unsigned seq) {
  TESSEL_GRID_STRIDE(e, n * D) {
    const int64_t i = e / D, j = e % D;
    const int32_t id = ids[i];
    if (id < 0 || id >= V_global) {
      if (j == 0) report(err, seq, kErrEmbeddingId, id, i, V_global);
      out[e] = T(0);
      continue;
    }
    const int64_t r = int64_t(id) - off;  // a row of another table shard contributes zeros
    out[e] = (r >= 0 && r < V) ? table[r * D + j] : T(0);
  }
}

template <class T>
__global__ void k_gather(const T* table, const int32_t* idx, T* out, int64_t P, int64_t J, int64_t n, int64_t S,
                         int64_t off, int64_t N, DeviceError* err, unsigned seq) {
  TESSEL_GRID_STRIDE(e, P * J * S) {
    const int64_t k = e % S, j = (e / S) % J, p = e / (S * J);
    const int32_t id = idx[j];
    if (id < 0 || id >= N) {
      if (k == 0 && p == 0) report(err, seq, kErrGatherIndex, id, j, N);
      out[e] = T(0);
      continue;
    }
    const int64_t r = int64_t(id) - off;
    out[e] = (r >= 0 && r < n) ? table[(p * n + r) * S + k] : T(0);
  }
}

template <class T>
__global__ void k_write_at(const T* values, const int32_t* idx, T* out, int64_t P, int64_t n, int64_t S,
                           int64_t off, int64_t N, DeviceError* err, unsigned seq) {
  TESSEL_GRID_STRIDE(e, P * S) {
    const int64_t p = e / S, k = e % S;
    const int32_t id = idx[p];
    if (id < 0 || id >= N) {
      if (k == 0) report(err, seq, kErrGatherIndex, id, p, N);
      continue;
    }
    const int64_t r = int64_t(id) - off;  // another block's position: not ours to write
    if (r >= 0 && r < n) out[(p * n + r) * S + k] = values[e];
  }
}

// scatter_add: each index's row (id - off when in [0, n), else n: sorted last and summed by
// no one) as the key of a stable radix sort whose values are the index positions j.
__global__ void k_scatter_keys(const int32_t* idx, int32_t* keys, int32_t* vals, int64_t J, int64_t n, int64_t off,
                               int64_t depth) {
  TESSEL_GRID_STRIDE(j, J) {
    const int64_t id = idx[j];
    const int64_t r = id - off;
    keys[j] = (id >= 0 && id < depth && r >= 0 && r < n) ? static_cast<int32_t>(r) : static_cast<int32_t>(n);
    vals[j] = static_cast<int32_t>(j);
  }
}

// The first index outside [0, depth), in index order (one thread: the CPU kernel's error).
__global__ void k_scatter_first_bad(const int32_t* idx, int64_t J, int64_t depth, DeviceError* err, unsigned seq) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int64_t j = 0; j < J; ++j)
    if (idx[j] < 0 || idx[j] >= depth) {
      report(err, seq, kErrScatterIndex, idx[j], j, depth);
      return;
    }
}

// begin[r] = the first sorted position with key >= r, for r in [0, n].
__global__ void k_scatter_segments(const int32_t* keys, int64_t J, int64_t* begin, int64_t n) {
  TESSEL_GRID_STRIDE(r, n + 1) {
    int64_t lo = 0, hi = J;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (keys[mid] < r) lo = mid + 1;
      else hi = mid;
    }
    begin[r] = lo;
  }
}

// out[p, r, k] = sum over the row's sorted positions t (index order) of upd[p, vals[t], k].
template <class T>
__global__ void k_scatter_sum(const T* upd, const int32_t* vals, const int64_t* begin, T* out, int64_t P, int64_t J,
                              int64_t n, int64_t S) {
  TESSEL_GRID_STRIDE(e, P * n * S) {
    const int64_t k = e % S, r = (e / S) % n, p = e / (S * n);
    float acc = 0.0f;
    for (int64_t t = begin[r]; t < begin[r + 1]; ++t) acc += to_f<T>(upd[(p * J + vals[t]) * S + k]);
    out[e] = from_f<T>(acc);
  }
}

__global__ void k_scatter_sum_i32(const int32_t* upd, const int32_t* vals, const int64_t* begin, int32_t* out,
                                  int64_t P, int64_t J, int64_t n, int64_t S) {
  TESSEL_GRID_STRIDE(e, P * n * S) {
    const int64_t k = e % S, r = (e / S) % n, p = e / (S * n);
    uint32_t acc = 0;
    for (int64_t t = begin[r]; t < begin[r + 1]; ++t) acc += static_cast<uint32_t>(upd[(p * J + vals[t]) * S + k]);
    out[e] = static_cast<int32_t>(acc);
  }
}

template <class T>
__global__ void k_one_hot(const int32_t* ids, T* out, T one, int64_t n, int64_t C, int64_t coff) {
  TESSEL_GRID_STRIDE(e, n * C) {
    const int64_t i = e / C, c = e % C;
    out[e] = int64_t(ids[i]) - coff == c ? one : T(0);
  }
}

template <class T>
__global__ void k_causal_mask(const T* in, T* out, T neg_inf, int64_t total, int64_t Q, int64_t K, int64_t qoff,
                              int64_t koff) {
  TESSEL_GRID_STRIDE(e, total) {
    const int64_t k = e % K, q = (e / K) % Q;
    out[e] = k + koff > q + qoff ? neg_inf : in[e];
  }
}

template <class T>
__global__ void k_mask_padding(const T* in, T* out, T fill, int64_t total, int64_t n, int64_t S, int64_t keep) {
  TESSEL_GRID_STRIDE(e, total) {
    const int64_t l = (e / S) % n;
    out[e] = l >= keep ? fill : in[e];
  }
}

}  // namespace

void embedding(const void* table, std::size_t elem, const int32_t* ids, void* out, int64_t n, int64_t V, int64_t D,
               int64_t off, int64_t V_global, DeviceError* err, unsigned seq, StreamHandle s) {
  if (n * D <= 0) return;
  dispatch_elem(elem, "embedding", [&](auto tag) {
    using T = decltype(tag);
    k_embedding<T><<<grid_for(n * D), kThreads, 0, as_stream(s)>>>(static_cast<const T*>(table), ids,
                                                                     static_cast<T*>(out), n, V, D, off, V_global,
                                                                     err, seq);
  });
  TESSEL_CUDA_LAUNCH_CHECK("embedding");
}

void gather(const void* table, std::size_t elem, const int32_t* idx, void* out, int64_t P, int64_t J, int64_t n,
            int64_t S, int64_t off, int64_t N, DeviceError* err, unsigned seq, StreamHandle s) {
  const int64_t total = P * J * S;
  if (total <= 0) return;
  dispatch_elem(elem, "gather", [&](auto tag) {
    using T = decltype(tag);
    k_gather<T><<<grid_for(total), kThreads, 0, as_stream(s)>>>(static_cast<const T*>(table), idx,
                                                                  static_cast<T*>(out), P, J, n, S, off, N, err, seq);
  });
  TESSEL_CUDA_LAUNCH_CHECK("gather");
}

void write_at(const void* values, std::size_t elem, const int32_t* idx, void* out, int64_t P, int64_t n, int64_t S,
              int64_t off, int64_t N, DeviceError* err, unsigned seq, StreamHandle s) {
  const int64_t total = P * S;
  if (total <= 0) return;
  dispatch_elem(elem, "write_at", [&](auto tag) {
    using T = decltype(tag);
    k_write_at<T><<<grid_for(total), kThreads, 0, as_stream(s)>>>(static_cast<const T*>(values), idx,
                                                                    static_cast<T*>(out), P, n, S, off, N, err, seq);
  });
  TESSEL_CUDA_LAUNCH_CHECK("write_at");
}

namespace {

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// The sort's own temporary storage for J items.
std::size_t scatter_sort_bytes(int64_t J) {
  std::size_t b = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, b, static_cast<const int32_t*>(nullptr),
                                                        static_cast<int32_t*>(nullptr),
                                                        static_cast<const int32_t*>(nullptr),
                                                        static_cast<int32_t*>(nullptr), static_cast<int>(J));
  if (e != cudaSuccess) throw_cuda(e, "scatter_add (radix sort size)", __FILE__, __LINE__);
  return b;
}

}  // namespace

std::size_t scatter_add_scratch_bytes(int64_t J, int64_t n) {
  if (J <= 0) return 0;
  return 4 * aligned(static_cast<std::size_t>(J) * 4) + aligned(static_cast<std::size_t>(n + 1) * 8) +
         aligned(scatter_sort_bytes(J));
}

void scatter_add(const void* updates, const int32_t* idx, void* out, DType t, int64_t P, int64_t J, int64_t n,
                 int64_t S, int64_t off, int64_t depth, DeviceError* err, unsigned seq, void* scratch, StreamHandle s) {
  const int64_t total = P * n * S;
  if (total <= 0) return;
  if (J > 0x7fffffff || n >= 0x7fffffff)
    throw RuntimeError("cuda kernel scatter_add: " + std::to_string(J) + " indices into " + std::to_string(n) +
                       " rows: above 2^31 - 1");
  auto st = as_stream(s);
  if (J == 0) {
    fill_bits(out, total, dtype_size(t), 0, s);
    return;
  }
  // Scratch: keys and values in and out (J each), the row segments (n + 1), the sort's storage.
  char* base = static_cast<char*>(scratch);
  const std::size_t jb = aligned(static_cast<std::size_t>(J) * 4);
  auto* keys_in = reinterpret_cast<int32_t*>(base);
  auto* keys_out = reinterpret_cast<int32_t*>(base + jb);
  auto* vals_in = reinterpret_cast<int32_t*>(base + 2 * jb);
  auto* vals_out = reinterpret_cast<int32_t*>(base + 3 * jb);
  auto* begin = reinterpret_cast<int64_t*>(base + 4 * jb);
  void* temp = base + 4 * jb + aligned(static_cast<std::size_t>(n + 1) * 8);
  std::size_t temp_bytes = scatter_sort_bytes(J);
  k_scatter_first_bad<<<1, 1, 0, st>>>(idx, J, depth, err, seq);
  k_scatter_keys<<<grid_for(J), kThreads, 0, st>>>(idx, keys_in, vals_in, J, n, off, depth);
  TESSEL_CUDA_LAUNCH_CHECK("scatter_add (keys)");
  int end_bit = 1;
  while (end_bit < 32 && (int64_t{1} << end_bit) <= n) ++end_bit;  // keys are in [0, n]
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                        static_cast<int>(J), 0, end_bit, st);
  if (e != cudaSuccess) throw_cuda(e, "scatter_add (radix sort)", __FILE__, __LINE__);
  k_scatter_segments<<<grid_for(n + 1), kThreads, 0, st>>>(keys_out, J, begin, n);
  if (t == DType::i32) {
    k_scatter_sum_i32<<<grid_for(total), kThreads, 0, st>>>(static_cast<const int32_t*>(updates), vals_out, begin,
                                                            static_cast<int32_t*>(out), P, J, n, S);
  } else {
    dispatch_float(t, "scatter_add", [&](auto tag) {
      using T = decltype(tag);
      k_scatter_sum<T><<<grid_for(total), kThreads, 0, st>>>(static_cast<const T*>(updates), vals_out, begin,
                                                             static_cast<T*>(out), P, J, n, S);
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("scatter_add");
}

void one_hot(const int32_t* ids, void* out, std::size_t elem, uint64_t one_bits, int64_t n, int64_t C, int64_t coff,
             StreamHandle s) {
  if (n * C <= 0) return;
  dispatch_elem(elem, "one_hot", [&](auto tag) {
    using T = decltype(tag);
    k_one_hot<T><<<grid_for(n * C), kThreads, 0, as_stream(s)>>>(ids, static_cast<T*>(out), bits_as<T>(one_bits), n,
                                                                   C, coff);
  });
  TESSEL_CUDA_LAUNCH_CHECK("one_hot");
}

void causal_mask(const void* in, void* out, std::size_t elem, uint64_t neg_inf_bits, int64_t mats, int64_t Q,
                 int64_t K, int64_t qoff, int64_t koff, StreamHandle s) {
  const int64_t total = mats * Q * K;
  if (total <= 0) return;
  dispatch_elem(elem, "causal_mask", [&](auto tag) {
    using T = decltype(tag);
    k_causal_mask<T><<<grid_for(total), kThreads, 0, as_stream(s)>>>(
        static_cast<const T*>(in), static_cast<T*>(out), bits_as<T>(neg_inf_bits), total, Q, K, qoff, koff);
  });
  TESSEL_CUDA_LAUNCH_CHECK("causal_mask");
}

void mask_padding(const void* in, void* out, std::size_t elem, uint64_t fill_bits, int64_t P, int64_t n, int64_t S,
                  int64_t keep, StreamHandle s) {
  const int64_t total = P * n * S;
  if (total <= 0) return;
  dispatch_elem(elem, "mask_padding", [&](auto tag) {
    using T = decltype(tag);
    k_mask_padding<T><<<grid_for(total), kThreads, 0, as_stream(s)>>>(
        static_cast<const T*>(in), static_cast<T*>(out), bits_as<T>(fill_bits), total, n, S, keep);
  });
  TESSEL_CUDA_LAUNCH_CHECK("mask_padding");
}

}  // namespace tessel::cuda_kernels
