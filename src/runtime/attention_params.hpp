// src/runtime/attention_params.hpp — internal: the host-side preparation of the attention
// kernels, shared by every backend (CPU: src/runtime/cpu/cpu_kernels_attention.cpp; CUDA:
// src/runtime/cuda/kernels/attention.cu through src/runtime/cuda/). From a kernel's arguments it checks the
// operands and results (count, rank, shapes, dtypes, the layout, the scale) and returns the
// sizes and the element strides of q/k/v in their layout, so a kernel reads its operands in
// place whatever the layout (no head split or merge copies). Errors name the op, the operand
// types and what is wrong (RuntimeError), the same on every backend.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/runtime/kernels.hpp"
#include "attention_geometry.hpp"

namespace tessel {

// The launch geometry (attention_geometry.hpp, what the CUDA kernels take), the layout and dtype.
struct AttentionParams : AttentionGeometry {
  bool bshd = false;  // the layout: [batch, seq, heads, head_dim] (else [batch, heads, seq, head_dim])
  DType dtype = DType::f32;
  // Keys query i sees: [0, kv_end(i)).
  int64_t kv_end(int64_t i) const { return causal ? std::min(Sk, i + 1 + offset) : Sk; }
  // Causal-counted flops of the forward (4 per kept pair and head-dim element).
  double forward_flops() const;
};

// The forward (kind Attention: q, k, v -> out, lse) or the backward (kind AttentionGrad:
// q, k, v, out, lse, dout -> dq, dk, dv). `backend` names the backend in errors ("cpu", "cuda").
AttentionParams attention_params(const KernelArgs& a, const char* backend);

}  // namespace tessel
