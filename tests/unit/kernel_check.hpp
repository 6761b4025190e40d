// The kernel-level harness of the GPU suite's dtype and einsum tests, header-only so that the
// CPU suite runs the same harness on the CPU backend (tests/unit/test_kernel_harness.cpp): a
// harness that throws or skips ops (an op retyped against its type rules, a K = 0 graph the IR
// refuses) then fails in CI, not on the first GPU run (issue 22, findings 1 and 2).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/ir/graph_text.hpp"
#include "test_util.hpp"

namespace tessel_test {

// The tessel names these helpers use (declarations, not a using-directive: a header must not
// pull all of tessel into its includers' lookup).
using tessel::Buffer;
using tessel::DType;
using tessel::Graph;
using tessel::HostTensor;
using tessel::Op;
using tessel::OpKind;
using tessel::Shape;
using tessel::CompareResult;
using tessel::Error;
using tessel::KernelArgs;
using tessel::Mesh;
using tessel::OpAttrs;
using tessel::Tensor;
using tessel::Value;
using tessel::run_cpu_kernel;

// t converted element by element (through double) to dtype `to`.
inline HostTensor converted(const HostTensor& t, DType to) {
  if (t.dtype() == to) return t;
  HostTensor r(to, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) r.set(i, t.get(i));
  return r;
}

// Host tensors <-> one backend (CUDA in the GPU suite, the CPU backend in the CPU suite), for
// kernel-level tests.
struct KernelDevice {
  explicit KernelDevice(std::unique_ptr<tessel::Backend> backend) : be(std::move(backend)) {}
  std::unique_ptr<tessel::Backend> be;
  std::unique_ptr<tessel::Stream> s = be->create_stream("test");
  std::shared_ptr<Buffer> upload(const HostTensor& t) {
    std::shared_ptr<Buffer> b = be->allocate(t.bytes());
    be->copy_from_host(*b, t.data(), t.bytes(), *s);
    return b;
  }
  HostTensor download(const Buffer& b, DType t, const Shape& shape) {
    HostTensor h(t, shape);
    be->copy_to_host(h.data(), b, h.bytes(), *s);
    s->synchronize();
    return h;
  }
};

inline bool is_float_type(DType t) { return t != DType::i32; }

// Runs one op's kernel on the CPU with `in` as operands and results of `out_types`; returns them.
inline std::vector<HostTensor> cpu_kernel(const Op& op, const std::vector<HostTensor>& in,
                                   const std::vector<std::pair<DType, Shape>>& out_types) {
  KernelArgs a;
  a.kind = op.kind;
  a.attrs = &op.attrs;
  for (const HostTensor& t : in) {
    a.in.push_back(t.data());
    a.in_shapes.push_back(t.shape());
    a.in_dtypes.push_back(t.dtype());
  }
  std::vector<HostTensor> out;
  for (const auto& [dt, shape] : out_types) out.emplace_back(dt, shape);
  a.out = out[0].data();
  a.out_shape = out[0].shape();
  a.out_dtype = out[0].dtype();
  for (std::size_t r = 1; r < out.size(); ++r) {
    a.extra_out.push_back(out[r].data());
    a.extra_out_shapes.push_back(out[r].shape());
    a.extra_out_dtypes.push_back(out[r].dtype());
  }
  run_cpu_kernel(a);
  return out;
}

// `text` (a fused expression) with its f32 literals and casts to f32 retyped to dt.
inline std::string retyped(std::string text, DType dt) {
  const std::string to = dtype_name(dt);
  for (const std::string from : {":f32", "cast<f32>"}) {
    const std::string repl = from[0] == ':' ? ":" + to : "cast<" + to + ">";
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + repl.size()))
      text.replace(at, from.size(), repl);
  }
  return text;
}

// One op retyped to dt as far as its type rules allow: every float operand in dt when the op
// accepts that (re-inferring its result dtypes through the registry), else operand by operand
// (adamw's moments, cross_entropy_grad's g stay f32). Returns the retyped op (its operand and
// result types in `g`), or nullopt when no operand can be in dt.
inline std::optional<Op> retype_op(const Op& op, const Graph& src, DType dt, Graph& g) {
  OpAttrs at = op.attrs;
  if (op.kind == OpKind::FusedElementwise || op.kind == OpKind::FusedSoftmax) at.equation = retyped(at.equation, dt);
  if (op.kind == OpKind::FusedEinsum) at.epilogue = retyped(at.epilogue, dt);
  std::vector<DType> types;
  for (int v : op.inputs) types.push_back(src.values[static_cast<std::size_t>(v)].dtype);
  auto attempt = [&](const std::vector<DType>& ts) -> bool {
    Graph t;
    std::vector<int> ids;
    for (std::size_t i = 0; i < ts.size(); ++i)
      ids.push_back(t.add_input("x" + std::to_string(i), ts[i], src.values[static_cast<std::size_t>(op.inputs[i])].shape).id);
    try {
      t.add_op_results(op.kind, ids, at);
    } catch (const Error&) {
      return false;
    }
    g = std::move(t);
    return true;
  };
  // Subsets of the float operands in dt, largest first (layer_norm_grad needs dy and x in dt
  // together; adamw keeps its moments in f32): the first the op accepts.
  std::vector<std::size_t> floats;
  for (std::size_t i = 0; i < types.size(); ++i)
    if (is_float_type(types[i])) floats.push_back(i);
  if (floats.size() > 12) return std::nullopt;
  std::vector<uint32_t> masks;
  for (uint32_t m = 1; m < (1u << floats.size()); ++m) masks.push_back(m);
  std::stable_sort(masks.begin(), masks.end(),
                   [](uint32_t a, uint32_t b) { return __builtin_popcount(a) > __builtin_popcount(b); });
  // An op whose result dtype is an attribute (one_hot, cast from i32) makes its float result in dt.
  if ((op.kind == OpKind::OneHot || (op.kind == OpKind::Cast && floats.empty())) && is_float_type(at.dtype)) {
    at.dtype = dt;
    return attempt(types) ? std::optional<Op>(g.ops.back()) : std::nullopt;
  }
  for (uint32_t m : masks) {
    std::vector<DType> ts = types;
    for (std::size_t b = 0; b < floats.size(); ++b)
      if (m & (1u << b)) ts[floats[b]] = dt;
    if (attempt(ts)) return g.ops.back();
  }
  return std::nullopt;
}

// Checks each op of g on its own: its operands are the values of an f32 CPU run of g, rounded to
// `dt` where the op's type rules allow (retype_op); dev's kernel on those very operands must
// match the CPU kernel's result of the same types. An op whose kernel throws is reported and the
// others are still checked. Returns how many ops ran in dt.
inline int check_kernels_in_dtype(const Graph& g, const std::vector<HostTensor>& inputs, DType dt, double tol, KernelDevice& dev) {
  std::map<int, HostTensor> val;  // the f32 run
  for (std::size_t i = 0; i < g.inputs.size(); ++i) val[g.inputs[i]] = inputs[i];
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::Input) continue;
    std::vector<HostTensor> in;
    for (int v : op.inputs) in.push_back(val.at(v));
    std::vector<std::pair<DType, Shape>> types;
    for (int v : op.results()) types.emplace_back(g.values[static_cast<std::size_t>(v)].dtype, g.values[static_cast<std::size_t>(v)].shape);
    std::vector<HostTensor> out = cpu_kernel(op, in, types);
    for (std::size_t r = 0; r < out.size(); ++r) val[op.result(static_cast<int>(r))] = std::move(out[r]);
  }
  int typed = 0;
  for (const Op& src_op : g.ops) {
    if (src_op.kind == OpKind::Input) continue;
    const std::string what = std::string(op_name(src_op.kind)) + " in " + dtype_name(dt);
    try {
      Graph mini;
      const std::optional<Op> op = retype_op(src_op, g, dt, mini);
      if (!op) continue;
      ++typed;
      std::vector<HostTensor> in;
      std::string operand_types;
      for (std::size_t i = 0; i < op->inputs.size(); ++i) {
        in.push_back(converted(val.at(src_op.inputs[i]), mini.values[static_cast<std::size_t>(op->inputs[i])].dtype));
        operand_types += std::string(i ? ", " : "") + dtype_name(in.back().dtype());
      }
      std::vector<std::pair<DType, Shape>> types;
      for (int v : op->results()) types.emplace_back(mini.values[static_cast<std::size_t>(v)].dtype, mini.values[static_cast<std::size_t>(v)].shape);
      const std::vector<HostTensor> want = cpu_kernel(*op, in, types);
      KernelArgs d;
      d.kind = op->kind;
      d.attrs = &op->attrs;
      std::vector<std::shared_ptr<Buffer>> dev_in, dev_out;
      for (const HostTensor& t : in) {
        dev_in.push_back(dev.upload(t));
        d.in.push_back(dev_in.back()->data());
        d.in_shapes.push_back(t.shape());
        d.in_dtypes.push_back(t.dtype());
      }
      for (const HostTensor& w : want) {
        dev_out.push_back(dev.be->allocate(w.bytes()));
        dev.be->poison(*dev_out.back(), w.dtype(), *dev.s);
      }
      d.out = dev_out[0]->data();
      d.out_shape = want[0].shape();
      d.out_dtype = want[0].dtype();
      for (std::size_t r = 1; r < want.size(); ++r) {
        d.extra_out.push_back(dev_out[r]->data());
        d.extra_out_shapes.push_back(want[r].shape());
        d.extra_out_dtypes.push_back(want[r].dtype());
      }
      dev.be->run_kernel(d, *dev.s);
      dev.s->synchronize();
      for (std::size_t r = 0; r < want.size(); ++r) {
        HostTensor got = dev.download(*dev_out[r], want[r].dtype(), want[r].shape());
        CompareResult c = compare(got, want[r], max_abs(in));
        INFO(what << " (operands " << operand_types << ") result " << r << " " << dtype_name(want[r].dtype()) << ": "
                  << c.to_string());
        CHECK(c.max_rel_err <= tol);
      }
    } catch (const std::exception& e) {
      FAIL_CHECK(what << ": " << e.what());
    }
  }
  return typed;
}

// Every sampled op kind (test_util.hpp) in bf16 and in f16 on dev against the CPU kernel, the
// operands of a random graph of that op rounded once (check_kernels_in_dtype), with tolerance
// `bf16_tol` / `f16_tol`. Every op with a float operand must run in the dtype (its registry type
// rules allow one at least). Returns how many ops ran in a 16-bit dtype.
inline int check_every_op_in_16_bits(KernelDevice& dev, uint64_t seed, double bf16_tol, double f16_tol) {
  const auto kinds = sampled_op_kinds();
  std::mt19937_64 rng(seed);
  const Mesh one = Mesh::parse("x=1");
  int typed_total = 0;
  for (OpKind k : kinds)
    for (DType dt : {DType::bf16, DType::f16}) {
      const uint64_t case_seed = rng();
      std::mt19937_64 crng(case_seed);
      Graph g = sample_op_graph(k, crng, one);
      INFO("seed " << seed << " op " << op_name(k) << " dtype " << dtype_name(dt) << " (case seed " << case_seed
                   << ")\n" << print_graph(g));
      const int typed = check_kernels_in_dtype(g, random_inputs(g, case_seed), dt, dt == DType::bf16 ? bf16_tol : f16_tol, dev);
      bool has_float = false;
      for (const Value& v : g.values) has_float = has_float || is_float_type(v.dtype);
      if (has_float) CHECK(typed > 0);
      typed_total += typed;
    }
  return typed_total;
}

// The einsum layouts the GPU suite checks through cuBLASLt: transposes on either side, batch
// letters, summed letters, a dot product, an outer product, odd row lengths.
struct EinsumLayoutCase {
  const char* eq;
  Shape a, b;
};
inline std::vector<EinsumLayoutCase> einsum_layout_cases() {
  return {{"mk,kn->mn", {33, 17}, {17, 9}},        {"km,kn->mn", {17, 33}, {17, 9}},
          {"mk,nk->mn", {33, 17}, {9, 17}},        {"mk,kn->nm", {33, 17}, {17, 9}},
          {"bmk,bkn->bmn", {3, 8, 5}, {3, 5, 7}},  {"bsd,df->bsf", {2, 6, 16}, {16, 12}},
          {"bqhd,bkhd->bhqk", {2, 4, 3, 8}, {2, 5, 3, 8}}, {"bhqk,bkhd->bqhd", {2, 3, 4, 5}, {2, 5, 3, 8}},
          {"ijs,jk->ik", {4, 3, 2}, {3, 6}},
          {"i,i->", {64}, {64}},                   {"ab,cd->abcd", {2, 3}, {4, 5}},
          {"bsd,vd->bsv", {2, 5, 16}, {37, 16}},   {"bmk,bkn->bnm", {3, 7, 5}, {3, 5, 9}},
          {"mk,kn->nm", {13, 11}, {11, 37}}};
}

// Every layout case in f32, bf16 and f16 on dev against the CPU kernel (check_kernels_in_dtype).
inline void check_einsum_layouts(KernelDevice& dev, std::mt19937_64& rng, const std::string& label) {
  for (const EinsumLayoutCase& c : einsum_layout_cases())
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Graph g;
      Tensor x = g.add_input("x", dt, c.a), y = g.add_input("y", dt, c.b);
      OpAttrs at;
      at.equation = c.eq;
      g.mark_output(g.add_op(OpKind::Einsum, {x.id, y.id}, at));
      INFO(c.eq << " " << dtype_name(dt) << label);
      const int typed = check_kernels_in_dtype(g, random_inputs(g, rng()), dt,
                                               dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 4e-3, dev);
      CHECK(typed == 1);
    }
}

// K = 0 (an empty summed letter) cannot be declared in a Graph (dims are >= 1), but a kernel
// can see it: the product is a sum over nothing, all zeros, in every dtype. The arguments are
// built by hand; dev's result is poisoned first.
inline void check_empty_einsum(KernelDevice& dev) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    OpAttrs at;
    at.equation = "ij,jk->ik";
    HostTensor want(dt, {4, 6});
    KernelArgs a;
    a.kind = OpKind::Einsum;
    a.attrs = &at;
    const float dummy[1] = {0};
    a.in = {dummy, dummy};
    a.in_shapes = {{4, 0}, {0, 6}};
    a.in_dtypes = {dt, dt};
    a.out = want.data();
    a.out_shape = want.shape();
    a.out_dtype = dt;
    for (int64_t i = 0; i < want.numel(); ++i) want.set(i, 7.0);
    run_cpu_kernel(a);
    std::shared_ptr<Buffer> x = dev.be->allocate(16), y = dev.be->allocate(16), out = dev.be->allocate(want.bytes());
    dev.be->poison(*out, dt, *dev.s);
    KernelArgs d = a;
    d.in = {x->data(), y->data()};
    d.out = out->data();
    dev.be->run_kernel(d, *dev.s);
    const HostTensor got = dev.download(*out, dt, want.shape());
    INFO(dtype_name(dt));
    for (int64_t i = 0; i < want.numel(); ++i) {
      CHECK(want.get(i) == 0.0);
      CHECK(got.get(i) == 0.0);
    }
  }
}

}  // namespace tessel_test
