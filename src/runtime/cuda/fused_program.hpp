// src/runtime/cuda/fused_program.hpp — the CUDA kernels' codes of the elementwise ops (OpKind ->
// src/runtime/cuda/kernels/elementwise_ops.hpp) and a typed fused expression as the device program's steps
// (launchers.hpp, FusedProgram). Host code with no CUDA type: the backend (cuda_kernels.cpp)
// plans its fused kernels with it, and tests/unit/test_cuda_device_math.cpp builds the same
// programs on the host to run the device interpreter (src/runtime/cuda/kernels/fused_eval.hpp) against the CPU
// fused kernel.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_loop.hpp"  // broadcast_strides
#include "launchers.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::cuda {

// The CUDA code of each elementwise op, generated from the families' lists (op_list.hpp): an op
// added to a list without its code in src/runtime/cuda/kernels/elementwise_ops.hpp does not compile.
#define TESSEL_CUDA_UNARY_CODE(k) {OpKind::k, cuda_kernels::Unary::k},
#define TESSEL_CUDA_BINARY_CODE(k) {OpKind::k, cuda_kernels::Binary::k},
inline constexpr std::pair<OpKind, cuda_kernels::Unary> kUnaryCodes[] = {TESSEL_UNARY_OPS(TESSEL_CUDA_UNARY_CODE)};
// Comparisons last (a code >= Binary::Eq is a comparison).
inline constexpr std::pair<OpKind, cuda_kernels::Binary> kBinaryCodes[] = {
    TESSEL_BINARY_OPS(TESSEL_CUDA_BINARY_CODE) TESSEL_COMPARE_OPS(TESSEL_CUDA_BINARY_CODE)};
#undef TESSEL_CUDA_UNARY_CODE
#undef TESSEL_CUDA_BINARY_CODE
static_assert(static_cast<int>(kBinaryCodes[sizeof kBinaryCodes / sizeof kBinaryCodes[0] -
                                            sizeof kCompareOps / sizeof kCompareOps[0]].second) ==
                  static_cast<int>(cuda_kernels::Binary::Eq),
              "the CUDA binary codes keep the comparisons last, from Binary::Eq on");

// The device program of `e` (typed by type_fused_expr on these operands; the root has the
// result's shape `out_shape`), its pointers unset. Throws RuntimeError saying why when a node is
// not an op the device evaluates, mixes i32 and float arguments, or exceeds the program's limits
// (kMaxFusedSteps, kMaxFusedOperands, kMaxRank).
inline cuda_kernels::FusedProgram fused_program_of(const FusedExpr& e, const std::vector<Shape>& in_shapes,
                                                   const std::vector<DType>& in_dtypes, const Shape& out_shape) {
  namespace ck = cuda_kernels;
  const Shape& os = out_shape;
  if (e.nodes.empty() || e.nodes.size() > static_cast<std::size_t>(ck::kMaxFusedSteps) ||
      in_shapes.size() > static_cast<std::size_t>(ck::kMaxFusedOperands) || in_dtypes.size() != in_shapes.size() ||
      os.size() > static_cast<std::size_t>(ck::kMaxRank))
    throw RuntimeError(fmt::format("{} nodes, {} operands, rank {}: outside the CUDA fused kernel's limits (1..{}, {}, {})",
                                   e.nodes.size(), in_shapes.size(), os.size(), ck::kMaxFusedSteps,
                                   ck::kMaxFusedOperands, ck::kMaxRank));
  ck::FusedProgram p;
  p.nsteps = static_cast<int>(e.nodes.size());
  p.noperands = static_cast<int>(in_shapes.size());
  p.rank = static_cast<int>(os.size());
  for (std::size_t d = 0; d < os.size(); ++d) p.shape[d] = os[d];
  for (std::size_t i = 0; i < in_shapes.size(); ++i) {
    const auto st = broadcast_strides(in_shapes[i], os);
    for (std::size_t d = 0; d < os.size(); ++d) p.stride[i][d] = st[d];
    p.in_dtype[i] = static_cast<int8_t>(in_dtypes[i]);
  }
  for (std::size_t k = 0; k < e.nodes.size(); ++k) {
    const FusedNode& nd = e.nodes[k];
    ck::FusedStep& st = p.steps[k];
    st.dtype = static_cast<int8_t>(nd.dtype);
    for (std::size_t j = 0; j < nd.args.size() && j < 3; ++j) st.arg[j] = static_cast<int16_t>(nd.args[j]);
    if (!nd.args.empty()) st.arg_dtype = static_cast<int8_t>(e.nodes[static_cast<std::size_t>(nd.args[0])].dtype);
    switch (nd.kind) {
      case FusedNode::Kind::Operand:
        st.kind = static_cast<int8_t>(ck::FusedKind::Operand);
        st.operand = static_cast<int16_t>(nd.operand);
        continue;
      case FusedNode::Kind::Literal:
        st.kind = static_cast<int8_t>(ck::FusedKind::Literal);
        if (nd.dtype == DType::i32) {
          st.lit_i = static_cast<int32_t>(nd.value);
        } else {  // rounded once to its dtype, as the CPU kernel's literal
          HostTensor t(nd.dtype, {1});
          t.set(0, static_cast<double>(static_cast<float>(nd.value)));
          st.lit_f = static_cast<float>(t.get(0));
        }
        continue;
      case FusedNode::Kind::Op: break;
    }
    bool found = false;
    for (const auto& [kind, op] : kUnaryCodes)
      if (kind == nd.op) st.kind = static_cast<int8_t>(ck::FusedKind::Unary), st.op = static_cast<int8_t>(op), found = true;
    for (const auto& [kind, op] : kBinaryCodes)
      if (kind == nd.op) {
        st.kind = static_cast<int8_t>(op >= ck::Binary::Eq ? ck::FusedKind::Compare : ck::FusedKind::Binary);
        st.op = static_cast<int8_t>(op);
        found = true;
      }
    if (nd.op == OpKind::Where) st.kind = static_cast<int8_t>(ck::FusedKind::Where), found = true;
    if (nd.op == OpKind::Cast) st.kind = static_cast<int8_t>(ck::FusedKind::Cast), found = true;
    if (nd.op == OpKind::CausalMask) st.kind = static_cast<int8_t>(ck::FusedKind::CausalMask), found = true;
    if (!found) throw RuntimeError(fmt::format("'{}' is not an op the CUDA fused kernel evaluates", op_name(nd.op)));
    if ((st.kind == static_cast<int8_t>(ck::FusedKind::Binary) ||
         st.kind == static_cast<int8_t>(ck::FusedKind::Compare)) &&
        (e.nodes[static_cast<std::size_t>(nd.args[0])].dtype == DType::i32) !=
            (e.nodes[static_cast<std::size_t>(nd.args[1])].dtype == DType::i32))
      throw RuntimeError(fmt::format("{}: i32 and float operands cannot be mixed", op_name(nd.op)));
  }
  return p;
}

}  // namespace tessel::cuda
