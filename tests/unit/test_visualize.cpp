// show_sharding (tessel/compiler/visualize.hpp): the mesh as a grid of per-device blocks, for 1-D,
// 2-D and 3-D meshes, replicated dims, partial values and custom device ids.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "tessel/compiler/visualize.hpp"

using namespace tessel;

TEST_CASE("show_sharding: a 1-D mesh is one row", "[visualize]") {
  const std::string s = show_sharding(Mesh::parse("x=4"), {8, 6}, Sharding::parse("[{x}, {}]"), "%a");
  INFO(s);
  CHECK_THAT(s, Catch::StartsWith("%a f32[8,6] sharding [{x}, {}] on mesh {x=4} (4 devices)\n"));
  CHECK_THAT(s, Catch::Contains("#0 [0:2, :]") && Catch::Contains("#1 [2:4, :]") && Catch::Contains("#2 [4:6, :]") &&
                    Catch::Contains("#3 [6:8, :]"));
  CHECK_THAT(s, Catch::Contains("x=0") && Catch::Contains("x=3"));
  // Two lines after the header: the column labels and one row.
  CHECK(std::count(s.begin(), s.end(), '\n') == 3);
}

TEST_CASE("show_sharding: a 2-D mesh has rows for the first axis and columns for the second", "[visualize]") {
  const Mesh mesh = Mesh::parse("data=2,model=4");
  const std::string s = show_sharding(mesh, {8, 16, 512}, Sharding::parse("[{data}, {}, {model}]"), "%h");
  INFO(s);
  CHECK(s ==
        "%h f32[8,16,512] sharding [{data}, {}, {model}] on mesh {data=2, model=4} (8 devices)\n"
        "        model=0             model=1               model=2               model=3\n"
        "data=0  #0 [0:4, :, 0:128]  #1 [0:4, :, 128:256]  #2 [0:4, :, 256:384]  #3 [0:4, :, 384:512]\n"
        "data=1  #4 [4:8, :, 0:128]  #5 [4:8, :, 128:256]  #6 [4:8, :, 256:384]  #7 [4:8, :, 384:512]\n");
  // Replicated over data: both rows hold the same blocks.
  const std::string r = show_sharding(mesh, {8, 512}, Sharding::parse("[{}, {model}]"));
  CHECK_THAT(r, Catch::Contains("#0 [:, 0:128]") && Catch::Contains("#4 [:, 0:128]"));
  // A dim split over both axes (data major).
  const std::string both = show_sharding(mesh, {16}, Sharding::parse("[{data, model}]"));
  CHECK_THAT(both, Catch::Contains("#0 [0:2]") && Catch::Contains("#3 [6:8]") && Catch::Contains("#4 [8:10]") &&
                       Catch::Contains("#7 [14:16]"));
}

TEST_CASE("show_sharding: a 3-D mesh flattens the trailing axes into columns", "[visualize]") {
  const Mesh mesh = Mesh::parse("x=2,y=2,z=2");
  const std::string s = show_sharding(mesh, {4, 4}, Sharding::parse("[{x}, {z}]"), "%v");
  INFO(s);
  CHECK_THAT(s, Catch::Contains("y=0,z=0") && Catch::Contains("y=0,z=1") && Catch::Contains("y=1,z=0") &&
                    Catch::Contains("y=1,z=1"));
  CHECK_THAT(s, Catch::Contains("x=0  #0 [0:2, 0:2]  #1 [0:2, 2:4]  #2 [0:2, 0:2]  #3 [0:2, 2:4]"));
  CHECK_THAT(s, Catch::Contains("x=1  #4 [2:4, 0:2]  #5 [2:4, 2:4]  #6 [2:4, 0:2]  #7 [2:4, 2:4]"));
  CHECK(std::count(s.begin(), s.end(), '\n') == 4);  // header, labels, 2 rows
}

TEST_CASE("show_sharding: partial values are marked and device ids are shown", "[visualize]") {
  const Mesh mesh({{"data", 2}, {"model", 2}}, {10, 11, 12, 13});
  const std::string s = show_sharding(mesh, {4, 6}, Sharding::parse("[{data}, {}] partial{model}"), "%p");
  INFO(s);
  CHECK_THAT(s, Catch::Contains("partial over {model}"));
  CHECK_THAT(s, Catch::Contains("#10 [0:2, :] +") && Catch::Contains("#13 [2:4, :] +"));
  // A fully replicated value on a mesh with no axes: one cell.
  const std::string one = show_sharding(Mesh(), {3}, Sharding::parse("[{}]"));
  CHECK_THAT(one, Catch::EndsWith("#0 [:]\n"));
  // A sharding that does not fit is the sharding's own error.
  CHECK_THROWS_AS(show_sharding(mesh, {4, 6}, Sharding::parse("[{nope}, {}]")), ShardingError);
}
