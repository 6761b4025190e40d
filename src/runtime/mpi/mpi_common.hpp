// mpi_common.hpp (private) — what the MPI runtime's files share: the MPI session (MPI is
// initialised once per process), the check that turns a failed MPI call into an MpiError, the
// abort messages between processes, the runtime state shared by the worlds (MpiRuntime::Impl)
// and the MpiWorld that holds the communicators of the groups spanning processes. Included
// only by src/runtime/mpi/*.cpp built with TESSEL_WITH_MPI (mpi_stub.cpp otherwise), so mpi.h
// never reaches a public header. The definitions here are inline: session() keeps one Session
// per process across the files that include it.
#pragma once

#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"

#define TESSEL_MPI(call) ::tessel::detail::mpi_check((call), #call, __FILE__, __LINE__)

namespace tessel {
namespace detail {

inline void mpi_check(int rc, const char* what, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  throw MpiError(fmt::format("{} failed: {} (error {}, {}:{})", what, std::string(msg, static_cast<std::size_t>(len)),
                             rc, file, line));
}

constexpr int kAbortTag = 7;
constexpr std::size_t kAbortMax = 8192;
// Liveness (mpi_liveness.cpp): how often a runtime's watcher checks its peers on this host.
constexpr double kLivenessPeriod = 0.5;

struct ProcessIdentity {
  char host[64] = {};
  char key[256] = {};
  long pid = 0;
  unsigned long long start = 0;  // start time (clock ticks after boot): tells a reused PID
  static ProcessIdentity self();
  bool same_host(const ProcessIdentity& other) const;
  // For a process on this host: it exited (no such process, a zombie, or its PID reused).
  bool gone() const;
  // Its marker file: present while the process holds a live MpiRuntime.
  std::string marker() const;
  // A gone process whose marker is still there died inside a runtime (not a clean end).
  bool died_live() const;
};
// A runtime of this process starts (creating the marker on the first; false when the marker
// cannot be made, so the peers cannot tell a clean end: they then do not watch this process)
// or ends (removing the marker when the last one ends cleanly).
bool runtime_started(const ProcessIdentity& self);
void runtime_ended(const ProcessIdentity& self, bool clean);

// An abort message to every rank but `self` on `comm` (kAbortTag); the requests are appended
// to `sends` (`msg` must outlive them).
inline void isend_abort_to_peers(const std::string& msg, int self, int size, MPI_Comm comm,
                                 std::vector<MPI_Request>& sends) {
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    MPI_Request q;
    if (MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, r, kAbortTag, comm, &q) == MPI_SUCCESS)
      sends.push_back(q);
  }
}

// This process's rank among the processes of `comm` on its node (MPI_COMM_TYPE_SHARED).
inline int node_rank(MPI_Comm comm, int rank) {
  MPI_Comm node;
  TESSEL_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int r = 0;
  TESSEL_MPI(MPI_Comm_rank(node, &r));
  MPI_Comm_free(&node);
  return r;
}

// A communicator of some of MPI_COMM_WORLD's processes: ranks[i] becomes its rank i. Only the
// processes listed call it; it returns once all of them have (MPI_Comm_create_group, `tag`).
// RuntimeError naming `what` (whose ranks: `whose`) and the list for a rank listed twice or out of range, a caller not
// listed, or a negative tag.
inline MPI_Comm comm_of_ranks(const std::vector<int>& ranks, int tag, int world_rank, int world_size,
                              const char* what, const char* whose) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= world_size)
    throw RuntimeError(fmt::format("{}: ranks [{}] must be distinct ranks of MPI_COMM_WORLD's {} processes", what,
                                   fmt::join(ranks, ", "), world_size));
  if (std::find(ranks.begin(), ranks.end(), world_rank) == ranks.end())
    throw RuntimeError(fmt::format("{}: process {} of MPI_COMM_WORLD is not one of the {} ranks [{}]: only the "
                                   "processes listed make it",
                                   what, world_rank, whose, fmt::join(ranks, ", ")));
  if (tag < 0) throw RuntimeError(fmt::format("{}: the group tag must be >= 0, got {}", what, tag));
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  TESSEL_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  TESSEL_MPI(MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group));
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  TESSEL_MPI(rc);
  TESSEL_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

// MPI is initialised once per process (it cannot be re-initialised after MPI_Finalize):
// on the first MpiRuntime, finalised at exit unless a failure left peers in an unknown state.
struct Session {
  bool we_initialised = false;
  std::atomic<bool> failed{false};
  int rank = 0, size = 1, local_rank = 0;

  Session() {
    int inited = 0, provided = 0;
    TESSEL_MPI(MPI_Initialized(&inited));
    if (!inited) {
      TESSEL_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      we_initialised = true;
    }
    TESSEL_MPI(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE)
      throw MpiError(fmt::format("MpiRuntime: MPI gives thread level {} but tessel needs MPI_THREAD_MULTIPLE (every "
                                 "device's communication stream calls MPI); initialise MPI with MPI_Init_thread("
                                 "MPI_THREAD_MULTIPLE) or let MpiRuntime do it",
                                 provided));
    TESSEL_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    TESSEL_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    TESSEL_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    local_rank = node_rank(MPI_COMM_WORLD, rank);
  }
  ~Session() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (we_initialised && !fin && !failed.load()) MPI_Finalize();
  }
};

inline Session& session() {
  static Session s;
  return s;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline bool finite_timeout(double t) { return t > 0 && std::isfinite(t); }

inline int int_count(std::size_t bytes, const char* what) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw RuntimeError(fmt::format("{}: a message of {} bytes is above MPI's int count limit", what, bytes));
  return static_cast<int>(bytes);
}

// ---- runtime state shared by the worlds -------------------------------------------------------

class MpiWorld;

}  // namespace detail

struct MpiRuntime::Impl {
  MpiRuntimeOptions opts;
  int rank = 0, size = 1, local_rank = 0;
  double timeout = 300;
  MPI_Comm ctrl = MPI_COMM_NULL;  // abort messages
  MPI_Comm host = MPI_COMM_NULL;  // splits and host exchanges (user thread only)
  MPI_Comm group = MPI_COMM_NULL;  // the processes of MpiRuntimeOptions::ranks (none: MPI_COMM_WORLD)
  std::unique_ptr<ThreadRuntime> local;
  int64_t mesh_devices = -1;
  std::vector<int> owner;  // position -> rank
  std::vector<int64_t> mine;

  mutable std::mutex mu;  // guards failure, worlds, abort_sends
  std::atomic<bool> failed{false};
  std::string failure;
  std::vector<detail::MpiWorld*> worlds;
  std::vector<MPI_Request> abort_sends;
  std::string abort_msg;

  std::thread watcher;
  std::atomic<bool> stop{false};

  // Liveness (mpi_liveness.cpp): every process's identity, by rank; which peers are watched
  // (on this host, their marker visible) and which ones ended cleanly. Watcher only.
  std::vector<detail::ProcessIdentity> peers;
  std::vector<char> watched, departed;
  bool marked = false;  // this process's marker was made (runtime_started)

  // First failure wins: remembers it, tells the other processes (unless it came from one),
  // and aborts every live world of this process.
  void fail(const std::string& reason, bool remote);
  void watch();
  // The watcher's liveness round: a watched peer that is gone while its marker says it held a
  // runtime fails this runtime, naming it.
  void check_peers();
  // Point-to-point exchange with every other process on `host`: post_recv(r, req) posts the
  // receive from r, and `send` (send_bytes) goes to every peer with `tag`. Waits with the
  // runtime's deadline; a timeout names the ranks whose data never came.
  void exchange(const char* what, const std::function<void(int, MPI_Request*)>& post_recv, const void* send,
                int send_bytes, int tag);
};

namespace detail {

// One group spanning processes: its communicator and where each member lives.
struct MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;  // the world's communicator of the group's round (not owned)
  std::size_t dup = 0;            // its index in the world's communicators
  std::vector<int64_t> members;  // mesh positions, member order
  std::vector<int> comm_rank;    // per member: rank of its process in comm (its world rank)
  std::vector<int> world_rank;   // per member: MPI_COMM_WORLD rank of its process
  std::string axes;              // "{data}"
};

class MpiWorld final : public CollectiveWorld {
 public:
  MpiWorld(std::shared_ptr<MpiRuntime::Impl> rt, const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
           double timeout_s);
  ~MpiWorld() override;

  std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) override;
  void abort(std::string reason) override;
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  // Local part of an abort (no message to other processes): from the runtime.
  void abort_local(const std::string& reason);
  std::string reason() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
  }
  std::string abort_reason() const override { return reason(); }

  MpiRuntime::Impl& rt() { return *rt_; }
  double timeout() const { return timeout_; }

 private:
  // Duplicates every process makes of the host communicator, one per round of groups, with
  // the runtime's deadline (they name what is still pending on a timeout).
  void make_communicators();

  std::shared_ptr<MpiRuntime::Impl> rt_;
  std::vector<MPI_Comm> dups_;
  std::vector<std::string> dup_what_;
  Mesh mesh_;
  double timeout_;
  std::unique_ptr<ThreadWorld> local_;
  std::map<std::pair<std::vector<std::string>, std::vector<int64_t>>, std::shared_ptr<MpiGroup>> groups_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

}  // namespace detail
}  // namespace tessel
