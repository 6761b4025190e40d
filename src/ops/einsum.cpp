// src/ops/einsum.cpp — the registry entry of einsum (one or two operands), its equation
// parser, and the matmul builder. Every letter is a factor; letters absent from the result
// are reduction factors (sharding them makes the result partial).
#include <cctype>
#include <map>
#include <set>

#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

void infer_einsum(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  EinsumSpec spec;
  try {
    spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  } catch (const ShapeError& e) {
    shape_fail("einsum", in, e.what());
  }
  std::map<char, int64_t> size;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::string& sub = spec.operands[i];
    if (sub.size() != in[i]->shape.size())
      shape_fail("einsum", in, fmt::format("equation '{}' gives operand {} the {} letters '{}' "
                                           "but %{} has rank {}", a.equation, i, sub.size(),
                                           sub, in[i]->name, in[i]->shape.size()));
    for (std::size_t d = 0; d < sub.size(); ++d) {
      auto it = size.find(sub[d]);
      if (it == size.end())
        size[sub[d]] = in[i]->shape[d];
      else if (it->second != in[i]->shape[d])
        shape_fail("einsum", in, fmt::format("letter '{}' of equation '{}' has size {} in one "
                                             "operand and {} in %{} (dim {})", sub[d],
                                             a.equation, it->second, in[i]->shape[d],
                                             in[i]->name, d));
    }
    if (!is_float(in[i]->dtype))
      shape_fail("einsum", in, "einsum needs floating-point operands; cast i32 values first");
  }
  if (in.size() == 2 && in[0]->dtype != in[1]->dtype)
    shape_fail("einsum", in, "operands must have the same dtype; insert a cast");
  out.clear();
  for (char c : spec.result) out.push_back(size[c]);
  dt = in[0]->dtype;
}

OpRule rule_einsum(const OpAttrs& a, const Shapes& in, const Shape&) {
  EinsumSpec spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  OpRule r;
  std::map<char, int> factor;
  for (std::size_t i = 0; i < in.size(); ++i) {
    std::vector<DimFactors> dims;
    for (std::size_t d = 0; d < spec.operands[i].size(); ++d) {
      char c = spec.operands[i][d];
      auto it = factor.find(c);
      if (it == factor.end()) {
        bool in_result = spec.result.find(c) != std::string::npos;
        factor[c] = static_cast<int>(r.factors.size());
        r.factors.push_back({std::string(1, c), in[i][d],
                             in_result ? FactorKind::Pass : FactorKind::Reduction});
      }
      dims.push_back({factor[c]});
    }
    r.operands.push_back(std::move(dims));
  }
  for (char c : spec.result) r.result.push_back({factor[c]});
  return r;
}

double flops_einsum(const OpAttrs& a, const Shapes& in, const Shape&) {
  EinsumSpec spec = parse_einsum(a.equation, static_cast<int>(in.size()));
  std::map<char, int64_t> size;
  for (std::size_t i = 0; i < in.size(); ++i)
    // (Shapes may not match the equation yet when a parsed program is being checked.)
    for (std::size_t d = 0; d < spec.operands[i].size() && d < in[i].size(); ++d) size[spec.operands[i][d]] = in[i][d];
  double n = 1;
  for (auto& kv : size) n *= static_cast<double>(kv.second);
  return in.size() == 2 ? 2 * n : n;
}

// Random batch (B), contracted (C) and free (A, F) letters in random orders.
Tensor sample_einsum(Graph& g, SampleGen& r) {
  std::string letters = "abcdefgh";
  std::shuffle(letters.begin(), letters.end(), r.rng);
  auto n = [&](int k) { return static_cast<std::size_t>(r.below(k)); };
  std::size_t nb = n(2), nc = n(3), na = n(3), nf = n(3);
  if (nb + nc + na + nf == 0) nc = 1;
  std::size_t p = 0;
  std::string B = letters.substr(p, nb); p += nb;
  std::string C = letters.substr(p, nc); p += nc;
  std::string A = letters.substr(p, na); p += na;
  std::string F = letters.substr(p, nf);
  std::string lhs = B + A + C, rhs = B + C + F, res = B + A + F;
  std::shuffle(lhs.begin(), lhs.end(), r.rng);
  std::shuffle(rhs.begin(), rhs.end(), r.rng);
  std::shuffle(res.begin(), res.end(), r.rng);
  std::map<char, int64_t> size;
  for (char c : lhs + rhs) size[c] = r.dim();
  Shape sa, sb;
  for (char c : lhs) sa.push_back(size[c]);
  for (char c : rhs) sb.push_back(size[c]);
  if (lhs.empty() || rhs.empty() || r.coin(0.15)) {  // one operand: sum some letters out
    std::string one = lhs.empty() ? rhs : lhs;
    Shape s1 = lhs.empty() ? sb : sa;
    std::string out;
    for (char c : one)
      if (r.coin()) out += c;
    return einsum(one + "->" + out, r.input(g, s1));
  }
  return einsum(lhs + "," + rhs + "->" + res, r.input(g, sa), r.input(g, sb));
}

}  // namespace

namespace {
// The gradient of operand `k` of einsum "A,B->C" (or "A->C"): einsum "C,B->A" of the result's
// gradient and the other operand. Letters of A found in neither C nor B (summed out of A
// alone) come back by broadcasting; with a scalar result the gradient scales instead.
Tensor einsum_operand_grad(const VjpArgs& a, const EinsumSpec& spec, std::size_t k) {
  const Tensor& gz = a.grad_output;
  const std::string& A = spec.operands[k];
  const bool binary = spec.operands.size() == 2;
  const std::string B = binary ? spec.operands[1 - k] : std::string();
  std::string kept;
  for (char c : A)
    if (spec.result.find(c) != std::string::npos || B.find(c) != std::string::npos) kept += c;
  Tensor r;
  if (spec.result.empty()) {
    if (binary) r = mul(einsum(B + "->" + kept, a.inputs[1 - k]), gz);
    else r = gz;  // kept is empty: every letter of A was summed
  } else if (binary) {
    r = einsum(spec.result + "," + B + "->" + kept, gz, a.inputs[1 - k]);
  } else {
    r = einsum(spec.result + "->" + kept, gz);
  }
  const Shape shape = a.inputs[k].shape();  // a copy: the builders below grow the graph
  if (kept == A) return r;
  Shape with_ones;
  for (std::size_t d = 0; d < A.size(); ++d) with_ones.push_back(kept.find(A[d]) != std::string::npos ? shape[d] : 1);
  return broadcast_to(reshape(r, with_ones), shape);
}
std::vector<Tensor> vjp_einsum(const VjpArgs& a) {
  const EinsumSpec spec = parse_einsum(a.op.attrs.equation, static_cast<int>(a.inputs.size()));
  std::vector<Tensor> out;
  for (std::size_t k = 0; k < a.inputs.size(); ++k) out.push_back(einsum_operand_grad(a, spec, k));
  return out;
}
}  // namespace

void register_einsum_ops(std::vector<OpDef>& t) {
  OpDef e = entry(OpKind::Einsum, "einsum", 1, 2, infer_einsum, rule_einsum, flops_einsum,
                  sample_einsum);
  e.attrs = {{"eq", AttrField::Equation}};
  e.partial_flow = PartialFlow::Multilinear;
  e.vjp = vjp_einsum;
  put(t, std::move(e));
}

}  // namespace ops_detail

EinsumSpec parse_einsum(std::string_view eq, int num_operands) {
  EinsumSpec spec;
  auto arrow = eq.find("->");
  if (arrow == std::string_view::npos)
    throw ShapeError(fmt::format("einsum equation '{}' needs '->' and a result, e.g. "
                                 "'bsd,df->bsf'", eq));
  std::string lhs(eq.substr(0, arrow)), rhs(eq.substr(arrow + 2));
  auto clean = [&](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (std::isspace(static_cast<unsigned char>(c))) continue;
      if (!std::isalpha(static_cast<unsigned char>(c)))
        throw ShapeError(fmt::format("einsum equation '{}': '{}' is not a letter", eq, c));
      o += c;
    }
    std::set<char> seen;
    for (char c : o)
      if (!seen.insert(c).second)
        throw ShapeError(fmt::format("einsum equation '{}': letter '{}' repeats within one "
                                     "term (diagonals are not supported)", eq, c));
    return o;
  };
  std::size_t b = 0;
  while (true) {
    auto comma = lhs.find(',', b);
    spec.operands.push_back(clean(lhs.substr(b, comma == std::string::npos ? std::string::npos : comma - b)));
    if (comma == std::string::npos) break;
    b = comma + 1;
  }
  spec.result = clean(rhs);
  if (static_cast<int>(spec.operands.size()) != num_operands)
    throw ShapeError(fmt::format("einsum equation '{}' has {} operand terms but {} operands "
                                 "were given", eq, spec.operands.size(), num_operands));
  for (char c : spec.result) {
    bool found = false;
    for (const auto& o : spec.operands) found = found || o.find(c) != std::string::npos;
    if (!found)
      throw ShapeError(fmt::format("einsum equation '{}': result letter '{}' appears in no "
                                   "operand", eq, c));
  }
  return spec;
}

Tensor einsum(std::string_view eq, Tensor a, Tensor b) {
  OpAttrs at;
  at.equation = std::string(eq);
  return ops_detail::build(OpKind::Einsum, {a, b}, std::move(at));
}
Tensor einsum(std::string_view eq, Tensor a) {
  OpAttrs at;
  at.equation = std::string(eq);
  return ops_detail::build(OpKind::Einsum, {a}, std::move(at));
}
Tensor matmul(Tensor a, Tensor b) {
  if (a.rank() < 2 || a.rank() > 8 || b.rank() != 2)
    throw ShapeError(fmt::format("matmul(%{}: {}, %{}: {}): expects [..., m, k] x [k, n]",
                                 a.name(), shape_str(a.shape()), b.name(), shape_str(b.shape())));
  std::string lhs = std::string("abcdefgh").substr(0, static_cast<std::size_t>(a.rank() - 1));
  return einsum(lhs + "k,kn->" + lhs + "n", a, b);
}

}  // namespace tessel
