// Program: the per-device SPMD instruction list, its summary and its text form.
#include "tessel/ir/program.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/ops/registry.hpp"

namespace tessel {

std::string CollectiveSummary::line() const {
  return fmt::format("collectives: all-gather={} all-reduce={} reduce-scatter={} all-to-all={} "
                     "collective-permute={} bytes={}", all_gather, all_reduce, reduce_scatter,
                     all_to_all, collective_permute, bytes);
}

CollectiveSummary Program::summary() const {
  CollectiveSummary s;
  for (const Instr& in : instrs) {
    if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
    switch (in.collective) {
      case CollectiveKind::AllGather: ++s.all_gather; break;
      case CollectiveKind::AllReduce: ++s.all_reduce; break;
      case CollectiveKind::ReduceScatter: ++s.reduce_scatter; break;
      case CollectiveKind::AllToAll: ++s.all_to_all; break;
      case CollectiveKind::CollectivePermute: ++s.collective_permute; break;
    }
    s.bytes += in.bytes;
  }
  return s;
}

double Program::total_flops() const {
  double f = 0;
  for (const Instr& in : instrs) f += in.flops;
  return f;
}

double Program::comm_seconds() const {
  double t = 0;
  for (const Instr& in : instrs)
    if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) t += in.seconds;
  return t;
}

double Program::comm_seconds(const CostModel& cost) const {
  double t = 0;
  for (const Instr& in : instrs)
    if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart)
      t += cost.collective_seconds(in.collective, mesh, in.axes, in.bytes);
  return t;
}

double Program::compute_seconds(const CostModel& cost) const {
  double t = 0;
  for (const Instr& in : instrs) {
    if (in.kind != InstrKind::Kernel) continue;
    double bytes = 0;
    for (int v : in.defs()) bytes += static_cast<double>(values[v].bytes());
    for (int v : in.in) bytes += static_cast<double>(values[v].bytes());
    t += cost.op_seconds(in.flops, bytes);
  }
  return t;
}

double Program::dispatch_seconds(const CostModel& cost) const {
  double t = 0;
  for (const Instr& in : instrs)
    if (in.kind == InstrKind::Kernel || in.kind == InstrKind::Copy || in.kind == InstrKind::Collective ||
        in.kind == InstrKind::CollectiveStart)
      t += cost.dispatch_seconds();
  return t;
}

namespace {
int64_t ring_index(int64_t index, int64_t shift, int64_t modulus) {
  if (modulus <= 0) return index;
  const int64_t r = (index + shift) % modulus;
  return r < 0 ? r + modulus : r;
}
}  // namespace

int64_t IndexExpr::eval(const Mesh& mesh, int64_t position) const {
  if (axes.empty() || stride == 0) return base;
  return base + stride * ring_index(mesh.index_in_group(position, axes), shift, modulus);
}

int64_t IndexExpr::max_value(const Mesh& mesh) const {
  if (axes.empty() || stride == 0) return base;
  const int64_t n = mesh.axes_size(axes);
  int64_t hi = 0;
  if (modulus <= 0) {
    hi = n - 1;
  } else {
    for (int64_t i = 0; i < n && hi < modulus - 1; ++i) hi = std::max(hi, ring_index(i, shift, modulus));
  }
  return stride > 0 ? base + stride * hi : base;
}

std::string collective_start_name(CollectiveKind k) { return std::string(collective_text(k)) + "_start"; }

std::vector<int> Program::last_use() const {
  std::vector<int> last(values.size(), -1);
  for (std::size_t i = 0; i < instrs.size(); ++i)
    for (int v : instrs[i].in) last[v] = static_cast<int>(i);
  for (int v : outputs) last[v] = static_cast<int>(instrs.size());
  return last;
}


std::string Program::to_string(int64_t device) const {
  std::string out;
  out += fmt::format("# SPMD program on mesh {} ({} devices)", mesh.to_string(), mesh.num_devices());
  if (device >= 0) {
    auto c = mesh.coords(device);
    std::vector<std::string> cs;
    for (int i = 0; i < mesh.rank(); ++i) cs.push_back(fmt::format("{}={}", mesh.axes()[i].name, c[i]));
    out += fmt::format(", shown for device {} {{{}}}", device, join(cs, ", "));
  }
  out += "\n";
  auto vname = [&](int v) { return "%" + values[v].name; };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const LocalValue& v = values[inputs[i]];
    out += fmt::format("{} = input {} sharding={}  # global {}\n", vname(inputs[i]),
                       type_str(v.dtype, v.shape), v.sharding.to_string(),
                       type_str(v.dtype, v.global_shape));
  }
  for (const Instr& in : instrs) {
    if (in.kind == InstrKind::Wait) {
      out += fmt::format("wait {} @{}\n", in.wait_for, in.stream);
      continue;
    }
    if (in.kind == InstrKind::CollectiveDone) {
      out += fmt::format("done {} @{}\n", vname(in.in.at(0)), in.stream);
      continue;
    }
    const LocalValue& o = values[in.out];
    std::vector<std::string> args;
    for (int v : in.in) args.push_back(vname(v));
    std::string line;
    if (in.kind == InstrKind::Kernel) {
      std::vector<std::string> names, types;
      for (int v : in.defs()) {
        names.push_back(vname(v));
        types.push_back(type_str(values[v].dtype, values[v].shape));
      }
      line = fmt::format("{} = {}({}){} : {}", join(names, ", "), op_name(in.op), join(args, ", "),
                         attrs_text(in.op, in.attrs), join(types, ", "));
    } else if (in.kind == InstrKind::Copy) {
      line = fmt::format("{} = copy({}) block={} blocks={} : {}", vname(in.out), join(args, ", "),
                         shape_str(in.block), in.copies.size(), type_str(o.dtype, o.shape));
    } else if (in.kind == InstrKind::View) {
      line = fmt::format("{} = view({}) offset={} : {}", vname(in.out), join(args, ", "), in.view_offset,
                         type_str(o.dtype, o.shape));
    } else if (in.kind == InstrKind::ShardSlice && in.axes.empty()) {
      line = fmt::format("{} = relabel({}) : {}", vname(in.out), join(args, ", "),
                         type_str(o.dtype, o.shape));
    } else if (in.kind == InstrKind::ShardSlice) {
      line = fmt::format("{} = shard_slice({}) dim={} axes={{{}}} : {}", vname(in.out),
                         join(args, ", "), in.dim, join(in.axes, ", "), type_str(o.dtype, o.shape));
    } else {
      std::string extra;
      const CollectiveInfo& ci = collective_info(in.collective);
      if (ci.shape == CollectiveShape::GatherDim || ci.shape == CollectiveShape::ScatterDim)
        extra = fmt::format(" dim={}", in.dim);
      if (ci.shape == CollectiveShape::AllToAll)
        extra = fmt::format(" split_dim={} concat_dim={}", in.dim, in.dim2);
      if (in.reduce == ReduceOp::Max) extra += " op=max";
      std::string group;
      if (ci.over_pairs) {
        std::vector<std::string> ps;
        for (auto& p : in.pairs) ps.push_back(fmt::format("{}->{}", p.first, p.second));
        group = " pairs=[" + join(ps, ",") + "]";
      } else {
        group = fmt::format(" axes={{{}}}", join(in.axes, ", "));
        if (device >= 0) group += fmt::format(" group=[{}]", fmt::join(mesh.group(device, in.axes), ","));
      }
      line = fmt::format("{} = {}{}({}){}{} bytes={} : {}", vname(in.out), collective_name(in.collective),
                         in.kind == InstrKind::CollectiveStart ? "-start" : "", join(args, ", "), group,
                         extra, in.bytes, type_str(o.dtype, o.shape));
    }
    out += line;
    if (in.stream != "compute") out += " @" + in.stream;
    std::vector<std::string> layouts;
    for (int v : in.defs()) layouts.push_back(values[v].sharding.to_string());
    out += fmt::format("  # {}", join(layouts, ", "));
    if (!in.note.empty()) out += "; " + in.note;
    out += "\n";
  }
  std::vector<std::string> outs;
  for (int v : outputs) outs.push_back(vname(v));
  out += "output " + join(outs, ", ") + "\n";
  return out;
}

}  // namespace tessel
