// tessel/runtime/device_threads.hpp — the local devices of this process, one thread each: the
// machinery every runtime runs its devices on, whatever the backend (CPU: ThreadRuntime and
// MpiRuntime, runtime/cpu/; CUDA: CudaRuntime, runtime/cuda/).
//
// DeviceThreads is made once and owns, per device: a persistent device thread (which walks the
// device's program, enqueuing work), a backend (made by DeviceThreadsOptions::make_backend) and
// three of its streams: compute, communication and transfer (host <-> device copies); and,
// when the backend gives one (make_inline_stream), an eager stream on the device thread itself
// for programs with nothing to overlap. Device 0 has no thread of its own: its part of each
// job runs on the thread that called run_on_devices, which would otherwise only wait (a
// hand-off there and back costs two wake-ups, more than a tiny step's work); with an inline
// stream (CPU), device 0's transfer stream is an eager one too, so its host copies run on the
// caller of to_device / to_host, which waits for them anyway. Loading a program
// (load() in loaded_executable.hpp) adds what is program-specific (communicators, events,
// labels); runs then reuse the threads and streams, so a step pays no thread or stream setup.
//
// Waiting: every wait of a step (the hand-off of a job to a device thread and back, a device
// thread waiting for its next job) polls for up to spin_us() microseconds before blocking on a
// condition variable, and nobody is notified unless it is blocked. DeviceThreadsOptions::
// spin_us says how long; by default it is decided from the machine: a spin only when
// std::thread::hardware_concurrency() covers the threads a step keeps busy (per device 1 with
// eager streams, 3 with async ones: the device thread and the compute and comm workers), since
// a spinner with too few cores steals the time of the thread it waits for. Waits among the
// device threads alone — a job's hand-offs when its program runs inline, a device thread
// waiting for its next job, an inline program's collectives — use inline_spin_us(), decided
// the same way for num_devices threads.
//
// Threads are real resources: when one cannot be started (a resource limit, a very large
// mesh) the constructor throws RuntimeError naming the device and the reason, after stopping
// and joining every thread already started.
//
// Thread safety: run_on_devices may be called from several threads; the jobs run one at a
// time (each job on all devices at once). The streams of a device are used by its thread
// during a job and by transfers (the transfer stream) from any thread.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/runtime/backend.hpp"

namespace tessel {

struct DeviceThreadsOptions {
  StreamMode stream_mode = StreamMode::Async;
  // Microseconds a waiter polls before blocking (see above). -1: automatic — the environment
  // variable TESSEL_SPIN_US when set (0 turns spinning off, N forces N us), else 20 when the
  // machine has a hardware thread for every thread a step keeps busy, else 0. >= 0: exactly that.
  int spin_us = -1;
  // Async mode: a program whose instructions are all on `compute` runs on the device thread's
  // inline stream (inline_stream) instead of the stream workers. false: always on the workers.
  // Off when there is no inline stream (make_inline_stream empty).
  bool inline_serial_programs = true;
  // Async mode, with inline_serial_programs: a program whose collectives that can overlap
  // with other work move at most this many bytes per device in all runs inline too (its
  // collectives then run on the device thread, in program order). 0: only programs with
  // nothing on another stream run inline. ThreadRuntimeOptions explains the default.
  int64_t inline_max_comm_bytes = 256 << 10;
  // For tests: called with the device before its thread is started (devices 1.., device 0
  // has none); an exception it throws is handled exactly like a failure to start that thread
  // (std::system_error).
  std::function<void(int64_t device)> before_thread_start;
  // The backend of each local device (required; called once per device, in device order, on
  // the constructing thread) with the resolved spin budget. Returning nullptr makes the
  // constructor throw RuntimeError naming the device.
  std::function<std::unique_ptr<Backend>(int64_t device, int spin_us)> make_backend;
  // Async mode: an eager stream that runs on the device's own thread (a stream of the same
  // memory as the backend's). Empty: none (inline_stream() is the compute stream and
  // inline_serial_programs is off).
  std::function<std::unique_ptr<Stream>(int64_t device, int spin_us)> make_inline_stream;
  // What errors call these devices ("ThreadRuntime", "CudaRuntime", ...).
  std::string owner = "DeviceThreads";
};

namespace detail {
struct RuntimeDevice;
struct JobCompletion;
}  // namespace detail

class DeviceThreads {
 public:
  explicit DeviceThreads(int64_t num_devices, DeviceThreadsOptions options);
  virtual ~DeviceThreads();  // stops and joins every device thread (no job may be running)
  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;

  int64_t num_devices() const { return static_cast<int64_t>(devices_.size()); }
  // The options in force (spin_us as given; inline_serial_programs off without an inline stream).
  const DeviceThreadsOptions& settings() const { return settings_; }
  // The spin budget in force (microseconds; DeviceThreadsOptions::spin_us resolved).
  int spin_us() const { return spin_us_; }
  // The budget of waits among the device threads alone (DeviceThreadsOptions::spin_us
  // resolved for num_devices() threads).
  int inline_spin_us() const { return inline_spin_us_; }

  Backend& backend(int64_t device);
  Stream& compute_stream(int64_t device);
  Stream& comm_stream(int64_t device);
  Stream& transfer_stream(int64_t device);
  // An eager stream on the device's own thread (the compute stream when the backend has none,
  // and in Eager mode): load() runs a program on it (its compute and comm instructions alike,
  // in program order) when the program has nothing to overlap, or its collectives move too few
  // bytes for overlap to pay (DeviceThreadsOptions::inline_serial_programs,
  // inline_max_comm_bytes).
  Stream& inline_stream(int64_t device);

  // Runs job(device) on every device's thread at once (device 0's on the calling thread) and
  // waits for all of them. Returns each device's exception (nullptr when it returned
  // normally). Jobs are serialised. inline_job: the job runs its program inline (no stream
  // worker works meanwhile): the caller waits for the others with inline_spin_us().
  std::vector<std::exception_ptr> run_on_devices(const std::function<void(int64_t device)>& job,
                                                 bool inline_job = false);

 protected:
  // Stops and joins the device threads now (idempotent): a derived class whose destructor must
  // end the threads before its own members go calls it first.
  void stop_threads() noexcept;

 private:
  DeviceThreadsOptions settings_;
  int spin_us_ = 0;
  int inline_spin_us_ = 0;
  std::unique_ptr<detail::JobCompletion> completion_;  // before devices_: their threads use it
  std::vector<std::unique_ptr<detail::RuntimeDevice>> devices_;
  std::mutex job_mutex_;
};

}  // namespace tessel
