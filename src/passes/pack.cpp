// src/passes/pack.cpp — the pack pass (program_passes.hpp): every layout decision the executor
// used to make at run time becomes an instruction. A collective over a non-leading dim gets
// `copy` instructions that pack the dim into rank-major blocks and unpack them, so every
// communicator moves one contiguous buffer (what NCCL and MPI take); a shard slice becomes a
// `copy` of the device's block; a relabel becomes a `view`.
#include "tessel/passes/program_passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "program_builders.hpp"

namespace tessel {
namespace {

using namespace detail;

// Product of the dims before `d`: 1 means blocks along `d` are contiguous (no packing).
int64_t outer(const Shape& s, int d) {
  int64_t n = 1;
  for (int i = 0; i < d && static_cast<std::size_t>(i) < s.size(); ++i) n *= s[static_cast<std::size_t>(i)];
  return n;
}

struct Builder {
  Program p;
  ScratchValues scratch;  // adds to p
  std::vector<Instr> out;

  explicit Builder(Program prog) : p(std::move(prog)), scratch(p) {}
  const LocalValue& val(int v) const { return p.values[static_cast<std::size_t>(v)]; }
};

std::vector<IndexExpr> at_dim(std::size_t rank, int dim, int64_t v) {
  std::vector<IndexExpr> e(rank);
  if (dim >= 0 && static_cast<std::size_t>(dim) < rank) e[static_cast<std::size_t>(dim)].base = v;
  return e;
}

// A copy next to `like` (its stream, its graph op).
Instr copy_like(const Instr& like, int src, int dst, const Shape& block, std::vector<CopyBlock> copies) {
  return copy_instr(src, dst, block, std::move(copies), like.stream, like.graph_op);
}

// Rank-major blocks r = 0..n-1: dim `d` of `spread` at r*block[d] <-> rows r*block[0] of the
// packed tensor.
std::vector<CopyBlock> rank_major(const Shape& block, int d, int64_t n, bool to_packed) {
  std::vector<CopyBlock> cs;
  for (int64_t r = 0; r < n; ++r) {
    CopyBlock c;
    auto spread = at_dim(block.size(), d, r * block[static_cast<std::size_t>(d)]);
    auto packed = at_dim(block.size(), 0, r * block[0]);
    c.src = to_packed ? spread : packed;
    c.dst = to_packed ? packed : spread;
    cs.push_back(std::move(c));
  }
  return cs;
}

Shape times_rows(Shape s, int64_t n) {
  s[0] *= n;
  return s;
}

}  // namespace

Program pack_pass(Program prog) {
  Builder b(std::move(prog));
  std::vector<bool> is_output(b.p.values.size(), false);
  for (int v : b.p.outputs) is_output[static_cast<std::size_t>(v)] = true;
  for (Instr& in : b.p.instrs) {
    if (in.kind == InstrKind::ShardSlice) {
      const LocalValue& o = b.val(in.out);
      const std::size_t r = o.shape.size();
      if (in.axes.empty() && !is_output[static_cast<std::size_t>(in.out)]) {
        Instr v = in;
        v.kind = InstrKind::View;
        v.view_offset = 0;
        b.out.push_back(std::move(v));
        continue;
      }
      CopyBlock c = whole_block(r);
      if (!in.axes.empty()) {
        c.src[static_cast<std::size_t>(in.dim)].stride = o.shape[static_cast<std::size_t>(in.dim)];
        c.src[static_cast<std::size_t>(in.dim)].axes = in.axes;
      }
      Instr cp = copy_like(in, in.in[0], in.out, o.shape, {c});
      cp.note = in.note;
      b.out.push_back(std::move(cp));
      continue;
    }
    if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) {
      b.out.push_back(in);
      continue;
    }
    const int x = in.in[0];
    const Shape xs = b.val(x).shape;
    const Shape os = b.val(in.out).shape;
    const DType dt = b.val(x).dtype;
    const int64_t n = in.collective == CollectiveKind::CollectivePermute ? 1 : b.p.mesh.axes_size(in.axes);
    switch (in.collective) {
      case CollectiveKind::AllGather: {
        if (outer(xs, in.dim) == 1) break;
        const int final_out = in.out;
        const int tmp = b.scratch.add(b.val(final_out).name + ".packed", dt, times_rows(xs, n));
        Instr g = in;
        g.dim = 0;
        g.out = tmp;
        b.out.push_back(std::move(g));
        b.out.push_back(copy_like(in, tmp, final_out, xs, rank_major(xs, in.dim, n, false)));
        continue;
      }
      case CollectiveKind::ReduceScatter: {
        if (outer(xs, in.dim) == 1) break;
        const int tmp = b.scratch.add(b.val(x).name + ".packed", dt, times_rows(os, n));
        b.out.push_back(copy_like(in, x, tmp, os, rank_major(os, in.dim, n, true)));
        Instr rs = in;
        rs.dim = 0;
        rs.in = {tmp};
        b.out.push_back(std::move(rs));
        continue;
      }
      case CollectiveKind::AllToAll: {
        const bool pack_in = outer(xs, in.dim) != 1, unpack_out = outer(os, in.dim2) != 1;
        if (!pack_in && !unpack_out) break;
        Shape blk = xs;
        blk[static_cast<std::size_t>(in.dim)] /= n;
        Instr a = in;
        if (pack_in) {
          const int send = b.scratch.add(b.val(x).name + ".packed", dt, times_rows(blk, n));
          b.out.push_back(copy_like(in, x, send, blk, rank_major(blk, in.dim, n, true)));
          a.in = {send};
          a.dim = 0;
        }
        if (unpack_out) {
          const int recv = b.scratch.add(b.val(in.out).name + ".packed", dt, times_rows(blk, n));
          a.out = recv;
          a.dim2 = 0;
          b.out.push_back(a);
          b.out.push_back(copy_like(in, recv, in.out, blk, rank_major(blk, in.dim2, n, false)));
        } else {
          b.out.push_back(a);
        }
        continue;
      }
      default: break;
    }
    b.out.push_back(in);
  }
  b.p.instrs = std::move(b.out);
  b.p.memory = {};
  return std::move(b.p);
}

}  // namespace tessel
