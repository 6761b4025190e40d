// The interference index (tessel/ir/interference.hpp) against the definitions it restates: on
// lowered programs (the golden graphs, a GPT training step at every ZeRO stage, with offload,
// with collective matmul), interfere(a, b) == !may_share(a, b) for every pair of placed values;
// the memory-plan pass gives exactly the offsets of the plain best-fit scan over every placed
// value (the algorithm it replaced, kept here as the oracle); and the verifier still refuses a
// plan that puts two live values on the same bytes.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/ir/interference.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/train/train_step.hpp"

#include "test_util.hpp"

using namespace tessel;
using tessel_test::partitioned_golden;

namespace {

Program partitioned_train_step(int zero, const char* mesh_text) {
  GptConfig cfg;
  cfg.batch = 4;
  cfg.seq = 16;
  cfg.d_model = 16;
  cfg.heads = 4;
  cfg.layers = 3;
  cfg.vocab = 32;
  const Mesh mesh = Mesh::parse(mesh_text);
  GptGraph m = build_gpt(cfg);
  TrainOptions o;
  o.zero = zero;
  add_train_step(m.graph, m.loss, m.weights, mesh, o);
  PropagationResult prop = propagate(m.graph, mesh);
  return partition(m.graph, mesh, prop);
}

struct Case {
  std::string name;
  Program lowered;
};

// Lowered programs of every shape the pipeline makes: two streams, waits, starts and dones,
// views, several results per kernel, host memory, rings of permutes.
std::vector<Case> lowered_programs() {
  std::vector<Case> cases;
  for (const char* name : {"dp_mlp", "megatron_mlp", "transformer_block_2d", "distributed_reductions"})
    cases.push_back({name, lower_program(partitioned_golden(name), true)});
  for (int zero : {0, 1, 2, 3})
    cases.push_back({fmt::format("gpt train step zero={}", zero), lower_program(partitioned_train_step(zero, "data=2,model=2"), true)});
  ProgramPassOptions offload;
  offload.offload_min_bytes = 256;
  offload.offload_min_gap = 8;
  offload.offload_prefetch = 2;
  cases.push_back({"gpt train step with offload", lower_program(partitioned_train_step(3, "data=2,model=2"), true, offload)});
  ProgramPassOptions ring;
  ring.collective_matmul.mode = OverlapMode::On;
  cases.push_back({"gpt train step with collective matmul", lower_program(partitioned_train_step(0, "data=1,model=4"), true, ring)});
  return cases;
}

// The values the memory plan places: defined by an instruction, not views, not outputs.
std::vector<int> placed_values(const Program& p) {
  std::vector<bool> output(p.values.size(), false);
  for (int v : p.outputs) output[static_cast<std::size_t>(v)] = true;
  std::vector<int> placed;
  for (const Instr& in : p.instrs)
    if (in.kind != InstrKind::View)
      for (int d : in.defs())
        if (!output[static_cast<std::size_t>(d)]) placed.push_back(d);
  return placed;
}

// The memory plan as it was before the index: largest first (ties in definition order), each
// value at the lowest offset of the smallest gap between the placed values it may not share
// bytes with, found by asking may_share of every placed value.
std::vector<int64_t> scan_plan(const Program& p) {
  const Liveness L = compute_liveness(p);
  std::vector<int64_t> offset(p.values.size(), -1);
  std::vector<std::pair<int, int64_t>> items[2];
  for (int v : placed_values(p)) {
    const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
    items[lv.host ? 1 : 0].push_back({v, (lv.bytes() + 63) / 64 * 64});
  }
  for (auto& pool : items) {
    std::stable_sort(pool.begin(), pool.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::vector<std::pair<int, int64_t>> placed;
    for (const auto& [v, bytes] : pool) {
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (const auto& [w, wb] : placed)
        if (!L.may_share(v, w)) busy.emplace_back(offset[static_cast<std::size_t>(w)], offset[static_cast<std::size_t>(w)] + wb);
      std::sort(busy.begin(), busy.end());
      int64_t best = -1, best_gap = 0, cursor = 0;
      for (const auto& [b, e] : busy) {
        if (b - cursor >= bytes && (best < 0 || b - cursor < best_gap)) {
          best = cursor;
          best_gap = b - cursor;
        }
        cursor = std::max(cursor, e);
      }
      offset[static_cast<std::size_t>(v)] = best < 0 ? cursor : best;
      placed.push_back({v, bytes});
    }
  }
  return offset;
}

}  // namespace

TEST_CASE("interference: interfere is exactly !may_share on every pair of placed values", "[program-ir][memory-plan]") {
  int64_t interfering = 0, sharing = 0;
  for (const Case& c : lowered_programs()) {
    INFO(c.name);
    const Liveness L = compute_liveness(c.lowered);
    const Interference index(L, static_cast<int>(c.lowered.instrs.size()));
    const std::vector<int> placed = placed_values(c.lowered);
    int mismatches = 0;
    for (int a : placed)
      for (int b : placed) {
        if (a == b) continue;
        mismatches += index.interfere(a, b) == L.may_share(a, b) ? 1 : 0;
        (index.interfere(a, b) ? interfering : sharing) += 1;
      }
    CHECK(mismatches == 0);
  }
  // Both answers occur, many times.
  CHECK(interfering > 1000);
  CHECK(sharing > 1000);
}

TEST_CASE("interference: the busy bytes of a value are the union of those of the added values it interferes with",
          "[program-ir][memory-plan]") {
  for (const Case& c : lowered_programs()) {
    INFO(c.name);
    const Program& p = c.lowered;
    const Liveness L = compute_liveness(p);
    Interference index(L, static_cast<int>(p.instrs.size()));
    // Every placed value at a byte range of its own, added in reverse definition order; each
    // is asked about before it is added.
    std::vector<int> placed = placed_values(p);
    std::reverse(placed.begin(), placed.end());
    std::vector<std::pair<int64_t, int64_t>> range(p.values.size());
    std::vector<int> added;
    for (std::size_t k = 0; k < placed.size(); ++k) {
      const int v = placed[k];
      const int64_t begin = static_cast<int64_t>(k % 7) * 64;
      range[static_cast<std::size_t>(v)] = {begin, begin + 64 * static_cast<int64_t>(1 + k % 3)};
      // The bytes each byte position is covered by, both ways.
      std::vector<bool> want(1024, false), got(1024, false);
      for (int w : added)
        if (!L.may_share(v, w))
          for (int64_t b = range[static_cast<std::size_t>(w)].first; b < range[static_cast<std::size_t>(w)].second; ++b)
            want[static_cast<std::size_t>(b)] = true;
      index.for_each_busy(v, [&](int64_t b, int64_t e) {
        for (; b < e; ++b) got[static_cast<std::size_t>(b)] = true;
      });
      CHECK(got == want);
      for (int64_t b = 0; b < 1024; b += 32)
        CHECK(index.overlaps(v, b, b + 32) == std::any_of(want.begin() + b, want.begin() + b + 32, [](bool x) { return x; }));
      index.add(v, range[static_cast<std::size_t>(v)].first, range[static_cast<std::size_t>(v)].second);
      added.push_back(v);
    }
  }
}

TEST_CASE("memory-plan: the indexed best fit places every value where the scan over all placed values did",
          "[program-ir][memory-plan]") {
  for (const Case& c : lowered_programs()) {
    INFO(c.name);
    CHECK(c.lowered.memory_plan().offset == scan_plan(c.lowered));
  }
}

TEST_CASE("verifier: a plan that puts two live values on the same bytes is refused",
          "[program-ir][memory-plan]") {
  Program p = lower_program(partitioned_train_step(2, "data=2,model=2"), true);
  const Liveness L = compute_liveness(p);
  const std::vector<int> placed = placed_values(p);
  // Move the last placed value onto the bytes of the first one it interferes with.
  const int v = placed.back();
  int w = -1;
  for (int u : placed)
    if (u != v && !L.may_share(u, v)) {
      w = u;
      break;
    }
  REQUIRE(w >= 0);
  p.memory.offset[static_cast<std::size_t>(v)] = p.memory.offset[static_cast<std::size_t>(w)];
  p.memory.arena_bytes = std::max(p.memory.arena_bytes, p.memory.offset[static_cast<std::size_t>(w)] +
                                                            p.values[static_cast<std::size_t>(v)].bytes());
  try {
    verify_program(p);
    FAIL("the verifier accepted two live values on the same bytes");
  } catch (const ProgramError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("overlaps") != std::string::npos);
    CHECK(msg.find("while both are live") != std::string::npos);
  }
}
