// tessel/runtime/kernel_table.hpp — how a backend registers its kernels: one function per op
// kind, looked up by kind. A kind with no kernel is a clear error naming the op and the
// backend, raised when a program is loaded or a kernel is called, never a crash.
//
//   KernelTable<CpuKernelFn> t("cpu");
//   t.add(OpKind::Einsum, k_einsum);
//   t.get(OpKind::Einsum)(args);
#pragma once

#include <array>
#include <string>

#include "tessel/common.hpp"
#include "tessel/graph.hpp"

namespace tessel {

template <class Fn>
class KernelTable {
 public:
  explicit KernelTable(std::string backend) : backend_(std::move(backend)) { fns_.fill(nullptr); }

  void add(OpKind kind, Fn fn) { fns_[index(kind)] = fn; }
  bool has(OpKind kind) const {
    const int k = static_cast<int>(kind);
    return k >= 0 && k < static_cast<int>(OpKind::kCount) && fns_[static_cast<std::size_t>(k)] != nullptr;
  }
  // The kernel of `kind`; throws RuntimeError naming the op and this backend when none is
  // registered.
  Fn get(OpKind kind) const {
    Fn f = fns_[index(kind)];
    if (!f) throw RuntimeError(missing_message(kind));
    return f;
  }
  const std::string& backend() const { return backend_; }
  std::string missing_message(OpKind kind) const;

 private:
  std::size_t index(OpKind kind) const {
    const int k = static_cast<int>(kind);
    if (k < 0 || k >= static_cast<int>(OpKind::kCount))
      throw RuntimeError("backend '" + backend_ + "': op kind #" + std::to_string(k) +
                         " is not an op of tessel");
    return static_cast<std::size_t>(k);
  }
  std::string backend_;
  std::array<Fn, static_cast<std::size_t>(OpKind::kCount)> fns_{};
};

// "op 'gather' has no kernel on backend 'cuda'; ..." (defined in src/runtime/kernel_table.cpp).
std::string missing_kernel_message(OpKind kind, const std::string& backend);

template <class Fn>
std::string KernelTable<Fn>::missing_message(OpKind kind) const {
  return missing_kernel_message(kind, backend_);
}

}  // namespace tessel
