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
// Collectives over a group that spans processes (member r = Mesh::group order, a device):
// direct point-to-point exchange with MPI_Isend/MPI_Irecv on the group's communicator, tag
// (src member * G + dst member), so several members in one process are told apart by tag;
// then MPI_Testall with a deadline. Per member and call:
//   all_gather      send own block to every peer, receive every peer's block in place
//   reduce_scatter  send block j to member j, receive block r from every peer, reduce them
//                   in member order 0..G-1 (so every chunk is reduced the same way)
//   all_reduce      reduce_scatter of G chunks of count/G elements, then all_gather of the
//                   reduced chunks (bandwidth-optimal: 2(G-1)/G of the buffer out and in;
//                   every replica gets bit-identical results)
//   all_to_all      block j to member j; collective_permute, send/recv: the pairs only;
//   broadcast       root sends to every member; barrier: empty messages with every member.
// Members of one group in the same process also talk through MPI (the shared-memory
// transport), which keeps one algorithm for every placement. Groups entirely inside one
// process use the ThreadWorld (no MPI at all).
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/process_group.hpp"

#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "../cpu/cpu_stream.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

#define TESSEL_MPI(call) ::tessel::detail::mpi_check((call), #call, __FILE__, __LINE__)

namespace tessel {
namespace detail {

void mpi_check(int rc, const char* what, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  throw MpiError(fmt::format("{} failed: {} (error {}, {}:{})", what, std::string(msg, static_cast<std::size_t>(len)),
                             rc, file, line));
}

namespace {

constexpr int kAbortTag = 7;
constexpr std::size_t kAbortMax = 8192;

// An abort message to every rank but `self` on `comm` (kAbortTag); the requests are appended
// to `sends` (`msg` must outlive them).
void isend_abort_to_peers(const std::string& msg, int self, int size, MPI_Comm comm, std::vector<MPI_Request>& sends) {
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    MPI_Request q;
    if (MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, r, kAbortTag, comm, &q) == MPI_SUCCESS)
      sends.push_back(q);
  }
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
    MPI_Comm node;
    TESSEL_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    TESSEL_MPI(MPI_Comm_rank(node, &local_rank));
    MPI_Comm_free(&node);
  }
  ~Session() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (we_initialised && !fin && !failed.load()) MPI_Finalize();
  }
};

Session& session() {
  static Session s;
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool finite_timeout(double t) { return t > 0 && std::isfinite(t); }

int int_count(std::size_t bytes, const char* what) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw RuntimeError(fmt::format("{}: a message of {} bytes is above MPI's int count limit", what, bytes));
  return static_cast<int>(bytes);
}

// ---- reductions ----------------------------------------------------------------------------

template <class Load, class Store, class T>
void reduce_blocks(const std::vector<const T*>& blocks, T* out, std::size_t n, ReduceOp op, Load load, Store store) {
  // Block by block into an accumulator (tight loops that vectorise), in member order; out may
  // alias any block, so it is written only at the end.
  using Acc = decltype(load(blocks[0][0]));
  thread_local std::vector<Acc> acc_buf;
  acc_buf.resize(n);
  Acc* acc = acc_buf.data();
  const T* b0 = blocks[0];
  for (std::size_t i = 0; i < n; ++i) acc[i] = load(b0[i]);
  for (std::size_t k = 1; k < blocks.size(); ++k) {
    const T* b = blocks[k];
    if (op == ReduceOp::Sum) {
      for (std::size_t i = 0; i < n; ++i) acc[i] += load(b[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const Acc v = load(b[i]);
        acc[i] = (v > acc[i] || v != v) ? v : acc[i];
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = store(acc[i]);
}

// out[i] = blocks[0][i] op blocks[1][i] op ... (member order); out may alias a block.
void reduce_into(const std::vector<const void*>& blocks, void* out, std::size_t n, DType dt, ReduceOp op) {
  switch (dt) {
    case DType::f32: {
      std::vector<const float*> b;
      for (auto* p : blocks) b.push_back(static_cast<const float*>(p));
      reduce_blocks(b, static_cast<float*>(out), n, op, [](float v) { return v; }, [](float v) { return v; });
      return;
    }
    case DType::i32: {
      std::vector<const int32_t*> b;
      for (auto* p : blocks) b.push_back(static_cast<const int32_t*>(p));
      reduce_blocks(b, static_cast<int32_t*>(out), n, op, [](int32_t v) { return static_cast<int64_t>(v); },
                    [](int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); });
      return;
    }
    case DType::bf16: {
      std::vector<const uint16_t*> b;
      for (auto* p : blocks) b.push_back(static_cast<const uint16_t*>(p));
      reduce_blocks(b, static_cast<uint16_t*>(out), n, op, [](uint16_t v) { return bf16_to_f32(v); },
                    [](float v) { return f32_to_bf16(v); });
      return;
    }
    case DType::f16: {
      std::vector<const uint16_t*> b;
      for (auto* p : blocks) b.push_back(static_cast<const uint16_t*>(p));
      reduce_blocks(b, static_cast<uint16_t*>(out), n, op, [](uint16_t v) { return f16_to_f32(v); },
                    [](float v) { return f32_to_f16(v); });
      return;
    }
  }
}

}  // namespace

// ---- runtime state shared by the worlds -------------------------------------------------------

class MpiWorld;

}  // namespace detail

struct MpiRuntime::Impl {
  MpiRuntimeOptions opts;
  int rank = 0, size = 1, local_rank = 0;
  double timeout = 300;
  MPI_Comm ctrl = MPI_COMM_NULL;  // abort messages
  MPI_Comm host = MPI_COMM_NULL;  // splits and host exchanges (user thread only)
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

  // First failure wins: remembers it, tells the other processes (unless it came from one),
  // and aborts every live world of this process.
  void fail(const std::string& reason, bool remote);
  void watch();
  // Waits for reqs with the runtime's deadline; `what` names the operation.
  void wait_host(std::vector<MPI_Request>& reqs, const std::string& what);
};

namespace detail {

// One group spanning processes: its communicator and where each member lives.
struct MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int64_t> members;  // mesh positions, member order
  std::vector<int> comm_rank;    // per member: rank of its process in comm
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

  MpiRuntime::Impl& rt() { return *rt_; }
  double timeout() const { return timeout_; }

 private:
  std::shared_ptr<MpiRuntime::Impl> rt_;
  Mesh mesh_;
  double timeout_;
  std::unique_ptr<ThreadWorld> local_;
  std::map<std::pair<std::vector<std::string>, std::vector<int64_t>>, std::shared_ptr<MpiGroup>> groups_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// ---- the communicator of one device in a spanning group -------------------------------------

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MpiWorld& world, std::shared_ptr<MpiGroup> g, int member)
      : world_(world), g_(std::move(g)), r_(member), n_(static_cast<int>(g_->members.size())) {
    who_ = fmt::format("rank {} device {}", world_.rt().rank, g_->members[static_cast<std::size_t>(r_)]);
  }
  int rank() const override { return r_; }
  int size() const override { return n_; }

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    submit(s, "all_gather", [=](Op& op) {
      char* out = static_cast<char*>(recv);
      if (send != out + r_ * bytes) std::memmove(out + r_ * bytes, send, bytes);
      for (int j = 0; j < n_; ++j)
        if (j != r_) {
          op.recv(out + j * bytes, bytes, j);
          op.send(out + r_ * bytes, bytes, j);
        }
    });
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dt, ReduceOp rop, Stream& s) override {
    const std::size_t es = dtype_size(dt), chunk = count * es;
    submit(s, "reduce_scatter", [=](Op& op) {
      auto scratch = std::make_shared<std::vector<char>>(chunk * static_cast<std::size_t>(n_));
      const char* in = static_cast<const char*>(send);
      for (int j = 0; j < n_; ++j)
        if (j != r_) {
          op.recv(scratch->data() + j * chunk, chunk, j);
          op.send(in + j * chunk, chunk, j);
        }
      op.then = [=](Op&) {
        std::vector<const void*> blocks;
        for (int j = 0; j < n_; ++j) blocks.push_back(j == r_ ? in + r_ * chunk : scratch->data() + j * chunk);
        reduce_into(blocks, recv, count, dt, rop);
      };
    });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dt, ReduceOp rop, Stream& s) override {
    const std::size_t es = dtype_size(dt);
    submit(s, "all_reduce", [=](Op& op) {
      auto lo = [=](int j) { return count * static_cast<std::size_t>(j) / static_cast<std::size_t>(n_); };
      const char* in = static_cast<const char*>(send);
      char* out = static_cast<char*>(recv);
      const std::size_t mine = lo(r_ + 1) - lo(r_);
      auto scratch = std::make_shared<std::vector<char>>(mine * es * static_cast<std::size_t>(n_));
      // Phase 1: reduce-scatter of the G chunks.
      for (int j = 0; j < n_; ++j)
        if (j != r_) {
          op.recv(scratch->data() + j * mine * es, mine * es, j);
          op.send(in + lo(j) * es, (lo(j + 1) - lo(j)) * es, j);
        }
      op.then = [=](Op& op2) {
        std::vector<const void*> blocks;
        for (int j = 0; j < n_; ++j) blocks.push_back(j == r_ ? in + lo(r_) * es : scratch->data() + j * mine * es);
        reduce_into(blocks, out + lo(r_) * es, mine, dt, rop);
        // Phase 2: all-gather of the reduced chunks.
        for (int j = 0; j < n_; ++j)
          if (j != r_) {
            op2.recv(out + lo(j) * es, (lo(j + 1) - lo(j)) * es, j);
            op2.send(out + lo(r_) * es, mine * es, j);
          }
        op2.then = nullptr;
        op2.keep = scratch;
      };
    });
  }

  void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    submit(s, "all_to_all", [=](Op& op) {
      const char* in = static_cast<const char*>(send);
      char* out = static_cast<char*>(recv);
      if (in == out) {  // in place: stage the blocks we send
        auto copy = std::make_shared<std::vector<char>>(in, in + bytes * static_cast<std::size_t>(n_));
        op.keep = copy;
        in = copy->data();
      } else {
        std::memcpy(out + r_ * bytes, in + r_ * bytes, bytes);
      }
      for (int j = 0; j < n_; ++j)
        if (j != r_) {
          op.recv(out + j * bytes, bytes, j);
          op.send(in + j * bytes, bytes, j);
        }
    });
  }

  void collective_permute(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes,
                          Stream& s) override {
    submit(s, "collective_permute", [=](Op& op) {
      if (send_to == r_ && recv_from == r_) {
        if (send != recv) std::memmove(recv, send, bytes);
        return;
      }
      if (recv_from >= 0 && recv_from != r_) op.recv(recv, bytes, recv_from);
      if (send_to >= 0 && send_to != r_) op.send(send, bytes, send_to);
    });
  }

  void send(const void* buf, std::size_t bytes, int peer, Stream& s) override {
    submit(s, "send", [=](Op& op) { op.send(buf, bytes, peer); });
  }
  void recv(void* buf, std::size_t bytes, int peer, Stream& s) override {
    submit(s, "recv", [=](Op& op) { op.recv(buf, bytes, peer); });
  }
  void broadcast(void* buf, std::size_t bytes, int root, Stream& s) override {
    submit(s, "broadcast", [=](Op& op) {
      if (r_ == root) {
        for (int j = 0; j < n_; ++j)
          if (j != r_) op.send(buf, bytes, j);
      } else {
        op.recv(buf, bytes, root);
      }
    });
  }
  void barrier(Stream& s) override {
    submit(s, "barrier", [=](Op& op) {
      for (int j = 0; j < n_; ++j)
        if (j != r_) {
          op.recv(nullptr, 0, j);
          op.send(nullptr, 0, j);
        }
    });
  }

  void group_start() override {
    if (grouping_) throw RuntimeError(fmt::format("{}: group_start inside a group (groups do not nest)", who_));
    grouping_ = true;
    group_.clear();
    group_stream_ = nullptr;
  }
  void group_end() override {
    if (!grouping_) throw RuntimeError(fmt::format("{}: group_end without group_start", who_));
    grouping_ = false;
    if (group_.empty()) return;
    auto ops = std::make_shared<std::vector<Pending>>(std::move(group_));
    group_.clear();
    detail::cpu_stream(*group_stream_, "mpi communicator").enqueue([this, ops] { run(*ops); });
  }
  void abort(const std::string& reason) override { world_.abort(reason); }

 private:
  // One call's messages: posted together, then waited for; `then` runs after they complete
  // and may post a second phase.
  struct Op {
    MpiCommunicator* c;
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;  // per request: member
    std::function<void(Op&)> then;
    std::shared_ptr<void> keep;
    void send(const void* buf, std::size_t bytes, int to) {
      reqs.emplace_back();
      peer.push_back(to);
      TESSEL_MPI(MPI_Isend(buf, int_count(bytes, "mpi communicator"), MPI_BYTE, c->g_->comm_rank[to],
                           c->r_ * c->n_ + to, c->g_->comm, &reqs.back()));
    }
    void recv(void* buf, std::size_t bytes, int from) {
      reqs.emplace_back();
      peer.push_back(from);
      TESSEL_MPI(MPI_Irecv(buf, int_count(bytes, "mpi communicator"), MPI_BYTE, c->g_->comm_rank[from],
                           from * c->n_ + c->r_, c->g_->comm, &reqs.back()));
    }
  };
  struct Pending {
    const char* kind;
    std::function<void(Op&)> post;
  };

  void submit(Stream& s, const char* kind, std::function<void(Op&)> post) {
    if (grouping_) {
      if (group_stream_ && group_stream_ != &s)
        throw RuntimeError(fmt::format("{}: the calls of a group must use one stream", who_));
      group_stream_ = &s;
      group_.push_back({kind, std::move(post)});
      return;
    }
    auto ops = std::make_shared<std::vector<Pending>>();
    ops->push_back({kind, std::move(post)});
    detail::cpu_stream(s, "mpi communicator").enqueue([this, ops] { run(*ops); });
  }

  std::string describe(const char* kind) const {
    std::vector<std::string> m;
    for (std::size_t j = 0; j < g_->members.size(); ++j)
      m.push_back(fmt::format("{}@rank{}", g_->members[j], g_->world_rank[j]));
    return fmt::format("{} over {} (devices {})", kind, g_->axes, join(m, ","));
  }

  // Runs on the stream's worker: posts every call's first phase, then completes them in order.
  void run(std::vector<Pending>& pend) {
    const double deadline = finite_timeout(world_.timeout()) ? now_s() + world_.timeout() : 0;
    std::vector<Op> ops(pend.size());
    const char* kind = pend.empty() ? "?" : pend[0].kind;
    try {
      if (world_.aborted()) throw_aborted(kind);
      for (std::size_t i = 0; i < pend.size(); ++i) {
        kind = pend[i].kind;
        ops[i].c = this;
        pend[i].post(ops[i]);
      }
      for (std::size_t i = 0; i < pend.size(); ++i) {
        kind = pend[i].kind;
        while (true) {
          wait(ops[i], kind, deadline);
          if (!ops[i].then) break;
          auto then = std::move(ops[i].then);
          ops[i].then = nullptr;
          ops[i].reqs.clear();
          ops[i].peer.clear();
          then(ops[i]);
        }
      }
    } catch (const MpiError& e) {
      for (auto& op : ops) cancel(op);
      const std::string msg = fmt::format("{}: {} failed: {}", who_, describe(kind), e.what());
      world_.abort(msg);
      throw RuntimeError(msg);
    } catch (...) {
      for (auto& op : ops) cancel(op);
      throw;
    }
  }

  [[noreturn]] void throw_aborted(const char* kind) {
    throw RuntimeError(fmt::format("{}: {} stopped: {}", who_, describe(kind), world_.reason()));
  }

  void cancel(Op& op) {
    for (auto& r : op.reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    op.reqs.clear();
  }

  void wait(Op& op, const char* kind, double deadline) {
    if (op.reqs.empty()) return;
    int spins = 0;
    while (true) {
      int flag = 0;
      TESSEL_MPI(MPI_Testall(static_cast<int>(op.reqs.size()), op.reqs.data(), &flag, MPI_STATUSES_IGNORE));
      if (flag) return;
      if (world_.aborted()) {
        cancel(op);
        throw_aborted(kind);
      }
      if (deadline > 0 && now_s() > deadline) {
        std::set<int> waiting;
        for (std::size_t k = 0; k < op.reqs.size(); ++k) {
          int done = 0;
          if (op.reqs[k] != MPI_REQUEST_NULL) MPI_Test(&op.reqs[k], &done, MPI_STATUS_IGNORE);
          if (op.reqs[k] != MPI_REQUEST_NULL && !done) waiting.insert(op.peer[k]);
        }
        std::vector<std::string> ws;
        for (int m : waiting)
          ws.push_back(fmt::format("device {} on rank {}", g_->members[static_cast<std::size_t>(m)],
                                   g_->world_rank[static_cast<std::size_t>(m)]));
        const std::string msg = fmt::format(
            "{}: {} timed out after {} s waiting for {} (is that process alive? a killed or stuck process looks like "
            "this; MpiRuntimeOptions::timeout_s / TESSEL_MPI_TIMEOUT_S set the limit)",
            who_, describe(kind), world_.timeout(), join(ws, ", "));
        cancel(op);
        world_.abort(msg);
        throw RuntimeError(msg);
      }
      if (++spins < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
      }
    }
  }

  MpiWorld& world_;
  std::shared_ptr<MpiGroup> g_;
  int r_, n_;
  std::string who_;
  bool grouping_ = false;
  std::vector<Pending> group_;
  Stream* group_stream_ = nullptr;
};

// ---- MpiWorld ---------------------------------------------------------------------------------

MpiWorld::MpiWorld(std::shared_ptr<MpiRuntime::Impl> rt, const Mesh& mesh,
                   const std::vector<std::vector<std::string>>& axes_list, double timeout_s)
    : rt_(std::move(rt)), mesh_(mesh), timeout_(timeout_s) {
  ThreadWorldOptions wo;
  wo.timeout_seconds = timeout_s;
  local_ = std::make_unique<ThreadWorld>(mesh, wo);
  const auto& owner = rt_->owner;
  const int me = rt_->rank;
  for (const auto& axes : axes_list) {
    // Every group of these axes that spans processes, in a order every process agrees on.
    std::vector<std::vector<int64_t>> spanning;
    std::set<std::vector<int64_t>> seen;
    for (int64_t p = 0; p < mesh.num_devices(); ++p) {
      auto g = mesh.group(p, axes);
      if (!seen.insert(g).second) continue;
      std::set<int> procs;
      for (int64_t m : g) procs.insert(owner[static_cast<std::size_t>(m)]);
      if (procs.size() > 1) spanning.push_back(g);
    }
    // Rounds of MPI_Comm_split: a process is in at most one group per round (greedy).
    std::vector<int> round(spanning.size());
    std::map<int, std::set<int>> used;  // process -> rounds taken
    int rounds = 0;
    for (std::size_t gi = 0; gi < spanning.size(); ++gi) {
      std::set<int> procs;
      for (int64_t m : spanning[gi]) procs.insert(owner[static_cast<std::size_t>(m)]);
      int rd = 0;
      while (true) {
        bool free_all = true;
        for (int pr : procs) free_all = free_all && !used[pr].count(rd);
        if (free_all) break;
        ++rd;
      }
      round[gi] = rd;
      for (int pr : procs) used[pr].insert(rd);
      rounds = std::max(rounds, rd + 1);
    }
    const std::string axes_str = "{" + join(axes, ",") + "}";
    for (int rd = 0; rd < rounds; ++rd) {
      int color = MPI_UNDEFINED, key = 0;
      std::size_t mine = spanning.size();
      for (std::size_t gi = 0; gi < spanning.size(); ++gi) {
        if (round[gi] != rd) continue;
        const auto& g = spanning[gi];
        for (std::size_t j = 0; j < g.size(); ++j)
          if (owner[static_cast<std::size_t>(g[j])] == me) {
            color = static_cast<int>(gi);
            key = static_cast<int>(j);
            mine = gi;
            break;
          }
        if (mine != spanning.size()) break;
      }
      MPI_Comm comm = MPI_COMM_NULL;
      TESSEL_MPI(MPI_Comm_split(rt_->host, color, key, &comm));
      if (mine == spanning.size()) continue;
      TESSEL_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
      auto grp = std::make_shared<MpiGroup>();
      grp->comm = comm;
      grp->members = spanning[mine];
      grp->axes = axes_str;
      std::vector<int> procs_in_order;  // distinct owners by first member = comm rank order
      for (int64_t m : grp->members) {
        const int pr = owner[static_cast<std::size_t>(m)];
        auto it = std::find(procs_in_order.begin(), procs_in_order.end(), pr);
        const int cr = static_cast<int>(it - procs_in_order.begin());
        if (it == procs_in_order.end()) procs_in_order.push_back(pr);
        grp->comm_rank.push_back(cr);
        grp->world_rank.push_back(pr);
      }
      int got = -1;
      TESSEL_MPI(MPI_Comm_rank(comm, &got));
      const int want = static_cast<int>(std::find(procs_in_order.begin(), procs_in_order.end(), me) -
                                        procs_in_order.begin());
      if (got != want)
        throw RuntimeError(fmt::format("MpiRuntime: rank {} got rank {} in the communicator of group {} but expected {}",
                                       me, got, shape_str(grp->members), want));
      groups_[{axes, grp->members}] = grp;
    }
  }
  std::lock_guard<std::mutex> lk(rt_->mu);
  rt_->worlds.push_back(this);
}

MpiWorld::~MpiWorld() {
  {
    std::lock_guard<std::mutex> lk(rt_->mu);
    rt_->worlds.erase(std::remove(rt_->worlds.begin(), rt_->worlds.end(), this), rt_->worlds.end());
  }
  // After a failure a peer may be dead: freeing could wait for it, so the communicators leak.
  if (!rt_->failed.load())
    for (auto& kv : groups_) MPI_Comm_free(&kv.second->comm);
}

std::unique_ptr<Communicator> MpiWorld::communicator(int64_t position, const std::vector<std::string>& axes) {
  auto g = mesh_.group(position, axes);
  bool all_here = true;
  for (int64_t m : g) all_here = all_here && rt_->owner[static_cast<std::size_t>(m)] == rt_->rank;
  if (all_here) return local_->communicator(position, axes);
  auto it = groups_.find({axes, g});
  if (it == groups_.end())
    throw RuntimeError(fmt::format("MpiRuntime: no communicator for device {} and axes {{{}}} (load creates one per "
                                   "group of communicator_axes(program))",
                                   position, join(axes, ",")));
  const int member = static_cast<int>(std::find(g.begin(), g.end(), position) - g.begin());
  return std::make_unique<MpiCommunicator>(*this, it->second, member);
}

void MpiWorld::abort_local(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load()) return;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  local_->abort(reason);
}

void MpiWorld::abort(std::string reason) {
  if (aborted()) return;
  const std::string r = fmt::format("rank {}: {}", rt_->rank, reason);
  abort_local(r);
  rt_->fail(r, false);
}

}  // namespace detail

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
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  MPI_Cancel(&req);
  if (failed.load())
    MPI_Request_free(&req);
  else
    MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void MpiRuntime::Impl::wait_host(std::vector<MPI_Request>& reqs, const std::string& what) {
  const double deadline = detail::finite_timeout(timeout) ? detail::now_s() + timeout : 0;
  while (true) {
    int flag = 0;
    TESSEL_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) return;
    if (failed.load()) {
      for (auto& r : reqs)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      std::lock_guard<std::mutex> lk(mu);
      throw RuntimeError(fmt::format("rank {}: {} stopped: {}", rank, what, failure));
    }
    if (deadline > 0 && detail::now_s() > deadline) {
      const std::string msg = fmt::format("rank {}: {} timed out after {} s (a process did not join: is it alive?)",
                                          rank, what, timeout);
      for (auto& r : reqs)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      fail(msg, false);
      throw RuntimeError(msg);
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
  TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &im.ctrl));
  TESSEL_MPI(MPI_Comm_set_errhandler(im.ctrl, MPI_ERRORS_RETURN));
  TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &im.host));
  TESSEL_MPI(MPI_Comm_set_errhandler(im.host, MPI_ERRORS_RETURN));
  Impl* raw = impl_.get();
  im.watcher = std::thread([raw] { raw->watch(); });
}

MpiRuntime::~MpiRuntime() {
  Impl& im = *impl_;
  im.local.reset();  // no job may be running
  im.stop.store(true);
  if (im.watcher.joinable()) im.watcher.join();
  if (!im.failed.load()) {
    MPI_Comm_free(&im.ctrl);
    MPI_Comm_free(&im.host);
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

ThreadRuntime& MpiRuntime::local() {
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
  return std::make_unique<detail::MpiWorld>(impl_, mesh, axes, timeout_s > 0 ? timeout_s : im.timeout);
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
  std::vector<MPI_Request> req(1);
  TESSEL_MPI(MPI_Iallgatherv(send.data(), static_cast<int>(send.size()), MPI_BYTE, recv.data(), counts.data(),
                             displs.data(), MPI_BYTE, im.host, &req[0]));
  im.wait_host(req, "to_host (gathering every process's shards)");
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

// ---- the MPI process group (process_group.hpp) ------------------------------------------------
// Bootstrap only (a CudaRuntime's NCCL unique id, small to_host exchanges): blocking
// MPI_Allgather(v) on a duplicate of MPI_COMM_WORLD, so it never matches a message of an
// MpiRuntime in the same process.

namespace {
class MpiProcessGroup : public ProcessGroup {
 public:
  MpiProcessGroup() {
    detail::Session& s = detail::session();
    rank_ = s.rank;
    size_ = s.size;
    local_rank_ = s.local_rank;
    TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &abort_comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(abort_comm_, MPI_ERRORS_RETURN));
  }
  ~MpiProcessGroup() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    {
      // Posted notices not yet delivered: give them a bounded time, then let go.
      std::lock_guard<std::mutex> lk(abort_mu_);
      drive_sends(1.0);
      for (MPI_Request& q : sends_) MPI_Request_free(&q);
      // A freed send may still read its buffer: leave those buffers alive.
      if (!sends_.empty())
        for (auto& b : posted_) (void)b.release();
    }
    MPI_Comm_free(&abort_comm_);
    MPI_Comm_free(&comm_);
  }
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::vector<std::string> allgather(const std::string& mine) override {
    const int n = detail::int_count(mine.size(), "process group allgather");
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
    TESSEL_MPI(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
    std::size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<std::size_t>(r)] = detail::int_count(total, "process group allgather");
      total += static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    }
    std::vector<char> recv(std::max<std::size_t>(total, 1));
    TESSEL_MPI(MPI_Allgatherv(mine.data(), n, MPI_BYTE, recv.data(), counts.data(), displs.data(), MPI_BYTE, comm_));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.emplace_back(recv.data() + displs[static_cast<std::size_t>(r)],
                       static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    return out;
  }

  // One message per other rank on a communicator of its own (nothing else is ever sent on
  // it); MPI_THREAD_MULTIPLE (the session's) lets the watchdog thread call these.
  void post_abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lk(abort_mu_);
    posted_.push_back(std::make_unique<std::string>(reason.substr(0, detail::kAbortMax - 1)));
    detail::isend_abort_to_peers(*posted_.back(), rank_, size_, abort_comm_, sends_);
    // MPI delivers a send only while the sender makes progress: drive it a little now (a
    // process often exits right after an abort).
    drive_sends(2.0);
  }

  std::optional<AbortNotice> poll_abort() override {
    std::lock_guard<std::mutex> lk(abort_mu_);
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, detail::kAbortTag, abort_comm_, &flag, &st) != MPI_SUCCESS || !flag)
      return std::nullopt;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    std::string reason(static_cast<std::size_t>(std::max(count, 0)), '\0');
    if (MPI_Recv(reason.data(), count, MPI_CHAR, st.MPI_SOURCE, detail::kAbortTag, abort_comm_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      return std::nullopt;
    return AbortNotice{st.MPI_SOURCE, reason};
  }

 private:
  // Under abort_mu_: test the posted sends until they are done or `seconds` pass.
  void drive_sends(double seconds) {
    const double deadline = detail::now_s() + seconds;
    while (!sends_.empty()) {
      int flag = 0;
      if (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
      if (flag) {
        sends_.clear();
        break;
      }
      if (detail::now_s() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm abort_comm_ = MPI_COMM_NULL;  // abort notices only
  std::mutex abort_mu_;
  std::vector<std::unique_ptr<std::string>> posted_;  // the buffers of sends in flight
  std::vector<MPI_Request> sends_;
};
}  // namespace

std::shared_ptr<ProcessGroup> mpi_process_group() { return std::make_shared<MpiProcessGroup>(); }

}  // namespace tessel
