// The install test's consumer: builds a Megatron MLP with the builder API, propagates and
// partitions it on a data=2,model=2 mesh, runs it on CPU threads and compares every output
// against the unpartitioned reference. Prints the collectives summary line; exits non-zero
// on any mismatch or error. Uses only installed headers (and no fmt: the library's fmt is a
// private, link-only dependency).
#include <cstdio>
#include <exception>
#include <vector>

#include "tessel/tessel.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"

int main() {
  try {
    tessel::Graph g;
    auto x = tessel::input(g, "x", tessel::DType::f32, {4, 8, 16});    // [B, S, D]
    auto w1 = tessel::input(g, "w1", tessel::DType::f32, {16, 32});    // [D, F]
    auto w2 = tessel::input(g, "w2", tessel::DType::f32, {32, 16});    // [F, D]
    auto h = tessel::gelu(tessel::einsum("bsd,df->bsf", x, w1));
    auto y = tessel::einsum("bsf,fd->bsd", h, w2).named("y");
    g.annotate(x, tessel::Sharding::of({{"data"}, {}, {}}));
    g.annotate(w1, tessel::Sharding::of({{}, {"model"}}));
    g.annotate(w2, tessel::Sharding::of({{"model"}, {}}));
    g.annotate(y, tessel::Sharding::of({{"data"}, {}, {}}));  // closed output: all-reduced
    g.mark_output(y);

    tessel::Mesh mesh = tessel::Mesh::parse("data=2,model=2");
    tessel::PropagationResult prop = tessel::propagate(g, mesh);
    tessel::Program prog = tessel::partition(g, mesh, prop);
    std::printf("%s\n", prog.summary().line().c_str());
    tessel::CollectiveSummary s = prog.summary();
    if (s.all_reduce != 1 || s.all_gather != 0) {
      std::fprintf(stderr, "consumer: expected one all-reduce and no all-gather\n");
      return 1;
    }

    tessel::Executable exe = tessel::compile(g, mesh);
    std::vector<tessel::HostTensor> inputs = tessel::random_inputs(g, 42);
    tessel::RunOptions ro;
    ro.poison = true;
    ro.check_replicas = true;
    std::vector<tessel::HostTensor> got = exe.run(inputs, ro);
    std::vector<tessel::HostTensor> want = tessel::run_reference(g, inputs);
    if (got.size() != want.size()) {
      std::fprintf(stderr, "consumer: %zu outputs, reference has %zu\n", got.size(), want.size());
      return 1;
    }
    int bad = 0;
    for (std::size_t o = 0; o < got.size(); ++o) {
      tessel::CompareResult c = tessel::compare(got[o], want[o]);
      std::printf("output %zu: %s\n", o, c.to_string().c_str());
      if (c.shape_mismatch || !(c.max_rel_err <= 1e-5)) ++bad;
    }
    if (bad) {
      std::fprintf(stderr, "consumer: %d output(s) differ from the reference\n", bad);
      return 1;
    }
    std::printf("consumer: OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: error: %s\n", e.what());
    return 1;
  }
}
