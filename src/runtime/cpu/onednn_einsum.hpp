// src/runtime/cpu/onednn_einsum.hpp — internal: the CPU backend's einsum lowered to a (batched)
// oneDNN matmul, and the switch that picks it or the Eigen kernel. Not a public header:
// oneDNN's headers stay inside src/runtime/cpu/onednn_einsum.cpp (docs/cpu-backend.md).
#pragma once

#include <string>
#include <vector>

#include "tessel/runtime/kernels.hpp"

namespace tessel {

// Which implementation the CPU einsum kernel uses. Auto (what the kernel table runs) is
// oneDNN where it is compiled in and the equation maps onto a matmul, else Eigen. Eigen is
// the fallback and the test oracle.
enum class EinsumImpl { Auto, Eigen, OneDnn };

// Runs the einsum of `args` (OpKind::Einsum, one or two operands) with `impl`; OneDnn
// behaves like Auto (falls back to Eigen where oneDNN cannot take the equation). Returns
// true when oneDNN ran it. Defined in cpu_kernels.cpp.
// With `epilogue` it only tries oneDNN with the epilogue as post-ops and returns whether that
// ran (false: nothing was written).
struct EinsumEpilogue;
bool cpu_einsum(const KernelArgs& args, EinsumImpl impl, const EinsumEpilogue* epilogue = nullptr);

// Load-time preparation of a CPU kernel (Backend::prepare_kernel): `args` as the kernel will
// get them, data pointers null. For an einsum that maps onto a oneDNN matmul it validates the
// equation and creates the oneDNN primitives the run will use (same cache keys: local dims,
// strides, dtype and the args' num_threads), so that no run creates one. Other kinds: nothing.
// Throws what the kernel would throw for invalid args. Defined in cpu_kernels.cpp.
void prepare_cpu_kernel(const KernelArgs& args);

// oneDNN primitives (matmuls, and the ops of onednn_ops.hpp) created in this process so far (by a run or a preparation), and
// how many were created while executing a kernel rather than preparing one: after load has
// prepared a program, its runs leave the latter unchanged. 0 without oneDNN.
struct OneDnnPrimitiveCounts {
  long created = 0;
  long created_while_running = 0;
};
OneDnnPrimitiveCounts onednn_primitive_counts();
// Empties the primitive caches (tests: so that a load must create its primitives).
void onednn_clear_primitive_cache();
// Counts one primitive creation (every oneDNN kernel calls it when it creates one);
// `running`: during a kernel's run rather than a preparation.
void onednn_count_creation(bool running);

// True when tessel was built with oneDNN (TESSEL_WITH_ONEDNN).
bool onednn_einsum_compiled();
// The largest scratchpad (bytes, as allocated) a oneDNN matmul run has used since the last
// reset; whether a primitive needs one is oneDNN's choice for the CPU at hand (tests: the
// meter must count exactly what was handed out). 0 without oneDNN.
int64_t onednn_scratchpad_high_water();
void onednn_reset_scratchpad_high_water();

// Runs the two-operand einsum `sa,sb->sr` of `args` (already validated: letters unique per
// subscript, sizes consistent, every result letter in an operand) as one oneDNN matmul with
// the operands' and result's layouts given to oneDNN as strides — no copies. Returns false,
// having written nothing, when it does not map onto one: a letter summed out of a single
// operand, a group of letters (batch, M, N or K) not contiguous and in the same order in the
// two tensors that hold it, a size-0 dim, dtypes other than all-f32 or all-bf16 (bf16 only
// where the CPU has native bf16 dot products), or no optimised oneDNN implementation for the
// layout (oneDNN's reference kernels are never used). Thread-safe: primitives are created
// once per (layout, dtype) and cached. With `prepare_only` it creates (or finds) the
// primitives and returns whether oneDNN would run it, touching no data.
//
// With `epilogue` (a fused_einsum's, as post-op steps: see EinsumEpilogue) the epilogue runs as
// the matmul's post-ops, and the call returns false, having written nothing, where it cannot
// (f32 only; a binary operand whose broadcast does not map onto the matmul's dims; no
// optimised implementation with those post-ops) or should not (a plain product that runs as
// dnnl_sgemm: sgemm then the loop measured faster than the primitive with post-ops): the
// caller then runs the product and the epilogue loop.
struct EinsumEpilogue;
bool onednn_einsum(const KernelArgs& args, const std::string& sa, const std::string& sb,
                   const std::string& sr, bool prepare_only = false, const EinsumEpilogue* epilogue = nullptr);

// A fused_einsum epilogue that is a chain of oneDNN post-ops over the product: each step reads
// the previous step's value (the product first) once and is one of
//   add(x, $k) / add($k, x)  binary add of epilogue operand k (a bias broadcast over the
//                            product, or a residual of its shape)
//   gelu(x)                  eltwise gelu_tanh: tessel's GELU is the tanh approximation (the
//                            same function; tessel evaluates it as x / (1 + exp(-2z)), so the
//                            two differ by rounding)
//   mul(x, c) / mul(c, x)    eltwise linear alpha = c, beta = 0 (exactly x * c): a scalar scale
// (a literal c). Anything else (another op, a shared node, a cast, a non-f32 node) is not.
struct EinsumEpilogue {
  struct Step {
    enum class Kind { Add, Gelu, Scale };
    Kind kind = Kind::Add;
    int operand = -1;   // Add: the epilogue operand ($k, k >= 1)
    float scale = 1.0f; // Scale
  };
  std::vector<Step> steps;
  // Epilogue operands by $k (index 0, the product, unused): data and shape.
  std::vector<const void*> in;
  std::vector<Shape> in_shapes;
  // Post-ops also where the plain product would run as dnnl_sgemm (benchmarks: BM_FusionMlp).
  bool force_primitive = false;
};
// The post-op steps of a parsed epilogue; false when it is not such a chain.
struct FusedExpr;
bool einsum_epilogue_steps(const FusedExpr& epilogue, std::vector<EinsumEpilogue::Step>& steps);

// fused_einsum without post-ops: the einsum (Auto), then the epilogue as a loop over the
// result (cpu_fused.cpp). The oracle the post-ops are tested against.
void run_fused_einsum_fallback(const KernelArgs& args);
// The fused_einsum kernel (what the kernel table runs); returns true when the epilogue ran as
// oneDNN post-ops, false when the fallback ran.
bool run_fused_einsum(const KernelArgs& args);

}  // namespace tessel
