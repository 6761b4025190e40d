// tests/unit/test_onednn_prepare.cpp — load() prepares every einsum's oneDNN primitive
// (Backend::prepare_kernel, docs/cpu-backend.md "Primitives at load"): after a load, runs of
// the program create no primitive, so the first run is as fast as the later ones. Built
// without oneDNN there is nothing to prepare and the counters stay 0.
#include <catch2/catch.hpp>

#include <cmath>

#include "../../src/runtime/cpu/onednn_einsum.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

using namespace tessel;

TEST_CASE("onednn prepare: a kernel run without preparation creates its primitive while running", "[onednn]") {
  // The counter the next test relies on does see creations on the run path. Batched products:
  // plain 2-d ones run as dnnl_sgemm, which needs no primitive.
  onednn_clear_primitive_cache();
  HostTensor a(DType::f32, {3, 24, 40}), b(DType::f32, {3, 40, 56}), c(DType::f32, {3, 24, 56});
  for (int64_t i = 0; i < a.numel(); ++i) a.set(i, 0.01 * double(i % 17));
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, 0.02 * double(i % 13));
  OpAttrs at;
  at.equation = "bij,bjk->bik";
  KernelArgs k;
  k.kind = OpKind::Einsum;
  k.attrs = &at;
  k.in = {a.data(), b.data()};
  k.in_shapes = {a.shape(), b.shape()};
  k.in_dtypes = {DType::f32, DType::f32};
  k.out = c.data();
  k.out_shape = c.shape();
  const OneDnnPrimitiveCounts before = onednn_primitive_counts();
  const bool ran = cpu_einsum(k, EinsumImpl::Auto);
  const OneDnnPrimitiveCounts after = onednn_primitive_counts();
  CHECK(ran == onednn_einsum_compiled());
  CHECK(after.created_while_running - before.created_while_running == (ran ? 1 : 0));
  // Prepared first: the run finds it.
  at.equation = "bik,bjk->bij";
  HostTensor e(DType::f32, {3, 40, 56});
  for (int64_t i = 0; i < e.numel(); ++i) e.set(i, 0.03 * double(i % 11));
  k.in_shapes = {c.shape(), e.shape()};
  k.in = {c.data(), e.data()};
  HostTensor d(DType::f32, {3, 24, 40});
  k.out = d.data();
  k.out_shape = d.shape();
  prepare_cpu_kernel(k);
  const OneDnnPrimitiveCounts prepared = onednn_primitive_counts();
  CHECK(prepared.created - after.created == (ran ? 1 : 0));
  CHECK(cpu_einsum(k, EinsumImpl::Auto) == ran);
  CHECK(onednn_primitive_counts().created == prepared.created);
}

TEST_CASE("onednn prepare: load creates the GPT's einsum primitives and runs create none", "[onednn][runtime]") {
  GptConfig cfg;
  cfg.batch = 4;
  cfg.seq = 16;
  cfg.d_model = 32;
  cfg.heads = 2;
  cfg.vocab = 64;
  const GptGraph m = build_gpt(cfg);
  for (const char* mesh : {"data=1,model=1", "data=2,model=1", "data=1,model=2"}) {
    for (int threads : {1, 2}) {
      INFO("mesh " << mesh << ", kernel threads " << threads);
      onednn_clear_primitive_cache();
      const Executable exe = compile(m.graph, Mesh::parse(mesh));
      ThreadRuntimeOptions ro;
      ro.kernel_threads = threads;
      ThreadRuntime rt(Mesh::parse(mesh).num_devices(), ro);
      const OneDnnPrimitiveCounts c0 = onednn_primitive_counts();
      LoadedExecutable le = load(exe, rt);
      const OneDnnPrimitiveCounts c1 = onednn_primitive_counts();
      if (onednn_einsum_compiled()) {
        CHECK(c1.created > c0.created);
      } else {
        CHECK(c1.created == 0);
      }
      CHECK(c1.created_while_running == c0.created_while_running);
      auto inputs = random_inputs(m.graph, 7);
      gpt_init(m.graph, inputs);
      std::vector<ShardedArray> in;
      for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
      RunResult r1 = le.run(in);
      RunResult r2 = le.run(in);
      const OneDnnPrimitiveCounts c2 = onednn_primitive_counts();
      CHECK(c2.created == c1.created);
      CHECK(c2.created_while_running == c1.created_while_running);
      const double l1 = le.to_host(r1.outputs[0]).get(0), l2 = le.to_host(r2.outputs[0]).get(0);
      CHECK(l1 == l2);
      const double ref = run_reference(m.graph, inputs)[0].get(0);
      CHECK(std::abs(l1 - ref) <= 1e-5 * std::abs(ref));
    }
  }
}

TEST_CASE("onednn prepare: load creates a fused_einsum's post-op primitive and runs create none", "[onednn][runtime][fused_einsum]") {
  // A batched product (a matmul primitive) with bias + GELU + residual as its epilogue.
  Graph g;
  Tensor x = input(g, "x", DType::f32, {3, 24, 40});
  Tensor w = input(g, "w", DType::f32, {3, 40, 56});
  Tensor b = input(g, "b", DType::f32, {56});
  Tensor r = input(g, "r", DType::f32, {3, 24, 56});
  g.mark_output(add(gelu(add(einsum("bij,bjk->bik", x, w), b)), r));
  onednn_clear_primitive_cache();
  const Executable exe = compile(g, Mesh::parse("d=1"));
  ThreadRuntime rt(1);
  const OneDnnPrimitiveCounts c0 = onednn_primitive_counts();
  LoadedExecutable le = load(exe, rt);
  const OneDnnPrimitiveCounts c1 = onednn_primitive_counts();
  if (ProgramPassOptions::fusion_default()) {
    bool fused = false;
    for (const Instr& in : le.program().instrs) fused = fused || in.op == OpKind::FusedEinsum;
    CHECK(fused);
  }
  CHECK(c1.created == c0.created + (onednn_einsum_compiled() ? 1 : 0));
  const auto inputs = random_inputs(g, 5);
  std::vector<ShardedArray> in;
  for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
  RunResult r1 = le.run(in);
  le.run(in);
  CHECK(onednn_primitive_counts().created == c1.created);
  const CompareResult c = compare(le.to_host(r1.outputs[0]), run_reference(g, inputs)[0]);
  INFO(c.to_string());
  CHECK(c.max_rel_err <= 2e-6);
}
