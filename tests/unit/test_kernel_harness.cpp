// The CPU half of the GPU suite's kernel-level tests (tests/gpu/test_cuda_ops.cpp): the same
// harness (tests/unit/kernel_check.hpp) with the CPU backend in the GPU's place. The two sides
// then run the same kernels, so every comparison must hold exactly; what this checks is the
// harness itself: every op of the registry retyped to bf16 and f16 within its type rules and
// run without an exception, every einsum layout case in each dtype, K = 0 through kernel
// arguments built by hand (issue 22, findings 1 and 2 failed here before they were fixed).
#include <catch2/catch.hpp>

#include <random>

#include "kernel_check.hpp"
#include "test_util.hpp"

using namespace tessel;

TEST_CASE("kernel harness: every op kernel in bf16 and f16 on the CPU backend == CPU kernel", "[kernels][harness]") {
  const uint64_t seed = tessel_test::seed();
  const auto kinds = tessel_test::sampled_op_kinds();
  tessel_test::announce("kernel harness: every op kernel in bf16 and f16 on the CPU backend", seed,
                        2 * static_cast<int>(kinds.size()));
  tessel_test::KernelDevice dev(make_cpu_backend());
  // The same kernels on both sides: equal bit for bit.
  CHECK(tessel_test::check_every_op_in_16_bits(dev, seed, 0.0, 0.0) >= static_cast<int>(kinds.size()));
}

TEST_CASE("kernel harness: einsum layouts on the CPU backend == CPU kernel", "[kernels][harness]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("kernel harness: einsum layouts on the CPU backend", seed, 42);
  tessel_test::KernelDevice dev(make_cpu_backend());
  std::mt19937_64 rng(seed);
  tessel_test::check_einsum_layouts(dev, rng, " (CPU backend)");
}

TEST_CASE("kernel harness: an einsum with an empty summed dimension on the CPU backend writes zeros",
          "[kernels][harness]") {
  tessel_test::KernelDevice dev(make_cpu_backend());
  tessel_test::check_empty_einsum(dev);
}
