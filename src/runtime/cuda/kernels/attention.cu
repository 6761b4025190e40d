// src/runtime/cuda/kernels/attention.cu — the host launchers of fused attention (launchers.hpp: attention_forward,
// attention_backward): the launch plan (attention_plan.hpp: the tensor-core path or the generic
// one, grid, threads, shared memory), the template dispatch over dtype, head_dim and the causal
// mask, and the launches on the stream. The kernels are src/runtime/cuda/kernels/attention_kernels.cuh.
#include <array>
#include <atomic>
#include <initializer_list>

#include "attention_kernels.cuh"

namespace tessel::cuda_kernels {
namespace {

using attn::Args;
using attn::Launch;
using attn::Path;
using attn::Plan;

// Whether this device runs the tensor-core kernels: compute capability >= 8.0 and a binary
// compiled for sm_80+ (cudaFuncGetAttributes' binaryVersion: a build for older architectures
// traps in those kernels). Cached per device (0: unknown, 1: no, 2: yes).
bool tc_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  static std::array<std::atomic<int>, 64> cache{};
  if (dev >= 0 && dev < 64) {
    const int c = cache[static_cast<std::size_t>(dev)].load(std::memory_order_relaxed);
    if (c) return c == 2;
  }
  int major = 0;
  cudaFuncAttributes fa{};
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
            cudaFuncGetAttributes(&fa, attn::fwd_tc<__nv_bfloat16, 64, false>) == cudaSuccess && fa.binaryVersion >= 80;
  cudaGetLastError();  // a failed query is not the next launch's error
  if (dev >= 0 && dev < 64) cache[static_cast<std::size_t>(dev)].store(ok ? 2 : 1, std::memory_order_relaxed);
  return ok;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Launches a kernel over a plan's grid with its dynamic shared memory on the stream (above
// 48 KiB the kernel's limit is raised first); attn::run_forward / run_backward call it.
struct Launcher {
  cudaStream_t st;
  void operator()(void (*kernel)(Args), const Launch& l, const Args& a, const char* what) const {
    if (l.blocks <= 0) return;
    if (l.smem > 48 * 1024) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.smem));
      if (e != cudaSuccess) throw_cuda(e, what, __FILE__, __LINE__);
    }
    Args b = a;
    b.tiles = l.tiles;
    kernel<<<static_cast<unsigned>(l.blocks), static_cast<unsigned>(l.threads), static_cast<std::size_t>(l.smem),
             st>>>(b);
    TESSEL_CUDA_LAUNCH_CHECK(what);
  }
};

Plan plan_of(const AttentionDims& p, DType t, std::initializer_list<const void*> ptrs, const char* what) {
  bool aligned = attn::strides_multiple_of(p, 8);
  for (const void* q : ptrs) aligned = aligned && aligned16(q);
  const bool maybe_tc = (t == DType::bf16 || t == DType::f16) && (p.D == 64 || p.D == 128) && aligned;
  return attn::plan_attention(p, t, aligned, maybe_tc && tc_device(), what);
}

}  // namespace

void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, DType t,
                       const AttentionDims& p, StreamHandle s) {
  const Plan plan = plan_of(p, t, {q, k, v, out}, "attention");
  Args a = attn::make_args(p);
  a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
  attn::run_forward(plan, t, a, Launcher{as_stream(s)});
}

std::size_t attention_backward_scratch_bytes(const AttentionDims& p) {
  const int64_t n = p.B * p.H * p.Sq;
  return n > 0 ? static_cast<std::size_t>(n) * sizeof(float) : 0;
}

void attention_backward(const void* q, const void* k, const void* v, const void* out, const float* lse,
                        const void* dout, void* dq, void* dk, void* dv, DType t, const AttentionDims& p, void* scratch,
                        StreamHandle s) {
  const Plan plan = plan_of(p, t, {q, k, v, out, dout, dq, dk, dv}, "attention_grad");
  const cudaStream_t st = as_stream(s);
  if (p.B * p.H == 0) return;
  if (p.Sq == 0) {  // no query: dk = dv = 0 (dq is empty)
    const std::size_t bytes = static_cast<std::size_t>(p.B * p.H * p.Sk * p.D) * (t == DType::f32 ? 4 : 2);
    if (bytes) {
      cudaError_t e = cudaMemsetAsync(dk, 0, bytes, st);
      if (e == cudaSuccess) e = cudaMemsetAsync(dv, 0, bytes, st);
      if (e != cudaSuccess) throw_cuda(e, "attention_grad (zero dk, dv)", __FILE__, __LINE__);
    }
    return;
  }
  if (!scratch) throw RuntimeError("cuda kernel attention_grad: no scratch for D_i (attention_backward_scratch_bytes)");
  Args a = attn::make_args(p);
  a.q = q, a.k = k, a.v = v, a.o_in = out, a.dout = dout, a.out = dq, a.dk = dk, a.dv = dv;
  a.lse = const_cast<float*>(lse);  // read only in the backward
  a.dsum = static_cast<float*>(scratch);
  attn::run_backward(plan, t, a, Launcher{st});
}

}  // namespace tessel::cuda_kernels
