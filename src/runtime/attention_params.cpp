// src/runtime/attention_params.cpp — the attention kernels' shared host-side checks and
// parameters (attention_params.hpp).
#include "attention_params.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_fail.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {
namespace {

[[noreturn]] void fail(const KernelArgs& a, const char* backend, const std::string& why) { kernel_fail(a, backend, why); }

}  // namespace

double AttentionParams::forward_flops() const {
  double pairs = 0;
  if (!causal) pairs = static_cast<double>(Sq) * static_cast<double>(Sk);
  else
    pairs = static_cast<double>(Sq) * (static_cast<double>(Sq) + 1) / 2 + static_cast<double>(Sq) * static_cast<double>(offset);
  return 4.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(D) * pairs;
}

AttentionParams attention_params(const KernelArgs& a, const char* backend) {
  const bool bwd = a.kind == OpKind::AttentionGrad;
  if (a.kind != OpKind::Attention && !bwd) fail(a, backend, "not an attention kernel");
  if (!a.attrs) fail(a, backend, "KernelArgs.attrs is null (the layout, mask and scale are attributes)");
  const std::size_t n_in = bwd ? 6 : 3, n_extra = bwd ? 2 : 1;
  if (a.in.size() != n_in || a.in_shapes.size() != n_in || a.in_dtypes.size() != n_in)
    fail(a, backend, fmt::format("expected {} operands with shapes and dtypes, got {} / {} / {}", n_in, a.in.size(),
                                 a.in_shapes.size(), a.in_dtypes.size()));
  if (a.extra_out.size() != n_extra || a.extra_out_shapes.size() != n_extra || a.extra_out_dtypes.size() != n_extra)
    fail(a, backend, fmt::format("expected {} extra results, got {}", n_extra, a.extra_out.size()));
  const OpAttrs& at = *a.attrs;
  AttentionParams p;
  if (at.equation != "bhsd" && at.equation != "bshd")
    fail(a, backend, fmt::format("layout \"{}\" is not \"bhsd\" or \"bshd\"", at.equation));
  p.bshd = at.equation == "bshd";
  const Shape& q = a.in_shapes[0];
  const Shape& k = a.in_shapes[1];
  if (q.size() != 4 || k.size() != 4 || a.in_shapes[2] != k) fail(a, backend, "q, k and v must be rank 4, k and v of one shape");
  p.dtype = a.in_dtypes[0];
  if (p.dtype == DType::i32) fail(a, backend, "needs floating-point q, k and v");
  for (std::size_t i = 1; i < 3; ++i)
    if (a.in_dtypes[i] != p.dtype) fail(a, backend, "q, k and v must have one dtype");
  const int ib = 0, ih = p.bshd ? 2 : 1, is = p.bshd ? 1 : 2, id = 3;
  p.B = q[ib];
  p.H = q[ih];
  p.Sq = q[is];
  p.D = q[id];
  p.Sk = k[is];
  if (k[ib] != p.B || k[ih] != p.H || k[id] != p.D) fail(a, backend, "q and k disagree on batch, heads or head_dim");
  p.causal = at.causal;
  p.offset = p.Sk - p.Sq;
  if (p.causal && p.offset < 0) fail(a, backend, "causal attention needs at least as many keys as queries");
  if (!std::isfinite(at.scalar) || at.scalar == 0) fail(a, backend, fmt::format("scale={} must be finite and non-zero", at.scalar));
  p.scale = static_cast<float>(at.scalar);
  auto strides = [&](int64_t S, int64_t& sb, int64_t& sh, int64_t& ss) {
    if (p.bshd) {
      ss = p.H * p.D;
      sh = p.D;
      sb = S * p.H * p.D;
    } else {
      ss = p.D;
      sh = S * p.D;
      sb = p.H * S * p.D;
    }
  };
  strides(p.Sq, p.q_sb, p.q_sh, p.q_ss);
  strides(p.Sk, p.k_sb, p.k_sh, p.k_ss);
  const Shape stats{p.B, p.H, p.Sq};
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail(a, backend, what);
  };
  if (!bwd) {
    need(a.out_shape == q && a.out_dtype == p.dtype, "out must have q's type");
    need(a.extra_out_shapes[0] == stats && a.extra_out_dtypes[0] == DType::f32, "lse must be f32 [batch, heads, Sq]");
  } else {
    need(a.in_shapes[3] == q && a.in_dtypes[3] == p.dtype, "out must have q's type");
    need(a.in_shapes[4] == stats && a.in_dtypes[4] == DType::f32, "lse must be f32 [batch, heads, Sq]");
    need(a.in_shapes[5] == q && a.in_dtypes[5] == p.dtype, "dout must have q's type");
    need(a.out_shape == q && a.out_dtype == p.dtype, "dq must have q's type");
    need(a.extra_out_shapes[0] == k && a.extra_out_dtypes[0] == p.dtype, "dk must have k's type");
    need(a.extra_out_shapes[1] == k && a.extra_out_dtypes[1] == p.dtype, "dv must have v's type");
  }
  for (std::size_t i = 0; i < a.in.size(); ++i)
    if (!a.in[i]) fail(a, backend, fmt::format("operand {} has a null data pointer", i));
  if (!a.out) fail(a, backend, "the result has a null data pointer");
  for (void* e : a.extra_out)
    if (!e) fail(a, backend, "an extra result has a null data pointer");
  return p;
}

}  // namespace tessel
