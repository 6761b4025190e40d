// src/runtime/cpu/cpu_kernels_optim.cpp — the CPU kernel of adamw: one fused AdamW step
// (parameter, m and v updated in one elementwise pass, in f32, vectorised).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <Eigen/Dense>

#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {

// One fused AdamW step (builders.hpp adamw): three results, elementwise, in f32.
void k_adamw(const KernelArgs& a) {
  check_arity(a, 8, 9);
  const OpAttrs& at = attrs_of(a);
  const Shape& s = a.in_shapes[0];
  if (a.extra_out.size() != 2 || a.extra_out_shapes.size() != 2 || a.extra_out_dtypes.size() != 2)
    fail(a, "adamw writes three results (the parameter, m and v)");
  for (int i = 1; i <= 3; ++i)
    if (a.in_shapes[static_cast<std::size_t>(i)] != s) fail(a, "g, m and v must have the parameter's shape");
  if (a.out_shape != s || a.extra_out_shapes[0] != s || a.extra_out_shapes[1] != s) fail(a, "results must have the parameter's shape");
  if (a.in_dtypes[2] != DType::f32 || a.in_dtypes[3] != DType::f32 || a.extra_out_dtypes[0] != DType::f32 ||
      a.extra_out_dtypes[1] != DType::f32)
    fail(a, "the moments must be f32");
  for (std::size_t i = 4; i < a.in.size(); ++i)
    if (num_elements(a.in_shapes[i]) != 1 || a.in_dtypes[i] != DType::f32)
      fail(a, "lr, bc1, bc2, gscale (and apply) must be f32 scalars");
  FVec b0, b1, ob;
  const float* p = in_f32(a, 0, b0);
  const float* g = in_f32(a, 1, b1);
  const float* m = static_cast<const float*>(a.in[2]);
  const float* v = static_cast<const float*>(a.in[3]);
  auto scalar = [&](std::size_t i) { return *static_cast<const float*>(a.in[i]); };
  const float lr = scalar(4), bc1 = scalar(5), bc2 = scalar(6), gscale = scalar(7);
  const float b1c = static_cast<float>(at.beta1), b2c = static_cast<float>(at.beta2), eps = static_cast<float>(at.eps),
              wd = static_cast<float>(at.weight_decay);
  float* po = out_f32(a, ob);
  float* mo = static_cast<float*>(a.extra_out[0]);
  float* vo = static_cast<float*>(a.extra_out[1]);
  const int64_t n = num_elements(s);
  if (a.in.size() == 9 && scalar(8) == 0.0f) {  // apply = 0: the step is skipped, values kept
    for (int64_t i = 0; i < n; ++i) po[i] = p[i], mo[i] = m[i], vo[i] = v[i];
    finish_out(a, ob);
    return;
  }
  // Vectorised in chunks that stay in L1 (Eigen's packet sqrt and division are IEEE's, as the
  // scalar ones; the scalar loop, its sqrt and division one element at a time, was 6% of the gpt
  // example's step). Each chunk reads its p, g, m, v before writing them, so the results may be
  // donated inputs' buffers.
  constexpr int64_t kChunk = 512;
  alignas(64) float gsb[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t c = std::min(kChunk, n - i0);
    using A = Eigen::Map<Eigen::ArrayXf>;
    using CA = Eigen::Map<const Eigen::ArrayXf>;
    A gs(gsb, c), m2(mo + i0, c), v2(vo + i0, c);
    gs = CA(g + i0, c) * gscale;
    m2 = b1c * CA(m + i0, c) + (1.0f - b1c) * gs;
    v2 = b2c * CA(v + i0, c) + (1.0f - b2c) * (gs * gs);
    const CA pi(p + i0, c);
    A(po + i0, c) = pi - lr * ((m2 * bc1) / ((v2 * bc2).sqrt() + eps) + wd * pi);
  }
  finish_out(a, ob);
}

}  // namespace tessel::cpu_detail
