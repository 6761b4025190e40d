// src/runtime/runtime_lifetime.hpp — the token that lets a loaded program outlive its runtime
// without a crash (runtime.hpp, Lifetimes). A runtime owns one; each LoadedExecutable holds a
// shared_ptr to it and enters it around every use of the runtime (a run, a transfer). The
// runtime's destructor retires it first: it waits for the uses in flight, and every later
// enter throws RuntimeError naming the operation and the runtime.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

namespace tessel::detail {

class RuntimeLifetime {
 public:
  // One use of the runtime, from enter() until destruction.
  class Use {
   public:
    Use() = default;
    explicit Use(RuntimeLifetime* l) : l_(l) {}
    Use(Use&& o) noexcept : l_(o.l_) { o.l_ = nullptr; }
    Use& operator=(Use&&) = delete;
    Use(const Use&) = delete;
    ~Use() {
      if (l_) l_->leave();
    }

   private:
    RuntimeLifetime* l_ = nullptr;
  };

  // Throws RuntimeError "<what>: the runtime ... was destroyed" after retire().
  Use enter(const std::string& what);
  // Marks the runtime gone and waits for the uses in flight. Idempotent.
  void retire(const std::string& description) noexcept;
  bool alive() const;

 private:
  void leave();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool alive_ = true;
  int active_ = 0;
  std::string description_;
};

}  // namespace tessel::detail
