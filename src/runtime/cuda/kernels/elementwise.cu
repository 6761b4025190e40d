// src/runtime/cuda/kernels/elementwise.cu — the one-thread-per-element kernels of the elementwise
// family (the CPU's cpu_kernels_elementwise.cpp): fills, strided copies (transpose, broadcast,
// slice, concat, block pack/unpack), unary and binary math, comparisons, where and casts; and
// the error helper every .cu file throws through.
//
// Every kernel is a grid-stride loop; strided ones decompose the linear index with the Loop's
// merged dims (usually one or two after merging), so the common layouts cost one division.
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "device_common.cuh"
#include "elementwise_math.cuh"

namespace tessel::cuda_kernels {

void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw RuntimeError(fmt::format("cuda: {} failed: {} ({}) at {}:{}", what, cudaGetErrorString(e),
                                 cudaGetErrorName(e), file, line));
}

namespace {

// ---- fills and copies --------------------------------------------------------------------------

template <class T>
__global__ void k_fill(T* out, int64_t n, T v) {
  TESSEL_GRID_STRIDE(i, n) out[i] = v;
}

template <class T>
__global__ void k_strided_copy(const T* in, T* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[2];
    loop_offsets<2>(loop, i, off);
    out[off[0]] = in[off[1]];
  }
}

// ---- unary --------------------------------------------------------------------------------------

template <class T>
__global__ void k_unary(Unary op, const T* in, T* out, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) out[i] = from_f<T>(unary_f(op, to_f<T>(in[i])));
}

__global__ void k_unary_i32(Unary op, const int32_t* in, int32_t* out, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) out[i] = unary_i(op, in[i]);
}

// ---- binary ---------------------------------------------------------------------------------------

template <class T>
__global__ void k_binary(Binary op, const T* a, const T* b, T* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[3];
    loop_offsets<3>(loop, i, off);
    out[off[0]] = from_f<T>(binary_f(op, to_f<T>(a[off[1]]), to_f<T>(b[off[2]])));
  }
}

__global__ void k_binary_i32(Binary op, const int32_t* a, const int32_t* b, int32_t* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[3];
    loop_offsets<3>(loop, i, off);
    out[off[0]] = binary_i(op, a[off[1]], b[off[2]]);
  }
}

template <class T>
__global__ void k_compare(Binary op, const T* a, const T* b, int32_t* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[3];
    loop_offsets<3>(loop, i, off);
    out[off[0]] = compare(op, to_f<T>(a[off[1]]), to_f<T>(b[off[2]]));
  }
}

__global__ void k_compare_i32(Binary op, const int32_t* a, const int32_t* b, int32_t* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[3];
    loop_offsets<3>(loop, i, off);
    out[off[0]] = compare(op, a[off[1]], b[off[2]]);
  }
}

template <class T>
__global__ void k_where(const int32_t* c, const T* a, const T* b, T* out, Loop loop, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t off[4];
    loop_offsets<4>(loop, i, off);
    out[off[0]] = c[off[1]] != 0 ? a[off[2]] : b[off[3]];
  }
}

// ---- casts ----------------------------------------------------------------------------------------

template <class S, class D>
__global__ void k_cast_ff(const S* in, D* out, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) out[i] = from_f<D>(to_f<S>(in[i]));
}
template <class S>
__global__ void k_cast_fi(const S* in, int32_t* out, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) out[i] = f32_to_i32_sat(to_f<S>(in[i]));
}
template <class D>
__global__ void k_cast_if(const int32_t* in, D* out, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) out[i] = from_f<D>(__int2float_rn(in[i]));
}

}  // namespace

__global__ void k_spin(int64_t ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<unsigned long long>(ns));
}

// ---- launchers -------------------------------------------------------------------------------------

void spin(int64_t ns, StreamHandle s) {
  if (ns <= 0) return;
  k_spin<<<1, 1, 0, as_stream(s)>>>(ns);
  TESSEL_CUDA_LAUNCH_CHECK("spin");
}

void fill_bits(void* out, int64_t n, std::size_t elem, uint64_t bits, StreamHandle s) {
  if (n <= 0) return;
  dispatch_elem(elem, "fill", [&](auto tag) {
    using T = decltype(tag);
    k_fill<T><<<grid_for(n), kThreads, 0, as_stream(s)>>>(static_cast<T*>(out), n, bits_as<T>(bits));
  });
  TESSEL_CUDA_LAUNCH_CHECK("fill");
}

void strided_copy(const void* in, void* out, std::size_t elem, const Loop& loop_in, StreamHandle s) {
  const Loop loop = with_divisors(loop_in);
  const int64_t n = loop.size();
  if (n <= 0) return;
  dispatch_elem(elem, "strided_copy", [&](auto tag) {
    using T = decltype(tag);
    k_strided_copy<T><<<grid_for(n), kThreads, 0, as_stream(s)>>>(static_cast<const T*>(in), static_cast<T*>(out),
                                                                    loop, n);
  });
  TESSEL_CUDA_LAUNCH_CHECK("strided_copy");
}

void unary(Unary op, const void* in, void* out, DType t, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  if (t == DType::i32) {
    if (op != Unary::Neg && op != Unary::Relu)
      throw RuntimeError("cuda kernel unary: i32 operands are only supported by neg and relu");
    k_unary_i32<<<grid_for(n), kThreads, 0, as_stream(s)>>>(op, static_cast<const int32_t*>(in),
                                                            static_cast<int32_t*>(out), n);
  } else {
    dispatch_float(t, "unary", [&](auto tag) {
      using T = decltype(tag);
      k_unary<T><<<grid_for(n), kThreads, 0, as_stream(s)>>>(op, static_cast<const T*>(in), static_cast<T*>(out), n);
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("unary");
}

void binary(Binary op, const void* a, const void* b, void* out, DType t, const Loop& loop_in, StreamHandle s) {
  const Loop loop = with_divisors(loop_in);
  const int64_t n = loop.size();
  if (n <= 0) return;
  const bool cmp = op >= Binary::Eq;
  const auto grid = grid_for(n);
  auto st = as_stream(s);
  if (t == DType::i32) {
    const auto* x = static_cast<const int32_t*>(a);
    const auto* y = static_cast<const int32_t*>(b);
    auto* o = static_cast<int32_t*>(out);
    if (cmp) k_compare_i32<<<grid, kThreads, 0, st>>>(op, x, y, o, loop, n);
    else k_binary_i32<<<grid, kThreads, 0, st>>>(op, x, y, o, loop, n);
  } else {
    dispatch_float(t, "binary", [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(a);
      const T* y = static_cast<const T*>(b);
      if (cmp) k_compare<T><<<grid, kThreads, 0, st>>>(op, x, y, static_cast<int32_t*>(out), loop, n);
      else k_binary<T><<<grid, kThreads, 0, st>>>(op, x, y, static_cast<T*>(out), loop, n);
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("binary");
}

void where(const int32_t* cond, const void* a, const void* b, void* out, std::size_t elem, const Loop& loop_in,
           StreamHandle s) {
  const Loop loop = with_divisors(loop_in);
  const int64_t n = loop.size();
  if (n <= 0) return;
  dispatch_elem(elem, "where", [&](auto tag) {
    using T = decltype(tag);
    k_where<T><<<grid_for(n), kThreads, 0, as_stream(s)>>>(cond, static_cast<const T*>(a), static_cast<const T*>(b),
                                                             static_cast<T*>(out), loop, n);
  });
  TESSEL_CUDA_LAUNCH_CHECK("where");
}

void cast(const void* in, DType from, void* out, DType to, int64_t n, StreamHandle s) {
  if (n <= 0) return;
  auto st = as_stream(s);
  const auto grid = grid_for(n);
  if (from == to) {
    cudaError_t e = cudaMemcpyAsync(out, in, static_cast<std::size_t>(n) * dtype_size(to), cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess) throw_cuda(e, "cast (copy)", __FILE__, __LINE__);
    return;
  }
  if (from == DType::i32) {
    dispatch_float(to, "cast", [&](auto tag) {
      using D = decltype(tag);
      k_cast_if<D><<<grid, kThreads, 0, st>>>(static_cast<const int32_t*>(in), static_cast<D*>(out), n);
    });
  } else if (to == DType::i32) {
    dispatch_float(from, "cast", [&](auto tag) {
      using S = decltype(tag);
      k_cast_fi<S><<<grid, kThreads, 0, st>>>(static_cast<const S*>(in), static_cast<int32_t*>(out), n);
    });
  } else {
    dispatch_float(from, "cast", [&](auto stag) {
      using S = decltype(stag);
      dispatch_float(to, "cast", [&](auto dtag) {
        using D = decltype(dtag);
        k_cast_ff<S, D><<<grid, kThreads, 0, st>>>(static_cast<const S*>(in), static_cast<D*>(out), n);
      });
    });
  }
  TESSEL_CUDA_LAUNCH_CHECK("cast");
}

}  // namespace tessel::cuda_kernels
