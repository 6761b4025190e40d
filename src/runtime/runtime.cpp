// src/runtime/runtime.cpp — what every Runtime shares: the single-process host exchange, and the
// seed a multi-process job agrees on (runtime.hpp).
#include "tessel/runtime/runtime.hpp"

#include <fmt/format.h>

#include <charconv>

#include "tessel/core/common.hpp"

namespace tessel {

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
