// Whole models: the GPT graph (models/gpt.hpp) partitioned over several data × model meshes
// equals the unpartitioned reference, and the Megatron layout costs exactly the expected
// collectives (two all-reduces over `model` per layer, one over `data` for the mean loss).
#include <catch2/catch.hpp>

#include "../unit/test_util.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"

using namespace tessel;

TEST_CASE("models: GPT partitioned == reference on data x model meshes", "[integration][models]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  uint64_t seed = tessel_test::seed();
  INFO("seed " << seed);
  tessel_test::announce("models: GPT partitioned == reference on data x model meshes", seed, 7);  // 7 meshes
  GptConfig cfg;
  cfg.batch = 4;
  cfg.seq = 16;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.vocab = 64;
  GptGraph m = build_gpt(cfg);
  auto inputs = random_inputs(m.graph, seed);
  auto want = run_reference(m.graph, inputs);
  for (const char* spec : {"data=1,model=1", "data=2,model=1", "data=1,model=4", "data=2,model=2",
                           "data=2,model=4", "data=4,model=2", "data=4,model=4"}) {
    INFO("mesh " << spec);
    Mesh mesh = Mesh::parse(spec);
    Executable exe = compile(m.graph, mesh);
    RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
    ro.poison = true;
    ro.check_replicas = true;
    auto got = exe.run(inputs, ro);
    CompareResult c = compare(got[0], want[0]);
    INFO(c.to_string());
    REQUIRE(c.max_rel_err <= 1e-5);
    auto s = exe.program().summary();
    CHECK(s.all_gather == 0);
    CHECK(s.all_to_all == 0);
    const int model_ar = mesh.axis_size("model") > 1 ? 2 * static_cast<int>(cfg.layers) : 0;
    const int data_ar = mesh.axis_size("data") > 1 ? 1 : 0;
    CHECK(s.all_reduce == model_ar + data_ar);
  }
}

TEST_CASE("models: GPT in bf16 runs partitioned and stays close to the reference", "[integration][models]") {
  GptConfig cfg;
  cfg.batch = 2;
  cfg.seq = 8;
  cfg.d_model = 16;
  cfg.heads = 2;
  cfg.layers = 1;
  cfg.vocab = 32;
  cfg.dtype = DType::bf16;
  GptGraph m = build_gpt(cfg);
  auto inputs = random_inputs(m.graph, 7);
  auto want = run_reference(m.graph, inputs);
  Executable exe = compile(m.graph, Mesh::parse("data=2,model=2"));
  auto got = exe.run(inputs);
  // bf16 keeps 8 bits of mantissa: different summation orders differ by ~1e-2 relative.
  REQUIRE(compare(got[0], want[0]).max_rel_err <= 5e-2);
}
