// tests/unit/test_cli_args.cpp — tessel-explain's argument parser (tessel/cli.hpp) without
// running anything: every flag, and every bad number names its flag and what it expects
// (std::stoull/stod used to accept "12abc", wrap "-1" and take "nan").
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tessel/cli.hpp"

using namespace tessel;
using tessel::cli::parse_explain_args;

namespace {

std::string usage_error(const std::vector<std::string>& args) {
  try {
    parse_explain_args(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("no UsageError");
  return "";
}

}  // namespace

TEST_CASE("cli args: every flag of tessel-explain", "[cli]") {
  const cli::ExplainOptions o = parse_explain_args(
      {"g.tsl", "--mesh", "data=2", "--why", "--device=3", "--links", "model=bw:5e9,alpha:0",
       "--dump-after=propagate", "--run", "--seed", "18446744073709551615", "--tolerance=0",
       "--trace", "t.json"});
  CHECK(o.file == "g.tsl");
  CHECK(o.mesh == "data=2");
  CHECK(o.why);
  CHECK(o.device == 3);
  CHECK(o.links == "model=bw:5e9,alpha:0");
  CHECK(o.dump_after == "propagate");
  CHECK(o.run);
  CHECK(o.seed_given);
  CHECK(o.seed == 18446744073709551615ull);
  CHECK(o.tolerance == 0.0);
  CHECK(o.trace == "t.json");
  CHECK(parse_explain_args({"--help"}).help);
  CHECK(parse_explain_args({"-h", "--seed", "x"}).help);  // --help wins
  CHECK_FALSE(parse_explain_args({"f"}).seed_given);
  const cli::ExplainOptions st = parse_explain_args({"g.tsl", "--stages", "4", "--microbatches=16"});
  CHECK(st.stages == 4);
  CHECK(st.microbatches == 16);
  CHECK(parse_explain_args({"g.tsl"}).stages == 0);
  CHECK(usage_error({"g.tsl", "--microbatches", "8"}).find("--microbatches needs --stages P") != std::string::npos);
  CHECK(st.stage_remat == "all");  // stages recompute their forward unless --remat none
  CHECK(parse_explain_args({"g.tsl", "--stages", "2", "--remat", "none"}).stage_remat == "none");
  CHECK(usage_error({"g.tsl", "--remat", "none"}).find("--remat needs --stages P") != std::string::npos);
  CHECK(usage_error({"g.tsl", "--stages", "2", "--remat", "einsums"}).find("--remat einsums: expected all or none") !=
        std::string::npos);
  CHECK(usage_error({"g.tsl", "--stages", "0"}).find("--stages") != std::string::npos);
  CHECK(parse_explain_args({"g.tsl", "--auto", "--write-problem", "p.json"}).write_problem == "p.json");
  CHECK(usage_error({"g.tsl", "--write-problem", "p.json"}).find("--write-problem needs --auto") != std::string::npos);
  CHECK(usage_error({"g.tsl", "--auto", "--write-problem="}).find("--write-problem needs a file name") !=
        std::string::npos);
}

TEST_CASE("cli args: a bad number names the flag and what it expects", "[cli]") {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {{"f", "--seed", "x"}, {"--seed", "'x'", "unsigned 64-bit integer"}},
      {{"f", "--seed", "12abc"}, {"--seed", "12abc"}},
      {{"f", "--seed", "-1"}, {"--seed", "-1"}},
      {{"f", "--seed", "18446744073709551616"}, {"--seed"}},
      {{"f", "--seed", ""}, {"--seed"}},
      {{"f", "--seed", " 1"}, {"--seed"}},
      {{"f", "--tolerance", "nan"}, {"--tolerance", "nan", "finite number"}},
      {{"f", "--tolerance", "inf"}, {"--tolerance", "finite"}},
      {{"f", "--tolerance", "-1"}, {"--tolerance", "out of range"}},
      {{"f", "--tolerance", "1e-5x"}, {"--tolerance", "not a number"}},
      {{"f", "--device", "-1"}, {"--device", "out of range"}},
      {{"f", "--device", "1.5"}, {"--device", "not an integer"}},
      {{"f", "--device", "99999999999999999999"}, {"--device"}},
      {{"f", "--links", "model=bw:nan"}, {"--links", "bw", "finite"}},
      {{"f", "--links", "model=bw:inf"}, {"--links", "finite"}},
      {{"f", "--links", "model=bw:5e9x"}, {"--links", "not a number"}},
      {{"f", "--links", "model=bw:0"}, {"--links", "bw must be > 0"}},
      {{"f", "--links", "model=alpha:-1"}, {"--links", "alpha must be >= 0"}},
      {{"f", "--links", "=bw:1"}, {"--links", "axis name"}},
      {{"f", "--links", "model=speed:1"}, {"--links", "unknown key"}},
      {{"f", "--dump-after=later"}, {"--dump-after", "expected one of parse, propagate, partition, collective-matmul, pack"}},
      {{"f", "--seed"}, {"--seed needs a value"}},
      {{"f", "--frob"}, {"unknown option '--frob'"}},
      {{"f", "g"}, {"unexpected argument 'g'"}},
      {{}, {"no FILE"}},
  };
  for (const Case& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += "[" + a + "] ";
    INFO("args " << joined);
    const std::string msg = usage_error(c.args);
    for (const auto& s : c.says) CHECK_THAT(msg, Catch::Contains(s));
  }
}

TEST_CASE("cli args: number parsers accept exactly their range", "[cli]") {
  CHECK(cli::parse_u64("--n", "0") == 0);
  CHECK(cli::parse_i64("--n", "-5", -5, 5) == -5);
  CHECK_THROWS_AS(cli::parse_i64("--n", "6", -5, 5), UsageError);
  CHECK(cli::parse_double("--x", "1e-3", 0, 1) == 1e-3);
  CHECK_THROWS_AS(cli::parse_double("--x", "0x1p3", 0, 1), UsageError);  // 8, out of range
  CHECK_THROWS_AS(cli::parse_double("--x", "-nan", -1, 1), UsageError);
}
