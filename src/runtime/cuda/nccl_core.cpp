// The NCCL world's host logic (nccl_core.hpp): plans, splits, init, gate, abort, watchdog. Part
// of tessel in every build; the CUDA side is nccl_world.cpp, NCCL itself nccl_api.cpp.
#include "nccl_core.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "tessel/core/collective_kind.hpp"
#include "tessel/runtime/process_group.hpp"

namespace tessel::cuda {

void nccl_check(NcclApi& api, int result, const char* expr, const char* file, int line) {
  if (result != kNcclSuccess && result != kNcclInProgress)
    throw RuntimeError(fmt::format("nccl: {} failed: {} at {}:{}", expr, api.error_string(result), file, line));
}

std::size_t nccl_type_size(NcclType t) {
  switch (t) {
    case NcclType::u8: return 1;
    case NcclType::f16:
    case NcclType::bf16: return 2;
    case NcclType::i32:
    case NcclType::f32: return 4;
  }
  return 1;
}

const char* nccl_type_name(NcclType t) {
  switch (t) {
    case NcclType::u8: return "ncclUint8";
    case NcclType::i32: return "ncclInt32";
    case NcclType::f16: return "ncclFloat16";
    case NcclType::bf16: return "ncclBfloat16";
    case NcclType::f32: return "ncclFloat32";
  }
  return "?";
}

NcclType nccl_type(DType t) {
  switch (t) {
    case DType::f32: return NcclType::f32;
    case DType::bf16: return NcclType::bf16;
    case DType::f16: return NcclType::f16;
    case DType::i32: return NcclType::i32;
  }
  return NcclType::f32;
}

NcclRedOp nccl_op(ReduceOp op) { return op == ReduceOp::Max ? NcclRedOp::max : NcclRedOp::sum; }

namespace {

NcclCall bytes_call(NcclCallKind kind, const void* send, void* recv, std::size_t bytes, int peer = -1) {
  NcclCall c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = bytes;
  c.peer = peer;
  return c;
}

NcclCall reduce_call(NcclCallKind kind, const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  NcclCall c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.type = nccl_type(t);
  c.op = nccl_op(op);
  return c;
}

// `calls` between ncclGroupStart and ncclGroupEnd.
NcclPlan grouped(std::vector<NcclCall> calls) {
  NcclPlan p;
  p.reserve(calls.size() + 2);
  p.push_back(NcclCall{});  // group_start
  for (NcclCall& c : calls) p.push_back(c);
  NcclCall end;
  end.kind = NcclCallKind::group_end;
  p.push_back(end);
  return p;
}

}  // namespace

NcclPlan nccl_all_gather_plan(const void* send, void* recv, std::size_t bytes) {
  return {bytes_call(NcclCallKind::all_gather, send, recv, bytes)};
}
NcclPlan nccl_reduce_scatter_plan(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  return {reduce_call(NcclCallKind::reduce_scatter, send, recv, count, t, op)};
}
NcclPlan nccl_all_reduce_plan(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  return {reduce_call(NcclCallKind::all_reduce, send, recv, count, t, op)};
}
NcclPlan nccl_all_to_all_plan(const void* send, void* recv, std::size_t bytes, int size) {
  std::vector<NcclCall> calls;
  for (int j = 0; j < size; ++j) {
    const std::size_t off = static_cast<std::size_t>(j) * bytes;
    calls.push_back(bytes_call(NcclCallKind::send, static_cast<const char*>(send) + off, nullptr, bytes, j));
    calls.push_back(bytes_call(NcclCallKind::recv, nullptr, static_cast<char*>(recv) + off, bytes, j));
  }
  return grouped(std::move(calls));
}
NcclPlan nccl_permute_plan(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes) {
  std::vector<NcclCall> calls;
  if (send_to >= 0) calls.push_back(bytes_call(NcclCallKind::send, send, nullptr, bytes, send_to));
  if (recv_from >= 0) calls.push_back(bytes_call(NcclCallKind::recv, nullptr, recv, bytes, recv_from));
  return grouped(std::move(calls));
}
NcclPlan nccl_send_plan(const void* buf, std::size_t bytes, int peer) {
  return {bytes_call(NcclCallKind::send, buf, nullptr, bytes, peer)};
}
NcclPlan nccl_recv_plan(void* buf, std::size_t bytes, int peer) {
  return {bytes_call(NcclCallKind::recv, nullptr, buf, bytes, peer)};
}
NcclPlan nccl_broadcast_plan(void* buf, std::size_t bytes, int root) {
  return {bytes_call(NcclCallKind::broadcast, buf, buf, bytes, root)};
}
NcclPlan nccl_barrier_plan(void* word) {
  return {reduce_call(NcclCallKind::all_reduce, word, word, 1, DType::i32, ReduceOp::Sum)};
}

int issue_nccl_plan(NcclApi& api, const NcclPlan& plan, NcclComm comm, NcclStream stream) {
  auto failed = [](int r) { return r != kNcclSuccess && r != kNcclInProgress; };
  int depth = 0;  // groups this plan opened and has not closed
  int first = kNcclSuccess;
  for (const NcclCall& c : plan) {
    int r = kNcclSuccess;
    switch (c.kind) {
      case NcclCallKind::group_start:
        r = api.group_start();
        if (!failed(r)) ++depth;
        break;
      case NcclCallKind::group_end:
        --depth;
        r = api.group_end();
        break;
      case NcclCallKind::all_gather: r = api.all_gather(c.send, c.recv, c.count, c.type, comm, stream); break;
      case NcclCallKind::reduce_scatter:
        r = api.reduce_scatter(c.send, c.recv, c.count, c.type, c.op, comm, stream);
        break;
      case NcclCallKind::all_reduce: r = api.all_reduce(c.send, c.recv, c.count, c.type, c.op, comm, stream); break;
      case NcclCallKind::broadcast:
        r = api.broadcast(c.send, c.recv, c.count, c.type, c.peer, comm, stream);
        break;
      case NcclCallKind::send: r = api.send(c.send, c.count, c.type, c.peer, comm, stream); break;
      case NcclCallKind::recv: r = api.recv(c.recv, c.count, c.type, c.peer, comm, stream); break;
    }
    if (failed(r)) {
      first = r;
      break;
    }
  }
  // After a failure, close what this plan opened (ncclGroupEnd then drops the group's calls).
  for (; depth > 0; --depth) (void)api.group_end();
  return first;
}

std::vector<NcclSplit> nccl_split_plan(const Mesh& mesh, const std::vector<std::string>& axes,
                                       const std::vector<int>& local_of) {
  std::vector<NcclSplit> out;
  const auto groups = mesh.groups(axes);
  for (std::size_t color = 0; color < groups.size(); ++color)
    for (std::size_t key = 0; key < groups[color].size(); ++key) {
      const int li = local_of[static_cast<std::size_t>(groups[color][key])];
      if (li < 0) continue;  // another process's device
      out.push_back({li, static_cast<int>(color), static_cast<int>(key)});
    }
  return out;
}

// ---- several processes: the GPU map and the bootstrap ---------------------------------------

int nccl_process_gpu(int local_rank, int64_t local_devices, int64_t i, int visible) {
  if (local_rank < 0 || local_devices < 1 || i < 0 || i >= local_devices || visible < 1)
    throw RuntimeError(fmt::format("nccl_process_gpu: local rank {}, local device {} of {}, {} visible GPU(s): out "
                                   "of range",
                                   local_rank, i, local_devices, visible));
  return static_cast<int>((static_cast<int64_t>(local_rank) * local_devices + i) % visible);
}

NcclProcessInfo nccl_process_info(int rank, std::vector<std::string> gpus, std::string unique_id) {
  NcclProcessInfo p;
  p.rank = rank;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) p.hostname = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  boot >> p.boot_id;  // NCCL's host hash: hostname + boot id, unless NCCL_HOSTID
  if (const char* h = std::getenv("NCCL_HOSTID")) p.nccl_hostid = h;
  if (const char* m = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE")) p.multi_rank_gpu = *m && std::atoi(m) != 0;
  p.gpus = std::move(gpus);
  p.unique_id = std::move(unique_id);
  return p;
}

namespace {

// The bootstrap message: length-prefixed fields ("<bytes>:<field>"), the unique id binary.
constexpr const char* kBootstrapMagic = "tessel-nccl-bootstrap-v1";

void put_field(std::string& out, const std::string& field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

bool get_field(const std::string& in, std::size_t& pos, std::string& field) {
  const std::size_t colon = in.find(':', pos);
  if (colon == std::string::npos || colon == pos || colon - pos > 12) return false;
  std::size_t n = 0;
  for (std::size_t i = pos; i < colon; ++i) {
    if (in[i] < '0' || in[i] > '9') return false;
    n = n * 10 + static_cast<std::size_t>(in[i] - '0');
  }
  if (n > in.size() - colon - 1) return false;
  field = in.substr(colon + 1, n);
  pos = colon + 1 + n;
  return true;
}

std::string encode(const NcclProcessInfo& p) {
  std::string out;
  for (const std::string& f : {std::string(kBootstrapMagic), std::to_string(p.rank), p.hostname, p.boot_id,
                               p.nccl_hostid, std::string(p.multi_rank_gpu ? "1" : "0"),
                               std::to_string(p.gpus.size())})
    put_field(out, f);
  for (const std::string& g : p.gpus) put_field(out, g);
  put_field(out, p.unique_id);
  return out;
}

NcclProcessInfo decode(const std::string& in, int from) {
  auto bad = [&] {
    return RuntimeError(fmt::format("nccl bootstrap: process {} sent {} bytes that are not a tessel NCCL bootstrap "
                                    "message (v1): every process must run the same tessel build",
                                    from, in.size()));
  };
  NcclProcessInfo p;
  std::size_t pos = 0;
  std::string magic, rank, multi, count;
  if (!get_field(in, pos, magic) || magic != kBootstrapMagic || !get_field(in, pos, rank) ||
      !get_field(in, pos, p.hostname) || !get_field(in, pos, p.boot_id) || !get_field(in, pos, p.nccl_hostid) ||
      !get_field(in, pos, multi) || !get_field(in, pos, count) || count.empty() || count.size() > 6 ||
      count.find_first_not_of("0123456789") != std::string::npos || rank != std::to_string(from))
    throw bad();
  p.rank = from;
  p.multi_rank_gpu = multi == "1";
  p.gpus.resize(std::stoul(count));
  for (std::string& g : p.gpus)
    if (!get_field(in, pos, g)) throw bad();
  if (!get_field(in, pos, p.unique_id) || pos != in.size()) throw bad();
  return p;
}

}  // namespace

std::string nccl_check_process_gpus(const std::vector<NcclProcessInfo>& ps) {
  std::string warning;
  for (std::size_t b = 0; b < ps.size(); ++b)
    for (std::size_t a = 0; a < b; ++a)
      for (const std::string& gpu : ps[b].gpus) {
        if (std::find(ps[a].gpus.begin(), ps[a].gpus.end(), gpu) == ps[a].gpus.end()) continue;
        const bool one_machine = ps[a].hostname == ps[b].hostname && ps[a].boot_id == ps[b].boot_id;
        if (ps[a].nccl_host() != ps[b].nccl_host()) {
          // Two hosts to NCCL: one machine's GPU shared through distinct NCCL_HOSTID.
          if (one_machine && warning.empty())
            warning = fmt::format(
                "tessel: processes {} and {} share GPU {} of host {}; their distinct NCCL_HOSTID ('{}', '{}') make "
                "NCCL treat them as two hosts and connect them over sockets: correctness tests only, not "
                "supported by NVIDIA",
                ps[a].rank, ps[b].rank, gpu, ps[a].hostname, ps[a].nccl_hostid, ps[b].nccl_hostid);
          continue;
        }
        if (ps[a].multi_rank_gpu && ps[b].multi_rank_gpu) continue;  // NCCL 2.30+ decides
        const std::string why =
            ps[a].nccl_hostid.empty()
                ? fmt::format("of host {} (NCCL_HOSTID unset on both)", ps[a].hostname)
                : fmt::format("of what NCCL takes for one host (NCCL_HOSTID='{}' on both)", ps[a].nccl_hostid);
        throw RuntimeError(fmt::format(
            "nccl bootstrap: processes {} and {} both have a rank on GPU {} {}, and NCCL refuses two ranks on one "
            "GPU (\"Duplicate GPU detected\"). Give each process its own GPU (LOCAL_RANK, CUDA_VISIBLE_DEVICES); "
            "or, to test on one GPU only (not supported by NVIDIA), give each process its own NCCL_HOSTID (e.g. "
            "NCCL_HOSTID=tessel-$RANK) with NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "
            "NCCL_IB_DISABLE=1, or with NCCL 2.30+ set NCCL_MULTI_RANK_GPU_ENABLE=1 (docs/backend-cuda.md)",
            ps[a].rank, ps[b].rank, gpu, why));
      }
  return warning;
}

std::string nccl_bootstrap(ProcessGroup& processes, const std::vector<std::string>& gpu_bus_ids,
                           const std::function<std::string()>& make_unique_id) {
  const int rank = processes.rank();
  const NcclProcessInfo mine =
      nccl_process_info(rank, gpu_bus_ids, rank == 0 ? make_unique_id() : std::string());
  const std::vector<std::string> all = processes.allgather(encode(mine));
  if (all.size() != static_cast<std::size_t>(processes.size()))
    throw RuntimeError(fmt::format("nccl bootstrap: {} messages from {} processes", all.size(), processes.size()));
  std::vector<NcclProcessInfo> infos;
  for (std::size_t r = 0; r < all.size(); ++r) infos.push_back(decode(all[r], static_cast<int>(r)));
  const std::string warning = nccl_check_process_gpus(infos);
  if (!warning.empty() && rank == 0) std::fprintf(stderr, "%s\n", warning.c_str());
  if (infos[0].unique_id.size() != kNcclUniqueIdBytes)
    throw RuntimeError(fmt::format("nccl bootstrap: process 0 sent a unique id of {} bytes, NCCL's has {}",
                                   infos[0].unique_id.size(), kNcclUniqueIdBytes));
  return infos[0].unique_id;
}

// ---- the communicator --------------------------------------------------------------------

NcclCommunicatorBase::NcclCommunicatorBase(NcclWorldBase& w, NcclComm comm, int device, int rank, int size,
                                           std::string group)
    : w_(w), comm_(comm), device_(device), rank_(rank), size_(size), group_(std::move(group)) {}

NcclCommunicatorBase::~NcclCommunicatorBase() { detach(); }

void NcclCommunicatorBase::detach() { w_.forget(this); }

void NcclCommunicatorBase::all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) {
  call(collective_text(CollectiveKind::AllGather), s, nccl_all_gather_plan(send, recv, bytes));
}
void NcclCommunicatorBase::reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                                          Stream& s) {
  call(collective_text(CollectiveKind::ReduceScatter), s, nccl_reduce_scatter_plan(send, recv, count, t, op));
}
void NcclCommunicatorBase::all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op,
                                      Stream& s) {
  call(collective_text(CollectiveKind::AllReduce), s, nccl_all_reduce_plan(send, recv, count, t, op));
}
void NcclCommunicatorBase::all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) {
  call(collective_text(CollectiveKind::AllToAll), s, nccl_all_to_all_plan(send, recv, bytes, size_));
}
void NcclCommunicatorBase::collective_permute(const void* send, int send_to, void* recv, int recv_from,
                                              std::size_t bytes, Stream& s) {
  call(collective_text(CollectiveKind::CollectivePermute), s, nccl_permute_plan(send, send_to, recv, recv_from, bytes));
}
void NcclCommunicatorBase::send(const void* buf, std::size_t bytes, int peer, Stream& s) {
  call("send", s, nccl_send_plan(buf, bytes, peer));
}
void NcclCommunicatorBase::recv(void* buf, std::size_t bytes, int peer, Stream& s) {
  call("recv", s, nccl_recv_plan(buf, bytes, peer));
}
void NcclCommunicatorBase::broadcast(void* buf, std::size_t bytes, int root, Stream& s) {
  call("broadcast", s, nccl_broadcast_plan(buf, bytes, root));
}
void NcclCommunicatorBase::barrier(Stream& s) { call("barrier", s, nccl_barrier_plan(barrier_word())); }

void NcclCommunicatorBase::abort(const std::string& reason) { w_.abort(reason); }

void NcclCommunicatorBase::group_start() {
  if (group_depth_ == 0) group_guard_ = std::shared_lock<std::shared_timed_mutex>(w_.calls_mutex());
  TESSEL_NCCL_CHECK(w_.api(), w_.api().group_start());
  ++group_depth_;
}

void NcclCommunicatorBase::group_end() {
  --group_depth_;
  const int r = w_.api().group_end();
  if (group_depth_ == 0 && group_guard_.owns_lock()) group_guard_.unlock();
  TESSEL_NCCL_CHECK(w_.api(), r);
}

bool NcclCommunicatorBase::overdue(double, std::string&) { return false; }

int NcclCommunicatorBase::enqueue(Stream&, const char*, const std::function<int(NcclStream)>& issue) {
  return issue(nullptr);
}

void NcclCommunicatorBase::call(const char* what, Stream& s, const NcclPlan& plan) {
  // The communicator stays alive to the end of the call (inside a group the group holds it).
  std::shared_lock<std::shared_timed_mutex> calls(w_.calls_mutex(), std::defer_lock);
  if (group_depth_ == 0) calls.lock();
  if (w_.aborted()) throw RuntimeError(fmt::format("nccl {}: the world was aborted: {}", what, w_.abort_reason()));
  const int r = enqueue(s, what, [&](NcclStream st) { return issue_nccl_plan(w_.api(), plan, comm_, st); });
  if (r != kNcclSuccess && r != kNcclInProgress) {
    const std::string msg = fmt::format("nccl {} on device {} (rank {} of {} in group {}): {}", what, device_, rank_,
                                        size_, group_, w_.api().error_string(r));
    if (calls.owns_lock()) calls.unlock();  // the abort takes it exclusively
    if (group_guard_.owns_lock()) group_guard_.unlock();
    w_.abort(msg);
    throw RuntimeError(msg);
  }
}

// ---- the world ---------------------------------------------------------------------------

NcclWorldBase::NcclWorldBase(NcclApi& api, const Mesh& mesh, std::vector<int64_t> positions, std::vector<int> gpus,
                             const std::string& unique_id, const CudaWorldOptions& o)
    : api_(api), mesh_(mesh), positions_(std::move(positions)), gpus_(std::move(gpus)), options_(o) {
  const int n = static_cast<int>(mesh_.num_devices());
  const int local = static_cast<int>(positions_.size());
  if (gpus_.size() != positions_.size())
    throw RuntimeError(fmt::format("nccl world: {} GPUs given for {} local devices of mesh {}", gpus_.size(), local,
                                   mesh_.to_string()));
  local_of_.assign(static_cast<std::size_t>(n), -1);
  for (int i = 0; i < local; ++i) {
    const int64_t p = positions_[static_cast<std::size_t>(i)];
    if (p < 0 || p >= n || local_of_[static_cast<std::size_t>(p)] >= 0)
      throw RuntimeError(fmt::format("nccl world: local device {} has position {}, not a fresh position of mesh {}", i,
                                     p, mesh_.to_string()));
    local_of_[static_cast<std::size_t>(p)] = i;
  }
  // NCCL puts one rank per GPU (it would fail with "Duplicate GPU detected"): say which
  // positions collide and what to use instead.
  for (int i = 0; i < local; ++i)
    for (int j = 0; j < i; ++j)
      if (gpus_[static_cast<std::size_t>(i)] == gpus_[static_cast<std::size_t>(j)])
        throw RuntimeError(fmt::format(
            "nccl world: mesh positions {} and {} of mesh {} are both on GPU {} of this process; NCCL needs one GPU "
            "per rank (give each position its own GPU, or make_cuda_virtual_world for several positions on one "
            "GPU; to test NCCL on one GPU, one process per position with a distinct NCCL_HOSTID each, "
            "docs/backend-cuda.md)",
            positions_[static_cast<std::size_t>(j)], positions_[static_cast<std::size_t>(i)], mesh_.to_string(),
            gpus_[static_cast<std::size_t>(i)]));
  world_.resize(static_cast<std::size_t>(local));
  if (unique_id.empty()) {
    if (local != n)
      throw RuntimeError(fmt::format("nccl world: {} of the {} devices of mesh {} are local and no NCCL unique id "
                                     "was given; a multi-process world needs one (nccl_unique_id())",
                                     local, n, mesh_.to_string()));
    TESSEL_NCCL_CHECK(api_, api_.comm_init_all(world_.data(), n, gpus_.data()));
  } else {
    if (unique_id.size() != kNcclUniqueIdBytes)
      throw RuntimeError(fmt::format("nccl world: the unique id has {} bytes, NCCL's has {}; every process must "
                                     "pass the bytes of one nccl_unique_id()",
                                     unique_id.size(), kNcclUniqueIdBytes));
    // Several local ranks join in one group (one thread drives them all).
    TESSEL_NCCL_CHECK(api_, api_.group_start());
    for (int i = 0; i < local; ++i) {
      const int r = api_.comm_init_rank(&world_[static_cast<std::size_t>(i)], n, unique_id.data(),
                                        static_cast<int>(positions_[static_cast<std::size_t>(i)]),
                                        gpus_[static_cast<std::size_t>(i)]);
      if (r != kNcclSuccess && r != kNcclInProgress) {
        (void)api_.group_end();
        throw RuntimeError(fmt::format("nccl: ncclCommInitRank (rank {} of {}, GPU {}) failed: {}",
                                       positions_[static_cast<std::size_t>(i)], n, gpus_[static_cast<std::size_t>(i)],
                                       api_.error_string(r)));
      }
    }
    TESSEL_NCCL_CHECK(api_, api_.group_end());
  }
  // Notices of an earlier world's abort (this load follows it) are not for this one.
  if (options_.processes) try {
      while (options_.processes->poll_abort()) {
      }
    } catch (const std::exception&) {
    }
  watchdog_ = std::thread([this] { watch(); });
}

NcclWorldBase::~NcclWorldBase() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  // Abort, not destroy: ncclCommDestroy may block forever on unfinished work (the communicators
  // handed out must be gone by now). An aborted world has none left.
  for (auto& [axes, comms] : split_)
    for (NcclComm c : comms)
      if (c) (void)api_.comm_abort(c);
  for (NcclComm c : world_) (void)api_.comm_abort(c);
}

std::unique_ptr<NcclCommunicatorBase> NcclWorldBase::make_member(NcclComm comm, int device, int rank, int size,
                                                                 std::string group) {
  return std::make_unique<NcclCommunicatorBase>(*this, comm, device, rank, size, std::move(group));
}

std::unique_ptr<Communicator> NcclWorldBase::communicator(int64_t position, const std::vector<std::string>& axes) {
  if (aborted()) throw RuntimeError("nccl world: aborted: " + abort_reason());
  std::lock_guard<std::mutex> lk(split_mu_);
  const int li = position >= 0 && position < mesh_.num_devices() ? local_of_[static_cast<std::size_t>(position)] : -1;
  if (li < 0)
    throw RuntimeError(fmt::format("nccl world: position {} of mesh {} is not a device of this process", position,
                                   mesh_.to_string()));
  auto it = split_.find(axes);
  if (it == split_.end()) it = split_.emplace(axes, split(axes)).first;
  const auto members = mesh_.group(position, axes);
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), position) - members.begin());
  auto c = make_member(it->second[static_cast<std::size_t>(li)], gpus_[static_cast<std::size_t>(li)], rank,
                       static_cast<int>(members.size()), shape_str(members));
  std::lock_guard<std::mutex> lk2(mu_);
  live_.push_back(c.get());
  return c;
}

std::string NcclWorldBase::abort_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}

void NcclWorldBase::abort_world(std::string reason, bool from_peer) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.exchange(true)) return;
    reason_ = std::move(reason);
  }
  if (!from_peer && options_.processes) {
    try {
      options_.processes->post_abort(abort_reason());
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
    for (NcclComm c : comms)
      if (c) (void)api_.comm_abort(c);
  split_.clear();
  for (NcclComm c : world_) (void)api_.comm_abort(c);
  world_.clear();
}

void NcclWorldBase::forget(NcclCommunicatorBase* c) {
  std::lock_guard<std::mutex> lk(mu_);
  live_.erase(std::remove(live_.begin(), live_.end(), c), live_.end());
}

// One ncclCommSplit per local device, grouped (one thread drives every local rank here); the
// other processes split their devices with the same colours (collective over them).
std::vector<NcclComm> NcclWorldBase::split(const std::vector<std::string>& axes) {
  std::vector<NcclComm> out(world_.size(), nullptr);
  TESSEL_NCCL_CHECK(api_, api_.group_start());
  for (const NcclSplit& sp : nccl_split_plan(mesh_, axes, local_of_)) {
    const auto p = static_cast<std::size_t>(sp.local);
    const int r = api_.comm_split(world_[p], sp.color, sp.key, &out[p]);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      (void)api_.group_end();
      throw RuntimeError(
          fmt::format("nccl: ncclCommSplit for axes {} failed: {}", join(axes, ","), api_.error_string(r)));
    }
  }
  TESSEL_NCCL_CHECK(api_, api_.group_end());
  return out;
}

void NcclWorldBase::watch() {
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
    // Held shared while polling, as a call holds it: an abort (another thread) frees the
    // communicators only under it exclusively, so the poll never reads a freed one. Busy (an
    // abort is waiting for it): next round.
    std::shared_lock<std::shared_timed_mutex> gate(calls_mu_, std::try_to_lock);
    if (!gate.owns_lock() || aborted_) continue;
    std::string what;
    for (NcclCommunicatorBase* c : live_) {
      int async = kNcclSuccess;
      if (api_.comm_get_async_error(c->comm(), &async) == kNcclSuccess && async != kNcclSuccess &&
          async != kNcclInProgress) {
        what = fmt::format("NCCL reported an asynchronous error: {}", api_.error_string(async));
        break;
      }
      if (c->overdue(options_.timeout_seconds, what)) {
        what = "timed out: " + what;
        break;
      }
    }
    gate.unlock();
    if (!what.empty()) {
      lk.unlock();
      abort(what);
      lk.lock();
    }
  }
}

}  // namespace tessel::cuda
