// GPU tests of the CUDA backend (label gpu; skipped without a GPU, see gpu_main.cpp):
//  * every op kind of the registry, partitioned over random virtual-device meshes (1–8 devices
//    on one GPU), equals the unpartitioned CPU reference (f32 within 1e-5, outputs poisoned
//    first, replicas bit-identical);
//  * every op kind's kernel in bf16 and f16 equals the CPU kernel on the same rounded inputs
//    (tolerances documented in docs/backend-cuda.md);
//  * einsum layouts (transposes folded into cuBLASLt, summed letters, batch, K = 0);
//  * every collective on the virtual-device world (and on NCCL with 2+ GPUs);
//  * the GPT forward on data=2,model=4 virtual devices matches the CPU loss;
//  * a bad index is an error naming the instruction, not a crash.
// Seeds: TESSEL_SEED reproduces (printed by each test), TESSEL_CASES sets the case count.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>

#include "../unit/test_util.hpp"
#include "gpu_test_util.hpp"
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

// Host tensors <-> one CUDA backend, for kernel-level tests.
struct Device {
  std::unique_ptr<Backend> be = make_cuda_backend();
  std::unique_ptr<Stream> s = be->create_stream("test");
  std::shared_ptr<Buffer> upload(const HostTensor& t) {
    std::shared_ptr<Buffer> b = be->allocate(t.bytes());
    be->copy_from_host(*b, t.data(), t.bytes(), *s);
    return b;
  }
  HostTensor download(const Buffer& b, DType t, const Shape& shape) {
    HostTensor h(t, shape);
    be->copy_to_host(h.data(), b, h.bytes(), *s);
    s->synchronize();
    return h;
  }
};

// Runs the ops of g in order on the CPU kernels, every float value rounded to `dt`, and checks
// each op's CUDA kernel on the very same (rounded) operands against the CPU kernel's result.
void check_kernels_in_dtype(const Graph& g, const std::vector<HostTensor>& inputs, DType dt, double tol, Device& dev) {
  std::map<int, HostTensor> val;
  auto as_dt = [&](const HostTensor& t) { return t.dtype() == DType::i32 ? t : tessel_gpu_test::converted(t, dt); };
  for (std::size_t i = 0; i < g.inputs.size(); ++i) val[g.inputs[i]] = as_dt(inputs[i]);
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::Input) continue;
    KernelArgs a;
    a.kind = op.kind;
    a.attrs = &op.attrs;
    std::vector<std::shared_ptr<Buffer>> dev_in;
    for (int v : op.inputs) {
      const HostTensor& t = val.at(v);
      a.in.push_back(t.data());
      a.in_shapes.push_back(t.shape());
      a.in_dtypes.push_back(t.dtype());
      dev_in.push_back(dev.upload(t));
    }
    auto out_dtype = [&](int v) {
      const DType gd = g.values[static_cast<std::size_t>(v)].dtype;
      return gd == DType::i32 || op.kind == OpKind::Cast ? gd : dt;
    };
    std::vector<HostTensor> want;
    for (int v : op.results()) want.emplace_back(out_dtype(v), g.values[static_cast<std::size_t>(v)].shape);
    a.out = want[0].data();
    a.out_shape = want[0].shape();
    a.out_dtype = want[0].dtype();
    for (std::size_t r = 1; r < want.size(); ++r) {
      a.extra_out.push_back(want[r].data());
      a.extra_out_shapes.push_back(want[r].shape());
      a.extra_out_dtypes.push_back(want[r].dtype());
    }
    run_cpu_kernel(a);
    // The same op on the GPU.
    KernelArgs d = a;
    for (std::size_t i = 0; i < dev_in.size(); ++i) d.in[i] = dev_in[i]->data();
    std::vector<std::shared_ptr<Buffer>> dev_out;
    for (const HostTensor& w : want) {
      dev_out.push_back(dev.be->allocate(w.bytes()));
      dev.be->poison(*dev_out.back(), w.dtype(), *dev.s);
    }
    d.out = dev_out[0]->data();
    for (std::size_t r = 1; r < dev_out.size(); ++r) d.extra_out[r - 1] = dev_out[r]->data();
    dev.be->run_kernel(d, *dev.s);
    dev.s->synchronize();
    for (std::size_t r = 0; r < want.size(); ++r) {
      HostTensor got = dev.download(*dev_out[r], want[r].dtype(), want[r].shape());
      CompareResult c = compare(got, want[r], max_abs(std::vector<HostTensor>{val.at(op.inputs.empty() ? op.output : op.inputs[0])}));
      INFO(op_name(op.kind) << " result " << r << " in " << dtype_name(dt) << ": " << c.to_string());
      CHECK(c.max_rel_err <= tol);
      val[op.result(static_cast<int>(r))] = std::move(want[r]);
    }
  }
}

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
  Device dev;
  std::mt19937_64 rng(seed);
  const Mesh one = Mesh::parse("x=1");
  for (OpKind k : kinds)
    for (DType dt : {DType::bf16, DType::f16}) {
      const uint64_t case_seed = rng();
      std::mt19937_64 crng(case_seed);
      Graph g = tessel_test::sample_op_graph(k, crng, one);
      INFO("seed " << seed << " op " << op_name(k) << " dtype " << dtype_name(dt) << " (case seed " << case_seed
                   << ")\n" << print_graph(g));
      // Both sides see the same rounded inputs and round each result once: the difference is
      // accumulation order and f32-vs-double statistics, a few units of the dtype's epsilon.
      check_kernels_in_dtype(g, random_inputs(g, case_seed), dt, dt == DType::bf16 ? 2e-2 : 4e-3, dev);
    }
}

TEST_CASE("einsum layouts through cuBLASLt == CPU kernel", "[gpu][einsum]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: einsum layouts through cuBLASLt == CPU kernel", seed, 12);
  Device dev;
  struct Case {
    const char* eq;
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {"mk,kn->mn", {33, 17}, {17, 9}},        {"km,kn->mn", {17, 33}, {17, 9}},
      {"mk,nk->mn", {33, 17}, {9, 17}},        {"mk,kn->nm", {33, 17}, {17, 9}},
      {"bmk,bkn->bmn", {3, 8, 5}, {3, 5, 7}},  {"bsd,df->bsf", {2, 6, 16}, {16, 12}},
      {"bqhd,bkhd->bhqk", {2, 4, 3, 8}, {2, 5, 3, 8}}, {"bhqk,bkhd->bqhd", {2, 3, 4, 5}, {2, 5, 3, 8}},
      {"ij,jk->ik", {4, 0}, {0, 6}},           {"ijs,jk->ik", {4, 3, 2}, {3, 6}},
      {"i,i->", {64}, {64}},                   {"ab,cd->abcd", {2, 3}, {4, 5}}};
  std::mt19937_64 rng(seed);
  for (const auto& c : cases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Graph g;
      Tensor x = g.add_input("x", dt, c.a), y = g.add_input("y", dt, c.b);
      OpAttrs at;
      at.equation = c.eq;
      g.mark_output(g.add_op(OpKind::Einsum, {x.id, y.id}, at));
      INFO(c.eq << " " << dtype_name(dt));
      check_kernels_in_dtype(g, random_inputs(g, rng()), dt,
                             dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 4e-3, dev);
    }
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
