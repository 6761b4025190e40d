// tessel-explain's views added with issue 6: --show VALUE (the mesh grid of a value's
// blocks), the peak bytes per device of the memory plan in the cost section, --links @FILE
// (a calibration file), and the warnings of tessel/compiler/checks.hpp.
#include <catch2/catch.hpp>

#include <string>

#include "run_binary.hpp"

using tessel_test::run_binary;
using tessel_test::temp_file;

namespace {

const std::string kMegatron = std::string(TESSEL_SOURCE_DIR) + "/tests/golden/megatron_mlp.tsl";
const std::string kCollectives = "collectives: all-gather=";

std::string last_line(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const auto p = s.rfind('\n');
  return p == std::string::npos ? s : s.substr(p + 1);
}

}  // namespace

TEST_CASE("cli: --show draws where a value lives on the mesh", "[integration][cli]") {
  const auto r = run_binary("tessel-explain", {kMegatron, "--show", "w1", "--show", "%x"});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("== where %w1 lives"));
  CHECK_THAT(r.out, Catch::Contains("%w1 f32[512,2048] sharding [{}, {model}] on mesh {data=2, model=4}"));
  CHECK_THAT(r.out, Catch::Contains("data=0  #0 [:, 0:512]"));
  CHECK_THAT(r.out, Catch::Contains("#7 [:, 1536:2048]"));
  CHECK_THAT(r.out, Catch::Contains("== where %x lives"));
  CHECK_THAT(last_line(r.out), Catch::StartsWith(kCollectives));
  // A partial value is marked.
  const auto h = run_binary("tessel-explain", {kMegatron, "--show", "y"});
  INFO(h.out);
  CHECK_THAT(h.out, Catch::Contains("partial over {model}"));
  // An unknown value is a usage error naming it.
  const auto bad = run_binary("tessel-explain", {kMegatron, "--show", "nope"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.out, Catch::Contains("no value %nope"));
}

TEST_CASE("cli: the cost section gives the peak bytes per device before a run", "[integration][cli]") {
  const auto r = run_binary("tessel-explain", {kMegatron});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Matches(R"([\s\S]*\npeak_bytes_per_device=[0-9]+ \(arena [0-9]+, inputs [0-9]+, outputs [0-9]+\)\n[\s\S]*)"));
  // The estimate equals what --run reports.
  const auto run = run_binary("tessel-explain", {kMegatron, "--run", "--seed", "3"}, 300);
  INFO(run.out);
  REQUIRE(run.status == 0);
  const auto number = [](const std::string& s, const std::string& key) {
    const auto at = s.rfind(key);
    REQUIRE(at != std::string::npos);
    return std::stoll(s.substr(at + key.size()));
  };
  const long long planned = number(run.out, "planned_peak_bytes_per_device=");
  CHECK(number(r.out, "\npeak_bytes_per_device=") == planned);
  // What the allocators measured: the plan's buffers, plus any kernel scratch.
  CHECK(number(run.out, "measured_peak_bytes_per_device=") >= planned);
}

TEST_CASE("cli: --links @FILE reads a link figures file", "[integration][cli]") {
  const std::string f = temp_file("links.txt",
                                  "# written by hand for the test\n"
                                  "model=bw:1e9,alpha:1e-3\n"
                                  "data=bw:2e9\n");
  const auto fast = run_binary("tessel-explain", {kMegatron});
  const auto slow = run_binary("tessel-explain", {kMegatron, "--links", "@" + f});
  INFO(slow.out);
  REQUIRE(slow.status == 0);
  CHECK_THAT(slow.out, Catch::Contains("link model: 1 GB/s, alpha 1000 us (from " + f + ")"));
  CHECK_THAT(slow.out, Catch::Contains("link data: 2 GB/s"));
  // Same program, slower links: comm_s grows (the collectives stay the same).
  const auto comm = [](const std::string& out) {
    const auto p = out.find("comm_s=");
    return p == std::string::npos ? -1.0 : std::stod(out.substr(p + 7));
  };
  CHECK(comm(slow.out) > comm(fast.out));
  CHECK(last_line(slow.out) == last_line(fast.out));
  // A bad file or a missing one is a usage error naming it.
  const std::string bad = temp_file("bad_links.txt", "model=bw:fast\n");
  const auto b = run_binary("tessel-explain", {kMegatron, "--links", "@" + bad});
  CHECK(b.status == 2);
  CHECK_THAT(b.out, Catch::Contains(bad) && Catch::Contains("not a number"));
  const auto m = run_binary("tessel-explain", {kMegatron, "--links", "@/nonexistent/links.txt"});
  CHECK(m.status == 2);
  CHECK_THAT(m.out, Catch::Contains("/nonexistent/links.txt"));
}

TEST_CASE("cli: warnings for an unused mesh axis and for no annotation", "[integration][cli]") {
  const std::string unused = temp_file("unused_axis.tsl",
                                       "mesh data=2, model=4\n%x = input f32[8,4] sharding=[{data}, {}]\n"
                                       "%y = relu(%x)\noutput %y\n");
  const auto r = run_binary("tessel-explain", {unused});
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("== warnings\nwarning: mesh axis 'model' (size 4) is used by no value"));
  const std::string none = temp_file("no_annotation.tsl", "mesh data=2\n%x = input f32[8,4]\n%y = relu(%x)\noutput %y\n");
  const auto n = run_binary("tessel-explain", {none});
  INFO(n.out);
  REQUIRE(n.status == 0);
  CHECK_THAT(n.out, Catch::Contains("warning: no value is annotated"));
  CHECK_THAT(last_line(n.out), Catch::StartsWith(kCollectives));
}
