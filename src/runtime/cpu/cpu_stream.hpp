// cpu_stream.hpp (private) — the CPU backend's Stream: an in-order task queue, run either by
// its own worker thread (async) or on the enqueuing thread at once (eager). Shared by the CPU
// backend and the thread communicator, which enqueues its collectives on a CpuStream.
//
// Waiting (async): the worker, when its queue is empty, and synchronize(), while tasks are
// pending, busy-wait up to spin_us microseconds (spin.hpp, adaptive) before blocking on their condition
// variables; enqueue and the worker notify only when somebody is actually blocked, so a busy
// or spinning peer costs no futex call. The queue is a ring that only grows: a step enqueues
// without allocating queue storage.
//
// Errors (async): the first task that throws puts the stream into an error state; later
// tasks are skipped except those marked `always` (event records, releases), which run so
// that no other stream waiting on this one can hang; synchronize() rethrows and clears the
// error. Eager: the failing call throws at once and nothing is sticky.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../spin.hpp"
#include "tessel/runtime/backend.hpp"

namespace tessel {
namespace detail {

class CpuStream final : public Stream {
 public:
  CpuStream(StreamMode mode, std::string name, int spin_us = 0);
  ~CpuStream() override;
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  // Enqueues fn. `always`: runs even when the stream is in its error state.
  void enqueue(std::function<void()> fn, bool always = false);
  void synchronize() override;
  void set_label(const char* label) override { label_ = label; }

  StreamMode mode() const { return mode_; }
  const std::string& name() const { return name_; }
  // True while a task of this stream has failed and synchronize() has not been called yet.
  // Meaningful inside the stream's own tasks.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string error_message() const;

 private:
  struct Task {
    std::function<void()> fn;
    const char* label = nullptr;
    bool always = false;
  };
  void run_task(Task& t);
  void worker();
  void push(Task&& t);  // under mu_
  Task pop();           // under mu_, queue not empty

  const StreamMode mode_;
  const std::string name_;
  SpinWait idle_spin_;  // the worker waiting for work
  SpinWait sync_spin_;  // synchronize() waiting for the worker
  const char* label_ = nullptr;  // host side: the label for tasks enqueued next

  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_idle_;
  std::vector<Task> ring_;   // guarded by mu_: a ring of capacity ring_.size() (a power of 2)
  std::size_t head_ = 0;     // guarded by mu_: index of the oldest task
  std::size_t size_ = 0;     // guarded by mu_: tasks queued
  // Written under mu_; read without it by spinning waiters.
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> finished_{0};
  bool worker_waiting_ = false;  // guarded by mu_: the worker is blocked on cv_work_
  int idle_waiters_ = 0;         // guarded by mu_: threads blocked on cv_idle_
  bool stop_ = false;            // guarded by mu_
  std::exception_ptr error_;  // guarded by mu_
  std::string error_msg_;     // guarded by mu_
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

// The CpuStream behind s; throws RuntimeError naming `who` when s belongs to another backend.
CpuStream& cpu_stream(Stream& s, const char* who);

}  // namespace detail
}  // namespace tessel
