// src/passes/collective_matmul.cpp — the collective-matmul pass (CollectiveEinsum, XLA's windowed
// einsum): an all-gather feeding an einsum, and an einsum feeding a reduce-scatter, become a
// ring of collective-permutes overlapped with partial einsums, where a two-stream timeline
// estimate from the cost model says it wins (docs/collective-matmul.md).
//
// All-gather → einsum over a ring of n devices (group index r): at step s a device holds the
// chunk of its neighbour s places on, (r+s) mod n; it passes that chunk on (to r-1, receiving
// from r+1) while it multiplies it, and writes its partial result at block (r+s) mod n. The
// permutes are emitted before the einsum of the same step, so the async-collectives pass
// starts each on the communication stream and waits for it only at the next step.
// Einsum → reduce-scatter is the dual: at step s the device computes the partial sum of block
// (r+s+1) mod n, adds the accumulator it received from r+1, and passes the sum to r-1; after n
// steps it holds the full sum of its own block r.
// Bidirectional: the chunk is split in two halves that travel the ring in opposite directions
// (the two permutes of a step are issued as one communicator group), so each link direction
// carries half the bytes.
//
// The sites and the gate that picks a variant are collective_matmul_plan.cpp.
#include "tessel/passes/collective_matmul.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessel/ops/registry.hpp"
#include "collective_matmul_sites.hpp"
#include "program_builders.hpp"

namespace tessel {
namespace {

using namespace detail;
using namespace cm_detail;

const char* variant_name(RingVariant v) {
  switch (v) {
    case RingVariant::None: return "none";
    case RingVariant::Uni: return "unidirectional";
    case RingVariant::Bi: return "bidirectional";
  }
  return "?";
}

// Pairs (source, target) of a permute that sends every device's buffer `step` places along
// its ring for `axes` (step -1: to r-1, so that each device receives from r+1).
std::vector<std::pair<int64_t, int64_t>> ring_pairs(const Mesh& mesh, const std::vector<std::string>& axes, int64_t step) {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  const int64_t n = mesh.axes_size(axes);
  for (int64_t q = 0; q < mesh.num_devices(); ++q) {
    const auto g = mesh.group(q, axes);
    const int64_t r = mesh.index_in_group(q, axes);
    pairs.push_back({q, g[static_cast<std::size_t>(((r + step) % n + n) % n)]});
  }
  return pairs;
}

IndexExpr ring_offset(const Site& s, int64_t stride, int64_t base, int64_t shift) {
  IndexExpr e;
  e.base = base;
  e.stride = stride;
  e.axes = s.axes;
  e.shift = ((shift % s.n) + s.n) % s.n;
  e.modulus = s.n;
  return e;
}

std::vector<IndexExpr> zeros(std::size_t rank) { return std::vector<IndexExpr>(rank); }

// ---- the rewrite ------------------------------------------------------------------------------

struct Rewriter {
  Program& p;
  ScratchValues scratch;
  std::vector<Instr> out;
  explicit Rewriter(Program& prog) : p(prog), scratch(prog) {}

  const LocalValue& val(int v) const { return p.values[static_cast<std::size_t>(v)]; }
  Shape shape(int v) const { return val(v).shape; }

  Instr kernel(const Instr& like, OpKind op, std::vector<int> in, int dst) {
    Instr k;
    k.kind = InstrKind::Kernel;
    k.op = op;
    if (op == OpKind::Einsum) k.attrs.equation = like.attrs.equation;
    k.in = std::move(in);
    k.out = dst;
    k.graph_op = like.graph_op;
    k.note = like.note;
    k.stream = like.stream;
    std::vector<Shape> shapes;
    for (int v : k.in) shapes.push_back(shape(v));
    if (op_def(op).flops) k.flops = op_def(op).flops(k.attrs, shapes, shape(dst));
    return k;
  }
  Instr permute(const Instr& like, int src, int dst, const Site& s, int64_t step, const CostModel& m) {
    Instr c;
    c.kind = InstrKind::Collective;
    c.collective = CollectiveKind::CollectivePermute;
    for (const auto& a : p.mesh.axes()) c.axes.push_back(a.name);
    c.pairs = ring_pairs(p.mesh, s.axes, step);
    c.in = {src};
    c.out = dst;
    c.bytes = val(dst).bytes();
    const LinkSpec l = m.link(s.axes);
    c.seconds = l.alpha_s + static_cast<double>(c.bytes) / l.bandwidth;
    c.graph_op = like.graph_op;
    c.note = fmt::format("collective matmul ring step over {{{}}}", fmt::join(s.axes, ","));
    c.stream = like.stream;
    return c;
  }
  // dst = the block of `src` whose offset along `dim` is stride*((r+shift) mod n) + base.
  int ring_slice(const Instr& like, int src, int dim, int64_t extent, int64_t base, int64_t shift, const Site& s,
                 const std::string& name) {
    Shape blk = shape(src);
    blk[static_cast<std::size_t>(dim)] = extent;
    const int dst = scratch.add(name, val(src).dtype, blk);
    CopyBlock cb;
    cb.src = zeros(blk.size());
    cb.dst = zeros(blk.size());
    cb.src[static_cast<std::size_t>(dim)] = ring_offset(s, s.chunk, base, shift);
    out.push_back(copy_instr(src, dst, blk, {cb}, like.stream, like.graph_op));
    return dst;
  }
  // dst = the block [base, base+extent) of `src` along `dim`, a constant offset.
  int slice(const Instr& like, int src, int dim, int64_t base, int64_t extent, const std::string& name) {
    Shape blk = shape(src);
    blk[static_cast<std::size_t>(dim)] = extent;
    const int dst = scratch.add(name, val(src).dtype, blk);
    CopyBlock cb;
    cb.src = zeros(blk.size());
    cb.dst = zeros(blk.size());
    cb.src[static_cast<std::size_t>(dim)].base = base;
    out.push_back(copy_instr(src, dst, blk, {cb}, like.stream, like.graph_op));
    return dst;
  }

  // All-gather → einsum. `halves` 1: one ring (receive from r+1); 2: the first half of each
  // chunk travels that way, the second the other way (receive from r-1).
  void gather(const Site& s, int halves, const CostModel& m) {
    const Instr& ag = p.instrs[static_cast<std::size_t>(s.coll)];
    const Instr e = p.instrs[static_cast<std::size_t>(s.einsum)];
    const int x = ag.in[0];
    const int gi = s.operand, wi = 1 - s.operand;
    const int w = e.in[static_cast<std::size_t>(wi)];
    const int wdim = s.op_dim[static_cast<std::size_t>(wi)];
    const int64_t part = s.chunk / halves;
    const std::string base = val(e.out).name;
    // cur[h]: the half-chunk of ring h held now; h = 0 travels from r+1, h = 1 from r-1.
    std::vector<int> cur(static_cast<std::size_t>(halves));
    for (int h = 0; h < halves; ++h)
      cur[static_cast<std::size_t>(h)] = halves == 1 ? x : slice(e, x, ag.dim, h * part, part, fmt::format("{}.half{}", base, h));
    std::vector<int> partials;
    std::vector<CopyBlock> blocks;
    int acc = -1;
    for (int64_t i = 0; i < s.n; ++i) {
      std::vector<int> next(static_cast<std::size_t>(halves), -1);
      // The chunks received at the previous step are read on compute through views (no
      // copy) emitted before this step's permutes: async-collectives then makes compute wait
      // for those chunks before the next permutes start, not after — a wait placed at the
      // einsum would cover the next permutes too, and each einsum would follow the transfer
      // of the chunk after its own (the ring serialised; docs/collective-matmul.md).
      std::vector<int> held = cur;
      if (i > 0)
        for (int h = 0; h < halves; ++h) {
          const int c = cur[static_cast<std::size_t>(h)];
          held[static_cast<std::size_t>(h)] = scratch.add(fmt::format("{}.held{}.{}", base, h, i), val(c).dtype, shape(c));
          out.push_back(view_instr(c, held[static_cast<std::size_t>(h)], 0, e.stream, e.graph_op));
        }
      if (i + 1 < s.n)
        for (int h = 0; h < halves; ++h) {
          const int c = cur[static_cast<std::size_t>(h)];
          next[static_cast<std::size_t>(h)] = scratch.add(fmt::format("{}.ring{}.{}", base, h, i + 1), val(c).dtype, shape(c));
          out.push_back(permute(e, c, next[static_cast<std::size_t>(h)], s, h == 0 ? -1 : 1, m));
        }
      for (int h = 0; h < halves; ++h) {
        // Ring h holds, at step i, the chunk of device r+i (h = 0) or r-i (h = 1).
        const int64_t shift = h == 0 ? i : -i;
        std::vector<int> ins(2);
        ins[static_cast<std::size_t>(gi)] = held[static_cast<std::size_t>(h)];
        ins[static_cast<std::size_t>(wi)] =
            wdim < 0 ? w : ring_slice(e, w, wdim, part, h * part, shift, s, fmt::format("{}.w{}.{}", base, h, i));
        Shape ps = shape(e.out);
        if (s.out_dim >= 0) ps[static_cast<std::size_t>(s.out_dim)] = part;
        const bool last = i + 1 == s.n && h + 1 == halves;
        if (s.out_dim < 0) {
          // Contracted ring dim: the partial products sum into the result.
          const int pv = scratch.add(fmt::format("{}.part{}.{}", base, h, i), val(e.out).dtype, ps);
          out.push_back(kernel(e, OpKind::Einsum, ins, pv));
          if (acc < 0) {
            acc = pv;
          } else {
            const int sum = last ? e.out : scratch.add(fmt::format("{}.acc{}.{}", base, h, i), val(e.out).dtype, ps);
            out.push_back(kernel(e, OpKind::Add, {acc, pv}, sum));
            acc = sum;
          }
          continue;
        }
        const int pv = scratch.add(fmt::format("{}.part{}.{}", base, h, i), val(e.out).dtype, ps);
        out.push_back(kernel(e, OpKind::Einsum, ins, pv));
        CopyBlock cb;
        cb.input = static_cast<int>(partials.size());
        cb.src = zeros(ps.size());
        cb.dst = zeros(ps.size());
        cb.dst[static_cast<std::size_t>(s.out_dim)] = ring_offset(s, s.chunk, h * part, shift);
        partials.push_back(pv);
        blocks.push_back(std::move(cb));
      }
      for (int h = 0; h < halves; ++h)
        if (next[static_cast<std::size_t>(h)] >= 0) cur[static_cast<std::size_t>(h)] = next[static_cast<std::size_t>(h)];
    }
    if (s.out_dim >= 0) {
      Shape blk = shape(e.out);
      blk[static_cast<std::size_t>(s.out_dim)] = part;
      Instr cp = copy_instr(partials[0], e.out, blk, std::move(blocks), e.stream, e.graph_op);
      cp.in = partials;
      cp.note = "collective matmul: the ring's partial results, each at its block";
      out.push_back(std::move(cp));
    }
  }

  // Einsum → reduce-scatter. Ring h = 0: accumulators travel to r-1 (block (r+i+1) mod n at
  // step i); h = 1: to r+1 (block (r-i-1) mod n); each carries its half of the block.
  void scatter(const Site& s, int halves, const CostModel& m) {
    const Instr& rs = p.instrs[static_cast<std::size_t>(s.coll)];
    const Instr e = p.instrs[static_cast<std::size_t>(s.einsum)];
    const int64_t part = s.chunk / halves;
    const std::string base = val(rs.out).name;
    Shape ps = shape(rs.out);
    ps[static_cast<std::size_t>(s.out_dim)] = part;
    std::vector<int> acc(static_cast<std::size_t>(halves), -1);
    std::vector<int> results(static_cast<std::size_t>(halves), -1);
    for (int64_t i = 0; i < s.n; ++i) {
      const bool last = i + 1 == s.n;
      std::vector<int> recv(static_cast<std::size_t>(halves), -1);
      if (i > 0)
        for (int h = 0; h < halves; ++h) {
          const int a = acc[static_cast<std::size_t>(h)];
          recv[static_cast<std::size_t>(h)] = scratch.add(fmt::format("{}.ring{}.{}", base, h, i), val(a).dtype, shape(a));
          out.push_back(permute(e, a, recv[static_cast<std::size_t>(h)], s, h == 0 ? -1 : 1, m));
        }
      for (int h = 0; h < halves; ++h) {
        const int64_t shift = h == 0 ? i + 1 : -i - 1;
        std::vector<int> ins(2);
        for (int k = 0; k < 2; ++k) {
          const int d = s.op_dim[static_cast<std::size_t>(k)];
          const int v = e.in[static_cast<std::size_t>(k)];
          ins[static_cast<std::size_t>(k)] =
              d < 0 ? v : ring_slice(e, v, d, part, h * part, shift, s, fmt::format("{}.in{}.{}.{}", base, k, h, i));
        }
        const bool final_half = last && halves == 1;
        const int pv = scratch.add(fmt::format("{}.part{}.{}", base, h, i), val(rs.out).dtype, ps);
        out.push_back(kernel(e, OpKind::Einsum, ins, pv));
        if (i == 0) {
          acc[static_cast<std::size_t>(h)] = pv;
          continue;
        }
        const int sum = final_half ? rs.out : scratch.add(fmt::format("{}.acc{}.{}", base, h, i), val(rs.out).dtype, ps);
        // The add reads the partial through a view (no copy): a fusion barrier. Made the
        // einsum's epilogue (fuse-elementwise), the add would make the einsum wait for the
        // accumulator's permute, and each step's product would follow its transfer instead of
        // running under it (the ring serialised; docs/collective-matmul.md).
        const int pview = scratch.add(fmt::format("{}.p{}.{}", base, h, i), val(pv).dtype, ps);
        out.push_back(view_instr(pv, pview, 0, e.stream, e.graph_op));
        out.push_back(kernel(e, OpKind::Add, {recv[static_cast<std::size_t>(h)], pview}, sum));
        acc[static_cast<std::size_t>(h)] = sum;
        if (last) results[static_cast<std::size_t>(h)] = sum;
      }
    }
    if (halves == 2) {
      // The two halves of the device's own block, side by side along the ring dim.
      std::vector<CopyBlock> blocks;
      for (int h = 0; h < 2; ++h) {
        CopyBlock cb;
        cb.input = h;
        cb.src = zeros(ps.size());
        cb.dst = zeros(ps.size());
        cb.dst[static_cast<std::size_t>(s.out_dim)].base = h * part;
        blocks.push_back(std::move(cb));
      }
      Instr cp = copy_instr(results[0], rs.out, ps, std::move(blocks), e.stream, e.graph_op);
      cp.in = results;
      cp.note = "collective matmul: the two halves of this device's block";
      out.push_back(std::move(cp));
    }
  }
};

}  // namespace

std::vector<CollectiveMatmulSite> collective_matmul_sites(const Program& p, const CollectiveMatmulOptions& options) {
  options.cost.validate();
  std::vector<std::pair<int, std::string>> declined;
  const std::vector<Site> sites = find_sites(p, &declined);
  std::vector<CollectiveMatmulSite> out;
  for (const Site& s : sites) out.push_back(decide(p, s, options));
  for (auto& [i, why] : declined) {
    CollectiveMatmulSite d;
    const Instr& c = p.instrs[static_cast<std::size_t>(i)];
    d.instr = i;
    d.gather = c.collective == CollectiveKind::AllGather;
    d.ring = p.mesh.axes_size(c.axes);
    d.axes = c.axes;
    d.description = fmt::format("%{} = {}(%{}) axes={{{}}} dim={}", p.values[static_cast<std::size_t>(c.out)].name,
                                collective_name(c.collective), p.values[static_cast<std::size_t>(c.in[0])].name,
                                fmt::join(c.axes, ","), c.dim);
    d.reason = "not rewritable: " + why;
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.instr < b.instr; });
  return out;
}

std::string CollectiveMatmulSite::line() const {
  std::string s = fmt::format("{} over {{{}}} (ring of {}): {}", gather ? "all-gather -> einsum" : "einsum -> reduce-scatter",
                              fmt::join(axes, ","), ring, description);
  if (before_s > 0) {
    s += fmt::format("\n    estimate: as is {:.3f} us, ring {:.3f} us{}", before_s * 1e6, uni_s * 1e6,
                     bi_s >= 0 ? fmt::format(", bidirectional ring {:.3f} us", bi_s * 1e6) : std::string());
    s += fmt::format("\n    terms: dispatch {:.3f} us per instruction (as is 2, ring {}{}), compute x{:.3g} "
                     "(device programs per device's compute)",
                     dispatch_s * 1e6, uni_instrs, bi_s >= 0 ? fmt::format(", bidirectional ring {}", bi_instrs) : std::string(),
                     compute_sharing);
  }
  s += fmt::format("\n    decision: {} ({})", variant == RingVariant::None ? "keep" : variant_name(variant), reason);
  return s;
}

Program collective_matmul_pass(Program p, const CollectiveMatmulOptions& options) {
  if (options.mode == OverlapMode::Off) return p;
  options.cost.validate();
  for (const Instr& in : p.instrs)
    if (in.kind == InstrKind::CollectiveStart || in.kind == InstrKind::Wait)
      throw Error("collective-matmul: the program already has asynchronous collectives; run the pass before "
                  "async-collectives");
  const std::vector<Site> sites = find_sites(p, nullptr);
  std::map<int, std::pair<Site, RingVariant>> at_einsum;  // einsum index -> site to rewrite there
  std::vector<bool> drop(p.instrs.size(), false);
  for (const Site& s : sites) {
    const CollectiveMatmulSite d = decide(p, s, options);
    if (d.variant == RingVariant::None) continue;
    // An einsum between an all-gather and a reduce-scatter can take part in one site only.
    if (at_einsum.count(s.einsum) || drop[static_cast<std::size_t>(s.coll)]) continue;
    at_einsum[s.einsum] = {s, d.variant};
    drop[static_cast<std::size_t>(s.coll)] = true;
  }
  if (at_einsum.empty()) return p;
  Rewriter rw(p);
  const std::vector<Instr> instrs = p.instrs;
  for (std::size_t i = 0; i < instrs.size(); ++i) {
    auto it = at_einsum.find(static_cast<int>(i));
    if (it != at_einsum.end()) {
      const int halves = it->second.second == RingVariant::Bi ? 2 : 1;
      if (it->second.first.gather)
        rw.gather(it->second.first, halves, options.cost);
      else
        rw.scatter(it->second.first, halves, options.cost);
      continue;
    }
    if (drop[i]) continue;
    rw.out.push_back(instrs[i]);
  }
  p.instrs = std::move(rw.out);
  return p;
}

}  // namespace tessel
