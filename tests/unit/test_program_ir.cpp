// Program IR v2: the text form round-trips at every stage of the lowering pipeline, the
// verifier catches broken stream/event discipline, start/done pairing, shapes and memory
// plans (naming the instruction), parse errors carry file:line:col, and the pass manager
// dumps after a named pass.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "tessel/core/collective_kind.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/compiler/propagate.hpp"

#include "test_util.hpp"

using namespace tessel;
using tessel_test::partitioned_golden;

namespace {

void check_round_trip(const Program& p) {
  const std::string text = print_program(p);
  INFO(text);
  Program q = parse_program(text);
  CHECK(print_program(q) == text);
}

std::string message_of(const std::string& text) {
  try {
    parse_program(text, "t.pir");
  } catch (const ParseError& e) {
    return e.what();
  }
  return "no error";
}

const char* kGolden[] = {"dp_mlp", "megatron_mlp", "attention_heads", "transformer_block_2d", "reshape_split",
                         "priority_conflict", "priority_swap_w", "priority_swap_x", "megatron_mlp_open",
                         "distributed_reductions"};

}  // namespace

TEST_CASE("program text round-trips after every pass of the pipeline", "[program-ir]") {
  for (const char* name : kGolden) {
    INFO(name);
    Program p = partitioned_golden(name);
    verify_program(p);
    check_round_trip(p);
    ProgramPassManager pm = default_program_pipeline();
    pm.verify_each(true);
    for (const auto& pass : pm.pass_names()) pm.dump_after(pass);
    Program lowered = pm.run(p);
    for (const auto& [pass, text] : pm.dumps()) {
      INFO("after " << pass);
      Program q = parse_program(text);
      CHECK(print_program(q) == text);
    }
    CHECK(lowered.memory_plan().planned);
    CHECK(lowered.memory_plan().peak_bytes() >= lowered.memory_plan().arena_bytes);
    // The lowered program has only executor kinds, collectives on comm.
    for (const Instr& in : lowered.instrs) {
      CHECK(in.kind != InstrKind::Collective);
      CHECK(in.kind != InstrKind::ShardSlice);
      if (in.kind == InstrKind::CollectiveStart || in.kind == InstrKind::CollectiveDone) CHECK(in.stream == "comm");
    }
    // combine-collectives may merge all-reduces: fewer of them, the same bytes.
    const CollectiveSummary before = p.summary(), after = lowered.summary();
    CHECK(after.bytes == before.bytes);
    CHECK(after.all_reduce <= before.all_reduce);
    CHECK(after.all_gather == before.all_gather);
    CHECK(after.reduce_scatter == before.reduce_scatter);
    CHECK(after.all_to_all == before.all_to_all);
    CHECK(after.collective_permute == before.collective_permute);
    // Without combining, the lowering keeps every collective.
    ProgramPassOptions separate;
    separate.combine_threshold_bytes = 0;
    CHECK(lower_program(p, true, separate).summary().line() == before.line());
  }
}

TEST_CASE("dump_program_after names the known passes", "[program-ir]") {
  Program p = partitioned_golden("megatron_mlp");
  CHECK(dump_program_after(p, "partition") == print_program(p));
  CHECK(dump_program_after(p, "memory-plan").find("memory arena=") != std::string::npos);
  try {
    dump_program_after(p, "nope");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("pack, combine-collectives, fuse-elementwise, async-collectives, memory-plan") != std::string::npos);
  }
}

TEST_CASE("program parse errors carry file:line:col", "[program-ir]") {
  CHECK(message_of("mesh x=2\n%a = input f32[2] global=f32[4] sharding=[{x}]\n%b = gelu(%c) : f32[2] global=f32[4] "
                   "sharding=[{x}] @compute\noutput %b\n")
            .find("t.pir:3:11: value %c is not defined") != std::string::npos);
  CHECK(message_of("mesh x=2\n%a = input f32[2] global=f32[4] sharding=[{y}]\noutput %a\n")
            .find("t.pir:2:44: unknown mesh axis 'y'") != std::string::npos);
  CHECK(message_of("mesh x=2\n%a = input f32[2] global=f32[4] sharding=[{x}]\n%b = gelu(%a) bogus=1 : f32[2] global=f32[4] "
                   "sharding=[{x}] @compute\noutput %b\n")
            .find("t.pir:3:15: gelu has no attribute 'bogus'") != std::string::npos);
  CHECK(message_of("mesh x=2\n%a = input f32[2] global=f32[4] sharding=[{x}]\n").find("no 'output' line") != std::string::npos);
}

TEST_CASE("the verifier names the instruction that breaks an invariant", "[program-ir]") {
  const std::string head = "mesh x=2\n%a = input f32[2,4] global=f32[4,4] sharding=[{x}, {}]\n";
  // A value made ready on comm read on compute without a wait.
  std::string msg = message_of(head +
                               "%b = all_gather_start(%a) axes={x} dim=0 bytes=32 : f32[4,4] global=f32[4,4] sharding=[{}, {}] @comm\n"
                               "done %b @comm\n"
                               "%c = gelu(%b) : f32[4,4] global=f32[4,4] sharding=[{}, {}] @compute\n"
                               "output %c\n");
  CHECK(msg.find("t.pir:5:1") != std::string::npos);
  CHECK(msg.find("#2 (%c = gelu)") != std::string::npos);
  CHECK(msg.find("'wait comm @compute'") != std::string::npos);
  // Read before done.
  msg = message_of(head +
                   "%b = all_gather_start(%a) axes={x} dim=0 bytes=32 : f32[4,4] global=f32[4,4] sharding=[{}, {}] @comm\n"
                   "%c = gelu(%b) : f32[4,4] global=f32[4,4] sharding=[{}, {}] @comm\n"
                   "done %b @comm\n"
                   "output %c\n");
  CHECK(msg.find("while its collective is in flight") != std::string::npos);
  // A start without a done.
  msg = message_of(head +
                   "%b = all_gather_start(%a) axes={x} dim=0 bytes=32 : f32[4,4] global=f32[4,4] sharding=[{}, {}] @comm\n"
                   "output %a\n");
  CHECK(msg.find("never done") != std::string::npos);
  // A kernel whose type disagrees with the registry.
  msg = message_of(head + "%c = reduce_sum(%a) dims=[1] keepdims=false : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute\n"
                          "output %c\n");
  CHECK(msg.find("the registry infers f32[2]") != std::string::npos);
  // Two live values in the same arena bytes.
  msg = message_of(head +
                   "%b = gelu(%a) : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute at=0\n"
                   "%c = tanh(%a) : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute at=0\n"
                   "%d = add(%b, %c) : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute\n"
                   "output %d\n"
                   "memory arena=64\n");
  CHECK(msg.find("overlaps %b") != std::string::npos);
  CHECK(msg.find("t.pir:4:1") != std::string::npos);
  // A copy block outside its source.
  msg = message_of(head + "%c = copy(%a) block=[2,4] copies=[[0,1*{x}]->[0,0]] : f32[2,4] global=f32[2,4] sharding=[{}, {}] @compute\n"
                          "output %c\n");
  CHECK(msg.find("leaves the source") != std::string::npos);
}

TEST_CASE("ring block offsets: eval over every device and text round trip and errors", "[program-ir][collective_matmul]") {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  IndexExpr e;
  e.base = 1;
  e.stride = 8;
  e.axes = {"model"};
  e.shift = 3;
  e.modulus = 4;
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    const int64_t r = mesh.index_in_group(d, {"model"});
    CHECK(e.eval(mesh, d) == 1 + 8 * ((r + 3) % 4));
  }
  CHECK(e.max_value(mesh) == 1 + 8 * 3);
  // A ring smaller than the group never reaches past modulus - 1.
  e.modulus = 2;
  CHECK(e.max_value(mesh) == 1 + 8 * 1);
  e.modulus = 4;
  e.shift = -1;  // a negative shift wraps around
  CHECK(e.eval(mesh, 0) == 1 + 8 * 3);

  // A copy gathering blocks of two inputs at ring offsets prints, parses and verifies.
  const std::string text =
      "mesh model=2\n"
      "%a = input f32[2,3] global=f32[4,3] sharding=[{model}, {}]\n"
      "%b = input f32[2,3] global=f32[4,3] sharding=[{model}, {}]\n"
      "%c = copy(%a, %b) block=[2,3] copies=[[0,0]->[2*({model}+0 mod 2),0], 1:[0,0]->[2*({model}+1 mod 2),0]] : "
      "f32[4,3] global=f32[4,3] sharding=[{}, {}] @compute\n"
      "output %c\n";
  Program p = parse_program(text, "ring.pir");
  CHECK(p.instrs.at(0).copies.at(1).input == 1);
  CHECK(p.instrs.at(0).copies.at(1).dst.at(0).modulus == 2);
  CHECK(p.instrs.at(0).copies.at(1).dst.at(0).shift == 1);
  CHECK(print_program(parse_program(print_program(p), "again.pir")) == print_program(p));
  verify_program(p);

  // Errors name what is wrong.
  auto with_copies = [](const std::string& copies) {
    return message_of("mesh model=2\n%a = input f32[2,3] global=f32[4,3] sharding=[{model}, {}]\n"
                      "%c = copy(%a) block=[2,3] copies=[" + copies +
                      "] : f32[2,3] global=f32[4,3] sharding=[{model}, {}] @compute\noutput %c\n");
  };
  CHECK(with_copies("[0,0]->[2*({model}+1 mod 0),0]").find("a ring modulus must be >= 1") != std::string::npos);
  CHECK(with_copies("[0,0]->[2*({model} mod 2),0]").find("expected a signed shift") != std::string::npos);
  CHECK(with_copies("[0,0]->[2*({model}+1 rem 2),0]").find("expected 'mod'") != std::string::npos);
  CHECK(with_copies("1:[0,0]->[0,0]").find("copy block input 1 is not one of the copy's 1 inputs") != std::string::npos);
  // A ring offset that can leave the result is caught by the verifier.
  CHECK(with_copies("[0,0]->[1*({model}+1 mod 2),0]").find("leaves the source") != std::string::npos);
}

// Regression (CI's fuzz_program_text, UBSan at num_elements): a value whose element count fits
// int64 but whose bytes do not, or an einsum whose letters multiply past int64, must be a clear
// error, never a signed overflow.
TEST_CASE("program text: a value too large for int64 bytes is refused where it is declared", "[program-ir][fuzz]") {
  const std::string m = message_of(
      "mesh model=2\n"
      "%x = input f32[3000000000,3000000000] global=f32[3000000000,3000000000] sharding=[{}, {}]\n"
      "output %x\n");
  INFO(m);
  CHECK(m.find("t.pir:2:") != std::string::npos);
  CHECK(m.find("more bytes than an int64 counts") != std::string::npos);
  CHECK(m.find("[3000000000,3000000000]") != std::string::npos);
}

TEST_CASE("num_elements and num_bytes throw ShapeError instead of overflowing", "[program-ir][fuzz]") {
  CHECK(num_elements(Shape{1 << 20, 1 << 20, 1 << 20}) == int64_t{1} << 60);
  CHECK_THROWS_AS(num_elements(Shape{int64_t{1} << 40, int64_t{1} << 40}), ShapeError);
  CHECK(num_bytes(Shape{int64_t{1} << 30}, DType::bf16) == int64_t{1} << 31);
  CHECK_THROWS_AS(num_bytes(Shape{int64_t{1} << 62}, DType::f32), ShapeError);
  CHECK(num_elements(Shape{0, int64_t{1} << 62}) == 0);
}

TEST_CASE("program text: a bad einsum is reported at file:line:col and bytes= is checked", "[program]") {
  std::string text;
  {
    std::FILE* f = std::fopen((std::string(TESSEL_SOURCE_DIR) + "/tests/golden/program/async_collectives.pir").c_str(), "rb");
    REQUIRE(f);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  REQUIRE_NOTHROW(verify_program(parse_program(text, "ok.pir")));
  // Like the graph text: the file, the line, the column of the op, then the line and a caret.
  CHECK_THROWS_WITH(parse_program(with("eq=\"bd,df->bf\"", "eq=\"bd,dq->bf\""), "bad.pir"),
                    Catch::Contains("bad.pir:7:6: einsum equation 'bd,dq->bf'") && Catch::Contains("^"));
  CHECK_THROWS_WITH(parse_program(with("bytes=256", "bytes=-5"), "neg.pir"),
                    Catch::Contains("neg.pir:9:46: a collective's bytes= must be >= 0, got -5"));
  CHECK_THROWS_WITH(verify_program(parse_program(with("bytes=256", "bytes=999999999999999999"), "huge.pir")),
                    Catch::Contains("bytes=999999999999999999 is outside [0, 384]"));
}

TEST_CASE("values of more than 2^50 bytes are refused where they are declared in the graph and the program text",
          "[program-ir]") {
  // 2^61 f32 elements: its bytes overflow int64; 2^49 f32 elements: 2^51 bytes, over the
  // bound, which keeps a memory plan's sums (arena + inputs + outputs) inside int64.
  for (const int64_t n : {int64_t{1} << 61, int64_t{1} << 49}) {
    INFO(n);
    Graph g;
    CHECK_THROWS_WITH(input(g, "x", DType::f32, {n}), Catch::Contains("input %x"));
    CHECK_THROWS_WITH(parse_graph(fmt::format("%x = input f32[{}]\noutput %x\n", n), "g.tsl"),
                      Catch::Contains("g.tsl:1:") && Catch::Contains("input %x"));
    CHECK_THAT(message_of(fmt::format("mesh model=2\n%x = input f32[{0}] global=f32[{0}] sharding=[{{}}]\n"
                                      "output %x\n",
                                      n)),
               Catch::Contains("t.pir:2:") && Catch::Contains("bytes"));
  }
  Graph g;
  CHECK_NOTHROW(input(g, "ok", DType::f32, {int64_t{1} << 48}));  // exactly 2^50 bytes
}

TEST_CASE("the collective table drives the text form and the verifier and the cost model", "[program-ir][collective]") {
  // Every row: its text form finds it again, its start name parses back to it, and its ring
  // factor is the nccl-tests one.
  for (const CollectiveInfo& c : kCollectiveTable) {
    INFO(c.text);
    REQUIRE(find_collective(c.text) == &c);
    CHECK(&collective_info(c.kind) == &c);
    CHECK(collective_start_name(c.kind) == std::string(c.text) + "_start");
    const double f = CostModel::ring_factor(c.kind, 4);
    CHECK(f == (c.kind == CollectiveKind::AllReduce ? 1.5 : c.kind == CollectiveKind::CollectivePermute ? 1.0 : 0.75));
    CHECK(CostModel::ring_factor(c.kind, 1) == 0);
  }
  CHECK(find_collective("all-gather") == nullptr);  // the display name is not the text form
  CHECK(find_collective("broadcast") == nullptr);
  // One instruction of each kind over x=2 parses, verifies and prints back as written.
  const std::string head = "mesh x=2\n%a = input f32[2,4] global=f32[4,4] sharding=[{x}, {}]\n";
  const std::string lines[] = {
      "%b = all_gather(%a) axes={x} dim=0 bytes=32 : f32[4,4] global=f32[4,4] sharding=[{}, {}] @compute\n",
      "%b = all_reduce(%a) axes={x} op=max bytes=32 : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute\n",
      "%r = input f32[4,4] global=f32[4,4] sharding=[{}, {}]\n"
      "%b = reduce_scatter(%r) axes={x} dim=0 bytes=64 : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute\n",
      "%b = all_to_all(%a) axes={x} split_dim=1 concat_dim=0 bytes=32 : f32[4,2] global=f32[4,4] sharding=[{}, {x}] "
      "@compute\n",
      "%b = collective_permute(%a) pairs=[0->1, 1->0] bytes=32 : f32[2,4] global=f32[4,4] sharding=[{x}, {}] @compute\n",
  };
  for (const std::string& l : lines) {
    INFO(l);
    const Program p = parse_program(head + l + "output %b\n", "t.pir");
    CHECK_NOTHROW(verify_program(p));
    check_round_trip(p);
  }
  // The attributes a row does not take are refused by name.
  CHECK(message_of(head +
                   "%b = all_gather(%a) axes={x} dim=0 op=max bytes=32 : f32[4,4] global=f32[4,4] sharding=[{}, {}] @compute\n"
                   "output %b\n")
            .find("all_gather has no attribute 'op'") != std::string::npos);
  CHECK(message_of(head + "%b = reduce_scatter(%a) axes={x} dim=0 bytes=32 : f32[2,4] global=f32[4,4] sharding=[{x}, {}] "
                          "@compute\noutput %b\n")
            .find("maps [2,4] to [1,4], but %b is [2,4]") != std::string::npos);
  CHECK(message_of(head + "%b = broadcast_start(%a) axes={x} bytes=32 : f32[2,4] global=f32[4,4] sharding=[{x}, {}] "
                          "@comm\noutput %b\n")
            .find("all_gather_start, all_reduce_start, reduce_scatter_start, all_to_all_start, collective_permute_start") !=
        std::string::npos);
}

TEST_CASE("program text: a shard_slice of a scalar is refused by the verifier", "[program-ir][fuzz]") {
  // Found by fuzz_program_text: the verifier let a scalar be sliced over an axis and the pack
  // pass then read dim 0 of its empty shape.
  const std::string head = "mesh x=2\n%a = input f32[] global=f32[] sharding=[]\n";
  CHECK(message_of(head + "%b = shard_slice(%a) dim=0 axes={x} : f32[] global=f32[] sharding=[] @compute\noutput %b\n")
            .find("slices %a, a scalar, over {x}") != std::string::npos);
  // A relabel of a scalar (a shard_slice over no axes) stays fine and lowers.
  const Program p = parse_program(head + "%b = shard_slice(%a) dim=0 axes={} : f32[] global=f32[] sharding=[] @compute\noutput %b\n", "t.pir");
  CHECK_NOTHROW(lower_program(p, /*verify=*/true));
}
