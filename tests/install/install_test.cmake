# Registers the install test (included from tests/CMakeLists.txt): install this build into a
# fresh prefix, configure tests/install/consumer against it through find_package(tessel),
# build it and run it. The work is done by run_install_test.cmake (cmake -P) at test time,
# so it sees the library as built, never a stale install.
set(_tessel_consumer_flags "")
if(TESSEL_SANITIZE_ADDRESS)
  # The installed static library is instrumented; the consumer must link the runtime.
  set(_tessel_consumer_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
elseif(TESSEL_SANITIZE_THREAD)
  set(_tessel_consumer_flags "-fsanitize=thread -fno-omit-frame-pointer")
endif()
add_test(NAME "install: find_package(tessel) consumer builds and runs"
  COMMAND ${CMAKE_COMMAND}
    -DTESSEL_BUILD_DIR=${CMAKE_BINARY_DIR}
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer
    -DWORK_DIR=${CMAKE_BINARY_DIR}/install-test
    -DCONFIG=$<CONFIG>
    "-DGENERATOR=${CMAKE_GENERATOR}"
    -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    "-DCONSUMER_FLAGS=${_tessel_consumer_flags}"
    -P ${CMAKE_CURRENT_LIST_DIR}/run_install_test.cmake)
set_tests_properties("install: find_package(tessel) consumer builds and runs" PROPERTIES
  TIMEOUT 600 LABELS install RUN_SERIAL TRUE)
