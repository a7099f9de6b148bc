# Installs the build tree into a fresh prefix and uses it as another project
# would (cmake -P script, run by CTest; tests/CMakeLists.txt passes the -D
# values below):
#   1. cmake --install BUILD_DIR --prefix <work>/prefix, then checks the layout:
#      bin/weftrun, headers under include/weft/ (the generated
#      rpc/protocol.capnp.h among them), lib/cmake/weft/weftConfig*.cmake;
#   2. configures tests/install/consumer with find_package(weft REQUIRED) and
#      CMAKE_PREFIX_PATH=<work>/prefix (and checks that weft_DIR is that prefix's),
#      builds it, and checks that its weft::weftrun names the installed bin/weftrun;
#   3. runs the consumer alone (a world of one: its agent calls itself), then
#      two copies of it under the installed bin/weftrun; each must print
#      "consumer rank R of W: ok".
# <work> is WORK_DIR, removed before and after (also when a step fails).
#
#   BUILD_DIR      weft's build tree
#   CONSUMER_DIR   tests/install/consumer
#   WORK_DIR       scratch folder
#   GENERATOR      CMake generator for the consumer (weft's own)
#   MAKE_PROGRAM   its build tool
#   CXX_COMPILER   C++ compiler (weft's own)
#   CXX_LAUNCHER   compiler launcher (weft's own, e.g. ccache; may be empty)
#   BUILD_TYPE     CMAKE_BUILD_TYPE for the consumer

foreach(var BUILD_DIR CONSUMER_DIR WORK_DIR GENERATOR CXX_COMPILER BUILD_TYPE)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer)

macro(fail message)
  file(REMOVE_RECURSE ${WORK_DIR})
  message(FATAL_ERROR "${message}")
endmacro()

# Runs a command; on failure (or timeout) removes WORK_DIR and stops with its output.
function(run what timeout)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${timeout})
  if(NOT rc EQUAL 0)
    fail("${what} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# ---- 1. install ---------------------------------------------------------------------
run("cmake --install" 300 ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(path
    bin/weftrun
    include/weft/common/error.h
    include/weft/tensor/tensor.h
    include/weft/rpc/agent.h
    include/weft/rpc/transport/connection.h
    include/weft/rpc/protocol.capnp.h
    include/weft/collectives/gloo/process_group_gloo.h
    include/weft/kernels/cpu/parallel.h)
  if(NOT EXISTS ${prefix}/${path})
    fail("cmake --install did not install ${path}")
  endif()
endforeach()
file(GLOB_RECURSE config_files RELATIVE ${prefix} ${prefix}/*/weftConfig.cmake)
if(NOT config_files)
  fail("cmake --install installed no weftConfig.cmake")
endif()
list(GET config_files 0 config_file)
get_filename_component(config_dir ${prefix}/${config_file} DIRECTORY)
foreach(file weftConfigVersion.cmake weftTargets.cmake WeftDependencies.cmake)
  if(NOT EXISTS ${config_dir}/${file})
    fail("cmake --install did not install ${file} next to ${config_file}")
  endif()
endforeach()

# ---- 2. configure and build the consumer ------------------------------------------------
set(configure ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${consumer_build} -G ${GENERATOR}
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_PREFIX_PATH=${prefix})
if(MAKE_PROGRAM)
  list(APPEND configure -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(CXX_LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
run("configuring the consumer" 300 ${configure})
file(STRINGS ${consumer_build}/CMakeCache.txt weft_dir REGEX "^weft_DIR:")
if(NOT weft_dir STREQUAL "weft_DIR:PATH=${config_dir}")
  fail("the consumer found another weft: ${weft_dir} (expected ${config_dir})")
endif()
run("building the consumer" 600 ${CMAKE_COMMAND} --build ${consumer_build})
file(READ ${consumer_build}/weftrun_path.txt weftrun_path)
if(NOT weftrun_path STREQUAL "${prefix}/bin/weftrun")
  fail("weft::weftrun names ${weftrun_path}, not the installed ${prefix}/bin/weftrun")
endif()

# ---- 3. run it --------------------------------------------------------------------------
# Nothing of the environment CTest runs in may place the lone process in a job.
set(clean_env ${CMAKE_COMMAND} -E env)
foreach(var WEFT_RANK WEFT_WORLD_SIZE WEFT_LOCAL_RANK RANK WORLD_SIZE LOCAL_RANK
    SLURM_PROCID SLURM_NTASKS SLURM_LOCALID
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
    WEFT_MASTER_ADDR WEFT_MASTER_PORT MASTER_ADDR MASTER_PORT)
  list(APPEND clean_env --unset=${var})
endforeach()

run("the consumer alone" 120 ${clean_env} ${consumer_build}/consumer)
if(NOT run_output MATCHES "consumer rank 0 of 1: ok")
  fail("the consumer alone did not report success:\n${run_output}")
endif()

run("the consumer under the installed weftrun" 180 ${clean_env} ${prefix}/bin/weftrun -n 2 ${consumer_build}/consumer)
foreach(rank 0 1)
  if(NOT run_output MATCHES "consumer rank ${rank} of 2: ok")
    fail("rank ${rank} of the consumer under weftrun did not report success:\n${run_output}")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "installed, built against and ran: ok")
