// thread_communicator.cpp — the in-process communicator: one thread per device.
//
// Every collective is "publish, meet, copy, meet":
//   1. each member writes its buffer pointers (and the call's kind and sizes) into its slot
//      of the group's shared state;
//   2. all members meet at barrier A (abortable: a member may leave it when the world is
//      aborted, see below);
//   3. every member checks that all slots describe the same call (a mismatch aborts the
//      world instead of corrupting memory), then copies or reduces *directly* from its peers'
//      buffers into its own recv buffer — each byte crosses memory once, no staging;
//   4. all members meet at barrier B (not abortable) so that nobody returns, and lets its
//      caller reuse or free its buffers, while a peer may still read them.
// all_reduce reduces one 1/n chunk per member (reduce-scatter over the peers' send buffers
// into its own recv chunk), meets, and then gathers the other chunks from the peers' recv
// buffers (a third barrier): reads n·count, writes 2·count per member, and in-place
// (send == recv) is safe without scratch because nobody reads a peer's chunk r while rank r
// overwrites it (see docs/runtime-communicator.md for the argument).
//
// Slots are double-buffered by call parity: a member can be at most one call ahead of its
// slowest peer (it cannot pass barrier A of call k+1 before everybody finished call k), so
// while a peer still validates call k's slots, a fast member writes call k+1's other slot.
//
// Abort: barrier A arrivals are counted under the group mutex. A member woken by an abort
// leaves only when the barrier has not completed, and withdraws its arrival, so a barrier
// can never complete with a member that has left (and whose buffers may be freed). Once
// barrier A has completed every member is only copying memory until B, which therefore
// always completes and is never abandoned.
//
// The shared state of a group: thread_group_state.hpp; the reduction loops: thread_reduce.hpp;
// ThreadWorld: thread_world.cpp.
#include "tessel/runtime/cpu/thread_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu_stream.hpp"
#include "../spin.hpp"
#include "thread_group_state.hpp"
#include "thread_reduce.hpp"

namespace tessel {
namespace {

using detail::elem_size;
using detail::Kind;
using detail::kind_name;
using detail::reduce;
using detail::ThreadGroupState;
using detail::ThreadSlot;
using Clock = std::chrono::steady_clock;

const char* dtype_str(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

bool overlaps(const void* a, std::size_t na, const void* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadWorld* world, std::shared_ptr<ThreadGroupState> group, int rank,
                     int spin_us, LinkModel link)
      : world_(world), g_(std::move(group)), rank_(rank), spin_(spin_us), link_(link),
        ptrs_(static_cast<std::size_t>(g_->n)) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  bool groups_permutes() const override { return true; }

  // ---- the stream-ordered interface: each call is a task on the caller's CPU stream ----

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    submit(s, [=] { do_all_gather(send, recv, bytes); }, others() * static_cast<double>(bytes));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                      Stream& s) override {
    submit(s, [=] { do_reduce_scatter(send, recv, count, dtype, op); },
           others() * static_cast<double>(count * elem_size(dtype)));
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream& s) override {
    submit(s, [=] { do_all_reduce(send, recv, count, dtype, op); },
           2 * others() / g_->n * static_cast<double>(count * elem_size(dtype)));
  }
  void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    submit(s, [=] { do_all_to_all(send, recv, bytes); }, others() * static_cast<double>(bytes));
  }
  void collective_permute(const void* send, int send_to, void* recv, int recv_from,
                          std::size_t bytes, Stream& s) override {
    const bool moves = (send_to >= 0 && send_to != rank_) || (recv_from >= 0 && recv_from != rank_);
    submit(s, [=] { do_collective_permute(send, send_to, recv, recv_from, bytes); },
           moves ? static_cast<double>(bytes) : -1.0, send_to);
  }
  void send(const void* buf, std::size_t bytes, int peer, Stream& s) override {
    if (in_group_) {
      group_stream(s);
      group_.push_back(GroupOp{nullptr, buf, bytes, peer, static_cast<double>(bytes), peer});
      return;
    }
    submit(s, [=] { do_send(buf, bytes, peer); }, static_cast<double>(bytes));
  }
  void recv(void* buf, std::size_t bytes, int peer, Stream& s) override {
    submit(s, [=] { do_recv(buf, bytes, peer); }, static_cast<double>(bytes));
  }
  void broadcast(void* buf, std::size_t bytes, int root, Stream& s) override {
    submit(s, [=] { do_broadcast(buf, bytes, root); }, static_cast<double>(bytes));
  }
  void barrier(Stream& s) override {
    submit(s, [=] { do_barrier(); }, 0.0);
  }

  void group_start() override {
    if (in_group_)
      throw RuntimeError("tessel: group_start on " + g_->describe() + " (rank " +
                         std::to_string(rank_) + "): a group is already open (groups do not nest)");
    in_group_ = true;
    group_stream_ = nullptr;
    group_.clear();
  }

  void group_end() override {
    if (!in_group_)
      throw RuntimeError("tessel: group_end on " + g_->describe() + " (rank " +
                         std::to_string(rank_) + ") without group_start");
    in_group_ = false;
    if (group_.empty()) return;
    auto ops = std::make_shared<std::vector<GroupOp>>(std::move(group_));
    group_.clear();
    detail::cpu_stream(*group_stream_, "thread communicator").enqueue([this, ops] { run_group(*ops); });
  }

  void abort(const std::string& reason) override { world_->abort(reason); }

  void do_all_gather(const void* send, void* recv, std::size_t bytes) {
    const int n = g_->n;
    char* out = static_cast<char*>(recv);
    const bool in_place = send == out + static_cast<std::size_t>(rank_) * bytes;
    if (!in_place && overlaps(send, bytes, recv, n * bytes)) send = stage(send, bytes);
    ThreadSlot& s = begin(Kind::AllGather);
    s.send = send;
    s.recv = recv;
    s.bytes = bytes;
    const auto& slots = meet_and_validate(Kind::AllGather);
    // Start after our own rank so that members do not all read rank 0 first.
    for (int k = 0; k < n; ++k) {
      const int i = (rank_ + k) % n;
      copy_bytes(out + static_cast<std::size_t>(i) * bytes, slots[i].send, bytes);
    }
    meet_done();
  }

  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                         ReduceOp op) {
    const int n = g_->n;
    const std::size_t blk = count * elem_size(dtype);
    const bool in_place =
        recv == static_cast<const char*>(send) + static_cast<std::size_t>(rank_) * blk;
    if (!in_place && overlaps(send, n * blk, recv, blk)) send = stage(send, n * blk);
    ThreadSlot& s = begin(Kind::ReduceScatter);
    s.send = send;
    s.recv = recv;
    s.bytes = blk;
    s.dtype = dtype;
    s.op = op;
    const auto& slots = meet_and_validate(Kind::ReduceScatter);
    for (int i = 0; i < n; ++i)
      ptrs_[i] = static_cast<const char*>(slots[i].send) + static_cast<std::size_t>(rank_) * blk;
    reduce(recv, ptrs_.data(), n, count, dtype, op);
    meet_done();
  }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                     ReduceOp op) {
    const int n = g_->n;
    const std::size_t es = elem_size(dtype);
    if (send != recv && overlaps(send, count * es, recv, count * es))
      send = stage(send, count * es);
    ThreadSlot& s = begin(Kind::AllReduce);
    s.send = send;
    s.recv = recv;
    s.bytes = count * es;
    s.dtype = dtype;
    s.op = op;
    const auto& slots = meet_and_validate(Kind::AllReduce);
    auto lo = [&](int c) { return count / n * c + std::min<std::size_t>(c, count % n); };
    // Phase 1: reduce chunk `rank` of every member's send into our recv chunk. Only we read
    // our own send chunk `rank`, tile before write, so send == recv is safe.
    const std::size_t my_lo = lo(rank_), my_hi = lo(rank_ + 1);
    for (int i = 0; i < n; ++i) ptrs_[i] = static_cast<const char*>(slots[i].send) + my_lo * es;
    reduce(static_cast<char*>(recv) + my_lo * es, ptrs_.data(), n, my_hi - my_lo, dtype, op);
    meet_done();
    // Phase 2: gather the other reduced chunks from the peers' recv buffers. Nobody reads
    // a send buffer any more, so overwriting our (aliased) send chunks is safe.
    for (int k = 1; k < n; ++k) {
      const int i = (rank_ + k) % n;
      const std::size_t a = lo(i), b = lo(i + 1);
      copy_bytes(static_cast<char*>(recv) + a * es,
                 static_cast<const char*>(slots[i].recv) + a * es, (b - a) * es);
    }
    meet_done();
  }

  void do_all_to_all(const void* send, void* recv, std::size_t bytes) {
    const int n = g_->n;
    // Peers read block `their rank` of our send while we write our recv: any overlap
    // (including in place) goes through scratch.
    if (overlaps(send, n * bytes, recv, n * bytes)) send = stage(send, n * bytes);
    ThreadSlot& s = begin(Kind::AllToAll);
    s.send = send;
    s.recv = recv;
    s.bytes = bytes;
    const auto& slots = meet_and_validate(Kind::AllToAll);
    char* out = static_cast<char*>(recv);
    for (int k = 0; k < n; ++k) {
      const int i = (rank_ + k) % n;
      copy_bytes(out + static_cast<std::size_t>(i) * bytes,
                 static_cast<const char*>(slots[i].send) + static_cast<std::size_t>(rank_) * bytes,
                 bytes);
    }
    meet_done();
  }

  void do_collective_permute(const void* send, int send_to, void* recv, int recv_from,
                             std::size_t bytes) {
    const int n = g_->n;
    if (send_to < -1 || send_to >= n || recv_from < -1 || recv_from >= n) {
      fail("collective_permute", "rank " + std::to_string(rank_) + " of " + g_->describe() +
                                     " got send_to=" + std::to_string(send_to) + " recv_from=" +
                                     std::to_string(recv_from) + "; both must be in [-1, " +
                                     std::to_string(n) + ")");
    }
    // A peer reads our send while we overwrite our recv: stage any overlap, except the
    // exact in-place copy to ourselves (a no-op).
    if (send_to >= 0 && recv_from >= 0 && overlaps(send, bytes, recv, bytes) &&
        !(send == recv && recv_from == rank_))
      send = stage(send, bytes);
    ThreadSlot& s = begin(Kind::Permute);
    s.send = send;
    s.recv = recv;
    s.bytes = bytes;
    s.peer_a = send_to;
    s.peer_b = recv_from;
    const auto& slots = meet_and_validate(Kind::Permute);
    if (recv_from >= 0) copy_bytes(recv, slots[recv_from].send, bytes);
    meet_done();
  }

  // A send is two halves: post (publish the buffer) and wait (until the receiver copied
  // it). A plain send does both; a group posts all its sends before running its receives.
  void send_post(const void* buf, std::size_t bytes, int peer) {
    check_peer("send", peer);
    auto& g = *g_;
    auto& ch = g.p2p[static_cast<std::size_t>(rank_) * g.n + peer];
    std::unique_lock<std::mutex> lk(g.mu);
    if (world_->aborted()) throw aborted_error("send");
    if (ch.state != detail::P2PChannel::Empty) {
      lk.unlock();
      fail("send", "two sends from rank " + std::to_string(rank_) + " to rank " +
                       std::to_string(peer) + " of " + g.describe() +
                       " at once (use one stream per device and group sends)");
    }
    ch.ptr = buf;
    ch.bytes = bytes;
    ch.state = detail::P2PChannel::Posted;
    g.cv.notify_all();
  }

  void send_wait(int peer) {
    auto& g = *g_;
    auto& ch = g.p2p[static_cast<std::size_t>(rank_) * g.n + peer];
    std::unique_lock<std::mutex> lk(g.mu);
    const auto deadline = deadline_from_now();
    // Leave early only while the receiver has not taken our buffer.
    auto ready = [&] {
      return ch.state == detail::P2PChannel::Done ||
             (ch.state == detail::P2PChannel::Posted && world_->aborted());
    };
    while (!ready()) {
      if (!wait_step(lk, deadline) && ch.state == detail::P2PChannel::Posted) {
        ch.state = detail::P2PChannel::Empty;
        lk.unlock();
        timeout_fail("send", "rank " + std::to_string(rank_) + " waits for rank " +
                                 std::to_string(peer) + " to post the matching recv");
      }
    }
    const bool done = ch.state == detail::P2PChannel::Done;
    ch.state = detail::P2PChannel::Empty;
    ch.ptr = nullptr;
    if (!done) throw aborted_error("send");
  }

  void do_send(const void* buf, std::size_t bytes, int peer) {
    send_post(buf, bytes, peer);
    send_wait(peer);
  }

  void do_recv(void* buf, std::size_t bytes, int peer) {
    check_peer("recv", peer);
    auto& g = *g_;
    auto& ch = g.p2p[static_cast<std::size_t>(peer) * g.n + rank_];
    std::unique_lock<std::mutex> lk(g.mu);
    const auto deadline = deadline_from_now();
    while (ch.state != detail::P2PChannel::Posted) {
      if (world_->aborted()) throw aborted_error("recv");
      if (!wait_step(lk, deadline) && ch.state != detail::P2PChannel::Posted) {
        lk.unlock();
        timeout_fail("recv", "rank " + std::to_string(rank_) + " waits for rank " +
                                 std::to_string(peer) + " to post the matching send");
      }
    }
    if (ch.bytes != bytes) {
      const std::size_t sent = ch.bytes;
      lk.unlock();  // the sender sees the abort with its buffer not taken and leaves
      fail("recv", "rank " + std::to_string(rank_) + " of " + g.describe() + " receives " +
                       std::to_string(bytes) + " bytes but rank " + std::to_string(peer) +
                       " sends " + std::to_string(sent));
    }
    ch.state = detail::P2PChannel::Taken;
    const void* src = ch.ptr;
    lk.unlock();
    copy_bytes(buf, src, bytes);
    lk.lock();
    ch.state = detail::P2PChannel::Done;
    g.cv.notify_all();
  }

  void do_broadcast(void* buf, std::size_t bytes, int root) {
    if (root < 0 || root >= g_->n)
      fail("broadcast", "root " + std::to_string(root) + " is not a rank of " + g_->describe());
    ThreadSlot& s = begin(Kind::Broadcast);
    s.send = buf;
    s.recv = buf;
    s.bytes = bytes;
    s.peer_a = root;
    const auto& slots = meet_and_validate(Kind::Broadcast);
    if (rank_ != root) copy_bytes(buf, slots[root].send, bytes);
    meet_done();
  }

  void do_barrier() {
    begin(Kind::Barrier);
    meet_and_validate(Kind::Barrier);
  }

 private:
  // One call of a group: a send (fn empty) or any other call (fn).
  struct GroupOp {
    std::function<void()> fn;
    const void* buf = nullptr;
    std::size_t bytes = 0;
    int peer = -1;
    double wire_bytes = -1;  // LinkModel: bytes this call moves (< 0: none)
    int link = -1;           // the peer it sends to (-1: every link, a collective)
  };

  // Members other than this one (the link model's ring factor).
  double others() const { return static_cast<double>(g_->n - 1); }

  // The link model: sleep until `t0 + seconds` (the wall time the transfer takes on the link).
  static void hold_until(Clock::time_point t0, double seconds) {
    if (seconds <= 0) return;
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  }

  void group_stream(Stream& s) {
    if (group_stream_ && group_stream_ != &s)
      throw RuntimeError("tessel: a group on " + g_->describe() + " (rank " + std::to_string(rank_) +
                         ") mixes streams; enqueue every call of a group on one stream");
    group_stream_ = &s;
  }

  // wire_bytes: what the call moves on one link (LinkModel); < 0: nothing leaves the device.
  // link: the peer a point-to-point call sends to (-1: a collective over the whole group).
  void submit(Stream& s, std::function<void()> fn, double wire_bytes, int link = -1) {
    const double model_s = wire_bytes < 0 || g_->n < 2 ? 0.0 : link_.seconds(wire_bytes);
    if (in_group_) {
      group_stream(s);
      group_.push_back(GroupOp{std::move(fn), nullptr, 0, -1, g_->n < 2 ? -1.0 : wire_bytes, link});
      return;
    }
    if (model_s > 0) {
      detail::cpu_stream(s, "thread communicator").enqueue([fn = std::move(fn), model_s] {
        const auto t0 = Clock::now();
        fn();
        hold_until(t0, model_s);
      });
      return;
    }
    detail::cpu_stream(s, "thread communicator").enqueue(std::move(fn));
  }

  // Posts every send, runs the other calls in order, then waits for the sends. On an error
  // the world is aborted first, so that the sends left are withdrawn (or finish being read)
  // and no peer can read our buffers after we leave.
  void run_group(std::vector<GroupOp>& ops) {
    std::vector<int> posted;
    const auto t0 = Clock::now();
    // The calls of a group use their links at once: bytes to one peer share that link, the
    // group takes the busiest link's time.
    std::map<int, double> per_link;
    for (const auto& op : ops)
      if (op.wire_bytes >= 0) per_link[op.link] += op.wire_bytes;
    double model_s = 0;
    for (const auto& [peer, bytes] : per_link) model_s = std::max(model_s, link_.seconds(bytes));
    try {
      for (const auto& op : ops)
        if (!op.fn) {
          send_post(op.buf, op.bytes, op.peer);
          posted.push_back(op.peer);
        }
      for (const auto& op : ops)
        if (op.fn) op.fn();
      while (!posted.empty()) {
        const int peer = posted.back();
        posted.pop_back();
        send_wait(peer);
      }
      hold_until(t0, model_s);
    } catch (const std::exception& e) {
      world_->abort(std::string("tessel: group on ") + g_->describe() + " failed: " + e.what());
      for (int peer : posted) {
        try {
          send_wait(peer);
        } catch (...) {
        }
      }
      throw;
    }
  }

  [[noreturn]] void fail(const char* what, const std::string& msg) {
    const std::string full = std::string("tessel: ") + what + ": " + msg;
    world_->abort(full);
    throw RuntimeError(full);
  }

  RuntimeError aborted_error(const char* what) const {
    return RuntimeError(std::string("tessel: ") + what + " on " + g_->describe() + " (rank " +
                        std::to_string(rank_) + ") aborted: " + world_->abort_reason());
  }

  void check_peer(const char* what, int peer) {
    if (peer < 0 || peer >= g_->n || peer == rank_)
      fail(what, "peer " + std::to_string(peer) + " of rank " + std::to_string(rank_) +
                     " is not another rank of " + g_->describe());
  }

  const void* stage(const void* src, std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    copy_bytes(scratch_.data(), src, bytes);
    return scratch_.data();
  }

  // Starts a collective call: checks the world and returns our slot for it.
  ThreadSlot& begin(Kind kind) {
    if (world_->aborted()) throw aborted_error(kind_name(kind));
    const uint64_t seq = g_->call_seq[rank_]++;
    parity_ = static_cast<int>(seq & 1);
    ThreadSlot& s = g_->slots[parity_][rank_];
    s = ThreadSlot{};
    s.kind = kind;
    return s;
  }

  Clock::time_point deadline_from_now() const {
    const double t = world_->options().timeout_seconds;
    if (!(t > 0) || std::isinf(t)) return Clock::time_point::max();  // 0 or inf: none
    const auto now = Clock::now();
    // Convert in double and compare before casting: a deadline past the clock's range (about
    // 292 years of nanoseconds) would overflow the integer conversion; it means "never".
    const double left = std::chrono::duration<double>(Clock::time_point::max() - now).count();
    if (t >= left) return Clock::time_point::max();
    return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
  }

  // One wait on the group condvar; false when the deadline passed.
  bool wait_step(std::unique_lock<std::mutex>& lk, Clock::time_point deadline) {
    if (deadline == Clock::time_point::max()) {
      g_->cv.wait(lk);
      return true;
    }
    return g_->cv.wait_until(lk, deadline) == std::cv_status::no_timeout ||
           Clock::now() < deadline;
  }

  [[noreturn]] void timeout_fail(const char* what, const std::string& detail) {
    std::ostringstream os;
    os << "tessel: " << what << " on " << g_->describe() << " timed out after "
       << world_->options().timeout_seconds << " s: " << detail;
    world_->abort(os.str());
    throw RuntimeError(os.str());
  }

  // Barrier. `abortable`: may leave (throwing) when the world is aborted or the timeout
  // passes, withdrawing our arrival so the phase can never complete without us.
  void meet(const char* what, bool abortable) {
    auto& g = *g_;
    std::unique_lock<std::mutex> lk(g.mu);
    const uint64_t target = g.gen.load(std::memory_order_relaxed) + 1;
    g.arrived[rank_] = target;
    if (++g.count == g.n) {
      g.count = 0;
      g.gen.store(target, std::memory_order_release);
      lk.unlock();
      g.cv.notify_all();
      return;
    }
    if (spin_.budget_us() > 0) {
      lk.unlock();
      bool aborted = false;
      const bool met = spin_([&] {
        aborted = abortable && world_->aborted();
        return aborted || g.gen.load(std::memory_order_acquire) >= target;
      });
      if (met && !aborted) return;
      lk.lock();
    }
    const auto deadline = abortable ? deadline_from_now() : Clock::time_point::max();
    while (g.gen.load(std::memory_order_acquire) < target) {
      if (abortable && world_->aborted()) {
        --g.count;
        g.arrived[rank_] = target - 1;
        throw aborted_error(what);
      }
      if (!wait_step(lk, deadline) && g.gen.load(std::memory_order_acquire) < target) {
        std::ostringstream os;
        os << "rank " << rank_ << " waits; ranks not arrived: [";
        bool first = true;
        for (int i = 0; i < g.n; ++i) {
          if (g.arrived[i] < target) {
            os << (first ? "" : ",") << i << " (device " << g.members[i] << ")";
            first = false;
          }
        }
        os << "]";
        --g.count;
        g.arrived[rank_] = target - 1;
        lk.unlock();
        timeout_fail(what, os.str());
      }
    }
  }

  // Barrier A plus the check that every member is making the same call.
  const std::vector<ThreadSlot>& meet_and_validate(Kind kind) {
    meet(kind_name(kind), /*abortable=*/true);
    const auto& slots = g_->slots[parity_];
    const ThreadSlot& a = slots[0];
    const int n = g_->n;
    auto describe = [](int r, const ThreadSlot& s) {
      std::ostringstream os;
      os << "rank " << r << " called " << kind_name(s.kind) << "(bytes=" << s.bytes;
      if (s.kind == Kind::ReduceScatter || s.kind == Kind::AllReduce)
        os << ", " << dtype_str(s.dtype) << ", " << (s.op == ReduceOp::Sum ? "sum" : "max");
      if (s.kind == Kind::Broadcast) os << ", root=" << s.peer_a;
      if (s.kind == Kind::Permute) os << ", send_to=" << s.peer_a << ", recv_from=" << s.peer_b;
      os << ")";
      return os.str();
    };
    // Every member runs the same checks on the same slots, so all of them agree.
    for (int i = 1; i < n; ++i) {
      const ThreadSlot& b = slots[i];
      const bool same = a.kind == b.kind && a.bytes == b.bytes && a.dtype == b.dtype &&
                        a.op == b.op &&
                        (a.kind != Kind::Broadcast || a.peer_a == b.peer_a);
      if (!same) {
        // Not fail(): every member throws the same error; abort() keeps the first reason.
        const std::string msg = std::string("tessel: collective mismatch on ") +
                                g_->describe() + ": " + describe(0, a) + " but " +
                                describe(i, b);
        // Nobody has touched a buffer yet, and begin() refuses new calls once aborted, so
        // the slots stay intact while the others read them.
        world_->abort(msg);
        throw RuntimeError(msg);
      }
    }
    if (kind == Kind::Permute) {
      for (int i = 0; i < n; ++i) {
        const int to = slots[i].peer_a, from = slots[i].peer_b;
        const bool ok = (from < 0 || slots[from].peer_a == i) && (to < 0 || slots[to].peer_b == i);
        if (!ok) {
          const int other = (from >= 0 && slots[from].peer_a != i) ? from : to;
          const std::string msg = std::string("tessel: collective_permute on ") +
                                  g_->describe() + ": inconsistent pattern, " +
                                  describe(i, slots[i]) + " but " +
                                  describe(other, slots[other]);
          world_->abort(msg);
          throw RuntimeError(msg);
        }
      }
    }
    return slots;
  }

  void meet_done() { meet("collective", /*abortable=*/false); }

  ThreadWorld* world_;
  std::shared_ptr<ThreadGroupState> g_;
  int rank_;
  detail::SpinWait spin_;
  LinkModel link_;
  int parity_ = 0;
  std::vector<const void*> ptrs_;
  std::vector<char> scratch_;
  // Host side (the thread that enqueues): the open group, if any.
  bool in_group_ = false;
  Stream* group_stream_ = nullptr;
  std::vector<GroupOp> group_;
};

}  // namespace

std::unique_ptr<Communicator> detail::make_thread_communicator(
    ThreadWorld* world, std::shared_ptr<ThreadGroupState> group, int rank, int spin_us,
    LinkModel link) {
  return std::make_unique<ThreadCommunicator>(world, std::move(group), rank, spin_us, link);
}

}  // namespace tessel
