// The CUDA backend: memory from the GPU's stream-ordered pool, streams and events mapped onto
// cudaStream_t / cudaEvent_t, host transfers staged through reused pinned blocks, block
// copies and poison as kernels, and the kernels of every op kind (cuda_kernels.cpp).
//
// Memory. allocate() takes memory from the device's default cudaMemPool (cudaMallocAsync on
// an allocation stream, then synchronised, so any stream may use it at once). The pool's
// release threshold is raised to "never", so memory freed by a step stays in the pool and the
// next step's allocations (outputs, kernel scratch) are served without a cudaMalloc; the
// executor's intermediates live in one arena allocated at load from the memory plan.
// release(b, s) frees with cudaFreeAsync on s when it drops the last reference (stream order:
// after everything enqueued on s); a buffer dropped elsewhere is freed by its GPU's DropQueue,
// after all work enqueued so far on that GPU's streams, without holding up later work.
#include "cuda_backend.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "cuda_loop.hpp"

namespace tessel::cuda {

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw RuntimeError(fmt::format("cuda: {} failed: {} ({}) at {}:{}", expr, cudaGetErrorString(e), cudaGetErrorName(e),
                                 file, line));
}

DeviceGuard::DeviceGuard(int device) {
  TESSEL_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) TESSEL_CUDA_CHECK(cudaSetDevice(device));
  else prev_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

DropQueue& DropQueue::of(int device) {
  static std::mutex mu;
  static std::map<int, DropQueue*> queues;  // leaked on purpose: see the class comment
  std::lock_guard<std::mutex> lk(mu);
  DropQueue*& q = queues[device];
  if (!q) q = new DropQueue();
  return *q;
}

void DropQueue::add(cudaStream_t s) {
  cudaEvent_t e = nullptr;
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::lock_guard<std::mutex> lk(mu_);
  streams_.emplace_back(s, e);
}

void DropQueue::remove(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(mu_);
  for (std::size_t i = 0; i < streams_.size(); ++i)
    if (streams_[i].first == s) {
      cudaEventDestroy(streams_[i].second);
      streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

bool DropQueue::free(void* ptr) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!stream_ && cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
    stream_ = nullptr;
    return false;
  }
  // cudaStreamWaitEvent waits for the event's latest record at the time of the call, so one
  // event per stream serves every drop.
  for (const auto& [s, e] : streams_)
    if (cudaEventRecord(e, s) != cudaSuccess || cudaStreamWaitEvent(stream_, e, 0) != cudaSuccess) return false;
  return cudaFreeAsync(ptr, stream_) == cudaSuccess;
}

CudaBuffer::~CudaBuffer() {
  if (!ptr_) return;
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != device_) cudaSetDevice(device_);
  // Errors cannot be thrown from here; a failed free leaves the memory to the pool.
  if (pooled_ && free_stream_ == cudaStream_t{0}) {
    // Dropped without release(): the GPU's drop queue, or (should CUDA refuse it) the legacy
    // default stream, which waits for every blocking stream of the GPU.
    if (!DropQueue::of(device_).free(ptr_)) {
      cudaGetLastError();
      if (cudaFreeAsync(ptr_, cudaStream_t{0}) != cudaSuccess) cudaGetLastError();
    }
  } else if (pooled_) {
    if (cudaFreeAsync(ptr_, free_stream_) != cudaSuccess) cudaGetLastError();
  } else if (cudaStreamSynchronize(free_stream_) != cudaSuccess || cudaFree(ptr_) != cudaSuccess) {
    cudaGetLastError();
  }
  if (prev != device_ && prev >= 0) cudaSetDevice(prev);
}

// ---- streams and events ---------------------------------------------------------------------

CudaStream::CudaStream(CudaBackend& backend, std::string name) : backend_(backend), name_(std::move(name)) {
  DeviceGuard g(backend_.device());
  // A blocking stream (not cudaStreamNonBlocking): should the drop queue fail, a dropped buffer
  // is freed on the legacy default stream, which then waits for this one.
  TESSEL_CUDA_CHECK(cudaStreamCreate(&stream_));
  DropQueue::of(backend_.device()).add(stream_);
  // The error record lives in device memory (a kernel's atomicCAS on it is a device atomic, not
  // one across PCIe or a VM's passthrough); synchronize copies it back on this stream into a
  // pinned mirror.
  void* d = nullptr;
  TESSEL_CUDA_CHECK(cudaMalloc(&d, sizeof(cuda_kernels::DeviceError)));
  err_ = static_cast<cuda_kernels::DeviceError*>(d);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(err_, 0, sizeof(cuda_kernels::DeviceError), stream_));
  void* h = nullptr;
  TESSEL_CUDA_CHECK(cudaHostAlloc(&h, sizeof(cuda_kernels::DeviceError), cudaHostAllocDefault));
  std::memset(h, 0, sizeof(cuda_kernels::DeviceError));
  err_host_ = static_cast<cuda_kernels::DeviceError*>(h);
}

CudaStream::~CudaStream() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(backend_.device());
  cudaStreamSynchronize(stream_);
  DropQueue::of(backend_.device()).remove(stream_);
  if (workspace_) cudaFree(workspace_);
  cudaStreamDestroy(stream_);
  cudaFree(err_);
  cudaFreeHost(err_host_);
  cudaGetLastError();
  if (prev >= 0) cudaSetDevice(prev);
}

void CudaStream::fail(const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  if (host_error_.empty()) host_error_ = label_ ? std::string(label_) + ": " + what : what;
}

unsigned CudaStream::next_checked_launch(const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  const unsigned seq = ++seq_;
  checked_[seq] = label_ ? std::string(label_) + ": " + what : what;
  return seq;
}

void* CudaStream::gemm_workspace(std::size_t& bytes) {
  if (!workspace_ && backend_.options().gemm_workspace_bytes > 0) {
    DeviceGuard g(backend_.device());
    // Once per stream, at its first einsum (not per step).
    TESSEL_CUDA_CHECK(cudaMalloc(&workspace_, backend_.options().gemm_workspace_bytes));
    workspace_bytes_ = backend_.options().gemm_workspace_bytes;
    workspace_metered_ = std::make_unique<MeteredBytes>(&backend_.device_memory(), workspace_bytes_);
  }
  bytes = workspace_bytes_;
  return workspace_;
}

void CudaStream::synchronize() {
  DeviceGuard g(backend_.device());
  // The record's copy is ordered after every kernel enqueued so far; a stream already in error
  // makes the copy fail too, and the stream's error is what is reported.
  bool checked_launches = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    checked_launches = seq_ != 0;  // a kernel that reports into the record was ever enqueued
  }
  bool have_record = false;
  if (checked_launches) {
    have_record = cudaMemcpyAsync(err_host_, err_, sizeof(cuda_kernels::DeviceError), cudaMemcpyDeviceToHost,
                                  stream_) == cudaSuccess;
    if (!have_record) cudaGetLastError();
  }
  const cudaError_t e = cudaStreamSynchronize(stream_);
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(mu_);
    msg.swap(host_error_);
    const cuda_kernels::DeviceError* de = err_host_;
    if (e == cudaSuccess && have_record && msg.empty() && de->flag) {
      const unsigned seq = de->seq;
      const auto it = checked_.find(seq);
      const std::string who = it != checked_.end() ? it->second : std::string("a kernel");
      const long long v = de->value, pos = de->position, bound = de->bound;
      switch (de->code) {
        case cuda_kernels::kErrEmbeddingId:
          msg = fmt::format("{}: id {} at position {} is outside the table's rows [0, {}); check the ids (tessel does "
                            "not clamp them)", who, v, pos, bound);
          break;
        case cuda_kernels::kErrLabel:
          msg = fmt::format("{}: label {} at position {} is outside the vocabulary (this block ends at {})", who, v, pos,
                            bound);
          break;
        default:
          msg = fmt::format("{}: index {} at position {} is outside [0, {}); check the indices (tessel does not clamp "
                            "them)", who, v, pos, bound);
      }
    }
    if (e == cudaSuccess && have_record && de->flag) {  // reset for the next run, ordered before its kernels
      err_host_->flag = 0;
      if (cudaMemsetAsync(err_, 0, sizeof(cuda_kernels::DeviceError), stream_) != cudaSuccess) cudaGetLastError();
    }
    checked_.clear();
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError(fmt::format("cuda stream '{}': {}{} ({})", name_, msg.empty() ? "" : msg + "; then ",
                                   cudaGetErrorString(e), cudaGetErrorName(e)));
  }
  if (!msg.empty()) throw RuntimeError(msg);
}

CudaStream& cuda_stream(Stream& s, const char* who) {
  auto* c = dynamic_cast<CudaStream*>(&s);
  if (!c) throw RuntimeError(fmt::format("{}: the stream is not a CUDA backend stream", who));
  return *c;
}

CudaEvent::CudaEvent(int device) : device_(device) {
  DeviceGuard g(device_);
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}

void CudaEvent::record(Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda event record");
  DeviceGuard g(cs.backend().device());
  const cudaError_t e = cudaEventRecord(event_, cs.handle());
  if (e != cudaSuccess) cs.fail(fmt::format("cudaEventRecord: {}", cudaGetErrorString(e)));
}

void CudaEvent::wait(Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda event wait");
  DeviceGuard g(cs.backend().device());
  const cudaError_t e = cudaStreamWaitEvent(cs.handle(), event_, 0);
  if (e != cudaSuccess) cs.fail(fmt::format("cudaStreamWaitEvent: {}", cudaGetErrorString(e)));
}

void CudaEvent::synchronize() {
  DeviceGuard g(device_);
  TESSEL_CUDA_CHECK(cudaEventSynchronize(event_));
}

// ---- pinned staging ---------------------------------------------------------------------------

PinnedPool::~PinnedPool() {
  for (auto& b : all_) cudaFreeHost(b.ptr);
}

PinnedPool::Block PinnedPool::acquire(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Best fit among the free blocks.
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i)
      if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes)) best = i;
    if (best < free_.size()) {
      Block b = free_[best];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
  }
  Block b;
  b.bytes = std::max<std::size_t>(bytes, 4096);
  TESSEL_CUDA_CHECK(cudaHostAlloc(&b.ptr, b.bytes, cudaHostAllocPortable));
  std::lock_guard<std::mutex> lk(mu_);
  all_.push_back(b);
  return b;
}

void PinnedPool::give_back(Block b) {
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(b);
}

// ---- the backend ---------------------------------------------------------------------------------

namespace {

void host_func_trampoline(void* p) {
  auto* fn = static_cast<std::function<void()>*>(p);
  (*fn)();
  delete fn;
}

// Runs f, turning an exception into the stream's error (the Stream contract: errors surface
// at synchronize); skips f after an earlier failure.
template <class F>
void enqueue(CudaStream& cs, int device, F&& f) {
  if (!cs.ok()) return;
  try {
    DeviceGuard g(device);
    f();
  } catch (const std::exception& e) {
    cs.fail(e.what());
  }
}

}  // namespace

uint64_t poison_bits(DType t) {
  switch (t) {
    case DType::f32: return 0x7fc00000u;
    case DType::bf16: return 0x7fc0u;
    case DType::f16: return 0x7e00u;
    case DType::i32: return 0x80000000u;
  }
  return 0;
}

uint64_t scalar_bits(DType t, double v) {
  switch (t) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case DType::bf16: return f32_to_bf16(static_cast<float>(v));
    case DType::f16: return f32_to_f16(static_cast<float>(v));
    case DType::i32: return static_cast<uint32_t>(static_cast<int32_t>(v));
  }
  return 0;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options) : options_(options) {
  const int n = cuda_device_count();
  if (options_.device < 0 || options_.device >= n)
    throw RuntimeError(fmt::format("cuda backend: GPU {} does not exist ({} GPU{} visible{})", options_.device, n,
                                   n == 1 ? "" : "s", n == 0 ? "; is a driver installed and CUDA_VISIBLE_DEVICES set?" : ""));
  DeviceGuard g(options_.device);
  if (const char* jit = std::getenv("TESSEL_CUDA_FUSED_JIT"); jit && std::string(jit) == "0") options_.fused_jit = false;
  if (const char* d = std::getenv("TESSEL_CUDA_DEBUG_DELAY_US"); d && *d) {
    char* end = nullptr;
    const long v = std::strtol(d, &end, 10);
    if (*end != '\0' || v < 0 || v > 1000000)
      throw RuntimeError(fmt::format("TESSEL_CUDA_DEBUG_DELAY_US='{}': expected microseconds, 0 to 1000000", d));
    options_.debug_delay_us = static_cast<int>(v);
  }
  delay_state_ = 0x5eed0000ULL + static_cast<uint64_t>(options_.device);
  // Stream-ordered memory pools are optional (cudaDevAttrMemoryPoolsSupported): without them,
  // plain cudaMalloc/cudaFree, said once per process on stderr. TESSEL_CUDA_MEMORY_POOLS=0
  // forces the fallback (to test it on a GPU that has pools).
  int supported = 0;
  TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, options_.device));
  const char* env = std::getenv("TESSEL_CUDA_MEMORY_POOLS");
  const bool forced_off = env && std::string(env) == "0";
  pools_ = supported != 0 && !forced_off;
  if (!pools_) {
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr,
                   "tessel: cuda backend (GPU %d): %s: allocating with cudaMalloc/cudaFree instead of the "
                   "stream-ordered pool (each free of kernel scratch or a released buffer waits for its stream; "
                   "expect slower steps)\n",
                   options_.device,
                   forced_off ? "TESSEL_CUDA_MEMORY_POOLS=0"
                              : "this GPU does not support stream-ordered memory pools "
                                "(cudaDevAttrMemoryPoolsSupported is 0)");
    });
  } else {
    cudaMemPool_t pool;
    TESSEL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, options_.device));
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    TESSEL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  TESSEL_CUDA_CHECK(cudaStreamCreate(&alloc_stream_));
  gemm_.reset(make_gemm_cache(options_.device));
}

CudaBackend::~CudaBackend() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(options_.device);
  gemm_.reset();
  if (alloc_stream_) {
    cudaStreamSynchronize(alloc_stream_);
    cudaStreamDestroy(alloc_stream_);
  }
  cudaGetLastError();
  if (prev >= 0) cudaSetDevice(prev);
}

std::unique_ptr<Buffer> CudaBackend::allocate(std::size_t bytes) { return allocate_ordered(bytes, alloc_stream_, true); }

std::unique_ptr<Buffer> CudaBackend::allocate_on(std::size_t bytes, Stream& s) {
  if (!pools_) return allocate(bytes);
  return allocate_ordered(bytes, cuda_stream(s, "cuda backend allocate_on").handle(), false);
}

std::unique_ptr<Buffer> CudaBackend::allocate_ordered(std::size_t bytes, cudaStream_t stream, bool wait) {
  DeviceGuard g(options_.device);
  void* p = nullptr;
  const cudaError_t e = pools_ ? cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), stream)
                               : cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError(fmt::format("cuda backend (GPU {}): cannot allocate {} bytes ({:.4g} GiB): out of device "
                                       "memory", options_.device, bytes, double(bytes) / double(1ull << 30)), bytes);
  }
  if (e != cudaSuccess) throw_cuda_error(e, pools_ ? "cudaMallocAsync" : "cudaMalloc", __FILE__, __LINE__);
  // allocate(): usable on any stream once the allocation stream is done. allocate_on(): the
  // first use is on `stream` itself, after the allocation in its order.
  if (pools_ && wait) TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  // Dropped without release(): freed by the GPU's DropQueue (free stream 0 says so), after all
  // work enqueued so far on the GPU's streams.
  return std::make_unique<CudaBuffer>(options_.device, p, bytes, cudaStream_t{0}, device_meter_, pools_);
}

namespace {
// Pinned, mapped host memory: the DMA engines copy it asynchronously and, mapped, kernels
// (copy_block) reach it through unified addressing.
class PinnedHostBuffer : public Buffer {
 public:
  PinnedHostBuffer(void* ptr, std::size_t bytes, std::shared_ptr<MemoryMeter> meter)
      : ptr_(ptr), bytes_(bytes), metered_(std::move(meter), bytes) {}
  ~PinnedHostBuffer() override { cudaFreeHost(ptr_); }
  void* data() override { return ptr_; }
  const void* data() const override { return ptr_; }
  std::size_t bytes() const override { return bytes_; }

 private:
  void* ptr_;
  std::size_t bytes_;
  MeteredBytes metered_;  // in the backend's host_memory()
};
}  // namespace

std::unique_ptr<Buffer> CudaBackend::allocate_host(std::size_t bytes) {
  DeviceGuard g(options_.device);
  void* p = nullptr;
  TESSEL_CUDA_CHECK(cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped));
  return std::make_unique<PinnedHostBuffer>(p, bytes, host_meter_);
}

void CudaBackend::release(std::shared_ptr<Buffer> b, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend release");
  if (auto* cb = dynamic_cast<CudaBuffer*>(b.get()); cb && b.use_count() == 1) cb->set_free_stream(cs.handle());
  b.reset();
}

void CudaBackend::copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend copy_from_host");
  if (bytes == 0) return;
  enqueue(cs, options_.device, [&] {
    // Staged: the host bytes are copied into a pinned block now, so the DMA is asynchronous
    // and the caller's memory is free at once; the block returns to the pool when the copy is done.
    PinnedPool::Block blk = pinned_.acquire(bytes);
    std::memcpy(blk.ptr, src, bytes);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), blk.ptr, bytes, cudaMemcpyHostToDevice, cs.handle()));
    auto* fn = new std::function<void()>([this, blk] { pinned_.give_back(blk); });
    TESSEL_CUDA_CHECK(cudaLaunchHostFunc(cs.handle(), host_func_trampoline, fn));
  });
}

void CudaBackend::copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend copy_to_host");
  if (bytes == 0) return;
  enqueue(cs, options_.device, [&] {
    PinnedPool::Block blk = pinned_.acquire(bytes);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(blk.ptr, src.data(), bytes, cudaMemcpyDeviceToHost, cs.handle()));
    // Host memory only (no CUDA call may run in a host function).
    auto* fn = new std::function<void()>([this, blk, dst, bytes] {
      std::memcpy(dst, blk.ptr, bytes);
      pinned_.give_back(blk);
    });
    TESSEL_CUDA_CHECK(cudaLaunchHostFunc(cs.handle(), host_func_trampoline, fn));
  });
}

void CudaBackend::copy(Buffer& dst, std::size_t dst_off, const Buffer& src, std::size_t src_off, std::size_t bytes,
                       Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend copy");
  if (bytes == 0) return;
  enqueue(cs, options_.device, [&] {
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + dst_off,
                                      static_cast<const char*>(src.data()) + src_off, bytes, cudaMemcpyDefault,
                                      cs.handle()));
  });
}

void CudaBackend::copy_block(Buffer& dst, const Buffer& src, const BlockCopy& c, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend copy_block");
  enqueue(cs, options_.device, [&] {
    const std::size_t rank = c.block.size();
    if (c.src_shape.size() != rank || c.dst_shape.size() != rank || c.src_offset.size() != rank ||
        c.dst_offset.size() != rank)
      throw RuntimeError("cuda backend copy_block: shapes, offsets and block must have one rank");
    const auto ss = contiguous_strides(c.src_shape), ds = contiguous_strides(c.dst_shape);
    int64_t sbase = 0, dbase = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      sbase += c.src_offset[d] * ss[d];
      dbase += c.dst_offset[d] * ds[d];
    }
    const char* sp = static_cast<const char*>(src.data()) + c.src_byte_offset + sbase * int64_t(c.elem_bytes);
    char* dp = static_cast<char*>(dst.data()) + c.dst_byte_offset + dbase * int64_t(c.elem_bytes);
    cuda_kernels::strided_copy(sp, dp, c.elem_bytes, make_loop(c.block, {ds, ss}), cs.handle());
  });
}

void CudaBackend::poison(Buffer& b, DType dtype, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend poison");
  enqueue(cs, options_.device, [&] {
    const std::size_t es = dtype_size(dtype);
    cuda_kernels::fill_bits(b.data(), static_cast<int64_t>(b.bytes() / es), es, poison_bits(dtype), cs.handle());
  });
}

void CudaBackend::run_kernel(const KernelArgs& args, Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda backend run_kernel");
  enqueue(cs, options_.device, [&] {
    debug_delay(cs);
    run_cuda_kernel(*this, args, cs);
  });
}

void CudaBackend::debug_delay(CudaStream& s) {
  if (options_.debug_delay_us <= 0) return;
  uint64_t z;
  {
    std::lock_guard<std::mutex> lk(delay_mu_);
    z = (delay_state_ += 0x9e3779b97f4a7c15ULL);
  }
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  if (z & 1) return;  // half of the time no delay
  const int64_t ns = static_cast<int64_t>((z >> 1) % (static_cast<uint64_t>(options_.debug_delay_us) * 1000 + 1));
  cuda_kernels::spin(ns, s.handle());
}

bool CudaBackend::has_kernel(OpKind kind) const { return has_cuda_kernel(kind); }

void CudaBackend::prepare_kernel(const KernelArgs& args) {
  if (args.kind != OpKind::Einsum && args.kind != OpKind::FusedEinsum) return;
  if (!args.attrs) return;  // the run reports it
  const KernelArgs product = args.kind == OpKind::Einsum ? args : fused_einsum_product_args(args);
  // Mixed float dtypes are cast to one first (with_uniform_floats): planned on the first run.
  for (DType d : product.in_dtypes)
    if (d != product.out_dtype) return;
  DeviceGuard g(options_.device);
  run_cuda_einsum(*this, product, nullptr);
}

void CudaBackend::launch_host_func(Stream& s, std::function<void()> fn) {
  CudaStream& cs = cuda_stream(s, "cuda backend launch_host_func");
  enqueue(cs, options_.device, [&] {
    auto* f = new std::function<void()>(std::move(fn));
    const cudaError_t e = cudaLaunchHostFunc(cs.handle(), host_func_trampoline, f);
    if (e != cudaSuccess) {
      delete f;
      throw_cuda_error(e, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
  });
}

std::unique_ptr<Stream> CudaBackend::create_stream(const std::string& name) {
  return std::make_unique<CudaStream>(*this, fmt::format("GPU {} {}", options_.device, name));
}

std::unique_ptr<Event> CudaBackend::create_event() { return std::make_unique<CudaEvent>(options_.device); }

void* CudaBackend::scratch(std::size_t bytes, CudaStream& s) {
  void* p = nullptr;
  const cudaError_t e = pools_ ? cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), s.handle())
                               : cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemoryError(fmt::format("cuda backend (GPU {}): cannot allocate {} bytes of kernel scratch",
                                       options_.device, bytes), bytes);
  }
  if (e != cudaSuccess) throw_cuda_error(e, pools_ ? "cudaMallocAsync (scratch)" : "cudaMalloc (scratch)", __FILE__,
                                         __LINE__);
  // In the device's high-water mark as if freed at once: free_scratch gets no size, so a count
  // kept open here could not be closed. A kernel's several scratch blocks are thus counted one
  // at a time (a lower bound of its scratch).
  device_meter_->add(bytes);
  device_meter_->sub(bytes);
  return p;
}

void CudaBackend::free_scratch(void* p, CudaStream& s) {
  if (!p) return;
  if (pools_) {
    TESSEL_CUDA_CHECK(cudaFreeAsync(p, s.handle()));
  } else {  // the kernels enqueued on s may still use it
    TESSEL_CUDA_CHECK(cudaStreamSynchronize(s.handle()));
    TESSEL_CUDA_CHECK(cudaFree(p));
  }
}

}  // namespace tessel::cuda

namespace tessel {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return n == 0 ? "cudaGetDeviceCount found 0 GPUs (check CUDA_VISIBLE_DEVICES)" : "";
}

std::string cuda_device_name(int device) {
  cudaDeviceProp p{};
  TESSEL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return fmt::format("{} (sm_{}{}, {:.1f} GiB)", p.name, p.major, p.minor, double(p.totalGlobalMem) / double(1ull << 30));
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace tessel
