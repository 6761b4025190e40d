// src/passes/memory_plan.cpp — the memory-plan pass (program_passes.hpp): every intermediate
// value gets an offset in one arena per device, from the live ranges the verifier also uses
// (compute_liveness), so the peak bytes per device are known before anything runs.
#include "tessel/passes/program_passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "tessel/ir/interference.hpp"
#include "tessel/ir/program_verify.hpp"

namespace tessel {

Program memory_plan_pass(Program p) {
  const std::size_t nv = p.values.size();
  MemoryPlan m;
  m.planned = true;
  m.offset.assign(nv, -1);
  std::vector<bool> external(nv, false), counted(nv, false);
  for (int v : p.inputs) {
    external[static_cast<std::size_t>(v)] = true;
    if (!counted[static_cast<std::size_t>(v)]) m.input_bytes += p.values[static_cast<std::size_t>(v)].bytes();
    counted[static_cast<std::size_t>(v)] = true;
  }
  for (int v : p.outputs) {
    external[static_cast<std::size_t>(v)] = true;
    if (!counted[static_cast<std::size_t>(v)]) m.output_bytes += p.values[static_cast<std::size_t>(v)].bytes();
    counted[static_cast<std::size_t>(v)] = true;
  }
  p.memory = {};  // liveness does not depend on the plan
  const Liveness L = compute_liveness(p);
  struct Item {
    int v;
    int64_t bytes;
  };
  // Two pools: the device arena, and the host pool of offloaded values (LocalValue::host).
  std::vector<Item> items[2];
  for (const Instr& in : p.instrs) {
    if (in.kind == InstrKind::View) continue;
    for (int d : in.defs())
      if (!external[static_cast<std::size_t>(d)])
        items[p.values[static_cast<std::size_t>(d)].host ? 1 : 0].push_back(
            {d, (p.values[static_cast<std::size_t>(d)].bytes() + 63) / 64 * 64});
  }
  for (int pool = 0; pool < 2; ++pool) {
    int64_t& size = pool == 0 ? m.arena_bytes : m.host_bytes;
    // Largest first; stable, so ties keep definition order.
    std::stable_sort(items[pool].begin(), items[pool].end(), [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
    // The bytes of the placed values, by when they are live: the busy bytes of the next value
    // come as a few unions of ranges instead of a scan of every placed value (interference.hpp).
    Interference placed(L, static_cast<int>(p.instrs.size()));
    std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of placed values live with v
    for (const Item& it : items[pool]) {
      busy.clear();
      placed.for_each_busy(it.v, [&](int64_t b, int64_t e) { busy.emplace_back(b, e); });
      std::sort(busy.begin(), busy.end());
      // Best fit: the smallest gap that holds it, the lowest such; else after them all. (The
      // gaps between the unions' ranges are those between the values' own: a value has at
      // least one element, so a gap narrower than one byte never holds it.)
      int64_t best = -1, best_gap = 0, cursor = 0;
      for (const auto& [b, e] : busy) {
        if (b - cursor >= it.bytes && (best < 0 || b - cursor < best_gap)) {
          best = cursor;
          best_gap = b - cursor;
        }
        cursor = std::max(cursor, e);
      }
      if (best < 0) best = cursor;
      m.offset[static_cast<std::size_t>(it.v)] = best;
      size = std::max(size, best + it.bytes);
      placed.add(it.v, best, best + it.bytes);
    }
  }
  p.memory = std::move(m);
  return p;
}

}  // namespace tessel
