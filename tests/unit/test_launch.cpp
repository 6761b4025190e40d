// Launch detection from torchrun-style variables and the shared-file rendezvous (launch.hpp),
// with threads standing in for processes.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "tessel/core/common.hpp"
#include "tessel/runtime/launch.hpp"

using namespace tessel;

TEST_CASE("launch: torchrun-style RANK / WORLD_SIZE / LOCAL_RANK", "[unit][launch]") {
  if (launched_by_mpi()) return;  // the MPI variables take precedence
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  LaunchInfo l = detect_launch();
  CHECK(l.source == "env");
  CHECK(l.rank == 2);
  CHECK(l.world_size == 4);
  CHECK(l.local_rank == 0);
  CHECK(l.local_world_size == 2);
  ::setenv("RANK", "4", 1);
  CHECK_THROWS_WITH(detect_launch(), Catch::Contains("rank 4 is outside world size 4"));
  ::setenv("RANK", "x", 1);
  CHECK_THROWS_WITH(detect_launch(), Catch::Contains("RANK='x'"));
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) ::unsetenv(v);
  CHECK(detect_launch().source == "none");
}

TEST_CASE("launch: file rendezvous exchanges every rank's payload", "[unit][launch]") {
  const std::string dir = fmt::format("{}/rendezvous-test-{}", TESSEL_BINARY_DIR, std::random_device{}());
  const int n = 3;
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] { got[r] = file_rendezvous(dir, "job1", r, n, std::string("id\0") + std::to_string(r), 30); });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) CHECK(got[r][q] == std::string("id\0") + std::to_string(q));
  // The same key with another world size is a stale file, named in the error.
  CHECK_THROWS_WITH(file_rendezvous(dir, "job1", 0, 2, "x", 1), Catch::Contains("stale"));
  // A rank that never comes: a timeout naming it.
  CHECK_THROWS_WITH(file_rendezvous(dir, "job2", 0, 2, "x", 0.05), Catch::Contains("for ranks 1 of 2"));
}

TEST_CASE("launch: sizes of 0 in the environment are errors naming the variables and not SIGFPE", "[unit][launch]") {
  if (launched_by_mpi()) return;
  ::setenv("WORLD_SIZE", "0", 1);
  ::setenv("RANK", "0", 1);
  CHECK_THROWS_WITH(detect_launch(), Catch::Contains("outside world size 0") && Catch::Contains("WORLD_SIZE"));
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_WORLD_SIZE", "0", 1);  // no LOCAL_RANK: it would be RANK % LOCAL_WORLD_SIZE
  CHECK_THROWS_WITH(detect_launch(), Catch::Contains("local world size 0") && Catch::Contains("LOCAL_WORLD_SIZE"));
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) ::unsetenv(v);
}

TEST_CASE("launch: a rendezvous file whose header lies about its size is an error naming it and the rank",
          "[unit][launch]") {
  const std::string dir = fmt::format("{}/rendezvous-bad-{}", TESSEL_BINARY_DIR, std::random_device{}());
  for (const char* bytes : {"-1", "18446744073709551615", "999", "0"}) {
    const std::string key = fmt::format("k{}", bytes[0] == '-' ? std::string("neg") : std::string(bytes));
    const std::string folder = dir + "/" + key;
    REQUIRE(std::system(fmt::format("mkdir -p '{}'", folder).c_str()) == 0);
    {
      std::FILE* f = std::fopen((folder + "/rank-1").c_str(), "wb");
      REQUIRE(f);
      std::fprintf(f, "tessel-rendezvous v1 rank=1 world_size=2 bytes=%s\nabc", bytes);
      std::fclose(f);
    }
    CHECK_THROWS_WITH(file_rendezvous(dir, key, 0, 2, "x", 5),
                      Catch::Contains("rendezvous: rank 0:") && Catch::Contains(folder + "/rank-1") &&
                          Catch::Contains("holds 3 payload bytes"));
  }
}
