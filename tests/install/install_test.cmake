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
# The tools an install puts in bin/ (cmake/install.cmake), each run with --help from there.
set(_tessel_tool_names)
foreach(t ${TESSEL_INSTALLED_TOOLS})
  list(APPEND _tessel_tool_names $<TARGET_FILE_NAME:${t}>)
endforeach()
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
    "-DTOOLS=$<JOIN:${_tessel_tool_names},;>"
    -P ${CMAKE_CURRENT_LIST_DIR}/run_install_test.cmake)
set_tests_properties("install: find_package(tessel) consumer builds and runs" PROPERTIES
  TIMEOUT 600 LABELS install RUN_SERIAL TRUE)

# Issue 36 item 3: the README's order on a fresh clone of this commit: ./scripts/demo (which
# builds only the demo), then a plain `cmake --install` (refused, naming what is not built and
# the command that builds it), then scripts/install PREFIX as README.md documents it, then the
# consumer against that prefix and every tool from its bin/. Builds a second tree from scratch
# (about 8 minutes on 2 cores): RUN_SERIAL, and left out of the sanitizer runs.
find_program(_tessel_git git)
if(_tessel_git AND EXISTS ${PROJECT_SOURCE_DIR}/.git)
  add_test(NAME "install: the README's demo then scripts/install leave a working consumer and every tool"
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/readme_order.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/readme-order
                   "$<JOIN:${_tessel_tool_names}, >")
  set_tests_properties("install: the README's demo then scripts/install leave a working consumer and every tool"
                       PROPERTIES TIMEOUT 2400 LABELS "install;slow" RUN_SERIAL TRUE)
endif()
