// tessel/runtime/kernels.hpp — what every backend's kernels see: KernelArgs, one op on dense
// row-major buffers of *local* shapes (the backend-neutral half of the kernel contract; each
// backend has a KernelTable of its kernels, kernel_table.hpp). The CPU kernels, which the
// unpartitioned reference executor runs too, are declared in runtime/cpu/cpu_kernels.hpp.
//
// Ops whose result depends on global positions (Embedding with a vocab-sharded table,
// CausalMask with sharded query/key dims, gather, one_hot, scatter_add) read `in_offsets`
// (the global coordinates of the first element of each operand's local block, all zero when
// unsharded), the global shapes, and the result block's offset.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/runtime/kernel_table.hpp"

namespace tessel {

class MemoryMeter;  // tessel/runtime/memory_meter.hpp

struct KernelArgs {
  OpKind kind = OpKind::Input;
  const OpAttrs* attrs = nullptr;  // attrs of the (local) op: shapes already local
  std::vector<const void*> in;
  std::vector<Shape> in_shapes;
  std::vector<DType> in_dtypes;
  std::vector<std::vector<int64_t>> in_offsets;  // per operand; empty = all zeros
  // For ops that read positions (OpDef::needs_offsets): the global shape of each operand
  // (empty = the local shape, i.e. unsharded) and the global position and shape of the
  // result's block (empty offset = all zeros, shape = the local one).
  std::vector<Shape> in_global_shapes;
  std::vector<int64_t> out_offset;
  Shape out_global_shape;
  void* out = nullptr;
  Shape out_shape;
  DType out_dtype = DType::f32;
  // Results 1.. of an op with several results (OpDef::num_results), like `out`.
  std::vector<void*> extra_out;
  std::vector<Shape> extra_out_shapes;
  std::vector<DType> extra_out_dtypes;
  int num_threads = 1;  // threads the kernel may use (Eigen thread pool where it pays)
  // Where the kernel counts scratch it allocates while it runs (the device's
  // Backend::device_memory(), set by the backend; null: not counted).
  MemoryMeter* scratch_meter = nullptr;
};

// fused_einsum's two halves, for any backend: the product (kind Einsum over the einsum's own
// operands, into the result) and the epilogue (kind FusedElementwise over {the result, the
// operands after the einsum's}, written in place; `attrs` holds its expression and must
// outlive the args). Throw RuntimeError naming fused_einsum when the equation's operand count
// does not fit the args.
KernelArgs fused_einsum_product_args(const KernelArgs& a);
KernelArgs fused_einsum_epilogue_args(const KernelArgs& a, OpAttrs& attrs);

// The arguments of kernel instruction `instr` of `program` as the device at mesh `position` runs
// it: kind, attrs (pointing into the program), local shapes and dtypes, and for ops that read
// positions (OpDef::needs_offsets) the blocks' global offsets and shapes. The data pointers are
// null (the executor and the kernel timer fill them). Throws Error when the instruction is not a
// kernel.
KernelArgs kernel_args_of(const Program& program, std::size_t instr, int64_t position);

}  // namespace tessel
