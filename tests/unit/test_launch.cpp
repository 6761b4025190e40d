// Launch detection from torchrun-style variables and the shared-file rendezvous (launch.hpp),
// with threads standing in for processes.
#include <catch2/catch.hpp>
#include <fmt/format.h>

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
