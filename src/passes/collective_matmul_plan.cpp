// src/passes/collective_matmul_plan.cpp — where and whether the collective-matmul pass rewrites
// (docs/collective-matmul.md): the sites (an all-gather whose only reader is a two-operand einsum
// with the gathered dim, or an einsum whose only reader is a reduce-scatter), the reasons a
// candidate is declined, and the gate — a two-stream timeline from the cost model that
// compares the ring (unidirectional or bidirectional) with the collective followed by the einsum.
// The rewrite itself is collective_matmul.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessel/ops/registry.hpp"
#include "collective_matmul_sites.hpp"

namespace tessel {
namespace cm_detail {
namespace {

// "bsd,df->bsf" → {"bsd","df"}, "bsf".
struct Equation {
  std::vector<std::string> in;
  std::string out;
};

Equation split_equation(const std::string& eq) {
  Equation e;
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  e.out = arrow == std::string::npos ? std::string() : eq.substr(arrow + 2);
  std::size_t b = 0;
  while (true) {
    const auto c = lhs.find(',', b);
    e.in.push_back(lhs.substr(b, c == std::string::npos ? std::string::npos : c - b));
    if (c == std::string::npos) break;
    b = c + 1;
  }
  return e;
}

bool repeats(const std::string& term, char l) { return std::count(term.begin(), term.end(), l) != 1; }

// The number of readers of each value (instructions), and which values are outputs.
struct Uses {
  std::vector<int> readers;
  std::vector<bool> output;
  explicit Uses(const Program& p) : readers(p.values.size(), 0), output(p.values.size(), false) {
    for (const Instr& in : p.instrs)
      for (int v : in.in) ++readers[static_cast<std::size_t>(v)];
    for (int v : p.outputs) output[static_cast<std::size_t>(v)] = true;
  }
  bool private_to_one_reader(int v) const {
    return readers[static_cast<std::size_t>(v)] == 1 && !output[static_cast<std::size_t>(v)];
  }
};

bool is_einsum2(const Instr& in) {
  return in.kind == InstrKind::Kernel && in.op == OpKind::Einsum && in.in.size() == 2 && in.in[0] != in.in[1];
}

}  // namespace

std::vector<Site> find_sites(const Program& p, std::vector<std::pair<int, std::string>>* declined) {
  Uses uses(p);
  std::vector<int> def(p.values.size(), -1);
  for (std::size_t i = 0; i < p.instrs.size(); ++i)
    for (int v : p.instrs[i].defs()) def[static_cast<std::size_t>(v)] = static_cast<int>(i);
  std::vector<int> first_reader(p.values.size(), -1);
  for (std::size_t i = 0; i < p.instrs.size(); ++i)
    for (int v : p.instrs[i].in)
      if (first_reader[static_cast<std::size_t>(v)] < 0) first_reader[static_cast<std::size_t>(v)] = static_cast<int>(i);
  auto decline = [&](int i, std::string why) {
    if (declined) declined->push_back({i, std::move(why)});
  };

  std::vector<Site> sites;
  for (std::size_t ci = 0; ci < p.instrs.size(); ++ci) {
    const Instr& c = p.instrs[ci];
    if (c.kind != InstrKind::Collective) continue;
    const bool gather = c.collective == CollectiveKind::AllGather;
    if (!gather && c.collective != CollectiveKind::ReduceScatter) continue;
    Site s;
    s.coll = static_cast<int>(ci);
    s.gather = gather;
    s.axes = c.axes;
    s.n = p.mesh.axes_size(c.axes);
    if (s.n < 2) continue;
    if (gather) {
      if (!uses.private_to_one_reader(c.out)) {
        decline(s.coll, "the gathered value has other readers (or is an output)");
        continue;
      }
      const int ei = first_reader[static_cast<std::size_t>(c.out)];
      const Instr& e = p.instrs[static_cast<std::size_t>(ei)];
      if (!is_einsum2(e)) continue;  // not an all-gather feeding an einsum
      s.einsum = ei;
      s.operand = e.in[0] == c.out ? 0 : 1;
      const Equation eq = split_equation(e.attrs.equation);
      const std::string& term = eq.in[static_cast<std::size_t>(s.operand)];
      const std::string& other = eq.in[static_cast<std::size_t>(1 - s.operand)];
      const char l = term.at(static_cast<std::size_t>(c.dim));
      if (repeats(term, l) || std::count(other.begin(), other.end(), l) > 1 || std::count(eq.out.begin(), eq.out.end(), l) > 1) {
        decline(s.coll, fmt::format("the einsum {} repeats the gathered letter '{}'", e.attrs.equation, l));
        continue;
      }
      const auto od = eq.out.find(l), wd = other.find(l);
      if (od == std::string::npos && wd == std::string::npos) {
        decline(s.coll, fmt::format("the gathered letter '{}' of {} is summed out of one operand only", l, e.attrs.equation));
        continue;
      }
      s.op_dim[static_cast<std::size_t>(s.operand)] = c.dim;
      s.op_dim[static_cast<std::size_t>(1 - s.operand)] = wd == std::string::npos ? -1 : static_cast<int>(wd);
      s.out_dim = od == std::string::npos ? -1 : static_cast<int>(od);
      s.chunk = p.values[static_cast<std::size_t>(c.in[0])].shape[static_cast<std::size_t>(c.dim)];
    } else {
      if (c.reduce != ReduceOp::Sum) continue;
      const int y = c.in[0];
      const int ei = def[static_cast<std::size_t>(y)];
      if (ei < 0 || !is_einsum2(p.instrs[static_cast<std::size_t>(ei)])) continue;
      if (!uses.private_to_one_reader(y)) {
        decline(s.coll, "the einsum's result has other readers (or is an output)");
        continue;
      }
      const Instr& e = p.instrs[static_cast<std::size_t>(ei)];
      s.einsum = ei;
      const Equation eq = split_equation(e.attrs.equation);
      const char l = eq.out.at(static_cast<std::size_t>(c.dim));
      if (repeats(eq.out, l)) continue;
      for (int k = 0; k < 2; ++k) {
        const std::string& t = eq.in[static_cast<std::size_t>(k)];
        if (std::count(t.begin(), t.end(), l) > 1) {
          decline(s.coll, fmt::format("the einsum {} repeats the scattered letter '{}'", e.attrs.equation, l));
          s.operand = -2;
          break;
        }
        const auto d = t.find(l);
        s.op_dim[static_cast<std::size_t>(k)] = d == std::string::npos ? -1 : static_cast<int>(d);
        if (d != std::string::npos && s.operand == -1) s.operand = k;
      }
      if (s.operand < 0) continue;
      s.out_dim = c.dim;
      s.chunk = p.values[static_cast<std::size_t>(c.out)].shape[static_cast<std::size_t>(c.dim)];
    }
    sites.push_back(s);
  }
  return sites;
}

namespace {

// ---- the gate: a two-stream timeline -----------------------------------------------------------

struct Costs {
  double comm_alpha = 0, comm_bw = 1;  // the ring's link
  double einsum_s = 0;                 // the whole einsum
  double einsum_bytes = 0;             // its operands + result
  double flops = 0;
  double out_bytes = 0;                // the einsum's result (gather) / the scattered result (scatter)
  double slice_bytes = 0;              // per step: the operand slices (ring-indexed copies), read + write
  int slices = 0;                      // ring-indexed copies per step and half
  double chunk_bytes = 0;              // one ring block of the travelling value
  double coll_s = 0;                   // the collective as it is
};

double step_einsum_s(const CostModel& m, const Costs& c, int64_t parts) {
  const double k = static_cast<double>(parts);
  return m.op_seconds(c.flops / k, c.einsum_bytes / k);
}

// The two-stream estimate of one ring: its seconds and the instructions it runs (each pays
// CostModel::dispatch_seconds on its stream).
struct RingEstimate {
  double seconds = 0;
  int64_t instrs = 0;
};

// Estimated seconds of the ring with `halves` chunks per step (1 uni, 2 bi), n steps. Every
// instruction the rewrite emits is charged its roofline time (op_seconds: compute_sharing
// included) plus one dispatch: the einsums, the ring-indexed slices, the adds and the
// assembling copies on compute, the permutes on comm.
RingEstimate ring_seconds(const CostModel& m, const Site& s, const Costs& c, int halves) {
  const double h = static_cast<double>(halves);
  const double d = m.dispatch_seconds();
  RingEstimate r;
  // Both directions at once on separate links — except on a ring of two, where both halves go
  // to the one neighbour over the same link. The permutes of a step are one group: one
  // dispatch each, the transfers at once.
  const double t_perm = c.comm_alpha + (s.n == 2 ? c.chunk_bytes : c.chunk_bytes / h) / c.comm_bw + h * d;
  const double t_e = (step_einsum_s(m, c, s.n * halves) + d) * h + m.op_seconds(0, c.slice_bytes) + c.slices * h * d;
  const int64_t e_instrs = halves * (1 + c.slices);
  double comp = 0, comm = 0;
  if (s.gather) {
    if (halves == 2) {  // the chunk split into its halves: two copies before anything travels
      comp = comm = m.op_seconds(0, 2 * c.chunk_bytes) + 2 * d;
      r.instrs += 2;
    }
    // Contracted ring letter: the partial products are summed (one add per half and step).
    const double t_add = s.out_dim < 0 ? h * (m.op_seconds(0, 3 * c.out_bytes) + d) : 0;
    // Permute s+1 leaves as soon as chunk s is here; einsum s needs chunk s.
    for (int64_t i = 0; i < s.n; ++i) {
      if (i > 0) {
        comm += t_perm;
        comp = std::max(comp, comm);
        r.instrs += halves;
      }
      comp += t_e;
      r.instrs += e_instrs;
      if (t_add > 0 && (i > 0 || halves == 2)) {
        comp += i > 0 ? t_add : t_add / h;
        r.instrs += i > 0 ? halves : 1;
      }
    }
    if (s.out_dim >= 0) {  // assembling the result: read + write, one copy
      comp += m.op_seconds(0, 2 * c.out_bytes) + d;
      r.instrs += 1;
    }
    r.seconds = comp;
    return r;
  }
  const double t_add = m.op_seconds(0, 3 * c.chunk_bytes) + h * d;
  double acc_ready = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const double e_end = comp + t_e;
    r.instrs += e_instrs;
    if (i == 0) {
      comp = acc_ready = e_end;
      continue;
    }
    comm = std::max(comm, acc_ready) + t_perm;
    comp = std::max(e_end, comm) + t_add;
    acc_ready = comp;
    r.instrs += 2 * halves;  // the permutes and the adds
  }
  if (halves == 2) {  // the two halves of this device's block, side by side
    comp += m.op_seconds(0, 2 * c.chunk_bytes) + d;
    r.instrs += 1;
  }
  r.seconds = comp;
  return r;
}

Costs site_costs(const Program& p, const Site& s, const CostModel& m) {
  const Instr& c = p.instrs[static_cast<std::size_t>(s.coll)];
  const Instr& e = p.instrs[static_cast<std::size_t>(s.einsum)];
  Costs k;
  const LinkSpec l = m.link(s.axes);
  k.comm_alpha = l.alpha_s;
  k.comm_bw = l.bandwidth;
  k.flops = e.flops;
  for (int v : e.in) k.einsum_bytes += static_cast<double>(p.values[static_cast<std::size_t>(v)].bytes());
  k.einsum_bytes += static_cast<double>(p.values[static_cast<std::size_t>(e.out)].bytes());
  k.einsum_s = m.op_seconds(k.flops, k.einsum_bytes);
  k.coll_s = m.collective_seconds(c.collective, p.mesh, s.axes, c.bytes);
  const double n = static_cast<double>(s.n);
  if (s.gather) {
    k.chunk_bytes = static_cast<double>(p.values[static_cast<std::size_t>(c.in[0])].bytes());
    k.out_bytes = static_cast<double>(p.values[static_cast<std::size_t>(e.out)].bytes());
    const int w = e.in[static_cast<std::size_t>(1 - s.operand)];
    if (s.op_dim[static_cast<std::size_t>(1 - s.operand)] >= 0) {
      k.slice_bytes = 2 * static_cast<double>(p.values[static_cast<std::size_t>(w)].bytes()) / n;
      k.slices = 1;
    }
  } else {
    k.chunk_bytes = static_cast<double>(p.values[static_cast<std::size_t>(c.out)].bytes());
    k.out_bytes = k.chunk_bytes;
    for (int j = 0; j < 2; ++j)
      if (s.op_dim[static_cast<std::size_t>(j)] >= 0) {
        k.slice_bytes += 2 * static_cast<double>(p.values[static_cast<std::size_t>(e.in[static_cast<std::size_t>(j)])].bytes()) / n;
        ++k.slices;
      }
  }
  return k;
}

bool bidirectional_possible(const Site& s) { return s.chunk % 2 == 0 && s.chunk >= 2; }

}  // namespace

CollectiveMatmulSite decide(const Program& p, const Site& s, const CollectiveMatmulOptions& o) {
  CollectiveMatmulSite d;
  const Instr& c = p.instrs[static_cast<std::size_t>(s.coll)];
  const Instr& e = p.instrs[static_cast<std::size_t>(s.einsum)];
  d.instr = s.coll;
  d.gather = s.gather;
  d.ring = s.n;
  d.axes = s.axes;
  auto vn = [&](int v) { return "%" + p.values[static_cast<std::size_t>(v)].name; };
  d.description = s.gather ? fmt::format("{} = all_gather({}) axes={{{}}} dim={} -> {} = einsum \"{}\"", vn(c.out), vn(c.in[0]),
                                         fmt::join(s.axes, ","), c.dim, vn(e.out), e.attrs.equation)
                           : fmt::format("{} = einsum \"{}\" -> {} = reduce_scatter({}) axes={{{}}} dim={}", vn(e.out),
                                         e.attrs.equation, vn(c.out), vn(c.in[0]), fmt::join(s.axes, ","), c.dim);
  const Costs k = site_costs(p, s, o.cost);
  const double disp = o.cost.dispatch_seconds();
  d.dispatch_s = disp;
  d.compute_sharing = o.cost.compute_sharing;
  d.before_s = k.einsum_s + k.coll_s + 2 * disp;  // two instructions: the collective, the einsum
  const RingEstimate uni = ring_seconds(o.cost, s, k, 1);
  d.uni_s = uni.seconds;
  d.uni_instrs = uni.instrs;
  if (bidirectional_possible(s)) {
    const RingEstimate bi = ring_seconds(o.cost, s, k, 2);
    d.bi_s = bi.seconds;
    d.bi_instrs = bi.instrs;
  }
  const bool bi_ok = d.bi_s >= 0;
  RingVariant best = RingVariant::Uni;
  if (o.direction == RingDirection::Bi && bi_ok) best = RingVariant::Bi;
  if (o.direction == RingDirection::Auto && bi_ok && d.bi_s < d.uni_s) best = RingVariant::Bi;
  const double best_s = best == RingVariant::Bi ? d.bi_s : d.uni_s;
  switch (o.mode) {
    case OverlapMode::Off:
      d.variant = RingVariant::None;
      d.reason = "collective matmul is off";
      break;
    case OverlapMode::On:
      d.variant = best;
      d.reason = "forced on";
      if (o.direction == RingDirection::Bi && !bi_ok)
        d.reason += fmt::format(" (bidirectional needs an even chunk; the chunk is {})", s.chunk);
      break;
    case OverlapMode::Auto:
      if (best_s < d.before_s * (1 - o.min_gain)) {
        d.variant = best;
        d.reason = fmt::format("the ring is estimated {:.2f}x faster", d.before_s / best_s);
      } else {
        d.variant = RingVariant::None;
        // Would the ring win without its per-instruction costs? Then they are why it loses.
        CostModel free = o.cost;
        free.dispatch_s = 0;
        const double free_before = k.einsum_s + k.coll_s;
        const double free_ring = ring_seconds(free, s, k, best == RingVariant::Bi ? 2 : 1).seconds;
        const double t_perm = k.comm_alpha + k.chunk_bytes / k.comm_bw;
        const double t_e = k.einsum_s / static_cast<double>(s.n);
        d.reason = disp > 0 && free_ring < free_before * (1 - o.min_gain)
                       ? fmt::format("the ring's {} instructions at {:.1f} us each (dispatch{}) outweigh the overlap",
                                     best == RingVariant::Bi ? d.bi_instrs : d.uni_instrs, disp * 1e6,
                                     o.cost.compute_sharing > 1
                                         ? fmt::format(", x{:.2g} for device programs sharing a core", o.cost.compute_sharing)
                                         : std::string())
                   : t_perm < 0.2 * t_e          ? "the collective is too small to be worth hiding"
                   : k.comm_alpha > 0.5 * t_perm ? "chunks are small: latency dominates each ring step"
                                                 : "the einsum is too small to hide the communication";
      }
      break;
  }
  return d;
}

}  // namespace cm_detail
}  // namespace tessel
