// src/runtime/sample_tokens_params.hpp — internal: what every backend's sample_tokens kernel
// shares (CPU: src/runtime/cpu/cpu_kernels_index.cpp; CUDA: src/runtime/cuda/kernels/index.cu):
// the host-side checks and sizes (one message on every backend, as write_at_params.hpp), and
// the draw's arithmetic, host and device: the uniform number of a row's key and the order key
// of a float. The op's semantics are in docs/ir.md; the host's reference is infer's
// sample_token (generate.hpp), which uses sample_uniform too.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define TESSEL_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define TESSEL_SAMPLE_HD inline
#include "tessel/runtime/kernels.hpp"
#endif

namespace tessel {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective mix of 64 bits.
TESSEL_SAMPLE_HD uint64_t sample_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The uniform number in [0, 1) a row with `key` draws with: 53 bits of its mix.
TESSEL_SAMPLE_HD double sample_uniform(int32_t key) {
  const uint64_t bits = sample_mix64(static_cast<uint64_t>(static_cast<uint32_t>(key)) ^ 0x5eed5eed00000000ull);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// A float's bits as an unsigned key of the same order (-inf < ... < -0 < +0 < ... < +inf).
TESSEL_SAMPLE_HD uint32_t sample_order_key(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

#ifndef __CUDACC__
struct SampleTokensParams {
  int64_t rows = 0;  // this block's rows (the logits' leading dims)
  int64_t V = 0;     // the vocabulary (the logits' last dim, whole)
};
// Throws RuntimeError naming `backend`, the op and its operands when the operands are not
// (logits [..., V] float, keys i32 [...], temperature f32 [...], top_k i32 [...], top_p f32 [...])
// -> i32 [...].
SampleTokensParams sample_tokens_params(const KernelArgs& a, const char* backend);
#endif

}  // namespace tessel
