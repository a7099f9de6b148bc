# Shared build settings for every weft target.

# Where weft/<folder> names each library's source folder when weft is added to
# another project (cmake/WeftPackage.cmake).
set(WEFT_PREFIXED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)

set(WEFT_WARNINGS -Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wno-unused-parameter)

if(WEFT_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # WEFT_DCHECK (common/error.h) stays on: a thread-id compare costs nothing next to ASan.
  add_compile_definitions(WEFT_DEBUG_CHECKS)
endif()

# Decides whether the CUDA kernels are built. Sets WEFT_HAVE_CUDA.
macro(weft_configure_cuda)
  set(WEFT_HAVE_CUDA OFF)
  if(NOT WEFT_CUDA STREQUAL "OFF")
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        # Hopper (H100/H200): machine code plus its PTX, one compilation per
        # file (a 2-core CI machine builds every .cu file). Other devices:
        # configure with -DCMAKE_CUDA_ARCHITECTURES=native (or e.g. 80).
        set(CMAKE_CUDA_ARCHITECTURES 90)
      endif()
      enable_language(CUDA)
      # The .cu files are C++20 like the rest. CMake 3.25 knows no CUDA20
      # flag for nvcc: name it (nvcc 12 and later take -std=c++20).
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA_STANDARD 20)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      find_package(CUDAToolkit REQUIRED)
      set(WEFT_HAVE_CUDA ON)
    elseif(WEFT_CUDA STREQUAL "ON")
      message(FATAL_ERROR "WEFT_CUDA=ON but no CUDA compiler was found (looked for nvcc in PATH and /usr/local/cuda/bin)")
    endif()
  endif()
  message(STATUS "weft: CUDA kernels ${WEFT_HAVE_CUDA}")
endmacro()

# weft_public_target(target name): makes `target` one of weft's public
# libraries: the alias weft::<name>, the same name in the installed package
# (weftTargets.cmake), and the include directories a user of it needs.
# Installed, headers live in include/weft/<folder>/ and both include/ and
# include/weft are searched: users write <weft/rpc/agent.h>, while weft's
# headers include each other as "rpc/agent.h". In the build tree the source
# root is searched; when weft is added to another project with
# add_subdirectory, also WEFT_PREFIXED_INCLUDE_DIR, in which weft/<folder>
# points at each library's folder, so that <weft/rpc/agent.h> works there too.
# cmake/WeftPackage.cmake installs every target named here.
function(weft_public_target target name)
  add_library(weft::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  else()
    set(scope PUBLIC)
  endif()
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/weft>)
  if(NOT PROJECT_IS_TOP_LEVEL)
    target_include_directories(${target} INTERFACE $<BUILD_INTERFACE:${WEFT_PREFIXED_INCLUDE_DIR}>)
  endif()
  set_property(GLOBAL APPEND PROPERTY WEFT_PUBLIC_TARGETS ${target})
endfunction()

# weft_library(name [DEPS ...]): one static library per source directory, built
# from every .cpp in it (new files are picked up at the next build).
function(weft_library name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  if(NOT sources)
    # Header-only so far: an interface target keeps dependents linking.
    add_library(weft_${name} INTERFACE)
    weft_public_target(weft_${name} ${name})
    target_link_libraries(weft_${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(weft_${name} STATIC ${sources})
  weft_public_target(weft_${name} ${name})
  target_compile_options(weft_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${WEFT_WARNINGS}>)
  target_link_libraries(weft_${name} PUBLIC ${ARG_DEPS})
endfunction()

# weft_test(name LABELS l1 [l2] SOURCES ... DEPS ...): a doctest executable whose
# test cases are registered one by one with CTest under the given labels.
# Labels in use: unit (fast, single process), multiprocess, gpu, slow, and
# install (tests/install, a CMake script rather than a doctest executable).
function(weft_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS;SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} doctest::doctest weft_test_main)
  target_compile_options(${name} PRIVATE ${WEFT_WARNINGS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  doctest_discover_tests(${name}
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77)
endfunction()
