// tessel/runtime/cpu/thread_runtime.hpp — the local devices of this process, one thread each.
//
// A ThreadRuntime is made once and owns, per device: a persistent device thread (which walks
// the device's program, enqueuing work), a backend (CPU unless ThreadRuntimeOptions::
// make_backend gives another, e.g. CUDA), and three streams: compute,
// communication and transfer (host <-> device copies). Device 0 has no thread of its own: its
// part of each job runs on the thread that called run_on_devices, which would otherwise only
// wait (a hand-off there and back costs two wake-ups, more than a tiny step's work). Loading a
// program on it (load() in loaded_executable.hpp) adds what is program-specific
// (communicators, events, labels); runs then reuse the threads and streams, so a step pays no
// thread or stream setup.
//
// Waiting: every wait of a step (the hand-off of a job to a device thread and back, a stream
// worker waiting for work, synchronize, event waits, the ThreadWorld's rendezvous) polls for up
// to spin_us() microseconds before blocking on a condition variable, and nobody is notified
// unless it is blocked. ThreadRuntimeOptions::spin_us says how long; by default it is decided
// from the machine: a spin only when std::thread::hardware_concurrency() covers the threads a
// step keeps busy (per device 1 with eager streams, 3 with async ones: the device thread and
// the compute and comm workers), since a spinner with too few cores steals the time of the
// thread it waits for. Waits among the device threads alone — a job's hand-offs when its
// program runs inline, a device thread waiting for its next job, an inline program's
// collectives — use inline_spin_us(), decided the same way for num_devices threads.
//
// Threads are real resources: when one cannot be started (a resource limit, a very large
// mesh) the constructor throws RuntimeError naming the device and the reason, after stopping
// and joining every thread already started.
//
// As a Runtime (runtime.hpp) it runs meshes of exactly num_devices() devices, all local, with
// an in-process ThreadWorld for the collectives. MpiRuntime runs its local devices on one.
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
#include <vector>

#include "tessel/runtime/backend.hpp"
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

namespace detail {
struct RuntimeDevice;
struct JobCompletion;
}

class ThreadRuntime : public Runtime {
 public:
  explicit ThreadRuntime(int64_t num_devices, ThreadRuntimeOptions options = {});
  ~ThreadRuntime() override;  // stops and joins every device thread (no job may be running)
  ThreadRuntime(const ThreadRuntime&) = delete;
  ThreadRuntime& operator=(const ThreadRuntime&) = delete;

  int64_t num_devices() const { return static_cast<int64_t>(devices_.size()); }
  const ThreadRuntimeOptions& options() const { return options_; }
  // The spin budget in force (microseconds; ThreadRuntimeOptions::spin_us resolved).
  int spin_us() const { return spin_us_; }
  // The budget of waits among the device threads alone (ThreadRuntimeOptions::spin_us
  // resolved for num_devices() threads): the hand-off of a job to a device thread and back
  // when the program runs inline (no stream worker is runnable then), a device thread waiting
  // for its next job, and the collectives of an inline program.
  int inline_spin_us() const { return inline_spin_us_; }

  Backend& backend(int64_t device);
  Stream& compute_stream(int64_t device);
  Stream& comm_stream(int64_t device);
  Stream& transfer_stream(int64_t device);
  // An eager stream on the device's own thread (the compute stream itself in Eager mode):
  // load() runs a program on it (its compute and comm instructions alike, in program order)
  // when the program has nothing to overlap — every instruction on `compute` — or its
  // collectives move too few bytes for overlap to pay, because handing each kernel to a stream
  // worker and waiting for it costs more than it buys then (ThreadRuntimeOptions::
  // inline_serial_programs, inline_max_comm_bytes).
  Stream& inline_stream(int64_t device);
  // The link model the collectives of this runtime's worlds use (ThreadRuntimeOptions::
  // link_model, else TESSEL_LINK_MODEL; off when neither is set).
  LinkModel link_model() const;

  // Runs job(device) on every device's thread at once (device 0's on the calling thread) and
  // waits for all of them. Returns each device's exception (nullptr when it returned
  // normally). Jobs are serialised. inline_job: the job runs its program inline (no stream
  // worker works meanwhile): the caller waits for the others with inline_spin_us().
  std::vector<std::exception_ptr> run_on_devices(const std::function<void(int64_t device)>& job,
                                                 bool inline_job = false);

  // Runtime: every device local, positions 0..num_devices()-1, a ThreadWorld.
  std::string name() const override { return "threads"; }
  int process_rank() const override { return 0; }
  int process_count() const override { return 1; }
  std::vector<int64_t> devices_for(const Mesh& mesh) override;
  ThreadRuntime& local() override { return *this; }
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                              double timeout_s) override;
  std::vector<HostTensor> allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) override;

 private:
  ThreadRuntimeOptions options_;
  int spin_us_ = 0;
  int inline_spin_us_ = 0;
  std::unique_ptr<detail::JobCompletion> completion_;  // before devices_: their threads use it
  std::vector<std::unique_ptr<detail::RuntimeDevice>> devices_;
  std::mutex job_mutex_;
};

}  // namespace tessel
