# cmake --install: libmeganeura.so, the C headers, the meganeura CLI, a CMake package
# (find_package(meganeura) gives meganeura::meganeura) and a pkg-config file (docs/EMBEDDING.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS meganeura_shared EXPORT meganeuraTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
install(FILES ${CMAKE_SOURCE_DIR}/include/meganeura/meganeura.h
              ${CMAKE_SOURCE_DIR}/include/meganeura/meganeura_vulkan.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/meganeura COMPONENT development)
install(EXPORT meganeuraTargets NAMESPACE meganeura::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura COMPONENT development)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/meganeuraConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/meganeuraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/meganeuraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/meganeuraConfig.cmake
              ${CMAKE_BINARY_DIR}/meganeuraConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura COMPONENT development)
# The .pc file finds its prefix from where it lies, so that --prefix at install time holds.
file(RELATIVE_PATH MEGANEURA_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${CMAKE_SOURCE_DIR}/cmake/meganeura.pc.in ${CMAKE_BINARY_DIR}/meganeura.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/meganeura.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
