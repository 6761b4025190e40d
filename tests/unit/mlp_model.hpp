// tests/unit/mlp_model.hpp — the two-block MLP the Trainer tests train (CPU: test_trainer.cpp,
// CUDA: tests/gpu/test_cuda_runtime.cpp): residuals, GELU, a mean-squared error, Megatron
// layouts on `model`, the batch split over `data`; and seeded initial parameters.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessel/tessel.hpp"

namespace tessel_test {

using namespace tessel;

// Two MLP blocks with residuals and a mean-squared error, Megatron layouts on `model`, the
// batch split over `data`.
struct Mlp {
  Graph g;
  Tensor loss;
  std::vector<Tensor> params;
};

inline Mlp build_mlp(int64_t batch) {
  Mlp m;
  Graph& g = m.g;
  Tensor x = input(g, "x", DType::f32, {batch, 16}), y = input(g, "y", DType::f32, {batch, 16});
  g.annotate(x, Sharding::of({{"data"}, {}}));
  g.annotate(y, Sharding::of({{"data"}, {}}));
  Tensor h = x;
  for (int b = 0; b < 2; ++b) {
    Tensor w1 = input(g, "w1_" + std::to_string(b), DType::f32, {16, 32});
    Tensor w2 = input(g, "w2_" + std::to_string(b), DType::f32, {32, 16});
    g.annotate(w1, Sharding::of({{}, {"model"}}));
    g.annotate(w2, Sharding::of({{"model"}, {}}));
    h = add(h, einsum("bf,fd->bd", gelu(einsum("bd,df->bf", h, w1)), w2));
    m.params.push_back(w1);
    m.params.push_back(w2);
  }
  Tensor d = sub(h, y);
  m.loss = mul(reduce_sum(mul(d, d), {0, 1}), constant(g, 1.0 / static_cast<double>(batch * 16))).named("loss");
  g.mark_output(m.loss);
  return m;
}

inline std::map<std::string, HostTensor> init_params(const Mlp& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0, 0.2);
  std::map<std::string, HostTensor> p;
  for (const Tensor& t : m.params) {
    HostTensor h(DType::f32, t.shape());
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, n(rng));
    p[t.name()] = h;
  }
  return p;
}

}  // namespace tessel_test
