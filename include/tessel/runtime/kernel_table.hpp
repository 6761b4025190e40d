// tessel/runtime/kernel_table.hpp — how a backend registers its kernels: one function per op
// kind, looked up by kind. A kind with no kernel is a clear error naming the op and the
// backend, raised when a program is loaded or a kernel is called, never a crash.
//
//   KernelTable<CpuKernelFn> t("cpu");
//   t.add(OpKind::Einsum, k_einsum);
//   t.get(OpKind::Einsum)(args);
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/ir/graph.hpp"

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

// A kernel's cache of plans (an expression parsed and typed for one list of operand types):
// a loaded program calls the same kernels with the same types every run, so each kernel keeps
// a thread_local PlanCache and plans once per thread. At most N entries; once full, an insert
// replaces the entries in turn. Entries never move (pointers stay valid until replaced).
template <class T, std::size_t N>
class PlanCache {
 public:
  template <class Match>
  T* find(Match&& match) {
    for (T& t : items_)
      if (match(t)) return &t;
    return nullptr;
  }
  T& insert(T t) {
    if (items_.size() < N) {
      if (items_.capacity() < N) items_.reserve(N);
      items_.push_back(std::move(t));
      return items_.back();
    }
    T& slot = items_[next_];
    slot = std::move(t);
    next_ = (next_ + 1) % N;
    return slot;
  }

 private:
  std::vector<T> items_;
  std::size_t next_ = 0;
};

}  // namespace tessel
