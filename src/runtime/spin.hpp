// spin.hpp (private) — bounded busy-waiting before blocking, shared by the CPU streams, the
// events, the device threads' hand-off (ThreadRuntime) and the thread communicator.
//
// Why: waking a thread blocked on a condition variable costs a futex call and the scheduler's
// wake-up latency (about 5-15 us per wake-up on the 2-core VM of bench/results); a step of a
// tiny program crosses several such hand-offs. A waiter that polls for a few microseconds first
// sees the event as soon as it happens, without a sleep/wake round trip. Spinning only pays
// when the thread being waited for has a core of its own: with more runnable threads than
// cores it steals that thread's time, so the budget is decided from the number of threads
// against std::thread::hardware_concurrency() (spin_budget_us), and it is bounded in time (not
// in iterations: a pause instruction costs ~1 ns on some x86 cores and ~35 ns on others).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessel {
namespace detail {

// The automatic budget: about one sleep/wake round trip (the competitive choice: spinning
// longer than blocking would cost gains little, and costs at most twice the optimum).
constexpr int kDefaultSpinUs = 20;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls ready() for up to budget_us microseconds, pausing the core between polls: true as
// soon as ready() holds, false when the budget ran out (the caller then blocks). With a
// budget <= 0 it polls once.
template <class Ready>
bool spin_until(int budget_us, Ready&& ready) {
  if (ready()) return true;
  if (budget_us <= 0) return false;
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::microseconds(budget_us);
  while (true) {
    for (int i = 0; i < 16; ++i) {  // the clock is read every 16 polls (~0.1-0.5 us)
      cpu_relax();
      if (ready()) return true;
    }
    if (Clock::now() >= end) return false;
  }
}

// One waiting site's spin, adaptive: a spin that runs out of budget means the awaited thread
// had no core (a loaded machine: other processes share the cores that hardware_concurrency()
// counts) or is busy for long, so the next 1, 3, 7, ... 63 waits of the site block at once;
// a spin that succeeds restores spinning on every wait. This bounds what spinning can waste
// to about budget / 64 per wait on a machine where it does not pay. Thread-safe (relaxed
// atomics: the counters are a heuristic, a lost update only changes one decision).
class SpinWait {
 public:
  explicit SpinWait(int budget_us = 0) : budget_us_(budget_us) {}
  SpinWait(const SpinWait&) = delete;
  SpinWait& operator=(const SpinWait&) = delete;
  int budget_us() const { return budget_us_; }

  // Polls ready() as spin_until does when this site spins now; true when ready() holds.
  template <class Ready>
  bool operator()(Ready&& ready) {
    if (ready()) return true;
    if (budget_us_ <= 0) return false;
    const int skip = skip_.load(std::memory_order_relaxed);
    if (skip > 0) {
      skip_.store(skip - 1, std::memory_order_relaxed);
      return false;
    }
    if (spin_until(budget_us_, ready)) {
      misses_.store(0, std::memory_order_relaxed);
      return true;
    }
    const int m = misses_.load(std::memory_order_relaxed) < kMaxBackoff ? misses_.load(std::memory_order_relaxed) + 1
                                                                        : kMaxBackoff;
    misses_.store(m, std::memory_order_relaxed);
    skip_.store((1 << m) - 1, std::memory_order_relaxed);
    return false;
  }

 private:
  static constexpr int kMaxBackoff = 6;  // at most 63 waits skipped after a miss
  const int budget_us_;
  std::atomic<int> misses_{0};  // consecutive spins that ran out of budget (capped)
  std::atomic<int> skip_{0};    // waits left that block without spinning
};

// The spin budget (microseconds) of waiters among `threads` threads that may be runnable at
// once. requested_us >= 0 is taken as it is (0: never spin). -1 (automatic): the environment
// variable TESSEL_SPIN_US when set (a whole number >= 0; anything else throws RuntimeError
// naming it), else kDefaultSpinUs when std::thread::hardware_concurrency() >= threads, else 0.
int spin_budget_us(int requested_us, int64_t threads);

}  // namespace detail
}  // namespace tessel
