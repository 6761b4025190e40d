// The NCCL collective world (built with TESSEL_WITH_NCCL; otherwise make_nccl_world throws).
//
// One world communicator per local device (ncclCommInitAll: this process drives every device
// of the mesh, a thread each), then, the first time an axis set is asked for, one
// ncclCommSplit per device inside one ncclGroupStart/End (a single thread drives all ranks of
// the split, which NCCL requires to be grouped): colour = index of the device's axis group in
// Mesh::groups(axes) and key = its index in the group, a pure function of the mesh, identical
// on every rank (docs/backend-cuda.md). Collectives are enqueued on the caller's stream (the
// executor's comm stream, ordered with compute by the program's events): all-gather,
// reduce-scatter and all-reduce (sum, max) directly; all-to-all and collective-permute as
// grouped ncclSend/ncclRecv.
//
// NCCL has no per-operation timeout: a watchdog thread polls ncclCommGetAsyncError on every
// communicator and, when a collective has been pending (its end event not reached) for longer
// than the timeout, aborts every communicator (ncclCommAbort), so blocked streams return and
// the run fails with the reason instead of hanging. Across processes the abort is posted on
// the ProcessGroup's abort channel, and each watchdog polls it: a failure on one process
// aborts every process's communicators with "process r aborted: <reason>".
//
// One process per GPU under mpirun / a launcher (issue 8, item 4b): each process owns some
// positions and joins with ncclCommInitRank on a unique id made by one process and shared
// through a ProcessGroup (MPI or a shared-file rendezvous; CudaRuntime does it); the splits
// are then collective over the processes, each splitting its own devices.
#include <fmt/format.h>

#include "cuda_backend.hpp"

#ifdef TESSEL_HAVE_NCCL
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <shared_mutex>
#include <thread>

namespace tessel::cuda {
namespace {

#define TESSEL_NCCL_CHECK(expr)                                                                         \
  do {                                                                                                  \
    ncclResult_t _r = (expr);                                                                           \
    if (_r != ncclSuccess)                                                                              \
      throw RuntimeError(fmt::format("nccl: {} failed: {} at {}:{}", #expr, ncclGetErrorString(_r), __FILE__, __LINE__)); \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

class NcclWorld;

// A collective in flight, for the watchdog: its end event and when it was enqueued.
struct Pending {
  cudaEvent_t done = nullptr;
  std::chrono::steady_clock::time_point since;
  std::string what;
  bool active = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(NcclWorld& w, ncclComm_t comm, int device, int rank, int size, std::string group)
      : w_(w), comm_(comm), device_(device), rank_(rank), size_(size), group_(std::move(group)) {
    DeviceGuard g(device_);
    TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&pending_.done, cudaEventDisableTiming));
    TESSEL_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
  }
  ~NcclCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    call("all_gather", s, [&](cudaStream_t st) { return ncclAllGather(send, recv, bytes, ncclUint8, comm_, st); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, Stream& s) override {
    call("reduce_scatter", s,
         [&](cudaStream_t st) { return ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, st); });
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, Stream& s) override {
    call("all_reduce", s,
         [&](cudaStream_t st) { return ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, st); });
  }
  void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    call("all_to_all", s, [&](cudaStream_t st) {
      ncclResult_t r = ncclGroupStart();
      for (int j = 0; j < size_ && r == ncclSuccess; ++j) {
        r = ncclSend(static_cast<const char*>(send) + std::size_t(j) * bytes, bytes, ncclUint8, j, comm_, st);
        if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(recv) + std::size_t(j) * bytes, bytes, ncclUint8, j, comm_, st);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  void collective_permute(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes,
                          Stream& s) override {
    call("collective_permute", s, [&](cudaStream_t st) {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess && send_to >= 0) r = ncclSend(send, bytes, ncclUint8, send_to, comm_, st);
      if (r == ncclSuccess && recv_from >= 0) r = ncclRecv(recv, bytes, ncclUint8, recv_from, comm_, st);
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  void send(const void* buf, std::size_t bytes, int peer, Stream& s) override {
    call("send", s, [&](cudaStream_t st) { return ncclSend(buf, bytes, ncclUint8, peer, comm_, st); });
  }
  void recv(void* buf, std::size_t bytes, int peer, Stream& s) override {
    call("recv", s, [&](cudaStream_t st) { return ncclRecv(buf, bytes, ncclUint8, peer, comm_, st); });
  }
  void broadcast(void* buf, std::size_t bytes, int root, Stream& s) override {
    call("broadcast", s, [&](cudaStream_t st) { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, st); });
  }
  void barrier(Stream& s) override {
    call("barrier", s, [&](cudaStream_t st) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, st);
    });
  }
  void group_start() override;
  void group_end() override;
  void abort(const std::string& reason) override;

  // For the watchdog (under its lock): true when a collective has been pending too long.
  bool overdue(double timeout, std::string& what) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!pending_.active) return false;
    if (cudaEventQuery(pending_.done) == cudaSuccess) {
      pending_.active = false;
      return false;
    }
    cudaGetLastError();  // cudaErrorNotReady
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - pending_.since).count();
    if (timeout > 0 && waited > timeout) {
      what = fmt::format("{} on device {} (rank {} of {} in group {}) pending for {:.3g} s", pending_.what, device_, rank_,
                         size_, group_, waited);
      return true;
    }
    return false;
  }
  ncclComm_t comm() const { return comm_; }

 private:
  template <class F>
  void call(const char* what, Stream& s, F&& f);

  NcclWorld& w_;
  ncclComm_t comm_;
  int device_, rank_, size_;
  std::string group_;
  std::mutex mu_;
  Pending pending_;
  void* barrier_buf_ = nullptr;
  int group_depth_ = 0;
  // Held shared from the outermost group_start to its group_end: a group's calls are issued at
  // its end, so the whole group is one call for the world's guard (NcclWorld::calls_mutex).
  std::shared_lock<std::shared_timed_mutex> group_guard_;
};

class NcclWorld : public CollectiveWorld {
 public:
  // This process drives the mesh positions `positions` (local index i on GPU gpus[i]).
  // unique_id empty: every position is local, one ncclCommInitAll. Otherwise one
  // ncclCommInitRank per local position (rank = position), grouped, with the id every
  // process of the job was given.
  NcclWorld(const Mesh& mesh, std::vector<int64_t> positions, std::vector<int> gpus, const std::string& unique_id,
            const CudaWorldOptions& o)
      : mesh_(mesh), positions_(std::move(positions)), gpus_(std::move(gpus)), options_(o) {
    const int n = static_cast<int>(mesh_.num_devices());
    const int local = static_cast<int>(positions_.size());
    if (gpus_.size() != positions_.size())
      throw RuntimeError(fmt::format("nccl world: {} GPUs given for {} local devices of mesh {}", gpus_.size(), local,
                                     mesh_.to_string()));
    local_of_.assign(static_cast<std::size_t>(n), -1);
    for (int i = 0; i < local; ++i) {
      const int64_t p = positions_[static_cast<std::size_t>(i)];
      if (p < 0 || p >= n || local_of_[static_cast<std::size_t>(p)] >= 0)
        throw RuntimeError(fmt::format("nccl world: local device {} has position {}, not a fresh position of mesh {}",
                                       i, p, mesh_.to_string()));
      local_of_[static_cast<std::size_t>(p)] = i;
    }
    // NCCL puts one rank per GPU (it would fail with "Duplicate GPU detected"): say which
    // positions collide and what to use instead.
    for (int i = 0; i < local; ++i)
      for (int j = 0; j < i; ++j)
        if (gpus_[static_cast<std::size_t>(i)] == gpus_[static_cast<std::size_t>(j)])
          throw RuntimeError(fmt::format(
              "nccl world: mesh positions {} and {} of mesh {} are both on GPU {}; NCCL needs one GPU per position "
              "(give each position its own GPU, or make_cuda_virtual_world for several positions on one GPU)",
              positions_[static_cast<std::size_t>(j)], positions_[static_cast<std::size_t>(i)], mesh_.to_string(),
              gpus_[static_cast<std::size_t>(i)]));
    world_.resize(static_cast<std::size_t>(local));
    if (unique_id.empty()) {
      if (local != n)
        throw RuntimeError(fmt::format("nccl world: {} of the {} devices of mesh {} are local and no NCCL unique id "
                                       "was given; a multi-process world needs one (nccl_unique_id())",
                                       local, n, mesh_.to_string()));
      TESSEL_NCCL_CHECK(ncclCommInitAll(world_.data(), n, gpus_.data()));
    } else {
      ncclUniqueId id;
      if (unique_id.size() != sizeof(id.internal))
        throw RuntimeError(fmt::format("nccl world: the unique id has {} bytes, NCCL's has {}; every process must "
                                       "pass the bytes of one nccl_unique_id()",
                                       unique_id.size(), sizeof(id.internal)));
      std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
      // Several local ranks join in one group (one thread drives them all).
      TESSEL_NCCL_CHECK(ncclGroupStart());
      for (int i = 0; i < local; ++i) {
        DeviceGuard g(gpus_[static_cast<std::size_t>(i)]);
        const ncclResult_t r = ncclCommInitRank(&world_[static_cast<std::size_t>(i)], n, id,
                                                static_cast<int>(positions_[static_cast<std::size_t>(i)]));
        if (r != ncclSuccess) {
          ncclGroupEnd();
          throw RuntimeError(fmt::format("nccl: ncclCommInitRank (rank {} of {}, GPU {}) failed: {}",
                                         positions_[static_cast<std::size_t>(i)], n, gpus_[static_cast<std::size_t>(i)],
                                         ncclGetErrorString(r)));
        }
      }
      TESSEL_NCCL_CHECK(ncclGroupEnd());
    }
    // Notices of an earlier world's abort (this load follows it) are not for this one.
    if (options_.processes)
      try {
        while (options_.processes->poll_abort()) {
        }
      } catch (const std::exception&) {
      }
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclWorld() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // Abort, not destroy: ncclCommDestroy may block forever on unfinished work (the communicators
    // handed out must be gone by now).
    for (auto& [axes, comms] : split_)
      for (ncclComm_t c : comms) ncclCommAbort(c);
    for (ncclComm_t c : world_) ncclCommAbort(c);
  }

  std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) override {
    if (aborted()) throw RuntimeError("nccl world: aborted: " + reason());
    std::lock_guard<std::mutex> lk(split_mu_);
    auto it = split_.find(axes);
    if (it == split_.end()) it = split_.emplace(axes, split(axes)).first;
    const int li = position >= 0 && position < mesh_.num_devices() ? local_of_[static_cast<std::size_t>(position)] : -1;
    if (li < 0)
      throw RuntimeError(fmt::format("nccl world: position {} of mesh {} is not a device of this process", position,
                                     mesh_.to_string()));
    const auto members = mesh_.group(position, axes);
    const int rank = static_cast<int>(std::find(members.begin(), members.end(), position) - members.begin());
    auto c = std::make_unique<NcclCommunicator>(*this, it->second[static_cast<std::size_t>(li)],
                                                gpus_[static_cast<std::size_t>(li)], rank,
                                                static_cast<int>(members.size()), shape_str(members));
    std::lock_guard<std::mutex> lk2(mu_);
    live_.push_back(c.get());
    return c;
  }

  void abort(std::string reason) override { abort_world(std::move(reason), /*from_peer=*/false); }

  // Aborts this process's communicators; unless the abort came from another process, tells
  // the others first (options_.processes), so theirs stop too instead of timing out.
  void abort_world(std::string reason, bool from_peer) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_.exchange(true)) return;
      reason_ = std::move(reason);
    }
    if (!from_peer && options_.processes) {
      try {
        options_.processes->post_abort(reason_);
      } catch (const std::exception&) {
        // best effort: the peers still have their own watchdogs
      }
    }
    // Calls that passed their aborted() check before it was set finish enqueueing first. A call
    // blocked inside NCCL (a peer that never comes) does not: after 2 s the abort goes ahead,
    // since ncclCommAbort is what releases such a call. Calls that come later see aborted().
    std::unique_lock<std::shared_timed_mutex> calls(calls_mu_, std::defer_lock);
    (void)calls.try_lock_for(std::chrono::seconds(2));
    // ncclCommAbort also stops kernels still running on the device: blocked streams return.
    std::lock_guard<std::mutex> lk(split_mu_);
    for (auto& [axes, comms] : split_)
      for (ncclComm_t c : comms) ncclCommAbort(c);
    split_.clear();
    for (ncclComm_t c : world_) ncclCommAbort(c);
    world_.clear();
  }
  bool aborted() const override { return aborted_.load(); }
  std::string reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
  }
  std::string abort_reason() const override { return reason(); }
  void forget(NcclCommunicator* c) {
    std::lock_guard<std::mutex> lk(mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), c), live_.end());
  }

 private:
  // One ncclCommSplit per local device, grouped (one thread drives every local rank here);
  // the other processes split their devices with the same colours (collective over them).
  std::vector<ncclComm_t> split(const std::vector<std::string>& axes) {
    const auto groups = mesh_.groups(axes);
    std::vector<ncclComm_t> out(world_.size(), nullptr);
    TESSEL_NCCL_CHECK(ncclGroupStart());
    for (std::size_t color = 0; color < groups.size(); ++color)
      for (std::size_t key = 0; key < groups[color].size(); ++key) {
        const int li = local_of_[static_cast<std::size_t>(groups[color][key])];
        if (li < 0) continue;  // another process's device
        const auto p = static_cast<std::size_t>(li);
        const ncclResult_t r =
            ncclCommSplit(world_[p], static_cast<int>(color), static_cast<int>(key), &out[p], nullptr);
        if (r != ncclSuccess) {
          ncclGroupEnd();
          throw RuntimeError(fmt::format("nccl: ncclCommSplit for axes {} failed: {}", join(axes, ","),
                                         ncclGetErrorString(r)));
        }
      }
    TESSEL_NCCL_CHECK(ncclGroupEnd());
    return out;
  }

  void watch() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      if (stop_ || aborted_) continue;
      if (options_.processes) {
        std::optional<AbortNotice> n;
        try {
          n = options_.processes->poll_abort();
        } catch (const std::exception&) {
        }
        if (n) {
          lk.unlock();
          abort_world(fmt::format("process {} aborted: {}", n->rank, n->reason), /*from_peer=*/true);
          lk.lock();
          continue;
        }
      }
      std::string what;
      for (NcclCommunicator* c : live_) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm(), &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
          what = fmt::format("NCCL reported an asynchronous error: {}", ncclGetErrorString(async));
          break;
        }
        if (c->overdue(options_.timeout_seconds, what)) {
          what = "timed out: " + what;
          break;
        }
      }
      if (!what.empty()) {
        lk.unlock();
        abort(what);
        lk.lock();
      }
    }
  }

  Mesh mesh_;
  std::vector<int64_t> positions_;  // per local device
  std::vector<int> gpus_;           // per local device
  std::vector<int> local_of_;       // per mesh position: its local device, -1 on another process
  CudaWorldOptions options_;
  std::vector<ncclComm_t> world_;
  std::mutex split_mu_;
  std::map<std::vector<std::string>, std::vector<ncclComm_t>> split_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NcclCommunicator*> live_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  bool stop_ = false;
  std::thread watchdog_;
  // Calls into the communicators hold it shared from their aborted() check through the NCCL
  // call; an abort takes it exclusively before freeing them (ncclCommAbort), so no call uses
  // a communicator the watchdog has freed (finding 10 of issue 22).
  std::shared_timed_mutex calls_mu_;

 public:
  // The shared side, for NcclCommunicator::call.
  std::shared_timed_mutex& calls_mutex() { return calls_mu_; }
};

NcclCommunicator::~NcclCommunicator() {
  w_.forget(this);
  if (pending_.done) cudaEventDestroy(pending_.done);
  if (barrier_buf_) cudaFree(barrier_buf_);
}

void NcclCommunicator::abort(const std::string& reason) { w_.abort(reason); }

void NcclCommunicator::group_start() {
  if (group_depth_ == 0) group_guard_ = std::shared_lock<std::shared_timed_mutex>(w_.calls_mutex());
  TESSEL_NCCL_CHECK(ncclGroupStart());
  ++group_depth_;
}

void NcclCommunicator::group_end() {
  --group_depth_;
  const ncclResult_t r = ncclGroupEnd();
  if (group_depth_ == 0 && group_guard_.owns_lock()) group_guard_.unlock();
  TESSEL_NCCL_CHECK(r);
}

template <class F>
void NcclCommunicator::call(const char* what, Stream& s, F&& f) {
  // The communicator stays alive to the end of the call (inside a group the group holds it).
  std::shared_lock<std::shared_timed_mutex> calls(w_.calls_mutex(), std::defer_lock);
  if (group_depth_ == 0) calls.lock();
  if (w_.aborted()) throw RuntimeError(fmt::format("nccl {}: the world was aborted: {}", what, w_.reason()));
  CudaStream& cs = cuda_stream(s, "nccl communicator");
  DeviceGuard g(device_);
  cs.backend().debug_delay(cs);
  const ncclResult_t r = f(cs.handle());
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string msg = fmt::format("nccl {} on device {} (rank {} of {} in group {}): {}", what, device_, rank_,
                                        size_, group_, ncclGetErrorString(r));
    if (calls.owns_lock()) calls.unlock();  // the abort takes it exclusively
    if (group_guard_.owns_lock()) group_guard_.unlock();
    w_.abort(msg);
    throw RuntimeError(msg);
  }
  if (group_depth_ == 0) {
    std::lock_guard<std::mutex> lk(mu_);
    TESSEL_CUDA_CHECK(cudaEventRecord(pending_.done, cs.handle()));
    pending_.since = std::chrono::steady_clock::now();
    pending_.what = what;
    pending_.active = true;
  }
}

}  // namespace
}  // namespace tessel::cuda

namespace tessel {
bool nccl_available() { return true; }
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int>& gpus,
                                                 const CudaWorldOptions& options) {
  std::vector<int64_t> positions(gpus.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i);
  return std::make_unique<cuda::NcclWorld>(mesh, std::move(positions), gpus, std::string(), options);
}
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int64_t>& positions,
                                                 const std::vector<int>& gpus, const std::string& unique_id,
                                                 const CudaWorldOptions& options) {
  if (unique_id.empty())
    throw RuntimeError(fmt::format("make_nccl_world (mesh {}): empty NCCL unique id; make one with nccl_unique_id() "
                                   "on one process and give every process its bytes",
                                   mesh.to_string()));
  return std::make_unique<cuda::NcclWorld>(mesh, positions, gpus, unique_id, options);
}
std::string nccl_unique_id() {
  ncclUniqueId id;
  TESSEL_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}
}  // namespace tessel

#else  // no NCCL

namespace tessel {
bool nccl_available() { return false; }
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int>&, const CudaWorldOptions&) {
  throw RuntimeError(fmt::format("make_nccl_world (mesh {}): tessel was built without NCCL; reconfigure with "
                                 "-DTESSEL_WITH_NCCL=ON (and NCCL_ROOT pointing at an NCCL install)",
                                 mesh.to_string()));
}
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int64_t>&, const std::vector<int>& gpus,
                                                 const std::string&, const CudaWorldOptions& options) {
  return make_nccl_world(mesh, gpus, options);  // throws: no NCCL
}
std::string nccl_unique_id() {
  throw RuntimeError("nccl_unique_id: tessel was built without NCCL; reconfigure with -DTESSEL_WITH_NCCL=ON (and "
                     "NCCL_ROOT pointing at an NCCL install)");
}
}  // namespace tessel

#endif
