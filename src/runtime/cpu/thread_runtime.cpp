// ThreadRuntime: persistent device threads with a job slot each (device 0's jobs run on the
// caller), and per-device backends and streams made once.
#include "tessel/runtime/cpu/thread_runtime.hpp"

#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "cpu_stream.hpp"
#include "spin.hpp"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <system_error>
#include <thread>

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

ThreadRuntime::ThreadRuntime(int64_t num_devices, ThreadRuntimeOptions options) : options_(std::move(options)) {
  if (num_devices < 1)
    throw RuntimeError(fmt::format("ThreadRuntime: num_devices must be >= 1, got {}", num_devices));
  if (options_.kernel_threads < 1)
    throw RuntimeError(fmt::format("ThreadRuntime: kernel_threads must be >= 1, got {}", options_.kernel_threads));
  if (options_.stream_mode != StreamMode::Async && options_.stream_mode != StreamMode::Eager)
    throw RuntimeError(fmt::format("ThreadRuntime: stream_mode {} is neither StreamMode::Async nor StreamMode::Eager",
                                   static_cast<int>(options_.stream_mode)));
  // The threads that may be runnable at once during a step: per device, the thread that walks
  // its program (the caller's for device 0) and, with async streams, the compute and comm
  // workers (the transfer stream's worker only works between steps). Waiters spin only when
  // the machine has a hardware thread for each of them (spin.hpp).
  const int64_t busy_threads = num_devices * (options_.stream_mode == StreamMode::Async ? 3 : 1);
  spin_us_ = detail::spin_budget_us(options_.spin_us, busy_threads);
  // The device threads alone: a job's hand-offs when its program runs inline, and the device
  // threads' waits for their next job (between steps no stream worker runs).
  inline_spin_us_ = detail::spin_budget_us(options_.spin_us, num_devices);
  // A backend of the caller's (make_backend): its streams are not CPU streams, so there is no
  // inline CPU stream to run serial programs on.
  const bool own_backend = static_cast<bool>(options_.make_backend);
  if (own_backend) options_.inline_serial_programs = false;
  CpuBackendOptions bo;
  bo.mode = options_.stream_mode;
  bo.kernel_threads = options_.kernel_threads;
  bo.spin_us = spin_us_;
  completion_ = std::make_unique<detail::JobCompletion>(spin_us_, inline_spin_us_);
  try {
    devices_.reserve(static_cast<std::size_t>(num_devices));
    for (int64_t d = 0; d < num_devices; ++d) {
      auto dev = std::make_unique<detail::RuntimeDevice>();
      if (own_backend) {
        dev->backend = options_.make_backend(d);
        if (!dev->backend)
          throw RuntimeError(fmt::format("ThreadRuntime: make_backend returned no backend for device {} of {}", d,
                                         num_devices));
      } else {
        dev->backend = make_cpu_backend(bo);
      }
      dev->compute = dev->backend->create_stream(fmt::format("device {} compute", d));
      dev->comm = dev->backend->create_stream(fmt::format("device {} comm", d));
      dev->transfer = dev->backend->create_stream(fmt::format("device {} transfer", d));
      if (options_.stream_mode == StreamMode::Async && !own_backend)
        dev->inline_compute = std::make_unique<detail::CpuStream>(StreamMode::Eager, fmt::format("device {} inline", d), spin_us_);
      dev->job_spin = std::make_unique<detail::SpinWait>(inline_spin_us_);
      dev->completion = completion_.get();
      if (d > 0) {  // device 0 runs on the caller of run_on_devices
        try {
          if (options_.before_thread_start) options_.before_thread_start(d);
          detail::RuntimeDevice* raw = dev.get();
          dev->thread = std::thread([raw, d] { raw->loop(d); });
        } catch (const std::system_error& e) {
          throw RuntimeError(fmt::format("ThreadRuntime: cannot start the thread of device {} of {}: {} "
                                         "(threads already started were stopped; use fewer devices or raise "
                                         "the process's thread limit)", d, num_devices, e.what()));
        }
      }
      devices_.push_back(std::move(dev));
    }
  } catch (const std::bad_alloc&) {
    for (auto& dev : devices_) dev->shutdown();
    throw RuntimeError(fmt::format("ThreadRuntime: out of memory setting up {} devices (started threads were stopped)",
                                   num_devices));
  } catch (...) {
    for (auto& dev : devices_) dev->shutdown();
    throw;
  }
}

ThreadRuntime::~ThreadRuntime() {
  // Programs loaded here may outlive it: their runs in flight end first, later ones throw.
  retire(fmt::format("ThreadRuntime of {} devices", devices_.size()));
  for (auto& dev : devices_) dev->shutdown();
}

Backend& ThreadRuntime::backend(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->backend; }
Stream& ThreadRuntime::compute_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->compute; }
Stream& ThreadRuntime::comm_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->comm; }
Stream& ThreadRuntime::inline_stream(int64_t d) {
  auto& dev = *devices_.at(static_cast<std::size_t>(d));
  return dev.inline_compute ? *dev.inline_compute : *dev.compute;
}
Stream& ThreadRuntime::transfer_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->transfer; }

std::vector<std::exception_ptr> ThreadRuntime::run_on_devices(const std::function<void(int64_t)>& job,
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

std::vector<int64_t> ThreadRuntime::devices_for(const Mesh& mesh) {
  if (num_devices() != mesh.num_devices())
    throw RuntimeError(fmt::format("load: the program is partitioned for mesh {} ({} devices) but the runtime has {} "
                                   "devices; make the ThreadRuntime with mesh.num_devices()",
                                   mesh.to_string(), mesh.num_devices(), num_devices()));
  std::vector<int64_t> pos(static_cast<std::size_t>(num_devices()));
  for (int64_t d = 0; d < num_devices(); ++d) pos[static_cast<std::size_t>(d)] = d;
  return pos;
}

LinkModel ThreadRuntime::link_model() const {
  return options_.link_model.on() ? options_.link_model : LinkModel::from_env();
}

std::unique_ptr<CollectiveWorld> ThreadRuntime::make_world(const Mesh& mesh,
                                                           const std::vector<std::vector<std::string>>& /*axes*/,
                                                           double timeout_s) {
  ThreadWorldOptions wo;
  wo.timeout_seconds = timeout_s;
  wo.spin_us = spin_us_;  // the collectives run on this runtime's threads: same budget
  wo.link_model = link_model();
  return std::make_unique<ThreadWorld>(mesh, wo);  // groups are created on first request
}

std::vector<HostTensor> ThreadRuntime::allgather_shards(const Mesh& /*mesh*/, std::vector<HostTensor> local) {
  return local;
}

}  // namespace tessel
