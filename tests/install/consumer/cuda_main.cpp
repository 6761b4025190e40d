// The second kind of consumer: one that links tessel::cuda (installed only when tessel was
// built with CUDA) to run on GPUs. Without a GPU it still links and runs: it says how many
// GPUs it sees and that a CudaRuntime would be refused, with the library's message.
#include <cstdio>
#include <exception>

#include "tessel/tessel.hpp"

int main() {
  if (!tessel::cuda_compiled()) {
    std::printf("tessel::cuda: not compiled in\n");
    return 1;
  }
  const int n = tessel::cuda_device_count();
  std::printf("tessel::cuda linked: %d CUDA device(s) visible\n", n);
  if (n == 0) {
    try {
      tessel::CudaRuntime rt(1);
      std::printf("a CudaRuntime was made without a GPU\n");
      return 1;
    } catch (const std::exception& e) {
      std::printf("no GPU: %s\n", e.what());
    }
  }
  return 0;
}
