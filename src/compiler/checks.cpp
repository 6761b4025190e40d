// The checks users trip over (tessel/compiler/checks.hpp): compile-time errors and warnings about
// work repeated on every device.
#include "tessel/compiler/checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "tessel/core/common.hpp"

namespace tessel {

void check_compilable(const Graph& graph, const Mesh& mesh) {
  if (graph.outputs.empty())
    throw Error(fmt::format(
        "compile: the graph ({} values) has no output, so nothing would be computed on mesh {}; "
        "mark the results with g.mark_output(t) (text form: a line `output %VALUE`)",
        graph.values.size(), mesh.to_string()));
}

std::string attention_split_warning(const Graph& graph, int op_index) {
  const Op& op = graph.ops[static_cast<std::size_t>(op_index)];
  if (op.kind != OpKind::Attention && op.kind != OpKind::AttentionGrad) return {};
  const bool bshd = op.attrs.equation == "bshd";
  const int seq = bshd ? 1 : 2;
  std::vector<int> values = op.inputs;
  for (int r : op.results()) values.push_back(r);
  for (int v : values) {
    auto it = graph.annotations.find(v);
    const Value& val = graph.values[static_cast<std::size_t>(v)];
    if (it == graph.annotations.end() || val.shape.size() != 4) continue;  // lse [b, h, q] is checked through q
    const Sharding& s = it->second.sharding;
    for (int d : {seq, 3}) {
      if (d >= s.rank() || s.dims[static_cast<std::size_t>(d)].axes.empty()) continue;
      return fmt::format("{} reads or writes {} annotated {}, which splits its {} (dim {}) over {}: attention keeps "
                         "the sequences and the head dim whole on each device, so the value is gathered there (a "
                         "split sequence needs a ring form, which tessel does not have yet); split the batch or the "
                         "heads to divide attention's work",
                         graph.describe_op(op_index), graph.describe(v), s.to_string(),
                         d == 3 ? "head dim" : "sequence", d,
                         fmt::join(s.dims[static_cast<std::size_t>(d)].axes, ","));
    }
  }
  return {};
}

std::vector<std::string> program_warnings(const Graph& graph, const Mesh& mesh, const Program& program) {
  std::vector<std::string> out;
  if (graph.outputs.empty())
    out.push_back("the graph has no output: nothing is computed (compile() refuses it); mark the results "
                  "with `output %VALUE`");
  if (mesh.num_devices() <= 1) return out;
  for (std::size_t i = 0; i < graph.ops.size(); ++i) {
    std::string w = attention_split_warning(graph, static_cast<int>(i));
    if (!w.empty()) out.push_back(std::move(w));
  }
  bool annotated = !graph.annotations.empty();
  for (const Op& op : graph.ops)
    if (op.kind == OpKind::ShardingConstraint) annotated = true;
  if (!annotated) {
    std::string axis = mesh.axes().front().name;
    for (const MeshAxis& a : mesh.axes())
      if (a.size > 1) {
        axis = a.name;
        break;
      }
    out.push_back(fmt::format(
        "no value is annotated: with nothing to propagate from, every value is replicated and each of "
        "the {} devices of mesh {} runs the whole program; annotate an input, e.g. "
        "`sharding=[{{{}}}, {{}}]` (g.annotate(x, Sharding::parse(\"[{{{}}}, {{}}]\")))",
        mesh.num_devices(), mesh.to_string(), axis, axis));
    return out;
  }
  std::set<std::string> used;
  for (const LocalValue& v : program.values)
    for (const MeshAxis& a : mesh.axes())
      if (v.sharding.uses_axis(a.name)) used.insert(a.name);
  for (const Instr& in : program.instrs)
    for (const std::string& a : in.axes) used.insert(a);
  for (const MeshAxis& a : mesh.axes()) {
    if (a.size <= 1 || used.count(a.name)) continue;
    out.push_back(fmt::format(
        "mesh axis '{}' (size {}) is used by no value: everything is replicated over it, so its {} "
        "devices repeat the same work; split a dim over it (e.g. sharding=[{{{}}}, ...]) or drop it "
        "from the mesh",
        a.name, a.size, a.size, a.name));
  }
  return out;
}

void add_program_warnings(const Graph& graph, const Mesh& mesh, Program& program) {
  for (std::string& w : program_warnings(graph, mesh, program))
    if (std::find(program.warnings.begin(), program.warnings.end(), w) == program.warnings.end())
      program.warnings.push_back(std::move(w));
}

namespace {

// "%NAME <kind> (N bytes per device) ...": the value's name, the kind and the bytes (-1: none).
struct ValueWarning {
  std::string name, kind;
  int64_t bytes = -1;
};

bool parse_value_warning(const std::string& w, ValueWarning& out) {
  if (w.size() < 2 || w[0] != '%') return false;
  const std::size_t sp = w.find(' ');
  if (sp == std::string::npos) return false;
  const std::size_t paren = w.find(" (", sp);
  if (paren == std::string::npos) return false;
  out.name = w.substr(0, sp);
  out.kind = w.substr(sp + 1, paren - sp - 1);
  out.bytes = -1;
  const std::size_t num = paren + 2, end = w.find(" bytes per device)", num);
  if (end != std::string::npos && end > num &&
      std::all_of(w.begin() + static_cast<std::ptrdiff_t>(num), w.begin() + static_cast<std::ptrdiff_t>(end),
                  [](char c) { return c >= '0' && c <= '9'; }))
    out.bytes = std::stoll(w.substr(num, end - num));
  return true;
}

}  // namespace

std::vector<std::string> summarize_warnings(const std::vector<std::string>& warnings, int keep_per_kind,
                                            const std::string& more_hint) {
  std::map<std::string, std::vector<ValueWarning>> by_kind;
  for (const std::string& w : warnings) {
    ValueWarning v;
    if (parse_value_warning(w, v)) by_kind[v.kind].push_back(v);
  }
  std::vector<std::string> out;
  std::set<std::string> seen, kinds_done;
  for (const std::string& w : warnings) {
    ValueWarning v;
    if (!parse_value_warning(w, v) || static_cast<int>(by_kind[v.kind].size()) <= keep_per_kind) {
      if (seen.insert(w).second) out.push_back(w);
      continue;
    }
    if (!kinds_done.insert(v.kind).second) continue;
    std::vector<ValueWarning> group = by_kind[v.kind];
    std::set<std::string> names;
    int64_t total = 0;
    bool all_bytes = true;
    for (const ValueWarning& g : group) {
      names.insert(g.name);
      if (g.bytes < 0) all_bytes = false;
      else total += g.bytes;
    }
    std::stable_sort(group.begin(), group.end(),
                     [](const ValueWarning& a, const ValueWarning& b) { return a.bytes > b.bytes; });
    std::vector<std::string> largest;
    for (const ValueWarning& g : group) {
      if (std::find(largest.begin(), largest.end(), g.name) == largest.end()) largest.push_back(g.name);
      if (largest.size() == 3) break;
    }
    std::string line = fmt::format("{} warnings that a value {} ({} values", group.size(), v.kind, names.size());
    if (all_bytes) line += fmt::format(", {} bytes per device in all", total);
    line += fmt::format("; the largest: {})", join(largest, ", "));
    if (!more_hint.empty()) line += "; " + more_hint;
    out.push_back(line);
  }
  return out;
}

}  // namespace tessel
