// The NCCL world on a recording fake of NCCL (issue 22, "GPU readiness"): the world's host logic
// (src/runtime/cuda/nccl_core.cpp, the code the GPU runs, with the CUDA side left out) calls
// NCCL through its table of entry points, here FakeNccl (nccl_fake.hpp), which moves the data
// on host memory and checks NCCL's rules: group balance, send/recv pairing, in-place pointers,
// split colours and keys against Mesh::groups, no call after an abort. Every test ends with the
// fake's violations (and, where every call completed, its state at rest) empty.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "nccl_core.hpp"
#include "nccl_fake.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "test_util.hpp"

using namespace tessel;
using tessel::cuda::NcclCommunicatorBase;
using tessel::cuda::NcclWorldBase;
using tessel::test::FakeNccl;
using tessel_test::error_of;

namespace {

class HostStream : public Stream {
 public:
  void synchronize() override {}
  void set_label(const char*) override {}
};

// A world driving every position of `mesh` (position i "on GPU i").
template <class World = NcclWorldBase>
std::unique_ptr<NcclWorldBase> fake_world(FakeNccl& fake, const Mesh& mesh, const CudaWorldOptions& o = {}) {
  std::vector<int64_t> positions(static_cast<std::size_t>(mesh.num_devices()));
  std::iota(positions.begin(), positions.end(), int64_t{0});
  std::vector<int> gpus(positions.begin(), positions.end());
  return std::make_unique<World>(fake, mesh, positions, gpus, std::string(), o);
}

NcclCommunicatorBase& member(const std::unique_ptr<Communicator>& c) {
  return dynamic_cast<NcclCommunicatorBase&>(*c);
}

// Every position's communicator for `axes`, made in position order on this thread (as a
// runtime does at load).
std::vector<std::unique_ptr<Communicator>> members(NcclWorldBase& w, const std::vector<std::string>& axes) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (int64_t p = 0; p < w.mesh().num_devices(); ++p) out.push_back(w.communicator(p, axes));
  return out;
}

// A fake NCCL, a world over every position of `mesh` on it, and every position's communicator
// for `axes`. Destroyed in the order NCCL needs: the members, the world, then the fake.
struct FakeSetup {
  FakeSetup(const Mesh& mesh, const std::vector<std::string>& axes, double wait_seconds = 10)
      : fake(wait_seconds), world(fake_world(fake, mesh)), comms(members(*world, axes)) {}
  FakeNccl fake;
  std::unique_ptr<NcclWorldBase> world;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// fn(position) on a thread per position (a collective blocks until its peers come).
void on_threads(int64_t n, const std::function<void(int64_t)>& fn) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int64_t p = 0; p < n; ++p)
    ts.emplace_back([&, p] {
      try {
        fn(p);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(p)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int64_t p = 0; p < n; ++p) {
    INFO("position " << p);
    CHECK(errors[static_cast<std::size_t>(p)] == "");
  }
}

void check_clean(const FakeNccl& fake, bool at_rest = true) {
  for (const std::string& v : fake.violations()) FAIL_CHECK("fake NCCL: " << v);
  if (at_rest)
    for (const std::string& v : fake.check_quiescent()) FAIL_CHECK("fake NCCL at rest: " << v);
}

const std::vector<std::vector<std::string>> kAxisSets = {{"data"}, {"model"}, {"data", "model"}, {}};

}  // namespace

TEST_CASE("nccl fake: split colours and keys come from Mesh::groups and give each member its group rank",
          "[unit][nccl]") {
  for (const char* text : {"data=2,model=3", "data=2,model=2,pipe=2"}) {
    const Mesh mesh = Mesh::parse(text);
    INFO("mesh " << mesh.to_string());
    FakeNccl fake;
    auto w = fake_world(fake, mesh);
    std::vector<std::vector<std::string>> sets = kAxisSets;
    sets.push_back({"model", "data"});  // major->minor in the order given
    if (mesh.rank() == 3) sets.push_back({"pipe", "data"});
    for (const auto& axes : sets) {
      INFO("axes {" << join(axes, ",") << "}");
      const std::size_t before = fake.calls().size();
      auto comms = members(*w, axes);
      const auto groups = mesh.groups(axes);
      // One grouped ncclCommSplit per position, on its world communicator.
      int splits = 0;
      for (std::size_t i = before; i < fake.calls().size(); ++i) {
        const FakeNccl::Call c = fake.calls()[i];
        if (c.op != "ncclCommSplit") continue;
        ++splits;
        CHECK(c.depth == 1);
        const int64_t p = c.rank;  // the world communicator's rank is the position
        std::size_t color = 0;
        while (color < groups.size() && std::find(groups[color].begin(), groups[color].end(), p) == groups[color].end())
          ++color;
        REQUIRE(color < groups.size());
        CHECK(c.color == static_cast<int>(color));
        CHECK(c.key == static_cast<int>(std::find(groups[color].begin(), groups[color].end(), p) - groups[color].begin()));
      }
      CHECK(splits == mesh.num_devices());
      for (int64_t p = 0; p < mesh.num_devices(); ++p) {
        const auto group = mesh.group(p, axes);
        NcclCommunicatorBase& m = member(comms[static_cast<std::size_t>(p)]);
        CHECK(m.rank() == mesh.index_in_group(p, axes));
        CHECK(fake.rank_of(m.comm()) == m.rank());
        CHECK(fake.size_of(m.comm()) == static_cast<int>(group.size()));
        CHECK(m.size() == static_cast<int>(group.size()));
        // The NCCL communicator's members are exactly the mesh group, in Mesh::group order.
        for (std::size_t k = 0; k < group.size(); ++k) {
          NcclCommunicatorBase& q = member(comms[static_cast<std::size_t>(group[k])]);
          CHECK(fake.clique_of(q.comm()) == fake.clique_of(m.comm()));
          CHECK(fake.rank_of(q.comm()) == static_cast<int>(k));
          CHECK(fake.world_rank_of(q.comm()) == group[k]);
        }
      }
      // A second request for the same axes splits nothing more.
      const std::size_t after = fake.calls().size();
      (void)w->communicator(0, axes);
      CHECK(fake.calls().size() == after);
    }
    check_clean(fake);
  }
}

TEST_CASE("nccl fake: all-gather reduce-scatter and all-reduce move NCCL's data in and out of place",
          "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=3");
  const int64_t n_dev = mesh.num_devices();
  constexpr std::size_t kE = 4;  // elements per rank block
  for (const auto& axes : kAxisSets) {
    INFO("axes {" << join(axes, ",") << "}");
    FakeSetup f(mesh, axes);
    auto& fake = f.fake;
    auto& comms = f.comms;
    const std::size_t n = mesh.group(0, axes).size();
    // Per position: buffers, allocated up front and tracked (every pointer must lie in them).
    struct Bufs {
      std::vector<float> ag_send, ag_out, ag_inplace, rs_send, rs_out, rs_inplace, ar_send, ar_out, ar_inplace;
      std::vector<int32_t> ar_max;
    };
    std::vector<Bufs> b(static_cast<std::size_t>(n_dev));
    auto val = [](int64_t p, std::size_t i) { return static_cast<float>(p * 100 + static_cast<int64_t>(i)); };
    for (int64_t p = 0; p < n_dev; ++p) {
      Bufs& x = b[static_cast<std::size_t>(p)];
      const std::size_t r = static_cast<std::size_t>(mesh.index_in_group(p, axes));
      x.ag_send.resize(kE);
      x.ag_out.assign(n * kE, -1);
      x.ag_inplace.assign(n * kE, -1);
      for (std::size_t i = 0; i < kE; ++i) x.ag_send[i] = x.ag_inplace[r * kE + i] = val(p, i);
      x.rs_send.resize(n * kE);
      for (std::size_t i = 0; i < n * kE; ++i) x.rs_send[i] = val(p, i);
      x.rs_inplace = x.rs_send;
      x.rs_out.assign(kE, -1);
      x.ar_send.resize(kE);
      for (std::size_t i = 0; i < kE; ++i) x.ar_send[i] = val(p, i);
      x.ar_inplace = x.ar_send;
      x.ar_out.assign(kE, -1);
      x.ar_max = {static_cast<int32_t>(p), static_cast<int32_t>(-p), 7, static_cast<int32_t>(p * p)};
      for (auto* v : {&x.ag_send, &x.ag_out, &x.ag_inplace, &x.rs_send, &x.rs_out, &x.rs_inplace, &x.ar_send, &x.ar_out,
                      &x.ar_inplace})
        fake.track(v->data(), v->size() * sizeof(float));
      fake.track(x.ar_max.data(), x.ar_max.size() * sizeof(int32_t));
    }
    on_threads(n_dev, [&](int64_t p) {
      HostStream s;
      Communicator& c = *comms[static_cast<std::size_t>(p)];
      Bufs& x = b[static_cast<std::size_t>(p)];
      const std::size_t r = static_cast<std::size_t>(c.rank());
      const std::size_t blk = kE * sizeof(float);
      c.all_gather(x.ag_send.data(), x.ag_out.data(), blk, s);
      c.all_gather(x.ag_inplace.data() + r * kE, x.ag_inplace.data(), blk, s);  // in place
      c.reduce_scatter(x.rs_send.data(), x.rs_out.data(), kE, DType::f32, ReduceOp::Sum, s);
      c.reduce_scatter(x.rs_inplace.data(), x.rs_inplace.data() + r * kE, kE, DType::f32, ReduceOp::Sum, s);
      c.all_reduce(x.ar_send.data(), x.ar_out.data(), kE, DType::f32, ReduceOp::Sum, s);
      c.all_reduce(x.ar_inplace.data(), x.ar_inplace.data(), kE, DType::f32, ReduceOp::Sum, s);
      c.all_reduce(x.ar_max.data(), x.ar_max.data(), 4, DType::i32, ReduceOp::Max, s);
    });
    for (int64_t p = 0; p < n_dev; ++p) {
      INFO("position " << p);
      const auto group = mesh.group(p, axes);
      const Bufs& x = b[static_cast<std::size_t>(p)];
      const std::size_t r = static_cast<std::size_t>(mesh.index_in_group(p, axes));
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < kE; ++i) {
          CHECK(x.ag_out[j * kE + i] == val(group[j], i));
          CHECK(x.ag_inplace[j * kE + i] == val(group[j], i));
        }
      for (std::size_t i = 0; i < kE; ++i) {
        float rs = 0, ar = 0;
        int32_t mx[4] = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
        for (int64_t q : group) {
          rs += val(q, r * kE + i);
          ar += val(q, i);
          const int32_t v[4] = {static_cast<int32_t>(q), static_cast<int32_t>(-q), 7, static_cast<int32_t>(q * q)};
          mx[i] = std::max(mx[i], v[i]);
        }
        CHECK(x.rs_out[i] == rs);
        CHECK(x.rs_inplace[r * kE + i] == rs);
        CHECK(x.ar_out[i] == ar);
        CHECK(x.ar_inplace[i] == ar);
        CHECK(x.ar_max[i] == mx[i]);
      }
    }
    check_clean(fake);
  }
}

TEST_CASE("nccl fake: all-to-all and permutes pair every send with its receive", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=3");
  const int64_t n_dev = mesh.num_devices();
  constexpr std::size_t kB = 8;  // bytes per block
  for (const auto& axes : kAxisSets) {
    INFO("axes {" << join(axes, ",") << "}");
    FakeSetup f(mesh, axes);
    auto& fake = f.fake;
    auto& comms = f.comms;
    const std::size_t n = mesh.group(0, axes).size();
    struct Bufs {
      std::vector<unsigned char> a2a_send, a2a_out, mine, ring_out, chain_out, left_out, right_out;
    };
    std::vector<Bufs> b(static_cast<std::size_t>(n_dev));
    auto byte = [](int64_t p, std::size_t j, std::size_t k) { return static_cast<unsigned char>(p * 31 + j * 7 + k); };
    for (int64_t p = 0; p < n_dev; ++p) {
      Bufs& x = b[static_cast<std::size_t>(p)];
      x.a2a_send.resize(n * kB);
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t k = 0; k < kB; ++k) x.a2a_send[j * kB + k] = byte(p, j, k);
      x.a2a_out.assign(n * kB, 0xEE);
      x.mine.resize(kB);
      for (std::size_t k = 0; k < kB; ++k) x.mine[k] = byte(p, 99, k);
      for (auto* v : {&x.ring_out, &x.chain_out, &x.left_out, &x.right_out}) v->assign(kB, 0xEE);
      for (auto* v : {&x.a2a_send, &x.a2a_out, &x.mine, &x.ring_out, &x.chain_out, &x.left_out, &x.right_out})
        fake.track(v->data(), v->size());
    }
    on_threads(n_dev, [&](int64_t p) {
      HostStream s;
      Communicator& c = *comms[static_cast<std::size_t>(p)];
      Bufs& x = b[static_cast<std::size_t>(p)];
      const int r = c.rank(), sz = c.size();
      c.all_to_all(x.a2a_send.data(), x.a2a_out.data(), kB, s);
      // A full ring: to r+1, from r-1.
      c.collective_permute(x.mine.data(), (r + 1) % sz, x.ring_out.data(), (r + sz - 1) % sz, kB, s);
      // A partial one, a chain: the last sends nothing, the first receives nothing.
      c.collective_permute(x.mine.data(), r + 1 < sz ? r + 1 : -1, x.chain_out.data(), r > 0 ? r - 1 : -1, kB, s);
      // Both directions of a bidirectional ring step in one group (as the executor issues
      // them when a communicator groups permutes).
      c.group_start();
      c.collective_permute(x.mine.data(), (r + 1) % sz, x.right_out.data(), (r + sz - 1) % sz, kB, s);
      c.collective_permute(x.mine.data(), (r + sz - 1) % sz, x.left_out.data(), (r + 1) % sz, kB, s);
      c.group_end();
    });
    for (int64_t p = 0; p < n_dev; ++p) {
      INFO("position " << p);
      const auto group = mesh.group(p, axes);
      const Bufs& x = b[static_cast<std::size_t>(p)];
      const std::size_t r = static_cast<std::size_t>(mesh.index_in_group(p, axes));
      const int64_t prev = group[(r + n - 1) % n], next = group[(r + 1) % n];
      for (std::size_t k = 0; k < kB; ++k) {
        for (std::size_t j = 0; j < n; ++j) CHECK(x.a2a_out[j * kB + k] == byte(group[j], r, k));
        CHECK(x.ring_out[k] == byte(prev, 99, k));
        CHECK(x.chain_out[k] == (r > 0 ? byte(prev, 99, k) : 0xEE));
        CHECK(x.right_out[k] == byte(prev, 99, k));
        CHECK(x.left_out[k] == byte(next, 99, k));
      }
    }
    // Every send and receive was inside a group; as many of each.
    int sends = 0, recvs = 0;
    for (const FakeNccl::Call& c : fake.calls()) {
      if (c.op != "ncclSend" && c.op != "ncclRecv") continue;
      (c.op == "ncclSend" ? sends : recvs) += 1;
      CHECK(c.depth >= 1);
    }
    CHECK(sends == recvs);
    CHECK(sends == static_cast<int>(n_dev * (n + 1 + 2)) + static_cast<int>(n_dev - n_dev / static_cast<int64_t>(n)));
    check_clean(fake);
  }
}

TEST_CASE("nccl fake: broadcast and barrier", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  FakeSetup f(mesh, {"model"});
  auto& fake = f.fake;
  auto& comms = f.comms;
  std::vector<std::vector<unsigned char>> buf(4, std::vector<unsigned char>(5));
  for (int64_t p = 0; p < 4; ++p) std::fill(buf[static_cast<std::size_t>(p)].begin(), buf[static_cast<std::size_t>(p)].end(), static_cast<unsigned char>(p + 1));
  on_threads(4, [&](int64_t p) {
    HostStream s;
    Communicator& c = *comms[static_cast<std::size_t>(p)];
    c.broadcast(buf[static_cast<std::size_t>(p)].data(), 5, 1, s);
    c.barrier(s);
  });
  for (int64_t p = 0; p < 4; ++p) {
    const int64_t root = mesh.group(p, {"model"})[1];
    for (unsigned char v : buf[static_cast<std::size_t>(p)]) CHECK(v == root + 1);
  }
  check_clean(fake);
}

TEST_CASE("nccl fake: after an abort no NCCL call is made and every call names why", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  FakeNccl fake;
  {
    auto w = fake_world(fake, mesh);
    auto comms = members(*w, {"model"});
    auto data = members(*w, {"data"});
    const int live = fake.live_comms();
    CHECK(live == 4 + 4 + 4);  // world + two splits
    w->abort("operator pressed stop");
    CHECK(w->aborted());
    CHECK(w->abort_reason() == "operator pressed stop");
    CHECK(fake.live_comms() == 0);  // every communicator aborted, each once (a second is a violation)
    const std::size_t calls = fake.calls().size();
    HostStream s;
    float x[4] = {};
    for (auto* set : {&comms, &data})
      for (auto& c : *set) {
        CHECK_THAT(error_of([&] { c->all_reduce(x, x, 4, DType::f32, ReduceOp::Sum, s); }),
                   Catch::Contains("operator pressed stop"));
        CHECK_THAT(error_of([&] { c->all_to_all(x, x + 2, 4, s); }), Catch::Contains("operator pressed stop"));
        CHECK_THAT(error_of([&] { c->barrier(s); }), Catch::Contains("operator pressed stop"));
      }
    CHECK_THAT(error_of([&] { (void)w->communicator(0, {"data", "model"}); }), Catch::Contains("operator pressed stop"));
    w->abort("a second reason");  // the first reason wins, nothing is aborted twice
    CHECK(w->abort_reason() == "operator pressed stop");
    CHECK(fake.calls().size() == calls);
  }  // the world's destructor aborts nothing again
  check_clean(fake, /*at_rest=*/false);
}

TEST_CASE("nccl fake: an abort while members wait inside a collective releases them", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("model=4");
  FakeSetup f(mesh, {"model"}, /*wait_seconds=*/30);
  auto& fake = f.fake;
  auto& w = f.world;
  auto& comms = f.comms;
  std::atomic<int> waiting{0};
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  // Three of four members enter an all-reduce; the fourth never comes.
  for (int p = 0; p < 3; ++p)
    ts.emplace_back([&, p] {
      HostStream s;
      float x[2] = {1, 2};
      ++waiting;
      errors[static_cast<std::size_t>(p)] =
          error_of([&] { comms[static_cast<std::size_t>(p)]->all_reduce(x, x, 2, DType::f32, ReduceOp::Sum, s); });
    });
  while (waiting < 3) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  w->abort("member 3 is gone");  // waits up to 2 s for the calls, then aborts: ncclCommAbort releases them
  for (auto& t : ts) t.join();
  for (const std::string& e : errors) CHECK_THAT(e, Catch::Contains("member 3 is gone") || Catch::Contains("remote error"));
  CHECK(fake.live_comms() == 0);
  check_clean(fake, /*at_rest=*/false);
}

TEST_CASE("nccl fake: the watchdog aborts the world on NCCL's asynchronous error", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  FakeSetup f(mesh, {"model"});
  auto& fake = f.fake;
  auto& w = f.world;
  auto& comms = f.comms;
  fake.set_async_error(member(comms[2]).comm(), tessel::cuda::kNcclRemoteError);
  for (int i = 0; i < 100 && !w->aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(w->aborted());
  CHECK_THAT(w->abort_reason(), Catch::Contains("NCCL reported an asynchronous error") &&
                                    Catch::Contains("remote error"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // more watchdog rounds: no poll of an aborted comm
  CHECK(fake.live_comms() == 0);
  check_clean(fake);
}

TEST_CASE("nccl fake: a failed call inside a group closes the group and aborts the world", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=3");
  FakeSetup f(mesh, {"data"});
  auto& fake = f.fake;
  auto& w = f.world;
  auto& comms = f.comms;
  HostStream s;
  std::vector<unsigned char> send(24), recv(24);
  fake.fail_next("ncclRecv", 3);  // the first receive of the all-to-all's group fails
  const std::string msg = error_of([&] { comms[1]->all_to_all(send.data(), recv.data(), 8, s); });
  CHECK_THAT(msg, Catch::Contains("nccl all_to_all on device 1 (rank 1 of 3") && Catch::Contains("injected"));
  CHECK(w->aborted());
  CHECK(w->abort_reason() == msg);
  for (const std::string& v : fake.check_quiescent()) CHECK_THAT(v, !Catch::Contains("left a group open"));
  // The same through the communicator's own group: group_end still balances the start.
  FakeSetup f2(mesh, {"data"});
  auto& fake2 = f2.fake;
  auto& comms2 = f2.comms;
  fake2.fail_next("ncclSend", 3);
  comms2[0]->group_start();
  CHECK_THAT(error_of([&] { comms2[0]->collective_permute(send.data(), 1, recv.data(), 2, 8, s); }),
             Catch::Contains("collective_permute"));
  CHECK_NOTHROW(comms2[0]->group_end());
  for (const std::string& v : fake2.check_quiescent()) CHECK_THAT(v, !Catch::Contains("left a group open"));
  check_clean(fake, /*at_rest=*/false);
  check_clean(fake2, /*at_rest=*/false);
}

TEST_CASE("nccl fake: processes join one world by rank and split with the same colours", "[unit][nccl]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  FakeNccl fake;
  std::string id(tessel::cuda::kNcclUniqueIdBytes, '\0');
  REQUIRE(fake.get_unique_id(id.data()) == 0);
  // Two "processes" (threads), each driving two positions on its GPUs 0 and 1.
  std::unique_ptr<NcclWorldBase> worlds[2];
  std::vector<std::unique_ptr<Communicator>> comms(4);
  on_threads(2, [&](int64_t proc) {
    const std::vector<int64_t> positions = {2 * proc, 2 * proc + 1};
    worlds[proc] = std::make_unique<NcclWorldBase>(fake, mesh, positions, std::vector<int>{0, 1}, id, CudaWorldOptions{});
    // data groups {0,2} and {1,3} span both processes: the split is collective over them.
    for (int64_t p : positions) comms[static_cast<std::size_t>(p)] = worlds[proc]->communicator(p, {"data"});
  });
  for (const auto& c : comms) REQUIRE(c);
  for (int64_t p = 0; p < 4; ++p) {
    NcclCommunicatorBase& m = member(comms[static_cast<std::size_t>(p)]);
    CHECK(m.rank() == mesh.index_in_group(p, {"data"}));
    CHECK(fake.rank_of(m.comm()) == m.rank());
    CHECK(fake.world_rank_of(m.comm()) == p);
  }
  std::vector<float> x(4);
  on_threads(4, [&](int64_t p) {
    HostStream s;
    x[static_cast<std::size_t>(p)] = static_cast<float>(p + 1);
    comms[static_cast<std::size_t>(p)]->all_reduce(&x[static_cast<std::size_t>(p)], &x[static_cast<std::size_t>(p)], 1,
                                                   DType::f32, ReduceOp::Sum, s);
  });
  CHECK(x == std::vector<float>{4, 6, 4, 6});
  comms.clear();
  worlds[0].reset();
  worlds[1].reset();
  CHECK(fake.live_comms() == 0);
  check_clean(fake);
}

namespace {

// A world whose members abort it once every member of a group has finished its all-reduce: the
// run's only collective completes everywhere and no device sees an error, as when the watchdog
// fires after the last collective was enqueued (issue 22, finding 9).
class AbortAfterAllReduceWorld : public NcclWorldBase {
 public:
  using NcclWorldBase::NcclWorldBase;
  std::atomic<int> finished{0};

 protected:
  std::unique_ptr<NcclCommunicatorBase> make_member(tessel::cuda::NcclComm comm, int device, int rank, int size,
                                                    std::string group) override;
};

class AbortAfterAllReduce : public NcclCommunicatorBase {
 public:
  AbortAfterAllReduce(AbortAfterAllReduceWorld& w, tessel::cuda::NcclComm comm, int device, int rank, int size,
                      std::string group)
      : NcclCommunicatorBase(w, comm, device, rank, size, std::move(group)), w_(w) {}
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, Stream& s) override {
    NcclCommunicatorBase::all_reduce(send, recv, count, t, op, s);  // eager: done on return
    if (++w_.finished == size()) w_.abort("injected: the watchdog fired after the last collective");
  }

 private:
  AbortAfterAllReduceWorld& w_;
};

std::unique_ptr<NcclCommunicatorBase> AbortAfterAllReduceWorld::make_member(tessel::cuda::NcclComm comm, int device,
                                                                            int rank, int size, std::string group) {
  return std::make_unique<AbortAfterAllReduce>(*this, comm, device, rank, size, std::move(group));
}

// CPU threads with eager streams (each collective runs on its device thread when issued, the
// fake's blocking semantics) whose collective world is the NCCL world over the fake: the
// executor's calls go through the code the GPU runs.
class FakeNcclRuntime : public ThreadRuntime {
 public:
  FakeNcclRuntime(int64_t n, FakeNccl& fake, bool abort_after_all_reduce = false)
      : ThreadRuntime(n, tessel_test::stream_options<ThreadRuntimeOptions>(StreamMode::Eager)), fake_(fake),
        abort_after_all_reduce_(abort_after_all_reduce) {}
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>&,
                                              double timeout_s) override {
    CudaWorldOptions o;
    o.timeout_seconds = timeout_s;
    if (abort_after_all_reduce_) return fake_world<AbortAfterAllReduceWorld>(fake_, mesh, o);
    return fake_world(fake_, mesh, o);
  }

 private:
  FakeNccl& fake_;
  bool abort_after_all_reduce_;
};

}  // namespace

TEST_CASE("nccl fake: an NCCL world aborted after the last collective fails the run and names why",
          "[unit][nccl]") {
  const Graph g = tessel_test::one_all_reduce_graph();
  const Executable exe = compile(g, Mesh::parse("data=2"));
  FakeNccl fake;
  FakeNcclRuntime rt(2, fake, /*abort_after_all_reduce=*/true);
  LoadedExecutable le = load(exe, rt);
  const auto inputs = random_inputs(g, 3);
  const std::vector<ShardedArray> in = {le.to_device("x", inputs[0]), le.to_device("w", inputs[1])};
  const std::string msg = error_of([&] { (void)le.run(in); });
  CHECK_THAT(msg, Catch::Contains("aborted during the run"));
  CHECK_THAT(msg, Catch::Contains("injected: the watchdog fired after the last collective"));
  int all_reduces = 0;
  for (const FakeNccl::Call& c : fake.calls()) all_reduces += c.op == "ncclAllReduce";
  CHECK(all_reduces == 2);  // it did run, on both members
  check_clean(fake, /*at_rest=*/false);
}

TEST_CASE("nccl fake: programs run through the NCCL world equal the reference", "[unit][nccl]") {
  FakeNccl fake;
  {
    FakeNcclRuntime rt(4, fake);
    tessel_test::check_sequence_parallel_rings(rt, 5);  // rings of permutes, uni- and bidirectional
  }
  {
    // Partial sums reduce-scattered (rs) and all-reduced (ar), an all-gather (g replicated)
    // and an all-to-all (rows on model to columns on model).
    Graph g = parse_graph(R"(
mesh data=2, model=2
%a = input f32[8,6] sharding=[{}, {model}]
%b = input f32[6,8] sharding=[{model}, {}]
%rs = einsum(%a, %b) eq="td,df->tf" sharding=[{model}, {}]
%ar = einsum(%a, %b) eq="td,df->tf" sharding=[{}, {}]
%x = input f32[8,6] sharding=[{data}, {}]
%g = gelu(%x) sharding=[{}, {}]
%t = relu(%rs) sharding=[{}, {model}]
output %t
output %ar
output %g
)", "collectives.tsl");
    Executable exe = compile(g, *g.mesh);
    INFO(exe.program().to_string(0));
    const auto inputs = random_inputs(g, 11);
    const auto want = run_reference(g, inputs);
    FakeNcclRuntime rt(4, fake);
    LoadedExecutable prog = load(exe, rt);
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < inputs.size(); ++i) args.push_back(prog.to_device(i, inputs[i]));
    RunOptions ro;
    ro.poison = true;
    RunResult r = prog.run(args, ro);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const CompareResult cmp = compare(prog.to_host(r.outputs[i], /*check_replicas=*/true), want[i]);
      INFO("output " << i << ": " << cmp.to_string());
      CHECK(cmp.max_rel_err <= 1e-5);
    }
  }
  std::map<std::string, int> ops;
  for (const FakeNccl::Call& c : fake.calls()) ++ops[c.op];
  for (const char* op : {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclSend", "ncclRecv"}) {
    INFO(op);
    CHECK(ops[op] > 0);
  }
  check_clean(fake);
}
