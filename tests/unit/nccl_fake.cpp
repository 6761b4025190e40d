// The recording fake of NCCL (nccl_fake.hpp): NCCL's semantics on host memory, its rules checked.
#include "nccl_fake.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "tessel/runtime/tensor.hpp"

namespace tessel::test {

using cuda::kNcclInProgress;
using cuda::kNcclInvalidUsage;
using cuda::kNcclRemoteError;
using cuda::kNcclSuccess;
using cuda::nccl_type_name;
using cuda::nccl_type_size;

// A call queued until its thread's group ends.
struct FakeNccl::Op {
  Kind kind = Kind::coll;
  Call call;
  int comm = -1;  // index in comms_ (join: -1)
  std::pair<int, uint64_t> slot;
  NcclComm* out = nullptr;  // split, join
  std::string id;           // join
};

namespace {

bool failed(int r) { return r != kNcclSuccess && r != kNcclInProgress; }

bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  return x < y + bn && y < x + an;
}

// acc[i] = acc[i] (op) x[i] for `count` elements of type t.
void reduce_into(cuda::NcclType t, cuda::NcclRedOp op, unsigned char* acc, const unsigned char* x, std::size_t count) {
  const bool mx = op == cuda::NcclRedOp::max;
  for (std::size_t i = 0; i < count; ++i) switch (t) {
      case cuda::NcclType::u8: acc[i] = mx ? std::max(acc[i], x[i]) : static_cast<unsigned char>(acc[i] + x[i]); break;
      case cuda::NcclType::i32: {
        int32_t a, b;
        std::memcpy(&a, acc + 4 * i, 4);
        std::memcpy(&b, x + 4 * i, 4);
        const int32_t r = mx ? std::max(a, b) : static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
        std::memcpy(acc + 4 * i, &r, 4);
        break;
      }
      case cuda::NcclType::f32: {
        float a, b;
        std::memcpy(&a, acc + 4 * i, 4);
        std::memcpy(&b, x + 4 * i, 4);
        const float r = mx ? std::max(a, b) : a + b;
        std::memcpy(acc + 4 * i, &r, 4);
        break;
      }
      case cuda::NcclType::f16:
      case cuda::NcclType::bf16: {
        uint16_t a, b;
        std::memcpy(&a, acc + 2 * i, 2);
        std::memcpy(&b, x + 2 * i, 2);
        const bool bf = t == cuda::NcclType::bf16;
        const float fa = bf ? bf16_to_f32(a) : f16_to_f32(a), fb = bf ? bf16_to_f32(b) : f16_to_f32(b);
        const float fr = mx ? std::max(fa, fb) : fa + fb;
        const uint16_t r = bf ? f32_to_bf16(fr) : f32_to_f16(fr);
        std::memcpy(acc + 2 * i, &r, 2);
        break;
      }
    }
}

// Bytes of the send buffer a call reads on `rank` of `size`.
std::size_t send_bytes(const FakeNccl::Call& c) {
  const std::size_t e = c.count * nccl_type_size(c.type);
  if (c.op == "ncclRecv") return 0;
  if (c.op == "ncclReduceScatter") return e * static_cast<std::size_t>(c.size);
  if (c.op == "ncclBroadcast") return c.rank == c.peer ? e : 0;
  return e;
}
// Bytes of the receive buffer a call writes.
std::size_t recv_bytes(const FakeNccl::Call& c) {
  const std::size_t e = c.count * nccl_type_size(c.type);
  if (c.op == "ncclSend") return 0;
  return c.op == "ncclAllGather" ? e * static_cast<std::size_t>(c.size) : e;
}

std::string where(const FakeNccl::Call& c) {
  return fmt::format("{} (clique {} rank {} of {})", c.op, c.clique, c.rank, c.size);
}

}  // namespace

FakeNccl::~FakeNccl() = default;

const char* FakeNccl::error_string(int r) {
  switch (r) {
    case 0: return "fake NCCL: no error";
    case 5: return "fake NCCL: invalid usage";
    case 6: return "fake NCCL: remote error (a peer's communicator was aborted)";
    case 7: return "fake NCCL: operation in progress";
    default: return "fake NCCL: injected error";
  }
}

FakeNccl::Thread& FakeNccl::thread_locked() {
  auto it = threads_.find(std::this_thread::get_id());
  if (it == threads_.end()) {
    Thread t;
    t.id = static_cast<int>(threads_.size());
    it = threads_.emplace(std::this_thread::get_id(), std::move(t)).first;
  }
  return it->second;
}

void FakeNccl::violation_locked(std::string what) { violations_.push_back(std::move(what)); }

FakeNccl::NcclComm FakeNccl::handle(int index) const {
  return const_cast<Comm*>(&comms_[static_cast<std::size_t>(index)]);
}

int FakeNccl::new_clique_locked(const std::vector<int>& comms_by_rank) {
  const int id = static_cast<int>(cliques_.size());
  cliques_.push_back(Clique{comms_by_rank});
  for (std::size_t r = 0; r < comms_by_rank.size(); ++r) {
    Comm& c = comms_[static_cast<std::size_t>(comms_by_rank[r])];
    c.clique = id;
    c.rank = static_cast<int>(r);
  }
  return id;
}

// Fills rec's communicator fields; a violation and null for a bad communicator.
FakeNccl::Comm* FakeNccl::comm_locked(NcclComm c, const char* op, Call& rec) {
  auto it = index_of_.find(c);
  if (it == index_of_.end()) {
    violation_locked(fmt::format("{} on {} communicator {}", op, c ? "an unknown" : "a null", c));
    return nullptr;
  }
  Comm& m = comms_[static_cast<std::size_t>(it->second)];
  rec.clique = m.clique;
  rec.rank = m.rank;
  rec.size = m.clique >= 0 ? static_cast<int>(cliques_[static_cast<std::size_t>(m.clique)].members.size()) : 0;
  if (m.aborted) {
    violation_locked(fmt::format("{} after ncclCommAbort of that communicator", where(rec)));
    return nullptr;
  }
  return &m;
}

bool FakeNccl::check_memory_locked(const char* what, const void* p, std::size_t bytes) {
  if (tracked_.empty() || bytes == 0) return true;
  const auto* q = static_cast<const unsigned char*>(p);
  for (const auto& [b, n] : tracked_)
    if (q >= b && q + bytes <= b + n) return true;
  violation_locked(fmt::format("{}: {} bytes at {} lie outside every tracked buffer", what, bytes, p));
  return false;
}

int FakeNccl::record_locked(Call rec) {
  rec.seq = calls_.size();
  calls_.push_back(rec);
  return rec.result;
}

int FakeNccl::failure_locked(const std::string& op) {
  auto it = fail_next_.find(op);
  if (it == fail_next_.end()) return kNcclSuccess;
  const int r = it->second;
  fail_next_.erase(it);
  return r;
}

bool FakeNccl::clique_aborted_locked(int clique) const {
  if (clique < 0) return false;
  for (int m : cliques_[static_cast<std::size_t>(clique)].members)
    if (comms_[static_cast<std::size_t>(m)].aborted) return true;
  return false;
}

int FakeNccl::enqueue_locked(std::unique_lock<std::mutex>& lk, std::shared_ptr<Op> op) {
  Thread& th = thread_locked();
  if (th.depth > 0) {
    th.queued.push_back(std::move(op));
    return kNcclSuccess;
  }
  return run_locked(lk, {std::move(op)});
}

// ---- issuing: post every send and contribution, then complete in order ----

int FakeNccl::run_locked(std::unique_lock<std::mutex>& lk, std::vector<std::shared_ptr<Op>> ops) {
  // Receive buffers of one group may overlap nothing else of the group: NCCL runs the group's
  // operations concurrently.
  for (std::size_t a = 0; a < ops.size(); ++a) {
    const Call& x = ops[a]->call;
    const std::size_t xr = recv_bytes(x);
    for (std::size_t b = 0; b < ops.size(); ++b) {
      const Call& y = ops[b]->call;
      if (a == b || xr == 0 || ops[a]->kind == Kind::split || ops[b]->kind == Kind::split || ops[a]->kind == Kind::join ||
          ops[b]->kind == Kind::join)
        continue;
      const std::size_t yr = recv_bytes(y), ys = send_bytes(y);
      if ((b > a && overlap(x.recv, xr, y.recv, yr)) || overlap(x.recv, xr, y.send, ys))
        violation_locked(fmt::format("in one group, {} writes {} bytes at {} that overlap {} ({} at {}, {} at {})",
                                     where(x), xr, static_cast<void*>(x.recv), where(y), yr,
                                     static_cast<void*>(y.recv), ys, y.send));
    }
  }
  for (auto& op : ops) {
    Call& c = op->call;
    switch (op->kind) {
      case Kind::send: {
        const auto* p = static_cast<const unsigned char*>(c.send);
        mail_[{c.clique, c.rank, c.peer}].push_back(
            Message{std::vector<unsigned char>(p, p + c.count * nccl_type_size(c.type)), c.count, c.type});
        break;
      }
      case Kind::coll: {
        Comm& m = comms_[static_cast<std::size_t>(op->comm)];
        op->slot = {m.clique, m.next_coll++};
        const auto* p = static_cast<const unsigned char*>(c.send);
        colls_[op->slot].by_rank[c.rank] = Contribution{c, std::vector<unsigned char>(p, p + send_bytes(c))};
        break;
      }
      case Kind::split: {
        Comm& m = comms_[static_cast<std::size_t>(op->comm)];
        op->slot = {m.clique, m.next_split++};
        splits_[op->slot].by_rank[c.rank] = {c.color, c.key};
        break;
      }
      case Kind::join: joins_[op->id].push_back({c.peer, op->out}); break;
      case Kind::recv: break;
    }
  }
  cv_.notify_all();
  for (auto& op : ops) {
    const int r = complete_locked(lk, *op);
    if (failed(r)) return r;
  }
  return kNcclSuccess;
}

int FakeNccl::complete_locked(std::unique_lock<std::mutex>& lk, Op& op) {
  const Call& c = op.call;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds_);
  auto wait = [&](auto ready, const std::string& what) {
    if (cv_.wait_until(lk, deadline, [&] { return ready() || clique_aborted_locked(c.clique); }) && ready())
      return kNcclSuccess;
    if (clique_aborted_locked(c.clique)) return kNcclRemoteError;
    violation_locked(fmt::format("{} waited {} s for {}: never came", where(c), wait_seconds_, what));
    return kNcclInvalidUsage;
  };
  switch (op.kind) {
    case Kind::send: return kNcclSuccess;  // posted (buffered)
    case Kind::recv: {
      auto& box = mail_[{c.clique, c.peer, c.rank}];
      const int r = wait([&] { return !box.empty(); }, fmt::format("an ncclSend from rank {}", c.peer));
      if (failed(r)) return r;
      Message m = std::move(box.front());
      box.pop_front();
      if (m.count != c.count || m.type != c.type)
        violation_locked(fmt::format("ncclSend of {} x {} from rank {} met {} of {} x {}", m.count,
                                     nccl_type_name(m.type), c.peer, where(c), c.count, nccl_type_name(c.type)));
      std::memcpy(c.recv, m.data.data(), std::min(m.data.size(), c.count * nccl_type_size(c.type)));
      return kNcclSuccess;
    }
    case Kind::coll: {
      CollSlot& slot = colls_[op.slot];
      const int r = wait([&] { return static_cast<int>(slot.by_rank.size()) == c.size; },
                         fmt::format("collective #{} on every rank", op.slot.second));
      if (failed(r)) return r;
      const Call& first = slot.by_rank.begin()->second.call;
      bool same = true;
      for (const auto& [rk, x] : slot.by_rank)
        if (x.call.op != first.op || x.call.count != first.count || x.call.type != first.type ||
            x.call.red != first.red || x.call.peer != first.peer)
          same = false;
      if (!same) {
        if (c.rank == first.rank) {
          std::string all;
          for (const auto& [rk, x] : slot.by_rank)
            all += fmt::format(" rank {}: {} of {} x {} op {} root {};", rk, x.call.op, x.call.count,
                               nccl_type_name(x.call.type), static_cast<int>(x.call.red), x.call.peer);
          violation_locked(fmt::format("clique {} collective #{}: the ranks disagree:{}", c.clique, op.slot.second, all));
        }
      } else {
        const std::size_t e = c.count * nccl_type_size(c.type);
        auto* out = static_cast<unsigned char*>(c.recv);
        if (c.op == "ncclAllGather") {
          for (const auto& [rk, x] : slot.by_rank) std::memcpy(out + static_cast<std::size_t>(rk) * e, x.data.data(), e);
        } else if (c.op == "ncclBroadcast") {
          std::memcpy(out, slot.by_rank.at(c.peer).data.data(), e);
        } else {  // reductions: block `off` of every rank's send, in rank order
          const std::size_t off = c.op == "ncclReduceScatter" ? static_cast<std::size_t>(c.rank) * e : 0;
          std::vector<unsigned char> acc(slot.by_rank.begin()->second.data.begin() + static_cast<std::ptrdiff_t>(off),
                                         slot.by_rank.begin()->second.data.begin() + static_cast<std::ptrdiff_t>(off + e));
          for (auto it = std::next(slot.by_rank.begin()); it != slot.by_rank.end(); ++it)
            reduce_into(c.type, c.red, acc.data(), it->second.data.data() + off, c.count);
          std::memcpy(out, acc.data(), e);
        }
      }
      if (++slot.finished == c.size) colls_.erase(op.slot);
      return kNcclSuccess;
    }
    case Kind::split: {
      SplitSlot& slot = splits_[op.slot];
      const int r = wait([&] { return static_cast<int>(slot.by_rank.size()) == c.size; },
                         fmt::format("ncclCommSplit #{} on every rank", op.slot.second));
      if (failed(r)) return r;
      if (!slot.made) {
        // Ranks of one colour in order of key, then of parent rank (NCCL's order).
        std::map<int, std::vector<std::pair<int, int>>> by_color;  // colour -> (key, parent rank)
        for (const auto& [rk, ck] : slot.by_rank) {
          slot.result[rk] = -1;
          if (ck.first != -1) by_color[ck.first].push_back({ck.second, rk});  // -1: NCCL_SPLIT_NOCOLOR
        }
        const std::vector<int> parent = cliques_[static_cast<std::size_t>(c.clique)].members;  // a copy: cliques_ grows
        for (auto& [color, members] : by_color) {
          std::sort(members.begin(), members.end());
          std::vector<int> made;
          for (const auto& [key, rk] : members) {
            Comm m;
            m.parent = parent[static_cast<std::size_t>(rk)];
            comms_.push_back(m);
            const int idx = static_cast<int>(comms_.size()) - 1;
            index_of_[handle(idx)] = idx;
            made.push_back(idx);
            slot.result[rk] = idx;
          }
          new_clique_locked(made);
        }
        slot.made = true;
      }
      const int idx = slot.result.at(c.rank);
      *op.out = idx >= 0 ? handle(idx) : nullptr;
      if (++slot.finished == c.size) splits_.erase(op.slot);
      return kNcclSuccess;
    }
    case Kind::join: {
      auto& joined = joins_[op.id];
      const int n = static_cast<int>(c.count);
      const int r = wait([&] { return static_cast<int>(joined.size()) == n; },
                         fmt::format("ncclCommInitRank of all {} ranks", n));
      if (failed(r)) return r;
      if (!joined_clique_.count(op.id)) {
        std::vector<int> by_rank(static_cast<std::size_t>(n), -1);
        for (const auto& [rk, out] : joined) {
          if (rk < 0 || rk >= n || by_rank[static_cast<std::size_t>(rk)] >= 0) {
            violation_locked(fmt::format("ncclCommInitRank: rank {} of {} given twice or out of range", rk, n));
            continue;
          }
          comms_.push_back(Comm{});
          const int idx = static_cast<int>(comms_.size()) - 1;
          index_of_[handle(idx)] = idx;
          by_rank[static_cast<std::size_t>(rk)] = idx;
        }
        joined_clique_[op.id] = new_clique_locked(by_rank);
      }
      const auto& members = cliques_[static_cast<std::size_t>(joined_clique_[op.id])].members;
      *op.out = handle(members[static_cast<std::size_t>(c.peer)]);
      return kNcclSuccess;
    }
  }
  return kNcclSuccess;
}

// ---- the table ----

int FakeNccl::get_unique_id(char* id) {
  std::lock_guard<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclGetUniqueId";
  rec.thread = thread_locked().id;
  const std::string s = fmt::format("fake-nccl-id-{}", unique_ids_++);
  std::memset(id, 0, cuda::kNcclUniqueIdBytes);
  std::memcpy(id, s.data(), s.size());
  return record_locked(rec);
}

int FakeNccl::comm_init_all(NcclComm* comms, int n, const int* devices) {
  std::lock_guard<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclCommInitAll";
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  rec.count = static_cast<std::size_t>(n);
  std::vector<int> made;
  for (int i = 0; i < n; ++i) {
    (void)devices;
    comms_.push_back(Comm{});
    const int idx = static_cast<int>(comms_.size()) - 1;
    index_of_[handle(idx)] = idx;
    made.push_back(idx);
    comms[i] = handle(idx);
  }
  rec.clique = new_clique_locked(made);
  rec.size = n;
  return record_locked(rec);
}

int FakeNccl::comm_init_rank(NcclComm* comm, int nranks, const char* id, int rank, int device) {
  std::unique_lock<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclCommInitRank";
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  rec.count = static_cast<std::size_t>(nranks);
  rec.peer = rank;
  rec.key = device;
  if (rank < 0 || rank >= nranks) {
    violation_locked(fmt::format("ncclCommInitRank: rank {} of {}", rank, nranks));
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  }
  auto op = std::make_shared<Op>();
  op->kind = Kind::join;
  op->call = rec;
  op->out = comm;
  op->id = std::string(id, cuda::kNcclUniqueIdBytes);
  record_locked(rec);
  return enqueue_locked(lk, std::move(op));
}

int FakeNccl::comm_split(NcclComm comm, int color, int key, NcclComm* out) {
  std::unique_lock<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclCommSplit";
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  rec.color = color;
  rec.key = key;
  Comm* m = comm_locked(comm, "ncclCommSplit", rec);
  if (!m) {
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  }
  if (const int f = failure_locked(rec.op)) {
    rec.result = f;
    return record_locked(rec);
  }
  auto op = std::make_shared<Op>();
  op->kind = Kind::split;
  op->call = rec;
  op->comm = index_of_.at(comm);
  op->out = out;
  record_locked(rec);
  return enqueue_locked(lk, std::move(op));
}

int FakeNccl::comm_abort(NcclComm comm) {
  std::lock_guard<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclCommAbort";
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  Comm* m = comm_locked(comm, "ncclCommAbort", rec);  // a second abort is a violation there
  if (!m) {
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  }
  m->aborted = true;
  cv_.notify_all();
  return record_locked(rec);
}

int FakeNccl::comm_get_async_error(NcclComm comm, int* async_error) {
  std::lock_guard<std::mutex> lk(mu_);
  Call rec;
  rec.op = "ncclCommGetAsyncError";
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  Comm* m = comm_locked(comm, "ncclCommGetAsyncError", rec);
  if (!m) {
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  }
  *async_error = m->async;
  return record_locked(rec);
}

int FakeNccl::group_start() {
  std::lock_guard<std::mutex> lk(mu_);
  Thread& th = thread_locked();
  Call rec;
  rec.op = "ncclGroupStart";
  rec.thread = th.id;
  rec.depth = th.depth++;
  return record_locked(rec);
}

int FakeNccl::group_end() {
  std::unique_lock<std::mutex> lk(mu_);
  Thread& th = thread_locked();
  Call rec;
  rec.op = "ncclGroupEnd";
  rec.thread = th.id;
  rec.depth = th.depth;
  if (th.depth == 0) {
    violation_locked(fmt::format("ncclGroupEnd on thread {} without an open ncclGroupStart", th.id));
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  }
  const uint64_t at = calls_.size();
  record_locked(rec);
  if (--th.depth > 0) return kNcclSuccess;
  std::vector<std::shared_ptr<Op>> ops = std::move(th.queued);
  th.queued.clear();
  const int r = run_locked(lk, std::move(ops));
  calls_[at].result = r;
  return r;
}

// The collectives and point-to-point calls: check, record, queue (or issue outside a group).
int FakeNccl::data_call(Call rec, Kind kind, NcclComm comm) {
  std::unique_lock<std::mutex> lk(mu_);
  rec.thread = thread_locked().id;
  rec.depth = thread_locked().depth;
  auto refuse = [&] {
    rec.result = kNcclInvalidUsage;
    return record_locked(rec);
  };
  if (!comm_locked(comm, rec.op.c_str(), rec)) return refuse();
  const std::string at = where(rec);
  if ((kind != Kind::coll || rec.op == "ncclBroadcast") && (rec.peer < 0 || rec.peer >= rec.size)) {
    violation_locked(fmt::format("{}: {} {} out of range", at, kind == Kind::coll ? "root" : "peer", rec.peer));
    return refuse();
  }
  const std::size_t sb = send_bytes(rec), rb = recv_bytes(rec);
  // Check both buffers (not short-circuited) so that each one out of bounds is reported.
  const bool send_inside = check_memory_locked(at.c_str(), rec.send, sb);
  const bool recv_inside = check_memory_locked(at.c_str(), rec.recv, rb);
  if (!send_inside || !recv_inside) return refuse();  // never write out of bounds
  // NCCL's in-place forms: the only overlaps of a send and a receive buffer it allows.
  if (overlap(rec.send, sb, rec.recv, rb)) {
    const std::size_t e = rec.count * nccl_type_size(rec.type), off = static_cast<std::size_t>(rec.rank) * e;
    const auto* sp = static_cast<const unsigned char*>(rec.send);
    const auto* rp = static_cast<const unsigned char*>(rec.recv);
    const bool in_place = rec.op == "ncclAllGather"       ? sp == rp + off
                          : rec.op == "ncclReduceScatter" ? rp == sp + off
                                                          : sp == rp;
    if (!in_place)
      violation_locked(fmt::format("{}: send {} and recv {} overlap, not in NCCL's in-place form ({})", at, rec.send,
                                   static_cast<void*>(rec.recv),
                                   rec.op == "ncclAllGather"       ? "send == recv + rank*count"
                                   : rec.op == "ncclReduceScatter" ? "recv == send + rank*recvcount"
                                                                   : "send == recv"));
  }
  if ((rec.result = failure_locked(rec.op))) return record_locked(rec);
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->call = rec;
  op->comm = index_of_.at(comm);
  record_locked(rec);
  return enqueue_locked(lk, std::move(op));
}

namespace {
FakeNccl::Call data_record(const char* op, const void* send, void* recv, std::size_t count, cuda::NcclType t,
                           cuda::NcclRedOp red = cuda::NcclRedOp::sum, int peer = -1) {
  FakeNccl::Call c;
  c.op = op;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.type = t;
  c.red = red;
  c.peer = peer;
  return c;
}
}  // namespace

int FakeNccl::all_gather(const void* send, void* recv, std::size_t count, NcclType t, NcclComm comm, NcclStream) {
  return data_call(data_record("ncclAllGather", send, recv, count, t), Kind::coll, comm);
}
int FakeNccl::reduce_scatter(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp red,
                             NcclComm comm, NcclStream) {
  return data_call(data_record("ncclReduceScatter", send, recv, count, t, red), Kind::coll, comm);
}
int FakeNccl::all_reduce(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp red, NcclComm comm,
                         NcclStream) {
  return data_call(data_record("ncclAllReduce", send, recv, count, t, red), Kind::coll, comm);
}
int FakeNccl::broadcast(const void* send, void* recv, std::size_t count, NcclType t, int root, NcclComm comm,
                        NcclStream) {
  return data_call(data_record("ncclBroadcast", send, recv, count, t, NcclRedOp::sum, root), Kind::coll, comm);
}
int FakeNccl::send(const void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream) {
  return data_call(data_record("ncclSend", buf, nullptr, count, t, NcclRedOp::sum, peer), Kind::send, comm);
}
int FakeNccl::recv(void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream) {
  return data_call(data_record("ncclRecv", nullptr, buf, count, t, NcclRedOp::sum, peer), Kind::recv, comm);
}

// ---- for the tests ----

std::vector<FakeNccl::Call> FakeNccl::calls() const {
  std::lock_guard<std::mutex> lk(mu_);
  return calls_;
}

std::vector<std::string> FakeNccl::violations() const {
  std::lock_guard<std::mutex> lk(mu_);
  return violations_;
}

std::vector<std::string> FakeNccl::check_quiescent() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::string> out;
  for (const auto& [tid, th] : threads_)
    if (th.depth != 0 || !th.queued.empty())
      out.push_back(fmt::format("thread {} left a group open (depth {}, {} calls queued)", th.id, th.depth,
                                th.queued.size()));
  for (const auto& [key, box] : mail_)
    if (!box.empty())
      out.push_back(fmt::format("clique {}: {} ncclSend from rank {} to rank {} never received", std::get<0>(key),
                                box.size(), std::get<1>(key), std::get<2>(key)));
  for (const auto& [key, slot] : colls_) {
    std::string ranks;
    for (const auto& [rk, x] : slot.by_rank) ranks += fmt::format(" {}", rk);
    out.push_back(fmt::format("clique {} collective #{} ({}) joined by ranks{} only", key.first, key.second,
                              slot.by_rank.begin()->second.call.op, ranks));
  }
  for (const auto& [key, slot] : splits_)
    out.push_back(fmt::format("clique {} ncclCommSplit #{} joined by {} ranks only", key.first, key.second,
                              slot.by_rank.size()));
  return out;
}

void FakeNccl::track(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  tracked_.push_back({static_cast<const unsigned char*>(p), bytes});
}

void FakeNccl::fail_next(const std::string& op, int result) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_next_[op] = result;
}

void FakeNccl::set_async_error(NcclComm comm, int result) {
  std::lock_guard<std::mutex> lk(mu_);
  comms_[static_cast<std::size_t>(index_of_.at(comm))].async = result;
}

int FakeNccl::rank_of(NcclComm comm) const {
  std::lock_guard<std::mutex> lk(mu_);
  return comms_[static_cast<std::size_t>(index_of_.at(comm))].rank;
}

int FakeNccl::size_of(NcclComm comm) const {
  std::lock_guard<std::mutex> lk(mu_);
  const int q = comms_[static_cast<std::size_t>(index_of_.at(comm))].clique;
  return static_cast<int>(cliques_[static_cast<std::size_t>(q)].members.size());
}

int FakeNccl::clique_of(NcclComm comm) const {
  std::lock_guard<std::mutex> lk(mu_);
  return comms_[static_cast<std::size_t>(index_of_.at(comm))].clique;
}

int FakeNccl::world_rank_of(NcclComm comm) const {
  std::lock_guard<std::mutex> lk(mu_);
  int i = index_of_.at(comm);
  while (comms_[static_cast<std::size_t>(i)].parent >= 0) i = comms_[static_cast<std::size_t>(i)].parent;
  return comms_[static_cast<std::size_t>(i)].rank;
}

int FakeNccl::live_comms() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(std::count_if(comms_.begin(), comms_.end(), [](const Comm& c) { return !c.aborted; }));
}

}  // namespace tessel::test
