# Install rules of clattn (included by the top CMakeLists.txt when CLATTN_INSTALL is ON):
#   lib/libclattn.a, include/clattn/*.h, bin/clattn (when the CLI is built),
#   lib/cmake/clattn/  clattnConfig.cmake, clattnConfigVersion.cmake, clattnTargets*.cmake
#                      -> find_package(clattn) gives clattn::clattn
#   lib/pkgconfig/clattn.pc
#   share/doc/clattn/LICENSE (MIT; also clattn_LICENSE in the CMake package)
# (lib is CMAKE_INSTALL_LIBDIR from GNUInstallDirs: lib/<multiarch> under /usr on Debian.)
# Both the CMake package and clattn.pc are relocatable, so `cmake --install build --prefix P`
# gives a working package in P whatever CMAKE_INSTALL_PREFIX was at configure time.
include(CMakePackageConfigHelpers)

set(CLATTN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/clattn)

install(TARGETS clattn EXPORT clattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET clattn_cli)
  install(TARGETS clattn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/clattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})

install(EXPORT clattnTargets NAMESPACE clattn:: DESTINATION ${CLATTN_CMAKE_DIR}
        FILE clattnTargets.cmake)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/clattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/clattnConfig.cmake INSTALL_DESTINATION ${CLATTN_CMAKE_DIR})
# 0.x: minor versions may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/clattnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/clattnConfig.cmake ${PROJECT_BINARY_DIR}/clattnConfigVersion.cmake
        DESTINATION ${CLATTN_CMAKE_DIR})

# clattn.pc: prefix relative to the .pc file's own directory (${pcfiledir}, pkg-config and pkgconf).
set(_pcdir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(CLATTN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _up "/_root/${_pcdir}" "/_root")
  string(REGEX REPLACE "/$" "" _up "${_up}")
  set(CLATTN_PC_PREFIX "\${pcfiledir}/${_up}")
endif()
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(CLATTN_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(CLATTN_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
# Link needs of the static library, in link order after -lclattn: OpenMP (libgomp via the
# compiler flag), the OpenMP build of OpenBLAS by absolute path (that directory has no
# libopenblas.so for -l to find) with a RUNPATH to its directory, libm. A sanitized build also
# needs its runtime.
set(CLATTN_PC_LIBS "${OpenMP_CXX_FLAGS} ${CLATTN_OPENBLAS} -Wl,-rpath,${CLATTN_OPENBLAS_DIR} -lm")
if(CLATTN_MPI)
  # Open MPI's C++ link line (its libraries and flags, as mpicxx would add them).
  string(REPLACE ";" " " _mpi_libs "${MPI_CXX_LIBRARIES}")
  string(APPEND CLATTN_PC_LIBS " ${MPI_CXX_LINK_FLAGS} ${_mpi_libs}")
endif()
if(CLATTN_SANITIZE)
  string(APPEND CLATTN_PC_LIBS " -fsanitize=${_san}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/clattn.pc.in ${PROJECT_BINARY_DIR}/clattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/clattn.pc DESTINATION ${_pcdir})
