// Activation memory. Rematerialisation (autodiff.hpp RematPolicy): each policy gives the
// gradients of `none` (bit for bit on one device: the recomputation runs the same kernels on
// the same values), partitioned too, and the memory plan's peak falls as the policy saves less.
// Offload (the offload-activations pass): the arena shrinks by what moves to the host pool, the
// step's results do not change, and the lowered program verifies and round-trips as text.
#include <catch2/catch.hpp>

#include <map>

#include "tessel/ops/builders.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

GptConfig small_gpt(int64_t layers) {
  GptConfig cfg;
  cfg.batch = 4;
  cfg.seq = 16;
  cfg.d_model = 16;
  cfg.heads = 2;
  cfg.layers = layers;
  cfg.vocab = 32;
  return cfg;
}

// The GPT's loss gradients under `policy`, as the graph's outputs (loss first).
GptGraph gpt_with_grads(const GptConfig& cfg, RematPolicy policy) {
  GptGraph m = build_gpt(cfg);
  m.graph.mark_output(m.loss);
  GradOptions o;
  o.remat = policy;
  o.checkpoints = m.checkpoints;
  for (const Tensor& d : grad(m.loss, m.weights, o)) m.graph.mark_output(d);
  return m;
}

int count_kind(const Graph& g, OpKind kind) {
  int n = 0;
  for (const Op& op : g.ops) n += op.kind == kind ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("remat: gradients under every policy equal the gradients without on one device and partitioned",
          "[remat]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("remat: gradients under every policy equal the gradients without", seed, 1);
  const GptConfig cfg = small_gpt(2);
  GptGraph base = gpt_with_grads(cfg, RematPolicy::none);
  std::vector<HostTensor> in = random_inputs(base.graph, seed);
  gpt_init(base.graph, in);
  const std::vector<HostTensor> want = run_reference(base.graph, in);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  for (RematPolicy p : {RematPolicy::einsums, RematPolicy::all}) {
    INFO("policy " << remat_policy_name(p));
    GptGraph m = gpt_with_grads(cfg, p);
    REQUIRE(m.graph.inputs.size() == base.graph.inputs.size());
    REQUIRE(m.graph.outputs.size() == want.size());
    // The backward recomputes: more ops than without, and under `einsums` no einsum twice
    // beyond the backward's own (the same count of einsums as `none`).
    CHECK(m.graph.ops.size() > base.graph.ops.size());
    if (p == RematPolicy::einsums) CHECK(count_kind(m.graph, OpKind::Einsum) == count_kind(base.graph, OpKind::Einsum));
    else CHECK(count_kind(m.graph, OpKind::Einsum) > count_kind(base.graph, OpKind::Einsum));
    const std::vector<HostTensor> got = run_reference(m.graph, in);
    for (std::size_t o = 0; o < want.size(); ++o) {
      INFO("output %" << m.graph.values[static_cast<std::size_t>(m.graph.outputs[o])].name);
      REQUIRE(got[o].numel() == want[o].numel());
      int64_t differ = 0;
      for (int64_t j = 0; j < got[o].numel(); ++j) differ += got[o].get(j) != want[o].get(j) ? 1 : 0;
      CHECK(differ == 0);  // bit for bit
    }
    Executable exe = compile(m.graph, mesh);
    const std::vector<HostTensor> part = exe.run(in);
    for (std::size_t o = 0; o < want.size(); ++o) {
      CompareResult cmp = compare(part[o], want[o], 1.0);
      INFO("partitioned output %" << m.graph.values[static_cast<std::size_t>(m.graph.outputs[o])].name << ": "
                                  << cmp.to_string());
      CHECK(cmp.max_rel_err <= 1e-5);
    }
  }
}

TEST_CASE("remat: the planned peak per device falls from none to einsums to all", "[remat]") {
  GptConfig cfg = small_gpt(4);
  cfg.seq = 32;
  const Mesh mesh = Mesh::parse("data=2,model=1");
  std::map<RematPolicy, int64_t> peak;
  for (RematPolicy p : {RematPolicy::none, RematPolicy::einsums, RematPolicy::all}) {
    GptGraph m = build_gpt(cfg);
    TrainOptions o;
    o.remat = p;
    o.checkpoints = m.checkpoints;
    add_train_step(m.graph, m.loss, m.weights, mesh, o);
    peak[p] = compile(m.graph, mesh).memory_estimate().peak_bytes();
  }
  INFO("peak bytes: none " << peak[RematPolicy::none] << ", einsums " << peak[RematPolicy::einsums] << ", all "
                           << peak[RematPolicy::all]);
  CHECK(peak[RematPolicy::none] > peak[RematPolicy::einsums]);
  CHECK(peak[RematPolicy::einsums] > peak[RematPolicy::all]);
}

TEST_CASE("remat: the policy names parse and an unknown one is an error naming the choices", "[remat]") {
  for (RematPolicy p : {RematPolicy::none, RematPolicy::einsums, RematPolicy::all})
    CHECK(parse_remat_policy(remat_policy_name(p)) == p);
  CHECK_THROWS_WITH(parse_remat_policy("dots"), Catch::Contains("unknown rematerialisation policy 'dots'") &&
                                                    Catch::Contains("none") && Catch::Contains("einsums"));
  Graph g, other;
  Tensor w = input(g, "w", DType::f32, {4});
  Tensor loss = reduce_sum(mul(w, w), {0});
  GradOptions o;
  o.checkpoints = {input(other, "c", DType::f32, {4})};
  CHECK_THROWS_WITH(grad(loss, {w}, o), Catch::Contains("checkpoint %c belongs to another graph"));
}

TEST_CASE("offload: saved activations move to the host pool and the step's results do not change", "[offload]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("offload: saved activations move to the host pool", seed, 1);
  GptConfig cfg = small_gpt(3);
  const Mesh mesh = Mesh::parse("data=2,model=1");
  GptGraph m = build_gpt(cfg);
  TrainStep s = add_train_step(m.graph, m.loss, m.weights, mesh, {});
  Graph& g = m.graph;
  Executable exe = compile(g, mesh);
  std::vector<HostTensor> host = random_inputs(g, seed);
  gpt_init(g, host);
  const std::vector<HostTensor> want = run_reference(g, host);
  ThreadRuntime rt(mesh.num_devices());
  LoadOptions plain, off;
  off.lowering.offload_min_bytes = 1024;
  off.lowering.offload_min_gap = 32;
  LoadedExecutable a = load(exe, rt, plain), b = load(exe, rt, off);
  const MemoryPlan& ma = a.program().memory_plan();
  const MemoryPlan& mb = b.program().memory_plan();
  INFO("arena " << ma.arena_bytes << " -> " << mb.arena_bytes << ", host pool " << mb.host_bytes);
  CHECK(ma.host_bytes == 0);
  CHECK(mb.host_bytes > 0);
  CHECK(mb.arena_bytes < ma.arena_bytes);
  CHECK(mb.peak_bytes() < ma.peak_bytes());
  int offloads = 0, reloads = 0;
  for (const Instr& in : b.program().instrs) {
    if (in.kind != InstrKind::Copy) continue;
    offloads += b.program().values[static_cast<std::size_t>(in.out)].host ? 1 : 0;
    reloads += b.program().values[static_cast<std::size_t>(in.in[0])].host ? 1 : 0;
    if (b.program().values[static_cast<std::size_t>(in.out)].host) CHECK(in.stream == "comm");
  }
  CHECK(offloads > 0);
  CHECK(offloads == reloads);
  // The lowered program verifies and its text round-trips, memory=host and host= included.
  verify_program(b.program());
  const std::string text = print_program(b.program());
  CHECK(text.find("memory=host") != std::string::npos);
  CHECK(print_program(parse_program(text)) == text);
  RunOptions ro;
  ro.poison = true;
  std::vector<ShardedArray> args;
  for (std::size_t i = 0; i < host.size(); ++i) args.push_back(b.to_device(i, host[i]));
  RunResult r = b.run(args, ro);
  REQUIRE(r.outputs.size() == want.size());
  for (std::size_t o = 0; o < want.size(); ++o) {
    CompareResult cmp = compare(b.to_host(r.outputs[o]), want[o], 1.0);
    INFO("output %" << g.values[static_cast<std::size_t>(g.outputs[o])].name << ": " << cmp.to_string());
    CHECK(cmp.max_rel_err <= 1e-5);
  }
  CHECK(r.stats.planned_peak_bytes == mb.peak_bytes());
  // Measured: the device buffers of the plan and a's arena (loaded on the same devices), and
  // the host pool counted apart.
  for (int64_t peak : r.stats.measured_peak_bytes) CHECK(peak == mb.peak_bytes() + ma.arena_bytes);
  for (int64_t peak : r.stats.measured_host_peak_bytes) CHECK(peak == mb.host_bytes);
  (void)s;
}

TEST_CASE("offload: only copies touch host memory and a bad option is an error", "[offload]") {
  Program p = parse_program(
      "mesh data=1\n"
      "%x = input f32[4] global=f32[4] sharding=[{}]\n"
      "%h = copy(%x) block=[4] copies=[[0]->[0]] : f32[4] global=f32[4] sharding=[{}] memory=host @compute\n"
      "%y = copy(%h) block=[4] copies=[[0]->[0]] : f32[4] global=f32[4] sharding=[{}] @compute\n"
      "output %y\n");
  CHECK(p.values[static_cast<std::size_t>(p.instrs[0].out)].host);
  CHECK_THROWS_WITH(parse_program("mesh data=1\n"
                                  "%x = input f32[4] global=f32[4] sharding=[{}]\n"
                                  "%h = copy(%x) block=[4] copies=[[0]->[0]] : f32[4] global=f32[4] sharding=[{}] memory=host @compute\n"
                                  "%y = neg(%h) : f32[4] global=f32[4] sharding=[{}] @compute\n"
                                  "output %y\n"),
                    Catch::Contains("lives in host memory"));
  CHECK_THROWS_WITH(offload_activations_pass(p, 16, 1), Catch::Contains("minimum gap must be >= 2"));
}
