// tessel-explain: read a graph in the text form (docs/ir.md), propagate shardings,
// partition it and print every value's sharding, the per-device program and its cost.
//
//   tessel-explain FILE [--mesh data=2,model=4] [--why] [--device N] [--show VALUE]
//                       [--links 'model=bw:50e9,alpha:5e-6;data=bw:12.5e9' | --links @FILE]
//                       [--dump-after=parse|propagate|partition]
//                       [--run [--seed N] [--tolerance X] [--trace FILE]]
//                       [--auto [--memory-budget BYTES] [--auto-seconds S]]
//                       [--stages P [--microbatches M] [--remat all|none]]
//
// --stages P cuts the graph (one micro-batch's forward with a scalar loss as its one output)
// into P pipeline stages by the cost model (pipeline/auto_stages.hpp): the candidates are the
// values nothing else crosses (single_value_cuts), each piece between them is priced, and the
// least max stage time is chosen; prints each stage's cut value, pieces and predicted time, the
// pipeline's step and the equal cut's, then exits. --remat none prices stages that keep their
// activations (their bytes per micro-batch in flight, a backward without recomputation), as
// gpt_train runs them by default; all (the default here) stages that recompute their forward.
//
// --auto chooses the layout of every value the file does not annotate (automatic sharding,
// tessel/autoshard/auto_shard.hpp), prints them as annotations with the predicted cost, the
// memory per device and, for the costliest ops, the best layout not taken, then explains the
// auto-sharded program as it explains an annotated one.
// --show VALUE draws the mesh as a grid with the block of VALUE each device holds, for
// every layout the value takes in the program (tessel/compiler/visualize.hpp). --links @FILE reads
// the link figures from a file (docs/links.md; tessel-bench --calibrate-links writes one).
// The cost section gives the estimated time and the peak bytes per device of the memory
// plan (before anything runs):
//   peak_bytes_per_device=P (arena A, inputs I, outputs O)
//
// --run executes the partitioned program on the CPU backend (one thread per device) with
// fresh seeded random inputs, runs the unpartitioned graph on one device with the same
// inputs, compares every element of every output, prints the run's memory per device,
// `planned_peak_bytes_per_device=P measured_peak_bytes_per_device=M` (M: the largest
// device's allocator high-water, kernel scratch included), and `max_rel_err=<value>` as the
// last line; the exit status is 3 when it is above the tolerance (default 1e-5).
//
// The last line is the collectives summary of one device:
//   collectives: all-gather=A all-reduce=B reduce-scatter=C all-to-all=D collective-permute=E bytes=F
// Bad input exits with status 1 (2 for bad usage: tessel::UsageError from tessel/cli.hpp)
// and a message; it never crashes. --help prints the usage and exits 0.
#include <fmt/format.h>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/autoshard/problem.hpp"

#include <cstdio>
#include <algorithm>
#include <optional>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tessel/compiler/checks.hpp"
#include "tessel/cli.hpp"
#include "tessel/train/train_step.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/compiler/uneven.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/pipeline/auto_stages.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/compiler/visualize.hpp"

namespace {

// --show VALUE: the grid of every layout VALUE takes in the program (its definition, then
// each reshard of it), or its propagated sharding when the program does not hold it.
void show_value(const tessel::Graph& g, const tessel::Mesh& mesh, const tessel::PropagationResult& prop,
                const tessel::Program& prog, const std::string& name) {
  const int v = g.find(name);
  if (v < 0) {
    std::vector<std::string> known;
    for (const auto& val : g.values) {
      if (known.size() == 8) {
        known.push_back("...");
        break;
      }
      known.push_back("%" + val.name);
    }
    throw tessel::UsageError(fmt::format("--show {}: the graph has no value %{} (its values: {})", name, name,
                                         tessel::join(known, ", ")));
  }
  fmt::print("== where %{} lives\n", name);
  std::vector<tessel::Sharding> seen;
  for (const tessel::LocalValue& lv : prog.values) {
    if (lv.graph_value != v) continue;
    if (std::find(seen.begin(), seen.end(), lv.sharding) != seen.end()) continue;
    seen.push_back(lv.sharding);
    std::fputs(tessel::show_sharding(mesh, lv.global_shape, lv.sharding, "%" + lv.name, lv.dtype).c_str(), stdout);
  }
  if (seen.empty()) {
    const tessel::Value& val = g.values[static_cast<std::size_t>(v)];
    fmt::print("(the program does not compute %{}: no output needs it; its propagated layout:)\n", name);
    std::fputs(tessel::show_sharding(mesh, val.shape, prop.shardings[static_cast<std::size_t>(v)], "%" + name,
                                     val.dtype).c_str(),
               stdout);
  }
}

// The "why" lines of --auto: one per rejected alternative, except that alternatives of the same
// op kind, layouts and costs whose value names differ only in their numbers (a repeated layer:
// %grad.l0_w1, %grad.l1_w1, ...) share one line naming them all.
std::vector<std::string> why_lines(const tessel::Graph& g, const std::vector<tessel::RejectedAlternative>& alts) {
  auto masked = [](const std::string& name) {
    std::string m;
    for (char c : name)
      if (!(c >= '0' && c <= '9')) m += c;
      else if (m.empty() || m.back() != '#') m += '#';
    return m;
  };
  std::vector<std::string> keys, out;
  std::vector<std::vector<std::string>> names;
  std::vector<std::string> tails;
  for (const tessel::RejectedAlternative& a : alts) {
    const tessel::Op& op = g.ops[static_cast<std::size_t>(a.op)];
    const std::string name = g.values[static_cast<std::size_t>(op.output)].name;
    const std::string tail = fmt::format("{}: {} costs {:.6g} s; best other {} would cost {:.6g} s", tessel::op_name(op.kind),
                                         a.chosen.to_string(), a.chosen_s, a.alternative.to_string(), a.alternative_s);
    const std::string key = masked(name) + "|" + tail;
    const auto it = std::find(keys.begin(), keys.end(), key);
    if (it != keys.end()) {
      names[static_cast<std::size_t>(it - keys.begin())].push_back(name);
      continue;
    }
    keys.push_back(key);
    names.push_back({name});
    tails.push_back(tail);
  }
  for (std::size_t k = 0; k < keys.size(); ++k) {
    std::vector<std::string> pct;
    for (const std::string& n : names[k]) pct.push_back("%" + n);
    out.push_back(pct.size() == 1 ? fmt::format("{} = {}", pct[0], tails[k])
                                  : fmt::format("{} ({} ops alike) = each {}", fmt::join(pct, ", "), pct.size(), tails[k]));
  }
  return out;
}

// --stages P: the pipeline's stage cuts by the cost model, in words. With --auto each stage's
// shape is chosen too (every shape of the mesh's devices over its axes) within --memory-budget
// per device, and each stage's layouts by automatic sharding for its shape (the file's own kept).
int explain_stages(tessel::Graph& g, const tessel::Mesh& mesh, const tessel::CostModel& cost, int64_t stages,
                   int64_t micro, bool shapes, int64_t budget, tessel::RematPolicy remat, const std::string& file) {
  if (g.outputs.size() != 1 || !g.values[static_cast<std::size_t>(g.outputs[0])].shape.empty() ||
      g.values[static_cast<std::size_t>(g.outputs[0])].dtype == tessel::DType::i32)
    throw tessel::Error(fmt::format("--stages: {} must have one output, a float scalar (the loss of one "
                                    "micro-batch); it has {} outputs",
                                    file, g.outputs.size()));
  std::vector<tessel::Tensor> params;
  for (int v : g.inputs)
    if (g.values[static_cast<std::size_t>(v)].dtype != tessel::DType::i32) params.push_back(g.tensor(v));
  const tessel::Tensor loss = g.tensor(g.outputs[0]);
  std::vector<tessel::Tensor> candidates = tessel::single_value_cuts(g, params);
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](const tessel::Tensor& t) { return t.id == loss.id; }),
                   candidates.end());
  tessel::StageCutOptions so;
  std::vector<std::string> axes;
  for (const tessel::MeshAxis& a : mesh.axes()) axes.push_back(a.name);
  so.meshes = shapes ? tessel::mesh_shapes(mesh, axes) : std::vector<tessel::Mesh>{mesh};
  so.memory_budget_bytes = budget;
  so.remat = remat;
  if (shapes) {  // --auto: each stage's layouts too, by automatic sharding for its shape (the file's kept)
    so.auto_shard = tessel::AutoShardOptions{};
    so.auto_shard->cost = cost;
    so.auto_shard->cost_figures = tessel::AutoShardOptions::CostFigures::Given;
  }
  const tessel::StageCut c = tessel::choose_stage_cuts(g, loss, params, candidates, stages, micro, so, cost);
  fmt::print("== pipeline stages: {} of mesh {}, {} micro-batches, remat {}; {} candidate cuts (values nothing "
             "else crosses), {} pieces{}\n",
             stages, mesh.to_string(), micro, tessel::remat_policy_name(remat), candidates.size(), candidates.size() + 1,
             shapes ? fmt::format("; each stage's shape among {}{}", so.meshes.size(),
                                  budget > 0 ? fmt::format(", within {} bytes per device", budget) : std::string())
                    : std::string());
  // Each stage's program on its shape: the layout of the value it sends.
  std::vector<tessel::PipelineStage> parts = tessel::stages_with_layouts(g, loss, params, c);
  int64_t first = 0;
  double sum = 0, mx = 0;
  for (int64_t s = 0; s < stages; ++s) {
    const auto u = static_cast<std::size_t>(s);
    const int64_t n = c.pieces[u];
    std::string sends = ",";
    if (s + 1 < stages) {
      tessel::Graph& fwd = parts[u].forward;
      fwd.mesh = c.stage_meshes[u];
      const tessel::Executable exe = tessel::compile(fwd, c.stage_meshes[u]);
      const tessel::Program& prog = exe.program();
      std::string layout = "?";
      for (std::size_t o = 0; o < fwd.outputs.size(); ++o)
        if (fwd.outputs[o] == fwd.find(c.cuts[u].name()))
          layout = prog.values[static_cast<std::size_t>(prog.outputs[o])].sharding.to_string();
      sends = fmt::format(", sends %{} as {},", c.cuts[u].name(), layout);
    }
    std::string planned;  // --auto: how many of the stage's values its plan lays out over an axis
    if (!c.stage_layouts.empty() && c.stage_layouts[u].empty()) {
      planned = " (the file's own layouts: they price lower here than automatic sharding's, or it could not plan this shape)";
    } else if (!c.stage_layouts.empty()) {
      int64_t split = 0, all = 0;
      for (const auto& v : parts[u].forward.values) {
        auto it = c.stage_layouts[u].find(v.name);
        if (it == c.stage_layouts[u].end()) continue;
        ++all;
        split += it->second.is_replicated() ? 0 : 1;
      }
      planned = fmt::format(" (layouts by automatic sharding: {} of its {} forward values split over an axis)", split, all);
    }
    fmt::print("stage {}: pieces {}..{} on {}{} predicted {:.6g} s per micro-batch (forward and backward), {} bytes "
               "per device{}\n",
               s, first, first + n - 1, c.stage_meshes[u].to_string(), sends, c.stage_s[u], c.stage_bytes[u], planned);
    first += n;
    sum += c.stage_s[u];
    mx = std::max(mx, c.stage_s[u]);
  }
  fmt::print("predicted step: {:.6g} s = sum + ({} - 1) x max of the stage times; equal numbers of pieces ({}): "
             "{:.6g} s\n",
             c.step_s, micro, fmt::join(c.equal_pieces, "/"), c.equal_step_s);
  // The idle share of the step: each stage busy M times its time of the P stages' M·max + sum - max.
  fmt::print("predicted bubble: {:.4f} (1 - M x sum / (P x step))\n",
             c.step_s > 0 ? 1.0 - static_cast<double>(micro) * sum / (static_cast<double>(stages) * c.step_s) : 0.0);
  return 0;
}

int run(int argc, char** argv) {
  // Argument parsing lives in the library (tessel/cli.hpp) so it is tested and fuzzed.
  const tessel::cli::ExplainOptions opt =
      tessel::cli::parse_explain_args(std::vector<std::string>(argv + 1, argv + argc));
  if (opt.help) {
    std::fputs(tessel::cli::usage_explain().c_str(), stdout);
    return 0;
  }
  const std::string& file = opt.file;
  const std::string& mesh_spec = opt.mesh;
  const std::string& links = opt.links;
  const std::string& dump_after = opt.dump_after;
  const std::string& trace_path = opt.trace;
  const bool why = opt.why, do_run = opt.run;
  uint64_t seed = opt.seed;
  const bool seed_given = opt.seed_given;
  const double tolerance = opt.tolerance;
  const int64_t device = opt.device;

  tessel::Graph g = tessel::parse_graph_file(file);
  tessel::Mesh mesh;
  if (!mesh_spec.empty()) mesh = tessel::Mesh::parse(mesh_spec);
  else if (g.mesh) mesh = *g.mesh;
  else throw tessel::Error(fmt::format("{}: no mesh: declare one in the file (mesh data=2, model=4) "
                                       "or pass --mesh data=2,model=4", file));
  if (device < 0 || device >= mesh.num_devices())
    throw tessel::Error(fmt::format("--device {} is outside mesh {} ({} devices)", device,
                                    mesh.to_string(), mesh.num_devices()));
  g.mesh = mesh;
  tessel::PartitionOptions popts;
  if (!links.empty()) {
    popts.cost.parse_links(links);
    for (const auto& kv : popts.cost.links)
      if (!mesh.has_axis(kv.first))
        throw tessel::Error(fmt::format("--links: axis '{}' is not in mesh {}", kv.first, mesh.to_string()));
  }
  tessel::ProgramPassOptions lowering;
  lowering.collective_matmul.cost = popts.cost;
  lowering.collective_matmul.mode = opt.collective_matmul == "on"    ? tessel::OverlapMode::On
                                    : opt.collective_matmul == "off" ? tessel::OverlapMode::Off
                                                                     : tessel::OverlapMode::Auto;
  lowering.collective_matmul.direction = opt.ring == "uni"  ? tessel::RingDirection::Uni
                                         : opt.ring == "bi" ? tessel::RingDirection::Bi
                                                            : tessel::RingDirection::Auto;
  if (dump_after == "parse") {
    std::fputs(tessel::print_graph(g).c_str(), stdout);
    return 0;
  }
  if (opt.stages > 0)
    return explain_stages(g, mesh, popts.cost, opt.stages, opt.microbatches, opt.auto_shard, opt.memory_budget,
                          tessel::parse_remat_policy(opt.stage_remat), file);
  std::optional<tessel::AutoShardResult> auto_result;  // --auto: the plan, for its predictions below
  int64_t auto_ops = 0;
  if (opt.auto_shard) {
    // Automatic sharding: the layouts of every value the file does not annotate are chosen,
    // printed as annotations, and the rest of this tool explains the program they give.
    tessel::AutoShardOptions ao;
    ao.cost = popts.cost;
    ao.memory_budget_bytes = opt.memory_budget;
    ao.time_limit_s = opt.auto_seconds;
    if (!opt.write_problem.empty()) {  // the formulation alone, for tessel-iopddl and the benchmarks
      tessel::AutoShardProblem ap = tessel::formulate_auto_shard(g, mesh, ao);
      ap.problem.name = fmt::format("{} on {}{}", file, mesh.to_string(),
                                    opt.memory_budget > 0 ? fmt::format(", budget {} bytes", opt.memory_budget) : "");
      tessel::autoshard::write_iopddl(ap.problem, opt.write_problem);
      fmt::print("wrote the automatic-sharding problem of {} on {} ({} nodes, {} edges{}) to {}\n", file,
                 mesh.to_string(), ap.problem.nodes.size(), ap.problem.edges.size(),
                 ap.problem.usage_limit ? fmt::format(", usage limit {}", *ap.problem.usage_limit) : "",
                 opt.write_problem);
      return 0;
    }
    const tessel::AutoShardResult r = tessel::auto_shard(g, mesh, ao);
    fmt::print("== auto-sharding: {} nodes, {} strategies, {} edges; formulated in {:.3f} s, solved in {:.3f} s by {}\n",
               r.nodes, r.strategies, r.edges, r.formulate_s, r.solve_s, r.solver);
    fmt::print("predicted per device: {:.6g} s = compute {:.6g} s + communication {:.6g} s; peak {} bytes{}\n",
               r.compute_s + r.comm_s, r.compute_s, r.comm_s, r.peak_bytes,
               opt.memory_budget > 0 ? fmt::format(" ({} the budget of {} bytes)", r.fits ? "within" : "ABOVE",
                                                   opt.memory_budget)
                                     : std::string());
    fmt::print("== chosen layouts (paste as annotations)\n");
    std::fputs(r.layouts_text(g).c_str(), stdout);
    fmt::print("== why: the costliest ops and the best layout not taken (the rest of the plan as chosen)\n");
    for (const std::string& line : why_lines(g, r.alternatives)) fmt::print("{}\n", line);
    tessel::check_fits(r, ao, mesh, fmt::format("--memory-budget {}", opt.memory_budget));  // after the plan is shown
    auto_result = r;
    auto_ops = static_cast<int64_t>(g.ops.size());
    g = r.annotated(g);
  }
  // An uneven split is padded (uneven.hpp): the rest of the pipeline sees the padded graph;
  // --run draws inputs for, and compares with, the user's graph.
  tessel::Graph user = g.clone();
  tessel::PaddedGraph padded = tessel::pad_uneven(g, mesh);
  const std::vector<tessel::Shape> user_shapes = padded.input_shapes;
  const std::vector<tessel::Shape> user_output_shapes = padded.output_shapes;
  const std::vector<std::string> padding_notes = padded.notes;
  if (padded.padded) g = std::move(padded.graph);
  tessel::PropagationResult prop = tessel::propagate(g, mesh);
  fmt::print("== mesh {} ({} devices)\n", mesh.to_string(), mesh.num_devices());
  for (const std::string& n : padding_notes) fmt::print("== uneven sharding: {}\n", n);
  fmt::print("== shardings after propagation ({} passes)\n", prop.passes);
  tessel::PrintOptions po;
  po.comment = [&](int v) { return prop.shardings[v].to_string(); };
  std::fputs(tessel::print_graph(g, po).c_str(), stdout);
  if (why) {
    fmt::print("== why\n");
    for (std::size_t v = 0; v < g.values.size(); ++v)
      std::fputs(prop.explain(g, static_cast<int>(v)).c_str(), stdout);
    for (const auto& d : prop.decisions) fmt::print("decision: {}\n", d);
  }
  if (dump_after == "propagate") return 0;
  tessel::Program prog = tessel::partition(g, mesh, prop, popts);
  tessel::add_program_warnings(g, mesh, prog);
  lowering.fuse_elementwise = lowering.fuse_elementwise && opt.fusion;
  if (dump_after != "parse" && dump_after != "propagate" && dump_after != "partition" && !dump_after.empty()) {
    // A lowering pass: the program after it, in the Program text form (parseable).
    fmt::print("== program after {}\n", dump_after);
    std::fputs(tessel::dump_program_after(prog, dump_after, lowering).c_str(), stdout);
    return 0;
  }
  fmt::print("== program\n");
  std::fputs(prog.to_string(device).c_str(), stdout);
  if (why) {  // the plan that was built: every collective and slice, and what it is for
    fmt::print("== why each collective (the plan that was built)\n");
    int n = 0;
    for (const tessel::Instr& in : prog.instrs) {
      if (in.kind != tessel::InstrKind::Collective && in.kind != tessel::InstrKind::ShardSlice) continue;
      const std::string what = in.kind == tessel::InstrKind::ShardSlice ? std::string("slice (no communication)")
                                                                        : tessel::collective_name(in.collective);
      fmt::print("{} of %{} over {{{}}}, {} bytes: {}\n", what, prog.values[static_cast<std::size_t>(in.in[0])].name,
                 fmt::join(in.axes, ","), in.bytes, in.note.empty() ? std::string("(no note)") : in.note);
      ++n;
    }
    if (n == 0) fmt::print("none: every op runs on the blocks its operands already hold\n");
  }
  for (const std::string& name : opt.show) show_value(g, mesh, prop, prog, name);
  auto s = prog.summary();
  if (!prog.warnings.empty()) {
    fmt::print("== warnings\n");
    for (const auto& w : prog.warnings) fmt::print("warning: {}\n", w);
  }
  const auto sites = tessel::collective_matmul_sites(prog, lowering.collective_matmul);
  if (!sites.empty()) {
    fmt::print("== collective matmul ({}; docs/collective-matmul.md)\n", opt.collective_matmul);
    for (const auto& site : sites) fmt::print("{}\n", site.line());
  }
  fmt::print("== cost per device (cost model: {:.0f} GFLOP/s, {:.0f} GB/s memory, default link {:.1f} GB/s, "
             "alpha {:.1f} us)\n",
             popts.cost.flops_per_s / 1e9, popts.cost.memory_bandwidth / 1e9, popts.cost.default_link.bandwidth / 1e9,
             popts.cost.default_link.alpha_s * 1e6);
  for (const auto& kv : popts.cost.links)
    fmt::print("link {}: {:.4g} GB/s, alpha {:.4g} us{}\n", kv.first, kv.second.bandwidth / 1e9,
               kv.second.alpha_s * 1e6, opt.links_file.empty() ? "" : " (from " + opt.links_file + ")");
  fmt::print("flops={:.6g} compute_s={:.6g} comm_s={:.6g}\n", prog.total_flops(),
             prog.compute_seconds(popts.cost), prog.comm_seconds());
  // The memory plan of the lowered program: what load() allocates, known before a run.
  const tessel::MemoryPlan mem = tessel::lower_program(prog, false, lowering).memory_plan();
  fmt::print("peak_bytes_per_device={} (arena {}, inputs {}, outputs {})\n", mem.peak_bytes(), mem.arena_bytes,
             mem.input_bytes, mem.output_bytes);
  fmt::print("{}\n", s.line());
  if (auto_result) {
    // The solver's prediction and the program's, side by side, and why they differ.
    const tessel::Program low = tessel::lower_program(prog, false, lowering);
    const tessel::AutoShardResult& r = *auto_result;
    const double dispatch = r.dispatch_s;
    int64_t kernels = 0, collectives = 0, unlowered = 0;
    for (const tessel::Instr& in : low.instrs) {
      kernels += in.kind == tessel::InstrKind::Kernel;
      collectives += in.kind == tessel::InstrKind::Collective || in.kind == tessel::InstrKind::CollectiveStart;
    }
    for (const tessel::Instr& in : prog.instrs) unlowered += in.kind == tessel::InstrKind::Collective;
    const double pc = low.compute_seconds(popts.cost), pm = low.comm_seconds(popts.cost);
    fmt::print("== auto-sharding: the solver's prediction against the program's (per device)\n");
    fmt::print("compute: solver {:.6g} s = {:.6g} s roofline of the graph's {} ops, before fusion, + {:.6g} s dispatch "
               "({:.3g} us per op computed); program {:.6g} s = roofline of its {} kernels after fusion, no dispatch\n",
               r.compute_s, std::max(0.0, r.compute_s - dispatch), auto_ops, dispatch,
               popts.cost.dispatch_seconds() * 1e6, pc, kernels);
    fmt::print("communication: solver {:.6g} s (each reduction of an op priced alone, a weight gradient's with a "
               "share of one latency); program {:.6g} s ({} collectives after lowering, {} before: reshards "
               "placed, reductions combined)\n",
               r.comm_s, pm, collectives, unlowered);
    fmt::print("peak: solver {} bytes (each value live from its op to its last use, in graph order, before fusion); "
               "program {} bytes (the memory plan: arena {} + inputs {} + outputs {}{})\n",
               r.peak_bytes, mem.peak_bytes(), mem.arena_bytes, mem.input_bytes, mem.output_bytes,
               mem.output_bytes > 0 ? ", each output apart from any input it updates: this tool declares no donation, "
                                      "a Trainer does"
                                    : "");
    const double solver = r.compute_s + r.comm_s, program = pc + pm + dispatch;
    fmt::print("total: solver {:.6g} s; program {:.6g} s with the same dispatch added ({:+.0f}%)\n", solver, program,
               solver > 0 ? 100.0 * (program - solver) / solver : 0.0);
  }
  if (!do_run) return 0;

  // ---- --run: partitioned run vs. the unpartitioned reference ----
  if (g.outputs.empty())
    throw tessel::Error(fmt::format("{}: the graph has no output, so --run would compare nothing; "
                                    "add a line `output %VALUE`", file));
  if (!trace_path.empty()) {
    // Checked before the run, which may be long: a bad path must not lose its results.
    const std::string dir = trace_path.find('/') == std::string::npos
                                ? std::string(".")
                                : trace_path.substr(0, trace_path.rfind('/') + 1);
    if (std::FILE* probe = std::fopen((dir + "/.").c_str(), "r")) std::fclose(probe);
    else throw tessel::Error(fmt::format("--trace {}: the folder {} does not exist", trace_path, dir));
  }
  tessel::cli::require_one_process("tessel-explain --run");
  if (!seed_given) seed = static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  tessel::Executable exe(g.clone(), mesh, prop, prog);
  exe.set_user_shapes(user_shapes, user_output_shapes);
  std::vector<tessel::HostTensor> inputs = tessel::random_inputs(user, seed);
  tessel::make_train_inputs_valid(user, inputs);  // a training step's state: v >= 0, a small lr
  // Loaded with the lowering options of this command (--collective-matmul, --ring).
  tessel::ThreadRuntime rt(mesh.num_devices());
  tessel::LoadOptions lo;
  lo.lowering = lowering;
  tessel::LoadedExecutable le = tessel::load(exe, rt, lo);
  std::vector<tessel::ShardedArray> arrays;
  for (std::size_t i = 0; i < inputs.size(); ++i) arrays.push_back(le.to_device(i, inputs[i]));
  tessel::RunOptions ro;
  ro.poison = true;
  ro.check_replicas = true;
  ro.trace_path = trace_path;
  tessel::RunResult res = le.run(arrays, ro);
  std::vector<tessel::HostTensor> got;
  for (const auto& a : res.outputs) got.push_back(le.to_host(a, /*check_replicas=*/true));
  std::vector<tessel::HostTensor> want = tessel::run_reference(user, inputs);
  double worst = 0;
  fmt::print("== run (cpu backend, {} device threads, seed {})\n", mesh.num_devices(), seed);
  for (std::size_t o = 0; o < got.size(); ++o) {
    // NaN at the same element on both sides is the graph's own (e.g. log of a negative input),
    // not a partitioning error: reported as such, and the other elements compared.
    int64_t both_nan = 0, first_nan = -1;
    if (got[o].dtype() != tessel::DType::i32 && got[o].shape() == want[o].shape())
      for (int64_t i = 0; i < got[o].numel(); ++i)
        if (std::isnan(got[o].get(i)) && std::isnan(want[o].get(i))) {
          if (both_nan++ == 0) first_nan = i;
          got[o].set(i, 0.0);
          want[o].set(i, 0.0);
        }
    tessel::CompareResult c = tessel::compare(got[o], want[o]);
    fmt::print("output %{}: {}\n", user.values[user.outputs[o]].name, c.to_string());
    if (both_nan > 0)
      fmt::print("output %{}: NaN on both sides at {} element{} (first: element {}): the graph makes NaN there "
                 "from these inputs; not a difference between the partitioned and the unpartitioned run\n",
                 user.values[user.outputs[o]].name, both_nan, both_nan == 1 ? "" : "s", first_nan);
    worst = std::max(worst, c.max_rel_err);
  }
  const auto& st = res.stats;
  int64_t peak = 0;
  for (int64_t b : st.measured_peak_bytes) peak = std::max(peak, b);
  fmt::print("planned_peak_bytes_per_device={} measured_peak_bytes_per_device={} wall_s={:.6f}\n",
             st.planned_peak_bytes, peak, st.seconds);
  if (!trace_path.empty()) fmt::print("trace written to {}\n", trace_path);
  fmt::print("max_rel_err={:.3g}\n", worst);
  return worst <= tolerance ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "tessel-explain: error: %s\n%s", e.what(), tessel::cli::usage_explain().c_str());
    return 2;
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel-explain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel-explain: error: %s\n", e.what());
    return 1;
  }
}
