// GPU tests of CudaRuntime (label gpu; skipped without a GPU, see gpu_main.cpp):
//  * every op kind of the registry has a CUDA kernel (Backend::has_kernel says so, and load()
//    keeps fusion on);
//  * load(exe, CudaRuntime): device-resident arrays over several steps == reference, fused
//    (fused_elementwise and fused_softmax kernels), donation, a second run, cancel between runs;
//  * placement errors (a GPU that does not exist) name the GPU;
//  * collective-matmul rings (uni and bi) on 4 virtual devices == reference;
//  * a loaded GPT forward is bit-identical over repeated runs;
//  * the Trainer on CUDA: steps == one device, a NaN batch skipped in place, memory measured;
//  * the fused JIT kernels == the interpreter bit for bit on the GPT forward.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "../unit/mlp_model.hpp"
#include "../unit/test_util.hpp"
#include "gpu_test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/trainer.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/tessel.hpp"
#include "fused_jit.hpp"

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

// The Trainer on CUDA virtual devices (data=2,model=2, ZeRO-2): each step's loss equals the
// one-device reference from the same state; a batch with a NaN is skipped through adamw's
// `apply` input (parameters and moments keep their bits on the GPU); the backends' allocators
// measure a peak (RunStats::measured_peak_bytes) beside the memory plan's.
TEST_CASE("a Trainer on CUDA virtual devices: steps == one device and a NaN batch skipped and memory measured",
          "[gpu][train]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: a Trainer on CUDA virtual devices", seed, 4);
  tessel_test::Mlp m = tessel_test::build_mlp(16);
  TrainerOptions o;
  o.train.zero = 2;
  o.lr = LrSchedule::constant(1e-2);
  o.non_finite = NonFinite::Skip;
  CudaRuntime rt(4);
  Trainer tr(m.g, m.loss, m.params, Mesh::parse("data=2,model=2"), rt, o);
  tr.init(tessel_test::init_params(m, seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  HostTensor xs(DType::f32, {16, 16}), ys(DType::f32, {16, 16});
  for (int step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, normal(rng)), ys.set(i, std::sin(3 * xs.get(i)));
    const StepRecord want = tr.reference_step({{xs, ys}});
    const StepRecord got = tr.step({xs, ys});
    INFO("seed " << seed << " step " << step << ": loss " << got.loss << " reference " << want.loss
                 << "; measured peak " << got.measured_peak_bytes << " B, planned " << got.planned_peak_bytes << " B");
    CHECK_FALSE(got.skipped);
    CHECK(std::fabs(got.loss - want.loss) <= 1e-5 * std::fabs(want.loss));
    CHECK(std::fabs(got.grad_norm - want.grad_norm) <= 1e-5 * std::fabs(want.grad_norm));
    CHECK(got.measured_peak_bytes > 0);
    CHECK(got.planned_peak_bytes > 0);
  }
  std::printf("measured peak %lld B per device, planned %lld B\n",
              static_cast<long long>(tr.history().back().measured_peak_bytes),
              static_cast<long long>(tr.history().back().planned_peak_bytes));
  // A NaN in the batch: the update is skipped on the GPU, every parameter and moment unchanged.
  const TrainState before = tr.state();
  xs.set(5, std::nan(""));
  const StepRecord skipped = tr.step({xs, ys});
  CHECK(skipped.skipped);
  CHECK(tr.steps_done() == 3);
  const TrainState after = tr.state();
  REQUIRE(after.values.size() == before.values.size());
  for (const auto& [name, t] : before.values) {
    const HostTensor& a = after.values.at(name);
    INFO("value " << name);
    REQUIRE(a.bytes() == t.bytes());
    CHECK(std::memcmp(a.data(), t.data(), t.bytes()) == 0);
  }
}

// The fused-expression JIT (src/runtime/cuda/fused_jit.hpp) against the interpreter kernel on
// the GPT forward (fused_elementwise and fused_softmax, f32 and bf16): the same bits, and the
// JIT kernels did run (compiled, launched, none fell back).
TEST_CASE("fused JIT kernels == the interpreter bit for bit on the GPT forward", "[gpu][jit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: fused JIT == interpreter", seed, 2);
  for (DType dt : {DType::f32, DType::bf16}) {
    GptConfig cfg;
    cfg.batch = 4, cfg.seq = 16, cfg.d_model = 32, cfg.heads = 4, cfg.layers = 2, cfg.vocab = 64;
    cfg.dtype = dt;
    cfg.compute = dt;
    GptGraph m = build_gpt(cfg);
    const Mesh mesh = Mesh::parse("data=2,model=2");
    Executable exe = compile(m.graph, mesh);
    const auto in = random_inputs(m.graph, seed);
    std::vector<HostTensor> got;
    for (bool jit : {true, false}) {
      CudaRuntimeOptions o;
      o.backend.fused_jit = jit;
      CudaRuntime rt(mesh.num_devices(), o);
      LoadOptions lo;
      lo.lowering.fuse_elementwise = true;
      LoadedExecutable le = load(exe, rt, lo);
      const auto before = cuda::FusedJit::shared(0).stats();
      std::vector<ShardedArray> args;
      for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
      RunOptions ro;
      ro.poison = true;
      got.push_back(le.to_host(le.run(args, ro).outputs[0], /*check_replicas=*/true));
      const auto after = cuda::FusedJit::shared(0).stats();
      INFO("dtype " << dtype_name(dt) << " jit " << jit << ": launches " << after.launches - before.launches
                    << ", compiled " << after.compiled << ", failed " << after.failed << ", compile "
                    << after.compile_seconds << " s");
      if (jit) CHECK(after.launches > before.launches);
      else CHECK(after.launches == before.launches);
      CHECK(after.failed == 0);
    }
    INFO("dtype " << dtype_name(dt) << ": loss " << got[0].get(0) << " (JIT) and " << got[1].get(0) << " (interpreter)");
    REQUIRE(got[0].bytes() == got[1].bytes());
    CHECK(std::memcmp(got[0].data(), got[1].data(), got[0].bytes()) == 0);
  }
  const auto s = cuda::FusedJit::shared(0).stats();
  std::printf("fused JIT: %lld programs compiled in %.2f s, %lld launches\n", static_cast<long long>(s.compiled),
              s.compile_seconds, static_cast<long long>(s.launches));
}

TEST_CASE("a pipeline of two CudaRuntime stages (pipeline_trainer and 1F1B): every step equals one device's reference step",
          "[gpu][pipeline]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: a pipeline of two CudaRuntime stages", seed, 1);
  const int64_t M = 4;
  GptConfig c;
  c.batch = 2;  // one micro-batch's rows
  c.seq = 16;
  c.d_model = 32;
  c.heads = 2;
  c.layers = 4;
  c.vocab = 64;
  GptGraph m = build_gpt(c);
  std::vector<HostTensor> host = random_inputs(m.graph, seed);
  gpt_init(m.graph, host);
  std::map<std::string, HostTensor> init;
  for (const Tensor& w : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == w.id) init[w.name()] = host[i];
  CudaRuntime r0(2), r1(2);  // each stage data=2, both on this GPU
  PipelineOptions po;
  po.micro = M;
  TrainerOptions o;
  o.lr = LrSchedule::constant(1e-2);
  o.train.zero = 1;
  Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights, equal_layer_cuts(m.checkpoints, c.layers, 2),
                                Mesh::parse("pipe=2,data=2,model=1"), {&r0, &r1}, o, po);
  tr.init(init);
  std::mt19937_64 rng(seed);
  for (int step = 1; step <= 3; ++step) {
    std::vector<std::vector<HostTensor>> micro;
    for (int64_t k = 0; k < M; ++k) {
      HostTensor tok(DType::i32, {c.batch, c.seq}), lab(DType::i32, {c.batch, c.seq});
      for (int64_t i = 0; i < tok.numel(); ++i) {
        tok.set(i, static_cast<double>(rng() % static_cast<uint64_t>(c.vocab)));
        lab.set(i, static_cast<double>(rng() % static_cast<uint64_t>(c.vocab)));
      }
      micro.push_back({tok, lab});
    }
    const StepRecord want = tr.reference_step(micro);
    const StepRecord got = tr.step(micro);
    INFO("seed " << seed << " step " << step << ": loss " << got.loss << " reference " << want.loss << ", bubble "
                 << got.bubble);
    CHECK_FALSE(got.skipped);
    CHECK(std::fabs(got.loss - want.loss) <= 1e-5 * std::fabs(want.loss));
    CHECK(std::fabs(got.grad_norm - want.grad_norm) <= 1e-5 * std::fabs(want.grad_norm));
    REQUIRE(got.peak_in_flight.size() == 2);
    CHECK(got.peak_in_flight[0] == 2);  // 1F1B: P - s on stage s
    CHECK(got.peak_in_flight[1] == 1);
  }
}
