// src/passes/fuse_attention.cpp — the fuse-attention graph pass (fuse_attention.hpp): finds
// einsum -> [scale] -> [causal_mask] -> softmax -> einsum chains whose letters say "attention"
// and rebuilds the graph with one attention op in each chain's place.
//
// Roles of the letters. In s = einsum("X,Y->Z", q, k) the contracted letter is the head dim d,
// the letter only q has is the query position, the one only k has the key position, and the
// two all three share are batch and heads. Z must end in (query, key) — softmax runs over the
// last dim and causal_mask masks the last two — and q must be [b,h,q,d] ("bhsd") or [b,q,h,d]
// ("bshd") with b = Z's first letter, k the same layout with the key position. The second
// einsum "P,V->R" is read through positions: P's letters are Z's dims, V must be k's layout
// with a new letter e (v's head dim) for d, and R q's layout with e for d.
#include "tessel/passes/fuse_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "tessel/ops/registry.hpp"

namespace tessel {
namespace {

struct Chain {
  int out_op = -1;           // the second einsum
  std::vector<int> members;  // the ops the attention op replaces (first einsum .. softmax)
  int q = -1, k = -1, v = -1;
  double scale = 1.0;
  bool causal = false;
  std::string layout;
  std::string path;  // for the report
};

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), users_(g.users()) {
    for (int o : g.outputs) outputs_.insert(o);
  }

  std::optional<Chain> match(int op_index) const {
    const Op& out = g_.ops[static_cast<std::size_t>(op_index)];
    if (out.kind != OpKind::Einsum || out.inputs.size() != 2) return std::nullopt;
    Chain c;
    c.out_op = op_index;
    // softmax over the last dim of the scores
    const int p = out.inputs[0];
    const int sm_op = only_reader_chain(p, op_index, OpKind::Softmax);
    if (sm_op < 0) return std::nullopt;
    const Op& sm = op(sm_op);
    if (sm.attrs.axis != static_cast<int64_t>(value(p).shape.size()) - 1) return std::nullopt;
    std::vector<std::string> steps = {fmt::format("softmax %{}", value(p).name)};
    c.members.push_back(sm_op);
    // back through at most one scale and one mask
    int x = sm.inputs[0];
    int reader = sm_op;
    bool scaled = false;
    for (;;) {
      const Op* pr = producer(x);
      if (!pr || !single_use(x, reader)) return std::nullopt;
      const int pr_index = value(x).producer;
      if (pr->kind == OpKind::CausalMask && !c.causal) {
        c.causal = true;
        steps.push_back(fmt::format("causal_mask %{}", value(x).name));
      } else if ((pr->kind == OpKind::Mul || pr->kind == OpKind::Div) && !scaled) {
        const int ci = pr->kind == OpKind::Div ? 1 : (scalar_const(pr->inputs[1]) ? 1 : 0);
        const std::optional<double> s = scalar_const(pr->inputs[static_cast<std::size_t>(ci)]);
        if (!s || !std::isfinite(*s) || *s == 0) return std::nullopt;
        if (value(pr->inputs[static_cast<std::size_t>(1 - ci)]).shape != value(x).shape) return std::nullopt;
        c.scale = pr->kind == OpKind::Div ? 1.0 / *s : *s;
        scaled = true;
        steps.push_back(fmt::format("{} {} %{}", op_name(pr->kind), *s, value(x).name));
        x = pr->inputs[static_cast<std::size_t>(1 - ci)];
        c.members.push_back(pr_index);
        reader = pr_index;
        continue;
      } else if (pr->kind == OpKind::Einsum && pr->inputs.size() == 2) {
        c.members.push_back(pr_index);
        steps.push_back(fmt::format("einsum %{}", value(x).name));
        c.q = pr->inputs[0];
        c.k = pr->inputs[1];
        if (!letters_fit(pr->attrs.equation, out.attrs.equation, c)) return std::nullopt;
        break;
      } else {
        return std::nullopt;
      }
      x = pr->inputs[0];
      c.members.push_back(pr_index);
      reader = pr_index;
    }
    c.v = out.inputs[1];
    // A mask applied before a negative scale would turn -inf into +inf: require scale > 0.
    if (c.causal && c.scale < 0) return std::nullopt;
    const Value &q = value(c.q), &k = value(c.k), &v = value(c.v);
    if (k.shape != v.shape || q.dtype != k.dtype || q.dtype != v.dtype || q.dtype == DType::i32) return std::nullopt;
    for (int m : c.members)
      if (value(op(m).output).dtype != q.dtype) return std::nullopt;
    if (value(out.output).dtype != q.dtype) return std::nullopt;
    const int s = c.layout == "bshd" ? 1 : 2;
    if (c.causal && q.shape[static_cast<std::size_t>(s)] != k.shape[static_cast<std::size_t>(s)]) return std::nullopt;
    // An annotation that splits a sequence or the head dim stays with the long form, which
    // honours it (attention keeps those dims whole).
    for (int val : {c.q, c.k, c.v, out.output}) {
      auto it = g_.annotations.find(val);
      if (it == g_.annotations.end()) continue;
      const Sharding& sh = it->second.sharding;
      for (int d : {s, 3})
        if (d < sh.rank() && !sh.dims[static_cast<std::size_t>(d)].axes.empty()) return std::nullopt;
    }
    std::reverse(steps.begin(), steps.end());
    steps.push_back(fmt::format("einsum %{}", value(out.output).name));
    c.path = fmt::format("{}", fmt::join(steps, " -> "));
    return c;
  }

 private:
  const Op& op(int i) const { return g_.ops[static_cast<std::size_t>(i)]; }
  const Value& value(int v) const { return g_.values[static_cast<std::size_t>(v)]; }
  const Op* producer(int v) const {
    const int p = value(v).producer;
    return p < 0 ? nullptr : &op(p);
  }
  // v is read by `reader` alone (once), is not an output and carries no annotation.
  bool single_use(int v, int reader) const {
    const auto& u = users_[static_cast<std::size_t>(v)];
    std::set<int> distinct(u.begin(), u.end());
    if (distinct.size() != 1 || *distinct.begin() != reader) return false;
    int reads = 0;
    for (int in : op(reader).inputs) reads += in == v;
    return reads == 1 && !outputs_.count(v) && !g_.annotations.count(v);
  }
  // The producer of v when it is of `kind` and v's only reader is `reader`; else -1.
  int only_reader_chain(int v, int reader, OpKind kind) const {
    const Op* p = producer(v);
    if (!p || p->kind != kind || !single_use(v, reader)) return -1;
    return value(v).producer;
  }
  std::optional<double> scalar_const(int v) const {
    const Op* p = producer(v);
    if (!p || p->kind != OpKind::Constant) return std::nullopt;
    for (int64_t d : value(v).shape)
      if (d != 1) return std::nullopt;
    return p->attrs.scalar;
  }
  bool letters_fit(const std::string& eq_a, const std::string& eq_b, Chain& c) const {
    EinsumSpec a, b;
    try {
      a = parse_einsum(eq_a, 2);
      b = parse_einsum(eq_b, 2);
    } catch (const Error&) {
      return false;
    }
    const std::string &X = a.operands[0], &Y = a.operands[1], &Z = a.result;
    if (X.size() != 4 || Y.size() != 4 || Z.size() != 4) return false;
    auto has = [](const std::string& s, char ch) { return s.find(ch) != std::string::npos; };
    const char Q = Z[2], S = Z[3];
    if (!has(X, Q) || has(Y, Q) || !has(Y, S) || has(X, S)) return false;
    const char B = Z[0], H = Z[1];
    if (!has(X, B) || !has(Y, B) || !has(X, H) || !has(Y, H)) return false;
    char D = 0;
    for (char ch : X)
      if (ch != B && ch != H && ch != Q) D = ch;
    if (!D || !has(Y, D) || has(Z, D)) return false;
    // q is [B,H,Q,D] or [B,Q,H,D] with B either shared letter; k the same layout.
    char b0 = X[0];
    if (b0 != B && b0 != H) return false;
    const char h0 = b0 == B ? H : B;
    const std::string bhsd{b0, h0, Q, D}, bshd{b0, Q, h0, D};
    if (X == bhsd) c.layout = "bhsd";
    else if (X == bshd) c.layout = "bshd";
    else return false;
    auto in_layout = [&](char pos, char dim) {
      return c.layout == "bhsd" ? std::string{b0, h0, pos, dim} : std::string{b0, pos, h0, dim};
    };
    if (Y != in_layout(S, D)) return false;
    // The second einsum, its letters translated to the first's by the scores' positions.
    const std::string &P = b.operands[0], &V = b.operands[1], &R = b.result;
    if (P.size() != 4 || V.size() != 4 || R.size() != 4) return false;
    std::map<char, char> to_a;
    for (std::size_t i = 0; i < 4; ++i) to_a[P[i]] = Z[i];
    char E = 0;
    for (char ch : V)
      if (!to_a.count(ch)) E = ch;
    if (!E || has(P, E)) return false;
    to_a[E] = D;  // v's head dim takes q's head-dim place in the layout
    auto translate = [&](const std::string& s, std::string& t) {
      t.clear();
      for (char ch : s) {
        auto it = to_a.find(ch);
        if (it == to_a.end()) return false;
        t.push_back(it->second);
      }
      return true;
    };
    std::string v_a, r_a;
    if (!translate(V, v_a) || !translate(R, r_a)) return false;
    return v_a == in_layout(S, D) && r_a == in_layout(Q, D);
  }

  const Graph& g_;
  std::vector<std::vector<int>> users_;
  std::set<int> outputs_;
};

}  // namespace

FusedAttentionGraph fuse_attention(const Graph& g) {
  FusedAttentionGraph r;
  Matcher m(g);
  std::map<int, Chain> chains;  // by out_op
  std::set<int> skipped;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    std::optional<Chain> c = m.match(static_cast<int>(i));
    if (!c) continue;
    for (int mem : c->members) skipped.insert(mem);
    chains.emplace(static_cast<int>(i), std::move(*c));
  }
  if (chains.empty()) {
    r.graph = g.clone();
    return r;
  }
  Graph& ng = r.graph;
  ng.mesh = g.mesh;
  ng.regions = g.regions;
  std::vector<int> map(g.values.size(), -1);
  auto mapped = [&](int v) {
    const int n = map[static_cast<std::size_t>(v)];
    if (n < 0) throw Error(fmt::format("fuse-attention: %{} is read before it is defined (a bug in the pass)",
                                       g.values[static_cast<std::size_t>(v)].name));
    return n;
  };
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (skipped.count(static_cast<int>(i))) continue;
    if (op.kind == OpKind::Input) {
      const Value& v = g.values[static_cast<std::size_t>(op.output)];
      map[static_cast<std::size_t>(op.output)] = ng.add_input(v.name, v.dtype, v.shape).id;
      continue;
    }
    auto it = chains.find(static_cast<int>(i));
    std::vector<Tensor> res;
    if (it != chains.end()) {
      const Chain& c = it->second;
      const std::string& out_name = g.values[static_cast<std::size_t>(op.output)].name;
      std::string lse = out_name + "_lse";
      for (int n = 2; g.find(lse) >= 0 || ng.find(lse) >= 0; ++n) lse = fmt::format("{}_lse{}", out_name, n);
      OpAttrs a;
      a.equation = c.layout;
      a.causal = c.causal;
      a.scalar = c.scale;
      res = ng.add_op_results(OpKind::Attention, {mapped(c.q), mapped(c.k), mapped(c.v)}, a, {out_name, lse});
      r.report.push_back(fmt::format("%{} = attention(%{}, %{}, %{}) layout={} causal={} scale={} (from {})", out_name,
                                     g.values[static_cast<std::size_t>(c.q)].name,
                                     g.values[static_cast<std::size_t>(c.k)].name,
                                     g.values[static_cast<std::size_t>(c.v)].name, c.layout, c.causal, c.scale, c.path));
      ++r.fused;
    } else {
      std::vector<int> ins;
      for (int v : op.inputs) ins.push_back(mapped(v));
      std::vector<std::string> names;
      for (int v : op.results()) names.push_back(g.values[static_cast<std::size_t>(v)].name);
      res = ng.add_op_results(op.kind, std::move(ins), op.attrs, std::move(names));
      ng.ops.back().factor_axes = op.factor_axes;
    }
    ng.ops.back().region = op.region;
    const std::vector<int> olds = op.results();
    for (std::size_t k = 0; k < olds.size(); ++k) map[static_cast<std::size_t>(olds[k])] = res[k].id;
  }
  for (const auto& [v, ann] : g.annotations)
    if (map[static_cast<std::size_t>(v)] >= 0) ng.annotations[map[static_cast<std::size_t>(v)]] = ann;
  for (int o : g.outputs) ng.outputs.push_back(mapped(o));
  return r;
}

}  // namespace tessel
