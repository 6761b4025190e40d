// Autodiff (autodiff.hpp): every op's vjp against central finite differences, partitioned
// gradients against the reference on random meshes and shardings, a tied weight, the
// data-parallel gradient all-reduce, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <set>

#include "tessel/ops/builders.hpp"
#include "tessel/train/autodiff.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

// Kinds whose sample graphs are differentiated: every kind with a vjp and a sample.
std::vector<OpKind> differentiable_kinds() {
  std::vector<OpKind> ks;
  for (OpKind k : all_op_kinds())
    if (op_def(k).vjp && op_def(k).sample) ks.push_back(k);
  return ks;
}

// The sample graph of `k` with loss = sum(out * w) (w a fresh f32 input), its f32 inputs as
// arguments, and their gradients marked as outputs after `out`. Returns false when the sample
// has no f32 argument or an integer result (nothing to differentiate).
struct GradCase {
  Graph g;
  std::vector<int> args;  // f32 graph inputs (positions in g.inputs)
  bool ok = false;
};

GradCase build_grad_case(OpKind k, std::mt19937_64& rng, const std::function<Sharding(const Shape&)>& shard_fn) {
  GradCase c;
  SampleGen r{rng, shard_fn};
  Tensor out = op_def(k).sample(c.g, r);
  c.g.outputs.clear();  // the sample may mark extra results; only `out` matters here
  if (out.dtype() == DType::i32) return c;
  if (out.dtype() != DType::f32) out = cast(out, DType::f32);
  std::vector<Tensor> wrt;
  for (std::size_t i = 0; i < c.g.inputs.size(); ++i) {
    const int v = c.g.inputs[i];
    if (c.g.values[static_cast<std::size_t>(v)].dtype == DType::f32) {
      c.args.push_back(static_cast<int>(i));
      wrt.push_back(c.g.tensor(v));
    }
  }
  if (wrt.empty()) return c;
  Tensor w = input(c.g, "loss.w", DType::f32, out.shape());
  Tensor prod = mul(out, w);
  std::vector<int64_t> all;
  for (int64_t d = 0; d < prod.rank(); ++d) all.push_back(d);
  Tensor loss = all.empty() ? prod : reduce_sum(prod, all);
  c.g.mark_output(out);
  for (const Tensor& t : grad(loss, wrt)) c.g.mark_output(t);
  c.ok = true;
  return c;
}

// sum(out * w) in double over the finite, moderate elements of out (masked positions, -inf
// or -1e30, are constants that would swamp a finite difference), for the inputs `in`.
double loss_of(const Graph& g, const std::vector<HostTensor>& in) {
  const HostTensor out = run_reference(g, in).at(0);
  const HostTensor& w = in.back();  // loss.w is the last input
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    if (std::isfinite(out.get(i)) && std::abs(out.get(i)) < 1e15) s += out.get(i) * w.get(i);
  return s;
}

}  // namespace

TEST_CASE("autodiff: every differentiable op kind's vjp equals central finite differences", "[autodiff][property]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(200);
  tessel_test::announce("autodiff: every differentiable op kind's vjp equals central finite differences", seed, cases);
  std::mt19937_64 rng(seed);
  const std::vector<OpKind> kinds = differentiable_kinds();
  std::map<OpKind, int> checked;
  for (int c = 0; c < cases; ++c) {
    const OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    const uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    GradCase gc = build_grad_case(k, crng, nullptr);
    if (!gc.ok) continue;
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << "\n"
                 << print_graph(gc.g));
    std::vector<HostTensor> in = random_inputs(gc.g, case_seed);
    const std::vector<HostTensor> got = run_reference(gc.g, in);
    // Through a bf16/f16 value the function is a staircase at the scale of its rounding:
    // finite differences need steps well above it and a looser tolerance (the vjp is the
    // straight-through derivative).
    bool low = false;
    for (const Value& v : gc.g.values) low = low || v.dtype == DType::bf16 || v.dtype == DType::f16;
    // f32 outputs of long contractions (an einsum over 16^3 elements) carry rounding that a
    // step of 3e-4 turns into a few 1e-3 of the derivative.
    const double rel_step = low ? 1e-1 : 3e-4, tol = low ? 6e-2 : 6e-3;
    for (std::size_t a = 0; a < gc.args.size(); ++a) {
      const std::size_t pos = static_cast<std::size_t>(gc.args[a]);
      const HostTensor& ad = got.at(1 + a);
      for (int probe = 0; probe < 4; ++probe) {
        const int64_t e = static_cast<int64_t>(crng() % static_cast<uint64_t>(in[pos].numel()));
        const double x0 = in[pos].get(e), h = rel_step * std::max(1.0, std::abs(x0));
        std::vector<HostTensor> p = in;
        p[pos].set(e, x0 + h);
        const double up = loss_of(gc.g, p);
        p[pos].set(e, x0 - h);
        const double down = loss_of(gc.g, p);
        const double mid = loss_of(gc.g, in);
        // Perturbed values are rounded to f32: divide by the step actually taken.
        const double step_up = static_cast<double>(static_cast<float>(x0 + h)) - x0;
        const double step_down = x0 - static_cast<double>(static_cast<float>(x0 - h));
        const double fd = (up - down) / (step_up + step_down);
        const double fwd = (up - mid) / step_up, bwd = (mid - down) / step_down;
        const double scale = 1.0 + std::abs(fd);
        // A kink inside the step (relu at 0, a tie of max) makes the one-sided slopes differ.
        if (!std::isfinite(fd) || std::abs(fwd - bwd) > (low ? 2e-1 : tol) * scale) continue;
        INFO("argument " << a << " (input #" << pos << ") element " << e << ": vjp " << ad.get(e) << ", finite "
                         << "difference " << fd);
        CHECK(std::abs(ad.get(e) - fd) <= tol * scale);
        ++checked[k];
      }
    }
  }
  // Every differentiable kind was checked on some element (when the run is long enough).
  if (cases >= static_cast<int>(kinds.size()) * 3)
    for (OpKind k : kinds) {
      INFO(op_name(k));
      CHECK(checked[k] > 0);
    }
}

TEST_CASE("autodiff: partitioned gradients == reference gradients on random meshes and shardings", "[autodiff][property]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(150);
  tessel_test::announce("autodiff: partitioned gradients == reference gradients on random meshes and shardings", seed, cases);
  std::mt19937_64 rng(seed);
  const std::vector<OpKind> kinds = differentiable_kinds();
  for (int c = 0; c < cases; ++c) {
    const OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    const uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    const Mesh mesh = tessel_test::random_mesh(crng);
    GradCase gc = build_grad_case(
        k, crng, [&](const Shape& s) { return tessel_test::random_sharding_for(crng, mesh, s, false); });
    if (!gc.ok) continue;
    for (int v : gc.g.inputs)
      if (crng() % 5 != 0)
        gc.g.annotate(v, tessel_test::random_sharding_for(crng, mesh, gc.g.values[static_cast<std::size_t>(v)].shape, false));
    INFO("seed " << seed << " case " << c << " (case seed " << case_seed << ") op " << op_name(k) << " mesh "
                 << mesh.to_string() << "\n" << print_graph(gc.g));
    tessel_test::check_matches(gc.g, mesh, case_seed);
  }
}

TEST_CASE("autodiff: a tied embedding and LM head gets the sum of both gradients", "[autodiff]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("autodiff: a tied embedding and LM head gets the sum of both gradients", seed, 1);
  Graph g;
  Tensor wte = input(g, "wte", DType::f32, {32, 8});
  Tensor ids = input(g, "ids", DType::i32, {4, 6});
  Tensor labels = input(g, "labels", DType::i32, {4, 6});
  Tensor h = tanh(embedding(wte, ids));
  Tensor logits = einsum("bsd,vd->bsv", h, wte);
  Tensor loss = reduce_mean(cross_entropy(logits, labels), {0, 1});
  std::vector<Tensor> d = grad(loss, {wte});
  g.mark_output(loss);
  g.mark_output(d[0]);
  CHECK(d[0].name() == "grad.wte");
  // The vocabulary split over model for the embedding's rows, the batch over data.
  g.annotate(wte, Sharding::parse("[{model}, {}]"));
  g.annotate(ids, Sharding::parse("[{data}, {}]"));
  tessel_test::check_matches(g, Mesh::parse("data=2,model=2"), seed);
  // Against finite differences on a few elements of the table.
  auto in = random_inputs(g, seed);
  const HostTensor ad = run_reference(g, in).at(1);
  std::mt19937_64 rng(seed);
  for (int probe = 0; probe < 6; ++probe) {
    const int64_t e = static_cast<int64_t>(rng() % 256);
    const double x0 = in[0].get(e), hstep = 1e-2;
    auto at = [&](double x) {
      auto p = in;
      p[0].set(e, x);
      return run_reference(g, p).at(0).get(0);
    };
    const double fd = (at(x0 + hstep) - at(x0 - hstep)) / (static_cast<float>(x0 + hstep) - static_cast<float>(x0 - hstep));
    INFO("element " << e << " vjp " << ad.get(e) << " finite difference " << fd);
    CHECK(std::abs(ad.get(e) - fd) <= 2e-3 * (1 + std::abs(fd)));
  }
}

TEST_CASE("autodiff: a replicated weight's gradient over a data-split batch is one all-reduce", "[autodiff]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {16, 32});
  Tensor w = input(g, "w", DType::f32, {32, 64});
  Tensor loss = reduce_sum(gelu(einsum("bd,df->bf", x, w)), {0, 1});
  Tensor dw = grad(loss, {w})[0];
  g.mark_output(dw);
  g.annotate(x, Sharding::parse("[{data}, {}]"));
  g.annotate(w, Sharding::parse("[{}, {}]"));
  g.annotate(dw, Sharding::parse("[{}, {}]"));  // replicated, as a data-parallel optimizer wants
  Executable exe = compile(g, Mesh::parse("data=4"));
  const CollectiveSummary s = exe.program().summary();
  INFO(exe.program().to_string(0));
  CHECK(s.all_reduce == 1);
  CHECK(s.bytes == 32 * 64 * 4);
  CHECK(s.all_gather + s.reduce_scatter + s.all_to_all + s.collective_permute == 0);
  // Left open, the partial gradient is reduce-scattered instead (half the traffic, ZeRO-2's
  // choice): open outputs stay where they are cheapest.
  Graph g2 = g.clone();
  g2.annotations.erase(g2.find(dw.name()));
  const CollectiveSummary s2 = compile(g2, Mesh::parse("data=4")).program().summary();
  CHECK(s2.reduce_scatter == 1);
  CHECK(s2.all_reduce == 0);
}

TEST_CASE("autodiff: errors name the loss or the argument or the op", "[autodiff]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {4, 8});
  Tensor ids = input(g, "ids", DType::i32, {4});
  Tensor y = relu(x);
  CHECK_THROWS_WITH(grad(y, {x}), Catch::Contains("the loss must be a float scalar") && Catch::Contains("%" + y.name()));
  CHECK_THROWS_WITH(grad(reduce_sum(ids, {0}), {x}), Catch::Contains("the loss must be a float scalar"));
  Tensor loss = reduce_sum(y, {0, 1});
  CHECK_THROWS_WITH(grad(loss, {ids}), Catch::Contains("%ids") && Catch::Contains("integer value"));
  Graph other;
  Tensor z = input(other, "z", DType::f32, {4, 8});
  CHECK_THROWS_WITH(grad(loss, {z}), Catch::Contains("another graph"));
  // An argument the loss does not depend on gets zeros.
  Tensor unused = input(g, "unused", DType::f32, {3});
  std::vector<Tensor> d = grad(loss, {x, unused});
  g.mark_output(d[0]);
  g.mark_output(d[1]);
  auto got = run_reference(g, random_inputs(g, 1));
  for (int64_t i = 0; i < 3; ++i) CHECK(got[1].get(i) == 0.0);
  // An op on the path without a vjp: the error names it.
  Tensor gamma = input(g, "gamma", DType::f32, {8});
  LayerNormGrads lg = layer_norm_grad(x, gamma, y);
  CHECK_THROWS_WITH(grad(reduce_sum(lg.dx, {0, 1}), {x}),
                    Catch::Contains("layer_norm_grad") && Catch::Contains("no vector-Jacobian product"));
}

TEST_CASE("autodiff: fused softmax_grad and cross_entropy_grad equal their composed forms", "[autodiff]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("autodiff: fused softmax_grad and cross_entropy_grad equal their composed forms", seed, 1);
  Graph g;
  // softmax along a middle axis and along the last one.
  Tensor x = input(g, "x", DType::f32, {3, 5, 4});
  Tensor dy = input(g, "dy", DType::f32, {3, 5, 4});
  for (int64_t axis : {1, 2}) {
    Tensor y = softmax(x, axis);
    g.mark_output(softmax_grad(y, dy, axis));
    g.mark_output(mul(y, sub(dy, reduce_sum(mul(dy, y), {axis}, /*keepdims=*/true))));
  }
  Tensor logits = input(g, "logits", DType::f32, {6, 7});
  Tensor labels = input(g, "labels", DType::i32, {6});
  Tensor gl = input(g, "gl", DType::f32, {6});
  g.mark_output(cross_entropy_grad(logits, labels, gl));
  g.mark_output(mul(sub(softmax(logits, -1), one_hot(labels, 7, DType::f32)), reshape(gl, {6, 1})));
  std::vector<HostTensor> in = random_inputs(g, seed);
  for (int64_t j = 0; j < 6; ++j) in[3].set(j, static_cast<double>((seed + static_cast<uint64_t>(j) * 5) % 7));
  const std::vector<HostTensor> out = run_reference(g, in);
  for (std::size_t o = 0; o < out.size(); o += 2) {
    CompareResult cmp = compare(out[o], out[o + 1], 1.0);
    INFO("output " << o << ": " << cmp.to_string());
    CHECK(cmp.max_rel_err <= 1e-6);
  }
  // The vjps use them.
  Tensor loss = reduce_sum(mul(softmax(x, 1), dy), {0, 1, 2});
  const std::size_t before = g.ops.size();
  grad(loss, {x});
  bool fused = false;
  for (std::size_t i = before; i < g.ops.size(); ++i) fused = fused || g.ops[i].kind == OpKind::SoftmaxGrad;
  CHECK(fused);
  CHECK_THROWS_WITH(softmax_grad(x, logits), Catch::Contains("softmax_grad"));
  CHECK_THROWS_WITH(cross_entropy_grad(logits, labels, x), Catch::Contains("labels and g must have shape [6]"));
}
