// cpu_stream.hpp (private) — the CPU backend's Stream: an in-order task queue, run either by
// its own worker thread (async) or on the enqueuing thread at once (eager). Shared by the CPU
// backend and the thread communicator, which enqueues its collectives on a CpuStream.
//
// Errors (async): the first task that throws puts the stream into an error state; later
// tasks are skipped except those marked `always` (event records, releases), which run so
// that no other stream waiting on this one can hang; synchronize() rethrows and clears the
// error. Eager: the failing call throws at once and nothing is sticky.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "tessel/runtime/backend.hpp"

namespace tessel {
namespace detail {

class CpuStream final : public Stream {
 public:
  CpuStream(StreamMode mode, std::string name);
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

  const StreamMode mode_;
  const std::string name_;
  const char* label_ = nullptr;  // host side: the label for tasks enqueued next

  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_idle_;
  std::deque<Task> queue_;  // guarded by mu_
  uint64_t enqueued_ = 0;   // guarded by mu_
  uint64_t finished_ = 0;   // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::exception_ptr error_;  // guarded by mu_
  std::string error_msg_;     // guarded by mu_
  std::atomic<bool> failed_{false};
  std::thread thread_;
};

// The CpuStream behind s; throws RuntimeError naming `who` when s belongs to another backend.
CpuStream& cpu_stream(Stream& s, const char* who);

}  // namespace detail
}  // namespace tessel
