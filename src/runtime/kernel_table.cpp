// src/runtime/kernel_table.cpp — the message for an op kind a backend has no kernel for.
#include "tessel/runtime/kernel_table.hpp"

#include "tessel/ops/registry.hpp"

namespace tessel {

std::string missing_kernel_message(OpKind kind, const std::string& backend) {
  if (kind == OpKind::Input)
    return "op 'input' has no kernel on backend '" + backend +
           "': inputs are bound by the runtime, not computed";
  return std::string("op '") + op_name(kind) + "' has no kernel on backend '" + backend +
         "'; register one in that backend's kernel table (docs/adding-an-op.md), or run the "
         "program on a backend that has it";
}

}  // namespace tessel
