// The runtime's backend hook (ThreadRuntimeOptions::make_backend), the kernel check of load()
// (Backend::has_kernel: lowering without fusion for a backend with no fused kernels, a clear
// error for any other missing kernel), and the file rendezvous of process_group.hpp. A CPU
// backend behind a wrapper that hides some kernels stands in for a GPU backend that lacks them.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../unit/test_util.hpp"
#include "hiding_backend.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;
using tessel_test::HidingBackend;

namespace {

GptGraph small_gpt() {
  GptConfig cfg;
  cfg.batch = 4, cfg.seq = 8, cfg.d_model = 16, cfg.heads = 2, cfg.layers = 1, cfg.vocab = 32;
  return build_gpt(cfg);
}

int count_kind(const Program& p, OpKind k) {
  int n = 0;
  for (const Instr& in : p.instrs) n += in.kind == InstrKind::Kernel && in.op == k;
  return n;
}

}  // namespace

TEST_CASE("a runtime with backends of its own (make_backend) runs unfused when they lack fused kernels",
          "[runtime][backend-hook]") {
  GptGraph m = small_gpt();
  const Mesh mesh = Mesh::parse("data=2,model=2");
  Executable exe = compile(m.graph, mesh);
  const auto in = random_inputs(m.graph, 3);
  const auto want = run_reference(m.graph, in);
  LoadOptions lo;
  lo.lowering.fuse_elementwise = true;

  // The plain CPU runtime fuses this program (else the check below would prove nothing).
  {
    ThreadRuntime cpu(mesh.num_devices());
    LoadedExecutable le = load(exe, cpu, lo);
    REQUIRE(count_kind(le.program(), OpKind::FusedElementwise) + count_kind(le.program(), OpKind::FusedSoftmax) > 0);
  }

  std::vector<HidingBackend*> made;
  ThreadRuntimeOptions o;
  o.make_backend = [&](int64_t) {
    auto b = std::make_unique<HidingBackend>(std::set<OpKind>{OpKind::FusedElementwise, OpKind::FusedSoftmax});
    made.push_back(b.get());
    return b;
  };
  ThreadRuntime rt(mesh.num_devices(), o);
  REQUIRE(made.size() == 4);
  CHECK(rt.backend(2).name() == "cpu-hiding");
  CHECK_FALSE(rt.options().inline_serial_programs);
  LoadedExecutable le = load(exe, rt, lo);
  CHECK(count_kind(le.program(), OpKind::FusedElementwise) == 0);
  CHECK(count_kind(le.program(), OpKind::FusedSoftmax) == 0);
  CHECK_FALSE(lowering_for(rt, lo.lowering).fuse_elementwise);
  for (int step = 0; step < 2; ++step) {
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
    RunOptions ro;
    ro.poison = true;
    RunResult r = tessel_test::guarded("run on the hook's backends", [&] { return le.run(args, ro); });
    const CompareResult c = compare(le.to_host(r.outputs[0], true), want[0]);
    INFO(c.to_string());
    CHECK(c.max_rel_err <= 1e-5);
  }
  for (HidingBackend* b : made) CHECK(b->kernels_run.load() > 0);  // the hook's backends ran the kernels
}

TEST_CASE("load names the op and instruction and device and backend when a kernel is missing", "[runtime][backend-hook]") {
  GptGraph m = small_gpt();
  Executable exe = compile(m.graph, Mesh::parse("data=1,model=2"));
  ThreadRuntimeOptions o;
  o.make_backend = [](int64_t) { return std::make_unique<HidingBackend>(std::set<OpKind>{OpKind::Attention}); };
  ThreadRuntime rt(2, o);
  LoadOptions lo;
  lo.lowering.fuse_elementwise = false;
  CHECK_THROWS_WITH(load(exe, rt, lo), Catch::Contains("%l0_ctx = attention") && Catch::Contains("local device 0") &&
                                           Catch::Contains("no kernel on backend 'cpu-hiding'"));
}

TEST_CASE("make_backend returning nothing is an error naming the device", "[runtime][backend-hook]") {
  ThreadRuntimeOptions o;
  o.make_backend = [](int64_t d) -> std::unique_ptr<Backend> {
    if (d == 1) return nullptr;
    return make_cpu_backend();
  };
  CHECK_THROWS_WITH(ThreadRuntime(3, o), Catch::Contains("no backend for device 1 of 3"));
}

TEST_CASE("CUDA runtime without a GPU or without CUDA is a clear error and not a crash", "[runtime][cuda]") {
  if (cuda_device_count() > 0) return;  // a GPU machine runs the gpu suite instead
  CHECK_THROWS_AS(CudaRuntime(2), RuntimeError);
  CHECK_THROWS_WITH(CudaRuntime(2), Catch::Contains("no CUDA GPU is visible") || Catch::Contains("without CUDA"));
  Graph g;
  g.mark_output(g.add_input("x", DType::f32, {4}));
  Executable exe = compile(g, Mesh::parse("x=1"));
  CHECK_THROWS_AS(run_on_cuda(exe, random_inputs(g, 1)), RuntimeError);
  // Before any launcher bootstrap (which could wait for other processes).
  CHECK_THROWS_WITH(make_cuda_runtime(Mesh::parse("x=2")),
                    Catch::Contains("make_cuda_runtime") &&
                        (Catch::Contains("no CUDA GPU is visible") || Catch::Contains("without CUDA")));
}

TEST_CASE("lowering_for: the collective-matmul gate knows CPU device threads share the cores", "[backend]") {
  const int64_t hw = static_cast<int64_t>(std::thread::hardware_concurrency());
  for (int64_t devices : {1, 2, 8}) {
    ThreadRuntime rt(devices);
    const ProgramPassOptions got = lowering_for(rt, ProgramPassOptions{});
    INFO(devices << " devices, " << hw << " hardware threads");
    CHECK(got.collective_matmul.cost.compute_sharing == compute_sharing(devices, hw));
    if (hw > 0 && devices > hw) CHECK(got.collective_matmul.cost.compute_sharing > 1);
    ProgramPassOptions mine;
    mine.collective_matmul.cost.compute_sharing = 3;  // the caller's figure is kept
    CHECK(lowering_for(rt, mine).collective_matmul.cost.compute_sharing == 3);
  }
}

TEST_CASE("file rendezvous: every rank gets every rank's bytes round after round", "[process-group]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("tessel-rdv-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  const int n = 3;
  std::vector<std::vector<std::vector<std::string>>> got(n);
  std::vector<std::string> errors(n);
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          FileRendezvousOptions o;
          o.rank = r, o.size = n, o.local_rank = r, o.dir = dir.string(), o.timeout_s = 60;
          auto pg = file_process_group(o);
          for (int round = 0; round < 4; ++round)
            got[r].push_back(pg->allgather(std::string(static_cast<std::size_t>(r + round), char('a' + r))));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ts) t.join();
  }
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
    for (int round = 0; round < 4; ++round)
      for (int from = 0; from < n; ++from)
        CHECK(got[r][round][from] == std::string(static_cast<std::size_t>(from + round), char('a' + from)));
  }
  fs::remove_all(dir);
}

TEST_CASE("file rendezvous: abort notices reach the other ranks once", "[process-group]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("tessel-abort-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::vector<std::shared_ptr<ProcessGroup>> pg;
  for (int r = 0; r < 3; ++r) {
    FileRendezvousOptions o;
    o.rank = r, o.size = 3, o.dir = dir.string(), o.key = "job";
    pg.push_back(file_process_group(o));
  }
  for (auto& g : pg) CHECK_FALSE(g->poll_abort());  // nothing posted (no directory yet)
  pg[1]->post_abort("rank 1: NCCL error: unhandled system error");
  CHECK_FALSE(pg[1]->poll_abort());  // never its own
  for (int r : {0, 2}) {
    const auto n = pg[static_cast<std::size_t>(r)]->poll_abort();
    REQUIRE(n);
    CHECK(n->rank == 1);
    CHECK(n->reason == "rank 1: NCCL error: unhandled system error");
    CHECK_FALSE(pg[static_cast<std::size_t>(r)]->poll_abort());  // once
  }
  // A second notice (a later world's abort) is a new one.
  pg[2]->post_abort("timed out");
  const auto n0 = pg[0]->poll_abort();
  REQUIRE(n0);
  CHECK(n0->rank == 2);
  CHECK(n0->reason == "timed out");
  // Another job's key does not see them.
  FileRendezvousOptions other;
  other.rank = 0, other.size = 3, other.dir = dir.string(), other.key = "another-job";
  CHECK_FALSE(file_process_group(other)->poll_abort());
  fs::remove_all(dir);
}

TEST_CASE("file rendezvous: a missing peer times out naming it", "[process-group]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("tessel-rdv-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  FileRendezvousOptions o;
  o.rank = 0, o.size = 2, o.dir = dir.string(), o.timeout_s = 0.2;
  auto pg = file_process_group(o);
  CHECK_THROWS_WITH(pg->allgather("x"), Catch::Contains("for ranks 1 of 2"));
  o.rank = 2;
  CHECK_THROWS_WITH(file_process_group(o), Catch::Contains("not a valid process"));
  fs::remove_all(dir);
}
