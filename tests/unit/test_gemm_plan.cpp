// tests/unit/test_gemm_plan.cpp — the CUDA backend's einsum -> cuBLASLt plan
// (src/runtime/cuda/gemm_plan.hpp) executed on the host and compared with the CPU einsum kernel.
//
// The host executor does what run_cuda_einsum does with a plan, with cuBLAS's semantics spelled
// out: the strided copies and sums into dense scratch, the zeroed padded copies, a column-major
// strided-batched GEMM (op N/T, leading dimensions, batch strides; cuBLAS's ld >= rows rule;
// every element it touches inside its buffer) and the final strided copy into the result.
// Scratch starts as NaN, so a read of something never written shows up in the result. No CUDA:
// the planner is part of tessel in every build.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../src/runtime/cuda/gemm_plan.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "test_util.hpp"

using namespace tessel;
using tessel::cuda::EinsumGemmPlan;
using tessel::cuda::GemmArrange;
using tessel::cuda::GemmOperand;

namespace {

using Buf = std::vector<float>;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Calls f(index) for every index of `shape` in row-major order.
template <class F>
void for_each_index(const Shape& shape, F f) {
  const int64_t n = num_elements(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

int64_t offset(const std::vector<int64_t>& idx, const std::vector<int64_t>& strides) {
  int64_t o = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) o += idx[d] * strides[d];
  return o;
}

// The host executor of a plan; `errors` collects what cuBLAS or a kernel would reject or where
// it would read or write outside a buffer.
struct HostExecutor {
  std::vector<std::string> errors;

  float read(const Buf& b, int64_t i, const char* what) {
    if (i < 0 || i >= static_cast<int64_t>(b.size())) {
      if (errors.size() < 5) errors.push_back(std::string(what) + " read at " + std::to_string(i) + " of " +
                                              std::to_string(b.size()));
      return kNaN;
    }
    return b[static_cast<std::size_t>(i)];
  }
  void write(Buf& b, int64_t i, float v, const char* what) {
    if (i < 0 || i >= static_cast<int64_t>(b.size())) {
      if (errors.size() < 5) errors.push_back(std::string(what) + " write at " + std::to_string(i) + " of " +
                                              std::to_string(b.size()));
      return;
    }
    b[static_cast<std::size_t>(i)] = v;
  }

  // dst (dense over g.shape) <- src, summing g.summed_shape out.
  void arrange(const GemmArrange& g, const Buf& src, Buf& dst) {
    if (g.src_strides.size() != g.shape.size() || g.summed_strides.size() != g.summed_shape.size())
      errors.push_back("an arrangement's strides do not match its shape");
    int64_t i = 0;
    for_each_index(g.shape, [&](const std::vector<int64_t>& idx) {
      const int64_t base = offset(idx, g.src_strides);
      double acc = 0;
      if (!g.sums()) acc = read(src, base, "arrange");
      else for_each_index(g.summed_shape, [&](const std::vector<int64_t>& j) {
          acc += read(src, base + offset(j, g.summed_strides), "sum");
        });
      write(dst, i++, static_cast<float>(acc), "arrange");
    });
  }

  // cuBLAS's operand g: the einsum operand, arranged and/or zero-padded into fresh scratch.
  Buf operand(const GemmOperand& g, const std::vector<Buf>& in, int64_t batch) {
    Buf cur = in.at(static_cast<std::size_t>(g.source));
    if (g.arrange) {
      Buf dst(static_cast<std::size_t>(num_elements(g.arranged.shape)), kNaN);
      arrange(g.arranged, cur, dst);
      cur = std::move(dst);
    }
    if (g.pad) {
      if (static_cast<int64_t>(cur.size()) != batch * g.rows * g.cols)
        errors.push_back("the padded copy's source is not a dense [batch, rows, cols]");
      if (g.padded_rows < g.rows || g.padded_cols < g.cols) errors.push_back("padding shrinks an operand");
      Buf dst(static_cast<std::size_t>(batch * g.padded_rows * g.padded_cols), 0.0f);
      for_each_index({batch, g.rows, g.cols}, [&](const std::vector<int64_t>& idx) {
        write(dst, offset(idx, {g.padded_rows * g.padded_cols, g.padded_cols, 1}),
              read(cur, offset(idx, {g.rows * g.cols, g.cols, 1}), "pad"), "pad");
      });
      cur = std::move(dst);
    }
    return cur;
  }

  // Column-major strided-batched C (m x n) = op(A) (m x k) * op(B) (k x n), cuBLAS's rules.
  void gemm(const EinsumGemmPlan& p, const Buf& A, const Buf& B, Buf& C) {
    const GemmOperand &a = p.a, &b = p.b;
    // cuBLAS: the leading dimension is at least the stored matrix's row count.
    if (a.ld < std::max<int64_t>(1, a.trans ? p.k : p.m)) errors.push_back("lda below op(A)'s stored rows");
    if (b.ld < std::max<int64_t>(1, b.trans ? p.n : p.k)) errors.push_back("ldb below op(B)'s stored rows");
    if (p.ldc < std::max<int64_t>(1, p.m)) errors.push_back("ldc below m");
    if (!errors.empty()) return;
    for (int64_t bi = 0; bi < p.batch; ++bi)
      for (int64_t j = 0; j < p.n; ++j)
        for (int64_t i = 0; i < p.m; ++i) {
          double acc = 0;
          for (int64_t l = 0; l < p.k; ++l) {
            const float x = read(A, bi * a.stride + (a.trans ? l + i * a.ld : i + l * a.ld), "gemm A");
            const float y = read(B, bi * b.stride + (b.trans ? j + l * b.ld : l + j * b.ld), "gemm B");
            acc += double(x) * double(y);
          }
          write(C, bi * p.stride_c + i + j * p.ldc, static_cast<float>(acc), "gemm C");
        }
  }

  // Runs plan p on operands `in` into a result of out_shape.
  Buf run(const EinsumGemmPlan& p, const std::vector<Buf>& in, const Shape& out_shape) {
    Buf out(static_cast<std::size_t>(num_elements(out_shape)), kNaN);
    using Kind = EinsumGemmPlan::Kind;
    switch (p.kind) {
      case Kind::Empty: break;
      case Kind::Unary: arrange(p.unary, in.at(0), out); break;
      case Kind::Zero: std::fill(out.begin(), out.end(), 0.0f); break;
      case Kind::Gemm: {
        const Buf A = operand(p.a, in, p.batch), B = operand(p.b, in, p.batch);
        if (p.c_in_result) {
          gemm(p, A, B, out);
        } else {
          Buf C(static_cast<std::size_t>(p.c_elements), kNaN);
          gemm(p, A, B, C);
          if (p.copy_out_strides.size() != out_shape.size()) errors.push_back("copy-out strides do not match the result");
          else {
            int64_t i = 0;
            for_each_index(out_shape, [&](const std::vector<int64_t>& idx) {
              write(out, i++, read(C, offset(idx, p.copy_out_strides), "copy out"), "copy out");
            });
          }
        }
        break;
      }
    }
    return out;
  }
};

// The CPU einsum kernel (run_cpu_kernel) in f32.
Buf cpu_einsum(const std::string& eq, const std::vector<Buf>& in, const std::vector<Shape>& shapes,
               const Shape& out_shape) {
  OpAttrs at;
  at.equation = eq;
  KernelArgs k;
  k.kind = OpKind::Einsum;
  k.attrs = &at;
  for (std::size_t i = 0; i < in.size(); ++i) {
    k.in.push_back(in[i].data());
    k.in_shapes.push_back(shapes[i]);
    k.in_dtypes.push_back(DType::f32);
  }
  Buf out(static_cast<std::size_t>(num_elements(out_shape)), kNaN);
  k.out = out.data();
  k.out_shape = out_shape;
  k.out_dtype = DType::f32;
  run_cpu_kernel(k);
  return out;
}

struct Coverage {
  int unary = 0, zero = 0, empty = 0, gemm = 0, padded = 0, pad_a = 0, pad_b = 0, arranged = 0, summed = 0,
      in_place_n = 0, in_place_t = 0, trans_c = 0, c_in_result = 0, c_copied = 0, bf16_quantum = 0;
};

// Plans `eq` with elem_size es and the padding threshold, runs the plan on the host and compares
// with the CPU kernel (|got - want| <= 1e-5 * (|a|·|b|) elementwise).
void check_plan(const std::string& eq, const std::vector<Shape>& shapes, const Shape& out_shape, std::size_t es,
                double pad_min_flops, std::mt19937_64& rng, Coverage& cov) {
  const EinsumGemmPlan p = tessel::cuda::plan_einsum_gemm(eq, shapes, out_shape, es, pad_min_flops);
  std::vector<Buf> in, abs_in;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    Buf b(static_cast<std::size_t>(num_elements(s)));
    for (float& x : b) x = d(rng);
    Buf ab = b;
    for (float& x : ab) x = std::fabs(x);
    in.push_back(std::move(b));
    abs_in.push_back(std::move(ab));
  }
  HostExecutor ex;
  const Buf got = ex.run(p, in, out_shape);
  INFO("plan: kind " << int(p.kind) << " m " << p.m << " n " << p.n << " k " << p.k << " lda " << p.a.ld << " ldb "
                     << p.b.ld << " ldc " << p.ldc << " batch " << p.batch << " strides " << p.a.stride << "/"
                     << p.b.stride << "/" << p.stride_c << " ops " << p.a.trans << p.b.trans << " padded " << p.padded
                     << " in result " << p.c_in_result);
  for (const auto& e : ex.errors) {
    INFO(e);
    CHECK(false);
  }
  const Buf want = cpu_einsum(eq, in, shapes, out_shape);
  const Buf scale = cpu_einsum(eq, abs_in, shapes, out_shape);
  int64_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool ok = std::isfinite(got[i]) && std::fabs(double(got[i]) - want[i]) <= 1e-5 * scale[i] + 1e-30;
    if (!ok && bad++ < 3) {
      INFO("element " << i << ": plan " << got[i] << ", cpu " << want[i]);
      CHECK(ok);
    }
  }
  CHECK(bad == 0);
  // The point of padding: every extent and leading dimension a multiple of 16 bytes.
  const int64_t q = 16 / static_cast<int64_t>(es);
  if (p.padded) {
    CHECK(pad_min_flops <= p.flops);
    CHECK((p.m % q == 0 && p.n % q == 0 && p.k % q == 0 && p.a.ld % q == 0 && p.b.ld % q == 0 && p.ldc % q == 0));
    CHECK_FALSE(p.c_in_result);
  }
  if (p.kind == EinsumGemmPlan::Kind::Gemm && !p.padded && pad_min_flops <= p.flops)
    CHECK((p.m % q == 0 && p.n % q == 0 && p.k % q == 0));  // nothing to pad
  // Coverage of the plan's paths.
  using Kind = EinsumGemmPlan::Kind;
  cov.unary += p.kind == Kind::Unary;
  cov.zero += p.kind == Kind::Zero;
  cov.empty += p.kind == Kind::Empty;
  if (p.kind != Kind::Gemm) return;
  ++cov.gemm;
  cov.padded += p.padded;
  cov.pad_a += p.a.pad;
  cov.pad_b += p.b.pad;
  cov.bf16_quantum += p.padded && es == 2;
  for (const GemmOperand* g : {&p.a, &p.b}) {
    cov.arranged += g->arrange;
    cov.summed += g->arrange && g->arranged.sums();
    // An operand used in place, in its canonical order (in_place_n) or transposed (in_place_t).
    if (!g->arrange) (g->trans == p.trans_c ? cov.in_place_n : cov.in_place_t) += 1;
  }
  cov.trans_c += p.trans_c;
  cov.c_in_result += p.c_in_result;
  cov.c_copied += !p.c_in_result;
}

}  // namespace

TEST_CASE("gemm plan: the mapping of a row-major matmul onto column-major cuBLASLt", "[kernels][cuda][gemm_plan]") {
  // mk,kn->mn with M=3, K=5, N=7: C^T (7 x 3, ld 7) = B^T (7 x 5, ld 7) * A^T (5 x 3, ld 5).
  auto p = tessel::cuda::plan_einsum_gemm("mk,kn->mn", {{3, 5}, {5, 7}}, {3, 7}, 4, 1e30);
  CHECK(p.kind == EinsumGemmPlan::Kind::Gemm);
  CHECK((p.m == 7 && p.n == 3 && p.k == 5 && p.ldc == 7 && p.stride_c == 21 && p.batch == 1));
  CHECK((p.a.source == 1 && !p.a.trans && !p.a.arrange && p.a.ld == 7));
  CHECK((p.b.source == 0 && !p.b.trans && !p.b.arrange && p.b.ld == 5));
  CHECK(p.c_in_result);
  // The result stored transposed: C = A B column-major, both operands read as transposes.
  p = tessel::cuda::plan_einsum_gemm("bmk,bkn->bnm", {{2, 3, 5}, {2, 5, 7}}, {2, 7, 3}, 4, 1e30);
  CHECK((p.trans_c && p.m == 3 && p.n == 7 && p.k == 5 && p.batch == 2 && p.ldc == 3 && p.stride_c == 21));
  CHECK((p.a.source == 0 && p.a.trans && p.a.ld == 5 && p.a.stride == 15));
  CHECK((p.b.source == 1 && p.b.trans && p.b.ld == 7 && p.b.stride == 35));
  // Forced padding of an f32 product (quantum 4): 7 x 3 x 5 -> 8 x 4 x 8, C through scratch.
  p = tessel::cuda::plan_einsum_gemm("mk,kn->mn", {{3, 5}, {5, 7}}, {3, 7}, 4, 0);
  CHECK((p.padded && p.m == 8 && p.n == 4 && p.k == 8 && p.a.ld == 8 && p.b.ld == 8 && p.ldc == 8));
  CHECK((p.a.pad && p.a.rows == 5 && p.a.cols == 7 && p.a.padded_rows == 8 && p.a.padded_cols == 8));
  CHECK((!p.c_in_result && p.c_elements == 32 && p.copy_out_strides == std::vector<int64_t>{8, 1}));
  // A letter summed out of one operand is reduced into scratch; a permuted operand is copied.
  p = tessel::cuda::plan_einsum_gemm("kms,nk->mn", {{5, 3, 2}, {7, 5}}, {3, 7}, 4, 1e30);
  CHECK((p.b.arrange && p.b.arranged.sums() && p.b.arranged.summed_shape == Shape{2}));
  CHECK((!p.a.arrange && p.a.trans));
  // Shapes that do not fit the equation are an error naming it.
  CHECK(tessel_test::contains(tessel_test::error_of([] {
                                tessel::cuda::plan_einsum_gemm("mk,kn->mn", {{3, 5}, {4, 7}}, {3, 7}, 4, 0);
                              }),
                              "cuda kernel einsum 'mk,kn->mn': letter 'k' has sizes 5 and 4"));
}

TEST_CASE("gemm plan: random einsums executed on a host GEMM emulator match the CPU kernel",
          "[kernels][cuda][gemm_plan][property]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(2000);
  tessel_test::announce("gemm plan: random einsums executed on a host GEMM emulator match the CPU kernel", seed, cases);
  std::mt19937_64 rng(seed);
  Coverage cov;
  const int64_t sizes[] = {1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17};
  for (int n = 0; n < cases; ++n) {
    std::string letters = "abcdefghijklmnopqrstuvwxyz";
    std::shuffle(letters.begin(), letters.end(), rng);
    std::size_t next = 0;
    auto take = [&](int count) {
      std::string s = letters.substr(next, static_cast<std::size_t>(count));
      next += static_cast<std::size_t>(count);
      return s;
    };
    const std::string batch = take(int(rng() % 3)), fa = take(int(rng() % 3)), fb = take(int(rng() % 3)),
                      k = take(int(rng() % 3)), sum_a = take(rng() % 5 == 0 ? 1 + int(rng() % 2) : 0),
                      sum_b = take(rng() % 6 == 0 ? 1 : 0);
    int64_t size[128] = {};
    std::string used = letters.substr(0, next);
    for (char ch : used) size[int(ch)] = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
    // Keep the work small: halve the largest letter until the whole index space is <= 40,000.
    auto space = [&] {
      int64_t s = 1;
      for (char ch : used) s *= size[int(ch)];
      return s;
    };
    while (space() > 40000) {
      char big = used[0];
      for (char ch : used)
        if (size[int(ch)] > size[int(big)]) big = ch;
      size[int(big)] = (size[int(big)] + 1) / 2;
    }
    if (!used.empty() && rng() % 40 == 0) size[int(used[rng() % used.size()])] = 0;  // an empty dim now and then
    // Layouts: the orders used in place (as N or T), groups permuted as blocks, or letters shuffled.
    auto layout = [&](std::vector<std::string> groups, const std::string& extra) {
      std::string s;
      switch (rng() % 4) {
        case 0: break;                                     // batch, first, second
        case 1: std::swap(groups[1], groups[2]); break;    // batch, second, first
        case 2: std::shuffle(groups.begin(), groups.end(), rng); break;
        default: break;
      }
      for (const auto& g : groups) s += g;
      if (!extra.empty()) s.insert(rng() % (s.size() + 1), extra);
      if (rng() % 4 == 3) std::shuffle(s.begin(), s.end(), rng);
      return s;
    };
    std::string eq;
    std::vector<Shape> shapes;
    Shape out;
    auto shape_of = [&](const std::string& sub) {
      Shape sh;
      for (char ch : sub) sh.push_back(size[int(ch)]);
      return sh;
    };
    if (rng() % 8 == 0) {  // one operand: a permutation or a sum
      const std::string sr = layout({batch, fa, fb}, ""), sa = layout({batch + fa, fb, k}, sum_a);
      eq = sa + "->" + sr;
      shapes = {shape_of(sa)};
      out = shape_of(sr);
    } else {
      const std::string sa = layout({batch, fa, k}, sum_a), sb = layout({batch, k, fb}, sum_b),
                        sr = layout({batch, fa, fb}, "");
      eq = sa + "," + sb + "->" + sr;
      shapes = {shape_of(sa), shape_of(sb)};
      out = shape_of(sr);
    }
    const std::size_t es = rng() % 3 == 0 ? 2 : 4;  // bf16's padding quantum (8) or f32's (4)
    std::string dims;
    for (const auto& s : shapes) dims += shape_str(s) + " ";
    INFO("seed " << seed << " case " << n << ": " << eq << " " << dims << "elem " << es);
    {
      INFO("padding forced on");
      check_plan(eq, shapes, out, es, 0.0, rng, cov);
    }
    {
      INFO("padding off");
      check_plan(eq, shapes, out, es, std::numeric_limits<double>::infinity(), rng, cov);
    }
  }
  std::printf("gemm plan coverage: %d plans, %d GEMMs (%d padded: %d A, %d B, %d at bf16's quantum), %d unary, "
              "%d zero, %d empty; operands arranged %d (summed %d), in place %d canonical %d transposed; C transposed "
              "%d, in the result %d, copied out %d\n",
              2 * cases, cov.gemm, cov.padded, cov.pad_a, cov.pad_b, cov.bf16_quantum, cov.unary, cov.zero, cov.empty,
              cov.arranged, cov.summed, cov.in_place_n, cov.in_place_t, cov.trans_c, cov.c_in_result, cov.c_copied);
  INFO("coverage: gemm " << cov.gemm << " unary " << cov.unary << " zero " << cov.zero << " empty " << cov.empty
                         << " padded " << cov.padded << " (a " << cov.pad_a << ", b " << cov.pad_b << ", bf16 "
                         << cov.bf16_quantum << ") arranged " << cov.arranged << " summed " << cov.summed
                         << " in place N " << cov.in_place_n << " T " << cov.in_place_t << " trans_c " << cov.trans_c
                         << " C in result " << cov.c_in_result << " copied " << cov.c_copied);
  if (cases >= 1000) {  // every path of the plan taken
    CHECK(cov.unary > 0);
    CHECK(cov.zero > 0);
    CHECK(cov.empty > 0);
    CHECK(cov.padded > 0);
    CHECK(cov.pad_a > 0);
    CHECK(cov.pad_b > 0);
    CHECK(cov.bf16_quantum > 0);
    CHECK(cov.arranged > 0);
    CHECK(cov.summed > 0);
    CHECK(cov.in_place_n > 0);
    CHECK(cov.in_place_t > 0);
    CHECK(cov.trans_c > 0);
    CHECK(cov.c_in_result > 0);
    CHECK(cov.c_copied > 0);
  }
}
