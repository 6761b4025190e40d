// collective-matmul end to end: random meshes, shapes, gathered operands and ring dims (free,
// batch, contracted; all-gather → einsum and einsum → reduce-scatter), unidirectional and
// bidirectional rings: the overlapped program == the program without the pass == the
// unpartitioned reference, every element, outputs poisoned first; and the rewritten program
// really has the ring (its all-gather / reduce-scatter replaced by permutes).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/passes/collective_matmul.hpp"
#include "../unit/test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

using tessel_test::guarded;

// A site pattern: the graph text (with {n} ring devices over {ring}), and what it must become.
struct Pattern {
  const char* name;
  bool gather;
  // fmt arguments: mesh, ring axes, c (chunk), n (ring size), b, d, f
  const char* text;
};

const Pattern kPatterns[] = {
    {"gather free dim, gathered operand first", true, R"(
mesh {mesh}
%x = input f32[{b},{s},{d}] sharding=[{{}}, {{{ring}}}, {{}}]
%w = input f32[{d},{f}] sharding=[{{}}, {{{ring}}}]
%y = einsum(%x, %w) eq="bsd,df->bsf" sharding=[{{}}, {{}}, {{{ring}}}]
output %y
)"},
    {"gather free dim, gathered operand second", true, R"(
mesh {mesh}
%x = input f32[{s},{d}] sharding=[{{{ring}}}, {{}}]
%w = input f32[{f},{d}] sharding=[{{{ring}}}, {{}}]
%y = einsum(%w, %x) eq="fd,sd->fs" sharding=[{{{ring}}}, {{}}]
output %y
)"},
    {"gather batch dim", true, R"(
mesh {mesh}
%x = input f32[{s},{b},{d}] sharding=[{{{ring}}}, {{}}, {{}}]
%w = input f32[{s},{d},{f}] sharding=[{{}}, {{}}, {{{ring}}}]
%y = einsum(%x, %w) eq="sbd,sdf->sbf" sharding=[{{}}, {{}}, {{{ring}}}]
output %y
)"},
    {"gather contracted dim", true, R"(
mesh {mesh}
%x = input f32[{b},{s}] sharding=[{{}}, {{{ring}}}]
%w = input f32[{s},{f}] sharding=[{{}}, {{{ring}}}]
%y = einsum(%x, %w) eq="bs,sf->bf" sharding=[{{}}, {{{ring}}}]
output %y
)"},
    {"scatter free dim", false, R"(
mesh {mesh}
%x = input f32[{b},{s},{f}] sharding=[{{}}, {{}}, {{{ring}}}]
%w = input f32[{f},{d}] sharding=[{{{ring}}}, {{}}]
%y = einsum(%x, %w) eq="bsf,fd->bsd" sharding=[{{}}, {{{ring}}}, {{}}]
output %y
)"},
    {"scatter batch dim", false, R"(
mesh {mesh}
%x = input f32[{s},{b},{f}] sharding=[{{}}, {{}}, {{{ring}}}]
%w = input f32[{s},{f},{d}] sharding=[{{}}, {{{ring}}}, {{}}]
%y = einsum(%x, %w) eq="sbf,sfd->sbd" sharding=[{{{ring}}}, {{}}, {{}}]
output %y
)"},
};

struct MeshChoice {
  const char* mesh;
  const char* ring;
  int n;
};
const MeshChoice kMeshes[] = {{"model=2", "model", 2},       {"model=3", "model", 3},
                              {"model=4", "model", 4},       {"data=2, model=2", "model", 2},
                              {"data=2, model=3", "data", 2}, {"data=2, model=2", "data, model", 4}};

}  // namespace

TEST_CASE("collective-matmul: overlapped == not overlapped == reference over random sites", "[integration][collective_matmul]") {
  // TESSEL_SEED / TESSEL_CASES as every seeded test (tests/unit/test_util.hpp).
  const uint64_t seed = tessel_test::seed();
  const int trials = std::max(1, tessel_test::cases(3));
  tessel_test::announce("collective-matmul: overlapped == not overlapped == reference (trials per pattern)", seed,
                        trials);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int rings = 0;
  for (const Pattern& pat : kPatterns) {
    for (int trial = 0; trial < trials; ++trial) {
      const MeshChoice& m = kMeshes[pick(0, static_cast<int>(std::size(kMeshes)) - 1)];
      const int c = pick(1, 4);
      const int64_t s = static_cast<int64_t>(c) * m.n;
      const int b = pick(1, 3), d = pick(1, 5) , f = m.n * pick(1, 3);
      // Contracted/scattered and weight dims must split over the ring too.
      const std::string text = fmt::format(pat.text, fmt::arg("mesh", m.mesh), fmt::arg("ring", m.ring), fmt::arg("s", s),
                                           fmt::arg("b", b), fmt::arg("d", d * m.n), fmt::arg("f", f));
      const RingDirection dir = pick(0, 1) ? RingDirection::Bi : RingDirection::Uni;
      INFO(pat.name << " on mesh " << m.mesh << " ring {" << m.ring << "} chunk " << c << " direction "
                    << (dir == RingDirection::Bi ? "bi" : "uni") << "\n" << text);
      Graph g = parse_graph(text, "site.tsl");
      Executable exe = compile(g, *g.mesh);
      const auto sites = collective_matmul_sites(exe.program());
      bool found = false;
      for (const auto& st : sites) found = found || (st.gather == pat.gather && st.before_s > 0);
      INFO(print_program(exe.program()));
      REQUIRE(found);

      const StreamMode mode = pick(0, 1) ? StreamMode::Async : StreamMode::Eager;
      ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
      ThreadRuntime rt(exe.mesh().num_devices(), ro);
      LoadOptions off, on;
      off.lowering.collective_matmul.mode = OverlapMode::Off;
      on.lowering.collective_matmul.mode = OverlapMode::On;
      on.lowering.collective_matmul.direction = dir;
      LoadedExecutable plain = load(exe, rt, off);
      LoadedExecutable ring = load(exe, rt, on);
      const CollectiveSummary s0 = plain.program().summary(), s1 = ring.program().summary();
      INFO("plain: " << s0.line() << "\nring: " << s1.line() << "\n" << print_program(ring.program()));
      if (pat.gather) CHECK(s1.all_gather < s0.all_gather);
      else CHECK(s1.reduce_scatter < s0.reduce_scatter);
      CHECK(s1.collective_permute >= s0.collective_permute + (m.n - 1));
      verify_program(ring.program());
      // The lowered text parses back to the same program.
      CHECK(print_program(parse_program(print_program(ring.program()), "ring.pir")) == print_program(ring.program()));
      ++rings;

      const uint64_t input_seed = rng();
      const auto inputs = random_inputs(g, input_seed);
      const auto want = run_reference(g, inputs);
      for (LoadedExecutable* le : {&plain, &ring}) {
        std::vector<ShardedArray> arrays;
        for (std::size_t i = 0; i < inputs.size(); ++i) arrays.push_back(le->to_device(i, inputs[i]));
        RunOptions opts;
        opts.poison = true;
        RunResult r = guarded(pat.name, [&] { return le->run(arrays, opts); });
        REQUIRE(r.outputs.size() == want.size());
        CompareResult cmp = compare(le->to_host(r.outputs[0], /*check_replicas=*/true), want[0]);
        INFO((le == &ring ? "ring" : "plain") << ": " << cmp.to_string());
        CHECK(cmp.max_rel_err <= 1e-5);
      }
    }
  }
  CHECK(rings == trials * static_cast<int>(std::size(kPatterns)));
}

TEST_CASE("collective-matmul: the gate keeps small sites and takes large ones", "[integration][collective_matmul]") {
  const std::string small = R"(
mesh model=4
%x = input f32[2,8,16] sharding=[{}, {model}, {}]
%w = input f32[16,8] sharding=[{}, {model}]
%y = einsum(%x, %w) eq="bsd,df->bsf" sharding=[{}, {}, {model}]
output %y
)";
  const std::string large = R"(
mesh model=4
%x = input f32[8,2048,4096] sharding=[{}, {model}, {}]
%w = input f32[4096,16384] sharding=[{}, {model}]
%y = einsum(%x, %w) eq="bsd,df->bsf" sharding=[{}, {}, {model}]
output %y
)";
  for (const auto& [text, want] : {std::pair{small, RingVariant::None}, std::pair{large, RingVariant::Uni}}) {
    Graph g = parse_graph(text, "gate.tsl");
    Executable exe = compile(g, *g.mesh);
    CollectiveMatmulOptions o;  // H100 figures, 450 GB/s links
    const auto sites = collective_matmul_sites(exe.program(), o);
    REQUIRE(sites.size() == 1);
    INFO(sites[0].line());
    CHECK(sites[0].variant == want);
    CHECK(sites[0].before_s > 0);
    CHECK(sites[0].uni_s > 0);
    if (want == RingVariant::None) {
      CHECK(sites[0].reason.find("latency") != std::string::npos);
      // Off keeps the program; the default pipeline leaves the small site alone.
      CHECK(print_program(collective_matmul_pass(exe.program(), o)) == print_program(exe.program()));
    } else {
      // Compute-bound steps: the bidirectional ring hides no more, and runs more instructions
      // (the chunk's halves, two einsums a step), each paying the dispatch cost.
      CHECK(sites[0].uni_s < sites[0].before_s);
      CHECK(sites[0].bi_s > sites[0].uni_s);
      CHECK(sites[0].bi_instrs > sites[0].uni_instrs);
    }
    o.mode = OverlapMode::Off;
    CHECK(print_program(collective_matmul_pass(exe.program(), o)) == print_program(exe.program()));
  }
}

TEST_CASE("collective-matmul: a gathered value with other readers is declined with the reason", "[integration][collective_matmul]") {
  Graph g = parse_graph(R"(
mesh model=2
%x = input f32[4,8] sharding=[{model}, {}]
%w = input f32[8,4] sharding=[{}, {model}]
%y = einsum(%x, %w) eq="sd,df->sf" sharding=[{}, {model}]
%z = einsum(%x, %w) eq="sd,df->sf" sharding=[{}, {model}]
output %y, %z
)", "two_readers.tsl");
  Executable exe = compile(g, *g.mesh);
  CollectiveMatmulOptions on;
  on.mode = OverlapMode::On;
  const auto sites = collective_matmul_sites(exe.program(), on);
  INFO(print_program(exe.program()));
  bool declined = false;
  for (const auto& s : sites) declined = declined || s.reason.find("other readers") != std::string::npos;
  // Either the partitioner gathered %x once for both einsums (declined, with the reason), or
  // once per einsum (each a site of its own).
  const CollectiveSummary sum = exe.program().summary();
  if (sum.all_gather == 1) CHECK(declined);
  // Whatever was decided, forced on the program still runs and verifies.
  ProgramPassOptions po;
  po.collective_matmul = on;
  verify_program(lower_program(exe.program(), true, po));
}

TEST_CASE("collective-matmul: a program with started collectives is refused", "[integration][collective_matmul]") {
  Graph g = parse_graph(R"(
mesh model=2
%x = input f32[4,8] sharding=[{model}, {}]
%w = input f32[8,4] sharding=[{}, {model}]
%y = einsum(%x, %w) eq="sd,df->sf" sharding=[{}, {model}]
output %y
)", "started.tsl");
  Executable exe = compile(g, *g.mesh);
  const Program lowered = lower_program(exe.program());
  CollectiveMatmulOptions on;
  on.mode = OverlapMode::On;
  CHECK_THROWS_WITH(collective_matmul_pass(lowered, on), Catch::Contains("before async-collectives"));
}

TEST_CASE("collective-matmul: lowered rings wait for each chunk before the next transfer starts", "[integration][collective_matmul]") {
  // Every pattern, uni and bi, lowered by the default pipeline (fuse-elementwise included):
  // - every transfer a wait of compute for comm covers is read on compute before the next
  //   transfer starts (a wait covers everything enqueued on comm so far: had it covered the
  //   next step's transfer, this step's einsum would wait for that one too);
  // - no fused_einsum reads a received value (the step's product would wait for the transfer).
  int checked = 0;
  for (const Pattern& pat : kPatterns)
    for (const MeshChoice& m : {kMeshes[2], kMeshes[5]})
      for (RingDirection dir : {RingDirection::Uni, RingDirection::Bi}) {
        const std::string text = fmt::format(pat.text, fmt::arg("mesh", m.mesh), fmt::arg("ring", m.ring),
                                             fmt::arg("s", 4 * m.n), fmt::arg("b", 2), fmt::arg("d", 3 * m.n),
                                             fmt::arg("f", 2 * m.n));
        Graph g = parse_graph(text, "site.tsl");
        Executable exe = compile(g, *g.mesh);
        ProgramPassOptions po;
        po.collective_matmul.mode = OverlapMode::On;
        po.collective_matmul.direction = dir;
        const Program low = lower_program(exe.program(), true, po);
        INFO(pat.name << " on " << m.mesh << (dir == RingDirection::Bi ? " bi" : " uni") << "\n" << print_program(low));
        std::vector<int> covered;  // transfers covered by a wait of compute for comm, not read yet
        std::vector<int> started;  // transfers started since the last such wait
        std::vector<bool> received(low.values.size(), false);
        int permutes = 0;
        const auto check_covered = [&] {
          for (int v : covered) {
            INFO("compute waited for the transfer of %" << low.values[static_cast<std::size_t>(v)].name
                                                     << " and the next transfer starts before compute reads it");
            CHECK(false);
          }
        };
        for (const Instr& in : low.instrs) {
          if (in.kind == InstrKind::CollectiveStart && in.collective == CollectiveKind::CollectivePermute) {
            check_covered();
            covered.clear();
            started.push_back(in.out);
            received[static_cast<std::size_t>(in.out)] = true;
            ++permutes;
          } else if (in.kind == InstrKind::Wait && in.stream == "compute" && in.wait_for == "comm") {
            covered.insert(covered.end(), started.begin(), started.end());
            started.clear();
          } else if (in.stream == "compute") {
            for (int v : in.in) covered.erase(std::remove(covered.begin(), covered.end(), v), covered.end());
            if (in.kind == InstrKind::Kernel && in.op == OpKind::FusedEinsum)
              for (int v : in.in) CHECK_FALSE(received[static_cast<std::size_t>(v)]);
          }
        }
        check_covered();
        CHECK(permutes >= m.n - 1);
        ++checked;
      }
  CHECK(checked == 2 * 2 * static_cast<int>(std::size(kPatterns)));
}
