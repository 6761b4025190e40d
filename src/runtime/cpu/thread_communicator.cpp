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
#include "tessel/runtime/cpu/thread_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

#include "cpu_stream.hpp"
#include "spin.hpp"

namespace tessel {
namespace {

enum class Kind : int {
  None,
  AllGather,
  ReduceScatter,
  AllReduce,
  AllToAll,
  Permute,
  Broadcast,
  Barrier
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "none";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllReduce: return "all_reduce";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Permute: return "collective_permute";
    case Kind::Broadcast: return "broadcast";
    case Kind::Barrier: return "barrier";
  }
  return "?";
}

// ---- bf16 / f16 <-> f32 (private and inline: the reduction loops must vectorise) ----

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_to_float(uint16_t v) { return float_of(static_cast<uint32_t>(v) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // qNaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: m·2^-24
    return float_of(bits_of(mag) | sign);
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}
// Round to nearest even (F. Giesen's float_to_half_fast3_rtne).
inline uint16_t float_to_f16(float f) {
  uint32_t u = bits_of(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= (127u + 16u) << 23) {
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {
    const uint32_t magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    o = bits_of(float_of(u) + float_of(magic_u)) - magic_u;
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mant_odd;
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

struct F32T {
  using Store = float;
  using Acc = float;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct I32T {
  using Store = int32_t;
  using Acc = int32_t;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct BF16T {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return bf16_to_float(v); }
  static Store store(Acc v) { return float_to_bf16(v); }
};
struct F16T {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return f16_to_float(v); }
  static Store store(Acc v) { return float_to_f16(v); }
};

struct SumOp {
  static float apply(float a, float b) { return a + b; }
  // Two's complement wrap-around instead of signed-overflow UB.
  static int32_t apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
struct MaxOp {
  // NaN-propagating: a NaN anywhere makes the result NaN, whatever the member order.
  static float apply(float a, float b) { return (b > a || b != b) ? b : a; }
  static int32_t apply(int32_t a, int32_t b) { return b > a ? b : a; }
};

// out[k] = src[0][k] op src[1][k] op ... op src[n-1][k], member order 0..n-1 (so every
// member computing an element gets the same bits). Works tile by tile through an
// accumulator that stays in L1, reading every source of a tile before writing that tile:
// `out` may therefore alias one of the sources exactly (in-place reduce_scatter and
// all_reduce). bf16/f16 accumulate in f32 and round once.
template <class T, class Op>
__attribute__((always_inline)) inline void reduce_tile(typename T::Store* out,
                                                       const void* const* src_v, int n,
                                                       std::size_t base, std::size_t m,
                                                       typename T::Acc* acc) {
  using Store = typename T::Store;
  const Store* s0 = static_cast<const Store*>(src_v[0]) + base;
  for (std::size_t k = 0; k < m; ++k) acc[k] = T::load(s0[k]);
  for (int i = 1; i < n; ++i) {
    const Store* si = static_cast<const Store*>(src_v[i]) + base;
    for (std::size_t k = 0; k < m; ++k) acc[k] = Op::apply(acc[k], T::load(si[k]));
  }
  for (std::size_t k = 0; k < m; ++k) out[base + k] = T::store(acc[k]);
}

template <class T, class Op>
void reduce_typed(void* out_v, const void* const* src_v, int n, std::size_t count) {
  constexpr std::size_t kTile = 2048;
  typename T::Acc acc[kTile];
  auto* out = static_cast<typename T::Store*>(out_v);
  std::size_t base = 0;
  // Full tiles with a compile-time trip count: GCC's -O2 vectoriser (very-cheap cost model)
  // only vectorises loops that need no scalar epilogue; this makes f32 sums ~2x faster.
  for (; base + kTile <= count; base += kTile)
    reduce_tile<T, Op>(out, src_v, n, base, kTile, acc);
  if (base < count) reduce_tile<T, Op>(out, src_v, n, base, count - base, acc);
}

template <class Op>
void reduce_op(void* out, const void* const* src, int n, std::size_t count, DType dtype) {
  switch (dtype) {
    case DType::f32: return reduce_typed<F32T, Op>(out, src, n, count);
    case DType::i32: return reduce_typed<I32T, Op>(out, src, n, count);
    case DType::bf16: return reduce_typed<BF16T, Op>(out, src, n, count);
    case DType::f16: return reduce_typed<F16T, Op>(out, src, n, count);
  }
}

void reduce(void* out, const void* const* src, int n, std::size_t count, DType dtype,
            ReduceOp op) {
  if (count == 0) return;
  if (op == ReduceOp::Sum)
    reduce_op<SumOp>(out, src, n, count, dtype);
  else
    reduce_op<MaxOp>(out, src, n, count, dtype);
}

std::size_t elem_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 4;
}
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

}  // namespace

namespace detail {

// What one member publishes for one call.
struct alignas(64) ThreadSlot {
  Kind kind = Kind::None;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t bytes = 0;  // per-block bytes (all_gather, all_to_all, permute, broadcast) or
                          // count·elem_size (reduce_scatter: the recv block; all_reduce)
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::Sum;
  int peer_a = -1;  // broadcast root; permute send_to
  int peer_b = -1;  // permute recv_from
};

// A send/recv rendezvous from one rank to another.
struct P2PChannel {
  enum State { Empty, Posted, Taken, Done };
  State state = Empty;
  const void* ptr = nullptr;
  std::size_t bytes = 0;
};

struct ThreadGroupState {
  ThreadGroupState(std::vector<std::string> axes_, std::vector<int64_t> members_)
      : axes(std::move(axes_)), members(std::move(members_)),
        n(static_cast<int>(members.size())),
        arrived(static_cast<std::size_t>(n), 0),
        call_seq(static_cast<std::size_t>(n), 0),
        p2p(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)) {
    slots[0].resize(static_cast<std::size_t>(n));
    slots[1].resize(static_cast<std::size_t>(n));
  }

  std::string describe() const {
    std::ostringstream os;
    os << "group {";
    for (std::size_t i = 0; i < axes.size(); ++i) os << (i ? "," : "") << axes[i];
    os << "} devices [";
    for (std::size_t i = 0; i < members.size(); ++i) os << (i ? "," : "") << members[i];
    os << "]";
    return os.str();
  }

  const std::vector<std::string> axes;
  const std::vector<int64_t> members;
  const int n;

  std::mutex mu;
  std::condition_variable cv;
  // Barrier: members arrived at the current phase, and the number of completed phases.
  int count = 0;                       // guarded by mu
  std::atomic<uint64_t> gen{0};        // written under mu, read lock-free by spinners
  std::vector<uint64_t> arrived;       // guarded by mu: last phase each rank arrived at
  // Per rank, only touched by that rank's thread: number of collective calls made.
  std::vector<uint64_t> call_seq;
  std::vector<ThreadSlot> slots[2];    // [call parity][rank]
  std::vector<P2PChannel> p2p;         // [from * n + to], guarded by mu
};

}  // namespace detail

namespace {

using detail::ThreadGroupState;
using detail::ThreadSlot;
using Clock = std::chrono::steady_clock;

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

ThreadWorld::ThreadWorld(const Mesh& mesh, ThreadWorldOptions options)
    : mesh_(mesh), options_(options) {
  if (std::isnan(options_.timeout_seconds) || options_.timeout_seconds < 0)
    throw RuntimeError(fmt::format("tessel: ThreadWorldOptions::timeout_seconds must be >= 0 "
                                   "(0 or inf: no timeout), got {}", options_.timeout_seconds));
  // Automatic: one thread per device is the caller's usual set-up (ThreadRuntime passes its own
  // budget, counting its stream workers too).
  spin_us_ = detail::spin_budget_us(options_.spin_us, mesh_.num_devices());
}

ThreadWorld::~ThreadWorld() = default;

void ThreadWorld::set_spin_us(int spin_us) {
  if (spin_us < 0) throw RuntimeError(fmt::format("ThreadWorld::set_spin_us: {} us is negative", spin_us));
  std::lock_guard<std::mutex> lk(mutex_);
  spin_us_ = spin_us;
}

LinkModel LinkModel::parse(const std::string& spec) {
  LinkModel m;
  std::size_t b = 0;
  bool bw = false;
  while (b < spec.size()) {
    std::size_t e = spec.find(',', b);
    const std::string part = spec.substr(b, e == std::string::npos ? std::string::npos : e - b);
    b = e == std::string::npos ? spec.size() : e + 1;
    const auto eq = part.find('=');
    const std::string key = part.substr(0, eq);
    char* end = nullptr;
    const std::string text = eq == std::string::npos ? std::string() : part.substr(eq + 1);
    const double v = text.empty() ? NAN : std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 || (key != "alpha_us" && key != "gbps"))
      throw RuntimeError(fmt::format("link model '{}': bad entry '{}' (expected alpha_us=MICROSECONDS,gbps=GB_PER_S, "
                                     "e.g. alpha_us=5,gbps=10)", spec, part));
    if (key == "alpha_us") m.alpha_s = v * 1e-6;
    else {
      if (v <= 0) throw RuntimeError(fmt::format("link model '{}': gbps must be > 0", spec));
      m.bandwidth = v * 1e9;
      bw = true;
    }
  }
  if (!spec.empty() && !bw) throw RuntimeError(fmt::format("link model '{}': gbps= is missing", spec));
  return m;
}

LinkModel LinkModel::from_env() {
  const char* e = std::getenv("TESSEL_LINK_MODEL");
  if (!e || !*e) return {};
  try {
    return parse(e);
  } catch (const RuntimeError& err) {
    throw RuntimeError(fmt::format("TESSEL_LINK_MODEL: {}", err.what()));
  }
}

std::unique_ptr<Communicator> ThreadWorld::communicator(int64_t position,
                                                        const std::vector<std::string>& axes) {
  check_not_aborted("communicator");
  if (position < 0 || position >= mesh_.num_devices())
    throw MeshError("tessel: ThreadWorld::communicator: position " + std::to_string(position) +
                    " is not a device of mesh " + mesh_.to_string() + " (0.." +
                    std::to_string(mesh_.num_devices() - 1) + ")");
  // Throws MeshError naming an unknown or repeated axis.
  std::vector<int64_t> members = mesh_.group(position, axes);
  const auto it = std::find(members.begin(), members.end(), position);
  if (it == members.end())
    throw MeshError("tessel: ThreadWorld::communicator: mesh group of device " +
                    std::to_string(position) + " does not contain it");
  const int rank = static_cast<int>(it - members.begin());
  std::shared_ptr<detail::ThreadGroupState> state;
  int spin_us = 0;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    spin_us = spin_us_;  // set_spin_us may change it
    auto key = std::make_pair(axes, members);
    auto found = groups_.find(key);
    if (found == groups_.end())
      found = groups_
                  .emplace(std::move(key),
                           std::make_shared<detail::ThreadGroupState>(axes, members))
                  .first;
    state = found->second;
  }
  return std::make_unique<ThreadCommunicator>(this, std::move(state), rank, spin_us, options_.link_model);
}

void ThreadWorld::abort(std::string reason) {
  std::vector<std::shared_ptr<detail::ThreadGroupState>> groups;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!aborted_.load(std::memory_order_relaxed)) {
      reason_ = std::move(reason);
      aborted_.store(true, std::memory_order_release);
    }
    groups.reserve(groups_.size());
    for (auto& kv : groups_) groups.push_back(kv.second);
  }
  // Lock each group's mutex once so a member between its predicate check and its wait
  // cannot miss the notification.
  for (auto& g : groups) {
    { std::lock_guard<std::mutex> lk(g->mu); }
    g->cv.notify_all();
  }
}

std::string ThreadWorld::abort_reason() const {
  std::lock_guard<std::mutex> lk(mutex_);
  return reason_;
}

void ThreadWorld::check_not_aborted(const char* what) const {
  if (aborted())
    throw RuntimeError(std::string("tessel: ") + what + ": the thread world of mesh " +
                       mesh_.to_string() + " was aborted: " + abort_reason());
}

}  // namespace tessel
