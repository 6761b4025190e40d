// tests/unit/test_onednn_einsum.cpp — the CPU einsum on oneDNN (src/runtime/cpu/onednn_einsum.cpp)
// against the Eigen kernel, its oracle: the GPT example's einsums (projections, attention in
// both directions, weight gradients), random equations with random letter orders and sizes,
// bf16, several kernel threads, and bit-identical results on repeated and concurrent calls.
// Built without oneDNN, every einsum runs on Eigen and the cases check that it says so.
//
// Tolerance: rounding in a sum of K products is bounded by a multiple of sum_k |a||b|, not of
// the result (which may cancel to ~0), so each element is compared against
// 1e-5 · (|A|·|B|)[element], the same einsum of the absolute values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../src/runtime/cpu/onednn_einsum.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/memory_meter.hpp"
#include "tessel/runtime/tensor.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

struct Case {
  std::string eq;
  Shape a, b, out;
};

HostTensor rand_tensor(std::mt19937_64& rng, DType t, const Shape& s) {
  HostTensor x(t, s);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, d(rng));
  return x;
}

HostTensor abs_of(const HostTensor& x) {
  HostTensor y(x.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y.set(i, std::fabs(x.get(i)));
  return y;
}

// Runs the einsum with `impl`; `ran_onednn` says whether oneDNN took it.
HostTensor run(const Case& c, const HostTensor& a, const HostTensor& b, EinsumImpl impl, bool* ran_onednn = nullptr,
               int threads = 1, MemoryMeter* scratch_meter = nullptr) {
  OpAttrs at;
  at.equation = c.eq;
  KernelArgs k;
  k.kind = OpKind::Einsum;
  k.attrs = &at;
  k.in = {a.data(), b.data()};
  k.in_shapes = {a.shape(), b.shape()};
  k.in_dtypes = {a.dtype(), b.dtype()};
  HostTensor out(a.dtype(), c.out);
  out.poison();
  k.out = out.data();
  k.out_shape = c.out;
  k.out_dtype = a.dtype();
  k.num_threads = threads;
  k.scratch_meter = scratch_meter;
  const bool r = cpu_einsum(k, impl);
  if (ran_onednn) *ran_onednn = r;
  return out;
}

bool same_bits(const HostTensor& x, const HostTensor& y) {
  // An empty tensor has no buffer (memcmp must not see a null pointer, even for 0 bytes).
  return x.shape() == y.shape() &&
         (x.numel() == 0 ||
          std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype())) == 0);
}

// oneDNN (Auto) against Eigen on fresh random operands; returns whether oneDNN ran.
bool check_case(std::mt19937_64& rng, const Case& c, DType t = DType::f32, int threads = 1) {
  const HostTensor a = rand_tensor(rng, t, c.a), b = rand_tensor(rng, t, c.b);
  bool ran = false;
  const HostTensor got = run(c, a, b, EinsumImpl::Auto, &ran, threads);
  const HostTensor want = run(c, a, b, EinsumImpl::Eigen);
  const HostTensor scale = run(c, abs_of(a), abs_of(b), EinsumImpl::Eigen);
  // bf16: both round the f32 sum to bf16 once (2^-8 relative), perhaps on either side.
  const double tol = t == DType::f32 ? 1e-5 : 1e-2;
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const bool ok = std::isfinite(g) && std::fabs(g - w) <= tol * scale.get(i) + 1e-30;
    if (!ok && bad++ < 5) {
      INFO(c.eq << " " << shape_str(c.a) << " " << shape_str(c.b) << " element " << i << ": onednn " << g
                << ", eigen " << w << ", scale " << scale.get(i));
      CHECK(ok);
    }
  }
  CHECK(bad == 0);
  // Deterministic for a given shape: a second call gives the same bits.
  const HostTensor again = run(c, a, b, EinsumImpl::Auto, nullptr, threads);
  CHECK(same_bits(got, again));
  return ran;
}

// The GPT example's einsums (examples/gpt.cpp defaults: batch 8, seq 64, d_model 128,
// 4 heads of 32, d_ff 512) and their gradients.
std::vector<Case> gpt_cases() {
  return {
      {"bsd,df->bsf", {8, 64, 128}, {128, 512}, {8, 64, 512}},     // MLP up
      {"bsf,fd->bsd", {8, 64, 512}, {512, 128}, {8, 64, 128}},     // MLP down
      {"bsd,dhk->bshk", {8, 64, 128}, {128, 4, 32}, {8, 64, 4, 32}},  // q/k/v projection
      {"bshk,hkd->bsd", {8, 64, 4, 32}, {4, 32, 128}, {8, 64, 128}},  // attention output
      {"bqhk,bshk->bhqs", {8, 64, 4, 32}, {8, 64, 4, 32}, {8, 4, 64, 64}},  // scores
      {"bhqs,bshk->bqhk", {8, 4, 64, 64}, {8, 64, 4, 32}, {8, 64, 4, 32}},  // weighted values
      {"bsf,df->bsd", {8, 64, 512}, {128, 512}, {8, 64, 128}},     // dX of MLP up (B transposed)
      {"bsd,bsf->df", {8, 64, 128}, {8, 64, 512}, {128, 512}},     // dW of MLP up (A transposed)
      {"bhqs,bqhk->bshk", {8, 4, 64, 64}, {8, 64, 4, 32}, {8, 64, 4, 32}},  // dK
      {"bhqs,bshk->bhqk", {8, 4, 64, 64}, {8, 64, 4, 32}, {8, 4, 64, 32}},
      {"ij,jk->ik", {33, 17}, {17, 9}, {33, 9}},
      {"ji,jk->ki", {17, 33}, {17, 9}, {9, 33}},                   // every operand transposed
      {"i,i->", {100}, {100}, {}},                                 // dot product
      {"i,j->ij", {5}, {7}, {5, 7}},                               // outer product (K = 1)
  };
}

}  // namespace

TEST_CASE("onednn einsum: the GPT example's einsums match Eigen and run on oneDNN", "[kernels][onednn]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("onednn einsum: the GPT example's einsums match Eigen and run on oneDNN", seed, 1);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  for (const Case& c : gpt_cases()) {
    INFO(c.eq);
    const bool ran = check_case(rng, c);
    // Every one of these maps onto a strided matmul: no fallback, no permuted copy.
    CHECK(ran == onednn_einsum_compiled());
  }
  // Two kernel threads (the projections are above the 2^25-flop threshold for threads).
  for (const Case& c : gpt_cases()) {
    INFO(c.eq << " on 2 threads");
    check_case(rng, c, DType::f32, 2);
  }
}

TEST_CASE("onednn einsum: fallbacks are exact Eigen runs", "[kernels][onednn]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("onednn einsum: fallbacks are exact Eigen runs", seed, 1);
  std::mt19937_64 rng(seed);
  INFO("seed " << seed);
  const std::vector<Case> declined = {
      {"ij,jk->i", {6, 5}, {5, 4}, {6}},                  // k summed out of B alone
      {"abk,bak->ab", {3, 4, 5}, {4, 3, 5}, {3, 4}},      // batch letters fine, but...
      {"mnk,kmn->", {2, 3, 4}, {4, 2, 3}, {}},            // K letters in different orders
      {"ak,ka->a", {0, 3}, {3, 0}, {0}},                  // empty
  };
  for (const Case& c : declined) {
    INFO(c.eq);
    const HostTensor a = rand_tensor(rng, DType::f32, c.a), b = rand_tensor(rng, DType::f32, c.b);
    bool ran = true;
    const HostTensor got = run(c, a, b, EinsumImpl::Auto, &ran);
    const HostTensor want = run(c, a, b, EinsumImpl::Eigen);
    // Batch letters in different orders are only strides: oneDNN may take that one.
    if (c.eq != "abk,bak->ab") CHECK_FALSE(ran);
    if (!ran) CHECK(same_bits(got, want));  // a declined einsum is the Eigen kernel, bit for bit
  }
  // f16 and mixed dtypes are never taken.
  const Case c{"ij,jk->ik", {4, 5}, {5, 6}, {4, 6}};
  const HostTensor a = rand_tensor(rng, DType::f16, c.a), b = rand_tensor(rng, DType::f16, c.b);
  bool ran = true;
  run(c, a, b, EinsumImpl::Auto, &ran);
  CHECK_FALSE(ran);
}

TEST_CASE("onednn einsum: random equations and layouts and sizes match Eigen", "[kernels][onednn][property]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(300);
  tessel_test::announce("onednn einsum: random equations and layouts and sizes match Eigen", seed, cases);
  std::mt19937_64 rng(seed);
  int taken = 0;
  for (int n = 0; n < cases; ++n) {
    // Letter groups: batch, M, N, K (0-2 letters each) and now and then a letter summed out
    // of A alone (never a matmul).
    std::string letters = "abcdefghijklmnop";
    std::shuffle(letters.begin(), letters.end(), rng);
    std::size_t next = 0;
    auto take = [&](int count) {
      std::string s = letters.substr(next, static_cast<std::size_t>(count));
      next += static_cast<std::size_t>(count);
      return s;
    };
    const std::string batch = take(int(rng() % 3)), m = take(int(rng() % 3)), nn = take(int(rng() % 3)),
                      k = take(int(rng() % 3)), only_a = take(rng() % 8 == 0 ? 1 : 0);
    int64_t size[128];
    for (char ch : letters) size[int(ch)] = 1 + int64_t(rng() % 6);
    // Layouts: half the cases keep each group's letters together (groups permuted as blocks:
    // oneDNN takes them); the others shuffle letters freely (mostly declined).
    const bool blocks = rng() % 2 == 0;
    auto layout = [&](std::vector<std::string> groups) {
      if (!blocks) {
        std::string s;
        for (const auto& g : groups) s += g;
        std::shuffle(s.begin(), s.end(), rng);
        return s;
      }
      std::shuffle(groups.begin(), groups.end(), rng);
      std::string s;
      for (const auto& g : groups) s += g;
      return s;
    };
    Case c;
    const std::string sa = layout({batch, m, k, only_a}), sb = layout({batch, k, nn}), sr = layout({batch, m, nn});
    c.eq = sa + "," + sb + "->" + sr;
    for (char ch : sa) c.a.push_back(size[int(ch)]);
    for (char ch : sb) c.b.push_back(size[int(ch)]);
    for (char ch : sr) c.out.push_back(size[int(ch)]);
    INFO("seed " << seed << " case " << n << ": " << c.eq << " " << shape_str(c.a) << " " << shape_str(c.b));
    const DType t = rng() % 4 == 0 ? DType::bf16 : DType::f32;
    if (check_case(rng, c, t, 1 + int(rng() % 2))) ++taken;
  }
  INFO("oneDNN took " << taken << " of " << cases);
  if (onednn_einsum_compiled()) CHECK(taken > cases / 5);
  else CHECK(taken == 0);
}

TEST_CASE("onednn einsum: concurrent calls from device threads give identical bits", "[kernels][onednn]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("onednn einsum: concurrent calls from device threads give identical bits", seed, 1);
  std::mt19937_64 rng(seed);
  for (const Case& c : gpt_cases()) {
    INFO(c.eq);
    const HostTensor a = rand_tensor(rng, DType::f32, c.a), b = rand_tensor(rng, DType::f32, c.b);
    const HostTensor want = run(c, a, b, EinsumImpl::Auto);
    std::vector<HostTensor> got(4, HostTensor(DType::f32, c.out));
    std::vector<std::thread> th;
    for (std::size_t i = 0; i < got.size(); ++i) th.emplace_back([&, i] { got[i] = run(c, a, b, EinsumImpl::Auto); });
    for (auto& t : th) t.join();
    for (const HostTensor& g : got) CHECK(same_bits(g, want));
  }
}

TEST_CASE("onednn einsum: a primitive's scratchpad counts against the device while it runs", "[kernels][onednn][memory]") {
  std::mt19937_64 rng(1);
  int64_t largest = 0;
  onednn_reset_scratchpad_high_water();
  for (const Case& c : gpt_cases()) {
    INFO(c.eq);
    MemoryMeter m;
    const HostTensor a = rand_tensor(rng, DType::f32, c.a), b = rand_tensor(rng, DType::f32, c.b);
    run(c, a, b, EinsumImpl::Auto, nullptr, 1, &m);
    CHECK(m.in_use() == 0);  // freed when the kernel returns
    largest = std::max(largest, m.high_water());
  }
  // The batched products (attention) run on matmul primitives (the others on sgemm, without a
  // scratchpad); whether a primitive asks for a scratchpad is oneDNN's choice for this CPU (an
  // Intel AVX2 box's did, an AMD EPYC's did not). The memory plan does not know of it, the
  // measurement must count exactly what was handed out.
  INFO("largest scratchpad oneDNN used: " << onednn_scratchpad_high_water() << " bytes");
  CHECK(largest == onednn_scratchpad_high_water());
  if (!onednn_einsum_compiled()) CHECK(largest == 0);
}
