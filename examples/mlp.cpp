// mlp: the Megatron MLP — the first weight split on its output dim over `model`, the second
// on its input dim, the batch over `data` — compiled for a data=2,model=4 mesh, run on 8
// virtual CPU devices and checked element by element against the unpartitioned graph.
// The output is closed to the batch-split layout, so the program needs exactly one all-reduce
// (of the output); left open it would be reduce-scattered instead (docs/propagation.md).
//
//   build/bin/mlp [--mesh data=2,model=4] [--seed N] [--print-program]
#include <fmt/format.h>

#include <cstdio>
#include <random>
#include <string>

#include "tessel/ops/builders.hpp"
#include "tessel/cli.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"

namespace {
const char* kUsage =
    "usage: mlp [--mesh data=2,model=4] [--seed N] [--print-program]\n"
    "The Megatron MLP on N virtual CPU devices, checked against one device.\n";
}  // namespace

int main(int argc, char** argv) try {
  std::string mesh_spec = "data=2,model=4";
  uint64_t seed = std::random_device{}();
  bool print_program = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return tessel::cli::next_value(i, argc, argv); };
    if (tessel::cli::is_help(a)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--mesh") mesh_spec = next();
    else if (a == "--seed") seed = tessel::cli::parse_u64(a, next());
    else if (a == "--print-program") print_program = true;
    else throw tessel::UsageError(fmt::format("unknown option '{}'", a));
  }
  using namespace tessel;
  Graph g;
  Tensor x = input(g, "x", DType::f32, {16, 128, 512});   // [batch, seq, d_model]
  Tensor w1 = input(g, "w1", DType::f32, {512, 2048});    // [d_model, d_ff]
  Tensor w2 = input(g, "w2", DType::f32, {2048, 512});    // [d_ff, d_model]
  Tensor h = gelu(einsum("bsd,df->bsf", x, w1)).named("h");
  Tensor y = einsum("bsf,fd->bsd", h, w2).named("y");
  g.mark_output(y);
  g.annotate(x, Sharding::parse("[{data}, {}, {}]"));
  g.annotate(w1, Sharding::parse("[{}, {model}]"));
  g.annotate(w2, Sharding::parse("[{model}, {}]"));
  g.annotate(y, Sharding::parse("[{data}, {}, {}]"));  // the next layer's layout (closed)

  tessel::cli::require_one_process("mlp");
  Mesh mesh = Mesh::parse(mesh_spec);
  Executable exe = compile(g, mesh);
  if (print_program) std::fputs(exe.program().to_string(0).c_str(), stdout);
  fmt::print("h is sharded {} (propagated)\n", exe.shardings().shardings[h.id].to_string());

  std::vector<HostTensor> inputs = random_inputs(g, seed);
  RunOptions ro;
  ro.poison = true;
  std::vector<HostTensor> got = exe.run(inputs, ro);
  std::vector<HostTensor> want = run_reference(g, inputs);
  CompareResult c = compare(got[0], want[0]);
  fmt::print("mesh {} ({} devices), seed {}: {}\n", mesh.to_string(), mesh.num_devices(), seed, c.to_string());
  fmt::print("{}\n", exe.program().summary().line());
  return c.max_rel_err <= 1e-5 ? 0 : 1;
} catch (const tessel::UsageError& e) {
  std::fprintf(stderr, "mlp: error: %s\n%s", e.what(), kUsage);
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mlp: error: %s\n", e.what());
  return 1;
}
