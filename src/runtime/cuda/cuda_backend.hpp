// src/runtime/cuda/cuda_backend.hpp — the CUDA backend's classes, internal to tessel::cuda
// (the communicators need the cudaStream_t behind a Stream). Public: tessel/runtime/cuda/cuda.hpp.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launchers.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/cuda/cuda.hpp"

namespace tessel::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line);

// A CUDA runtime call that fails becomes a RuntimeError with the call, the error and file:line.
#define TESSEL_CUDA_CHECK(expr)                                                           \
  do {                                                                                    \
    cudaError_t _tessel_e = (expr);                                                       \
    if (_tessel_e != cudaSuccess) ::tessel::cuda::throw_cuda_error(_tessel_e, #expr, __FILE__, __LINE__); \
  } while (0)

// Makes `device` current on this host thread for the scope (CUDA's current device is per
// thread; the executor's device threads and the transfer callers are many threads).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

class CudaBackend;

// Device memory from the GPU's stream-ordered pool (cudaMallocAsync). Freed by
// cudaFreeAsync on the stream given to Backend::release, or (dropped without release, after
// the host has synchronised) on the backend's allocation stream.
// Without memory pools (CudaBackend::memory_pools() false) it came from cudaMalloc and is freed
// by cudaFree once the free stream has finished.
// Frees device memory dropped without release(), in stream order: after all work enqueued so
// far on every stream of its GPU (what the legacy default stream would wait for), on a
// non-blocking stream of its own, so that no later work waits for the free (the legacy default
// stream would have serialised every virtual device's streams: issue 22 finding 11). One per
// GPU, never destroyed (buffers may be dropped during static destruction); every CudaStream
// registers while it lives.
class DropQueue {
 public:
  static DropQueue& of(int device);
  void add(cudaStream_t s);
  void remove(cudaStream_t s);
  // Enqueues cudaFreeAsync(ptr) after the GPU's streams' work so far; false when CUDA refused
  // (the caller falls back to the legacy default stream). Call with `device` current.
  bool free(void* ptr);

 private:
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;  // created on first use
  std::vector<std::pair<cudaStream_t, cudaEvent_t>> streams_;
};

class CudaBuffer : public Buffer {
 public:
  // Counted in `meter` (the backend's device_memory()) until the free is enqueued.
  CudaBuffer(int device, void* ptr, std::size_t bytes, cudaStream_t alloc_stream, std::shared_ptr<MemoryMeter> meter,
             bool pooled = true)
      : device_(device), ptr_(ptr), bytes_(bytes), free_stream_(alloc_stream), pooled_(pooled),
        metered_(std::move(meter), bytes) {}
  ~CudaBuffer() override;
  void* data() override { return ptr_; }
  const void* data() const override { return ptr_; }
  std::size_t bytes() const override { return bytes_; }
  void set_free_stream(cudaStream_t s) { free_stream_ = s; }

 private:
  int device_;
  void* ptr_;
  std::size_t bytes_;
  cudaStream_t free_stream_;
  bool pooled_;
  MeteredBytes metered_;
};

// An in-order CUDA stream. Errors: a failed enqueue (bad arguments found on the host, a
// launch error) is kept and rethrown by synchronize, prefixed with the label current at the
// failed call, and later work is skipped until then (the Stream contract); a kernel that
// finds a bad index writes the stream's DeviceError record, which synchronize turns into
// the same kind of error, naming the instruction through the launch's sequence number.
class CudaStream : public Stream {
 public:
  CudaStream(CudaBackend& backend, std::string name);
  ~CudaStream() override;
  void synchronize() override;
  void set_label(const char* label) override { label_ = label; }

  cudaStream_t handle() const { return stream_; }
  CudaBackend& backend() { return backend_; }
  const std::string& name() const { return name_; }
  // False after an enqueue failed (until synchronize): callers skip their work.
  bool ok() const {
    std::lock_guard<std::mutex> lk(mu_);
    return host_error_.empty();
  }
  // Records a host-side failure of the operation being enqueued (first one wins).
  void fail(const std::string& what);
  // For kernels that can report bad indices: the record and a sequence number that names
  // the current label when it fires.
  cuda_kernels::DeviceError* device_error() { return err_; }
  unsigned next_checked_launch(const std::string& what);
  // The cuBLASLt workspace of this stream (allocated on first use).
  void* gemm_workspace(std::size_t& bytes);

 private:
  CudaBackend& backend_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  const char* label_ = nullptr;
  std::string host_error_;
  cuda_kernels::DeviceError* err_ = nullptr;       // device memory
  cuda_kernels::DeviceError* err_host_ = nullptr;  // pinned: its copy at synchronize
  mutable std::mutex mu_;
  unsigned seq_ = 0;
  std::map<unsigned, std::string> checked_;  // seq -> "label: op(...)" of launches that may report
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::unique_ptr<MeteredBytes> workspace_metered_;  // the workspace in the device's count
};

class CudaEvent : public Event {
 public:
  explicit CudaEvent(int device);
  ~CudaEvent() override;
  void record(Stream& s) override;
  void wait(Stream& s) override;
  void synchronize() override;
  cudaEvent_t handle() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

// Pinned host staging blocks for transfers, reused once the copy that used them is done.
class PinnedPool {
 public:
  ~PinnedPool();
  struct Block {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  Block acquire(std::size_t bytes);
  void give_back(Block b);  // thread-safe, no CUDA call (may run in a host callback)

 private:
  std::mutex mu_;
  std::vector<Block> free_;
  std::vector<Block> all_;
};

struct GemmCache;  // cuBLASLt descriptors and algorithms per problem (cuda_einsum.cpp)
GemmCache* make_gemm_cache(int device);
void destroy_gemm_cache(GemmCache* c);
int64_t gemm_plan_count(GemmCache& c);

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override;
  // cudaMallocAsync on s with no host synchronisation (allocate() waits for its own
  // allocation stream); plain allocate() without memory pools.
  std::unique_ptr<Buffer> allocate_on(std::size_t bytes, Stream& s) override;
  std::unique_ptr<Buffer> allocate_host(std::size_t bytes) override;
  void release(std::shared_ptr<Buffer> b, Stream& s) override;
  void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) override;
  void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) override;
  void copy(Buffer& dst, std::size_t dst_off, const Buffer& src, std::size_t src_off, std::size_t bytes,
            Stream& s) override;
  void copy_block(Buffer& dst, const Buffer& src, const BlockCopy& c, Stream& s) override;
  void poison(Buffer& b, DType dtype, Stream& s) override;
  void run_kernel(const KernelArgs& args, Stream& s) override;
  bool has_kernel(OpKind kind) const override;  // has_cuda_kernel
  // Einsums and fused_einsum's product: the cuBLASLt descriptors and algorithm, at load.
  void prepare_kernel(const KernelArgs& args) override;
  void launch_host_func(Stream& s, std::function<void()> fn) override;
  std::unique_ptr<Stream> create_stream(const std::string& name = "stream") override;
  std::unique_ptr<Event> create_event() override;

  int device() const { return options_.device; }
  const CudaBackendOptions& options() const { return options_; }
  GemmCache& gemm() { return *gemm_; }
  // Stream-ordered scratch for a kernel: freed on the same stream after use.
  void* scratch(std::size_t bytes, CudaStream& s);
  void free_scratch(void* p, CudaStream& s);
  // Whether allocations come from the GPU's stream-ordered pool (cudaMallocAsync): false where
  // cudaDevAttrMemoryPoolsSupported is 0 (some virtualised GPUs, older drivers) or
  // TESSEL_CUDA_MEMORY_POOLS=0; then cudaMalloc/cudaFree, freeing after the stream synchronises.
  bool memory_pools() const { return pools_; }
  // CudaBackendOptions::debug_delay_us: maybe a random spin on `s` (before a kernel or a
  // collective's work is enqueued there); nothing when the option is 0.
  void debug_delay(CudaStream& s);

 private:
  std::unique_ptr<Buffer> allocate_ordered(std::size_t bytes, cudaStream_t stream, bool wait);
  CudaBackendOptions options_;
  std::mutex delay_mu_;
  uint64_t delay_state_ = 0;  // splitmix64 state of the debug delays
  cudaStream_t alloc_stream_ = nullptr;
  bool pools_ = true;
  PinnedPool pinned_;
  std::unique_ptr<GemmCache, void (*)(GemmCache*)> gemm_{nullptr, destroy_gemm_cache};
};

// The CudaStream behind a Stream; throws RuntimeError naming `who` for another backend's.
CudaStream& cuda_stream(Stream& s, const char* who);

// The CUDA kernels of every op kind (cuda_kernels.cpp), on stream s of backend be.
void run_cuda_kernel(CudaBackend& be, const KernelArgs& args, CudaStream& s);
bool has_cuda_kernel(OpKind kind);
// Einsum through cuBLASLt (cuda_einsum.cpp).
// s == nullptr: prepare only (load): the checks and the cuBLASLt plan, no kernel, no allocation.
void run_cuda_einsum(CudaBackend& be, const KernelArgs& args, CudaStream* s);

// The bits of NaN / INT32_MIN / a scalar in a dtype (for fills).
uint64_t poison_bits(DType t);
uint64_t scalar_bits(DType t, double v);

// Kernel scratch for one launch: taken from the backend (stream-ordered) and given back when
// the launch has been enqueued (or has thrown). 0 bytes: none (null).
class ScopedScratch {
 public:
  ScopedScratch(CudaBackend& be, CudaStream& s, std::size_t bytes)
      : be_(be), s_(s), p_(bytes > 0 ? be.scratch(bytes, s) : nullptr) {}
  ~ScopedScratch() {
    try {
      be_.free_scratch(p_, s_);
    } catch (...) {  // a destructor must not throw; the stream's next synchronize reports it
    }
  }
  ScopedScratch(const ScopedScratch&) = delete;
  ScopedScratch& operator=(const ScopedScratch&) = delete;
  void* get() const { return p_; }

 private:
  CudaBackend& be_;
  CudaStream& s_;
  void* p_;
};


}  // namespace tessel::cuda
