// src/passes/fuse_elementwise.cpp — the fuse-elementwise Program pass (docs/program-ir.md,
// "fuse-elementwise"): XLA's loop fusion for tessel's Programs. Each maximal group of
// elementwise kernels whose intermediate values nothing else reads becomes one
// fused_elementwise kernel (tessel/ir/fused_expr.hpp) that reads the group's operands once and
// writes its result once; the intermediates never reach memory.
//
// Groups grow from a root (the last instruction of the group, taken from the end of the
// program backwards) towards its producers. A producer joins when
//   - it is a kernel of an elementwise op (is_fusible_elementwise), a fused_elementwise (its
//     expression is inlined), or a constant whose dims are all 1 (it becomes a literal);
//   - every reader of its result is already in the group, and the result is not an output;
//   - it runs on the root's stream;
//   - its result has as many elements as the root's: a smaller producer (a [B,S,1] statistic
//     broadcast over [B,S,D]) stays a kernel of its own, so the fused kernel never recomputes
//     a value per element of a broadcast (XLA's "reuses operand elements" rule);
//   - the group stays within kMaxOperands operands and kMaxNodes nodes.
// A softmax is a root too: its group (its operand's producers, by the same rules, and also a
// causal_mask of the softmax's shape, which reads positions) becomes one fused_softmax kernel,
// softmax(expr) along the softmax's axis — the attention's scale + causal mask + softmax.
// An einsum is a group's head when the group alone reads its result (every reader a member,
// not an output, the root's stream) and the group keeps the product's shape and dtype: the
// group becomes one fused_einsum, the einsum with the group's expression as its epilogue
// (`$0` the product: the matmul's bias, GELU, residual and scale as post-ops, so the product
// is written once, already finished). Then one op is enough; otherwise a group with fewer
// than two ops is left as it is. The fused kernel stands at its root's
// place: every operand of the group is defined before any member, and no other instruction
// reads a member's result, so moving the members' work there changes no dependence (and no
// stream order: a value ready for a member is ready later too).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "tessel/ir/fused_expr.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/passes/program_passes.hpp"

namespace tessel {
namespace {

constexpr std::size_t kMaxOperands = 16;  // buffers one block of the kernel reads
constexpr std::size_t kMaxNodes = 64;     // node buffers of 4 KiB each per block (cpu_fused.cpp)

bool all_ones(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](int64_t d) { return d == 1; });
}

bool is_literal_constant(const Instr& in) { return in.kind == InstrKind::Kernel && in.op == OpKind::Constant && all_ones(in.attrs.shape); }

bool is_softmax(const Instr& in) { return in.kind == InstrKind::Kernel && in.op == OpKind::Softmax; }

bool is_member_kind(const Instr& in) {
  return in.kind == InstrKind::Kernel && in.extra_out.empty() &&
         (is_fusible_elementwise(in.op) || in.op == OpKind::FusedElementwise);
}

struct Group {
  std::vector<int> members;  // instruction indices, program order (the head included)
  int head = -1;             // the einsum whose product the group's expression finishes, or -1
};

class Fuser {
 public:
  Fuser(const Program& p, bool einsum_epilogues)
      : p_(p), einsum_epilogues_(einsum_epilogues), def_(p.values.size(), -1), readers_(p.values.size()) {
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
      const Instr& in = p.instrs[i];
      for (int v : in.defs()) def_[static_cast<std::size_t>(v)] = static_cast<int>(i);
      for (int v : in.in) readers_[static_cast<std::size_t>(v)].insert(static_cast<int>(i));
    }
    for (int v : p.outputs) output_.insert(v);
  }

  // The nodes and operands of a group, with the expression text of its kernel.
  Program run() {
    std::vector<int> group_of(p_.instrs.size(), -1);
    std::vector<Group> groups;
    for (int r = static_cast<int>(p_.instrs.size()) - 1; r >= 0; --r) {
      const Instr& root = p_.instrs[static_cast<std::size_t>(r)];
      if (group_of[static_cast<std::size_t>(r)] >= 0 || !(is_member_kind(root) || is_softmax(root))) continue;
      const Shape& root_shape = p_.values[static_cast<std::size_t>(root.out)].shape;
      std::set<int> members{r};
      const int64_t elems = num_elements(p_.values[static_cast<std::size_t>(root.out)].shape);
      for (bool grew = true; grew;) {
        grew = false;
        for (int m : std::vector<int>(members.begin(), members.end()))
          for (int v : p_.instrs[static_cast<std::size_t>(m)].in) {
            const int j = def_[static_cast<std::size_t>(v)];
            if (j < 0 || members.count(j) || group_of[static_cast<std::size_t>(j)] >= 0) continue;
            const Instr& pj = p_.instrs[static_cast<std::size_t>(j)];
            // A softmax takes a causal mask of its own shape into its prologue.
            const bool mask = is_softmax(root) && pj.kind == InstrKind::Kernel && pj.op == OpKind::CausalMask &&
                              p_.values[static_cast<std::size_t>(v)].shape == root_shape;
            if (!(is_member_kind(pj) || is_literal_constant(pj) || mask) || pj.stream != root.stream || output_.count(v)) continue;
            if (!is_literal_constant(pj) && num_elements(p_.values[static_cast<std::size_t>(v)].shape) != elems) continue;
            const auto& rd = readers_[static_cast<std::size_t>(v)];
            if (!std::all_of(rd.begin(), rd.end(), [&](int x) { return members.count(x) > 0; })) continue;
            std::set<int> grown = members;
            grown.insert(j);
            if (!fits(grown)) continue;
            members = std::move(grown);
            grew = true;
          }
      }
      int ops = 0;
      for (int m : members) {
        const Instr& mi = p_.instrs[static_cast<std::size_t>(m)];
        ops += mi.op == OpKind::FusedElementwise ? parse_fused_expr(mi.attrs.equation).num_ops()
               : mi.op == OpKind::Constant   ? 0
                                              : 1;
      }
      const int head = is_softmax(root) || ops < 1 ? -1 : einsum_head(members, root);
      if (ops < 2 && head < 0) continue;
      Group g;
      g.head = head;
      if (head >= 0) members.insert(head);
      g.members.assign(members.begin(), members.end());
      for (int m : g.members) group_of[static_cast<std::size_t>(m)] = static_cast<int>(groups.size());
      groups.push_back(std::move(g));
    }
    if (groups.empty()) return p_;

    Program out = p_;
    out.instrs.clear();
    for (std::size_t i = 0; i < p_.instrs.size(); ++i) {
      const int g = group_of[i];
      if (g < 0) {
        out.instrs.push_back(p_.instrs[i]);
      } else if (static_cast<int>(i) == groups[static_cast<std::size_t>(g)].members.back()) {
        out.instrs.push_back(fused_instr(groups[static_cast<std::size_t>(g)]));
      }
    }
    return out;
  }

 private:
  // The einsum that only this group reads (see the file comment), the latest if several, or -1.
  int einsum_head(const std::set<int>& members, const Instr& root) const {
    if (!einsum_epilogues_) return -1;
    const LocalValue& rv = p_.values[static_cast<std::size_t>(root.out)];
    int best = -1;
    for (int v : leaves(members)) {
      const int j = def_[static_cast<std::size_t>(v)];
      if (j < 0 || j <= best) continue;
      const Instr& e = p_.instrs[static_cast<std::size_t>(j)];
      const LocalValue& ev = p_.values[static_cast<std::size_t>(v)];
      if (e.kind != InstrKind::Kernel || e.op != OpKind::Einsum || !e.extra_out.empty() || e.stream != root.stream ||
          output_.count(v) || ev.shape != rv.shape || ev.dtype != rv.dtype)
        continue;
      const auto& rd = readers_[static_cast<std::size_t>(v)];
      if (!std::all_of(rd.begin(), rd.end(), [&](int x) { return members.count(x) > 0; })) continue;
      std::set<int> grown = members;
      grown.insert(j);
      if (!fits(grown)) continue;
      best = j;
    }
    return best;
  }

  // Values read by the members that no member defines, in order of first read.
  std::vector<int> leaves(const std::set<int>& members) const {
    std::vector<int> ls;
    for (int m : members)
      for (int v : p_.instrs[static_cast<std::size_t>(m)].in)
        if (!members.count(def_[static_cast<std::size_t>(v)]) && std::find(ls.begin(), ls.end(), v) == ls.end())
          ls.push_back(v);
    return ls;
  }
  bool fits(const std::set<int>& members) const {
    std::size_t nodes = 0;
    for (int m : members) {
      const Instr& mi = p_.instrs[static_cast<std::size_t>(m)];
      nodes += mi.op == OpKind::FusedElementwise ? parse_fused_expr(mi.attrs.equation).nodes.size() : 1 + mi.in.size();
    }
    return leaves(members).size() <= kMaxOperands && nodes <= kMaxNodes;
  }

  Instr fused_instr(const Group& g) const {
    std::set<int> members(g.members.begin(), g.members.end());
    members.erase(g.head);
    // The expression's operands; with a head, its product first ($0 of the epilogue).
    std::vector<int> ops = leaves(members);
    const Instr* head = g.head >= 0 ? &p_.instrs[static_cast<std::size_t>(g.head)] : nullptr;
    if (head) {
      ops.erase(std::find(ops.begin(), ops.end(), head->out));
      ops.insert(ops.begin(), head->out);
    }
    FusedExpr e;
    std::map<int, int> node_of;  // value -> node
    auto value_node = [&](int v) {
      auto it = node_of.find(v);
      if (it != node_of.end()) return it->second;
      FusedNode n;
      n.kind = FusedNode::Kind::Operand;
      n.operand = static_cast<int>(std::find(ops.begin(), ops.end(), v) - ops.begin());
      e.nodes.push_back(n);
      return node_of[v] = e.root();
    };
    Instr f;
    const Instr& root = p_.instrs[static_cast<std::size_t>(g.members.back())];
    std::vector<std::string> names;
    const bool softmax = is_softmax(root);
    for (int m : g.members) {
      const Instr& mi = p_.instrs[static_cast<std::size_t>(m)];
      names.push_back(p_.values[static_cast<std::size_t>(mi.out)].name);
      f.flops += mi.flops;
      f.seconds += mi.seconds;
      if (softmax && m == g.members.back()) break;  // the softmax itself: the op, not a node
      if (m == g.head) continue;                     // the einsum: the op, its product is $0
      if (mi.op == OpKind::Constant) {
        FusedNode n;
        n.kind = FusedNode::Kind::Literal;
        n.value = mi.attrs.scalar;
        n.dtype = p_.values[static_cast<std::size_t>(mi.out)].dtype;
        n.shape = p_.values[static_cast<std::size_t>(mi.out)].shape;
        e.nodes.push_back(n);
        node_of[mi.out] = e.root();
      } else if (mi.op == OpKind::FusedElementwise) {
        // Inline the member's expression: its operand k is the node of its k-th input.
        const FusedExpr inner = parse_fused_expr(mi.attrs.equation);
        std::vector<int> map(inner.nodes.size());
        for (std::size_t k = 0; k < inner.nodes.size(); ++k) {
          FusedNode n = inner.nodes[k];
          if (n.kind == FusedNode::Kind::Operand) {
            map[k] = value_node(mi.in[static_cast<std::size_t>(n.operand)]);
            continue;
          }
          for (int& a : n.args) a = map[static_cast<std::size_t>(a)];
          e.nodes.push_back(std::move(n));
          map[k] = e.root();
        }
        node_of[mi.out] = map.back();
      } else {
        FusedNode n;
        n.kind = FusedNode::Kind::Op;
        n.op = mi.op;
        n.dtype = mi.attrs.dtype;  // cast's target
        for (int v : mi.in) n.args.push_back(value_node(v));
        e.nodes.push_back(std::move(n));
        node_of[mi.out] = e.root();
      }
    }
    // The expression's result (the softmax's operand for a softmax root) must be its last node:
    // members are in program order, so it is, unless it is an inlined fused op's shared node
    // or the operand of a softmax read by an earlier member too: then it is copied last.
    const int result = softmax ? root.in[0] : root.out;
    if (node_of.at(result) != e.root()) e.nodes.push_back(e.nodes[static_cast<std::size_t>(node_of.at(result))]);
    f.kind = InstrKind::Kernel;
    f.op = softmax ? OpKind::FusedSoftmax : OpKind::FusedElementwise;
    if (softmax) f.attrs.axis = root.attrs.axis;
    f.attrs.equation = print_fused_expr(e);
    f.in = ops;
    if (head) {  // einsum(head's operands) then the expression over {product, the other leaves}
      f.op = OpKind::FusedEinsum;
      f.attrs.epilogue = f.attrs.equation;
      f.attrs.equation = head->attrs.equation;
      f.in = head->in;
      f.in.insert(f.in.end(), ops.begin() + 1, ops.end());
    }
    f.out = root.out;
    f.stream = root.stream;
    f.graph_op = root.graph_op;
    f.note = "fused: " + join(names, ", ");
    return f;
  }

  const Program& p_;
  bool einsum_epilogues_ = true;
  std::vector<int> def_;
  std::vector<std::set<int>> readers_;
  std::set<int> output_;
};

}  // namespace

Program fuse_elementwise_pass(Program p, bool einsum_epilogues) { return Fuser(p, einsum_epilogues).run(); }

}  // namespace tessel
