# Install headers, the library and a package config usable by find_package(tessel).
include(CMakePackageConfigHelpers)
install(TARGETS tessel ${TESSEL_FLOORS} EXPORT tesselTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/tessel DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(ex tessel_example_explain)
  if(TARGET ${ex})
    install(TARGETS ${ex} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
install(EXPORT tesselTargets NAMESPACE tessel:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
configure_package_config_file(cmake/tesselConfig.cmake.in
  ${CMAKE_BINARY_DIR}/tesselConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/tesselConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/tesselConfig.cmake ${CMAKE_BINARY_DIR}/tesselConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessel)
