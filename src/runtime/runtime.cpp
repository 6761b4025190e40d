// src/runtime/runtime.cpp — what every Runtime shares: the single-process host exchange, and the
// seed a multi-process job agrees on, and the lifetime token of a runtime (runtime.hpp).
#include "tessel/runtime/runtime.hpp"

#include <fmt/format.h>

#include <charconv>

#include "tessel/core/common.hpp"
#include "runtime_lifetime.hpp"

namespace tessel {

namespace detail {

RuntimeLifetime::Use RuntimeLifetime::enter(const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!alive_)
    throw RuntimeError(fmt::format("{}: the runtime this program was loaded on ({}) was destroyed; a runtime must "
                                   "outlive the programs loaded on it: destroy the LoadedExecutable first, or load the "
                                   "program again on a live runtime",
                                   what, description_));
  ++active_;
  return Use(this);
}

void RuntimeLifetime::leave() {
  std::lock_guard<std::mutex> lk(mu_);
  if (--active_ == 0) cv_.notify_all();
}

void RuntimeLifetime::retire(const std::string& description) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (alive_) {
    alive_ = false;
    try {
      description_ = description;
    } catch (...) {  // out of memory: the message names no runtime
    }
  }
  cv_.wait(lk, [&] { return active_ == 0; });
}

bool RuntimeLifetime::alive() const {
  std::lock_guard<std::mutex> lk(mu_);
  return alive_;
}

}  // namespace detail

Runtime::Runtime() : lifetime_(std::make_shared<detail::RuntimeLifetime>()) {}
Runtime::Runtime(const Runtime&) : Runtime() {}
Runtime::~Runtime() { retire("a runtime"); }

void Runtime::retire(const std::string& description) noexcept {
  if (lifetime_) lifetime_->retire(description);
}

std::vector<std::string> Runtime::allgather_host(const std::string& mine) { return {mine}; }

uint64_t agree_on_seed(Runtime* runtime, uint64_t seed) {
  if (!runtime || runtime->process_count() <= 1) return seed;
  const std::vector<std::string> all = runtime->allgather_host(std::to_string(seed));
  uint64_t first = 0;
  const std::string& s = all.empty() ? std::string() : all[0];
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), first);
  if (all.size() != static_cast<std::size_t>(runtime->process_count()) || ec != std::errc() ||
      end != s.data() + s.size())
    throw RuntimeError(fmt::format("agree_on_seed: rank {} got {} answers (expected {}), rank 0's '{}' is not a seed",
                                   runtime->process_rank(), all.size(), runtime->process_count(), s));
  return first;
}

}  // namespace tessel
