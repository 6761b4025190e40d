# Build options, all prefixed TESSEL_.
include(CheckLanguage)
option(TESSEL_BUILD_TESTS "Build the test suite" ON)
option(TESSEL_BUILD_BENCHMARKS "Build tessel-bench (Google Benchmark)" ON)
option(TESSEL_LINK_CHECKS "Link each floor's library whole into a program of its own (CTest 'layering: ...')" ON)
option(TESSEL_SANITIZE_ADDRESS "Build with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
option(TESSEL_SANITIZE_THREAD "Build with ThreadSanitizer" OFF)

# CUDA defaults to ON only where a CUDA compiler is found.
# The GPU recipe (scripts/gpu-check) configures with TESSEL_REQUIRE_CUDA=ON: the CUDA backend with
# cuBLASLt must be built, and a missing piece is a configure error, not a build without it
# (cmake/cuda.cmake; -DTESSEL_WITH_NCCL=ON does the same for NCCL).
option(TESSEL_REQUIRE_CUDA "Fail the configure unless the CUDA backend (nvcc, cudart, cuBLASLt) can be built" OFF)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER AND (TESSEL_REQUIRE_CUDA OR TESSEL_WITH_CUDA) AND EXISTS /usr/local/cuda/bin/nvcc)
  # check_language looks only at PATH, CUDACXX and CUDA_PATH; asked for CUDA, the toolkit's usual home too.
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler" FORCE)
endif()
if(CMAKE_CUDA_COMPILER)
  set(_tessel_cuda_default ON)
else()
  set(_tessel_cuda_default OFF)
endif()
option(TESSEL_WITH_CUDA "Build the CUDA + NCCL backend" ${_tessel_cuda_default})
if(TESSEL_REQUIRE_CUDA AND NOT TESSEL_WITH_CUDA)
  message(FATAL_ERROR "tessel: TESSEL_REQUIRE_CUDA=ON but TESSEL_WITH_CUDA is OFF (cached from an earlier configure "
                      "without nvcc?): pass -DTESSEL_WITH_CUDA=ON too")
endif()
if(TESSEL_WITH_CUDA AND NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "tessel: the CUDA backend was asked for (TESSEL_WITH_CUDA/TESSEL_REQUIRE_CUDA) but no CUDA "
                      "compiler (nvcc) was found on PATH, through CUDACXX or CUDA_PATH, or at /usr/local/cuda/bin/nvcc: "
                      "pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc, or -DTESSEL_WITH_CUDA=OFF for a CPU-only build")
endif()

# MPI (the multi-process runtime, docs/runtime-mpi.md) defaults to ON where MPI is found.
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  set(_tessel_mpi_default ON)
else()
  set(_tessel_mpi_default OFF)
endif()
option(TESSEL_WITH_MPI "Build the MPI runtime (MpiRuntime; needs an MPI with MPI_THREAD_MULTIPLE)" ${_tessel_mpi_default})

# oneDNN (Debian's libdnnl-dev) runs the CPU backend's einsums as batched matmuls
# (docs/cpu-backend.md); defaults to ON where its CMake package is found. OFF: Eigen only.
find_package(dnnl CONFIG QUIET)
if(dnnl_FOUND)
  set(_tessel_onednn_default ON)
else()
  set(_tessel_onednn_default OFF)
endif()
option(TESSEL_WITH_ONEDNN "Run CPU einsums on oneDNN matmuls (Eigen stays the fallback)" ${_tessel_onednn_default})

option(TESSEL_NATIVE "Compile for the build machine's CPU (-march=native): Eigen then uses AVX/FMA" ON)

# Warnings: -Wall -Wextra on the project's own code (library, tests, examples, benchmarks,
# fuzzers). TESSEL_WERROR turns them into errors; it defaults to ON under CI (the CI
# environment variable set and not "false"), so a change that adds a warning fails there.
if(DEFINED ENV{CI} AND NOT "$ENV{CI}" STREQUAL "" AND NOT "$ENV{CI}" STREQUAL "false")
  set(_tessel_werror_default ON)
else()
  set(_tessel_werror_default OFF)
endif()
option(TESSEL_WERROR "Treat compiler warnings in tessel's own code as errors" ${_tessel_werror_default})
set(TESSEL_WARNINGS -Wall -Wextra)
if(TESSEL_WERROR)
  list(APPEND TESSEL_WARNINGS -Werror)
endif()
if(TESSEL_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 warns inside its own AVX-512 intrinsics headers when Eigen uses them (GCC bug
    # 105593, a false positive in avx512fintrin.h: -Wmaybe-uninitialized at -O2/-O3,
    # -Wuninitialized at -O1). Only the Eigen kernels include them (the kernel families
    # cpu_kernels*.cpp, their shared cpu_kernel_util.cpp, cpu_fused.cpp); silence it there.
    file(GLOB TESSEL_EIGEN_KERNEL_SOURCES CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/src/runtime/cpu/cpu_kernels*.cpp
         ${PROJECT_SOURCE_DIR}/src/runtime/cpu/cpu_kernel_util.cpp
         ${PROJECT_SOURCE_DIR}/src/runtime/cpu/cpu_fused.cpp)
    set_source_files_properties(${TESSEL_EIGEN_KERNEL_SOURCES} PROPERTIES
      COMPILE_OPTIONS "-Wno-maybe-uninitialized;-Wno-uninitialized")
  endif()
endif()
# libFuzzer targets (fuzz/): clang only. Everything, the library included, is built with
# coverage instrumentation for libFuzzer and ASan + UBSan (float-cast-overflow too, which
# GCC's -fsanitize=undefined lacks); use a build directory of its own (scripts/fuzz).
option(TESSEL_BUILD_FUZZERS "Build the libFuzzer targets in fuzz/ (clang only)" OFF)
if(TESSEL_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TESSEL_BUILD_FUZZERS needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++, as scripts/fuzz does")
  endif()
  if(TESSEL_SANITIZE_ADDRESS OR TESSEL_SANITIZE_THREAD)
    message(FATAL_ERROR "TESSEL_BUILD_FUZZERS brings its own sanitizers: leave "
                        "TESSEL_SANITIZE_ADDRESS and TESSEL_SANITIZE_THREAD off")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow
                      -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined,float-cast-overflow)
endif()
if(TESSEL_SANITIZE_ADDRESS AND TESSEL_SANITIZE_THREAD)
  message(FATAL_ERROR "TESSEL_SANITIZE_ADDRESS and TESSEL_SANITIZE_THREAD are exclusive")
endif()
if(TESSEL_SANITIZE_ADDRESS)
  # float-cast-overflow is part of clang's "undefined" group but not GCC's; name it for
  # clang (scripts/test-sanitizers builds this mode with clang when it is installed).
  set(_tessel_ubsan undefined)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(_tessel_ubsan undefined,float-cast-overflow)
  endif()
  add_compile_options(-fsanitize=address,${_tessel_ubsan} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,${_tessel_ubsan})
endif()
if(TESSEL_SANITIZE_THREAD)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
