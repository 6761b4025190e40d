// Main of the GPU tests: without a GPU every test exits with code 77, which CTest reports as
// SKIPPED (SKIP_RETURN_CODE, tests/gpu/gpu_tests.cmake) — never as passed; with
// TESSEL_REQUIRE_GPU=1 (scripts/gpu-check) it fails instead. Either way it prints why (the CUDA
// error) or which GPU it runs on. Listing the tests (catch_discover_tests at build time) works
// without a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_test_util.hpp"
#include "tessel/runtime/cuda/cuda.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
  if (!listing) {
    if (tessel::cuda_device_count() == 0) {
      const std::string why = "no CUDA GPU is visible to this process: " + tessel::cuda_unavailable_reason();
      const char* require = std::getenv("TESSEL_REQUIRE_GPU");
      if (require && std::string(require) == "1") {
        std::fprintf(stderr, "FAILED (TESSEL_REQUIRE_GPU=1): %s\n", why.c_str());
        return 1;
      }
      tessel_gpu_test::skip(why);
    }
    std::printf("GPU 0: %s\n", tessel::cuda_device_name(0).c_str());
  }
  return Catch::Session().run(argc, argv);
}
