// fuzz/fuzz_util.hpp — shared by the libFuzzer targets: how a target reports a broken law.
// A law violation prints what was checked and traps, so libFuzzer saves the input as a crash
// (the library itself never aborts; only the harness does).
#pragma once

#include <cstdio>
#include <string>

namespace tessel_fuzz {

[[noreturn]] inline void law_broken(const std::string& law, const std::string& detail) {
  std::fprintf(stderr, "tessel fuzz: law broken: %s\n%s\n", law.c_str(), detail.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

}  // namespace tessel_fuzz
