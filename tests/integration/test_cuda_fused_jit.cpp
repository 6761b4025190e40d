// The CUDA fused-expression JIT checked without a GPU (NVRTC needs none): the generated source
// of every fused program of the sampled fused ops (f32) and of a bf16 GPT training step
// (forward, backward, AdamW; lowered with fusion) compiles for sm_90, the architecture of the
// lent H100/H200, with both kernels where the result is a float; the source is a pure function
// of the program (the same program twice gives the same text) and does not depend on the
// shape, only on which operands are dense. The kernels' results are checked on a GPU
// (tests/gpu: every op kind against the CPU, the JIT against the interpreter bit for bit).
#include <catch2/catch.hpp>

#ifdef TESSEL_TEST_HAVE_CUDA
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../unit/test_util.hpp"
#include "fused_jit.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/train/train_step.hpp"

using namespace tessel;

namespace {

struct Case {
  std::string what;
  KernelArgs args;
  OpAttrs attrs;
};

KernelArgs args_for(OpKind kind, const OpAttrs* attrs, const std::vector<Shape>& in_shapes,
                    const std::vector<DType>& in_dtypes, const Shape& out_shape, DType out_dtype) {
  KernelArgs a;
  a.kind = kind;
  a.attrs = attrs;
  a.in_shapes = in_shapes;
  a.in_dtypes = in_dtypes;
  a.in.assign(in_shapes.size(), nullptr);
  a.out_shape = out_shape;
  a.out_dtype = out_dtype;
  return a;
}

// The args of an op reading `inputs` (value ids with a shape and a dtype: Graph or Program values).
template <class Values>
KernelArgs args_of(OpKind kind, const OpAttrs* attrs, const std::vector<int>& inputs, const Values& values, int out) {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (int v : inputs) {
    shapes.push_back(values[static_cast<std::size_t>(v)].shape);
    dtypes.push_back(values[static_cast<std::size_t>(v)].dtype);
  }
  const auto& o = values[static_cast<std::size_t>(out)];
  return args_for(kind, attrs, shapes, dtypes, o.shape, o.dtype);
}

void check_compiles(const KernelArgs& a, const std::string& what, std::set<std::string>& seen, int& compiled) {
  const bool positional = a.kind == OpKind::FusedSoftmax;
  const cuda::ck::FusedProgram p = cuda::cuda_fused_program(a, positional);
  const std::string src = cuda::fused_jit_source(p, a.out_dtype);
  REQUIRE(src == cuda::fused_jit_source(p, a.out_dtype));
  if (!seen.insert(src).second) return;
  const cuda::NvrtcResult r = cuda::nvrtc_compile(src, 90);
  INFO(what << ": equation " << a.attrs->equation << "\n" << r.log << "\n--- source ---\n" << src);
  REQUIRE(r.ok);
  CHECK(r.cubin.size() > 0);
  CHECK(src.find("tessel_fused_elementwise") != std::string::npos);
  if (a.out_dtype != DType::i32) CHECK(src.find("tessel_fused_softmax") != std::string::npos);
  ++compiled;
}

}  // namespace

TEST_CASE("fused JIT sources compile with NVRTC for sm_90 without a GPU", "[cuda][jit]") {
  const uint64_t seed = tessel_test::seed();
  const int per_kind = tessel_test::cases(6);
  tessel_test::announce("fused JIT sources compile with NVRTC", seed, per_kind);
  std::printf("NVRTC %s\n", cuda::nvrtc_version().c_str());
  std::set<std::string> seen;
  int compiled = 0;
  std::mt19937_64 rng(seed);
  const Mesh one = Mesh::parse("x=1");
  for (OpKind k : {OpKind::FusedElementwise, OpKind::FusedSoftmax})
    for (int c = 0; c < per_kind; ++c) {
      Graph g = tessel_test::sample_op_graph(k, rng, one);
      const Op& op = g.ops.back();
      REQUIRE(op.kind == k);
      check_compiles(args_of(k, &op.attrs, op.inputs, g.values, op.output),
                     std::string(op_name(k)) + " sample " + std::to_string(c) + " (seed " + std::to_string(seed) + ")",
                     seen, compiled);
    }
  // A bf16 GPT training step, lowered with fusion: the programs a real step runs.
  GptConfig cfg;
  cfg.batch = 2, cfg.seq = 16, cfg.d_model = 32, cfg.heads = 4, cfg.layers = 1, cfg.vocab = 64;
  cfg.dtype = DType::bf16;
  cfg.compute = DType::bf16;
  GptGraph m = build_gpt(cfg);
  const Mesh mesh = Mesh::parse("data=1,model=1");
  add_train_step(m.graph, m.loss, m.weights, mesh);
  Executable exe = compile(m.graph, mesh);
  ProgramPassOptions po;
  po.fuse_elementwise = true;
  const Program low = lower_program(exe.program(), false, po);
  int fused = 0;
  for (const Instr& in : low.instrs) {
    if (in.kind != InstrKind::Kernel || (in.op != OpKind::FusedElementwise && in.op != OpKind::FusedSoftmax)) continue;
    ++fused;
    check_compiles(args_of(in.op, &in.attrs, in.in, low.values, in.out),
                   std::string("GPT training step: ") + op_name(in.op), seen, compiled);
  }
  CHECK(fused > 0);
  CHECK(compiled > 4);
  std::printf("%d distinct fused programs compiled (%d fused instructions in the GPT step)\n", compiled, fused);
}

TEST_CASE("a fused JIT source depends on which operands are dense and not on the shape", "[cuda][jit]") {
  Graph g;
  Tensor a = input(g, "a", DType::f32, {4, 8}), b = input(g, "b", DType::f32, {8});
  (void)a, (void)b;
  OpAttrs at;
  at.equation = "add($0,$1)";
  auto source = [&](const Shape& sa, const Shape& sb, const Shape& so) {
    const KernelArgs k = args_for(OpKind::FusedElementwise, &at, {sa, sb}, {DType::f32, DType::f32}, so, DType::f32);
    return cuda::fused_jit_source(cuda::cuda_fused_program(k, false), DType::f32);
  };
  const std::string broadcast = source({4, 8}, {8}, {4, 8});
  CHECK(broadcast == source({16, 32}, {32}, {16, 32}));  // another shape: the same kernel
  const std::string dense = source({4, 8}, {4, 8}, {4, 8});
  CHECK(dense != broadcast);
  CHECK(dense.find("p.stride") == std::string::npos);  // every operand read at the element's own index
  CHECK(broadcast.find("p.stride[1]") != std::string::npos);
  CHECK_THROWS_WITH(cuda::fused_jit_source(cuda::ck::FusedProgram{}, DType::f32), Catch::Contains("0 steps"));
}
#endif
