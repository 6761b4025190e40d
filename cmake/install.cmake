# Install headers, the library and a package config usable by find_package(tessel).
include(CMakePackageConfigHelpers)
# Every tool the README and docs/ document (the examples and tessel-bench, whose
# --calibrate-links writes a cost model's link figures); the GPU and MPI benchmark binaries are
# run from the build tree by scripts/bench-gpu and scripts/bench-mpi and are not installed.
set(TESSEL_INSTALLED_TOOLS)
foreach(t tessel_example_gpt tessel_example_gpt_train tessel_example_gpt_generate tessel_example_mlp tessel_example_train_mlp
          tessel_example_explain tessel_example_plan tessel_example_iopddl tessel_bench)
  if(TARGET ${t})
    list(APPEND TESSEL_INSTALLED_TOOLS ${t})
  endif()
endforeach()
# What an install needs built: scripts/install builds this target, then installs. A plain
# `cmake --install` after a partial build (./scripts/demo builds only the demo) stops first,
# naming what is missing and the command that builds it.
add_custom_target(tessel_installable)
add_dependencies(tessel_installable ${TESSEL_FLOORS} ${TESSEL_INSTALLED_TOOLS})
if(TARGET tessel_cuda)
  add_dependencies(tessel_installable tessel_cuda)
endif()
set(_tessel_install_files)
foreach(t ${TESSEL_FLOORS} ${TESSEL_INSTALLED_TOOLS})
  list(APPEND _tessel_install_files "$<TARGET_FILE:${t}>")
endforeach()
if(TARGET tessel_cuda)
  list(APPEND _tessel_install_files "$<TARGET_FILE:tessel_cuda>")
endif()
install(CODE "
  set(_missing)
  foreach(f ${_tessel_install_files})
    if(NOT EXISTS \${f})
      get_filename_component(_n \${f} NAME)
      list(APPEND _missing \${_n})
    endif()
  endforeach()
  if(_missing)
    message(FATAL_ERROR \"tessel: not built yet: \${_missing}. Build what an install needs first: \"
                        \"./scripts/install PREFIX (builds and installs), or cmake --build ${CMAKE_BINARY_DIR} \"
                        \"--target tessel_installable, then cmake --install again\")
  endif()")
install(TARGETS ${TESSEL_INSTALLED_TOOLS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET tessel_cuda)
  install(TARGETS tessel_cuda EXPORT tesselTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(TARGETS tessel ${TESSEL_FLOORS} EXPORT tesselTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/tessel DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tesselTargets NAMESPACE tessel:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
configure_package_config_file(cmake/tesselConfig.cmake.in
  ${CMAKE_BINARY_DIR}/tesselConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/tesselConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/tesselConfig.cmake ${CMAKE_BINARY_DIR}/tesselConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
