// src/ir/program_verify.cpp — the Program verifier and the liveness both it and the memory-plan
// pass use (one definition of "live", so a plan the pass makes is a plan the verifier accepts).
#include "tessel/ir/program_verify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "tessel/ir/interference.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {
namespace {

std::string kind_name(const Instr& in) {
  switch (in.kind) {
    case InstrKind::Kernel: return op_name(in.op);
    case InstrKind::Collective: return collective_name(in.collective);
    case InstrKind::CollectiveStart: return collective_start_name(in.collective);
    case InstrKind::ShardSlice: return "shard_slice";
    case InstrKind::Copy: return "copy";
    case InstrKind::View: return "view";
    case InstrKind::CollectiveDone: return "done";
    case InstrKind::Wait: return "wait";
  }
  return "?";
}

}  // namespace

std::string describe_instr(const Program& p, int i) {
  if (i < 0 || static_cast<std::size_t>(i) >= p.instrs.size()) return fmt::format("#{}", i);
  const Instr& in = p.instrs[static_cast<std::size_t>(i)];
  if (in.kind == InstrKind::Wait) return fmt::format("#{} (wait {} @{})", i, in.wait_for, in.stream);
  auto vn = [&](int v) {
    return v >= 0 && static_cast<std::size_t>(v) < p.values.size() ? "%" + p.values[static_cast<std::size_t>(v)].name
                                                                    : fmt::format("<value {}>", v);
  };
  if (in.kind == InstrKind::CollectiveDone)
    return fmt::format("#{} (done {} @{})", i, in.in.empty() ? std::string("?") : vn(in.in[0]), in.stream);
  return fmt::format("#{} ({} = {})", i, vn(in.out), kind_name(in));
}

Liveness compute_liveness(const Program& p) {
  const std::size_t nv = p.values.size();
  const int n = static_cast<int>(p.instrs.size());
  Liveness L;
  L.first.assign(nv, -1);
  L.last.assign(nv, -1);
  L.root.resize(nv);
  L.def_stream.assign(nv, "");
  L.access.assign(nv, {});
  for (std::size_t v = 0; v < nv; ++v) L.root[v] = static_cast<int>(v);
  for (const Instr& in : p.instrs)
    if (in.kind == InstrKind::View && in.out >= 0 && !in.in.empty())
      L.root[static_cast<std::size_t>(in.out)] = L.root[static_cast<std::size_t>(in.in[0])];
  for (int i = 0; i < n; ++i) {
    const Instr& in = p.instrs[static_cast<std::size_t>(i)];
    if (in.kind == InstrKind::Wait) L.waits[{in.stream, in.wait_for}].push_back(i);
  }
  std::vector<int> done_at(nv, -1);
  for (int i = 0; i < n; ++i) {
    const Instr& in = p.instrs[static_cast<std::size_t>(i)];
    if (in.kind == InstrKind::CollectiveDone && !in.in.empty()) done_at[static_cast<std::size_t>(in.in[0])] = i;
  }
  auto touch = [&](int v, const std::string& s, int i) {
    auto& acc = L.access[static_cast<std::size_t>(L.root[static_cast<std::size_t>(v)])];
    for (auto& [t, u] : acc)
      if (t == s) {
        u = std::max(u, i);
        return;
      }
    acc.emplace_back(s, i);
  };
  for (int i = 0; i < n; ++i) {
    const Instr& in = p.instrs[static_cast<std::size_t>(i)];
    if (in.kind == InstrKind::Wait || in.kind == InstrKind::CollectiveDone) continue;
    // A started collective reads its operand and writes its result until its done.
    const int until = in.kind == InstrKind::CollectiveStart && in.out >= 0 && done_at[static_cast<std::size_t>(in.out)] >= 0
                          ? done_at[static_cast<std::size_t>(in.out)]
                          : i;
    for (int v : in.in) touch(v, in.stream, until);
    for (int d : in.defs()) {
      const std::size_t o = static_cast<std::size_t>(d);
      if (L.root[o] == d) {
        L.first[o] = i;
        L.def_stream[o] = in.stream;
      }
      touch(d, in.stream, until);
    }
  }
  for (std::size_t r = 0; r < nv; ++r)
    for (const auto& [s, u] : L.access[r]) L.last[r] = std::max(L.last[r], u);
  for (int v : p.inputs) L.first[static_cast<std::size_t>(v)] = -1;
  for (int v : p.outputs) L.last[static_cast<std::size_t>(L.root[static_cast<std::size_t>(v)])] = n;
  for (std::size_t v = 0; v < nv; ++v) {
    const std::size_t r = static_cast<std::size_t>(L.root[v]);
    L.first[v] = L.first[r];
    L.last[v] = L.last[r];
  }
  return L;
}

bool Liveness::may_share(int a, int b) const {
  int x = root[static_cast<std::size_t>(a)], y = root[static_cast<std::size_t>(b)];
  if (x == y) return false;
  if (first[static_cast<std::size_t>(x)] > first[static_cast<std::size_t>(y)]) std::swap(x, y);
  const std::size_t X = static_cast<std::size_t>(x), Y = static_cast<std::size_t>(y);
  const int def = first[Y];
  if (first[X] == def || last[X] >= def) return false;
  for (const auto& [t, u] : access[X]) {
    if (u >= def) return false;
    if (t == def_stream[Y]) continue;
    auto it = waits.find({def_stream[Y], t});
    if (it == waits.end()) return false;
    auto pos = std::upper_bound(it->second.begin(), it->second.end(), u);
    if (pos == it->second.end() || *pos >= def) return false;
  }
  return true;
}

void verify_program(const Program& p) {
  const std::size_t nv = p.values.size();
  const int n = static_cast<int>(p.instrs.size());
  auto err = [&](int i, const std::string& msg) -> ProgramError {
    return ProgramError(i, fmt::format("program verifier: instruction {}: {}", describe_instr(p, i), msg));
  };
  auto vname = [&](int v) { return "%" + p.values[static_cast<std::size_t>(v)].name; };
  auto check_id = [&](int i, int v) {
    if (v < 0 || static_cast<std::size_t>(v) >= nv) throw err(i, fmt::format("names value id {} of {}", v, nv));
  };
  std::vector<bool> defined(nv, false), pending(nv, false), is_view(nv, false);
  std::vector<int> def_instr(nv, -1), ready_at(nv, -1);
  std::vector<std::string> ready_on(nv), started_on(nv);
  std::map<std::pair<std::string, std::string>, int> synced;  // (waiting, waited) -> last wait
  for (int v : p.inputs) {
    if (v < 0 || static_cast<std::size_t>(v) >= nv) throw ProgramError(-1, fmt::format("program verifier: input id {} of {}", v, nv));
    if (defined[static_cast<std::size_t>(v)])
      throw ProgramError(-1, fmt::format("program verifier: input {} is listed twice", vname(v)));
    defined[static_cast<std::size_t>(v)] = true;
  }
  auto check_layout = [&](int i, int v) {
    const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
    try {
      lv.sharding.validate(p.mesh, lv.global_shape, "value " + vname(v));
      const Shape local = lv.sharding.local_shape(p.mesh, lv.global_shape);
      if (local != lv.shape)
        throw err(i, fmt::format("{} has local type {} but its global type {} under sharding {} gives {}", vname(v),
                                 type_str(lv.dtype, lv.shape), type_str(lv.dtype, lv.global_shape),
                                 lv.sharding.to_string(), shape_str(local)));
    } catch (const ProgramError&) {
      throw;
    } catch (const Error& e) {
      throw err(i, e.what());
    }
  };
  for (int v : p.inputs) check_layout(-1, v);

  for (int i = 0; i < n; ++i) {
    const Instr& in = p.instrs[static_cast<std::size_t>(i)];
    const std::string& S = in.stream;
    if (S.empty()) throw err(i, "has no stream");
    for (int v : in.in) check_id(i, v);
    if (in.kind == InstrKind::Wait) {
      if (in.wait_for.empty() || in.wait_for == S)
        throw err(i, fmt::format("a stream waits for another stream, not '{}' (write 'wait compute @comm')", in.wait_for));
      if (!in.in.empty() || in.out >= 0) throw err(i, "a wait has no operands and no result");
      synced[{S, in.wait_for}] = i;
      continue;
    }
    if (in.kind == InstrKind::CollectiveDone) {
      if (in.in.size() != 1 || in.out >= 0) throw err(i, "a done names exactly the started value");
      const int v = in.in[0];
      if (!pending[static_cast<std::size_t>(v)])
        throw err(i, fmt::format("{} has no collective start in flight (every done needs one start before it)", vname(v)));
      if (started_on[static_cast<std::size_t>(v)] != S)
        throw err(i, fmt::format("{} was started on stream '{}' but is done on '{}'", vname(v),
                                 started_on[static_cast<std::size_t>(v)], S));
      pending[static_cast<std::size_t>(v)] = false;
      ready_on[static_cast<std::size_t>(v)] = S;
      ready_at[static_cast<std::size_t>(v)] = i;
      continue;
    }
    // Operands: defined, not in flight, ready on this stream.
    for (int v : in.in) {
      const std::size_t u = static_cast<std::size_t>(v);
      if (!defined[u]) throw err(i, fmt::format("reads {} before it is defined", vname(v)));
      if (pending[u])
        throw err(i, fmt::format("reads {} while its collective is in flight (add 'done {} @{}' before it)", vname(v),
                                 vname(v), started_on[u]));
      const std::string& T = ready_on[u];
      if (!T.empty() && T != S) {
        auto it = synced.find({S, T});
        if (it == synced.end() || it->second < ready_at[u])
          throw err(i, fmt::format("reads {} on stream '{}', but it was made ready on stream '{}' by {} and no "
                                   "'wait {} @{}' follows that (events are the only edges between streams)",
                                   vname(v), S, T, describe_instr(p, ready_at[u]), T, S));
      }
    }
    check_id(i, in.out);
    if (!in.extra_out.empty() && in.kind != InstrKind::Kernel)
      throw err(i, "only a kernel defines several values");
    for (int d : in.defs()) {
      check_id(i, d);
      if (defined[static_cast<std::size_t>(d)]) throw err(i, fmt::format("defines {} a second time", vname(d)));
      check_layout(i, d);
    }
    // Host memory (offloaded values) is moved by copies only; nothing else reads or writes it.
    if (in.kind != InstrKind::Copy) {
      for (int v : in.in)
        if (p.values[static_cast<std::size_t>(v)].host)
          throw err(i, fmt::format("reads {}, which lives in host memory (memory=host): only a copy may; reload it "
                                   "into device memory first", vname(v)));
      for (int d : in.defs())
        if (p.values[static_cast<std::size_t>(d)].host)
          throw err(i, fmt::format("defines {} in host memory (memory=host): only a copy may", vname(d)));
    }
    for (std::size_t a = 0; a < in.extra_out.size(); ++a)
      if (in.extra_out[a] == in.out ||
          std::find(in.extra_out.begin() + static_cast<std::ptrdiff_t>(a) + 1, in.extra_out.end(), in.extra_out[a]) != in.extra_out.end())
        throw err(i, fmt::format("defines {} twice", vname(in.extra_out[a])));
    const std::size_t o = static_cast<std::size_t>(in.out);
    const LocalValue& ov = p.values[o];
    auto arity = [&](std::size_t k) {
      if (in.in.size() != k) throw err(i, fmt::format("takes {} operand(s), got {}", k, in.in.size()));
    };
    auto same_dtype = [&]() {
      if (p.values[static_cast<std::size_t>(in.in[0])].dtype != ov.dtype)
        throw err(i, fmt::format("changes the dtype from {} to {}", dtype_name(p.values[static_cast<std::size_t>(in.in[0])].dtype),
                                 dtype_name(ov.dtype)));
    };
    auto group_size = [&](const std::vector<std::string>& axes) {
      for (const auto& a : axes)
        if (!p.mesh.has_axis(a)) throw err(i, fmt::format("names mesh axis '{}' not in mesh {}", a, p.mesh.to_string()));
      return p.mesh.axes_size(axes);
    };
    switch (in.kind) {
      case InstrKind::Kernel: {
        const OpDef& def = op_def(in.op);
        if (in.op == OpKind::Input || in.op == OpKind::ShardingConstraint) throw err(i, "is not a kernel");
        if (static_cast<int>(in.in.size()) < def.min_inputs || (def.max_inputs >= 0 && static_cast<int>(in.in.size()) > def.max_inputs))
          throw err(i, fmt::format("{} takes {}..{} operands, got {}", def.name, def.min_inputs, def.max_inputs, in.in.size()));
        // Kernels that read positions (one_hot, gather, ...) keep global extents in their
        // attributes and get their block's offsets: their types are checked globally.
        const bool global = def.needs_offsets;
        std::vector<Value> vals(in.in.size());
        std::vector<const Value*> ptrs;
        for (std::size_t j = 0; j < in.in.size(); ++j) {
          const LocalValue& lv = p.values[static_cast<std::size_t>(in.in[j])];
          vals[j].name = lv.name;
          vals[j].shape = global ? lv.global_shape : lv.shape;
          vals[j].dtype = lv.dtype;
          ptrs.push_back(&vals[j]);
        }
        std::vector<ResultType> types;
        try {
          types = infer_op(in.op, in.attrs, ptrs);
        } catch (const Error& e) {
          throw err(i, fmt::format("the registry's shape function rejects it: {}", e.what()));
        }
        const std::vector<int> defs = in.defs();
        if (types.size() != defs.size())
          throw err(i, fmt::format("{} has {} result(s), the instruction defines {}", def.name, types.size(), defs.size()));
        for (std::size_t r = 0; r < defs.size(); ++r) {
          const LocalValue& rv = p.values[static_cast<std::size_t>(defs[r])];
          const Shape& have = global ? rv.global_shape : rv.shape;
          if (types[r].shape != have || types[r].dtype != rv.dtype)
            throw err(i, fmt::format("the registry infers {} from the {} operands, but {} is {}",
                                     type_str(types[r].dtype, types[r].shape), global ? "global" : "local",
                                     vname(defs[r]), type_str(rv.dtype, have)));
        }
        break;
      }
      case InstrKind::Collective:
      case InstrKind::CollectiveStart: {
        arity(1);
        same_dtype();
        const Shape& x = p.values[static_cast<std::size_t>(in.in[0])].shape;
        Shape want = x;
        {
          // bytes= feeds the cost model and the runtime's choice of inline collectives: it is
          // at most what the collective reads and writes on a device.
          const LocalValue& a = p.values[static_cast<std::size_t>(in.in[0])];
          const int64_t most = num_elements(a.shape) * static_cast<int64_t>(dtype_size(a.dtype)) +
                               (in.out >= 0 ? num_elements(p.values[static_cast<std::size_t>(in.out)].shape) *
                                                  static_cast<int64_t>(dtype_size(a.dtype))
                                            : 0);
          if (in.bytes < 0 || in.bytes > most)
            throw err(i, fmt::format("bytes={} is outside [0, {}], the bytes its operand and result hold on a device",
                                     in.bytes, most));
        }
        auto dim_ok = [&](int d, const char* what) {
          if (d < 0 || static_cast<std::size_t>(d) >= x.size())
            throw err(i, fmt::format("{} {} is outside rank {}", what, d, x.size()));
        };
        const CollectiveInfo& ci = collective_info(in.collective);
        if (ci.over_pairs) {
          std::set<int64_t> src, dst;
          for (const auto& pr : in.pairs) {
            if (pr.first < 0 || pr.first >= p.mesh.num_devices() || pr.second < 0 || pr.second >= p.mesh.num_devices())
              throw err(i, fmt::format("pair {}->{} names a device outside the mesh", pr.first, pr.second));
            if (!src.insert(pr.first).second || !dst.insert(pr.second).second)
              throw err(i, fmt::format("device {} or {} appears twice in the pairs", pr.first, pr.second));
          }
        } else {
          const int64_t k = group_size(in.axes);
          auto split = [&](int d, const char* what) {
            dim_ok(d, what);
            if (x[static_cast<std::size_t>(d)] % k != 0)
              throw err(i, fmt::format("{} {} of size {} does not split over {} devices", what, d, x[static_cast<std::size_t>(d)], k));
            want[static_cast<std::size_t>(d)] /= k;
          };
          switch (ci.shape) {
            case CollectiveShape::Same: break;
            case CollectiveShape::GatherDim:
              dim_ok(in.dim, "dim");
              want[static_cast<std::size_t>(in.dim)] *= k;
              break;
            case CollectiveShape::ScatterDim: split(in.dim, "dim"); break;
            case CollectiveShape::AllToAll:
              dim_ok(in.dim, "split_dim");
              dim_ok(in.dim2, "concat_dim");
              split(in.dim, "split_dim");
              want[static_cast<std::size_t>(in.dim2)] *= k;
              break;
          }
        }
        if (in.reduce != ReduceOp::Sum && !ci.reduces)
          throw err(i, fmt::format("{} does not reduce: it takes no op=", ci.text));
        if (want != ov.shape)
          throw err(i, fmt::format("maps {} to {}, but {} is {}", shape_str(x), shape_str(want), vname(in.out), shape_str(ov.shape)));
        break;
      }
      case InstrKind::ShardSlice: {
        arity(1);
        same_dtype();
        const Shape& x = p.values[static_cast<std::size_t>(in.in[0])].shape;
        Shape want = x;
        const int64_t k = group_size(in.axes);
        // A relabel (no axes) of a scalar is fine; a slice needs a dim to cut.
        if (!in.axes.empty() && x.empty())
          throw err(i, fmt::format("slices {}, a scalar, over {{{}}}: only a value of rank >= 1 has a dim to split",
                                   vname(in.in[0]), fmt::join(in.axes, ", ")));
        if (in.dim < 0 || static_cast<std::size_t>(in.dim) >= std::max<std::size_t>(x.size(), 1))
          throw err(i, fmt::format("dim {} is outside rank {}", in.dim, x.size()));
        if (!x.empty()) {
          if (x[static_cast<std::size_t>(in.dim)] % k != 0) throw err(i, "the dim does not split over the group");
          want[static_cast<std::size_t>(in.dim)] /= k;
        }
        if (want != ov.shape) throw err(i, fmt::format("slices {} to {}, but {} is {}", shape_str(x), shape_str(want), vname(in.out), shape_str(ov.shape)));
        break;
      }
      case InstrKind::Copy: {
        if (in.in.empty()) throw err(i, "copies from no input");
        for (int x : in.in)
          if (p.values[static_cast<std::size_t>(x)].dtype != ov.dtype)
            throw err(i, fmt::format("copies {} {} into {} {}: a copy keeps the dtype", dtype_name(p.values[static_cast<std::size_t>(x)].dtype),
                                     vname(x), dtype_name(ov.dtype), vname(in.out)));
        const std::size_t r = in.block.size();
        if (ov.shape.size() != r)
          throw err(i, fmt::format("block {} must have the rank of the result {}", shape_str(in.block), shape_str(ov.shape)));
        if (in.copies.empty()) throw err(i, "copies nothing");
        for (std::size_t c = 0; c < in.copies.size(); ++c) {
          const CopyBlock& b = in.copies[c];
          if (b.input < 0 || static_cast<std::size_t>(b.input) >= in.in.size())
            throw err(i, fmt::format("block #{} takes input {}, but the copy has {} inputs", c, b.input, in.in.size()));
          const Shape& x = p.values[static_cast<std::size_t>(in.in[static_cast<std::size_t>(b.input)])].shape;
          if (x.size() != r)
            throw err(i, fmt::format("block {} must have the rank of the source {} and the result {}", shape_str(in.block),
                                     shape_str(x), shape_str(ov.shape)));
          if (b.src.size() != r || b.dst.size() != r) throw err(i, fmt::format("block #{} has offsets of the wrong rank", c));
          for (std::size_t d = 0; d < r; ++d) {
            for (const IndexExpr* e : {&b.src[d], &b.dst[d]}) {
              if (e->base < 0 || e->stride < 0 || e->modulus < 0)
                throw err(i, fmt::format("block #{} has a negative offset or ring modulus", c));
              group_size(e->axes);
            }
            if (b.src[d].max_value(p.mesh) + in.block[d] > x[d] || b.dst[d].max_value(p.mesh) + in.block[d] > ov.shape[d])
              throw err(i, fmt::format("block #{} of shape {} leaves the source {} or the result {} along dim {}", c,
                                       shape_str(in.block), shape_str(x), shape_str(ov.shape), d));
          }
        }
        if (num_elements(in.block) * static_cast<int64_t>(in.copies.size()) != num_elements(ov.shape))
          throw err(i, fmt::format("{} blocks of {} do not cover the result {}", in.copies.size(), shape_str(in.block), shape_str(ov.shape)));
        break;
      }
      case InstrKind::View: {
        arity(1);
        const LocalValue& x = p.values[static_cast<std::size_t>(in.in[0])];
        if (in.view_offset < 0 || in.view_offset + ov.bytes() > x.bytes())
          throw err(i, fmt::format("a view of {} bytes at offset {} leaves {} ({} bytes)", ov.bytes(), in.view_offset,
                                   vname(in.in[0]), x.bytes()));
        is_view[o] = true;
        break;
      }
      default: break;
    }
    for (int d : in.extra_out) {
      const std::size_t e = static_cast<std::size_t>(d);
      defined[e] = true;
      def_instr[e] = i;
      ready_on[e] = S;
      ready_at[e] = i;
    }
    defined[o] = true;
    def_instr[o] = i;
    if (in.kind == InstrKind::CollectiveStart) {
      pending[o] = true;
      started_on[o] = S;
    } else if (in.kind == InstrKind::View) {
      // A view is ready where its source is.
      ready_on[o] = ready_on[static_cast<std::size_t>(in.in[0])];
      ready_at[o] = ready_at[static_cast<std::size_t>(in.in[0])];
    } else {
      ready_on[o] = S;
      ready_at[o] = i;
    }
  }
  for (std::size_t v = 0; v < nv; ++v)
    if (pending[v]) throw err(def_instr[v], fmt::format("starts a collective that is never done (add 'done {}')", vname(static_cast<int>(v))));
  for (int v : p.outputs) {
    if (v < 0 || static_cast<std::size_t>(v) >= nv || !defined[static_cast<std::size_t>(v)])
      throw ProgramError(-1, fmt::format("program verifier: an output is not defined"));
    if (is_view[static_cast<std::size_t>(v)])
      throw err(def_instr[static_cast<std::size_t>(v)], fmt::format("output {} is a view; an output owns its buffer (copy it)", vname(v)));
    if (p.values[static_cast<std::size_t>(v)].host)
      throw err(def_instr[static_cast<std::size_t>(v)], fmt::format("output {} lives in host memory; outputs are device buffers", vname(v)));
  }
  for (int v : p.inputs)
    if (p.values[static_cast<std::size_t>(v)].host)
      throw ProgramError(-1, fmt::format("program verifier: input {} lives in host memory; inputs are device buffers", vname(v)));

  // The memory plan.
  const MemoryPlan& m = p.memory;
  if (!m.planned) return;
  if (m.offset.size() != nv) throw ProgramError(-1, fmt::format("program verifier: the memory plan places {} values of {}", m.offset.size(), nv));
  std::vector<bool> is_output(nv, false), is_input(nv, false);
  for (int v : p.outputs) is_output[static_cast<std::size_t>(v)] = true;
  for (int v : p.inputs) is_input[static_cast<std::size_t>(v)] = true;
  std::vector<int> pools[2];  // the arena's values, the host pool's
  for (std::size_t v = 0; v < nv; ++v) {
    const int i = def_instr[v];
    const bool wants = i >= 0 && !is_view[v] && !is_output[v] && !is_input[v];
    if (m.offset[v] >= 0 && !wants)
      throw err(i, fmt::format("{} is {} and has no place in the arena (at= is for intermediate values)", vname(static_cast<int>(v)),
                               is_input[v] ? "an input" : is_output[v] ? "an output" : is_view[v] ? "a view" : "not defined"));
    if (wants && m.offset[v] < 0) throw err(i, fmt::format("{} has no place in the arena (run the memory-plan pass)", vname(static_cast<int>(v))));
    if (!wants) continue;
    const bool host = p.values[v].host;
    if (m.offset[v] + p.values[v].bytes() > (host ? m.host_bytes : m.arena_bytes))
      throw err(i, fmt::format("{} at {} ({} bytes) leaves the {} of {} bytes", vname(static_cast<int>(v)), m.offset[v],
                               p.values[v].bytes(), host ? "host pool" : "arena", host ? m.host_bytes : m.arena_bytes));
    pools[host ? 1 : 0].push_back(static_cast<int>(v));
  }
  const Liveness L = compute_liveness(p);
  for (std::vector<int>& placed : pools) {
    // Each placed value against the bytes of those before it that it may not share bytes with
    // (a few unions of ranges, interference.hpp), rather than every pair whose bytes overlap,
    // which in a plan that reuses bytes well is most pairs of a long program. A clash found
    // that way is reported by the scan in offset order below, which names the pair it always has.
    Interference live(L, n);
    bool clash = false;
    for (int v : placed) {
      const std::size_t a = static_cast<std::size_t>(v);
      // (A value has at least one element, so bytes overlap iff one begins within the other.)
      const int64_t bytes = p.values[a].bytes();
      clash = bytes < 1 || live.overlaps(v, m.offset[a], m.offset[a] + bytes);
      if (clash) break;
      live.add(v, m.offset[a], m.offset[a] + bytes);
    }
    if (!clash) continue;
    std::sort(placed.begin(), placed.end(), [&](int a, int b) { return m.offset[static_cast<std::size_t>(a)] < m.offset[static_cast<std::size_t>(b)]; });
    for (std::size_t a = 0; a < placed.size(); ++a) {
      const std::size_t va = static_cast<std::size_t>(placed[a]);
      const int64_t end_a = m.offset[va] + p.values[va].bytes();
      for (std::size_t b = a + 1; b < placed.size(); ++b) {
        const std::size_t vb = static_cast<std::size_t>(placed[b]);
        if (m.offset[vb] >= end_a) break;
        if (!L.may_share(placed[a], placed[b]))
          throw err(def_instr[vb], fmt::format("{} (arena [{}, {}), live #{}..#{}) overlaps {} (arena [{}, {}), live #{}..#{}) "
                                               "while both are live (or without a wait ordering the reuse after the other stream)",
                                               vname(placed[b]), m.offset[vb], m.offset[vb] + p.values[vb].bytes(), L.first[vb],
                                               L.last[vb], vname(placed[a]), m.offset[va], end_a, L.first[va], L.last[va]));
      }
    }
  }
}

}  // namespace tessel
