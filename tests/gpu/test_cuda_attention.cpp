// GPU tests of fused attention's CUDA kernels (src/runtime/cuda/kernels/attention.cu; label gpu, skipped without a
// GPU, failing with TESSEL_REQUIRE_GPU=1): the forward (out, lse) and the backward (dq, dk, dv)
// against the CPU kernels (src/runtime/cpu/cpu_kernels_attention.cpp, the oracle) element by
// element on the same operands:
//  * f32, bf16 and f16; head_dim 4, 16 (the generic kernels), 64 and 128 (tensor cores for bf16
//    and f16); layouts bhsd and bshd; causal and not; sequences off every tile size, Sk = Sq and
//    Sk > Sq (the causal mask aligned to the end);
//  * long sequences (1024) at head_dim 64 and 128 in bf16, causal;
//  * operands 2 bytes off 16-byte alignment: bf16/f16 at head_dim 64/128 then take the generic
//    kernels (the tensor-core path's cp.async needs 16-byte aligned rows);
//  * the backward ten times: bit-identical results (no atomics: the GPU round checks this too);
//  * a head_dim above the kernels' limit is an error naming it.
// Tolerances (max-norm relative error, floored at the largest operand: compare()): f32 1e-5
// (summation order); bf16 1e-2 and f16 2e-3, the tensor-core path rounding P and dS to the
// operand type for the MMAs as FlashAttention-2 does (the emulated kernels show ~1e-3 and ~2e-4:
// tests/unit/test_cuda_attention_plan.cpp); lse 1e-5 on every path (f32 scores).
// Seeds: TESSEL_SEED reproduces (printed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../unit/kernel_check.hpp"
#include "../unit/test_util.hpp"
#include "gpu_test_util.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/kernels.hpp"

using namespace tessel;

namespace {

using tessel_test::KernelDevice;

struct Case {
  DType dt;
  int64_t B, H, Sq, Sk, D;
  bool causal, bshd;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.dt)) + " [" + std::to_string(c.B) + "," + std::to_string(c.H) + "," +
         std::to_string(c.Sq) + "/" + std::to_string(c.Sk) + "," + std::to_string(c.D) + "] " +
         (c.bshd ? "bshd" : "bhsd") + (c.causal ? " causal" : "");
}

Shape shape_of(const Case& c, int64_t S) { return c.bshd ? Shape{c.B, S, c.H, c.D} : Shape{c.B, c.H, S, c.D}; }

OpAttrs attrs_of(const Case& c) {
  OpAttrs a;
  a.equation = c.bshd ? "bshd" : "bhsd";
  a.causal = c.causal;
  a.scalar = 1.0 / std::sqrt(static_cast<double>(c.D));
  return a;
}

HostTensor random_tensor(DType dt, const Shape& s, std::mt19937_64& rng, double lo, double hi) {
  HostTensor t(dt, s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

KernelArgs args_of(OpKind kind, const OpAttrs& attrs, const std::vector<const void*>& in,
                   const std::vector<HostTensor>& in_types, const std::vector<void*>& out,
                   const std::vector<std::pair<DType, Shape>>& out_types) {
  KernelArgs a;
  a.kind = kind;
  a.attrs = &attrs;
  for (std::size_t i = 0; i < in.size(); ++i) {
    a.in.push_back(in[i]);
    a.in_shapes.push_back(in_types[i].shape());
    a.in_dtypes.push_back(in_types[i].dtype());
  }
  a.out = out[0];
  a.out_dtype = out_types[0].first;
  a.out_shape = out_types[0].second;
  for (std::size_t r = 1; r < out.size(); ++r) {
    a.extra_out.push_back(out[r]);
    a.extra_out_dtypes.push_back(out_types[r].first);
    a.extra_out_shapes.push_back(out_types[r].second);
  }
  return a;
}

// The CPU kernel of `kind` on `in`: results of `types`.
std::vector<HostTensor> on_cpu(OpKind kind, const OpAttrs& attrs, const std::vector<HostTensor>& in,
                               const std::vector<std::pair<DType, Shape>>& types) {
  Op op;
  op.kind = kind;
  op.attrs = attrs;
  return tessel_test::cpu_kernel(op, in, types);
}

// The CUDA kernel of `kind` on `in` (uploaded), results poisoned first, downloaded. `shift` bytes
// into each buffer (2: pointers off 16-byte alignment, which sends bf16/f16 to the generic kernels).
std::vector<HostTensor> on_gpu(KernelDevice& dev, OpKind kind, const OpAttrs& attrs, const std::vector<HostTensor>& in,
                               const std::vector<std::pair<DType, Shape>>& types, std::size_t shift = 0) {
  std::vector<std::shared_ptr<Buffer>> din, dout;
  std::vector<const void*> ip;
  std::vector<void*> op;
  for (const HostTensor& t : in) {
    std::vector<char> bytes(t.bytes() + shift, 0);
    std::memcpy(bytes.data() + shift, t.data(), t.bytes());
    din.push_back(dev.be->allocate(bytes.size()));
    dev.be->copy_from_host(*din.back(), bytes.data(), bytes.size(), *dev.s);
    dev.s->synchronize();
    ip.push_back(static_cast<const char*>(din.back()->data()) + shift);
  }
  for (const auto& [dt, s] : types) {
    dout.push_back(dev.be->allocate(static_cast<std::size_t>(num_elements(s)) * dtype_size(dt) + shift));
    dev.be->poison(*dout.back(), dt, *dev.s);
    op.push_back(static_cast<char*>(dout.back()->data()) + shift);
  }
  dev.be->run_kernel(args_of(kind, attrs, ip, in, op, types), *dev.s);
  dev.s->synchronize();
  std::vector<HostTensor> out;
  for (std::size_t r = 0; r < types.size(); ++r) {
    out.emplace_back(types[r].first, types[r].second);
    std::vector<char> bytes(out.back().bytes() + shift);
    dev.be->copy_to_host(bytes.data(), *dout[r], bytes.size(), *dev.s);
    dev.s->synchronize();
    std::memcpy(out.back().data(), bytes.data() + shift, out.back().bytes());
  }
  return out;
}

double tolerance(const Case& c) { return c.dt == DType::f32 ? 1e-5 : c.dt == DType::bf16 ? 1e-2 : 2e-3; }

// The forward and the backward of c on the GPU against the CPU.
void check_case(KernelDevice& dev, const Case& c, uint64_t seed, std::size_t shift = 0) {
  INFO(describe(c) << " seed " << seed << (shift ? " (operands off 16-byte alignment)" : ""));
  std::mt19937_64 rng(seed);
  const OpAttrs attrs = attrs_of(c);
  const Shape qs = shape_of(c, c.Sq), ks = shape_of(c, c.Sk), ls{c.B, c.H, c.Sq};
  const std::vector<HostTensor> in = {random_tensor(c.dt, qs, rng, -2, 2), random_tensor(c.dt, ks, rng, -2, 2),
                                      random_tensor(c.dt, ks, rng, -1, 1)};
  const std::vector<std::pair<DType, Shape>> ftypes = {{c.dt, qs}, {DType::f32, ls}};
  const std::vector<HostTensor> want = on_cpu(OpKind::Attention, attrs, in, ftypes);
  const std::vector<HostTensor> got = on_gpu(dev, OpKind::Attention, attrs, in, ftypes, shift);
  const double floor = max_abs(in);
  for (std::size_t r = 0; r < 2; ++r) {
    const CompareResult cmp = compare(got[r], want[r], floor);
    INFO((r == 0 ? "out " : "lse ") << cmp.to_string());
    CHECK(cmp.max_rel_err <= (r == 0 ? tolerance(c) : 1e-5));
  }
  // The backward on the CPU's forward results: the same operands on both sides.
  const std::vector<HostTensor> bin = {in[0], in[1], in[2], want[0], want[1], random_tensor(c.dt, qs, rng, -1, 1)};
  const std::vector<std::pair<DType, Shape>> btypes = {{c.dt, qs}, {c.dt, ks}, {c.dt, ks}};
  const std::vector<HostTensor> bwant = on_cpu(OpKind::AttentionGrad, attrs, bin, btypes);
  const std::vector<HostTensor> bgot = on_gpu(dev, OpKind::AttentionGrad, attrs, bin, btypes, shift);
  const double bfloor = max_abs(bin);
  const char* names[] = {"dq", "dk", "dv"};
  for (std::size_t r = 0; r < 3; ++r) {
    const CompareResult cmp = compare(bgot[r], bwant[r], bfloor);
    INFO(names[r] << " " << cmp.to_string());
    CHECK(cmp.max_rel_err <= tolerance(c));
  }
}

}  // namespace

TEST_CASE("attention kernels == CPU kernels over dtypes and head dims and layouts and masks and Sk > Sq", "[gpu][attention]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: attention kernels == CPU kernels", seed, 96);
  KernelDevice dev(make_cuda_backend());
  std::mt19937_64 rng(seed);
  int n = 0;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t D : {4, 16, 64, 128})
      for (bool bshd : {false, true})
        for (bool causal : {false, true}) {
          // Lengths off the tiles (128/64/32/16); every other case with more keys than queries.
          const int64_t Sq = 77 + 50 * (n % 3), Sk = Sq + (n % 2 ? 0 : 45 + 20 * (n % 5));
          check_case(dev, {dt, 2, 3, Sq, Sk, D, causal, bshd}, rng());
          ++n;
        }
}

TEST_CASE("attention kernels == CPU kernels at 1024 tokens", "[gpu][attention]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: attention kernels == CPU kernels at 1024 tokens", seed, 4);
  KernelDevice dev(make_cuda_backend());
  std::mt19937_64 rng(seed);
  check_case(dev, {DType::bf16, 1, 4, 1024, 1024, 64, true, true}, rng());
  check_case(dev, {DType::bf16, 1, 2, 1024, 1024, 128, true, false}, rng());
  check_case(dev, {DType::f16, 1, 2, 1000, 1024, 64, true, true}, rng());
  check_case(dev, {DType::bf16, 1, 2, 1024, 1024, 64, false, true}, rng());
}

TEST_CASE("attention on operands off 16-byte alignment (the generic kernels) == CPU kernels", "[gpu][attention]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: attention on misaligned operands == CPU kernels", seed, 2);
  KernelDevice dev(make_cuda_backend());
  std::mt19937_64 rng(seed);
  check_case(dev, {DType::bf16, 1, 2, 90, 130, 64, true, true}, rng(), 2);
  check_case(dev, {DType::f16, 1, 2, 70, 70, 128, false, false}, rng(), 2);
}

TEST_CASE("attention_grad on CUDA is bit-identical over 10 runs", "[gpu][attention]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("gpu: attention_grad on CUDA is bit-identical over 10 runs", seed, 3);
  KernelDevice dev(make_cuda_backend());
  std::mt19937_64 rng(seed);
  // The tensor-core path (bf16, 64 and 128) and the generic one (f32, 16).
  for (const Case& c : {Case{DType::bf16, 2, 4, 300, 300, 64, true, true}, Case{DType::f16, 1, 3, 200, 260, 128, true, false},
                        Case{DType::f32, 2, 2, 150, 150, 16, false, true}}) {
    INFO(describe(c));
    const OpAttrs attrs = attrs_of(c);
    const Shape qs = shape_of(c, c.Sq), ks = shape_of(c, c.Sk), ls{c.B, c.H, c.Sq};
    const std::vector<HostTensor> in = {random_tensor(c.dt, qs, rng, -2, 2), random_tensor(c.dt, ks, rng, -2, 2),
                                        random_tensor(c.dt, ks, rng, -1, 1)};
    const std::vector<HostTensor> fwd = on_gpu(dev, OpKind::Attention, attrs, in, {{c.dt, qs}, {DType::f32, ls}});
    const std::vector<HostTensor> bin = {in[0], in[1], in[2], fwd[0], fwd[1], random_tensor(c.dt, qs, rng, -1, 1)};
    const std::vector<std::pair<DType, Shape>> btypes = {{c.dt, qs}, {c.dt, ks}, {c.dt, ks}};
    const std::vector<HostTensor> first = on_gpu(dev, OpKind::AttentionGrad, attrs, bin, btypes);
    for (int run = 1; run < 10; ++run) {
      const std::vector<HostTensor> again = on_gpu(dev, OpKind::AttentionGrad, attrs, bin, btypes);
      for (std::size_t r = 0; r < 3; ++r) {
        INFO("run " << run << " result " << r);
        REQUIRE(again[r].bytes() == first[r].bytes());
        CHECK(std::memcmp(again[r].data(), first[r].data(), first[r].bytes()) == 0);
      }
    }
    // And the forward.
    const std::vector<HostTensor> fwd2 = on_gpu(dev, OpKind::Attention, attrs, in, {{c.dt, qs}, {DType::f32, ls}});
    for (std::size_t r = 0; r < 2; ++r) CHECK(std::memcmp(fwd2[r].data(), fwd[r].data(), fwd[r].bytes()) == 0);
  }
}

TEST_CASE("attention with a head_dim above the CUDA kernels' limit is an error naming it", "[gpu][attention]") {
  KernelDevice dev(make_cuda_backend());
  const Case c{DType::f32, 1, 1, 8, 8, 300, false, false};
  std::mt19937_64 rng(1);
  const Shape s = shape_of(c, 8);
  const std::vector<HostTensor> in = {random_tensor(c.dt, s, rng, -1, 1), random_tensor(c.dt, s, rng, -1, 1),
                                      random_tensor(c.dt, s, rng, -1, 1)};
  CHECK_THROWS_WITH(on_gpu(dev, OpKind::Attention, attrs_of(c), in, {{c.dt, s}, {DType::f32, {1, 1, 8}}}),
                    Catch::Contains("head_dim 300"));
}
