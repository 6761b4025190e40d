// ThreadRuntime: persistent device threads with a job slot each, and per-device backends and
// streams made once.
#include "tessel/runtime/thread_runtime.hpp"

#include "tessel/runtime/thread_communicator.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <system_error>
#include <thread>

namespace tessel {
namespace detail {

struct RuntimeDevice {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Stream> compute, comm, transfer;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  const std::function<void(int64_t)>* job = nullptr;  // guarded by mu
  uint64_t job_seq = 0;                              // guarded by mu
  uint64_t done_seq = 0;                             // guarded by mu
  std::exception_ptr error;                          // guarded by mu
  bool stop = false;                                 // guarded by mu

  void loop(int64_t d) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      cv.wait(lk, [&] { return stop || job_seq != seen; });
      if (stop) return;
      seen = job_seq;
      const auto* j = job;
      lk.unlock();
      std::exception_ptr err;
      try {
        (*j)(d);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      error = err;
      done_seq = seen;
      cv.notify_all();
    }
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
  CpuBackendOptions bo;
  bo.mode = options_.stream_mode;
  bo.kernel_threads = options_.kernel_threads;
  try {
    devices_.reserve(static_cast<std::size_t>(num_devices));
    for (int64_t d = 0; d < num_devices; ++d) {
      auto dev = std::make_unique<detail::RuntimeDevice>();
      dev->backend = make_cpu_backend(bo);
      dev->compute = dev->backend->create_stream(fmt::format("device {} compute", d));
      dev->comm = dev->backend->create_stream(fmt::format("device {} comm", d));
      dev->transfer = dev->backend->create_stream(fmt::format("device {} transfer", d));
      try {
        if (options_.before_thread_start) options_.before_thread_start(d);
        detail::RuntimeDevice* raw = dev.get();
        dev->thread = std::thread([raw, d] { raw->loop(d); });
      } catch (const std::system_error& e) {
        throw RuntimeError(fmt::format("ThreadRuntime: cannot start the thread of device {} of {}: {} "
                                       "(threads already started were stopped; use fewer devices or raise "
                                       "the process's thread limit)", d, num_devices, e.what()));
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
  for (auto& dev : devices_) dev->shutdown();
}

Backend& ThreadRuntime::backend(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->backend; }
Stream& ThreadRuntime::compute_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->compute; }
Stream& ThreadRuntime::comm_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->comm; }
Stream& ThreadRuntime::transfer_stream(int64_t d) { return *devices_.at(static_cast<std::size_t>(d))->transfer; }

std::vector<std::exception_ptr> ThreadRuntime::run_on_devices(const std::function<void(int64_t)>& job) {
  std::lock_guard<std::mutex> guard(job_mutex_);
  std::vector<uint64_t> seq(devices_.size());
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    auto& dev = *devices_[d];
    {
      std::lock_guard<std::mutex> lk(dev.mu);
      dev.job = &job;
      seq[d] = ++dev.job_seq;
    }
    dev.cv.notify_all();
  }
  std::vector<std::exception_ptr> errors(devices_.size());
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    auto& dev = *devices_[d];
    std::unique_lock<std::mutex> lk(dev.mu);
    dev.cv.wait(lk, [&] { return dev.done_seq == seq[d]; });
    errors[d] = dev.error;
    dev.error = nullptr;
    dev.job = nullptr;
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

std::unique_ptr<CollectiveWorld> ThreadRuntime::make_world(const Mesh& mesh,
                                                           const std::vector<std::vector<std::string>>& /*axes*/,
                                                           double timeout_s) {
  ThreadWorldOptions wo;
  wo.timeout_seconds = timeout_s;
  return std::make_unique<ThreadWorld>(mesh, wo);  // groups are created on first request
}

std::vector<HostTensor> ThreadRuntime::allgather_shards(const Mesh& /*mesh*/, std::vector<HostTensor> local) {
  return local;
}

}  // namespace tessel
