# The dependencies weft finds by hand rather than through a package of their
# own. Used by weft's build and, installed next to weftConfig.cmake, by every
# project that finds weft with find_package(weft), so both look in the same
# places.

# OpenBLAS, the OpenMP build (Debian's libopenblas-openmp-dev). weft splits
# large products over its own kernel threads (kernels/cpu/parallel.h) and
# keeps every BLAS call on its calling thread (kernels/cpu/gemm.cpp), so BLAS
# never starts OpenMP teams of its own. Debian's serial build would do that
# by itself but is not safe to call from several threads at once.
# Looked for under each CMAKE_PREFIX_PATH entry, then /usr, in Debian's layout
# (<root>/lib/<multiarch>/openblas-openmp, <root>/include/<multiarch>/openblas-openmp),
# so that a copy unpacked from the Debian packages into a prefix is found
# (scripts/device_check.sh).
# Defines the imported target weft::openblas when found, and sets
# WEFT_OPENBLAS_DIR, WEFT_OPENBLAS_LIBRARY and WEFT_OPENBLAS_INCLUDE_DIR.
macro(weft_find_openblas)
  set(weft_openblas_roots ${CMAKE_PREFIX_PATH} /usr)
  find_library(WEFT_OPENBLAS_LIBRARY NAMES openblas
    PATHS ${weft_openblas_roots}
    PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
    NO_DEFAULT_PATH)
  find_path(WEFT_OPENBLAS_INCLUDE_DIR cblas.h
    PATHS ${weft_openblas_roots}
    PATH_SUFFIXES include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
    NO_DEFAULT_PATH)
  if(WEFT_OPENBLAS_LIBRARY)
    get_filename_component(WEFT_OPENBLAS_DIR ${WEFT_OPENBLAS_LIBRARY} DIRECTORY)
  else()
    set(WEFT_OPENBLAS_DIR /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
  endif()
  if(WEFT_OPENBLAS_LIBRARY AND WEFT_OPENBLAS_INCLUDE_DIR AND NOT TARGET weft::openblas)
    add_library(weft::openblas UNKNOWN IMPORTED)
    set_target_properties(weft::openblas PROPERTIES IMPORTED_LOCATION ${WEFT_OPENBLAS_LIBRARY})
  endif()
endmacro()

# NCCL for the nccl process group: nccl.h and libnccl, looked for next to the
# CUDA toolkit (find CUDAToolkit first). Defines the imported target weft::nccl
# when found, and sets NCCL_INCLUDE_DIR and NCCL_LIBRARY.
macro(weft_find_nccl)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND NOT TARGET weft::nccl)
    add_library(weft::nccl UNKNOWN IMPORTED)
    set_target_properties(weft::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY})
  endif()
endmacro()
