// src/passes/offload.cpp — the offload-activations pass (program_passes.hpp): values that sit unread
// in the device arena for a long stretch of the program (a training step's saved activations,
// between their forward use and their backward use) are copied to the host pool on the comm
// stream after their last use before the gap, and copied back shortly before their first use
// after it (ZeRO-Offload's / DeepSpeed's cpu_checkpointing, JAX's offload to pinned_host). The
// arena then holds neither copy across the gap; the host pool (MemoryPlan::host_bytes, pinned
// memory on CUDA) holds the offloaded bytes. The copies are ordinary `copy` instructions whose
// one side has `memory=host`, ordered by waits like a collective, so the verifier's
// stream-order and liveness rules apply unchanged; on CUDA they are cudaMemcpyAsync on the
// comm stream, overlapping the compute stream.
#include <fmt/format.h>

#include <algorithm>

#include "program_builders.hpp"
#include "tessel/passes/program_passes.hpp"

namespace tessel {

Program offload_activations_pass(Program p, int64_t min_bytes, int min_gap, int prefetch) {
  using detail::copy_instr;
  using detail::whole_block;
  if (min_bytes <= 0) return p;
  if (min_gap < 2) throw Error(fmt::format("offload-activations: the minimum gap must be >= 2 instructions, got {}", min_gap));
  if (prefetch < 1) throw Error(fmt::format("offload-activations: the prefetch distance must be >= 1 instruction, got {}", prefetch));
  const std::size_t nv = p.values.size();
  const int n = static_cast<int>(p.instrs.size());
  const std::string compute = "compute", comm = "comm";
  // Candidates: intermediate values defined and read on compute only, with no views of them.
  std::vector<bool> excluded(nv, false);
  for (int v : p.inputs) excluded[static_cast<std::size_t>(v)] = true;
  for (int v : p.outputs) excluded[static_cast<std::size_t>(v)] = true;
  std::vector<int> def(nv, -1);
  std::vector<std::vector<int>> reads(nv);
  for (int i = 0; i < n; ++i) {
    const Instr& in = p.instrs[static_cast<std::size_t>(i)];
    const bool on_compute = in.stream == compute;
    if (in.kind == InstrKind::View) {
      excluded[static_cast<std::size_t>(in.in[0])] = true;
      excluded[static_cast<std::size_t>(in.out)] = true;
      continue;
    }
    for (int v : in.in) {
      reads[static_cast<std::size_t>(v)].push_back(i);
      if (!on_compute) excluded[static_cast<std::size_t>(v)] = true;
    }
    for (int d : in.defs()) {
      def[static_cast<std::size_t>(d)] = i;
      if (!on_compute || in.kind == InstrKind::CollectiveStart) excluded[static_cast<std::size_t>(d)] = true;
    }
  }
  struct Offload {
    int v, after, before;  // offload after instruction `after`, reload for `before`
    int host = -1, dev = -1;
  };
  std::vector<Offload> plan;
  for (std::size_t v = 0; v < nv; ++v) {
    if (excluded[v] || def[v] < 0 || p.values[v].host || p.values[v].bytes() < min_bytes || reads[v].empty()) continue;
    std::vector<int> at{def[v]};
    at.insert(at.end(), reads[v].begin(), reads[v].end());
    int best = -1;
    for (std::size_t k = 0; k + 1 < at.size(); ++k)
      if (at[k + 1] - at[k] >= min_gap && (best < 0 || at[k + 1] - at[k] > at[static_cast<std::size_t>(best) + 1] - at[static_cast<std::size_t>(best)]))
        best = static_cast<int>(k);
    if (best >= 0) plan.push_back({static_cast<int>(v), at[static_cast<std::size_t>(best)], at[static_cast<std::size_t>(best) + 1]});
  }
  if (plan.empty()) return p;

  detail::ScratchValues scratch(p);
  auto twin = [&](int v, const char* suffix, bool host) {
    const LocalValue like = p.values[static_cast<std::size_t>(v)];  // a copy: add() grows the table
    const int id = scratch.add(like.name + suffix, like.dtype, like.shape);
    const std::string name = p.values[static_cast<std::size_t>(id)].name;
    p.values[static_cast<std::size_t>(id)] = like;
    p.values[static_cast<std::size_t>(id)].name = name;
    p.values[static_cast<std::size_t>(id)].host = host;
    return id;
  };
  // Inserted instructions, before instruction i (index n: at the end).
  std::vector<std::vector<Instr>> before(static_cast<std::size_t>(n) + 1);
  auto wait = [](const std::string& waiting, const std::string& waited) {
    Instr w;
    w.kind = InstrKind::Wait;
    w.stream = waiting;
    w.wait_for = waited;
    return w;
  };
  std::vector<std::pair<int, int>> rename_from(nv, {-1, -1});  // value -> (from instruction, reloaded value)
  for (Offload& o : plan) {
    o.host = twin(o.v, ".host", true);
    o.dev = twin(o.v, ".reload", false);
    const LocalValue& lv = p.values[static_cast<std::size_t>(o.v)];
    const Shape shape = lv.shape;
    const int graph_op = p.instrs[static_cast<std::size_t>(def[static_cast<std::size_t>(o.v)])].graph_op;
    // Offload: comm sees the value complete, copies it out; compute waits for that copy a
    // prefetch distance later (from then on the value's arena bytes may be reused).
    auto& out_at = before[static_cast<std::size_t>(o.after) + 1];
    out_at.push_back(wait(comm, compute));
    Instr off = copy_instr(o.v, o.host, shape, {whole_block(shape.size())}, comm, graph_op);
    off.note = fmt::format("offload %{} to host memory", lv.name);
    out_at.push_back(std::move(off));
    const int freed = std::min(o.after + 1 + prefetch, o.before);
    // Reload: a prefetch distance before the reader, after the offload's wait; comm waits for
    // compute first (the reloaded value's arena bytes may be reused ones).
    const int reload = std::max(freed, o.before - prefetch);
    if (freed < reload) before[static_cast<std::size_t>(freed)].push_back(wait(compute, comm));
    auto& in_at = before[static_cast<std::size_t>(reload)];
    in_at.push_back(wait(comm, compute));
    Instr back = copy_instr(o.host, o.dev, shape, {whole_block(shape.size())}, comm, graph_op);
    back.note = fmt::format("reload %{} from host memory", lv.name);
    in_at.push_back(std::move(back));
    before[static_cast<std::size_t>(o.before)].push_back(wait(compute, comm));
    rename_from[static_cast<std::size_t>(o.v)] = {o.before, o.dev};
  }
  std::vector<Instr> out;
  out.reserve(p.instrs.size() + plan.size() * 6);
  for (int i = 0; i <= n; ++i) {
    for (Instr& ins : before[static_cast<std::size_t>(i)]) out.push_back(std::move(ins));
    if (i == n) break;
    Instr in = p.instrs[static_cast<std::size_t>(i)];
    for (int& v : in.in) {
      const auto [from, dev] = rename_from[static_cast<std::size_t>(v)];
      if (from >= 0 && i >= from) v = dev;
    }
    out.push_back(std::move(in));
  }
  p.instrs = std::move(out);
  p.memory = {};
  return p;
}

}  // namespace tessel
