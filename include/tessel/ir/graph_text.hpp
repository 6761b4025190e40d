// tessel/ir/graph_text.hpp — the textual form of a Graph (docs/ir.md): a parser and a printer that
// round-trip.
//
//   mesh data=2, model=4
//   %x = input f32[8,128,512] sharding=[{data}, {}, {}]
//   %w1 = input f32[512,2048] sharding=[{}, {model}]
//   %h = einsum(%x, %w1) eq="bsd,df->bsf" : f32[8,128,2048]
//   %g = gelu(%h) : f32[8,128,2048]
//   output %g
//
// Laws (tested): parse_graph(print_graph(g)) is the same graph as g (values, ops, attrs,
// annotations, mesh, outputs), and print_graph(parse_graph(print_graph(g))) == print_graph(g).
//
// Every mistake in the text throws ParseError "file:line:col: message", followed by the
// offending line and a caret under the column. Shape errors found while building the graph
// are reported at the op that caused them. The parser never throws anything but a
// tessel::Error on malformed input.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "tessel/core/common.hpp"
#include "tessel/ir/graph.hpp"

namespace tessel {

// Parses the text form. `filename` only appears in error messages.
Graph parse_graph(std::string_view text, std::string_view filename = "<input>");
// Reads and parses a file; throws ParseError when it cannot be read.
Graph parse_graph_file(const std::string& path);

struct PrintOptions {
  // Print the result type (` : f32[8,128]`) on every op line. Input and constant lines
  // always carry their type.
  bool types = true;
  // When set and it returns a non-empty string for a value, `  # <comment>` is appended to
  // the line that defines the value (newlines in the comment are printed as spaces).
  std::function<std::string(int value)> comment;
};

// Prints the graph in the text form: the mesh, one line per op in graph order, then the
// outputs on one `output` line.
std::string print_graph(const Graph& g, const PrintOptions& opts = {});

}  // namespace tessel
