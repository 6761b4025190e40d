// src/runtime/kernel_fail.hpp — internal: the error of a backend-shared host-side kernel check
// (attention_params, write_at_params): RuntimeError naming the backend, the op, its operand
// types and result, and what is wrong — the same message on every backend.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "tessel/ops/registry.hpp"
#include "tessel/runtime/kernels.hpp"

namespace tessel {

[[noreturn]] inline void kernel_fail(const KernelArgs& a, const char* backend, const std::string& why) {
  std::vector<std::string> ins;
  for (std::size_t i = 0; i < a.in_shapes.size(); ++i)
    ins.push_back(i < a.in_dtypes.size() ? type_str(a.in_dtypes[i], a.in_shapes[i]) : shape_str(a.in_shapes[i]));
  throw RuntimeError(fmt::format("{} kernel {}({}) -> {}: {}", backend, op_name(a.kind), fmt::join(ins, ", "),
                                 type_str(a.out_dtype, a.out_shape), why));
}

}  // namespace tessel
