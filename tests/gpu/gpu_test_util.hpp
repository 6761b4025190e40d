// Helpers of the GPU tests: skipping (exit code 77, CTest's SKIP_RETURN_CODE for this binary:
// Debian's Catch2 2.13 has no SKIP) and their GPT. The kernel-level harness is
// tests/unit/kernel_check.hpp (shared with the CPU suite).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/models/gpt.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel_gpu_test {

constexpr int kSkipCode = 77;

// Ends the process as SKIPPED: each CTest test runs one TEST_CASE in its own process.
[[noreturn]] inline void skip(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(kSkipCode);
}

// The GPT of the GPU tests: batch 4, seq 16, d_model 32, 4 heads, vocab 64.
inline tessel::GptGraph tiny_gpt(int64_t layers) {
  tessel::GptConfig cfg;
  cfg.batch = 4, cfg.seq = 16, cfg.d_model = 32, cfg.heads = 4, cfg.layers = layers, cfg.vocab = 64;
  return tessel::build_gpt(cfg);
}

}  // namespace tessel_gpu_test
