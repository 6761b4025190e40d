// Golden tests for Program→Program passes: each tests/golden/program/NAME.pir is a program in
// the text form (docs/program-ir.md) whose first line names the passes to run,
//   # passes: pack, async-collectives
// (combine-collectives takes its threshold as combine-collectives(threshold=BYTES);
// collective-matmul its mode and direction as collective-matmul(on uni) or (on bi)),
// and NAME.expected is print_program of the result. Every pass is verified. Regenerate with
// TESSEL_UPDATE_GOLDEN=1 after an intended change, and review the diff.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"

using namespace tessel;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string lower(const std::string& name) {
  const std::string dir = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/program/";
  const std::string text = read(dir + name + ".pir");
  REQUIRE(text.rfind("# passes:", 0) == 0);
  std::string list = text.substr(9, text.find('\n') - 9);
  ProgramPassManager all = default_program_pipeline();
  ProgramPassManager pm;
  pm.verify_each(true);
  std::stringstream ss(list);
  std::string pass;
  while (std::getline(ss, pass, ',')) {
    pass.erase(0, pass.find_first_not_of(' '));
    pass.erase(pass.find_last_not_of(' ') + 1);
    if (pass.rfind("combine-collectives", 0) == 0) {
      int64_t threshold = ProgramPassOptions{}.combine_threshold_bytes;
      const auto eq = pass.find("(threshold=");
      if (eq != std::string::npos) threshold = std::stoll(pass.substr(eq + 11));
      pm.add("combine-collectives", [threshold](Program q) { return combine_collectives_pass(std::move(q), threshold); });
    } else if (pass.rfind("collective-matmul", 0) == 0) {
      // collective-matmul(on,bi): mode and ring direction.
      CollectiveMatmulOptions o;
      o.mode = pass.find("(on") != std::string::npos ? OverlapMode::On : OverlapMode::Auto;
      o.direction = pass.find("bi)") != std::string::npos ? RingDirection::Bi : RingDirection::Uni;
      pm.add("collective-matmul", [o](Program q) { return collective_matmul_pass(std::move(q), o); });
    } else if (pass == "pack") pm.add(pass, pack_pass);
    else if (pass == "fuse-elementwise") pm.add(pass, [](Program p) { return fuse_elementwise_pass(std::move(p)); });
    else if (pass == "async-collectives") pm.add(pass, async_collectives_pass);
    else if (pass == "memory-plan") pm.add(pass, memory_plan_pass);
    else FAIL("unknown pass " << pass);
  }
  Program p = parse_program(text, dir + name + ".pir");
  const std::string out = print_program(pm.run(std::move(p)));
  // The result is itself a valid program in the text form.
  CHECK(print_program(parse_program(out, name + ".expected")) == out);
  const std::string expected_path = dir + name + ".expected";
  if (std::getenv("TESSEL_UPDATE_GOLDEN")) std::ofstream(expected_path) << out;
  INFO("golden file " << expected_path << " (set TESSEL_UPDATE_GOLDEN=1 to regenerate)");
  CHECK(out == read(expected_path));
  return out;
}

}  // namespace

TEST_CASE("golden program: pack makes collective packing and shard slices explicit", "[golden][program-ir]") {
  const std::string out = lower("pack_collectives");
  CHECK(out.find("shard_slice") == std::string::npos);
  CHECK(out.find("all_gather(%g.packed)") == std::string::npos);
  CHECK(out.find("view(%s)") != std::string::npos);
}

TEST_CASE("golden program: async-collectives splits collectives into start/done on comm", "[golden][program-ir]") {
  const std::string out = lower("async_collectives");
  CHECK(out.find("all_gather_start(%h)") != std::string::npos);
  CHECK(out.find("wait comm @compute") != std::string::npos);
  // The independent exp runs between the start and the done.
  CHECK(out.find("all_gather_start(%h)") < out.find("= exp(%x)"));
  CHECK(out.find("= exp(%x)") < out.find("done %g @comm"));
}

TEST_CASE("golden program: memory-plan reuses dead bytes", "[golden][program-ir]") {
  const std::string out = lower("memory_plan");
  CHECK(out.find("memory arena=1088") != std::string::npos);
}

TEST_CASE("golden program: the default pipeline on a 2-D transformer block", "[golden][program-ir]") {
  const std::string out = lower("transformer_block_2d");
  CHECK(out.find("all_reduce_start") != std::string::npos);
}

namespace {
int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("golden program: combine-collectives merges two independent all-reduces", "[golden][program-ir]") {
  const std::string out = lower("combine_two");
  CHECK(count(out, "all_reduce(") == 1);
  CHECK(out.find("all_reduce(%combined.in) axes={model} bytes=36") != std::string::npos);
  // The reader of the first result moves after the combined all-reduce; exp stays first.
  CHECK(out.find("= exp(%x)") < out.find("= concat("));
  CHECK(out.find("= all_reduce(") < out.find("= log(%sr)"));
  CHECK(out.find("%lr = copy(%lr.unpacked)") != std::string::npos);
}

TEST_CASE("golden program: combine-collectives keeps a dependent pair apart", "[golden][program-ir]") {
  const std::string out = lower("combine_dependent");
  CHECK(count(out, "all_reduce(") == 2);
  CHECK(out.find("%ar = all_reduce(%a)") != std::string::npos);
}

TEST_CASE("golden program: combine-collectives never combines into a cycle", "[golden][program-ir]") {
  const std::string out = lower("combine_no_cycle");
  CHECK(count(out, "all_reduce(") == 3);
  CHECK(out.find("%as = all_reduce(%a)") != std::string::npos);
  CHECK(out.find("%ds = all_reduce(%d)") != std::string::npos);
}

TEST_CASE("golden program: combine-collectives needs the same group and op and dtype", "[golden][program-ir]") {
  const std::string out = lower("combine_mismatch");
  CHECK(count(out, "all_reduce(") == 4);
  CHECK(out.find("%b = all_reduce(%f) axes={y}") != std::string::npos);
  CHECK(out.find("%c = all_reduce(%f) axes={x} op=max") != std::string::npos);
  CHECK(out.find("%d = all_reduce(%i)") != std::string::npos);
}

TEST_CASE("golden program: the combine threshold splits a run", "[golden][program-ir]") {
  const std::string out = lower("combine_threshold");
  CHECK(count(out, "all_reduce(") == 3);
  CHECK(count(out, "bytes=32") == 2);
  CHECK(out.find("%big = all_reduce(%x)") != std::string::npos);
}

TEST_CASE("golden program: collective-matmul turns the MLP's all-gather and reduce-scatter into rings", "[golden][program-ir][collective_matmul]") {
  const std::string uni = lower("collective_matmul_uni");
  CHECK(uni.find("all_gather") == std::string::npos);
  CHECK(uni.find("reduce_scatter") == std::string::npos);
  CHECK(uni.find("collective_permute") != std::string::npos);
  CHECK(uni.find("mod 4)") != std::string::npos);
  const std::string bi = lower("collective_matmul_bi");
  // Compute takes the chunk of step 1 (%u.ring0.1, through a view) before the next chunk's
  // permute (%u.ring0.2) starts, and that permute starts before the einsum of step 1: it
  // travels while that einsum runs, and the einsum waits for its own chunk only.
  const auto held = bi.find("%u.held0.1 = view(%u.ring0.1)");
  const auto start = bi.find("%u.ring0.2 = collective_permute_start(%u.ring0.1)");
  const auto einsum = bi.find("= einsum(%u.held0.1");
  REQUIRE(held != std::string::npos);
  REQUIRE(start != std::string::npos);
  REQUIRE(einsum != std::string::npos);
  CHECK(held < start);
  CHECK(start < einsum);
  // Reduce-scatter ring: the received accumulator is added by an add of its own, never as an
  // einsum's epilogue (which would make the step's product wait for the transfer).
  CHECK(bi.find("%y.1.acc0.1 = add(%y.1.ring0.1, %y.1.p0.1)") != std::string::npos);
  CHECK(bi.find("fused_einsum") == std::string::npos);
}

TEST_CASE("golden program: fuse-elementwise makes scale + mask + softmax and bias + GELU and bias + residual one kernel each", "[golden][program-ir]") {
  const std::string out = lower("fuse_elementwise");
  // The MLP's first einsum with its bias + GELU as the epilogue (the product %u is gone), and
  // its bias + the residual (after the all-reduce's done: the partial einsum keeps no epilogue).
  CHECK(out.find("%a = fused_einsum(%h2, %w1, %b1) eq=\"bsd,df->bsf\" epilogue=\"gelu(add($0,$1))\"") != std::string::npos);
  CHECK(out.find("%u = ") == std::string::npos);
  CHECK(out.find("%d = einsum(%a, %w2)") != std::string::npos);
  CHECK(out.find("%y = fused_elementwise(") != std::string::npos);
  CHECK(out.find("done %d") < out.find("%y = fused_elementwise("));
  // The attention's scale, causal mask and softmax: one kernel.
  CHECK(out.find("%p = fused_softmax(%s) expr=\"causal_mask(mul($0,0.17677669529663687:f32[]))\" axis=3") != std::string::npos);
  CHECK(out.find("= gelu(") == std::string::npos);
  CHECK(out.find("= softmax(") == std::string::npos);
}
