// Mesh and Sharding: construction errors, coordinates, axis groups, text form, local blocks.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"
#include "test_util.hpp"

using namespace tessel;

TEST_CASE("mesh: coordinates and positions round trip", "[mesh]") {
  Mesh m = Mesh::parse("data=2,model=4");
  REQUIRE(m.num_devices() == 8);
  REQUIRE(m.to_string() == "{data=2, model=4}");
  for (int64_t p = 0; p < 8; ++p) REQUIRE(m.position(m.coords(p)) == p);
  REQUIRE(m.coords(5) == std::vector<int64_t>{1, 1});
  REQUIRE(Mesh::parse("{data=2, model=4}") == m);
  REQUIRE(Mesh::parse(" { data = 2 ,model=4 } ") == m);
  // The header's documented refusals (issue 36 item 7: it once promised "data=2 model=4").
  CHECK_THROWS_WITH(Mesh::parse("data=2 model=4"),
                    Catch::Contains("at column 8") && Catch::Contains("separate axes with ','"));
  CHECK_THROWS_WITH(Mesh::parse("data:2"), Catch::Contains("'=', not ':'"));
  CHECK_THROWS_WITH(Mesh::parse("data=2,,model=4"), Catch::Contains("no empty axis"));
}

TEST_CASE("mesh: axis groups partition the devices", "[mesh]") {
  Mesh m = Mesh::parse("x=2,y=3,z=2");
  for (std::vector<std::string> axes : std::vector<std::vector<std::string>>{
           {}, {"x"}, {"y"}, {"z"}, {"x", "y"}, {"y", "x"}, {"x", "z"}, {"x", "y", "z"}, {"z", "y"}}) {
    auto groups = m.groups(axes);
    std::set<int64_t> seen;
    for (const auto& grp : groups) {
      REQUIRE(static_cast<int64_t>(grp.size()) == m.axes_size(axes));
      for (std::size_t r = 0; r < grp.size(); ++r) {
        REQUIRE(seen.insert(grp[r]).second);
        REQUIRE(m.index_in_group(grp[r], axes) == static_cast<int64_t>(r));
        REQUIRE(m.group(grp[r], axes) == grp);
        // members differ only along the group's axes
        auto c0 = m.coords(grp[0]), c = m.coords(grp[r]);
        for (int i = 0; i < m.rank(); ++i) {
          bool in_group = false;
          for (auto& a : axes) in_group = in_group || m.axis_index(a) == i;
          if (!in_group) REQUIRE(c0[i] == c[i]);
        }
      }
    }
    REQUIRE(static_cast<int64_t>(seen.size()) == m.num_devices());
  }
}

TEST_CASE("mesh: bad meshes are rejected with a clear error", "[mesh][errors]") {
  REQUIRE_THROWS_WITH(Mesh({{"a", 2}, {"a", 2}}), Catch::Contains("appears twice"));
  REQUIRE_THROWS_WITH(Mesh({{"", 2}}), Catch::Contains("empty name"));
  REQUIRE_THROWS_WITH(Mesh({{"a", 0}}), Catch::Contains("size 0"));
  REQUIRE_THROWS_WITH(Mesh({{"a", 2}}, {0, 1, 2}), Catch::Contains("3 device ids"));
  REQUIRE_THROWS_WITH(Mesh({{"a", 2}}, {1, 1}), Catch::Contains("distinct"));
  REQUIRE_THROWS_AS(Mesh::parse("data=,model=4"), MeshError);
  REQUIRE_THROWS_AS(Mesh::parse("data"), MeshError);
  // ':' is not the separator (it used to be accepted silently), and an empty spec is no mesh.
  REQUIRE_THROWS_WITH(Mesh::parse("data:2"), Catch::Contains("data=SIZE") && Catch::Contains("not ':'"));
  REQUIRE_THROWS_WITH(Mesh::parse("data=2,model:4"), Catch::Contains("model=SIZE"));
  REQUIRE_THROWS_WITH(Mesh::parse(""), Catch::Contains("empty mesh") && Catch::Contains("data=2,model=4"));
  REQUIRE_THROWS_WITH(Mesh::parse("  "), Catch::Contains("empty mesh"));
  REQUIRE_THROWS_WITH(Mesh::parse("{}"), Catch::Contains("empty mesh"));
  // One ',' between axes, braces only as one matched pair: each stray separator is an error at
  // its column (these used to parse as data=2 or data=2,model=2).
  REQUIRE_THROWS_WITH(Mesh::parse("data=2,"), Catch::Contains("column 8") && Catch::Contains("after ','"));
  REQUIRE_THROWS_WITH(Mesh::parse(",data=2"), Catch::Contains("column 1") && Catch::Contains("expected name=size"));
  REQUIRE_THROWS_WITH(Mesh::parse("data=2,,model=2"), Catch::Contains("column 8") && Catch::Contains("no empty axis"));
  REQUIRE_THROWS_WITH(Mesh::parse("data=2}"), Catch::Contains("column 7") && Catch::Contains("unexpected '}'"));
  REQUIRE_THROWS_WITH(Mesh::parse("{data=2"), Catch::Contains("closing '}'"));
  REQUIRE_THROWS_WITH(Mesh::parse("data=2 model=2"),
                      Catch::Contains("column 8") && Catch::Contains("separate axes with ','"));
  REQUIRE_THROWS_WITH(Mesh::parse("a=2").axis_size("b"), Catch::Contains("no axis 'b'"));
}

TEST_CASE("sharding: text form round trips", "[sharding]") {
  for (const char* t : {"[{data}, {}, {model}]", "[{}, {}] partial{model}", "[{data, model}, {?}]",
                        "[{data, ?}, {model}] partial{x, y}", "[]"}) {
    Sharding s = Sharding::parse(t);
    REQUIRE(s.to_string() == t);
    REQUIRE(Sharding::parse(s.to_string()) == s);
  }
  REQUIRE(Sharding::parse("[{data},{ }]") == Sharding::of({{"data"}, {}}));
  REQUIRE(!Sharding::parse("[{?}]").dims[0].closed);
}

TEST_CASE("sharding: parse errors give the column", "[sharding][errors]") {
  REQUIRE_THROWS_WITH(Sharding::parse("[{data}"), Catch::Contains("column 8"));
  REQUIRE_THROWS_WITH(Sharding::parse("[{data}] partial"), Catch::Contains("expected '{'"));
  REQUIRE_THROWS_WITH(Sharding::parse("{data}"), Catch::Contains("expected '['"));
  REQUIRE_THROWS_AS(Sharding::parse("[{1x}] junk"), ParseError);
}

TEST_CASE("sharding: validation names tensor / dim / axis and the fix", "[sharding][errors]") {
  Mesh m = Mesh::parse("data=2,model=4");
  REQUIRE_THROWS_WITH(Sharding::of({{"nope"}, {}}).validate(m, {8, 8}, "%x"),
                      Catch::Contains("%x") && Catch::Contains("axis 'nope'"));
  REQUIRE_THROWS_WITH(Sharding::of({{"data"}, {"data"}}).validate(m, {8, 8}, "%x"),
                      Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(Sharding::of({{"data"}, {}}, {"data"}).validate(m, {8, 8}, "%x"),
                      Catch::Contains("both"));
  REQUIRE_THROWS_WITH(Sharding::of({{}, {"model"}}).validate(m, {8, 19}, "%x"),
                      Catch::Contains("19") && Catch::Contains("not divisible") &&
                          Catch::Contains("multiple of 4"));
  REQUIRE_THROWS_WITH(Sharding::of({{}}).validate(m, {8, 8}, "%x"), Catch::Contains("rank 2"));
  REQUIRE_NOTHROW(Sharding::of({{"data", "model"}, {}}).validate(m, {8, 3}, "%x"));
}

TEST_CASE("property: shards tile the global tensor exactly once per replica", "[sharding][property]") {
  uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(300);
  tessel_test::announce("property: shards tile the global tensor exactly once per replica", seed, cases);
  INFO("seed " << seed << " (TESSEL_SEED reproduces)");
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < cases; ++iter) {
    Mesh mesh = tessel_test::random_mesh(rng);
    Shape shape;
    Sharding s = tessel_test::random_sharding(rng, mesh, shape, false);
    INFO("mesh " << mesh.to_string() << " shape " << shape_str(shape) << " sharding " << s.to_string());
    s.validate(mesh, shape, "t");
    int64_t replicas = mesh.num_devices() / mesh.axes_size(s.tiled_axes());
    std::vector<int> count(static_cast<std::size_t>(num_elements(shape)), 0);
    Shape local = s.local_shape(mesh, shape);
    for (int64_t p = 0; p < mesh.num_devices(); ++p) {
      auto off = s.local_offset(mesh, shape, p);
      for (int64_t i = 0; i < num_elements(local); ++i) {
        int64_t rem = i, flat = 0;
        std::vector<int64_t> idx(shape.size());
        for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
          idx[d] = rem % local[d] + off[d];
          rem /= local[d];
        }
        for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
        ++count[static_cast<std::size_t>(flat)];
      }
    }
    for (int c : count) REQUIRE(c == replicas);
  }
}

// Regression (fuzz_mesh_sharding timeout, input "{xdata=10838810 "): a mesh of 10.8 million
// devices was built (a per-device table of that size on every parse). Meshes are capped at
// Mesh::kMaxDevices = 2^20 and refused before anything is allocated.
TEST_CASE("mesh: an absurdly large mesh is refused before it is allocated", "[mesh][regression]") {
  CHECK_THROWS_AS(Mesh::parse("{xdata=10838810 }"), MeshError);
  CHECK_THROWS_AS(Mesh::parse("a=1024,b=1025"), MeshError);
  CHECK(Mesh::parse("a=1024,b=1024").num_devices() == Mesh::kMaxDevices);
  try {
    Mesh::parse("data=2097152");
    FAIL("accepted");
  } catch (const MeshError& e) {
    CHECK(std::string(e.what()).find("1048576") != std::string::npos);
  }
}
