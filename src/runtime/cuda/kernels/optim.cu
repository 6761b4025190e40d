// src/runtime/cuda/kernels/optim.cu — the optimizer family (the CPU's cpu_kernels_optim.cpp):
// one fused AdamW step per element (moments in f32, the parameter in its own dtype).
#include "device_common.cuh"

namespace tessel::cuda_kernels {

namespace {
template <class T>
__global__ void k_adamw(const T* p, const T* g, const float* m, const float* v, const float* lr, const float* bc1,
                        const float* bc2, const float* gscale, const float* apply, T* po, float* mo, float* vo,
                        int64_t n, float b1, float b2, float eps, float wd) {
  const float l = *lr, c1 = *bc1, c2 = *bc2, gs_scale = *gscale;
  if (apply && *apply == 0.0f) {  // the step is skipped: the values are kept
    TESSEL_GRID_STRIDE(i, n) {
      po[i] = p[i];
      mo[i] = m[i];
      vo[i] = v[i];
    }
    return;
  }
  TESSEL_GRID_STRIDE(i, n) {
    const float pf = to_f<T>(p[i]);
    const float gs = to_f<T>(g[i]) * gs_scale;
    const float m2 = b1 * m[i] + (1.0f - b1) * gs;
    const float v2 = b2 * v[i] + (1.0f - b2) * (gs * gs);
    mo[i] = m2;
    vo[i] = v2;
    po[i] = from_f<T>(pf - l * ((m2 * c1) / (sqrtf(v2 * c2) + eps) + wd * pf));
  }
}
}  // namespace

void adamw(const void* p, const void* g, const float* m, const float* v, const float* lr, const float* bc1,
           const float* bc2, const float* gscale, const float* apply, void* p_out, float* m_out, float* v_out, DType t,
           int64_t n,
           float beta1, float beta2, float eps, float weight_decay, StreamHandle s) {
  if (n <= 0) return;
  dispatch_float(t, "adamw", [&](auto tag) {
    using T = decltype(tag);
    k_adamw<T><<<grid_for(n), kThreads, 0, as_stream(s)>>>(static_cast<const T*>(p), static_cast<const T*>(g), m, v, lr,
                                                          bc1, bc2, gscale, apply, static_cast<T*>(p_out), m_out,
                                                          v_out, n,
                                                          beta1, beta2, eps, weight_decay);
  });
  TESSEL_CUDA_LAUNCH_CHECK("adamw");
}

}  // namespace tessel::cuda_kernels
