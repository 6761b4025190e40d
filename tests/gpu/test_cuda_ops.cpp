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

bool is_float_type(DType t) { return t != DType::i32; }

// Runs one op's kernel on the CPU with `in` as operands and results of `out_types`; returns them.
std::vector<HostTensor> cpu_kernel(const Op& op, const std::vector<HostTensor>& in,
                                   const std::vector<std::pair<DType, Shape>>& out_types) {
  KernelArgs a;
  a.kind = op.kind;
  a.attrs = &op.attrs;
  for (const HostTensor& t : in) {
    a.in.push_back(t.data());
    a.in_shapes.push_back(t.shape());
    a.in_dtypes.push_back(t.dtype());
  }
  std::vector<HostTensor> out;
  for (const auto& [dt, shape] : out_types) out.emplace_back(dt, shape);
  a.out = out[0].data();
  a.out_shape = out[0].shape();
  a.out_dtype = out[0].dtype();
  for (std::size_t r = 1; r < out.size(); ++r) {
    a.extra_out.push_back(out[r].data());
    a.extra_out_shapes.push_back(out[r].shape());
    a.extra_out_dtypes.push_back(out[r].dtype());
  }
  run_cpu_kernel(a);
  return out;
}

// `text` (a fused expression) with its f32 literals and casts to f32 retyped to dt.
std::string retyped(std::string text, DType dt) {
  const std::string to = dtype_name(dt);
  for (const std::string from : {":f32", "cast<f32>"}) {
    const std::string repl = from[0] == ':' ? ":" + to : "cast<" + to + ">";
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + repl.size()))
      text.replace(at, from.size(), repl);
  }
  return text;
}

// One op retyped to dt as far as its type rules allow: every float operand in dt when the op
// accepts that (re-inferring its result dtypes through the registry), else operand by operand
// (adamw's moments, cross_entropy_grad's g stay f32). Returns the retyped op (its operand and
// result types in `g`), or nullopt when no operand can be in dt.
std::optional<Op> retype_op(const Op& op, const Graph& src, DType dt, Graph& g) {
  OpAttrs at = op.attrs;
  if (op.kind == OpKind::FusedElementwise || op.kind == OpKind::FusedSoftmax) at.equation = retyped(at.equation, dt);
  if (op.kind == OpKind::FusedEinsum) at.epilogue = retyped(at.epilogue, dt);
  std::vector<DType> types;
  for (int v : op.inputs) types.push_back(src.values[static_cast<std::size_t>(v)].dtype);
  auto attempt = [&](const std::vector<DType>& ts) -> bool {
    Graph t;
    std::vector<int> ids;
    for (std::size_t i = 0; i < ts.size(); ++i)
      ids.push_back(t.add_input("x" + std::to_string(i), ts[i], src.values[static_cast<std::size_t>(op.inputs[i])].shape).id);
    try {
      t.add_op_results(op.kind, ids, at);
    } catch (const Error&) {
      return false;
    }
    g = std::move(t);
    return true;
  };
  // Subsets of the float operands in dt, largest first (layer_norm_grad needs dy and x in dt
  // together; adamw keeps its moments in f32): the first the op accepts.
  std::vector<std::size_t> floats;
  for (std::size_t i = 0; i < types.size(); ++i)
    if (is_float_type(types[i])) floats.push_back(i);
  if (floats.size() > 12) return std::nullopt;
  std::vector<uint32_t> masks;
  for (uint32_t m = 1; m < (1u << floats.size()); ++m) masks.push_back(m);
  std::stable_sort(masks.begin(), masks.end(),
                   [](uint32_t a, uint32_t b) { return __builtin_popcount(a) > __builtin_popcount(b); });
  // An op whose result dtype is an attribute (one_hot, cast from i32) makes its float result in dt.
  if ((op.kind == OpKind::OneHot || (op.kind == OpKind::Cast && floats.empty())) && is_float_type(at.dtype)) {
    at.dtype = dt;
    return attempt(types) ? std::optional<Op>(g.ops.back()) : std::nullopt;
  }
  for (uint32_t m : masks) {
    std::vector<DType> ts = types;
    for (std::size_t b = 0; b < floats.size(); ++b)
      if (m & (1u << b)) ts[floats[b]] = dt;
    if (attempt(ts)) return g.ops.back();
  }
  return std::nullopt;
}

// Checks each op of g on its own: its operands are the values of an f32 CPU run of g, rounded to
// `dt` where the op's type rules allow (retype_op); the CUDA kernel on those very operands must
// match the CPU kernel's result of the same types. An op whose kernel throws is reported and the
// others are still checked. Returns how many ops ran in dt.
int check_kernels_in_dtype(const Graph& g, const std::vector<HostTensor>& inputs, DType dt, double tol, Device& dev) {
  std::map<int, HostTensor> val;  // the f32 run
  for (std::size_t i = 0; i < g.inputs.size(); ++i) val[g.inputs[i]] = inputs[i];
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::Input) continue;
    std::vector<HostTensor> in;
    for (int v : op.inputs) in.push_back(val.at(v));
    std::vector<std::pair<DType, Shape>> types;
    for (int v : op.results()) types.emplace_back(g.values[static_cast<std::size_t>(v)].dtype, g.values[static_cast<std::size_t>(v)].shape);
    std::vector<HostTensor> out = cpu_kernel(op, in, types);
    for (std::size_t r = 0; r < out.size(); ++r) val[op.result(static_cast<int>(r))] = std::move(out[r]);
  }
  int typed = 0;
  for (const Op& src_op : g.ops) {
    if (src_op.kind == OpKind::Input) continue;
    const std::string what = std::string(op_name(src_op.kind)) + " in " + dtype_name(dt);
    try {
      Graph mini;
      const std::optional<Op> op = retype_op(src_op, g, dt, mini);
      if (!op) continue;
      ++typed;
      std::vector<HostTensor> in;
      std::string operand_types;
      for (std::size_t i = 0; i < op->inputs.size(); ++i) {
        in.push_back(tessel_gpu_test::converted(val.at(src_op.inputs[i]), mini.values[static_cast<std::size_t>(op->inputs[i])].dtype));
        operand_types += std::string(i ? ", " : "") + dtype_name(in.back().dtype());
      }
      std::vector<std::pair<DType, Shape>> types;
      for (int v : op->results()) types.emplace_back(mini.values[static_cast<std::size_t>(v)].dtype, mini.values[static_cast<std::size_t>(v)].shape);
      const std::vector<HostTensor> want = cpu_kernel(*op, in, types);
      KernelArgs d;
      d.kind = op->kind;
      d.attrs = &op->attrs;
      std::vector<std::shared_ptr<Buffer>> dev_in, dev_out;
      for (const HostTensor& t : in) {
        dev_in.push_back(dev.upload(t));
        d.in.push_back(dev_in.back()->data());
        d.in_shapes.push_back(t.shape());
        d.in_dtypes.push_back(t.dtype());
      }
      for (const HostTensor& w : want) {
        dev_out.push_back(dev.be->allocate(w.bytes()));
        dev.be->poison(*dev_out.back(), w.dtype(), *dev.s);
      }
      d.out = dev_out[0]->data();
      d.out_shape = want[0].shape();
      d.out_dtype = want[0].dtype();
      for (std::size_t r = 1; r < want.size(); ++r) {
        d.extra_out.push_back(dev_out[r]->data());
        d.extra_out_shapes.push_back(want[r].shape());
        d.extra_out_dtypes.push_back(want[r].dtype());
      }
      dev.be->run_kernel(d, *dev.s);
      dev.s->synchronize();
      for (std::size_t r = 0; r < want.size(); ++r) {
        HostTensor got = dev.download(*dev_out[r], want[r].dtype(), want[r].shape());
        CompareResult c = compare(got, want[r], max_abs(in));
        INFO(what << " (operands " << operand_types << ") result " << r << " " << dtype_name(want[r].dtype()) << ": "
                  << c.to_string());
        CHECK(c.max_rel_err <= tol);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK(what << ": " << e.what());
    }
  }
  return typed;
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
      const int typed = check_kernels_in_dtype(g, random_inputs(g, case_seed), dt, dt == DType::bf16 ? 2e-2 : 4e-3, dev);
      // Every op with a float operand ran in dt (its registry type rules allow one at least).
      bool has_float = false;
      for (const Value& v : g.values) has_float = has_float || is_float_type(v.dtype);
      if (has_float) CHECK(typed > 0);
    }
}

TEST_CASE("einsum layouts through cuBLASLt == CPU kernel", "[gpu][einsum]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: einsum layouts through cuBLASLt == CPU kernel", seed, 28);
  // Every case twice: as it comes, and with every product's odd rows padded to 16 bytes
  // (gemm_pad_min_flops = 0: the path the GPT-2 LM head takes).
  Device plain;
  CudaBackendOptions po;
  po.gemm_pad_min_flops = 0;
  Device padded{make_cuda_backend(po)};
  struct Case {
    const char* eq;
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {"mk,kn->mn", {33, 17}, {17, 9}},        {"km,kn->mn", {17, 33}, {17, 9}},
      {"mk,nk->mn", {33, 17}, {9, 17}},        {"mk,kn->nm", {33, 17}, {17, 9}},
      {"bmk,bkn->bmn", {3, 8, 5}, {3, 5, 7}},  {"bsd,df->bsf", {2, 6, 16}, {16, 12}},
      {"bqhd,bkhd->bhqk", {2, 4, 3, 8}, {2, 5, 3, 8}}, {"bhqk,bkhd->bqhd", {2, 3, 4, 5}, {2, 5, 3, 8}},
      {"ijs,jk->ik", {4, 3, 2}, {3, 6}},
      {"i,i->", {64}, {64}},                   {"ab,cd->abcd", {2, 3}, {4, 5}},
      {"bsd,vd->bsv", {2, 5, 16}, {37, 16}},   {"bmk,bkn->bnm", {3, 7, 5}, {3, 5, 9}},
      {"mk,kn->nm", {13, 11}, {11, 37}}};
  std::mt19937_64 rng(seed);
  for (Device* dev_p : {&plain, &padded})
  for (const auto& c : cases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Device& dev = *dev_p;
      Graph g;
      Tensor x = g.add_input("x", dt, c.a), y = g.add_input("y", dt, c.b);
      OpAttrs at;
      at.equation = c.eq;
      g.mark_output(g.add_op(OpKind::Einsum, {x.id, y.id}, at));
      INFO(c.eq << " " << dtype_name(dt) << (dev_p == &padded ? " (rows padded)" : ""));
      check_kernels_in_dtype(g, random_inputs(g, rng()), dt,
                             dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 4e-3, dev);
    }
}

// K = 0 (an empty summed letter) cannot be declared in a Graph (dims are >= 1), but a kernel
// can see it: the product is a sum over nothing, all zeros, in every dtype.
TEST_CASE("einsum with an empty summed dimension writes zeros", "[gpu][einsum]") {
  Device dev;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    OpAttrs at;
    at.equation = "ij,jk->ik";
    HostTensor want(dt, {4, 6});
    KernelArgs a;
    a.kind = OpKind::Einsum;
    a.attrs = &at;
    const float dummy[1] = {0};
    a.in = {dummy, dummy};
    a.in_shapes = {{4, 0}, {0, 6}};
    a.in_dtypes = {dt, dt};
    a.out = want.data();
    a.out_shape = want.shape();
    a.out_dtype = dt;
    for (int64_t i = 0; i < want.numel(); ++i) want.set(i, 7.0);
    run_cpu_kernel(a);
    std::shared_ptr<Buffer> x = dev.be->allocate(16), y = dev.be->allocate(16), out = dev.be->allocate(want.bytes());
    dev.be->poison(*out, dt, *dev.s);
    KernelArgs d = a;
    d.in = {x->data(), y->data()};
    d.out = out->data();
    dev.be->run_kernel(d, *dev.s);
    const HostTensor got = dev.download(*out, dt, want.shape());
    INFO(dtype_name(dt));
    for (int64_t i = 0; i < want.numel(); ++i) {
      CHECK(want.get(i) == 0.0);
      CHECK(got.get(i) == 0.0);
    }
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
