// src/runtime/onednn_einsum.hpp — internal: the CPU backend's einsum lowered to a (batched)
// oneDNN matmul, and the switch that picks it or the Eigen kernel. Not a public header:
// oneDNN's headers stay inside src/runtime/onednn_einsum.cpp (docs/cpu-backend.md).
#pragma once

#include <string>

#include "tessel/runtime/kernels.hpp"

namespace tessel {

// Which implementation the CPU einsum kernel uses. Auto (what the kernel table runs) is
// oneDNN where it is compiled in and the equation maps onto a matmul, else Eigen. Eigen is
// the fallback and the test oracle.
enum class EinsumImpl { Auto, Eigen, OneDnn };

// Runs the einsum of `args` (OpKind::Einsum, one or two operands) with `impl`; OneDnn
// behaves like Auto (falls back to Eigen where oneDNN cannot take the equation). Returns
// true when oneDNN ran it. Defined in cpu_kernels.cpp.
bool cpu_einsum(const KernelArgs& args, EinsumImpl impl);

// True when tessel was built with oneDNN (TESSEL_WITH_ONEDNN).
bool onednn_einsum_compiled();

// Runs the two-operand einsum `sa,sb->sr` of `args` (already validated: letters unique per
// subscript, sizes consistent, every result letter in an operand) as one oneDNN matmul with
// the operands' and result's layouts given to oneDNN as strides — no copies. Returns false,
// having written nothing, when it does not map onto one: a letter summed out of a single
// operand, a group of letters (batch, M, N or K) not contiguous and in the same order in the
// two tensors that hold it, a size-0 dim, dtypes other than all-f32 or all-bf16 (bf16 only
// where the CPU has native bf16 dot products), or no optimised oneDNN implementation for the
// layout (oneDNN's reference kernels are never used). Thread-safe: primitives are created
// once per (layout, dtype) and cached.
bool onednn_einsum(const KernelArgs& args, const std::string& sa, const std::string& sb,
                   const std::string& sr);

}  // namespace tessel
