// Property test: for every op kind, random meshes (1–8 devices), shapes and input
// shardings, the partitioned run equals the unpartitioned reference element by element
// (f32 relative error <= 1e-5 in the max norm, against the larger of the output's and the
// inputs' magnitude — see compare.hpp; NaN never passes). Outputs are poisoned before each run and
// replicas must agree bit for bit. TESSEL_CASES sets the number of cases (default 2000),
// TESSEL_SEED the seed (printed on failure).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>

#include "../unit/test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/text.hpp"

using namespace tessel;

namespace {

struct Gen {
  std::mt19937_64& rng;
  int64_t pick(std::initializer_list<int64_t> xs) {
    auto it = xs.begin();
    std::advance(it, static_cast<long>(rng() % xs.size()));
    return *it;
  }
  int64_t dim() { return pick({2, 4, 6, 8, 12, 16}); }
  Shape shape(int rank) {
    Shape s;
    for (int i = 0; i < rank; ++i) s.push_back(dim());
    return s;
  }
  int rank() { return 1 + static_cast<int>(rng() % 3); }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
};

// A positive operand for log/sqrt/rsqrt/div denominators.
Tensor positive(Tensor x) { return exp(x); }

// Builds a small graph around one op of kind `k`; returns its output.
Tensor build(Graph& g, OpKind k, Gen& r) {
  auto in = [&](Shape s, DType t = DType::f32) {
    return input(g, fmt::format("in{}", g.inputs.size()), t, std::move(s));
  };
  switch (k) {
    case OpKind::Input:
      return in(r.shape(r.rank()));
    case OpKind::Constant: {
      Tensor x = in(r.shape(r.rank()));
      return add(x, constant(g, 0.25));
    }
    case OpKind::Einsum: {
      std::string letters = "abcdefgh";
      std::shuffle(letters.begin(), letters.end(), r.rng);
      int nb = static_cast<int>(r.rng() % 2), nc = static_cast<int>(r.rng() % 3);
      int na = static_cast<int>(r.rng() % 3), nf = static_cast<int>(r.rng() % 3);
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
      if (lhs.empty() || rhs.empty() || r.coin(0.15)) {
        // single-operand einsum: sum some letters out
        std::string one = lhs.empty() ? rhs : lhs;
        Shape s1 = lhs.empty() ? sb : sa;
        std::string out;
        for (char c : one)
          if (r.coin()) out += c;
        return einsum(one + "->" + out, in(s1));
      }
      return einsum(lhs + "," + rhs + "->" + res, in(sa), in(sb));
    }
    case OpKind::Log: case OpKind::Sqrt: case OpKind::Rsqrt: {
      Tensor x = positive(in(r.shape(r.rank())));
      return g.add_op(k, {x.id}, {});
    }
    case OpKind::Neg: case OpKind::Exp: case OpKind::Tanh: case OpKind::Gelu: case OpKind::Relu:
    case OpKind::CausalMask: {
      Shape s = r.shape(k == OpKind::CausalMask ? 2 + static_cast<int>(r.rng() % 2) : r.rank());
      if (k == OpKind::CausalMask) s[s.size() - 2] = s.back();
      return g.add_op(k, {in(s).id}, {});
    }
    case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div: case OpKind::Max: {
      Shape a = r.shape(r.rank());
      Shape b = a;
      if (r.coin()) {  // broadcasting: drop leading dims and/or set some to 1
        std::size_t drop = static_cast<std::size_t>(r.rng() % (a.size() + 1));
        b.erase(b.begin(), b.begin() + static_cast<long>(drop));
        for (auto& d : b)
          if (r.coin(0.3)) d = 1;
        if (b.empty()) b = {};
      }
      Tensor ta = in(a), tb = in(b);
      if (r.coin(0.3)) std::swap(ta, tb);
      if (k == OpKind::Div) tb = positive(tb);
      return g.add_op(k, {ta.id, tb.id}, {});
    }
    case OpKind::ReduceSum: case OpKind::ReduceMax: case OpKind::ReduceMean: {
      Shape s = r.shape(r.rank());
      OpAttrs a;
      for (std::size_t d = 0; d < s.size(); ++d)
        if (r.coin()) a.dims.push_back(static_cast<int64_t>(d));
      if (a.dims.empty()) a.dims.push_back(static_cast<int64_t>(r.rng() % s.size()));
      a.keepdims = r.coin();
      return g.add_op(k, {in(s).id}, a);
    }
    case OpKind::Reshape: {
      // [.., a*b, ..] <-> [.., a, b, ..] splits and merges, or a full flatten
      Shape s = r.shape(r.rank());
      Shape t;
      int mode = static_cast<int>(r.rng() % 3);
      if (mode == 0) {  // split one dim
        for (std::size_t d = 0; d < s.size(); ++d) {
          if (d == 0 && s[d] % 2 == 0) { t.push_back(2); t.push_back(s[d] / 2); }
          else t.push_back(s[d]);
        }
      } else if (mode == 1 && s.size() >= 2) {  // merge the last two
        t.assign(s.begin(), s.end() - 2);
        t.push_back(s[s.size() - 2] * s.back());
      } else {
        t = {num_elements(s)};
      }
      OpAttrs a;
      a.shape = t;
      return g.add_op(k, {in(s).id}, a);
    }
    case OpKind::Transpose: {
      Shape s = r.shape(r.rank());
      OpAttrs a;
      for (std::size_t d = 0; d < s.size(); ++d) a.dims.push_back(static_cast<int64_t>(d));
      std::shuffle(a.dims.begin(), a.dims.end(), r.rng);
      return g.add_op(k, {in(s).id}, a);
    }
    case OpKind::Broadcast: {
      Shape t = r.shape(r.rank());
      Shape s(t.begin() + static_cast<long>(r.rng() % t.size()), t.end());
      for (auto& d : s)
        if (r.coin(0.4)) d = 1;
      OpAttrs a;
      a.shape = t;
      return g.add_op(k, {in(s).id}, a);
    }
    case OpKind::Slice: {
      Shape s = r.shape(r.rank());
      OpAttrs a;
      for (auto d : s) {
        int64_t st = r.coin() ? 0 : static_cast<int64_t>(r.rng() % static_cast<uint64_t>(d));
        int64_t lim = r.coin() ? d : st + 1 + static_cast<int64_t>(r.rng() % static_cast<uint64_t>(d - st));
        a.starts.push_back(st);
        a.limits.push_back(lim);
      }
      return g.add_op(k, {in(s).id}, a);
    }
    case OpKind::Concat: {
      Shape s = r.shape(r.rank());
      int64_t axis = static_cast<int64_t>(r.rng() % s.size());
      std::vector<Tensor> xs;
      int n = 2 + static_cast<int>(r.rng() % 2);
      for (int i = 0; i < n; ++i) {
        Shape si = s;
        si[axis] = r.dim();
        xs.push_back(in(si));
      }
      return concat(xs, axis);
    }
    case OpKind::Softmax: {
      Shape s = r.shape(r.rank());
      return softmax(in(s), static_cast<int64_t>(r.rng() % s.size()));
    }
    case OpKind::LayerNorm: {
      Shape s = r.shape(1 + r.rank());
      return layer_norm(in(s), in({s.back()}), in({s.back()}));
    }
    case OpKind::Embedding: {
      int64_t v = r.dim() * 2, d = r.dim();
      Shape ids = r.shape(1 + static_cast<int>(r.rng() % 2));
      return embedding(in({v, d}), in(ids, DType::i32));
    }
    case OpKind::CrossEntropy: {
      Shape lead = r.shape(1 + static_cast<int>(r.rng() % 2));
      Shape logits = lead;
      logits.push_back(r.dim());
      return cross_entropy(in(logits), in(lead, DType::i32));
    }
    case OpKind::ShardingConstraint: {
      Tensor x = tanh(in(r.shape(r.rank())));
      return x;  // the constraint itself is added by the caller (needs the mesh)
    }
    case OpKind::kCount: break;
  }
  throw Error("unreachable");
}

}  // namespace

TEST_CASE("property: partitioned run == reference for every op kind", "[integration][property]") {
  uint64_t seed = tessel_test::seed();
  int cases = tessel_test::cases(2000);
  tessel_test::announce("property: partitioned run == reference for every op kind", seed, cases);
  std::mt19937_64 rng(seed);
  std::map<OpKind, int> per_kind;
  for (int c = 0; c < cases; ++c) {
    OpKind k = static_cast<OpKind>(1 + c % (static_cast<int>(OpKind::kCount) - 1));
    uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    Gen cr{crng};
    Mesh mesh = tessel_test::random_mesh(crng);
    Graph g;
    Tensor out = build(g, k, cr);
    if (k == OpKind::ShardingConstraint)
      out = shard(out, tessel_test::random_sharding_for(crng, mesh, out.shape(), false));
    g.mark_output(out);
    for (int v : g.inputs)
      if (cr.coin(0.8))
        g.annotate(v, tessel_test::random_sharding_for(crng, mesh, g.values[v].shape, false));
    if (cr.coin(0.3) && k != OpKind::ShardingConstraint)
      g.annotate(out, tessel_test::random_sharding_for(crng, mesh, out.shape(), false));
    g.mesh = mesh;
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << "\n"
                 << print_graph(g));
    Executable exe = compile(g, mesh);
    INFO(exe.program().to_string(0));
    auto inputs = random_inputs(g, case_seed);
    RunOptions ro;
    ro.poison = true;
    ro.check_replicas = true;
    ro.collective_timeout_s = 60;
    auto got = exe.run(inputs, ro);
    auto want = run_reference(g, inputs);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      // Judged against the larger of the output's and the inputs' magnitude (compare.hpp):
      // a sum of signed inputs that cancels to ~0 keeps the inputs' absolute rounding.
      CompareResult cmp = compare(got[i], want[i], max_abs(inputs));
      INFO(cmp.to_string());
      REQUIRE(cmp.max_rel_err <= 1e-5);
    }
    ++per_kind[k];
  }
  for (int k = 1; k < static_cast<int>(OpKind::kCount); ++k)
    REQUIRE(per_kind[static_cast<OpKind>(k)] > 0);
}
