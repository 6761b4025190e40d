// tessel/runtime/backend.hpp — what a device runtime provides to the executor: memory that
// lives on the device, kernels, and streams and events for asynchronous work.
//
// The CPU backend executes eagerly (a stream is the calling thread, events are complete when
// recorded); the interface is shaped for CUDA, where a stream is a cudaStream_t, an event a
// cudaEvent_t and buffers device allocations. No CUDA header appears here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tessel/runtime/kernels.hpp"

namespace tessel {

// Memory on one device. data() is a device pointer (host memory on the CPU backend).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual const void* data() const = 0;
  virtual std::size_t bytes() const = 0;
};

// An ordered queue of work on one device.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual void synchronize() = 0;
};

// A point in a stream that other streams (or the host) can wait for.
class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& s) = 0;
  virtual void wait(Stream& s) = 0;  // make s wait until this event completes
  virtual void synchronize() = 0;    // block the host until it completes
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::unique_ptr<Buffer> allocate(std::size_t bytes) = 0;
  // A read-only view of host memory usable as a device buffer without a copy, when the
  // device can read host memory directly (CPU); nullptr otherwise (the caller copies).
  virtual std::unique_ptr<Buffer> wrap_host(const void* host, std::size_t bytes) = 0;
  virtual void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) = 0;
  virtual void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) = 0;
  // Device-to-device copy (offsets in bytes).
  virtual void copy(Buffer& dst, std::size_t dst_off, const Buffer& src, std::size_t src_off,
                    std::size_t bytes, Stream& s) = 0;
  // Fills a buffer with NaN (float dtypes) or INT32_MIN (i32) so an unwritten element is
  // caught by comparisons.
  virtual void poison(Buffer& b, DType dtype, Stream& s) = 0;
  // args' pointers are device pointers from Buffer::data().
  virtual void run_kernel(const KernelArgs& args, Stream& s) = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
};

// The CPU backend: host memory, the Eigen kernels of kernels.hpp, eager streams.
std::unique_ptr<Backend> make_cpu_backend(int kernel_threads = 1);

}  // namespace tessel
