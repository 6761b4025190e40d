// Every op kind of the registry has a CUDA kernel, checked on the CPU machine (the CUDA kernel
// table is plain host data: no GPU needed). A new op that gets a CPU kernel but no CUDA one fails
// here, in CI, instead of at load() on the first GPU that runs it (docs/adding-an-op.md). Built
// where the CUDA backend is (TESSEL_TEST_HAVE_CUDA); a build without CUDA has no table to check.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tessel/ops/registry.hpp"
#include "tessel/runtime/cuda/cuda.hpp"

#ifdef TESSEL_TEST_HAVE_CUDA
TEST_CASE("cuda kernels: every op kind of the registry has one (checked without a GPU)", "[cuda][registry]") {
  std::vector<std::string> missing;
  for (tessel::OpKind k : tessel::all_op_kinds())
    if (k != tessel::OpKind::Input && !tessel::cuda_has_kernel(k)) missing.push_back(tessel::op_name(k));
  INFO("op kinds without a CUDA kernel (register one in src/runtime/cuda/cuda_kernels.cpp): "
       << tessel::join(missing, ", "));
  CHECK(missing.empty());
  CHECK_FALSE(tessel::cuda_has_kernel(tessel::OpKind::Input));
}
#endif
