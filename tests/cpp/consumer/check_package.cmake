# tests/cpp/consumer/check_package.cmake — the installed-package check (CTest: package_consumer).
#
#   cmake -DCODA_BUILD_DIR=<libcoda build> -DCODA_SOURCE_DIR=<repo> -DWORK_DIR=<scratch> \
#         [-DCXX_COMPILER=...] [-DC_COMPILER=...] [-DCONFIG=Release] -P tests/cpp/consumer/check_package.cmake
#
# 1. cmake --install <build> --prefix <scratch>/prefix
# 2. configure + build tests/cpp/consumer against it (find_package(coda), coda::coda) and run it
# 3. configure + build csrc/examples against it and run the example (0 = passed, 77 = no SM90 GPU)
cmake_minimum_required(VERSION 3.22)
foreach(var CODA_BUILD_DIR CODA_SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "check_package.cmake: pass -D${var}=...")
  endif()
endforeach()

function(run)
  cmake_parse_arguments(RUN "" "" "ALLOW" ${ARGN})
  string(REPLACE ";" " " line "${RUN_UNPARSED_ARGUMENTS}")
  message(STATUS "$ ${line}")
  execute_process(COMMAND ${RUN_UNPARSED_ARGUMENTS} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 AND NOT rc IN_LIST RUN_ALLOW)
    message(FATAL_ERROR "check_package.cmake: exit status ${rc}: ${line}")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(config_args "")
if(CONFIG)  # multi-config generators: the configuration that was built
  set(config_args --config "${CONFIG}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
run("${CMAKE_COMMAND}" --install "${CODA_BUILD_DIR}" --prefix "${prefix}" ${config_args})

set(configure_args "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release)
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(C_COMPILER)
  list(APPEND configure_args "-DCMAKE_C_COMPILER=${C_COMPILER}")
endif()

run("${CMAKE_COMMAND}" -S "${CODA_SOURCE_DIR}/tests/cpp/consumer" -B "${WORK_DIR}/consumer" ${configure_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/consumer")
run("${WORK_DIR}/consumer/coda_consumer")

run("${CMAKE_COMMAND}" -S "${CODA_SOURCE_DIR}/csrc/examples" -B "${WORK_DIR}/example" ${configure_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/example")
run("${WORK_DIR}/example/coda_example" ALLOW 77)
message(STATUS "check_package.cmake: the installed coda package works (prefix ${prefix})")
