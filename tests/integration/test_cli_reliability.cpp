// tests/integration/test_cli_reliability.cpp — the example binaries as an adversarial user
// drives them (issue 13): values that used to kill the process (SIGFPE on i32
// INT_MIN / -1), bad numbers for flags, and --help on every binary. Each must end in a normal
// exit with a message, never in a signal.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <string>

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
