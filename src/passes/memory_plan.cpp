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

std::vector<int> input_last_use(const Program& p) {
  const std::size_t nv = p.values.size(), n = p.instrs.size();
  std::vector<int> input_of(nv, -1), root(nv), done_at(nv, -1);
  for (std::size_t i = 0; i < p.inputs.size(); ++i) input_of[static_cast<std::size_t>(p.inputs[i])] = static_cast<int>(i);
  for (std::size_t v = 0; v < nv; ++v) root[v] = static_cast<int>(v);
  for (std::size_t j = 0; j < n; ++j)  // an async collective reads its operand until its done
    if (p.instrs[j].kind == InstrKind::CollectiveDone && !p.instrs[j].in.empty())
      done_at[static_cast<std::size_t>(p.instrs[j].in[0])] = static_cast<int>(j);
  std::vector<int> last(p.inputs.size(), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind == InstrKind::View) root[static_cast<std::size_t>(in.out)] = root[static_cast<std::size_t>(in.in[0])];
    int until = static_cast<int>(i);
    if (in.kind == InstrKind::CollectiveStart && done_at[static_cast<std::size_t>(in.out)] > until)
      until = done_at[static_cast<std::size_t>(in.out)];
    for (int v : in.in) {
      const int r = input_of[static_cast<std::size_t>(root[static_cast<std::size_t>(v)])];
      if (r >= 0) last[static_cast<std::size_t>(r)] = std::max(last[static_cast<std::size_t>(r)], until);
    }
  }
  return last;
}

namespace {
// Whether kernel `in` may write its result `v` over its operand `dv` (read by nobody later):
// the kernel reads every element of that operand before it writes the same element of the
// result. A fused elementwise kernel does, block by block, for any operand of the result's
// shape (cpu_fused.cpp); adamw does, element by element, for the result's own operand (the
// parameter, m or v into their updated values: cpu_kernels_optim.cpp, src/runtime/cuda/kernels/optim.cu);
// write_at over its dst.
bool in_place(const Instr& in, int v, int dv, const Program& p) {
  if (in.kind != InstrKind::Kernel || p.values[static_cast<std::size_t>(dv)].shape != p.values[static_cast<std::size_t>(v)].shape)
    return false;
  if (in.op == OpKind::FusedElementwise) return std::find(in.in.begin(), in.in.end(), dv) != in.in.end();
  // write_at (cpu_kernels_index.cpp, src/runtime/cuda/kernels/index.cu) over its dst: then it
  // copies nothing and writes only the indexed rows, reading the indices and values alone.
  if (in.op == OpKind::WriteAt) return !in.in.empty() && in.in[0] == dv;
  if (in.op == OpKind::AdamW) {  // results (p, m, v) from operands (p, g, m, v, ...)
    const std::vector<int> defs = in.defs();
    const std::size_t operand_of[3] = {0, 2, 3};
    for (std::size_t r = 0; r < defs.size() && r < 3; ++r)
      if (defs[r] == v) return operand_of[r] < in.in.size() && in.in[operand_of[r]] == dv;
  }
  return false;
}
}  // namespace

std::vector<int> donated_outputs(const Program& p, const std::vector<int>& donate, const std::vector<int>& input_last) {
  std::vector<int> donor_of(p.outputs.size(), -1), output_of(p.values.size(), -1);
  for (std::size_t i = 0; i < donate.size() && i < p.inputs.size(); ++i)
    if (donate[i] >= 0 && static_cast<std::size_t>(donate[i]) < p.outputs.size())
      donor_of[static_cast<std::size_t>(donate[i])] = static_cast<int>(i);
  for (std::size_t o = 0; o < p.outputs.size(); ++o)
    if (donor_of[o] >= 0) output_of[static_cast<std::size_t>(p.outputs[o])] = static_cast<int>(o);
  std::vector<int> into(p.outputs.size(), -1);
  for (std::size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind == InstrKind::View) continue;  // a view lives in its source
    for (int v : in.defs()) {
      const int o = output_of[static_cast<std::size_t>(v)];
      if (o < 0) continue;
      const int donor = donor_of[static_cast<std::size_t>(o)];
      const int dv = p.inputs[static_cast<std::size_t>(donor)];
      const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
      if (p.values[static_cast<std::size_t>(dv)].bytes() != lv.bytes()) continue;
      const int last = input_last[static_cast<std::size_t>(donor)];
      if (last < static_cast<int>(i) || (last == static_cast<int>(i) && in_place(in, v, dv, p))) into[static_cast<std::size_t>(o)] = donor;
    }
  }
  return into;
}

void plan_donations(Program& p, const Graph& g, const std::vector<std::pair<std::string, std::string>>& donations) {
  std::vector<int> donate(p.inputs.size(), -1);
  for (const auto& [in_name, out_name] : donations)
    for (std::size_t i = 0; i < g.inputs.size() && i < donate.size(); ++i)
      if (g.values[static_cast<std::size_t>(g.inputs[i])].name == in_name)
        for (std::size_t o = 0; o < g.outputs.size(); ++o)
          if (g.values[static_cast<std::size_t>(g.outputs[o])].name == out_name) donate[i] = static_cast<int>(o);
  plan_donations(p, donate);
}

void plan_donations(Program& p, const std::vector<int>& donate) {
  if (donate.size() != p.inputs.size())
    throw Error(fmt::format("plan_donations: {} donation entries for a program with {} inputs (one per input: the "
                            "output it is donated to, or -1)",
                            donate.size(), p.inputs.size()));
  const std::vector<int> into = donated_outputs(p, donate, input_last_use(p));
  p.memory.donated_bytes = 0;
  for (std::size_t o = 0; o < into.size(); ++o)
    if (into[o] >= 0) p.memory.donated_bytes += p.values[static_cast<std::size_t>(p.outputs[o])].bytes();
}

}  // namespace tessel
