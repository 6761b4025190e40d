// Einsum on the GPU: every two-operand einsum becomes one strided-batched GEMM through
// cuBLASLt, with the operands' transposes folded into the layouts.
//
// The letters split into batch (both operands and the result), free_a / free_b (one operand
// and the result), contract (both operands, not the result) and summed (one operand only).
// An operand already laid out as [batch, free, contract] or [batch, contract, free] is used in
// place: a row-major buffer read as column-major is the transpose, so only the op flag and the
// leading dimension change; otherwise it is permuted (or, with summed letters, reduced) into
// scratch once. Likewise the result is written in place when its letters are [batch, free_a,
// free_b] or [batch, free_b, free_a], else through scratch and one permutation.
//
// Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T[N,M] = B^T A^T, so cuBLASLt's "A" is our
// B and its "B" our A (unless C itself is stored transposed: then C = A B column-major).
//
// Precision: f32 uses CUBLAS_COMPUTE_32F (exact f32 products, TF32 off) unless
// CudaBackendOptions::allow_tf32; bf16 and f16 use f32 accumulation and scale type.
//
// Descriptors and the heuristic's algorithm are made per problem (types, shapes, layouts,
// alignments, workspace) and cached per backend: at load, by CudaBackend::prepare_kernel
// (run_cuda_einsum without a stream: every check and the plan, no kernel), for buffers at the
// 16-byte alignment the arena and the allocators give, so a step's einsums only look them up;
// a buffer less aligned at run time gets its own plan on its first product. One-operand
// einsums are a permutation or a reduction.
#include <cublasLt.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

#include "cuda_backend.hpp"
#include "cuda_loop.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel::cuda {

namespace ck = cuda_kernels;

#define TESSEL_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                               \
    cublasStatus_t _st = (expr);                                                                     \
    if (_st != CUBLAS_STATUS_SUCCESS)                                                                \
      throw RuntimeError(fmt::format("cublasLt: {} failed: {} ({}) at {}:{}", #expr,                 \
                                     cublasLtGetStatusString(_st), cublasLtGetStatusName(_st), __FILE__, __LINE__)); \
  } while (0)

namespace {

struct GemmKey {
  int dtype, compute;
  int op_a, op_b;
  int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  int align_a, align_b, align_c;
  std::size_t workspace;
  auto tie() const {
    return std::tie(dtype, compute, op_a, op_b, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c, align_a,
                    align_b, align_c, workspace);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~GemmPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int al = 16;
  while (al > 1 && (u % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

}  // namespace

struct GemmCache {
  cublasLtHandle_t handle = nullptr;
  std::mutex mu;
  std::map<GemmKey, std::unique_ptr<GemmPlan>> plans;

  const GemmPlan& plan(const GemmKey& key) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto p = std::make_unique<GemmPlan>();
    const auto dt = static_cast<cudaDataType_t>(key.dtype);
    TESSEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, static_cast<cublasComputeType_t>(key.compute), CUDA_R_32F));
    const auto ta = static_cast<cublasOperation_t>(key.op_a), tb = static_cast<cublasOperation_t>(key.op_b);
    TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Stored shapes (column-major): op(A) is m x k, op(B) is k x n, C is m x n.
    auto layout = [&](cublasLtMatrixLayout_t& l, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
      TESSEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, dt, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
      const int32_t batch = static_cast<int32_t>(key.batch);
      TESSEL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      TESSEL_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    };
    layout(p->a, ta == CUBLAS_OP_N ? key.m : key.k, ta == CUBLAS_OP_N ? key.k : key.m, key.lda, key.stride_a);
    layout(p->b, tb == CUBLAS_OP_N ? key.k : key.n, tb == CUBLAS_OP_N ? key.n : key.k, key.ldb, key.stride_b);
    layout(p->c, key.m, key.n, key.ldc, key.stride_c);
    cublasLtMatmulPreference_t pref = nullptr;
    TESSEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = key.workspace;
    uint32_t al_a = static_cast<uint32_t>(key.align_a), al_b = static_cast<uint32_t>(key.align_b),
             al_c = static_cast<uint32_t>(key.align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    TESSEL_CUBLAS_CHECK(st);
    if (returned == 0)
      throw RuntimeError(fmt::format("cublasLt: no algorithm for a {}x{}x{} GEMM (batch {}, type {}, alignments {}/{}/{})",
                                     key.m, key.n, key.k, key.batch, key.dtype, key.align_a, key.align_b, key.align_c));
    p->algo = result.algo;
    return *plans.emplace(key, std::move(p)).first->second;
  }
};

GemmCache* make_gemm_cache(int /*device*/) {
  auto c = std::make_unique<GemmCache>();
  TESSEL_CUBLAS_CHECK(cublasLtCreate(&c->handle));
  return c.release();
}

int64_t gemm_plan_count(GemmCache& c) {
  std::lock_guard<std::mutex> lk(c.mu);
  return static_cast<int64_t>(c.plans.size());
}

void destroy_gemm_cache(GemmCache* c) {
  if (!c) return;
  c->plans.clear();
  if (c->handle) cublasLtDestroy(c->handle);
  delete c;
}

namespace {

[[noreturn]] void efail(const KernelArgs& a, const std::string& why) {
  throw RuntimeError(fmt::format("cuda kernel einsum '{}': {}", a.attrs ? a.attrs->equation : std::string("?"), why));
}

cudaDataType_t cuda_type(const KernelArgs& a, DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: efail(a, "needs a float type, got i32");
  }
}

// Scratch freed on the stream when the scope ends (after the kernels that use it were enqueued).
// Without a stream (preparing at load) nothing is allocated: a stand-in address with the
// alignment the stream-ordered allocator gives, never dereferenced.
struct Scratch {
  CudaBackend& be;
  CudaStream* s;
  std::vector<void*> ptrs;
  void* get(std::size_t bytes) {
    if (!s) return reinterpret_cast<void*>(uintptr_t{256});
    ptrs.push_back(be.scratch(bytes, *s));
    return ptrs.back();
  }
  ~Scratch() {
    for (void* p : ptrs) cudaFreeAsync(p, s->handle());
  }
};

}  // namespace

void run_cuda_einsum(CudaBackend& be, const KernelArgs& a, CudaStream* s) {
  if (!a.attrs) efail(a, "KernelArgs.attrs is null");
  const std::size_t nin = a.in.size();
  if (nin < 1 || nin > 2 || a.in_shapes.size() != nin || a.in_dtypes.size() != nin) efail(a, "takes 1 or 2 operands");
  EinsumSpec eq;
  try {
    eq = parse_einsum(a.attrs->equation, static_cast<int>(nin));
  } catch (const Error& e) {
    efail(a, e.what());
  }
  const DType t = a.out_dtype;
  for (DType d : a.in_dtypes)
    if (d != t) efail(a, "operands and result must have one dtype (the backend casts mixed ones first)");
  const std::size_t es = dtype_size(t);
  int64_t size[128];
  std::fill(std::begin(size), std::end(size), int64_t{-1});
  std::vector<std::vector<int64_t>> strides_of(nin);  // per operand: stride of each of its letters
  for (std::size_t i = 0; i < nin; ++i) {
    const std::string& sub = eq.operands[i];
    if (sub.size() != a.in_shapes[i].size()) efail(a, fmt::format("operand {} subscript '{}' does not match its rank", i, sub));
    for (std::size_t d = 0; d < sub.size(); ++d) {
      int64_t& sz = size[int(sub[d])];
      if (sz >= 0 && sz != a.in_shapes[i][d]) efail(a, fmt::format("letter '{}' has sizes {} and {}", sub[d], sz, a.in_shapes[i][d]));
      sz = a.in_shapes[i][d];
    }
    strides_of[i] = contiguous_strides(a.in_shapes[i]);
  }
  if (eq.result.size() != a.out_shape.size()) efail(a, "result subscript does not match the result rank");
  for (std::size_t d = 0; d < eq.result.size(); ++d)
    if (size[int(eq.result[d])] != a.out_shape[d]) efail(a, fmt::format("result dim {} does not match the operands", d));
  auto prod = [&](const std::string& letters) {
    int64_t p = 1;
    for (char c : letters) p *= size[int(c)];
    return p;
  };
  auto shape_of = [&](const std::string& letters) {
    Shape sh;
    for (char c : letters) sh.push_back(size[int(c)]);
    return sh;
  };
  // Strides of `letters` inside operand i (its layout).
  auto strides_in = [&](std::size_t i, const std::string& letters) {
    std::vector<int64_t> st;
    for (char c : letters) st.push_back(strides_of[i][eq.operands[i].find(c)]);
    return st;
  };
  Scratch scratch{be, s, {}};
  // Operand i brought to the letter order `target`, summing `summed` out (scratch when needed).
  auto arrange = [&](std::size_t i, const std::string& target, const std::string& summed, void* dst) {
    if (!s) return;  // preparing: no kernel
    const Shape ts = shape_of(target);
    if (summed.empty()) {
      ck::strided_copy(a.in[i], dst, es, make_loop(ts, {contiguous_strides(ts), strides_in(i, target)}), s->handle());
    } else {
      ck::reduce(ck::Reduce::Sum, a.in[i], dst, t, make_loop(ts, {strides_in(i, target)}),
                 make_loop(shape_of(summed), {strides_in(i, summed)}), s->handle());
    }
  };

  if (nin == 1) {
    std::string summed;
    for (char c : eq.operands[0])
      if (eq.result.find(c) == std::string::npos) summed += c;
    arrange(0, eq.result, summed, a.out);
    return;
  }

  const std::string& sa = eq.operands[0];
  const std::string& sb = eq.operands[1];
  const std::string& sr = eq.result;
  auto has = [](const std::string& str, char c) { return str.find(c) != std::string::npos; };
  std::string batch, free_a, free_b, contract, sum_a, sum_b;
  for (char c : sr) {
    if (has(sa, c) && has(sb, c)) batch += c;
    else if (has(sa, c)) free_a += c;
    else free_b += c;
  }
  for (char c : sa)
    if (!has(sr, c)) (has(sb, c) ? contract : sum_a) += c;
  for (char c : sb)
    if (!has(sr, c) && !has(sa, c)) sum_b += c;
  const int64_t B = prod(batch), M = prod(free_a), N = prod(free_b), K = prod(contract);
  const int64_t out_n = num_elements(a.out_shape);
  if (out_n == 0) return;

  // A as [batch, M, K] (trans_a: [batch, K, M]); B as [batch, K, N] (trans_b: [batch, N, K]).
  auto prepare = [&](std::size_t i, const std::string& sub, const std::string& sum, const std::string& seq_n,
                     const std::string& seq_t, bool& trans) -> const void* {
    trans = false;
    if (sum.empty() && sub == seq_n) return a.in[i];
    if (sum.empty() && sub == seq_t) {
      trans = true;
      return a.in[i];
    }
    void* dst = scratch.get(static_cast<std::size_t>(prod(seq_n)) * es);
    arrange(i, seq_n, sum, dst);
    return dst;
  };
  bool trans_a = false, trans_b = false;
  const void* pa = prepare(0, sa, sum_a, batch + free_a + contract, batch + contract + free_a, trans_a);
  const void* pb = prepare(1, sb, sum_b, batch + contract + free_b, batch + free_b + contract, trans_b);
  const std::string seq_c = batch + free_a + free_b;
  bool trans_c = false;
  void* pc = a.out;
  if (sr != seq_c && sr == batch + free_b + free_a) trans_c = true;
  // The product goes to scratch when the result's letters are in another order (allocated below,
  // unless its rows are padded, which needs a scratch of its own).
  const bool c_scratch = sr != seq_c && !trans_c;

  std::map<char, int64_t> c_strides;  // strides of the product's letters in pc (set with padded rows)
  if (K == 0) {
    if (c_scratch) pc = scratch.get(static_cast<std::size_t>(out_n) * es);
    if (s) ck::fill_bits(pc, out_n, es, 0, s->handle());
  } else {
    GemmKey key{};
    key.dtype = cuda_type(a, t);
    key.compute = t == DType::f32 && !be.options().allow_tf32 ? CUBLAS_COMPUTE_32F
                  : t == DType::f32                           ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                              : CUBLAS_COMPUTE_32F;
    key.batch = B;
    const void *lt_a, *lt_b;
    if (!trans_c) {
      // Column-major D (N x M, ld N) = op(Bbuf) (N x K) * op(Abuf) (K x M).
      key.m = N, key.n = M, key.k = K, key.ldc = N;
      lt_a = pb;  // [K,N] row-major = N x K col-major (ld N): op N; [N,K] row-major = K x N (ld K): op T
      key.op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      key.lda = trans_b ? K : N;
      lt_b = pa;  // [M,K] row-major = K x M col-major (ld K): op N; [K,M] row-major = M x K (ld M): op T
      key.op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      key.ldb = trans_a ? M : K;
    } else {
      // Column-major D (M x N, ld M) = op(Abuf) (M x K) * op(Bbuf) (K x N).
      key.m = M, key.n = N, key.k = K, key.ldc = M;
      lt_a = pa;  // [M,K] row-major = K x M col-major: op T (ld K); [K,M] row-major = M x K: op N (ld M)
      key.op_a = trans_a ? CUBLAS_OP_N : CUBLAS_OP_T;
      key.lda = trans_a ? M : K;
      lt_b = pb;  // [K,N] row-major = N x K col-major: op T (ld N); [N,K] row-major = K x N: op N (ld K)
      key.op_b = trans_b ? CUBLAS_OP_N : CUBLAS_OP_T;
      key.ldb = trans_b ? K : N;
    }
    key.stride_a = trans_c ? M * K : K * N;  // cuBLASLt's A is our A only when C is transposed
    key.stride_b = trans_c ? K * N : M * K;
    key.stride_c = M * N;
    // 16-byte rows: cuBLASLt's fast kernels need every matrix's contiguous extent and leading
    // dimension to be a multiple of 16 bytes; with one odd (GPT-2's vocabulary of 50257) it falls
    // back to an align1 kernel (on an H200, 6.6 ms for the 8192x768x50257 LM head). A big enough
    // product then runs on zero-padded copies: m, n and k rounded up (zeros add nothing to the
    // sums; the padded rows and columns of the product are dropped by the copy out).
    const int64_t q = 16 / static_cast<int64_t>(es);
    auto up = [&](int64_t d) { return (d + q - 1) / q * q; };
    const bool pad = 2.0 * double(B) * double(M) * double(N) * double(K) >= be.options().gemm_pad_min_flops &&
                     (key.m % q || key.n % q || key.k % q);
    if (pad) {
      const int64_t mp = up(key.m), np = up(key.n), kp = up(key.k);
      // Operand stored row-major as [B, r, c] (dense): copied into a zeroed [B, rp, cp].
      auto widen = [&](const void*& p, int64_t r, int64_t c, int64_t rp, int64_t cp) {
        if (r == rp && c == cp) return;
        void* dst = scratch.get(static_cast<std::size_t>(B * rp * cp) * es);
        if (s) {
          ck::fill_bits(dst, B * rp * cp, es, 0, s->handle());
          ck::strided_copy(p, dst, es, make_loop({B, r, c}, {{rp * cp, cp, 1}, {r * c, c, 1}}), s->handle());
        }
        p = dst;
      };
      // op(A) is m x k: stored col-major m x k ([k][m] row-major) for N, k x m ([m][k]) for T.
      if (key.op_a == CUBLAS_OP_N) widen(lt_a, key.k, key.m, kp, mp);
      else widen(lt_a, key.m, key.k, mp, kp);
      // op(B) is k x n: stored [n][k] for N, [k][n] for T.
      if (key.op_b == CUBLAS_OP_N) widen(lt_b, key.n, key.k, np, kp);
      else widen(lt_b, key.k, key.n, kp, np);
      key.lda = key.op_a == CUBLAS_OP_N ? mp : kp;
      key.ldb = key.op_b == CUBLAS_OP_N ? kp : np;
      key.stride_a = mp * kp;
      key.stride_b = kp * np;
      key.m = mp, key.n = np, key.k = kp;
      key.ldc = mp;
      key.stride_c = mp * np;
      pc = scratch.get(static_cast<std::size_t>(B * key.stride_c) * es);  // every element written
    } else if (c_scratch) {
      pc = scratch.get(static_cast<std::size_t>(out_n) * es);
    }
    // The product's layout in pc: [batch, rows, ldc]; rows are C's n letters, columns its m.
    const std::string seq_rows = trans_c ? free_b : free_a, seq_cols = trans_c ? free_a : free_b;
    c_strides.clear();
    auto put = [&](const std::string& letters, int64_t scale) {
      const auto st = contiguous_strides(shape_of(letters));
      for (std::size_t i = 0; i < letters.size(); ++i) c_strides[letters[i]] = st[i] * scale;
    };
    put(batch, key.stride_c);
    put(seq_rows, key.ldc);
    put(seq_cols, 1);
    key.align_a = alignment_of(lt_a);
    key.align_b = alignment_of(lt_b);
    key.align_c = alignment_of(pc);
    // The workspace the stream will have: its size is part of the plan's key.
    std::size_t ws_bytes = be.options().gemm_workspace_bytes;
    void* ws = s ? s->gemm_workspace(ws_bytes) : nullptr;
    key.workspace = ws_bytes;
    GemmCache& cache = be.gemm();
    const GemmPlan& plan = cache.plan(key);
    if (!s) return;  // prepared: the descriptors and the algorithm are in the cache
    const float alpha = 1.0f, beta = 0.0f;
    TESSEL_CUBLAS_CHECK(cublasLtMatmul(cache.handle, plan.op, &alpha, lt_a, plan.a, lt_b, plan.b, &beta, pc, plan.c, pc,
                                       plan.c, &plan.algo, ws, ws_bytes, s->handle()));
  }
  if (!s) return;
  if (pc != a.out) {
    std::vector<int64_t> st;
    if (c_strides.empty()) {  // pc holds seq_c densely
      const auto cst = contiguous_strides(shape_of(seq_c));
      for (char c : sr) st.push_back(cst[seq_c.find(c)]);
    } else {
      for (char c : sr) st.push_back(c_strides.at(c));
    }
    ck::strided_copy(pc, a.out, es, make_loop(a.out_shape, {contiguous_strides(a.out_shape), st}), s->handle());
  }

}

}  // namespace tessel::cuda
