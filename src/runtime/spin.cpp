// The spin budget policy of spin.hpp.
#include "spin.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "tessel/core/common.hpp"

namespace tessel {
namespace detail {

int spin_budget_us(int requested_us, int64_t threads) {
  // A budget past a second would keep every waiter (and the process's exit) spinning; the
  // environment variable refuses it too.
  if (requested_us > 1000000)
    throw RuntimeError(fmt::format("spin_us = {}: expected microseconds, a whole number from 0 (never spin) to "
                                   "1000000, or -1 for the default",
                                   requested_us));
  if (requested_us >= 0) return requested_us;
  if (const char* env = std::getenv("TESSEL_SPIN_US"); env && *env) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > 1000000)
      throw RuntimeError(fmt::format("TESSEL_SPIN_US='{}': expected microseconds, a whole number from 0 (never "
                                     "spin) to 1000000",
                                     env));
    return static_cast<int>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw != 0 && static_cast<int64_t>(hw) >= threads ? kDefaultSpinUs : 0;
}

}  // namespace detail
}  // namespace tessel
