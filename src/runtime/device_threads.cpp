// DeviceThreads: persistent device threads with a job slot each (device 0's jobs run on the
// caller), and per-device backends and streams made once (device_threads.hpp).
#include "tessel/runtime/device_threads.hpp"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <system_error>
#include <thread>

#include "spin.hpp"

namespace tessel {
namespace detail {

// The end of a job on the device threads: the last one to finish wakes the caller, once (not
// once per device).
struct JobCompletion {
  JobCompletion(int spin_us, int inline_spin_us) : spin(spin_us), inline_spin(inline_spin_us) {}
  std::atomic<int64_t> pending{0};  // device threads still running the current job
  SpinWait spin;                    // the caller polls `pending` before blocking
  SpinWait inline_spin;             // ... for a job that runs its program inline
  std::mutex mu;
  std::condition_variable cv;
  bool caller_waiting = false;  // guarded by mu

  void arrive() {  // a device thread, after its job; its error is published by the release
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    std::lock_guard<std::mutex> lk(mu);
    if (caller_waiting) cv.notify_one();
  }
  void wait(bool inline_job) {  // the caller
    const auto done = [&] { return pending.load(std::memory_order_acquire) == 0; };
    (inline_job ? inline_spin : spin)(done);
    std::unique_lock<std::mutex> lk(mu);
    caller_waiting = true;
    cv.wait(lk, done);
    caller_waiting = false;
  }
};

struct RuntimeDevice {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Stream> compute, comm, transfer;
  std::unique_ptr<Stream> inline_compute;  // Async mode: an eager stream on the device thread
  std::thread thread;  // none for device 0, whose jobs run on the caller of run_on_devices
  JobCompletion* completion = nullptr;
  std::unique_ptr<SpinWait> job_spin;  // the device thread polls for its next job
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void(int64_t)>* job = nullptr;  // guarded by mu
  // Written under mu; polled without it by the spinning device thread.
  std::atomic<uint64_t> job_seq{0};
  // The job's exception: written by the device thread before completion->arrive(), read and
  // reset by the caller after completion->wait().
  std::exception_ptr error;
  bool stop = false;            // guarded by mu
  bool thread_waiting = false;  // guarded by mu: the device thread is blocked on cv

  void loop(int64_t d) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      if (!stop && job_seq.load(std::memory_order_relaxed) == seen) {
        lk.unlock();
        (*job_spin)([&] { return job_seq.load(std::memory_order_acquire) != seen; });
        lk.lock();
        thread_waiting = true;
        cv.wait(lk, [&] { return stop || job_seq.load(std::memory_order_relaxed) != seen; });
        thread_waiting = false;
      }
      if (stop) return;
      seen = job_seq.load(std::memory_order_relaxed);
      const auto* j = job;
      lk.unlock();
      try {
        (*j)(d);
      } catch (...) {
        error = std::current_exception();
      }
      completion->arrive();
      lk.lock();
    }
  }

  // Caller side: hands job to the device thread.
  void start(const std::function<void(int64_t)>& j) {
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu);
      job = &j;
      job_seq.store(job_seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      wake = thread_waiting;  // a spinning device thread sees the job without a futex call
    }
    if (wake) cv.notify_all();
  }

  ~RuntimeDevice() { shutdown(); }

  void shutdown() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
};

}  // namespace detail

DeviceThreads::DeviceThreads(int64_t num_devices, DeviceThreadsOptions options) : settings_(std::move(options)) {
  const std::string& who = settings_.owner;
  if (num_devices < 1) throw RuntimeError(fmt::format("{}: num_devices must be >= 1, got {}", who, num_devices));
  if (settings_.stream_mode != StreamMode::Async && settings_.stream_mode != StreamMode::Eager)
    throw RuntimeError(fmt::format("{}: stream_mode {} is neither StreamMode::Async nor StreamMode::Eager", who,
                                   static_cast<int>(settings_.stream_mode)));
  if (!settings_.make_backend) throw RuntimeError(fmt::format("{}: DeviceThreadsOptions::make_backend is empty", who));
  // The threads that may be runnable at once during a step: per device, the thread that walks
  // its program (the caller's for device 0) and, with async streams, the compute and comm
  // workers (the transfer stream's worker only works between steps). Waiters spin only when
  // the machine has a hardware thread for each of them (spin.hpp).
  const int64_t busy_threads = num_devices * (settings_.stream_mode == StreamMode::Async ? 3 : 1);
  spin_us_ = detail::spin_budget_us(settings_.spin_us, busy_threads);
  // The device threads alone: a job's hand-offs when its program runs inline, and the device
  // threads' waits for their next job (between steps no stream worker runs).
  inline_spin_us_ = detail::spin_budget_us(settings_.spin_us, num_devices);
  const bool inline_streams = settings_.stream_mode == StreamMode::Async && settings_.make_inline_stream;
  if (!settings_.make_inline_stream) settings_.inline_serial_programs = false;
  completion_ = std::make_unique<detail::JobCompletion>(spin_us_, inline_spin_us_);
  try {
    devices_.reserve(static_cast<std::size_t>(num_devices));
    for (int64_t d = 0; d < num_devices; ++d) {
      auto dev = std::make_unique<detail::RuntimeDevice>();
      dev->backend = settings_.make_backend(d, spin_us_);
      if (!dev->backend)
        throw RuntimeError(fmt::format("{}: make_backend returned no backend for device {} of {}", who, d, num_devices));
      dev->compute = dev->backend->create_stream(fmt::format("device {} compute", d));
      dev->comm = dev->backend->create_stream(fmt::format("device {} comm", d));
      // Device 0's host copies run on the caller, as its jobs do: to_device and to_host wait
      // for them anyway, and a hand-off to a transfer worker and back costs two wake-ups (with an
      // eager stream of the backend's kind; otherwise, as on GPUs, a stream of the backend).
      dev->transfer = d == 0 && inline_streams ? settings_.make_inline_stream(d, spin_us_)
                                               : dev->backend->create_stream(fmt::format("device {} transfer", d));
      if (inline_streams) dev->inline_compute = settings_.make_inline_stream(d, spin_us_);
      dev->job_spin = std::make_unique<detail::SpinWait>(inline_spin_us_);
      dev->completion = completion_.get();
      if (d > 0) {  // device 0 runs on the caller of run_on_devices
        try {
          if (settings_.before_thread_start) settings_.before_thread_start(d);
          detail::RuntimeDevice* raw = dev.get();
          dev->thread = std::thread([raw, d] { raw->loop(d); });
        } catch (const std::system_error& e) {
          throw RuntimeError(fmt::format("{}: cannot start the thread of device {} of {}: {} "
                                         "(threads already started were stopped; use fewer devices or raise "
                                         "the process's thread limit)", who, d, num_devices, e.what()));
        }
      }
      devices_.push_back(std::move(dev));
    }
  } catch (const std::bad_alloc&) {
    for (auto& dev : devices_) dev->shutdown();
    throw RuntimeError(fmt::format("{}: out of memory setting up {} devices (started threads were stopped)", who,
                                   num_devices));
  } catch (...) {
    for (auto& dev : devices_) dev->shutdown();
    throw;
  }
}

DeviceThreads::~DeviceThreads() { stop_threads(); }

void DeviceThreads::stop_threads() noexcept {
  for (auto& dev : devices_) dev->shutdown();
}

Backend& DeviceThreads::backend(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->backend; }
Stream& DeviceThreads::compute_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->compute; }
Stream& DeviceThreads::comm_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->comm; }
Stream& DeviceThreads::inline_stream(int64_t d) {
  auto& dev = *devices_.at(static_cast<std::size_t>(d));
  return dev.inline_compute ? *dev.inline_compute : *dev.compute;
}
Stream& DeviceThreads::transfer_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->transfer; }

std::vector<std::exception_ptr> DeviceThreads::run_on_devices(const std::function<void(int64_t)>& job,
                                                              bool inline_job) {
  std::lock_guard<std::mutex> guard(job_mutex_);
  const std::size_t n = devices_.size();
  std::vector<std::exception_ptr> errors(n);  // before any start: nothing may throw after it
  completion_->pending.store(static_cast<int64_t>(n) - 1, std::memory_order_relaxed);  // published by start()
  for (std::size_t d = 1; d < n; ++d) devices_[d]->start(job);
  // Device 0 runs here: the caller would only wait, and a hand-off to a thread and back costs
  // two wake-ups (more than a tiny step's own work).
  try {
    job(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  if (n > 1) completion_->wait(inline_job);
  for (std::size_t d = 1; d < n; ++d) {
    errors[d] = std::move(devices_[d]->error);
    devices_[d]->error = nullptr;
  }
  return errors;
}

}  // namespace tessel
