// src/compiler/uneven.cpp — uneven shardings by padding (uneven.hpp): classes of dims that share a
// factor, their padded sizes, and the rewritten graph with masks and slices.
#include "tessel/ops/builders.hpp"
#include "tessel/compiler/uneven.hpp"

#include "dim_classes.hpp"

#include <fmt/format.h>

#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "tessel/ops/registry.hpp"

namespace tessel {
namespace {

using Classes = DimClasses;

// The dim of each tensor of an op that holds exactly factor f, for non-replicated factors:
// such dims have the same size and are padded alike.
void unite_op(Classes& c, const Graph& g, const Op& op) {
  if (op.kind == OpKind::Input || op.kind == OpKind::Constant) return;
  const OpRule rule = op_rule(g, op);
  std::vector<std::pair<int, const std::vector<DimFactors>*>> ts;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) ts.push_back({op.inputs[i], &rule.operands[i]});
  for (int r = 0; r < op.num_results(); ++r) ts.push_back({op.result(r), &rule.result_dims(r)});
  for (std::size_t f = 0; f < rule.factors.size(); ++f) {
    if (rule.factors[f].kind == FactorKind::Replicated) continue;
    int first = -1;
    for (const auto& [v, dims] : ts)
      for (std::size_t d = 0; d < dims->size(); ++d)
        if ((*dims)[d].size() == 1 && (*dims)[d][0] == static_cast<int>(f)) {
          const int n = c.node(v, d);
          if (first < 0) first = n;
          else c.unite(first, n);
        }
  }
}

// The value padding takes under a reduction of op k: -inf (the lowest i32) where the op takes a
// max or a softmax over it (cross_entropy_grad's logits too), else 0. softmax_grad sums
// y * dy over the axis: a zero y (softmax's own padding) is neutral there.
double neutral_for(OpKind k, DType dt) {
  const bool max_like = k == OpKind::ReduceMax || k == OpKind::Softmax || k == OpKind::CrossEntropy ||
                        k == OpKind::CrossEntropyGrad;
  if (!max_like) return 0.0;
  return dt == DType::i32 ? -2147483648.0 : -std::numeric_limits<double>::infinity();
}

struct Padder {
  const Graph& g;
  const Mesh& mesh;
  Classes cls;
  std::map<int, int64_t> padded_size;  // class root -> padded size
  PaddedGraph out;
  std::vector<Tensor> map;  // original value -> value of the padded graph

  Padder(const Graph& graph, const Mesh& m) : g(graph), mesh(m), cls(graph) {}

  // Values the rewrite adds get names of their own ("pad.N", never a name of the user's
  // graph): builder-made names (v0, v1, ...) could collide with user names added later.
  int pad_names = 0;
  Tensor own(Tensor t) {
    std::string n;
    do n = fmt::format("pad.{}", pad_names++);
    while (g.find(n) >= 0 || out.graph.find(n) >= 0);
    return t.named(n);
  }

  // The padded graph names its helper values freshly ("v12"), which may be a name a later
  // value of the user's graph has: before a user's name is given, a helper holding it is
  // renamed out of the way (pad.N).
  void claim(const std::string& name) {
    const int id = out.graph.find(name);
    if (id >= 0) own(out.graph.tensor(id));
  }
  Tensor name_as(Tensor t, const std::string& name) {
    if (out.graph.find(name) == t.id) return t;
    claim(name);
    return t.named(name);
  }

  int64_t padded(int v, std::size_t d) {
    auto it = padded_size.find(cls.find(cls.node(v, d)));
    return it == padded_size.end() ? g.values[static_cast<std::size_t>(v)].shape[d] : it->second;
  }
  Shape padded_shape(int v) {
    Shape s = g.values[static_cast<std::size_t>(v)].shape;
    for (std::size_t d = 0; d < s.size(); ++d) s[d] = padded(v, d);
    return s;
  }

  // Requests from annotations and constraints: the lcm of the shard counts per class, for
  // classes with at least one uneven split.
  void plan() {
    for (const Op& op : g.ops) unite_op(cls, g, op);
    std::map<int, int64_t> lcm;
    std::set<int> uneven;
    auto request = [&](int v, const Sharding& s) {
      const Shape& shape = g.values[static_cast<std::size_t>(v)].shape;
      for (std::size_t d = 0; d < s.dims.size() && d < shape.size(); ++d) {
        for (const auto& a : s.dims[d].axes)
          if (!mesh.has_axis(a)) return;  // validated (and reported) later
        const int64_t k = mesh.axes_size(s.dims[d].axes);
        if (k <= 1) continue;
        const int root = cls.find(cls.node(v, d));
        int64_t& l = lcm[root];
        l = l == 0 ? k : std::lcm(l, k);
        if (shape[d] % k != 0) uneven.insert(root);
      }
    };
    for (const auto& [v, ann] : g.annotations) request(v, ann.sharding);
    for (const Op& op : g.ops)
      if (op.kind == OpKind::ShardingConstraint && op.attrs.sharding) request(op.output, *op.attrs.sharding);
    for (int root : uneven) {
      // The size of any member: every member of a class has the same size.
      int64_t n = -1;
      for (std::size_t v = 0; v < g.values.size() && n < 0; ++v)
        for (std::size_t d = 0; d < g.values[v].shape.size(); ++d)
          if (cls.find(cls.node(static_cast<int>(v), d)) == root) {
            n = g.values[v].shape[d];
            out.notes.push_back(fmt::format("dim {} of %{} (size {}) and the dims sharing its factor are "
                                            "padded to {} for an even split over {} shards", d,
                                            g.values[v].name, n, (n + lcm[root] - 1) / lcm[root] * lcm[root],
                                            lcm[root]));
            break;
          }
      padded_size[root] = (n + lcm[root] - 1) / lcm[root] * lcm[root];
    }
  }

  // x (a value of the padded graph holding original value v) sliced to v's real extent.
  Tensor unpad(Tensor x, int v) {
    const Shape& real = g.values[static_cast<std::size_t>(v)].shape;
    if (x.shape() == real) return x;
    return own(slice(x, std::vector<int64_t>(real.size(), 0), real));
  }
  // x of v's real shape padded with zeros to v's padded shape (concat with zeros per dim).
  Tensor pad(Tensor x, int v) {
    const Shape want = padded_shape(v);
    Graph& pg = out.graph;
    for (std::size_t d = 0; d < want.size(); ++d) {
      const Shape cur = x.shape();
      if (cur[d] == want[d]) continue;
      Shape zs = cur;
      zs[d] = want[d] - cur[d];
      Tensor z = own(broadcast_to(own(constant(pg, 0.0, x.dtype())), zs));
      x = own(concat({x, z}, static_cast<int64_t>(d)));
    }
    return x;
  }

  // Whether op `op` sees a padded dim through something other than a single-factor,
  // non-replicated dim (then it must see real extents).
  bool transparent(const Op& op, const OpRule& rule) {
    std::vector<std::pair<int, const std::vector<DimFactors>*>> ts;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) ts.push_back({op.inputs[i], &rule.operands[i]});
    for (int r = 0; r < op.num_results(); ++r) ts.push_back({op.result(r), &rule.result_dims(r)});
    // Factors carried padded: a padded dim must be exactly one non-replicated factor, and
    // that factor may appear nowhere else inside a compound dim.
    std::set<int> padded_factors;
    for (const auto& [v, dims] : ts) {
      const Shape& s = g.values[static_cast<std::size_t>(v)].shape;
      for (std::size_t d = 0; d < s.size(); ++d) {
        if (padded(v, d) == s[d]) continue;
        if (d >= dims->size() || (*dims)[d].size() != 1) return false;
        if (rule.factors[static_cast<std::size_t>((*dims)[d][0])].kind == FactorKind::Replicated) return false;
        padded_factors.insert((*dims)[d][0]);
      }
    }
    for (const auto& [v, dims] : ts)
      for (const DimFactors& df : *dims)
        if (df.size() > 1)
          for (int f : df)
            if (padded_factors.count(f)) return false;
    // Ops whose attributes name extents along dims the rule cannot rewrite.
    return op.kind != OpKind::LayerNorm;
  }

  Tensor emit(const Op& op, std::vector<Tensor> ins, OpAttrs a, const std::string& name) {
    std::vector<int> ids;
    for (const Tensor& t : ins) ids.push_back(t.id);
    return out.graph.add_op(op.kind, ids, std::move(a), name);
  }

  // layer_norm over a padded feature dim, from masked sums (the valid extent is n).
  Tensor layer_norm_padded(const Op& op, Tensor x, Tensor gamma, Tensor beta, int64_t n) {
    Graph& pg = out.graph;
    const int64_t last = x.rank() - 1;
    const DType dt = x.dtype();
    auto f32 = [&](Tensor t) { return t.dtype() == DType::f32 ? t : own(cast(t, DType::f32)); };
    Tensor xf = f32(x);
    Tensor inv_n = own(constant(pg, 1.0 / static_cast<double>(n)));
    Tensor mean = own(mul(own(reduce_sum(own(mask_padding(xf, last, n, 0.0)), {last}, true)), inv_n));
    Tensor d = own(sub(xf, mean));
    Tensor var = own(mul(own(reduce_sum(own(mask_padding(own(mul(d, d)), last, n, 0.0)), {last}, true)), inv_n));
    Tensor rstd = own(rsqrt(own(add(var, own(constant(pg, op.attrs.eps))))));
    Tensor y = own(add(own(mul(own(mul(d, rstd)), f32(gamma))), f32(beta)));
    return dt == DType::f32 ? y : own(cast(y, dt));
  }

  // Reductions over padded factors see the neutral element in the padding: factors the op
  // sums or combines over, and for an op with several results, factors one result lacks.
  void mask_reduced(const Op& op, const OpRule& rule, std::vector<Tensor>& ins) {
    if (op.kind == OpKind::Embedding || op.kind == OpKind::Gather) return;  // ids pick real rows
    for (std::size_t f = 0; f < rule.factors.size(); ++f) {
      const FactorKind k = rule.factors[f].kind;
      bool reduced = k == FactorKind::Reduction || k == FactorKind::Combined;
      for (int r = 0; r < op.num_results() && !reduced; ++r)
        reduced = k == FactorKind::Pass && !rule.in_result(r, static_cast<int>(f));
      if (!reduced) continue;
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        const auto& dims = rule.operands[i];
        for (std::size_t d = 0; d < dims.size(); ++d)
          if (dims[d].size() == 1 && dims[d][0] == static_cast<int>(f)) {
            const int64_t real = g.values[static_cast<std::size_t>(op.inputs[i])].shape[d];
            if (padded(op.inputs[i], d) == real) continue;
            ins[i] = own(mask_padding(ins[i], static_cast<int64_t>(d), real, neutral_for(op.kind, ins[i].dtype())));
          }
      }
    }
  }

  // An op with several results: either every padded dim is carried through (the masked
  // operands are enough), or it runs on real extents and its padded results are padded back.
  void rewrite_results(const Op& op) {
    const OpRule rule = op_rule(g, op);
    std::vector<Tensor> ins;
    for (int v : op.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    const bool carry = transparent(op, rule);
    if (carry) mask_reduced(op, rule, ins);
    else
      for (std::size_t i = 0; i < ins.size(); ++i) ins[i] = unpad(ins[i], op.inputs[i]);
    std::vector<int> ids;
    for (const Tensor& t : ins) ids.push_back(t.id);
    std::vector<Tensor> rs = out.graph.add_op_results(op.kind, ids, op.attrs);
    for (int r = 0; r < op.num_results(); ++r) {
      const int v = op.result(r);
      const Value& val = g.values[static_cast<std::size_t>(v)];
      Tensor t = rs[static_cast<std::size_t>(r)];
      const bool padded_v = padded_shape(v) != val.shape;
      if (!carry && padded_v) t = pad(own(t), v);
      map[static_cast<std::size_t>(v)] = name_as(t, val.name);
    }
  }

  void rewrite() {
    Graph& pg = out.graph;
    pg.mesh = g.mesh;
    map.assign(g.values.size(), Tensor{});
    // The ops written for an op are in its region (Op::region): the partitioner re-gathers by it.
    pg.regions = g.regions;
    std::size_t stamped = 0;
    int region = -1;
    auto stamp = [&] {
      for (; stamped < pg.ops.size(); ++stamped) pg.ops[stamped].region = region;
    };
    for (const Op& op : g.ops) {
      stamp();
      region = op.region;
      if (op.num_results() > 1) {
        rewrite_results(op);
        continue;
      }
      const Value& ov = g.values[static_cast<std::size_t>(op.output)];
      const bool out_padded = padded_shape(op.output) != ov.shape;
      const std::string& name = ov.name;
      if (op.kind == OpKind::Input) {
        claim(name);
        map[op.output] = pg.add_input(name, ov.dtype, padded_shape(op.output));
        out.input_shapes.push_back(ov.shape);
        continue;
      }
      if (op.kind == OpKind::Constant) {
        OpAttrs a = op.attrs;
        a.shape = padded_shape(op.output);
        claim(name);
        map[op.output] = pg.add_op(OpKind::Constant, {}, a, name);
        continue;
      }
      const OpRule rule = op_rule(g, op);
      std::vector<Tensor> ins;
      for (int v : op.inputs) ins.push_back(map[v]);
      Tensor r;
      if (!transparent(op, rule)) {
        if (op.kind == OpKind::LayerNorm && padded(op.inputs[0], ov.shape.size() - 1) != ov.shape.back() &&
            ov.shape.size() >= 1) {
          // Features padded: masked sums over the real extent; other dims stay padded.
          r = layer_norm_padded(op, ins[0], ins[1], ins[2], ov.shape.back());
          r = name_as(r, name);
        } else {
          for (std::size_t i = 0; i < ins.size(); ++i) ins[i] = unpad(ins[i], op.inputs[i]);
          if (!out_padded) claim(name);
          r = emit(op, ins, op.attrs, out_padded ? std::string() : name);
          if (out_padded) r = pad(own(r), op.output);
          if (out_padded) r = name_as(r, name);
        }
      } else {
        mask_reduced(op, rule, ins);
        OpAttrs a = op.attrs;
        if (op.kind == OpKind::Reshape || op.kind == OpKind::Broadcast) a.shape = padded_shape(op.output);
        if (op.kind == OpKind::Slice)  // a padded dim is sliced whole (from 0): take it all
          for (std::size_t d = 0; d < a.limits.size(); ++d)
            if (padded(op.output, d) != ov.shape[d]) a.limits[d] = padded(op.output, d);
        if (op.kind == OpKind::OneHot || op.kind == OpKind::ScatterAdd) a.depth = padded(op.output, static_cast<std::size_t>(a.axis < 0 ? ov.shape.size() - 1 : a.axis));
        double rescale = 1;
        if (op.kind == OpKind::ReduceMean)
          for (int64_t d : op.attrs.dims)
            rescale *= static_cast<double>(padded(op.inputs[0], static_cast<std::size_t>(d))) /
                       static_cast<double>(g.values[static_cast<std::size_t>(op.inputs[0])].shape[static_cast<std::size_t>(d)]);
        if (rescale != 1) {
          r = name_as(mul(own(emit(op, ins, a, std::string())), own(constant(pg, rescale, ov.dtype))), name);
        } else {
          claim(name);
          r = emit(op, ins, a, name);
        }
      }
      map[op.output] = r;
    }
    for (const auto& [v, ann] : g.annotations) {
      pg.annotate(map[v], ann.sharding, ann.priority);
      if (ann.gather_expected) pg.expect_gathers(map[v]);
    }
    // Outputs stay padded (a padded output keeps its layout, so it can be donated back to the
    // padded input it updates); the runtime trims them to the user's shape on the way to the host.
    for (int v : g.outputs) {
      pg.mark_output(map[v]);
      out.output_shapes.push_back(g.values[static_cast<std::size_t>(v)].shape);
    }
    stamp();
  }
};

}  // namespace

PaddedGraph pad_uneven(const Graph& g, const Mesh& mesh) {
  Padder p(g, mesh);
  p.plan();
  if (p.padded_size.empty()) {
    PaddedGraph same;
    same.graph = g.clone();
    for (int v : g.inputs) same.input_shapes.push_back(g.values[static_cast<std::size_t>(v)].shape);
    for (int v : g.outputs) same.output_shapes.push_back(g.values[static_cast<std::size_t>(v)].shape);
    return same;
  }
  p.rewrite();
  p.out.padded = true;
  return std::move(p.out);
}

}  // namespace tessel
