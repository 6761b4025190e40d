// Graph: SSA values and ops over global shapes, and the ggml-style builder functions.
#include "tessel/ir/graph.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/ops/registry.hpp"

namespace tessel {

const Value& Tensor::value() const {
  if (!anchor) throw Error("tessel::Tensor: a default handle refers to no graph");
  const Graph* g = anchor->graph;
  if (!g)
    throw Error(fmt::format("tessel::Tensor (value #{}): its graph was destroyed or assigned "
                            "over; keep the Graph alive while its handles are used", id));
  if (id < 0 || id >= static_cast<int>(g->values.size()))
    throw Error(fmt::format("tessel::Tensor: value #{} is not a value of its graph", id));
  return g->values[static_cast<std::size_t>(id)];
}

Tensor Tensor::named(std::string name) const {
  value();
  Graph* graph = anchor->graph;
  if (graph->find(name) >= 0 && graph->find(name) != id)
    throw Error(fmt::format("value name '%{}' is already used: names must be unique", name));
  graph->find(name);  // sync the index
  graph->names_.erase(graph->values[static_cast<std::size_t>(id)].name);
  graph->names_[name] = id;
  graph->values[static_cast<std::size_t>(id)].name = std::move(name);
  return *this;
}

Graph::Graph() : anchor_(std::make_shared<GraphAnchor>(GraphAnchor{this})) {}

Graph::~Graph() {
  if (anchor_) anchor_->graph = nullptr;
}

Graph::Graph(Graph&& o) noexcept
    : values(std::move(o.values)), ops(std::move(o.ops)), inputs(std::move(o.inputs)),
      outputs(std::move(o.outputs)), annotations(std::move(o.annotations)),
      mesh(std::move(o.mesh)), regions(std::move(o.regions)), next_name_(o.next_name_),
      names_(std::move(o.names_)), anchor_(std::move(o.anchor_)) {
  anchor_->graph = this;
  // The moved-from graph is empty and has a fresh identity.
  o.anchor_ = std::make_shared<GraphAnchor>(GraphAnchor{&o});
  o.clear_after_move();
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this == &o) return *this;
  anchor_->graph = nullptr;  // handles to what this graph held are now invalid
  values = std::move(o.values);
  ops = std::move(o.ops);
  inputs = std::move(o.inputs);
  outputs = std::move(o.outputs);
  annotations = std::move(o.annotations);
  mesh = std::move(o.mesh);
  regions = std::move(o.regions);
  next_name_ = o.next_name_;
  names_ = std::move(o.names_);
  anchor_ = std::move(o.anchor_);
  anchor_->graph = this;
  o.anchor_ = std::make_shared<GraphAnchor>(GraphAnchor{&o});
  o.clear_after_move();
  return *this;
}

void Graph::clear_after_move() noexcept {
  values.clear();
  ops.clear();
  inputs.clear();
  outputs.clear();
  annotations.clear();
  mesh.reset();
  regions.clear();
  next_name_ = 0;
  names_.clear();
}

Graph Graph::clone() const {
  Graph g;
  g.values = values;
  g.ops = ops;
  g.inputs = inputs;
  g.outputs = outputs;
  g.annotations = annotations;
  g.mesh = mesh;
  g.regions = regions;
  g.next_name_ = next_name_;
  return g;
}

Tensor Graph::tensor(int id) {
  if (id < 0 || id >= static_cast<int>(values.size()))
    throw Error(fmt::format("Graph::tensor: value id {} is not in the graph ({} values)", id,
                            values.size()));
  return Tensor{anchor_, id};
}

std::string Graph::fresh_name() {
  while (true) {
    std::string n = fmt::format("v{}", next_name_++);
    if (find(n) < 0) return n;
  }
}

int Graph::find(std::string_view name) const {
  // The name index is kept by add_input/add_op/Tensor::named; it is rebuilt when values
  // were added another way.
  if (names_.size() != values.size()) {
    names_.clear();
    for (std::size_t i = 0; i < values.size(); ++i) names_[values[i].name] = static_cast<int>(i);
  }
  auto it = names_.find(std::string(name));
  return it == names_.end() ? -1 : it->second;
}

std::string Graph::describe(int v) const {
  const Value& val = values.at(static_cast<std::size_t>(v));
  if (val.producer < 0 || ops[val.producer].kind == OpKind::Input)
    return fmt::format("%{} ({}, input)", val.name, type_str(val.dtype, val.shape));
  if (val.result > 0)
    return fmt::format("%{} ({}, result {} of {})", val.name, type_str(val.dtype, val.shape),
                       val.result, describe_op(val.producer));
  return fmt::format("%{} ({}, result of {})", val.name, type_str(val.dtype, val.shape),
                     describe_op(val.producer));
}

std::string Graph::describe_op(int op) const {
  return fmt::format("op #{} {}", op, op_name(ops.at(static_cast<std::size_t>(op)).kind));
}

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> u(values.size());
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (int v : ops[i].inputs) u[v].push_back(static_cast<int>(i));
  return u;
}

Tensor Graph::add_input(std::string name, DType dtype, Shape shape) {
  for (int64_t d : shape)
    if (d < 1)
      throw ShapeError(fmt::format("input %{}: shape {} has a dim < 1", name, shape_str(shape)));
  (void)checked_value_bytes(shape, dtype, fmt::format("input %{}", name));
  if (name.empty()) name = fresh_name();
  if (find(name) >= 0)
    throw Error(fmt::format("input name '%{}' is already used: names must be unique", name));
  Op op;
  op.kind = OpKind::Input;
  op.attrs.dtype = dtype;
  op.output = static_cast<int>(values.size());
  find(name);  // sync the index before adding
  names_[name] = static_cast<int>(values.size());
  values.push_back(Value{std::move(name), std::move(shape), dtype, static_cast<int>(ops.size())});
  ops.push_back(std::move(op));
  inputs.push_back(static_cast<int>(values.size()) - 1);
  return Tensor{anchor_, static_cast<int>(values.size()) - 1};
}


Tensor Graph::add_op(OpKind kind, std::vector<int> in, OpAttrs attrs, std::string name) {
  const OpDef& def = op_def(kind);
  if (def.num_results != 1)
    throw Error(fmt::format("{} has {} results: build it with Graph::add_op_results (or its "
                            "builder function), which returns a handle per result",
                            def.name, def.num_results));
  std::vector<std::string> names;
  if (!name.empty()) names.push_back(std::move(name));
  return add_op_results(kind, std::move(in), std::move(attrs), std::move(names)).front();
}

std::vector<Tensor> Graph::add_op_results(OpKind kind, std::vector<int> in, OpAttrs attrs,
                                          std::vector<std::string> names) {
  const OpDef& def = op_def(kind);
  if (kind == OpKind::Input) throw Error("use Graph::add_input to create inputs");
  int n = static_cast<int>(in.size());
  if (n < def.min_inputs || (def.max_inputs >= 0 && n > def.max_inputs))
    throw ShapeError(fmt::format("{}: takes {}{} operands, got {}", def.name, def.min_inputs,
                                 def.max_inputs == def.min_inputs ? std::string()
                                 : def.max_inputs < 0 ? std::string(" or more")
                                 : fmt::format(" to {}", def.max_inputs), n));
  if (!names.empty() && static_cast<int>(names.size()) != def.num_results)
    throw Error(fmt::format("{}: {} names given for its {} result{}", def.name, names.size(),
                            def.num_results, def.num_results == 1 ? "" : "s"));
  std::vector<const Value*> ins;
  for (int v : in) {
    if (v < 0 || v >= static_cast<int>(values.size()))
      throw Error(fmt::format("{}: operand id {} is not a value of this graph", def.name, v));
    ins.push_back(&values[static_cast<std::size_t>(v)]);
  }
  // Canonical attributes (negative axes made positive, reduced dims sorted).
  if (def.normalize) def.normalize(attrs, ins);
  std::vector<ResultType> types = infer_op(kind, attrs, ins);
  // Guard against sizes that overflow (e.g. an outer product of huge dims): the same bound as
  // every other place a value is declared.
  for (const ResultType& t : types) {
    for (int64_t d : t.shape)
      if (d < 0) throw ShapeError(fmt::format("{}: result shape {} has a negative dim", def.name, shape_str(t.shape)));
    (void)checked_value_bytes(t.shape, t.dtype, fmt::format("{}: its result", def.name));
  }
  names.resize(types.size());
  for (std::size_t r = 0; r < names.size(); ++r) {
    if (names[r].empty()) names[r] = fresh_name();
    if (find(names[r]) >= 0)
      throw Error(fmt::format("{}: value name '%{}' is already used: names must be unique",
                              def.name, names[r]));
    for (std::size_t q = 0; q < r; ++q)
      if (names[q] == names[r])
        throw Error(fmt::format("{}: value name '%{}' is given to two of its results", def.name,
                                names[r]));
  }
  Op op;
  op.kind = kind;
  op.inputs = std::move(in);
  op.attrs = std::move(attrs);
  std::vector<Tensor> handles;
  for (std::size_t r = 0; r < types.size(); ++r) {
    const int id = static_cast<int>(values.size());
    if (r == 0) op.output = id;
    else op.extra_outputs.push_back(id);
    names_[names[r]] = id;
    values.push_back(Value{std::move(names[r]), std::move(types[r].shape), types[r].dtype,
                           static_cast<int>(ops.size()), static_cast<int>(r)});
    handles.push_back(Tensor{anchor_, id});
  }
  ops.push_back(std::move(op));
  return handles;
}

void Graph::annotate(Tensor t, Sharding s, int priority) {
  t.value();
  if (t.graph() != this)
    throw Error(fmt::format("annotate: tensor %{} belongs to another graph; annotate it on the "
                            "graph that built it", t.name()));
  annotate(t.id, std::move(s), priority);
}

void Graph::annotate(int v, Sharding s, int priority) {
  if (v < 0 || v >= static_cast<int>(values.size()))
    throw Error(fmt::format("annotate: value id {} is not in the graph", v));
  if (s.rank() != static_cast<int>(values[v].shape.size()))
    throw ShardingError(fmt::format("annotate {}: sharding {} has {} dims for a value of rank {}",
                                    describe(v), s.to_string(), s.rank(), values[v].shape.size()));
  if (!s.partial.empty())
    throw ShardingError(fmt::format("annotate {}: sharding {} is partial; annotations give the "
                                    "layout of materialized values, drop partial{{...}}",
                                    describe(v), s.to_string()));
  if (priority < 0)
    throw ShardingError(fmt::format("annotate {}: priority {} must be >= 0", describe(v), priority));
  annotations[v] = Annotation{std::move(s), priority};
}

void Graph::expect_gathers(Tensor t) {
  t.value();
  auto it = annotations.find(t.id);
  if (t.graph() != this || it == annotations.end())
    throw Error(fmt::format("expect_gathers: %{} has no annotation on this graph; annotate it first", t.name()));
  it->second.gather_expected = true;
}

int Graph::region_id(const std::string& name) {
  const auto it = std::find(regions.begin(), regions.end(), name);
  if (it != regions.end()) return static_cast<int>(it - regions.begin());
  regions.push_back(name);
  return static_cast<int>(regions.size()) - 1;
}

void Graph::set_region(std::size_t first_op, int region) {
  if (region < -1 || region >= static_cast<int>(regions.size()))
    throw Error(fmt::format("set_region: region {} is not one of the graph's {} regions", region, regions.size()));
  for (std::size_t i = first_op; i < ops.size(); ++i) ops[i].region = region;
}

void Graph::mark_output(Tensor t) {
  t.value();
  if (t.graph() != this) throw Error("mark_output: tensor belongs to another graph");
  outputs.push_back(t.id);
}

}  // namespace tessel
