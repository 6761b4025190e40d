// tessel/compiler/checks.hpp — the checks users trip over, in one place rather than spread through
// the partitioner: a graph that cannot be compiled (no output) is an error; a program that
// compiles but repeats its work on every device of an axis (a mesh axis no value uses, no
// annotation at all) gets a warning. compile() runs both; tessel-explain prints the
// warnings in its "== warnings" section, the API returns them in Program::warnings.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/program.hpp"

namespace tessel {

// Throws Error when the graph cannot be compiled meaningfully: it has no output (nothing
// would be computed, and a run would compare nothing). The message says how to mark one.
void check_compilable(const Graph& graph, const Mesh& mesh);

// A warning when an annotation on an operand or result of attention op `op` splits a sequence or
// the head dim, which attention keeps whole on each device (no ring form yet), so the value is
// gathered for it (empty: none). Names the op, the value, its sharding and what to do.
std::string attention_split_warning(const Graph& graph, int op);

// Warnings about a partitioned program, each a sentence naming what and what to do:
//   - the graph has no output (for tools that partition without compile(), which refuses it);
//   - no value of the graph is annotated (no `sharding=` and no sharding_constraint) on a
//     mesh of more than one device: every device runs the whole program;
//   - an annotation splits an attention's sequence or head dim (attention_split_warning);
//   - a mesh axis of size > 1 that no value of the program is split, or partial, over and
//     no collective runs on: the work is repeated on each of its devices.
// (With no annotation at all only the first is given: it explains the second.)
std::vector<std::string> program_warnings(const Graph& graph, const Mesh& mesh, const Program& program);

// Appends program_warnings() to program.warnings (skipping any already there).
void add_program_warnings(const Graph& graph, const Mesh& mesh, Program& program);

// The warnings for a terminal: warnings about one value each ("%NAME <kind> (...)...", as the
// partitioner's "is all-gathered over {data}") are grouped by kind; a kind with more than
// `keep_per_kind` members becomes one line counting them, their bytes per device when given,
// and the largest few by name, ending with `more_hint` (e.g. "--all-warnings lists each").
// Other warnings pass through unchanged, in order, each once.
std::vector<std::string> summarize_warnings(const std::vector<std::string>& warnings, int keep_per_kind = 2,
                                            const std::string& more_hint = "");

}  // namespace tessel
