// tessel/core/common.hpp helpers shared by the tools and the calibration: median.
#include <catch2/catch.hpp>

#include <vector>

#include "tessel/core/common.hpp"

using namespace tessel;

TEST_CASE("median: the middle value or the mean of the two middle ones and none is an error", "[unit]") {
  CHECK(median({3.0}) == 3.0);
  CHECK(median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);  // unsorted, even: (2 + 3) / 2
  CHECK(median({2.0, 2.0, 9.0, 1.0}) == 2.0);
  CHECK_THROWS_WITH(median({}), Catch::Contains("median: no values"));
}
