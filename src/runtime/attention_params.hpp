// src/runtime/attention_params.hpp — internal: the host-side preparation of the attention
// kernels, shared by every backend (CPU: src/runtime/cpu/cpu_kernels_attention.cpp; CUDA:
// kernels/attention.cu through src/runtime/cuda/). From a kernel's arguments it checks the
// operands and results (count, rank, shapes, dtypes, the layout, the scale) and returns the
// sizes and the element strides of q/k/v in their layout, so a kernel reads its operands in
// place whatever the layout (no head split or merge copies). Errors name the op, the operand
// types and what is wrong (RuntimeError), the same on every backend.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/runtime/kernels.hpp"

namespace tessel {

struct AttentionParams {
  int64_t B = 0, H = 0, Sq = 0, Sk = 0, D = 0;
  // Element strides of a [batch, head, position] index in q (and out, dout, dq) and in k (and
  // v, dk, dv); the head_dim is contiguous (stride 1) in both layouts.
  int64_t q_sb = 0, q_sh = 0, q_ss = 0;
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;
  float scale = 1.0f;
  bool causal = false;
  // Causal: query i sees keys j <= i + offset (offset = Sk - Sq >= 0).
  int64_t offset = 0;
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
