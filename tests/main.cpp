// Catch2 main shared by every tessel test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <string>

// Test names must filter cleanly: Catch2 splits a filter at ',' (so a name with a comma
// matches nothing when given whole), and '[', ']', '*', '\\', '"' and a leading '~' or
// '#' are filter syntax; ';' splits a CMake list (catch_discover_tests). Every binary
// checks its own registered names.
TEST_CASE("meta: test names filter cleanly in Catch2 and ctest", "[meta]") {
  for (const Catch::TestCase& t : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    const std::string& n = t.name;
    INFO("test name: " << n);
    CHECK(n.find_first_of(",[]*\\\";") == std::string::npos);
    CHECK_FALSE(n.empty());
    CHECK(n.front() != '~');
    CHECK(n.front() != '#');
  }
}
