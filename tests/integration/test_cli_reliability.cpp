// tests/integration/test_cli_reliability.cpp — the example binaries as an adversarial user
// drives them (issue 13): values that used to kill the process (SIGFPE on i32
// INT_MIN / -1), bad numbers for flags, and --help on every binary. Each must end in a normal
// exit with a message, never in a signal.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>
#include <vector>

#include "run_binary.hpp"

using tessel_test::BinaryResult;
using tessel_test::run_binary;
using tessel_test::temp_file;

TEST_CASE("cli: --run of i32 INT_MIN / -1 and x / 0 does not trap", "[integration][cli][integers]") {
  // %am = a + INT_MIN with a in [0, 8): INT_MIN for a = 0, so %q has INT_MIN / -1; %z is 0.
  const std::string f = temp_file("intmin.tsl", R"(mesh x=2
%a = input i32[4] sharding=[{x}]
%m = constant i32[] value=-2147483648
%b = constant i32[4] value=-1
%am = add(%a, %m)
%q = div(%am, %b)
%z = sub(%a, %a)
%r = div(%q, %z)
%c = div(%m, %b)
output %q, %r, %c
)");
  for (const char* seed : {"1", "2", "3"}) {
    BinaryResult r = run_binary("tessel-explain", {"--run", "--seed", seed, f});
    INFO("seed " << seed << "\n--- output ---\n" << r.out);
    CHECK(r.signal == 0);
    CHECK(r.exited);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("max_rel_err=0"));
    CHECK_THAT(r.out, Catch::Contains("output %c: max_rel_err=0 at element 0 (got -2147483648, want -2147483648)"));
  }
  ::unlink(f.c_str());
}

TEST_CASE("cli: every example binary answers --help with its usage", "[integration][cli]") {
  for (const char* bin : {"tessel-explain", "gpt", "mlp", "tessel-iopddl"}) {
    for (const char* flag : {"--help", "-h"}) {
      BinaryResult r = run_binary(bin, {flag});
      INFO(bin << " " << flag << "\n--- output ---\n" << r.out);
      CHECK(r.exited);
      CHECK(r.status == 0);
      CHECK_THAT(r.out, Catch::Contains("usage:"));
    }
  }
}

TEST_CASE("cli: a bad number for a flag names the flag and exits 2", "[integration][cli]") {
  const std::string mlp = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/megatron_mlp.tsl";
  struct Case {
    const char* bin;
    std::vector<std::string> args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"tessel-explain", {mlp, "--run", "--seed", "x"}, {"--seed", "'x'"}},
      {"tessel-explain", {mlp, "--run", "--tolerance", "nan"}, {"--tolerance", "finite"}},
      {"tessel-explain", {mlp, "--links", "model=bw:nan"}, {"--links", "finite"}},
      {"tessel-explain", {mlp, "--device", "x"}, {"--device"}},
      {"gpt", {"--batch", "x"}, {"--batch", "'x'"}},
      {"gpt", {"--iters", "0"}, {"--iters", "out of range"}},
      {"gpt", {"--seed", "-1"}, {"--seed", "-1"}},
      {"mlp", {"--seed", "1e3"}, {"--seed", "1e3"}},
      {"mlp", {"--mesh"}, {"--mesh needs a value"}},
      {"tessel-iopddl", {"example.json", "5", "--seed", "x"}, {"--seed", "'x'"}},
      {"tessel-iopddl", {"example.json", "0"}, {"SECONDS", "'0'"}},
  };
  for (const Case& c : cases) {
    BinaryResult r = run_binary(c.bin, c.args);
    INFO(c.bin << " --- output ---\n" << r.out);
    CHECK(r.exited);
    CHECK(r.status == 2);
    CHECK_THAT(r.out, Catch::Contains("usage:"));
    for (const auto& s : c.says) CHECK_THAT(r.out, Catch::Contains(s));
  }
}

TEST_CASE("cli: --run of a graph with no output is an error", "[integration][cli]") {
  const std::string f = temp_file("nooutput.tsl", "mesh x=2\n%a = input f32[4] sharding=[{x}]\n%b = relu(%a)\n");
  BinaryResult r = run_binary("tessel-explain", {"--run", f});
  INFO(r.out);
  CHECK(r.exited);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("no output"));
  CHECK_THAT(r.out, !Catch::Contains("max_rel_err"));
  ::unlink(f.c_str());
}

TEST_CASE("cli: --trace into a missing folder fails before the run", "[integration][cli]") {
  const std::string mlp = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/megatron_mlp.tsl";
  BinaryResult r = run_binary("tessel-explain", {mlp, "--run", "--trace", "/nonexistent-tessel-dir/t.json"});
  INFO(r.out);
  CHECK(r.exited);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("/nonexistent-tessel-dir/"));
  CHECK_THAT(r.out, !Catch::Contains("== run"));
}
