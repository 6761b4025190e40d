// bench_collectives.cpp — bandwidth of the in-process thread communicator, nccl-tests style.
//
// BM_Collective/<kind>/<bytes>[/devices:2]: one collective over an 8-device (or 2-device) world (one thread per
// device, all devices in one group). <bytes> is the "size" of nccl-tests for that
// collective, and the counters are defined exactly as there (doc/PERFORMANCE.md of
// nccl-tests), in GB/s = 1e9 bytes/s:
//   algbw = size / time
//   busbw = algbw · factor, factor = 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
//           reduce_scatter and all_to_all, 1 for collective_permute (like sendrecv)
//   size  = all_gather: the whole recv buffer (each rank sends size/n);
//           reduce_scatter: the whole send buffer (each rank receives size/n);
//           all_reduce, all_to_all, collective_permute: the per-rank buffer.
// BM_Memcpy/<bytes>: one thread copying <bytes>; counter bw = bytes / time, the yardstick
// busbw is compared against (a one-copy collective can at best approach the machine's
// aggregate copy bandwidth, shared by all device threads).
//
// The 8 device threads live for the whole run (a persistent pool with a start/done
// handshake), so thread creation is never timed; buffers are allocated and touched by their
// own device thread before timing. Time is measured by the driving thread around one
// collective on all devices (manual time, hence the "/manual_time" suffix Google Benchmark
// adds to the names), so it includes the handshake (a few µs).
//
// No BENCHMARK_MAIN here: another file of bench/ provides it.
#include <benchmark/benchmark.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"

namespace {

using tessel::Communicator;
using tessel::DType;
using tessel::ReduceOp;

constexpr int kDevices = 8;

// Persistent device threads of one ThreadWorld; run(job) runs job(device) on all of them.
class DevicePool {
 public:
  explicit DevicePool(int n)
      : n_(n), world_(tessel::Mesh({{"d", n}})), send_(static_cast<std::size_t>(n)),
        recv_(static_cast<std::size_t>(n)) {
    for (int d = 0; d < n; ++d) comms_.push_back(world_.communicator(d, {"d"}));
    // Eager streams: the collective runs on the device thread that enqueues it (the busbw of
    // the protocol itself, without a stream worker's hand-off).
    for (int d = 0; d < n; ++d) streams_.push_back(backend_->create_stream("bench"));
    for (int d = 0; d < n; ++d) threads_.emplace_back([this, d] { loop(d); });
  }
  ~DevicePool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return n_; }
  Communicator& comm(int d) { return *comms_[static_cast<std::size_t>(d)]; }
  tessel::Stream& stream(int d) { return *streams_[static_cast<std::size_t>(d)]; }
  char* send(int d) { return send_[static_cast<std::size_t>(d)].data(); }
  char* recv(int d) { return recv_[static_cast<std::size_t>(d)].data(); }

  // Grows every device's send and recv buffers to `bytes`, in the device's own thread.
  void reserve(std::size_t bytes) {
    run([&](int d) {
      auto& s = send_[static_cast<std::size_t>(d)];
      auto& r = recv_[static_cast<std::size_t>(d)];
      if (s.size() < bytes) s.resize(bytes, 1);
      if (r.size() < bytes) r.resize(bytes, 0);
      // Small positive floats: sums stay finite whatever the dtype interpretation.
      for (std::size_t i = 0; i < bytes; i += 4096) s[i] = 1;
    });
  }

  // Runs job(device) on every device thread; returns the first error ("" when none).
  std::string run(const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lk(mu_);
    job_ = &job;
    running_ = n_;
    error_.clear();
    ++epoch_;
    start_cv_.notify_all();
    done_cv_.wait(lk, [&] { return running_ == 0; });
    return error_;
  }

 private:
  void loop(int d) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        start_cv_.wait(lk, [&] { return stop_ || epoch_ != seen; });
        if (stop_) return;
        seen = epoch_;
        job = job_;
      }
      std::string err;
      try {
        (*job)(d);
      } catch (const std::exception& e) {
        err = e.what();
        world_.abort(err);
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (!err.empty() && error_.empty()) error_ = err;
      if (--running_ == 0) done_cv_.notify_one();
    }
  }

  const int n_;
  tessel::ThreadWorld world_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<tessel::Backend> backend_ = tessel::make_cpu_backend({tessel::StreamMode::Eager, 1});
  std::vector<std::unique_ptr<tessel::Stream>> streams_;
  std::vector<std::vector<char>> send_, recv_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t epoch_ = 0;
  int running_ = 0;
  bool stop_ = false;
  std::string error_;
};

DevicePool& pool(int n) {
  // benchmark-only; the library itself has no globals
  static DevicePool p8(kDevices);
  static DevicePool p2(2);
  return n == 2 ? p2 : p8;
}

enum class Kind { AllGather, ReduceScatter, AllReduce, AllToAll, Permute };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllReduce: return "all_reduce";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Permute: return "collective_permute";
  }
  return "?";
}

double bus_factor(Kind k, int n) {
  switch (k) {
    case Kind::AllReduce: return 2.0 * (n - 1) / n;
    case Kind::AllGather:
    case Kind::ReduceScatter:
    case Kind::AllToAll: return static_cast<double>(n - 1) / n;
    case Kind::Permute: return 1.0;
  }
  return 1.0;
}

void bm_collective(benchmark::State& state, Kind kind, std::size_t size, int devices) {
  DevicePool& p = pool(devices);
  const int n = p.size();
  p.reserve(size);
  const std::size_t block = size / static_cast<std::size_t>(n);  // bytes per rank block
  const std::function<void(int)> job = [&](int d) {
    Communicator& c = p.comm(d);
    tessel::Stream& st = p.stream(d);
    switch (kind) {
      case Kind::AllGather:
        c.all_gather(p.send(d), p.recv(d), block, st);
        break;
      case Kind::ReduceScatter:
        c.reduce_scatter(p.send(d), p.recv(d), block / 4, DType::f32, ReduceOp::Sum, st);
        break;
      case Kind::AllReduce:
        c.all_reduce(p.send(d), p.recv(d), size / 4, DType::f32, ReduceOp::Sum, st);
        break;
      case Kind::AllToAll:
        c.all_to_all(p.send(d), p.recv(d), block, st);
        break;
      case Kind::Permute:
        c.collective_permute(p.send(d), (c.rank() + 1) % n, p.recv(d), (c.rank() + n - 1) % n,
                             size, st);
        break;
    }
  };
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = p.run(job);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!err.empty()) {
      state.SkipWithError(err.c_str());
      break;
    }
    state.SetIterationTime(s);
    total += s;
  }
  if (total > 0) {
    const double algbw = static_cast<double>(size) * static_cast<double>(state.iterations()) /
                         total / 1e9;
    state.counters["algbw"] = algbw;
    state.counters["busbw"] = algbw * bus_factor(kind, n);
  }
  state.SetLabel(std::to_string(n) + " devices");
}

void bm_memcpy(benchmark::State& state, std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    total += s;
  }
  if (total > 0)
    state.counters["bw"] =
        static_cast<double>(bytes) * static_cast<double>(state.iterations()) / total / 1e9;
}

const bool kRegistered = [] {
  const int64_t sizes[] = {int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20};
  for (Kind k : {Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce, Kind::AllToAll,
                 Kind::Permute}) {
    for (int64_t s : sizes) {
      benchmark::RegisterBenchmark(
          (std::string("BM_Collective/") + kind_name(k) + "/" + std::to_string(s)).c_str(),
          bm_collective, k, static_cast<std::size_t>(s), kDevices)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      // The same on 2 devices: one device thread per core of a 2-core machine, where a
      // one-copy collective can reach memcpy bandwidth per device.
      benchmark::RegisterBenchmark(
          (std::string("BM_Collective/") + kind_name(k) + "/" + std::to_string(s) + "/devices:2").c_str(),
          bm_collective, k, static_cast<std::size_t>(s), 2)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int64_t s : sizes) {
    benchmark::RegisterBenchmark(("BM_Memcpy/" + std::to_string(s)).c_str(), bm_memcpy,
                                 static_cast<std::size_t>(s))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
