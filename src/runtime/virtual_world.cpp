// The virtual-device collective protocol (virtual_world.hpp): one implementation on the
// Backend/Stream/Event contract for the CUDA backend's one-process world and the CPU streams.
#include "virtual_world.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "comm_call.hpp"
#include "tessel/runtime/communicator.hpp"

namespace tessel {
namespace detail {
namespace {

using Kind = CommCall;
const char* kind_name(Kind k) { return comm_call_name(k); }

struct Post {
  Kind kind = Kind::Barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t bytes = 0;  // per block (all_gather, all_to_all, permute, p2p) or count * elem
  std::size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::Sum;
  int send_to = -1, recv_from = -1, root = -1;
  Event* ready = nullptr;
  Event* done = nullptr;
};

class World;

// A rendezvous among n members that exchanges one Post each.
struct Channel {
  explicit Channel(int n) : posts(static_cast<std::size_t>(n)), ready(static_cast<std::size_t>(n)),
                            done(static_cast<std::size_t>(n)) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Post> posts, result;
  int arrived = 0;
  uint64_t gen = 0;
  std::vector<std::unique_ptr<Event>> ready, done;  // per member, made by the member on its device

  std::vector<Post> exchange(World& w, int me, const Post& p, const std::string& what);
};

struct GroupState {
  explicit GroupState(std::vector<int64_t> m) : members(std::move(m)), all(static_cast<int>(members.size())) {}
  std::vector<int64_t> members;
  Channel all;
  std::mutex pairs_mu;
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> pairs;
  Channel& pair(int a, int b) {
    std::lock_guard<std::mutex> lk(pairs_mu);
    auto& c = pairs[{std::min(a, b), std::max(a, b)}];
    if (!c) c = std::make_unique<Channel>(2);
    return *c;
  }
};

class World : public CollectiveWorld {
 public:
  World(const Mesh& mesh, double timeout_seconds, std::shared_ptr<VirtualDeviceOps> ops)
      : mesh_(mesh), timeout_(timeout_seconds), ops_(std::move(ops)) {
    if (!(timeout_seconds >= 0))
      throw RuntimeError(fmt::format("{} world: timeout_seconds must be >= 0, got {}", ops_->name(), timeout_seconds));
  }
  std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) override;
  void abort(std::string reason) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_.load()) return;
      reason_ = std::move(reason);
      aborted_.store(true, std::memory_order_release);
    }
  }
  bool aborted() const override { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return reason_;
  }
  void check(const std::string& what) const {
    if (!aborted()) return;
    std::lock_guard<std::mutex> lk(mu_);
    throw RuntimeError(fmt::format("{}: the collective world was aborted: {}", what, reason_));
  }
  double timeout() const { return timeout_; }
  VirtualDeviceOps& ops() const { return *ops_; }

 private:
  Mesh mesh_;
  double timeout_;
  std::shared_ptr<VirtualDeviceOps> ops_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
  std::map<std::pair<std::vector<std::string>, std::vector<int64_t>>, std::shared_ptr<GroupState>> groups_;
};

std::vector<Post> Channel::exchange(World& w, int me, const Post& p, const std::string& what) {
  w.check(what);
  std::unique_lock<std::mutex> lk(mu);
  posts[static_cast<std::size_t>(me)] = p;
  const uint64_t my_gen = gen;
  if (++arrived == static_cast<int>(posts.size())) {
    arrived = 0;
    result = posts;
    ++gen;
    cv.notify_all();
    return result;
  }
  const auto start = std::chrono::steady_clock::now();
  // Polls so that abort() (which does not know the channels) wakes every waiter promptly.
  while (gen == my_gen) {
    cv.wait_for(lk, std::chrono::milliseconds(20));
    if (gen != my_gen) break;
    if (w.aborted()) {
      --arrived;
      lk.unlock();
      w.check(what);
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (w.timeout() > 0 && waited > w.timeout()) {
      --arrived;
      lk.unlock();
      const std::string msg = fmt::format("{}: timed out after {:.3g} s waiting for its peers", what, waited);
      w.abort(msg);
      throw RuntimeError(msg);
    }
  }
  return result;
}

class VirtualCommunicator : public Communicator {
 public:
  VirtualCommunicator(World& w, std::shared_ptr<GroupState> g, int rank, int64_t position)
      : w_(w), g_(std::move(g)), rank_(rank), position_(position) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(g_->members.size()); }

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    Post p{Kind::AllGather, send, recv, bytes};
    issue(p, s);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& s) override {
    Post p{Kind::ReduceScatter, send, recv, count * dtype_size(dtype), count, dtype, op};
    issue(p, s);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, Stream& s) override {
    Post p{Kind::AllReduce, send, recv, count * dtype_size(dtype), count, dtype, op};
    issue(p, s);
  }
  void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) override {
    Post p{Kind::AllToAll, send, recv, bytes};
    issue(p, s);
  }
  void collective_permute(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes,
                          Stream& s) override {
    Post p{Kind::Permute, send, recv, bytes};
    p.send_to = send_to;
    p.recv_from = recv_from;
    issue(p, s);
  }
  void broadcast(void* buf, std::size_t bytes, int root, Stream& s) override {
    Post p{Kind::Broadcast, buf, buf, bytes};
    p.root = root;
    issue(p, s);
  }
  void barrier(Stream& s) override { issue(Post{Kind::Barrier}, s); }
  void send(const void* buf, std::size_t bytes, int peer, Stream& s) override {
    Post p{Kind::P2P, buf, nullptr, bytes};
    p.send_to = peer;
    issue(p, s);
  }
  void recv(void* buf, std::size_t bytes, int peer, Stream& s) override {
    Post p{Kind::P2P, nullptr, buf, bytes};
    p.recv_from = peer;
    issue(p, s);
  }
  void group_start() override {
    if (in_group_) throw RuntimeError(w_.ops().name() + ": group_start inside a group (groups do not nest)");
    in_group_ = true;
  }
  void group_end() override {
    if (!in_group_) throw RuntimeError(w_.ops().name() + ": group_end without group_start");
    in_group_ = false;
    std::vector<std::pair<Post, Stream*>> ops;
    ops.swap(queued_);
    run(ops);
  }
  void abort(const std::string& reason) override { w_.abort(reason); }

 private:
  std::string what(Kind k) const {
    return fmt::format("{} of device {} (rank {} of {} in group {})", kind_name(k), position_, rank_, size(),
                       shape_str(g_->members));
  }

  void issue(const Post& p, Stream& s) {
    if (in_group_) {
      queued_.push_back({p, &s});
      return;
    }
    run({{p, &s}});
  }

  // Collectives in order, then the point-to-point ops coalesced per peer, peers in ascending
  // order (a global order on pairs: no two members wait for each other crosswise).
  void run(const std::vector<std::pair<Post, Stream*>>& ops) {
    std::map<int, std::pair<Post, Stream*>> per_peer;
    for (const auto& [p, s] : ops) {
      if (p.kind != Kind::P2P) {
        protocol(g_->all, rank_, p, *s);
        continue;
      }
      const int peer = p.send_to >= 0 ? p.send_to : p.recv_from;
      if (peer < 0 || peer >= size() || peer == rank_)
        throw RuntimeError(fmt::format("{}: peer {} is not another member of the group", what(p.kind), peer));
      // Normalised: bytes = bytes sent (0: none), count = bytes received (0: none).
      Post n = p;
      n.count = p.recv ? p.bytes : 0;
      n.bytes = p.send ? p.bytes : 0;
      auto it = per_peer.find(peer);
      if (it == per_peer.end()) {
        per_peer[peer] = {n, s};
        continue;
      }
      Post& q = it->second.first;
      if ((n.send && q.send) || (n.recv && q.recv))
        throw RuntimeError(fmt::format("{}: two sends or two receives with peer {} in one group", what(p.kind), peer));
      if (n.send) q.send = n.send, q.send_to = n.send_to, q.bytes = n.bytes;
      if (n.recv) q.recv = n.recv, q.recv_from = n.recv_from, q.count = n.count;
    }
    for (auto& [peer, ps] : per_peer) protocol(g_->pair(rank_, peer), rank_ < peer ? 0 : 1, ps.first, *ps.second);
  }

  void protocol(Channel& ch, int me, Post p, Stream& s) {
    VirtualDeviceOps& ops = w_.ops();
    const std::string label = what(p.kind);
    ops.before_collective(s);
    const std::size_t m = static_cast<std::size_t>(me);
    // Only this member touches its own slots (the others read them after the rendezvous).
    if (!ch.ready[m]) {
      ch.ready[m] = ops.create_event(s);
      ch.done[m] = ops.create_event(s);
    }
    ch.ready[m]->record(s);
    p.ready = ch.ready[m].get();
    p.done = ch.done[m].get();
    const std::vector<Post> posts = ch.exchange(w_, me, p, label);
    for (const Post& q : posts)
      if (q.kind != p.kind || (p.kind != Kind::P2P && p.kind != Kind::Permute && q.bytes != p.bytes)) {
        const std::string msg = fmt::format("{}: members disagree ({} of {} bytes vs {} of {} bytes)", label,
                                            kind_name(p.kind), p.bytes, kind_name(q.kind), q.bytes);
        w_.abort(msg);
        throw RuntimeError(msg);
      }
    for (std::size_t j = 0; j < posts.size(); ++j)
      if (j != m) posts[j].ready->wait(s);
    void* temp = nullptr;
    try {
      temp = pull(posts, me, p, s);
    } catch (...) {
      // Still meet the peers at the second rendezvous, so they are not left waiting.
      ch.done[m]->record(s);
      ch.exchange(w_, me, p, label);
      throw;
    }
    ch.done[m]->record(s);
    const std::vector<Post> done = ch.exchange(w_, me, p, label);
    for (std::size_t j = 0; j < done.size(); ++j)
      if (j != m) done[j].done->wait(s);
    if (temp) {
      ops.copy(p.recv, temp, recv_bytes(p, static_cast<int>(posts.size())), s);
      ops.free_scratch(temp, s);
    }
  }

  static std::size_t recv_bytes(const Post& p, int n) {
    switch (p.kind) {
      case Kind::AllGather:
      case Kind::AllToAll: return p.bytes * static_cast<std::size_t>(n);
      case Kind::ReduceScatter:
      case Kind::AllReduce:
      case Kind::Permute:
      case Kind::Broadcast: return p.bytes;
      case Kind::P2P: return p.count;
      case Kind::None:
      case Kind::Barrier: return 0;
    }
    return 0;
  }
  static std::size_t send_bytes(const Post& p, int n) {
    switch (p.kind) {
      case Kind::ReduceScatter:
      case Kind::AllToAll: return p.bytes * static_cast<std::size_t>(n);
      default: return p.send ? p.bytes : 0;
    }
  }

  // Enqueues this member's reads; returns the scratch written instead of recv (in place), or null.
  void* pull(const std::vector<Post>& posts, int me, const Post& p, Stream& s) {
    const int n = static_cast<int>(posts.size());
    const std::size_t rb = recv_bytes(p, n), sb = send_bytes(p, n);
    if (rb == 0 || !p.recv) return nullptr;
    // A permute member that receives nothing keeps recv as it is (as the CPU communicator does):
    // no scratch, so nothing unwritten is copied over it.
    if (p.kind == Kind::Permute && p.recv_from < 0) return nullptr;
    const char* s0 = static_cast<const char*>(p.send);
    const char* r0 = static_cast<const char*>(p.recv);
    const bool overlap = p.send && p.kind != Kind::Broadcast && s0 < r0 + rb && r0 < s0 + sb;
    void* temp = overlap ? w_.ops().scratch(rb, s) : nullptr;
    char* dst = static_cast<char*>(temp ? temp : p.recv);
    auto copy = [&](char* to, const void* from, std::size_t bytes) {
      if (bytes && to != from) w_.ops().copy(to, from, bytes, s);
    };
    const auto me_u = static_cast<std::size_t>(me);
    switch (p.kind) {
      case Kind::AllGather:
        for (int j = 0; j < n; ++j) copy(dst + std::size_t(j) * p.bytes, posts[std::size_t(j)].send, p.bytes);
        break;
      case Kind::AllToAll:
        for (int j = 0; j < n; ++j)
          copy(dst + std::size_t(j) * p.bytes, static_cast<const char*>(posts[std::size_t(j)].send) + me_u * p.bytes,
               p.bytes);
        break;
      case Kind::AllReduce:
      case Kind::ReduceScatter: {
        std::vector<const void*> srcs;
        const std::size_t off = p.kind == Kind::ReduceScatter ? me_u * p.bytes : 0;
        for (const Post& q : posts) srcs.push_back(static_cast<const char*>(q.send) + off);
        if (p.count > 0) w_.ops().reduce(srcs, dst, p.dtype, p.op, p.count, s);
        break;
      }
      case Kind::Permute:
        if (p.recv_from >= 0) {
          if (p.recv_from >= n || posts[std::size_t(p.recv_from)].send_to != me)
            throw RuntimeError(fmt::format("{}: member {} does not send to rank {}", what(p.kind), p.recv_from, me));
          copy(dst, posts[std::size_t(p.recv_from)].send, p.bytes);
        }
        break;
      case Kind::Broadcast:
        if (p.root < 0 || p.root >= n) throw RuntimeError(fmt::format("{}: root {} out of range", what(p.kind), p.root));
        copy(dst, posts[std::size_t(p.root)].send, p.bytes);
        break;
      case Kind::P2P: {
        const Post& peer = posts[me_u ^ 1u];
        if (peer.bytes != p.count)
          throw RuntimeError(fmt::format("{}: receiving {} bytes but the peer sends {}", what(p.kind), p.count,
                                         peer.send ? peer.bytes : 0));
        copy(dst, peer.send, p.count);
        break;
      }
      case Kind::None:
      case Kind::Barrier: break;
    }
    return temp;
  }

  World& w_;
  std::shared_ptr<GroupState> g_;
  int rank_;
  int64_t position_;
  bool in_group_ = false;
  std::vector<std::pair<Post, Stream*>> queued_;
};

std::unique_ptr<Communicator> World::communicator(int64_t position, const std::vector<std::string>& axes) {
  check(fmt::format("communicator of device {}", position));
  std::vector<int64_t> members = mesh_.group(position, axes);
  if (ops_->max_group_size() > 0 && members.size() > static_cast<std::size_t>(ops_->max_group_size()))
    throw RuntimeError(fmt::format("{} world: a group of {} devices exceeds the {} a reduction reads", ops_->name(),
                                   members.size(), ops_->max_group_size()));
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), position) - members.begin());
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = groups_[{axes, members}];
    if (!slot) slot = std::make_shared<GroupState>(members);
    g = slot;
  }
  return std::make_unique<VirtualCommunicator>(*this, std::move(g), rank, position);
}

}  // namespace

std::unique_ptr<CollectiveWorld> make_virtual_world(const Mesh& mesh, double timeout_seconds,
                                                    std::shared_ptr<VirtualDeviceOps> ops) {
  return std::make_unique<World>(mesh, timeout_seconds, std::move(ops));
}

}  // namespace detail
}  // namespace tessel
