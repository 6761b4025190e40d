// The CPU backend: host buffers (not zero-filled: every buffer is written before it is
// read), the Eigen kernels, block copies, and CPU streams (a worker thread per stream in async
// mode, inline in eager mode) with events that are real fences.
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <new>
#include <system_error>

#include "cpu_stream.hpp"
#include "onednn_einsum.hpp"
#include "../spin.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/block_copy.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

const char* stream_mode_name(StreamMode m) { return m == StreamMode::Async ? "async" : "eager"; }

namespace detail {

CpuStream::CpuStream(StreamMode mode, std::string name, int spin_us)
    : mode_(mode), name_(std::move(name)), idle_spin_(spin_us), sync_spin_(spin_us) {
  if (mode_ == StreamMode::Async) {
    ring_.resize(16);
    try {
      thread_ = std::thread([this] { worker(); });
    } catch (const std::system_error& e) {
      throw RuntimeError(fmt::format("cpu backend: cannot start the worker thread of stream '{}': {}",
                                     name_, e.what()));
    }
  }
}

CpuStream::~CpuStream() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();
  }
}

void CpuStream::run_task(Task& t) {
  if (failed_.load(std::memory_order_relaxed) && !t.always) return;
  try {
    t.fn();
  } catch (...) {
    std::string msg;
    try {
      throw;
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown exception";
    }
    if (t.label) msg = std::string(t.label) + ": " + msg;
    std::exception_ptr ep = t.label ? std::make_exception_ptr(RuntimeError(msg)) : std::current_exception();
    if (mode_ == StreamMode::Eager) std::rethrow_exception(ep);
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_) {
      error_ = ep;
      error_msg_ = msg;
    }
    failed_.store(true, std::memory_order_release);
  }
}

void CpuStream::push(Task&& t) {
  if (size_ == ring_.size()) {  // full: double, oldest first (growth only; never in steady state)
    std::vector<Task> bigger(ring_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
    ring_.swap(bigger);
    head_ = 0;
  }
  ring_[(head_ + size_) & (ring_.size() - 1)] = std::move(t);
  ++size_;
}

CpuStream::Task CpuStream::pop() {
  Task t = std::move(ring_[head_]);
  head_ = (head_ + 1) & (ring_.size() - 1);
  --size_;
  return t;
}

void CpuStream::enqueue(std::function<void()> fn, bool always) {
  Task t{std::move(fn), label_, always};
  if (mode_ == StreamMode::Eager) {
    run_task(t);
    return;
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    push(std::move(t));
    enqueued_.store(enqueued_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    wake = worker_waiting_;  // a busy or spinning worker sees the task without a futex call
  }
  if (wake) cv_work_.notify_one();
}

void CpuStream::worker() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    if (size_ == 0 && !stop_) {
      // Idle: poll for the next task for a while (a step enqueues in bursts), then sleep.
      lk.unlock();
      idle_spin_([&] {
        return enqueued_.load(std::memory_order_acquire) != finished_.load(std::memory_order_relaxed);
      });
      lk.lock();
      worker_waiting_ = true;
      cv_work_.wait(lk, [&] { return stop_ || size_ != 0; });
      worker_waiting_ = false;
    }
    if (size_ == 0) return;  // stop_ and drained
    Task t = pop();
    lk.unlock();
    run_task(t);
    t.fn = nullptr;  // destroy captures (e.g. released buffers) before reporting progress
    lk.lock();
    finished_.store(finished_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    if (idle_waiters_ > 0 && size_ == 0) cv_idle_.notify_all();
  }
}

void CpuStream::synchronize() {
  const auto idle = [&] {
    return finished_.load(std::memory_order_acquire) == enqueued_.load(std::memory_order_acquire);
  };
  sync_spin_(idle);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    ++idle_waiters_;
    cv_idle_.wait(lk, idle);
    --idle_waiters_;
    err = error_;
    error_ = nullptr;
    error_msg_.clear();
    failed_.store(false, std::memory_order_release);
  }
  if (err) std::rethrow_exception(err);
}

std::string CpuStream::error_message() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_msg_;
}

CpuStream& cpu_stream(Stream& s, const char* who) {
  auto* c = dynamic_cast<CpuStream*>(&s);
  if (!c) throw RuntimeError(fmt::format("{}: the stream is not a CPU backend stream", who));
  return *c;
}

}  // namespace detail

namespace {

using detail::CpuStream;
using detail::cpu_stream;
using detail::SpinWait;

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(std::size_t bytes, std::shared_ptr<MemoryMeter> meter)
      : data_(static_cast<std::byte*>(::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kBufferAlignment)))),
        bytes_(bytes), metered_(std::move(meter), bytes) {}
  void* data() override { return data_.get(); }
  const void* data() const override { return data_.get(); }
  std::size_t bytes() const override { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t(kBufferAlignment)); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_;
  MeteredBytes metered_;  // counted from here until the memory is freed (declared last: first to go)
};

// Completion of the records of one event: record k completes when its stream reaches it.
struct EventState {
  explicit EventState(int spin_us) : spin(spin_us) {}
  SpinWait spin;  // a waiter polls `completed` before blocking (spin.hpp)
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<uint64_t> recorded{0};   // records made by the host
  std::atomic<uint64_t> completed{0};  // written under mu, read without it by spinners
  uint64_t last_failed = 0;            // guarded by mu: the last record whose stream had failed
  std::string failure;                 // guarded by mu
  int waiters = 0;                     // guarded by mu: threads blocked on cv

  // Waits for record `target`; throws when a stream had failed at or after it.
  void wait_for(uint64_t target) {
    const auto done = [&] { return completed.load(std::memory_order_acquire) >= target; };
    spin(done);
    std::unique_lock<std::mutex> lk(mu);
    ++waiters;
    cv.wait(lk, done);
    --waiters;
    if (last_failed >= target)
      throw RuntimeError("waited for an event of a stream that had failed: " + failure);
  }
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(int spin_us) : st_(std::make_shared<EventState>(spin_us)) {}
  void record(Stream& s) override {
    CpuStream& cs = cpu_stream(s, "Event::record");
    const uint64_t k = st_->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
    auto st = st_;
    CpuStream* csp = &cs;
    cs.enqueue(
        [st, k, csp] {
          const bool failed = csp->failed();
          std::string why = failed ? csp->error_message() : std::string();
          bool wake;
          {
            std::lock_guard<std::mutex> lk(st->mu);
            if (k > st->completed.load(std::memory_order_relaxed)) st->completed.store(k, std::memory_order_release);
            if (failed) {
              st->last_failed = k;
              st->failure = why;
            }
            wake = st->waiters > 0;
          }
          if (wake) st->cv.notify_all();
        },
        /*always=*/true);
  }
  void wait(Stream& s) override {
    CpuStream& cs = cpu_stream(s, "Event::wait");
    const uint64_t target = st_->recorded.load(std::memory_order_acquire);
    if (target == 0) return;
    auto st = st_;
    cs.enqueue([st, target] { st->wait_for(target); });
  }
  void synchronize() override {
    const uint64_t target = st_->recorded.load(std::memory_order_acquire);
    if (target != 0) st_->wait_for(target);
  }

 private:
  std::shared_ptr<EventState> st_;
};

void poison_now(void* data, std::size_t bytes, DType dtype) {
  std::size_t n = bytes / dtype_size(dtype);
  switch (dtype) {
    case DType::f32: {
      float* p = static_cast<float*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
      break;
    }
    case DType::i32: {
      int32_t* p = static_cast<int32_t*>(data);
      for (std::size_t i = 0; i < n; ++i) p[i] = std::numeric_limits<int32_t>::min();
      break;
    }
    default: {
      uint16_t* p = static_cast<uint16_t*>(data);
      uint16_t nan = dtype == DType::bf16 ? 0x7FC0 : 0x7E00;
      for (std::size_t i = 0; i < n; ++i) p[i] = nan;
    }
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o)
      : mode_(o.mode), threads_(o.kernel_threads < 1 ? 1 : o.kernel_threads), spin_us_(o.spin_us < 0 ? 0 : o.spin_us) {}
  std::string name() const override { return std::string("cpu (") + stream_mode_name(mode_) + ")"; }
  std::unique_ptr<Buffer> allocate(std::size_t bytes) override { return allocate_in(bytes, device_meter_); }
  // Ordinary memory too, counted apart (host_memory()).
  std::unique_ptr<Buffer> allocate_host(std::size_t bytes) override { return allocate_in(bytes, host_meter_); }
  std::unique_ptr<Buffer> allocate_in(std::size_t bytes, const std::shared_ptr<MemoryMeter>& meter) {
    // Beyond a 47-bit user address space no allocation can succeed: refuse it without asking
    // the allocator (sanitizer allocators abort on such sizes instead of throwing).
    constexpr std::size_t kMaxBytes = std::size_t{1} << 47;
    const auto fail = [&] {
      return OutOfMemoryError(fmt::format("cpu backend: cannot allocate {} bytes ({:.4g} GiB)", bytes,
                                          static_cast<double>(bytes) / (1u << 30)),
                              bytes);
    };
    if (bytes > kMaxBytes) throw fail();
    try {
      return std::make_unique<CpuBuffer>(bytes, meter);
    } catch (const std::bad_alloc&) {
      throw fail();
    }
  }
  void release(std::shared_ptr<Buffer> b, Stream& s) override {
    CpuStream& cs = cpu_stream(s, "release");
    if (cs.mode() == StreamMode::Eager) return;  // b dies here
    // The task owns the reference; the worker drops it after the earlier tasks ran.
    cs.enqueue([b = std::move(b)]() mutable { b.reset(); }, /*always=*/true);
  }
  void copy_from_host(Buffer& dst, const void* src, std::size_t bytes, Stream& s) override {
    check_bytes("copy_from_host", bytes, dst.bytes());
    void* d = dst.data();
    if (bytes) cpu_stream(s, "copy_from_host").enqueue([d, src, bytes] { std::memcpy(d, src, bytes); });
  }
  void copy_to_host(void* dst, const Buffer& src, std::size_t bytes, Stream& s) override {
    check_bytes("copy_to_host", bytes, src.bytes());
    const void* sp = src.data();
    if (bytes) cpu_stream(s, "copy_to_host").enqueue([dst, sp, bytes] { std::memcpy(dst, sp, bytes); });
  }
  void copy(Buffer& dst, std::size_t doff, const Buffer& src, std::size_t soff, std::size_t bytes,
            Stream& s) override {
    check_bytes("copy (destination)", doff + bytes, dst.bytes());
    check_bytes("copy (source)", soff + bytes, src.bytes());
    auto* d = static_cast<std::byte*>(dst.data()) + doff;
    const auto* sp = static_cast<const std::byte*>(src.data()) + soff;
    if (bytes) cpu_stream(s, "copy").enqueue([d, sp, bytes] { std::memcpy(d, sp, bytes); });
  }
  void copy_block(Buffer& dst, const Buffer& src, const BlockCopy& c, Stream& s) override {
    const std::size_t sb = static_cast<std::size_t>(num_elements(c.src_shape)) * c.elem_bytes;
    const std::size_t db = static_cast<std::size_t>(num_elements(c.dst_shape)) * c.elem_bytes;
    check_bytes("copy_block (source)", c.src_byte_offset + sb, src.bytes());
    check_bytes("copy_block (destination)", c.dst_byte_offset + db, dst.bytes());
    const auto* sp = static_cast<const std::byte*>(src.data()) + c.src_byte_offset;
    auto* d = static_cast<std::byte*>(dst.data()) + c.dst_byte_offset;
    cpu_stream(s, "copy_block").enqueue([sp, d, c] {
      tessel::copy_block(sp, c.src_shape, c.src_offset, d, c.dst_shape, c.dst_offset, c.block, c.elem_bytes);
    });
  }
  void poison(Buffer& b, DType dtype, Stream& s) override {
    void* d = b.data();
    std::size_t bytes = b.bytes();
    cpu_stream(s, "poison").enqueue([d, bytes, dtype] { poison_now(d, bytes, dtype); });
  }
  void run_kernel(const KernelArgs& args, Stream& s) override {
    CpuStream& cs = cpu_stream(s, "run_kernel");
    KernelArgs a = args;
    a.num_threads = threads_;
    a.scratch_meter = device_meter_.get();  // oneDNN scratchpads count against this device
    cs.enqueue([a = std::move(a)] { run_cpu_kernel(a); });
  }
  void prepare_kernel(const KernelArgs& args) override {
    KernelArgs a = args;
    a.num_threads = threads_;  // as run_kernel: the thread split is part of the primitives' keys
    prepare_cpu_kernel(a);
  }
  void launch_host_func(Stream& s, std::function<void()> fn) override {
    cpu_stream(s, "launch_host_func").enqueue(std::move(fn), /*always=*/true);
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CpuStream>(mode_, name, spin_us_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(spin_us_); }

 private:
  static void check_bytes(const char* what, std::size_t need, std::size_t have) {
    if (need > have)
      throw RuntimeError(fmt::format("cpu backend: {} of {} bytes exceeds the buffer of {} bytes", what,
                                     need, have));
  }
  StreamMode mode_;
  int threads_;
  int spin_us_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  if (options.mode != StreamMode::Async && options.mode != StreamMode::Eager)
    throw RuntimeError(fmt::format("make_cpu_backend: mode {} is neither StreamMode::Async nor StreamMode::Eager",
                                   static_cast<int>(options.mode)));
  if (options.spin_us > 1000000)
    throw RuntimeError(fmt::format("make_cpu_backend: spin_us = {}: expected microseconds from 0 to 1000000, or -1",
                                   options.spin_us));
  return std::make_unique<CpuBackend>(options);
}

}  // namespace tessel
