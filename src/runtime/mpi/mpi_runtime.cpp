// MpiRuntime: local devices on a ThreadRuntime, groups that span processes on MPI
// communicators split per axis group, an abort channel between processes.
//
// Threading: MPI_THREAD_MULTIPLE. Every device's communication stream has its own worker
// thread, and each worker issues its own nonblocking MPI calls and tests them. The
// alternative (MPI_THREAD_SERIALIZED with one progress thread that all workers hand their
// calls to) adds a hop and a queue per call and makes the stream order of one device depend
// on the others' traffic; Open MPI 4.1 supports MPI_THREAD_MULTIPLE on its shared-memory and
// TCP transports, and a worker blocked waiting for a peer then never holds up another
// device's collectives. One more thread per process (the watcher) waits for abort messages.
//
// The collectives of groups that span processes: mpi_communicator.cpp; the MPI process group
// (bootstrap exchanges): mpi_process_group.cpp; what they share: mpi_common.hpp.
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "mpi_common.hpp"

namespace tessel {

// ---- MpiRuntime::Impl --------------------------------------------------------------------------

void MpiRuntime::Impl::fail(const std::string& reason, bool remote) {
  std::vector<detail::MpiWorld*> ws;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (failed.load()) return;
    failure = reason;
    failed.store(true);
    detail::session().failed.store(true);
    ws = worlds;
    if (!remote) {
      abort_msg = reason.substr(0, detail::kAbortMax - 1);
      detail::isend_abort_to_peers(abort_msg, rank, size, ctrl, abort_sends);
    }
  }
  for (auto* w : ws) w->abort_local(reason);
  if (!remote) {
    // Drive the abort messages out (bounded): MPI delivers a send only while its sender
    // makes progress, and a process usually exits right after its failure — without this,
    // a peer could miss the abort and wait for its timeout instead.
    const double deadline = detail::now_s() + 5.0;
    while (true) {
      int flag = 0;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (abort_sends.empty() ||
            MPI_Testall(static_cast<int>(abort_sends.size()), abort_sends.data(), &flag, MPI_STATUSES_IGNORE) !=
                MPI_SUCCESS)
          break;
      }
      if (flag || detail::now_s() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

void MpiRuntime::Impl::watch() {
  std::vector<char> buf(detail::kAbortMax);
  MPI_Request req;
  if (MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, MPI_ANY_SOURCE, detail::kAbortTag, ctrl, &req) !=
      MPI_SUCCESS)
    return;
  const bool liveness = !peers.empty();
  double next_check = 0;
  while (!stop.load()) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&req, &flag, &st) != MPI_SUCCESS) break;
    if (flag) {
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      fail(std::string(buf.data(), static_cast<std::size_t>(std::max(n, 0))), true);
      if (MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, MPI_ANY_SOURCE, detail::kAbortTag, ctrl, &req) !=
          MPI_SUCCESS)
        return;
    }
    // A dead peer on this host is noticed within about kLivenessPeriod instead of at the timeout.
    if (liveness && !failed.load() && detail::now_s() >= next_check) {
      next_check = detail::now_s() + detail::kLivenessPeriod;
      check_peers();
    }
    // 5 ms: a peer's abort reaches a waiting worker within that, with fewer wake-ups on
    // oversubscribed cores (bench/results/2026-11-27T0330-2core-cpu-pool-processes).
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  MPI_Cancel(&req);
  if (failed.load())
    MPI_Request_free(&req);
  else
    MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void MpiRuntime::Impl::exchange(const char* what, const std::function<void(int, MPI_Request*)>& post_recv,
                                const void* send, int send_bytes, int tag) {
  std::vector<MPI_Request> reqs;
  std::vector<int> from;  // per request: the rank it receives from, or -1 for a send
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    reqs.emplace_back();
    from.push_back(r);
    post_recv(r, &reqs.back());
    reqs.emplace_back();
    from.push_back(-1);
    TESSEL_MPI(MPI_Isend(send, send_bytes, MPI_BYTE, r, tag, host, &reqs.back()));
  }
  const double deadline = detail::finite_timeout(timeout) ? detail::now_s() + timeout : 0;
  while (true) {
    int flag = 0;
    TESSEL_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) return;
    std::string reason;
    if (failed.load()) {
      std::lock_guard<std::mutex> lk(mu);
      reason = fmt::format("rank {}: {} stopped: {}", rank, what, failure);
    } else if (deadline > 0 && detail::now_s() > deadline) {
      std::vector<std::string> missing;
      for (std::size_t k = 0; k < reqs.size(); ++k) {
        int done = 1;
        if (from[k] >= 0 && reqs[k] != MPI_REQUEST_NULL) MPI_Test(&reqs[k], &done, MPI_STATUS_IGNORE);
        if (!done) missing.push_back(std::to_string(from[k]));
      }
      reason = fmt::format("rank {}: {} timed out after {} s waiting for rank{} {} (did {} exit, or not call "
                           "the same load/to_host? MpiRuntimeOptions::timeout_s / TESSEL_MPI_TIMEOUT_S set the limit)",
                           rank, what, timeout, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                           missing.size() == 1 ? "it" : "they");
      fail(reason, false);
    }
    if (!reason.empty()) {
      for (auto& r : reqs)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
      throw RuntimeError(reason);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ---- MpiRuntime ------------------------------------------------------------------------------

bool mpi_compiled() { return true; }

MpiRuntime::MpiRuntime(MpiRuntimeOptions options) : impl_(std::make_shared<Impl>()) {
  Impl& im = *impl_;
  im.opts = std::move(options);
  if (im.opts.kernel_threads < 1)
    throw RuntimeError(fmt::format("MpiRuntime: kernel_threads must be >= 1, got {}", im.opts.kernel_threads));
  double t = im.opts.timeout_s;
  if (t < 0) {
    t = 300;
    if (const char* e = std::getenv("TESSEL_MPI_TIMEOUT_S")) {
      char* end = nullptr;
      t = std::strtod(e, &end);
      if (!end || *end || std::isnan(t) || t < 0)
        throw RuntimeError(fmt::format("MpiRuntime: TESSEL_MPI_TIMEOUT_S='{}' is not a number of seconds >= 0", e));
    }
  }
  if (std::isnan(t)) throw RuntimeError("MpiRuntime: timeout_s is NaN");
  im.timeout = t;
  detail::Session& s = detail::session();
  if (s.failed.load())
    throw RuntimeError("MpiRuntime: an earlier MpiRuntime of this process failed; a failed multi-process job cannot "
                       "continue (restart it)");
  im.rank = s.rank;
  im.size = s.size;
  im.local_rank = s.local_rank;
  MPI_Comm base = MPI_COMM_WORLD;
  if (!im.opts.ranks.empty()) {
    const std::vector<int>& rs = im.opts.ranks;
    im.group = detail::comm_of_ranks(rs, im.opts.group_tag, s.rank, s.size, "MpiRuntime", "runtime's");
    base = im.group;
    im.rank = static_cast<int>(std::find(rs.begin(), rs.end(), s.rank) - rs.begin());
    im.size = static_cast<int>(rs.size());
    im.local_rank = detail::node_rank(base, im.rank);
  }
  TESSEL_MPI(MPI_Comm_dup(base, &im.ctrl));
  TESSEL_MPI(MPI_Comm_set_errhandler(im.ctrl, MPI_ERRORS_RETURN));
  TESSEL_MPI(MPI_Comm_dup(base, &im.host));
  TESSEL_MPI(MPI_Comm_set_errhandler(im.host, MPI_ERRORS_RETURN));
  // Liveness (mpi_liveness.cpp): who every process is, so the watcher notices a dead one.
  bool watch = im.opts.watch_peers;
  if (const char* e = std::getenv("TESSEL_MPI_WATCH_PEERS")) {
    if (std::string(e) != "0" && std::string(e) != "1")
      throw RuntimeError(fmt::format("MpiRuntime: TESSEL_MPI_WATCH_PEERS='{}' is not 0 or 1", e));
    watch = std::string(e) == "1";
  }
  if (im.size > 1 && watch) {
    detail::ProcessIdentity me = detail::ProcessIdentity::self();
    im.marked = detail::runtime_started(me);
    if (!im.marked) me.start = 0;  // no marker: the peers cannot tell our clean end, so they do not watch us
    im.peers.resize(static_cast<std::size_t>(im.size));
    TESSEL_MPI(MPI_Allgather(&me, static_cast<int>(sizeof me), MPI_BYTE, im.peers.data(), static_cast<int>(sizeof me),
                             MPI_BYTE, im.host));
    im.watched.assign(static_cast<std::size_t>(im.size), 0);
    im.departed.assign(static_cast<std::size_t>(im.size), 0);
    for (int r = 0; r < im.size; ++r) {
      const detail::ProcessIdentity& p = im.peers[static_cast<std::size_t>(r)];
      // Every peer made its marker before the exchange: one not visible here (another /dev/shm)
      // cannot be told apart from a clean end, so it is not watched.
      im.watched[static_cast<std::size_t>(r)] = r != im.rank && me.same_host(p) && p.died_live();
    }
  }
  Impl* raw = impl_.get();
  im.watcher = std::thread([raw] { raw->watch(); });
}

MpiRuntime::~MpiRuntime() {
  Impl& im = *impl_;
  // Programs loaded here may outlive it: their runs in flight end first, later ones throw.
  retire(fmt::format("MpiRuntime of rank {} of {}", im.rank, im.size));
  im.local.reset();  // no job may be running
  im.stop.store(true);
  if (im.watcher.joinable()) im.watcher.join();
  // A clean end (the marker goes with the last runtime): the peers do not take this process's
  // exit for a death.
  if (im.marked) detail::runtime_ended(im.peers[static_cast<std::size_t>(im.rank)], !im.failed.load());
  if (!im.failed.load()) {
    MPI_Comm_free(&im.ctrl);
    MPI_Comm_free(&im.host);
    if (im.group != MPI_COMM_NULL) MPI_Comm_free(&im.group);
  } else {
    for (auto& q : im.abort_sends)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);  // completed ones are already null
  }
}

int MpiRuntime::rank() const { return impl_->rank; }
int MpiRuntime::world_size() const { return impl_->size; }
int MpiRuntime::local_rank() const { return impl_->local_rank; }
double MpiRuntime::timeout_s() const { return impl_->timeout; }
bool MpiRuntime::failed() const { return impl_->failed.load(); }
std::string MpiRuntime::failure() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->failure;
}
void MpiRuntime::abort(const std::string& reason) {
  std::vector<detail::MpiWorld*> ws;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    ws = impl_->worlds;
  }
  if (ws.empty()) impl_->fail(fmt::format("rank {}: {}", impl_->rank, reason), false);
  for (auto* w : ws) w->abort(reason);
}

std::vector<int64_t> MpiRuntime::devices_for(const Mesh& mesh) {
  Impl& im = *impl_;
  const int64_t n = mesh.num_devices();
  std::vector<int> owner(static_cast<std::size_t>(n));
  if (im.opts.process_of_device.empty()) {
    if (n % im.size != 0)
      throw RuntimeError(fmt::format("load: the world size {} (mpirun -np) does not divide the {} devices of mesh {}; "
                                     "launch a number of processes that divides {} (each owns a block of devices) "
                                     "or give MpiRuntimeOptions::process_of_device",
                                     im.size, n, mesh.to_string(), n));
    const int64_t k = n / im.size;
    for (int64_t p = 0; p < n; ++p) owner[static_cast<std::size_t>(p)] = static_cast<int>(p / k);
  } else {
    const auto& m = im.opts.process_of_device;
    if (static_cast<int64_t>(m.size()) != n)
      throw RuntimeError(fmt::format("load: process_of_device has {} entries but mesh {} has {} devices", m.size(),
                                     mesh.to_string(), n));
    std::vector<int> count(static_cast<std::size_t>(im.size), 0);
    for (int64_t p = 0; p < n; ++p) {
      const int r = m[static_cast<std::size_t>(p)];
      if (r < 0 || r >= im.size)
        throw RuntimeError(fmt::format("load: process_of_device[{}] = {} is not a rank of the world of {}", p, r,
                                       im.size));
      owner[static_cast<std::size_t>(p)] = r;
      ++count[static_cast<std::size_t>(r)];
    }
    for (int r = 0; r < im.size; ++r)
      if (count[static_cast<std::size_t>(r)] == 0)
        throw RuntimeError(fmt::format("load: rank {} owns no device of mesh {} in process_of_device (every process "
                                       "of the world of {} must own one)",
                                       r, mesh.to_string(), im.size));
  }
  std::vector<int64_t> mine;
  for (int64_t p = 0; p < n; ++p)
    if (owner[static_cast<std::size_t>(p)] == im.rank) mine.push_back(p);
  if (im.local) {
    if (owner != im.owner)
      throw RuntimeError(fmt::format("load: this MpiRuntime runs meshes of {} devices as devices {} of rank {}; mesh {} "
                                     "would need another placement (make another MpiRuntime for it)",
                                     im.mesh_devices, shape_str(im.mine), im.rank, mesh.to_string()));
    return mine;
  }
  ThreadRuntimeOptions ro;
  ro.stream_mode = im.opts.stream_mode;
  ro.kernel_threads = im.opts.kernel_threads;
  ro.inline_max_comm_bytes = im.opts.inline_max_comm_bytes;
  im.local = std::make_unique<ThreadRuntime>(static_cast<int64_t>(mine.size()), ro);
  im.owner = owner;
  im.mine = mine;
  im.mesh_devices = n;
  return mine;
}

DeviceThreads& MpiRuntime::local() {
  if (!impl_->local)
    throw RuntimeError("MpiRuntime: no devices yet (load a program first: the mesh decides which devices are here)");
  return *impl_->local;
}

std::unique_ptr<CollectiveWorld> MpiRuntime::make_world(const Mesh& mesh,
                                                        const std::vector<std::vector<std::string>>& axes,
                                                        double timeout_s) {
  Impl& im = *impl_;
  if (im.failed.load())
    throw RuntimeError(fmt::format("MpiRuntime (rank {}): the job failed earlier ({}); a failed multi-process job "
                                   "cannot continue: restart it",
                                   im.rank, failure()));
  if (std::isnan(timeout_s) || timeout_s < 0)
    throw RuntimeError(fmt::format("MpiRuntime: timeout must be >= 0 seconds, got {}", timeout_s));
  devices_for(mesh);
  if (im.size > 1) {
    // Every process arrives (with the deadline, naming a missing one) before any waits in
    // the communicators' creation.
    try {
      allgather_host("make_world");
    } catch (const RuntimeError& e) {
      throw RuntimeError(fmt::format("load, before making the communicators: {}", e.what()));
    }
  }
  return std::make_unique<detail::MpiWorld>(impl_, mesh, axes, timeout_s > 0 ? timeout_s : im.timeout);
}

std::vector<std::string> MpiRuntime::allgather_host(const std::string& mine) {
  Impl& im = *impl_;
  if (im.failed.load())
    throw RuntimeError(fmt::format("rank {}: a host exchange (allgather_host) stopped before it began: the job failed earlier ({})", im.rank, failure()));
  if (im.size == 1) return {mine};
  // Point to point rather than MPI_Iallgather(v): when a process never comes (it exited before
  // load, or loads later than the deadline), the receives still open name it. The sizes
  // first (8 bytes from every rank), then the bytes, each phase waited for with the runtime's
  // deadline. Tags of their own on the host communicator (collectives there never match them).
  constexpr int kSizeTag = 7301, kDataTag = 7302;
  const std::size_t n = static_cast<std::size_t>(im.size);
  std::vector<unsigned long long> sizes(n, 0);
  const unsigned long long my_size = mine.size();
  sizes[static_cast<std::size_t>(im.rank)] = my_size;
  im.exchange("a host exchange (allgather_host: sizes)",
        [&](int r, MPI_Request* q) {
          TESSEL_MPI(MPI_Irecv(&sizes[static_cast<std::size_t>(r)], static_cast<int>(sizeof(unsigned long long)),
                               MPI_BYTE, r, kSizeTag, im.host, q));
        },
        &my_size, static_cast<int>(sizeof my_size), kSizeTag);
  std::vector<std::string> out(n);
  out[static_cast<std::size_t>(im.rank)] = mine;
  for (int r = 0; r < im.size; ++r)
    if (r != im.rank) {
      const unsigned long long b = sizes[static_cast<std::size_t>(r)];
      if (b > (1ull << 30))
        throw RuntimeError(fmt::format("rank {}: allgather_host: rank {} announces {} bytes (more than 1 GiB: not a "
                                       "host exchange of this job)",
                                       im.rank, r, b));
      out[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(b), '\0');
    }
  im.exchange("a host exchange (allgather_host)",
        [&](int r, MPI_Request* q) {
          std::string& buf = out[static_cast<std::size_t>(r)];
          TESSEL_MPI(MPI_Irecv(buf.data(), detail::int_count(buf.size(), "allgather_host"), MPI_BYTE, r, kDataTag,
                               im.host, q));
        },
        mine.data(), detail::int_count(mine.size(), "allgather_host"), kDataTag);
  return out;
}

std::vector<HostTensor> MpiRuntime::allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) {
  Impl& im = *impl_;
  devices_for(mesh);
  if (local.size() != im.mine.size())
    throw RuntimeError(fmt::format("MpiRuntime: {} local shards for {} local devices", local.size(), im.mine.size()));
  if (im.failed.load())
    throw RuntimeError(fmt::format("rank {}: to_host stopped: the job failed earlier ({})", im.rank, failure()));
  if (im.size == 1) return local;
  const DType dt = local.empty() ? DType::f32 : local[0].dtype();
  const Shape shape = local.empty() ? Shape{} : local[0].shape();
  const std::size_t bytes = local.empty() ? 0 : local[0].bytes();
  std::vector<char> send(bytes * local.size());
  for (std::size_t i = 0; i < local.size(); ++i) std::memcpy(send.data() + i * bytes, local[i].data(), bytes);
  std::vector<int> counts(static_cast<std::size_t>(im.size), 0), displs(static_cast<std::size_t>(im.size), 0);
  for (int64_t p = 0; p < mesh.num_devices(); ++p) counts[static_cast<std::size_t>(im.owner[p])] += 1;
  std::size_t total = 0;
  for (int r = 0; r < im.size; ++r) {
    const std::size_t c = static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]) * bytes;
    counts[static_cast<std::size_t>(r)] = detail::int_count(c, "to_host");
    displs[static_cast<std::size_t>(r)] = detail::int_count(total, "to_host");
    total += c;
  }
  std::vector<char> recv(total);
  // Point to point (not MPI_Iallgatherv): a timeout names the ranks whose shards never came.
  constexpr int kShardTag = 7303;
  std::memcpy(recv.data() + displs[static_cast<std::size_t>(im.rank)], send.data(), send.size());
  im.exchange("to_host (gathering every process's shards)",
              [&](int r, MPI_Request* q) {
                TESSEL_MPI(MPI_Irecv(recv.data() + displs[static_cast<std::size_t>(r)],
                                     counts[static_cast<std::size_t>(r)], MPI_BYTE, r, kShardTag, im.host, q));
              },
              send.data(), detail::int_count(send.size(), "to_host"), kShardTag);
  std::vector<HostTensor> out;
  std::vector<std::size_t> next(static_cast<std::size_t>(im.size), 0);
  for (int64_t p = 0; p < mesh.num_devices(); ++p) {
    const int r = im.owner[static_cast<std::size_t>(p)];
    HostTensor t(dt, shape);
    std::memcpy(t.data(), recv.data() + displs[static_cast<std::size_t>(r)] + next[static_cast<std::size_t>(r)]++ * bytes,
                bytes);
    out.push_back(std::move(t));
  }
  return out;
}

void abort_job_on_error(int status, double grace_s) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  if (!initialized) return;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) return;
  std::fflush(stdout);
  std::fflush(stderr);
  if (grace_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
  MPI_Abort(MPI_COMM_WORLD, status == 0 ? 1 : status);
  std::_Exit(status == 0 ? 1 : status);  // MPI_Abort does not return; should it, do not run atexit handlers
}

}  // namespace tessel
