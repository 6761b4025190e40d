// Host tests of the CUDA kernels' index math (src/runtime/cuda/kernels/launchers.hpp), which runs on the host
// exactly as on the device (the same expression, __umulhi replaced by a 64-bit product):
//  * FastDivmod: n / d and n % d for divisors 1..2^31-1 and dividends 0..2^31-1, at every
//    power-of-two boundary, around multiples of d, and on seeded random pairs;
//  * with_divisors: a loop of 2^31 elements or more keeps 64-bit division; a smaller one gets a
//    divisor per dim, and decomposing with them gives the same offsets as 64-bit division.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "../../src/runtime/cuda/kernels/launchers.hpp"
#include "test_util.hpp"

using tessel::cuda_kernels::FastDivmod;
using tessel::cuda_kernels::Loop;

namespace {

void check_div(const FastDivmod& f, uint32_t n) {
  const uint32_t q = f.div(n);
  if (q != n / f.d) FAIL("FastDivmod(" << f.d << ").div(" << n << ") = " << q << ", want " << n / f.d);
}

std::vector<uint32_t> interesting(uint32_t d) {
  std::vector<uint32_t> v = {0, 1, 2, 0x7ffffffeu, 0x7fffffffu};
  for (int b = 0; b < 31; ++b) {
    const uint32_t p = 1u << b;
    v.insert(v.end(), {p - 1, p, p + 1});
  }
  for (uint64_t k : {1ull, 2ull, 3ull, 1000ull, 0x7fffffffull / d, 0x7fffffffull / d - 1}) {
    const uint64_t m = k * d;
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t n = static_cast<int64_t>(m) + delta;
      if (n >= 0 && n < (int64_t{1} << 31)) v.push_back(static_cast<uint32_t>(n));
    }
  }
  return v;
}

}  // namespace

TEST_CASE("FastDivmod divides like 32-bit division below 2^31", "[cuda][unit]") {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4100; ++d) divisors.push_back(d);
  for (int b = 12; b < 31; ++b)
    for (int64_t delta = -3; delta <= 3; ++delta) divisors.push_back(static_cast<uint32_t>((int64_t{1} << b) + delta));
  divisors.insert(divisors.end(), {50257, 50304, 65535, 3 * 1024 * 1024, 0x7ffffffeu, 0x7fffffffu});
  for (uint32_t d : divisors) {
    const FastDivmod f = FastDivmod::make(d);
    for (uint32_t n : interesting(d)) check_div(f, n);
  }
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("FastDivmod on random pairs", seed, 2000000);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000000; ++i) {
    // log-uniform divisors: small and large ones equally often
    const int bits = static_cast<int>(rng() % 31) + 1;
    const uint32_t d = static_cast<uint32_t>(1 + rng() % ((uint64_t{1} << bits) - 1));
    const uint32_t n = static_cast<uint32_t>(rng() % (uint64_t{1} << 31));
    INFO("seed " << seed);
    check_div(FastDivmod::make(d), n);
  }
  CHECK_THROWS_WITH(FastDivmod::make(0), Catch::Contains("divisor 0"));
  CHECK_THROWS_WITH(FastDivmod::make(int64_t{1} << 31), Catch::Contains("outside [1, 2^31)"));
}

TEST_CASE("with_divisors decomposes loop indices as 64-bit division does", "[cuda][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("with_divisors on random loops", seed, 300);
  std::mt19937_64 rng(seed);
  for (int c = 0; c < 300; ++c) {
    Loop l;
    l.rank = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < l.rank; ++d) {
      l.shape[d] = 1 + static_cast<int64_t>(rng() % 37);
      for (int k = 0; k < 2; ++k) l.stride[k][d] = static_cast<int64_t>(rng() % 5000);
    }
    const Loop w = tessel::cuda_kernels::with_divisors(l);
    REQUIRE(w.small);
    for (int64_t i = 0; i < l.size(); ++i) {
      int64_t want[2] = {0, 0}, got[2] = {0, 0};
      int64_t rest = i;
      uint32_t rest32 = static_cast<uint32_t>(i);
      for (int d = l.rank - 1; d >= 0; --d) {
        const int64_t idx = rest % l.shape[d];
        rest /= l.shape[d];
        const uint32_t q = w.div[d].div(rest32);
        const int64_t idx32 = rest32 - q * w.div[d].d;
        rest32 = q;
        for (int k = 0; k < 2; ++k) want[k] += idx * l.stride[k][d], got[k] += idx32 * l.stride[k][d];
      }
      INFO("seed " << seed << " case " << c << " index " << i);
      REQUIRE(got[0] == want[0]);
      REQUIRE(got[1] == want[1]);
    }
  }
  Loop big;
  big.rank = 2;
  big.shape[0] = 1 << 16;
  big.shape[1] = 1 << 15;  // 2^31 elements: 64-bit division kept
  CHECK_FALSE(tessel::cuda_kernels::with_divisors(big).small);
  big.shape[1] = (1 << 15) - 1;
  CHECK(tessel::cuda_kernels::with_divisors(big).small);
}
