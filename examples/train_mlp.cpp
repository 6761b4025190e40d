// train_mlp: a custom loop on the Trainer (docs/training.md); every step checked on one device.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/tessel.hpp"

int main(int argc, char** argv) {
  using namespace tessel;
  if (argc > 1) {  // no options: --help says so, anything else is an error
    std::printf("usage: train_mlp (no options): trains two MLP blocks on data=2,model=2\n");
    return std::string(argv[1]) == "--help" ? 0 : 2;
  }
  Graph g;  // the model: two MLP blocks with residuals, a mean-squared error
  Tensor x = input(g, "x", DType::f32, {16, 32}), y = input(g, "y", DType::f32, {16, 32});
  g.annotate(x, Sharding::of({{"data"}, {}}));  // the batch split over data
  std::vector<Tensor> params;
  Tensor h = x;
  for (int b = 0; b < 2; ++b) {
    Tensor w1 = input(g, "w1_" + std::to_string(b), DType::f32, {32, 64});
    Tensor w2 = input(g, "w2_" + std::to_string(b), DType::f32, {64, 32});
    g.annotate(w1, Sharding::of({{}, {"model"}}));  // Megatron: columns, then rows
    g.annotate(w2, Sharding::of({{"model"}, {}}));
    h = add(h, einsum("bf,fd->bd", gelu(einsum("bd,df->bf", h, w1)), w2));
    params.insert(params.end(), {w1, w2});
  }
  Tensor d = sub(h, y);
  Tensor loss = mul(reduce_sum(mul(d, d), {0, 1}), constant(g, 1.0 / (16 * 32))).named("loss");
  g.mark_output(loss);

  TrainerOptions o;
  o.train.zero = 2;  // AdamW moments and gradients split over data
  o.lr = LrSchedule::warmup_cosine(1e-2, 5, 60);
  ThreadRuntime rt(4);
  Trainer trainer(g, loss, params, Mesh::parse("data=2,model=2"), rt, o);
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal(0, 1);
  std::map<std::string, HostTensor> init;
  for (const Tensor& p : params) {
    HostTensor t(DType::f32, p.shape());
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.1 * normal(rng));
    init[p.name()] = t;
  }
  trainer.init(init);
  HostTensor xs(DType::f32, {16, 32}), ys(DType::f32, {16, 32});
  double worst = 0, first = 0, last = 0;
  for (int step = 1; step <= 60; ++step) {  // learn y = sin(3x)
    for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, normal(rng)), ys.set(i, std::sin(3 * xs.get(i)));
    const double ref = trainer.reference_step({{xs, ys}}).loss;  // one device, the same state
    const StepRecord r = trainer.step({xs, ys});
    worst = std::max(worst, std::fabs(r.loss - ref) / ref);
    if (step <= 10) first += r.loss / 10;
    if (step > 50) last += r.loss / 10;
    if (step % 10 == 0) std::printf("step %2d  loss %.5f  lr %.5f\n", step, r.loss, r.lr);
  }
  std::printf("mean loss of steps 1-10 %.5f, of steps 51-60 %.5f; largest difference from one device %.1e\n",
              first, last, worst);
  return worst <= 1e-5 && last < first ? 0 : 1;
}
