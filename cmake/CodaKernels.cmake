# cmake/CodaKernels.cmake — which of libcoda's kernel translation units to compile.
#
# Every kernel is csrc/kernels/ops/<op>_<dtype>.cu: one CUTLASS instantiation, about 60–100 s of
# nvcc on one core and ~4 GB of memory, so they build in parallel (cmake --build -jN).
# CODA_KERNELS = "all" (the default) compiles all of them; a ;-list compiles a subset (CI uses
# two); CODA_BUILD_OPS=OFF compiles none. Ops whose kernel is missing return
# coda::StatusCode::kNotBuilt after validating their arguments.

# The ops and their coda::Op enumerators, from their one list (csrc/include/coda/op_list.h, rows
# X(NAME, Enumerator, value, "name")): CODA_ALL_OPS = gemm;gemm_bias_act;..., CODA_OP_ENUM_<op>.
# The Transformer-block ops' translation units are written by `python -m coda_ext libgen
# csrc/kernels/ops` from the graphs of coda_ext.ops (committed; CMake never runs Python).
set(coda_op_list "${CMAKE_CURRENT_LIST_DIR}/../csrc/include/coda/op_list.h")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${coda_op_list}")
set(coda_op_row "X\\(([A-Z0-9_]+), (k[A-Za-z0-9]+), ([0-9]+), \"([a-z0-9_]+)\"\\)")
file(READ "${coda_op_list}" coda_op_text)
string(REGEX MATCHALL "${coda_op_row}" coda_op_rows "${coda_op_text}")
set(CODA_ALL_OPS "")
foreach(row IN LISTS coda_op_rows)
  if(row MATCHES "${coda_op_row}")
    list(APPEND CODA_ALL_OPS "${CMAKE_MATCH_4}")
    set(CODA_OP_ENUM_${CMAKE_MATCH_4} "${CMAKE_MATCH_2}")
  endif()
endforeach()
if(NOT CODA_ALL_OPS)
  message(FATAL_ERROR "coda: no ops found in ${coda_op_list}; its rows must read X(NAME, kEnumerator, value, \"name\")")
endif()
# Ops whose host code runs the small kernels of csrc/kernels/ops/finish.cu (a few seconds of
# nvcc, compiled when any of their kernels is).
set(CODA_FINISH_OPS linear_residual_norm linear_swiglu linear_swiglu_train
    qkv_rope qkv_rope_qk_norm64 qkv_rope_qk_norm128 lm_head_cross_entropy)
set(CODA_ALL_DTYPES bf16 fp16)
set(CODA_DTYPE_ENUM_bf16 kBFloat16)
set(CODA_DTYPE_ENUM_fp16 kFloat16)

set(CODA_ALL_KERNELS "")
foreach(op IN LISTS CODA_ALL_OPS)
  foreach(dtype IN LISTS CODA_ALL_DTYPES)
    list(APPEND CODA_ALL_KERNELS "${op}_${dtype}")
  endforeach()
endforeach()

# Sets CODA_KERNEL_LIST (the kernels to compile), CODA_KERNEL_SOURCES, the text blocks
# CODA_KERNEL_DECLARATIONS / CODA_KERNEL_ROWS that csrc/lib/kernel_table.cpp.in expands, and
# CODA_WITH_FINISH (1: finish.cu is among the sources).
function(coda_resolve_kernels)
  set(selected "")
  if(CODA_BUILD_OPS)
    if(CODA_KERNELS STREQUAL "all" OR CODA_KERNELS STREQUAL "")
      set(selected ${CODA_ALL_KERNELS})
    else()
      foreach(k IN LISTS CODA_KERNELS)
        if(NOT k IN_LIST CODA_ALL_KERNELS)
          list(JOIN CODA_ALL_KERNELS ", " known)
          message(FATAL_ERROR "coda: CODA_KERNELS names an unknown kernel '${k}'. Known: all, ${known}.")
        endif()
        list(APPEND selected "${k}")
      endforeach()
      list(REMOVE_DUPLICATES selected)
    endif()
  endif()

  set(sources "")
  set(decls "")
  set(rows "")
  set(with_finish 0)
  foreach(op IN LISTS CODA_ALL_OPS)
    foreach(dtype IN LISTS CODA_ALL_DTYPES)
      set(k "${op}_${dtype}")
      if(k IN_LIST selected)
        if(op IN_LIST CODA_FINISH_OPS)
          set(with_finish 1)
        endif()
        list(APPEND sources "${PROJECT_SOURCE_DIR}/csrc/kernels/ops/${k}.cu")
        string(APPEND decls "CODA_DECLARE_KERNEL(${k})\n")
        string(APPEND rows "      CODA_KERNEL_ROW(${CODA_OP_ENUM_${op}}, ${CODA_DTYPE_ENUM_${dtype}}, ${k})\n")
      endif()
    endforeach()
  endforeach()

  if(with_finish)
    list(APPEND sources "${PROJECT_SOURCE_DIR}/csrc/kernels/ops/finish.cu")
  endif()

  list(LENGTH selected count)
  list(JOIN selected ";" joined)
  set(CODA_KERNEL_LIST "${joined}" PARENT_SCOPE)
  set(CODA_KERNEL_COUNT ${count} PARENT_SCOPE)
  set(CODA_KERNEL_SOURCES ${sources} PARENT_SCOPE)
  set(CODA_KERNEL_DECLARATIONS "${decls}" PARENT_SCOPE)
  set(CODA_KERNEL_ROWS "${rows}" PARENT_SCOPE)
  set(CODA_WITH_FINISH ${with_finish} PARENT_SCOPE)
endfunction()
