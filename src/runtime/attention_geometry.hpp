// src/runtime/attention_geometry.hpp — internal: the geometry of one attention launch, the one
// struct the host-side checks (attention_params.hpp, every backend) fill and the CUDA kernels
// (cuda/kernels/attention_plan.hpp, read by nvcc too) take. Plain data, no includes beyond
// <cstdint>, so device code can hold it.
#pragma once

#include <cstdint>

namespace tessel {

struct AttentionGeometry {
  int64_t B = 0, H = 0, Sq = 0, Sk = 0, D = 0;
  // Element strides of a [batch, head, position] index in q (and out, dout, dq) and in k (and
  // v, dk, dv); the head_dim is contiguous (stride 1) in both layouts.
  int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  float scale = 1.0f;
  bool causal = false;
  // Causal: query i sees keys j <= i + offset (offset = Sk - Sq >= 0).
  int64_t offset = 0;
};

}  // namespace tessel
