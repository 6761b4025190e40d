// Einsum on the GPU: every two-operand einsum becomes one strided-batched GEMM through
// cuBLASLt, with the operands' transposes folded into the layouts.
//
// The mapping (letter classes, in-place operands and transposes, leading dimensions, batch
// strides, the padding of odd rows, the copy into the result) is a host function with no CUDA
// types, plan_einsum_gemm (gemm_plan.hpp), tested on the host against the CPU einsum kernel
// (tests/unit/test_gemm_plan.cpp); this file executes its plans.
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
#include "gemm_plan.hpp"

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
    for (void* p : ptrs) {
      try {
        be.free_scratch(p, *s);  // stream-ordered (or, without memory pools, after the stream)
      } catch (const Error&) {   // a destructor cannot throw: the stream's error reports it
        cudaGetLastError();
      }
    }
  }
};

}  // namespace

void run_cuda_einsum(CudaBackend& be, const KernelArgs& a, CudaStream* s) {
  if (!a.attrs) efail(a, "KernelArgs.attrs is null");
  const std::size_t nin = a.in.size();
  if (nin < 1 || nin > 2 || a.in_shapes.size() != nin || a.in_dtypes.size() != nin) efail(a, "takes 1 or 2 operands");
  const DType t = a.out_dtype;
  for (DType d : a.in_dtypes)
    if (d != t) efail(a, "operands and result must have one dtype (the backend casts mixed ones first)");
  const std::size_t es = dtype_size(t);
  const EinsumGemmPlan p =
      plan_einsum_gemm(a.attrs->equation, a.in_shapes, a.out_shape, es, be.options().gemm_pad_min_flops);
  using Kind = EinsumGemmPlan::Kind;
  if (p.kind == Kind::Empty) return;
  // An arrangement (gemm_plan.hpp) from src into the dense dst.
  auto arrange = [&](const GemmArrange& g, const void* src, void* dst) {
    if (!s) return;  // preparing: no kernel
    if (!g.sums()) {
      ck::strided_copy(src, dst, es, make_loop(g.shape, {contiguous_strides(g.shape), g.src_strides}), s->handle());
    } else {
      const ScopedScratch scratch(be, *s, ck::reduce_scratch_bytes(t, num_elements(g.shape),
                                                                   num_elements(g.summed_shape)));
      ck::reduce(ck::Reduce::Sum, src, dst, t, make_loop(g.shape, {g.src_strides}),
                 make_loop(g.summed_shape, {g.summed_strides}), scratch.get(), s->handle());
    }
  };
  if (p.kind == Kind::Unary) {
    arrange(p.unary, a.in[0], a.out);
    return;
  }
  if (p.kind == Kind::Zero) {
    if (s) ck::fill_bits(a.out, num_elements(a.out_shape), es, 0, s->handle());
    return;
  }
  Scratch scratch{be, s, {}};
  // cuBLASLt's operand g: arranged and/or zero-padded into scratch, else the einsum operand itself.
  auto operand = [&](const GemmOperand& g) {
    const void* ptr = a.in[static_cast<std::size_t>(g.source)];
    const int64_t B = p.batch;
    if (g.arrange) {
      void* dst = scratch.get(static_cast<std::size_t>(num_elements(g.arranged.shape)) * es);
      arrange(g.arranged, ptr, dst);
      ptr = dst;
    }
    if (g.pad) {
      const int64_t r = g.rows, c = g.cols, rp = g.padded_rows, cp = g.padded_cols;
      void* dst = scratch.get(static_cast<std::size_t>(B * rp * cp) * es);
      if (s) {
        ck::fill_bits(dst, B * rp * cp, es, 0, s->handle());
        ck::strided_copy(ptr, dst, es, make_loop({B, r, c}, {{rp * cp, cp, 1}, {r * c, c, 1}}), s->handle());
      }
      ptr = dst;
    }
    return ptr;
  };
  const void* lt_a = operand(p.a);
  const void* lt_b = operand(p.b);
  void* pc = p.c_in_result ? a.out : scratch.get(static_cast<std::size_t>(p.c_elements) * es);

  GemmKey key{};
  key.dtype = cuda_type(a, t);
  key.compute = t == DType::f32 && !be.options().allow_tf32 ? CUBLAS_COMPUTE_32F
                : t == DType::f32                           ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                            : CUBLAS_COMPUTE_32F;
  key.op_a = p.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.op_b = p.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  key.m = p.m, key.n = p.n, key.k = p.k;
  key.lda = p.a.ld, key.ldb = p.b.ld, key.ldc = p.ldc;
  key.batch = p.batch;
  key.stride_a = p.a.stride, key.stride_b = p.b.stride, key.stride_c = p.stride_c;
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
  if (!p.c_in_result)
    ck::strided_copy(pc, a.out, es, make_loop(a.out_shape, {contiguous_strides(a.out_shape), p.copy_out_strides}),
                     s->handle());
}

}  // namespace tessel::cuda
