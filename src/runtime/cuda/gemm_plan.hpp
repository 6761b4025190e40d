// src/runtime/cuda/gemm_plan.hpp — the einsum -> cuBLASLt mapping as a host function with no
// CUDA types: which operands are permuted (or summed) into scratch, the GEMM's transposes,
// extents, leading dimensions and batch strides, the zero-padded copies of a product whose rows
// are not a multiple of 16 bytes, and the strides of the final copy into the result.
// run_cuda_einsum (cuda_einsum.cpp) only executes a plan; tests/unit/test_gemm_plan.cpp executes
// plans on the host (strided copies, zero padding, a column-major batched GEMM with cuBLAS's
// op/ld/stride semantics) against the CPU einsum kernel. Compiled into the main library, so the
// test runs in a build without CUDA too.
//
// Everything is in elements of the einsum's dtype (elem_size bytes), every strided copy writes
// its destination densely (row-major over `shape`) unless it says otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel::cuda {

// Row-major strides of a dense tensor: tessel::contiguous_strides (core/common.hpp).
using tessel::contiguous_strides;

// dst[i] = src[offset(i)] over the index space `shape` (dst dense, row-major), or, when
// summed_shape is not empty, dst[i] = sum over j of src[offset(i) + offset_summed(j)].
struct GemmArrange {
  Shape shape;
  std::vector<int64_t> src_strides;  // per dim of shape: stride in the source
  Shape summed_shape;
  std::vector<int64_t> summed_strides;
  bool sums() const { return !summed_shape.empty(); }
};

// One of cuBLASLt's two GEMM operands.
struct GemmOperand {
  int source = 0;        // the einsum operand it comes from (0 or 1)
  bool arrange = false;  // permuted (or summed) into a dense scratch of arranged.shape first
  GemmArrange arranged;
  // Zero padding (after the arrangement): the dense [batch, rows, cols] buffer is copied into a
  // zeroed dense [batch, padded_rows, padded_cols] scratch.
  bool pad = false;
  int64_t rows = 0, cols = 0, padded_rows = 0, padded_cols = 0;
  bool trans = false;  // CUBLAS_OP_T (else CUBLAS_OP_N)
  int64_t ld = 0;      // leading dimension (column-major)
  int64_t stride = 0;  // batch stride
};

struct EinsumGemmPlan {
  enum class Kind {
    Empty,  // the result has no elements: nothing to do
    Unary,  // one operand: `unary` arranges it straight into the result
    Zero,   // nothing is contracted (a contracted letter of size 0): the result is zeros
    Gemm,   // one strided-batched GEMM
  };
  Kind kind = Kind::Empty;
  // The letter classes: batch (both operands and the result), free_a / free_b (one operand and
  // the result), contract (both operands, not the result), sum_a / sum_b (one operand only).
  struct Letters {
    std::string batch, free_a, free_b, contract, sum_a, sum_b;
  } letters;
  int64_t B = 1, M = 1, N = 1, K = 1;  // products of the classes' extents
  GemmArrange unary;                   // Kind::Unary
  // Kind::Gemm: column-major C (m x n, ld ldc, batch stride stride_c) = op(a) (m x k) * op(b)
  // (k x n), `batch` times. a.source is 1 unless the product is stored transposed (free_b
  // before free_a in the result).
  GemmOperand a, b;
  int64_t m = 0, n = 0, k = 0, ldc = 0, stride_c = 0, batch = 1;
  bool padded = false;  // m, n, k are the padded extents; C is a scratch of batch * stride_c
  bool trans_c = false; // C is the result's [batch, free_b, free_a] rather than [batch, free_a, free_b]
  // C is written straight into the result (its letters are in C's order, unpadded); else into
  // a scratch of c_elements and copied out: result (dense) <- C at copy_out_strides (per result dim).
  bool c_in_result = true;
  int64_t c_elements = 0;
  std::vector<int64_t> copy_out_strides;
  double flops = 0;  // 2 B M N K
};

// The plan of `equation` over operands of `in_shapes` into a result of `out_shape`, for a dtype
// of elem_size bytes; a product of at least pad_min_flops FLOPs whose m, n or k is not a multiple
// of 16 bytes is padded (CudaBackendOptions::gemm_pad_min_flops). Throws RuntimeError naming the
// equation when the shapes do not fit it.
EinsumGemmPlan plan_einsum_gemm(const std::string& equation, const std::vector<Shape>& in_shapes,
                                const Shape& out_shape, std::size_t elem_size, double pad_min_flops);

}  // namespace tessel::cuda
