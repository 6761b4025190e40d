// src/runtime/cpu/onednn_einsum.cpp — the CPU backend's two-operand einsum as one (batched)
// oneDNN matmul (built with TESSEL_WITH_ONEDNN; otherwise onednn_einsum always declines and
// the Eigen kernel in cpu_kernels_einsum.cpp runs).
//
// Mapping. The letters of `sa,sb->sr` fall into four groups: batch (in A, B and the result),
// M (A and result), N (B and result), K (A and B, summed). Letters of size 1 are dropped
// first (they carry no data). Each of M, N and K becomes one matmul dim: its letters must sit
// next to each other, in the same order, in both tensors that hold them, so that the group is
// one strided dim there. Batch letters stay separate dims of the matmul (oneDNN takes up to
// 12 dims) with their own strides, merged only where they are contiguous in all three. The
// tensors are then described to oneDNN as they lie in memory — src [batch.., M, K], weights
// [batch.., K, N], dst [batch.., M, N], each dim with its stride — so a transposed operand or
// result (`bqhk,bshk->bhqs`, `bhqs,bshk->bqhk`) costs no copy. Anything else returns false
// and the caller runs the Eigen kernel (which permutes into copies where it must).
//
// Primitives are created once per (dims, strides, dtype) and kept in a cache
// behind a mutex: many device threads run kernels at once, and creating a oneDNN primitive
// (JIT code generation) costs far more than a small product. A layout for which oneDNN only
// has its reference implementation (`ref:`) is cached as "declined": those are slower than
// Eigen. Scratchpads are per call (user mode): the library-managed scratchpad is shared by
// primitives of a thread and not meant for primitives executed on several threads at once.
//
// Threads. Debian's oneDNN uses OpenMP: a primitive takes omp_get_max_threads() threads, and
// every device thread that called it would fork a team of all cores whose threads spin at
// barriers. Every oneDNN call here runs with the calling thread's OpenMP thread count set to 1
// (creation included: the work split is fixed then); KernelArgs::num_threads > 1 splits the
// result's rows over plain threads instead, as the Eigen kernel does. Each block's summation
// order is fixed by its primitive, the split by (shape, num_threads): a given shape and thread
// count gives bit-identical results on every device (replicas agree bit for bit).
#include "onednn_einsum.hpp"

#include "tessel/ops/registry.hpp"

#if TESSEL_WITH_ONEDNN

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "onednn_common.hpp"
#include "onednn_ops.hpp"
#include "tessel/runtime/memory_meter.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {
namespace {

using dnnl::memory;
using onednn::cpu_engine;
using onednn::ScopedThreads;

bool cpu_has_bf16() {
  static const bool ok = [] {
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return ok;
}

// One tensor's view as a matmul operand: dims and strides in elements.
struct View {
  memory::dims dims, strides;
};

struct Entry {
  bool ok = false;  // false: oneDNN has no optimised implementation; run Eigen
  dnnl::matmul prim;
  memory::desc src, wei, dst, scratch;
  std::size_t scratch_bytes = 0;
  std::vector<memory::desc> binary;  // per post-op: the binary operand's desc (else empty)
};

// The post-ops of a fused_einsum's epilogue for one primitive: per step its kind, scale and,
// for a binary add, the operand's view in the dst's dims (broadcast dims of size 1).
struct PostOps {
  std::vector<EinsumEpilogue::Step> steps;
  std::vector<View> binary;  // per step (dims empty: not binary)
};

onednn::PrimitiveCache<Entry>& cache() {
  static onednn::PrimitiveCache<Entry> c;
  return c;
}

// Counters for onednn_primitive_counts (tests: a loaded program's runs create none).
std::atomic<long> g_created{0};
std::atomic<long> g_created_running{0};

std::shared_ptr<const Entry> create(const View& s, const View& w, const View& d, memory::data_type dt,
                                    bool running, const PostOps* post = nullptr) {
  onednn_count_creation(running);
  std::lock_guard<std::mutex> create_lock(onednn::creation_mutex());  // see onednn_common.hpp
  auto e = std::make_shared<Entry>();
  try {
    e->src = memory::desc(s.dims, dt, s.strides);
    e->wei = memory::desc(w.dims, dt, w.strides);
    e->dst = memory::desc(d.dims, dt, d.strides);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (post) {
      dnnl::post_ops ops;
      for (std::size_t i = 0; i < post->steps.size(); ++i) {
        const EinsumEpilogue::Step& st = post->steps[i];
        e->binary.emplace_back();
        switch (st.kind) {
          case EinsumEpilogue::Step::Kind::Add:
            e->binary.back() = memory::desc(post->binary[i].dims, dt, post->binary[i].strides);
            ops.append_binary(dnnl::algorithm::binary_add, e->binary.back());
            break;
          case EinsumEpilogue::Step::Kind::Gelu: ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f); break;
          case EinsumEpilogue::Step::Kind::Scale: ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, st.scale, 0.0f); break;
        }
      }
      attr.set_post_ops(ops);
    }
    ScopedThreads st(1);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->src, e->wei, e->dst), attr, cpu_engine(),
                                    /*allow_empty=*/true);
    if (!pd) return e;
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) return e;  // oneDNN's reference loops: slower than Eigen
    e->scratch = pd.scratchpad_desc();
    e->scratch_bytes = e->scratch.get_size();
    e->prim = dnnl::matmul(pd);
    e->ok = true;
  } catch (const dnnl::error&) {
    e->ok = false;  // a layout oneDNN rejects: Eigen runs it
  }
  return e;
}

// dnnl_sgemm's (row-major) description of src [rows, K] · wei [K, N] -> dst [rows, N], or
// ok = false when a stride pattern is not one it takes (no unit stride, or a leading dimension
// smaller than the dim it strides over).
struct Sgemm {
  bool ok = false;
  char ta = 'N', tb = 'N';
  int64_t lda = 0, ldb = 0, ldc = 0;
};

Sgemm sgemm_layout(const View& s, const View& w, const View& d, int64_t block_rows) {
  Sgemm g;
  auto operand = [](const View& v, int64_t rows, char& t, int64_t& ld) {
    if (v.strides[1] == 1 && v.strides[0] >= std::max<int64_t>(1, v.dims[1])) {
      t = 'N';
      ld = v.strides[0];
      return true;
    }
    if (v.strides[0] == 1 && v.strides[1] >= std::max<int64_t>(1, rows)) {
      t = 'T';
      ld = v.strides[1];
      return true;
    }
    return false;
  };
  if (d.strides[1] != 1 || d.strides[0] < std::max<int64_t>(1, d.dims[1])) return g;
  if (!operand(s, block_rows, g.ta, g.lda) || !operand(w, w.dims[0], g.tb, g.ldb)) return g;
  g.ldc = d.strides[0];
  g.ok = true;
  return g;
}

void append_view(std::string& key, const View& v) {
  for (std::size_t i = 0; i < v.dims.size(); ++i) key += fmt::format("{}:{},", v.dims[i], v.strides[i]);
  key += '|';
}

}  // namespace

bool onednn_einsum_compiled() { return true; }

namespace {
std::atomic<int64_t> g_scratch_high_water{0};
}  // namespace

int64_t onednn_scratchpad_high_water() { return g_scratch_high_water.load(); }
void onednn_reset_scratchpad_high_water() { g_scratch_high_water.store(0); }

OneDnnPrimitiveCounts onednn_primitive_counts() {
  return {g_created.load(std::memory_order_relaxed), g_created_running.load(std::memory_order_relaxed)};
}

void onednn_clear_primitive_cache() {
  cache().clear();
  onednn_clear_op_cache();
}

void onednn_count_creation(bool running) {
  g_created.fetch_add(1, std::memory_order_relaxed);
  if (running) g_created_running.fetch_add(1, std::memory_order_relaxed);
}

bool onednn_einsum(const KernelArgs& a, const std::string& sa, const std::string& sb, const std::string& sr,
                   bool prepare_only, const EinsumEpilogue* epilogue) {
  if (a.in.size() != 2) return false;
  const DType dt = a.out_dtype;
  if (epilogue && dt != DType::f32) return false;  // post-ops on f32 products only
  if (a.in_dtypes[0] != dt || a.in_dtypes[1] != dt) return false;
  memory::data_type mdt;
  if (dt == DType::f32) {
    mdt = memory::data_type::f32;
  } else if (dt == DType::bf16 && cpu_has_bf16()) {
    mdt = memory::data_type::bf16;
  } else {
    return false;
  }

  // Sizes and row-major strides of every letter in each tensor (0 = absent).
  int64_t size[128] = {};
  int64_t st_a[128] = {}, st_b[128] = {}, st_r[128] = {};
  auto fill = [&](const std::string& sub, const Shape& shp, int64_t* st) {
    int64_t acc = 1;
    for (std::size_t k = sub.size(); k-- > 0;) {
      size[int(sub[k])] = shp[k];
      st[int(sub[k])] = acc;
      acc *= shp[k];
    }
  };
  fill(sa, a.in_shapes[0], st_a);
  fill(sb, a.in_shapes[1], st_b);
  fill(sr, a.out_shape, st_r);
  for (const std::string* s : {&sa, &sb, &sr})
    for (char c : *s)
      if (size[int(c)] == 0) return false;  // empty: the Eigen kernel handles it

  // Letters of size 1 carry no data: drop them. Then classify: batch in the result's order,
  // M and K in A's, N in B's (the orders the groups must have to be one strided dim).
  auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  std::string batch, m, n, k;
  for (char c : sr)
    if (size[int(c)] != 1 && has(sa, c) && has(sb, c)) batch += c;
  for (char c : sa) {
    if (size[int(c)] == 1 || has(sb, c) == has(sr, c)) continue;  // size 1 or batch
    if (has(sr, c)) m += c;
    else k += c;
  }
  for (char c : sb) {
    if (size[int(c)] == 1 || has(sa, c)) continue;
    if (!has(sr, c)) return false;  // summed out of B alone: not a matmul
    n += c;
  }
  for (char c : sa)
    if (size[int(c)] != 1 && !has(sb, c) && !has(sr, c)) return false;  // summed out of A alone

  // A group of letters as one dim of tensor `st`: its letters (in the group's order) must be
  // contiguous there, each outer letter's stride = inner's stride * inner's size.
  auto group_stride = [&](const std::string& g, const int64_t* st, int64_t& stride) {
    if (g.empty()) return true;
    for (std::size_t i = 0; i + 1 < g.size(); ++i)
      if (st[int(g[i])] != st[int(g[i + 1])] * size[int(g[i + 1])]) return false;
    stride = st[int(g.back())];
    return true;
  };
  auto prod = [&](const std::string& g) {
    int64_t p = 1;
    for (char c : g) p *= size[int(c)];
    return p;
  };
  int64_t m_a = 0, m_r = 0, n_b = 0, n_r = 0, k_a = 0, k_b = 0;
  if (!group_stride(m, st_a, m_a) || !group_stride(m, st_r, m_r) || !group_stride(n, st_b, n_b) ||
      !group_stride(n, st_r, n_r) || !group_stride(k, st_a, k_a) || !group_stride(k, st_b, k_b))
    return false;
  const int64_t M = prod(m), N = prod(n), K = prod(k);

  // Batch dims in the result's order; adjacent ones merged where contiguous in all three.
  std::vector<std::string> bgroups;
  for (char c : batch) {
    if (!bgroups.empty()) {
      const char p = bgroups.back().back();
      const int64_t sz = size[int(c)];
      if (st_a[int(p)] == st_a[int(c)] * sz && st_b[int(p)] == st_b[int(c)] * sz &&
          st_r[int(p)] == st_r[int(c)] * sz) {
        bgroups.back() += c;
        continue;
      }
    }
    bgroups.push_back(std::string(1, c));
  }
  if (bgroups.size() + 2 > DNNL_MAX_NDIMS) return false;

  // A size-1 M/N/K dim (an empty group) gets the stride a dense layout would give it, so that
  // oneDNN recognises the plain layouts.
  View vs, vw, vd;
  for (const auto& g : bgroups) {
    const int64_t sz = prod(g);
    vs.dims.push_back(sz);
    vw.dims.push_back(sz);
    vd.dims.push_back(sz);
    vs.strides.push_back(st_a[int(g.back())]);
    vw.strides.push_back(st_b[int(g.back())]);
    vd.strides.push_back(st_r[int(g.back())]);
  }
  auto unit = [](int64_t& s_outer, int64_t& s_inner, bool outer_empty, bool inner_empty, int64_t inner_size) {
    if (outer_empty && inner_empty) {
      s_outer = 1;
      s_inner = 1;
    } else if (outer_empty) {
      s_outer = s_inner * inner_size;
    } else if (inner_empty) {
      s_inner = 1;
    }
  };
  unit(m_a, k_a, m.empty(), k.empty(), K);
  unit(k_b, n_b, k.empty(), n.empty(), N);
  unit(m_r, n_r, m.empty(), n.empty(), N);
  // oneDNN's optimised matmuls want the result's rows contiguous. A result stored transposed
  // (M innermost, e.g. `ji,jk->ki`) is computed as C^T = B^T A^T: the operands swap roles.
  const bool swap = n_r != 1 && m_r == 1;
  auto rows_cols = [](View& v, int64_t rows, int64_t row_stride, int64_t cols, int64_t col_stride) {
    v.dims.insert(v.dims.end(), {rows, cols});
    v.strides.insert(v.strides.end(), {row_stride, col_stride});
  };
  if (swap) {
    std::swap(vs, vw);
    rows_cols(vs, N, n_b, K, k_b);
    rows_cols(vw, K, k_a, M, m_a);
    rows_cols(vd, N, n_r, M, m_r);
  } else {
    rows_cols(vs, M, m_a, K, k_a);
    rows_cols(vw, K, k_b, N, n_b);
    rows_cols(vd, M, m_r, N, n_r);
  }

  // The epilogue's binary operands as views in the dst's dims: per result letter its stride in
  // the operand (0 where broadcast), each group of letters one dim (size 1 where the operand
  // is broadcast along the whole group; a group partly broadcast is not one dim: decline).
  std::vector<View> bin_views;
  if (epilogue) {
    for (const EinsumEpilogue::Step& step : epilogue->steps) {
      bin_views.emplace_back();
      if (step.kind != EinsumEpilogue::Step::Kind::Add) continue;
      const std::size_t k = static_cast<std::size_t>(step.operand);
      if (k >= epilogue->in_shapes.size()) return false;
      const Shape& os = epilogue->in_shapes[k];
      if (os.size() > sr.size()) return false;
      int64_t st_o[128] = {};
      int64_t acc = 1;
      for (std::size_t d = os.size(); d-- > 0;) {
        const std::size_t rd_ = d + (sr.size() - os.size());
        if (os[d] != 1) {
          if (os[d] != size[int(sr[rd_])]) return false;
          st_o[int(sr[rd_])] = acc;
        }
        acc *= os[d];
      }
      auto group_dim = [&](const std::string& g, View& v) {
        bool any = false, all = true;
        for (char c : g) {
          if (st_o[int(c)]) any = true;
          else all = false;
        }
        if (!any) {
          v.dims.push_back(1);
          v.strides.push_back(1);
          return true;
        }
        int64_t stride = 0;
        if (!all || !group_stride(g, st_o, stride)) return false;
        v.dims.push_back(prod(g));
        v.strides.push_back(stride);
        return true;
      };
      View& v = bin_views.back();
      for (const auto& g : bgroups)
        if (!group_dim(g, v)) return false;
      if (!(swap ? group_dim(n, v) && group_dim(m, v) : group_dim(m, v) && group_dim(n, v))) return false;
    }
  }

  // Threads: the result's rows split into `threads` equal blocks (the last one may be
  // shorter: a second primitive), each a single-threaded oneDNN call on a thread of its own,
  // as the Eigen kernel splits its GEMMs. Not oneDNN's OpenMP team: libgomp's threads spin at
  // barriers, and on a machine with more busy threads than cores (N device threads, other
  // processes) that made a 2-thread product up to 9x slower than one thread (measured,
  // docs/cpu-backend.md). Below 2^25 flops one thread, as in the Eigen kernel.
  const double flops = 2.0 * double(prod(batch)) * double(M) * double(N) * double(K);
  const std::size_t rd = vd.dims.size() - 2;  // the rows dim of src and dst
  const int64_t R = vd.dims[rd];
  const int64_t threads = flops < double(1 << 25) ? 1 : std::max<int64_t>(1, std::min<int64_t>(a.num_threads, R));
  const int64_t rows_per = (R + threads - 1) / threads;
  const int64_t blocks = (R + rows_per - 1) / rows_per;
  auto primitive = [&](int64_t rows) {
    View s2 = vs, d2 = vd;
    s2.dims[rd] = rows;
    d2.dims[rd] = rows;
    std::string key = dt == DType::f32 ? "f32|" : "bf16|";
    append_view(key, s2);
    append_view(key, vw);
    append_view(key, d2);
    PostOps post;
    if (epilogue) {
      post.steps = epilogue->steps;
      post.binary = bin_views;
      for (std::size_t i = 0; i < post.steps.size(); ++i) {
        const EinsumEpilogue::Step& st = post.steps[i];
        if (st.kind == EinsumEpilogue::Step::Kind::Add) {
          View& b = post.binary[i];
          if (b.dims[rd] != 1) b.dims[rd] = rows;
          key += "add:";
          append_view(key, b);
        } else {
          key += st.kind == EinsumEpilogue::Step::Kind::Gelu ? "gelu|" : fmt::format("scale:{}|", st.scale);
        }
      }
    }
    std::shared_ptr<const Entry> e = cache().find(key);
    if (!e) e = cache().insert(key, create(s2, vw, d2, mdt, /*running=*/!prepare_only, epilogue ? &post : nullptr));
    return e;
  };
  // A plain f32 matrix product (no batch dim; each operand with a unit stride in one of its
  // two dims, the result's rows contiguous) runs as oneDNN's dnnl_sgemm instead of a matmul
  // primitive: at the GPT's shapes sgemm ran 1-10% faster (BM_Matmul, docs/cpu-backend.md) and
  // it needs no primitive. Each block's summation order is fixed by (shape, block rows).
  Sgemm g = dt == DType::f32 && vd.dims.size() == 2 ? sgemm_layout(vs, vw, vd, rows_per) : Sgemm{};
  // An epilogue as post-ops needs the matmul primitive (sgemm has none). Where the plain
  // product runs as sgemm, the caller's sgemm + epilogue loop is faster: the primitive with
  // bias + gelu_tanh post-ops took 12-17% more CPU time than sgemm and a fused_elementwise
  // for the gpt example's and the GPT-2-small block's MLP (BM_FusionMlp, docs/cpu-backend.md).
  // So post-ops only where the product runs on a primitive anyway (batched products).
  if (epilogue && g.ok && !epilogue->force_primitive) return false;
  if (epilogue) g.ok = false;
  std::shared_ptr<const Entry> full, last;
  if (!g.ok) {
    full = primitive(rows_per);
    const int64_t last_rows = R - (blocks - 1) * rows_per;
    last = last_rows == rows_per ? full : primitive(last_rows);
    if (!full->ok || !last->ok) return false;
  }
  if (prepare_only) return true;

  const std::size_t esz = dtype_size(dt);
  const auto* src = static_cast<const std::byte*>(a.in[swap ? 1 : 0]);
  const void* wei = a.in[swap ? 0 : 1];
  auto* dst = static_cast<std::byte*>(a.out);
  auto run_block = [&](int64_t blk) {
    if (g.ok) {
      const int64_t r0 = blk * rows_per, rows = std::min(rows_per, R - r0);
      ScopedThreads st(1);
      const dnnl_status_t status =
          dnnl_sgemm(g.ta, g.tb, rows, vd.dims[1], vs.dims[1], 1.0f,
                     reinterpret_cast<const float*>(src) + r0 * vs.strides[0], g.lda, static_cast<const float*>(wei),
                     g.ldb, 0.0f, reinterpret_cast<float*>(dst) + r0 * vd.strides[0], g.ldc);
      if (status != dnnl_success) throw dnnl::error(status, "dnnl_sgemm");
      return;
    }
    const Entry& e = blk == blocks - 1 ? *last : *full;
    const int64_t r0 = blk * rows_per;
    const dnnl::engine& eng = cpu_engine();
    dnnl::stream strm(eng);
    memory ms(e.src, eng, const_cast<std::byte*>(src) + r0 * vs.strides[rd] * int64_t(esz));
    memory mw(e.wei, eng, const_cast<void*>(wei));
    memory md(e.dst, eng, dst + r0 * vd.strides[rd] * int64_t(esz));
    std::vector<float, AlignedAllocator<float>> scratch((e.scratch_bytes + sizeof(float) - 1) / sizeof(float));
    const MeteredBytes counted(a.scratch_meter, scratch.size() * sizeof(float));  // the device's, while it lives
    {
      const auto bytes = static_cast<int64_t>(scratch.size() * sizeof(float));
      int64_t hw = g_scratch_high_water.load();
      while (bytes > hw && !g_scratch_high_water.compare_exchange_weak(hw, bytes)) {
      }
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}};
    if (e.scratch_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratch, eng, scratch.data()));
    for (std::size_t i = 0; i < e.binary.size(); ++i) {
      if (!epilogue || epilogue->steps[i].kind != EinsumEpilogue::Step::Kind::Add) continue;
      const View& b = bin_views[i];
      const auto* base = static_cast<const std::byte*>(epilogue->in[static_cast<std::size_t>(epilogue->steps[i].operand)]);
      const int64_t off = b.dims[rd] == 1 ? 0 : r0 * b.strides[rd] * int64_t(esz);
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i)) | DNNL_ARG_SRC_1,
                   memory(e.binary[i], eng, const_cast<std::byte*>(base) + off));
    }
    ScopedThreads st(1);
    e.prim.execute(strm, args);
    strm.wait();
  };
  std::string error;
  std::mutex error_mu;
  auto guarded = [&](int64_t blk) {
    try {
      run_block(blk);
    } catch (const dnnl::error& err) {
      std::lock_guard<std::mutex> lock(error_mu);
      error = fmt::format("{} (status {})", err.what(), static_cast<int>(err.status));
    }
  };
  std::vector<std::thread> pool;
  int64_t spawned = 1;
  for (; spawned < blocks; ++spawned) {
    try {
      pool.emplace_back(guarded, spawned);
    } catch (...) {
      break;  // cannot spawn more threads: the calling thread does the rest
    }
  }
  guarded(0);
  for (int64_t blk = spawned; blk < blocks; ++blk) guarded(blk);
  for (auto& t : pool) t.join();
  if (!error.empty())
    throw RuntimeError(fmt::format("{}:{}: einsum '{}' on oneDNN: {}", __FILE__, __LINE__,
                                   a.attrs ? a.attrs->equation : std::string("?"), error));
  return true;
}

}  // namespace tessel

#else  // !TESSEL_WITH_ONEDNN

namespace tessel {

bool onednn_einsum_compiled() { return false; }

int64_t onednn_scratchpad_high_water() { return 0; }
void onednn_reset_scratchpad_high_water() {}

OneDnnPrimitiveCounts onednn_primitive_counts() { return {}; }

void onednn_clear_primitive_cache() {}

void onednn_count_creation(bool) {}

bool onednn_einsum(const KernelArgs&, const std::string&, const std::string&, const std::string&, bool,
                   const EinsumEpilogue*) {
  return false;
}

}  // namespace tessel

#endif
