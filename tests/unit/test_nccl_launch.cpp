// NCCL's two-process launcher on one GPU, its host side run for real across two processes
// (issue 35 item 4, CPU side; ../shared/notes/gpu-next-round.md §2.4, Tier A).
//
// The GPU round runs two processes on GPU 0 through the RANK/WORLD_SIZE/LOCAL_RANK launcher,
// each with its own NCCL_HOSTID (docs/backend-cuda.md, "Two processes on one GPU"). Here the
// test binary starts itself twice (posix_spawn of /proc/self/exe, running the hidden test case
// below) with exactly that environment: RANK, WORLD_SIZE=2, LOCAL_RANK=0, TESSEL_RENDEZVOUS_DIR,
// NCCL_HOSTID, NCCL_SOCKET_IFNAME=lo, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1, NCCL_IB_DISABLE=1.
// Each process runs the launcher's host code that CudaRuntime runs on a GPU:
// process_group_from_env() (detect_launch, the file rendezvous), nccl_process_gpu() (the GPU of
// each local device), nccl_bootstrap() (the unique id and NCCL's one-rank-per-GPU rule) and
// NcclWorldBase (ncclCommInitRank, the splits, a collective, the abort channel), with NCCL
// replaced by ProcessFakeNccl: the world's table of entry points (nccl_api.hpp) for one process
// of a job, recording every call, whose communicator-making calls and all-reduce meet the other
// processes' through files, as NCCL's ranks meet through its bootstrap network. (FakeNccl of
// nccl_fake.hpp is in-process: its ranks meet in one process's memory, so it cannot serve two
// processes.) Each process writes what it saw to a file; the parent test compares them.
//
// What this shows: both processes get the same unique id bytes (made once, on rank 0), ranks 0
// and 1 of 2 on GPU 0, the split colours and keys of Mesh::groups for a data=2 mesh, one
// all-reduce through the split communicator, an abort on one process reaching the other's
// world through the abort channel, tessel's refusal (before any NCCL call, on both processes,
// naming NCCL_HOSTID) of two processes on one GPU without distinct NCCL_HOSTID, and a process
// whose peer was killed before it arrived failing within TESSEL_RENDEZVOUS_TIMEOUT, naming it.
//
// What the fake cannot show: NCCL itself. Whether NCCL 2.28 accepts the NCCL_HOSTID split
// (its host hash, its "Duplicate GPU detected" check), its Socket transport over lo, real data
// on a GPU, CUDA streams and events, the watchdog's timeout on a collective that never ends, a
// peer killed after init (only NCCL's own timeout or the watchdog ends the survivor then), and
// the GPU's compute mode (EXCLUSIVE_PROCESS would refuse the second process): all still to run
// on a GPU (docs/backend-cuda.md).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "nccl_core.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/process_group.hpp"

extern char** environ;

using namespace tessel;
namespace fs = std::filesystem;
using tessel::cuda::NcclComm;
using tessel::cuda::NcclRedOp;
using tessel::cuda::NcclStream;
using tessel::cuda::NcclType;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Written whole under a temporary name, then renamed: a reader sees all of it or nothing.
void write_whole(const fs::path& path, const std::string& content) {
  const fs::path tmp = path.parent_path() / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << content;
    if (!f) throw RuntimeError(fmt::format("fake NCCL: cannot write {}", tmp.string()));
  }
  fs::rename(tmp, path);
}

std::string read_whole(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A recording fake of NCCL for one process of a multi-process job (the table of nccl_api.hpp,
// host memory, null streams). ncclCommInitRank, ncclCommSplit and ncclAllReduce (f32, i32; sum,
// max) meet the other ranks through files under `dir`, written whole by rename:
//   init-<hash of the id>/rank-<r>        "nranks=<n> device=<d> id=<hex>"
//   <comm>.split<k>/rank-<r>              "color=<c> key=<k>"   (the comm's k-th split)
//   <comm>.coll<k>/rank-<r>               a header line, then the send buffer's bytes
// Inside a group, init and split are deferred to the outermost ncclGroupEnd, which publishes
// them all before waiting for any (so one process may drive several ranks). A split orders the
// ranks of a colour by key, then parent rank, as NCCL documents. Violations (a rank that
// disagrees on nranks, the id, or a collective; a call on an unknown or aborted communicator;
// a second ncclCommAbort; peers that never come within wait_seconds) are recorded. The other
// collectives and point-to-point calls are not modelled: they fail with ncclInvalidUsage.
class ProcessFakeNccl final : public cuda::NcclApi {
 public:
  struct Call {
    std::string op;
    std::string comm;  // the communicator's name (init: the new one)
    int rank = -1, nranks = 0, device = -1, color = 0, key = 0, new_rank = -1, new_size = 0, result = 0;
    std::size_t count = 0;  // ncclAllReduce
    std::string id;         // hex (ncclGetUniqueId, ncclCommInitRank)
  };

  ProcessFakeNccl(fs::path dir, double wait_seconds) : dir_(std::move(dir)), wait_seconds_(wait_seconds) {
    fs::create_directories(dir_);
  }

  const char* error_string(int r) override {
    switch (r) {
      case cuda::kNcclSuccess: return "no error";
      case cuda::kNcclInvalidUsage: return "invalid usage (fake NCCL; see its violations)";
      case cuda::kNcclRemoteError: return "remote process exited or there was a network error (fake NCCL)";
      case cuda::kNcclInProgress: return "NCCL operation in progress";
    }
    return "unknown result (fake NCCL)";
  }

  int get_unique_id(char* id) override {
    std::mt19937_64 rng(std::random_device{}());
    const std::string s = fmt::format("fake-nccl-process-id pid={} n={} nonce={:016x}", ::getpid(), ids_++, rng());
    std::memset(id, 0, cuda::kNcclUniqueIdBytes);
    std::memcpy(id, s.data(), s.size());
    Call c;
    c.op = "ncclGetUniqueId";
    c.id = hex(std::string(id, cuda::kNcclUniqueIdBytes));
    return record(c);
  }

  int comm_init_all(NcclComm*, int n, const int*) override {
    Call c;
    c.op = "ncclCommInitAll";
    c.nranks = n;
    c.result = cuda::kNcclInvalidUsage;
    violation("ncclCommInitAll in a multi-process job");
    return record(c);
  }

  int comm_init_rank(NcclComm* comm, int nranks, const char* id, int rank, int device) override {
    Pending p;
    p.init = true;
    p.call.op = "ncclCommInitRank";
    p.call.nranks = nranks;
    p.call.rank = rank;
    p.call.device = device;
    p.call.id = hex(std::string(id, cuda::kNcclUniqueIdBytes));
    p.out = comm;
    if (rank < 0 || rank >= nranks) {
      violation(fmt::format("ncclCommInitRank: rank {} of {}", rank, nranks));
      p.call.result = cuda::kNcclInvalidUsage;
      return record(p.call);
    }
    p.folder = dir_ / fmt::format("init-{:016x}", fnv1a(p.call.id));
    return defer(std::move(p));
  }

  int comm_split(NcclComm comm, int color, int key, NcclComm* out) override {
    Pending p;
    p.call.op = "ncclCommSplit";
    p.call.color = color;
    p.call.key = key;
    p.out = out;
    Comm* parent = lookup(comm, p.call);
    if (!parent) return record(p.call);
    p.parent = parent;
    p.folder = dir_ / fmt::format("{}.split{}", parent->name, parent->splits++);
    return defer(std::move(p));
  }

  int comm_abort(NcclComm comm) override {
    Call c;
    c.op = "ncclCommAbort";
    Comm* m = lookup(comm, c);
    if (m) {
      std::lock_guard<std::mutex> lk(mu_);
      m->aborted = true;
    }
    return record(c);
  }

  int comm_get_async_error(NcclComm comm, int* async_error) override {  // the watchdog's poll: not recorded
    std::lock_guard<std::mutex> lk(mu_);
    *async_error = cuda::kNcclSuccess;
    return known_.count(comm) ? cuda::kNcclSuccess : cuda::kNcclInvalidUsage;
  }

  int group_start() override {
    Call c;
    c.op = "ncclGroupStart";
    ++depth_;
    return record(c);
  }

  int group_end() override {
    Call c;
    c.op = "ncclGroupEnd";
    if (depth_ == 0) {
      violation("ncclGroupEnd without ncclGroupStart");
      c.result = cuda::kNcclInvalidUsage;
      return record(c);
    }
    record(c);
    if (--depth_ > 0) return cuda::kNcclSuccess;
    std::vector<Pending> ops;
    ops.swap(queued_);
    return run(ops);
  }

  int all_reduce(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp op, NcclComm comm,
                 NcclStream) override {
    Call c;
    c.op = "ncclAllReduce";
    c.count = count;
    Comm* m = lookup(comm, c);
    if (!m) return record(c);
    if (depth_ > 0 || (t != NcclType::f32 && t != NcclType::i32)) {
      violation("ncclAllReduce inside a group or of a type other than f32, i32: not modelled");
      c.result = cuda::kNcclInvalidUsage;
      return record(c);
    }
    const std::size_t bytes = count * 4;
    const fs::path folder = dir_ / fmt::format("{}.coll{}", m->name, m->colls++);
    fs::create_directories(folder);
    const std::string header = fmt::format("ncclAllReduce count={} type={} op={}\n", count, cuda::nccl_type_name(t),
                                           op == NcclRedOp::max ? "max" : "sum");
    write_whole(folder / fmt::format("rank-{}", m->rank),
                header + std::string(static_cast<const char*>(send), bytes));
    std::vector<std::string> files;
    c.result = wait_all(folder, m->nranks, files, "ncclAllReduce");
    if (c.result != cuda::kNcclSuccess) return record(c);
    std::vector<unsigned char> acc;
    for (int r = 0; r < m->nranks; ++r) {
      const std::string& f = files[static_cast<std::size_t>(r)];
      if (f.compare(0, header.size(), header) != 0 || f.size() != header.size() + bytes) {
        violation(fmt::format("{}: rank {} disagrees on its all-reduce ('{}')", m->name, r, f.substr(0, f.find('\n'))));
        c.result = cuda::kNcclInvalidUsage;
        return record(c);
      }
      const unsigned char* in = reinterpret_cast<const unsigned char*>(f.data() + header.size());
      if (r == 0) {
        acc.assign(in, in + bytes);
        continue;
      }
      for (std::size_t i = 0; i < count; ++i) {
        if (t == NcclType::f32) {
          float a, b;
          std::memcpy(&a, acc.data() + 4 * i, 4);
          std::memcpy(&b, in + 4 * i, 4);
          a = op == NcclRedOp::max ? std::max(a, b) : a + b;
          std::memcpy(acc.data() + 4 * i, &a, 4);
        } else {
          int32_t a, b;
          std::memcpy(&a, acc.data() + 4 * i, 4);
          std::memcpy(&b, in + 4 * i, 4);
          a = op == NcclRedOp::max ? std::max(a, b) : a + b;
          std::memcpy(acc.data() + 4 * i, &a, 4);
        }
      }
    }
    std::memcpy(recv, acc.data(), bytes);
    return record(c);
  }

  int all_gather(const void*, void*, std::size_t, NcclType, NcclComm, NcclStream) override {
    return unmodelled("ncclAllGather");
  }
  int reduce_scatter(const void*, void*, std::size_t, NcclType, NcclRedOp, NcclComm, NcclStream) override {
    return unmodelled("ncclReduceScatter");
  }
  int broadcast(const void*, void*, std::size_t, NcclType, int, NcclComm, NcclStream) override {
    return unmodelled("ncclBroadcast");
  }
  int send(const void*, std::size_t, NcclType, int, NcclComm, NcclStream) override { return unmodelled("ncclSend"); }
  int recv(void*, std::size_t, NcclType, int, NcclComm, NcclStream) override { return unmodelled("ncclRecv"); }

  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lk(mu_);
    return violations_;
  }
  int made() const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<int>(comms_.size());
  }

 private:
  struct Comm {
    std::string name;
    int rank = -1, nranks = 0;
    bool aborted = false;
    int splits = 0, colls = 0;
  };
  struct Pending {
    bool init = false;  // else a split
    Call call;
    NcclComm* out = nullptr;
    fs::path folder;
    Comm* parent = nullptr;
  };

  int record(const Call& c) {
    std::lock_guard<std::mutex> lk(mu_);
    calls_.push_back(c);
    return c.result;
  }
  void violation(const std::string& v) {
    std::lock_guard<std::mutex> lk(mu_);
    violations_.push_back(v);
  }
  int unmodelled(const char* op) {
    violation(fmt::format("{} is not modelled by the process fake", op));
    Call c;
    c.op = op;
    c.result = cuda::kNcclInvalidUsage;
    return record(c);
  }
  Comm* lookup(NcclComm comm, Call& c) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!known_.count(comm)) {
      violations_.push_back(fmt::format("{} on an unknown communicator", c.op));
      c.result = cuda::kNcclInvalidUsage;
      return nullptr;
    }
    Comm* m = static_cast<Comm*>(comm);
    c.comm = m->name;
    c.rank = m->rank;
    c.nranks = m->nranks;
    if (m->aborted) {
      violations_.push_back(fmt::format("{} on {} (rank {}) after its ncclCommAbort", c.op, m->name, m->rank));
      c.result = cuda::kNcclInvalidUsage;
      return nullptr;
    }
    return m;
  }
  Comm* make(std::string name, int rank, int nranks) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.push_back(Comm{std::move(name), rank, nranks});
    known_.insert(&comms_.back());
    return &comms_.back();
  }
  int defer(Pending p) {
    if (depth_ > 0) {
      queued_.push_back(std::move(p));
      return cuda::kNcclSuccess;
    }
    std::vector<Pending> one;
    one.push_back(std::move(p));
    return run(one);
  }

  // Waits for rank-0 .. rank-(n-1) in `folder`; files[r] their contents.
  int wait_all(const fs::path& folder, int n, std::vector<std::string>& files, const std::string& what) {
    files.assign(static_cast<std::size_t>(n), std::string());
    std::vector<bool> have(static_cast<std::size_t>(n), false);
    const auto deadline = Clock::now() + std::chrono::duration<double>(wait_seconds_);
    for (int missing = n;;) {
      for (int r = 0; r < n; ++r) {
        const fs::path f = folder / fmt::format("rank-{}", r);
        std::error_code ec;
        if (have[static_cast<std::size_t>(r)] || !fs::exists(f, ec)) continue;
        files[static_cast<std::size_t>(r)] = read_whole(f);
        have[static_cast<std::size_t>(r)] = true;
        --missing;
      }
      if (missing == 0) return cuda::kNcclSuccess;
      if (Clock::now() > deadline) {
        std::string ranks;
        for (int r = 0; r < n; ++r)
          if (!have[static_cast<std::size_t>(r)]) ranks += fmt::format(" {}", r);
        violation(fmt::format("{} in {}: ranks{} never came within {} s", what, folder.string(), ranks, wait_seconds_));
        return cuda::kNcclRemoteError;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // Publishes every op, then completes each (waiting for its peers).
  int run(std::vector<Pending>& ops) {
    for (Pending& p : ops) {
      fs::create_directories(p.folder);
      const int me = p.init ? p.call.rank : p.parent->rank;
      write_whole(p.folder / fmt::format("rank-{}", me),
                  p.init ? fmt::format("nranks={} device={} id={}", p.call.nranks, p.call.device, p.call.id)
                         : fmt::format("color={} key={}", p.call.color, p.call.key));
    }
    int first = cuda::kNcclSuccess;
    for (Pending& p : ops) {
      const int r = p.init ? complete_init(p) : complete_split(p);
      if (r != cuda::kNcclSuccess && first == cuda::kNcclSuccess) first = r;
    }
    return first;
  }

  int complete_init(Pending& p) {
    Call& c = p.call;
    std::vector<std::string> files;
    c.result = wait_all(p.folder, c.nranks, files, "ncclCommInitRank");
    if (c.result != cuda::kNcclSuccess) return record(c);
    for (int r = 0; r < c.nranks; ++r) {
      int n = -1, device = -1;
      char id[400] = {};
      if (std::sscanf(files[static_cast<std::size_t>(r)].c_str(), "nranks=%d device=%d id=%399s", &n, &device, id) != 3 ||
          n != c.nranks || c.id != id) {
        violation(fmt::format("ncclCommInitRank: rank {} joined with '{}', rank {} with nranks={} and its id", r,
                              files[static_cast<std::size_t>(r)].substr(0, 40), c.rank, c.nranks));
        c.result = cuda::kNcclInvalidUsage;
        return record(c);
      }
    }
    Comm* m = make(fmt::format("w{:016x}", fnv1a(c.id)), c.rank, c.nranks);
    *p.out = m;
    c.comm = m->name;
    c.new_rank = m->rank;
    c.new_size = m->nranks;
    return record(c);
  }

  int complete_split(Pending& p) {
    Call& c = p.call;
    std::vector<std::string> files;
    c.result = wait_all(p.folder, p.parent->nranks, files, "ncclCommSplit");
    if (c.result != cuda::kNcclSuccess) return record(c);
    std::vector<std::pair<int, int>> mine;  // (key, parent rank) of the ranks of c.color
    for (int r = 0; r < p.parent->nranks; ++r) {
      int color = 0, key = 0;
      if (std::sscanf(files[static_cast<std::size_t>(r)].c_str(), "color=%d key=%d", &color, &key) != 2) {
        violation(fmt::format("ncclCommSplit: rank {} wrote '{}'", r, files[static_cast<std::size_t>(r)]));
        c.result = cuda::kNcclInvalidUsage;
        return record(c);
      }
      if (color == c.color) mine.emplace_back(key, r);
    }
    if (c.color < 0) {  // NCCL_SPLIT_NOCOLOR
      *p.out = nullptr;
      return record(c);
    }
    std::sort(mine.begin(), mine.end());
    const int rank = static_cast<int>(
        std::find(mine.begin(), mine.end(), std::make_pair(c.key, p.parent->rank)) - mine.begin());
    Comm* m = make(fmt::format("{}.c{}", p.folder.filename().string(), c.color), rank, static_cast<int>(mine.size()));
    *p.out = m;
    c.new_rank = m->rank;
    c.new_size = m->nranks;
    return record(c);
  }

  fs::path dir_;
  double wait_seconds_;
  mutable std::mutex mu_;
  std::deque<Comm> comms_;  // a handle is an element's address (stable)
  std::set<NcclComm> known_;
  std::vector<Call> calls_;
  std::vector<std::string> violations_;
  int depth_ = 0;  // one thread drives the world's NCCL calls in these tests
  std::vector<Pending> queued_;
  int ids_ = 0;
};

class HostStream : public Stream {
 public:
  void synchronize() override {}
  void set_label(const char*) override {}
};

// Stands for cudaDeviceGetPCIBusId of GPU g of this machine: every process of the machine sees
// the same bus id for the same ordinal (one CUDA_VISIBLE_DEVICES for all).
std::string fake_bus_id(int g) { return fmt::format("00000000:{:02X}:00.0", 0x19 + g); }

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

const char* const kChildTest = "nccl launch: one process of a launch on one GPU (started by the nccl launch tests)";

}  // namespace

// One process of a launch: run only by the tests below, in a process of their making (hidden;
// without TESSEL_TEST_NCCL_LAUNCH_OUT it does nothing). It writes one line per fact to that
// file as it goes: a process killed midway leaves what it had seen.
TEST_CASE("nccl launch: one process of a launch on one GPU (started by the nccl launch tests)",
          "[.][nccl-launch-process]") {
  const char* out_path = std::getenv("TESSEL_TEST_NCCL_LAUNCH_OUT");
  if (!out_path) return;
  const auto t0 = Clock::now();
  std::ofstream out(out_path, std::ios::trunc);
  auto say = [&](const std::string& line) { out << line << '\n' << std::flush; };
  const std::string rdv = env_or("TESSEL_RENDEZVOUS_DIR", std::string(out_path) + ".rendezvous");
  ProcessFakeNccl fake(fs::path(rdv) / "fake-nccl", 10);
  try {
    const LaunchInfo li = detect_launch();
    say(fmt::format("launch rank={} world_size={} local_rank={} local_world_size={} source={}", li.rank, li.world_size,
                    li.local_rank, li.local_world_size, li.source));
    if (const double delay = std::atof(env_or("TESSEL_TEST_NCCL_LAUNCH_DELAY", "0").c_str()); delay > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    // As make_cuda_runtime: the launcher's process group, the mesh shared evenly, and the GPU
    // of each local device (CudaRuntime's constructor) among the visible ones (one here).
    const std::shared_ptr<ProcessGroup> pg = process_group_from_env();
    if (!pg) throw RuntimeError("process_group_from_env() returned no group");
    say(fmt::format("group {} rank={} size={} local_rank={}", pg->name(), pg->rank(), pg->size(), pg->local_rank()));
    const Mesh mesh = Mesh::parse(env_or("TESSEL_TEST_NCCL_LAUNCH_MESH", "data=2"));
    if (mesh.num_devices() % pg->size() != 0) throw RuntimeError("the mesh does not divide among the processes");
    const int64_t k = mesh.num_devices() / pg->size();
    const int visible = std::atoi(env_or("TESSEL_TEST_VISIBLE_GPUS", "1").c_str());
    std::vector<int64_t> positions;
    std::vector<int> gpus;
    std::vector<std::string> bus_ids;
    for (int64_t i = 0; i < k; ++i) {
      positions.push_back(pg->rank() * k + i);
      gpus.push_back(cuda::nccl_process_gpu(pg->local_rank(), k, i, visible));
      bus_ids.push_back(fake_bus_id(gpus.back()));
      say(fmt::format("device {} position={} gpu={} bus={}", i, positions.back(), gpus.back(), bus_ids.back()));
    }
    // As CudaRuntime::make_world: the bootstrap, then the world over the process group.
    const std::string id = cuda::nccl_bootstrap(*pg, bus_ids, [&] {
      std::string s(cuda::kNcclUniqueIdBytes, '\0');
      TESSEL_NCCL_CHECK(fake, fake.get_unique_id(s.data()));
      return s;
    });
    say("bootstrap_id " + hex(id));
    CudaWorldOptions wo;
    wo.processes = pg;
    {
      cuda::NcclWorldBase world(fake, mesh, positions, gpus, id, wo);
      std::map<int64_t, std::unique_ptr<Communicator>> data;
      std::vector<std::unique_ptr<Communicator>> alone;
      for (int64_t p : positions) {  // the axis sets a data=2 program asks for
        data[p] = world.communicator(p, {"data"});
        alone.push_back(world.communicator(p, {}));
        say(fmt::format("member data position={} rank={} size={}", p, data[p]->rank(), data[p]->size()));
        say(fmt::format("member none position={} rank={} size={}", p, alone.back()->rank(), alone.back()->size()));
      }
      // One all-reduce over `data` per local position, each on a thread (a collective waits
      // for its peers): position p contributes p + 1.
      std::map<int64_t, float> x;
      std::map<int64_t, std::string> errors;
      for (int64_t p : positions) x[p] = static_cast<float>(p + 1);
      std::vector<std::thread> ts;
      for (int64_t p : positions)
        ts.emplace_back([&, p] {
          try {
            HostStream s;
            data[p]->all_reduce(&x[p], &x[p], 1, DType::f32, ReduceOp::Sum, s);
          } catch (const std::exception& e) {
            errors[p] = e.what();
          }
        });
      for (auto& t : ts) t.join();
      for (int64_t p : positions)
        say(errors.count(p) ? fmt::format("allreduce_error position={} {}", p, one_line(errors[p]))
                            : fmt::format("allreduce position={} value={}", p, x[p]));
      if (env_or("TESSEL_TEST_NCCL_LAUNCH_ABORT", "0") == "1") {
        // Process 0 aborts (as on an NCCL error or a cancel); the others' watchdogs must see it.
        if (pg->rank() == 0) {
          world.abort("injected by process 0 after its all-reduce");
          say("abort_posted");
        } else {
          const auto until = Clock::now() + std::chrono::seconds(10);
          while (!world.aborted() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          say(world.aborted() ? "abort_seen " + one_line(world.abort_reason()) : std::string("abort_not_seen"));
        }
      }
      data.clear();
      alone.clear();
    }
    say("world_closed");
  } catch (const std::exception& e) {
    say(std::string("error ") + one_line(e.what()));
  }
  for (const ProcessFakeNccl::Call& c : fake.calls())
    say(fmt::format("call {} comm={} rank={} nranks={} device={} color={} key={} new_rank={} new_size={} count={} "
                    "result={} id={}",
                    c.op, c.comm.empty() ? "-" : c.comm, c.rank, c.nranks, c.device, c.color, c.key, c.new_rank,
                    c.new_size, c.count, c.result, c.id.empty() ? "-" : c.id));
  for (const std::string& v : fake.violations()) say("violation " + one_line(v));
  say(fmt::format("made {}", fake.made()));
  say(fmt::format("elapsed_s {:.3f}", seconds_since(t0)));
  say("done");
}

namespace {

// What one process of a launch wrote (above), and how it ended.
struct Process {
  pid_t pid = -1;
  std::string out_path, log_path;
  std::vector<std::string> lines;
  std::string log;
  bool exited = false;
  int status = -1, signal = 0;

  bool has(const std::string& prefix) const {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
  }
  // The rest of the first line that starts with `prefix` ("" when none).
  std::string value(const std::string& prefix) const {
    for (const std::string& l : lines)
      if (l.rfind(prefix, 0) == 0) return l.substr(prefix.size());
    return "";
  }
  // The recorded NCCL calls named `op`, each as its key=value fields.
  std::vector<std::map<std::string, std::string>> calls(const std::string& op) const {
    std::vector<std::map<std::string, std::string>> out;
    for (const std::string& l : lines) {
      if (l.rfind("call " + op + " ", 0) != 0) continue;
      std::map<std::string, std::string> f;
      std::istringstream in(l.substr(6 + op.size()));
      std::string tok;
      while (in >> tok)
        if (const auto eq = tok.find('='); eq != std::string::npos) f[tok.substr(0, eq)] = tok.substr(eq + 1);
      out.push_back(std::move(f));
    }
    return out;
  }
  std::string describe() const {
    std::string s = fmt::format("exited={} status={} signal={}\n--- its report:\n", exited, status, signal);
    for (const std::string& l : lines) s += l.substr(0, 300) + "\n";
    return s + "--- its output:\n" + log;
  }
};

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(TESSEL_BINARY_DIR) / fmt::format("{}-{}-{}", name, ::getpid(), std::random_device{}());
  fs::create_directories(d);
  return d.string();
}

std::string self_exe() {
  char buf[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<std::size_t>(n));
}

// Starts this test binary on kChildTest with this process's environment minus every launcher,
// NCCL and rendezvous variable, plus `env`: the environment a launcher would give it.
Process start(const std::string& dir, const std::string& name, const std::map<std::string, std::string>& env) {
  Process p;
  p.out_path = dir + "/" + name + ".report";
  p.log_path = dir + "/" + name + ".log";
  auto launcher_var = [](const std::string& kv) {
    const std::string n = kv.substr(0, kv.find('='));
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
      if (n == v) return true;
    for (const char* pre : {"OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "NCCL_", "TESSEL_RENDEZVOUS_", "TESSEL_TEST_NCCL_"})
      if (n.rfind(pre, 0) == 0) return true;
    return false;
  };
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e)
    if (!launcher_var(*e)) vars.emplace_back(*e);
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  vars.push_back("TESSEL_TEST_NCCL_LAUNCH_OUT=" + p.out_path);
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  const std::string exe = self_exe();
  std::string test = kChildTest;
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), test.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, p.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = ::posix_spawn(&p.pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return p;
}

// Waits for the process (killed after timeout_s), then reads its report and output.
void finish(Process& p, double timeout_s = 60) {
  const auto t0 = Clock::now();
  int st = 0;
  while (::waitpid(p.pid, &st, WNOHANG) == 0) {
    if (seconds_since(t0) > timeout_s) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  p.exited = WIFEXITED(st);
  p.status = p.exited ? WEXITSTATUS(st) : -1;
  p.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  std::ifstream f(p.out_path);
  for (std::string l; std::getline(f, l);) p.lines.push_back(l);
  p.log = read_whole(p.log_path);
}

// The environment the GPU round gives process `rank` of two on one GPU (docs/backend-cuda.md).
std::map<std::string, std::string> one_gpu_env(const std::string& rendezvous, int rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "0"},
          {"TESSEL_RENDEZVOUS_DIR", rendezvous},
          {"NCCL_HOSTID", fmt::format("tessel-{}", rank)},
          {"NCCL_SOCKET_IFNAME", "lo"},
          {"NCCL_P2P_DISABLE", "1"},
          {"NCCL_SHM_DISABLE", "1"},
          {"NCCL_IB_DISABLE", "1"}};
}

// Both processes of a launch, started together, run to the end.
std::vector<Process> launch_two(const std::string& dir, const std::vector<std::map<std::string, std::string>>& envs) {
  std::vector<Process> ps;
  for (std::size_t r = 0; r < envs.size(); ++r) ps.push_back(start(dir, fmt::format("process{}", r), envs[r]));
  for (Process& p : ps) finish(p);
  return ps;
}

}  // namespace

TEST_CASE("nccl launch: two processes on one GPU with distinct NCCL_HOSTID join one NCCL world through the "
          "RANK/WORLD_SIZE launcher (fake NCCL)",
          "[unit][nccl]") {
  const auto t0 = Clock::now();
  const std::string dir = fresh_dir("nccl-launch");
  const std::string rdv = dir + "/rendezvous";
  std::vector<std::map<std::string, std::string>> envs = {one_gpu_env(rdv, 0), one_gpu_env(rdv, 1)};
  for (auto& e : envs) e["TESSEL_TEST_NCCL_LAUNCH_ABORT"] = "1";
  const std::vector<Process> ps = launch_two(dir, envs);
  const Mesh mesh = Mesh::parse("data=2");
  const auto data_groups = mesh.groups({"data"});  // {{0, 1}}: one colour, key = position
  const auto alone_groups = mesh.groups({});       // {{0}, {1}}: colour = position, key 0
  REQUIRE(data_groups.size() == 1);
  REQUIRE(alone_groups.size() == 2);

  std::string ids[2];
  for (int r = 0; r < 2; ++r) {
    const Process& p = ps[static_cast<std::size_t>(r)];
    INFO("process " << r << ": " << p.describe());
    REQUIRE(p.exited);
    CHECK(p.status == 0);
    REQUIRE(p.has("done"));
    CHECK_FALSE(p.has("error "));
    CHECK_FALSE(p.has("violation "));
    CHECK(p.value("launch ") ==
          fmt::format("rank={} world_size=2 local_rank=0 local_world_size=2 source=env", r));
    CHECK(p.value("group ") == fmt::format("file rank={} size=2 local_rank=0", r));
    // One device per process, position = rank, on GPU 0 (the one visible GPU).
    CHECK(p.value("device 0 ") == fmt::format("position={} gpu=0 bus={}", r, fake_bus_id(0)));
    CHECK_FALSE(p.has("device 1 "));
    // The unique id: made once, by rank 0; every process joins with those bytes.
    CHECK(p.calls("ncclGetUniqueId").size() == (r == 0 ? 1u : 0u));
    const auto inits = p.calls("ncclCommInitRank");
    REQUIRE(inits.size() == 1);
    CHECK(inits[0].at("rank") == std::to_string(r));
    CHECK(inits[0].at("nranks") == "2");
    CHECK(inits[0].at("device") == "0");
    CHECK(inits[0].at("result") == "0");
    ids[r] = inits[0].at("id");
    CHECK(p.value("bootstrap_id ") == ids[r]);
    // The splits, in the order the world asked for them: data, then none; colour = index of the
    // device's group in Mesh::groups, key = its index in the group.
    const auto splits = p.calls("ncclCommSplit");
    REQUIRE(splits.size() == 2);
    CHECK(splits[0].at("color") == "0");
    CHECK(splits[0].at("key") ==
          std::to_string(std::find(data_groups[0].begin(), data_groups[0].end(), r) - data_groups[0].begin()));
    CHECK(splits[0].at("new_rank") == std::to_string(r));
    CHECK(splits[0].at("new_size") == "2");
    CHECK(splits[1].at("color") == std::to_string(r));
    CHECK(alone_groups[static_cast<std::size_t>(r)] == std::vector<int64_t>{r});
    CHECK(splits[1].at("key") == "0");
    CHECK(splits[1].at("new_rank") == "0");
    CHECK(splits[1].at("new_size") == "1");
    for (const auto& s : splits) CHECK(s.at("result") == "0");
    CHECK(p.value("member data ") == fmt::format("position={} rank={} size=2", r, r));
    CHECK(p.value("member none ") == fmt::format("position={} rank=0 size=1", r));
    // 1 + 2 over the data group, through the split communicator.
    CHECK(p.value("allreduce ") == fmt::format("position={} value=3", r));
    const auto reduces = p.calls("ncclAllReduce");
    REQUIRE(reduces.size() == 1);
    CHECK(reduces[0].at("comm") == splits[0].at("comm") + ".split0.c0");
    CHECK(reduces[0].at("rank") == std::to_string(r));
    CHECK(reduces[0].at("nranks") == "2");
    CHECK(reduces[0].at("count") == "1");
    // Every communicator made (the world's and two splits) aborted once, by the abort.
    CHECK(p.value("made ") == "3");
    CHECK(p.calls("ncclCommAbort").size() == 3u);
    CHECK(p.has("world_closed"));
  }
  CHECK(ids[0] == ps[0].calls("ncclGetUniqueId").at(0).at("id"));
  CHECK(ids[0] == ids[1]);
  CHECK(ids[0].size() == 2 * tessel::cuda::kNcclUniqueIdBytes);
  // Process 0's abort reached process 1's world through the abort channel, naming it.
  CHECK(ps[0].has("abort_posted"));
  CHECK(ps[1].value("abort_seen ") == "process 0 aborted: injected by process 0 after its all-reduce");
  // Rank 0 says once that the two share a GPU through distinct NCCL_HOSTID.
  CHECK_THAT(ps[0].log, Catch::Contains("processes 0 and 1 share GPU " + fake_bus_id(0)) &&
                            Catch::Contains("distinct NCCL_HOSTID ('tessel-0', 'tessel-1')") &&
                            Catch::Contains("not supported by NVIDIA"));
  CHECK_THAT(ps[1].log, !Catch::Contains("share GPU"));
  const double took = seconds_since(t0);
  INFO("took " << took << " s");
  CHECK(took < 30);
  fs::remove_all(dir);
}

TEST_CASE("nccl launch: two processes on one GPU without distinct NCCL_HOSTID are refused on both before any NCCL "
          "call and told what to set",
          "[unit][nccl]") {
  const std::string dir = fresh_dir("nccl-launch-refused");
  // torchrun's default on a machine with one GPU (LOCAL_RANK 0 and 1: both on GPU 0), NCCL_HOSTID
  // unset; then LOCAL_RANK 0 on both with one NCCL_HOSTID for both.
  for (const bool same_hostid : {false, true}) {
    INFO((same_hostid ? "one NCCL_HOSTID for both" : "NCCL_HOSTID unset"));
    const std::string run = dir + (same_hostid ? "/same" : "/unset");
    fs::create_directories(run);
    std::vector<std::map<std::string, std::string>> envs = {one_gpu_env(run + "/rendezvous", 0),
                                                            one_gpu_env(run + "/rendezvous", 1)};
    for (int r = 0; r < 2; ++r) {
      auto& e = envs[static_cast<std::size_t>(r)];
      if (same_hostid) {
        e["NCCL_HOSTID"] = "tessel";
      } else {
        e.erase("NCCL_HOSTID");
        e["LOCAL_RANK"] = std::to_string(r);
      }
    }
    const std::vector<Process> ps = launch_two(run, envs);
    for (int r = 0; r < 2; ++r) {
      const Process& p = ps[static_cast<std::size_t>(r)];
      INFO("process " << r << ": " << p.describe());
      REQUIRE(p.has("done"));
      CHECK(p.value("device 0 ") == fmt::format("position={} gpu=0 bus={}", r, fake_bus_id(0)));
      const std::string err = p.value("error ");
      CHECK_THAT(err, Catch::Contains("nccl bootstrap: processes 0 and 1 both have a rank on GPU " + fake_bus_id(0)) &&
                          Catch::Contains("\"Duplicate GPU detected\"") &&
                          Catch::Contains("own NCCL_HOSTID (e.g. NCCL_HOSTID=tessel-$RANK)") &&
                          Catch::Contains("NCCL_MULTI_RANK_GPU_ENABLE=1"));
      CHECK_THAT(err, Catch::Contains(same_hostid ? "(NCCL_HOSTID='tessel' on both)" : "(NCCL_HOSTID unset on both)"));
      // Refused before any NCCL call but rank 0's unique id: no process waits in NCCL's init.
      CHECK(p.calls("ncclCommInitRank").empty());
      CHECK(p.calls("ncclGetUniqueId").size() == (r == 0 ? 1u : 0u));
      CHECK_FALSE(p.has("violation "));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("nccl launch: a process whose peer was killed before the rendezvous fails within the rendezvous "
          "timeout naming it",
          "[unit][nccl]") {
  const std::string dir = fresh_dir("nccl-launch-killed");
  const std::string rdv = dir + "/rendezvous";
  std::map<std::string, std::string> e0 = one_gpu_env(rdv, 0), e1 = one_gpu_env(rdv, 1);
  e0["TESSEL_RENDEZVOUS_TIMEOUT"] = e1["TESSEL_RENDEZVOUS_TIMEOUT"] = "1.5";
  e1["TESSEL_TEST_NCCL_LAUNCH_DELAY"] = "60";  // killed while it waits
  Process p0 = start(dir, "process0", e0);
  Process p1 = start(dir, "process1", e1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(p1.pid, SIGKILL);
  finish(p1);
  finish(p0);
  INFO("process 0: " << p0.describe());
  INFO("process 1: " << p1.describe());
  CHECK(p1.signal == SIGKILL);
  CHECK_FALSE(p1.has("bootstrap_id "));
  REQUIRE(p0.has("done"));
  CHECK(p0.exited);
  CHECK_THAT(p0.value("error "), Catch::StartsWith("rendezvous: rank 0 waited") &&
                                     Catch::Contains("for ranks 1 of 2 (did they start"));
  CHECK(p0.calls("ncclCommInitRank").empty());
  const double elapsed = std::atof(p0.value("elapsed_s ").c_str());
  CHECK(elapsed >= 1.5);
  CHECK(elapsed < 6);
  fs::remove_all(dir);
}

TEST_CASE("nccl launch: the GPU map and NCCL's one-rank-per-GPU rule across processes", "[unit][nccl]") {
  using tessel::cuda::nccl_process_gpu;
  // Two processes of a node with one device each: distinct GPUs while there are two, GPU 0 for
  // both on one GPU (LOCAL_RANK 0 for both, or 0 and 1).
  CHECK(nccl_process_gpu(0, 1, 0, 2) == 0);
  CHECK(nccl_process_gpu(1, 1, 0, 2) == 1);
  CHECK(nccl_process_gpu(1, 1, 0, 1) == 0);
  CHECK(nccl_process_gpu(0, 2, 1, 4) == 1);
  CHECK(nccl_process_gpu(1, 2, 1, 4) == 3);
  CHECK_THROWS_WITH(nccl_process_gpu(0, 1, 0, 0), Catch::Contains("0 visible GPU(s): out of range"));

  auto proc = [](int rank, const std::string& hostid, std::vector<std::string> gpus) {
    tessel::cuda::NcclProcessInfo p;
    p.rank = rank;
    p.hostname = "node";
    p.boot_id = "boot";
    p.nccl_hostid = hostid;
    p.gpus = std::move(gpus);
    return p;
  };
  using tessel::cuda::nccl_check_process_gpus;
  // Distinct GPUs (e.g. CUDA_VISIBLE_DEVICES per process: both ordinal 0, distinct bus ids).
  CHECK(nccl_check_process_gpus({proc(0, "", {"A"}), proc(1, "", {"B"})}).empty());
  // One GPU, distinct NCCL_HOSTID: allowed, with the warning.
  CHECK_THAT(nccl_check_process_gpus({proc(0, "h0", {"A"}), proc(1, "h1", {"A"})}),
             Catch::Contains("processes 0 and 1 share GPU A of host node"));
  // Two machines with the same bus id: the ordinary multi-node case, no warning.
  auto other = proc(1, "", {"A"});
  other.hostname = "node2";
  CHECK(nccl_check_process_gpus({proc(0, "", {"A"}), other}).empty());
  // One GPU, NCCL_HOSTID unset or equal: refused, naming the processes and the GPU.
  CHECK_THROWS_WITH(nccl_check_process_gpus({proc(0, "", {"A"}), proc(1, "", {"B"}), proc(2, "", {"C", "A"})}),
                    Catch::Contains("processes 0 and 2 both have a rank on GPU A of host node"));
  CHECK_THROWS_WITH(nccl_check_process_gpus({proc(0, "x", {"A"}), proc(1, "x", {"A"})}),
                    Catch::Contains("NCCL_HOSTID='x' on both"));
  // NCCL 2.30+'s NCCL_MULTI_RANK_GPU_ENABLE on both: left to NCCL.
  auto m0 = proc(0, "", {"A"}), m1 = proc(1, "", {"A"});
  m0.multi_rank_gpu = m1.multi_rank_gpu = true;
  CHECK(nccl_check_process_gpus({m0, m1}).empty());
  m1.multi_rank_gpu = false;
  CHECK_THROWS(nccl_check_process_gpus({m0, m1}));
}

TEST_CASE("nccl launch: TESSEL_RENDEZVOUS_TIMEOUT sets the file group's timeout and a bad one is an error naming it",
          "[unit][nccl]") {
  if (launched_by_mpi()) return;  // the MPI variables take precedence
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  const std::string dir = fresh_dir("nccl-launch-timeout");
  ::setenv("TESSEL_RENDEZVOUS_DIR", dir.c_str(), 1);
  ::setenv("TESSEL_RENDEZVOUS_TIMEOUT", "0.2", 1);
  std::string err;
  const auto t0 = Clock::now();
  try {
    process_group_from_env()->allgather("x");
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK(seconds_since(t0) < 5);
  CHECK_THAT(err, Catch::Contains("for ranks 1 of 2"));
  for (const char* bad : {"0", "-1", "soon", "inf"}) {
    ::setenv("TESSEL_RENDEZVOUS_TIMEOUT", bad, 1);
    CHECK_THROWS_WITH(process_group_from_env(), Catch::Contains(fmt::format("TESSEL_RENDEZVOUS_TIMEOUT='{}'", bad)));
  }
  for (const char* v : {"WORLD_SIZE", "RANK", "TESSEL_RENDEZVOUS_DIR", "TESSEL_RENDEZVOUS_TIMEOUT"}) ::unsetenv(v);
  fs::remove_all(dir);
}
