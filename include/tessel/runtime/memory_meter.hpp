// tessel/runtime/memory_meter.hpp — what a backend has allocated and not yet freed on one
// device, and the high-water mark of it: the runtime's own measurement of its memory
// (RunStats::measured_peak_bytes), beside the memory plan's number (MemoryPlan::peak_bytes).
//
// A backend counts every allocation it makes from its allocator (buffers: arena, inputs,
// outputs; kernel scratch) at the bytes asked for, and uncounts it when the memory is freed
// (on the CPU backend in stream order: when the last reference is dropped by the stream that
// released it). Allocations come from several threads (device threads, stream workers), so
// the counts are atomics and the high-water mark is raised with a compare-exchange loop.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessel {

class MemoryMeter {
 public:
  // Counts `bytes` more in use and raises the high-water mark to the new total.
  void add(std::size_t bytes) {
    const int64_t now = in_use_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) + static_cast<int64_t>(bytes);
    int64_t high = high_.load(std::memory_order_relaxed);
    while (now > high && !high_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
    }
  }
  // Counts `bytes` fewer in use (they were freed).
  void sub(std::size_t bytes) { in_use_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed); }
  // Bytes allocated and not yet freed.
  int64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  // The most bytes in use at once since the last reset_high_water (or since the meter was made).
  int64_t high_water() const { return high_.load(std::memory_order_relaxed); }
  // Starts a new measurement: the high-water mark becomes the bytes in use now (returned).
  int64_t reset_high_water() {
    const int64_t now = in_use();
    high_.store(now, std::memory_order_relaxed);
    return now;
  }

 private:
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> high_{0};
};

// `bytes` counted in a meter for as long as this object lives (a buffer's member, a kernel's
// scratch). Holds the meter by shared_ptr: a buffer may outlive the backend that made it.
class MeteredBytes {
 public:
  MeteredBytes() = default;
  MeteredBytes(std::shared_ptr<MemoryMeter> meter, std::size_t bytes) : meter_(std::move(meter)), bytes_(bytes) {
    if (meter_) meter_->add(bytes_);
  }
  ~MeteredBytes() {
    if (meter_) meter_->sub(bytes_);
  }
  // Not owning the meter: for scratch that lives inside a call, while the meter surely does.
  MeteredBytes(MemoryMeter* meter, std::size_t bytes)
      : MeteredBytes(std::shared_ptr<MemoryMeter>(std::shared_ptr<MemoryMeter>(), meter), bytes) {}
  MeteredBytes(const MeteredBytes&) = delete;
  MeteredBytes& operator=(const MeteredBytes&) = delete;

 private:
  std::shared_ptr<MemoryMeter> meter_;
  std::size_t bytes_ = 0;
};

}  // namespace tessel
