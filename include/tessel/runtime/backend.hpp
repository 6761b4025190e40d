// tessel/runtime/backend.hpp — what a device runtime provides to the executor: memory that
// lives on the device, kernels, block copies, and streams and events that order all of it.
//
// The contract is stream-ordered, as on CUDA: every operation that touches device memory is
// *enqueued* on a Stream and completes in that stream's order; an Event recorded on one stream
// and waited on by another is the only edge between streams; the host sees device memory only
// through explicit transfers (copy_from_host / copy_to_host) after synchronising. The executor
// never dereferences Buffer::data(): it passes device pointers to enqueued operations only.
//
// The CPU backend implements this for real (StreamMode::Async: one worker thread per stream,
// events are fences), so a missing wait is a data race that TSan reports on a laptop, long
// before a GPU. StreamMode::Eager runs every operation on the calling thread at once (for
// debugging: errors are thrown by the call that failed, with its stack). No CUDA header here.
//
// Thread safety: a Stream may be enqueued on from several host threads (the order between
// them is the order the calls happen in); an Event may be recorded by one stream at a time.
// Descriptors passed by reference (KernelArgs, BlockCopy) are copied by the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/memory_meter.hpp"

namespace tessel {

// Memory on one device. data() is a device pointer (host memory on the CPU backend): hand it
// to enqueued operations, never read or write it from the host.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual const void* data() const = 0;
  virtual std::size_t bytes() const = 0;
};

// An in-order queue of work on one device.
class Stream {
 public:
  virtual ~Stream() = default;
  // Blocks the host until everything enqueued so far has run. Throws the first error of an
  // operation enqueued since the last synchronize (RuntimeError, prefixed with the label that
  // was current when the failed operation was enqueued) and clears it. After an error, later
  // operations of the stream are skipped until synchronize (events still complete, marked
  // failed, so streams waiting on them fail instead of hanging).
  virtual void synchronize() = 0;
  // Names the operations enqueued from now on in error messages (e.g. "device 3 instruction
  // #7 (%h = einsum)"). `label` must stay valid while those operations may still fail;
  // nullptr clears it. Like an NVTX range on CUDA: cheap, no work is enqueued.
  virtual void set_label(const char* label) = 0;
};

// A point in a stream that other streams (or the host) can wait for. Waiting on an event
// that was never recorded returns at once (as cudaStreamWaitEvent does).
class Event {
 public:
  virtual ~Event() = default;
  // Enqueues the event on s: it completes when s reaches this point.
  virtual void record(Stream& s) = 0;
  // Makes s wait (in stream order) until the last record() made before this call completes.
  // When the recording stream had failed, s fails too.
  virtual void wait(Stream& s) = 0;
  // Blocks the host until the last record() completes; throws when its stream had failed.
  virtual void synchronize() = 0;
};

// A strided N-d block copy between dense row-major tensors stored at byte offsets in two
// buffers: the one primitive behind local shard slices and the packing of a tensor dim into
// the rank-major blocks collectives exchange (and their unpacking).
struct BlockCopy {
  Shape src_shape;
  std::vector<int64_t> src_offset;  // element coordinates of the block's first element
  std::size_t src_byte_offset = 0;  // where the src tensor starts in its buffer
  Shape dst_shape;
  std::vector<int64_t> dst_offset;
  std::size_t dst_byte_offset = 0;
  Shape block;
  std::size_t elem_bytes = 4;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Device memory, not initialised. Allocation itself is immediate (the CPU backend never
  // hands out memory that an enqueued operation still uses: see release). Throws
  // OutOfMemoryError when the memory cannot be had.
  virtual std::unique_ptr<Buffer> allocate(std::size_t bytes) = 0;
  // The same for a buffer first written on stream s (a program's output, by the instruction
  // that defines it): a backend with stream-ordered allocation allocates in s's order without
  // waiting for it on the host; the buffer may be used on s at once and on another stream once
  // it is ordered after s (an event). The default is allocate(bytes).
  virtual std::unique_ptr<Buffer> allocate_on(std::size_t bytes, Stream& s) {
    (void)s;
    return allocate(bytes);
  }
  // Host memory that copy() moves to and from device buffers asynchronously (the host pool of
  // offloaded activations, MemoryPlan::host_bytes): pinned memory on CUDA. The default is
  // allocate(), right for a backend whose device memory is host memory (the CPU's).
  virtual std::unique_ptr<Buffer> allocate_host(std::size_t bytes) { return allocate(bytes); }
  // Drops a reference to a buffer in stream order: the memory is freed (when this was the
  // last reference) only after everything enqueued on s before this call has run. Work of
  // other streams that used the buffer must be ordered before this point by events.
  virtual void release(std::shared_ptr<Buffer> b, Stream& s) = 0;

  // Host <-> device transfers; the host memory must stay valid until s reaches the copy.
  virtual void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) = 0;
  virtual void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) = 0;
  // Device-to-device copy (offsets in bytes).
  virtual void copy(Buffer& dst, std::size_t dst_off, const Buffer& src, std::size_t src_off,
                    std::size_t bytes, Stream& s) = 0;
  // Strided block copy (BlockCopy above); src and dst may be the same buffer only when the
  // two blocks do not overlap.
  virtual void copy_block(Buffer& dst, const Buffer& src, const BlockCopy& c, Stream& s) = 0;
  // Fills a buffer with NaN (float dtypes) or INT32_MIN (i32) so an unwritten element is
  // caught by comparisons.
  virtual void poison(Buffer& b, DType dtype, Stream& s) = 0;
  // args' pointers are device pointers from Buffer::data(); args is copied.
  virtual void run_kernel(const KernelArgs& args, Stream& s) = 0;
  // Does now what run_kernel would otherwise do on the first run of a kernel with these args
  // (pointers null): the CPU backend creates the oneDNN primitives of einsums. Called at load
  // for every kernel instruction, so that the first run is as fast as later ones. Synchronous;
  // throws what run_kernel's kernel would throw for invalid args. Default: nothing to prepare.
  virtual void prepare_kernel(const KernelArgs& args) { (void)args; }
  // Whether run_kernel has a kernel for op kind `kind`. load() asks every local backend: when
  // one lacks a kind that only a lowering pass produces (fused_elementwise, fused_softmax:
  // fuse-elementwise) it lowers without that pass; any other missing kind fails load with a
  // RuntimeError naming the op, the instruction, the device and the backend
  // (check_program_kernels in loaded_executable.hpp). Default: every kind (the CPU backend).
  virtual bool has_kernel(OpKind kind) const {
    (void)kind;
    return true;
  }
  // Runs fn on the host when s reaches this point (cudaLaunchHostFunc): for timestamps and
  // bookkeeping only, never for touching device memory. fn must not throw.
  virtual void launch_host_func(Stream& s, std::function<void()> fn) = 0;

  // Throws RuntimeError naming the backend when a stream (its worker thread) cannot be made.
  virtual std::unique_ptr<Stream> create_stream(const std::string& name = "stream") = 0;
  virtual std::unique_ptr<Event> create_event() = 0;

  // What this backend has allocated on its device and not yet freed (allocate(), and kernel
  // scratch where the backend counts it), with a high-water mark the executor resets at the
  // start of every run (RunStats::measured_peak_bytes). A backend implementation counts every
  // allocation in it (MeteredBytes); one backend per device, so the counts are per device. A
  // backend that delegates its allocations to another returns that one's meters.
  virtual MemoryMeter& device_memory() { return *device_meter_; }
  // The same for allocate_host() (host memory: the pool of offloaded activations).
  virtual MemoryMeter& host_memory() { return *host_meter_; }

 protected:
  std::shared_ptr<MemoryMeter> device_meter_ = std::make_shared<MemoryMeter>();
  std::shared_ptr<MemoryMeter> host_meter_ = std::make_shared<MemoryMeter>();
};

// How the CPU backend runs its streams.
enum class StreamMode {
  Async,  // every stream an in-order queue with its own worker thread; events are fences
  Eager,  // every operation runs on the calling thread when enqueued (debugging)
};
const char* stream_mode_name(StreamMode m);  // "async" / "eager"

struct CpuBackendOptions {
  StreamMode mode = StreamMode::Async;
  int kernel_threads = 1;  // threads each kernel may use (Eigen thread pool where it pays)
  // Async streams: how long (microseconds) a thread waiting on this backend's streams and
  // events busy-waits before blocking on a condition variable — a stream worker waiting for
  // work, synchronize(), an event wait. 0: block at once. Pays only when the threads involved
  // have cores of their own; ThreadRuntime decides it from the machine (ThreadRuntimeOptions).
  int spin_us = 0;
};

// The CPU backend: host memory, the Eigen kernels of kernels.hpp, CPU streams.
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace tessel
