// src/ir/program_text_print.cpp — the printer of a Program's text form (docs/program-ir.md); its
// parser is program_text_parse.cpp. Kernel attributes are printed through the op registry's
// schema (ops/registry.hpp), so the parser reads back exactly what is written here.
#include "tessel/ir/program_text.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "tessel/ops/registry.hpp"
#include "tessel/ir/program_verify.hpp"
#include "text_lexer.hpp"

namespace tessel {
namespace {

using namespace detail;

std::string axes_text(const std::vector<std::string>& axes) { return "{" + join(axes, ", ") + "}"; }

std::string index_text(const IndexExpr& e) {
  if (e.axes.empty() || e.stride == 0) return std::to_string(e.base);
  std::string s = e.base != 0 ? std::to_string(e.base) + "+" : std::string();
  const std::string axes = "{" + join(e.axes, ",") + "}";
  if (e.modulus > 0) return s + fmt::format("{}*({}{:+d} mod {})", e.stride, axes, e.shift, e.modulus);
  return s + std::to_string(e.stride) + "*" + axes;
}

std::string index_list_text(const std::vector<IndexExpr>& v) {
  std::vector<std::string> parts;
  for (const auto& e : v) parts.push_back(index_text(e));
  return "[" + join(parts, ",") + "]";
}

// ---- printer --------------------------------------------------------------------------------

std::string instr_text(const Program& p, const Instr& in) {
  auto vname = [&](int v) { return value_ref(p.values[static_cast<std::size_t>(v)].name); };
  if (in.kind == InstrKind::Wait) return fmt::format("wait {} @{}", in.wait_for, in.stream);
  if (in.kind == InstrKind::CollectiveDone) return fmt::format("done {} @{}", vname(in.in.at(0)), in.stream);
  std::vector<std::string> args;
  for (int v : in.in) args.push_back(vname(v));
  const std::string call = "(" + join(args, ", ") + ")";
  std::vector<std::string> names;
  for (int v : in.defs()) names.push_back(vname(v));
  std::string s = join(names, ", ") + " = ";
  switch (in.kind) {
    case InstrKind::Kernel: s += op_name(in.op) + call + attrs_text(in.op, in.attrs); break;
    case InstrKind::ShardSlice: s += fmt::format("shard_slice{} axes={} dim={}", call, axes_text(in.axes), in.dim); break;
    case InstrKind::Copy: {
      std::vector<std::string> cs;
      for (const auto& c : in.copies)
        cs.push_back((c.input != 0 ? std::to_string(c.input) + ":" : std::string()) + index_list_text(c.src) + "->" +
                     index_list_text(c.dst));
      s += fmt::format("copy{} block={} copies=[{}]", call, shape_str(in.block), join(cs, ", "));
      break;
    }
    case InstrKind::View: s += fmt::format("view{} offset={}", call, in.view_offset); break;
    case InstrKind::Collective:
    case InstrKind::CollectiveStart: {
      s += collective_text(in.collective);
      if (in.kind == InstrKind::CollectiveStart) s += "_start";
      s += call;
      const CollectiveInfo& ci = collective_info(in.collective);
      if (ci.over_pairs) {
        std::vector<std::string> ps;
        for (const auto& pr : in.pairs) ps.push_back(fmt::format("{}->{}", pr.first, pr.second));
        s += " pairs=[" + join(ps, ", ") + "]";
      } else {
        s += " axes=" + axes_text(in.axes);
      }
      if (ci.shape == CollectiveShape::GatherDim || ci.shape == CollectiveShape::ScatterDim)
        s += fmt::format(" dim={}", in.dim);
      if (ci.shape == CollectiveShape::AllToAll)
        s += fmt::format(" split_dim={} concat_dim={}", in.dim, in.dim2);
      if (in.reduce == ReduceOp::Max) s += " op=max";
      s += fmt::format(" bytes={}", in.bytes);
      break;
    }
    default: break;
  }
  // Each result's type, layout and arena offset; the stream after the first result's.
  const std::vector<int> defs = in.defs();
  for (std::size_t r = 0; r < defs.size(); ++r) {
    const std::size_t v = static_cast<std::size_t>(defs[r]);
    const LocalValue& o = p.values[v];
    s += fmt::format("{} : {} global={} sharding={}", r ? "," : "", type_str(o.dtype, o.shape),
                     type_str(o.dtype, o.global_shape), o.sharding.to_string());
    if (o.host) s += " memory=host";
    if (r == 0) s += " @" + in.stream;
    if (p.memory.planned && v < p.memory.offset.size() && p.memory.offset[v] >= 0)
      s += fmt::format(" at={}", p.memory.offset[v]);
  }
  return s;
}

}  // namespace

std::string print_program(const Program& p) {
  std::string out = "mesh";
  if (p.mesh.rank() == 0) out += " {}";
  for (int i = 0; i < p.mesh.rank(); ++i)
    out += fmt::format("{} {}={}", i ? "," : "", p.mesh.axes()[i].name, p.mesh.axes()[i].size);
  bool identity = true;
  for (std::size_t i = 0; i < p.mesh.device_ids().size(); ++i) identity = identity && p.mesh.device_ids()[i] == static_cast<int>(i);
  if (!identity) {
    std::vector<int64_t> ids(p.mesh.device_ids().begin(), p.mesh.device_ids().end());
    out += " devices=" + shape_str(ids);
  }
  out += "\n";
  for (int v : p.inputs) {
    const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
    out += fmt::format("{} = input {} global={} sharding={}\n", value_ref(lv.name), type_str(lv.dtype, lv.shape),
                       type_str(lv.dtype, lv.global_shape), lv.sharding.to_string());
  }
  for (const Instr& in : p.instrs) out += instr_text(p, in) + "\n";
  std::vector<std::string> outs;
  for (int v : p.outputs) outs.push_back(value_ref(p.values[static_cast<std::size_t>(v)].name));
  out += outs.empty() ? "output\n" : "output " + join(outs, ", ") + "\n";
  if (p.memory.planned)
    out += fmt::format("memory arena={}{}  # peak {} bytes per device: arena + inputs {} + outputs {}{}\n",
                       p.memory.arena_bytes,
                       p.memory.host_bytes > 0 ? fmt::format(" host={}", p.memory.host_bytes) : std::string(),
                       p.memory.peak_bytes(), p.memory.input_bytes, p.memory.output_bytes,
                       p.memory.donated_bytes > 0
                           ? fmt::format(" - written into donated inputs {}", p.memory.donated_bytes)
                           : std::string());
  return out;
}

}  // namespace tessel
