// src/passes/program_passes.cpp — pack, async-collectives and memory-plan, and the pass manager
// (combine-collectives lives in src/passes/combine_collectives.cpp).
#include "tessel/passes/program_passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
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

Program async_collectives_pass(Program prog) {
  Program& p = prog;
  const std::string comm = "comm";
  std::vector<Instr> out;
  const std::size_t nv = p.values.size();
  std::vector<std::string> ready_on(nv);
  std::vector<int> ready_at(nv, -1);
  std::vector<bool> pending(nv, false);
  std::vector<int> started;  // values in flight, in start order
  std::map<std::pair<std::string, std::string>, int> synced;  // (waiting, waited) -> index
  std::map<std::string, int> last_on;                          // stream -> last instruction on it
  auto emit = [&](Instr in) {
    last_on[in.stream] = static_cast<int>(out.size());
    out.push_back(std::move(in));
  };
  auto wait = [&](const std::string& waited, const std::string& waiting) {
    auto it = last_on.find(waited);
    if (it == last_on.end()) return;
    auto s = synced.find({waiting, waited});
    if (s != synced.end() && s->second > it->second) return;  // nothing new on `waited`
    Instr w;
    w.kind = InstrKind::Wait;
    w.stream = waiting;
    w.wait_for = waited;
    synced[{waiting, waited}] = static_cast<int>(out.size());
    emit(std::move(w));
  };
  auto done = [&](int v) {
    Instr d;
    d.kind = InstrKind::CollectiveDone;
    d.stream = comm;
    d.in = {v};
    d.out = -1;
    pending[static_cast<std::size_t>(v)] = false;
    started.erase(std::find(started.begin(), started.end(), v));
    ready_on[static_cast<std::size_t>(v)] = comm;
    ready_at[static_cast<std::size_t>(v)] = static_cast<int>(out.size());
    emit(std::move(d));
  };
  auto ready_for = [&](const Instr& in) {
    for (int v : in.in)
      if (pending[static_cast<std::size_t>(v)]) done(v);
    for (int v : in.in) {
      const std::string& t = ready_on[static_cast<std::size_t>(v)];
      if (t.empty() || t == in.stream) continue;
      auto s = synced.find({in.stream, t});
      if (s == synced.end() || s->second < ready_at[static_cast<std::size_t>(v)]) wait(t, in.stream);
    }
  };
  for (Instr in : p.instrs) {
    if (in.kind == InstrKind::Collective) {
      in.kind = InstrKind::CollectiveStart;
      in.stream = comm;
      // The collective sees (and may overwrite storage freed by) everything before it.
      for (const auto& [s, i] : last_on)
        if (s != comm) wait(s, comm);
      ready_for(in);
      const int o = in.out;
      emit(std::move(in));
      pending[static_cast<std::size_t>(o)] = true;
      started.push_back(o);
      continue;
    }
    if (in.kind == InstrKind::CollectiveDone || in.kind == InstrKind::Wait) {
      throw Error("async-collectives: the program already has async collectives or waits; run the pass once, on "
                  "a program with synchronous collectives");
    }
    if (in.kind == InstrKind::CollectiveStart) throw Error("async-collectives: the program already has collective starts");
    ready_for(in);
    const int o = in.out;
    const std::vector<int> defs = in.defs();
    const std::string s = in.stream;
    const bool view = in.kind == InstrKind::View;
    const int src = view ? in.in[0] : -1;
    emit(std::move(in));
    if (view) {
      ready_on[static_cast<std::size_t>(o)] = ready_on[static_cast<std::size_t>(src)];
      ready_at[static_cast<std::size_t>(o)] = ready_at[static_cast<std::size_t>(src)];
    } else {
      for (int d : defs) {
        ready_on[static_cast<std::size_t>(d)] = s;
        ready_at[static_cast<std::size_t>(d)] = static_cast<int>(out.size()) - 1;
      }
    }
  }
  while (!started.empty()) done(started.front());
  p.instrs = std::move(out);
  p.memory = {};
  return prog;
}

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
    std::vector<Item> placed;
    for (const Item& it : items[pool]) {
      const std::size_t v = static_cast<std::size_t>(it.v);
      std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of placed values live with v
      for (const Item& q : placed) {
        const std::size_t w = static_cast<std::size_t>(q.v);
        if (!L.may_share(static_cast<int>(v), static_cast<int>(w))) busy.emplace_back(m.offset[w], m.offset[w] + q.bytes);
      }
      std::sort(busy.begin(), busy.end());
      int64_t best = -1, best_gap = 0, cursor = 0;
      for (const auto& [b, e] : busy) {
        if (b - cursor >= it.bytes && (best < 0 || b - cursor < best_gap)) {
          best = cursor;
          best_gap = b - cursor;
        }
        cursor = std::max(cursor, e);
      }
      if (best < 0) best = cursor;
      m.offset[v] = best;
      size = std::max(size, best + it.bytes);
      placed.push_back(it);
    }
  }
  p.memory = std::move(m);
  return p;
}

ProgramPassManager& ProgramPassManager::add(std::string name, ProgramPassFn fn) {
  for (const auto& pr : passes_)
    if (pr.first == name) throw Error(fmt::format("pass manager: pass '{}' is added twice", name));
  passes_.emplace_back(std::move(name), std::move(fn));
  return *this;
}

ProgramPassManager& ProgramPassManager::verify_each(bool on) {
  verify_ = on;
  return *this;
}

ProgramPassManager& ProgramPassManager::dump_after(std::string pass) {
  dump_after_.push_back(std::move(pass));
  return *this;
}

std::vector<std::string> ProgramPassManager::pass_names() const {
  std::vector<std::string> names;
  for (const auto& pr : passes_) names.push_back(pr.first);
  return names;
}

Program ProgramPassManager::run(Program p) {
  const auto names = pass_names();
  for (const auto& d : dump_after_)
    if (std::find(names.begin(), names.end(), d) == names.end())
      throw Error(fmt::format("--dump-after={}: no such Program pass (the passes: {})", d, join(names, ", ")));
  dumps_.clear();
  if (verify_) {
    try {
      verify_program(p);
    } catch (const ProgramError& e) {
      throw ProgramError(e.instruction(), fmt::format("before the first pass: {}", e.what()));
    }
  }
  for (auto& [name, fn] : passes_) {
    p = fn(std::move(p));
    if (verify_) {
      try {
        verify_program(p);
      } catch (const ProgramError& e) {
        throw ProgramError(e.instruction(), fmt::format("after pass '{}': {}", name, e.what()));
      }
    }
    if (std::find(dump_after_.begin(), dump_after_.end(), name) != dump_after_.end()) dumps_[name] = print_program(p);
  }
  return p;
}

bool ProgramPassOptions::fusion_default() {
  const char* v = std::getenv("TESSEL_FUSION");
  return !(v && std::string(v) == "0");
}

ProgramPassManager default_program_pipeline(const ProgramPassOptions& options) {
  ProgramPassManager pm;
  // First: it matches the partitioner's synchronous all-gathers and reduce-scatters next to
  // their einsums, and its permutes and ring copies are lowered like any others.
  const CollectiveMatmulOptions cm = options.collective_matmul;
  pm.add("collective-matmul", [cm](Program p) { return collective_matmul_pass(std::move(p), cm); });
  pm.add("pack", pack_pass);
  // After pack (every collective then moves one contiguous buffer), before async-collectives
  // (which gives the combined collective one start/done and places its waits).
  const int64_t threshold = options.combine_threshold_bytes;
  pm.add("combine-collectives", [threshold](Program p) { return combine_collectives_pass(std::move(p), threshold); });
  // After pack and combine-collectives (the kernels are final: combining adds concats and
  // views, which fusion leaves alone), before async-collectives (a fused kernel stands at its
  // root's place on compute; the async pass then places dones and waits for the fused
  // program, and memory-plan sees only the values that still reach memory).
  const bool fuse = options.fuse_elementwise, epilogues = options.fuse_einsum_epilogue;
  pm.add("fuse-elementwise",
         [fuse, epilogues](Program p) { return fuse ? fuse_elementwise_pass(std::move(p), epilogues) : p; });
  pm.add("async-collectives", async_collectives_pass);
  if (options.offload_min_bytes > 0) {
    const int64_t bytes = options.offload_min_bytes;
    const int gap = options.offload_min_gap, prefetch = options.offload_prefetch;
    pm.add("offload-activations",
           [bytes, gap, prefetch](Program p) { return offload_activations_pass(std::move(p), bytes, gap, prefetch); });
  }
  pm.add("memory-plan", memory_plan_pass);
#ifndef NDEBUG
  pm.verify_each(true);
#endif
  return pm;
}

std::vector<std::string> default_program_pass_names() { return default_program_pipeline().pass_names(); }

Program lower_program(const Program& partitioned, bool verify, const ProgramPassOptions& options) {
  ProgramPassManager pm = default_program_pipeline(options);
  if (verify) pm.verify_each(true);
  return pm.run(partitioned);
}

std::string dump_program_after(const Program& partitioned, const std::string& pass,
                               const ProgramPassOptions& options) {
  if (pass == "partition") return print_program(partitioned);
  ProgramPassManager pm = default_program_pipeline(options);
  const auto names = pm.pass_names();
  if (std::find(names.begin(), names.end(), pass) == names.end())
    throw Error(fmt::format("--dump-after={}: no such Program pass (partition, {})", pass, join(names, ", ")));
  pm.dump_after(pass);
  pm.run(partitioned);
  return pm.dumps().at(pass);
}

}  // namespace tessel
