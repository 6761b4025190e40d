// tests/unit/checkpoint_util.hpp — what the checkpoint tests share: a temporary folder removed
// at the end, seeded random tensors of any dtype, and bit-for-bit equality.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "tessel/runtime/tensor.hpp"

namespace tessel_test {

// A fresh folder path under the temp directory (not created), removed with its contents at
// the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& what)
      : path((std::filesystem::temp_directory_path() /
              ("tessel-ckpt-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand())))
                 .string()) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline tessel::HostTensor random_tensor(tessel::DType t, const tessel::Shape& s, std::mt19937_64& rng) {
  tessel::HostTensor h(t, s);
  std::normal_distribution<double> n(0, 3);
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, t == tessel::DType::i32 ? std::round(n(rng) * 1000) : n(rng));
  return h;
}

inline bool same_bits(const tessel::HostTensor& a, const tessel::HostTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace tessel_test
