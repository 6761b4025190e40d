// src/ir/graph_text_print.cpp — the printer of the Graph's text form (docs/ir.md); its parser is
// graph_text_parse.cpp.
//
// The printer emits exactly what the parser reads, with the shortest decimal form of each
// double that reads back to the same bits, so print → parse → print is the identity on the
// text and parse(print(g)) rebuilds g.
#include "tessel/ir/graph_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "tessel/ops/registry.hpp"
#include "text_lexer.hpp"

namespace tessel {
namespace {

using namespace detail;

std::string ref(const Graph& g, int id) {
  if (id < 0 || static_cast<std::size_t>(id) >= g.values.size())
    return fmt::format("%\"<invalid value {}>\"", id);
  return value_ref(g.values[id].name);
}

// `%a, %b, %c = op(%x, ...) attrs sharding=(S, _, S) priority=P : T, T, T` for an op with
// several results (the sharding and priority lists only when a result is annotated).
std::string op_results_line(const Graph& g, const Op& op, const PrintOptions& opts) {
  const std::vector<int> rs = op.results();
  std::vector<std::string> names, args, shardings, types;
  std::vector<int> prios;
  bool annotated = false;
  for (int v : rs) {
    names.push_back(ref(g, v));
    types.push_back(type_str(g.values[static_cast<std::size_t>(v)].dtype, g.values[static_cast<std::size_t>(v)].shape));
    auto it = g.annotations.find(v);
    annotated = annotated || it != g.annotations.end();
    shardings.push_back(it != g.annotations.end() ? sharding_text(it->second.sharding) : "_");
    prios.push_back(it != g.annotations.end() ? it->second.priority : 0);
  }
  for (int v : op.inputs) args.push_back(ref(g, v));
  std::string line = fmt::format("{} = {}({}){}", join(names, ", "), op_def(op.kind).name, join(args, ", "),
                                 attrs_text(op.kind, op.attrs));
  if (annotated) {
    line += " sharding=(" + join(shardings, ", ") + ")";
    if (std::adjacent_find(prios.begin(), prios.end(), std::not_equal_to<>()) == prios.end()) {
      if (prios[0] != 0) line += fmt::format(" priority={}", prios[0]);
    } else {
      line += fmt::format(" priority=({})", fmt::join(prios, ", "));
    }
  }
  if (opts.types) line += " : " + join(types, ", ");
  if (opts.comment) {
    std::vector<std::string> cs;
    for (int v : rs) {
      std::string c = opts.comment(v);
      for (char& ch : c)
        if (ch == '\n' || ch == '\r') ch = ' ';
      if (!c.empty()) cs.push_back(c);
    }
    if (!cs.empty()) line += "  # " + join(cs, "; ");
  }
  return line;
}

}  // namespace

std::string print_graph(const Graph& g, const PrintOptions& opts) {
  std::string out;
  if (g.mesh) {
    const Mesh& m = *g.mesh;
    out += "mesh ";
    if (m.axes().empty()) out += "{}";
    for (std::size_t i = 0; i < m.axes().size(); ++i)
      out += fmt::format("{}{}={}", i ? ", " : "", m.axes()[i].name, m.axes()[i].size);
    const auto& ids = m.device_ids();
    bool identity = true;
    for (std::size_t i = 0; i < ids.size(); ++i) identity = identity && ids[i] == static_cast<int>(i);
    if (!identity) {
      out += " devices=[";
      for (std::size_t i = 0; i < ids.size(); ++i) out += fmt::format("{}{}", i ? "," : "", ids[i]);
      out += "]";
    }
    out += '\n';
  }
  for (const Op& op : g.ops) {
    if (op.num_results() > 1) {
      out += op_results_line(g, op, opts) + '\n';
      continue;
    }
    std::string line = ref(g, op.output) + " = ";
    const bool valid = op.output >= 0 && static_cast<std::size_t>(op.output) < g.values.size();
    const Value* v = valid ? &g.values[op.output] : nullptr;
    const std::string type = v ? type_str(v->dtype, v->shape) : std::string("f32[]");
    const char* name = op_def(op.kind).name;
    if (op.kind == OpKind::Input) {
      line += fmt::format("{} {}", name, type);
    } else if (op.kind == OpKind::Constant) {
      line += fmt::format("{} {}{}", name, type, attrs_text(op.kind, op.attrs));
    } else {
      line += name;
      line += '(';
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        if (i) line += ", ";
        line += ref(g, op.inputs[i]);
      }
      line += ')';
      line += attrs_text(op.kind, op.attrs);
      if (op.kind == OpKind::ShardingConstraint) {
        if (op.attrs.sharding) line += " sharding=" + sharding_text(*op.attrs.sharding);
        if (op.attrs.priority != 0) line += fmt::format(" priority={}", op.attrs.priority);
      }
    }
    if (op.kind != OpKind::ShardingConstraint) {
      if (auto it = g.annotations.find(op.output); it != g.annotations.end()) {
        line += " sharding=" + sharding_text(it->second.sharding);
        if (it->second.priority != 0) line += fmt::format(" priority={}", it->second.priority);
      }
    }
    if (opts.types && op.kind != OpKind::Input && op.kind != OpKind::Constant)
      line += " : " + type;
    if (opts.comment) {
      std::string c = opts.comment(op.output);
      if (!c.empty()) {
        for (char& ch : c)
          if (ch == '\n' || ch == '\r') ch = ' ';
        line += "  # " + c;
      }
    }
    out += line;
    out += '\n';
  }
  if (!g.outputs.empty()) {
    out += "output ";
    for (std::size_t i = 0; i < g.outputs.size(); ++i) {
      if (i) out += ", ";
      out += ref(g, g.outputs[i]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace tessel
