// tessel/runtime/cpu/thread_runtime.hpp — the CPU runtime of one process: every device of the
// mesh is a thread of this process (DeviceThreads, device_threads.hpp, with CPU backends), and
// the collectives run in process through a ThreadWorld (thread_communicator.hpp).
//
// The device-thread machinery (persistent device threads, job hand-offs, the spin policy, the
// streams of each device) is DeviceThreads'; ThreadRuntime adds the CPU backends (or the ones
// ThreadRuntimeOptions::make_backend gives, e.g. a test's), an eager CPU stream per device for
// inline programs, the link model of the in-process collectives, and the Runtime interface:
// it runs meshes of exactly num_devices() devices, all local. MpiRuntime runs its local
// devices on one.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/device_threads.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"

namespace tessel {

struct ThreadRuntimeOptions {
  StreamMode stream_mode = StreamMode::Async;
  int kernel_threads = 1;  // threads each device's kernels may use
  // Microseconds a waiter polls before blocking (see above). -1: automatic — the environment
  // variable TESSEL_SPIN_US when set (0 turns spinning off, N forces N us), else 20 when the
  // machine has a hardware thread for every thread a step keeps busy, else 0. >= 0: exactly that.
  int spin_us = -1;
  // A simulated interconnect for the collectives (thread_communicator.hpp, LinkModel); off by
  // default. The environment variable TESSEL_LINK_MODEL turns it on when this is off.
  LinkModel link_model;
  // Async mode: a program whose instructions are all on `compute` runs on the device thread's
  // inline stream (inline_stream) instead of the stream workers. false: always on the workers.
  bool inline_serial_programs = true;
  // Async mode, with inline_serial_programs: a program whose collectives that can overlap
  // with other work move at most this many bytes per device in all runs inline too (its
  // collectives then run on the device thread, in program order). A collective can overlap
  // when another stream has work enqueued beside it that does not wait for it; the rest sit
  // on the critical path (a tensor-parallel all-reduce between two einsums), where the stream
  // workers only add hand-offs, whatever their size. Overlap could hide at most the time of
  // the others — about 25 us at memcpy speed for the default 256 KiB, the cost of a hand-off
  // to a stream worker and back — while every hand-off costs a thread wake-up. Not applied
  // while a link model is on (it simulates an interconnect worth overlapping). 0: only
  // programs with nothing on another stream run inline (the stream workers under test).
  int64_t inline_max_comm_bytes = 256 << 10;
  // For tests: called with the device before its thread is started (devices 1.., device 0
  // has none); an exception it throws is handled exactly like a failure to start that thread
  // (std::system_error).
  std::function<void(int64_t device)> before_thread_start;
  // The backend of each local device (called once per device, in device order, on the
  // constructing thread). Empty: a CPU backend (make_cpu_backend with stream_mode,
  // kernel_threads and the spin budget above). CudaRuntime (cuda.hpp) passes CUDA backends
  // here. With a backend of its own, the runtime has no inline stream (inline_stream() is the
  // compute stream) and inline_serial_programs is turned off: the inline stream is a CPU
  // stream. Returning nullptr makes the constructor throw RuntimeError naming the device.
  std::function<std::unique_ptr<Backend>(int64_t device)> make_backend;
};

class ThreadRuntime : public Runtime, public DeviceThreads {
 public:
  explicit ThreadRuntime(int64_t num_devices, ThreadRuntimeOptions options = {});
  ~ThreadRuntime() override;  // stops and joins every device thread (no job may be running)
  ThreadRuntime(const ThreadRuntime&) = delete;
  ThreadRuntime& operator=(const ThreadRuntime&) = delete;

  const ThreadRuntimeOptions& options() const { return options_; }
  // The link model the collectives of this runtime's worlds use (ThreadRuntimeOptions::
  // link_model, else TESSEL_LINK_MODEL; off when neither is set).
  LinkModel link_model() const;

  // Runtime: every device local, positions 0..num_devices()-1, a ThreadWorld.
  std::string name() const override { return "threads"; }
  int process_rank() const override { return 0; }
  int process_count() const override { return 1; }
  std::vector<int64_t> devices_for(const Mesh& mesh) override;
  DeviceThreads& local() override { return *this; }
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                              double timeout_s) override;
  std::vector<HostTensor> allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) override;

 private:
  ThreadRuntimeOptions options_;
};

}  // namespace tessel
