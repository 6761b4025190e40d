// GPU tests of the CUDA backend (label gpu; skipped without a GPU, see gpu_main.cpp):
//  * every op kind of the registry, partitioned over random virtual-device meshes (1–8 devices
//    on one GPU), equals the unpartitioned CPU reference (f32 within 1e-5, outputs poisoned
//    first, replicas bit-identical);
//  * every op kind's kernel in bf16 and f16 equals the CPU kernel on the same rounded inputs
//    (tolerances documented in docs/backend-cuda.md);
//  * einsum layouts (transposes folded into cuBLASLt, summed letters, batch, K = 0);
//  * every collective on the virtual-device world (and on NCCL with 2+ GPUs);
//  * the GPT forward on data=2,model=4 virtual devices matches the CPU loss;
//  * a bad index is an error naming the instruction, not a crash;
//  * long reductions (split in chunks), layer_norm_grad over many rows, scatter_add (sorted).
// Seeds: TESSEL_SEED reproduces (printed by each test), TESSEL_CASES sets the case count.
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <random>

#include "../unit/test_util.hpp"
#include "../unit/kernel_check.hpp"
#include "gpu_test_util.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

using tessel_test::check_kernels_in_dtype;
using tessel_test::is_float_type;
using tessel_test::KernelDevice;

// One CUDA backend and a stream, for kernel-level tests.
KernelDevice cuda_device(const CudaBackendOptions& o = {}) { return KernelDevice(make_cuda_backend(o)); }

}  // namespace

TEST_CASE("every op kind partitioned on CUDA virtual devices == reference", "[gpu][property]") {
  const uint64_t seed = tessel_test::seed();
  const auto kinds = tessel_test::sampled_op_kinds();
  const int cases = tessel_test::cases(4 * static_cast<int>(kinds.size()));
  tessel_test::announce("gpu: every op kind partitioned on CUDA virtual devices == reference", seed, cases);
  std::mt19937_64 rng(seed);
  std::map<OpKind, int> per_kind;
  for (int c = 0; c < cases; ++c) {
    const OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    const uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    const Mesh mesh = tessel_test::random_mesh(crng);
    Graph g = tessel_test::sample_op_graph(k, crng, mesh);
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << "\n"
                 << print_graph(g));
    Executable exe = compile(g, mesh);
    INFO(exe.program().to_string(0));
    const auto inputs = random_inputs(g, case_seed);
    CudaRunOptions ro;
    ro.poison = true;
    ro.check_replicas = true;
    const auto got = run_on_cuda(exe, inputs, ro);
    const auto want = run_reference(g, inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CompareResult cmp = compare(got[i], want[i], max_abs(inputs));
      INFO(cmp.to_string());
      REQUIRE(cmp.max_rel_err <= 1e-5);
    }
    ++per_kind[k];
  }
  if (cases >= static_cast<int>(kinds.size()))
    for (OpKind k : kinds) REQUIRE(per_kind[k] > 0);
}

TEST_CASE("every op kernel in bf16 and f16 == CPU kernel on the same inputs", "[gpu][dtypes]") {
  const uint64_t seed = tessel_test::seed();
  const auto kinds = tessel_test::sampled_op_kinds();
  tessel_test::announce("gpu: every op kernel in bf16 and f16 == CPU kernel on the same inputs", seed,
                        2 * static_cast<int>(kinds.size()));
  KernelDevice dev = cuda_device();
  // Both sides see the same rounded inputs and round each result once: the difference is
  // accumulation order and f32-vs-double statistics, a few units of the dtype's epsilon.
  tessel_test::check_every_op_in_16_bits(dev, seed, 2e-2, 4e-3);
}

TEST_CASE("einsum layouts through cuBLASLt == CPU kernel", "[gpu][einsum]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: einsum layouts through cuBLASLt == CPU kernel", seed, 28);
  // Every case twice: as it comes, and with every product's odd rows padded to 16 bytes
  // (gemm_pad_min_flops = 0: the path the GPT-2 LM head takes).
  KernelDevice plain = cuda_device();
  CudaBackendOptions po;
  po.gemm_pad_min_flops = 0;
  KernelDevice padded = cuda_device(po);
  std::mt19937_64 rng(seed);
  tessel_test::check_einsum_layouts(plain, rng, "");
  tessel_test::check_einsum_layouts(padded, rng, " (rows padded)");
}

// K = 0 (an empty summed letter) cannot be declared in a Graph (dims are >= 1), but a kernel
// can see it: the product is a sum over nothing, all zeros, in every dtype.
TEST_CASE("einsum with an empty summed dimension writes zeros", "[gpu][einsum]") {
  KernelDevice dev = cuda_device();
  tessel_test::check_empty_einsum(dev);
}

TEST_CASE("collectives on the virtual-device world", "[gpu][collectives]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: collectives on the virtual-device world", seed, 1);
  // Each collective as a one-op program: a value resharded between two layouts makes the
  // partitioner emit it; the program runs on virtual devices and must equal the input.
  const std::vector<std::pair<std::string, std::pair<Sharding, Sharding>>> reshards = {
      {"all_gather", {Sharding::parse("[{x}, {}]"), Sharding::parse("[{}, {}]")}},
      {"all_to_all", {Sharding::parse("[{x}, {}]"), Sharding::parse("[{}, {x}]")}},
      {"permute", {Sharding::parse("[{x,y}, {}]"), Sharding::parse("[{y,x}, {}]")}},
  };
  std::mt19937_64 rng(seed);
  const Mesh mesh = Mesh::parse("x=2,y=2");
  for (const auto& [name, ab] : reshards) {
    INFO(name);
    Graph g;
    Tensor x = g.add_input("x", DType::f32, {8, 8});
    g.annotate(x, ab.first);
    OpAttrs at;
    at.sharding = ab.second;
    Tensor y = g.add_op(OpKind::ShardingConstraint, {x.id}, at);
    g.mark_output(y);
    Executable exe = compile(g, mesh);
    INFO(exe.program().to_string(0));
    const auto in = random_inputs(g, rng());
    const auto got = run_on_cuda(exe, in);
    CHECK(compare(got[0], in[0]).max_rel_err == 0);
  }
  // all-reduce (sum, max) and reduce-scatter: a contraction over a sharded dim.
  for (const char* out_sharding : {"[{}, {}]", "[{x}, {}]"}) {
    for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
      Graph g;
      Tensor a = g.add_input("a", dt, {8, 16});
      g.annotate(a, Sharding::parse("[{}, {x}]"));
      OpAttrs at;
      at.dims = {1};
      Tensor s = g.add_op(OpKind::ReduceSum, {a.id}, at);
      Tensor m = g.add_op(OpKind::ReduceMax, {a.id}, at);
      OpAttrs c1;
      c1.sharding = Sharding::parse(out_sharding == std::string("[{}, {}]") ? "[{}]" : "[{x}]");
      g.mark_output(g.add_op(OpKind::ShardingConstraint, {s.id}, c1));
      g.mark_output(g.add_op(OpKind::ShardingConstraint, {m.id}, c1));
      Executable exe = compile(g, mesh);
      INFO(dtype_name(dt) << " " << out_sharding << "\n" << exe.program().to_string(0));
      const auto in = random_inputs(g, rng());
      const auto got = run_on_cuda(exe, in);
      const auto want = run_reference(g, in);
      for (std::size_t i = 0; i < got.size(); ++i)
        CHECK(compare(got[i], want[i], max_abs(in)).max_rel_err <= (dt == DType::bf16 ? 2e-2 : 1e-5));
    }
  }
}

TEST_CASE("collectives on NCCL", "[gpu][nccl]") {
  if (!nccl_available()) tessel_gpu_test::skip("tessel was built without NCCL");
  if (cuda_device_count() < 2)
    tessel_gpu_test::skip("NCCL needs 2 GPUs here (NCCL < 2.30 refuses two ranks on one GPU)");
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: collectives on NCCL", seed, 1);
  GptGraph m = tessel_gpu_test::tiny_gpt(1);
  const Mesh mesh = Mesh::parse("data=1,model=2");
  Executable exe = compile(m.graph, mesh);
  const auto in = random_inputs(m.graph, seed);
  CudaRunOptions ro;
  ro.use_nccl = true;
  ro.num_gpus = 2;
  const auto got = run_on_cuda(exe, in, ro);
  const auto want = run_reference(m.graph, in);
  CHECK(compare(got[0], want[0]).max_rel_err <= 1e-5);
}

TEST_CASE("GPT forward on data=2 model=4 virtual devices matches the CPU loss", "[gpu][models]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: GPT forward on data=2 model=4 virtual devices matches the CPU loss", seed, 1);
  GptGraph m = tessel_gpu_test::tiny_gpt(2);
  const auto in = random_inputs(m.graph, seed);
  const auto want = run_reference(m.graph, in);
  for (const char* spec : {"data=1,model=1", "data=2,model=4"}) {
    INFO(spec);
    Executable exe = compile(m.graph, Mesh::parse(spec));
    const auto got = run_on_cuda(exe, in);
    CompareResult c = compare(got[0], want[0]);
    INFO(c.to_string());
    CHECK(c.max_rel_err <= 1e-5);
  }
}

TEST_CASE("an index out of range is an error naming the op", "[gpu][errors]") {
  Graph g;
  Tensor table = g.add_input("table", DType::f32, {8, 4});
  Tensor ids = g.add_input("ids", DType::i32, {6});
  g.mark_output(g.add_op(OpKind::Embedding, {table.id, ids.id}, OpAttrs{}));
  Executable exe = compile(g, Mesh::parse("x=2"));
  auto in = random_inputs(g, 1);
  in[1].as<int32_t>()[3] = 8;
  CHECK_THROWS_WITH(run_on_cuda(exe, in), Catch::Contains("id 8 at position 3") && Catch::Contains("embedding"));
  in[1].as<int32_t>()[3] = 1;  // the backend is usable again after the error
  CHECK(compare(run_on_cuda(exe, in)[0], run_reference(g, in)[0]).max_rel_err == 0);
}

// The kernels whose work grows past the sampled ops' small shapes: a reduction of 300,000
// elements into one value and of 100,000 into three (split into chunks), layer_norm_grad over
// 1,000 rows (dgamma and dbeta summed in chunks of 256 rows), scatter_add of 6,000 updates into
// 300 rows with repeated ids (sorted by row). Each equals the CPU reference on the same inputs
// (f32, 1e-5 relative), and a bad scatter index is still an error naming the op.
TEST_CASE("long reductions and many-row kernels == CPU", "[gpu][scale]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: long reductions and many-row kernels == CPU", seed, 4);
  auto check = [&](Graph& g, std::vector<HostTensor> in, const std::string& what) {
    const Mesh one = Mesh::parse("x=1");
    Executable exe = compile(g, one);
    const auto want = run_reference(g, in);
    CudaRuntime rt(1);
    LoadedExecutable le = load(exe, rt);
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
    RunOptions ro;
    ro.poison = true;
    const RunResult r = le.run(args, ro);
    for (std::size_t o = 0; o < want.size(); ++o) {
      const CompareResult c = compare(le.to_host(r.outputs[o]), want[o]);
      INFO(what << " output " << o << " (seed " << seed << "): " << c.to_string());
      CHECK(c.max_rel_err <= 1e-5);
    }
  };
  {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {300000});
    Tensor y = input(g, "y", DType::f32, {3, 100000});
    g.mark_output(reduce_sum(x, {0}));
    g.mark_output(reduce_mean(y, {1}));
    g.mark_output(reduce_max(y, {1}));
    // Positive inputs: the sum does not cancel, so a relative error measures the summation
    // (f32 in a different tree than the CPU's), not the cancellation of 300,000 signed terms
    // (seen on the H200: 2.3e-5 relative to a sum of -79.5, 1e-8 of the sum of magnitudes).
    auto in = random_inputs(g, seed);
    for (HostTensor& t : in)
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.5 + std::fabs(t.get(i)));
    check(g, in, "reduce");
  }
  {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {1000, 96});
    Tensor gamma = input(g, "gamma", DType::f32, {96});
    Tensor dy = input(g, "dy", DType::f32, {1000, 96});
    LayerNormGrads lg = layer_norm_grad(x, gamma, dy);
    g.mark_output(lg.dx);
    g.mark_output(lg.dgamma);
    g.mark_output(lg.dbeta);
    check(g, random_inputs(g, seed + 1), "layer_norm_grad");
  }
  {
    Graph g;
    Tensor upd = input(g, "upd", DType::f32, {6000, 24});
    Tensor ids = input(g, "ids", DType::i32, {6000});
    g.mark_output(scatter_add(upd, ids, 300));
    auto in = random_inputs(g, seed + 2);
    std::mt19937_64 rng(seed);
    for (int64_t j = 0; j < 6000; ++j) in[1].set(j, static_cast<double>(rng() % 300));
    check(g, in, "scatter_add");
    in[1].set(4321, 300);  // out of range: an error naming the op, not a crash
    Executable exe = compile(g, Mesh::parse("x=1"));
    CudaRuntime rt(1);
    LoadedExecutable le = load(exe, rt);
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < in.size(); ++i) args.push_back(le.to_device(i, in[i]));
    CHECK_THROWS_WITH(le.run(args), Catch::Contains("scatter_add") && Catch::Contains("index 300 at position 4321"));
  }
}
