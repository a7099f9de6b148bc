# weft as a package for other projects, included by the top CMakeLists.txt once
# every library and tools/weftrun are defined:
#   - weft::weft, one target for all of weft's libraries;
#   - in the build tree, when weft is added with add_subdirectory, a folder in
#     which weft/<folder> is each library's source folder, so that
#     <weft/rpc/agent.h> works there too (see weft_public_target);
#   - the install rules of `cmake --install <build> --prefix P`:
#       P/lib/libweft_<name>.a                   every library
#       P/include/weft/<folder>/*.h              their headers, and the generated rpc/protocol.capnp.h
#       P/bin/weftrun                            the launcher
#       P/lib/cmake/weft/                        weftConfig.cmake, weftConfigVersion.cmake,
#                                                weftTargets*.cmake, WeftDependencies.cmake
#     (lib is CMAKE_INSTALL_LIBDIR). find_package(weft) then defines weft::<name>
#     for each library, weft::weft and weft::weftrun; weftConfig.cmake finds
#     weft's dependencies as the build did.

include(CMakePackageConfigHelpers)

get_property(weft_libraries GLOBAL PROPERTY WEFT_PUBLIC_TARGETS)

add_library(weft_all INTERFACE)
weft_public_target(weft_all weft)
target_link_libraries(weft_all INTERFACE ${weft_libraries})

add_executable(weft::weftrun ALIAS weftrun)

# The folder of each library's headers, relative to the source root.
set(weft_header_folders "")
foreach(target IN LISTS weft_libraries)
  get_target_property(dir ${target} SOURCE_DIR)
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${dir})
  list(APPEND weft_header_folders ${folder})
endforeach()

# ---- the build tree, added to another project --------------------------------------
if(NOT PROJECT_IS_TOP_LEVEL)
  file(MAKE_DIRECTORY ${WEFT_PREFIXED_INCLUDE_DIR}/weft)
  foreach(folder IN LISTS weft_header_folders)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${WEFT_PREFIXED_INCLUDE_DIR}/weft/${folder} SYMBOLIC)
  endforeach()
endif()

# ---- install -----------------------------------------------------------------------
set(WEFT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/weft)

install(TARGETS ${weft_libraries} weft_all weftrun EXPORT weftTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

foreach(folder IN LISTS weft_header_folders)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/${folder}
    FILES_MATCHING PATTERN "*.h")
endforeach()
# Headers generated in the build tree (rpc/protocol.capnp.h), next to their folder's own.
get_property(weft_generated_headers GLOBAL PROPERTY WEFT_GENERATED_HEADERS)
foreach(header IN LISTS weft_generated_headers)
  file(RELATIVE_PATH relative ${PROJECT_BINARY_DIR} ${header})
  get_filename_component(folder ${relative} DIRECTORY)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weft/${folder})
endforeach()

install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_INSTALL_CMAKEDIR})

# What the installed config needs to know of this build.
if(WEFT_HAVE_CUDA)
  get_filename_component(WEFT_CUDA_TOOLKIT_ROOT ${CUDAToolkit_BIN_DIR} DIRECTORY)
else()
  set(WEFT_CUDA_TOOLKIT_ROOT "")
endif()
if(NOT DEFINED WEFT_HAVE_NCCL)
  set(WEFT_HAVE_NCCL OFF)
endif()
if(TARGET weft_rpc)
  set(WEFT_HAVE_DISTRIBUTED ON)
else()
  set(WEFT_HAVE_DISTRIBUTED OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/weftConfig.cmake.in
  ${PROJECT_BINARY_DIR}/weftConfig.cmake
  INSTALL_DESTINATION ${WEFT_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/weftConfig.cmake
  ${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/WeftDependencies.cmake
  DESTINATION ${WEFT_INSTALL_CMAKEDIR})
