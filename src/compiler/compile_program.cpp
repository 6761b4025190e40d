// compile_graph and compile_program (compiler/compiled_program.hpp): the compiler's pipeline
// from a graph to the runtime-neutral artifact load() takes.
#include "tessel/compiler/compiled_program.hpp"

#include "tessel/compiler/checks.hpp"
#include "tessel/compiler/uneven.hpp"

namespace tessel {

CompiledProgram compiled_program_of(const Graph& graph, const Mesh& mesh, Program program,
                                    std::vector<Shape> user_input_shapes, std::vector<Shape> user_output_shapes) {
  CompiledProgram c;
  c.program = std::move(program);
  c.mesh = mesh;
  for (int v : graph.inputs) c.input_names.push_back(graph.values[static_cast<std::size_t>(v)].name);
  for (int v : graph.outputs) c.output_names.push_back(graph.values[static_cast<std::size_t>(v)].name);
  c.user_input_shapes = std::move(user_input_shapes);
  c.user_output_shapes = std::move(user_output_shapes);
  return c;
}

Compilation compile_graph(const Graph& graph, const Mesh& mesh, const CompileProgramOptions& o,
                          const Graph* warnings_for) {
  check_compilable(graph, mesh);
  PaddedGraph pg;
  if (o.strict_even_shardings) {
    pg.graph = graph.clone();
    for (int v : graph.inputs) pg.input_shapes.push_back(graph.values[static_cast<std::size_t>(v)].shape);
    for (int v : graph.outputs) pg.output_shapes.push_back(graph.values[static_cast<std::size_t>(v)].shape);
  } else {
    pg = pad_uneven(graph, mesh);
  }
  Compilation c;
  c.shardings = propagate(pg.graph, mesh, o.propagation);
  Program prog = partition(pg.graph, mesh, c.shardings, o.partition);
  add_program_warnings(warnings_for ? *warnings_for : graph, mesh, prog);
  for (const std::string& n : pg.notes) prog.warnings.push_back("uneven sharding: " + n);
  c.compiled = compiled_program_of(pg.graph, mesh, std::move(prog), std::move(pg.input_shapes),
                                    std::move(pg.output_shapes));
  c.graph = std::move(pg.graph);
  return c;
}

CompiledProgram compile_program(const Graph& graph, const Mesh& mesh, const CompileProgramOptions& options) {
  return compile_graph(graph, mesh, options).compiled;
}

}  // namespace tessel
