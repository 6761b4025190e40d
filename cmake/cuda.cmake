# The CUDA backend: built only when TESSEL_WITH_CUDA is ON (a CUDA compiler was found).
# Public headers never include CUDA; kernels/ holds .cu files behind host launchers.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
file(GLOB TESSEL_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cu)
if(TESSEL_CUDA_SOURCES)
  add_library(tessel_cuda ${TESSEL_CUDA_SOURCES})
  add_library(tessel::cuda ALIAS tessel_cuda)
  target_link_libraries(tessel_cuda PUBLIC tessel CUDA::cudart CUDA::cublasLt)
else()
  message(STATUS "tessel: CUDA compiler found; no CUDA kernels yet (kernels/ is empty)")
endif()
