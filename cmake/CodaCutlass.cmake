# cmake/CodaCutlass.cmake — finds the CUTLASS headers libcoda's kernels compile against and
# defines the build-only INTERFACE target coda_cutlass (never installed or exported).
#
# Where from, in order:
#   1. -DCODA_CUTLASS_DIR=<a CUTLASS checkout>   (or the environment variable CODA_CUTLASS_DIR)
#   2. the nvidia-cutlass wheel of the Python 3 interpreter that find_package(Python3) picks
#      (<site-packages>/cutlass_library/source), which is where coda_ext's JIT finds it too.
# Either must contain include/cutlass/cutlass.h and tools/util/include.

function(coda_find_cutlass)
  set(base "${CODA_CUTLASS_DIR}")
  if(NOT base AND DEFINED ENV{CODA_CUTLASS_DIR})
    set(base "$ENV{CODA_CUTLASS_DIR}")
  endif()
  set(origin "CODA_CUTLASS_DIR")
  if(NOT base)
    find_package(Python3 COMPONENTS Interpreter)
    if(NOT Python3_Interpreter_FOUND)
      message(FATAL_ERROR "coda: CUTLASS not found: no Python 3 interpreter to ask for the nvidia-cutlass wheel. "
                          "Set -DCODA_CUTLASS_DIR=<CUTLASS checkout>, or -DPython3_EXECUTABLE=<python with "
                          "nvidia-cutlass==4.2.0.0 installed>.")
    endif()
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import importlib.util as u; s = u.find_spec('cutlass_library'); print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
      OUTPUT_VARIABLE wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT wheel_dir)
      message(FATAL_ERROR "coda: CUTLASS not found: ${Python3_EXECUTABLE} has no nvidia-cutlass wheel. "
                          "Run `${Python3_EXECUTABLE} -m pip install nvidia-cutlass==4.2.0.0`, pass "
                          "-DPython3_EXECUTABLE=<a python that has it>, or set -DCODA_CUTLASS_DIR=<CUTLASS checkout>.")
    endif()
    set(base "${wheel_dir}/source")
    set(origin "the nvidia-cutlass wheel of ${Python3_EXECUTABLE}")
  endif()
  file(REAL_PATH "${base}" base)
  if(NOT EXISTS "${base}/include/cutlass/cutlass.h" OR NOT IS_DIRECTORY "${base}/tools/util/include")
    message(FATAL_ERROR "coda: ${base} (from ${origin}) is not a CUTLASS tree: it needs include/cutlass/cutlass.h "
                        "and tools/util/include/.")
  endif()

  file(STRINGS "${base}/include/cutlass/version.h" version_lines REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) ")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUTLASS_${part} +([0-9]+)" _ "${version_lines}")
    list(APPEND version "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN version "." version)
  if(NOT version VERSION_EQUAL 4.2.0)
    message(WARNING "coda: CUTLASS ${version} at ${base}; coda_ext is developed and tested with 4.2.0 "
                    "(the nvidia-cutlass 4.2.0.0 wheel).")
  endif()
  message(STATUS "coda: CUTLASS ${version} from ${origin}: ${base}")

  if(NOT TARGET coda_cutlass)
    add_library(coda_cutlass INTERFACE)
    target_include_directories(coda_cutlass SYSTEM INTERFACE "${base}/include" "${base}/tools/util/include")
  endif()
  set(CODA_CUTLASS_VERSION "${version}" PARENT_SCOPE)
  set(CODA_CUTLASS_ROOT "${base}" PARENT_SCOPE)
endfunction()
