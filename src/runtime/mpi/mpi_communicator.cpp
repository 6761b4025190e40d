// mpi_communicator.cpp — the MPI side of MpiRuntime's collectives: MpiWorld (at load, the MPI
// communicators of the axis groups that span processes: one nonblocking duplicate of the
// runtime's host communicator per round of process-disjoint groups, waited for with the
// deadline) and MpiCommunicator (the communicator of one device in such a group).
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
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include "../cpu/cpu_stream.hpp"
#include "mpi_common.hpp"
#include "tessel/core/collective_kind.hpp"

namespace tessel {
namespace detail {

namespace {

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
    submit(s, collective_text(CollectiveKind::AllGather), [=](Op& op) {
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
    submit(s, collective_text(CollectiveKind::ReduceScatter), [=](Op& op) {
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
    submit(s, collective_text(CollectiveKind::AllReduce), [=](Op& op) {
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
    submit(s, collective_text(CollectiveKind::AllToAll), [=](Op& op) {
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
    submit(s, collective_text(CollectiveKind::CollectivePermute), [=](Op& op) {
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
    std::vector<long long> expect;  // per request: the bytes a receive must get (-1: a send)
    std::function<void(Op&)> then;
    std::shared_ptr<void> keep;
    void send(const void* buf, std::size_t bytes, int to) {
      reqs.emplace_back();
      peer.push_back(to);
      expect.push_back(-1);
      TESSEL_MPI(MPI_Isend(buf, int_count(bytes, "mpi communicator"), MPI_BYTE, c->g_->comm_rank[to],
                           c->r_ * c->n_ + to, c->g_->comm, &reqs.back()));
    }
    void recv(void* buf, std::size_t bytes, int from) {
      reqs.emplace_back();
      peer.push_back(from);
      expect.push_back(static_cast<long long>(bytes));
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
          ops[i].expect.clear();
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
    op.peer.clear();
    op.expect.clear();
  }

  void wait(Op& op, const char* kind, double deadline) {
    if (op.reqs.empty()) return;
    int spins = 0;
    std::vector<MPI_Status> status(op.reqs.size());
    while (true) {
      int flag = 0;
      TESSEL_MPI(MPI_Testall(static_cast<int>(op.reqs.size()), op.reqs.data(), &flag, status.data()));
      if (flag) {
        // A receive that got fewer bytes than the program says (a longer one is MPI's
        // truncation error above): the processes run different programs.
        for (std::size_t k = 0; k < op.reqs.size(); ++k) {
          if (op.expect[k] < 0) continue;
          int got = 0;
          MPI_Get_count(&status[k], MPI_BYTE, &got);
          if (static_cast<long long>(got) != op.expect[k]) {
            const std::string msg = fmt::format(
                "{}: {} received {} bytes from device {} on rank {} where this program expects {}: the processes "
                "run different programs (load compares their fingerprints; were they built from the same graph?)",
                who_, describe(kind), got, g_->members[static_cast<std::size_t>(op.peer[k])],
                g_->world_rank[static_cast<std::size_t>(op.peer[k])], op.expect[k]);
            world_.abort(msg);
            throw RuntimeError(msg);
          }
        }
        return;
      }
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
      // One communicator per round, duplicated from the host communicator by every process
      // (MPI_Comm_idup: nonblocking, so its wait has the deadline below; MPI_Comm_split has
      // none and would hang on a process that died or never came). The groups of a round
      // share no process, so they can share it: members address each other by world rank.
      dups_.push_back(MPI_COMM_NULL);
      dup_what_.push_back(fmt::format("{} round {}", axes_str, rd));
      std::size_t mine = spanning.size();
      for (std::size_t gi = 0; gi < spanning.size() && mine == spanning.size(); ++gi) {
        if (round[gi] != rd) continue;
        for (int64_t m : spanning[gi])
          if (owner[static_cast<std::size_t>(m)] == me) mine = gi;
      }
      if (mine == spanning.size()) continue;
      auto grp = std::make_shared<MpiGroup>();
      grp->dup = dups_.size() - 1;
      grp->members = spanning[mine];
      grp->axes = axes_str;
      for (int64_t m : grp->members) {
        grp->world_rank.push_back(owner[static_cast<std::size_t>(m)]);
        grp->comm_rank.push_back(owner[static_cast<std::size_t>(m)]);  // a duplicate keeps the ranks
      }
      groups_[{axes, grp->members}] = grp;
    }
  }
  make_communicators();
  for (auto& kv : groups_) kv.second->comm = dups_[kv.second->dup];
  // Registered under the runtime's lock, which fail() holds while it reads the worlds to abort:
  // an abort that came in while this world was being made (a peer's failure during this
  // process's load) aborts it here, or its collectives would wait for the timeout.
  std::string earlier;
  {
    std::lock_guard<std::mutex> lk(rt_->mu);
    rt_->worlds.push_back(this);
    if (rt_->failed.load()) earlier = rt_->failure;
  }
  if (!earlier.empty()) abort_local(earlier);
}

MpiWorld::~MpiWorld() {
  {
    std::lock_guard<std::mutex> lk(rt_->mu);
    rt_->worlds.erase(std::remove(rt_->worlds.begin(), rt_->worlds.end(), this), rt_->worlds.end());
  }
  // After a failure a peer may be dead: freeing could wait for it, so the communicators leak.
  if (!rt_->failed.load())
    for (MPI_Comm& c : dups_)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

void MpiWorld::make_communicators() {
  std::vector<MPI_Request> reqs(dups_.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < dups_.size(); ++i) TESSEL_MPI(MPI_Comm_idup(rt_->host, &dups_[i], &reqs[i]));
  const double deadline = finite_timeout(timeout_) ? now_s() + timeout_ : 0;
  while (true) {
    int flag = 0;
    TESSEL_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) break;
    std::string reason;
    if (rt_->failed.load()) {
      std::lock_guard<std::mutex> lk(rt_->mu);
      reason = fmt::format("rank {}: load, making the communicators of the groups that span processes, stopped: {}",
                           rt_->rank, rt_->failure);
    } else if (deadline > 0 && now_s() > deadline) {
      std::vector<std::string> open;
      for (std::size_t i = 0; i < reqs.size(); ++i)
        if (reqs[i] != MPI_REQUEST_NULL) open.push_back(dup_what_[i]);
      reason = fmt::format(
          "rank {}: load, making the communicators of the groups that span processes ({}), timed out after {} s: "
          "every process had come to load (the fingerprints were exchanged) but one did not make them (did a "
          "process die, or load with another MpiRuntimeOptions::process_of_device?); MpiRuntimeOptions::timeout_s / "
          "TESSEL_MPI_TIMEOUT_S set the limit",
          rt_->rank, join(open, ", "), timeout_);
      rt_->fail(reason, false);
    }
    if (!reason.empty()) {
      // A pending duplication can be neither cancelled nor freed (MPI forbids both for a
      // nonblocking collective), and MPI may still write its communicator should it complete:
      // the handles' storage is left allocated on purpose. The runtime refuses new work from
      // now on; the job is to be restarted.
      static_cast<void>(new std::vector<MPI_Comm>(std::move(dups_)));  // deliberately never freed
      dups_.clear();
      throw RuntimeError(reason);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (MPI_Comm c : dups_) TESSEL_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
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
}  // namespace tessel
