// fuzz/fuzz_graph_text.cpp — libFuzzer target for the graph text form (docs/ir.md):
//   parse → print → parse: the reparsed graph prints the same (the printed form is canonical);
//   → compile on the declared mesh (propagate + partition);
//   → run on the CPU backend with seeded inputs against the unpartitioned reference, with
//     dtype-aware tolerances, poisoned outputs and replica checks.
// Sizes are bounded (elements per value, ops, devices, flops) so that each input runs in
// milliseconds; inputs over the bounds still exercise parse/print/compile. Every
// tessel::Error is a fine answer to a bad program; anything else (another exception, a
// sanitizer report, a mismatch) is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

namespace {

constexpr int64_t kMaxElements = 1 << 12;    // per value
constexpr int64_t kMaxTotal = 1 << 15;       // all values together
constexpr std::size_t kMaxOps = 48;
constexpr int64_t kMaxDevices = 8;
constexpr double kMaxFlops = 1 << 22;        // einsum flops, all ops together

bool small_enough(const tessel::Graph& g, const tessel::Mesh& mesh) {
  if (mesh.num_devices() > kMaxDevices || g.ops.size() > kMaxOps) return false;
  int64_t total = 0;
  for (const auto& v : g.values) {
    int64_t n = 1;
    for (int64_t d : v.shape) {
      if (d <= 0 || d > kMaxElements) return false;
      n *= d;
      if (n > kMaxElements) return false;
    }
    total += n;
    if (total > kMaxTotal) return false;
  }
  double flops = 0;
  for (const auto& op : g.ops) {
    if (op.kind != tessel::OpKind::Einsum) continue;
    // The flops are the product of the distinct letter sizes (x2), which is at most the
    // product of the operands' element counts: every letter is in some operand.
    double f = 1;
    for (int v : op.inputs) f *= double(tessel::num_elements(g.values[v].shape));
    flops += std::min(f, 1e30);
  }
  return flops <= kMaxFlops;
}

// Tolerance of the max-norm relative error for an output of this dtype. The reference and
// the partitioned run differ only by the order of float additions (partial sums), so the
// error is a few ulps of the largest intermediate, judged against the inputs' scale.
double tolerance(tessel::DType t) {
  switch (t) {
    case tessel::DType::f32: return 1e-4;
    case tessel::DType::f16: return 2e-2;
    case tessel::DType::bf16: return 1e-1;
    case tessel::DType::i32: return 0;
  }
  return 0;
}

bool all_finite_and_moderate(const tessel::HostTensor& t) {
  if (t.dtype() == tessel::DType::i32) return true;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.get(i);
    if (!std::isfinite(v) || std::fabs(v) > 1e4) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tessel::Graph g;
  try {
    g = tessel::parse_graph(text, "<fuzz>");
  } catch (const tessel::Error&) {
    return 0;
  }
  // Round trip: print(parse(print(g))) == print(g).
  const std::string printed = tessel::print_graph(g);
  std::string reprinted;
  try {
    reprinted = tessel::print_graph(tessel::parse_graph(printed, "<printed>"));
  } catch (const tessel::Error& e) {
    tessel_fuzz::law_broken("the printed form of a parsed graph parses", printed + "\n" + e.what());
  }
  if (reprinted != printed)
    tessel_fuzz::law_broken("print(parse(print(g))) == print(g)",
                            "--- first\n" + printed + "--- second\n" + reprinted);

  if (!g.mesh) return 0;
  const tessel::Mesh mesh = *g.mesh;
  if (!small_enough(g, mesh)) return 0;
  std::optional<tessel::Executable> compiled;
  try {
    compiled.emplace(tessel::compile(g, mesh));
  } catch (const tessel::Error&) {
    return 0;
  }
  if (g.outputs.empty()) return 0;
  tessel::Executable& exe = *compiled;

  const uint64_t seed = size * 0x9e3779b97f4a7c15ull + (size ? data[0] : 0);
  const std::vector<tessel::HostTensor> inputs = tessel::random_inputs(g, seed);
  std::vector<tessel::HostTensor> want;
  try {
    want = tessel::run_reference(g, inputs);
  } catch (const tessel::Error&) {
    // The reference refuses the program (e.g. a constant out of the i32 range): the
    // partitioned run must refuse it too, with an Error.
    try {
      exe.run(inputs);
    } catch (const tessel::Error&) {
    }
    return 0;
  }
  tessel::RunOptions ro;
  ro.poison = true;
  ro.check_replicas = true;
  std::vector<tessel::HostTensor> got;
  try {
    got = exe.run(inputs, ro);
  } catch (const tessel::Error& e) {
    tessel_fuzz::law_broken("a program the reference runs also runs partitioned",
                            printed + "\n" + e.what());
  }
  if (got.size() != want.size())
    tessel_fuzz::law_broken("as many outputs as the reference", printed);
  const double scale = tessel::max_abs(inputs);
  for (std::size_t o = 0; o < got.size(); ++o) {
    // Non-finite or large intermediates make reassociation errors unbounded: skip those.
    if (!all_finite_and_moderate(want[o])) continue;
    const tessel::CompareResult c = tessel::compare(got[o], want[o], scale);
    if (c.shape_mismatch || !(c.max_rel_err <= tolerance(want[o].dtype())))
      tessel_fuzz::law_broken("partitioned run == reference",
                              printed + "\noutput #" + std::to_string(o) + ": " + c.to_string() +
                                  "\nseed " + std::to_string(seed));
  }
  return 0;
}
