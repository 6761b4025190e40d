# The GPU tests (label gpu): tests/gpu/, built whenever tessel::cuda is. Without a GPU each
# test exits 77 and CTest reports it as SKIPPED (never as passed).
if(TARGET tessel_cuda)
  file(GLOB _gpu_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
  add_executable(tessel_tests_gpu ${_gpu_srcs})
  target_link_libraries(tessel_tests_gpu PRIVATE tessel::cuda tessel::tessel Catch2::Catch2 fmt::fmt)
  target_compile_options(tessel_tests_gpu PRIVATE ${TESSEL_TEST_WARNINGS})
  target_compile_definitions(tessel_tests_gpu PRIVATE TESSEL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_include_directories(tessel_tests_gpu PRIVATE ${PROJECT_SOURCE_DIR}/src/runtime/cuda/kernels ${PROJECT_SOURCE_DIR}/src/runtime/cuda)
  catch_discover_tests(tessel_tests_gpu TEST_PREFIX "gpu: "
    PROPERTIES TIMEOUT 600 LABELS gpu SKIP_RETURN_CODE 77 RESOURCE_LOCK gpu)
endif()
