// Property test of the combine-collectives pass on random programs: interleaved all-reduces
// over two axis groups with two reduce ops, operands of several ranks, random dependences
// between them (chains through kernels), random thresholds. The result must verify, never
// have more all-reduces or different bytes, and compute the same values as the input program
// on every device (a small interpreter of the kinds involved runs both).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"

using namespace tessel;

namespace {

// Runs the program on the 4 devices of mesh x=2, y=2 (position = 2*x + y).
std::vector<std::vector<std::vector<float>>> interpret(const Program& p) {
  const std::size_t nv = p.values.size();
  std::vector<std::vector<std::vector<float>>> val(4, std::vector<std::vector<float>>(nv));
  for (int d = 0; d < 4; ++d)
    for (std::size_t k = 0; k < p.inputs.size(); ++k) {
      const LocalValue& lv = p.values[static_cast<std::size_t>(p.inputs[k])];
      auto& v = val[static_cast<std::size_t>(d)][static_cast<std::size_t>(p.inputs[k])];
      for (int64_t e = 0; e < num_elements(lv.shape); ++e) v.push_back(0.1f * static_cast<float>(d + 1) + 0.01f * static_cast<float>(e + 7 * k));
    }
  for (const Instr& in : p.instrs) {
    const std::size_t o = static_cast<std::size_t>(in.out);
    const int64_t n = num_elements(p.values[o].shape);
    for (int d = 0; d < 4; ++d) {
      auto& V = val[static_cast<std::size_t>(d)];
      auto arg = [&](std::size_t j) -> const std::vector<float>& { return V[static_cast<std::size_t>(in.in[j])]; };
      std::vector<float> r;
      switch (in.kind) {
        case InstrKind::Kernel:
          if (in.op == OpKind::Add) {
            for (int64_t e = 0; e < n; ++e) r.push_back(arg(0)[static_cast<std::size_t>(e)] + arg(1)[static_cast<std::size_t>(e)]);
          } else if (in.op == OpKind::Tanh) {
            for (float x : arg(0)) r.push_back(std::tanh(x));
          } else if (in.op == OpKind::Concat) {
            for (std::size_t j = 0; j < in.in.size(); ++j) r.insert(r.end(), arg(j).begin(), arg(j).end());
          } else {
            FAIL("unexpected kernel " << op_name(in.op));
          }
          break;
        case InstrKind::View: {
          const auto& src = arg(0);
          const std::size_t at = static_cast<std::size_t>(in.view_offset / 4);
          r.assign(src.begin() + static_cast<std::ptrdiff_t>(at), src.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(n)));
          break;
        }
        case InstrKind::Copy:
          REQUIRE(in.copies.size() == 1);
          REQUIRE(in.block == p.values[o].shape);
          r = arg(0);
          break;
        case InstrKind::Collective: {
          REQUIRE(in.collective == CollectiveKind::AllReduce);
          const bool over_x = in.axes == std::vector<std::string>{"x"};
          const int peer = over_x ? (d + 2) % 4 : (d ^ 1);
          const auto& a = arg(0);
          const auto& b = val[static_cast<std::size_t>(peer)][static_cast<std::size_t>(in.in[0])];
          for (std::size_t e = 0; e < a.size(); ++e)
            r.push_back(in.reduce == ReduceOp::Max ? std::max(a[e], b[e]) : a[e] + b[e]);
          break;
        }
        default: FAIL("unexpected instruction kind");
      }
      REQUIRE(static_cast<int64_t>(r.size()) == n);
      V[o] = std::move(r);
    }
  }
  std::vector<std::vector<std::vector<float>>> outs(4);
  for (int d = 0; d < 4; ++d)
    for (int v : p.outputs) outs[static_cast<std::size_t>(d)].push_back(val[static_cast<std::size_t>(d)][static_cast<std::size_t>(v)]);
  return outs;
}

std::string random_program(std::mt19937_64& rng) {
  const std::vector<std::string> types = {"f32[4]", "f32[2,2]", "f32[]", "f32[3]"};
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::string s = "mesh x=2, y=2\n";
  std::vector<std::pair<std::string, std::size_t>> vals;  // name, type
  for (std::size_t t = 0; t < types.size(); ++t) {
    const std::string name = fmt::format("in{}", t);
    const std::string sh = t == 1 ? "[{}, {}]" : t == 2 ? "[]" : "[{}]";
    s += fmt::format("%{} = input {} global={} sharding={}\n", name, types[t], types[t], sh);
    vals.emplace_back(name, t);
  }
  const int n = 6 + static_cast<int>(pick(20));
  std::vector<std::string> reduced;
  for (int i = 0; i < n; ++i) {
    const auto& [a, t] = vals[pick(vals.size())];
    const std::string ty = types[t];
    const std::string sh = t == 1 ? "[{}, {}]" : t == 2 ? "[]" : "[{}]";
    const std::string name = fmt::format("v{}", i);
    const std::size_t what = pick(10);
    if (what < 5) {
      const std::string axes = pick(3) == 0 ? "{y}" : "{x}";
      const std::string op = pick(4) == 0 ? " op=max" : "";
      s += fmt::format("%{} = all_reduce(%{}) axes={}{} bytes={} : {} global={} sharding={} @compute\n", name, a, axes, op,
                       t == 1 || t == 0 ? 16 : t == 2 ? 4 : 12, ty, ty, sh);
      reduced.push_back(name);
    } else if (what < 8) {
      s += fmt::format("%{} = tanh(%{}) : {} global={} sharding={} @compute\n", name, a, ty, ty, sh);
    } else {
      // add of two values of the same type
      std::vector<std::string> same;
      for (const auto& [b, u] : vals)
        if (u == t) same.push_back(b);
      s += fmt::format("%{} = add(%{}, %{}) : {} global={} sharding={} @compute\n", name, a, same[pick(same.size())], ty, ty, sh);
    }
    vals.emplace_back(name, t);
  }
  // Outputs: some all-reduce results directly, and the last few values.
  std::vector<std::string> outs;
  for (const auto& r : reduced)
    if (pick(3) == 0) outs.push_back("%" + r);
  for (std::size_t k = vals.size() >= 3 ? vals.size() - 3 : 0; k < vals.size(); ++k)
    if (std::find(outs.begin(), outs.end(), "%" + vals[k].first) == outs.end()) outs.push_back("%" + vals[k].first);
  s += "output ";
  for (std::size_t k = 0; k < outs.size(); ++k) s += (k ? ", " : "") + outs[k];
  return s + "\n";
}

int all_reduces(const Program& p) { return p.summary().all_reduce; }

}  // namespace

TEST_CASE("property: combine-collectives keeps random programs valid and their values", "[program-ir][combine]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(300);
  tessel_test::announce("property: combine-collectives keeps random programs valid and their values", seed, cases);
  std::mt19937_64 rng(seed);
  int merged = 0;
  for (int c = 0; c < cases; ++c) {
    const std::string text = random_program(rng);
    const int64_t threshold = std::vector<int64_t>{16, 28, 40, 1 << 20}[rng() % 4];
    INFO("seed " << seed << " case " << c << " threshold " << threshold << "\n" << text);
    Program p = parse_program(text, "random.pir");
    Program q = combine_collectives_pass(p, threshold);
    INFO("combined:\n" << print_program(q));
    verify_program(q);
    CHECK(all_reduces(q) <= all_reduces(p));
    CHECK(q.summary().bytes == p.summary().bytes);
    if (all_reduces(q) < all_reduces(p)) ++merged;
    for (const Instr& in : q.instrs)
      if (in.kind == InstrKind::Collective) CHECK(q.values[static_cast<std::size_t>(in.in[0])].bytes() <= std::max<int64_t>(threshold, 16));
    const auto want = interpret(p), got = interpret(q);
    for (std::size_t d = 0; d < 4; ++d)
      for (std::size_t o = 0; o < want[d].size(); ++o) CHECK(got[d][o] == want[d][o]);
    // The text of the result parses back to itself.
    CHECK(print_program(parse_program(print_program(q))) == print_program(q));
  }
  // The generator does produce combinable programs.
  CHECK(merged > cases / 4);
}

TEST_CASE("combine-collectives refuses a program with async collectives", "[program-ir][combine]") {
  Program p = parse_program(
      "mesh x=2\n%a = input f32[4] global=f32[4] sharding=[{}]\n"
      "%b = all_reduce_start(%a) axes={x} bytes=16 : f32[4] global=f32[4] sharding=[{}] @comm\n"
      "done %b @comm\noutput %b\n");
  CHECK_THROWS_WITH(combine_collectives_pass(p), Catch::Contains("#0 (%b = all_reduce_start)") &&
                                                    Catch::Contains("before it"));
}

TEST_CASE("combine-collectives: a ZeRO-2 step's reduce-scatters and all-gathers combine with the same values",
          "[program-ir][combine]") {
  const uint64_t seed = tessel_test::seed();
  GptConfig cfg;  // a small model: the gradients are a large share of the peak
  cfg.batch = 4, cfg.seq = 16, cfg.d_model = 32, cfg.heads = 2, cfg.layers = 2, cfg.vocab = 64;
  GptGraph m = build_gpt(cfg);
  const Mesh mesh = Mesh::parse("data=2,model=1");
  TrainOptions to;
  to.zero = 2;
  add_train_step(m.graph, m.loss, m.weights, mesh, to);
  const Executable exe = compile(m.graph, mesh);
  std::vector<HostTensor> host = random_inputs(m.graph, seed);
  gpt_init(m.graph, host);
  ThreadRuntime rt(2);
  LoadOptions apart;
  apart.lowering.combine_threshold_bytes = 0;  // every collective on its own
  LoadedExecutable separate = load(exe, rt, apart), combined = load(exe, rt);
  const CollectiveSummary s0 = separate.program().summary(), s1 = combined.program().summary();
  INFO("seed " << seed << "; separate: " << s0.line() << "; combined: " << s1.line());
  CHECK(s1.reduce_scatter < s0.reduce_scatter);
  CHECK(s1.reduce_scatter >= 1);
  CHECK(s1.all_gather < s0.all_gather);
  CHECK(s1.bytes == s0.bytes);
  // The span keeps the gradients from living much longer than the uncombined program lets them.
  const int64_t p0 = separate.program().memory_plan().peak_bytes(), p1 = combined.program().memory_plan().peak_bytes();
  INFO("planned peak: separate " << p0 << ", combined " << p1);
  CHECK(p1 <= p0 + p0 / 100);
  auto run = [&](LoadedExecutable& prog) {
    std::vector<ShardedArray> in;
    for (std::size_t i = 0; i < host.size(); ++i) in.push_back(prog.to_device(i, host[i]));
    RunResult r = prog.run(in);
    std::vector<HostTensor> out;
    for (const ShardedArray& a : r.outputs) out.push_back(prog.to_host(a));
    return out;
  };
  const std::vector<HostTensor> a = run(separate), b = run(combined);
  REQUIRE(a.size() == b.size());
  for (std::size_t o = 0; o < a.size(); ++o) {
    INFO("output " << separate.output_names()[o]);
    REQUIRE(a[o].shape() == b[o].shape());
    for (int64_t e = 0; e < num_elements(a[o].shape()); ++e) REQUIRE(a[o].get(e) == b[o].get(e));
  }
}
