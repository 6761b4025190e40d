// GPU tests of CudaRuntime (label gpu; skipped without a GPU, see gpu_main.cpp):
//  * every op kind of the registry has a CUDA kernel (Backend::has_kernel says so, and load()
//    keeps fusion on);
//  * load(exe, CudaRuntime): device-resident arrays over several steps == reference, fused
//    (fused_elementwise and fused_softmax kernels), donation, a second run, cancel between runs;
//  * placement errors (a GPU that does not exist) name the GPU;
//  * collective-matmul rings (uni and bi) on 4 virtual devices == reference.
#include <catch2/catch.hpp>

#include <cmath>

#include "../unit/test_util.hpp"
#include "gpu_test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

TEST_CASE("every op kind of the registry has a CUDA kernel", "[gpu][registry]") {
  std::vector<std::string> missing;
  for (OpKind k : all_op_kinds())
    if (k != OpKind::Input && !cuda_has_kernel(k)) missing.push_back(op_name(k));
  INFO("op kinds without a CUDA kernel: " << join(missing, ", ")
                                          << " (add one in kernels/ and src/runtime/cuda/cuda_kernels.cpp)");
  CHECK(missing.empty());
  // So load() keeps the fuse-elementwise pass on CUDA (Backend::has_kernel).
  CudaRuntime rt(1);
  ProgramPassOptions want_fusion;
  want_fusion.fuse_elementwise = true;
  CHECK(lowering_for(rt, want_fusion).fuse_elementwise);
  for (OpKind k : all_op_kinds()) CHECK(rt.local().backend(0).has_kernel(k) == (k != OpKind::Input));
}

TEST_CASE("load on a CudaRuntime: device-resident steps and donation and cancel", "[gpu][runtime]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: load on a CudaRuntime", seed, 1);
  GptGraph m = tessel_gpu_test::tiny_gpt(2);
  const Mesh mesh = Mesh::parse("data=2,model=4");
  Executable exe = compile(m.graph, mesh);
  const auto in = random_inputs(m.graph, seed);
  const auto want = run_reference(m.graph, in);
  CudaRuntime rt(mesh.num_devices());
  CHECK(rt.name() == "cuda");
  for (int64_t d = 0; d < rt.num_devices(); ++d) CHECK(rt.local().backend(d).name() == "cuda");
  LoadOptions lo;
  lo.lowering.fuse_elementwise = true;  // fused_elementwise and fused_softmax on the GPU
  LoadedExecutable le = load(exe, rt, lo);
  // load made the cuBLASLt plans of the program's products; the runs below make none.
  std::vector<int64_t> plans;
  for (int64_t d = 0; d < rt.num_devices(); ++d) plans.push_back(rt.gemm_plans(d));
  CHECK(plans[0] > 0);
  int fused = 0;
  for (const Instr& i : le.program().instrs)
    fused += i.kind == InstrKind::Kernel && (i.op == OpKind::FusedElementwise || i.op == OpKind::FusedSoftmax);
  CHECK(fused > 0);
  std::vector<ShardedArray> args;
  for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
  for (int step = 0; step < 3; ++step) {
    RunOptions ro;
    ro.poison = true;
    RunResult r = le.run(args, ro);
    const CompareResult c = compare(le.to_host(r.outputs[0], /*check_replicas=*/true), want[0]);
    INFO("step " << step << ": " << c.to_string());
    CHECK(c.max_rel_err <= 1e-5);
  }
  for (int64_t d = 0; d < rt.num_devices(); ++d) CHECK(rt.gemm_plans(d) == plans[static_cast<std::size_t>(d)]);
  CHECK_THROWS_AS(rt.gemm_plans(rt.num_devices()), RuntimeError);
  CHECK_FALSE(le.cancel("nothing in flight"));
  RunResult again = le.run(args);
  CHECK(compare(le.to_host(again.outputs[0]), want[0]).max_rel_err <= 1e-5);

  // Donation: y = x + x in place, three times.
  Graph g = parse_graph(R"(
mesh x=2
%x = input f32[8,4] sharding=[{x}, {}]
%y = add(%x, %x)
output %y
)", "donate.tsl");
  Executable dexe = compile(g, *g.mesh);
  CudaRuntime rt2(2);
  LoadOptions dlo;
  dlo.donate = {{"x", "y"}};
  LoadedExecutable dl = load(dexe, rt2, dlo);
  const auto x0 = random_inputs(g, seed);
  ShardedArray x = dl.to_device("x", x0[0]);
  for (int i = 0; i < 3; ++i) x = std::move(dl.run({x}).outputs[0]);
  const HostTensor got = dl.to_host(x);
  for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.get(i) == x0[0].get(i) * 8);
}

TEST_CASE("CudaRuntime placement errors name the GPU", "[gpu][runtime][errors]") {
  CudaRuntimeOptions o;
  o.backend.device = cuda_device_count();
  CHECK_THROWS_WITH(CudaRuntime(1, o), Catch::Contains("would run on GPU") && Catch::Contains("visible"));
  CHECK_THROWS_WITH(CudaRuntime(0), Catch::Contains("num_devices must be >= 1"));
}

TEST_CASE("collective-matmul rings on CUDA virtual devices == reference", "[gpu][collective_matmul]") {
  // The rings' permutes run on the comm streams of 4 virtual devices and the partial einsums
  // on compute, ordered by the program's events.
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: collective-matmul rings on CUDA virtual devices", seed, 2);
  CudaRuntime rt(4);
  tessel_test::check_sequence_parallel_rings(rt, seed);
}

// Races between streams or virtual devices show as runs that differ: every reduction of the
// CUDA backend is in a fixed order, so the same loaded program on the same inputs must give the
// same bits every time. Outputs are poisoned before each run. TESSEL_CASES sets the run count.
TEST_CASE("a loaded GPT forward is bit-identical over repeated runs", "[gpu][stress]") {
  const uint64_t seed = tessel_test::seed();
  const int runs = tessel_test::cases(40);
  tessel_test::announce("gpu: a loaded GPT forward is bit-identical over repeated runs", seed, runs);
  GptGraph m = tessel_gpu_test::tiny_gpt(2);
  const Mesh mesh = Mesh::parse("data=2,model=4");
  Executable exe = compile(m.graph, mesh);
  const auto in = random_inputs(m.graph, seed);
  const auto want = run_reference(m.graph, in);
  CudaRuntime rt(mesh.num_devices());
  LoadOptions lo;
  lo.lowering.fuse_elementwise = true;
  LoadedExecutable le = load(exe, rt, lo);
  std::vector<ShardedArray> args;
  for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
  HostTensor first;
  int differing = 0;
  for (int r = 0; r < runs; ++r) {
    RunOptions ro;
    ro.poison = true;
    const HostTensor got = le.to_host(le.run(args, ro).outputs[0], /*check_replicas=*/true);
    if (r == 0) {
      first = got;
      const CompareResult c = compare(got, want[0]);
      INFO("run 0 against the CPU reference: " << c.to_string());
      REQUIRE(c.max_rel_err <= 1e-5);
      continue;
    }
    bool same = got.bytes() == first.bytes();
    for (int64_t i = 0; same && i < got.numel(); ++i) same = got.get(i) == first.get(i) || (std::isnan(got.get(i)) && std::isnan(first.get(i)));
    if (!same) {
      ++differing;
      UNSCOPED_INFO("run " << r << " differs from run 0: " << compare(got, first).to_string());
    }
  }
  CHECK(differing == 0);
}
