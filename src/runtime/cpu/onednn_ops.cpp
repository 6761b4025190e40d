// src/runtime/cpu/onednn_ops.cpp — softmax, layer normalisation and GELU as oneDNN primitives
// (onednn_ops.hpp). Each tensor is given to oneDNN as a dense 2-d [rows, len] f32 tensor;
// primitives are created once per (op, rows, len, eps) under the process-wide creation lock
// and cached; every call runs single-threaded with a per-call scratchpad, for the reasons the
// einsum gives (onednn_einsum.cpp's header, docs/cpu-backend.md).
#include "onednn_ops.hpp"

#if TESSEL_WITH_ONEDNN

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "onednn_common.hpp"
#include "onednn_einsum.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/memory_meter.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {
namespace {

using dnnl::memory;

struct OpEntry {
  bool ok = false;  // false: no optimised implementation; the hand-written kernel runs
  dnnl::primitive prim;
  memory::desc data, stat, scratch;
  std::size_t scratch_bytes = 0;
};

onednn::PrimitiveCache<OpEntry>& op_cache() {
  static onednn::PrimitiveCache<OpEntry> c;
  return c;
}

enum class RowOp { Softmax, LayerNorm, Gelu };

// The primitive for `op` on a dense [rows, len] f32 tensor, created on first use.
std::shared_ptr<const OpEntry> row_primitive(RowOp op, int64_t rows, int64_t len, float eps, bool running) {
  const std::string key = fmt::format("{}|{}|{}|{}", static_cast<int>(op), rows, len, eps);
  if (auto e = op_cache().find(key)) return e;
  auto e = std::make_shared<OpEntry>();
  {
    std::lock_guard<std::mutex> lock(onednn::creation_mutex());
    onednn_count_creation(running);
    try {
      e->data = memory::desc({rows, len}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      onednn::ScopedThreads st(1);
      const auto& eng = onednn::cpu_engine();
      const auto inf = dnnl::prop_kind::forward_inference;
      auto finish = [&](const auto& pd) {
        if (!pd || std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return;  // reference loops
        e->scratch = pd.scratchpad_desc();
        e->scratch_bytes = e->scratch.get_size();
        e->ok = true;
      };
      if (op == RowOp::Softmax) {
        dnnl::softmax_forward::primitive_desc pd(dnnl::softmax_forward::desc(inf, e->data, 1), attr, eng, true);
        finish(pd);
        if (e->ok) e->prim = dnnl::softmax_forward(pd);
      } else if (op == RowOp::LayerNorm) {
        const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
        dnnl::layer_normalization_forward::primitive_desc pd(
            dnnl::layer_normalization_forward::desc(inf, e->data, eps, flags), attr, eng, true);
        finish(pd);
        if (e->ok) {
          e->stat = memory::desc({len}, memory::data_type::f32, memory::format_tag::a);
          e->prim = dnnl::layer_normalization_forward(pd);
        }
      } else {
        dnnl::eltwise_forward::primitive_desc pd(
            dnnl::eltwise_forward::desc(inf, dnnl::algorithm::eltwise_gelu_tanh, e->data, 0.0f, 0.0f), attr, eng,
            true);
        finish(pd);
        if (e->ok) e->prim = dnnl::eltwise_forward(pd);
      }
    } catch (const dnnl::error&) {
      e->ok = false;
    }
  }
  return op_cache().insert(key, std::move(e));
}

bool all_f32(const KernelArgs& a) {
  if (a.out_dtype != DType::f32) return false;
  for (DType d : a.in_dtypes)
    if (d != DType::f32) return false;
  return true;
}

void execute(const KernelArgs& a, const OpEntry& e, std::unordered_map<int, memory>& args, const char* op) {
  const dnnl::engine& eng = onednn::cpu_engine();
  std::vector<float, AlignedAllocator<float>> scratch((e.scratch_bytes + sizeof(float) - 1) / sizeof(float));
  const MeteredBytes counted(a.scratch_meter, scratch.size() * sizeof(float));  // the device's, while it lives
  if (e.scratch_bytes) args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratch, eng, scratch.data()));
  try {
    dnnl::stream strm(eng);
    onednn::ScopedThreads st(1);
    e.prim.execute(strm, args);
    strm.wait();
  } catch (const dnnl::error& err) {
    throw RuntimeError(fmt::format("{}:{}: {} on oneDNN: {} (status {})", __FILE__, __LINE__, op, err.what(),
                                   static_cast<int>(err.status)));
  }
}

memory wrap(const memory::desc& d, const void* p) {
  return memory(d, onednn::cpu_engine(), const_cast<void*>(p));
}

}  // namespace

void onednn_clear_op_cache() { op_cache().clear(); }

bool onednn_softmax(const KernelArgs& a, bool prepare_only) {
  if (a.in.size() != 1 || !all_f32(a) || a.attrs == nullptr) return false;
  const Shape& s = a.in_shapes[0];
  const int64_t r = static_cast<int64_t>(s.size());
  if (r == 0 || (a.attrs->axis != -1 && a.attrs->axis != r - 1)) return false;
  const int64_t len = s.back(), n = num_elements(s);
  if (len == 0 || n == 0) return false;
  const int64_t rows = n / len;
  auto e = row_primitive(RowOp::Softmax, rows, len, 0.0f, !prepare_only);
  if (!e->ok || prepare_only) return e->ok;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(e->data, a.in[0])}, {DNNL_ARG_DST, wrap(e->data, a.out)}};
  execute(a, *e, args, "softmax");
  // A row of -inf (fully masked) comes out NaN from exp(-inf - -inf); the kernel's definition
  // is zeros. Its first element tells (one strided read per row).
  const auto* x = static_cast<const float*>(a.in[0]);
  auto* y = static_cast<float*>(a.out);
  for (int64_t row = 0; row < rows; ++row) {
    if (!std::isnan(y[row * len])) continue;
    bool all_masked = true;
    for (int64_t j = 0; j < len && all_masked; ++j) all_masked = x[row * len + j] == -std::numeric_limits<float>::infinity();
    if (all_masked) std::fill(y + row * len, y + (row + 1) * len, 0.0f);
  }
  return true;
}

bool onednn_layer_norm(const KernelArgs& a, bool prepare_only) {
  if (a.in.size() != 3 || !all_f32(a) || a.attrs == nullptr) return false;
  const Shape& s = a.in_shapes[0];
  if (s.empty()) return false;
  const int64_t len = s.back(), n = num_elements(s);
  if (len == 0 || n == 0) return false;
  auto e = row_primitive(RowOp::LayerNorm, n / len, len, static_cast<float>(a.attrs->eps), !prepare_only);
  if (!e->ok || prepare_only) return e->ok;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(e->data, a.in[0])},
                                       {DNNL_ARG_DST, wrap(e->data, a.out)},
                                       {DNNL_ARG_SCALE, wrap(e->stat, a.in[1])},
                                       {DNNL_ARG_SHIFT, wrap(e->stat, a.in[2])}};
  execute(a, *e, args, "layer_norm");
  return true;
}

bool onednn_gelu(const KernelArgs& a, bool prepare_only) {
  if (a.in.size() != 1 || !all_f32(a)) return false;
  const int64_t n = num_elements(a.out_shape);
  if (n == 0) return false;
  // Any dense shape: one row of n (rows of up to 2^31 - 1: oneDNN's dims are int64 anyway).
  auto e = row_primitive(RowOp::Gelu, 1, n, 0.0f, !prepare_only);
  if (!e->ok || prepare_only) return e->ok;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(e->data, a.in[0])}, {DNNL_ARG_DST, wrap(e->data, a.out)}};
  execute(a, *e, args, "gelu");
  return true;
}

}  // namespace tessel

#else  // !TESSEL_WITH_ONEDNN

namespace tessel {

void onednn_clear_op_cache() {}
bool onednn_softmax(const KernelArgs&, bool) { return false; }
bool onednn_layer_norm(const KernelArgs&, bool) { return false; }
bool onednn_gelu(const KernelArgs&, bool) { return false; }

}  // namespace tessel

#endif
