// SPMD partitioner: per op, pick the factor sharding, reshard operands, emit the local op.
#include "tessel/compiler/partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "tessel/ops/registry.hpp"
#include "tessel/compiler/factor_choice.hpp"
#include "tessel/compiler/reshard.hpp"

namespace tessel {
namespace {

using Axes = std::vector<std::string>;


struct Partitioner {
  const Graph& g;
  const Mesh& mesh;
  const PropagationResult& prop;
  const PartitionOptions& opts;
  Program prog;
  std::vector<int> phys;                           // graph value -> local value holding it
  struct Cached {
    int value;               // the resharded local value
    std::size_t last_use;    // instruction count when it was last handed out
    bool gathers;            // its plan all-gathers (a copy larger than the source)
    bool of_input;           // a copy of a program input (a parameter), which lives the whole step
    int region;              // the region it was made in (Graph::regions; -1: none)
  };
  std::map<std::pair<int, std::string>, Cached> cache;  // (local, target layout) -> reshard
  std::map<int, int> name_count;
  // The region of the op being partitioned: its own, or when it has none the last one seen.
  int region = -1;
  // Copies are made again by region (PartitionOptions::regather_by_region), not by distance.
  bool by_region = false;

  int new_value(int graph_value, Sharding s, DType dtype, const Shape& global) {
    LocalValue lv;
    int& n = name_count[graph_value];
    lv.name = graph_value >= 0 ? g.values[graph_value].name : std::string("tmp");
    if (n > 0 || graph_value < 0) lv.name += fmt::format(".{}", n);
    ++n;
    lv.global_shape = global;
    lv.dtype = dtype;
    lv.shape = s.local_shape(mesh, global);
    lv.sharding = std::move(s);
    lv.graph_value = graph_value;
    prog.values.push_back(std::move(lv));
    return static_cast<int>(prog.values.size()) - 1;
  }

  // A program input (a parameter, the batch): it lives the whole step.
  bool is_input(int graph_value) const {
    if (graph_value < 0) return false;
    const int p = g.values[static_cast<std::size_t>(graph_value)].producer;
    return p >= 0 && g.ops[static_cast<std::size_t>(p)].kind == OpKind::Input;
  }

  int reshard(int local, const Sharding& target, int graph_op, const std::string& why) {
    const LocalValue src = prog.values[local];
    if (src.sharding.same_layout(target)) return local;
    std::string key = target.closed_copy().to_string();
    auto it = cache.find({local, key});
    if (it != cache.end()) {
      Cached& c = it->second;
      // PartitionOptions::regather_by_region and regather_distance: when a copy is made again.
      const bool again =
          by_region ? (c.gathers || c.of_input) && c.region != region
                    : c.gathers && opts.regather_distance > 0 &&
                          prog.instrs.size() - c.last_use > static_cast<std::size_t>(opts.regather_distance);
      if (!again) {
        c.last_use = prog.instrs.size();
        return c.value;
      }
    }
    ReshardPlan plan = plan_reshard(mesh, src.global_shape, src.dtype, src.sharding, target, opts.cost);
    const auto ann = src.graph_value >= 0 ? g.annotations.find(src.graph_value) : g.annotations.end();
    const bool by_design = ann != g.annotations.end() && ann->second.gather_expected;  // ZeRO/FSDP
    for (const ReshardStep& st : plan.steps)
      if (!by_design && st.kind == InstrKind::Collective && st.collective == CollectiveKind::AllGather)
        prog.warnings.push_back(fmt::format(
            "%{} is all-gathered over {{{}}} ({} bytes per device) {}: {} -> {}", src.name,
            join(st.axes, ", "), st.bytes, why, src.sharding.to_string(), target.to_string()));
    int cur = local;
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const ReshardStep& st = plan.steps[i];
      Instr in;
      in.kind = st.kind;
      in.collective = st.collective;
      in.axes = st.axes;
      in.dim = st.dim;
      in.dim2 = st.dim2;
      in.pairs = st.pairs;
      in.bytes = st.bytes;
      in.seconds = st.seconds;
      in.in = {cur};
      in.graph_op = graph_op;
      in.note = i == 0 ? fmt::format("reshard {} -> {} {}", src.sharding.to_string(),
                                     target.to_string(), why)
                       : std::string();
      in.out = new_value(src.graph_value, st.after, src.dtype, src.global_shape);
      cur = in.out;
      prog.instrs.push_back(std::move(in));
    }
    // An empty plan (equivalent layouts): relabel without moving data.
    if (plan.steps.empty()) {
      Instr in;
      in.kind = InstrKind::ShardSlice;  // a no-op slice over no axes
      in.dim = 0;
      in.in = {cur};
      in.graph_op = graph_op;
      in.note = "relabel (same data on every device)";
      in.out = new_value(src.graph_value, target, src.dtype, src.global_shape);
      cur = in.out;
      prog.instrs.push_back(std::move(in));
    }
    bool gathers = false;
    for (const ReshardStep& st : plan.steps)
      gathers = gathers || (st.kind == InstrKind::Collective && st.collective == CollectiveKind::AllGather);
    cache[{local, key}] = Cached{cur, prog.instrs.size(), gathers, is_input(src.graph_value), region};
    return cur;
  }

  double bytes_of(int graph_value) const {
    const Value& v = g.values[graph_value];
    return static_cast<double>(num_elements(v.shape)) * static_cast<double>(dtype_size(v.dtype));
  }

  void emit_kernel(int graph_op, OpKind kind, OpAttrs attrs, std::vector<int> in, int out,
                   std::vector<int> extra_out = {}) {
    Instr ins;
    ins.kind = InstrKind::Kernel;
    ins.op = kind;
    ins.in = std::move(in);
    ins.out = out;
    ins.extra_out = std::move(extra_out);
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (int v : ins.in) {
      shapes.push_back(prog.values[v].shape);
      dtypes.push_back(prog.values[v].dtype);
    }
    const LocalValue& o = prog.values[out];
    ins.flops = op_def(kind).flops(attrs, shapes, o.shape);
    const double bytes = op_bytes(kind, attrs, shapes, dtypes, o.shape, o.dtype);
    ins.seconds = opts.cost.op_seconds(ins.flops, bytes);
    ins.attrs = std::move(attrs);
    ins.graph_op = graph_op;
    prog.instrs.push_back(std::move(ins));
  }

  Axes mesh_order(Axes axes) const {
    std::sort(axes.begin(), axes.end(), [&](const std::string& a, const std::string& b) {
      return mesh.axis_index(a) < mesh.axis_index(b);
    });
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    return axes;
  }

  // Factor sharding for an op by the one factor policy (compiler/factor_choice.hpp): the
  // operands' current layouts and the results' propagated ones as wishes, ranked by the
  // priority their layouts derive from, then bytes. result_first: the results' wishes are
  // Exact (the op computes where its results are wanted); otherwise they only fill factors the
  // operands left free. Then made realizable.
  std::vector<Axes> choose_factors(const Op& op, const OpRule& rule, bool result_first) {
    std::vector<FactorWish> wishes;
    for (int r = 0; r < op.num_results(); ++r) {
      FactorWish w;
      w.value = op.result(r);
      w.priority = prop.source_priority[static_cast<std::size_t>(w.value)];
      w.bytes = bytes_of(w.value);
      w.reach = result_first ? FactorWish::Reach::Exact : FactorWish::Reach::FillEmpty;
      w.axes = project_onto_factors(mesh, rule.result_dims(r), rule.factors, prop.shardings[op.result(r)]);
      wishes.push_back(std::move(w));
    }
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      FactorWish w;
      w.value = op.inputs[i];
      w.priority = prop.source_priority[static_cast<std::size_t>(w.value)];
      w.bytes = bytes_of(w.value);
      w.axes = project_onto_factors(mesh, rule.operands[i], rule.factors, prog.values[phys[op.inputs[i]]].sharding);
      wishes.push_back(std::move(w));
    }
    FactorAxes fs = choose_factor_axes(rule, wishes).axes;
    make_realizable(mesh, rule, fs);
    return fs;
  }

  // The combined axes of a factor sharding: those of its Combined factors, in mesh order.
  Axes combined_axes(const OpRule& rule, const std::vector<Axes>& fs) const {
    Axes a;
    for (std::size_t f = 0; f < fs.size(); ++f)
      if (rule.factors[f].kind == FactorKind::Combined) a.insert(a.end(), fs[f].begin(), fs[f].end());
    return mesh_order(a);
  }

  // Seconds of a distributed reduction's statistics all-reduces: distribute_stats of them,
  // each of one f32 per local row (the elements of operand 0's block without the combined
  // factors).
  double stats_estimate(const Op& op, const OpRule& rule, const std::vector<Axes>& fs) const {
    const Axes axes = combined_axes(rule, fs);
    if (axes.empty() || mesh.axes_size(axes) == 1) return 0;
    const Shape& s0 = g.values[op.inputs[0]].shape;
    Sharding req = Sharding::replicated(static_cast<int>(s0.size()));
    for (std::size_t d = 0; d < rule.operands[0].size(); ++d)
      req.dims[d].axes = compose_dim(mesh, rule.operands[0][d], rule.factors, fs);
    double rows = static_cast<double>(num_elements(req.local_shape(mesh, s0)));
    for (std::size_t f = 0; f < fs.size(); ++f)
      if (rule.factors[f].kind == FactorKind::Combined)
        rows /= static_cast<double>(rule.factors[f].size) / static_cast<double>(mesh.axes_size(fs[f]));
    const int64_t bytes = static_cast<int64_t>(rows) * 4;
    return op_def(op.kind).distribute_stats *
           opts.cost.collective_seconds(CollectiveKind::AllReduce, mesh, axes, bytes);
  }

  // The local layout of result r under factor sharding fs: its dims from the factors that
  // compose them; partial over the axes of sharded factors it sums over (reduction factors,
  // and for an op with several results the factors this result lacks), plus `kept` (partial
  // operands that flowed through).
  Sharding result_layout(const Op& op, const OpRule& rule, const std::vector<Axes>& fs, int r,
                         const Axes& kept) const {
    const Value& v = g.values[static_cast<std::size_t>(op.result(r))];
    const auto& dims = rule.result_dims(r);
    Sharding rs = Sharding::replicated(static_cast<int>(v.shape.size()));
    for (std::size_t d = 0; d < dims.size(); ++d) rs.dims[d].axes = compose_dim(mesh, dims[d], rule.factors, fs);
    Axes partial = kept;
    for (std::size_t f = 0; f < fs.size(); ++f) {
      const FactorKind k = rule.factors[f].kind;
      if (k == FactorKind::Reduction || (k == FactorKind::Pass && !rule.in_result(r, static_cast<int>(f))))
        partial.insert(partial.end(), fs[f].begin(), fs[f].end());
    }
    rs.partial = mesh_order(partial);
    return rs;
  }

  // Which partial operands may stay partial under factor sharding fs (their sums flow through
  // the op, PartialFlow): one operand of a multilinear op, or every operand of an additive op
  // when all are partial over the same axes; never over axes the op's factors use.
  std::vector<bool> kept_partials(const Op& op, const std::vector<Axes>& fs) const {
    Axes op_axes;
    for (const auto& a : fs) op_axes.insert(op_axes.end(), a.begin(), a.end());
    auto disjoint = [&](const Axes& p) {
      for (const auto& a : p)
        if (std::find(op_axes.begin(), op_axes.end(), a) != op_axes.end()) return false;
      return true;
    };
    std::vector<bool> keep(op.inputs.size(), false);
    const PartialFlow flow = op_def(op.kind).partial_flow;
    if (flow == PartialFlow::Multilinear) {
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        const auto& p = prog.values[phys[op.inputs[i]]].sharding.partial;
        if (!p.empty() && disjoint(p)) {
          keep[i] = true;
          break;
        }
      }
    } else if (flow == PartialFlow::Additive) {
      const Axes shared = shared_partial(op);
      if (!shared.empty() && disjoint(shared)) keep.assign(op.inputs.size(), true);
    }
    return keep;
  }
  // The axes every operand of op is partial over, when they all are over the same ones; else
  // none.
  Axes shared_partial(const Op& op) const {
    const Axes first = mesh_order(prog.values[phys[op.inputs[0]]].sharding.partial);
    for (int v : op.inputs)
      if (mesh_order(prog.values[phys[v]].sharding.partial) != first) return {};
    return first;
  }

  // Estimated communication seconds of a factor sharding: operand reshards plus the reshard of
  // each result to its propagated layout. An operand that may stay partial (kept_partials) is
  // not reduced: its sum flows into the result, which is reduced instead.
  double comm_estimate(const Op& op, const OpRule& rule, const std::vector<Axes>& fs) {
    double t = 0;
    const std::vector<bool> keep = kept_partials(op, fs);
    Axes kept;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      int v = op.inputs[i];
      const LocalValue& lv = prog.values[phys[v]];
      Sharding req = Sharding::replicated(static_cast<int>(g.values[v].shape.size()));
      for (std::size_t d = 0; d < rule.operands[i].size(); ++d)
        req.dims[d].axes = compose_dim(mesh, rule.operands[i][d], rule.factors, fs);
      if (keep[i]) {
        req.partial = lv.sharding.partial;
        kept.insert(kept.end(), req.partial.begin(), req.partial.end());
      }
      t += plan_reshard(mesh, lv.global_shape, lv.dtype, lv.sharding, req, opts.cost).seconds;
    }
    if (op_def(op.kind).partial_flow == PartialFlow::Additive && !kept.empty()) kept = shared_partial(op);
    for (int r = 0; r < op.num_results(); ++r) {
      const int v = op.result(r);
      const Value& outv = g.values[static_cast<std::size_t>(v)];
      t += plan_reshard(mesh, outv.shape, outv.dtype, result_layout(op, rule, fs, r, kept),
                        prop.shardings[v].closed_copy().without_partial(), opts.cost).seconds;
    }
    return t;
  }

  // The partitioner's LocalEmitter for distributed reductions (ops.hpp).
  struct Emitter : LocalEmitter {
    Partitioner& P;
    int oi;
    Axes axes;
    Emitter(Partitioner& p, int op_index, Axes a) : P(p), oi(op_index), axes(std::move(a)) {}

    int local_value(const Shape& shape, DType dt, Sharding layout, const Shape& global) {
      int v = P.new_value(-1, std::move(layout), dt, global);
      if (P.prog.values[v].shape != shape)
        throw PartitionError("internal error: a distributed reduction's block has an inconsistent shape");
      return v;
    }
    std::pair<Shape, DType> infer(OpKind kind, const OpAttrs& attrs, const std::vector<int>& ins) const {
      std::vector<Value> vals;
      for (int v : ins) vals.push_back(Value{P.prog.values[v].name, P.prog.values[v].shape, P.prog.values[v].dtype, -1});
      std::vector<const Value*> ptrs;
      for (const Value& v : vals) ptrs.push_back(&v);
      Shape out;
      DType dt = DType::f32;
      op_def(kind).infer(attrs, ptrs, out, dt);
      return {out, dt};
    }
    int kernel(OpKind kind, const OpAttrs& attrs, const std::vector<int>& ins) override {
      auto [shape, dt] = infer(kind, attrs, ins);
      const int v = local_value(shape, dt, Sharding::replicated(static_cast<int>(shape.size())), shape);
      P.emit_kernel(oi, kind, attrs, ins, v);
      return v;
    }
    int kernel_block(OpKind kind, const OpAttrs& attrs, const std::vector<int>& ins,
                     const Shape& global, const Sharding& layout) override {
      // Ops that read positions keep global sizes in their attributes: the block's shape
      // comes from its layout, the dtype from the shape function.
      const DType dt = infer(kind, attrs, ins).second;
      const int v = local_value(layout.local_shape(P.mesh, global), dt, layout, global);
      P.emit_kernel(oi, kind, attrs, ins, v);
      return v;
    }
    int all_reduce(int v, ReduceOp op) override {
      const LocalValue src = P.prog.values[v];
      Instr in;
      in.kind = InstrKind::Collective;
      in.collective = CollectiveKind::AllReduce;
      in.reduce = op;
      in.axes = axes;
      in.bytes = src.bytes();
      in.seconds = P.opts.cost.collective_seconds(CollectiveKind::AllReduce, P.mesh, axes, in.bytes);
      in.in = {v};
      in.graph_op = oi;
      in.note = fmt::format("{} of per-row statistics for {}", op == ReduceOp::Max ? "max" : "sum",
                            P.g.describe_op(oi));
      in.out = local_value(src.shape, src.dtype, Sharding::replicated(static_cast<int>(src.shape.size())), src.shape);
      const int out = in.out;
      P.prog.instrs.push_back(std::move(in));
      return out;
    }
    int scalar(double value, DType dtype) override {
      OpAttrs a;
      a.scalar = value;
      a.dtype = dtype;
      const int v = local_value({}, dtype, Sharding::replicated(0), {});
      P.emit_kernel(oi, OpKind::Constant, a, {}, v);
      return v;
    }
    const Shape& shape(int v) const override { return P.prog.values[v].shape; }
    DType dtype(int v) const override { return P.prog.values[v].dtype; }
  };

  void op(int oi) {
    const Op& op = g.ops[oi];
    if (op.region >= 0) region = op.region;
    const Value& outv = g.values[op.output];
    if (op.kind == OpKind::Input) {
      int l = new_value(op.output, prop.shardings[op.output].closed_copy(), outv.dtype, outv.shape);
      prog.inputs.push_back(l);
      phys[op.output] = l;
      return;
    }
    if (op.kind == OpKind::Constant) {
      int l = new_value(op.output, prop.shardings[op.output].closed_copy(), outv.dtype, outv.shape);
      OpAttrs a = op.attrs;
      const LocalValue& lv = prog.values[l];
      const std::vector<Shape> none;
      op_def(op.kind).localize(a, LocalizeArgs{none, outv.shape, none, lv.shape, lv.sharding});
      emit_kernel(oi, op.kind, std::move(a), {}, l);
      phys[op.output] = l;
      return;
    }
    if (op.kind == OpKind::ShardingConstraint) {
      phys[op.output] = reshard(phys[op.inputs[0]], prop.shardings[op.output].closed_copy(), oi,
                                fmt::format("for {}", g.describe_op(oi)));
      return;
    }
    OpRule rule = op_rule(g, op);
    std::size_t nf = rule.factors.size();
    // Two candidate factor shardings: the result's layout first (compute where the value is
    // wanted), or the operands' layouts first (keep operands in place; the result may come
    // out partial or differently tiled and is resharded for its consumers). The cost model
    // picks the cheaper; ties go to the result-first candidate.
    //   With combined factors (a reduction the op does itself: softmax, layer_norm,
    // cross_entropy, reduce_max), each candidate is also tried with them gathered; when
    // they stay split the op is emitted in its distributed form, whose statistics
    // all-reduces are added to its cost.
    std::vector<Axes> fs;
    // A strategy chosen by automatic sharding is taken as it is: the plan priced the op's
    // compute and collectives and every reshard around it, where the candidates below are
    // compared on this op's collectives alone.
    if (!op.factor_axes.empty() && factor_axes_problem(mesh, op, rule, op.factor_axes).empty()) fs = op.factor_axes;
    else {
      const OpDef& def = op_def(op.kind);
      std::vector<std::vector<Axes>> cands = {choose_factors(op, rule, true), choose_factors(op, rule, false)};
      // An additive op (add, sub) of operands partial over the same axes: also try each
      // candidate without those axes, so the sums add up before one reduction (a tied weight's
      // two gradient contributions are then reduced once, not once each).
      if (def.partial_flow == PartialFlow::Additive)
        if (const Axes shared = shared_partial(op); !shared.empty())
          for (std::size_t c = 0, n = cands.size(); c < n; ++c) {
            std::vector<Axes> without = cands[c];
            for (Axes& a : without)
              a.erase(std::remove_if(a.begin(), a.end(),
                                     [&](const std::string& x) {
                                       return std::find(shared.begin(), shared.end(), x) != shared.end();
                                     }),
                      a.end());
            cands.push_back(without);
          }
      bool any_combined = false;
      for (const Factor& f : rule.factors) any_combined = any_combined || f.kind == FactorKind::Combined;
      if (any_combined) {
        for (std::size_t c = 0, n = cands.size(); c < n; ++c) {
          std::vector<Axes> gathered = cands[c];
          bool may_split = true;
          for (std::size_t f = 0; f < nf; ++f)
            if (rule.factors[f].kind == FactorKind::Combined) {
              gathered[f].clear();
              may_split = may_split && factor_may_split(op, rule, static_cast<int>(f));
            }
          if (!may_split) cands[c] = gathered;  // no distributed form: always gather
          else cands.push_back(gathered);
        }
      }
      double best = 0;
      for (std::size_t c = 0; c < cands.size(); ++c) {
        if (std::find(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(c), cands[c]) !=
            cands.begin() + static_cast<std::ptrdiff_t>(c))
          continue;  // the same factor sharding as an earlier candidate (ties go to the first)
        const double t = comm_estimate(op, rule, cands[c]) + stats_estimate(op, rule, cands[c]);
        if (c == 0 || t < best - 1e-12) {
          best = t;
          fs = cands[c];
        }
      }
    }
    // 5. Which partial operands may stay partial.
    const std::vector<bool> keep = kept_partials(op, fs);
    // 6. Reshard operands to what the factor sharding needs.
    std::vector<int> ins;
    Axes kept_partial;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      int v = op.inputs[i];
      Sharding req = Sharding::replicated(static_cast<int>(g.values[v].shape.size()));
      for (std::size_t d = 0; d < rule.operands[i].size(); ++d)
        req.dims[d].axes = compose_dim(mesh, rule.operands[i][d], rule.factors, fs);
      if (keep[i]) {
        req.partial = prog.values[phys[v]].sharding.partial;
        kept_partial.insert(kept_partial.end(), req.partial.begin(), req.partial.end());
      }
      ins.push_back(reshard(phys[v], req, oi, fmt::format("for operand {} of {}", i, g.describe_op(oi))));
    }
    // 7. The local results.
    const Sharding rs = result_layout(op, rule, fs, 0, kept_partial);
    int64_t mean_scale = 1;
    for (std::size_t f = 0; f < nf; ++f)
      if (rule.factors[f].kind == FactorKind::Reduction && !fs[f].empty()) mean_scale *= mesh.axes_size(fs[f]);
    if (const Axes caxes = combined_axes(rule, fs); !caxes.empty() && mesh.axes_size(caxes) > 1) {
      // The distributed form: local statistics, all-reduced over the combined axes.
      Emitter em(*this, oi, caxes);
      DistributeArgs da{em, op.attrs, ins, {}, {}, outv.shape, outv.dtype};
      for (int v : ins) {
        da.global_in.push_back(prog.values[v].global_shape);
        da.in_layouts.push_back(prog.values[v].sharding);
      }
      const int res = op_def(op.kind).distribute(da);
      LocalValue& lv = prog.values[static_cast<std::size_t>(res)];
      if (lv.shape != rs.local_shape(mesh, outv.shape) || lv.dtype != outv.dtype)
        throw PartitionError(fmt::format("internal error: the distributed form of {} produced {} "
                                         "where {} was expected", g.describe_op(oi),
                                         type_str(lv.dtype, lv.shape),
                                         type_str(outv.dtype, rs.local_shape(mesh, outv.shape))));
      lv.graph_value = op.output;
      lv.global_shape = outv.shape;
      lv.sharding = rs;
      lv.name = g.values[op.output].name;
      phys[op.output] = as_annotated(op.output, res, oi);
      return;
    }
    int out = new_value(op.output, rs, outv.dtype, outv.shape);
    std::vector<int> extra;
    for (int r = 1; r < op.num_results(); ++r) {
      const int v = op.result(r);
      const Value& rv = g.values[static_cast<std::size_t>(v)];
      extra.push_back(new_value(v, result_layout(op, rule, fs, r, kept_partial), rv.dtype, rv.shape));
      phys[static_cast<std::size_t>(v)] = extra.back();
    }
    OpAttrs a = op.attrs;
    if (const LocalizeFn localize = op_def(op.kind).localize) {
      std::vector<Shape> gin, lin;
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        gin.push_back(g.values[op.inputs[i]].shape);
        lin.push_back(prog.values[ins[i]].shape);
      }
      localize(a, LocalizeArgs{gin, outv.shape, lin, prog.values[out].shape, rs});
    }
    emit_kernel(oi, op.kind, std::move(a), ins, out, std::move(extra));
    // A mean over a split dim: each device divided by its local extent; scale by 1/k so
    // the partial sum over the k shards is the global mean.
    if (op.kind == OpKind::ReduceMean && mean_scale > 1) {
      int c = new_value(-1, Sharding::replicated(0), outv.dtype, {});
      OpAttrs ca;
      ca.scalar = 1.0 / static_cast<double>(mean_scale);
      ca.dtype = outv.dtype;
      emit_kernel(oi, OpKind::Constant, ca, {}, c);
      int scaled = new_value(op.output, rs, outv.dtype, outv.shape);
      emit_kernel(oi, OpKind::Mul, {}, {out, c}, scaled);
      out = scaled;
    }
    phys[op.output] = as_annotated(op.output, out, oi);
    for (int r = 1; r < op.num_results(); ++r)
      phys[static_cast<std::size_t>(op.result(r))] = as_annotated(op.result(r), phys[static_cast<std::size_t>(op.result(r))], oi);
  }

  // A result the graph annotates is made in its layout at once when the op computed it in
  // another (the operands' layouts won, or it came out partial): the annotation says where the
  // value lives, and every consumer reshards from there (as comm_estimate priced it), not each
  // from the computed layout.
  int as_annotated(int v, int local, int oi) {
    if (!g.annotations.count(v)) return local;
    const Sharding want = prop.shardings[static_cast<std::size_t>(v)].closed_copy();
    if (want.rank() != static_cast<int>(g.values[static_cast<std::size_t>(v)].shape.size())) return local;
    return reshard(local, want, oi, fmt::format("to its annotated layout, after {}", g.describe_op(oi)));
  }

  // The layout an output is delivered in. A closed output (annotated by the user, or the
  // result of a sharding_constraint) gets exactly its layout. An open one stays where it is
  // cheapest to produce: as computed when it is materialized, and when it is partial, reduced
  // by whichever is cheapest of an all-reduce or a reduce-scatter onto one of its dims.
  Sharding output_layout(int v) {
    const bool closed = g.annotations.count(v) > 0 ||
                        (g.values[v].producer >= 0 &&
                         g.ops[static_cast<std::size_t>(g.values[v].producer)].kind == OpKind::ShardingConstraint);
    if (closed || !opts.open_outputs_cheapest) return prop.shardings[v].closed_copy().without_partial();
    const LocalValue& cur = prog.values[phys[v]];
    const Sharding base = cur.sharding.closed_copy().without_partial();
    Sharding best = base;
    if (cur.sharding.partial.empty()) return best;
    double best_s = plan_reshard(mesh, cur.global_shape, cur.dtype, cur.sharding, best, opts.cost).seconds;
    const Axes partial = cur.sharding.partial;
    for (std::size_t d = 0; d < cur.global_shape.size(); ++d) {
      Sharding cand = base;
      cand.dims[d].axes.insert(cand.dims[d].axes.end(), partial.begin(), partial.end());
      if (cur.global_shape[d] % mesh.axes_size(cand.dims[d].axes) != 0) continue;
      const double t = plan_reshard(mesh, cur.global_shape, cur.dtype, cur.sharding, cand, opts.cost).seconds;
      if (t < best_s - 1e-15) {
        best_s = t;
        best = cand;
      }
    }
    return best;
  }

  Program run() {
    prog.mesh = mesh;
    phys.assign(g.values.size(), -1);
    by_region = opts.regather_by_region && !g.regions.empty();
    // Ops whose results reach no output are not emitted (inputs always are).
    std::vector<bool> needed(g.values.size(), false);
    for (int v : g.outputs) needed[v] = true;
    auto any_needed = [&](const Op& o) {
      for (int v : o.results())
        if (needed[static_cast<std::size_t>(v)]) return true;
      return false;
    };
    for (std::size_t i = g.ops.size(); i-- > 0;)
      if (any_needed(g.ops[i]))
        for (int v : g.ops[i].inputs) needed[v] = true;
    for (std::size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == OpKind::Input || any_needed(g.ops[i])) op(static_cast<int>(i));
    for (int v : g.outputs) {
      const Sharding want = output_layout(v);
      prog.outputs.push_back(reshard(phys[v], want, -1, fmt::format("for output %{}", g.values[v].name)));
    }
    return std::move(prog);
  }
};

}  // namespace

Program partition(const Graph& g, const Mesh& mesh, const PropagationResult& prop,
                  const PartitionOptions& opts) {
  if (prop.shardings.size() != g.values.size())
    throw PartitionError("partition: the propagation result does not belong to this graph");
  for (std::size_t v = 0; v < g.values.size(); ++v)
    prop.shardings[v].validate(mesh, g.values[v].shape, g.describe(static_cast<int>(v)));
  Partitioner p{g, mesh, prop, opts, {}, {}, {}, {}, -1, false};
  return p.run();
}

}  // namespace tessel
