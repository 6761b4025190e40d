// src/runtime/cpu/cpu_kernels.cpp — the CPU kernel table: one kernel per OpKind, on dense
// row-major buffers of the shapes given in KernelArgs (local shapes in a partitioned run,
// global ones in the reference executor); with load-time preparation (prepare_cpu_kernel) and
// the hand-written kernels that are the oracle for the oneDNN ones (run_handwritten_kernel).
//
// The kernels are split by op family like the op registry (src/ops/): cpu_kernels_einsum.cpp
// (GEMM, einsum), cpu_kernels_elementwise.cpp (unary, binary, cast, comparisons, where),
// cpu_kernels_reduction.cpp, cpu_kernels_layout.cpp (constant, copy, transpose, broadcast,
// slice, concat), cpu_kernels_nn.cpp (softmax, layer_norm, embedding, cross_entropy, their
// grads, causal_mask), cpu_kernels_attention.cpp (attention and its backward), cpu_kernels_optim.cpp (adamw), cpu_kernels_index.cpp (one_hot, gather,
// scatter_add, mask_padding); the fused ops' kernels are cpu_fused.cpp's. They are declared in
// cpu_kernel_families.hpp and share cpu_kernel_util.hpp (argument checks, f32 views of float
// operands, the strided loop nest).
//
// Design:
//  * No global mutable state: many device threads call these kernels concurrently (the
//    oneDNN primitive cache is the one shared structure; it is behind a mutex).
#include "tessel/runtime/cpu/cpu_kernels.hpp"

#include "cpu_elementwise.hpp"
#include "cpu_kernel_families.hpp"
#include "onednn_einsum.hpp"
#include "onednn_ops.hpp"

namespace tessel {

using namespace cpu_detail;

const KernelTable<CpuKernelFn>& cpu_kernel_table() {
  static const KernelTable<CpuKernelFn> t = [] {
    KernelTable<CpuKernelFn> k("cpu");
    k.add(OpKind::Constant, k_constant);
    k.add(OpKind::Einsum, k_einsum);
    for (OpKind u : kUnaryOps) k.add(u, k_unary);
    for (OpKind b : kBinaryOps) k.add(b, k_binary);
    for (OpKind r : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMean}) k.add(r, k_reduce);
    k.add(OpKind::Reshape, k_copy);
    k.add(OpKind::ShardingConstraint, k_copy);
    k.add(OpKind::Transpose, k_transpose);
    k.add(OpKind::Broadcast, k_broadcast);
    k.add(OpKind::Slice, k_slice);
    k.add(OpKind::Concat, k_concat);
    k.add(OpKind::Softmax, k_softmax);
    k.add(OpKind::LayerNorm, k_layer_norm);
    k.add(OpKind::LayerNormGrad, k_layer_norm_grad);
    k.add(OpKind::AdamW, k_adamw);
    k.add(OpKind::Embedding, k_embedding);
    k.add(OpKind::CrossEntropy, k_cross_entropy);
    k.add(OpKind::SoftmaxGrad, k_softmax_grad);
    k.add(OpKind::CrossEntropyGrad, k_cross_entropy_grad);
    k.add(OpKind::CausalMask, k_causal_mask);
    k.add(OpKind::Cast, k_cast);
    for (OpKind c : kCompareOps)
      k.add(c, k_compare);
    k.add(OpKind::Where, k_where);
    k.add(OpKind::OneHot, k_one_hot);
    k.add(OpKind::Gather, k_gather);
    k.add(OpKind::ScatterAdd, k_scatter_add);
    k.add(OpKind::WriteAt, k_write_at);
    k.add(OpKind::SampleTokens, k_sample_tokens);
    k.add(OpKind::MaskPadding, k_mask_padding);
    k.add(OpKind::FusedElementwise, fused_elementwise_kernel);
    k.add(OpKind::FusedSoftmax, fused_softmax_kernel);
    k.add(OpKind::FusedEinsum, fused_einsum_kernel);
    k.add(OpKind::Attention, k_attention);
    k.add(OpKind::AttentionGrad, k_attention_grad);
    return k;
  }();
  return t;
}

bool cpu_einsum(const KernelArgs& args, EinsumImpl impl, const EinsumEpilogue* epilogue) {
  return einsum_kernel(args, impl, false, epilogue);
}

void prepare_cpu_kernel(const KernelArgs& args) {
  if (args.kind == OpKind::Softmax && softmax_on_onednn(args)) onednn_softmax(args, /*prepare_only=*/true);
  if (args.kind == OpKind::LayerNorm) onednn_layer_norm(args, /*prepare_only=*/true);
  if (args.kind != OpKind::Einsum && args.kind != OpKind::FusedEinsum) return;
  // The kernel's validation rejects null data pointers; preparing reads and writes no data,
  // so null pointers are replaced by one that is never dereferenced.
  static const float placeholder = 0.0f;
  KernelArgs a = args.kind == OpKind::FusedEinsum ? fused_einsum_product_args(args) : args;
  for (const void*& p : a.in)
    if (!p) p = &placeholder;
  if (!a.out) a.out = const_cast<float*>(&placeholder);
  // fused_einsum: the primitive with the epilogue's post-ops, or (declined) the plain product's.
  if (args.kind == OpKind::FusedEinsum) {
    EinsumEpilogue ep;
    if (fused_einsum_post_ops(args, ep) && einsum_kernel(a, EinsumImpl::Auto, /*prepare_only=*/true, &ep)) return;
  }
  einsum_kernel(a, EinsumImpl::Auto, /*prepare_only=*/true);
}

void run_handwritten_kernel(const KernelArgs& args) {
  switch (args.kind) {
    case OpKind::Softmax: softmax_kernel(args, false); break;
    case OpKind::LayerNorm: layer_norm_kernel(args, false); break;
    case OpKind::Gelu: k_unary(args); break;
    case OpKind::Einsum: einsum_kernel(args, EinsumImpl::Eigen); break;
    default: run_cpu_kernel(args);
  }
}

bool has_cpu_kernel(OpKind kind) { return cpu_kernel_table().has(kind); }

void run_cpu_kernel(const KernelArgs& args) { cpu_kernel_table().get(args.kind)(args); }

}  // namespace tessel
