# The CUDA backend (tessel::cuda): built only when TESSEL_WITH_CUDA is ON (a CUDA compiler was
# found). Public headers never include CUDA: src/runtime/cuda/kernels/ holds the .cu files (one per op family, as the CPU's cpu_kernels_*.cpp) behind plain host
# launchers (launchers.hpp), src/runtime/cuda/ the backend, the virtual-device and NCCL
# communicators (C++ files that include the CUDA runtime, cuBLASLt and NCCL headers).
#
# Architectures: the local GPU's when one is present (nvidia-smi lists it: "native"), else
# sm_90 alone (H100/H200), real SASS only, so a build without a GPU compiles every kernel once.
# All architectures on request: -DCMAKE_CUDA_ARCHITECTURES=all (or any list, e.g. "80-real;90-real").
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(_tessel_cuda_arch 90-real)
  find_program(TESSEL_NVIDIA_SMI nvidia-smi)
  if(TESSEL_NVIDIA_SMI)
    execute_process(COMMAND ${TESSEL_NVIDIA_SMI} -L OUTPUT_VARIABLE _gpus RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0 AND _gpus MATCHES "GPU [0-9]")
      set(_tessel_cuda_arch native)
    endif()
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${_tessel_cuda_arch} CACHE STRING "CUDA architectures of tessel::cuda")
  message(STATUS "tessel: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
# One CUDA runtime, the shared libcudart: tessel_cuda links CUDA::cudart, and CMake would otherwise
# add the static cudart (its default) to every executable linking the CUDA objects: two runtimes
# with separate state in one process. The variable sets the property of every target made from
# here on (the tests, examples and benchmarks); tessel_cuda's is set below as well.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)
# FindCUDAToolkit makes CUDA::cudart and CUDA::cublasLt only where it finds the unversioned
# libcudart.so / libcublasLt.so: say so here rather than at link time.
foreach(_lib cudart cublasLt nvrtc)
  if(NOT TARGET CUDA::${_lib})
    message(FATAL_ERROR "tessel: the CUDA backend needs lib${_lib}.so, not found in ${CUDAToolkit_LIBRARY_DIR} "
                        "(found: '${CUDA_${_lib}_LIBRARY}'). FindCUDAToolkit looks for the unversioned name: install "
                        "the toolkit's development files or add a link lib${_lib}.so -> lib${_lib}.so.<major>; or "
                        "configure with -DTESSEL_WITH_CUDA=OFF")
  endif()
endforeach()

file(GLOB TESSEL_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels/*.cu
     ${PROJECT_SOURCE_DIR}/src/runtime/cuda/*.cpp)
# cuda_stub.cpp stands in for the backend in a build without CUDA (CMakeLists.txt); gemm_plan.cpp
# (the host-only einsum planner) and nccl_core.cpp (the NCCL world's host logic) are in
# tessel::cuda_host, in every build.
list(FILTER TESSEL_CUDA_SOURCES EXCLUDE REGEX "/(cuda_stub|gemm_plan|nccl_core)\\.cpp$")

# NCCL ships with the CUDA toolkit here (nccl.h and libnccl next to cudart); elsewhere point
# NCCL_ROOT at an install (e.g. the nvidia-nccl-cu13 wheel's nvidia/nccl folder).
find_path(TESSEL_NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
# The wheel has only libnccl.so.2 (no unversioned libnccl.so): both names are looked for.
find_library(TESSEL_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64)
if(TESSEL_NCCL_INCLUDE_DIR AND TESSEL_NCCL_LIBRARY)
  set(_tessel_nccl_default ON)
else()
  set(_tessel_nccl_default OFF)
endif()
option(TESSEL_WITH_NCCL "Build the NCCL communicator of the CUDA backend" ${_tessel_nccl_default})
if(TESSEL_WITH_NCCL AND NOT (TESSEL_NCCL_INCLUDE_DIR AND TESSEL_NCCL_LIBRARY))
  message(FATAL_ERROR "tessel: TESSEL_WITH_NCCL=ON but NCCL was not found (nccl.h: '${TESSEL_NCCL_INCLUDE_DIR}', "
                      "libnccl: '${TESSEL_NCCL_LIBRARY}'), looked for in NCCL_ROOT='${NCCL_ROOT}' (or $ENV{NCCL_ROOT}) "
                      "and the CUDA toolkit: set -DNCCL_ROOT to a folder with include/nccl.h and lib/libnccl.so[.2] "
                      "(e.g. the nvidia-nccl-cu13 wheel's nvidia/nccl), or -DTESSEL_WITH_NCCL=OFF")
endif()
set(_tessel_nccl_version "")
if(TESSEL_WITH_NCCL AND EXISTS ${TESSEL_NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${TESSEL_NCCL_INCLUDE_DIR}/nccl.h _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^;]*NCCL_[A-Z]+ +([0-9]+)[^;]*" "\\1" _v "${_v}")
  string(REPLACE ";" "." _tessel_nccl_version "${_v}")
endif()
# What the build uses, for the log of a GPU run (scripts/gpu-check greps these lines).
message(STATUS "tessel: CUDA: nvcc ${CMAKE_CUDA_COMPILER} ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
               "${CMAKE_CUDA_ARCHITECTURES}")
message(STATUS "tessel: CUDA: cudart ${CUDA_cudart_LIBRARY} (shared), cuBLASLt ${CUDA_cublasLt_LIBRARY}")
if(TESSEL_WITH_NCCL)
  message(STATUS "tessel: NCCL ${_tessel_nccl_version}: ${TESSEL_NCCL_LIBRARY} (nccl.h in ${TESSEL_NCCL_INCLUDE_DIR})")
else()
  message(STATUS "tessel: NCCL: off (make_nccl_world throws; -DTESSEL_WITH_NCCL=ON requires it)")
endif()

# The fused-expression JIT (src/runtime/cuda/fused_jit.cpp) compiles the elementwise ops' own
# per-element code into its kernels: the two headers' texts are embedded here.
file(READ ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels/elementwise_ops.hpp _tessel_jit_ops)
file(READ ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels/elementwise_math.cuh _tessel_jit_math)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels/elementwise_ops.hpp
             ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels/elementwise_math.cuh)
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/generated/fused_jit_headers.cpp CONTENT
"// generated by cmake/cuda.cmake from src/runtime/cuda/kernels/elementwise_ops.hpp and elementwise_math.cuh
namespace tessel::cuda {
extern const char* const kFusedJitOpsHeader;
extern const char* const kFusedJitMathHeader;
const char* const kFusedJitOpsHeader = R\"tessel_jit(${_tessel_jit_ops})tessel_jit\";
const char* const kFusedJitMathHeader = R\"tessel_jit(${_tessel_jit_math})tessel_jit\";
}  // namespace tessel::cuda
" @ONLY)
list(APPEND TESSEL_CUDA_SOURCES ${CMAKE_BINARY_DIR}/generated/fused_jit_headers.cpp)

add_library(tessel_cuda ${TESSEL_CUDA_SOURCES})
add_library(tessel::cuda ALIAS tessel_cuda)
target_include_directories(tessel_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(tessel_cuda PUBLIC tessel_factory PRIVATE CUDA::cudart CUDA::cublasLt CUDA::nvrtc fmt::fmt)
set_target_properties(tessel_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME cuda CUDA_RUNTIME_LIBRARY Shared)
target_compile_options(tessel_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TESSEL_WARNINGS}>
                       $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall --expt-relaxed-constexpr>)
if(TESSEL_WITH_NCCL)
  target_include_directories(tessel_cuda PRIVATE ${TESSEL_NCCL_INCLUDE_DIR})
  target_link_libraries(tessel_cuda PRIVATE ${TESSEL_NCCL_LIBRARY})
  target_compile_definitions(tessel_cuda PRIVATE TESSEL_HAVE_NCCL=1)
endif()
# Installed by cmake/install.cmake, after its check that everything an install needs is built.
