// src/runtime/cpu/cpu_kernel_families.hpp — internal: the CPU kernels the kernel table
// (cpu_kernels.cpp) registers, each defined in the file of its op family,
// cpu_kernels_<family>.cpp, as the op registry is split (src/ops/<family>.cpp); and the
// kernel variants that prepare_cpu_kernel and run_handwritten_kernel call besides.
#pragma once

#include "tessel/runtime/kernels.hpp"

#include "onednn_einsum.hpp"

namespace tessel::cpu_detail {

// einsum (cpu_kernels_einsum.cpp). einsum_kernel: the kernel with the implementation chosen;
// true when oneDNN ran (prepare_only and epilogue: see its definition).
bool einsum_kernel(const KernelArgs& a, EinsumImpl impl, bool prepare_only = false,
                   const EinsumEpilogue* epilogue = nullptr);
void k_einsum(const KernelArgs& a);

// elementwise (cpu_kernels_elementwise.cpp): unary, binary, cast, comparisons, where.
void k_unary(const KernelArgs& a);
void k_binary(const KernelArgs& a);
void k_cast(const KernelArgs& a);
void k_compare(const KernelArgs& a);
void k_where(const KernelArgs& a);

// reduction (cpu_kernels_reduction.cpp): reduce_sum, reduce_max, reduce_mean.
void k_reduce(const KernelArgs& a);

// layout (cpu_kernels_layout.cpp): constant, reshape and sharding_constraint (k_copy),
// transpose, broadcast, slice, concat.
void k_constant(const KernelArgs& a);
void k_copy(const KernelArgs& a);
void k_transpose(const KernelArgs& a);
void k_broadcast(const KernelArgs& a);
void k_slice(const KernelArgs& a);
void k_concat(const KernelArgs& a);

// nn (cpu_kernels_nn.cpp). softmax_kernel and layer_norm_kernel with onednn false run the
// hand-written loops only (the oracle); softmax_on_onednn: whether a softmax runs on oneDNN.
bool softmax_on_onednn(const KernelArgs& a);
void softmax_kernel(const KernelArgs& a, bool onednn);
void layer_norm_kernel(const KernelArgs& a, bool onednn);
void k_softmax(const KernelArgs& a);
void k_layer_norm(const KernelArgs& a);
void k_layer_norm_grad(const KernelArgs& a);
void k_embedding(const KernelArgs& a);
void k_cross_entropy(const KernelArgs& a);
void k_softmax_grad(const KernelArgs& a);
void k_cross_entropy_grad(const KernelArgs& a);
void k_causal_mask(const KernelArgs& a);

// attention (cpu_kernels_attention.cpp): the tiled (flash) forward and backward.
void k_attention(const KernelArgs& a);
void k_attention_grad(const KernelArgs& a);

// optim (cpu_kernels_optim.cpp): one fused AdamW step.
void k_adamw(const KernelArgs& a);

// index (cpu_kernels_index.cpp): one_hot, gather, scatter_add, mask_padding.
void k_one_hot(const KernelArgs& a);
void k_gather(const KernelArgs& a);
void k_scatter_add(const KernelArgs& a);
void k_write_at(const KernelArgs& a);
void k_sample_tokens(const KernelArgs& a);
void k_mask_padding(const KernelArgs& a);

}  // namespace tessel::cpu_detail
