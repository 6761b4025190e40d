// Helpers shared by the tests: seeds (TESSEL_SEED overrides; printed by each test), random
// meshes, shapes and shardings, and the partitioned-run-versus-reference check.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"

namespace tessel_test {

// Runs one CPU kernel (run_cpu_kernel) on the operands `in` and returns its result, poisoned
// first so that an element the kernel does not write fails a comparison. `offsets` and
// `threads`: KernelArgs::in_offsets and num_threads.
inline tessel::HostTensor run_cpu_op(tessel::OpKind kind, const tessel::OpAttrs& attrs,
                                     const std::vector<const tessel::HostTensor*>& in, tessel::DType out_dtype,
                                     const tessel::Shape& out_shape, std::vector<std::vector<int64_t>> offsets = {},
                                     int threads = 1) {
  tessel::KernelArgs a;
  a.kind = kind;
  a.attrs = &attrs;
  for (const tessel::HostTensor* t : in) {
    a.in.push_back(t->data());
    a.in_shapes.push_back(t->shape());
    a.in_dtypes.push_back(t->dtype());
  }
  a.in_offsets = std::move(offsets);
  tessel::HostTensor out(out_dtype, out_shape);
  out.poison();
  a.out = out.data();
  a.out_shape = out_shape;
  a.out_dtype = out_dtype;
  a.num_threads = threads;
  tessel::run_cpu_kernel(a);
  return out;
}

// y = x·w with the contraction split over data (mesh data=2): one all-reduce, the run's only
// collective (the tests of a world aborted after the last collective, issue 22 finding 9).
inline tessel::Graph one_all_reduce_graph() {
  using namespace tessel;
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  Tensor w = input(g, "w", DType::f32, {8, 4});
  g.annotate(x, Sharding::of({{}, {"data"}}));
  g.annotate(w, Sharding::of({{"data"}, {}}));
  Tensor y = einsum("ik,kj->ij", x, w);
  g.annotate(y, Sharding::of({{}, {}}));
  g.mark_output(y);
  return g;
}

// An optimizer-style update on data=2 x model=2: %w is dead after tanh, before %w_new is
// written, so a run donating %w to %w_new writes %w_new over %w's buffer (in place).
inline tessel::Graph donated_update_graph() {
  return tessel::parse_graph(R"(
mesh data=2, model=2
%w = input f32[8,16] sharding=[{data}, {model}]
%t = tanh(%w)
%w_new = relu(%t)
output %w_new
)", "update.tsl");
}

// ThreadRuntimeOptions or RunOptions for a test of `mode`'s streams. A program whose
// collectives are small runs inline on the device threads by default (inline_max_comm_bytes);
// a test of StreamMode::Async means the stream workers, so this turns that off.
template <class Options>
Options stream_options(tessel::StreamMode mode) {
  Options o;
  o.stream_mode = mode;
  o.inline_max_comm_bytes = 0;
  return o;
}

// Runs f on another thread and ends the test process with a message naming `what` when it
// has not finished within 120 s: a hang or deadlock fails loudly instead of stalling CTest.
template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  auto fut = std::async(std::launch::async, std::forward<F>(f));
  if (fut.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "\nFATAL: '%s' did not finish within 120 s (hang or deadlock)\n", what.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return fut.get();
}

// The message of the tessel::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tessel::Error& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Occurrences of `part` in `s` (overlapping ones too).
inline int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// The graph's outputs on `mesh` from random inputs of `seed` (outputs poisoned first, replicas
// checked), lowered with fusion on or off, einsum epilogues as `epilogues` says.
inline std::vector<tessel::HostTensor> run_fused(const tessel::Graph& g, const tessel::Mesh& mesh, bool fuse,
                                                 bool epilogues, uint64_t seed) {
  tessel::Executable exe = tessel::compile(g, mesh);
  tessel::RunOptions ro;
  ro.poison = true;
  ro.check_replicas = true;
  ro.lowering.fuse_elementwise = fuse;
  ro.lowering.fuse_einsum_epilogue = epilogues;
  return exe.run(tessel::random_inputs(g, seed), ro);
}

inline uint64_t seed() {
  if (const char* s = std::getenv("TESSEL_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
}

// Number of cases for property tests: TESSEL_CASES overrides the default.
inline int cases(int dflt) {
  if (const char* s = std::getenv("TESSEL_CASES")) return std::atoi(s);
  return dflt;
}

// Every seeded test prints one line on stdout when it starts, e.g.
//   tessel-seed: property: ... seed=1718023847123 cases=2000 (TESSEL_SEED=1718023847123 TESSEL_CASES=2000 reproduces)
// so a log of a passing run says what it covered and scripts/soak can count cases and seeds.
inline void announce(const std::string& test, uint64_t seed, int cases) {
  std::printf("tessel-seed: %s seed=%llu cases=%d (TESSEL_SEED=%llu TESSEL_CASES=%d reproduces)\n",
              test.c_str(), static_cast<unsigned long long>(seed), cases,
              static_cast<unsigned long long>(seed), cases);
  std::fflush(stdout);
}

// 1–8 devices, 1–3 axes.
inline tessel::Mesh random_mesh(std::mt19937_64& rng) {
  static const std::vector<std::vector<int64_t>> shapes = {
      {1}, {2}, {4}, {8}, {2, 2}, {2, 4}, {4, 2}, {1, 4}, {2, 2, 2}, {2, 1, 2}, {3}, {3, 2}, {1, 2, 4}};
  const auto& s = shapes[rng() % shapes.size()];
  static const char* names[] = {"x", "y", "z"};
  std::vector<tessel::MeshAxis> axes;
  for (std::size_t i = 0; i < s.size(); ++i) axes.push_back({names[i], s[i]});
  return tessel::Mesh(axes);
}

// A random sharding for a random shape of rank 1–3 that it divides. Each axis goes to a
// random dim, is left unused, or (when allow_partial) becomes a partial axis.
inline tessel::Sharding random_sharding(std::mt19937_64& rng, const tessel::Mesh& mesh,
                                        tessel::Shape& shape, bool allow_partial, int rank = -1) {
  if (rank < 0) rank = 1 + static_cast<int>(rng() % 3);
  tessel::Sharding s = tessel::Sharding::replicated(rank);
  std::vector<std::string> axes;
  for (const auto& a : mesh.axes()) axes.push_back(a.name);
  std::shuffle(axes.begin(), axes.end(), rng);
  for (const auto& a : axes) {
    int choice = static_cast<int>(rng() % (rank + (allow_partial ? 2 : 1)));
    if (choice < rank) s.dims[choice].axes.push_back(a);
    else if (choice == rank + 1) s.partial.push_back(a);
  }
  if (shape.empty()) {
    shape.resize(static_cast<std::size_t>(rank));
    for (int d = 0; d < rank; ++d) shape[d] = mesh.axes_size(s.dims[d].axes) * (1 + static_cast<int64_t>(rng() % 3));
  }
  return s;
}

// A random sharding valid for a given shape (axes whose sizes do not divide are skipped).
inline tessel::Sharding random_sharding_for(std::mt19937_64& rng, const tessel::Mesh& mesh,
                                            const tessel::Shape& shape, bool allow_partial) {
  int rank = static_cast<int>(shape.size());
  tessel::Sharding s = tessel::Sharding::replicated(rank);
  std::vector<std::string> axes;
  for (const auto& a : mesh.axes()) axes.push_back(a.name);
  std::shuffle(axes.begin(), axes.end(), rng);
  for (const auto& a : axes) {
    int choice = static_cast<int>(rng() % (rank + (allow_partial ? 2 : 1)));
    if (choice < rank) {
      auto trial = s.dims[choice].axes;
      trial.push_back(a);
      if (shape[choice] % mesh.axes_size(trial) == 0) s.dims[choice].axes = trial;
    } else if (choice == rank + 1) {
      s.partial.push_back(a);
    }
  }
  return s;
}

// Every op kind with a sample generator in the registry (all but Input), in enum order.
inline std::vector<tessel::OpKind> sampled_op_kinds() {
  std::vector<tessel::OpKind> kinds;
  for (tessel::OpKind k : tessel::all_op_kinds())
    if (tessel::op_def(k).sample && k != tessel::OpKind::Input) kinds.push_back(k);
  return kinds;
}

// A random graph around one op of kind k on `mesh` (its registry sample generator): inputs
// annotated with probability 0.8, the result with probability p_annotate_output.
inline tessel::Graph sample_op_graph(tessel::OpKind k, std::mt19937_64& rng, const tessel::Mesh& mesh,
                                     double p_annotate_output = 0.3) {
  tessel::SampleGen cr{rng, [&](const tessel::Shape& s) { return random_sharding_for(rng, mesh, s, false); }};
  tessel::Graph g;
  tessel::Tensor out = tessel::op_def(k).sample(g, cr);
  g.mark_output(out);
  for (int v : g.inputs)
    if (cr.coin(0.8)) g.annotate(v, random_sharding_for(rng, mesh, g.values[v].shape, false));
  if (cr.coin(p_annotate_output) && k != tessel::OpKind::ShardingConstraint)
    g.annotate(out, random_sharding_for(rng, mesh, out.shape(), false));
  g.mesh = mesh;
  return g;
}

// Compiles g for mesh, runs it partitioned on fresh seeded inputs (outputs poisoned first,
// replicas checked) and compares every element of every output with the unpartitioned
// reference (max-norm relative error, the inputs' scale as floor).
inline void check_matches(tessel::Graph& g, const tessel::Mesh& mesh, uint64_t seed, double tol = 1e-5) {
  tessel::Executable exe = tessel::compile(g, mesh);
  INFO(exe.program().to_string(0));
  auto inputs = tessel::random_inputs(g, seed);
  tessel::RunOptions ro;
  ro.poison = true;
  ro.check_replicas = true;
  auto got = exe.run(inputs, ro);
  auto want = tessel::run_reference(g, inputs);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].shape() == want[i].shape());
    tessel::CompareResult cmp = tessel::compare(got[i], want[i], tessel::max_abs(inputs));
    INFO("output " << i << ": " << cmp.to_string());
    CHECK(cmp.max_rel_err <= tol);
  }
}

// The sequence-parallel MLP on a ring of 4 (mesh model=4): x and y sharded along tokens, the
// weights along the hidden dim, so forced collective matmul turns its all-gather and its
// reduce-scatter into rings of permutes. Loaded on `rt` in both ring directions, run with
// outputs poisoned, and checked against the reference (the MPI and CUDA ring tests).
inline void check_sequence_parallel_rings(tessel::Runtime& rt, uint64_t seed) {
  using namespace tessel;
  Graph g = parse_graph(R"(
mesh model=4
%x = input f32[8,6] sharding=[{model}, {}]
%w1 = input f32[6,8] sharding=[{}, {model}]
%w2 = input f32[8,6] sharding=[{model}, {}]
%u = einsum(%x, %w1) eq="td,df->tf" sharding=[{}, {model}]
%a = gelu(%u)
%y = einsum(%a, %w2) eq="tf,fd->td" sharding=[{model}, {}]
output %y
)", "mlp.tsl");
  INFO("seed " << seed);
  Executable exe = compile(g, *g.mesh);
  const auto inputs = random_inputs(g, seed);
  const auto want = run_reference(g, inputs);
  for (RingDirection dir : {RingDirection::Uni, RingDirection::Bi}) {
    LoadOptions lo;
    lo.lowering.collective_matmul.mode = OverlapMode::On;
    lo.lowering.collective_matmul.direction = dir;
    LoadedExecutable prog = load(exe, rt, lo);
    REQUIRE(prog.program().summary().collective_permute >= 3);
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < inputs.size(); ++i) args.push_back(prog.to_device(i, inputs[i]));
    RunOptions ro;
    ro.poison = true;
    RunResult r = prog.run(args, ro);
    const CompareResult cmp = compare(prog.to_host(r.outputs[0], /*check_replicas=*/true), want[0]);
    INFO((dir == RingDirection::Uni ? "uni: " : "bi: ") << cmp.to_string());
    CHECK(cmp.max_rel_err <= 1e-5);
  }
}

// The golden graph tests/golden/NAME.tsl, propagated and partitioned on its own mesh.
inline tessel::Program partitioned_golden(const std::string& name) {
  tessel::Graph g = tessel::parse_graph_file(std::string(TESSEL_SOURCE_DIR) + "/tests/golden/" + name + ".tsl");
  tessel::PropagationResult prop = tessel::propagate(g, *g.mesh);
  return tessel::partition(g, *g.mesh, prop);
}

}  // namespace tessel_test
