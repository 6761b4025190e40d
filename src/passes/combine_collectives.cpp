// src/passes/combine_collectives.cpp — the combine-collectives pass (XLA's AllReduceCombiner,
// ReduceScatterCombiner and AllGatherCombiner): many small collectives over one axis group cost
// one latency each (α per ring step), so the independent ones of one kind that agree on group,
// reduce op and dtype are merged into one collective of a packed buffer. The Megatron
// statistics (softmax / cross-entropy sums and maxima, layer-norm moments), per-layer gradient
// reductions and ZeRO's per-parameter reduce-scatters and all-gathers are the cases it is for.
//
// How (docs/program-ir.md, "combine-collectives"):
//   1. Grouping. Candidates are the synchronous all-reduces whose buffer fits the threshold.
//      Reachability between candidates (does b's operand depend on a's result, through any
//      instructions) is kept as bitsets, transitively closed in the graph where each group is
//      one node: merging a candidate into a group is legal iff neither reaches the other, so
//      the merged graph stays acyclic. Each (axes, op, dtype) has one open group; a candidate
//      that cannot join it (dependence or threshold) opens a new one.
//   2. Scheduling. A list schedule of the merged graph that keeps the original order wherever
//      dependences allow (ready nodes by original index; a group counts at its last member):
//      only instructions reading a combined result move, to after the combined all-reduce.
//   3. Rewriting. A group becomes `view`s flattening the operands, `concat` into
//      %combined.in, the collective into %combined.out, and one `view` per result (view +
//      `copy` for a program output, which may not be a view) emitted just before the result's
//      first reader, so async-collectives still places the done as late as possible.
//      Reduce-scatters and all-gathers move rank-major blocks (after pack, the blocks of their
//      dim are contiguous): a reduce-scatter's operands are viewed as [n, block] and
//      concatenated along dim 1, so row r of %combined.in holds every member's block for rank
//      r and the result is the members' reduced blocks side by side; an all-gather's operands
//      are concatenated into one row, gathered to [n, row], and each member's columns are
//      copied out (a strided copy) before its first reader.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tessel/passes/program_passes.hpp"
#include "tessel/core/collective_kind.hpp"
#include "tessel/ir/program_verify.hpp"
#include "program_builders.hpp"

namespace tessel {
namespace {

using namespace detail;

using Bits = std::vector<uint64_t>;


void set(Bits& b, std::size_t i) { b[i / 64] |= uint64_t{1} << (i % 64); }
void or_into(Bits& a, const Bits& b) {
  for (std::size_t w = 0; w < a.size(); ++w) a[w] |= b[w];
}
bool intersects(const Bits& a, const Bits& b) {
  for (std::size_t w = 0; w < a.size(); ++w)
    if (a[w] & b[w]) return true;
  return false;
}
template <class F>
void for_each_bit(const Bits& b, F&& f) {
  for (std::size_t w = 0; w < b.size(); ++w)
    for (uint64_t x = b[w]; x; x &= x - 1) f(w * 64 + static_cast<std::size_t>(__builtin_ctzll(x)));
}

struct Group {
  std::vector<std::size_t> members;  // candidate indices, program order
  Bits member_bits;
  int64_t bytes = 0;
};

}  // namespace

namespace {

// One combining of p: all-reduces always, reduce-scatters and all-gathers when `rs_ag` (the
// reduce-scatters within span_instrs of their group's first member).
Program combine(Program p, int64_t threshold_bytes, int span_instrs, bool rs_ag) {
  const std::size_t n = p.instrs.size(), nv = p.values.size();
  for (std::size_t i = 0; i < n; ++i) {
    const InstrKind k = p.instrs[i].kind;
    if (k == InstrKind::CollectiveStart || k == InstrKind::CollectiveDone || k == InstrKind::Wait)
      throw Error(fmt::format("combine-collectives: instruction {} is already lowered by async-collectives; run "
                              "combine-collectives before it, on synchronous collectives",
                              describe_instr(p, static_cast<int>(i))));
  }
  auto bytes_of = [&](int v) { return p.values[static_cast<std::size_t>(v)].bytes(); };

  // ---- candidates ----
  std::vector<std::size_t> cand;          // instruction index per candidate
  std::vector<int> cand_of(n, -1);        // candidate index per instruction
  // The product of the dims before `d` (1: the blocks along d are contiguous and rank-major).
  auto outer = [](const Shape& s, int d) {
    int64_t o = 1;
    for (int k = 0; k < d && static_cast<std::size_t>(k) < s.size(); ++k) o *= s[static_cast<std::size_t>(k)];
    return o;
  };
  std::vector<bool> is_out(nv, false);
  for (int v : p.outputs) is_out[static_cast<std::size_t>(v)] = true;
  for (std::size_t i = 0; i < n; ++i) {
    const Instr& in = p.instrs[i];
    if (in.kind != InstrKind::Collective || in.in.size() != 1 || in.out < 0) continue;
    // Only all-gathers whose result is a program output (ZeRO-1/2's updated parameters), which
    // lives to the end anyway. The others are gathered where they are used, so that the copy
    // dies soon (ZeRO-3's weights and activations): combined, they would all be gathered at once.
    if (in.collective == CollectiveKind::AllGather && !is_out[static_cast<std::size_t>(in.out)]) continue;

    const LocalValue& x = p.values[static_cast<std::size_t>(in.in[0])];
    const LocalValue& y = p.values[static_cast<std::size_t>(in.out)];
    if (in.collective == CollectiveKind::ReduceScatter || in.collective == CollectiveKind::AllGather) {
      if (!rs_ag || in.dim < 0 || outer(x.shape, in.dim) != 1 || outer(y.shape, in.dim) != 1) continue;
      if (num_elements(x.shape) == 0 || num_elements(y.shape) == 0) continue;
    } else if (in.collective != CollectiveKind::AllReduce) {
      continue;
    }
    if (std::max(bytes_of(in.in[0]), bytes_of(in.out)) > threshold_bytes) continue;
    cand_of[i] = static_cast<int>(cand.size());
    cand.push_back(i);
  }
  const std::size_t C = cand.size();
  if (C < 2) return p;
  const std::size_t words = (C + 63) / 64;

  // ---- reachability between candidates ----
  // deps[v]: the candidates whose result v depends on (v itself a candidate's result counts).
  std::vector<Bits> deps(nv, Bits(words, 0));
  std::vector<Bits> anc(C, Bits(words, 0)), desc(C, Bits(words, 0));
  for (std::size_t i = 0; i < n; ++i) {
    const Instr& in = p.instrs[i];
    if (in.out < 0) continue;
    Bits acc(words, 0);
    for (int v : in.in) or_into(acc, deps[static_cast<std::size_t>(v)]);
    if (cand_of[i] >= 0) {
      const std::size_t c = static_cast<std::size_t>(cand_of[i]);
      anc[c] = acc;
      set(acc, c);
    }
    for (int e : in.extra_out) deps[static_cast<std::size_t>(e)] = acc;
    deps[static_cast<std::size_t>(in.out)] = std::move(acc);
  }
  deps.clear();
  for (std::size_t b = 0; b < C; ++b) for_each_bit(anc[b], [&](std::size_t a) { set(desc[a], b); });

  // ---- grouping ----
  using Key = std::tuple<int, std::vector<std::string>, int, int>;  // kind, axes, reduce op, dtype
  std::map<Key, std::size_t> open;
  std::vector<Group> groups;
  std::vector<int> group_of(C, -1);
  for (std::size_t c = 0; c < C; ++c) {
    const Instr& in = p.instrs[cand[c]];
    const int op = in.collective == CollectiveKind::AllGather ? -1 : static_cast<int>(in.reduce);
    const Key key{static_cast<int>(in.collective), in.axes, op,
                  static_cast<int>(p.values[static_cast<std::size_t>(in.in[0])].dtype)};
    const int64_t b = std::max(bytes_of(in.in[0]), bytes_of(in.out));
    auto it = open.find(key);
    if (it != open.end()) {
      Group& g = groups[it->second];
      // Reduce-scatters join only within span_instrs instructions of the group's first
      // member: the combined one stands at the last member's place, so every earlier member's
      // operand lives until then (ZeRO's gradients, which the per-parameter reduce-scatters
      // free as they come).
      const bool near = in.collective != CollectiveKind::ReduceScatter ||
                        cand[c] - cand[g.members.front()] <= static_cast<std::size_t>(span_instrs);
      if (near && g.bytes + b <= threshold_bytes && !intersects(anc[c], g.member_bits) &&
          !intersects(desc[c], g.member_bits)) {
        // Merge: every member now stands for the whole group. Keep the relation closed:
        // whatever reaches a member reaches all of them and all they reach.
        const std::size_t m0 = g.members.front();
        Bits A = anc[m0], D = desc[m0];
        or_into(A, anc[c]);
        or_into(D, desc[c]);
        Bits M = g.member_bits;
        set(M, c);
        Bits DM = D, AM = A;
        or_into(DM, M);
        or_into(AM, M);
        for_each_bit(A, [&](std::size_t x) { or_into(desc[x], DM); });
        for_each_bit(D, [&](std::size_t y) { or_into(anc[y], AM); });
        g.members.push_back(c);
        g.member_bits = M;
        g.bytes += b;
        for (std::size_t m : g.members) {
          anc[m] = A;
          desc[m] = D;
        }
        group_of[c] = static_cast<int>(it->second);
        continue;
      }
    }
    Group g;
    g.members = {c};
    g.member_bits.assign(words, 0);
    set(g.member_bits, c);
    g.bytes = b;
    group_of[c] = static_cast<int>(groups.size());
    open[key] = groups.size();
    groups.push_back(std::move(g));
  }
  bool any = false;
  for (const Group& g : groups) any = any || g.members.size() >= 2;
  if (!any) return p;

  // ---- scheduling: nodes are instructions, or a combined group (at its last member) ----
  std::vector<int> node_of(n);  // node per instruction
  std::vector<std::vector<std::size_t>> node_instrs;
  std::vector<std::size_t> node_priority;
  std::vector<int> group_node(groups.size(), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const int c = cand_of[i];
    const int gi = c >= 0 ? group_of[static_cast<std::size_t>(c)] : -1;
    if (gi >= 0 && groups[static_cast<std::size_t>(gi)].members.size() >= 2) {
      int& gn = group_node[static_cast<std::size_t>(gi)];
      if (gn < 0) {
        gn = static_cast<int>(node_instrs.size());
        node_instrs.emplace_back();
        node_priority.push_back(0);
      }
      node_instrs[static_cast<std::size_t>(gn)].push_back(i);
      node_priority[static_cast<std::size_t>(gn)] = i;  // the last member
      node_of[i] = gn;
      continue;
    }
    node_of[i] = static_cast<int>(node_instrs.size());
    node_instrs.push_back({i});
    node_priority.push_back(i);
  }
  const std::size_t N = node_instrs.size();
  std::vector<int> def_node(nv, -1);
  for (std::size_t i = 0; i < n; ++i)
    for (int d : p.instrs[i].defs()) def_node[static_cast<std::size_t>(d)] = node_of[i];
  std::vector<std::vector<std::size_t>> succ(N);
  std::vector<int> indeg(N, 0);
  for (std::size_t k = 0; k < N; ++k) {
    std::unordered_set<int> preds;
    for (std::size_t i : node_instrs[k])
      for (int v : p.instrs[i].in) {
        const int d = def_node[static_cast<std::size_t>(v)];
        if (d >= 0 && d != static_cast<int>(k)) preds.insert(d);
      }
    for (int d : preds) {
      succ[static_cast<std::size_t>(d)].push_back(k);
      ++indeg[k];
    }
  }
  using Ready = std::pair<std::size_t, std::size_t>;  // (priority, node)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready;
  for (std::size_t k = 0; k < N; ++k)
    if (indeg[k] == 0) ready.push({node_priority[k], k});

  // ---- rewriting ----
  ScratchValues scratch(p);
  std::vector<bool> is_output(nv, false);
  for (int v : p.outputs) is_output[static_cast<std::size_t>(v)] = true;
  std::vector<Instr> out;
  out.reserve(n + 8 * groups.size());
  // Results of combined all-reduces not unpacked yet: value -> where it lies.
  struct Packed {
    int packed;
    int64_t offset;  // bytes
    int graph_op;
    // An all-gather's member: its columns [column, column + width) of the [ranks, row]
    // %combined.out are copied out first (offset is then 0 in the copy).
    int64_t ranks = 0, column = 0, width = 0;
  };
  std::map<int, Packed> pending;
  auto unpack = [&](int v) {
    auto it = pending.find(v);
    if (it == pending.end()) return;
    Packed where = it->second;
    pending.erase(it);
    if (where.ranks > 0) {  // an all-gather's member: its rank-major blocks, copied out
      const LocalValue lv = p.values[static_cast<std::size_t>(v)];
      const int cols = scratch.add(lv.name + ".gathered", lv.dtype, Shape{where.ranks, where.width});
      CopyBlock b = whole_block(2);
      b.src[1].base = where.column;
      out.push_back(copy_instr(where.packed, cols, Shape{where.ranks, where.width}, {b}, "compute", where.graph_op));
      where.packed = cols;
      where.offset = 0;
    }
    if (!is_output[static_cast<std::size_t>(v)]) {
      out.push_back(view_instr(where.packed, v, where.offset, "compute", where.graph_op));
      return;
    }
    // An output is a buffer of its own: view, then copy.
    const LocalValue lv = p.values[static_cast<std::size_t>(v)];
    const int tmp = scratch.add(lv.name + ".unpacked", lv.dtype, lv.shape);
    out.push_back(view_instr(where.packed, tmp, where.offset, "compute", where.graph_op));
    out.push_back(copy_instr(tmp, v, lv.shape, {whole_block(lv.shape.size())}, "compute", where.graph_op));
  };
  std::map<int, int> flat_of;  // operand -> its flat view
  std::size_t emitted = 0;
  while (!ready.empty()) {
    const std::size_t k = ready.top().second;
    ready.pop();
    ++emitted;
    const auto& ins = node_instrs[k];
    if (ins.size() == 1) {
      Instr in = std::move(p.instrs[ins[0]]);  // emitted once; p.instrs is replaced by `out`
      for (int v : in.in) unpack(v);
      out.push_back(std::move(in));
    } else {
      const Instr& first = p.instrs[ins.front()];
      const DType dt = p.values[static_cast<std::size_t>(first.in[0])].dtype;
      const CollectiveKind kind = first.collective;
      // Reduce-scatters and all-gathers: n ranks, each member's operand viewed as [n, block]
      // (reduce-scatter) or [1, block] (all-gather); all-reduces: flat.
      const int64_t ranks = kind == CollectiveKind::AllReduce ? 1 : p.mesh.axes_size(first.axes);
      Instr cat;
      cat.kind = InstrKind::Kernel;
      cat.op = OpKind::Concat;
      cat.attrs.axis = kind == CollectiveKind::AllReduce ? 0 : 1;
      cat.stream = first.stream;
      cat.graph_op = first.graph_op;
      int64_t cols = 0, bytes = 0;  // columns of the packed row(s)
      double seconds = 0;
      std::vector<std::string> what;
      std::vector<std::pair<int, Packed>> results;
      for (std::size_t i : ins) {
        const Instr& m = p.instrs[i];
        const int x = m.in[0];
        unpack(x);
        const LocalValue& xv = p.values[static_cast<std::size_t>(x)];
        const int64_t ne = num_elements(xv.shape);
        // The operand as the packing wants it: [ne] / [n, ne / n] / [1, ne].
        const Shape want = kind == CollectiveKind::AllReduce     ? Shape{ne}
                           : kind == CollectiveKind::ReduceScatter ? Shape{ranks, ne / ranks}
                                                                   : Shape{1, ne};
        int flat = x;
        if (xv.shape != want) {
          auto f = flat_of.find(x);
          if (f != flat_of.end() && p.values[static_cast<std::size_t>(f->second)].shape == want) {
            flat = f->second;
          } else {
            flat = scratch.add(xv.name + ".flat", dt, want);
            flat_of[x] = flat;
            out.push_back(view_instr(x, flat, 0, first.stream, m.graph_op));
          }
        }
        cat.in.push_back(flat);
        const int64_t width = want.back();
        Packed where{-1, cols * static_cast<int64_t>(dtype_size(dt)), m.graph_op};
        if (kind == CollectiveKind::AllGather) {
          where.ranks = ranks;
          where.column = cols;
          where.width = width;
          where.offset = 0;
        }
        results.push_back({m.out, where});
        cols += width;
        bytes += m.bytes;
        seconds += m.seconds;
        what.push_back("%" + p.values[static_cast<std::size_t>(m.out)].name);
      }
      const Shape in_shape = kind == CollectiveKind::AllReduce     ? Shape{cols}
                             : kind == CollectiveKind::ReduceScatter ? Shape{ranks, cols}
                                                                     : Shape{1, cols};
      const Shape out_shape = kind == CollectiveKind::AllReduce     ? Shape{cols}
                              : kind == CollectiveKind::ReduceScatter ? Shape{1, cols}
                                                                      : Shape{ranks, cols};
      const int packed_in = scratch.add("combined.in", dt, in_shape);
      cat.out = packed_in;
      out.push_back(std::move(cat));
      const int packed_out = scratch.add("combined.out", dt, out_shape);
      Instr coll = first;
      coll.in = {packed_in};
      coll.out = packed_out;
      if (kind != CollectiveKind::AllReduce) coll.dim = 0;
      coll.bytes = bytes;
      coll.seconds = seconds;  // an upper bound: the latency saved is not subtracted
      coll.note = fmt::format("combined {} of {}", collective_info(kind).name, join(what, ", "));
      out.push_back(std::move(coll));
      for (auto [v, where] : results) {
        where.packed = packed_out;
        pending[v] = where;
      }
    }
    for (std::size_t s : succ[k])
      if (--indeg[s] == 0) ready.push({node_priority[s], s});
  }
  if (emitted != N)
    throw Error("combine-collectives: internal error: the combined program has a cycle (please report it)");
  std::vector<int> rest;
  for (const auto& pr : pending) rest.push_back(pr.first);
  for (int v : rest) unpack(v);
  p.instrs = std::move(out);
  p.memory = {};
  return p;
}

}  // namespace

Program combine_collectives_pass(Program p, int64_t threshold_bytes, int span_instrs) {
  if (threshold_bytes <= 0) return p;
  bool rs_ag = false;
  for (const Instr& in : p.instrs)
    rs_ag = rs_ag || (in.kind == InstrKind::Collective && (in.collective == CollectiveKind::ReduceScatter ||
                                                         in.collective == CollectiveKind::AllGather));
  Program base = combine(p, threshold_bytes, span_instrs, false);
  if (!rs_ag || span_instrs <= 0) return base;
  // Combining reduce-scatters keeps their operands alive until the group's last member, and a
  // combined all-gather's packed result stands beside its members' own buffers for a while:
  // kept only when the program's planned peak grows by at most 1%, with the span narrowed
  // (4x at a time) until it does; else only the all-reduces are combined.
  const int64_t peak = memory_plan_pass(base).memory_plan().peak_bytes();
  for (int span = span_instrs; span >= 1; span /= 4) {
    Program c = combine(p, threshold_bytes, span, true);
    if (memory_plan_pass(c).memory_plan().peak_bytes() <= peak + peak / 100) return c;
  }
  return base;
}

}  // namespace tessel
